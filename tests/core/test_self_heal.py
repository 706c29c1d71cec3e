"""Issue 20: the planner heals routine faults by itself (docs/plan.md#self-healing). Pure table tests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from reconciler.core.observed import AppRecord, Checkpoint, ClusterPhase, JobPhase, LiveApp
from reconciler.core.plan import Action, AwaitRunning, EnsureCluster, SpecRef, StartJob, reason_key, spec_hash
from reconciler.core.planner import Policy, plan
from tests.core.builders import NOW, app, inp, record

P1 = app()
P2 = app(job={"args": ["v2"]})
JOB = "j" * 32
OLD_JOB = "0" * 32
CKPT = f"file:///state/checkpoints/orders/{JOB}/chk-41"
FOREIGN_CKPT = f"file:///state/checkpoints/orders/{'f' * 32}/chk-3"
H = spec_hash(P1.canonical())


def live(*, cluster: ClusterPhase = ClusterPhase.READY, state: str | None = "RESTARTING",
         missing: tuple[str, ...] = (), stored_ck: str | None = None, ckpt_age: timedelta | None = None,
         exception: str | None = None, job_id: str | None = JOB) -> LiveApp:
    phase = {None: JobPhase.NONE, "RESTARTING": JobPhase.STARTING, "CREATED": JobPhase.STARTING,
             "FAILING": JobPhase.FAILING, "FAILED": JobPhase.FAILING, "RUNNING": JobPhase.STARTING}[state]
    return LiveApp(
        name="orders", cluster=cluster, job_id=job_id if state else None, flink_state=state, job=phase,
        missing_processes=missing, job_exception=exception,
        latest_checkpoint=(Checkpoint(path=CKPT, completed_at=NOW - ckpt_age)
                           if ckpt_age is not None and state else None),
        stored_checkpoint=Checkpoint(path=stored_ck, completed_at=NOW - timedelta(seconds=3)) if stored_ck else None,
    )


def rec(*, unhealthy_for: timedelta | None = None, repairs: tuple[timedelta, ...] = (), **kw: Any) -> AppRecord:
    return record(unhealthy_since=NOW - unhealthy_for if unhealthy_for is not None else None,
                  repairs=tuple(NOW - r for r in repairs), repairs_spec_hash=H if repairs else None,
                  job_ids=(JOB,), **kw)


@dataclass(frozen=True)
class Row:
    id: str
    live: LiveApp
    record: AppRecord | None
    action: Action
    steps: tuple[str, ...] = ()
    reason: str = ""
    desired: object = P1
    repair: str | None = None


START = ("EnsureCluster", "StartJob", "AwaitRunning")
ROWS = [
    Row("a TaskManager died: restarted at once on the live cluster, the job recovers by itself",
        live(cluster=ClusterPhase.STARTING, missing=("taskmanager-0",)), rec(), Action.REPAIR,
        ("EnsureCluster", "AwaitRunning"), "taskmanager-0 not running", repair="taskmanager"),
    Row("a TaskManager died but the job runs on (spare slots): the process is restarted all the same",
        live(cluster=ClusterPhase.STARTING, missing=("taskmanager-1",), state="RUNNING")
        .model_copy(update={"job": JobPhase.RUNNING}), rec(), Action.REPAIR, ("EnsureCluster", "AwaitRunning"),
        "taskmanager-1 not running", repair="taskmanager"),
    Row("Flink restarting the job within the grace period: wait, and say since when",
        live(), rec(unhealthy_for=timedelta(seconds=20)), Action.NOOP, (),
        "recovering since 2026-06-01 11:59:40 UTC: Flink is recovering job", repair="recovering"),
    Row("first sight of the restart: the grace period starts now",
        live(state="CREATED"), rec(), Action.NOOP, (), "by 12:01:00 UTC (recovery.gracePeriod 60s)"),
    Row("still restarting after the grace period: cancel, restart from its latest checkpoint",
        live(ckpt_age=timedelta(seconds=2)), rec(unhealthy_for=timedelta(seconds=61)), Action.REPAIR,
        ("CancelJob", *START), f"restarting from the latest checkpoint of job {JOB}", repair="job"),
    Row("a FAILED job (Flink gave up) is repaired at once from its latest checkpoint",
        live(state="FAILED", ckpt_age=timedelta(seconds=5)), rec(), Action.REPAIR, ("CancelJob", *START),
        "latest checkpoint", repair="job"),
    Row("the JobManager died (no HA): a new cluster, the job from its newest retained checkpoint",
        live(cluster=ClusterPhase.FAILED, state=None, stored_ck=CKPT), rec(), Action.REPAIR, START,
        "newest retained checkpoint", repair="jobmanager"),
    Row("the cluster vanished: recreated, the job from the savepoint on record when nothing is newer",
        LiveApp(name="orders", cluster=ClusterPhase.ABSENT), rec(savepoint_age=timedelta(hours=1)), Action.REPAIR,
        START, "last savepoint on record", repair="cluster"),
    Row("the JobManager forgot its job (READY, no job): restarted from the newest state",
        live(state=None, stored_ck=CKPT), rec(), Action.REPAIR, START, "newest retained checkpoint", repair="job"),
    Row("a checkpoint of a job this app never ran is not restored from",
        live(cluster=ClusterPhase.FAILED, state=None, stored_ck=FOREIGN_CKPT), rec(), Action.BLOCKED, (),
        "belongs to a job this app never ran"),
    Row("maxCheckpointAge set and exceeded: blocked (opt-in)",
        live(state="FAILED", ckpt_age=timedelta(hours=2)), rec(), Action.BLOCKED, (),
        "older than maxCheckpointAge 10m", desired=app(job={"maxCheckpointAge": "10m"})),
    Row("backoff: a second repair right after the first waits",
        live(state="FAILED", ckpt_age=timedelta(seconds=5)), rec(repairs=(timedelta(seconds=4),)), Action.NOOP, (),
        "attempt 2 waits until 12:00:06 UTC (backoff 10s", repair="job"),
    Row("backoff doubles: the third waits 20 s after the second",
        live(state="FAILED", ckpt_age=timedelta(seconds=5)),
        rec(repairs=(timedelta(seconds=60), timedelta(seconds=15))), Action.NOOP, (), "backoff 20s"),
    Row("backoff over: the next repair runs",
        live(state="FAILED", ckpt_age=timedelta(seconds=5)), rec(repairs=(timedelta(seconds=11),)), Action.REPAIR,
        ("CancelJob", *START)),
    Row("crash loop: five repairs in ten minutes fail the app with Flink's error, no more restarts",
        live(state="FAILED", ckpt_age=timedelta(seconds=5), exception="java.lang.IllegalStateException: boom"),
        rec(repairs=tuple(timedelta(minutes=m) for m in (9, 7, 5, 3, 1))), Action.BLOCKED, (),
        "crash loop: 5 automatic repairs within 10m did not keep the job running; last error: "
        "java.lang.IllegalStateException: boom. Not restarting it again: push a fix, or bump "
        "spec.job.restartNonce", repair="job"),
    Row("repairs older than the window do not count",
        live(state="FAILED", ckpt_age=timedelta(seconds=5)),
        rec(repairs=tuple(timedelta(minutes=m) for m in (59, 50, 40, 30, 20))), Action.REPAIR, ("CancelJob", *START)),
    Row("a new spec resets the crash loop: the upgrade restores from the newest state, with a risk line",
        live(state="FAILED", ckpt_age=timedelta(seconds=5)),
        rec(repairs=tuple(timedelta(minutes=m) for m in (9, 7, 5, 3, 1))), Action.UPGRADE,
        ("CancelJob", *START), "while the job is down", desired=P2),
    Row("a failed repair is not 'this spec already failed': the backoff decides",
        live(state="FAILED", ckpt_age=timedelta(seconds=5)),
        rec(repairs=(timedelta(seconds=30),), last_outcome="failure", last_action="repair", last_message="boom",
            last_attempted_spec_hash=H), Action.REPAIR, ("CancelJob", *START)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_self_healing_table(row: Row) -> None:
    assert isinstance(row.desired, type(P1))
    records = [row.record] if row.record else []
    p = plan(inp([row.desired], [P1], [row.live], records)).app("orders")
    assert p.action is row.action, p.reason
    assert tuple(s.type for s in p.steps) == row.steps, p.reason
    assert row.reason in p.reason, p.reason
    if row.repair is not None:
        assert p.repair == row.repair
    if row.action is Action.REPAIR and row.desired is P1:
        assert not p.risks, "repairing the same spec from its own newest state is Flink's HA, not a risk"
    if row.action is Action.UPGRADE:
        assert any("RESTORES FROM CHECKPOINT" in r for r in p.risks), p.risks
    for step in p.steps:
        if isinstance(step, StartJob):
            assert step.restore.path in (CKPT, "file:///sp/orders/savepoint-1"), "never empty state"


def test_a_dead_taskmanager_is_restarted_at_the_spec_that_runs_not_a_new_one() -> None:
    """A change in Git while a TaskManager is dead must not reconfigure the cluster under the running job."""
    applied = rec(last_applied_revision="a" * 40)
    dead_tm = live(cluster=ClusterPhase.STARTING, missing=("taskmanager-1",))
    p = plan(inp([P2], [P1], [dead_tm], [applied])).app("orders")
    assert p.action is Action.REPAIR
    assert p.desired_revision == "a" * 40, "still applied at its own revision, not at Git's head (found by the soak)"
    ensure, wait = p.steps
    assert isinstance(ensure, EnsureCluster) and ensure.spec is SpecRef.PREVIOUS
    assert isinstance(wait, AwaitRunning) and wait.job_id == JOB
    assert p.desired == P1.canonical(), "the repair records what runs as applied, so the change is still planned next"
    assert not p.diff


def test_repairs_of_the_spec_that_runs_count_for_the_crash_loop_while_git_has_a_newer_one() -> None:
    """A TaskManager that cannot be restarted (its configuration gone) while a newer spec waits in Git: each repair
    is recorded under the spec that runs, and the guard counts them there. Found by the chaos soak: the guard
    compared them with the desired spec, found none, and the repair ran on every pass (177 times)."""
    dead_tm = live(cluster=ClusterPhase.STARTING, missing=("taskmanager-0",))
    five = rec(repairs=tuple(timedelta(minutes=m) for m in (9, 7, 5, 3, 1)))
    assert five.repairs_spec_hash == H  # recorded under P1, what runs
    p = plan(inp([P2], [P1], [dead_tm], [five])).app("orders")
    assert p.action is Action.BLOCKED and p.reason.startswith("crash loop: 5 automatic repairs"), p.reason
    one = rec(repairs=(timedelta(seconds=2),))
    p = plan(inp([P2], [P1], [dead_tm], [one])).app("orders")
    assert p.action is Action.NOOP and "backoff" in p.reason, p.reason


def test_the_policy_sets_the_crash_loop_limits() -> None:
    two = Policy(repair_max_attempts=2, repair_window=timedelta(minutes=1), repair_backoff=timedelta(seconds=1))
    failing = live(state="FAILED", ckpt_age=timedelta(seconds=5))
    i = inp([P1], [P1], [failing], [rec(repairs=(timedelta(seconds=40), timedelta(seconds=20)))], policy=two)
    assert plan(i).app("orders").action is Action.BLOCKED
    i = inp([P1], [P1], [failing], [rec(repairs=(timedelta(seconds=90), timedelta(seconds=70)))], policy=two)
    assert plan(i).app("orders").action is Action.REPAIR


@pytest.mark.parametrize(("a", "b", "same"), [
    ("the latest checkpoint is 12s old", "the latest checkpoint is 13s old", True),
    ("recovering since 11:59:40 UTC", "recovering since 11:59:41 UTC", True),
    ("job 1 is FAILED", "job 1 is RESTARTING", False),
])
def test_a_reason_said_again_with_other_numbers_is_the_same_reason(a: str, b: str, same: bool) -> None:
    assert (reason_key(a) == reason_key(b)) is same


# Kubernetes: a deleted JobManager workload (or a deleted cluster) whose job Flink keeps HA data of.
SP = "file:///sp/orders/savepoint-1"


def gone(cluster: ClusterPhase = ClusterPhase.STARTING, ha_job: str | None = JOB) -> LiveApp:
    missing = ("jobmanager",) if cluster is ClusterPhase.STARTING else ()
    return LiveApp(name="orders", cluster=cluster, missing_processes=missing, ha_job_id=ha_job)


@pytest.mark.parametrize(("cluster", "kind"), [(ClusterPhase.STARTING, "jobmanager"), (ClusterPhase.ABSENT, "cluster")])
def test_a_jobmanager_that_is_gone_restarts_the_same_job_from_its_ha_data_at_once(cluster: ClusterPhase,
                                                                                  kind: str) -> None:
    """Not a new job from the last savepoint on record (a rewind: the latest checkpoint is only in Flink's HA
    data), and no grace period: nothing else brings a deleted workload back."""
    p = plan(inp([P1], [P1], [gone(cluster)], [rec(savepoint_age=timedelta(hours=1))])).app("orders")
    assert p.action is Action.REPAIR and p.repair == kind, p.reason
    assert tuple(s.type for s in p.steps) == START
    start = p.steps[1]
    assert isinstance(start, StartJob) and start.job_id == JOB and start.spec is SpecRef.DESIRED
    assert start.restore.path == SP  # used by Flink only if its HA data has no checkpoint
    assert f"Flink's HA data of job {JOB} remains" in p.reason and not p.risks


def test_ha_data_of_a_job_not_in_the_apps_lineage_is_not_rejoined() -> None:
    p = plan(inp([P1], [P1], [gone(ha_job="f" * 32)], [rec(savepoint_age=timedelta(hours=1))])).app("orders")
    assert p.action is Action.REPAIR
    start = next(s for s in p.steps if isinstance(s, StartJob))
    assert start.job_id != "f" * 32 and "last savepoint on record" in p.reason


def test_a_spec_changed_while_the_jobmanager_is_gone_is_not_rejoined_and_says_what_it_restores() -> None:
    """The HA data holds the old spec's job graph: the upgrade starts a new job, its restore point in the risks."""
    p = plan(inp([P2], [P1], [gone()], [rec(savepoint_age=timedelta(hours=1))])).app("orders")
    start = next(s for s in p.steps if isinstance(s, StartJob))
    assert start.job_id != JOB
    assert any("RESTORES FROM SAVEPOINT" in r for r in p.risks), p.risks


