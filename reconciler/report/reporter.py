"""Fan commit statuses out to the sinks without ever blocking reconciling.

`report()` only records the wish and returns. One worker thread per sink posts, so a slow or
rate-limited forge delays nobody else. Per (revision, context) only the newest status matters: a
newer one replaces an older one still waiting, and a status equal to the last one posted is not
posted again. Failures are retried with exponential backoff, or after exactly the wait the forge
asked for (Retry-After / rate-limit reset), which then holds back every post to that sink.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from reconciler.clock import Clock
from reconciler.errors import ReportError, TransientReportError
from reconciler.memory import release_memory
from reconciler.report.status import BatchStatusSink, CommitStatus, StatusSink

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (revision, app): an app has one context, and its name is shared, not built per status


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 8
    base_delay: float = 1.0
    max_delay: float = 300.0

    def delay(self, attempts: int, retry_after: float | None) -> float:
        """Wait before attempt `attempts + 1`: the forge's word if it gave one, else 1, 2, 4 ... s."""
        if retry_after is not None:
            return retry_after
        return float(min(self.max_delay, self.base_delay * 2.0 ** (attempts - 1)))


@dataclass(frozen=True)
class SinkStats:
    posted: int
    skipped: int  # identical to what was posted or queued already
    retries: int
    failed: int  # given up: permanent error or attempts exhausted
    dropped: int  # queue full
    pending: int


@dataclass(eq=False)
class _Item:
    status: CommitStatus
    attempts: int = 0
    not_before: float = 0.0
    inflight: bool = False


class _SinkWorker:
    def __init__(
        self, sink: StatusSink, clock: Clock, *, policy: RetryPolicy, max_pending: int, remember: int,
        recheck: float,
    ) -> None:
        self.sink = sink
        self._clock = clock
        self._policy = policy
        self._max_pending = max_pending
        self._remember = remember
        self._recheck = recheck
        self._cond = threading.Condition()
        self._queue: OrderedDict[Key, _Item] = OrderedDict()
        # The hash of the last status posted per key, a bounded LRU: 50,000 statuses cost a few MB, not the
        # statuses themselves (their descriptions) kept for the life of the daemon.
        self._last: OrderedDict[Key, int] = OrderedDict()
        self._blocked_until = 0.0
        self._stop = False
        self._counts = {"posted": 0, "skipped": 0, "retries": 0, "failed": 0, "dropped": 0}
        self._thread = threading.Thread(target=self._run, name=f"reporter-{sink.name}", daemon=True)
        self._thread.start()

    # ---- called from the reconciling side: never blocks on I/O

    def submit(self, statuses: Sequence[CommitStatus]) -> None:
        """Queue `statuses` at once: the worker takes them as one batch (a pass's statuses are one note push,
        not a first push of those queued before the worker woke and a second of the rest)."""
        with self._cond:
            for status in statuses:
                self._submit(status)
            self._cond.notify_all()

    def _submit(self, status: CommitStatus) -> None:
        key = (status.revision, status.app)
        queued = self._queue.get(key)
        if queued is not None and queued.status == status:
            self._counts["skipped"] += 1
            return
        if queued is None and self._last.get(key) == hash(status):
            self._counts["skipped"] += 1
            return
        if queued is None and len(self._queue) >= self._max_pending:
            self._counts["dropped"] += 1
            log.warning("status queue of %s is full (%d): dropped %s %s for %s", self.sink.name,
                        self._max_pending, status.context, status.state.value, status.revision[:12])
            return
        self._queue[key] = _Item(status)  # replaces an older status for the same key

    def stats(self) -> SinkStats:
        with self._cond:
            return SinkStats(pending=len(self._queue), **self._counts)

    def wait_empty(self, deadline: float) -> bool:
        with self._cond:
            self._cond.notify_all()  # re-check due times now (e.g. after a clock jump)
            while self._queue:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))
                self._cond.notify_all()
            return True

    def stop(self, timeout: float) -> None:
        with self._cond:
            self._stop = True
            lost = len(self._queue)
            self._cond.notify_all()
        if lost:
            log.warning("%s: %d status(es) not posted at shutdown", self.sink.name, lost)
        self._thread.join(timeout)

    # ---- the worker thread

    def _take_due(self) -> list[_Item] | None:
        """Items to post now; waits until there are some. None when stopping."""
        with self._cond:
            while True:
                if self._stop:
                    return None
                now = self._clock.monotonic()
                if self._queue and now >= self._blocked_until:
                    due = [i for i in self._queue.values() if not i.inflight and i.not_before <= now]
                    if due:
                        for item in due:
                            item.inflight = True
                        return due
                if not self._queue:
                    self._cond.wait()  # idle: sleep until a status arrives
                    continue
                upcoming = [i.not_before for i in self._queue.values() if not i.inflight]
                next_due = max(min(upcoming, default=now), self._blocked_until)
                self._cond.wait(min(max(next_due - now, 0.001), self._recheck))

    def _run(self) -> None:
        while True:
            due = self._take_due()
            if due is None:
                return
            sink = self.sink
            if isinstance(sink, BatchStatusSink) and len(due) > 1:
                batch = [i.status for i in due]
                self._settle(due, self._attempt(partial(sink.post_batch, batch)))
                if len(batch) >= 1000:  # a full pass's statuses: give the heap they took back
                    del batch, due
                    release_memory()
                continue
            for n, item in enumerate(due):
                error = self._attempt(partial(sink.post, item.status))
                self._settle([item], error)
                if isinstance(error, TransientReportError):
                    self._release(due[n + 1 :])  # the sink is in trouble: do not hammer it
                    break

    def _attempt(self, call: Callable[[], None]) -> ReportError | None:
        try:
            call()
        except ReportError as e:
            return e
        except Exception as e:  # a sink bug must not kill the worker
            log.exception("%s: unexpected error while posting", self.sink.name)
            return ReportError(f"{self.sink.name}: {type(e).__name__}: {e}")
        return None

    def _release(self, items: Sequence[_Item]) -> None:
        with self._cond:
            for item in items:
                item.inflight = False

    def _settle(self, items: Sequence[_Item], error: ReportError | None) -> None:
        retried: list[tuple[_Item, float]] = []
        gave_up: list[_Item] = []
        with self._cond:
            now = self._clock.monotonic()
            for item in items:
                key = (item.status.revision, item.status.app)
                current = self._queue.get(key)
                superseded = current is not item
                item.inflight = False
                if error is None:
                    self._counts["posted"] += 1
                    self._last[key] = hash(item.status)
                    self._last.move_to_end(key)
                    while len(self._last) > self._remember:
                        self._last.popitem(last=False)
                    if not superseded:
                        del self._queue[key]
                    log.debug("%s: posted %s %s on %s", self.sink.name, item.status.context,
                              item.status.state.value, item.status.revision[:12])
                    continue
                if superseded:  # a newer status for this key waits; it carries on
                    continue
                item.attempts += 1
                retryable = isinstance(error, TransientReportError)
                if not retryable or item.attempts >= self._policy.max_attempts:
                    del self._queue[key]
                    self._counts["failed"] += 1
                    gave_up.append(item)
                    continue
                retry_after = error.retry_after if isinstance(error, TransientReportError) else None
                delay = self._policy.delay(item.attempts, retry_after)
                item.not_before = now + delay
                if retry_after is not None:
                    self._blocked_until = max(self._blocked_until, now + retry_after)
                self._counts["retries"] += 1
                retried.append((item, delay))
            self._cond.notify_all()
        self._log_failures(retried, gave_up, error)

    def _log_failures(self, retried: Sequence[tuple[_Item, float]], gave_up: Sequence[_Item],
                      error: ReportError | None) -> None:
        """One line per status, or one line for a whole batch (a full pass's 10,000 statuses share one
        failed push: 10,000 identical warnings would bury everything else)."""
        if len(retried) == 1:
            item, delay = retried[0]
            log.warning("%s: posting %s %s for %s failed (attempt %d), retrying in %.1f s: %s",
                        self.sink.name, item.status.context, item.status.state.value,
                        item.status.revision[:12], item.attempts, delay, error)
        elif retried:
            item, delay = retried[0]
            log.warning("%s: posting %d statuses (%s %s for %s, ...) failed (attempt %d), retrying in %.1f s: %s",
                        self.sink.name, len(retried), item.status.context, item.status.state.value,
                        item.status.revision[:12], item.attempts, delay, error)
        if len(gave_up) == 1:
            item = gave_up[0]
            log.error("%s: gave up on %s %s for %s after %d attempt(s): %s", self.sink.name,
                      item.status.context, item.status.state.value, item.status.revision[:12],
                      item.attempts, error)
        elif gave_up:
            item = gave_up[0]
            log.error("%s: gave up on %d statuses (%s %s for %s, ...) after %d attempt(s): %s", self.sink.name,
                      len(gave_up), item.status.context, item.status.state.value, item.status.revision[:12],
                      item.attempts, error)


