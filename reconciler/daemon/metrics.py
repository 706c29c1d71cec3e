"""Prometheus metrics of one daemon, in its own CollectorRegistry.

A private registry (not prometheus_client's global one) keeps tests and several daemons in one process
independent, and /metrics shows exactly what we define. The service records through the methods here;
the raw metric objects are attributes for anything more specific.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.exposition import choose_encoder

from reconciler import __version__ as _version
from reconciler.alerting.facts import AppFacts
from reconciler.core.observed import Outcome
from reconciler.daemon.app_metrics import AppHealthCollector
from reconciler.service.ports import APP_STATES

PREFIX = "flink_reconciler"

# Upgrades take seconds to many minutes; fetches milliseconds to a minute.
LONG_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
FETCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

STEP_TYPES = ("savepoint", "stop", "start", "downtime")
SYNC_TRIGGERS = ("startup", "poll", "drift", "webhook")


class HealthListener(Protocol):
    """Told what the metrics are told about app health, fetches and passes (the alerter, alerting/alerter.py)."""

    def app_health(self, facts: Sequence[AppFacts], *, full: bool, owner: str = "") -> None: ...
    def forget_owner(self, owner: str) -> None: ...
    def git_fetched(self, *, error: str | None) -> None: ...
    def sync_finished(self, *, ok: bool) -> None: ...


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # `*_created` series double the per-app series count (1,000 apps) and nobody alerts on them.
        # This switch is process-wide in prometheus_client; the daemon owns its process.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Info(f"{PREFIX}_build", "Version of this daemon.", registry=r)
        self.build_info.info({"version": _version})
        self.reconcile_duration = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Time to reconcile one app (plan + apply).",
            ["app"],
            buckets=LONG_BUCKETS,
            registry=r,
        )
        self.reconcile_outcomes = Counter(
            f"{PREFIX}_reconcile_outcomes",
            "Reconcile results per app (success, failure, error).",
            ["app", "outcome"],
            registry=r,
        )
        self.last_applied_revision = Info(
            f"{PREFIX}_last_applied_revision",
            "The Git revision last applied successfully to each app.",
            ["app"],
            registry=r,
        )
        self.git_fetch_duration = Histogram(
            f"{PREFIX}_git_fetch_duration_seconds",
            "Latency of fetching the GitOps repository.",
            buckets=FETCH_BUCKETS,
            registry=r,
        )
        self.git_fetch_errors = Counter(
            f"{PREFIX}_git_fetch_errors",
            "Failed Git fetches by kind (the error class, e.g. SourceAuthError, SourceUnreachableError).",
            ["kind"],
            registry=r,
        )
        self.step_duration = Histogram(
            f"{PREFIX}_step_duration_seconds",
            "Duration of executor steps by type (savepoint, stop, start, downtime).",
            ["step"],
            buckets=LONG_BUCKETS,
            registry=r,
        )
        self.journal_inflight_steps = Gauge(
            f"{PREFIX}_journal_inflight_steps",
            "Steps recorded as started but not finished in the journal.",
            registry=r,
        )
        self.webhook_requests = Counter(
            f"{PREFIX}_webhook_requests",
            "Webhook deliveries by forge and result.",
            ["forge", "result"],
            registry=r,
        )
        self.http_refused = Counter(
            f"{PREFIX}_http_connections_refused",
            "Connections refused (too_many_connections, too_many_from_client), requests refused for their Host "
            "header (host), or bodies not received within the request deadline (deadline).",
            ["reason"],
            registry=r,
        )
        self.sync_passes = Counter(
            f"{PREFIX}_sync_passes",
            "Sync passes by trigger (startup, poll, drift, webhook) and result (ok, error).",
            ["trigger", "result"],
            registry=r,
        )
        self.sync_duration = Histogram(
            f"{PREFIX}_sync_duration_seconds",
            "Duration of a whole sync pass.",
            ["trigger"],
            buckets=LONG_BUCKETS,
            registry=r,
        )
        self.sync_requests_coalesced = Counter(
            f"{PREFIX}_sync_requests_coalesced",
            "Sync requests folded into a pending pass because one was already running or queued.",
            ["trigger"],
            registry=r,
        )
        self.apps = Gauge(
            f"{PREFIX}_apps",
            "Apps by their state after the last pass: ok (in sync or being changed), blocked (waits for a human: "
            "e.g. its record cannot be read), error (invalid spec), failure (its last change failed).",
            ["state"],
            registry=r,
        )
        self._app_states: dict[str, dict[str, int]] = {}  # who counted (a shard, or "") -> state -> apps
        self._app_states_lock = threading.Lock()
        self.last_sync_success = Gauge(
            f"{PREFIX}_last_successful_sync_timestamp_seconds",
            "Unix time of the last sync pass that completed without a pass-level error.",
            registry=r,
        )
        self.repairs = Counter(
            f"{PREFIX}_repairs",
            "Automatic repairs run (self-healing), by what failed: taskmanager, jobmanager, cluster or job.",
            ["kind", "outcome"],
            registry=r,
        )

        self.git_last_fetch_success = Gauge(
            f"{PREFIX}_git_last_successful_fetch_timestamp_seconds",
            "Unix time of the last successful fetch of the GitOps repository.",
            registry=r,
        )
        self.notifications = Counter(
            f"{PREFIX}_notifications",
            "Notification delivery attempts by sink and result (sent, error).",
            ["sink", "result"],
            registry=r,
        )
        self.notifications_dropped = Counter(
            f"{PREFIX}_notifications_dropped",
            "Notifications given up by sink and reason: queue_full (the sink is down or slow and its queue is "
            "full), failed (every attempt failed), closed (shutting down).",
            ["sink", "reason"],
            registry=r,
        )
        # Per-app series live in a registry of their own: rendered once per change of the facts (a pass), not once
        # per scrape (daemon/app_metrics.py; 10,000 apps are ~100,000 series).
        self.app_health_collector = AppHealthCollector()
        self._app_text: tuple[int, str, bytes] | None = None  # (facts version, content type, body)
        self._app_text_lock = threading.Lock()
        self._listeners: list[HealthListener] = []

        self.autoscale_parallelism = Gauge(
            f"{PREFIX}_autoscale_parallelism",
            "Autoscaled apps: job.parallelism in Git (kind=current) and what the metrics call for (kind=wanted).",
            ["app", "kind"],
            registry=r,
        )
        self.autoscale_verdict = Gauge(
            f"{PREFIX}_autoscale_verdict",
            "The autoscaler's last verdict per app: 1 for the current one (scale-up, scale-down, keep, wait).",
            ["app", "verdict"],
            registry=r,
        )
        self.autoscale_requests = Counter(
            f"{PREFIX}_autoscale_rest_requests",
            "Flink REST requests the autoscaler made to sample an app's metrics.",
            ["app"],
            registry=r,
        )
        self.autoscale_commits = Counter(
            f"{PREFIX}_autoscale_commits",
            "Commits the autoscaler wrote (mode: commit), by direction.",
            ["app", "direction"],
            registry=r,
        )
        self.autoscale_push_refused = Gauge(
            f"{PREFIX}_autoscale_push_refused",
            "1 while origin refuses the autoscaler's pushes for an app (a protected branch, a hook): it backs off and "
            "only recommends until a push is accepted again.",
            ["app"],
            registry=r,
        )

    # --- recording helpers (what the service and the daemon call) ---------------------------------
    def add_listener(self, listener: HealthListener) -> None:
        self._listeners.append(listener)

    def app_health(self, facts: Sequence[AppFacts], *, full: bool, owner: str = "") -> None:
        """Per-app health after a pass (service.ports.AppHealth): the `flink_reconciler_app_*` series, and the
        listeners (the alerter)."""
        self.app_health_collector.update(facts, full=full, owner=owner)
        for listener in self._listeners:
            listener.app_health(facts, full=full, owner=owner)

    def forget_owner(self, owner: str) -> None:
        self.app_health_collector.forget(owner)
        for listener in self._listeners:
            listener.forget_owner(owner)

    def count_notification(self, sink: str, result: str) -> None:
        self.notifications.labels(sink, result).inc()

    def count_notification_dropped(self, sink: str, reason: str) -> None:
        self.notifications_dropped.labels(sink, reason).inc()

    def observe_reconcile(self, app: str, seconds: float, outcome: Outcome | str) -> None:
        self.reconcile_duration.labels(app).observe(seconds)
        self.reconcile_outcomes.labels(app, str(outcome)).inc()

    def count_repair(self, kind: str, outcome: Outcome | str) -> None:
        self.repairs.labels(kind, str(outcome)).inc()

    def set_autoscale(self, app: str, *, current: int, wanted: int | None, verdict: str) -> None:
        self.autoscale_parallelism.labels(app, "current").set(current)
        if wanted is not None:
            self.autoscale_parallelism.labels(app, "wanted").set(wanted)
        for v in ("scale-up", "scale-down", "keep", "wait"):
            self.autoscale_verdict.labels(app, v).set(1 if v == verdict else 0)

    def count_autoscale_requests(self, app: str, n: int) -> None:
        self.autoscale_requests.labels(app).inc(n)

    def count_autoscale_commit(self, app: str, direction: str) -> None:
        self.autoscale_commits.labels(app, direction).inc()

    def set_autoscale_push_refused(self, app: str, refused: bool) -> None:
        self.autoscale_push_refused.labels(app).set(1 if refused else 0)

    def set_app_states(self, counts: dict[str, int], *, owner: str = "") -> None:
        """The apps of one reconciler (a shard's, or the only one) by state; the gauge is the sum over owners."""
        with self._app_states_lock:
            if counts:
                self._app_states[owner] = dict(counts)
            else:
                self._app_states.pop(owner, None)
            for state in APP_STATES:
                self.apps.labels(state).set(sum(c.get(state, 0) for c in self._app_states.values()))

    def set_applied_revision(self, app: str, revision: str) -> None:
        self.last_applied_revision.labels(app).info({"revision": revision})

    def forget_app(self, app: str) -> None:
        """Drop an app's series after it was deleted, so /metrics does not grow forever."""
        for metric in (self.reconcile_duration, self.last_applied_revision):
            with suppress(KeyError):
                metric.remove(app)
        for outcome in Outcome:
            with suppress(KeyError):
                self.reconcile_outcomes.remove(app, outcome.value)

    def observe_git_fetch(self, seconds: float, *, error: str | None = None) -> None:
        """Record one fetch; `error` names the failure kind (the error class) when it failed."""
        self.git_fetch_duration.observe(seconds)
        if error is not None:
            self.git_fetch_errors.labels(error).inc()
        else:
            self.git_last_fetch_success.set_to_current_time()
        for listener in self._listeners:
            listener.git_fetched(error=error)

    @contextmanager
    def time_git_fetch(self) -> Iterator[None]:
        """Time a fetch; an exception counts as an error of its class name."""
        t0 = time.perf_counter()
        try:
            yield
        except BaseException as e:
            self.observe_git_fetch(time.perf_counter() - t0, error=type(e).__name__)
            raise
        self.observe_git_fetch(time.perf_counter() - t0)

    def observe_step(self, step: str, seconds: float) -> None:
        self.step_duration.labels(step).observe(seconds)

    def set_inflight_steps(self, count: int) -> None:
        self.journal_inflight_steps.set(count)

    def count_webhook(self, forge: str, result: str) -> None:
        self.webhook_requests.labels(forge, result).inc()

    def count_http_refused(self, reason: str) -> None:
        self.http_refused.labels(reason).inc()

    def observe_sync(self, trigger: str, result: str, seconds: float) -> None:
        self.sync_passes.labels(trigger, result).inc()
        self.sync_duration.labels(trigger).observe(seconds)
        for listener in self._listeners:
            listener.sync_finished(ok=result == "ok")

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type) in the format the scraper asked for (text or OpenMetrics)."""
        encoder, content_type = choose_encoder(accept or "")
        body = encoder(self.registry)
        version = self.app_health_collector.version
        with self._app_text_lock:
            cached = self._app_text
            if cached is None or cached[:2] != (version, content_type):
                openmetrics = content_type.startswith("application/openmetrics-text")
                cached = self._app_text = (version, content_type,
                                           self.app_health_collector.render(openmetrics=openmetrics))
        eof = b"# EOF\n"
        if body.endswith(eof):  # OpenMetrics: one EOF, at the very end
            return body[: -len(eof)] + cached[2] + eof, content_type
        return body + cached[2], content_type
