"""Issue 11 item 2: the executor's in-place rescale, against the in-memory Flink (FakeClock, no sleeps).

The plan is the planner's shape: RescaleInPlace, then the regular savepoint upgrade as its fallback
(rollback_after 1). A rescale that Flink adopts ends the execution with the same job; one it refuses or
does not adopt in time journals the fallback and runs the upgrade; a crash at either point resumes right.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.apply.executor import EventPhase, Executor, StepEvent
from reconciler.apply.journal import Journal
from reconciler.apply.retry import Backoff
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import (
    CAPTURED,
    Action,
    AppPlan,
    AwaitHealthy,
    AwaitRunning,
    EnsureCluster,
    RescaleInPlace,
    SpecRef,
    StartJob,
    Step,
    StopWithSavepoint,
)
from reconciler.live.flink import FlinkUnsupportedError, JobVertex
from reconciler.spec.model import FlinkApp
from tests.apply.fakes import Crash, FakeFlink, FakeRuntime, Fault, make_app

OLD, NEW, RB = "0" * 32, "1" * 32, "2" * 32
REV = "d" * 40
VERTICES = ("src0000000000000000000000000000a", "cnt0000000000000000000000000000b")


class RescalingFlink(FakeFlink):
    """FakeFlink with the adaptive scheduler's resource requirements: a PUT is adopted `adopt_after`
    seconds later (None: never), the job keeping its id and restoring from its own latest checkpoint."""

    def __init__(self, base: FakeFlink, *, adopt_after: float | None = 3.0, unsupported: bool = False) -> None:
        super().__init__(base.rt, base.app)
        self.jobs_by_id = base.jobs_by_id
        self.adopt_after = adopt_after
        self.unsupported = unsupported
        self.requirements: dict[str, dict[str, tuple[int, int]]] = {}
        self.pending: dict[str, tuple[float, int]] = {}
        self.puts: list[dict[str, tuple[int, int]]] = []

    def _tick(self) -> None:
        super()._tick()
        now = self.rt.clock.monotonic()
        for job_id, (at, parallelism) in list(self.pending.items()):
            if now >= at:
                job = self.jobs_by_id[job_id]
                job.restored_from = job.checkpoints[-1][1] if job.checkpoints else None
                job.parallelism = job.tasks_running = parallelism
                del self.pending[job_id]

    def _reqs(self, job_id: str) -> dict[str, tuple[int, int]]:
        job = self._job(job_id)
        return self.requirements.setdefault(job_id, dict.fromkeys(VERTICES, (1, job.parallelism)))

    def vertices(self, job_id: str) -> list[JobVertex]:
        def go() -> list[JobVertex]:
            self._tick()
            job = self._job(job_id)
            return [JobVertex(v, v, job.parallelism, "RUNNING", job.tasks_running) for v in VERTICES]
        return self.rt.call("vertices", go)

    def resource_requirements(self, job_id: str) -> dict[str, tuple[int, int]]:
        def go() -> dict[str, tuple[int, int]]:
            if self.unsupported:
                raise FlinkUnsupportedError("the job's scheduler cannot change its parallelism in place (only the "
                                            "adaptive scheduler can)",
                                            method="GET", url=f"fake:///jobs/{job_id}/resource-requirements",
                                            status=500)
            return dict(self._reqs(job_id))
        return self.rt.call("resource_requirements", go)

    def set_resource_requirements(self, job_id: str, requirements: Mapping[str, tuple[int, int]]) -> None:
        def go() -> None:
            self._reqs(job_id).update(requirements)
            self.puts.append(dict(requirements))
            upper = max(hi for _, hi in requirements.values())
            if self.adopt_after is not None and upper != self._job(job_id).parallelism:
                self.pending[job_id] = (self.rt.clock.monotonic() + self.adopt_after, upper)
            else:
                self.pending.pop(job_id, None)
        self.rt.call("set_resource_requirements", go)


@dataclass
class World:
    clock: FakeClock
    rt: FakeRuntime
    journal: Journal
    events: list[StepEvent] = field(default_factory=list)
    on_event: list[object] = field(default_factory=list)

    def executor(self) -> Executor:
        def event(e: StepEvent) -> None:
            self.events.append(e)
            for hook in self.on_event:
                hook(e)  # type: ignore[operator]
        return Executor(self.rt, self.journal, self.clock, resolve_jar=lambda _: Path("/jars/counter.jar"),
                        poll_interval=0.2, backoff=Backoff(0.5, 2.0, 4.0), on_event=event)

    def seed(self, old: FlinkApp, **flink: object) -> FakeFlink:
        self.rt.seed_job(old, OLD)
        self.clock.sleep(5)  # a few checkpoints of the running job
        cluster = self.rt.clusters[old.name]
        if flink.pop("plain", False):
            return cluster.flink
        cluster.flink = RescalingFlink(cluster.flink, **flink)  # type: ignore[arg-type]
        return cluster.flink


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    clock = FakeClock()
    rt = FakeRuntime(clock, savepoint_dir=str(tmp_path / "sp"), create_savepoint_dirs=True)
    journal = Journal(tmp_path / "journal", clock)
    yield World(clock, rt, journal)
    journal.close()


def rescale_plan(old: FlinkApp, new: FlinkApp, *, deadline: float = 60) -> AppPlan:
    """What the planner gives a parallelism-only change with inPlaceRescale (tests/core/test_planner_rescale.py)."""
    def start(ref: SpecRef, job: str, healthy: bool) -> list[Step]:
        steps: list[Step] = [EnsureCluster(spec=ref, deadline_s=60),
                             StartJob(spec=ref, job_id=job, restore=CAPTURED, deadline_s=60),
                             AwaitRunning(job_id=job, deadline_s=60)]
        return [*steps, AwaitHealthy(job_id=job, deadline_s=60)] if healthy else steps
    return AppPlan(
        app=new.name, action=Action.SCALE, reason="spec.job.parallelism 1 -> 2: rescaled in place",
        desired=new.canonical(), previous=old.canonical(), rollback_after=1,
        steps=(RescaleInPlace(job_id=OLD, parallelism=new.spec.job.parallelism,
                              previous_parallelism=old.spec.job.parallelism, deadline_s=deadline),
               StopWithSavepoint(job_id=OLD, deadline_s=60), *start(SpecRef.DESIRED, NEW, True)),
        rollback=tuple(start(SpecRef.PREVIOUS, RB, False)),
    )


def applied_parallelism(w: World) -> int | None:
    rec = w.journal.record("orders")
    spec = rec.last_applied_spec if rec else None
    return int(spec["spec"]["job"]["parallelism"]) if spec else None


OLD_APP, NEW_APP = make_app(parallelism=1), make_app(parallelism=2)


def test_an_adopted_rescale_keeps_the_same_job_and_records_the_parallelism_once_flink_reports_it(
        world: World) -> None:
    flink = world.seed(OLD_APP)
    assert isinstance(flink, RescalingFlink)
    world.journal.begin("orders", "a" * 40, rescale_plan(OLD_APP, OLD_APP))  # the app was applied at 1 ...
    world.journal.finish("orders", Outcome.SUCCESS, "applied", applied_spec=OLD_APP.canonical(), job_id=OLD)
    seen: list[tuple[EventPhase, int | None, int]] = []
    world.on_event.append(lambda e: seen.append((e.phase, applied_parallelism(world),
                                                 flink.jobs_by_id[OLD].parallelism)))

    result = world.executor().run_app(REV, rescale_plan(OLD_APP, NEW_APP))

    assert result.outcome is Outcome.SUCCESS and result.action is Action.SCALE, result.message
    assert result.job_id == OLD and "job " + OLD + " running" in result.message
    assert world.rt.stop_triggers == [] and world.rt.submits == [], "no stop, no new job"
    assert world.rt.running_jobs("orders") == [OLD] and flink.jobs_by_id[OLD].parallelism == 2
    assert flink.puts == [dict.fromkeys(VERTICES, (2, 2))]
    assert [s for s, _ in result.step_timings] == ["RescaleInPlace"], "the fallback steps did not run"
    # While Flink had not adopted it, the record still said 1; it says 2 only after the step verified it.
    assert (EventPhase.STARTED, 1, 1) in seen and all(applied == 1 for _, applied, _ in seen)
    assert applied_parallelism(world) == 2
    lineage = world.journal.lineage("orders")[-1]
    assert lineage.restored_from is None and lineage.job_id == OLD  # no job was started


@pytest.mark.parametrize("cluster_apply_fails", [False, True])
def test_after_an_adopted_rescale_the_cluster_carries_the_new_spec_for_a_first_sight_without_records(
        world: World, cluster_apply_fails: bool) -> None:
    """The cluster's own copy of the spec (its spec hash) is what first sight compares with the desired spec
    when the records are lost: stale, it would plan a savepoint redeploy of the job already running at the new
    parallelism. Updating it is best effort: a failure there is no reason for the fallback's stop."""
    world.seed(OLD_APP)
    assert world.rt.clusters["orders"].spec_hash == OLD_APP.spec_hash
    if cluster_apply_fails:
        world.rt.provision_error = "quota exceeded"
    result = world.executor().run_app(REV, rescale_plan(OLD_APP, NEW_APP))
    assert result.outcome is Outcome.SUCCESS and result.job_id == OLD, result.message
    assert [s for s, _ in result.step_timings] == ["RescaleInPlace"] and world.rt.stop_triggers == []
    want = OLD_APP.spec_hash if cluster_apply_fails else NEW_APP.spec_hash
    assert world.rt.clusters["orders"].spec_hash == want != (NEW_APP.spec_hash if cluster_apply_fails else "")
    assert world.rt.observe("orders").spec_hash == want


