"""The decision table: (desired, live, records, policy) -> Plan. Pure; every safety rule lives here.

Read top to bottom, `_plan_app` is the ladder a reviewer checks: invalid specs never act, deletions
pass the guards, a failed revision is not retried in a loop, and every path that would start a job
without its state either has the spec's consent (stateless) and says so in `risks`, or is blocked
with an instruction.

Over 600 lines for one concern, the ladder of decisions a reviewer reads top to bottom; the restore-point
choice (`core.restore`) and self-healing (`core.heal`) are their own modules.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime

from reconciler.core.context import (
    Ctx,
    Desired,
    PlanInput,
    Policy,
    ctx_start_steps,
    failed_before,
    seconds,
    start_steps,
    step_deadlines,
)
from reconciler.core.diff import diff, field_name, highest_class
from reconciler.core.heal import heal_previous, recovering, repair, repair_guard, repair_kind
from reconciler.core.observed import (
    ClusterPhase,
    JobPhase,
    LiveApp,
    LiveState,
    Records,
)
from reconciler.core.plan import (
    CAPTURED,
    NO_STATE,
    Action,
    AppPlan,
    CancelJob,
    ClusterStrategy,
    DeleteCluster,
    DeleteRetiredCluster,
    DiscardStandby,
    EnsureCluster,
    FieldChange,
    ForgetApp,
    Plan,
    PromoteStandby,
    Restore,
    RestoreKind,
    SpecRef,
    StartStandbyCluster,
    Step,
    StopWithSavepoint,
)
from reconciler.core.rescale import in_place_rescale
from reconciler.core.restore import restore_when_not_running
from reconciler.core.takeover import plan_takeover
from reconciler.spec.load import LoadResult, file_key
from reconciler.spec.model import ChangeClass, Deadlines, DeletionPolicy, FlinkApp, JobState, UpgradeMode
from reconciler.spec.model import ClusterStrategy as SpecClusterStrategy

OFFLINE_JOB_ID = "<running job>"  # offline previews do not know the live job id
# A job of this exact spec runs but no record says we applied it (records lost): the shell records it as
# applied, so the next change has a previous spec to diff against and to roll back to.
ADOPTED_RUNNING = "already running this spec (adopted)"
DEFAULT_POLICY = Policy()

# The planner's input types live in core.context (shared with core.heal and core.restore); callers import them here.
__all__ = ["ADOPTED_RUNNING", "OFFLINE_JOB_ID", "Desired", "PlanInput", "Policy", "assumed_live", "cluster_changes",
           "desired_from", "offline_input", "plan", "start_steps"]


def plan(inp: PlanInput, only: Collection[str] | None = None) -> Plan:
    """Plan every app, or only the apps in `only` (the incremental path: files changed in one push).

    The mass-deletion guard always counts the whole repository, whatever `only` says, orphans included."""
    orphans = _orphans(inp)
    names = set(inp.desired.apps) | set(inp.previous) | _erroring_apps(inp.desired) | orphans | set(inp.records.broken)
    deletions = [n for n in set(inp.previous) - set(inp.desired.apps) if not _source_broken(n, inp)]
    deployed = set(inp.previous) | {n for n, a in inp.live.apps.items() if a.cluster is not ClusterPhase.ABSENT}
    guard = (_unreadable_guard(len(deletions) + len(orphans), inp)
             or _mass_delete_guard(len(deletions) + len(orphans), len(deployed), inp))
    selected = sorted(names if only is None else names & set(only))
    apps = tuple(_plan_unreadable(name, inp)
                 or (_plan_orphan(name, inp, guard) if name in orphans else _plan_app(name, inp, guard))
                 for name in selected)
    return Plan(
        revision=inp.revision,
        base_revision=inp.base_revision,
        mode=inp.mode,
        live_fingerprint=inp.live.fingerprint(),
        apps=apps,
        guard=guard,
    )


def _erroring_apps(desired: Desired) -> set[str]:
    return {e.app for e in desired.errors if e.app}


def _source_broken(name: str, inp: PlanInput) -> bool:
    """The app's file is broken, or lies under a broken path (a folder of specs replaced by a symlink)."""
    src = inp.previous_sources.get(name) or inp.desired.sources.get(name)
    broken = inp.desired.broken_files
    return (src is not None and (src in broken or any(src.startswith(b.rstrip("/") + "/") for b in broken))) or (
        name in inp.desired.errors_by_app
    )


