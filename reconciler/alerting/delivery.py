"""Delivery that never slows reconciling: per sink a bounded queue and one worker thread.

`submit` never blocks: a full queue drops the notification and counts it (`reason="queue_full"`). The worker
makes up to `max_attempts` attempts, waiting `backoff * 2**n` (capped) between transient failures; a notification
that still could not be sent is dropped and counted (`reason="failed"`). A sink that is down, slow or answering
500 thus costs its own thread and queue, never a pass (bench/alert_sinks_bench.py measures it).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from reconciler.alerting.message import Notification
from reconciler.alerting.sinks import Sink
from reconciler.errors import ReportError, TransientReportError

log = logging.getLogger(__name__)


class DeliveryMetrics(Protocol):
    def count_notification(self, sink: str, result: str) -> None: ...
    def count_notification_dropped(self, sink: str, reason: str) -> None: ...


@dataclass(frozen=True)
class Retry:
    max_attempts: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt `attempt` (1-based)."""
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1)))


class Delivery:
    """One sink's queue and worker."""

    def __init__(self, sink: Sink, *, retry: Retry, queue_size: int, metrics: DeliveryMetrics | None = None,
                 on_sent: Callable[[str, Notification], None] | None = None) -> None:
        self.sink = sink
        self._retry = retry
        self._queue: queue.Queue[Notification | None] = queue.Queue(maxsize=queue_size)
        self._metrics = metrics
        self._on_sent = on_sent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"notify-{sink.name}", daemon=True)
        self._thread.start()

    def submit(self, n: Notification) -> bool:
        """Queue `n`; False (and counted as dropped) when the queue is full or closed. Never blocks."""
        if self._stop.is_set():
            self._dropped("closed")
            return False
        try:
            self._queue.put_nowait(n)
        except queue.Full:
            self._dropped("queue_full")
            log.warning("notification to %s dropped: its queue is full (the sink is down or slow)", self.sink.name)
            return False
        return True

    def pending(self) -> int:
        return self._queue.qsize()

    def close(self, timeout: float) -> None:
        """Stop after what is queued was tried once more (waits at most `timeout`); the rest is dropped."""
        self._stop.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(timeout=max(0.0, timeout))
        close = getattr(self.sink, "close", None)
        if callable(close):
            close()

    def _dropped(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.count_notification_dropped(self.sink.name, reason)

    def _loop(self) -> None:
        while True:
            n = self._queue.get()
            if n is None:
                return
            self._deliver(n)

    def _deliver(self, n: Notification) -> None:
        for attempt in range(1, self._retry.max_attempts + 1):
            try:
                self.sink.send(n)
            except TransientReportError as e:
                if self._metrics is not None:
                    self._metrics.count_notification(self.sink.name, "error")
                if attempt == self._retry.max_attempts or self._stop.is_set():
                    log.warning("notification %s to %s dropped after %d attempt(s): %s", n.subject, self.sink.name,
                                attempt, e)
                    break
                self._stop.wait(self._retry.delay(attempt))
                continue
            except ReportError as e:
                if self._metrics is not None:
                    self._metrics.count_notification(self.sink.name, "error")
                log.warning("notification %s to %s refused: %s", n.subject, self.sink.name, e)
                break
            except Exception:  # a bug in a sink must not end its worker
                log.exception("notification %s to %s: unexpected error", n.subject, self.sink.name)
                break
            if self._metrics is not None:
                self._metrics.count_notification(self.sink.name, "sent")
            if self._on_sent is not None:
                self._on_sent(self.sink.name, n)
            return
        self._dropped("failed")
