"""When a FlinkDeployment may be taken over, and what the operator's status says after the suspend we ask for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from reconciler.core.observed import Checkpoint, LiveApp, OperatorDeployment, Outcome
from reconciler.core.plan import (
    Action,
    AppPlan,
    DeleteOperatorDeployment,
    ReleaseOperatorDeployment,
    RestoreKind,
    StartJob,
    SuspendOperatorDeployment,
    describe_step,
    deterministic_job_id,
)
from reconciler.core.planner import PlanInput, plan
from reconciler.core.render import to_text as render_text
from reconciler.operator_migration.status import (
    LAST_STATE_FALLBACK,
    Before,
    before_suspend,
    operator_view,
    release_patch,
    suspend_patch,
    suspend_refusal,
    suspension,
    takeover_refusal,
)
from tests.core.builders import NOW, REV, absent, app, inp, record, running


def durable(uri: str) -> str | None:
    return None if uri.startswith("s3://") else "a pod's own disk"


def fd(status: dict[str, Any] | None = None, conf: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"flinkConfiguration": conf if conf is not None else {"state.savepoints.dir": "s3://b/sp"}},
            "status": status or {"lifecycleState": "STABLE", "reconciliationStatus": {"state": "DEPLOYED"},
                                 "jobStatus": {"state": "RUNNING"}}}


@pytest.mark.parametrize(("deployment", "reason"), [
    (fd(), None),
    (fd(conf={"execution": {"checkpointing": {"savepoint-dir": "s3://b/sp"}}}), None),
    (fd({"reconciliationStatus": {"state": "UPGRADING"}}), "mid-upgrade (reconciliationStatus.state UPGRADING)"),
    (fd({"reconciliationStatus": {"state": "ROLLING_BACK"}}), "mid-upgrade"),
    (fd({"error": "boom", "reconciliationStatus": {"state": "DEPLOYED"}}), "is in error (boom)"),
    (fd(conf={}), "has no savepoint directory"),
    (fd(conf={"state.savepoints.dir": "file:///tmp/sp"}), "'file:///tmp/sp' is not durable storage: a pod's own"),
    (fd(conf={"a": [{"b": 1}]}), "not a Flink option value"),
    ({"spec": "x", "status": 3}, "has no savepoint directory"),
])
def test_refusals(deployment: dict[str, Any], reason: str | None) -> None:
    got = takeover_refusal(deployment, durable)
    assert (got is None) if reason is None else (got is not None and reason in got), got
    if got:
        assert "shop/orders" in got or "default/?" in got


NEW = "s3://b/sp/savepoint-2"
OLD = "s3://b/sp/savepoint-1"
BEFORE = Before(paths=(OLD,), last_time=1000, job_state="running", upgrade_mode="last-state")


def suspended(path: str | None, *, stamp: int | None = None, **extra: Any) -> dict[str, Any]:
    job: dict[str, Any] = {"state": "FINISHED", **({"upgradeSavepointPath": path} if path else {})}
    if stamp is not None:
        job["savepointInfo"] = {"lastSavepoint": {"location": path, "timeStamp": stamp, "triggerType": "UPGRADE"}}
    return {"lifecycleState": "SUSPENDED", "jobStatus": job, **extra}


@pytest.mark.parametrize(("status", "on_storage", "done", "savepoint", "problem"), [
    ({"lifecycleState": "STABLE", "jobStatus": {"state": "RUNNING"}}, None, False, None, None),
    ({"lifecycleState": "SUSPENDED", "jobStatus": {"upgradeSavepointPath": NEW}}, None, True, NEW, None),
    (suspended(NEW, stamp=2000), True, True, NEW, None),
    ({"lifecycleState": "SUSPENDED", "jobStatus": {}}, None, True, None, "without a savepoint path"),
    ({"lifecycleState": "FAILED", "error": "savepoint timed out"}, None, True, None, "savepoint timed out"),
    ({}, None, False, None, None),
    # what the operator leaves when it did not take a savepoint now (AbstractJobReconciler, SnapshotObserver)
    (suspended("KUBERNETES_OPERATOR_LAST_STATE"), None, True, None, "last-state suspend"),
    (suspended("s3://b/chk/0f1e/chk-42"), None, True, None, "from a checkpoint"),
    (suspended("s3://b/chk/0f1e/chk-42/"), None, True, None, "from a checkpoint"),
    (suspended(OLD), None, True, None, "a savepoint it named before this suspend"),
    (suspended(NEW, stamp=1000), None, True, None, "not newer than the last one"),
    (suspended(NEW, stamp=900), None, True, None, "not newer than the last one"),
    (suspended(NEW), False, True, None, "no _metadata on storage"),
])
def test_suspension(status: dict[str, Any], on_storage: bool | None, done: bool, savepoint: str | None,
                    problem: str | None) -> None:
    s = suspension({"status": status}, BEFORE, lambda _: on_storage)
    assert (s.done, s.savepoint) == (done, savepoint)
    assert (s.problem is None) if problem is None else (s.problem is not None and problem in s.problem), s.problem
    if s.problem and s.done:
        assert "not deleted" in s.problem or "left to the operator" in s.problem


def test_before_suspend_remembers_every_savepoint_field_and_every_patched_field() -> None:
    doc = {"spec": {"job": {"state": "running"}, "flinkConfiguration": {LAST_STATE_FALLBACK: "true"}},
           "status": {"jobStatus": {"upgradeSavepointPath": OLD, "savepointInfo": {
               "lastSavepoint": {"location": "s3://b/sp/savepoint-0", "timeStamp": 1234},
               "savepointHistory": [{"location": "s3://b/sp/savepoint-a"}, "junk"]}}}}
    b = before_suspend(doc)
    assert b == Before(paths=(OLD, "s3://b/sp/savepoint-0", "s3://b/sp/savepoint-a"), last_time=1234,
                       job_state="running", upgrade_mode=None, fallback="true")
    assert Before.from_json(b.to_json()) == b
    assert before_suspend({"spec": "x", "status": {"jobStatus": {"savepointInfo": {"lastSavepoint": {
        "timeStamp": True}}}}}) == Before()


def test_the_patches_set_and_restore_the_same_fields() -> None:
    sp = suspend_patch()
    assert sp == {"spec": {"job": {"state": "suspended", "upgradeMode": "savepoint"},
                           "flinkConfiguration": {LAST_STATE_FALLBACK: "false"}}}
    # had none: null removes what we set (a merge patch); had one: it comes back
    assert release_patch(Before(job_state="running")) == {"spec": {
        "job": {"state": "running", "upgradeMode": None}, "flinkConfiguration": {LAST_STATE_FALLBACK: None}}}
    back = release_patch(Before(job_state="running", upgrade_mode="stateless", fallback="true"))
    assert back["spec"]["job"]["upgradeMode"] == "stateless" and back["spec"]["flinkConfiguration"] == {
        LAST_STATE_FALLBACK: "true"}
    # every field the suspend patch sets is one the release patch sets
    assert sp["spec"]["job"].keys() == back["spec"]["job"].keys()
    assert sp["spec"]["flinkConfiguration"].keys() == back["spec"]["flinkConfiguration"].keys()


@pytest.mark.parametrize(("spec_state", "lifecycle", "job", "reason"), [
    ("running", "STABLE", "RUNNING", None),
    ("suspended", "SUSPENDED", "FINISHED", "already suspended"),
    ("running", "SUSPENDED", "FINISHED", "already suspended"),
    ("suspended", "STABLE", "RUNNING", "already suspended"),  # asked by someone else, not done yet
    ("running", "DEPLOYED", "INITIALIZING", "job is INITIALIZING"),
    ("running", "DEPLOYED", "RECONCILING", "job is RECONCILING"),
    ("running", "STABLE", "FINISHED", "job is FINISHED"),
    ("running", "STABLE", "FAILED", "job is FAILED"),
    ("running", "STABLE", "RESTARTING", "job is RESTARTING"),
    ("running", "CREATED", None, "job is not reported"),
])
def test_suspend_refusals(spec_state: str, lifecycle: str, job: str | None, reason: str | None) -> None:
    doc = {"metadata": {"name": "orders", "namespace": "shop"}, "spec": {"job": {"state": spec_state}},
           "status": {"lifecycleState": lifecycle, "jobStatus": {"state": job} if job else {}}}
    got = suspend_refusal(doc)
    assert (got is None) if reason is None else (got is not None and reason in got), got
    if got:  # each says the way out
        assert "initialSavepointPath" in got


# ---- the plan ---------------------------------------------------------------------------------------------

OP = OperatorDeployment(namespace="default", name="orders", job_state="running", upgrade_mode="last-state",
                        lifecycle="STABLE")
CKPT: dict[str, Any] = {"flinkConfiguration": {"execution.checkpointing.interval": "5s"}}
TAKEOVER_STEPS = ("SuspendOperatorDeployment", "DeleteOperatorDeployment", "EnsureCluster", "StartJob",
                  "AwaitRunning", "AwaitHealthy")


TAKEN = app(takeover={"from": "FlinkDeployment/orders"})
SUSPENDED_OP = OP.model_copy(update={"job_state": "suspended", "lifecycle": "SUSPENDED",
                                     "not_suspendable": "X is already suspended"})


def operated(name: str = "orders", op: OperatorDeployment | None = OP, **kw: Any) -> LiveApp:
    return absent(name).model_copy(update={"operator": op, **kw})


@dataclass(frozen=True)
class Row:
    id: str
    input: PlanInput
    action: Action
    steps: tuple[str, ...] = ()
    reason: str = ""


ROWS = [
    Row("first sight, a FlinkDeployment of its name: takeover", inp([app(**CKPT)], live=[operated()]),
        Action.TAKEOVER, TAKEOVER_STEPS, "take over FlinkDeployment default/orders"),
    Row("spec.takeover names another FlinkDeployment", inp(
        [app(**CKPT, takeover={"from": "FlinkDeployment/legacy"})],
        live=[operated(op=OP.model_copy(update={"name": "legacy"}))]),
        Action.TAKEOVER, TAKEOVER_STEPS, "FlinkDeployment default/legacy"),
    Row("no checkpointing: no AwaitHealthy", inp([app()], live=[operated()]), Action.TAKEOVER, TAKEOVER_STEPS[:-1]),
    Row("suspended in Git: stop it there, start nothing", inp([app(job={"state": "suspended"})], live=[operated()]),
        Action.TAKEOVER, TAKEOVER_STEPS[:2], "keep it suspended here"),
    Row("refused: mid-upgrade", inp([app()], live=[operated(op=OP.model_copy(update={"refusal": "X is mid-upgrade"}))]),
        Action.BLOCKED, (), "takeover refused: X is mid-upgrade"),
    Row("FlinkDeployments unreadable, spec says takeover", inp(
        [app(takeover={"from": "FlinkDeployment/orders"})],
        live=[operated(op=OP.model_copy(update={"unreadable": "403 Forbidden"}))]),
        Action.BLOCKED, (), "403 Forbidden"),
    Row("FlinkDeployments unreadable, no takeover asked, first sight: never started beside the operator's job", inp(
        [app()], live=[operated(op=OP.model_copy(update={"unreadable": "403 Forbidden"}))]),
        Action.BLOCKED, (), "FlinkDeployments in namespace default cannot be read (403 Forbidden)"),
    Row("FlinkDeployments unreadable, no takeover asked, first sight with a savepoint found: blocked too", inp(
        [app()], live=[operated(op=OP.model_copy(update={"unreadable": "403 Forbidden"}),
                                stored_savepoint=Checkpoint(path="file:///sp/orders/savepoint-1",
                                                           completed_at=NOW - timedelta(minutes=5)))]),
        Action.BLOCKED, (), "Grant the reconciler list on flinkdeployments.flink.apache.org in namespace default"),
    Row("FlinkDeployments unreadable, no takeover asked, a cluster of ours runs (records lost): adopted", inp(
        [app()], live=[running().model_copy(update={"operator": OP.model_copy(update={"unreadable": "403"})})]),
        Action.UPGRADE, ("StopWithSavepoint", "EnsureCluster", "StartJob", "AwaitRunning")),
    Row("FlinkDeployments unreadable, no takeover asked, suspended: nothing to start", inp(
        [app(job={"state": "suspended"})], live=[operated(op=OP.model_copy(update={"unreadable": "403"}))]),
        Action.NOOP, (), "suspended"),
    Row("FlinkDeployments unreadable, an app of ours with a record: planned as usual", inp(
        [app()], previous=[app()], live=[running().model_copy(update={"operator": OP.model_copy(
            update={"unreadable": "403"})})], records=[record()]),
        Action.NOOP, (), "up to date"),
    Row("spec.takeover but no such FlinkDeployment, never seen: never an empty start",
        inp([app(takeover={"from": "FlinkDeployment/orders"})]), Action.BLOCKED, (), "there is none in namespace"),
    Row("spec.takeover, no FlinkDeployment, but a record (a takeover rolled back to its job): planned as usual",
        inp([TAKEN], live=[running().model_copy(update={"deployed_spec_hash": TAKEN.spec_hash})],
            records=[record(savepoint_age=timedelta(minutes=1))]),
        Action.NOOP, (), "adopted"),
    Row("already ours, spec.takeover added while a FlinkDeployment exists", inp(
        [app(takeover={"from": "FlinkDeployment/orders"})], previous=[app()],
        live=[running().model_copy(update={"operator": OP})], records=[record()]),
        Action.BLOCKED, (), "already runs here"),
    Row("already ours, a FlinkDeployment of its name and no spec.takeover: left alone", inp(
        [app()], previous=[app()], live=[running().model_copy(update={"operator": OP})], records=[record()]),
        Action.NOOP),
    Row("its job is not RUNNING: refused, nothing asked of the operator", inp(
        [app()], live=[operated(op=OP.model_copy(update={"not_suspendable": "X's job is INITIALIZING"}))]),
        Action.BLOCKED, (), "takeover refused: X's job is INITIALIZING"),
    Row("already suspended: refused (its savepoint may be stale or a placeholder)", inp(
        [app()], live=[operated(op=SUSPENDED_OP)]), Action.BLOCKED, (), "takeover refused: X is already suspended"),
    Row("already suspended, initialSavepointPath named: deleted, started from that savepoint", inp(
        [app(job={"initialSavepointPath": "s3://b/sp/savepoint-9"})], live=[operated(op=SUSPENDED_OP)]),
        Action.TAKEOVER, TAKEOVER_STEPS[1:-1], "starts here from s3://b/sp/savepoint-9"),
    Row("already suspended, initialSavepointPath named, suspended in Git: deleted only", inp(
        [app(job={"initialSavepointPath": "s3://b/sp/savepoint-9", "state": "suspended"})],
        live=[operated(op=SUSPENDED_OP)]), Action.TAKEOVER, TAKEOVER_STEPS[1:2], "keep the app suspended"),
    Row("not RUNNING (not suspended), initialSavepointPath named: still refused", inp(
        [app(job={"initialSavepointPath": "s3://b/sp/savepoint-9"})],
        live=[operated(op=OP.model_copy(update={"not_suspendable": "X's job is FINISHED"}))]),
        Action.BLOCKED, (), "X's job is FINISHED"),
    Row("a takeover of this spec failed before: not retried in a loop", inp(
        [app()], live=[operated()],
        records=[record(last_outcome=Outcome.FAILURE, last_attempted_revision=REV,
                        last_attempted_spec_hash=app().spec_hash, last_action="takeover", last_message="boom")]),
        Action.BLOCKED, (), "this spec already failed"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_plan_table(row: Row) -> None:
    ap = plan(row.input).app("orders")
    assert ap.action is row.action, ap.reason
    assert tuple(s.type for s in ap.steps) == row.steps
    assert row.reason in ap.reason


def test_the_takeover_plan_in_detail() -> None:
    ap = plan(inp([app(**CKPT)], live=[operated()])).app("orders")
    suspend, delete, _, start, *_ = ap.steps
    assert isinstance(suspend, SuspendOperatorDeployment) and (suspend.namespace, suspend.name) == ("default", "orders")
    assert isinstance(delete, DeleteOperatorDeployment)
    assert isinstance(start, StartJob) and start.restore.kind is RestoreKind.CAPTURED
    assert start.job_id == deterministic_job_id("orders", REV, 1)
    # Our start fails: the job restarts from the same savepoint here (a new job id); nothing of the operator's
    assert ap.rollback_after == 1
    assert [s.type for s in ap.rollback] == ["EnsureCluster", "StartJob", "AwaitRunning", "AwaitHealthy"]
    assert all(isinstance(s, StartJob) and s.restore.kind is RestoreKind.CAPTURED and s.job_id != start.job_id
               for s in ap.rollback if isinstance(s, StartJob))
    # The suspend fails: the operator gets its job back as it was
    assert [(s.type, s.state, s.upgrade_mode) for s in ap.abort if isinstance(s, ReleaseOperatorDeployment)] == [
        ("ReleaseOperatorDeployment", "running", "last-state")]
    assert any(r.startswith("TAKES OVER FlinkDeployment default/orders") for r in ap.risks)
    assert "never without one" in describe_step(suspend) and "HA metadata included" in describe_step(delete)
    assert AppPlan.model_validate_json(ap.model_dump_json()) == ap  # serializable like every plan


def test_the_offline_preview_shows_the_takeover_when_the_spec_asks_for_it() -> None:
    head = app(**CKPT, takeover={"from": "FlinkDeployment/legacy"})
    the_plan = plan(dataclasses.replace(inp([head]), mode="offline"))
    ap = the_plan.app("orders")
    assert ap.action is Action.TAKEOVER and tuple(s.type for s in ap.steps) == TAKEOVER_STEPS
    text = render_text(the_plan)
    assert "takeover" in text and "FlinkDeployment default/legacy with a savepoint" in text
    assert "RISK" in text and "TAKES OVER FlinkDeployment default/legacy" in text
    # without spec.takeover an offline preview cannot know of a FlinkDeployment: a create
    assert plan(dataclasses.replace(inp([app()]), mode="offline")).app("orders").action is Action.CREATE


def test_operator_view_reads_what_the_plan_needs() -> None:
    doc = fd(conf={"state.savepoints.dir": "s3://b/sp"})
    doc["spec"]["job"] = {"state": "running", "upgradeMode": "stateless"}
    v = operator_view(doc, durable)
    assert (v.namespace, v.name, v.job_state, v.upgrade_mode, v.lifecycle, v.refusal) == (
        "shop", "orders", "running", "stateless", "STABLE", None)
    assert operator_view(fd(conf={}), durable).refusal is not None
    assert v.not_suspendable is None
    assert "job is FAILED" in str(operator_view(fd({"jobStatus": {"state": "FAILED"}}), durable).not_suspendable)


def test_the_suspended_takeover_starts_from_the_named_savepoint_and_rolls_back_to_it() -> None:
    ap = plan(inp([app(job={"initialSavepointPath": "s3://b/sp/savepoint-9"})],
                  live=[operated(op=SUSPENDED_OP)])).app("orders")
    starts = [s for s in (*ap.steps, *ap.rollback) if isinstance(s, StartJob)]
    assert len(starts) == 2 and all(s.restore.kind is RestoreKind.PATH and s.restore.path == "s3://b/sp/savepoint-9"
                                    for s in starts)
    assert ap.abort == () and ap.rollback_after == 0
    assert any("spec.job.initialSavepointPath s3://b/sp/savepoint-9" in r for r in ap.risks)
