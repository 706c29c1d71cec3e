"""Issue 35: an upgrade that fails while its old job dies too. The failed spec is not retried until Git changes it,
but the app is not left without a job either: the next pass starts the last applied spec again from its newest
state, and the commit's status says both facts.

Two ways to get there: a stop-with-savepoint that genuinely failed, then the old job's JobManager killed (no HA);
and a new job that could not start after the stop while the rollback could not restart the old one. Real Git, the
real pass, journal, executor and git-notes statuses; the Flink double with a JobManager that dies
(tests/daemon/test_jobmanager_dies_mid_upgrade.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.errors import PermanentStepError
from reconciler.report.gitnotes import GitNotesSink
from reconciler.report.reporter import Reporter
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.model import FlinkApp
from tests.daemon.test_jobmanager_dies_mid_upgrade import APP, DyingJobManager, spec
from tests.gitutil import Repo, git


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.repo = Repo(tmp_path)
        self.repo.write("jobs/counter.jar", b"not really a jar")
        self.repo.write("apps/orders.yaml", spec(1))
        self.first = self.repo.commit("orders")
        self.clock = FakeClock()
        self.rt = DyingJobManager(self.clock, savepoint_dir=str(tmp_path / "savepoints"), create_savepoint_dirs=True)
        state = tmp_path / "state"
        source = GitSource(str(self.repo.origin), state / "git")
        self.rec = Reconciler(source=source, runtime=self.rt, journal=Journal(state / "journal", self.clock),
                              clock=self.clock, runtime_name="local", reporter=Reporter([GitNotesSink(source)],
                                                                                        self.clock))
        self.rec.source.fetch()
        assert self.apply().outcome is Outcome.SUCCESS
        self.clock.sleep(10)  # it checkpoints
        (self.old_job,) = self.rt.running_jobs(APP)
        self.repo.write("apps/orders.yaml", spec(2))
        self.second = self.repo.commit("orders at parallelism 2")
        self.rec.source.fetch()

    def apply(self) -> Any:
        result = self.rec.apply(self.rec.source.head())
        return result.results.get(APP)

    def note(self, commit: str) -> str:
        assert self.rec.reporter is not None and self.rec.reporter.flush(10)
        git(self.repo.work, "fetch", "-q", "-f", "origin", "refs/notes/*:refs/notes/*")
        return git(self.repo.work, "notes", "--ref=flink-reconciler", "show", commit)

    def job(self, job_id: str) -> Any:
        return self.rt.clusters[APP].flink.jobs_by_id[job_id]


def _heals_and_is_not_retried(w: World, restored_from: str) -> str:
    """The pass after the failure: the last applied spec from `restored_from`; then the failed spec stays failed."""
    healed = w.apply()
    assert healed.action.value == "repair" and healed.outcome is Outcome.SUCCESS, healed
    (job_id,) = w.rt.running_jobs(APP)
    job = w.job(job_id)
    assert job.parallelism == 1, "the last applied spec runs again, not the failed one"
    assert job.restored_from == restored_from, "from the newest state, never empty"
    record = w.rec.journal.record(APP)
    assert record is not None and record.job_id == job_id
    assert record.last_applied_spec is not None and record.last_applied_spec["spec"]["job"]["parallelism"] == 1
    assert record.last_applied_revision == w.first, "still applied at its own revision (its jar, its lineage)"
    assert record.failed_revision == w.second and record.failed_spec_hash is not None
    assert w.rec.journal.lineage(APP)[-1].revision == w.first, "the job ran the first revision's spec"
    note = w.note(w.second)
    line = next(x for x in note.splitlines() if x.startswith(f"flink-reconciler/{APP}: "))
    assert line.startswith(f"flink-reconciler/{APP}: failure - The last applied spec (revision {w.first[:12]}) "
                           f"runs again: job {job_id}; this spec already failed at revision {w.second[:12]}: "), line
    assert "(not retried until Git changes it)" in line, line
    assert restored_from in line, "and from which state"
    w.apply()  # says once that Git's spec stays failed
    said = len(w.rec.journal.history(APP))
    for _ in range(3):  # not retried in a loop, the job is left alone, and nothing more is written
        again = w.apply()
        assert again is None or again.action.value == "blocked", again
        w.clock.sleep(5)
    assert w.rt.running_jobs(APP) == [job_id]
    assert len(w.rec.journal.history(APP)) == said, [t.action for t in w.rec.journal.history(APP)][-6:]
    assert w.note(w.second).count(f"flink-reconciler/{APP}: ") == 1
    return job_id


def test_a_stop_that_failed_then_a_killed_jobmanager_runs_the_last_applied_spec_again(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.rt.savepoint_failure = "java.io.IOException: Mkdirs failed to create file:/state/savepoints/orders/savepoint-1"
    failed = w.apply()
    assert failed.action.value == "upgrade" and failed.outcome is Outcome.FAILURE, failed
    assert "Mkdirs failed" in failed.message and "the old job keeps running" in failed.message, failed.message
    w.rt.savepoint_failure = None
    w.clock.sleep(3)
    w.rt.kill_jobmanager(APP)  # and now the old job is gone too: nothing runs
    newest = max(w.rt.retained, key=lambda c: c.completed_at)
    assert f"/{w.old_job}/chk-" in newest.path
    _heals_and_is_not_retried(w, newest.path)

    # The documented retry: a restartNonce bump is a new spec, tried (and here it succeeds); the failure is forgotten.
    w.repo.write("apps/orders.yaml", spec(2).replace("parallelism: 2", "parallelism: 2\n    restartNonce: 1"))
    w.repo.commit("orders: retry at parallelism 2")
    w.rec.source.fetch()
    upgraded = w.apply()
    assert upgraded.action.value == "upgrade" and upgraded.outcome is Outcome.SUCCESS, upgraded
    record = w.rec.journal.record(APP)
    assert record is not None and record.failed_spec_hash is None


def test_a_new_job_that_cannot_start_and_a_rollback_that_cannot_either_run_the_last_applied_spec_again(
        tmp_path: Path) -> None:
    w = World(tmp_path)
    start = w.rt.start_job
    refused: list[str] = []

    def cannot_start(app: FlinkApp, **kw: Any) -> str:
        if len(refused) < 2:  # the new job, then the rollback's
            refused.append(str(app.spec.job.parallelism))
            raise PermanentStepError("Flink refused the submit: the JobManager has no slots for it")
        return start(app, **kw)

    w.rt.start_job = cannot_start  # type: ignore[method-assign]
    failed = w.apply()
    assert failed.outcome is Outcome.FAILURE and "the rollback failed too" in failed.message, failed
    assert "needs a human" not in failed.message and "the next pass looks again" in failed.message
    assert refused == ["2", "1"] and w.rt.running_jobs(APP) == []
    record = w.rec.journal.record(APP)
    assert record is not None and record.latest_savepoint is not None
    _heals_and_is_not_retried(w, record.latest_savepoint.path)
