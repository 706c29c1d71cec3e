"""Self-healing: let Flink recover first, restart dead processes, repair a job that is gone from its newest state,
and never loop (docs/plan.md#self-healing). Pure: since when a job is unhealthy and when repairs ran come from
the app's record.
"""

from __future__ import annotations

import re

from reconciler.core.context import Ctx, age_text, ctx_start_steps, failed_before, step_deadlines
from reconciler.core.diff import highest_class
from reconciler.core.observed import ClusterPhase, JobPhase, LiveApp
from reconciler.core.plan import (
    NO_STATE,
    Action,
    AppPlan,
    AwaitRunning,
    CancelJob,
    EnsureCluster,
    Restore,
    RestoreKind,
    SpecRef,
    Step,
)
from reconciler.core.restore import restore_when_not_running
from reconciler.spec.model import ChangeClass, JobState, UpgradeMode


def heal_previous(ctx: Ctx, failed: AppPlan) -> AppPlan:
    """Git's spec failed (`failed`: this spec already failed, not retried until Git changes it) and the job is not
    running healthily: an upgrade that failed while its old job died too (a stop that failed, then a kill; a new job
    that could not start and a rollback that could not restart the old one). The last applied spec runs again,
    healed as if Git still asked for it: from its newest savepoint or checkpoint, never empty, with the crash-loop
    guard and its backoff counted under that spec's hash (`recovering`, `repair_guard`, `repair`). The plan says both
    facts, and names the failure (`AppPlan.failed`) so the commit's status stays a failure. Without a last applied
    spec that ran (a create or a resume failed) there is nothing to go back to: `failed` stands."""
    prev, rec = ctx.previous, ctx.inp.records.get(ctx.name)
    if prev is None or prev.spec.job.state is not JobState.RUNNING or rec is None or ctx.previous_canonical is None:
        return failed
    live = ctx.live
    if live.ha_job_id is not None and live.ha_job_id != rec.job_id:
        # Flink's HA data of a job the record does not say runs (the failed spec's new job): never rejoined.
        live = live.model_copy(update={"ha_job_id": None})
    back = Ctx(ctx.name, prev, prev, live, ctx.inp, (), ctx.previous_canonical, ctx.previous_canonical)
    kind = repair_kind(live)
    healed = recovering(back) or repair_guard(back, kind) or repair(back)
    at = rec.last_applied_revision
    spec_at = f"the last applied spec (revision {at[:12]})" if at else "the last applied spec"
    # What the failure said of the old job then ("keeps running") is not true now that nothing runs: left out.
    why = _STILL_RAN.sub("", failed.reason.split(". Not retrying in a loop", 1)[0])
    if healed.action is Action.REPAIR:
        said = f"{why}; it is not retried until Git changes it. Meanwhile {spec_at} runs again: {healed.reason}"
    elif healed.action is Action.BLOCKED:
        said = f"{_STILL_RAN.sub('', failed.reason)} And {spec_at} cannot run again by itself either: {healed.reason}"
    else:
        said = f"{_STILL_RAN.sub('', failed.reason)} Meanwhile, for {spec_at}: {healed.reason}"
    return healed.model_copy(update={"reason": said, "failed": why, "desired_revision": at,
                                     "repair": healed.repair or kind})


_STILL_RAN = re.compile(r"; the old job keeps running \(Flink says job [0-9a-f]+ is RUNNING\)")


def repair(ctx: Ctx) -> AppPlan:
    rejoined = rejoin(ctx)
    if rejoined is not None:
        return rejoined
    live = ctx.live
    what = (f"job {live.job_id} is {live.flink_state}" if live.job_id
            else "the cluster is gone" if live.cluster is ClusterPhase.ABSENT
            else f"job {live.stopped_job_id} has ended" if live.stopped_job_id else "no job is running")
    found = restore_when_not_running(ctx, what)
    if isinstance(found, AppPlan):
        return found
    restore, risks, src = found
    steps: list[Step] = []
    if live.job_id and live.job in (JobPhase.FAILING, JobPhase.STARTING) and live.cluster is not ClusterPhase.FAILED:
        steps.append(CancelJob(job_id=live.job_id, deadline_s=step_deadlines(ctx)[0]))
    steps.extend(ctx_start_steps(ctx, restore, ctx.job_id))
    origin = src.describe() if src else restore.describe()
    return ctx.app_plan(Action.REPAIR, f"drift: {what}; restarting from {origin}",
                        risks=risks, steps=tuple(steps), repair=repair_kind(live))


