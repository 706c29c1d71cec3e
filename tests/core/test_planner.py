"""The decision table, as a table. Each row: a situation and exactly what the plan must say."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from reconciler.core.observed import Checkpoint, ClusterPhase, JobPhase, LiveApp, Outcome
from reconciler.core.plan import (
    Action,
    AppPlan,
    CancelJob,
    RestoreKind,
    StartJob,
    deterministic_job_id,
    spec_hash,
)
from reconciler.core.planner import Desired, PlanInput, Policy, plan
from reconciler.errors import SpecError
from reconciler.spec.load import file_key
from tests.core.builders import (
    NOW,
    REV,
    absent,
    app,
    failed,
    inp,
    record,
    running,
    with_meta,
)

SAVEPOINT, LAST_STATE, STATELESS = "savepoint", "last-state", "stateless"
CKPT: dict[str, Any] = {"flinkConfiguration": {"execution.checkpointing.interval": "5s"}}


@dataclass(frozen=True)
class Row:
    id: str
    input: PlanInput
    action: Action
    steps: tuple[str, ...] = ()
    restore: str | None = None  # restore kind of the (first) StartJob
    risk: str | None = None  # substring of a risk line; None: no risks at all
    reason: str | None = None  # substring of the reason
    rollback: tuple[str, ...] = ()
    path: str | None = None  # restore path of the (first) StartJob


def mode(m: str, **kw: Any) -> dict[str, Any]:
    return {"job": {"upgradeMode": m, **kw}}


P1 = app()
P2 = app(job={"parallelism": 2})
START = ("EnsureCluster", "StartJob", "AwaitRunning")
ROLLBACK = ("EnsureCluster", "StartJob", "AwaitRunning")
SUSPENDED = app(job={"state": "suspended"})

# Evidence of a past, as observe() reports it for an app the records forgot.
STORED_SP = "file:/state/savepoints/orders/savepoint-aaaaaa-1"
STOPPED_SP = "file:/state/savepoints/orders/savepoint-bbbbbb-2"
STORED_CK = "file:/state/checkpoints/orders/cccccc/chk-9"


def point(path: str, age: timedelta, *, savepoint: bool = True) -> Checkpoint:
    return Checkpoint(path=path, completed_at=NOW - age, is_savepoint=savepoint)


def gone(*, stored_sp: timedelta | None = None, stored_ck: timedelta | None = None,
         error: str | None = None) -> LiveApp:
    """No cluster (suspended, or removed with the records): only the app's storage speaks."""
    return LiveApp(name="orders", cluster=ClusterPhase.ABSENT,
                   stored_savepoint=point(STORED_SP, stored_sp) if stored_sp is not None else None,
                   stored_checkpoint=point(STORED_CK, stored_ck, savepoint=False) if stored_ck is not None else None,
                   evidence_error=error)


def stopped(*, sp_age: timedelta | None = timedelta(minutes=2), ckpt_age: timedelta | None = None,
            stored_sp: timedelta | None = None) -> LiveApp:
    """A live cluster whose job ended (e.g. stop-with-savepoint, then the reconciler died): no job runs."""
    return LiveApp(name="orders", cluster=ClusterPhase.READY, stopped_job_id="s" * 32,
                   stopped_savepoint=point(STOPPED_SP, sp_age) if sp_age is not None else None,
                   latest_checkpoint=point("file:/ck/chk-3", ckpt_age, savepoint=False) if ckpt_age is not None
                   else None,
                   stored_savepoint=point(STORED_SP, stored_sp) if stored_sp is not None else None)


def cluster(phase: ClusterPhase, message: str = "JobManager pod CrashLoopBackOff") -> LiveApp:
    return LiveApp(name="orders", cluster=phase, cluster_message=message)


PRUNE = Policy(prune=True)
OTHER = app("other")