def _unreadable_guard(n_deletions: int, inp: PlanInput) -> str | None:
    """A file that cannot be read and names no app may hold an app that moved there (a rename onto a
    symlink, a path with a newline): no deletion while one exists."""
    files = sorted({e.app for e in inp.desired.errors if e.app is not None and e.app == file_key(e.file)})
    if not files or not n_deletions or not inp.policy.prune:
        return None
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return (f"refusing to delete while {shown} cannot be read: an app removed from its old file may have "
            "moved there. Fix or remove the unreadable file first; nothing is deleted.")


def _orphans(inp: PlanInput) -> set[str]:
    """Clusters the runtime manages with no spec in Git and no record: apps deleted from Git while the
    records were lost. Nothing else says they existed, so they are planned from the live view."""
    known = set(inp.desired.apps) | set(inp.previous) | _erroring_apps(inp.desired) | set(inp.records.broken)
    return {n for n, a in inp.live.apps.items()
            if a.cluster is not ClusterPhase.ABSENT and n not in known and not _source_broken(n, inp)}


def _mass_delete_guard(n_deletions: int, known: int, inp: PlanInput) -> str | None:
    if n_deletions == 0 or inp.policy.allow_mass_delete or not inp.policy.prune:
        return None
    if not inp.desired.apps and not inp.desired.errors:
        return (f"refusing to delete: revision {inp.revision[:12]} has no app specs at all while {known} "
                "app(s) are deployed (empty checkout or wrong path?). Nothing is deleted. If every app really "
                "is to go, run `flink-reconciler apply --prune --allow-mass-delete` once.")
    if n_deletions >= inp.policy.mass_delete_min and n_deletions > inp.policy.mass_delete_fraction * known:
        return (f"refusing to delete {n_deletions} of {known} apps at once (mass-deletion guard, threshold "
                f"{inp.policy.mass_delete_fraction:.0%}). If intended, delete them in smaller commits, run "
                "`flink-reconciler apply --prune --allow-mass-delete` once, or raise the daemon's "
                "mass_delete_threshold (FLINK_RECONCILER_MASS_DELETE_THRESHOLD).")
    return None


def _plan_unreadable(name: str, inp: PlanInput) -> AppPlan | None:
    """An app whose record, or whose runtime's own account of it, exists but cannot be read waits, BLOCKED with
    what is wrong and what to do. Planned without them it would look like a first sight: a create from empty
    state, an orphan to delete. Every other app is planned as usual."""
    why = inp.records.broken.get(name)
    if why is None:
        live = inp.live.apps.get(name)
        why = live.unreadable if live is not None else None
    if why is None:
        return None
    return AppPlan(app=name, action=Action.BLOCKED, source_file=_src(name, inp), reason=why)


def _plan_app(name: str, inp: PlanInput, guard: str | None) -> AppPlan:
    desired = inp.desired.apps.get(name)
    previous = inp.previous.get(name)
    live = inp.live.get(name)
    errors = inp.desired.errors_by_app.get(name, ())
    if errors or (desired is None and _source_broken(name, inp)):
        if errors:
            reason = "; ".join(str(e) for e in errors) + " (invalid spec: the app is left as it is)"
        else:
            src = inp.previous_sources.get(name)
            in_file = [str(e) for e in inp.desired.errors_by_file.get(src or "", ())]
            reason = (f"{src} could not be read or no longer holds app {name}"
                      + (f" ({'; '.join(in_file[:2])})" if in_file else "")
                      + ": the app is left as it is until the file is fixed")
        return AppPlan(app=name, action=Action.ERROR, source_file=_src(name, inp), reason=reason)
    if desired is None:
        assert previous is not None
        return _plan_delete(name, previous, live, inp, guard)
    return _plan_present(name, desired, previous, live, inp)


def _src(name: str, inp: PlanInput) -> str | None:
    return inp.desired.sources.get(name) or inp.previous_sources.get(name)


# ---------------------------------------------------------------------------------------------------
# deletion