def rejoin(ctx: Ctx) -> AppPlan | None:
    """A job whose JobManager is gone while Flink's HA data of it remains (Kubernetes HA: a deleted JobManager
    Deployment, a deleted cluster): the same job id is started again, and Flink resumes it from its latest
    checkpoint, as it does when the kubelet replaces the pod. A new job would start from the newest state the
    planner can see, which on Kubernetes is the last savepoint on record (checkpoints are in the HA data and the
    object store): older than the latest checkpoint, a silent rewind. Only for a job of the app's own lineage, and
    only while the spec is the one it ran (an upgrade-class change waits until it runs again: then it is upgraded
    from a savepoint)."""
    live, rec = ctx.live, ctx.inp.records.get(ctx.name)
    job = live.ha_job_id
    if job is None or live.job_id is not None or rec is None or job not in {rec.job_id, *rec.job_ids} \
            or highest_class(ctx.changes) >= ChangeClass.UPGRADE:
        return None
    sp = rec.latest_savepoint
    stateless = ctx.desired.spec.job.upgrade_mode is UpgradeMode.STATELESS
    restore = Restore(kind=RestoreKind.PATH, path=sp.path) if sp and not stateless else NO_STATE
    gone = "its cluster is gone" if live.cluster is ClusterPhase.ABSENT else "its JobManager is gone"
    return ctx.app_plan(
        Action.REPAIR, f"drift: {gone}, and Flink's HA data of job {job} remains: starting job {job} again, which "
        "Flink resumes from its latest checkpoint (the restore point of its arguments, "
        f"{restore.path or 'empty state'}, only if it has none)",
        steps=tuple(ctx_start_steps(ctx, restore, job)), repair=repair_kind(live))


# Flink states a job passes through while Flink itself recovers it (its restart strategy, slots coming back).
_RECOVERING_STATES = frozenset({"RESTARTING", "INITIALIZING", "CREATED", "RECONCILING", "FAILING", "RUNNING"})


def repair_kind(live: LiveApp) -> str:
    """What a repair brings back, for its metric and its history line."""
    if live.missing_processes:
        return "jobmanager" if any("jobmanager" in p for p in live.missing_processes) else "taskmanager"
    if live.cluster is ClusterPhase.FAILED:
        return "jobmanager"
    if live.cluster is ClusterPhase.ABSENT:
        return "cluster"
    return "job"


