"""The daemon: when to sync, never two syncs at once, and a clean exit on SIGTERM.

Every trigger (startup, the poll and drift jobs of an apscheduler BackgroundScheduler, a webhook)
only *requests* a sync. One worker thread runs them, so two passes can never overlap, and requests
that arrive while a pass runs fold into a single follow-up pass (full if any of them asked for full).
A trigger never blocks: the HTTP thread answers the webhook at once, the scheduler thread is free.

Errors from a pass are logged and counted, never fatal: the next tick tries again.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Literal
from urllib.parse import urlsplit

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from pydantic import SecretStr

from reconciler import __version__
from reconciler.alerting.alerter import Alerter
from reconciler.clock import Clock, SystemClock
from reconciler.daemon.dashboard import dashboard_for
from reconciler.daemon.http import Endpoints, HttpServer, ProbeServer, allowed_hosts, refuse_unsafe_exposure
from reconciler.daemon.http_server import Limits
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.ports import AsksForPasses, ReconcileService, StatusSource
from reconciler.daemon.webhooks import WebhookEvent, WebhookSecrets
from reconciler.errors import ReconcilerError, ShutdownRequested
from reconciler.logs import mask_secrets, utc_timestamp
from reconciler.memory import release_memory
from reconciler.redaction import redact_url
from reconciler.settings import Settings
from reconciler.terminal import terminal_safe

log = logging.getLogger(__name__)

Trigger = Literal["startup", "poll", "drift", "webhook"]
DRIFT_JITTER = 0.1  # each drift pass starts up to this share of the interval late: replicas drift apart


@dataclass(frozen=True)
class SyncRecord:
    """One finished pass, for the status page and tests."""

    trigger: str
    full: bool
    reason: str
    started_at: datetime
    duration_s: float
    result: Literal["ok", "error"]
    error: str | None = None


@dataclass
class _Pending:
    full: bool
    trigger: str
    reasons: list[str] = field(default_factory=list)


class SyncRunner:
    """A single worker thread running service.sync; requests coalesce into at most one pending pass."""

    def __init__(self, service: ReconcileService, metrics: Metrics, clock: Clock) -> None:
        self._service = service
        self._metrics = metrics
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: _Pending | None = None
        self._current: _Pending | None = None
        self._current_since: datetime | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="sync", daemon=True)
        self.last: SyncRecord | None = None
        self.last_error: SyncRecord | None = None
        self.passes = {"ok": 0, "error": 0}

    def start(self) -> None:
        self._thread.start()

    def request(self, *, full: bool, trigger: str, reason: str) -> bool:
        """Ask for a pass. False once closed (shutting down). Never blocks on a running pass."""
        with self._cond:
            if self._closed:
                return False
            if self._pending is None:
                self._pending = _Pending(full=full, trigger=trigger, reasons=[reason])
                if self._current is not None:
                    log.debug("sync (%s) queued behind the running pass", trigger)
            else:
                if full and not self._pending.full:
                    self._pending.trigger = trigger  # the pass is now a drift pass: count it as one
                self._pending.full = self._pending.full or full
                if reason not in self._pending.reasons:
                    self._pending.reasons.append(reason)
                self._metrics.sync_requests_coalesced.labels(trigger).inc()
                log.debug("sync (%s) coalesced into the pending %s pass", trigger, self._pending.trigger)
            self._cond.notify_all()
            return True

    def close(self) -> _Pending | None:
        """Refuse new requests and drop the pending one (returned, for the log)."""
        with self._cond:
            self._closed = True
            dropped, self._pending = self._pending, None
            self._cond.notify_all()
            return dropped

    def join(self, timeout: float) -> bool:
        """Wait for the running pass to end; True if the worker stopped in time."""
        if not self._thread.is_alive():
            return True
        self._thread.join(timeout=max(0.0, timeout))
        return not self._thread.is_alive()

    @property
    def running(self) -> tuple[str, datetime] | None:
        with self._cond:
            if self._current is None or self._current_since is None:
                return None
            return self._current.trigger, self._current_since

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing runs or is pending (for tests and benchmarks)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._current is None and self._pending is None, timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._closed or self._pending is None:
                    return
                job, self._pending = self._pending, None
                self._current, self._current_since = job, self._clock.now()
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._current = self._current_since = None
                    self._cond.notify_all()

    def _run(self, job: _Pending) -> None:
        reason = "; ".join(job.reasons)
        started_at = self._clock.now()
        t0 = self._clock.monotonic()
        error: str | None = None
        log.info("sync started", extra={"trigger": job.trigger, "full": job.full, "reason": reason})
        try:
            self._service.sync(full=job.full, reason=reason)
        except ShutdownRequested:
            # Stopped while a step waited (the clock woke it): its transition stays in flight in the journal, and
            # the next start resumes it. Not a failed pass.
            log.info("sync stopped for shutdown: the waiting steps stay in flight and resume on the next start",
                     extra={"trigger": job.trigger})
            return
        except ReconcilerError as e:
            error = f"{type(e).__name__}: {e}"
            log.warning("sync failed: %s", error, extra={"trigger": job.trigger})
        except Exception as e:
            # A bug in a pass must not kill the daemon; the next tick retries. Keep the traceback.
            error = f"unexpected {type(e).__name__}: {e}"
            log.exception("sync crashed", extra={"trigger": job.trigger})
        duration = self._clock.monotonic() - t0
        result: Literal["ok", "error"] = "ok" if error is None else "error"
        record = SyncRecord(job.trigger, job.full, reason, started_at, duration, result, error)
        self.last = record
        self.passes[result] += 1
        if error is not None:
            self.last_error = record
        else:
            self._metrics.last_sync_success.set(self._clock.now().timestamp())
        self._metrics.observe_sync(job.trigger, result, duration)
        log.info("sync finished", extra={"trigger": job.trigger, "result": result, "seconds": round(duration, 3)})
        if job.full or duration >= 1.0:
            release_memory()


class Daemon:
    """Scheduler + sync worker + HTTP server around one ReconcileService."""

    def __init__(
        self,
        service: ReconcileService,
        settings: Settings,
        metrics: Metrics,
        clock: Clock | None = None,
        alerter: Alerter | None = None,
    ) -> None:
        self.service = service
        self.alerter = alerter  # conditions judged after each pass and on a timer; notifications (docs/alerts.md)
        self.settings = settings
        self.metrics = metrics
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.runner = SyncRunner(service, metrics, self.clock)
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopped: bool | None = None  # the result of the one stop()
        self._started_at: datetime | None = None
        self._scheduler = BackgroundScheduler(
            timezone=UTC,
            executors={"default": ThreadPoolExecutor(max_workers=1)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        webhook = settings.webhook_enabled
        refuse_unsafe_exposure(settings, settings.listen_host, webhook=webhook)
        self.http = HttpServer(
            settings.listen_host,
            settings.listen_port,
            Endpoints(
                secrets=_secrets(settings),
                branch=settings.branch,
                on_push=self.on_webhook,
                readiness=self.readiness,
                metrics=metrics,
                status_page=self.status_page,
                ui=dashboard_for(service, settings, self.clock, alerts=alerter.active if alerter else None),
                webhook=webhook,
            ),
            hosts=allowed_hosts(settings.listen_host, settings.allowed_hosts),
            limits=Limits(max_per_client=settings.max_connections_per_client),
        )
        self.probes = ProbeServer(
            settings.probe_host or settings.listen_host, settings.probe_port, readiness=self.readiness,
            metrics=metrics, alive=self.http.alive,
        )

    # --- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Serve HTTP, start the worker with a full startup pass, then schedule poll and drift."""
        self._started_at = self.clock.now()
        self.probes.start()
        try:
            self.http.start()
        except BaseException:
            self.probes.stop()
            raise
        self.runner.start()
        self.runner.request(full=True, trigger="startup", reason="startup")
        if isinstance(self.service, AsksForPasses):
            self.service.ask_for_passes_with(self._asked)
        self._scheduler.add_job(
            self._tick, "interval", seconds=self.settings.poll_interval, args=("poll",), id="poll", name="poll"
        )
        self._scheduler.add_job(
            self._tick, "interval", seconds=self.settings.drift_interval, args=("drift",), id="drift", name="drift",
            start_date=datetime.now(UTC) + timedelta(seconds=self.settings.drift_interval + self._drift_offset()),
            jitter=self.settings.drift_interval * DRIFT_JITTER,
        )
        if self.alerter is not None:  # time-based conditions (no pass for too long, a checkpoint aging) between passes
            self._scheduler.add_job(self.alerter.tick, "interval", seconds=min(30.0, self.settings.poll_interval),
                                    id="alerts", name="alerts")
        self._scheduler.start()
        log.info(
            "daemon started",
            extra={"poll_interval": self.settings.poll_interval, "drift_interval": self.settings.drift_interval},
        )

    def _drift_offset(self) -> float:
        """Shard i of N starts its drift timer i/N of an interval later: shard processes started together
        would otherwise run their full passes at the same moment and a push to any of them waits behind
        all N (push -> status p99, bench/scale_bench.py)."""
        s = self.settings
        return s.drift_interval * s.shard / s.shards if isinstance(s.shard, int) and s.shards > 1 else 0.0

    def stop(self, deadline_s: float | None = None) -> bool:
        """Stop scheduling, let the service finish or park its steps, wait for the pass, close HTTP.

        True when everything ended within the deadline. HTTP stays up until the end, so /healthz
        answers and /readyz says "shutting down" while the current step is parked.
        """
        with self._stop_lock:
            if self._stopped is not None:
                return self._stopped
            self._stopped = self._stop(self.settings.shutdown_deadline if deadline_s is None else deadline_s)
            return self._stopped

    def _stop(self, deadline: float) -> bool:
        t_end = self.clock.monotonic() + deadline
        self._stopping.set()
        clean = True
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        dropped = self.runner.close()
        self.clock.stop()  # every step waiting on the clock (a retry's backoff, a poll) wakes now and parks
        if dropped is not None:
            log.info("dropping the pending %s sync: shutting down", dropped.trigger)
        running = self.runner.running
        log.info(
            "shutting down",
            extra={"deadline_s": deadline, "running_sync": running[0] if running else None},
        )
        try:
            self.service.shutdown(deadline_s=max(0.0, t_end - self.clock.monotonic()))
        except Exception:
            clean = False
            log.exception("service shutdown failed")
        if not self.runner.join(t_end - self.clock.monotonic()):
            clean = False
            log.error("the running sync did not end within the %.1fs shutdown deadline", deadline)
        if self.alerter is not None:  # what is queued gets one more try, within what is left of the deadline
            self.alerter.close(timeout=max(0.5, min(5.0, t_end - self.clock.monotonic())))
        self.http.stop()
        self.probes.stop()
        log.info("daemon stopped", extra={"clean": clean})
        return clean

    def run_forever(self) -> int:
        """Run until SIGTERM or SIGINT; then shut down gracefully. Exit code 0 when clean, 1 otherwise.

        Must be called from the main thread (signal handlers live there).
        """
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if stop.is_set():
                log.warning("%s received again; still shutting down", name)
            else:
                log.info("%s received", name)
            stop.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            try:
                self.start()
            except BaseException:
                self.stop(deadline_s=0)
                raise
            # A timed wait, not stop.wait(): the kernel may deliver SIGTERM to another thread (one forking a JVM,
            # say); Python then runs our handler only when the main thread next runs bytecode, and an untimed
            # wait never returns to it (seen once in a 30-minute soak: SIGTERM ignored for a minute).
            while not stop.wait(timeout=0.5):
                pass
            return 0 if self.stop() else 1
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    # --- triggers ---------------------------------------------------------------------------------
    def request_sync(self, *, full: bool, trigger: Trigger, reason: str) -> bool:
        if self._stopping.is_set():
            return False
        return self.runner.request(full=full, trigger=trigger, reason=reason)

    def on_webhook(self, event: WebhookEvent) -> bool:
        return self.request_sync(full=False, trigger="webhook", reason=f"webhook: {event.describe()}")

    def _asked(self, reason: str) -> None:
        self.request_sync(full=False, trigger="poll", reason=reason)

    def _tick(self, trigger: Trigger) -> None:
        self.request_sync(full=trigger == "drift", trigger=trigger, reason=trigger)

    # --- what the endpoints show ------------------------------------------------------------------
    def readiness(self) -> tuple[bool, str]:
        """Ready once a pass has completed, and only while the last one did: a daemon whose every pass
        fails (Git unreachable, a spec value that crashes planning) must not look healthy. Then the
        service's own answer."""
        if self._stopping.is_set():
            return False, "shutting down"
        last = self.runner.last
        if self.runner.passes["ok"] == 0:
            running = self.runner.running
            why = "starting: no sync pass has completed yet"
            if running is not None:
                why += f" (a {running[0]} pass is running since {_ts(running[1])})"
            if last is not None and last.error:
                why += f"; the last one failed: {last.error}"
            return False, why
        if last is not None and last.result == "error":
            return False, f"the last sync pass ({last.trigger}, {_ts(last.started_at)}) failed: {last.error}"
        try:
            return self.service.readiness()
        except Exception as e:
            log.warning("readiness check failed: %s", e)
            return False, f"readiness check failed: {type(e).__name__}: {e}"

    def status_page(self) -> str:
        s = self.settings
        ready, why = self.readiness()
        lines = [
            f"flink-reconciler {__version__}",
            f"repository: {redact_url(s.repo_url or '-')} branch={s.branch} path=/{s.path}",
            f"runtime: {s.runtime}{' (dry run)' if s.dry_run else ''}  poll={s.poll_interval:g}s "
            f"drift={s.drift_interval:g}s  prune={'on' if s.prune else 'off'}"
            + (f"  shard={s.shard} of {s.shards}" if s.shards > 1 else ""),
            f"started: {_ts(self._started_at)}",
            f"ready: {'yes' if ready else 'no'} ({one_line(why)})",
        ]
        running = self.runner.running
        lines.append(f"sync: running {running[0]} pass since {_ts(running[1])}" if running else "sync: idle")
        last = self.runner.last
        if last is not None:
            lines.append(
                f"last sync: {_ts(last.started_at)} trigger={last.trigger} full={last.full} "
                f"result={last.result} took={last.duration_s:.2f}s"
            )
        if self.runner.last_error is not None:
            err = self.runner.last_error
            lines.append(f"last error: {_ts(err.started_at)} {one_line(str(err.error))}")
        lines.append(f"passes: {self.runner.passes['ok']} ok, {self.runner.passes['error']} failed")
        if self.alerter is not None:
            active = self.alerter.active()
            lines.append(f"active alerts: {len(active)}" + (" (docs/alerts.md)" if active else ""))
            lines.extend(f"  {a.alert:34} {a.app or '-'}: {one_line(a.summary[:300])}" for a in active[:50])
        if isinstance(self.service, StatusSource):
            try:
                lines.append("")
                lines.append(self.service.status_text().rstrip("\n"))
            except Exception as e:
                lines.append(f"(app status unavailable: {type(e).__name__}: {one_line(str(e))})")
        return "\n".join(lines) + "\n"


