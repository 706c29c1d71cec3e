"""One handler per step kind: what each planned step does against the runtime and Flink.

Every handler is idempotent given the journal's scratch data, so a retry within this process and a resume
after a crash are the same code path: a journaled savepoint trigger is polled, never re-triggered; a job id
already on the cluster is never submitted again. A handler returns the scratch data to journal with the
step's completion (a captured savepoint), or raises: TransientStepError is retried until the step's deadline,
PermanentStepError fails the step at once.
"""

from __future__ import annotations

import logging
import re
import uuid
from datetime import datetime, timedelta
from typing import Final

from reconciler.apply.executor.execution import TERMINAL_STATES, Run, clip, suffix
from reconciler.apply.executor.jobmanager import JobManagerProbe
from reconciler.apply.journal import Stage
from reconciler.apply.operator_steps import release_operator, suspend_operator
from reconciler.apply.rescale import rescale_in_place
from reconciler.core.observed import ClusterPhase, JobPhase, job_phase
from reconciler.core.plan import (
    AwaitHealthy,
    AwaitRunning,
    CancelJob,
    DeleteCluster,
    DeleteOperatorDeployment,
    DeleteRetiredCluster,
    DiscardStandby,
    EnsureCluster,
    ForgetApp,
    PromoteStandby,
    ReleaseOperatorDeployment,
    RescaleInPlace,
    RestoreKind,
    SpecRef,
    StartJob,
    StartStandbyCluster,
    Step,
    StopWithSavepoint,
    SuspendOperatorDeployment,
)
from reconciler.errors import (
    JobNotFoundError,
    ObserveError,
    PermanentStepError,
    ReconcilerError,
    StepError,
    TransientStepError,
    TriggerNotFoundError,
)
from reconciler.live.flink import is_transient_text
from reconciler.live.ports import FlinkApi, OperatorTakeover, StandbyRuntime

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_KEY: Final = "execution.checkpointing.interval"
_ZERO_DURATION = re.compile(r"^\s*0+(\.0+)?\s*[a-z]*\s*$", re.IGNORECASE)
_CLOCK_SKEW = timedelta(minutes=1)  # between our clock and the JobManager's, when comparing their times
_MISSING_LOOK_S = 10.0  # how long a new job waits for its tasks before a look for a killed process