def recovering(ctx: Ctx) -> AppPlan | None:
    """Let Flink recover first. A job Flink is restarting (or a cluster still coming back) is given the app's
    recovery.gracePeriod, counted from when the job was first seen unhealthy; dead processes of a cluster whose
    JobManager is up are restarted at once (nothing else would), and the job then recovers on them by itself.
    None: nothing is recovering, or the grace period is over: the caller repairs."""
    live = ctx.live
    rec = ctx.inp.records.get(ctx.name)
    gave_up = (live.flink_state or "").upper() == "FAILED"  # Flink's restart strategy is exhausted: a full repair
    if live.missing_processes and live.job_id is None and repair_kind(live) == "jobmanager":
        # Nothing else brings back a JobManager that is gone; a spec that failed is still not retried in a loop.
        return failed_before(ctx) or repair_guard(ctx, "jobmanager") or repair(ctx)
    if live.missing_processes and live.cluster is not ClusterPhase.FAILED and not gave_up:
        kind = repair_kind(live)
        runs_other = ctx.previous_canonical is not None and ctx.previous_canonical != ctx.desired_canonical
        # The repair is recorded under the spec it applies (what runs), so its crash-loop window is counted there.
        guard = repair_guard(ctx, kind, spec_hash=ctx.previous.spec_hash if runs_other and ctx.previous else None)
        if guard is not None:
            return guard
        ref = SpecRef.PREVIOUS if ctx.previous is not None else SpecRef.DESIRED  # what runs, not a new config
        _, start, _ = step_deadlines(ctx)
        steps: list[Step] = [EnsureCluster(spec=ref, deadline_s=start, keep_running=True)]
        if live.job_id:
            steps.append(AwaitRunning(job_id=live.job_id, deadline_s=start))
        fixed = ctx.app_plan(
            Action.REPAIR,
            f"{', '.join(live.missing_processes)} not running: restarting it on the live cluster"
            + (f"; job {live.job_id} recovers from its latest checkpoint by itself" if live.job_id else ""),
            steps=tuple(steps), repair=kind)
        if runs_other:
            # What this repair applies is what runs: a Git change waits for the next pass, which plans it as the
            # upgrade it is (recording the new spec as applied here would skip it for good).
            fixed = fixed.model_copy(update={"desired": ctx.previous_canonical, "diff": (),
                                             "change_class": ChangeClass.IGNORE,
                                             "desired_revision": rec.last_applied_revision if rec else None})
        return fixed
    if live.cluster is ClusterPhase.STARTING and live.job_id is None:
        what = f"the cluster is coming back ({live.cluster_message or 'starting'})"
    elif live.job_id and live.job in (JobPhase.STARTING, JobPhase.FAILING) and (
            (live.flink_state or "").upper() in _RECOVERING_STATES):
        what = f"Flink is recovering job {live.job_id} ({live.flink_state})"
    else:
        return None
    since = (rec.unhealthy_since if rec else None) or ctx.inp.now
    grace = ctx.desired.spec.recovery.grace_period
    if ctx.inp.now - since >= grace:
        return None
    return ctx.app_plan(
        Action.NOOP, f"recovering since {since:%Y-%m-%d %H:%M:%S} UTC: {what}; if it is not running by "
        f"{since + grace:%H:%M:%S} UTC (recovery.gracePeriod {age_text(grace)}), it is restarted from its newest "
        "checkpoint or savepoint", repair="recovering")


def repair_guard(ctx: Ctx, kind: str, *, spec_hash: str | None = None) -> AppPlan | None:
    """No crash loops: repairs of one spec (`spec_hash`, by default the desired one) back off exponentially, and
    after too many within the window the app is failed with Flink's last error and left alone until Git changes
    (a fix, or a restartNonce bump)."""
    rec = ctx.inp.records.get(ctx.name)
    if rec is None or rec.repairs_spec_hash != (spec_hash or ctx.desired.spec_hash):
        return None
    pol = ctx.inp.policy
    recent = sorted(t for t in rec.repairs if ctx.inp.now - t <= pol.repair_window)
    if not recent:
        return None
    if len(recent) >= pol.repair_max_attempts:
        error = ctx.live.job_exception or (rec.last_message if rec.last_action == Action.REPAIR.value else None)
        return ctx.app_plan(
            Action.BLOCKED,
            f"crash loop: {len(recent)} automatic repairs within {age_text(pol.repair_window)} did not keep the job "
            f"running" + (f"; last error: {error}" if error else "") + ". Not restarting it again: push a fix, "
            "or bump spec.job.restartNonce to retry the same spec.", repair=kind)
    wait = min(pol.repair_backoff_max, pol.repair_backoff * 2 ** (len(recent) - 1))
    if ctx.inp.now < recent[-1] + wait:
        return ctx.app_plan(
            Action.NOOP, f"{kind} needs a repair; attempt {len(recent) + 1} waits until "
            f"{recent[-1] + wait:%H:%M:%S} UTC (backoff {age_text(wait)} after {len(recent)} within "
            f"{age_text(pol.repair_window)})", repair=kind)
    return None
