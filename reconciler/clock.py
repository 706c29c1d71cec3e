"""Injected time: every deadline, backoff and timestamp goes through a Clock so tests never sleep."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time (UTC), for records and reports."""
        ...

    def monotonic(self) -> float:
        """Seconds on a monotonic scale, for deadlines."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that advances only when slept on or told to; thread-safe."""

    def __init__(self, start: datetime | None = None) -> None:
        self._t0 = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._elapsed = 0.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._t0 + timedelta(seconds=self._elapsed)

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._elapsed += max(0.0, seconds)