@pytest.mark.parametrize("case", ["unsupported", "plain client", "not adopted in time"])
def test_a_rescale_flink_refuses_or_does_not_adopt_falls_back_to_the_savepoint_upgrade(
        world: World, case: str) -> None:
    how: dict[str, dict[str, object]] = {"unsupported": {"unsupported": True}, "plain client": {"plain": True},
                                         "not adopted in time": {"adopt_after": None}}
    flink = world.seed(OLD_APP, **how[case])
    result = world.executor().run_app(REV, rescale_plan(OLD_APP, NEW_APP, deadline=5))

    assert result.outcome is Outcome.SUCCESS, result.message
    assert result.job_id == NEW and world.rt.running_jobs("orders") == [NEW]
    assert world.rt.stop_triggers and world.rt.stop_triggers[0][0] == OLD
    assert flink.jobs_by_id[NEW].parallelism == 2 and applied_parallelism(world) == 2
    assert [s for s, _ in result.step_timings][:2] == ["RescaleInPlace", "StopWithSavepoint"]
    fallback = [t for t in world.journal.history("orders") if t.action == "fallback"]
    why = {"unsupported": "only the adaptive scheduler can",
           "plain client": "cannot change a job's parallelism in place",
           "not adopted in time": "deadline passed waiting for job " + OLD + " to run at parallelism 2"}[case]
    assert len(fallback) == 1 and why in (fallback[0].message or ""), fallback
    assert "running the regular upgrade instead" in (fallback[0].message or "")
    assert [e.phase for e in world.events if e.description.startswith("rescale")] == [
        EventPhase.STARTED, EventPhase.FAILED]
    if isinstance(flink, RescalingFlink) and not flink.unsupported:
        # Not adopted: the request was taken back, so the job would not rescale under the fallback's stop.
        assert flink.puts == [dict.fromkeys(VERTICES, (2, 2)), dict.fromkeys(VERTICES, (1, 1))]


