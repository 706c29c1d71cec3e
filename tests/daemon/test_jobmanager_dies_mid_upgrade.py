"""kill -9 of a JobManager (no HA) while an upgrade waits for its stop-with-savepoint: the job is gone with it and
no savepoint will ever come. The execution ends as interrupted (not "this spec already failed", not parked to
wait forever) and the next pass restarts the app at the new spec from its newest checkpoint.

Found by the chaos soak: the stop step retried a dead REST endpoint until its deadline, parked, and did so again
on every pass, so the app stayed down. Real Git, the real pass, journal and executor; the Flink double of
tests/apply/fakes.py, extended here with a JobManager that dies (its jobs with it) and a restart that forgets
them, as the local runtime's does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Checkpoint, ClusterPhase, Outcome
from reconciler.core.plan import INTERRUPTED
from reconciler.errors import ObserveError
from reconciler.live.ports import ClusterInfo
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.model import FlinkApp
from tests.apply.fakes import FakeCluster, FakeFlink, FakeRuntime
from tests.gitutil import Repo

APP = "orders"


def spec(parallelism: int, interval: str = "1s") -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager:
    slots: 2
  flinkConfiguration:
    execution.checkpointing.interval: {interval}
  job:
    jarURI: jobs/counter.jar
    parallelism: {parallelism}
"""


RT = TypeVar("RT", bound=FakeRuntime)


def dying_jobmanager(clock: FakeClock, savepoint_dir: str) -> DyingJobManager:
    return DyingJobManager(clock, savepoint_dir=savepoint_dir, create_savepoint_dirs=True)


def applied_world(tmp_path: Path, make: Callable[[FakeClock, str], RT]) -> tuple[Repo, RT, Reconciler, FakeClock]:
    """`orders` applied at parallelism 1 and checkpointing for 10 s. Real Git, the real pass, journal and executor
    over the runtime `make` builds."""
    repo = Repo(tmp_path)
    repo.write("jobs/counter.jar", b"not really a jar")
    repo.write("apps/orders.yaml", spec(1))
    repo.commit("orders")
    clock = FakeClock()
    runtime = make(clock, str(tmp_path / "savepoints"))
    state = tmp_path / "state"
    rec = Reconciler(source=GitSource(str(repo.origin), state / "git"), runtime=runtime,
                     journal=Journal(state / "journal", clock), clock=clock, runtime_name="local")
    rec.source.fetch()
    assert rec.apply(rec.source.head()).results[APP].outcome is Outcome.SUCCESS
    clock.sleep(10)
    return repo, runtime, rec, clock


def upgrade_world(tmp_path: Path, make: Callable[[FakeClock, str], RT]) -> tuple[RT, Reconciler, FakeClock]:
    """`applied_world`, then parallelism 2 committed and fetched, not yet applied."""
    repo, runtime, rec, clock = applied_world(tmp_path, make)
    repo.write("apps/orders.yaml", spec(2))
    repo.commit("orders at parallelism 2")
    rec.source.fetch()
    return runtime, rec, clock


def kill_after_new_start(runtime: FakeRuntime, kill: Callable[[str], None]) -> Callable[..., str]:
    """From now on, a start of the new spec (parallelism 2) kills a process of the app right after its submit.
    Returns the start it wraps, to put back."""
    start = runtime.start_job

    def start_then_kill(app: FlinkApp, **kw: Any) -> str:
        job = start(app, **kw)
        if app.spec.job.parallelism == 2:
            kill(APP)
        return job

    runtime.start_job = start_then_kill  # type: ignore[method-assign]
    return start


