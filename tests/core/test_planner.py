"""The decision table, as a table. Each row: a situation and exactly what the plan must say."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from reconciler.core.observed import ClusterPhase, JobPhase, LiveApp, Outcome
from reconciler.core.plan import Action, AppPlan, RestoreKind, StartJob, deterministic_job_id, spec_hash
from reconciler.core.planner import Desired, PlanInput, Policy, plan
from reconciler.errors import SpecError
from tests.core.builders import (
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


def mode(m: str, **kw: Any) -> dict[str, Any]:
    return {"job": {"upgradeMode": m, **kw}}


P1 = app()
P2 = app(job={"parallelism": 2})
START = ("EnsureCluster", "StartJob", "AwaitRunning")
ROLLBACK = ("EnsureCluster", "StartJob", "AwaitRunning")

ROWS = [
    Row("create", inp([P1]), Action.CREATE, START, "none", reason="new app"),
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
    Row("failed job, savepoint mode, no checkpoint: blocked with instructions",
        inp([app(job={"args": ["v2"]})], [P1], [failed()], [record(savepoint_age=timedelta(days=1))]),
        Action.BLOCKED, reason="initialSavepointPath: file:///sp/orders/savepoint-1"),
    Row("failed job, last-state: newest retained checkpoint",
        inp([app(job={"args": ["v2"], "upgradeMode": LAST_STATE})], [app(**mode(LAST_STATE))],
            [failed(ckpt_age=timedelta(hours=9))]),
        Action.UPGRADE, ("CancelJob", *START), "path", rollback=ROLLBACK),
    Row("drift: job died, repaired from a young checkpoint",
        inp([app(job={"maxCheckpointAge": "1h"})], [app(job={"maxCheckpointAge": "1h"})],
            [failed(ckpt_age=timedelta(minutes=1))]),
        Action.REPAIR, ("CancelJob", *START), "path", risk="RESTORES FROM CHECKPOINT"),
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
    assert tuple(s.type for s in result.rollback) == row.rollback
    if row.rollback:
        assert result.rollback_after == 0
        assert all(getattr(s, "spec", "previous") == "previous" for s in result.rollback)
    _assert_safety_invariants(result, row.input)


def _assert_safety_invariants(result: AppPlan, pin: PlanInput) -> None:
    """Rule 1: a job started without state is either a brand-new app or said loudly, with consent."""
    for s in result.steps:
        if isinstance(s, StartJob) and s.restore.kind is RestoreKind.NONE:
            brand_new = pin.previous.get("orders") is None and not (
                (r := pin.records.get("orders")) and r.savepoints)
            assert brand_new or any("WITHOUT STATE" in r for r in result.risks), result
            desired = pin.desired.apps["orders"]
            assert brand_new or desired.spec.job.upgrade_mode.value == "stateless" or \
                desired.spec.job.savepoint_redeploy_nonce is not None
    if result.action in (Action.BLOCKED, Action.ERROR, Action.NOOP):
        assert result.steps == ()


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