def _plan_delete(name: str, previous: FlinkApp, live: LiveApp, inp: PlanInput, guard: str | None) -> AppPlan:
    base = {"app": name, "source_file": _src(name, inp), "previous": previous.canonical()}
    policy = previous.spec.deletion_policy
    if not inp.policy.prune:
        return AppPlan(**base, action=Action.NOOP,
                       reason="spec removed from Git; pruning is disabled, so the app keeps running "
                              "(enable prune to delete it)")
    if guard:
        return AppPlan(**base, action=Action.BLOCKED, reason=guard)
    d = previous.spec.deadlines
    if policy is DeletionPolicy.ORPHAN:
        return AppPlan(**base, action=Action.DELETE,
                       reason="spec removed; deletionPolicy orphan: stop managing it, cluster keeps running",
                       steps=(ForgetApp(deadline_s=10),))
    if live.cluster is ClusterPhase.UNKNOWN:
        return AppPlan(**base, action=Action.BLOCKED,
                       reason=f"spec removed but the app could not be observed ({live.cluster_message}); "
                              "deletion waits until it can take a final savepoint")
    steps: list[Step] = []
    risks: list[str] = []
    job_id = live.job_id
    if policy is DeletionPolicy.SAVEPOINT_THEN_DELETE:
        if job_id and live.job is JobPhase.RUNNING:
            steps.append(StopWithSavepoint(job_id=job_id, deadline_s=seconds(d.savepoint)))
        elif job_id and live.job in (JobPhase.STARTING, JobPhase.FAILING):
            return AppPlan(**base, action=Action.BLOCKED,
                           reason=f"spec removed but job {job_id} is {live.flink_state}: no final savepoint "
                                  "is possible. Wait for it to recover, or set deletionPolicy: delete in the "
                                  "spec (restored from Git history) to delete without a savepoint.")
    elif job_id and live.job in (JobPhase.RUNNING, JobPhase.STARTING, JobPhase.FAILING):
        steps.append(CancelJob(job_id=job_id, deadline_s=seconds(d.savepoint)))
        risks.append(f"DELETES APP {name} WITHOUT A FINAL SAVEPOINT (deletionPolicy: delete): its state is dropped")
    steps.append(DeleteCluster(deadline_s=seconds(d.delete)))
    risks.insert(0, f"DELETES APP {name}: spec removed from Git")
    reason = "spec removed; " + ("final savepoint, then delete the cluster" if len(steps) > 1
                                 and policy is DeletionPolicy.SAVEPOINT_THEN_DELETE else "delete the cluster")
    return AppPlan(**base, action=Action.DELETE, reason=reason, risks=tuple(risks),
                   steps=tuple(steps))


def _plan_orphan(name: str, inp: PlanInput, guard: str | None) -> AppPlan:
    """A managed cluster that neither Git nor the records know: deleted from Git while the records were
    lost. Deleted only with prune on, through the guard, and never without a final savepoint."""
    live = inp.live.get(name)
    base = {"app": name}
    what = f"a cluster of app {name} exists but Git has no spec and " + (
        "no applied spec of it is on record" if inp.records.get(name) else "there is no record of it")
    if not inp.policy.prune:
        return AppPlan(**base, action=Action.NOOP,
                       reason=f"{what}; pruning is disabled, so it is left running (add its spec back to manage "
                              "it, or enable prune to delete it after a final savepoint)")
    if guard:
        return AppPlan(**base, action=Action.BLOCKED, reason=guard)
    if live.cluster is ClusterPhase.UNKNOWN:
        return AppPlan(**base, action=Action.BLOCKED,
                       reason=f"{what}, and it could not be observed ({live.cluster_message}); deletion waits "
                              "until it can take a final savepoint")
    d = Deadlines()
    steps: list[Step] = []
    if live.cluster is not ClusterPhase.READY or (live.job_id and live.job is not JobPhase.RUNNING):
        state = (f"job {live.job_id} is {live.flink_state}" if live.job_id
                 else f"the cluster is {live.cluster.value} ({live.cluster_message or 'no detail'})")
        return AppPlan(**base, action=Action.BLOCKED,
                       reason=f"{what}; {state}, so no final savepoint can be taken. Wait for it to recover, add "
                              "its spec back to Git to repair it, or delete the cluster by hand if it is not wanted "
                              "(retained checkpoints stay in storage).")
    if live.job_id:
        steps.append(StopWithSavepoint(job_id=live.job_id, deadline_s=seconds(d.savepoint)))
        reason = f"{what} (pruning is on): final savepoint, then delete the cluster"
    else:
        kept = live.stopped_savepoint
        reason = f"{what} (pruning is on): no job runs on it, delete the cluster" + (
            f" (the savepoint its last job stopped with, {kept.path}, is kept)" if kept else "")
    steps.append(DeleteCluster(deadline_s=seconds(d.delete)))
    return AppPlan(**base, action=Action.DELETE, reason=reason,
                   risks=(f"DELETES APP {name}: no spec in Git and no record of it",), steps=tuple(steps))


