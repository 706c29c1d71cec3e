"""The decision table: (desired, live, records, policy) -> Plan. Pure; every safety rule lives here.

Read top to bottom, `_plan_app` is the ladder a reviewer checks: invalid specs never act, deletions
pass the guards, a failed revision is not retried in a loop, and every path that would start a job
without its state either has the spec's consent (stateless) and says so in `risks`, or is blocked
with an instruction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from reconciler.core.diff import diff, highest_class
from reconciler.core.observed import (
    Checkpoint,
    ClusterPhase,
    JobPhase,
    LiveApp,
    LiveState,
    Outcome,
    Records,
)
from reconciler.core.plan import (
    CAPTURED,
    NO_STATE,
    Action,
    AppPlan,
    AwaitHealthy,
    AwaitRunning,
    CancelJob,
    DeleteCluster,
    EnsureCluster,
    FieldChange,
    ForgetApp,
    Plan,
    Restore,
    RestoreKind,
    SpecRef,
    StartJob,
    Step,
    StopWithSavepoint,
    deterministic_job_id,
)
from reconciler.errors import SpecError
from reconciler.spec.load import LoadResult
from reconciler.spec.model import ChangeClass, DeletionPolicy, FlinkApp, JobState, UpgradeMode

CHECKPOINT_INTERVAL_KEY = "execution.checkpointing.interval"
OFFLINE_JOB_ID = "<running job>"  # offline previews do not know the live job id


@dataclass(frozen=True)
class Policy:
    prune: bool = False
    mass_delete_fraction: float = 0.5  # refuse when more than this share of known apps would go at once
    mass_delete_min: int = 3  # ... and at least this many (deleting 1 of 2 apps is not "mass")
    allow_mass_delete: bool = False


@dataclass(frozen=True)
class Desired:
    """What Git says, already parsed: valid apps, and the errors of the invalid ones."""

    apps: Mapping[str, FlinkApp] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)  # app -> file
    errors: tuple[SpecError, ...] = ()
    broken_files: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PlanInput:
    revision: str
    desired: Desired
    previous: Mapping[str, FlinkApp]  # what runs, as far as we know (last applied / base revision)
    previous_sources: Mapping[str, str]
    live: LiveState
    records: Records
    now: datetime
    policy: Policy = Policy()
    mode: Literal["offline", "live"] = "live"
    base_revision: str | None = None


def plan(inp: PlanInput, only: Collection[str] | None = None) -> Plan:
    """Plan every app, or only the apps in `only` (the incremental path: files changed in one push).

    The mass-deletion guard always counts the whole repository, whatever `only` says."""
    names = set(inp.desired.apps) | set(inp.previous) | _erroring_apps(inp.desired)
    deletions = [n for n in set(inp.previous) - set(inp.desired.apps) if not _source_broken(n, inp)]
    guard = _mass_delete_guard(len(deletions), inp)
    selected = sorted(names if only is None else names & set(only))
    apps = tuple(_plan_app(name, inp, guard) for name in selected)
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
    src = inp.previous_sources.get(name) or inp.desired.sources.get(name)
    return (src is not None and src in inp.desired.broken_files) or any(
        e.app == name for e in inp.desired.errors
    )


def _mass_delete_guard(n_deletions: int, inp: PlanInput) -> str | None:
    known = len(inp.previous)
    if n_deletions == 0 or inp.policy.allow_mass_delete or not inp.policy.prune:
        return None
    if not inp.desired.apps and not inp.desired.errors:
        return (f"refusing to delete: revision {inp.revision[:12]} has no app specs at all while {known} "
                "app(s) are deployed (empty checkout or wrong path?). Nothing is deleted.")
    if n_deletions >= inp.policy.mass_delete_min and n_deletions > inp.policy.mass_delete_fraction * known:
        return (f"refusing to delete {n_deletions} of {known} apps at once (mass-deletion guard, threshold "
                f"{inp.policy.mass_delete_fraction:.0%}). If intended, delete them in smaller commits or run "
                "with `apply --allow-mass-delete`.")
    return None


def _plan_app(name: str, inp: PlanInput, guard: str | None) -> AppPlan:
    desired = inp.desired.apps.get(name)
    previous = inp.previous.get(name)
    live = inp.live.get(name)
    errors = [e for e in inp.desired.errors if e.app == name]
    if errors or (desired is None and _source_broken(name, inp)):
        where = "; ".join(str(e) for e in errors) or (
            f"{inp.previous_sources.get(name)} has errors (see above)")
        return AppPlan(app=name, action=Action.ERROR, source_file=_src(name, inp),
                       reason=f"{where} (invalid spec: the app is left as it is)")
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
            steps.append(StopWithSavepoint(job_id=job_id, deadline_s=_s(d.savepoint)))
        elif job_id and live.job in (JobPhase.STARTING, JobPhase.FAILING):
            return AppPlan(**base, action=Action.BLOCKED,
                           reason=f"spec removed but job {job_id} is {live.flink_state}: no final savepoint "
                                  "is possible. Wait for it to recover, or set deletionPolicy: delete in the "
                                  "spec (restored from Git history) to delete without a savepoint.")
    elif job_id and live.job in (JobPhase.RUNNING, JobPhase.STARTING, JobPhase.FAILING):
        steps.append(CancelJob(job_id=job_id, deadline_s=_s(d.savepoint)))
        risks.append(f"DELETES APP {name} WITHOUT A FINAL SAVEPOINT (deletionPolicy: delete): its state is dropped")
    steps.append(DeleteCluster(deadline_s=_s(d.delete)))
    risks.insert(0, f"DELETES APP {name}: spec removed from Git")
    reason = "spec removed; " + ("final savepoint, then delete the cluster" if len(steps) > 1
                                 and policy is DeletionPolicy.SAVEPOINT_THEN_DELETE else "delete the cluster")
    return AppPlan(**base, action=Action.DELETE, reason=reason, risks=tuple(risks),
                   steps=tuple(steps))


# ---------------------------------------------------------------------------------------------------
# create / upgrade / scale / suspend / resume / restart / repair


@dataclass(frozen=True)
class _Ctx:
    name: str
    desired: FlinkApp
    previous: FlinkApp | None
    live: LiveApp
    inp: PlanInput
    changes: tuple[FieldChange, ...]

    @property
    def job_id(self) -> str:
        rec = self.inp.records.get(self.name)
        attempt = rec.attempts + 1 if rec and rec.last_attempted_revision == self.inp.revision else 1
        return deterministic_job_id(self.name, self.inp.revision, attempt)

    @property
    def rollback_job_id(self) -> str:
        return deterministic_job_id(self.name, self.inp.revision, 1, purpose="rollback")

    def app_plan(self, action: Action, reason: str, **kw: object) -> AppPlan:
        return AppPlan(
            app=self.name,
            action=action,
            reason=reason,
            change_class=highest_class(self.changes),
            diff=self.changes,
            desired=self.desired.canonical(),
            previous=self.previous.canonical() if self.previous else None,
            source_file=self.inp.desired.sources.get(self.name),
            upgrade_mode=self.desired.spec.job.upgrade_mode.value,
            **kw,
        )


def _plan_present(
    name: str, desired: FlinkApp, previous: FlinkApp | None, live: LiveApp, inp: PlanInput
) -> AppPlan:
    changes = diff(previous.canonical() if previous else None, desired.canonical())
    ctx = _Ctx(name, desired, previous, live, inp, changes)
    want_running = desired.spec.job.state is JobState.RUNNING
    if live.cluster is ClusterPhase.UNKNOWN:
        return ctx.app_plan(Action.NOOP, f"live state unknown ({live.cluster_message}); nothing is changed "
                                         "until it can be observed")
    blocked = _failed_before(ctx)
    running = live.job in (JobPhase.RUNNING, JobPhase.STARTING)

    if previous is None:
        if live.job_id and running:
            if live.deployed_spec_hash == desired.spec_hash:
                return ctx.app_plan(Action.NOOP, "already running this spec (adopted)")
            return blocked or _upgrade(ctx, "a running job not in our records: redeploying the desired spec "
                                            "from a savepoint of it")
        if not want_running:
            return ctx.app_plan(Action.NOOP, "new app with state: suspended; nothing to start")
        return blocked or _create(ctx)

    was_running = previous.spec.job.state is JobState.RUNNING
    if not want_running:
        if running and live.job_id:
            return _suspend(ctx)
        if live.cluster is not ClusterPhase.ABSENT and not live.job_id:
            return ctx.app_plan(Action.SUSPEND, "suspended: removing the idle cluster",
                                steps=(DeleteCluster(deadline_s=_s(desired.spec.deadlines.delete)),))
        return ctx.app_plan(Action.NOOP, "suspended" + (" (spec changes apply on resume)" if changes else ""))

    if not was_running and not running:
        return blocked or _resume(ctx)

    if not running:  # Git says it runs and it did run: the job died or the cluster went away
        if live.job_id and highest_class(changes) >= ChangeClass.UPGRADE:
            return blocked or _upgrade(ctx, _changed_fields(changes, ChangeClass.UPGRADE) + " while the job is down")
        return blocked or _repair(ctx)

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
        return blocked or _upgrade(ctx, reason, action=Action.RESTART if reason.startswith("restart") else None)
    if level is ChangeClass.SCALE:
        return blocked or ctx.app_plan(
            Action.SCALE, "scale change: resources are applied without restarting the job",
            steps=(EnsureCluster(deadline_s=_s(desired.spec.deadlines.start)),))
    if changes:
        return ctx.app_plan(Action.NOOP, "metadata-only change: recorded, the job is not touched")
    return ctx.app_plan(Action.NOOP, "up to date")


def _failed_before(ctx: _Ctx) -> AppPlan | None:
    """A revision that failed is not retried in a loop: a new commit or a nonce retries."""
    rec = ctx.inp.records.get(ctx.name)
    if not rec or rec.last_outcome is not Outcome.FAILURE:
        return None
    if rec.last_attempted_spec_hash != ctx.desired.spec_hash:
        return None
    if (rec.last_message or "").startswith(_FAILED_BEFORE):
        return ctx.app_plan(Action.BLOCKED, rec.last_message or "")  # already said; never nest it
    return ctx.app_plan(
        Action.BLOCKED,
        f"{_FAILED_BEFORE} at revision {(rec.last_attempted_revision or '?')[:12]}: "
        f"{rec.last_message or 'see history'}. Not retrying in a loop: push a fix, or bump "
        "spec.job.restartNonce to retry the same spec.",
    )


_FAILED_BEFORE = "this spec already failed"


def _deadlines(ctx: _Ctx) -> tuple[float, float, float]:
    d = ctx.desired.spec.deadlines
    return _s(d.savepoint), _s(d.start), _s(d.healthy)


def _start_steps(ctx: _Ctx, restore: Restore, job_id: str, spec: SpecRef = SpecRef.DESIRED) -> list[Step]:
    app = ctx.desired if spec is SpecRef.DESIRED else ctx.previous
    assert app is not None
    _, start, healthy = _deadlines(ctx)
    steps: list[Step] = [
        EnsureCluster(spec=spec, deadline_s=start),
        StartJob(spec=spec, job_id=job_id, restore=restore,
                 allow_non_restored_state=app.spec.job.allow_non_restored_state, deadline_s=start),
        AwaitRunning(job_id=job_id, deadline_s=start),
    ]
    if spec is SpecRef.DESIRED and CHECKPOINT_INTERVAL_KEY in app.spec.flink_configuration:
        steps.append(AwaitHealthy(job_id=job_id, deadline_s=healthy))
    return steps


def _create(ctx: _Ctx) -> AppPlan:
    rec = ctx.inp.records.get(ctx.name)
    initial = ctx.desired.spec.job.initial_savepoint_path
    last = rec.latest_savepoint if rec else None
    risks: tuple[str, ...] = ()
    if initial:
        restore, reason = Restore(kind=RestoreKind.PATH, path=initial), f"new app, from initialSavepointPath {initial}"
    elif last and ctx.desired.spec.job.upgrade_mode is not UpgradeMode.STATELESS:
        # The app existed before (deleted with a final savepoint): never silently start it empty.
        restore = Restore(kind=RestoreKind.PATH, path=last.path)
        reason = f"re-created app, from its last savepoint {last.path} ({last.taken_at:%Y-%m-%d %H:%M} UTC)"
    else:
        restore, reason = NO_STATE, "new app"
        if last:
            risks = (f"STARTS WITHOUT STATE: upgradeMode stateless; the last savepoint {last.path} is not used",)
    return ctx.app_plan(Action.CREATE, reason, risks=risks, steps=tuple(_start_steps(ctx, restore, ctx.job_id)))


def _restore_when_not_running(ctx: _Ctx, what: str) -> tuple[Restore, tuple[str, ...]] | AppPlan:
    """No savepoint can be taken (job not running): the upgradeMode decides, else a human does."""
    mode = ctx.desired.spec.job.upgrade_mode
    rec = ctx.inp.records.get(ctx.name)
    ckpt = ctx.live.latest_checkpoint
    sp = rec.latest_savepoint if rec else None
    if mode is UpgradeMode.STATELESS:
        return NO_STATE, (f"STARTS WITHOUT STATE: upgradeMode stateless ({what})",)
    newest: Checkpoint | None = ckpt
    if sp and (ckpt is None or sp.taken_at >= ckpt.completed_at):
        newest = Checkpoint(path=sp.path, completed_at=sp.taken_at, is_savepoint=True)
    if mode is UpgradeMode.LAST_STATE:
        if newest:
            return Restore(kind=RestoreKind.PATH, path=newest.path), ()
        return _blocked_no_state(ctx, what, "no retained checkpoint or savepoint exists")
    # savepoint mode: a checkpoint is acceptable only when young enough.
    max_age = ctx.desired.spec.job.max_checkpoint_age
    if ckpt and max_age is not None:
        age = ctx.inp.now - ckpt.completed_at
        if age <= max_age:
            return Restore(kind=RestoreKind.PATH, path=ckpt.path), (
                f"RESTORES FROM CHECKPOINT {ckpt.path} ({_age(age)} old, within maxCheckpointAge "
                f"{_age(max_age)}): {what}, so no savepoint can be taken",)
    if ckpt:
        why = f"the latest checkpoint is {_age(ctx.inp.now - ckpt.completed_at)} old" + (
            f", older than maxCheckpointAge {_age(max_age)}" if max_age else " and maxCheckpointAge is unset")
    else:
        why = "there is no retained checkpoint"
    return _blocked_no_state(ctx, what, why, savepoint=sp.path if sp else None, ckpt=ckpt)


def _blocked_no_state(ctx: _Ctx, what: str, why: str, savepoint: str | None = None,
                      ckpt: Checkpoint | None = None) -> AppPlan:
    options = []
    if ckpt:
        options.append(f"set spec.job.maxCheckpointAge above {_age(ctx.inp.now - ckpt.completed_at)} to restore "
                       f"from checkpoint {ckpt.path}")
    if savepoint:
        options.append(f"set spec.job.initialSavepointPath: {savepoint} and bump spec.job.savepointRedeployNonce "
                       "to restore from the last savepoint")
    options.append("or set spec.job.upgradeMode: stateless and bump restartNonce to start with empty state")
    return ctx.app_plan(Action.BLOCKED, f"{what} and upgradeMode is {ctx.desired.spec.job.upgrade_mode.value}: {why}. "
                                        "To proceed: " + "; ".join(options) + ".")


def _upgrade(ctx: _Ctx, reason: str, action: Action | None = None) -> AppPlan:
    live = ctx.live
    job = live.job_id
    assert job is not None
    mode = ctx.desired.spec.job.upgrade_mode
    sp_deadline, _, _ = _deadlines(ctx)
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
        found = _restore_when_not_running(ctx, f"job {job} is {live.flink_state or 'not running'}")
        if isinstance(found, AppPlan):
            return found
        restore, risks = found
        first = CancelJob(job_id=job, deadline_s=sp_deadline)
    steps = [first, *_start_steps(ctx, restore, ctx.job_id)]
    rollback: tuple[Step, ...] = ()
    if ctx.previous is not None:
        rollback = tuple(_start_steps(ctx, restore, ctx.rollback_job_id, spec=SpecRef.PREVIOUS))
    via = "savepoint" if isinstance(first, StopWithSavepoint) else "cancel"
    return ctx.app_plan(action or Action.UPGRADE, f"{reason}: {mode.value} upgrade via {via}", risks=risks,
                        steps=tuple(steps), rollback_after=0, rollback=rollback)


def _suspend(ctx: _Ctx) -> AppPlan:
    job = ctx.live.job_id
    assert job is not None
    sp, _, _ = _deadlines(ctx)
    delete = DeleteCluster(deadline_s=_s(ctx.desired.spec.deadlines.delete))
    if ctx.desired.spec.job.upgrade_mode is UpgradeMode.STATELESS:
        return ctx.app_plan(Action.SUSPEND, "suspend (stateless: cancel)",
                            risks=("DROPS STATE: upgradeMode stateless; the job is cancelled without a savepoint",),
                            steps=(CancelJob(job_id=job, deadline_s=sp), delete))
    if ctx.live.job is not JobPhase.RUNNING:
        return ctx.app_plan(Action.BLOCKED, f"suspend requested but job {job} is {ctx.live.flink_state}: no savepoint "
                                            "can be taken. Wait for it to run, or set upgradeMode: last-state.")
    return ctx.app_plan(Action.SUSPEND, "suspend: stop with a savepoint, then remove the cluster",
                        steps=(StopWithSavepoint(job_id=job, deadline_s=sp), delete))


def _resume(ctx: _Ctx) -> AppPlan:
    rec = ctx.inp.records.get(ctx.name)
    sp = rec.latest_savepoint if rec else None
    if ctx.desired.spec.job.upgrade_mode is UpgradeMode.STATELESS:
        return ctx.app_plan(Action.RESUME, "resume (stateless)", risks=("STARTS WITHOUT STATE: upgradeMode stateless",),
                            steps=tuple(_start_steps(ctx, NO_STATE, ctx.job_id)))
    if sp:
        return ctx.app_plan(Action.RESUME, f"resume from the savepoint taken at suspend ({sp.path})",
                            steps=tuple(_start_steps(ctx, Restore(kind=RestoreKind.PATH, path=sp.path), ctx.job_id)))
    found = _restore_when_not_running(ctx, "resuming a suspended app with no recorded savepoint")
    if isinstance(found, AppPlan):
        return found
    return ctx.app_plan(Action.RESUME, "resume", risks=found[1], steps=tuple(_start_steps(ctx, found[0], ctx.job_id)))


def _repair(ctx: _Ctx) -> AppPlan:
    live = ctx.live
    what = (f"job {live.job_id} is {live.flink_state}" if live.job_id
            else "the cluster is gone" if live.cluster is ClusterPhase.ABSENT else "no job is running")
    found = _restore_when_not_running(ctx, what)
    if isinstance(found, AppPlan):
        return found
    restore, risks = found
    steps: list[Step] = []
    if live.job_id and live.job is JobPhase.FAILING:
        steps.append(CancelJob(job_id=live.job_id, deadline_s=_deadlines(ctx)[0]))
    steps.extend(_start_steps(ctx, restore, ctx.job_id))
    return ctx.app_plan(Action.REPAIR, f"drift: {what}; restarting from {restore.describe()}",
                        risks=risks, steps=tuple(steps))


def _savepoint_redeploy(ctx: _Ctx, job: str) -> AppPlan:
    path = ctx.desired.spec.job.initial_savepoint_path
    restore = Restore(kind=RestoreKind.PATH, path=path) if path else NO_STATE
    sp, _, _ = _deadlines(ctx)
    # Keep a savepoint of the state being discarded, so the redeploy itself can be undone.
    first: Step = (StopWithSavepoint(job_id=job, deadline_s=sp) if ctx.live.job is JobPhase.RUNNING
                   else CancelJob(job_id=job, deadline_s=sp))
    risk = (f"DISCARDS CURRENT STATE: savepointRedeployNonce changed; the job restarts from {path}" if path
            else "STARTS WITHOUT STATE: savepointRedeployNonce changed and initialSavepointPath is unset")
    return ctx.app_plan(Action.UPGRADE, "savepointRedeployNonce changed: redeploy from "
                        + (path or "empty state"), risks=(risk,),
                        steps=(first, *_start_steps(ctx, restore, ctx.job_id)), rollback_after=0,
                        rollback=tuple(_start_steps(ctx, CAPTURED, ctx.rollback_job_id, SpecRef.PREVIOUS))
                        if isinstance(first, StopWithSavepoint) else ())


def _changed_fields(changes: tuple[FieldChange, ...], at_least: ChangeClass) -> str:
    """'spec.job.args, spec.job.parallelism changed' (field paths, list indexes folded)."""
    fields: list[str] = []
    for c in changes:
        if c.change_class < at_least:
            continue
        parts = [p for p in c.path.split("/")[1:] if not p.isdigit()]
        if parts[:2] == ["spec", "flinkConfiguration"] and len(parts) > 2:
            parts = [*parts[:2], parts[2].replace("~1", "/").replace("~0", "~")]
        name = ".".join(parts[:4])
        if name not in fields:
            fields.append(name)
    shown = ", ".join(fields[:4]) + (f" and {len(fields) - 4} more" if len(fields) > 4 else "")
    return f"{shown} changed ({highest_class(changes).label})"


def _s(d: timedelta) -> float:
    return max(1.0, d.total_seconds())


def _age(d: timedelta) -> str:
    secs = int(d.total_seconds())
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    return f"{secs // 3600}h{(secs % 3600) // 60:02d}m"


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
                  policy: Policy = Policy()) -> PlanInput:
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
