"""kill -9 of a TaskManager (local runtime: nothing restarts it) once an upgrade has stopped the old job: the new job
waits for slots that do not come. The step itself restarts the process, and the upgrade completes; where the
process cannot be restarted, the failure path cancels the new job before it starts the old one, never leaving two.

Found by the chaos soak (a parallelism change, the TaskManager killed as the new job started): the new job waited
out its deadline at 0/4 tasks, the rollback skipped cancelling it because the cluster looked "starting", started the
old spec's job beside it, and the app was left with two jobs and "needs a human". Real Git, the real pass, journal
and executor; the Flink double of tests/apply/fakes.py with a TaskManager that can die."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.clock import FakeClock
from reconciler.core.observed import ClusterPhase, Outcome
from reconciler.core.plan import spec_hash
from reconciler.live.ports import ClusterInfo
from reconciler.service.reconcile import Reconciler
from reconciler.spec.model import FlinkApp
from tests.apply.fakes import TERMINAL, FakeFlink, FakeJob, FakeRuntime
from tests.daemon.test_jobmanager_dies_mid_upgrade import APP, kill_after_new_start, upgrade_world


class DyingTaskManager(FakeRuntime):
    """The app's only TaskManager can die: its jobs' tasks stop and none deploy until `ensure_cluster` (of the
    spec the cluster runs) restarts it, as the local runtime's does. `restartable=False`: it never comes back."""

    def __init__(self, clock: FakeClock, **kw: Any) -> None:
        super().__init__(clock, **kw)
        self.dead: set[str] = set()
        self.restartable = True
        self.restarts = 0

    def kill_taskmanager(self, app: str) -> None:
        flink = self.clusters[app].flink
        flink._tick()
        for job in flink.jobs_by_id.values():
            if job.state not in TERMINAL:
                job.tasks_running = 0
        self.dead.add(app)

    def _flink_of(self, app: str) -> FakeFlink:
        flink = self.clusters[app].flink
        if not getattr(flink, "_tm_aware", False):
            advance = flink._advance

            def gated(job: FakeJob, now: float) -> None:
                if app in self.dead and job.cancel_at is None:  # no slots: nothing deploys (a cancel still ends it)
                    return
                advance(job, now)

            flink._advance = gated  # type: ignore[method-assign]
            flink._tm_aware = True  # type: ignore[attr-defined]
        return flink

    def observe(self, app: str) -> ClusterInfo:
        info = super().observe(app)
        if app in self.dead:
            return ClusterInfo(app=app, phase=ClusterPhase.STARTING, rest_url=info.rest_url, spec_hash=info.spec_hash,
                               message="TaskManager(s) not running: taskmanager-0 (exited with code -9)",
                               missing=("taskmanager-0",))
        return info

    def ensure_cluster(self, app: FlinkApp, *, deadline: float, keep_running: bool = False) -> ClusterInfo:
        c = self.clusters.get(app.name)
        if c is not None and app.name in self.dead and self.restartable:
            assert c.spec_hash == spec_hash(app.canonical()), "a restart of a process must not reconfigure the cluster"
            self.dead.discard(app.name)
            self.restarts += 1
        return super().ensure_cluster(app, deadline=deadline, keep_running=keep_running)

    def start_job(self, app: FlinkApp, **kw: Any) -> str:
        self._flink_of(app.name)
        job = super().start_job(app, **kw)
        self.clusters[app.name].spec_hash = spec_hash(app.canonical())  # as the local runtime's start does
        return job


def _world(tmp_path: Path) -> tuple[DyingTaskManager, Reconciler, FakeClock]:
    runtime, rec, clock = upgrade_world(
        tmp_path, lambda c, d: DyingTaskManager(c, savepoint_dir=d, create_savepoint_dirs=True))
    kill_after_new_start(runtime, runtime.kill_taskmanager)
    return runtime, rec, clock


def test_a_taskmanager_killed_as_the_new_job_starts_is_restarted_by_the_step_and_the_upgrade_completes(
        tmp_path: Path) -> None:
    runtime, rec, clock = _world(tmp_path)
    t0 = clock.monotonic()
    upgrade = rec.apply(rec.source.head()).results[APP]
    assert upgrade.outcome is Outcome.SUCCESS, upgrade
    assert runtime.restarts == 1 and clock.monotonic() - t0 < 60
    (job_id,) = runtime.running_jobs(APP)
    assert runtime.clusters[APP].flink.jobs_by_id[job_id].parallelism == 2
    notes = [t.message or "" for t in rec.journal.history(APP)]
    assert any(m.startswith("restarted taskmanager-0 while job ") for m in notes), notes


def test_a_taskmanager_that_cannot_be_restarted_fails_the_upgrade_and_the_new_job_is_cancelled_first(
        tmp_path: Path) -> None:
    runtime, rec, _ = _world(tmp_path)
    runtime.restartable = False
    upgrade = rec.apply(rec.source.head()).results[APP]
    assert upgrade.outcome is Outcome.FAILURE and "rolled back" not in upgrade.message, upgrade
    new_job = runtime.submits[-1]
    # The cluster looked "starting" (a TaskManager missing), yet its JobManager answers: the new job is cancelled.
    assert new_job in runtime.cancels and runtime.clusters[APP].flink.jobs_by_id[new_job].state == "CANCELED"
    assert runtime.running_jobs(APP) == []  # never the old spec's job beside it