# ---------------------------------------------------------------------------------------------------
# create / upgrade / scale / suspend / resume / restart / repair


def _plan_present(
    name: str, desired: FlinkApp, previous: FlinkApp | None, live: LiveApp, inp: PlanInput
) -> AppPlan:
    desired_c, previous_c = desired.canonical(), previous.canonical() if previous else None
    changes = diff(previous_c, desired_c)
    ctx = Ctx(name, desired, previous, live, inp, changes, desired_c, previous_c)
    want_running = desired.spec.job.state is JobState.RUNNING
    if live.cluster is ClusterPhase.UNKNOWN:
        return ctx.app_plan(Action.NOOP, f"live state unknown ({live.cluster_message}); nothing is changed "
                                         "until it can be observed")
    blocked = failed_before(ctx)
    taken = plan_takeover(ctx)  # an app the Flink Kubernetes Operator runs moves here (core.takeover)
    if taken is not None:
        return blocked if blocked is not None and taken.action is Action.TAKEOVER else taken
    running = live.job in (JobPhase.RUNNING, JobPhase.STARTING)

    if previous is None:  # first sight: no spec of it was ever applied, as far as the records know
        if live.job_id and running:
            if not want_running:
                return blocked or _suspend(ctx)
            if live.deployed_spec_hash == desired.spec_hash:
                return ctx.app_plan(Action.NOOP, ADOPTED_RUNNING)
            return blocked or _upgrade(ctx, "a running job not in our records: redeploying the desired spec "
                                            "from a savepoint of it")
        if not want_running:
            return ctx.app_plan(Action.NOOP, "new app with state: suspended; nothing to start")
        if live.job_id:  # a failing job nobody recorded: replaced, from its state (or blocked)
            return blocked or _upgrade(ctx, f"a job not in our records is {live.flink_state}: replacing it")
        return blocked or _create(ctx)

    was_running = previous.spec.job.state is JobState.RUNNING
    if not want_running:
        if running and live.job_id:
            return _suspend(ctx)
        if live.cluster is not ClusterPhase.ABSENT and not live.job_id:
            return ctx.app_plan(Action.SUSPEND, "suspended: removing the idle cluster",
                                steps=(DeleteCluster(deadline_s=seconds(desired.spec.deadlines.delete)),))
        return ctx.app_plan(Action.NOOP, "suspended" + (" (spec changes apply on resume)" if changes else ""))

    if not was_running and not running:
        return blocked or _resume(ctx)

    if live.job is not JobPhase.RUNNING or live.missing_processes:  # it ran: heal (docs/plan.md#self-healing)
        if blocked is not None:  # Git's spec failed, and what runs (or ran) is the last applied one: heal that
            return heal_previous(ctx, blocked)
        waiting = recovering(ctx)
        if waiting is not None:
            return waiting
        if live.job_id and highest_class(changes) >= ChangeClass.UPGRADE:
            return _upgrade(ctx, _changed_fields(changes, ChangeClass.UPGRADE) + " while the job is down")
        return repair_guard(ctx, repair_kind(live)) or repair(ctx)

    job = live.job_id
    assert job is not None
    prev_job = previous.spec.job
    new_job = desired.spec.job
    if new_job.savepoint_redeploy_nonce != prev_job.savepoint_redeploy_nonce:
        return blocked or _savepoint_redeploy(ctx, job)
    level = highest_class(changes)
    if level >= ChangeClass.UPGRADE:
        reason = "restartNonce changed" if (
            new_job.restart_nonce != prev_job.restart_nonce and all(
                c.path == "/spec/job/restartNonce" for c in changes if c.change_class >= ChangeClass.UPGRADE)
        ) else _changed_fields(changes, ChangeClass.UPGRADE)
        return blocked or in_place_rescale(
            _upgrade(ctx, reason, action=Action.RESTART if reason.startswith("restart") else None),
            desired, previous, live, changes)
    if level is ChangeClass.SCALE:
        return blocked or ctx.app_plan(
            Action.SCALE, "scale change: resources are applied without restarting the job",
            steps=(EnsureCluster(deadline_s=seconds(desired.spec.deadlines.start), keep_running=True),))
    leftover = _leftover_clusters(ctx)
    if leftover:
        return leftover
    if changes:
        return ctx.app_plan(Action.NOOP, "metadata-only change: recorded, the job is not touched")
    return ctx.app_plan(Action.NOOP, "up to date")