class StepHandlers(JobManagerProbe):
    """What each step kind does; `_handle` picks the handler."""

    def _handle(self, run: Run, stage: Stage, step: Step, deadline: float) -> dict[str, str | None]:
        """Do one step (idempotently); return the scratch data to journal with its completion."""
        match step:
            case EnsureCluster():
                self._ensure_cluster(run, step, deadline)
            case StopWithSavepoint():
                return self._stop_with_savepoint(run, step, deadline)
            case CancelJob():
                return self._cancel_job(run, step, deadline)
            case StartJob():
                self._start_job(run, step, deadline)
            case AwaitRunning():
                self._await_running(run, step, deadline)
            case AwaitHealthy():
                self._await_healthy(run, stage, step, deadline)
            case DeleteCluster():
                self.runtime.delete_cluster(run.app, deadline=deadline)
            case ForgetApp():
                self.journal.forget(run.app)
            case RescaleInPlace(job_id=job_id):
                flink = self.runtime.flink(run.app)
                rescale_in_place(flink, step, job_progress=lambda: self._job_progress(flink, job_id),
                                 wait=lambda what: self._wait(deadline, what, flink=flink, job_id=job_id))
                self._record_on_cluster(run)
            case StartStandbyCluster():
                self._start_standby(run, step, deadline)
            case PromoteStandby(generation=gen):
                self._standby_runtime().promote_standby(run.app, generation=gen, deadline=deadline)
            # A runtime without standbys has none to discard or retire: undoing is then a no-op, so an abort
            # of a warm plan handed to it ends cleanly.
            case DiscardStandby(generation=gen) if isinstance(self.runtime, StandbyRuntime):
                self.runtime.discard_standby(run.app, generation=gen, deadline=deadline)
            case DeleteRetiredCluster() if isinstance(self.runtime, StandbyRuntime):
                self.runtime.delete_retired(run.app, deadline=deadline)
            case SuspendOperatorDeployment():
                return suspend_operator(self._operator_port(), self.journal, run.app, run.revision, step,
                                        wait=lambda what: self._wait(deadline, what))
            case DeleteOperatorDeployment(namespace=ns, name=name):
                self._operator_port().delete_flink_deployment(ns, name, deadline=deadline)
            case ReleaseOperatorDeployment():
                release_operator(self._operator_port(), self.journal, run.app, step)
        return {}


    # ---- takeover from the Flink Kubernetes Operator ----

    def _operator_port(self) -> OperatorTakeover:
        if not isinstance(self.runtime, OperatorTakeover):
            raise PermanentStepError(f"the {self.runtime.name} runtime cannot take over FlinkDeployments; a takeover "
                                     "runs on the kubernetes runtime")
        return self.runtime

    def _standby_runtime(self) -> StandbyRuntime:
        if not isinstance(self.runtime, StandbyRuntime):
            raise PermanentStepError(f"the {self.runtime.name} runtime cannot run a standby cluster (warm standby); "
                                     "plan again (it plans cold for this runtime) or set "
                                     "spec.upgrade.clusterStrategy: cold")
        return self.runtime

    def _start_standby(self, run: Run, step: StartStandbyCluster, deadline: float) -> None:
        info = self._standby_runtime().start_standby(self._spec(run, step.spec), generation=step.generation,
                                                     deadline=deadline, jar=self._jar(run, step.spec))
        if info.phase is ClusterPhase.FAILED:
            raise PermanentStepError(f"the standby cluster failed to start: {info.message or 'no reason given'}")
        if info.phase is not ClusterPhase.READY:
            raise TransientStepError(f"the standby cluster is {info.phase.value}: {info.message or 'not ready yet'}")

    def _record_on_cluster(self, run: Run) -> None:
        """After an in-place rescale: the cluster's own copy of the spec (what first sight adopts when the
        records are lost) becomes the desired one, by the cluster's apply, which keeps every pod and JVM (the
        parallelism is in no config hash). Best effort: the job already runs at the new parallelism, and a
        stale copy costs at most one savepoint redeploy after a loss of the records, never a fallback now."""
        try:
            app = self._spec(run, SpecRef.DESIRED)
            self.runtime.ensure_cluster(app, deadline=self.clock.monotonic() + app.spec.deadlines.start.total_seconds(),
                                        keep_running=True)
        except ReconcilerError as e:
            log.warning("%s: rescaled in place, but the cluster's copy of the spec was not updated: %s", run.app, e)

    def _ensure_cluster(self, run: Run, step: EnsureCluster, deadline: float) -> None:
        info = self.runtime.ensure_cluster(self._spec(run, step.spec), deadline=deadline,
                                           keep_running=step.keep_running)
        if info.phase is ClusterPhase.FAILED:
            raise PermanentStepError(f"the cluster failed to start: {info.message or 'no reason given'}")
        if info.phase is not ClusterPhase.READY:
            raise TransientStepError(f"the cluster is {info.phase.value}: {info.message or 'not ready yet'}")

    def _stop_with_savepoint(self, run: Run, step: StopWithSavepoint, deadline: float) -> dict[str, str | None]:
        try:
            return self._stop_attempt(run, step, deadline)
        except (ObserveError, StepError):
            self._jobmanager_alive(run)  # only when an attempt failed: no extra observe on the upgrade's path
            raise

    def _stop_attempt(self, run: Run, step: StopWithSavepoint, deadline: float) -> dict[str, str | None]:
        inf = self._inflight(run.app)
        flink = self.runtime.flink(run.app)
        trigger = inf.trigger_id
        if trigger is not None and inf.captured_path and self._recorded(run.app, inf.captured_path, step.job_id):
            return {}  # completed and recorded before a crash; Flink may have forgotten the trigger by now
        if trigger is None:
            # Trigger only a job that has not ended: a job that ended under us has no savepoint to give.
            state = self._job_state(flink, step.job_id)
            if state is None or state in TERMINAL_STATES:
                raise PermanentStepError(f"job {step.job_id} is {state or 'gone'}: no savepoint can be taken")
            # Our own trigger id is journaled BEFORE the request: whatever happens next (crash, lost
            # response, timeout), a resume polls this id or re-sends it, and Flink deduplicates it.
            trigger = uuid.uuid4().hex
            self.journal.set_scratch(run.app, trigger_id=trigger)
            flink.stop_with_savepoint(step.job_id, drain=step.drain, trigger_id=trigger)
        while True:
            try:
                status = flink.savepoint_status(step.job_id, trigger)
            except TriggerNotFoundError:
                # Journaled, but Flink never got the request (or a restarted JobManager forgot it).
                state = self._job_state(flink, step.job_id)
                if state == "FINISHED":
                    # Flink forgot the operation but the job ended: its checkpoint statistics name the
                    # savepoint it stopped with (taken after this execution began).
                    found = self._stopped_with(flink, step.job_id, since=inf.started_at)
                    if found is not None:
                        self.journal.add_savepoint(run.app, found, job_id=step.job_id, revision=run.revision)
                        return {"captured_path": found, "captured_kind": "savepoint"}
                if state is None or state in TERMINAL_STATES:
                    raise PermanentStepError(
                        f"job {step.job_id} is {state or 'gone'} and Flink does not know savepoint {trigger}: "
                        "its state is not in a known savepoint") from None
                self._wait(deadline, f"savepoint {trigger} of job {step.job_id} (re-sending it)")
                flink.stop_with_savepoint(step.job_id, drain=step.drain, trigger_id=trigger)
                continue
            if status.done:
                if status.failure:
                    # "Not all required tasks are currently running" (too early after a start) comes
                    # back inside a COMPLETED operation: only its text tells "not yet" from "never".
                    # Flink said how it ended: the trigger is settled (a resume must not poll it again).
                    self.journal.set_scratch(run.app, trigger_id=None)
                    if is_transient_text(status.failure):
                        self._restart_missing(run, "the savepoint waited for the job's tasks", default=SpecRef.PREVIOUS)
                        raise TransientStepError(f"savepoint refused for now: {clip(status.failure, 300)}")
                    raise PermanentStepError(f"stop-with-savepoint failed: {clip(status.failure)}")
                if not status.location:
                    self.journal.set_scratch(run.app, trigger_id=None)
                    raise PermanentStepError("stop-with-savepoint completed without a savepoint location")
                self.journal.add_savepoint(run.app, status.location, job_id=step.job_id, revision=run.revision)
                return {"captured_path": status.location, "captured_kind": "savepoint"}
            # A stopping job processes nothing: this is downtime too, poll as for the start.
            self._wait(deadline, f"savepoint {trigger} of job {step.job_id}", interval=self.poll_interval / 4)

    def _stopped_with(self, flink: FlinkApi, job_id: str, *, since: datetime) -> str | None:
        stats = flink.checkpoints(job_id)
        at = stats.latest_savepoint_at
        if stats.latest_savepoint_path and at is not None and at >= since - _CLOCK_SKEW:
            return stats.latest_savepoint_path
        return None

    def _recorded(self, app: str, path: str, job_id: str) -> bool:
        rec = self.journal.record(app)
        return rec is not None and any(s.path == path and s.job_id == job_id for s in rec.savepoints)

    def _cancel_job(self, run: Run, step: CancelJob, deadline: float) -> dict[str, str | None]:
        state = self._cancel_and_wait(run.app, step.job_id, deadline)
        if not step.capture_checkpoint:
            return {}
        if state is None:
            raise PermanentStepError(f"job {step.job_id} is gone: no retained checkpoint can be found")
        stats = self.runtime.flink(run.app).checkpoints(step.job_id)
        if not stats.latest_completed_path:
            raise PermanentStepError(f"job {step.job_id} has no retained checkpoint to restore from")
        self.journal.add_savepoint(
            run.app, stats.latest_completed_path, job_id=step.job_id, revision=run.revision, kind="checkpoint",
            taken_at=stats.latest_completed_at,
        )
        return {"captured_path": stats.latest_completed_path, "captured_kind": "checkpoint"}

    def _cancel_and_wait(self, app: str, job_id: str, deadline: float) -> str | None:
        """Cancel unless already ending, then wait for a terminal state (None: the job does not exist)."""
        flink = self.runtime.flink(app)
        sent = False
        while True:
            state = self._job_state(flink, job_id)
            if state is None or state in TERMINAL_STATES:
                return state
            if not sent and state != "CANCELLING":
                try:
                    flink.cancel(job_id)
                except JobNotFoundError:
                    return None
                except PermanentStepError:  # 409: it reached a terminal state meanwhile; else re-raise
                    state = self._job_state(flink, job_id)
                    if state is None or state in TERMINAL_STATES:
                        return state
                    raise
                sent = True
                continue
            self._wait(deadline, f"job {job_id} to finish cancelling (state {state})")

    def _start_job(self, run: Run, step: StartJob, deadline: float) -> None:
        match step.restore.kind:
            case RestoreKind.NONE:
                restore: str | None = None
            case RestoreKind.CAPTURED:
                restore = self._inflight(run.app).captured_path
                if restore is None:
                    raise PermanentStepError("no captured restore point: the step that takes it did not complete")
            case RestoreKind.PATH:
                restore = step.restore.path
                if not restore:
                    raise PermanentStepError("the plan names no restore path")
        if self._job_submitted(run.app, step.job_id):
            log.info("%s: job %s already submitted; not submitting again", run.app, step.job_id)
            return
        app = self._spec(run, step.spec)
        jar = self._jar(run, step.spec)
        started = self.runtime.start_job(
            app, job_id=step.job_id, jar=jar, restore_path=restore,
            allow_non_restored_state=step.allow_non_restored_state, deadline=deadline,
        )
        if started != step.job_id:
            raise PermanentStepError(f"the runtime started job {started}, not the planned {step.job_id}")

    def _restore_path(self, run: Run, step: StartJob) -> str | None:
        if step.restore.kind is RestoreKind.CAPTURED:
            return self._inflight(run.app).captured_path
        return step.restore.path if step.restore.kind is RestoreKind.PATH else None

    def _job_submitted(self, app: str, job_id: str) -> bool:
        """Whether the cluster already has this job. Unknown (cluster not up yet, as before a
        Kubernetes application-mode start) counts as no: `start_job` is idempotent on the id anyway."""
        try:
            return any(j.job_id == job_id for j in self.runtime.flink(app).jobs())
        except (StepError, ObserveError):
            return False

    def _await_running(self, run: Run, step: AwaitRunning, deadline: float) -> None:
        flink = self.runtime.flink(run.app)
        look = self.clock.monotonic() + _MISSING_LOOK_S
        while True:
            last = self._job_progress(flink, step.job_id)
            if last is None:
                return
            if not self.runtime.restarts_processes and self.clock.monotonic() >= look:  # a TaskManager killed?
                self._restart_missing(run, f"job {step.job_id} waited for its tasks")
                look = self.clock.monotonic() + _MISSING_LOOK_S
            # The app is down until this returns: poll faster than elsewhere (a GET of /jobs/overview).
            self._wait(deadline, f"job {step.job_id} to run all its tasks (last seen {last})",
                       flink=flink, job_id=step.job_id, interval=self.poll_interval / 4)

    def _job_progress(self, flink: FlinkApi, job_id: str) -> str | None:
        """None when the job runs every task; a description of where it is otherwise; raises when it
        cannot get there (gone, failed, ended)."""
        try:
            job = flink.job(job_id)
        except JobNotFoundError as e:
            raise PermanentStepError(f"job {job_id} does not exist{suffix(self._root_cause(flink, job_id))}") from e
        phase = job_phase(job.state, job.tasks_running, job.tasks_total, job.tasks_finished)
        if phase is JobPhase.RUNNING:
            return None
        if phase is JobPhase.FAILING:
            raise PermanentStepError(f"job {job_id} is {job.state}{suffix(self._root_cause(flink, job_id))}")
        if job.state.upper() in TERMINAL_STATES | {"CANCELLING"}:
            raise PermanentStepError(f"job {job_id} ended ({job.state}){suffix(self._root_cause(flink, job_id))}")
        return f"{job.state}, {job.tasks_running}/{job.tasks_total} tasks running"

    def _await_healthy(self, run: Run, stage: Stage, step: AwaitHealthy, deadline: float) -> None:
        conf = self._spec(run, self._spec_ref_of(run, stage, step.job_id)).spec.flink_configuration
        interval = conf.get(CHECKPOINT_INTERVAL_KEY)
        if interval is None or _ZERO_DURATION.match(interval):
            return  # checkpointing is off: nothing to wait for
        flink = self.runtime.flink(run.app)
        while True:
            progress = self._job_progress(flink, step.job_id)
            if progress is None:
                started_ms = flink.job(step.job_id).start_time_ms
                stats = flink.checkpoints(step.job_id)
                after_start = stats.latest_completed_at is None or started_ms <= 0 or (
                    stats.latest_completed_at.timestamp() * 1000 >= started_ms)
                if stats.completed_count > 0 and stats.latest_completed_id is not None and after_start:
                    return
                progress = f"{stats.completed_count} checkpoints completed"
            self._wait(deadline, f"job {step.job_id} to complete a checkpoint (last seen {progress})",
                       flink=flink, job_id=step.job_id)

    @staticmethod
    def _spec_ref_of(run: Run, stage: Stage, job_id: str) -> SpecRef:
        """The spec a job was started from: its StartJob's, else the stage's natural one."""
        for steps in (run.plan.rollback, run.plan.steps) if stage is Stage.ROLLBACK else (run.plan.steps,):
            for s in steps:
                if isinstance(s, StartJob) and s.job_id == job_id:
                    return s.spec
        return SpecRef.PREVIOUS if stage is Stage.ROLLBACK else SpecRef.DESIRED
