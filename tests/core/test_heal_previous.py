"""Issue 35: an upgrade that failed while its old job died too. Git's spec already failed (not retried until Git
changes it), nothing runs: the last applied spec runs again from its newest state, under the same rules as any
repair (never empty, the crash-loop guard under that spec's hash). Pure table tests of `core.heal.heal_previous`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from reconciler.core.observed import AppRecord, Checkpoint, ClusterPhase, JobPhase, LiveApp
from reconciler.core.plan import Action, StartJob, spec_hash
from reconciler.core.planner import plan
from reconciler.spec.model import FlinkApp
from tests.core.builders import BASE, NOW, REV, app, inp, record

P1 = app()  # the last applied spec
P2 = app(job={"args": ["v2"]})  # Git's, whose upgrade failed
H1, H2 = spec_hash(P1.canonical()), spec_hash(P2.canonical())
OLD_JOB, NEW_JOB = "0" * 32, "1" * 32
CKPT = f"file:///state/checkpoints/orders/{OLD_JOB}/chk-41"
SP = "file:///sp/orders/savepoint-1"
STATELESS2 = app(job={"args": ["v2"], "upgradeMode": "stateless"})
START = ("EnsureCluster", "StartJob", "AwaitRunning")


def failed(**kw: Any) -> AppRecord:
    """The record right after the failed upgrade of P2 (stop failed; or rolled back and the rollback failed too)."""
    base: dict[str, Any] = {
        "last_applied_revision": BASE, "last_attempted_revision": REV, "last_attempted_spec_hash": H2,
        "last_outcome": "failure", "last_action": "upgrade", "job_id": OLD_JOB, "job_ids": (OLD_JOB, NEW_JOB),
        "last_message": "stop job 0000 failed: stop-with-savepoint failed: java.io.IOException: disk full",
        "failed_spec_hash": H2, "failed_revision": REV,
        "failed_message": "stop job 0000 failed: stop-with-savepoint failed: java.io.IOException: disk full; the old "
                          f"job keeps running (Flink says job {OLD_JOB} is RUNNING)"}
    base.update(kw)
    return record(**base)


def jobmanager_dead(stored: str | None = CKPT) -> LiveApp:
    """Local runtime: the JobManager was killed (no HA), its job is gone; the retained checkpoint stays."""
    return LiveApp(name="orders", cluster=ClusterPhase.FAILED, cluster_message="JobManager is not running",
                   stored_checkpoint=Checkpoint(path=stored, completed_at=NOW - timedelta(seconds=3)) if stored
                   else None)


def no_job() -> LiveApp:
    """The cluster is up and runs nothing: the new job failed to start, and so did the rollback's."""
    return LiveApp(name="orders", cluster=ClusterPhase.READY)


@dataclass(frozen=True)
class Row:
    id: str
    live: LiveApp
    record: AppRecord
    action: Action
    steps: tuple[str, ...] = ()
    says: tuple[str, ...] = ()
    restores: str | None = None
    desired: FlinkApp = P2
    previous: FlinkApp | None = P1
    extra: dict[str, Any] = field(default_factory=dict)
    healed: bool = True  # planned as a heal of the last applied spec