def _leftover_clusters(ctx: Ctx) -> AppPlan | None:
    """A warm standby's cluster, or the old cluster it retired, with nothing else to do: an upgrade was cut
    short where no record could finish it (records lost). Never two clusters of one app for long: removed,
    the job keeps running on the live cluster."""
    live = ctx.live
    steps: list[Step] = []
    what = []
    delete = seconds(ctx.desired.spec.deadlines.delete)
    if live.standby_generation:
        steps.append(DiscardStandby(generation=live.standby_generation, deadline_s=delete))
        what.append(f"standby cluster {live.standby_generation}")
    if live.retired_cluster:
        steps.append(DeleteRetiredCluster(deadline_s=delete))
        what.append("the old cluster a standby replaced")
    if not steps:
        return None
    return ctx.app_plan(Action.REPAIR, f"{' and '.join(what)} left beside the live cluster by an interrupted "
                                       "upgrade: removing it (the job keeps running)", steps=tuple(steps))


def _create(ctx: Ctx) -> AppPlan:
    """First sight of an app. It starts empty only when nothing anywhere shows it had state: records,
    a stopped job on its cluster, stored savepoints and retained checkpoints are all asked first."""
    initial = ctx.desired.spec.job.initial_savepoint_path
    live = ctx.live
    if initial:
        return ctx.app_plan(Action.CREATE, f"new app, from initialSavepointPath {initial}",
                            steps=tuple(ctx_start_steps(ctx, Restore(kind=RestoreKind.PATH, path=initial), ctx.job_id)))
    # A cluster nobody recorded that cannot be read may hold a job with state. (One our own records
    # know, e.g. of a create that failed, is ours to reconfigure: EnsureCluster below does.)
    unknown_cluster = ctx.inp.records.get(ctx.name) is None
    if unknown_cluster and live.cluster is ClusterPhase.STARTING:
        return ctx.app_plan(Action.NOOP, f"no record of this app, and its existing cluster is still starting "
                                         f"({live.cluster_message or 'no detail'}): its jobs and checkpoints cannot "
                                         "be read yet, so nothing is started until they can")
    if unknown_cluster and live.cluster is ClusterPhase.FAILED:
        return ctx.app_plan(Action.BLOCKED, f"no record of this app, and its existing cluster is failing "
                                            f"({live.cluster_message or 'no detail'}): its jobs and checkpoints "
                                            "cannot be read, so the state to adopt is unknown. To proceed: fix or "
                                            "delete that cluster, or set spec.job.initialSavepointPath to the "
                                            "savepoint to start from.")
    what = "no record of this app" if ctx.inp.records.get(ctx.name) is None else "no applied spec of this app on record"
    found = restore_when_not_running(ctx, what)
    if isinstance(found, AppPlan):
        return found
    restore, risks, src = found
    if src is not None:
        reason = f"adopted: restoring from {src.describe()} ({what})"
    elif risks:
        reason = "new app (stateless): the state found is not used"
    elif ctx.inp.mode == "offline":
        reason = "new app"  # a preview sees no storage; the live plan looks for a past before it starts
    else:
        reason = "new app, from empty state: no record, savepoint or checkpoint of it anywhere"
    return ctx.app_plan(Action.CREATE, reason, risks=risks, steps=tuple(ctx_start_steps(ctx, restore, ctx.job_id)))


