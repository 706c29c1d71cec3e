"""A repair whose job checkpoints only after the step's deadline (a loaded machine, a slow first checkpoint)
ends as a failure while its job runs on. The next pass that sees that job running with a completed checkpoint
records it as recovered: `status` must not say "failure" for a healthy app until the next Git change.

Real Git (a bare origin), the real pass, journal and executor, and the in-memory Flink double of
tests/apply/fakes.py (a fake clock: the executor's waits cost no time)."""

from __future__ import annotations

from pathlib import Path

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.apply.fakes import Behaviour, FakeRuntime
from tests.gitutil import Repo

APP = "orders"
SPEC = f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  flinkConfiguration:
    execution.checkpointing.interval: 30s
  job:
    jarURI: jobs/counter.jar
    parallelism: 1
    upgradeMode: last-state
  deadlines:
    healthy: 10s
"""


def _setup(tmp_path: Path) -> tuple[Reconciler, FakeRuntime, FakeClock]:
    repo = Repo(tmp_path)
    repo.write("jobs/counter.jar", b"not really a jar")
    repo.write("apps/orders.yaml", SPEC)
    repo.commit("orders")
    clock = FakeClock()
    runtime = FakeRuntime(clock, savepoint_dir=str(tmp_path / "savepoints"), create_savepoint_dirs=True)
    state = tmp_path / "state"
    rec = Reconciler(source=GitSource(str(repo.origin), state / "git"), runtime=runtime,
                     journal=Journal(state / "journal", clock), clock=clock, runtime_name="local")
    rec.source.fetch()
    return rec, runtime, clock


def _create(rec: Reconciler, clock: FakeClock, head: str) -> None:
    """Running with a checkpoint (a create whose first checkpoint came late is adopted at the next pass)."""
    for _ in range(3):
        rec.apply(head)
        record = rec.journal.record(APP)
        if record is not None and record.last_outcome is Outcome.SUCCESS:
            return
        clock.sleep(31)
    raise AssertionError(rec.journal.record(APP))


def _fail_the_job(runtime: FakeRuntime) -> str:
    (job,) = [j for j in runtime.clusters[APP].flink.jobs_by_id.values() if j.state == "RUNNING"]
    job.state, job.tasks_running = "FAILED", 0
    job.exceptions.append("java.lang.OutOfMemoryError: Java heap space")
    return job.job_id


def test_a_repair_that_missed_its_checkpoint_deadline_is_recovered_once_its_job_checkpoints(tmp_path: Path) -> None:
    rec, runtime, clock = _setup(tmp_path)
    head = rec.source.head()
    _create(rec, clock, head)
    # The job fails; the repair starts a new one, whose first checkpoint comes after its 10 s deadline.
    old = _fail_the_job(runtime)
    repaired = rec.apply(head).results[APP]
    assert repaired.action.value == "repair" and repaired.outcome is Outcome.FAILURE, repaired
    new = runtime.running_jobs(APP)
    assert new and new != [old]
    record = rec.journal.record(APP)
    assert record is not None and record.last_outcome is Outcome.FAILURE and record.last_action == "repair"

    rec.apply(head)  # still no checkpoint: still a failure, nothing written
    assert rec.journal.record(APP).last_outcome is Outcome.FAILURE  # type: ignore[union-attr]
    clock.sleep(31)
    rec.apply(head)
    record = rec.journal.record(APP)
    assert record is not None and record.last_outcome is Outcome.SUCCESS, record
    assert record.job_id == new[0] and "recovered" in (record.last_message or "")
    assert [t.action for t in rec.journal.history(APP)][-1] == "recovered"
    assert runtime.running_jobs(APP) == new, "nothing was restarted to get there"
    n = len(rec.journal.history(APP))
    rec.apply(head)
    assert len(rec.journal.history(APP)) == n, "said once"


def test_a_repair_whose_job_does_not_run_stays_a_failure(tmp_path: Path) -> None:
    rec, runtime, clock = _setup(tmp_path)
    head = rec.source.head()
    _create(rec, clock, head)
    runtime.behaviours[""] = Behaviour.NO_CHECKPOINTS
    _fail_the_job(runtime)
    repaired = rec.apply(head).results[APP]
    assert repaired.action.value == "repair" and repaired.outcome is Outcome.FAILURE
    clock.sleep(60)
    rec.apply(head)
    record = rec.journal.record(APP)
    assert record is not None and record.last_action == "repair" and record.last_outcome is Outcome.FAILURE