ROWS = [
    Row("create", inp([P1]), Action.CREATE, START, "none", reason="new app, from empty state"),
    Row("create with checkpointing waits for a checkpoint", inp([app(**CKPT)]), Action.CREATE,
        (*START, "AwaitHealthy"), "none"),
    Row("create from initialSavepointPath", inp([app(job={"initialSavepointPath": "file:///sp/x"})]),
        Action.CREATE, START, "path", reason="initialSavepointPath"),
    Row("re-created app restores its last savepoint", inp([P1], records=[record(savepoint_age=timedelta(days=3))]),
        Action.CREATE, START, "path", reason="last savepoint"),
    Row("re-created stateless app says it does not use the savepoint",
        inp([app(**mode(STATELESS))], records=[record(savepoint_age=timedelta(days=3))]),
        Action.CREATE, START, "none", risk="STARTS WITHOUT STATE"),
    Row("new suspended app starts nothing", inp([app(job={"state": "suspended"})]), Action.NOOP),
    Row("no-op", inp([P1], [P1], [running()]), Action.NOOP, reason="up to date"),
    Row("metadata-only change never restarts", inp([with_meta(P1, labels={"team": "x"})], [P1], [running()]),
        Action.NOOP, reason="metadata-only"),
    Row("policy-only change never restarts", inp([app(**mode(LAST_STATE))], [P1], [running()]),
        Action.NOOP, reason="metadata-only"),
    Row("scale TaskManagers only", inp([app(taskManager={"replicas": 3})], [P1], [running()]),
        Action.SCALE, ("EnsureCluster",), reason="without restarting"),
    Row("savepoint upgrade", inp([P2], [P1], [running()]), Action.UPGRADE,
        ("StopWithSavepoint", *START), "captured", rollback=ROLLBACK, reason="savepoint upgrade"),
    Row("savepoint upgrade waits for the first checkpoint", inp([app(job={"args": ["x"]}, **CKPT)],
                                                                 [app(**CKPT)], [running()]),
        Action.UPGRADE, ("StopWithSavepoint", *START, "AwaitHealthy"), "captured", rollback=ROLLBACK),
    Row("last-state upgrade", inp([app(job={"args": ["x"], "upgradeMode": LAST_STATE})],
                                  [app(**mode(LAST_STATE))], [running()]),
        Action.UPGRADE, ("CancelJob", *START), "captured", rollback=ROLLBACK, reason="last-state"),
    Row("stateless upgrade says it drops state", inp([app(job={"args": ["x"], "upgradeMode": STATELESS})],
                                                     [app(**mode(STATELESS))], [running()]),
        Action.UPGRADE, ("CancelJob", *START), "none", risk="STARTS WITHOUT STATE", rollback=ROLLBACK),
    Row("redeploy-class change still carries state", inp([app(highAvailability={"enabled": True,
                                                                                "storageDir": "file:///ha"})],
                                                         [P1], [running()]),
        Action.UPGRADE, ("StopWithSavepoint", *START), "captured", rollback=ROLLBACK,
        reason="spec.highAvailability.enabled, spec.highAvailability.storageDir changed (redeploy)"),
    Row("suspend takes a savepoint and removes the cluster", inp([app(job={"state": "suspended"})], [P1], [running()]),
        Action.SUSPEND, ("StopWithSavepoint", "DeleteCluster")),
    Row("suspend stateless says so", inp([app(job={"state": "suspended", "upgradeMode": STATELESS})],
                                         [app(**mode(STATELESS))], [running()]),
        Action.SUSPEND, ("CancelJob", "DeleteCluster"), risk="DROPS STATE"),
    Row("suspend a failing savepoint-mode job is blocked",
        inp([app(job={"state": "suspended"})], [P1], [running(state="RESTARTING", phase=JobPhase.STARTING)]),
        Action.BLOCKED, reason="no savepoint"),
    Row("suspended stays suspended", inp([app(job={"state": "suspended"})], [app(job={"state": "suspended"})],
                                         [absent()]), Action.NOOP),
    Row("resume from the last savepoint", inp([P1], [app(job={"state": "suspended"})], [absent()],
                                              [record(savepoint_age=timedelta(hours=5))]),
        Action.RESUME, START, "path", reason="resume from the savepoint"),
    Row("resume savepoint-mode without any savepoint is blocked",
        inp([P1], [app(job={"state": "suspended"})], [absent()]), Action.BLOCKED, reason="no retained checkpoint"),
    Row("restart nonce", inp([app(job={"restartNonce": 2})], [app(job={"restartNonce": 1})], [running()]),
        Action.RESTART, ("StopWithSavepoint", *START), "captured", rollback=ROLLBACK, reason="restartNonce"),
    Row("savepoint-redeploy nonce discards state, loudly",
        inp([app(job={"savepointRedeployNonce": 1, "initialSavepointPath": "file:///sp/old"})],
            [app(job={"initialSavepointPath": "file:///sp/old"})], [running()]),
        Action.UPGRADE, ("StopWithSavepoint", *START), "path", risk="DISCARDS CURRENT STATE", rollback=ROLLBACK),
    Row("failed job, savepoint mode, young checkpoint: fallback",
        inp([app(job={"parallelism": 1, "args": ["v2"], "maxCheckpointAge": "10m"})],
            [app(job={"maxCheckpointAge": "10m"})], [failed(ckpt_age=timedelta(minutes=3))]),
        Action.UPGRADE, ("CancelJob", *START), "path", risk="RESTORES FROM CHECKPOINT", rollback=ROLLBACK),
    Row("failed job, savepoint mode, old checkpoint: blocked with instructions",
        inp([app(job={"args": ["v2"], "maxCheckpointAge": "10m"})], [app(job={"maxCheckpointAge": "10m"})],
            [failed(ckpt_age=timedelta(hours=2))]),
        Action.BLOCKED, reason="older than maxCheckpointAge 10m"),
    Row("failed job, savepoint mode, no checkpoint: the last savepoint is the newest state (a risk line)",
        inp([app(job={"args": ["v2"]})], [P1], [failed()], [record(savepoint_age=timedelta(days=1))]),
        Action.UPGRADE, ("CancelJob", *START), "path", risk="RESTORES FROM SAVEPOINT file:///sp/orders/savepoint-1",
        rollback=ROLLBACK),
    Row("failed job, last-state: newest retained checkpoint",
        inp([app(job={"args": ["v2"], "upgradeMode": LAST_STATE})], [app(**mode(LAST_STATE))],
            [failed(ckpt_age=timedelta(hours=9))]),
        Action.UPGRADE, ("CancelJob", *START), "path", rollback=ROLLBACK),
    Row("drift: job died, repaired from a young checkpoint (the spec is unchanged: no risk)",
        inp([app(job={"maxCheckpointAge": "1h"})], [app(job={"maxCheckpointAge": "1h"})],
            [failed(ckpt_age=timedelta(minutes=1))]),
        Action.REPAIR, ("CancelJob", *START), "path"),
    Row("drift: job died, repaired from its latest checkpoint however old (maxCheckpointAge unset)",
        inp([P1], [P1], [failed(ckpt_age=timedelta(hours=3))]),
        Action.REPAIR, ("CancelJob", *START), "path", reason="latest checkpoint"),
    Row("drift: cluster removed behind our back, last-state",
        inp([app(**mode(LAST_STATE))], [app(**mode(LAST_STATE))], [absent()],
            [record(savepoint_age=timedelta(hours=1))]),
        Action.REPAIR, START, "path", reason="cluster is gone"),
    Row("delete with pruning off keeps the app", inp([], [P1], [running()]), Action.NOOP, reason="pruning is disabled"),
    Row("delete with pruning on: final savepoint first", inp([app("other")], [P1, app("other")], [running()],
                                                              policy=Policy(prune=True)),
        Action.DELETE, ("StopWithSavepoint", "DeleteCluster"), risk="DELETES APP orders"),
    Row("delete policy delete says state is dropped",
        inp([app("other")], [app(deletionPolicy="delete"), app("other")], [running()], policy=Policy(prune=True)),
        Action.DELETE, ("CancelJob", "DeleteCluster"), risk="WITHOUT A FINAL SAVEPOINT"),
    Row("delete policy orphan only forgets", inp([app("other")], [app(deletionPolicy="orphan"), app("other")],
                                                 [running()], policy=Policy(prune=True)),
        Action.DELETE, ("ForgetApp",)),
    Row("mass-deletion guard: empty tree", inp([], [P1], [running()], policy=Policy(prune=True)),
        Action.BLOCKED, reason="no app specs at all"),
    # --- first sight of an app with a past (no record, or a record without an applied spec) ---
    Row("first sight: suspended app, records lost, its suspend savepoint in storage",
        inp([P1], live=[gone(stored_sp=timedelta(hours=3))]), Action.CREATE, START, "path", path=STORED_SP,
        reason="adopted: restoring from the newest savepoint in its savepoint directory"),
    Row("first sight: a job stopped with a savepoint on the live cluster (crash mid-upgrade)",
        inp([P1], live=[stopped()]), Action.CREATE, START, "path", path=STOPPED_SP,
        reason=f"the savepoint job {'s' * 32} stopped with"),
    Row("first sight: a stopped job whose savepoint does not show (yet) is a trace: blocked, never empty",
        inp([P1], live=[stopped(sp_age=None)]), Action.BLOCKED, reason=f"job {'s' * 32} on its cluster has ended"),
    Row("first sight: same in last-state mode",
        inp([app(**mode(LAST_STATE))], live=[stopped(sp_age=None)]), Action.BLOCKED,
        reason="no retained checkpoint or savepoint exists"),
    Row("first sight: the newest evidence wins (stored savepoint newer than the stopped job's)",
        inp([P1], live=[stopped(sp_age=timedelta(hours=5), stored_sp=timedelta(minutes=1))]),
        Action.CREATE, START, "path", path=STORED_SP),
    Row("first sight: a recorded savepoint newer than the stored one",
        inp([P1], live=[gone(stored_sp=timedelta(days=9))], records=[record(savepoint_age=timedelta(days=3))]),
        Action.CREATE, START, "path", path="file:///sp/orders/savepoint-1", reason="last savepoint on record"),
    Row("first sight: savepoint mode, young retained checkpoint newer than any savepoint",
        inp([app(job={"maxCheckpointAge": "10m"})], live=[gone(stored_sp=timedelta(hours=2),
                                                               stored_ck=timedelta(minutes=4))]),
        Action.CREATE, START, "path", path=STORED_CK, risk="RESTORES FROM CHECKPOINT"),
    Row("first sight: savepoint mode, a checkpoint newer than the savepoint is the newest state",
        inp([P1], live=[gone(stored_sp=timedelta(days=2), stored_ck=timedelta(hours=2))]),
        Action.CREATE, START, "path", path=STORED_CK, risk="RESTORES FROM CHECKPOINT"),
    Row("first sight: savepoint mode, a checkpoint older than maxCheckpointAge: blocked with instructions",
        inp([app(job={"maxCheckpointAge": "10m"})], live=[gone(stored_sp=timedelta(days=2),
                                                               stored_ck=timedelta(hours=2))]), Action.BLOCKED,
        reason=f"set spec.job.maxCheckpointAge above 2h00m to restore from checkpoint {STORED_CK}; or set "
               f"spec.job.initialSavepointPath: {STORED_SP}"),
    Row("first sight: last-state takes the newest retained checkpoint",
        inp([app(**mode(LAST_STATE))], live=[gone(stored_sp=timedelta(days=2), stored_ck=timedelta(hours=2))]),
        Action.CREATE, START, "path", path=STORED_CK),
    Row("first sight: stateless starts empty and names the state it ignores",
        inp([app(**mode(STATELESS))], live=[gone(stored_sp=timedelta(hours=1))]), Action.CREATE, START, "none",
        risk=f"ignores the newest savepoint in its savepoint directory {STORED_SP}"),
    Row("first sight: initialSavepointPath wins over the evidence",
        inp([app(job={"initialSavepointPath": "file:///sp/chosen"})], live=[stopped()]), Action.CREATE, START,
        "path", path="file:///sp/chosen"),
    Row("first sight: storage that could not be read blocks, never starts empty",
        inp([P1], live=[gone(error="permission denied: /state/savepoints/orders")]), Action.BLOCKED,
        reason="could not be read (permission denied"),
    Row("first sight: unobservable cluster changes nothing",
        inp([P1], live=[cluster(ClusterPhase.UNKNOWN, "connection refused")]), Action.NOOP,
        reason="live state unknown"),
    Row("first sight: failing cluster whose jobs cannot be read is blocked",
        inp([P1], live=[cluster(ClusterPhase.FAILED)]), Action.BLOCKED, reason="CrashLoopBackOff"),
    Row("a failed create's own cluster (on record) is reconfigured by a new spec, as before",
        inp([P2], live=[cluster(ClusterPhase.FAILED)], records=[record(last_attempted_revision="c" * 40)]),
        Action.CREATE, START, "none"),
    Row("first sight: starting cluster waits", inp([P1], live=[cluster(ClusterPhase.STARTING, "1/2 TaskManagers")]),
        Action.NOOP, reason="still starting"),
    Row("first sight: a failed job nobody recorded, with a young checkpoint, is replaced from it",
        inp([app(**mode(LAST_STATE))], live=[failed(ckpt_age=timedelta(minutes=3))]), Action.UPGRADE,
        ("CancelJob", *START), "path", path="file:///ckpt/orders/chk-7"),
    Row("first sight: a failed job with no state anywhere is replaced by a new one",
        inp([P1], live=[failed()]), Action.UPGRADE, ("CancelJob", *START), "none"),
    Row("first sight: a running job nobody recorded, Git says suspended: savepoint and suspend",
        inp([SUSPENDED], live=[running()]), Action.SUSPEND, ("StopWithSavepoint", "DeleteCluster")),
    # --- resume / repair when the record lost its savepoint ---
    Row("resume: the record lost its savepoint, the suspend savepoint is in storage",
        inp([P1], [SUSPENDED], [gone(stored_sp=timedelta(hours=5))]), Action.RESUME, START, "path", path=STORED_SP,
        reason="resume from the newest savepoint in its savepoint directory"),
    Row("resume: a checkpoint newer than the stored savepoint is the newest state",
        inp([P1], [SUSPENDED], [gone(stored_sp=timedelta(hours=5), stored_ck=timedelta(hours=1))]),
        Action.RESUME, START, "path", path=STORED_CK),
    Row("resume: storage unreadable blocks",
        inp([P1], [SUSPENDED], [gone(error="EIO")]), Action.BLOCKED, reason="could not be read (EIO)"),
    Row("repair: the job was stopped with a savepoint behind our back; restart from that savepoint",
        inp([P1], [P1], [stopped()]), Action.REPAIR, START, "path", path=STOPPED_SP, reason="stopped with"),
    Row("repair: an old stored savepoint is the newest state there is (no checkpoint anywhere)",
        inp([P1], [P1], [gone(stored_sp=timedelta(days=1))]), Action.REPAIR, START, "path", path=STORED_SP),
    Row("repair: last-state takes the newest of stored savepoint and checkpoint",
        inp([app(**mode(LAST_STATE))], [app(**mode(LAST_STATE))],
            [gone(stored_sp=timedelta(minutes=5), stored_ck=timedelta(hours=1))]),
        Action.REPAIR, START, "path", path=STORED_SP),
    Row("repair: blocked with one option says it without a stray 'or'",
        inp([P1], [P1], [absent()]), Action.BLOCKED,
        reason="To proceed: set spec.job.upgradeMode: stateless and bump restartNonce to start with empty state."),
    # --- orphans: a cluster with no spec in Git and no record ---
    Row("orphan with pruning off is left alone, and says so",
        inp([OTHER], [OTHER], [running(), running("other")]), Action.NOOP, reason="pruning is disabled"),
    Row("orphan with pruning on: final savepoint, then delete",
        inp([OTHER], [OTHER], [running(), running("other")], policy=PRUNE), Action.DELETE,
        ("StopWithSavepoint", "DeleteCluster"), risk="DELETES APP orders: no spec in Git and no record"),
    Row("orphan whose job is failing: no final savepoint possible, blocked",
        inp([OTHER], [OTHER], [failed(), running("other")], policy=PRUNE), Action.BLOCKED,
        reason="no final savepoint can be taken"),
    Row("orphan that cannot be observed is not deleted",
        inp([OTHER], [OTHER], [cluster(ClusterPhase.UNKNOWN, "timeout"), running("other")], policy=PRUNE),
        Action.BLOCKED, reason="could not be observed (timeout)"),
    Row("orphan with a stopped job: its savepoint is kept, the idle cluster is deleted",
        inp([OTHER], [OTHER], [stopped(), running("other")], policy=PRUNE), Action.DELETE, ("DeleteCluster",),
        risk="DELETES APP orders", reason=STOPPED_SP),
    Row("failed revision is not retried in a loop",
        inp([P2], [P1], [running()],
            [record(last_outcome=Outcome.FAILURE, last_attempted_revision=REV, last_message="boom",
                    last_attempted_spec_hash=spec_hash(P2.canonical()))]),
        Action.BLOCKED, reason="restartNonce"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_decision_table(row: Row) -> None:
    result = plan(row.input).app("orders")
    assert result.action is row.action, result.reason
    assert tuple(s.type for s in result.steps) == row.steps
    if row.restore is not None:
        start = next(s for s in result.steps if isinstance(s, StartJob))
        assert start.restore.kind.value == row.restore
    if row.risk is None:
        assert result.risks == ()
    else:
        assert any(row.risk in r for r in result.risks), result.risks
    if row.reason:
        assert row.reason in result.reason
    if row.path is not None:
        start = next(s for s in result.steps if isinstance(s, StartJob))
        assert start.restore.path == row.path, start.restore
    assert tuple(s.type for s in result.rollback) == row.rollback
    if row.rollback:
        assert result.rollback_after == 0
        assert all(getattr(s, "spec", "previous") == "previous" for s in result.rollback)
    _assert_safety_invariants(result, row.input)


def _assert_safety_invariants(result: AppPlan, pin: PlanInput) -> None:
    """Rule 1: a job started without state is either a brand-new app (no trace of any state: no record,
    no savepoint or checkpoint on the cluster or in storage) or said loudly, with consent."""
    for s in result.steps:
        if isinstance(s, StartJob) and s.restore.kind is RestoreKind.NONE:
            brand_new = pin.previous.get("orders") is None and not (
                (r := pin.records.get("orders")) and r.savepoints) and not pin.live.get("orders").has_evidence
            assert brand_new or any("WITHOUT STATE" in r for r in result.risks), result
            desired = pin.desired.apps["orders"]
            assert brand_new or desired.spec.job.upgrade_mode.value == "stateless" or \
                desired.spec.job.savepoint_redeploy_nonce is not None
    if result.action in (Action.BLOCKED, Action.ERROR, Action.NOOP):
        assert result.steps == ()
    # Rule 5 for orphans too: a deletion of a running job always saves its state first.
    if result.action is Action.DELETE and any(isinstance(s, CancelJob) for s in result.steps):
        assert any("WITHOUT A FINAL SAVEPOINT" in r for r in result.risks), result


def test_mass_deletion_guard_most_apps_gone() -> None:
    prev = [app(f"a{i}") for i in range(10)]
    result = plan(inp(prev[:3], prev, [running(f"a{i}") for i in range(10)], policy=Policy(prune=True)))
    assert result.guard and "7 of 10" in result.guard
    deletes = [a for a in result.apps if a.app not in ("a0", "a1", "a2")]
    assert {a.action for a in deletes} == {Action.BLOCKED}
    assert all(not a.steps for a in deletes)
    # A few at a time is fine.
    ok = plan(inp(prev[:8], prev, [running(f"a{i}") for i in range(10)], policy=Policy(prune=True)))
    assert ok.guard is None and ok.app("a9").action is Action.DELETE


def test_invalid_spec_is_an_error_and_never_deletes() -> None:
    err = SpecError("unknown field 'paralelism'", file="apps/orders.yaml", line=9, field="spec.job.paralelism",
                    app="orders")
    desired = Desired(apps={"other": app("other")}, sources={"other": "apps/other.yaml"}, errors=(err,),
                      broken_files=frozenset({"apps/orders.yaml"}))
    pin = inp([], [P1, app("other")], [running(), running("other")], policy=Policy(prune=True),
              desired_obj=desired)
    result = plan(pin)
    orders = result.app("orders")
    assert orders.action is Action.ERROR and not orders.steps
    assert "apps/orders.yaml:9" in orders.reason and "paralelism" in orders.reason
    assert result.app("other").action is Action.NOOP
    assert result.guard is None


def test_app_in_a_broken_file_without_a_name_is_kept() -> None:
    # YAML so broken that no app name is known: the apps that lived in that file are still not deleted.
    err = SpecError("invalid YAML: mapping values are not allowed here", file="apps/orders.yaml", line=3)
    desired = Desired(apps={}, errors=(err,), broken_files=frozenset({"apps/orders.yaml"}))
    result = plan(inp([], [P1], [running()], policy=Policy(prune=True), desired_obj=desired))
    assert result.app("orders").action is Action.ERROR
    assert not result.app("orders").steps


def test_apps_under_a_broken_folder_are_kept() -> None:
    # A folder of specs replaced by a symlink: only the folder is known broken, its files simply vanish.
    team = dataclasses.replace(inp([], [P1], [running()], policy=Policy(prune=True)),
                               previous_sources={"orders": "apps/team/orders.yaml"})
    desired = Desired(apps={}, errors=(SpecError("is a symbolic link", file="apps/team", app=file_key("apps/team")),),
                      broken_files=frozenset({"apps/team"}))
    result = plan(dataclasses.replace(team, desired=desired))
    assert result.app("orders").action is Action.ERROR and not result.app("orders").steps
    # ...but not a sibling whose name merely starts the same way.
    other = dataclasses.replace(team, previous_sources={"orders": "apps/teammates/orders.yaml"})
    assert plan(dataclasses.replace(other, desired=desired)).app("orders").action is Action.BLOCKED


def test_no_deletion_while_a_file_that_names_no_app_cannot_be_read() -> None:
    # `git mv apps/orders.yaml "apps/new\nline.yaml"`: the old file is gone, the new one cannot be read.
    bad = "apps/new\nline.yaml"
    desired = Desired(apps={"other": app("other")}, sources={"other": "apps/other.yaml"},
                      errors=(SpecError("a path with a newline cannot be read", file=bad, app=file_key(bad)),),
                      broken_files=frozenset({bad}))
    result = plan(inp([], [P1, app("other")], [running(), running("other")], policy=Policy(prune=True),
                      desired_obj=desired))
    orders = result.app("orders")
    assert orders.action is Action.BLOCKED and not orders.steps
    assert result.guard is not None and "cannot be read" in result.guard and file_key(bad) in result.guard
    assert result.app(file_key(bad)).action is Action.ERROR
    assert result.app("other").action is Action.NOOP
    # Without prune nothing would be deleted anyway: no guard needed.
    assert plan(inp([], [P1, app("other")], [running(), running("other")], desired_obj=desired)).guard is None


def test_unknown_live_state_is_never_treated_as_absent() -> None:
    unknown = LiveApp(name="orders", cluster=ClusterPhase.UNKNOWN, cluster_message="connection refused")
    result = plan(inp([P2], [P1], [unknown])).app("orders")
    assert result.action is Action.NOOP and not result.steps and "connection refused" in result.reason


def test_job_ids_are_deterministic_and_differ_per_attempt() -> None:
    a = plan(inp([P1])).app("orders")
    b = plan(inp([P1])).app("orders")
    assert a.steps == b.steps
    start = next(s for s in a.steps if isinstance(s, StartJob))
    assert start.job_id == deterministic_job_id("orders", REV, 1)
    retry = plan(inp([P1], records=[record(last_attempted_revision=REV, attempts=1)])).app("orders")
    assert next(s for s in retry.steps if isinstance(s, StartJob)).job_id == deterministic_job_id("orders", REV, 2)


def test_plan_round_trips_through_json_exactly() -> None:
    pin = inp([P2, app("new")], [P1, app("gone")], [running(), running("gone")], policy=Policy(prune=True))
    result = plan(pin)
    assert type(result).from_json(result.to_json()) == result
    assert result.to_json() == type(result).from_json(result.to_json()).to_json()
    assert result.live_fingerprint == pin.live.fingerprint()
    assert result.revision == REV and result.format_version == 1


def test_failed_before_reason_is_stable_across_passes() -> None:
    from reconciler.core.observed import AppRecord

    rec = record(last_outcome=Outcome.FAILURE, last_attempted_revision=REV, last_message="ClassNotFoundException",
                 last_attempted_spec_hash=P2.spec_hash)
    first = plan(inp([P2], [P1], [running()], [rec])).app("orders")
    assert first.action is Action.BLOCKED and "ClassNotFoundException" in first.reason
    # The journal stores that reason as the new message; the next pass must say the same, not nest it.
    again_rec = AppRecord(**{**rec.model_dump(), "last_message": first.reason})
    again = plan(inp([P2], [P1], [running()], [again_rec])).app("orders")
    assert again.reason == first.reason


def test_orphans_count_for_the_mass_deletion_guard() -> None:
    # Records lost, and most apps gone from Git at once: the guard holds for clusters nobody recorded too.
    live = [running(f"a{i}") for i in range(10)]
    result = plan(inp([app("a0"), app("a1")], [], live, policy=PRUNE))
    assert result.guard and "8 of 10" in result.guard and "--allow-mass-delete" in result.guard
    assert "mass_delete_threshold" in result.guard
    orphans = [a for a in result.apps if a.app not in ("a0", "a1")]
    assert len(orphans) == 8 and {a.action for a in orphans} == {Action.BLOCKED}
    assert all(not a.steps for a in orphans)
    # With the guard lifted, each is deleted after a final savepoint.
    lifted = plan(inp([app("a0"), app("a1")], [], live, policy=Policy(prune=True, allow_mass_delete=True)))
    assert {tuple(s.type for s in a.steps) for a in lifted.apps if a.app not in ("a0", "a1")} == {
        ("StopWithSavepoint", "DeleteCluster")}


def test_empty_checkout_with_lost_records_deletes_nothing_and_says_how_to_proceed() -> None:
    result = plan(inp([], [], [running("x"), running("y")], policy=PRUNE))
    assert result.guard is not None
    assert "no app specs at all while 2 app(s)" in result.guard
    assert "`flink-reconciler apply --prune --allow-mass-delete`" in result.guard
    assert all(a.action is Action.BLOCKED and not a.steps for a in result.apps)


def test_a_broken_file_error_says_what_happened_on_its_own() -> None:
    err = SpecError("invalid YAML: mapping values are not allowed here", file="apps/orders.yaml", line=3)
    desired = Desired(apps={}, errors=(err,), broken_files=frozenset({"apps/orders.yaml"}))
    orders = plan(inp([], [P1], [running()], policy=PRUNE, desired_obj=desired)).app("orders")
    assert orders.action is Action.ERROR and not orders.steps
    assert orders.reason.startswith("apps/orders.yaml could not be read or no longer holds app orders")
    assert "apps/orders.yaml:3" in orders.reason and "left as it is" in orders.reason
    assert "see above" not in orders.reason


def test_evidence_does_not_make_plans_stale() -> None:
    """Checkpoint paths and stored savepoints move on their own; the fingerprint ignores them, and an
    absent app listed only for its evidence fingerprints like an app not listed at all."""
    plain = inp([P1], live=[running()]).live
    moved = inp([P1], live=[running(ckpt_age=timedelta(seconds=3))]).live
    assert plain.fingerprint() == moved.fingerprint()
    nothing = inp([P1], live=[]).live
    assert nothing.fingerprint() == inp([P1], live=[gone(stored_sp=timedelta(hours=1))]).live.fingerprint()
    assert inp([P1], live=[stopped()]).live.fingerprint() == inp([P1], live=[stopped(sp_age=None)]).live.fingerprint()