def test_a_crash_inside_the_rescale_resumes_it_without_asking_twice(world: World) -> None:
    flink = world.seed(OLD_APP)
    assert isinstance(flink, RescalingFlink)
    world.rt.faults.append(Fault("vertices", nth=3, error=Crash(), when="after"))
    with pytest.raises(Crash):
        world.executor().run_app(REV, rescale_plan(OLD_APP, NEW_APP))
    result = world.executor().resume("orders")
    assert result is not None and result.outcome is Outcome.SUCCESS and result.job_id == OLD, result
    assert flink.puts == [dict.fromkeys(VERTICES, (2, 2))], "the resumed step found its request in place"
    assert world.rt.stop_triggers == [] and world.rt.submits == []


def test_a_crash_after_the_rescale_completed_finishes_without_running_the_fallback(world: World) -> None:
    flink = world.seed(OLD_APP)

    def die(e: StepEvent) -> None:
        if e.phase is EventPhase.DONE and e.description.startswith("rescale"):
            raise Crash  # journaled done, not finished: the process dies here

    world.on_event.append(die)
    with pytest.raises(Crash):
        world.executor().run_app(REV, rescale_plan(OLD_APP, NEW_APP))
    world.on_event.clear()
    result = world.executor().resume("orders")
    assert result is not None and result.outcome is Outcome.SUCCESS and result.job_id == OLD, result
    assert world.rt.stop_triggers == [] and world.rt.submits == [], "the fallback never ran"
    assert flink.jobs_by_id[OLD].parallelism == 2 and applied_parallelism(world) == 2
