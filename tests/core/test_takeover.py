"""When a FlinkDeployment may be taken over, and what the operator's status says after the suspend we ask for."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.core.takeover import suspension, takeover_refusal


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
    (fd({"jobStatus": {"state": "FAILED"}}), "job is FAILED"),
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


@pytest.mark.parametrize(("status", "done", "savepoint", "problem"), [
    ({"lifecycleState": "STABLE", "jobStatus": {"state": "RUNNING"}}, False, None, None),
    ({"lifecycleState": "SUSPENDED", "jobStatus": {"upgradeSavepointPath": "s3://b/sp/savepoint-1"}},
     True, "s3://b/sp/savepoint-1", None),
    ({"lifecycleState": "SUSPENDED", "jobStatus": {}}, True, None, "without a savepoint path"),
    ({"lifecycleState": "FAILED", "error": "savepoint timed out"}, True, None, "savepoint timed out"),
    ({}, False, None, None),
])
def test_suspension(status: dict[str, Any], done: bool, savepoint: str | None, problem: str | None) -> None:
    s = suspension({"status": status})
    assert (s.done, s.savepoint) == (done, savepoint)
    assert (s.problem is None) if problem is None else (s.problem is not None and problem in s.problem)
