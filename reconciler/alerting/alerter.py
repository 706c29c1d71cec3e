"""The daemon's alerter: fed the facts of every pass (and the outcome of every fetch and pass), it keeps which
conditions hold, notifies the sinks subscribed to them, and tells the dashboard what is firing.

Everything it is told is remembered, so a timer's `tick` re-judges time-based conditions (a checkpoint getting
older, no pass for too long) between passes. It holds a lock for microseconds; sending happens on the
deliveries' threads, never on the caller's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from reconciler.alerting.conditions import (
    ALERTS,
    LIVE_TRIGGERS,
    Condition,
    Thresholds,
    all_conditions,
    daemon_conditions,
)
from reconciler.alerting.config import AlertingSettings
from reconciler.alerting.delivery import Delivery, DeliveryMetrics, Retry
from reconciler.alerting.facts import AppFacts, carry_over
from reconciler.alerting.message import Notification, notification, runbook_url
from reconciler.alerting.sinks import Sink, make_sink, secrets_of
from reconciler.alerting.state import Event, Key, Tracked, advance, firing
from reconciler.clock import Clock
from reconciler.logs import mask_secrets, redact

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActiveAlert:
    """A firing condition, for the dashboard."""

    alert: str
    severity: str
    app: str
    namespace: str
    summary: str
    since: datetime
    runbook_url: str


class Alerter:
    def __init__(self, cfg: AlertingSettings, clock: Clock, *, metrics: DeliveryMetrics | None = None,
                 sinks: Mapping[str, Sink] | None = None,
                 on_sent: Callable[[str, Notification], None] | None = None) -> None:
        """`sinks`: by name; default: built from `cfg.sinks` (secret files read now: ConfigError if unreadable)."""
        self.cfg = cfg
        self.clock = clock
        self.thresholds: Thresholds = cfg.thresholds
        if sinks is None:
            for s in cfg.sinks:
                mask_secrets(*secrets_of(s))  # never in a log line either
            sinks = {s.name: make_sink(s) for s in cfg.sinks}
        retry = Retry(cfg.max_attempts, cfg.retry_backoff, cfg.retry_backoff_max)
        self._deliveries = {name: Delivery(sink, retry=retry, queue_size=cfg.queue_size, metrics=metrics,
                                           on_sent=on_sent) for name, sink in sinks.items()}
        self._lock = threading.Lock()
        self._facts: dict[str, dict[str, AppFacts]] = {}  # owner (a shard, or "") -> app -> facts
        self._tracked: dict[Key, Tracked] = {}
        self._started_at = clock.now()
        self._last_ok_pass: datetime | None = None
        self._fetch_failures = 0
        self._fetch_error: str | None = None

    # --- what it is told ------------------------------------------------------------------------------
    def app_health(self, facts: Sequence[AppFacts], *, full: bool, owner: str = "") -> None:
        """The facts of the apps one pass planned (every app of `owner` when `full`)."""
        with self._lock:
            mine = self._facts.setdefault(owner, {})
            scope = set(mine) | {f.app for f in facts} if full else {f.app for f in facts}
            kept = {f.app: carry_over(f, mine.get(f.app)) for f in facts}
            if full:
                mine.clear()
            mine.update(kept)
            events = self._judge_apps(scope)
        self._send(events)

    def forget_owner(self, owner: str) -> None:
        """A shard this replica no longer holds: its apps are another replica's now; nothing resolves here."""
        with self._lock:
            gone = set(self._facts.pop(owner, {}))
            self._tracked = {k: t for k, t in self._tracked.items() if k[1] not in gone}

    def git_fetched(self, *, error: str | None) -> None:
        with self._lock:
            if error is None:
                self._fetch_failures, self._fetch_error = 0, None
            else:
                self._fetch_failures += 1
                self._fetch_error = error
            events = self._judge_daemon()
        self._send(events)

    def sync_finished(self, *, ok: bool) -> None:
        with self._lock:
            if ok:
                self._last_ok_pass = self.clock.now()
            events = self._judge_daemon()
        self._send(events)

    def tick(self) -> None:
        """Judge again with the time now (a timer calls it between passes)."""
        with self._lock:
            events = self._judge_apps(None) + self._judge_daemon()
        self._send(events)

    # --- what it says ---------------------------------------------------------------------------------
    def active(self) -> list[ActiveAlert]:
        with self._lock:
            tracked = firing(self._tracked)
        return [ActiveAlert(alert=ALERTS[t.condition.trigger][0], severity=ALERTS[t.condition.trigger][1],
                            app=t.condition.app, namespace=t.condition.namespace, summary=redact(t.condition.summary),
                            since=t.since, runbook_url=runbook_url(t.condition.trigger, self.cfg.runbook_url))
                for t in tracked]

    def pending(self) -> int:
        return sum(d.pending() for d in self._deliveries.values())

    def close(self, timeout: float = 5.0) -> None:
        for d in self._deliveries.values():
            d.close(timeout)

    # --- inside ---------------------------------------------------------------------------------------
    def _judge_apps(self, scope: set[str] | None) -> list[Event]:
        now = self.clock.now()
        facts = [f for mine in self._facts.values() for f in mine.values() if scope is None or f.app in scope]
        active = all_conditions(facts, now, self.thresholds)
        # An app the pass could not observe (or just changed, so observed before the change) keeps its live
        # conditions as they were: "not looked at" neither resolves nor raises them.
        unobserved = {f.app for f in facts if not f.observed}

        def in_scope(key: Key) -> bool:
            if key[1] == "" or (key[0] in LIVE_TRIGGERS and key[1] in unobserved):
                return False
            return scope is None or key[1] in scope

        self._tracked, events = advance(self._tracked, active, now, self.cfg.timing, in_scope=in_scope)
        return events

    def _judge_daemon(self) -> list[Event]:
        now = self.clock.now()
        active: list[Condition] = daemon_conditions(
            now=now, started_at=self._started_at, last_ok_pass=self._last_ok_pass,
            fetch_failures=self._fetch_failures, last_fetch_error=self._fetch_error, t=self.thresholds)
        self._tracked, events = advance(self._tracked, active, now, self.cfg.timing, in_scope=lambda k: k[1] == "")
        return events

    def _send(self, events: list[Event]) -> None:
        for ev in events:
            c = ev.condition
            log.log(logging.WARNING if ev.status == "firing" else logging.INFO, "alert %s %s%s: %s", ev.status.value,
                    ALERTS[c.trigger][0], f" {c.app}" if c.app else "", redact(c.summary))
            names = self.cfg.sinks_for(c.trigger, c.app, c.namespace)
            if not names:
                continue
            n = notification(ev, runbook_base=self.cfg.runbook_url, dashboard_url=self.cfg.dashboard_url)
            for name in sorted(names):
                d = self._deliveries.get(name)
                if d is not None:
                    d.submit(n)
