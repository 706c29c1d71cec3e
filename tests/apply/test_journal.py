"""The journal: durable, crash-safe, Flux-style records; retention; the state-dir lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import MAX_TRANSITIONS, SCHEMA_VERSION, Journal, Stage, StepPhase, local_savepoint_dir
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import CAPTURED, Action, AppPlan, AwaitRunning, StartJob, StopWithSavepoint, spec_hash
from reconciler.errors import JournalError, RecordConflictError
from reconciler.live.records import FileRecordStore
from tests.apply.fakes import make_app

REV1, REV2 = "1" * 40, "2" * 40


def plan_for(name: str = "orders", *, revision_job: str = "n" * 32) -> AppPlan:
    desired = make_app(name, parallelism=2).canonical()
    return AppPlan(
        app=name, action=Action.UPGRADE, reason="upgrade change", desired=desired,
        previous=make_app(name).canonical(), source_file=f"apps/{name}.yaml",
        steps=(StopWithSavepoint(job_id="o" * 32, deadline_s=60),
               StartJob(job_id=revision_job, restore=CAPTURED, deadline_s=60),
               AwaitRunning(job_id=revision_job, deadline_s=60)),
        rollback_after=0,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def journal(tmp_path: Path, clock: FakeClock) -> Iterator[Journal]:
    j = Journal(tmp_path / "state" / "journal.sqlite", clock)
    yield j
    j.close()


def test_empty_journal_has_no_records(journal: Journal) -> None:
    assert journal.records().apps == {}
    assert journal.record("orders") is None
    assert journal.inflight("orders") is None
    assert journal.all_inflight() == {}


def test_inflight_survives_reopen_with_its_scratch(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "journal.sqlite"
    p = plan_for()
    with Journal(path, clock) as j:
        j.begin("orders", REV1, p)
        j.step_started("orders", 0)
        j.set_scratch("orders", trigger_id="t-1")
    with Journal(path, clock) as j:
        inf = j.inflight("orders")
        assert inf is not None
        assert (inf.revision, inf.stage, inf.step_index, inf.phase, inf.trigger_id) == (
            REV1, Stage.FORWARD, 0, StepPhase.STARTED, "t-1")
        assert inf.plan == p  # the AppPlan round-trips exactly
        rec = j.record("orders")
        assert rec is not None
        assert (rec.last_attempted_revision, rec.attempts, rec.last_outcome, rec.source_file) == (
            REV1, 1, Outcome.PENDING, "apps/orders.yaml")
        assert rec.last_attempted_spec_hash == spec_hash(p.desired or {})


def test_a_killed_writer_leaves_every_committed_step_behind(tmp_path: Path) -> None:
    """A process SIGKILLed right after journaling (no close, no flush by us) loses nothing."""
    path = tmp_path / "journal.sqlite"
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from reconciler.apply.journal import Journal
        from reconciler.clock import FakeClock
        from tests.apply.test_journal import plan_for
        j = Journal(Path({str(path)!r}), FakeClock())
        j.begin("orders", {REV1!r}, plan_for())
        j.step_started("orders", 0)
        j.set_scratch("orders", trigger_id="t-1")
        j.step_done("orders", 0, captured_path="file:/sp/savepoint-1", captured_kind="savepoint")
        j.step_started("orders", 1, submitted_job_id="n" * 32)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2], capture_output=True,
                          timeout=60, check=False)
    assert proc.returncode == -9, proc.stderr.decode()
    with Journal(path, FakeClock()) as j:
        inf = j.inflight("orders")
        assert inf is not None
        assert (inf.step_index, inf.phase, inf.captured_path, inf.submitted_job_id) == (
            1, StepPhase.STARTED, "file:/sp/savepoint-1", "n" * 32)
        # Moving to the next step dropped the trigger id: it belonged to step 0.
        assert inf.trigger_id is None


def test_step_phases_and_scratch(journal: Journal) -> None:
    journal.begin("orders", REV1, plan_for())
    inf = journal.inflight("orders")
    assert inf is not None and (inf.step_index, inf.phase) == (0, StepPhase.PENDING)
    journal.step_started("orders", 0)
    journal.set_scratch("orders", trigger_id="t-9")
    journal.step_started("orders", 0)  # a resume re-enters the step: the trigger stays
    inf = journal.inflight("orders")
    assert inf is not None and inf.trigger_id == "t-9"
    journal.step_done("orders", 0, captured_path="file:/x/savepoint-a", captured_kind="savepoint")
    inf = journal.inflight("orders")
    assert inf is not None and (inf.phase, inf.captured_path, inf.captured_kind) == (
        StepPhase.DONE, "file:/x/savepoint-a", "savepoint")
    with pytest.raises(ValueError, match="unknown scratch keys"):
        journal.set_scratch("orders", trigger="oops")


def test_begin_refuses_a_second_execution(journal: Journal) -> None:
    journal.begin("orders", REV1, plan_for())
    with pytest.raises(JournalError, match="unfinished execution"):
        journal.begin("orders", REV2, plan_for())


def test_start_rollback_switches_stage_and_remembers_the_cause(journal: Journal) -> None:
    journal.begin("orders", REV1, plan_for())
    journal.step_started("orders", 2)
    journal.start_rollback("orders", failed_step="start job n", failure="ClassNotFoundException")
    inf = journal.inflight("orders")
    assert inf is not None
    assert (inf.stage, inf.step_index, inf.phase, inf.failed_step, inf.failure) == (
        Stage.ROLLBACK, 0, StepPhase.PENDING, "start job n", "ClassNotFoundException")
    assert [t.action for t in journal.history("orders")] == ["upgrade", "rollback"]


def test_finish_moves_applied_only_on_success(journal: Journal) -> None:
    p = plan_for()
    journal.begin("orders", REV1, p)
    journal.finish("orders", Outcome.SUCCESS, "ok", applied_spec=p.desired, job_id="n" * 32)
    journal.begin("orders", REV2, p)
    journal.finish("orders", Outcome.FAILURE, "rolled back", applied_spec=p.desired)
    rec = journal.record("orders")
    assert rec is not None
    assert rec.last_applied_revision == REV1
    assert rec.last_applied_spec == p.desired
    assert rec.last_attempted_revision == REV2
    assert (rec.last_outcome, rec.last_message) == (Outcome.FAILURE, "rolled back")
    assert rec.job_id == "n" * 32  # KEEP by default
    assert journal.inflight("orders") is None
    journal.begin("orders", REV2, p)
    journal.finish("orders", Outcome.SUCCESS, "suspended", applied_spec=p.desired, job_id=None)
    rec = journal.record("orders")
    assert rec is not None and rec.job_id is None and rec.last_applied_revision == REV2


def test_attempts_count_per_revision(journal: Journal) -> None:
    for rev, expected in [(REV1, 1), (REV1, 2), (REV1, 3), (REV2, 1)]:
        journal.begin("orders", rev, plan_for())
        rec = journal.record("orders")
        assert rec is not None and rec.attempts == expected
        journal.finish("orders", Outcome.FAILURE, "x", applied_spec=None)


def test_record_attempt_is_idempotent_per_tick(journal: Journal) -> None:
    for _ in range(3):
        journal.record_attempt("orders", REV1, Outcome.FAILURE, "blocked: wait", action="blocked")
    rec = journal.record("orders")
    assert rec is not None and rec.attempts == 1 and rec.last_outcome is Outcome.FAILURE
    assert len(journal.history("orders")) == 1
    journal.record_attempt("orders", REV1, Outcome.ERROR, "invalid spec", action="error")
    rec = journal.record("orders")
    assert rec is not None and rec.attempts == 2 and rec.last_outcome is Outcome.ERROR


def test_record_attempt_keeps_a_failed_spec_refused_but_does_not_invent_one(journal: Journal) -> None:
    p = plan_for()
    journal.begin("orders", REV1, p)
    journal.finish("orders", Outcome.FAILURE, "rolled back", applied_spec=None)
    journal.record_attempt("orders", REV2, Outcome.FAILURE, "this spec already failed", action="blocked")
    rec = journal.record("orders")
    assert rec is not None and rec.last_attempted_spec_hash == spec_hash(p.desired or {})
    # A blocked answer after a success must not look like "this spec failed" to the planner.
    journal.begin("other", REV1, plan_for("other"))
    journal.finish("other", Outcome.SUCCESS, "ok", applied_spec=None)
    journal.record_attempt("other", REV2, Outcome.FAILURE, "needs a human", action="blocked")
    rec = journal.record("other")
    assert rec is not None and rec.last_attempted_spec_hash is None


def test_forget_drops_the_record_but_keeps_history(journal: Journal) -> None:
    journal.begin("orders", REV1, plan_for())
    journal.add_savepoint("orders", "file:/sp/savepoint-1", job_id="o" * 32, revision=REV1)
    journal.forget("orders")
    assert journal.record("orders") is None
    assert journal.inflight("orders") is None
    journal.step_done("orders", 0)  # a step finishing after ForgetApp is a no-op, not an error
    journal.finish("orders", Outcome.SUCCESS, "forgotten", applied_spec=None)
    assert journal.record("orders") is None  # finishing does not resurrect it
    assert [t.action for t in journal.history("orders")] == ["upgrade", "savepoint", "forget", "finish"]


def test_savepoint_history_is_ordered_and_deduplicated(journal: Journal, clock: FakeClock) -> None:
    for i in range(3):
        journal.add_savepoint("orders", f"file:/sp/savepoint-{i}", job_id=f"{i}" * 32, revision=REV1)
        clock.advance(60)
    journal.add_savepoint("orders", "file:/sp/savepoint-1", job_id="1" * 32, revision=REV1)
    rec = journal.record("orders")
    assert rec is not None
    assert [s.path for s in rec.savepoints] == [f"file:/sp/savepoint-{i}" for i in range(3)]
    assert rec.latest_savepoint is not None and rec.latest_savepoint.path == "file:/sp/savepoint-2"
    assert journal.records().apps["orders"] == rec


def test_retention_keeps_the_newest_and_the_restore_point_and_deletes_local_dirs(
    journal: Journal, clock: FakeClock, tmp_path: Path
) -> None:
    dirs = []
    for i in range(5):
        d = tmp_path / "savepoints" / f"savepoint-abc123-{i:012x}"
        d.mkdir(parents=True)
        (d / "_metadata").write_text("x")
        dirs.append(d)
    journal.begin("orders", REV1, plan_for())
    locations = [f"file:{dirs[0]}", str(dirs[1]), f"file://{dirs[2]}", f"file:{dirs[3]}", f"file:{dirs[4]}"]
    for loc in locations:
        journal.add_savepoint("orders", loc, job_id="o" * 32, revision=REV1)
        clock.advance(10)
    journal.add_savepoint("orders", "s3://bucket/sp/savepoint-remote", job_id="o" * 32, revision=REV1,
                          taken_at=clock.now() - timedelta(hours=1))
    # The execution in flight restores from the second-oldest: it must survive any retention.
    journal.step_done("orders", 0, captured_path=locations[1], captured_kind="savepoint")
    pruned = journal.prune_savepoints("orders", 2)
    assert sorted(p.path for p in pruned) == sorted([locations[0], locations[2], "s3://bucket/sp/savepoint-remote"])
    rec = journal.record("orders")
    assert rec is not None
    assert {s.path for s in rec.savepoints} == {locations[1], locations[3], locations[4]}
    assert [d.exists() for d in dirs] == [False, True, False, True, True]
    assert journal.prune_savepoints("orders", 2) == []  # stable


def test_retention_never_prunes_the_latest_even_with_retain_below_one(journal: Journal, clock: FakeClock) -> None:
    for i in range(3):
        journal.add_savepoint("orders", f"/nowhere/savepoint-{i}", job_id=None, revision=REV1)
        clock.advance(1)
    journal.prune_savepoints("orders", 0)
    rec = journal.record("orders")
    assert rec is not None and [s.path for s in rec.savepoints] == ["/nowhere/savepoint-2"]


def test_adopted_checkpoints_are_forgotten_but_not_deleted(journal: Journal, clock: FakeClock, tmp_path: Path) -> None:
    chk = tmp_path / "savepoint-looking-checkpoint"
    chk.mkdir()
    journal.add_savepoint("orders", str(chk), job_id=None, revision=REV1, kind="checkpoint")
    clock.advance(1)
    journal.add_savepoint("orders", "/sp/savepoint-new", job_id=None, revision=REV1)
    assert [p.path for p in journal.prune_savepoints("orders", 1)] == [str(chk)]
    assert chk.exists()


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("file:/data/sp/savepoint-1a2b3c-0123456789ab", "/data/sp/savepoint-1a2b3c-0123456789ab"),
        ("file:///data/sp/savepoint-x", "/data/sp/savepoint-x"),
        ("file://localhost/data/sp/savepoint-x", "/data/sp/savepoint-x"),
        ("/data/sp/savepoint-x", "/data/sp/savepoint-x"),
        ("file://otherhost/data/sp/savepoint-x", None),
        ("s3://bucket/sp/savepoint-x", None),
        ("hdfs:///sp/savepoint-x", None),
        ("relative/savepoint-x", None),
        ("file:/data/sp", None),  # not a savepoint directory name: never deleted
        ("/", None),
        ("/data/sp/savepoint-x/../../etc", None),
    ],
)
def test_local_savepoint_dir(location: str, expected: str | None) -> None:
    got = local_savepoint_dir(location)
    assert (str(got) if got else None) == expected


def test_history_lists_transitions_with_times(journal: Journal, clock: FakeClock) -> None:
    p = plan_for()
    journal.begin("orders", REV1, p)
    clock.advance(5)
    journal.finish("orders", Outcome.SUCCESS, "applied", applied_spec=p.desired)
    hist = journal.history("orders")
    assert [(t.action, t.outcome, t.revision) for t in hist] == [
        ("upgrade", Outcome.PENDING, REV1), ("finish", Outcome.SUCCESS, REV1)]
    assert hist[1].at - hist[0].at == timedelta(seconds=5)
    assert journal.history("nobody") == []


def test_lock_refuses_a_second_holder_naming_file_and_pid(journal: Journal, tmp_path: Path, clock: FakeClock) -> None:
    other = Journal(journal.path, clock)
    try:
        with journal.lock_exclusive():
            with pytest.raises(JournalError) as err, other.lock_exclusive():
                pass
            assert str(journal.lock_path) in str(err.value)
            assert f"pid {os.getpid()}" in str(err.value)
        with other.lock_exclusive():  # released on exit
            pass
    finally:
        other.close()


def test_lock_held_by_another_process(journal: Journal) -> None:
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from reconciler.apply.journal import Journal
        from reconciler.clock import FakeClock
        j = Journal(Path({str(journal.path)!r}), FakeClock())
        with j.lock_exclusive():
            print("locked", flush=True)
            sys.stdin.readline()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[2], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(JournalError, match=rf"pid {proc.pid}\)"), journal.lock_exclusive():
            pass
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=30)
    with journal.lock_exclusive():  # the holder exited: free again
        pass


def _record_file(journal: Journal, app: str = "orders") -> Path:
    return journal.path.parent / "records" / f"{app}.json"


def test_records_live_in_one_file_per_app_beside_the_runtime(journal: Journal) -> None:
    journal.begin("orders", REV1, plan_for())
    journal.add_savepoint("orders", "file:/sp/savepoint-1", job_id="o" * 32, revision=REV1)
    doc = json.loads(_record_file(journal).read_text())
    assert (doc["kind"], doc["version"], doc["app"]) == ("FlinkReconcilerRecord", SCHEMA_VERSION, "orders")
    assert doc["inflight"]["revision"] == REV1 and doc["savepoints"][0]["path"] == "file:/sp/savepoint-1"
    assert not list(_record_file(journal).parent.glob(".*.tmp"))  # written atomically, no temp file left


def test_a_new_journal_on_the_same_records_sees_everything(journal: Journal, clock: FakeClock) -> None:
    """What a new process (or pod) sees: nothing lives only in the old process."""
    journal.begin("orders", REV1, plan_for())
    journal.step_done("orders", 0, captured_path="file:/sp/savepoint-1", captured_kind="savepoint")
    other = Journal(journal.path, clock)
    inf = other.inflight("orders")
    assert inf is not None and inf.captured_path == "file:/sp/savepoint-1"
    assert other.records() == journal.records()


def test_a_record_of_a_newer_version_blocks_its_app_only_and_is_never_written(journal: Journal,
                                                                              clock: FakeClock) -> None:
    journal.begin("orders", REV1, plan_for())
    journal.begin("billing", REV1, plan_for("billing"))
    path = _record_file(journal)
    doc = json.loads(path.read_text())
    doc["version"] = 99
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    other = Journal(journal.path, clock)
    records = other.records()
    assert set(records.apps) == {"billing"}
    why = records.broken["orders"]
    assert "written by a newer flink-reconciler (record version 99" in why and str(path.parent) in why
    assert "upgrade" in why and "record rebuild" not in why
    assert other.inflight("orders") is None and set(other.all_inflight()) == {"billing"}
    writes: list[Callable[[], object]] = [
        lambda: other.record_attempt("orders", REV1, Outcome.FAILURE, "x", action="blocked"),
        lambda: other.note("orders", "x", "y"), lambda: other.begin("orders", REV1, plan_for()),
        lambda: other.forget("orders")]
    for write in writes:
        with pytest.raises(JournalError, match="not writing the record of app orders"):
            write()
    other.set_source_file("billing", "apps/billing.yaml")  # the other apps' records are written as usual
    assert path.read_bytes() == before  # byte for byte


@pytest.mark.parametrize("content", [b"this is not json at all", b"[1, 2]", b'{"kind": "Something", "version": 1}',
                                     b'{"kind": "FlinkReconcilerRecord", "version": 1, "app": "orders", "rec',
                                     b'{"kind": "FlinkReconcilerRecord", "version": 1, "app": "orders", '
                                     b'"record": {"last_outcome": "exploded"}}',
                                     b'{"kind": "FlinkReconcilerRecord", "version": 1, "app": "orders", '
                                     b'"inflight": {"revision": "x"}}'])
def test_a_corrupt_record_blocks_its_app_only_naming_it(journal: Journal, clock: FakeClock, content: bytes) -> None:
    journal.begin("billing", REV1, plan_for("billing"))
    path = _record_file(journal)
    path.write_bytes(content)
    other = Journal(journal.path, clock)
    records = other.records()
    assert set(records.apps) == {"billing"} and set(records.broken) == {"orders"}
    assert str(path) in records.broken["orders"] or (str(path.parent) in records.broken["orders"]
                                                     and "app 'orders'" in records.broken["orders"])
    assert "flink-reconciler record rebuild orders" in records.broken["orders"]
    with pytest.raises(JournalError, match="not writing the record of app orders"):
        other.record_attempt("orders", REV1, Outcome.FAILURE, "x", action="blocked")
    assert path.read_bytes() == content
    path.unlink()  # repaired (here: removed) by a human: the app is an app without a record again
    assert other.records().broken == {} and other.record("orders") is None


def test_a_record_that_breaks_between_read_and_write_is_not_overwritten(journal: Journal, clock: FakeClock) -> None:
    journal.begin("orders", REV1, plan_for())
    path = _record_file(journal)
    path.write_bytes(b'{"kind": "FlinkReconcilerRecord", "vers')  # a hand edit gone wrong, after our read
    with pytest.raises(RecordConflictError):
        journal.step_started("orders", 0)
    assert path.read_bytes() == b'{"kind": "FlinkReconcilerRecord", "vers'
    assert "orders" in journal.broken()
    with pytest.raises(JournalError, match="not writing"):
        journal.step_started("orders", 0)


def test_a_second_writer_is_refused_instead_of_overwritten(journal: Journal, clock: FakeClock) -> None:
    journal.begin("orders", REV1, plan_for())
    other = Journal(journal.path, clock)
    assert other.inflight("orders") is not None  # both have read the same version
    journal.step_started("orders", 0)
    with pytest.raises(RecordConflictError):
        other.set_scratch("orders", trigger_id="from-the-other-writer")
    inf = Journal(journal.path, clock).inflight("orders")
    assert inf is not None and inf.trigger_id is None and inf.phase is StepPhase.STARTED
    other.refresh()  # after re-reading, the other writer may go on
    other.set_scratch("orders", trigger_id="t-2")
    assert Journal(journal.path, clock).inflight("orders").trigger_id == "t-2"  # type: ignore[union-attr]


def test_idle_ticks_do_not_write(journal: Journal) -> None:
    """The daemon meets a blocked app every tick: the record must not be rewritten each time."""
    journal.set_source_file("orders", "apps/orders.yaml")  # no record yet: none is made for this
    assert not _record_file(journal).exists()
    journal.record_attempt("orders", REV1, Outcome.FAILURE, "blocked: x", action="blocked",
                           source_file="apps/orders.yaml")
    stamp = _record_file(journal).stat()
    for _ in range(3):
        journal.record_attempt("orders", REV1, Outcome.FAILURE, "blocked: x", action="blocked")
        journal.set_source_file("orders", "apps/orders.yaml")
    again = _record_file(journal).stat()
    assert (again.st_ino, again.st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)
    journal.record_attempt("orders", REV1, Outcome.FAILURE, "blocked: y", action="blocked")
    assert _record_file(journal).stat().st_ino != stamp.st_ino  # a real change is written


def test_lineage_names_what_each_execution_restored_and_produced(journal: Journal, clock: FakeClock) -> None:
    p = plan_for()
    journal.begin("orders", REV1, p)
    journal.add_savepoint("orders", "file:/sp/savepoint-1", job_id="o" * 32, revision=REV1)
    journal.step_done("orders", 0, captured_path="file:/sp/savepoint-1", captured_kind="savepoint")
    journal.set_scratch("orders", restored_from="file:/sp/savepoint-1")
    clock.advance(3)
    got = journal.finish("orders", Outcome.SUCCESS, "applied", applied_spec=p.desired, job_id="n" * 32)
    assert got is not None
    assert (got.revision, got.action, got.outcome, got.restored_from, got.savepoints, got.job_id) == (
        REV1, "upgrade", Outcome.SUCCESS, "file:/sp/savepoint-1", ("file:/sp/savepoint-1",), "n" * 32)
    assert journal.lineage("orders") == [got]


def test_history_is_capped(journal: Journal) -> None:
    for i in range(MAX_TRANSITIONS + 20):
        journal.note("orders", "note", f"line {i}")
    hist = journal.history("orders")
    assert len(hist) == MAX_TRANSITIONS and hist[-1].message == f"line {MAX_TRANSITIONS + 19}"


def test_threads_share_one_journal(journal: Journal) -> None:
    names = [f"app-{i}" for i in range(8)]

    def work(name: str) -> None:
        journal.begin(name, REV1, plan_for(name))
        for i in range(3):
            journal.step_started(name, i)
            journal.step_done(name, i)
        journal.finish(name, Outcome.SUCCESS, "ok", applied_spec={"n": name})

    threads = [threading.Thread(target=work, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    recs = journal.records()
    assert sorted(recs.apps) == names
    assert all(r.last_outcome is Outcome.SUCCESS and r.last_applied_spec == {"n": r.name} for r in recs.apps.values())
    assert journal.all_inflight() == {}


def test_an_adopted_running_job_is_recorded_as_applied_once(journal: Journal) -> None:
    spec = plan_for().desired
    assert spec is not None
    journal.record_adopted("orders", REV1, spec, source_file="apps/orders.yaml")
    journal.record_adopted("orders", REV1, spec, source_file="apps/orders.yaml")  # every pass: one write
    rec = journal.record("orders")
    assert rec is not None
    assert (rec.last_applied_revision, rec.last_applied_spec, rec.last_outcome, rec.source_file) == (
        REV1, spec, Outcome.SUCCESS, "apps/orders.yaml")
    assert [t.action for t in journal.history("orders")] == ["adopt"]


class _CountingStore(FileRecordStore):
    """The real file store, counting its writes."""

    writes = 0

    def put(self, app: str, doc: dict[str, Any], *, expected: str | None) -> str:
        self.writes += 1
        return super().put(app, doc, expected=expected)


def test_an_app_blocked_for_ten_minutes_is_one_history_entry_not_one_per_pass(tmp_path: Path,
                                                                              clock: FakeClock) -> None:
    """Issue 20: the drift pass meets the same blocked app every few seconds, its reason naming a growing age."""
    store = _CountingStore(tmp_path / "state" / "records")
    journal = Journal(tmp_path / "state" / "journal.sqlite", clock, store=store)
    start = clock.now()
    for tick in range(120):  # ten minutes at a 5 s drift interval
        journal.record_attempt("orders", "r1", Outcome.FAILURE, f"the latest checkpoint is {tick * 5}s old",
                               action="blocked")
        clock.advance(5)
    (line,) = journal.history("orders")
    assert (line.action, line.at, line.count) == ("blocked", start, 10)
    assert line.last_seen is not None and (line.last_seen - start).total_seconds() == 540
    assert line.message == "the latest checkpoint is 540s old"  # the words as last written down
    rec = journal.record("orders")
    assert rec is not None and rec.attempts == 1
    assert store.writes <= 11, "a repeat writes the record at most once a minute"
    journal.record_attempt("orders", "r1", Outcome.FAILURE, "job j is FAILED: no checkpoint", action="blocked")
    assert len(journal.history("orders")) == 2, "a different reason is a new entry"


def test_a_repair_counts_in_the_crash_loop_window_and_restarts_the_grace_period(journal: Journal,
                                                                                clock: FakeClock) -> None:
    repair = plan_for().model_copy(update={"action": Action.REPAIR, "repair": "taskmanager"})
    journal.record_attempt("orders", "r0", Outcome.SUCCESS, "adopted", action="adopt")
    journal.mark_health("orders", healthy=False)
    rec = journal.record("orders")
    assert rec is not None and rec.unhealthy_since == clock.now()
    clock.advance(30)
    journal.mark_health("orders", healthy=False)  # already known: the first sighting stays
    assert journal.record("orders").unhealthy_since == clock.now() - timedelta(seconds=30)  # type: ignore[union-attr]
    journal.begin("orders", "r1", repair)
    journal.finish("orders", Outcome.FAILURE, "boom", applied_spec=None)
    rec = journal.record("orders")
    assert rec is not None
    assert rec.repairs == (clock.now(),) and rec.repairs_spec_hash == spec_hash(repair.desired or {})
    assert rec.unhealthy_since is None and rec.last_action == "repair"
    journal.mark_health("orders", healthy=True)
