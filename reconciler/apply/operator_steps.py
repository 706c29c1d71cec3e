"""Executing a takeover's steps on the Flink Kubernetes Operator's FlinkDeployment.

`SuspendOperatorDeployment`: the operator is asked (never forced) to stop the job it runs with a savepoint, and
never without one (its last-state fallback off). Before the patch, the FlinkDeployment is checked again (still
running, not suspended: `suspend_refusal`) and what it was is journaled (`Before`: the savepoint fields of its
status, and every field the patch sets). Once suspended, only a savepoint this suspend produced is accepted
(`suspension`: a new path, newer than the last one recorded, not a checkpoint nor the last-state placeholder,
its `_metadata` on storage where the runtime can look), and journaled the moment it is read, so the deletion of
the FlinkDeployment that follows can never take the only copy of that path with it. Anything else fails the step
before the deletion: the abort gives the FlinkDeployment back (`release`), as it was.
"""

from __future__ import annotations

from collections.abc import Callable

from reconciler.apply.journal import Journal
from reconciler.core.plan import ReleaseOperatorDeployment, SuspendOperatorDeployment
from reconciler.errors import PermanentStepError
from reconciler.live.ports import OperatorTakeover
from reconciler.operator_migration.status import (
    Before,
    before_suspend,
    release_patch,
    suspend_patch,
    suspend_refusal,
    suspension,
)


def suspend_operator(port: OperatorTakeover, journal: Journal, app: str, revision: str,
                     step: SuspendOperatorDeployment, *, wait: Callable[[str], None]) -> dict[str, str | None]:
    """Check, journal what it was, patch (once), then poll the status until it names a savepoint this suspend
    produced; `wait(what)` sleeps one poll interval or raises at the step's deadline. Returns the scratch data to
    journal with the step."""
    where = f"FlinkDeployment {step.namespace}/{step.name}"
    inflight = journal.inflight(app)
    captured = inflight.captured_path if inflight is not None else None
    journaled = inflight.operator_before if inflight is not None else None
    fd = port.flink_deployment(step.namespace, step.name)
    if fd is None:
        if captured:  # read and journaled before a crash
            return {"captured_path": captured, "captured_kind": "savepoint"}
        raise PermanentStepError(f"{where} is gone before its savepoint path was read: set "
                                 "spec.job.initialSavepointPath to its last savepoint (in its savepoint directory)")
    if journaled is None:  # not patched yet: its state now decides, and what it is now is what an abort restores
        refused = suspend_refusal(fd)
        if refused:
            raise PermanentStepError(f"takeover refused, nothing was changed: {refused}")
        before = before_suspend(fd)
        journal.set_scratch(app, operator_before=before.to_json())
        port.suspend_flink_deployment(step.namespace, step.name, patch=suspend_patch())
    else:
        before = Before.from_json(journaled)
        job = (fd.get("spec") or {}).get("job") or {}
        if job.get("state") != "suspended" or job.get("upgradeMode") != "savepoint":  # crashed before the patch
            port.suspend_flink_deployment(step.namespace, step.name, patch=suspend_patch())
    while True:
        answer = suspension(fd, before, port.savepoint_on_storage)
        if answer.done and answer.problem:
            raise PermanentStepError(f"{where}: {answer.problem}")
        if answer.done and answer.savepoint:
            journal.set_scratch(app, captured_path=answer.savepoint, captured_kind="savepoint")
            job_id = ((fd.get("status") or {}).get("jobStatus") or {}).get("jobId")
            rec = journal.record(app)
            if rec is None or not any(s.path == answer.savepoint for s in rec.savepoints):
                journal.add_savepoint(app, answer.savepoint, job_id=str(job_id) if job_id else None,
                                      revision=revision)
            return {"captured_path": answer.savepoint, "captured_kind": "savepoint"}
        lifecycle = (fd.get("status") or {}).get("lifecycleState") or "no status"
        wait(f"the operator to suspend {where} with a savepoint (lifecycleState {lifecycle})")
        fd = port.flink_deployment(step.namespace, step.name)
        if fd is None:
            raise PermanentStepError(f"{where} was deleted while the operator suspended it, before its savepoint "
                                     "path was read: set spec.job.initialSavepointPath to its last savepoint")


def release_operator(port: OperatorTakeover, journal: Journal, app: str, step: ReleaseOperatorDeployment) -> None:
    """Give the FlinkDeployment back as it was before our suspend patch: every field the patch set. Nothing was
    patched (no `Before` journaled: the suspend was refused, or never sent): nothing to give back."""
    inflight = journal.inflight(app)
    if inflight is None or inflight.operator_before is None:
        return
    port.release_flink_deployment(step.namespace, step.name,
                                  patch=release_patch(Before.from_json(inflight.operator_before)))
