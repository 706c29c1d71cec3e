"""Planning the takeover of an app the Apache Flink Kubernetes Operator runs (pure): when, and the plan.

A takeover of a `FlinkDeployment` (docs/migrate-from-flink-operator.md) is planned when Git has a FlinkApp of its
name and namespace that was never applied here, or one whose spec.takeover names it. The operator stops its own
job with a savepoint (we never kill its pods), we read the savepoint path from its status, delete the
FlinkDeployment, and the job starts here from that savepoint. What the operator's documents say (refusals, the
suspension) is read in `reconciler.operator_migration.status`; the planner sees it as `OperatorDeployment`.
"""

from __future__ import annotations

from reconciler.core.context import Ctx, ctx_start_steps, seconds, step_deadlines
from reconciler.core.observed import ClusterPhase, OperatorDeployment
from reconciler.core.plan import (
    CAPTURED,
    Action,
    AppPlan,
    DeleteOperatorDeployment,
    ReleaseOperatorDeployment,
    Restore,
    RestoreKind,
    Step,
    SuspendOperatorDeployment,
)
from reconciler.spec.model import JobState


def plan_takeover(ctx: Ctx) -> AppPlan | None:
    """The takeover plan of this app, a BLOCKED one saying why not, or None when no takeover is due.

    Due when the app was never applied here and the operator runs a FlinkDeployment of its name (or the one
    spec.takeover names). An offline preview cannot see FlinkDeployments: it plans the takeover when the spec
    names one. Once the takeover began, the journal carries it; an app with a record is planned as usual."""
    takeover = ctx.desired.spec.takeover
    ns = ctx.desired.metadata.namespace
    if ctx.inp.mode == "offline":
        if takeover is None or ctx.previous is not None:
            return None
        return _takeover(ctx, OperatorDeployment(namespace=ns, name=takeover.name))
    op = ctx.live.operator
    rec = ctx.inp.records.get(ctx.name)
    known = ctx.previous is not None or (rec is not None and rec.ran_here)
    if op is None:
        if takeover is not None and not known:
            return ctx.app_plan(Action.BLOCKED, (
                f"spec.takeover names FlinkDeployment/{takeover.name}, but there is none in namespace {ns}: nothing "
                "to take over, and the app is not started from empty state. If it runs in another namespace, set "
                "metadata.namespace to that one. If it was removed, set spec.job.initialSavepointPath to the "
                "savepoint it stopped with (the newest complete one in its savepoint directory) and remove "
                "spec.takeover"))
        return None
    if op.unreadable is not None:
        if takeover is None:
            return _unknown_operator(ctx, op) if not known else None
        return ctx.app_plan(Action.BLOCKED, (
            f"spec.takeover: FlinkDeployments in namespace {ns} cannot be read ({op.unreadable}), so whether the "
            "operator still runs this job is unknown; nothing is started meanwhile. Grant the reconciler get, list, "
            "patch and delete on flinkdeployments.flink.apache.org (on Kubernetes), or, if the FlinkDeployment is "
            "gone, set spec.job.initialSavepointPath to the savepoint it stopped with and remove spec.takeover"))
    if ctx.previous is not None:
        if takeover is None:
            return None
        return ctx.app_plan(Action.BLOCKED, (
            f"spec.takeover names FlinkDeployment {op.namespace}/{op.name}, but this app already runs here: a "
            "takeover starts an app that is not running here yet. Remove spec.takeover, or delete the "
            "FlinkDeployment under the operator if it is a leftover"))
    if op.refusal is not None:
        return ctx.app_plan(Action.BLOCKED, f"takeover refused: {op.refusal}")
    if op.not_suspendable is not None:
        initial = ctx.desired.spec.job.initial_savepoint_path
        if initial and (op.job_state == "suspended" or op.lifecycle == "SUSPENDED"):
            return _takeover(ctx, op, initial)
        return ctx.app_plan(Action.BLOCKED, f"takeover refused: {op.not_suspendable}")
    return _takeover(ctx, op)