def _secrets(settings: Settings) -> WebhookSecrets:
    """The webhook secrets; every configured secret is also registered with the log/HTTP redaction."""
    def raw(value: SecretStr | None) -> bytes | None:
        return value.get_secret_value().encode() if isinstance(value, SecretStr) else None

    configured = (settings.git_token, settings.forge_token, settings.github_webhook_secret,
                  settings.gitlab_webhook_token, settings.gitea_webhook_secret)
    mask_secrets(*(v.get_secret_value() for v in configured if isinstance(v, SecretStr)),
                 *_url_credentials(settings.repo_url))
    return WebhookSecrets(
        github=raw(settings.github_webhook_secret),
        gitlab=raw(settings.gitlab_webhook_token),
        gitea=raw(settings.gitea_webhook_secret),
    )


def _url_credentials(url: str | None) -> tuple[str | None, str | None]:
    """The user and password of an http(s) URL: a token is often given as the user (https://TOKEN@host)."""
    if not url or not url.lower().startswith(("http://", "https://")):
        return None, None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None, None
    return parts.username, parts.password


def one_line(text: str) -> str:
    """A field of one line of the status page: its newlines escaped too (the page escapes control characters)."""
    return terminal_safe(text, newlines=False)


def _ts(when: datetime | None) -> str:
    return utc_timestamp(when.timestamp()) if when is not None else "-"
