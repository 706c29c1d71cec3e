"""One execution as a state machine: its forward steps, and what a failure leads to.

Each stage runs its steps in order: the journal marks a step started *before* anything happens outside and
done *after* it completed; each step has its own deadline on the injected clock, and transient errors are
retried with capped exponential backoff until that deadline (`_run_stage`, `_with_retries`).

Failure path (safety rules 2 and 3 of docs/architecture.md): a step at index <= `rollback_after` fails ->
stop (or run the plan's `abort` steps, which undo what it did beside the old job); the old job was not
touched (or its stop failed, which leaves it running). A later step fails -> cancel the new job we
submitted, run the plan's `rollback` steps once, and report FAILURE either way; nothing here loops and
nothing here writes Git. A stop whose outcome is unknown is parked in flight, never failed; a JobManager
that died without HA ends the execution as interrupted, not as the spec's failure.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from reconciler.apply.executor.events import AppResult, EventPhase, StepEvent
from reconciler.apply.executor.execution import TERMINAL_STATES, Run, StageFailedError, clip
from reconciler.apply.executor.steps import StepHandlers
from reconciler.apply.journal import KEEP, InFlight, Keep, Stage, StepPhase
from reconciler.apply.rescale import in_place_done
from reconciler.core.observed import ClusterPhase, Outcome
from reconciler.core.plan import (
    CancelJob,
    DeleteCluster,
    DeleteOperatorDeployment,
    DeleteRetiredCluster,
    RescaleInPlace,
    SpecRef,
    StartJob,
    Step,
    StopWithSavepoint,
    describe_step,
)
from reconciler.errors import (
    DeadlineExceededError,
    JobManagerGoneError,
    JobNotFoundError,
    JournalError,
    ObserveError,
    PermanentStepError,
    ReconcilerError,
    StepError,
    TransientStepError,
    TriggerNotFoundError,
)
from reconciler.spec.model import FlinkApp

log = logging.getLogger(__name__)
R = TypeVar("R")


class Stages(StepHandlers):
    """One execution, from where its journal says it is to its end."""

    def _drive(self, app: str) -> AppResult:
        inf = self._inflight(app)
        run = Run(app=app, plan=inf.plan, revision=inf.revision)
        plan = inf.plan
        if inf.stage is Stage.FORWARD:
            if inf.step_index == 0 and inf.phase is StepPhase.PENDING and any(
                    isinstance(s, StartJob) and s.spec is SpecRef.DESIRED for s in plan.steps):
                # Fetch the new jar before the first step: a missing or corrupt jar then fails the
                # upgrade while the old job still runs, and the download stays out of the downtime window.
                try:
                    self._jar(run, SpecRef.DESIRED)
                except Exception as e:
                    why = str(e) if isinstance(e, ReconcilerError) else f"internal error: {type(e).__name__}: {e}"
                    return self._finish(run, Outcome.FAILURE, failed_step="resolve the job jar",
                                        message=f"the job jar could not be fetched (nothing was changed): {why}",
                                        job_id=KEEP)
            try:
                self._run_stage(run, Stage.FORWARD, plan.steps, self._next_index(inf))
            except StageFailedError as f:
                no_rollback = plan.rollback_after is None or f.index <= plan.rollback_after or not plan.rollback
                # A dead JobManager (no HA, nothing restarts it) is a fault, not the spec's failure: interrupted, and
                # the next pass restarts from the newest state. After the stop, once per spec (a second death under
                # it is the spec's own doing: the usual failure path, then the crash-loop guard).
                if isinstance(f.__cause__, JobManagerGoneError) and (
                        isinstance(f.step, StopWithSavepoint) or not self.journal.interrupted_before(app)):
                    return self._interrupted(run, f)
                if isinstance(f.step, StopWithSavepoint) and self._stop_outcome_unknown(run, f.step):
                    return self._park(run, f)
                if isinstance(f.step, DeleteOperatorDeployment):  # its job stopped, its savepoint is ours: go on later
                    return self._park(run, f, message=(
                        f"{describe_step(f.step)} failed ({f.cause}); the operator's job is stopped and the savepoint "
                        f"{self._inflight(app).captured_path or 'the spec names'} is recorded, so the takeover stays "
                        "in flight and the "
                        "deletion is retried on the next pass (check the operator: its finalizer removes the "
                        "FlinkDeployment)"))
                if isinstance(f.step, DeleteRetiredCluster):  # the new job runs: never roll that back
                    return self._park(run, f, message=(
                        f"{describe_step(f.step)} failed ({f.cause}); the new job runs on the new cluster, so the "
                        "transition stays in flight and the old cluster's deletion is retried on the next pass"))
                if no_rollback and plan.abort:
                    self.journal.start_rollback(app, failed_step=describe_step(f.step), failure=f.cause,
                                                stage=Stage.ABORT)
                    return self._abort(run, self._inflight(app))
                if no_rollback:
                    return self._finish(run, Outcome.FAILURE, failed_step=describe_step(f.step),
                                        message=f"{describe_step(f.step)} failed: {f.cause}"
                                        + self._old_job_now(run), job_id=KEEP)
                self.journal.start_rollback(app, failed_step=describe_step(f.step), failure=f.cause)
                inf = self._inflight(app)
            else:
                return self._succeed(run)
        if inf.stage is Stage.ABORT:
            return self._abort(run, inf)
        return self._roll_back(run, inf)

    def _abort(self, run: Run, inf: InFlight) -> AppResult:
        """A step up to the stop failed: the old job was not touched. Undo what the plan did beside it (discard
        a warm standby), so nothing of the failed attempt is left. If that fails too, the execution stays in
        flight and the next pass tries again: a leftover cluster is never forgotten."""
        failed_step = inf.failed_step or "a step"
        first = f"{failed_step} failed: {inf.failure}"
        try:
            self._run_stage(run, Stage.ABORT, run.plan.abort, self._next_index(inf))
        except StageFailedError as f:
            return self._park(run, f, message=(
                f"{first}; the old job was not touched, but {describe_step(f.step)} failed too ({f.cause}): the "
                "transition stays in flight and the next pass tries again"))
        undone = "; ".join(describe_step(s) for s in run.plan.abort)
        return self._finish(run, Outcome.FAILURE, failed_step=failed_step,
                            message=f"{first}{self._old_job_now(run)} (undone: {undone})", job_id=KEEP)

    def _old_job_now(self, run: Run) -> str:
        """What became of the job the plan was to stop, as Flink says now (a stop that failed leaves it running,
        unless its JobManager died meanwhile): said as seen, never assumed. '' for a plan with no old job."""
        old = next((s.job_id for s in run.plan.steps if isinstance(s, StopWithSavepoint | CancelJob)), None)
        if old is None:
            return ""
        try:
            state = self._job_state(self.runtime.flink(run.app), old)
        except ReconcilerError as e:
            return (f"; the old job {old} cannot be seen ({clip(str(e), 300)}): if nothing runs, the next pass "
                    "starts the last applied spec again from its newest state")
        if state == "RUNNING":
            return f"; the old job keeps running (Flink says job {old} is RUNNING)"
        if state is not None and state not in TERMINAL_STATES:
            return f"; the old job {old} is {state}"
        return (f"; the old job {old} is {state or 'gone'}: nothing runs, and the next pass starts the last applied "
                "spec again from its newest state")

    def _stop_outcome_unknown(self, run: Run, step: StopWithSavepoint) -> bool:
        """Whether a failed stop-with-savepoint may still have stopped the job: its trigger was journaled (so
        the request may have reached Flink) and one last look cannot settle it. Settled means Flink answered
        that the savepoint failed, or does not know our trigger while the job still runs (it never got it)."""
        trigger = self._inflight(run.app).trigger_id
        if trigger is None:
            return False
        try:
            flink = self.runtime.flink(run.app)
            try:
                status = flink.savepoint_status(step.job_id, trigger)
            except TriggerNotFoundError:
                state = self._job_state(flink, step.job_id)
                if state is None or state in TERMINAL_STATES | {"CANCELLING"}:
                    return True
            else:
                if not (status.done and status.failure):
                    return True
        except ReconcilerError:
            return True
        self.journal.set_scratch(run.app, trigger_id=None)
        return False

    def _interrupted(self, run: Run, f: StageFailedError) -> AppResult:
        """The job to stop died with its JobManager (no HA) before it gave a savepoint: this execution cannot go on.
        It ends as interrupted, not as a failure of the spec: the next pass sees no job and restarts the app from
        its newest checkpoint or savepoint (self-healing, `core.heal`), or says BLOCKED when it finds none."""
        return self._finish(run, Outcome.FAILURE, failed_step=describe_step(f.step), message=(
            f"interrupted: {describe_step(f.step)}: {f.cause}; the next pass restarts the app from its newest "
            "checkpoint or savepoint"), job_id=KEEP, interrupted=True)

    def _park(self, run: Run, f: StageFailedError, *, message: str | None = None) -> AppResult:
        """A stop-with-savepoint whose outcome is unknown (the request may have reached Flink, and no answer
        said it failed) is not finished: the old job may have stopped with a savepoint we have not seen. It
        stays in flight, and the next pass polls the same trigger again (and finishes the upgrade, or fails it
        once Flink says the savepoint failed): never "failed" with the app down and its savepoint unrecorded."""
        message = message or (
            f"{describe_step(f.step)}: no answer from Flink before the deadline ({f.cause}); the job may "
            "have stopped with a savepoint, so the transition stays in flight and resumes on the next pass")
        self.journal.note(run.app, "parked", message, revision=run.revision, outcome=Outcome.FAILURE)
        return AppResult(app=run.app, action=run.plan.action, outcome=Outcome.FAILURE,
                         failed_step=describe_step(f.step), message=message, step_timings=tuple(run.timings))

    @staticmethod
    def _next_index(inf: InFlight) -> int:
        if in_place_done(inf):  # rescaled in place: the steps after it are its fallback, not to run
            return len(inf.steps)
        return inf.step_index + 1 if inf.phase is StepPhase.DONE else inf.step_index

    def _succeed(self, run: Run) -> AppResult:
        plan = run.plan
        job_id: str | Keep | None = KEEP
        starts = [s for s in plan.steps if isinstance(s, StartJob)]
        if starts:
            job_id = starts[-1].job_id
        elif any(isinstance(s, StopWithSavepoint | CancelJob | DeleteCluster | DeleteOperatorDeployment)
                 for s in plan.steps):
            job_id = None
        if (inf := self.journal.inflight(run.app)) is not None and (done := in_place_done(inf)) is not None:
            job_id = done.job_id  # rescaled in place: the same job runs on
        if plan.desired is not None:
            try:
                retention = FlinkApp.model_validate(plan.desired).spec.savepoints
            except ValidationError:
                retention = None
            if retention is not None and self.journal.record(run.app) is not None:
                for sp in self.journal.prune_savepoints(run.app, retention.retain, max_age=retention.max_age,
                                                        disposer=lambda: self.runtime.flink(run.app)):
                    log.info("%s: pruned savepoint %s (retain %d)", run.app, sp.path, retention.retain)
        message = f"{plan.label} applied at {run.revision[:12]}"
        if isinstance(job_id, str):
            message += f"; job {job_id} running"
        return self._finish(run, Outcome.SUCCESS, failed_step=None, message=message, job_id=job_id,
                            applied_spec=plan.desired)

    def _roll_back(self, run: Run, inf: InFlight) -> AppResult:
        failed_step = inf.failed_step or "a step"
        first = f"{failed_step} failed: {inf.failure}"
        try:
            if inf.step_index == 0 and inf.phase is not StepPhase.DONE:
                self._cancel_failed_job(run, inf.submitted_job_id)
            self._run_stage(run, Stage.ROLLBACK, run.plan.rollback, self._next_index(inf))
        except StageFailedError as f:
            return self._finish(
                run, Outcome.FAILURE, failed_step=failed_step,
                message=f"{first}; the rollback failed too: {describe_step(f.step)}: {f.cause}; the next pass "
                        "looks again: with no job running it starts the last applied spec again from its newest "
                        "state (this spec is not retried until Git changes it)",
                job_id=None, rolled_back=False,
            )
        starts = [s for s in run.plan.rollback if isinstance(s, StartJob)]
        return self._finish(
            run, Outcome.FAILURE, failed_step=failed_step,
            message=f"rolled back to the previous spec: {first}",
            job_id=starts[-1].job_id if starts else KEEP, rolled_back=True,
        )

    def _cancel_failed_job(self, run: Run, job_id: str | None) -> None:
        """Before rolling back, make sure the new job we submitted is not running (and holding slots)."""
        if job_id is None:
            return
        try:
            phase = self.runtime.observe(run.app).phase
        except ReconcilerError:
            phase = ClusterPhase.UNKNOWN
        if phase in (ClusterPhase.ABSENT, ClusterPhase.FAILED):
            return  # no JobManager is up, so the new job cannot be running (a stuck rollout)
        if phase is ClusterPhase.STARTING:  # not up yet, or up with a TaskManager missing: cancel what answers
            try:
                self.runtime.flink(run.app).job(job_id)
            except ReconcilerError:  # no JobManager answers, or it does not know the job: nothing runs it
                return
        step = CancelJob(job_id=job_id, deadline_s=self.cleanup_deadline_s)
        try:
            self._with_retries(run, step, lambda deadline: self._cancel_and_wait(run.app, job_id, deadline))
        except StepError as e:
            raise StageFailedError(0, step, f"could not cancel the failed new job {job_id}: {e}") from e

    def _finish(
        self,
        run: Run,
        outcome: Outcome,
        *,
        failed_step: str | None,
        message: str,
        job_id: str | Keep | None,
        rolled_back: bool = False,
        applied_spec: dict[str, Any] | None = None,
        interrupted: bool = False,
    ) -> AppResult:
        inf = self.journal.inflight(run.app)
        savepoint = inf.captured_path if inf is not None else None
        lineage = self.journal.finish(run.app, outcome, message, applied_spec=applied_spec, job_id=job_id,
                                      rolled_back=rolled_back, interrupted=interrupted)
        return AppResult(
            app=run.app, action=run.plan.action, outcome=outcome, failed_step=failed_step, message=message,
            rolled_back=rolled_back, savepoint=savepoint, job_id=job_id if isinstance(job_id, str) else None,
            step_timings=tuple(run.timings),
            restored_from=lineage.restored_from if lineage else None,
            savepoints=lineage.savepoints if lineage else (),
        )


    # ---- running a stage --------------------------------------------------------------------------

    def _run_stage(self, run: Run, stage: Stage, steps: tuple[Step, ...], start: int) -> None:
        rollback = stage is not Stage.FORWARD
        for index in range(start, len(steps)):
            step = steps[index]
            pre: dict[str, str | None] = {}
            if isinstance(step, StartJob):  # with the job id, the lineage: what it restores ("" = empty state)
                pre = {"submitted_job_id": step.job_id, "restored_from": self._restore_path(run, step) or ""}
            self.journal.step_started(run.app, index, **pre)
            t0 = self.clock.monotonic()
            self._emit(run, step, EventPhase.STARTED, t0, index=index, count=len(steps), rollback=rollback)
            try:
                scratch = self._with_retries(
                    run, step, functools.partial(self._handle, run, stage, step),
                    index=index, count=len(steps), rollback=rollback,
                )
            except StepError as e:
                self._record_timing(run, step, t0, rollback)
                self._emit(run, step, EventPhase.FAILED, t0, index=index, count=len(steps), rollback=rollback,
                           message=str(e))
                if isinstance(step, RescaleInPlace) and stage is Stage.FORWARD:  # the steps after it: its fallback
                    self.journal.note(run.app, "fallback", f"in-place rescale to parallelism {step.parallelism} "
                                      f"failed ({clip(str(e), 500)}); running the regular upgrade instead",
                                      revision=run.revision, outcome=Outcome.PENDING)
                    continue
                raise StageFailedError(index, step, clip(str(e))) from e
            except Exception as e:  # a bug in a handler or port: fail this app's step, not the process
                log.exception("%s: step %s raised unexpectedly", run.app, step.type)
                self._record_timing(run, step, t0, rollback)
                cause = f"internal error: {type(e).__name__}: {e}"
                self._emit(run, step, EventPhase.FAILED, t0, index=index, count=len(steps), rollback=rollback,
                           message=cause)
                raise StageFailedError(index, step, clip(cause)) from e
            self.journal.step_done(run.app, index, **scratch)
            self._record_timing(run, step, t0, rollback)
            self._emit(run, step, EventPhase.DONE, t0, index=index, count=len(steps), rollback=rollback)
            if isinstance(step, RescaleInPlace) and stage is Stage.FORWARD:
                return  # rescaled in place: the steps after it are its fallback

    def _with_retries(
        self, run: Run, step: Step, attempt_fn: Callable[[float], R], *, index: int = 0, count: int = 1,
        rollback: bool = False,
    ) -> R:
        """Call `attempt_fn(deadline)` until it returns, retrying transient errors with backoff."""
        t0 = self.clock.monotonic()
        deadline = t0 + step.deadline_s
        attempt = 0
        while True:
            try:
                return attempt_fn(deadline)
            except TransientStepError as e:
                last: ReconcilerError = e
            except JobNotFoundError as e:
                raise PermanentStepError(str(e)) from e
            except ObserveError as e:  # live state unreadable right now: worth another look
                last = e
            except StepError:
                raise
            except JournalError:
                raise
            except ReconcilerError as e:  # provisioning, spec, ... : retrying will not help
                raise PermanentStepError(str(e)) from e
            if not rollback:
                self._fail_fast_if_jobmanager_died(run, step)
            delay = self.backoff.delay(attempt)
            attempt += 1
            if self.clock.monotonic() + delay >= deadline:
                raise DeadlineExceededError(
                    f"did not succeed within its {step.deadline_s:g}s deadline; last error: {last}"
                ) from last
            self._emit(run, step, EventPhase.RETRY, t0, index=index, count=count, rollback=rollback,
                       message=f"{last} (retry in {delay:g}s)")
            self.clock.sleep(delay)

    def _record_timing(self, run: Run, step: Step, t0: float, rollback: bool) -> None:
        run.timings.append((("rollback:" if rollback else "") + step.type, self.clock.monotonic() - t0))

    def _emit(
        self, run: Run, step: Step, phase: EventPhase, t0: float, *, index: int, count: int, rollback: bool,
        message: str | None = None,
    ) -> None:
        if self.on_event is None:
            return
        event = StepEvent(app=run.app, index=index, count=count, description=describe_step(step), phase=phase,
                          elapsed=self.clock.monotonic() - t0, rollback=rollback, message=message)
        try:
            self.on_event(event)
        except Exception:  # progress output must never break an upgrade
            log.exception("progress callback failed")
