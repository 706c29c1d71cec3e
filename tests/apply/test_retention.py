"""Savepoint retention (`Journal.prune_savepoints`) with many savepoints: it keeps exactly what the rule
says, and a disposal that fails is reported in the app's history, never raised.

The rule: keep the newest `retain` savepoints (with `max_age`, none older than it), and always the
newest one, manual ones (not counted against `retain`), and the rollback point of each of the newest
`retain` revisions that ran, so `rollback --to` any of them keeps working. Savepoints are real
directories under tmp_path; the lineage is written through the journal as the executor writes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.core.rollback import RollbackPoint, rollback_point
from reconciler.errors import TransientStepError
from reconciler.live.ports import SavepointStatus
from tests.apply.test_journal import plan_for

APP = "orders"


@dataclass
class History:
    """Executions of one app, written through the journal like the executor does."""

    journal: Journal
    clock: FakeClock
    root: Path
    n: int = 0
    jobs: dict[str, str] = field(default_factory=dict)  # revision -> the job it left running
    running: str | None = None

    def savepoint(self, job: str, rev: str, kind: str = "savepoint") -> str:
        self.n += 1
        d = self.root / f"savepoint-{job[:6]}-{self.n:012x}"
        d.mkdir(parents=True)
        (d / "_metadata").write_text("x")
        self.journal.add_savepoint(APP, f"file:{d}", job_id=job, revision=rev, kind=kind)
        return f"file:{d}"

    def run(self, rev: str, *, fail: bool = False) -> str | None:
        """An upgrade to `rev`: stop the running job with a savepoint, start the new one. `fail`: the
        new job fails and the plan's rollback restarts the old spec from that savepoint."""
        self.journal.begin(APP, rev, plan_for())
        taken = self.savepoint(self.running, rev) if self.running else None
        job = f"job-{self.n}-{rev[:4]}"
        self.journal.step_started(APP, 1, restored_from=taken or "", submitted_job_id=job)
        self.journal.finish(APP, Outcome.FAILURE if fail else Outcome.SUCCESS, "x",
                            applied_spec=None if fail else {"rev": rev}, job_id=job)
        self.running = job
        if not fail:
            self.jobs[rev] = job
        self.clock.advance(60)
        return taken

    def paths(self) -> set[str]:
        rec = self.journal.record(APP)
        assert rec is not None
        return {s.path for s in rec.savepoints}


@pytest.fixture
def h(tmp_path: Path) -> Iterator[History]:
    clock = FakeClock()
    journal = Journal(tmp_path / "state" / "journal", clock)
    yield History(journal, clock, tmp_path / "savepoints")
    journal.close()


def exists(path: str) -> bool:
    return Path(path.removeprefix("file:")).is_dir()


def test_the_newest_n_are_kept_and_manual_savepoints_are_never_counted_nor_disposed(h: History) -> None:
    revs = [str(i) * 40 for i in range(1, 9)]
    left: dict[str, str] = {}  # revision -> the savepoint taken when it was left
    manual = []
    for i, rev in enumerate(revs):
        taken = h.run(rev)
        if taken:
            left[revs[i - 1]] = taken
        if i in (2, 6):
            manual.append(h.savepoint(h.running or "", rev, kind="manual"))
    assert len(h.paths()) == 9
    pruned = h.journal.prune_savepoints(APP, 3)
    kept = {left[revs[4]], left[revs[5]], left[revs[6]], *manual}
    assert h.paths() == kept
    assert {p.path for p in pruned} == {left[r] for r in revs[:4]}
    assert all(not exists(p.path) for p in pruned) and all(exists(p) for p in kept)
    assert [t.action for t in h.journal.history(APP)].count("prune") == 4
    assert h.journal.prune_savepoints(APP, 3) == []  # stable


def test_the_rollback_point_of_a_recent_revision_survives_a_burst_of_newer_savepoints(h: History) -> None:
    r1, r2, r3, r4 = ("1" * 40, "2" * 40, "3" * 40, "4" * 40)
    h.run(r1)
    s1 = h.run(r2)  # leaving r1
    s2 = h.run(r3)  # leaving r2: r2's rollback point
    f1, f2, f3 = (h.run(r4, fail=True) for _ in range(3))  # three failed tries at r4, each rolled back to r3
    assert None not in (s1, s2, f1, f2, f3)
    pruned = h.journal.prune_savepoints(APP, 2)
    # Newest two: f3, f2. Protected besides: r2's rollback point s2 (r3 and r2 are the two newest that ran;
    # r3's point is f3, the savepoint of the last job that ran r3's spec).
    assert h.paths() == {f3, f2, s2}
    assert {p.path for p in pruned} == {s1, f1}
    rec = h.journal.record(APP)
    assert rec is not None
    point = rollback_point(r2, h.journal.lineage(APP), rec.savepoints)
    assert isinstance(point, RollbackPoint) and point.savepoint.path == s2 and exists(s2)