class Reporter:
    """Hands statuses to every sink in the background; see the module docstring for the rules."""

    def __init__(
        self,
        sinks: Sequence[StatusSink],
        clock: Clock,
        *,
        retry: RetryPolicy | None = None,
        max_pending: int = 200_000,  # a shard of 50,000 apps queues a full pass's statuses at once
        remember: int = 50_000,
        recheck_interval: float = 1.0,
    ) -> None:
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique, got {names}")
        self._workers = [
            _SinkWorker(
                s, clock, policy=retry or RetryPolicy(), max_pending=max_pending, remember=remember,
                recheck=recheck_interval,
            )
            for s in sinks
        ]
        self._closed = False

    @property
    def sinks(self) -> list[StatusSink]:
        return [w.sink for w in self._workers]

    def report(self, status: CommitStatus) -> None:
        """Queue `status` for every sink and return at once."""
        self.report_many([status])

    def report_many(self, statuses: Sequence[CommitStatus]) -> None:
        """Queue `statuses` for every sink as one batch (a pass's) and return at once."""
        if self._closed:
            if statuses:
                first = statuses[0]
                log.warning("reporter closed: dropped %s %s%s", first.context, first.state.value,
                            f" and {len(statuses) - 1} more" if len(statuses) > 1 else "")
            return
        for worker in self._workers:
            worker.submit(statuses)

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` real seconds until nothing is pending; True if everything settled."""
        deadline = time.monotonic() + timeout
        return all(w.wait_empty(deadline) for w in self._workers)

    def stats(self) -> dict[str, SinkStats]:
        return {w.sink.name: w.stats() for w in self._workers}

    def close(self, timeout: float = 5.0) -> None:
        """Give pending statuses up to `timeout` seconds, then stop the workers."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        for w in self._workers:
            w.stop(timeout=1.0)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
