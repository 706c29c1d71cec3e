"""The executor against the in-memory Flink: every step type, retries, deadlines, failure paths,
rollback, crash/resume at every call, and independence of apps. No test sleeps: FakeClock."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.apply.executor import AppResult, EventPhase, Executor, StepEvent
from reconciler.apply.journal import Journal, Stage, StepPhase
from reconciler.apply.retry import Backoff
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
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
    ForgetApp,
    Plan,
    Restore,
    RestoreKind,
    SpecRef,
    StartJob,
    Step,
    StopWithSavepoint,
)
from reconciler.errors import ObserveError, SpecError, TransientStepError, TriggerNotFoundError
from reconciler.spec.model import FlinkApp
from tests.apply.fakes import TERMINAL, Behaviour, Crash, FakeJob, FakeRuntime, Fault, make_app

OLD, NEW, RB = "0" * 32, "1" * 32, "2" * 32
REV = "c" * 40
JAR = Path("/jars/counter.jar")


@dataclass
class World:
    clock: FakeClock
    rt: FakeRuntime
    journal: Journal
    events: list[StepEvent] = field(default_factory=list)
    jars: list[str] = field(default_factory=list)
    ex: Executor = field(init=False)

    def __post_init__(self) -> None:
        self.ex = self.executor()

    def executor(self, *, max_parallel: int = 4) -> Executor:
        return Executor(self.rt, self.journal, self.clock, resolve_jar=self.resolve, poll_interval=0.2,
                        backoff=Backoff(0.5, 2.0, 4.0), on_event=self.events.append, max_parallel=max_parallel)

    def resolve(self, app: FlinkApp) -> Path:
        self.jars.append(app.name)
        return JAR


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    clock = FakeClock()
    rt = FakeRuntime(clock, savepoint_dir=str(tmp_path / "sp"), create_savepoint_dirs=True)
    journal = Journal(tmp_path / "journal", clock)
    w = World(clock, rt, journal)
    yield w
    journal.close()


def start_steps(ref: SpecRef, job: str, restore: Restore, *, healthy: bool = True, deadline: float = 300) -> list[Step]:
    steps: list[Step] = [
        EnsureCluster(spec=ref, deadline_s=deadline),
        StartJob(spec=ref, job_id=job, restore=restore, deadline_s=deadline),
        AwaitRunning(job_id=job, deadline_s=deadline),
    ]
    if healthy:
        steps.append(AwaitHealthy(job_id=job, deadline_s=deadline))
    return steps


def upgrade(old: FlinkApp, new: FlinkApp, *, first: Step | None = None, restore: Restore = CAPTURED,
            rollback: bool = True, deadline: float = 300) -> AppPlan:
    """The shape the planner gives a savepoint upgrade (first step = rollback_after 0)."""
    first = first or StopWithSavepoint(job_id=OLD, deadline_s=60)
    return AppPlan(
        app=new.name, action=Action.UPGRADE, reason="upgrade change", desired=new.canonical(),
        previous=old.canonical(), steps=(first, *start_steps(SpecRef.DESIRED, NEW, restore, deadline=deadline)),
        rollback_after=0,
        rollback=tuple(start_steps(SpecRef.PREVIOUS, RB, restore, healthy=False)) if rollback else (),
    )


def create(app: FlinkApp, restore: Restore = NO_STATE) -> AppPlan:
    return AppPlan(app=app.name, action=Action.CREATE, reason="new app", desired=app.canonical(),
                   steps=tuple(start_steps(SpecRef.DESIRED, NEW, restore)))


def live_jobs(w: World, app: str = "orders") -> list[str]:
    return w.rt.running_jobs(app)


def job(w: World, job_id: str, app: str = "orders") -> FakeJob:
    return w.rt.clusters[app].flink.jobs_by_id[job_id]


# ---- happy paths, one per step type ------------------------------------------------------------------


def test_create_runs_every_step_and_records_success(world: World) -> None:
    app = make_app()
    result = world.ex.run_app(REV, create(app))
    assert result.outcome is Outcome.SUCCESS, result.message
    assert (result.job_id, result.rolled_back, result.failed_step) == (NEW, False, None)
    assert [t for t, _ in result.step_timings] == ["EnsureCluster", "StartJob", "AwaitRunning", "AwaitHealthy"]
    assert live_jobs(world) == [NEW]
    j = job(world, NEW)
    assert j.restored_from is None and j.tasks_running == j.parallelism
    assert j.checkpoints  # AwaitHealthy waited for the first checkpoint
    rec = world.journal.record("orders")
    assert rec is not None
    assert (rec.last_applied_revision, rec.last_attempted_revision, rec.last_outcome, rec.job_id) == (
        REV, REV, Outcome.SUCCESS, NEW)
    assert rec.last_applied_spec == app.canonical()
    assert world.journal.inflight("orders") is None
    assert [(e.index, e.phase) for e in world.events] == [
        (i, p) for i in range(4) for p in (EventPhase.STARTED, EventPhase.DONE)]
    assert world.events[0].description.startswith("ensure cluster")


def test_savepoint_upgrade_restores_the_new_job_from_the_savepoint_it_took(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.SUCCESS, result.message
    assert len(world.rt.stop_triggers) == 1 and world.rt.savepoints_taken == [result.savepoint]
    assert job(world, OLD).state == "FINISHED"
    assert job(world, NEW).restored_from == result.savepoint
    assert live_jobs(world) == [NEW]
    rec = world.journal.record("orders")
    assert rec is not None and [(s.path, s.job_id, s.revision, s.kind) for s in rec.savepoints] == [
        (result.savepoint, OLD, REV, "savepoint")]


def test_stateless_upgrade_cancels_and_starts_empty(world: World) -> None:
    old, new = make_app(upgrade_mode="stateless"), make_app(upgrade_mode="stateless", parallelism=2)
    world.rt.seed_job(old, OLD)
    result = world.ex.run_app(REV, upgrade(old, new, first=CancelJob(job_id=OLD, deadline_s=60), restore=NO_STATE))
    assert result.outcome is Outcome.SUCCESS, result.message
    assert world.rt.cancels == [OLD] and world.rt.stop_triggers == []
    assert job(world, OLD).state == "CANCELED"
    assert job(world, NEW).restored_from is None
    assert result.savepoint is None


def test_last_state_upgrade_restores_from_the_cancelled_jobs_latest_checkpoint(world: World) -> None:
    old, new = make_app(upgrade_mode="last-state"), make_app(upgrade_mode="last-state", parallelism=2)
    world.rt.seed_job(old, OLD)
    world.clock.advance(5.5)  # five checkpoints at 1s
    result = world.ex.run_app(REV, upgrade(old, new, first=CancelJob(job_id=OLD, capture_checkpoint=True,
                                                                     deadline_s=60)))
    assert result.outcome is Outcome.SUCCESS, result.message
    old_job = job(world, OLD)
    assert old_job.state == "CANCELED"
    latest = old_job.checkpoints[-1][1]
    assert result.savepoint == latest and job(world, NEW).restored_from == latest
    rec = world.journal.record("orders")
    assert rec is not None and [(s.path, s.kind) for s in rec.savepoints] == [(latest, "checkpoint")]


def test_capturing_a_checkpoint_that_does_not_exist_fails_and_starts_nothing(world: World) -> None:
    old, new = make_app(checkpointing=None), make_app(checkpointing=None, parallelism=2)
    world.rt.seed_job(old, OLD)
    result = world.ex.run_app(REV, upgrade(old, new, first=CancelJob(job_id=OLD, capture_checkpoint=True,
                                                                     deadline_s=60)))
    assert result.outcome is Outcome.FAILURE
    assert "no retained checkpoint" in result.message
    assert world.rt.submits == [] and not result.rolled_back


def test_start_from_a_known_path(world: World) -> None:
    app = make_app()
    world.rt.extra_paths.add("file:/old/savepoint-feed00-000000000001")
    result = world.ex.run_app(REV, create(app, Restore(kind=RestoreKind.PATH,
                                                       path="file:/old/savepoint-feed00-000000000001")))
    assert result.outcome is Outcome.SUCCESS, result.message
    assert job(world, NEW).restored_from == "file:/old/savepoint-feed00-000000000001"


def test_await_healthy_is_skipped_when_checkpointing_is_off(world: World) -> None:
    app = make_app(checkpointing=None)
    result = world.ex.run_app(REV, create(app))
    assert result.outcome is Outcome.SUCCESS, result.message
    assert "checkpoints" not in world.rt.calls


def test_scale_reconfigures_the_cluster_only(world: World) -> None:
    old, new = make_app(), make_app(retain=3)
    world.rt.seed_job(old, OLD)
    p = AppPlan(app="orders", action=Action.SCALE, reason="scale", desired=new.canonical(),
                previous=old.canonical(), steps=(EnsureCluster(deadline_s=60),))
    result = world.ex.run_app(REV, p)
    assert result.outcome is Outcome.SUCCESS and result.job_id is None
    assert world.rt.ensure_calls and live_jobs(world) == [OLD]
    rec = world.journal.record("orders")
    assert rec is not None and rec.job_id is None and rec.last_applied_spec == new.canonical()


def test_suspend_then_delete_and_forget(world: World) -> None:
    app = make_app()
    world.rt.seed_job(app, OLD)
    suspend = AppPlan(app="orders", action=Action.SUSPEND, reason="suspend", desired=app.canonical(),
                      steps=(StopWithSavepoint(job_id=OLD, deadline_s=60), DeleteCluster(deadline_s=60)))
    result = world.ex.run_app(REV, suspend)
    assert result.outcome is Outcome.SUCCESS, result.message
    assert world.rt.deletes == ["orders"] and "orders" not in world.rt.clusters
    rec = world.journal.record("orders")
    assert rec is not None and rec.job_id is None and len(rec.savepoints) == 1
    forget = AppPlan(app="orders", action=Action.DELETE, reason="orphan", previous=app.canonical(),
                     steps=(ForgetApp(deadline_s=10),))
    result = world.ex.run_app("d" * 40, forget)
    assert result.outcome is Outcome.SUCCESS
    assert world.journal.record("orders") is None
    assert [t.action for t in world.journal.history("orders")][-2:] == ["forget", "finish"]


# ---- retries and deadlines -----------------------------------------------------------------------


def test_transient_errors_are_retried_with_capped_exponential_backoff(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.faults = [Fault("savepoint_status", TransientStepError("connection refused"), nth=n) for n in (1, 2, 3, 4)]
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.SUCCESS, result.message
    retries = [e.message for e in world.events if e.phase is EventPhase.RETRY]
    assert [m.rsplit("retry in ", 1)[1] for m in retries if m] == ["0.5s)", "1s)", "2s)", "4s)"]
    assert len(world.rt.stop_triggers) == 1  # retrying a poll never re-triggers


def test_a_transient_error_past_the_deadline_fails_the_step(world: World) -> None:
    app = make_app()
    world.rt.faults = [Fault("ensure_cluster", TransientStepError("503 from the API server"), nth=n)
                       for n in range(1, 100)]
    p = AppPlan(app="orders", action=Action.CREATE, reason="new", desired=app.canonical(),
                steps=tuple(start_steps(SpecRef.DESIRED, NEW, NO_STATE, deadline=20)))
    t0 = world.clock.monotonic()
    result = world.ex.run_app(REV, p)
    assert result.outcome is Outcome.FAILURE
    assert "deadline" in result.message and "503 from the API server" in result.message
    assert world.clock.monotonic() - t0 <= 20
    assert world.rt.submits == []


NO_COMMITTER = ("java.util.concurrent.CompletionException: org.apache.flink.runtime.checkpoint.CheckpointException: "
                "Trigger checkpoint failure. (caused by: java.lang.IllegalArgumentException: Checkpoint needs at "
                "least one vertex that commits the checkpoint)")


TASK_FAILED = ("java.util.concurrent.CompletionException: org.apache.flink.runtime.checkpoint.CheckpointException: "
               "Task has failed. (caused by: org.apache.flink.runtime.checkpoint.CheckpointException: Task name with "
               "subtask : Source: generator (1/2)#1 Failure reason: Task has failed.)")


@pytest.mark.parametrize("refusal", [NO_COMMITTER, TASK_FAILED], ids=["no-committer", "task-failed"])
def test_a_stop_refused_while_the_tasks_restart_is_retried_not_the_specs_failure(world: World, refusal: str) -> None:
    # Chaos soak round 87 (run 9) and round 49 (run 12): a TaskManager killed under the stop; Flink answers that no
    # task can commit the checkpoint, or that a task failed. The tasks come back, and a new trigger succeeds.
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.savepoint_failures = [(refusal, None), (refusal, None)]
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.SUCCESS, result.message
    assert len(world.rt.stop_triggers) == 3 and len(world.rt.savepoints_taken) == 1
    assert live_jobs(world) == [NEW]


def test_a_stop_refused_because_every_task_finished_gives_up_at_once(world: World) -> None:
    # The same answer for a bounded job whose tasks all finished: the job ends FINISHED, there is nothing to stop
    # and no savepoint to take. Not retried until the deadline; nothing started, nothing deleted.
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.savepoint_failures = [(NO_COMMITTER, "FINISHED")]
    t0 = world.clock.monotonic()
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.FAILURE
    assert "FINISHED" in result.message and "no savepoint can be taken" in result.message
    assert len(world.rt.stop_triggers) == 1 and world.clock.monotonic() - t0 < 5
    assert world.rt.submits == [] and world.rt.deletes == []


def test_savepoint_refused_while_tasks_deploy_is_retried_with_a_new_trigger(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    j = job(world, OLD)
    j.tasks_running = 0
    j.submitted_at = world.clock.monotonic()  # still deploying for 1s
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.SUCCESS, result.message
    # Tasks run from t=1s: refused at t=0 and t=0.5 (backoff 0.5s), accepted at t=1.5 (backoff 1s).
    assert len(world.rt.stop_triggers) == 3
    assert len(world.rt.savepoints_taken) == 1


def test_an_observe_error_is_transient_and_a_provision_error_is_permanent(world: World) -> None:
    app = make_app()
    world.rt.faults = [Fault("ensure_cluster", ObserveError("kube API timeout"))]
    assert world.ex.run_app(REV, create(app)).outcome is Outcome.SUCCESS
    world.rt.provision_error = "java: command not found"
    world.rt.clusters.clear()
    result = world.ex.run_app("e" * 40, create(make_app()))
    assert result.outcome is Outcome.FAILURE and "java: command not found" in result.message
    assert world.rt.counts["ensure_cluster"] == 3  # no retry of the permanent one


# ---- failure paths -------------------------------------------------------------------------------


def test_a_failed_savepoint_leaves_the_old_job_running_and_starts_nothing(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.savepoint_failure = "java.io.IOException: /savepoints is not writable"
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.FAILURE and not result.rolled_back
    assert "/savepoints is not writable" in result.message
    assert result.failed_step is not None and result.failed_step.startswith("stop job")
    assert live_jobs(world) == [OLD] and job(world, OLD).state == "RUNNING"
    assert world.rt.submits == [] and world.rt.ensure_calls == [] and world.rt.cancels == []
    rec = world.journal.record("orders")
    assert rec is not None and rec.last_outcome is Outcome.FAILURE and rec.last_applied_revision is None


def test_a_rejected_submit_rolls_back_to_the_previous_spec_from_the_fresh_savepoint(world: World) -> None:
    old, new = make_app(), make_app(entry_class="com.example.Typo", parallelism=2)
    world.rt.behaviours["com.example.Typo"] = Behaviour.BAD_ENTRY_CLASS
    world.rt.seed_job(old, OLD)
    world.journal.begin("orders", "a" * 40, create(old))
    world.journal.finish("orders", Outcome.SUCCESS, "ok", applied_spec=old.canonical(), job_id=OLD)
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.FAILURE and result.rolled_back
    assert result.message.startswith("rolled back to the previous spec")
    assert "ClassNotFoundException" in result.message
    assert result.failed_step is not None and result.failed_step.startswith("start job")
    assert live_jobs(world) == [RB]
    assert job(world, RB).restored_from == result.savepoint
    assert world.rt.ensure_calls[-1][1] != world.rt.ensure_calls[0][1]  # previous spec reapplied
    rec = world.journal.record("orders")
    assert rec is not None
    assert (rec.last_applied_revision, rec.last_attempted_revision, rec.last_outcome, rec.job_id) == (
        "a" * 40, REV, Outcome.FAILURE, RB)
    assert rec.last_applied_spec == old.canonical()
    assert [t for t, _ in result.step_timings] == [
        "StopWithSavepoint", "EnsureCluster", "StartJob",
        "rollback:EnsureCluster", "rollback:StartJob", "rollback:AwaitRunning"]
    # History says what happened: the upgrade was rolled back, and why.
    mine = [(t.action, t.outcome, t.message) for t in world.journal.history("orders") if t.revision == REV]
    assert [(a, o) for a, o, _ in mine] == [("upgrade", Outcome.PENDING), ("savepoint", None),
                                            ("rollback", Outcome.PENDING), ("finish", Outcome.FAILURE)]
    assert mine[2][2] == f"{result.failed_step} failed: " + result.message.split(" failed: ", 1)[1]
    assert "ClassNotFoundException" in mine[2][2] and mine[3][2] == result.message
    last = world.journal.lineage("orders")[-1]
    assert (last.revision, last.action, last.outcome, last.job_id) == (
        REV, "upgrade -> rolled back", Outcome.FAILURE, RB)
    assert last.restored_from == result.savepoint  # the rolled-back job's start: from the fresh savepoint


def test_a_rollback_to_a_revision_is_recorded_as_one_and_so_is_its_own_failure(world: World) -> None:
    """`rollback APP --to REV` runs an upgrade plan with purpose "rollback": its transitions, lineage and
    result say rollback, and a rollback whose new job fails is `rollback -> rolled back`."""
    old, new, bad = make_app(), make_app(parallelism=2), make_app(entry_class="com.example.Typo")
    world.rt.behaviours["com.example.Typo"] = Behaviour.BAD_ENTRY_CLASS
    world.rt.seed_job(old, OLD)
    result = world.ex.run_app(REV, upgrade(old, new).model_copy(update={"purpose": "rollback"}))
    assert result.outcome is Outcome.SUCCESS and result.message == f"rollback applied at {REV[:12]}; job {NEW} running"
    assert [t.action for t in world.journal.history("orders")] == ["rollback", "savepoint", "finish"]
    assert world.journal.lineage("orders")[-1].action == "rollback"
    again = "d" * 40
    result = world.ex.run_app(again, upgrade(new, bad, first=StopWithSavepoint(job_id=NEW, deadline_s=60))
                              .model_copy(update={"purpose": "rollback"}))
    assert result.rolled_back and result.message.startswith("rolled back to the previous spec")
    assert [t.action for t in world.journal.history("orders") if t.revision == again] == [
        "rollback", "savepoint", "rollback", "finish"]
    assert world.journal.lineage("orders")[-1].action == "rollback -> rolled back"


def test_a_job_that_fails_after_start_is_rolled_back_with_flinks_root_cause(world: World) -> None:
    old, new = make_app(), make_app(entry_class="com.example.Broken")
    world.rt.behaviours["com.example.Broken"] = Behaviour.FAILS_AFTER_START
    world.rt.seed_job(old, OLD)
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.rolled_back and "counter state is corrupt" in result.message
    assert result.failed_step is not None and result.failed_step.startswith("wait until job")
    assert live_jobs(world) == [RB]


def test_a_job_that_never_runs_all_tasks_is_rolled_back_at_its_deadline(world: World) -> None:
    old, new = make_app(), make_app(entry_class="com.example.Loop")
    world.rt.behaviours["com.example.Loop"] = Behaviour.RESTART_LOOP
    world.rt.seed_job(old, OLD)
    t0 = world.clock.monotonic()
    result = world.ex.run_app(REV, upgrade(old, new, deadline=30))
    assert result.rolled_back and "deadline" in result.message
    assert "NullPointerException: boom" in result.message  # the restart loop's cause, not just "timeout"
    assert job(world, NEW).state == "CANCELED"  # cancelled before the rollback
    assert live_jobs(world) == [RB]
    assert world.clock.monotonic() - t0 < 30 + 60 + 30


def test_a_job_without_checkpoints_is_cancelled_and_rolled_back(world: World) -> None:
    old, new = make_app(), make_app(entry_class="com.example.NoCkpt")
    world.rt.behaviours["com.example.NoCkpt"] = Behaviour.NO_CHECKPOINTS
    world.rt.seed_job(old, OLD)
    result = world.ex.run_app(REV, upgrade(old, new, deadline=20))
    assert result.rolled_back, result.message
    assert "complete a checkpoint" in result.message
    assert NEW in world.rt.cancels and live_jobs(world) == [RB]


def test_a_failing_rollback_reports_both_causes_and_stops(world: World) -> None:
    old, new = make_app(entry_class="com.example.Gone"), make_app(entry_class="com.example.Typo")
    world.rt.behaviours.update({"com.example.Gone": Behaviour.BAD_ENTRY_CLASS,
                                "com.example.Typo": Behaviour.BAD_ENTRY_CLASS})
    world.rt.seed_job(make_app(), OLD)
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.FAILURE and not result.rolled_back
    assert "com.example.Typo" in result.message and "com.example.Gone" in result.message
    assert "the rollback failed too" in result.message
    assert world.rt.counts["start_job"] == 2  # once forward, once back: never a loop
    assert live_jobs(world) == [] and world.journal.inflight("orders") is None
    rec = world.journal.record("orders")
    assert rec is not None and rec.job_id is None
    assert world.journal.lineage("orders")[-1].action == "upgrade"  # not rolled back: nothing runs


def test_without_rollback_after_nothing_else_is_done(world: World) -> None:
    old, new = make_app(), make_app(entry_class="com.example.Typo")
    world.rt.behaviours["com.example.Typo"] = Behaviour.BAD_ENTRY_CLASS
    world.rt.seed_job(old, OLD)
    p = upgrade(old, new).model_copy(update={"rollback_after": None})
    result = world.ex.run_app(REV, p)
    assert result.outcome is Outcome.FAILURE and not result.rolled_back
    assert world.rt.counts["start_job"] == 1


def test_a_bug_in_a_step_is_a_step_failure_that_still_rolls_back(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.faults = [Fault("start_job", KeyError("jar cache"))]
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.rolled_back and "internal error: KeyError" in result.message
    assert live_jobs(world) == [RB]


def test_a_jar_that_cannot_be_fetched_fails_before_the_old_job_is_touched(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)

    def broken(app: FlinkApp) -> Path:
        if app.spec.job.parallelism == 2:
            raise KeyError("jar cache")
        return JAR

    ex = Executor(world.rt, world.journal, world.clock, resolve_jar=broken)
    result = ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.FAILURE and not result.rolled_back
    assert "nothing was changed" in result.message and "KeyError" in result.message
    assert world.rt.stop_triggers == [] and live_jobs(world) == [OLD]


def test_a_jar_that_cannot_be_resolved_is_permanent(world: World) -> None:
    def missing(app: FlinkApp) -> Path:
        raise SpecError("jar not found", file="apps/orders.yaml", field="spec.job.jarURI")

    ex = Executor(world.rt, world.journal, world.clock, resolve_jar=missing)
    result = ex.run_app(REV, create(make_app()))
    assert result.outcome is Outcome.FAILURE and "jar not found" in result.message
    assert world.rt.submits == []


# ---- blocked / error / no-op ---------------------------------------------------------------------


@pytest.mark.parametrize(("action", "outcome"), [(Action.BLOCKED, Outcome.FAILURE), (Action.ERROR, Outcome.ERROR)])
def test_blocked_and_invalid_apps_are_recorded_but_not_executed(world: World, action: Action, outcome: Outcome) -> None:
    p = AppPlan(app="orders", action=action, reason="needs a human: do X", source_file="apps/orders.yaml")
    result = world.ex.run_app(REV, p)
    assert (result.outcome, result.message) == (outcome, "needs a human: do X")
    assert world.rt.calls == []
    rec = world.journal.record("orders")
    assert rec is not None and (rec.last_outcome, rec.last_message, rec.last_attempted_revision) == (
        outcome, "needs a human: do X", REV)
    assert world.journal.inflight("orders") is None


def test_run_skips_noop_apps(world: World) -> None:
    plan = Plan(revision=REV, live_fingerprint="x", apps=(AppPlan(app="orders", action=Action.NOOP, reason="ok"),))
    assert world.ex.run(plan) == {}
    assert world.journal.record("orders") is None


# ---- independence and concurrency ----------------------------------------------------------------


def test_apps_are_independent(world: World) -> None:
    good, bad, stuck = make_app("good"), make_app("bad", entry_class="com.example.Typo"), make_app("stuck")
    world.rt.behaviours["com.example.Typo"] = Behaviour.BAD_ENTRY_CLASS
    world.journal.begin("stuck", "f" * 40, create(stuck))  # an unfinished execution: refused, not resumed here
    plan = Plan(revision=REV, live_fingerprint="x", apps=(create(bad), create(good), create(stuck)))
    results = world.ex.run(plan)
    assert results["good"].outcome is Outcome.SUCCESS
    assert results["bad"].outcome is Outcome.FAILURE and "Typo" in results["bad"].message
    assert results["stuck"].outcome is Outcome.FAILURE and "unfinished execution" in results["stuck"].message
    assert "resumed first" in results["stuck"].message and "internal error" not in results["stuck"].message
    stuck_inflight = world.journal.inflight("stuck")
    assert stuck_inflight is not None and stuck_inflight.revision == "f" * 40  # kept for a resume
    assert live_jobs(world, "good") == [NEW]


def test_apps_run_concurrently_up_to_max_parallel(world: World) -> None:
    active, peak, lock = 0, 0, threading.Lock()
    barrier = threading.Barrier(2, timeout=10)
    original = world.rt.ensure_cluster

    def ensure(app: FlinkApp, *, deadline: float, keep_running: bool = False) -> object:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            if app.name in ("a", "b"):
                barrier.wait()  # both must be inside at once, or this times out
            time.sleep(0.01)
            return original(app, deadline=deadline, keep_running=keep_running)
        finally:
            with lock:
                active -= 1

    world.rt.ensure_cluster = ensure  # type: ignore[method-assign,assignment]
    ex = world.executor(max_parallel=2)
    apps = [make_app(n, checkpointing=None) for n in ("a", "b", "c", "d", "e")]
    results = ex.run(Plan(revision=REV, live_fingerprint="x", apps=tuple(create(a) for a in apps)))
    assert {r.outcome for r in results.values()} == {Outcome.SUCCESS}
    assert peak == 2


def test_a_crash_in_one_worker_is_reraised_after_the_others_finish(world: World) -> None:
    world.rt.faults = [Fault("ensure_cluster", Crash())]
    ex = world.executor(max_parallel=1)
    plan = Plan(revision=REV, live_fingerprint="x",
                apps=(create(make_app("a", checkpointing=None)), create(make_app("b", checkpointing=None))))
    with pytest.raises(Crash):
        ex.run(plan)
    rec = world.journal.record("b")
    assert rec is not None and rec.last_outcome is Outcome.SUCCESS
    assert set(world.journal.all_inflight()) == {"a"}


def test_a_broken_progress_callback_does_not_break_the_upgrade(world: World) -> None:
    def explode(event: StepEvent) -> None:
        raise RuntimeError("terminal closed")

    ex = Executor(world.rt, world.journal, world.clock, resolve_jar=world.resolve, on_event=explode)
    assert ex.run_app(REV, create(make_app())).outcome is Outcome.SUCCESS


# ---- retention -----------------------------------------------------------------------------------


def test_success_prunes_savepoints_per_retention_keeping_the_restore_point(world: World) -> None:
    apps = [make_app(retain=2, parallelism=p) for p in (1, 2, 3, 4)]
    world.rt.seed_job(apps[0], OLD)
    running = OLD
    for i, (old, new) in enumerate(itertools.pairwise(apps)):
        new_job = f"{i + 1}" * 32
        p = upgrade(old, new).model_copy(update={"steps": (
            StopWithSavepoint(job_id=running, deadline_s=60),
            *start_steps(SpecRef.DESIRED, new_job, CAPTURED))})
        result = world.ex.run_app(f"{i}" * 40, p)
        assert result.outcome is Outcome.SUCCESS, result.message
        running = new_job
    taken = world.rt.savepoints_taken
    assert len(taken) == 3
    rec = world.journal.record("orders")
    assert rec is not None and [s.path for s in rec.savepoints] == taken[1:]
    on_disk = [Path(t.removeprefix("file:")).exists() for t in taken]
    assert on_disk == [False, True, True]


# ---- crash and resume ----------------------------------------------------------------------------


def _upgrade_world(tmp_path: Path, *, bad_new: bool = False) -> tuple[World, AppPlan]:
    clock = FakeClock()
    rt = FakeRuntime(clock)
    journal = Journal(tmp_path / "journal", clock)
    w = World(clock, rt, journal)
    old = make_app()
    new = make_app(entry_class="com.example.Typo" if bad_new else None, parallelism=2)
    rt.behaviours["com.example.Typo"] = Behaviour.BAD_ENTRY_CLASS
    rt.seed_job(old, OLD)
    return w, upgrade(old, new)


def _crash_points(tmp_path: Path, *, bad_new: bool) -> list[tuple[str, int]]:
    """Every REST/runtime call a clean run makes, as (method, nth call)."""
    w, p = _upgrade_world(tmp_path / "clean", bad_new=bad_new)
    w.ex.run_app(REV, p)
    w.journal.close()
    seen: dict[str, int] = {}
    points = []
    for m in w.rt.calls:
        seen[m] = seen.get(m, 0) + 1
        points.append((m, seen[m]))
    return points


@pytest.mark.parametrize("bad_new", [False, True], ids=["upgrade", "rollback"])
def test_resume_after_a_crash_at_every_call(tmp_path: Path, bad_new: bool) -> None:
    """Kill the process before or after any call; a resumed run ends like an uninterrupted one:
    one savepoint trigger, each job submitted once, exactly one job running."""
    points = _crash_points(tmp_path, bad_new=bad_new)
    assert len(points) > 10
    expected_job = RB if bad_new else NEW
    for n, (method, nth) in enumerate(points):
        for when in ("before", "after"):
            if (method, when) == ("stop_with_savepoint", "after"):
                continue  # the trigger id itself is lost: see test_crash_losing_the_trigger_id
            where = f"crash {when} {method} #{nth}"
            w, p = _upgrade_world(tmp_path / f"{n}-{when}", bad_new=bad_new)
            w.rt.faults = [Fault(method, Crash(), nth=nth, when=when)]
            try:
                w.ex.run_app(REV, p)
            except Crash:
                pass
            else:  # only a call that raised in the clean run has no "after" to crash in
                assert when == "after" and w.rt.faults, where
                w.journal.close()
                continue
            inflight = w.journal.inflight("orders")
            assert inflight is not None, where
            w.clock.advance(0.1)
            result = Executor(w.rt, w.journal, w.clock, resolve_jar=w.resolve).resume("orders")
            assert result is not None, where
            assert result.rolled_back is bad_new, (where, result.message)
            assert result.outcome is (Outcome.FAILURE if bad_new else Outcome.SUCCESS), (where, result.message)
            assert len(w.rt.stop_triggers) == 1, where
            assert len(w.rt.submits) == len(set(w.rt.submits)), (where, w.rt.submits)
            assert live_jobs(w) == [expected_job], where
            assert job(w, expected_job).restored_from == w.rt.savepoints_taken[0], where
            assert w.journal.inflight("orders") is None, where
            w.journal.close()


def test_the_trigger_id_is_journaled_before_the_first_poll(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.faults = [Fault("savepoint_status", Crash())]
    with pytest.raises(Crash):
        world.ex.run_app(REV, upgrade(old, new))
    inf = world.journal.inflight("orders")
    assert inf is not None
    assert (inf.stage, inf.step_index, inf.phase, inf.trigger_id) == (
        Stage.FORWARD, 0, StepPhase.STARTED, world.rt.stop_triggers[0][1])


def test_the_job_id_is_journaled_before_the_submit(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.faults = [Fault("start_job", Crash(), when="after")]
    with pytest.raises(Crash):
        world.ex.run_app(REV, upgrade(old, new))
    inf = world.journal.inflight("orders")
    assert inf is not None and (inf.step_index, inf.phase, inf.submitted_job_id) == (2, StepPhase.STARTED, NEW)
    assert inf.captured_path == world.rt.savepoints_taken[0]
    result = world.ex.resume("orders")
    assert result is not None and result.outcome is Outcome.SUCCESS
    assert world.rt.counts["start_job"] == 1 and world.rt.submits == [NEW]


@pytest.mark.parametrize("when", ["before", "after"])
def test_crash_around_the_stop_request_resumes_by_the_journaled_trigger_id(world: World, when: str) -> None:
    """The trigger id is ours and journaled before the request. Crash before Flink got it: the resume
    finds Flink does not know it and re-sends the same id. Crash after: the resume polls it. Either way
    exactly one savepoint, and the upgrade finishes from it."""
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.faults = [Fault("stop_with_savepoint", Crash(), when=when)]  # type: ignore[arg-type]
    with pytest.raises(Crash):
        world.ex.run_app(REV, upgrade(old, new))
    inf = world.journal.inflight("orders")
    assert inf is not None and inf.trigger_id is not None and len(inf.trigger_id) == 32
    assert len(world.rt.stop_triggers) == (0 if when == "before" else 1)
    world.clock.advance(5)
    result = world.ex.resume("orders")
    assert result is not None and result.outcome is Outcome.SUCCESS, result
    assert [t for _, t in world.rt.stop_triggers] == [inf.trigger_id]
    assert len(world.rt.savepoints_taken) == 1 and world.rt.submits == [NEW]


def test_resume_with_nothing_in_flight(world: World) -> None:
    assert world.ex.resume("orders") is None
    assert world.ex.resume_all() == {}


def test_resume_all_continues_every_app(world: World) -> None:
    world.rt.faults = [Fault("run_jar", Crash(), when="after")]
    ex = world.executor(max_parallel=1)
    plan = Plan(revision=REV, live_fingerprint="x",
                apps=(create(make_app("a", checkpointing=None)), create(make_app("b", checkpointing=None))))
    with pytest.raises(Crash):
        ex.run(plan)
    assert set(world.journal.all_inflight()) == {"a"}
    results: dict[str, AppResult] = world.ex.resume_all()
    assert set(results) == {"a"} and results["a"].outcome is Outcome.SUCCESS
    assert world.rt.submits.count(NEW) == 2  # one per app's own cluster, each once
    assert all(j.state not in TERMINAL for c in world.rt.clusters.values() for j in c.flink.jobs_by_id.values())


def test_a_trigger_flink_never_knows_fails_at_the_step_deadline(world: World) -> None:
    """Safety rule 4: even a JobManager that answers 404 to every poll cannot make the step spin."""
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.faults = [Fault("savepoint_status", TriggerNotFoundError("no savepoint operation (404)"), nth=n)
                       for n in range(1, 10_000)]
    start = world.clock.monotonic()
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.FAILURE and result.failed_step and "savepoint" in result.failed_step
    step = upgrade(old, new).steps[0]
    assert world.clock.monotonic() - start <= step.deadline_s + 5


def test_a_stop_whose_status_stays_unreadable_is_parked_in_flight_and_resumed(world: World) -> None:
    """The stop reached Flink and took effect, but no poll got an answer before the deadline: the app must
    not be left down with its savepoint unrecorded. The transition stays in flight; a resume finishes it."""
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.faults = [Fault("savepoint_status", TransientStepError("503 from a proxy"), nth=n)
                       for n in range(1, 10_000)]
    parked = world.ex.run_app(REV, upgrade(old, new))
    assert parked.outcome is Outcome.FAILURE and "stays in flight" in parked.message, parked.message
    inf = world.journal.inflight("orders")
    assert inf is not None and inf.trigger_id is not None and inf.step_index == 0
    assert world.rt.submits == []  # nothing started while the stop is unsettled
    again = world.ex.run_app(REV, upgrade(old, new))  # a new plan is refused while the transition is open
    assert again.outcome is Outcome.FAILURE and "still in flight" in again.message

    world.rt.faults = []
    resumed = world.ex.resume("orders")
    assert resumed is not None
    assert resumed.outcome is Outcome.SUCCESS, resumed.message
    assert len(world.rt.stop_triggers) == 1  # polled again, never re-triggered
    assert live_jobs(world) == [NEW] and job(world, NEW).restored_from == world.rt.savepoints_taken[0]


def test_a_stop_flink_never_received_is_a_plain_failure_with_the_old_job_running(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.faults = [Fault("stop_with_savepoint", TransientStepError("503 from a proxy"), nth=n)
                       for n in range(1, 10_000)]
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.FAILURE and "stays in flight" not in result.message, result.message
    assert world.journal.inflight("orders") is None  # settled: Flink does not know the trigger, the job runs
    assert live_jobs(world) == [OLD]


def test_a_fenced_replica_stops_at_the_next_step_and_leaves_the_record_to_the_leader(world: World,
                                                                                      tmp_path: Path) -> None:
    """The Lease moved: the next record write is refused, so nothing after it is touched."""
    from reconciler.errors import FencedError
    from reconciler.live.records import FileRecordStore

    class LosesTheLease(FileRecordStore):
        writes = 0

        def put(self, app: str, doc: dict[str, object], *, expected: str | None) -> str:
            self.writes += 1
            if self.writes > 2:  # begin and the first step_started went through
                raise FencedError("lease flink-reconciler is held by pod-b")
            return super().put(app, doc, expected=expected)

    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    fenced = Executor(world.rt, Journal(tmp_path / "fenced" / "journal", world.clock,
                                        store=LosesTheLease(tmp_path / "fenced" / "records")),
                      world.clock, resolve_jar=world.resolve, poll_interval=0.2)
    result = fenced.run(Plan(revision=REV, live_fingerprint="x", apps=(upgrade(old, new),)))["orders"]
    assert result.outcome is Outcome.FAILURE and result.message.startswith("stopped: lease"), result.message
    assert world.rt.submits == []  # the start never ran
    inf = fenced.journal.inflight("orders")
    assert inf is not None and inf.step_index == 0  # left for the leader to resume
