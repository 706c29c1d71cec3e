"""The alert conditions ("triggers", as Argo CD Notifications calls them), from facts and the time. Pure.

Each trigger has the name of the Prometheus alert that says the same thing (deploy/alerts/), so a team reads
one vocabulary whether Prometheus or the daemon itself notifies it, and one runbook section per trigger
(docs/alerts.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from reconciler.alerting.facts import AppFacts, Phase


class Trigger(StrEnum):
    APP_BLOCKED = "app-blocked"
    CHANGE_FAILED = "change-failed"
    CRASH_LOOP = "crash-loop"
    CHECKPOINT_AGE = "checkpoint-age"
    JOB_NOT_RUNNING = "job-not-running"
    NOT_SYNCING = "not-syncing"
    GIT_FETCH_FAILING = "git-fetch-failing"
    RECORDS_UNREADABLE = "records-unreadable"


# trigger -> (Prometheus alert name, severity). The rules in deploy/alerts/ use these names (a test checks).
ALERTS: Mapping[Trigger, tuple[str, str]] = {
    Trigger.APP_BLOCKED: ("FlinkAppBlocked", "warning"),
    Trigger.CHANGE_FAILED: ("FlinkAppChangeFailed", "warning"),
    Trigger.CRASH_LOOP: ("FlinkAppCrashLooping", "critical"),
    Trigger.CHECKPOINT_AGE: ("FlinkAppCheckpointTooOld", "warning"),
    Trigger.JOB_NOT_RUNNING: ("FlinkAppJobNotRunning", "critical"),
    Trigger.NOT_SYNCING: ("FlinkReconcilerNotSyncing", "critical"),
    Trigger.GIT_FETCH_FAILING: ("FlinkReconcilerGitFetchFailing", "warning"),
    Trigger.RECORDS_UNREADABLE: ("FlinkReconcilerRecordsUnreadable", "warning"),
}
DAEMON_TRIGGERS = frozenset({Trigger.NOT_SYNCING, Trigger.GIT_FETCH_FAILING})
LIVE_TRIGGERS = frozenset({Trigger.CHECKPOINT_AGE, Trigger.JOB_NOT_RUNNING})  # judged from the observed job


def alert_name(trigger: Trigger) -> str:
    return ALERTS[trigger][0]


@dataclass(frozen=True)
class Thresholds:
    checkpoint_age_factor: float = 3.0  # the last checkpoint is older than this many checkpoint intervals ...
    checkpoint_age_min: timedelta = timedelta(minutes=2)  # ... and older than this
    job_down_for: timedelta = timedelta(minutes=5)  # job-not-running: down this long (outside a change)
    not_syncing_after: timedelta = timedelta(minutes=10)  # no pass completed for this long
    git_fetch_failures: int = 3  # consecutive failed fetches


@dataclass(frozen=True)
class Condition:
    """An active condition: of one app (`app`), or of the daemon (`app` is "")."""

    trigger: Trigger
    app: str
    namespace: str
    summary: str  # one line
    detail: str = ""  # what the reconciler said (a plan's reason, Flink's error), redacted before it leaves

    @property
    def key(self) -> tuple[Trigger, str]:
        return self.trigger, self.app


def app_conditions(f: AppFacts, now: datetime, t: Thresholds) -> list[Condition]:
    """Every condition active for one app."""
    out: list[Condition] = []

    def add(trigger: Trigger, summary: str) -> None:
        out.append(Condition(trigger, f.app, f.namespace, summary, f.reason))

    if f.record_unreadable is not None:
        out.append(Condition(Trigger.RECORDS_UNREADABLE, f.app, f.namespace,
                             f"the record of {f.app} cannot be read", f.record_unreadable))
    if f.phase is Phase.BLOCKED:
        add(Trigger.APP_BLOCKED, f"{f.app} is blocked and waits for a human")
    if f.change_failed:
        add(Trigger.CHANGE_FAILED, f"the last change of {f.app} failed")
    if f.phase is Phase.CRASH_LOOP:
        add(Trigger.CRASH_LOOP, f"{f.app} is crash-looping: repairs do not keep its job running")
    if not f.observed:
        return out  # what follows needs the live job; "could not look" is not "down"
    if f.job_running and f.checkpoint_interval_s and f.checkpoint_at is not None:
        age = now - f.checkpoint_at
        limit = max(t.checkpoint_age_min, timedelta(seconds=f.checkpoint_interval_s * t.checkpoint_age_factor))
        if age > limit:
            failed = f" ({f.checkpoints_failed} failed checkpoints)" if f.checkpoints_failed else ""
            add(Trigger.CHECKPOINT_AGE, f"the last checkpoint of {f.app} completed {_age(age)} ago, over "
                f"{t.checkpoint_age_factor:g}x its interval of {f.checkpoint_interval_s:g}s{failed}")
    if f.want_running and not f.job_running and f.phase in (Phase.IN_SYNC, Phase.HEALING):
        # changing: down on purpose; crash loop, blocked, failed: their own alerts say why
        since = f.unhealthy_since
        if since is None or now - since >= t.job_down_for:
            state = f.job_state or "no job"
            add(Trigger.JOB_NOT_RUNNING, f"the job of {f.app} is not running ({state})"
                + (f" since {since:%Y-%m-%d %H:%M:%S} UTC" if since else "") + " while Git wants it running")
    return out


def daemon_conditions(*, now: datetime, started_at: datetime, last_ok_pass: datetime | None,
                      fetch_failures: int, last_fetch_error: str | None, t: Thresholds) -> list[Condition]:
    """The daemon's own conditions: no pass completed for too long, Git fetches failing in a row."""
    out: list[Condition] = []
    since = last_ok_pass or started_at
    if now - since > t.not_syncing_after:
        what = (f"since {last_ok_pass:%Y-%m-%d %H:%M:%S} UTC" if last_ok_pass
                else f"since it started {_age(now - since)} ago")
        out.append(Condition(Trigger.NOT_SYNCING, "", "", f"the reconciler has not completed a sync pass {what}"))
    if fetch_failures >= t.git_fetch_failures:
        out.append(Condition(Trigger.GIT_FETCH_FAILING, "", "",
                             f"the last {fetch_failures} fetches of the Git repository failed", last_fetch_error or ""))
    return out


def all_conditions(facts: Iterable[AppFacts], now: datetime, t: Thresholds) -> list[Condition]:
    return [c for f in facts for c in app_conditions(f, now, t)]


def _age(d: timedelta) -> str:
    secs = int(d.total_seconds())
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    return f"{secs // 3600}h{(secs % 3600) // 60:02d}m"
