"""Executing `RescaleInPlace`: a new parallelism for the running job, through the adaptive scheduler.

The plan puts the regular upgrade after this step as its fallback. The executor runs the step; when it
completes, the execution is done and those steps are skipped (`in_place_done`, also after a crash); when
it fails (Flink refuses, the endpoint is missing, the job does not adopt the parallelism before the
deadline), the executor journals the fallback and runs them.

Seen on Flink 2.3 (see docs/plan.md): the PUT answers at once; the adaptive scheduler then waits out its
cooldown after the job's last (re)start (`jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling`,
30 s by default) and the next checkpoint (`...rescale-trigger.max-delay`), restarts the job's tasks at the
new parallelism from that checkpoint (`latest.restored` names it, `is_savepoint: false`), under the same
job id. Requirements with lowerBound = upperBound never run the job at less: short of slots, it waits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from reconciler.apply.journal import InFlight, Stage, StepPhase
from reconciler.core.plan import RescaleInPlace
from reconciler.errors import DeadlineExceededError, PermanentStepError, ReconcilerError
from reconciler.live.flink import JobVertex
from reconciler.live.ports import FlinkApi


@runtime_checkable
class RescaleApi(Protocol):
    """What an in-place rescale needs of a JobManager's REST API (`FlinkRestClient` has it)."""

    def vertices(self, job_id: str) -> list[JobVertex]: ...
    def resource_requirements(self, job_id: str) -> dict[str, tuple[int, int]]: ...
    def set_resource_requirements(self, job_id: str, requirements: Mapping[str, tuple[int, int]]) -> None: ...


def in_place_done(inf: InFlight) -> RescaleInPlace | None:
    """The in-place rescale that completed this execution, if one did: the steps after it must not run."""
    if inf.stage is not Stage.FORWARD or inf.phase is not StepPhase.DONE or inf.step_index >= len(inf.steps):
        return None
    step = inf.steps[inf.step_index]
    return step if isinstance(step, RescaleInPlace) else None


def target_requirements(current: Mapping[str, tuple[int, int]], step: RescaleInPlace) -> dict[str, tuple[int, int]]:
    """Every vertex running at the job's parallelism (upper bound `previous_parallelism`) gets exactly the new
    one (lower = upper: never less); a vertex that sets its own parallelism keeps it. Idempotent: a vertex
    already at the new one keeps it, so a retried or resumed step asks for the same."""
    moved = {v for v, (_, hi) in current.items() if hi in (step.previous_parallelism, step.parallelism)}
    if not moved:
        raise PermanentStepError(f"no vertex of job {step.job_id} runs at the job's parallelism "
                                 f"{step.previous_parallelism} (requirements {dict(current)})")
    return {v: ((step.parallelism, step.parallelism) if v in moved else req) for v, req in current.items()}


def rescale_in_place(flink: FlinkApi, step: RescaleInPlace, *, job_progress: Callable[[], str | None],
                     wait: Callable[[str], None]) -> None:
    """Ask for the new parallelism and wait until the job runs every task at it and completed a checkpoint
    since (so a failover restores the rescaled job, not the old one). `job_progress` is None while the job
    runs every task and raises when it cannot (failed, gone); `wait` sleeps one poll or raises at the
    deadline. Not adopted by then: the request is taken back (best effort), so the job does not rescale
    later under the fallback."""
    if not isinstance(flink, RescaleApi):
        raise PermanentStepError("this runtime's Flink client cannot change a job's parallelism in place")
    current = flink.resource_requirements(step.job_id)
    target = target_requirements(current, step)
    if target != current:
        flink.set_resource_requirements(step.job_id, target)
    moved = sorted(v for v, (_, hi) in target.items() if hi == step.parallelism)
    adopted = False
    base_checkpoint: int | None = None
    try:
        while True:
            where = job_progress()
            if where is None:
                at = {v.vertex_id: v.parallelism for v in flink.vertices(step.job_id)}
                pending = [v for v in moved if at.get(v) != step.parallelism]
                if not pending:
                    adopted = True
                    completed = flink.checkpoints(step.job_id).latest_completed_id or 0
                    if base_checkpoint is None:
                        base_checkpoint = completed
                    elif completed > base_checkpoint:
                        return
                    where = f"every vertex at {step.parallelism}, waiting for a checkpoint after {base_checkpoint}"
                else:
                    where = f"{len(pending)} of {len(moved)} vertices not yet at {step.parallelism}"
            wait(f"job {step.job_id} to run at parallelism {step.parallelism} (last seen: {where})")
    except DeadlineExceededError:
        if not adopted:
            old = (step.previous_parallelism, step.previous_parallelism)
            undo = {v: (current[v] if current[v] != req else old) if v in moved else req for v, req in target.items()}
            with contextlib.suppress(ReconcilerError):
                flink.set_resource_requirements(step.job_id, undo)
        raise