def _upgrade(ctx: Ctx, reason: str, action: Action | None = None) -> AppPlan:
    live = ctx.live
    job = live.job_id
    assert job is not None
    mode = ctx.desired.spec.job.upgrade_mode
    sp_deadline, _, _ = step_deadlines(ctx)
    first: Step
    risks: tuple[str, ...] = ()
    if mode is UpgradeMode.STATELESS:
        first, restore = CancelJob(job_id=job, deadline_s=sp_deadline), NO_STATE
        risks = (f"STARTS WITHOUT STATE: upgradeMode stateless; job {job} is cancelled and its state dropped",)
    elif live.job is JobPhase.RUNNING and mode is UpgradeMode.SAVEPOINT:
        first, restore = StopWithSavepoint(job_id=job, deadline_s=sp_deadline), CAPTURED
    elif live.job is JobPhase.RUNNING:  # last-state
        first, restore = CancelJob(job_id=job, capture_checkpoint=True, deadline_s=sp_deadline), CAPTURED
    else:  # job not healthy: no savepoint possible
        found = restore_when_not_running(ctx, f"job {job} is {live.flink_state or 'not running'}")
        if isinstance(found, AppPlan):
            return found
        restore, risks, src = found
        first = CancelJob(job_id=job, deadline_s=sp_deadline)
        if src is not None:
            reason += f" (from {src.describe()})"
        elif restore.kind is RestoreKind.NONE and not risks:
            reason += " (from empty state: no savepoint or checkpoint of it anywhere)"
    via = "savepoint" if isinstance(first, StopWithSavepoint) else "cancel"
    reason = f"{reason}: {mode.value} upgrade via {via}"
    strategy, why = _cluster_strategy(ctx)
    rollback: tuple[Step, ...] = ()
    if strategy is ClusterStrategy.WARM_STANDBY:
        return _warm_standby(ctx, first, restore, f"{reason}, {why}", risks=risks, action=action)
    if ctx.previous is not None:
        rollback = tuple(ctx_start_steps(ctx, restore, ctx.rollback_job_id, spec=SpecRef.PREVIOUS))
    steps = [first, *ctx_start_steps(ctx, restore, ctx.job_id)]
    return ctx.app_plan(action or Action.UPGRADE, f"{reason}, {why}" if why else reason, risks=risks,
                        steps=tuple(steps), rollback_after=0, rollback=rollback, cluster_strategy=strategy)


# A change under one of these needs new Flink JVMs (the cluster's configuration, resources or image);
# everything else an upgrade changes (the job's jar, arguments, parallelism, nonces) needs only a new job.
_CLUSTER_FIELDS = ("/spec/flinkVersion", "/spec/image", "/spec/jobManager", "/spec/taskManager/resources",
                   "/spec/taskManager/slots", "/spec/taskManager/volumeClaimTemplates", "/spec/flinkConfiguration",
                   "/spec/podTemplate", "/spec/runtime", "/spec/highAvailability", "/metadata/namespace")


def cluster_changes(changes: tuple[FieldChange, ...]) -> tuple[FieldChange, ...]:
    """The changes that need a new cluster (new JVMs), not only a new job."""
    return tuple(c for c in changes if c.change_class >= ChangeClass.UPGRADE
                 and any(c.path == f or c.path.startswith(f + "/") for f in _CLUSTER_FIELDS))


