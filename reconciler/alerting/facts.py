"""What one pass observed about an app, as one frozen value: the input of the per-app metrics and of the alert
conditions. Pure: built from the plan, the execution's outcome, the live state and the record the pass already
had in hand, so health costs no request beyond what observing the app asked (docs/alerts.md#metrics).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from reconciler.core.context import FAILED_BEFORE
from reconciler.core.observed import AppRecord, ClusterPhase, JobPhase, LiveApp, Outcome
from reconciler.core.plan import INTERRUPTED, Action, AppPlan
from reconciler.spec.model import FlinkApp, JobState

CHECKPOINT_INTERVAL_KEY = "execution.checkpointing.interval"


class Phase(StrEnum):
    """Where an app stands after a pass: `flink_reconciler_app_phase{phase=...}`."""

    IN_SYNC = "in_sync"  # what Git says runs (or is suspended) as it says
    CHANGING = "changing"  # a change is being applied (or was parked mid-way)
    HEALING = "healing"  # Flink is recovering the job within recovery.gracePeriod, or a repair runs
    CRASH_LOOP = "crash_loop"  # repairs back off (crash-loop backoff), or gave up after too many
    BLOCKED = "blocked"  # needs a human: the reason says what to do
    FAILED = "failed"  # the last change of this spec failed (rolled back); not retried in a loop
    INVALID = "invalid"  # the spec in Git is invalid; nothing is done to the app


@dataclass(frozen=True)
class AppFacts:
    app: str
    namespace: str
    phase: Phase
    reason: str  # the plan's reason or the execution's message: words for a human, may quote Flink
    want_running: bool | None = None  # Git wants the job running (None: no valid spec to say)
    observed: bool = True  # False: the runtime could not be read this pass (nothing below is known)
    job_state: str | None = None  # Flink's state of the app's job (None: no job)
    job_running: bool = False  # RUNNING with every task running
    restarts: int | None = None  # Flink's numRestarts of that job
    checkpoint_at: datetime | None = None  # the job's last completed checkpoint
    checkpoint_interval_s: float | None = None  # execution.checkpointing.interval (None: checkpointing off)
    checkpoints_failed: int | None = None  # the job's failed checkpoints (Flink's counts.failed)
    savepoint_at: datetime | None = None  # the newest savepoint on record
    unhealthy_since: datetime | None = None  # since when the job is seen down (the record's, for self-healing)
    record_unreadable: str | None = None  # the record cannot be read: why, and what to do
    repaired: bool = False  # this pass ran a repair that succeeded (a heal done)
    # Git's spec failed and is not retried until Git changes it, whatever the last applied spec does meanwhile (heals,
    # a crash loop of its own): the change-failed alert follows this, not the phase, so a crash loop of the healed
    # spec neither resolves nor re-fires it.
    change_failed: bool = False
    # False: this pass neither observed the app nor executed anything for it (its plan is "nothing until it can be
    # observed"): its phase is not known, and the last known one stands (`carry_over`).
    judged: bool = True


def phase_of(ap: AppPlan, outcome: Outcome | None, *, repeated_repair: bool = False,
             interrupted: bool = False) -> Phase:
    """The app's phase from its plan and how this pass's execution of it ended (None: not executed here).
    `repeated_repair`: the record holds an earlier repair within the crash-loop window. `interrupted`: the execution
    that failed was cut off by a fault (its JobManager died mid-way, `core.plan.INTERRUPTED`), not refused by the
    spec: the next pass heals the app and applies the spec, so it is healing, not a failed change (found by the
    chaos soak: a JobManager kill in an upgrade paged "change failed" and resolved it 8 s later).

    Git's spec that failed stays `failed` while the last applied spec is healed meanwhile (`AppPlan.failed`): the
    passes of that time alternate between "this spec already failed" (the job runs) and a heal (it does not), and
    the phase must not follow them, or the change-failed alert fires and resolves on every pass (found by the chaos
    soak). Only a crash loop or a block of the healed spec says more."""
    phase = Phase.HEALING if interrupted and outcome is Outcome.FAILURE else _plan_phase(ap, outcome)
    if phase is Phase.HEALING and repeated_repair and ap.action is Action.REPAIR:
        phase = Phase.CRASH_LOOP
    if ap.failed is not None and phase in (Phase.IN_SYNC, Phase.HEALING, Phase.CHANGING):
        return Phase.FAILED
    return phase


def _plan_phase(ap: AppPlan, outcome: Outcome | None) -> Phase:
    if ap.action is Action.ERROR or outcome is Outcome.ERROR:
        return Phase.INVALID
    if ap.action is Action.BLOCKED:
        if ap.reason.startswith(FAILED_BEFORE):
            return Phase.FAILED
        return Phase.CRASH_LOOP if ap.repair not in (None, "recovering") else Phase.BLOCKED
    if ap.action is Action.NOOP:
        if ap.repair == "recovering":
            return Phase.HEALING
        return Phase.CRASH_LOOP if ap.repair is not None else Phase.IN_SYNC
    if outcome is Outcome.FAILURE:
        return Phase.HEALING if ap.action is Action.REPAIR else Phase.FAILED
    if outcome is Outcome.SUCCESS:
        return Phase.IN_SYNC
    return Phase.HEALING if ap.action is Action.REPAIR else Phase.CHANGING


def facts_of(ap: AppPlan, *, outcome: Outcome | None, message: str | None, live: LiveApp,
             record: AppRecord | None, spec: FlinkApp | None, unreadable: str | None = None,
             now: datetime | None = None, repair_window: timedelta | None = None) -> AppFacts:
    """One app's facts after a pass. `spec`: the app's spec in Git (else the one applied last), for its namespace,
    whether its job should run and its checkpoint interval. `now` and `repair_window` (the crash-loop window of
    self-healing): a repair that is not the first within the window is part of a crash loop, not a heal, so the
    phase does not flap between the repairs and the backoff waits in between."""
    repeated = (record is not None and now is not None and repair_window is not None
                and sum(1 for t in record.repairs if now - t <= repair_window) >= 2)
    interrupted = record is not None and record.last_action == INTERRUPTED
    phase = phase_of(ap, outcome, repeated_repair=repeated, interrupted=interrupted)
    observed = live.cluster is not ClusterPhase.UNKNOWN
    interval = None
    if spec is not None:
        interval = flink_duration_s(spec.spec.flink_configuration.get(CHECKPOINT_INTERVAL_KEY))
    has_job = observed and live.job_id is not None
    return AppFacts(
        app=ap.app,
        namespace=spec.metadata.namespace if spec is not None else "",
        phase=phase,
        reason=message if message and outcome in (Outcome.FAILURE, Outcome.ERROR) else ap.reason,
        want_running=(spec.spec.job.state is JobState.RUNNING) if spec is not None else None,
        observed=observed,
        job_state=live.flink_state if has_job else None,
        job_running=has_job and live.job is JobPhase.RUNNING,
        restarts=live.restarts if has_job else None,
        checkpoint_at=live.latest_checkpoint.completed_at if has_job and live.latest_checkpoint else None,
        checkpoint_interval_s=interval if interval else None,
        checkpoints_failed=live.checkpoints_failed if has_job else None,
        savepoint_at=record.latest_savepoint.taken_at if record is not None and record.latest_savepoint else None,
        unhealthy_since=record.unhealthy_since if record is not None else None,
        record_unreadable=unreadable,
        repaired=ap.action is Action.REPAIR and outcome is Outcome.SUCCESS,
        change_failed=phase is Phase.FAILED or ap.failed is not None or (
            # Whatever this pass planned (a pass that could not observe the app plans "nothing until it can", a
            # NOOP): the record remembers Git's spec as failed (`core.context.failed_before`). Found by the chaos soak.
            record is not None and spec is not None and record.failed_spec_hash is not None
            and record.failed_spec_hash == spec.spec_hash),
        judged=outcome is not None or observed,
    )


def carry_over(new: AppFacts, old: AppFacts | None) -> AppFacts:
    """The facts to keep after a pass: a pass that could not look at the app (`judged` False) says nothing of its
    phase, so the last known one stands; a blocked or crash-looping app does not read as in sync (and resolve its
    alert) for one pass whose JobManager did not answer (found by the chaos soak)."""
    if new.judged or old is None:
        return new
    return replace(new, phase=old.phase, reason=old.reason, change_failed=new.change_failed or old.change_failed)


# Flink's duration syntax (org.apache.flink.util.TimeUtils): a number and a unit, "10 s", "1min", "500ms", or ISO-8601.
_FLINK_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zμ]*)\s*", re.IGNORECASE)
_FLINK_UNITS = {
    **dict.fromkeys(("", "ms", "milli", "millis", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}
_ISO = re.compile(r"PT(?:([0-9.]+)H)?(?:([0-9.]+)M)?(?:([0-9.]+)S)?", re.IGNORECASE)


def flink_duration_s(text: str | None) -> float | None:
    """Seconds of a Flink duration value (a bare number is milliseconds, as Flink reads it); None when unset or
    unreadable (the checkpoint-age condition is then off for that app, never a guess)."""
    if text is None:
        return None
    m = _FLINK_DURATION.fullmatch(text)
    if m and m.group(2).lower() in _FLINK_UNITS:
        return float(m.group(1)) * _FLINK_UNITS[m.group(2).lower()]
    iso = _ISO.fullmatch(text.strip())
    if iso and any(iso.groups()):
        h, mi, s = (float(g) if g else 0.0 for g in iso.groups())
        return h * 3600 + mi * 60 + s
    return None
