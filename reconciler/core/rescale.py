"""In-place rescale (opt-in): a parallelism-only change applied to the running job, not by replacing it.

With Flink's adaptive scheduler a job's parallelism can change through its resource requirements (REST
`PUT /jobs/:jobid/resource-requirements`): the same job keeps running and restarts its tasks at the new
parallelism from its own latest checkpoint, so there is no savepoint, no new job and no jar upload. The
planner first plans the regular upgrade; `in_place_rescale` then either returns it unchanged or puts a
`RescaleInPlace` step in front of it, the regular steps becoming its fallback (they run only when the
rescale fails or Flink does not adopt it in time; see `reconciler.apply.rescale`). When the change also raises
`taskManager.replicas` so the slots hold the new parallelism (what the autoscaler commits with
`autoscale.maxTaskManagers`), the new TaskManagers are started first (`EnsureCluster`, which adds TaskManagers
without touching the JobManager or the job): the adaptive scheduler only runs the job at a parallelism it has
slots for. Pure.
"""

from __future__ import annotations

from reconciler.core.diff import field_name, highest_class
from reconciler.core.observed import JobPhase, LiveApp
from reconciler.core.plan import Action, AppPlan, AwaitHealthy, EnsureCluster, FieldChange, RescaleInPlace, Step
from reconciler.spec.model import ChangeClass, FlinkApp

PARALLELISM_PATH = "/spec/job/parallelism"
REPLICAS_PATH = "/spec/taskManager/replicas"


def in_place_rescale(upgrade: AppPlan, desired: FlinkApp, previous: FlinkApp | None, live: LiveApp,
                     changes: tuple[FieldChange, ...]) -> AppPlan:
    """`upgrade` (the regular plan of this change), or the in-place rescale with `upgrade` as its fallback.

    Opted in (spec.upgrade.inPlaceRescale, which the spec may only set with the adaptive scheduler), the
    rescale is planned when the change is parallelism-only and safe in place; otherwise the reason says
    why the regular upgrade runs instead."""
    if not desired.spec.upgrade.in_place_rescale or upgrade.action not in (Action.UPGRADE, Action.RESTART):
        return upgrade
    why_not = _why_not(upgrade, desired, previous, live, changes)
    if why_not is not None:
        return upgrade.model_copy(update={"reason": f"{upgrade.reason} (not rescaled in place: {why_not})"})
    assert previous is not None and live.job_id is not None  # _why_not checked both
    old, new = previous.spec.job.parallelism, desired.spec.job.parallelism
    step = RescaleInPlace(job_id=live.job_id, parallelism=new, previous_parallelism=old,
                          deadline_s=max(1.0, desired.spec.deadlines.rescale.total_seconds()))
    first: tuple[Step, ...] = (step,)
    tms = ""
    old_tm, new_tm = previous.spec.task_manager.replicas, desired.spec.task_manager.replicas
    if new_tm > old_tm:
        first = (EnsureCluster(deadline_s=max(1.0, desired.spec.deadlines.start.total_seconds()), keep_running=True),
                 step)
        tms = f" on taskManager.replicas {old_tm} -> {new_tm} (started first, the job untouched)"
    shifted = None if upgrade.rollback_after is None else upgrade.rollback_after + len(first)
    return upgrade.model_copy(update={
        "action": Action.SCALE,
        "reason": f"spec.job.parallelism {old} -> {new}{tms}: rescaled in place by the adaptive scheduler (the same "
                  f"job keeps running, restarted from its own latest checkpoint); if that fails: {upgrade.reason}",
        "steps": (*first, *upgrade.steps),
        "rollback_after": shifted,
    })


def _why_not(upgrade: AppPlan, desired: FlinkApp, previous: FlinkApp | None, live: LiveApp,
             changes: tuple[FieldChange, ...]) -> str | None:
    if previous is None:
        return "no applied spec on record to rescale from"
    if live.job is not JobPhase.RUNNING or live.job_id is None:
        return f"job {live.job_id} is {live.job.value} ({live.flink_state}), not running every task"
    new = desired.spec.job.parallelism
    tm, new_tm = previous.spec.task_manager, desired.spec.task_manager
    more_tms = new_tm.replicas > tm.replicas and new_tm.slots == tm.slots
    if new > (new_tm.replicas if more_tms else tm.replicas) * tm.slots:
        return (f"parallelism {new} needs {new} task slots and the running cluster has {tm.replicas * tm.slots} "
                f"(taskManager.replicas {tm.replicas} x slots {tm.slots}), so it is not a parallelism-only change")
    ok = {PARALLELISM_PATH, REPLICAS_PATH} if more_tms else {PARALLELISM_PATH}
    others = sorted({field_name(c.path) for c in changes if c.change_class >= ChangeClass.SCALE and c.path not in ok})
    if others:
        return f"{', '.join(others[:3])} changed too ({highest_class(changes).label}), not only the parallelism"
    if not any(isinstance(s, AwaitHealthy) for s in upgrade.steps):
        # Without checkpoints the adaptive scheduler would restart the tasks from empty state.
        return "checkpointing is off (execution.checkpointing.interval unset), and the rescale restarts the " \
               "job's tasks from its latest checkpoint"
    return None