def _unknown_operator(ctx: Ctx, op: OperatorDeployment) -> AppPlan | None:
    """First sight of an app without spec.takeover while FlinkDeployments cannot be read (the reconciler may not
    list them, the API server failed): the operator may run this very job, and a job started here beside it from
    empty state (or from an old savepoint) would run twice, with two writers to its sinks. Nothing is started until
    they can be read. A cluster of ours (records lost) is ours to adopt, and a suspended app starts nothing."""
    if ctx.live.cluster is not ClusterPhase.ABSENT or ctx.desired.spec.job.state is not JobState.RUNNING:
        return None
    ns = op.namespace
    return ctx.app_plan(Action.BLOCKED, (
        f"FlinkDeployments in namespace {ns} cannot be read ({op.unreadable}), so whether the Flink Kubernetes "
        f"Operator runs this app's job there is unknown; a new app is not started beside a job it may run. Grant "
        f"the reconciler list on flinkdeployments.flink.apache.org in namespace {ns} (the rule in "
        "deploy/kubernetes/rbac-apps.yaml); if the operator does run it, add spec.takeover (the import writes it) "
        "to take it over with its state"))


def _takeover(ctx: Ctx, op: OperatorDeployment, suspended_from: str | None = None) -> AppPlan:
    sp, _, _ = step_deadlines(ctx)
    delete = seconds(ctx.desired.spec.deadlines.delete)
    where = f"FlinkDeployment {op.namespace}/{op.name}"
    if suspended_from is not None:
        return _take_suspended(ctx, op, where, suspended_from, delete)
    steps: list[Step] = [SuspendOperatorDeployment(namespace=op.namespace, name=op.name, deadline_s=sp),
                         DeleteOperatorDeployment(namespace=op.namespace, name=op.name, deadline_s=delete)]
    risks = [f"TAKES OVER {where} from the Flink Kubernetes Operator: the operator stops its job with a savepoint, "
             "the job is down until it runs here, and the FlinkDeployment is deleted. Never delete it first, nor "
             "let Argo CD / Flux prune it (the operator would cancel the job without a savepoint); remove it from "
             "that source after the takeover, or it is re-created"]
    release = ReleaseOperatorDeployment(namespace=op.namespace, name=op.name, state=op.job_state or "running",
                                        upgrade_mode=op.upgrade_mode, deadline_s=delete)
    if ctx.desired.spec.job.state is not JobState.RUNNING:
        return ctx.app_plan(Action.TAKEOVER, f"take over {where}: stop it with a savepoint and keep it suspended "
                                             "here (spec.job.state: suspended)",
                            risks=tuple(risks), steps=tuple(steps), abort=(release,))
    steps += ctx_start_steps(ctx, CAPTURED, ctx.job_id)
    rollback = tuple(ctx_start_steps(ctx, CAPTURED, ctx.rollback_job_id))
    return ctx.app_plan(Action.TAKEOVER, f"take over {where}: the operator stops it with a savepoint, then the job "
                                         "starts here from that savepoint",
                        risks=tuple(risks), steps=tuple(steps), rollback_after=1, rollback=rollback,
                        abort=(release,))


def _take_suspended(ctx: Ctx, op: OperatorDeployment, where: str, path: str, delete: float) -> AppPlan:
    """A FlinkDeployment suspended before the takeover, whose savepoint the spec names: nothing is asked of the
    operator (no job of it runs); it is deleted, and the job starts here from that savepoint."""
    steps: list[Step] = [DeleteOperatorDeployment(namespace=op.namespace, name=op.name, deadline_s=delete)]
    risks = [f"TAKES OVER {where}, suspended under the Flink Kubernetes Operator: it is deleted (with its HA "
             f"metadata) and the job starts here from spec.job.initialSavepointPath {path}, the savepoint you named; "
             "a newer one in its savepoint directory would be skipped"]
    if ctx.desired.spec.job.state is not JobState.RUNNING:
        return ctx.app_plan(Action.TAKEOVER, f"take over {where} (suspended): delete it and keep the app suspended "
                                             "here (spec.job.state: suspended)", risks=tuple(risks), steps=tuple(steps))
    restore = Restore(kind=RestoreKind.PATH, path=path)
    steps += ctx_start_steps(ctx, restore, ctx.job_id)
    return ctx.app_plan(Action.TAKEOVER, f"take over {where} (suspended): delete it, then the job starts here from "
                                         f"{path}", risks=tuple(risks), steps=tuple(steps), rollback_after=0,
                        rollback=tuple(ctx_start_steps(ctx, restore, ctx.rollback_job_id)))