def _cluster_strategy(ctx: Ctx) -> tuple[ClusterStrategy | None, str]:
    """How an upgrade of a running job reaches its cluster, and the words the plan says it with.

    Warm standby only when everything it needs holds: the job runs (else there is nothing to keep up),
    the change needs a new cluster, the previous spec is known (the rollback target), no redeploy-class
    field changed (runtime, namespace, HA: the cluster is recreated whole), the spec allows it and the
    runtime can run two clusters of one app."""
    if ctx.previous is None or ctx.live.job is not JobPhase.RUNNING:
        return None, ""
    cluster = cluster_changes(ctx.changes)
    if not cluster:
        return ClusterStrategy.JOB_ONLY, ""
    if highest_class(cluster) >= ChangeClass.REDEPLOY:
        return ClusterStrategy.COLD, ("cold: a redeploy-class field changed, so the cluster is recreated while "
                                      "the job is down")
    if ctx.desired.spec.upgrade.cluster_strategy is SpecClusterStrategy.COLD:
        return ClusterStrategy.COLD, ("cold (spec.upgrade.clusterStrategy: cold): the cluster restarts while the "
                                      "job is down")
    if not ctx.inp.policy.warm_standby:
        return ClusterStrategy.COLD, ("cold: this runtime cannot run a standby cluster, so the cluster restarts "
                                      "while the job is down")
    if refused := ctx.inp.policy.standby_refused.get(ctx.name):
        return ClusterStrategy.COLD, f"cold: {refused}, so the cluster restarts while the job is down"
    return ClusterStrategy.WARM_STANDBY, ("warm standby: a new cluster starts beside the running job, which "
                                          "moves to it once it is ready (the app needs room for two clusters "
                                          "meanwhile)")


def _warm_standby(ctx: Ctx, stop: Step, restore: Restore, reason: str, *, risks: tuple[str, ...],
                  action: Action | None) -> AppPlan:
    """Standby up -> stop the old job -> standby becomes live -> the job starts there -> old cluster deleted.

    A failure up to the stop leaves the old job running: `abort` discards the standby. A failure after it
    rolls back: the standby is discarded (the old cluster is live again) and the previous job restarts on
    the old cluster from the state the stop captured."""
    _, start, healthy = step_deadlines(ctx)
    delete = seconds(ctx.desired.spec.deadlines.delete)
    gen = ctx.generation
    discard = DiscardStandby(generation=gen, deadline_s=delete)
    steps: list[Step] = [
        StartStandbyCluster(generation=gen, deadline_s=start),
        stop,
        PromoteStandby(generation=gen, deadline_s=delete),
        *(s for s in start_steps(ctx.desired, SpecRef.DESIRED, restore, ctx.job_id, start_s=start, healthy_s=healthy)
          if not isinstance(s, EnsureCluster)),  # the standby is the cluster
        DeleteRetiredCluster(deadline_s=delete),
    ]
    assert ctx.previous is not None
    rollback = (discard, *start_steps(ctx.previous, SpecRef.PREVIOUS, restore, ctx.rollback_job_id, start_s=start,
                                      healthy_s=healthy))
    return ctx.app_plan(action or Action.UPGRADE, reason, risks=risks, steps=tuple(steps), rollback_after=1,
                        rollback=rollback, abort=(discard,), cluster_strategy=ClusterStrategy.WARM_STANDBY)


def _suspend(ctx: Ctx) -> AppPlan:
    job = ctx.live.job_id
    assert job is not None
    sp, _, _ = step_deadlines(ctx)
    delete = DeleteCluster(deadline_s=seconds(ctx.desired.spec.deadlines.delete))
    if ctx.desired.spec.job.upgrade_mode is UpgradeMode.STATELESS:
        return ctx.app_plan(Action.SUSPEND, "suspend (stateless: cancel)",
                            risks=("DROPS STATE: upgradeMode stateless; the job is cancelled without a savepoint",),
                            steps=(CancelJob(job_id=job, deadline_s=sp), delete))
    if ctx.live.job is not JobPhase.RUNNING:
        return ctx.app_plan(Action.BLOCKED, f"suspend requested but job {job} is {ctx.live.flink_state}: no savepoint "
                                            "can be taken. Wait for it to run, or set upgradeMode: last-state.")
    return ctx.app_plan(Action.SUSPEND, "suspend: stop with a savepoint, then remove the cluster",
                        steps=(StopWithSavepoint(job_id=job, deadline_s=sp), delete))