class DyingJobManager(FakeRuntime):
    """A JobManager that can die (kill -9): the cluster is FAILED, REST refuses, its jobs are gone; their retained
    checkpoints stay in storage. `ensure_cluster` starts a new JobManager that knows no job."""

    def __init__(self, clock: FakeClock, **kw: Any) -> None:
        super().__init__(clock, **kw)
        self.dead: set[str] = set()
        self.retained: list[Checkpoint] = []

    def kill_jobmanager(self, app: str) -> None:
        flink = self.clusters[app].flink
        flink._tick()
        for job in flink.jobs_by_id.values():
            self.retained += [Checkpoint(path=path, completed_at=self.wall(at)) for _, path, at in job.checkpoints]
        self.extra_paths |= {c.path for c in self.retained}  # retained on disk: a new JobManager can restore them
        self.dead.add(app)

        def refused(*_a: Any, **_k: Any) -> Any:
            raise ObserveError(f"JobManager REST of {app} not answering (connection refused)")

        for name in ("overview", "jobs", "job", "savepoint_status", "stop_with_savepoint", "trigger_savepoint",
                     "cancel", "checkpoints", "exceptions", "run_jar", "upload_jar"):
            setattr(flink, name, refused)  # a client held from before the kill gets nothing either

    def observe(self, app: str) -> ClusterInfo:
        if app in self.dead:
            return ClusterInfo(app=app, phase=ClusterPhase.FAILED, rest_url=f"fake://{app}",
                               spec_hash=self.clusters[app].spec_hash,
                               message="JobManager is not running: killed by SIGKILL")
        return super().observe(app)

    def flink(self, app: str) -> FakeFlink:
        if app in self.dead:
            raise ObserveError(f"JobManager REST of {app} not answering (connection refused)")
        return super().flink(app)

    def stored_snapshots(self, app: str) -> list[Checkpoint]:
        # newest first, as the runtimes list them
        return sorted(self.retained, key=lambda c: c.completed_at, reverse=True) if app in self.clusters else []

    def ensure_cluster(self, app: FlinkApp, *, deadline: float, keep_running: bool = False) -> ClusterInfo:
        if app.name in self.dead:
            old = self.clusters.pop(app.name)
            self.dead.discard(app.name)
            self.clusters[app.name] = FakeCluster(app.name, self.clock.monotonic(), old.spec_hash,
                                                  FakeFlink(self, app.name))
        return super().ensure_cluster(app, deadline=deadline, keep_running=keep_running)


