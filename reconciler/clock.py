"""Injected time: every deadline, backoff and timestamp goes through a Clock so tests never sleep.

A clock is also how a shutdown reaches every waiting step at once: `stop()` wakes every `sleep` in progress and
makes each later one raise `ShutdownRequested` (reconciler/errors.py), which unwinds the step where it waits, its
journal entry untouched (in flight, resumed at the next start), instead of letting it wait out its deadline.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

from reconciler.errors import ShutdownRequested


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time (UTC), for records and reports."""
        ...

    def monotonic(self) -> float:
        """Seconds on a monotonic scale, for deadlines."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`; raises ShutdownRequested once `stop()` was called (at once, if it comes meanwhile)."""
        ...

    def stop(self) -> None:
        """The process is shutting down: wake every sleeper now, and every later sleep raises."""
        ...


class SystemClock:
    def __init__(self) -> None:
        self._stopped = threading.Event()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        # Event.wait returns as soon as stop() sets it: every thread waiting here wakes at once.
        if self._stopped.wait(seconds if seconds > 0 else 0):
            raise ShutdownRequested("shutting down")

    def stop(self) -> None:
        self._stopped.set()


class FakeClock:
    """A clock that advances only when slept on or told to; thread-safe."""

    def __init__(self, start: datetime | None = None) -> None:
        self._t0 = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._elapsed = 0.0
        self._lock = threading.Lock()
        self._stopped = False

    def now(self) -> datetime:
        with self._lock:
            return self._t0 + timedelta(seconds=self._elapsed)

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed

    def sleep(self, seconds: float) -> None:
        if self._stopped:
            raise ShutdownRequested("shutting down")
        self.advance(seconds)

    def stop(self) -> None:
        self._stopped = True

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._elapsed += max(0.0, seconds)