def test_max_age_disposes_of_old_savepoints_but_never_the_newest(h: History) -> None:
    revs = [str(i) * 40 for i in range(1, 7)]
    taken = [h.run(rev) for rev in revs][1:]  # savepoints at t = 60, 120, 180, 240, 300; now 360
    pruned = h.journal.prune_savepoints(APP, 10, max_age=timedelta(seconds=150))
    assert h.paths() == set(taken[3:])  # 240 and 300 are younger than 150 s; r5's point (300) too
    assert {p.path for p in pruned} == set(taken[:3])
    # Everything old: the newest stays whatever the age.
    h.clock.advance(3600)
    h.journal.prune_savepoints(APP, 10, max_age=timedelta(seconds=150))
    assert h.paths() == {taken[-1]}


class Disposer:
    """Stands in for the app's Flink REST client (`trigger_disposal` / `disposal_status`)."""

    def __init__(self) -> None:
        self.disposed: list[str] = []
        self.polls = 0

    def trigger_disposal(self, savepoint_path: str) -> str:
        if "unreachable" in savepoint_path:
            raise TransientStepError("Flink REST unreachable: ConnectError")
        return savepoint_path

    def disposal_status(self, trigger_id: str) -> SavepointStatus:
        self.polls += 1
        if self.polls % 2:
            return SavepointStatus(done=False)  # in progress first
        if "denied" in trigger_id:
            return SavepointStatus(done=True, failure="java.nio.file.AccessDeniedException: s3://b/denied")
        if "gone" in trigger_id:
            return SavepointStatus(done=True, failure="java.io.FileNotFoundException: Cannot find checkpoint or "
                                                      f"savepoint file/directory '{trigger_id}' on file system 'file'.")
        self.disposed.append(trigger_id)
        return SavepointStatus(done=True)


def test_disposal_failures_are_reported_and_never_fatal(h: History, tmp_path: Path) -> None:
    for path in ("s3://b/savepoint-ok", "s3://b/savepoint-denied", "s3://b/savepoint-unreachable"):
        h.journal.add_savepoint(APP, path, job_id="j", revision="1" * 40)
        h.clock.advance(1)
    blocker = tmp_path / "sp" / "savepoint-not-a-dir"
    blocker.parent.mkdir()
    blocker.write_text("a file where a savepoint directory was")  # rmtree of it fails
    h.journal.add_savepoint(APP, f"file:{blocker}", job_id="j", revision="1" * 40)
    h.clock.advance(1)
    h.journal.add_savepoint(APP, "s3://b/savepoint-newest", job_id="j", revision="1" * 40)
    disposer = Disposer()
    pruned = h.journal.prune_savepoints(APP, 1, disposer=lambda: disposer)
    assert len(pruned) == 4 and h.paths() == {"s3://b/savepoint-newest"}
    assert disposer.disposed == ["s3://b/savepoint-ok"]
    failed = {(t.message or "").split(": ", 1)[0]: t.message or "" for t in h.journal.history(APP)
              if t.action == "dispose-failed"}
    assert set(failed) == {"s3://b/savepoint-denied", "s3://b/savepoint-unreachable", f"file:{blocker}"}
    assert "AccessDeniedException" in failed["s3://b/savepoint-denied"]
    assert "unreachable" in failed["s3://b/savepoint-unreachable"] and "delete it by hand" in failed[f"file:{blocker}"]
    assert all(t.outcome is Outcome.FAILURE for t in h.journal.history(APP) if t.action == "dispose-failed")


def test_without_a_disposer_remote_savepoints_are_only_forgotten(h: History) -> None:
    h.journal.add_savepoint(APP, "s3://b/savepoint-old", job_id="j", revision="1" * 40)
    h.clock.advance(1)
    h.journal.add_savepoint(APP, "s3://b/savepoint-new", job_id="j", revision="1" * 40)
    assert [p.path for p in h.journal.prune_savepoints(APP, 1)] == ["s3://b/savepoint-old"]
    assert not any(t.action == "dispose-failed" for t in h.journal.history(APP))


def test_a_file_savepoint_this_process_cannot_see_is_disposed_of_by_flink(h: History, tmp_path: Path) -> None:
    """On Kubernetes a file: savepoint lives on a volume of the Flink pods: the JobManager disposes of it.
    One that Flink cannot find either is already gone: nothing to report."""
    elsewhere = "file:/mnt/flink-pvc/savepoints/orders/savepoint-abc123-000000000001"
    gone = "file:/mnt/flink-pvc/savepoints/orders/savepoint-gone12-000000000002"
    for path in (elsewhere, gone, "file:/mnt/flink-pvc/savepoints/orders/savepoint-newest-000000000003"):
        h.journal.add_savepoint(APP, path, job_id="j", revision="1" * 40)
        h.clock.advance(1)
    disposer = Disposer()
    assert {p.path for p in h.journal.prune_savepoints(APP, 1, disposer=disposer)} == {elsewhere, gone}
    assert disposer.disposed == [elsewhere]
    assert not any(t.action == "dispose-failed" for t in h.journal.history(APP))