FAILED_BEFORE = "this spec already failed at revision bbbbbbbbbbbb: stop job 0000 failed"
ROWS = [
    Row("a stop that failed, then the JobManager killed: the last applied spec from the newest checkpoint",
        jobmanager_dead(), failed(), Action.REPAIR, START,
        (FAILED_BEFORE, "it is not retried until Git changes it",
         "Meanwhile the last applied spec (revision aaaaaaaaaaaa) runs again: drift: ",
         "restarting from the newest retained checkpoint"), CKPT),
    Row("the new job could not start and the rollback could not restart the old one: from the stop's savepoint",
        no_job(), failed(job_id=None, savepoint_age=timedelta(minutes=1)),
        Action.REPAIR, START, (FAILED_BEFORE, "runs again", "its last savepoint on record"), SP),
    Row("no state anywhere: blocked, and the status says both facts",
        jobmanager_dead(stored=None), failed(), Action.BLOCKED, (),
        (FAILED_BEFORE, "Not retrying in a loop",
         "And the last applied spec (revision aaaaaaaaaaaa) cannot run again by itself either:",
         "there is no retained checkpoint", "To proceed")),
    Row("the crash-loop guard counts repairs under the last applied spec's hash",
        jobmanager_dead(), failed(repairs=tuple(NOW - timedelta(minutes=m) for m in (9, 7, 5, 3, 1)),
                                  repairs_spec_hash=H1),
        Action.BLOCKED, (), (FAILED_BEFORE, "crash loop: 5 automatic repairs within 10m")),
    Row("and backs off under it",
        jobmanager_dead(), failed(repairs=(NOW - timedelta(seconds=4),), repairs_spec_hash=H1), Action.NOOP, (),
        (FAILED_BEFORE, "attempt 2 waits until 12:00:06 UTC")),
    Row("repairs counted under the failed spec's hash are not the last applied spec's",
        jobmanager_dead(), failed(repairs=tuple(NOW - timedelta(minutes=m) for m in (9, 7, 5, 3, 1)),
                                  repairs_spec_hash=H2),
        Action.REPAIR, START, (), CKPT),
    Row("Flink recovering the last applied spec's job: its grace period first",
        LiveApp(name="orders", cluster=ClusterPhase.READY, job_id=OLD_JOB, flink_state="RESTARTING",
                job=JobPhase.STARTING),
        failed(unhealthy_since=NOW - timedelta(seconds=20)), Action.NOOP, (),
        (FAILED_BEFORE, "recovering since 2026-06-01 11:59:40 UTC")),
    Row("a repair ran since (last_attempted_* rewritten): the failed spec is still not retried, the job runs",
        LiveApp(name="orders", cluster=ClusterPhase.READY, job_id="2" * 32, flink_state="RUNNING",
                job=JobPhase.RUNNING),
        failed(last_outcome="success", last_action="repair", last_attempted_spec_hash=H1, last_message="repaired"),
        Action.BLOCKED, (), (FAILED_BEFORE, "Not retrying in a loop"), healed=False),
    Row("a restartNonce bump retries the failed spec, from the same newest state (and says so)",
        jobmanager_dead(), failed(), Action.REPAIR, START, ("restarting from the newest retained checkpoint",), CKPT,
        desired=app(job={"args": ["v2"], "restartNonce": 1}), extra={"risk": "RESTORES FROM CHECKPOINT"}, healed=False),
    Row("a failed create has no last applied spec to go back to: blocked",
        jobmanager_dead(), failed(last_applied_revision=None, last_action="create"), Action.BLOCKED, (),
        (FAILED_BEFORE,), previous=None, healed=False),
    Row("a stateless last applied spec starts again empty, and says so",
        jobmanager_dead(stored=None), failed(failed_spec_hash=spec_hash(STATELESS2.canonical())), Action.REPAIR,
        START, ("runs again",), None, desired=STATELESS2, previous=app(job={"upgradeMode": "stateless"}),
        extra={"risk": "STARTS WITHOUT STATE"}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_heal_the_last_applied_spec_table(row: Row) -> None:
    prev = [row.previous] if row.previous else []
    p = plan(inp([row.desired], prev, [row.live], [row.record])).app("orders")
    assert p.action is row.action, p.reason
    assert tuple(s.type for s in p.steps) == row.steps, p.reason
    for text in row.says:
        assert text in p.reason, p.reason
    starts = [s for s in p.steps if isinstance(s, StartJob)]
    for s in starts:
        assert s.restore.path == row.restores, "the newest state of the last applied spec's job"
    if not row.healed:
        assert p.failed is None and p.desired == row.desired.canonical()
    elif row.previous is not None:
        if row.action is Action.REPAIR:
            assert "keeps running" not in p.reason, "said of the moment the stop failed, not true now"
        assert p.desired == row.previous.canonical() and not p.diff, "what runs is the last applied spec"
        assert p.failed is not None and p.failed.startswith(FAILED_BEFORE), p.failed
        assert p.desired_revision == BASE and p.repair is not None
    if "risk" in row.extra:
        assert any(row.extra["risk"] in r for r in p.risks), p.risks
    elif row.action is Action.REPAIR:
        assert not p.risks, "the spec that ran, from its own newest state: Flink's HA, not a risk"


def test_the_repair_starts_a_new_job_id_not_the_failed_upgrades() -> None:
    p = plan(inp([P2], [P1], [jobmanager_dead()], [failed(attempts=1)])).app("orders")
    start = next(s for s in p.steps if isinstance(s, StartJob))
    upgrade = plan(inp([P2], [P1], [jobmanager_dead()], [record()])).app("orders")
    first = next(s for s in upgrade.steps if isinstance(s, StartJob))
    assert start.job_id != first.job_id, "attempt 2 at this revision: a job id of its own"


@pytest.mark.parametrize(("ha_job", "rejoined"), [(OLD_JOB, True), (NEW_JOB, False)])
def test_flinks_ha_data_is_rejoined_only_for_the_job_the_record_says_runs(ha_job: str, rejoined: bool) -> None:
    """Kubernetes HA: the JobManager's workload deleted. HA data of the old job resumes it; HA data of the failed
    spec's new job is never rejoined under the last applied spec."""
    gone = LiveApp(name="orders", cluster=ClusterPhase.STARTING, missing_processes=("jobmanager",), ha_job_id=ha_job)
    rec = failed(savepoint_age=timedelta(minutes=1))
    p = plan(inp([P2], [P1], [gone], [rec])).app("orders")
    assert p.action is Action.REPAIR, p.reason
    start = next(s for s in p.steps if isinstance(s, StartJob))
    assert (start.job_id == ha_job) is rejoined
    assert p.desired == P1.canonical()


def test_a_record_from_before_the_failed_spec_field_still_blocks_the_failed_spec() -> None:
    old = failed(failed_spec_hash=None, failed_revision=None, failed_message=None)
    p = plan(inp([P2], [P1], [jobmanager_dead()], [old])).app("orders")
    assert p.action is Action.REPAIR and p.desired == P1.canonical(), p.reason
    running = LiveApp(name="orders", cluster=ClusterPhase.READY, job_id=OLD_JOB, flink_state="RUNNING",
                      job=JobPhase.RUNNING)
    p = plan(inp([P2], [P1], [running], [old])).app("orders")
    assert p.action is Action.BLOCKED and p.reason.startswith("this spec already failed"), p.reason