def test_a_jobmanager_killed_during_the_upgrades_stop_interrupts_it_and_the_app_restarts_from_its_checkpoint(
        tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("jobs/counter.jar", b"not really a jar")
    repo.write("apps/orders.yaml", spec(1))
    repo.commit("orders")
    clock = FakeClock()
    runtime = DyingJobManager(clock, savepoint_dir=str(tmp_path / "savepoints"), create_savepoint_dirs=True,
                              savepoint_s=5.0)
    state = tmp_path / "state"
    rec = Reconciler(source=GitSource(str(repo.origin), state / "git"), runtime=runtime,
                     journal=Journal(state / "journal", clock), clock=clock, runtime_name="local")
    rec.source.fetch()
    assert rec.apply(rec.source.head()).results[APP].outcome is Outcome.SUCCESS
    clock.sleep(10)  # it checkpoints
    (old_job,) = runtime.running_jobs(APP)

    repo.write("apps/orders.yaml", spec(2))
    repo.commit("orders at parallelism 2")
    rec.source.fetch()
    flink = runtime.clusters[APP].flink
    stop = flink.stop_with_savepoint

    def stop_then_die(job_id: str, **kw: Any) -> str:
        trigger = stop(job_id, **kw)
        runtime.kill_jobmanager(APP)  # before the savepoint completes
        return trigger

    flink.stop_with_savepoint = stop_then_die  # type: ignore[method-assign]
    t0 = clock.monotonic()
    upgrade = rec.apply(rec.source.head()).results[APP]
    assert upgrade.action.value == "upgrade" and upgrade.outcome is Outcome.FAILURE, upgrade
    assert upgrade.message.startswith("interrupted: stop job") and "JobManager is not running" in upgrade.message
    assert clock.monotonic() - t0 < 60, "not waited out until the stop's deadline"
    record = rec.journal.record(APP)
    assert record is not None and record.last_action == INTERRUPTED and rec.journal.inflight(APP) is None

    # The next pass: no job, no savepoint; the newest retained checkpoint of the old job restarts it, at the new spec.
    repaired = rec.apply(rec.source.head()).results[APP]
    assert repaired.action.value == "repair" and repaired.outcome is Outcome.SUCCESS, repaired
    (new_job,) = runtime.running_jobs(APP)
    job = runtime.clusters[APP].flink.jobs_by_id[new_job]
    newest = max(runtime.retained, key=lambda c: c.completed_at)
    assert job.restored_from == newest.path and f"/{old_job}/chk-" in job.restored_from
    assert job.parallelism == 2
    record = rec.journal.record(APP)
    assert record is not None and record.last_outcome is Outcome.SUCCESS


def test_a_jobmanager_killed_after_the_stop_interrupts_the_upgrade_instead_of_a_rollback_onto_it(
        tmp_path: Path) -> None:
    """Killed once the new job was submitted: not rolled back onto the dead cluster, not "this spec already
    failed"; the next pass starts the new spec from the savepoint the stop took."""
    runtime, rec, clock = upgrade_world(tmp_path, dying_jobmanager)
    start = kill_after_new_start(runtime, runtime.kill_jobmanager)
    t0 = clock.monotonic()
    upgrade = rec.apply(rec.source.head()).results[APP]
    assert upgrade.outcome is Outcome.FAILURE and upgrade.message.startswith("interrupted: wait until job"), upgrade
    assert clock.monotonic() - t0 < 60, "the dead JobManager was seen at the first failed poll, not at the deadline"
    record = rec.journal.record(APP)
    assert record is not None and record.last_action == INTERRUPTED and record.latest_savepoint is not None
    runtime.start_job = start  # type: ignore[method-assign]
    repaired = rec.apply(rec.source.head()).results[APP]
    assert repaired.action.value == "repair" and repaired.outcome is Outcome.SUCCESS, repaired
    (new_job,) = runtime.running_jobs(APP)
    job = runtime.clusters[APP].flink.jobs_by_id[new_job]
    assert job.restored_from == record.latest_savepoint.path and job.parallelism == 2


def test_a_second_jobmanager_death_under_the_same_spec_is_the_specs_failure_and_never_loops(tmp_path: Path) -> None:
    """A config that kills its JobManager after the start: interrupted once, then the usual failure path, and the
    next passes are repairs bounded by the crash-loop guard (core.heal.repair_guard), never another interruption."""
    runtime, rec, _ = upgrade_world(tmp_path, dying_jobmanager)
    kill_after_new_start(runtime, runtime.kill_jobmanager)  # only the new spec kills its JobManager
    first = rec.apply(rec.source.head()).results[APP]
    assert first.message.startswith("interrupted: "), first
    second = rec.apply(rec.source.head()).results[APP]
    assert second.outcome is Outcome.FAILURE and not second.message.startswith("interrupted"), second
    record = rec.journal.record(APP)
    assert record is not None and record.last_action != INTERRUPTED
    later = [rec.apply(rec.source.head()).results.get(APP) for _ in range(3)]  # repairs, bounded by the guard
    assert not any(r and r.message.startswith("interrupted") for r in later), later


def test_a_runtime_that_restarts_processes_itself_rolls_back_as_before(tmp_path: Path) -> None:
    """On Kubernetes a FAILED JobManager after the start is crash-looping (its supervisor restarts a killed one):
    the spec's failure, rolled back at once, never an interruption."""
    runtime, rec, _ = upgrade_world(tmp_path, dying_jobmanager)
    runtime.restarts_processes = True
    kill_after_new_start(runtime, runtime.kill_jobmanager)
    upgrade = rec.apply(rec.source.head()).results[APP]
    assert upgrade.outcome is Outcome.FAILURE and not upgrade.message.startswith("interrupted"), upgrade


def test_a_spec_that_failed_is_tried_again_when_git_returns_to_it_after_another_ran(tmp_path: Path) -> None:
    """Chaos soak run 14, round 66: parallelism 2 failed (its stop could not write the savepoint); then another spec
    ran, reached through an interrupted upgrade and the repair that finished it; then Git went back to parallelism
    2, and the app stayed blocked: "this spec already failed", for good. A spec applied since the failure is a
    fresh start (as a successful upgrade already was), whichever execution applied it."""
    repo, runtime, rec, clock = applied_world(tmp_path, dying_jobmanager)

    def push(parallelism: int, interval: str = "1s") -> Any:
        repo.write("apps/orders.yaml", spec(parallelism, interval))
        repo.commit(f"orders at parallelism {parallelism}, a checkpoint every {interval}")
        rec.source.fetch()
        return rec.apply(rec.source.head()).results[APP]

    runtime.savepoint_failure = "java.io.IOException: Mkdirs failed to create file:/savepoints/orders/savepoint-1"
    failed = push(2)
    assert failed.action.value == "upgrade" and failed.outcome is Outcome.FAILURE, failed
    record = rec.journal.record(APP)
    assert record is not None and record.failed_spec_hash is not None
    runtime.savepoint_failure = None

    start = runtime.start_job

    def start_then_kill(app: FlinkApp, **kw: Any) -> str:
        job = start(app, **kw)
        if app.spec.flink_configuration.get("execution.checkpointing.interval") == "2s":
            runtime.start_job = start  # type: ignore[method-assign]  # once
            runtime.kill_jobmanager(APP)
        return job

    runtime.start_job = start_then_kill  # type: ignore[method-assign]
    clock.sleep(10)
    interrupted = push(1, "2s")
    assert interrupted.outcome is Outcome.FAILURE and interrupted.message.startswith("interrupted: "), interrupted
    repaired = rec.apply(rec.source.head()).results[APP]
    assert repaired.action.value == "repair" and repaired.outcome is Outcome.SUCCESS, repaired
    record = rec.journal.record(APP)
    assert record is not None and record.failed_spec_hash is None, "another spec runs: the failure is behind it"

    clock.sleep(10)
    again = push(2)
    assert again.action.value == "upgrade" and again.outcome is Outcome.SUCCESS, again
    assert [runtime.clusters[APP].flink.jobs_by_id[j].parallelism for j in runtime.running_jobs(APP)] == [2]
