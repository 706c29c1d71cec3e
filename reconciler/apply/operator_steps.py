"""Executing `SuspendOperatorDeployment`: the Flink Kubernetes Operator is asked (never forced) to stop the job
it runs with a savepoint, and the savepoint path its status then names is journaled the moment it is read, so
the deletion of the FlinkDeployment that follows can never take the only copy of that path with it."""

from __future__ import annotations

from collections.abc import Callable

from reconciler.apply.journal import Journal
from reconciler.core.plan import SuspendOperatorDeployment
from reconciler.errors import PermanentStepError
from reconciler.live.ports import OperatorTakeover
from reconciler.operator_migration.status import suspension


def suspend_operator(port: OperatorTakeover, journal: Journal, app: str, revision: str,
                     step: SuspendOperatorDeployment, *, wait: Callable[[str], None]) -> dict[str, str | None]:
    """Patch (idempotent), then poll the status until it names the savepoint; `wait(what)` sleeps one poll
    interval or raises at the step's deadline. Returns the scratch data to journal with the step."""
    where = f"FlinkDeployment {step.namespace}/{step.name}"
    inflight = journal.inflight(app)
    captured = inflight.captured_path if inflight is not None else None
    fd = port.flink_deployment(step.namespace, step.name)
    if fd is None:
        if captured:  # read and journaled before a crash
            return {"captured_path": captured, "captured_kind": "savepoint"}
        raise PermanentStepError(f"{where} is gone before its savepoint path was read: set "
                                 "spec.job.initialSavepointPath to its last savepoint (in its savepoint directory)")
    job = (fd.get("spec") or {}).get("job") or {}
    if job.get("state") != "suspended" or job.get("upgradeMode") != "savepoint":
        port.suspend_flink_deployment(step.namespace, step.name)
    while True:
        answer = suspension(fd)
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