def test_a_stateless_app_without_ha_data_starts_again_empty_and_says_so() -> None:
    stateless = app(job={"upgradeMode": "stateless"})
    p = plan(inp([stateless], [stateless], [gone(ha_job=None)], [rec()])).app("orders")
    assert p.action is Action.REPAIR and p.repair == "jobmanager"
    start = next(s for s in p.steps if isinstance(s, StartJob))
    assert start.restore.path is None and any("STARTS WITHOUT STATE" in r for r in p.risks), p.risks


def test_a_jobmanager_gone_after_a_failed_upgrade_runs_the_last_applied_spec_again_not_the_failed_one() -> None:
    """Issue 35 changed this from BLOCKED: the failed spec is still not retried in a loop, but the app does not stay
    without a job. Flink's HA data of the job the record does not name is not rejoined (tests/core/test_heal_previous.py
    has the whole table)."""
    failed = rec(last_outcome="failure", last_action="upgrade", last_message="boom",
                 last_attempted_spec_hash=spec_hash(P2.canonical()), savepoint_age=timedelta(minutes=5))
    p = plan(inp([P2], [P1], [gone()], [failed])).app("orders")
    assert p.action is Action.REPAIR and p.reason.startswith("this spec already failed"), p.reason
    assert p.desired == P1.canonical() and p.failed is not None and "boom" in p.failed
    start = next(s for s in p.steps if isinstance(s, StartJob))
    assert start.restore.path == SP and start.job_id != JOB
