"""`reconciler.core.rollback`: which state a rollback to a commit restores, what it drops, and its plan.

Table-driven over lineage as the journal records it: an execution's revision, whether it succeeded,
what its job restored (None: it started none), which savepoints it took and which job it left running.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from reconciler.core.observed import ClusterPhase, JobPhase, LiveApp, Outcome, SavepointRecord
from reconciler.core.plan import (
    AwaitHealthy,
    AwaitRunning,
    CancelJob,
    EnsureCluster,
    RestoreKind,
    SpecRef,
    StartJob,
    StopWithSavepoint,
)
from reconciler.core.rollback import (
    Refusal,
    RollbackPoint,
    job_revisions,
    plan_rollback,
    protected_rollback_points,
    rollback_point,
)
from reconciler.spec.model import FlinkApp
from tests.apply.fakes import make_app

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
A, B, C, D = ("a" * 40, "b" * 40, "c" * 40, "d" * 40)


@dataclass(frozen=True)
class Ex:
    revision: str
    at: datetime
    action: str
    outcome: Outcome
    restored_from: str | None
    savepoints: tuple[str, ...]
    job_id: str | None


def t(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def sp(path: str, minutes: int, job: str | None, rev: str | None, kind: str = "savepoint") -> SavepointRecord:
    return SavepointRecord(path=path, taken_at=t(minutes), job_id=job, revision=rev, kind=kind)


# create at A (job ja), upgrade to B (stop ja -> sp1, job jb), upgrade to C (stop jb -> sp2, job jc)
LINEAGE = [
    Ex(A, t(0), "create", Outcome.SUCCESS, "", (), "ja"),
    Ex(B, t(10), "upgrade", Outcome.SUCCESS, "sp1", ("sp1",), "jb"),
    Ex(C, t(20), "upgrade", Outcome.SUCCESS, "sp2", ("sp2",), "jc"),
]
SAVEPOINTS = [sp("sp1", 10, "ja", B), sp("sp2", 20, "jb", C)]


def test_each_job_belongs_to_the_revision_whose_spec_it_ran() -> None:
    assert job_revisions(LINEAGE) == {"ja": A, "jb": B, "jc": C}
    # A failed upgrade to D rolled back: its job runs C's spec again, not D's.
    failed = [*LINEAGE, Ex(D, t(30), "upgrade", Outcome.FAILURE, "sp3", ("sp3",), "jc2")]
    assert job_revisions(failed)["jc2"] == C


def test_the_rollback_point_is_the_savepoint_taken_when_the_revision_was_left() -> None:
    point = rollback_point(A, LINEAGE, SAVEPOINTS)
    assert isinstance(point, RollbackPoint)
    assert point.savepoint.path == "sp1"  # recorded under B: the upgrade that left A took it
    assert "job ja" in point.how and f"when revision {B[:12]} replaced it" in point.how
    assert [s.path for s in point.newer] == ["sp2"]
    point_b = rollback_point(B, LINEAGE, SAVEPOINTS)
    assert isinstance(point_b, RollbackPoint) and point_b.savepoint.path == "sp2" and point_b.newer == ()


def test_a_newer_manual_savepoint_of_the_revisions_job_wins() -> None:
    sps = [sp("m1", 5, "ja", A, kind="manual"), *SAVEPOINTS, sp("m2", 15, "jb", B, kind="manual")]
    point = rollback_point(A, LINEAGE, sps)
    assert isinstance(point, RollbackPoint) and point.savepoint.path == "sp1"
    assert [s.path for s in point.older] == ["m1"]
    point_b = rollback_point(B, LINEAGE, sps)
    assert isinstance(point_b, RollbackPoint) and point_b.savepoint.path == "sp2"
    # Before C's upgrade took sp2, B's newest state was the manual one.
    point_b = rollback_point(B, LINEAGE[:2], [s for s in sps if s.path != "sp2"])
    assert isinstance(point_b, RollbackPoint) and point_b.savepoint.path == "m2" and point_b.savepoint.kind == "manual"


def test_the_job_a_failed_upgrade_rolled_back_to_counts_for_the_old_revision() -> None:
    lineage = [*LINEAGE[:2], Ex(C, t(20), "upgrade", Outcome.FAILURE, "sp2", ("sp2",), "jb2"),
               Ex(D, t(30), "upgrade", Outcome.SUCCESS, "sp3", ("sp3",), "jd")]
    sps = [SAVEPOINTS[0], sp("sp2", 20, "jb", C), sp("sp3", 30, "jb2", D)]
    point = rollback_point(B, lineage, sps)
    assert isinstance(point, RollbackPoint) and point.savepoint.path == "sp3"  # jb2 ran B's spec until D
    refused = rollback_point(C, lineage, sps)
    assert isinstance(refused, Refusal) and "never ran" in refused.reason


def test_without_job_ids_the_savepoint_of_the_next_execution_is_used() -> None:
    lineage = [Ex(e.revision, e.at, e.action, e.outcome, e.restored_from, e.savepoints, None) for e in LINEAGE]
    sps = [sp("sp1", 10, None, B), sp("sp2", 20, None, C)]  # as recovered from git notes
    point = rollback_point(A, lineage, sps)
    assert isinstance(point, RollbackPoint) and point.savepoint.path == "sp1"
    assert f"when {A[:12]} was left" in point.how


@pytest.mark.parametrize(("revision", "lineage", "savepoints", "words"), [
    (D, LINEAGE, SAVEPOINTS, "never ran this app"),
    (C, LINEAGE, SAVEPOINTS, "is what the app runs now"),
    (A, LINEAGE, [SAVEPOINTS[1]], "no savepoint of its job is on record"),
    (A, [], [], "no execution of it is on record"),
    # a failed attempt at D never ran D's spec
    (D, [*LINEAGE, Ex(D, t(30), "upgrade", Outcome.FAILURE, "sp3", ("sp3",), "jc2")], SAVEPOINTS, "never ran"),
])
def test_refusals_say_why(revision: str, lineage: list[Ex], savepoints: list[SavepointRecord], words: str) -> None:
    refused = rollback_point(revision, lineage, savepoints)
    assert isinstance(refused, Refusal), refused
    assert words in refused.reason and revision[:12] in refused.reason


def _live(job: JobPhase = JobPhase.RUNNING, job_id: str | None = "jc") -> LiveApp:
    return LiveApp(name="orders", cluster=ClusterPhase.READY, job_id=job_id, job=job,
                   flink_state="RUNNING" if job is JobPhase.RUNNING else "RESTARTING")


def _point() -> RollbackPoint:
    point = rollback_point(A, LINEAGE, SAVEPOINTS)
    assert isinstance(point, RollbackPoint)
    return point


def test_the_plan_stops_the_current_job_with_a_savepoint_and_starts_the_old_spec_from_the_point() -> None:
    target, current = make_app(parallelism=1), make_app(parallelism=3)
    the_plan = plan_rollback(app="orders", revision=A, target=target, current=current, live=_live(),
                             point=_point(), attempt=4, source_file="apps/orders.yaml")
    ap = the_plan.app("orders")
    assert the_plan.revision == A and the_plan.mode == "live"
    assert [type(s) for s in ap.steps] == [StopWithSavepoint, EnsureCluster, StartJob, AwaitRunning, AwaitHealthy]
    assert isinstance(ap.steps[0], StopWithSavepoint) and ap.steps[0].job_id == "jc"
    start = ap.steps[2]
    assert isinstance(start, StartJob) and start.restore.kind is RestoreKind.PATH and start.restore.path == "sp1"
    assert start.spec is SpecRef.DESIRED and ap.desired == target.canonical() and ap.previous == current.canonical()
    assert [c.path for c in ap.diff] == ["/spec/job/parallelism"]
    # The state it drops, in one risk line: the running job's (kept in step 1's savepoint) and sp2.
    (risk,) = ap.risks
    assert risk.startswith("DISCARDS CURRENT STATE: app orders restarts from sp1")
    assert "running job jc" in risk and "1 newer savepoint(s)" in risk and C[:12] in risk
    # A failed start rolls back to the current spec from the savepoint step 1 took.
    assert ap.rollback_after == 0
    assert [type(s) for s in ap.rollback] == [EnsureCluster, StartJob, AwaitRunning]
    back = ap.rollback[1]
    assert isinstance(back, StartJob) and back.spec is SpecRef.PREVIOUS and back.restore.kind is RestoreKind.CAPTURED
    # Job ids never collide with REV's own (deterministic per attempt, distinct from the undo's).
    again = plan_rollback(app="orders", revision=A, target=target, current=current, live=_live(), point=_point(),
                          attempt=4, source_file=None)
    assert again.app("orders").steps[2] == start
    assert start.job_id not in (back.job_id, "ja")


def test_a_job_that_is_not_running_is_cancelled_and_the_plan_says_so() -> None:
    ap = plan_rollback(app="orders", revision=A, target=make_app(), current=make_app(parallelism=3),
                       live=_live(JobPhase.STARTING), point=_point(), attempt=4, source_file=None).app("orders")
    assert isinstance(ap.steps[0], CancelJob) and ap.rollback == ()
    assert "no savepoint can be taken of it" in ap.risks[0]


def test_no_running_job_and_nothing_newer_drops_nothing() -> None:
    point = rollback_point(B, LINEAGE, SAVEPOINTS)
    assert isinstance(point, RollbackPoint)
    absent = LiveApp(name="orders", cluster=ClusterPhase.ABSENT)
    ap = plan_rollback(app="orders", revision=B, target=make_app(), current=None, live=absent, point=point,
                       attempt=1, source_file=None, head_note="the tip differs").app("orders")
    assert ap.risks == () and isinstance(ap.steps[0], EnsureCluster)
    assert ap.reason.endswith("; the tip differs")


def test_a_target_spec_that_suspends_is_blocked() -> None:
    doc = make_app().canonical()
    suspended = FlinkApp.model_validate({**doc, "spec": {**doc["spec"], "job": {**doc["spec"]["job"],
                                                                                 "state": "suspended"}}})
    ap = plan_rollback(app="orders", revision=A, target=suspended, current=make_app(), live=_live(), point=_point(),
                       attempt=1, source_file=None).app("orders")
    assert ap.action.value == "blocked" and ap.steps == ()


def test_retention_protects_the_rollback_points_of_the_newest_revisions() -> None:
    assert protected_rollback_points(LINEAGE, SAVEPOINTS, window=3) == {"sp1", "sp2"}
    assert protected_rollback_points(LINEAGE, SAVEPOINTS, window=2) == {"sp2"}  # C (none yet) and B
    # A window by age: only revisions that ran since then (the newest always counts).
    assert protected_rollback_points(LINEAGE, SAVEPOINTS, window=10, since=t(5)) == {"sp2"}
    assert protected_rollback_points(LINEAGE, SAVEPOINTS, window=10, since=t(25)) == set()