def _resume(ctx: Ctx) -> AppPlan:
    rec = ctx.inp.records.get(ctx.name)
    sp = rec.latest_savepoint if rec else None
    if ctx.desired.spec.job.upgrade_mode is UpgradeMode.STATELESS:
        return ctx.app_plan(Action.RESUME, "resume (stateless)", risks=("STARTS WITHOUT STATE: upgradeMode stateless",),
                            steps=tuple(ctx_start_steps(ctx, NO_STATE, ctx.job_id)))
    if sp:
        return ctx.app_plan(Action.RESUME, f"resume from the savepoint taken at suspend ({sp.path})",
                            steps=tuple(ctx_start_steps(ctx, Restore(kind=RestoreKind.PATH, path=sp.path), ctx.job_id)))
    # The record lost its savepoint: the suspend savepoint is still the newest state wherever it is found.
    found = restore_when_not_running(ctx, "resuming a suspended app with no recorded savepoint")
    if isinstance(found, AppPlan):
        return found
    restore, risks, src = found
    reason = f"resume from {src.describe()} (no savepoint recorded)" if src else "resume"
    return ctx.app_plan(Action.RESUME, reason, risks=risks, steps=tuple(ctx_start_steps(ctx, restore, ctx.job_id)))


def _savepoint_redeploy(ctx: Ctx, job: str) -> AppPlan:
    path = ctx.desired.spec.job.initial_savepoint_path
    restore = Restore(kind=RestoreKind.PATH, path=path) if path else NO_STATE
    sp, _, _ = step_deadlines(ctx)
    # Keep a savepoint of the state being discarded, so the redeploy itself can be undone.
    first: Step = (StopWithSavepoint(job_id=job, deadline_s=sp) if ctx.live.job is JobPhase.RUNNING
                   else CancelJob(job_id=job, deadline_s=sp))
    risk = (f"DISCARDS CURRENT STATE: savepointRedeployNonce changed; the job restarts from {path}" if path
            else "STARTS WITHOUT STATE: savepointRedeployNonce changed and initialSavepointPath is unset")
    return ctx.app_plan(Action.UPGRADE, "savepointRedeployNonce changed: redeploy from "
                        + (path or "empty state"), risks=(risk,),
                        steps=(first, *ctx_start_steps(ctx, restore, ctx.job_id)), rollback_after=0,
                        rollback=tuple(ctx_start_steps(ctx, CAPTURED, ctx.rollback_job_id, SpecRef.PREVIOUS))
                        if isinstance(first, StopWithSavepoint) else ())


def _changed_fields(changes: tuple[FieldChange, ...], at_least: ChangeClass) -> str:
    """'spec.job.args, spec.job.parallelism changed' (field paths, list indexes folded)."""
    fields: list[str] = []
    for c in changes:
        if c.change_class < at_least:
            continue
        name = field_name(c.path)
        if name not in fields:
            fields.append(name)
    shown = ", ".join(fields[:4]) + (f" and {len(fields) - 4} more" if len(fields) > 4 else "")
    return f"{shown} changed ({highest_class(changes).label})"


def desired_from(result: LoadResult) -> Desired:
    return Desired(
        apps={n: la.app for n, la in result.apps.items()},
        sources={n: la.file for n, la in result.apps.items()},
        errors=result.errors,
        broken_files=result.broken_files,
    )


def assumed_live(previous: Mapping[str, FlinkApp], base_revision: str) -> LiveState:
    """Offline previews assume the base revision is exactly what runs (no cluster, no credentials)."""
    apps = {}
    for name, app in previous.items():
        running = app.spec.job.state is JobState.RUNNING
        apps[name] = LiveApp(
            name=name,
            cluster=ClusterPhase.READY if running else ClusterPhase.ABSENT,
            job_id=OFFLINE_JOB_ID if running else None,
            flink_state="RUNNING" if running else None,
            job=JobPhase.RUNNING if running else JobPhase.NONE,
            deployed_spec_hash=app.spec_hash,
        )
    return LiveState(apps=apps)


def offline_input(base: LoadResult, head: LoadResult, *, base_revision: str, revision: str, now: datetime,
                  policy: Policy = DEFAULT_POLICY) -> PlanInput:
    previous = {n: la.app for n, la in base.apps.items()}
    return PlanInput(
        revision=revision,
        base_revision=base_revision,
        desired=desired_from(head),
        previous=previous,
        previous_sources={n: la.file for n, la in base.apps.items()},
        live=assumed_live(previous, base_revision),
        records=Records(),
        now=now,
        policy=policy,
        mode="offline",
    )
