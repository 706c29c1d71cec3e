"""The executor: runs each app's planned steps against a Runtime, journaled and resumable.

Per step: the journal marks it started *before* anything happens outside and done *after* it
completed; each step has its own deadline on the injected clock; transient errors are retried with
capped exponential backoff until that deadline. Every step handler is idempotent given the journal's
scratch data, so a retry within this process and a resume after a crash are the same code path:
a journaled savepoint trigger is polled, never re-triggered; a job id already on the cluster is
never submitted again.

Failure path (safety rules 2 and 3 of docs/architecture.md): a step at index <= `rollback_after` fails -> stop;
the old job was not touched (or its stop failed, which leaves it running). A later step fails ->
cancel the new job we submitted, run the plan's `rollback` steps once, and report FAILURE either
way; nothing here loops and nothing here writes Git.

Apps are independent: `run` executes them on a bounded thread pool and one app's failure or bug
becomes that app's FAILURE, never the others'. A `BaseException` that is not an `Exception`
(KeyboardInterrupt, SystemExit, a test's simulated crash) is deliberately not caught: it models the
process dying, and the journal is what a later `resume` continues from.

Over 600 lines for one concern: every step kind's handler, with its deadline, retries, and the forward,
rollback and abort stages that must read as one state machine.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic import ValidationError

from reconciler.apply.journal import KEEP, InFlight, Journal, Keep, Stage, StepPhase
from reconciler.apply.operator_steps import release_operator, suspend_operator
from reconciler.apply.rescale import in_place_done, rescale_in_place
from reconciler.apply.retry import Backoff
from reconciler.clock import Clock
from reconciler.core.observed import ClusterPhase, JobPhase, Outcome, job_phase
from reconciler.core.plan import (
    Action,
    AppPlan,
    AwaitHealthy,
    AwaitRunning,
    CancelJob,
    DeleteCluster,
    DeleteOperatorDeployment,
    DeleteRetiredCluster,
    DiscardStandby,
    EnsureCluster,
    ForgetApp,
    Plan,
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
    describe_step,
)
from reconciler.errors import (
    DeadlineExceededError,
    FencedError,
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
from reconciler.live.flink import is_transient_text
from reconciler.live.ports import FlinkApi, OperatorTakeover, Runtime, StandbyRuntime
from reconciler.live.records import is_record_name
from reconciler.logs import log_context
from reconciler.spec.model import FlinkApp

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

# Flink states a job never leaves (SUSPENDED is left out: with HA the job comes back).
TERMINAL_STATES: Final = frozenset({"FINISHED", "CANCELED", "FAILED"})
CHECKPOINT_INTERVAL_KEY: Final = "execution.checkpointing.interval"
_ZERO_DURATION = re.compile(r"^\s*0+(\.0+)?\s*[a-z]*\s*$", re.IGNORECASE)
_MAX_CAUSE = 2000
_CLOCK_SKEW = timedelta(minutes=1)  # between our clock and the JobManager's, when comparing their times
_MISSING_LOOK_S = 10.0  # how long a new job waits for its tasks before a look for a killed process


class EventPhase(StrEnum):
    STARTED = "started"
    DONE = "done"
    RETRY = "retry"
    FAILED = "failed"


@dataclass(frozen=True)
class StepEvent:
    """A progress line for the CLI: one per step start/end and per retry."""

    app: str
    index: int  # 0-based within its stage
    count: int  # steps in the stage
    description: str
    phase: EventPhase
    elapsed: float  # seconds since the step started (injected clock)
    rollback: bool = False
    message: str | None = None


@dataclass(frozen=True)
class AppResult:
    app: str
    action: Action
    outcome: Outcome
    failed_step: str | None
    message: str
    rolled_back: bool = False
    savepoint: str | None = None  # the restore point this execution captured, if any
    job_id: str | None = None  # the job this execution left running (submitted by it), if any
    restored_from: str | None = None  # what its last started job restored ("": empty state; None: no start)
    savepoints: tuple[str, ...] = ()  # every savepoint/checkpoint this execution captured
    step_timings: tuple[tuple[str, float], ...] = ()  # (step type, seconds); rollback steps "rollback:<type>"


@dataclass
class _Run:
    """Mutable bookkeeping of one execution in this process (the durable part is the journal)."""

    app: str
    plan: AppPlan
    revision: str
    timings: list[tuple[str, float]] = field(default_factory=list)
    specs: dict[SpecRef, FlinkApp] = field(default_factory=dict)
    jars: dict[SpecRef, Path | None] = field(default_factory=dict)


class _StageFailedError(Exception):
    """A stage stopped at a step (internal control flow)."""

    def __init__(self, index: int, step: Step, cause: str) -> None:
        super().__init__(cause)
        self.index = index
        self.step = step
        self.cause = cause


class Executor:
    def __init__(
        self,
        runtime: Runtime,
        journal: Journal,
        clock: Clock,
        *,
        resolve_jar: Callable[[FlinkApp], Path | None],
        poll_interval: float = 0.2,
        max_parallel: int = 4,
        on_event: Callable[[StepEvent], None] | None = None,
        backoff: Backoff | None = None,
        cleanup_deadline_s: float = 60.0,
    ) -> None:
        if poll_interval <= 0 or max_parallel < 1 or cleanup_deadline_s <= 0:
            raise ValueError("poll_interval and cleanup_deadline_s must be > 0, max_parallel >= 1")
        self.runtime = runtime
        self.journal = journal
        self.clock = clock
        self.resolve_jar = resolve_jar
        self.poll_interval = poll_interval
        self.max_parallel = max_parallel
        self.on_event = on_event
        self.backoff = backoff or Backoff()
        self.cleanup_deadline_s = cleanup_deadline_s

    # ---- entry points ---------------------------------------------------------------------------

    def run(self, plan: Plan) -> dict[str, AppResult]:
        """Execute every app of the plan that has something to do, concurrently and independently.

        Apps with an unfinished execution in the journal must be resumed first (`resume_all`): their new
        plan was computed against a half-done state, so they are refused (FAILURE, nothing touched); one that
        `resume_all` parked (a stop whose outcome is unknown) is refused so until its transition ends."""
        todo = [a for a in plan.apps if a.action is not Action.NOOP]
        self._stamp_revision(plan.revision)
        return self._parallel(todo, lambda a: a.app, lambda a: self._guarded(a.app, a.action,
                                                                            lambda: self.run_app(plan.revision, a)))

    def run_app(self, revision: str, app_plan: AppPlan) -> AppResult:
        if app_plan.action in (Action.BLOCKED, Action.ERROR, Action.NOOP):
            return self._not_executed(revision, app_plan)
        pending = self.journal.inflight(app_plan.app)
        if pending is not None:
            return AppResult(app=app_plan.app, action=app_plan.action, outcome=Outcome.FAILURE, failed_step=None,
                             message=f"not started: an unfinished execution of revision {pending.revision[:12]} "
                                     f"({pending.plan.action.value}) is still in flight; it is resumed first")
        self.journal.begin(app_plan.app, revision, app_plan)
        return self._drive(app_plan.app)

    def resume(self, app: str) -> AppResult | None:
        """Continue the app's execution left in the journal by a crashed process (None: nothing to do)."""
        pending = self.journal.inflight(app)
        if pending is None:
            return None
        self._stamp_revision(pending.revision)
        return self._drive(app)

    def resume_all(self) -> dict[str, AppResult]:
        """Resume every in-flight execution, those of one revision at a time (the runtime stamps it)."""
        by_revision: dict[str, list[InFlight]] = {}
        for i in self.journal.all_inflight().values():
            by_revision.setdefault(i.revision, []).append(i)
        results: dict[str, AppResult | None] = {}
        for _, pending in sorted(by_revision.items()):  # resume() stamps the group's revision
            results.update(self._parallel(
                pending, lambda i: i.app, lambda i: self._guarded(i.app, i.plan.action, lambda: self.resume(i.app))))
        return {k: v for k, v in results.items() if v is not None}

    def _stamp_revision(self, revision: str) -> None:
        """The one place a runtime that stamps its objects with the revision (Kubernetes) learns it; the Runtime
        protocol keeps it out of every call. A resumed execution stamps its own: another one (a new replica's
        "unknown", an older pass's) changes a Deployment's annotations, which rolls its pods (a warm standby's
        session cluster restarted, a just-submitted job's JobManager too)."""
        if hasattr(self.runtime, "revision"):
            self.runtime.revision = revision

    def _parallel(self, items: list[T], key: Callable[[T], str], fn: Callable[[T], R]) -> dict[str, R]:
        if not items:
            return {}
        crash: BaseException | None = None
        results: dict[str, R] = {}
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(items)),
                                thread_name_prefix="apply") as pool:
            futures = [(key(i), pool.submit(fn, i)) for i in items]
            for name, fut in futures:
                try:
                    results[name] = fut.result()
                except BaseException as e:  # a simulated/real crash in one worker: re-raised below
                    crash = crash or e
        if crash is not None:
            raise crash
        return results

    def _guarded(self, app: str, action: Action, fn: Callable[[], R]) -> R | AppResult:
        """Turn anything an app's execution raises (a journal error, a bug outside the steps) into
        that app's FAILURE. Its in-flight record, if any, is left alone: finishing it here could
        drop a half-done upgrade that only a resume can complete safely."""
        try:
            with log_context(app=app):  # every line this app's execution logs names it
                return fn()
        except FencedError as e:  # deposed: stop here; the leader resumes from the record
            log.warning("%s: stopped, this replica may no longer act: %s", app, e)
            return AppResult(app=app, action=action, outcome=Outcome.FAILURE, failed_step=None,
                             message=f"stopped: {e}")
        except Exception as e:
            log.exception("applying %s failed unexpectedly", app)
            message = f"internal error: {type(e).__name__}: {e}"
            return AppResult(app=app, action=action, outcome=Outcome.FAILURE, failed_step=None, message=message)

    def _not_executed(self, revision: str, app_plan: AppPlan) -> AppResult:
        """No-op: nothing to record. Blocked / invalid: record the attempt, touch nothing live."""
        outcome = Outcome.SUCCESS
        if app_plan.action is not Action.NOOP:
            outcome = Outcome.ERROR if app_plan.action is Action.ERROR else Outcome.FAILURE
        # An error of a file that names no app (its plan entry is the file's path) has no record to keep; an app
        # whose record cannot be read keeps it as it is (never written over: it is what a human repairs).
        if (app_plan.action is not Action.NOOP and is_record_name(app_plan.app)
                and app_plan.app not in self.journal.broken()):
            self.journal.record_attempt(app_plan.app, revision, outcome, app_plan.reason,
                                        action=app_plan.action.value, source_file=app_plan.source_file)
        return AppResult(app=app_plan.app, action=app_plan.action, outcome=outcome, failed_step=None,
                         message=app_plan.reason)

    # ---- one execution --------------------------------------------------------------------------

    def _drive(self, app: str) -> AppResult:
        inf = self._inflight(app)
        run = _Run(app=app, plan=inf.plan, revision=inf.revision)
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
            except _StageFailedError as f:
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
                                        message=f"{describe_step(f.step)} failed: {f.cause}", job_id=KEEP)
                self.journal.start_rollback(app, failed_step=describe_step(f.step), failure=f.cause)
                inf = self._inflight(app)
            else:
                return self._succeed(run)
        if inf.stage is Stage.ABORT:
            return self._abort(run, inf)
        return self._roll_back(run, inf)

    def _abort(self, run: _Run, inf: InFlight) -> AppResult:
        """A step up to the stop failed: the old job was not touched. Undo what the plan did beside it (discard
        a warm standby), so nothing of the failed attempt is left. If that fails too, the execution stays in
        flight and the next pass tries again: a leftover cluster is never forgotten."""
        failed_step = inf.failed_step or "a step"
        first = f"{failed_step} failed: {inf.failure}"
        try:
            self._run_stage(run, Stage.ABORT, run.plan.abort, self._next_index(inf))
        except _StageFailedError as f:
            return self._park(run, f, message=(
                f"{first}; the old job was not touched, but {describe_step(f.step)} failed too ({f.cause}): the "
                "transition stays in flight and the next pass tries again"))
        undone = "; ".join(describe_step(s) for s in run.plan.abort)
        return self._finish(run, Outcome.FAILURE, failed_step=failed_step,
                            message=f"{first}; the old job keeps running (undone: {undone})", job_id=KEEP)

    def _stop_outcome_unknown(self, run: _Run, step: StopWithSavepoint) -> bool:
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

    def _interrupted(self, run: _Run, f: _StageFailedError) -> AppResult:
        """The job to stop died with its JobManager (no HA) before it gave a savepoint: this execution cannot go on.
        It ends as interrupted, not as a failure of the spec: the next pass sees no job and restarts the app from
        its newest checkpoint or savepoint (self-healing, `core.heal`), or says BLOCKED when it finds none."""
        return self._finish(run, Outcome.FAILURE, failed_step=describe_step(f.step), message=(
            f"interrupted: {describe_step(f.step)}: {f.cause}; the next pass restarts the app from its newest "
            "checkpoint or savepoint"), job_id=KEEP, interrupted=True)

    def _park(self, run: _Run, f: _StageFailedError, *, message: str | None = None) -> AppResult:
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

    def _succeed(self, run: _Run) -> AppResult:
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

    def _roll_back(self, run: _Run, inf: InFlight) -> AppResult:
        failed_step = inf.failed_step or "a step"
        first = f"{failed_step} failed: {inf.failure}"
        try:
            if inf.step_index == 0 and inf.phase is not StepPhase.DONE:
                self._cancel_failed_job(run, inf.submitted_job_id)
            self._run_stage(run, Stage.ROLLBACK, run.plan.rollback, self._next_index(inf))
        except _StageFailedError as f:
            return self._finish(
                run, Outcome.FAILURE, failed_step=failed_step,
                message=f"{first}; the rollback failed too: {describe_step(f.step)}: {f.cause}; "
                        "the app is left as it is and needs a human",
                job_id=None, rolled_back=False,
            )
        starts = [s for s in run.plan.rollback if isinstance(s, StartJob)]
        return self._finish(
            run, Outcome.FAILURE, failed_step=failed_step,
            message=f"rolled back to the previous spec: {first}",
            job_id=starts[-1].job_id if starts else KEEP, rolled_back=True,
        )

    def _cancel_failed_job(self, run: _Run, job_id: str | None) -> None:
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
            raise _StageFailedError(0, step, f"could not cancel the failed new job {job_id}: {e}") from e

    def _finish(
        self,
        run: _Run,
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

    def _inflight(self, app: str) -> InFlight:
        inf = self.journal.inflight(app)
        if inf is None:
            raise JournalError(f"{self.journal.path}: app {app!r} has no execution in flight")
        return inf

    # ---- steps ----------------------------------------------------------------------------------

    def _run_stage(self, run: _Run, stage: Stage, steps: tuple[Step, ...], start: int) -> None:
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
                                      f"failed ({_short(str(e), 500)}); running the regular upgrade instead",
                                      revision=run.revision, outcome=Outcome.PENDING)
                    continue
                raise _StageFailedError(index, step, _short(str(e))) from e
            except Exception as e:  # a bug in a handler or port: fail this app's step, not the process
                log.exception("%s: step %s raised unexpectedly", run.app, step.type)
                self._record_timing(run, step, t0, rollback)
                cause = f"internal error: {type(e).__name__}: {e}"
                self._emit(run, step, EventPhase.FAILED, t0, index=index, count=len(steps), rollback=rollback,
                           message=cause)
                raise _StageFailedError(index, step, _short(cause)) from e
            self.journal.step_done(run.app, index, **scratch)
            self._record_timing(run, step, t0, rollback)
            self._emit(run, step, EventPhase.DONE, t0, index=index, count=len(steps), rollback=rollback)
            if isinstance(step, RescaleInPlace) and stage is Stage.FORWARD:
                return  # rescaled in place: the steps after it are its fallback

    def _with_retries(
        self, run: _Run, step: Step, attempt_fn: Callable[[float], R], *, index: int = 0, count: int = 1,
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

    def _handle(self, run: _Run, stage: Stage, step: Step, deadline: float) -> dict[str, str | None]:
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

    def _start_standby(self, run: _Run, step: StartStandbyCluster, deadline: float) -> None:
        info = self._standby_runtime().start_standby(self._spec(run, step.spec), generation=step.generation,
                                                     deadline=deadline, jar=self._jar(run, step.spec))
        if info.phase is ClusterPhase.FAILED:
            raise PermanentStepError(f"the standby cluster failed to start: {info.message or 'no reason given'}")
        if info.phase is not ClusterPhase.READY:
            raise TransientStepError(f"the standby cluster is {info.phase.value}: {info.message or 'not ready yet'}")

    def _record_on_cluster(self, run: _Run) -> None:
        """After an in-place rescale: the cluster's own copy of the spec (what first sight adopts when the
        records are lost) becomes the desired one, by the cluster's apply, which keeps every pod and JVM (the
        parallelism is in no config hash). Best effort: the job already runs at the new parallelism, and a
        stale copy costs at most one savepoint redeploy after a loss of the records, never a fallback now."""
        try:
            app = self._spec(run, SpecRef.DESIRED)
            self.runtime.ensure_cluster(app, deadline=self.clock.monotonic() + app.spec.deadlines.start.total_seconds())
        except ReconcilerError as e:
            log.warning("%s: rescaled in place, but the cluster's copy of the spec was not updated: %s", run.app, e)

    def _ensure_cluster(self, run: _Run, step: EnsureCluster, deadline: float) -> None:
        info = self.runtime.ensure_cluster(self._spec(run, step.spec), deadline=deadline)
        if info.phase is ClusterPhase.FAILED:
            raise PermanentStepError(f"the cluster failed to start: {info.message or 'no reason given'}")
        if info.phase is not ClusterPhase.READY:
            raise TransientStepError(f"the cluster is {info.phase.value}: {info.message or 'not ready yet'}")

    def _stop_with_savepoint(self, run: _Run, step: StopWithSavepoint, deadline: float) -> dict[str, str | None]:
        try:
            return self._stop_attempt(run, step, deadline)
        except (ObserveError, StepError):
            self._jobmanager_alive(run)  # only when an attempt failed: no extra observe on the upgrade's path
            raise

    def _stop_attempt(self, run: _Run, step: StopWithSavepoint, deadline: float) -> dict[str, str | None]:
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
                        raise TransientStepError(f"savepoint refused for now: {_short(status.failure, 300)}")
                    raise PermanentStepError(f"stop-with-savepoint failed: {_short(status.failure)}")
                if not status.location:
                    self.journal.set_scratch(run.app, trigger_id=None)
                    raise PermanentStepError("stop-with-savepoint completed without a savepoint location")
                self.journal.add_savepoint(run.app, status.location, job_id=step.job_id, revision=run.revision)
                return {"captured_path": status.location, "captured_kind": "savepoint"}
            # A stopping job processes nothing: this is downtime too, poll as for the start.
            self._wait(deadline, f"savepoint {trigger} of job {step.job_id}", interval=self.poll_interval / 4)

    def _jobmanager_alive(self, run: _Run, *, new_spec_too: bool = False) -> None:
        """Raise JobManagerGoneError when the app's JobManager is dead and the app has no HA (kill -9 mid-upgrade):
        its jobs are gone with it, so waiting for a savepoint or a job until the step's deadline, then parking or
        rolling back onto that cluster, would keep the app down. The job's state is in its retained checkpoints."""
        # HA of the spec the cluster may run: the previous one (the stop), or either once the new one may have started.
        refs = [SpecRef.PREVIOUS, *([SpecRef.DESIRED] if new_spec_too and run.plan.desired else [])]
        if run.plan.previous is None or any(self._spec(run, r).spec.high_availability.enabled for r in refs):
            return
        try:
            info = self.runtime.observe(run.app)
        except ReconcilerError:
            return
        if info.phase is ClusterPhase.FAILED and not info.session:
            raise JobManagerGoneError(f"the JobManager is not running ({info.message or 'dead'}); without high "
                                      "availability its jobs are gone with it")

    def _fail_fast_if_jobmanager_died(self, run: _Run, step: Step) -> None:
        """After a failed attempt of a forward step: a dead JobManager that nothing restarts (local processes) will
        not answer before the deadline either, so the step ends now (JobManagerGoneError), not minutes later with
        the app down meanwhile. Not a cluster being started (the spec's own doing); the stop probes on its own. On
        Kubernetes a FAILED JobManager is crash-looping on the new spec: the usual failure path."""
        if self.runtime.restarts_processes or isinstance(step, EnsureCluster | StartStandbyCluster |
                                                           StopWithSavepoint):
            return
        self._jobmanager_alive(run, new_spec_too=True)

    def _restart_missing(self, run: _Run, waiting: str, *, default: SpecRef | None = None) -> None:
        """A step waiting for the job's tasks (a savepoint refused because they are not running; a new job waiting
        for slots) may wait for a process killed during the upgrade: restart it on the live cluster, at the spec
        that cluster runs (by hash; else `default`), so Flink can run the tasks before the step's deadline. Nothing
        else would: an app in flight gets no repair plan. A cluster of another spec is left alone."""
        missing: tuple[str, ...] = ()
        try:
            info = self.runtime.observe(run.app)
            missing = info.missing
            if not missing or info.phase is ClusterPhase.FAILED:
                return
            refs = [r for r, raw in ((SpecRef.PREVIOUS, run.plan.previous), (SpecRef.DESIRED, run.plan.desired))
                    if raw]
            ref = next((r for r in refs if self._spec(run, r).spec_hash == info.spec_hash), default)
            if ref is None or ref not in refs:
                return
            self.runtime.ensure_cluster(self._spec(run, ref), deadline=self.clock.monotonic() + self.cleanup_deadline_s)
        except ReconcilerError as e:  # the step's own waiting goes on; the next look tries again
            log.warning("%s: could not restart %s while %s: %s", run.app, ", ".join(missing), waiting, e)
            return
        self.journal.note(run.app, "repair", f"restarted {', '.join(missing)} while {waiting}", revision=run.revision)

    def _stopped_with(self, flink: FlinkApi, job_id: str, *, since: datetime) -> str | None:
        stats = flink.checkpoints(job_id)
        at = stats.latest_savepoint_at
        if stats.latest_savepoint_path and at is not None and at >= since - _CLOCK_SKEW:
            return stats.latest_savepoint_path
        return None

    def _recorded(self, app: str, path: str, job_id: str) -> bool:
        rec = self.journal.record(app)
        return rec is not None and any(s.path == path and s.job_id == job_id for s in rec.savepoints)

    def _cancel_job(self, run: _Run, step: CancelJob, deadline: float) -> dict[str, str | None]:
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

    def _start_job(self, run: _Run, step: StartJob, deadline: float) -> None:
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

    def _restore_path(self, run: _Run, step: StartJob) -> str | None:
        if step.restore.kind is RestoreKind.CAPTURED:
            return self._inflight(run.app).captured_path
        return step.restore.path if step.restore.kind is RestoreKind.PATH else None

    def _jar(self, run: _Run, ref: SpecRef) -> Path | None:
        if ref not in run.jars:
            run.jars[ref] = self.resolve_jar(self._spec(run, ref))
        return run.jars[ref]

    def _job_submitted(self, app: str, job_id: str) -> bool:
        """Whether the cluster already has this job. Unknown (cluster not up yet, as before a
        Kubernetes application-mode start) counts as no: `start_job` is idempotent on the id anyway."""
        try:
            return any(j.job_id == job_id for j in self.runtime.flink(app).jobs())
        except (StepError, ObserveError):
            return False

    def _await_running(self, run: _Run, step: AwaitRunning, deadline: float) -> None:
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
            raise PermanentStepError(f"job {job_id} does not exist{_suffix(self._root_cause(flink, job_id))}") from e
        phase = job_phase(job.state, job.tasks_running, job.tasks_total, job.tasks_finished)
        if phase is JobPhase.RUNNING:
            return None
        if phase is JobPhase.FAILING:
            raise PermanentStepError(f"job {job_id} is {job.state}{_suffix(self._root_cause(flink, job_id))}")
        if job.state.upper() in TERMINAL_STATES | {"CANCELLING"}:
            raise PermanentStepError(f"job {job_id} ended ({job.state}){_suffix(self._root_cause(flink, job_id))}")
        return f"{job.state}, {job.tasks_running}/{job.tasks_total} tasks running"

    def _await_healthy(self, run: _Run, stage: Stage, step: AwaitHealthy, deadline: float) -> None:
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
    def _spec_ref_of(run: _Run, stage: Stage, job_id: str) -> SpecRef:
        """The spec a job was started from: its StartJob's, else the stage's natural one."""
        for steps in (run.plan.rollback, run.plan.steps) if stage is Stage.ROLLBACK else (run.plan.steps,):
            for s in steps:
                if isinstance(s, StartJob) and s.job_id == job_id:
                    return s.spec
        return SpecRef.PREVIOUS if stage is Stage.ROLLBACK else SpecRef.DESIRED

    # ---- helpers --------------------------------------------------------------------------------

    def _spec(self, run: _Run, ref: SpecRef) -> FlinkApp:
        if ref not in run.specs:
            raw = run.plan.desired if ref is SpecRef.DESIRED else run.plan.previous
            if raw is None:
                raise PermanentStepError(f"the plan carries no {ref.value} spec for {run.app}")
            try:
                run.specs[ref] = FlinkApp.model_validate(raw)
            except ValidationError as e:
                raise PermanentStepError(f"the plan's {ref.value} spec is invalid: {e}") from e
        return run.specs[ref]

    def _job_state(self, flink: FlinkApi, job_id: str) -> str | None:
        try:
            return flink.job(job_id).state.upper()
        except JobNotFoundError:
            return None

    def _root_cause(self, flink: FlinkApi, job_id: str) -> str | None:
        try:
            causes = flink.exceptions(job_id)
        except ReconcilerError:
            return None
        return _short(causes[0]) if causes else None

    def _wait(self, deadline: float, what: str, *, flink: FlinkApi | None = None, job_id: str | None = None,
              interval: float | None = None) -> None:
        """Sleep one poll interval, or raise DeadlineExceededError when the deadline has come."""
        now = self.clock.monotonic()
        if now >= deadline:
            cause = self._root_cause(flink, job_id) if flink is not None and job_id is not None else None
            raise DeadlineExceededError(f"deadline passed waiting for {what}{_suffix(cause)}")
        self.clock.sleep(min(interval or self.poll_interval, deadline - now))

    def _record_timing(self, run: _Run, step: Step, t0: float, rollback: bool) -> None:
        run.timings.append((("rollback:" if rollback else "") + step.type, self.clock.monotonic() - t0))

    def _emit(
        self, run: _Run, step: Step, phase: EventPhase, t0: float, *, index: int, count: int, rollback: bool,
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


def _short(text: str, limit: int = _MAX_CAUSE) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _suffix(cause: str | None) -> str:
    return f": {cause}" if cause else ""
