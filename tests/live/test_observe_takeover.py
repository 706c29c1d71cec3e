"""Which apps the observer looks up FlinkDeployments for, and what it says when it cannot (live.observe)."""

from __future__ import annotations

from typing import Any

from reconciler.core.observed import LiveState
from reconciler.errors import ObserveError
from reconciler.live.observe import with_operator_deployments
from tests.core.builders import app

FD: dict[str, Any] = {"metadata": {"name": "orders", "namespace": "default"},
                      "spec": {"flinkConfiguration": {"state.savepoints.dir": "s3://b/sp"},
                               "job": {"state": "running", "upgradeMode": "savepoint"}},
                      "status": {"lifecycleState": "STABLE", "jobStatus": {"state": "RUNNING"}}}


class Operator:
    """A runtime with FlinkDeployments (live.ports.OperatorTakeover), counting its lists."""

    name = "kubernetes"

    def __init__(self, found: dict[tuple[str, str], dict[str, Any]] | None = None, error: str | None = None) -> None:
        self.found, self.error, self.lists = found or {}, error, 0

    def flink_deployments(self) -> dict[tuple[str, str], dict[str, Any]]:
        self.lists += 1
        if self.error:
            raise ObserveError(self.error)
        return self.found

    def flink_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.found.get((namespace, name))

    def suspend_flink_deployment(self, namespace: str, name: str, *, patch: dict[str, Any]) -> None: ...
    def release_flink_deployment(self, namespace: str, name: str, *, patch: dict[str, Any]) -> None: ...
    def savepoint_on_storage(self, uri: str) -> bool | None: ...
    def delete_flink_deployment(self, namespace: str, name: str, *, deadline: float) -> None: ...

    def savepoint_storage_problem(self, deployment: dict[str, Any], uri: str) -> str | None:
        return None if uri.startswith("s3://") else "the pod's own disk"


def test_first_sight_apps_get_their_flinkdeployment_and_known_apps_cost_no_request() -> None:
    rt = Operator({("default", "orders"): FD})
    live = with_operator_deployments(rt, LiveState(), {"orders": app(), "other": app("other")}, known=())
    op = live.get("orders").operator
    assert op is not None and (op.name, op.job_state, op.upgrade_mode, op.refusal) == ("orders", "running",
                                                                                        "savepoint", None)
    assert live.get("other").operator is None and rt.lists == 1
    assert with_operator_deployments(rt, LiveState(), {"orders": app()}, known={"orders"}) == LiveState()
    assert rt.lists == 1  # every app has a record and none names a takeover: nothing listed


def test_spec_takeover_names_the_flinkdeployment_even_for_a_known_app() -> None:
    rt = Operator({("default", "legacy"): {**FD, "metadata": {"name": "legacy", "namespace": "default"}}})
    live = with_operator_deployments(rt, LiveState(), {"orders": app(takeover={"from": "FlinkDeployment/legacy"})},
                                     known={"orders"})
    op = live.get("orders").operator
    assert op is not None and op.name == "legacy"


def test_unreadable_is_said_never_none() -> None:
    live = with_operator_deployments(Operator(error="403 Forbidden"), LiveState(), {"orders": app()}, known=())
    op = live.get("orders").operator
    assert op is not None and op.unreadable == "403 Forbidden"


class Local:
    name = "local"


def test_a_runtime_without_flinkdeployments_says_so_for_apps_that_ask_for_a_takeover() -> None:
    apps = {"orders": app(takeover={"from": "FlinkDeployment/orders"}), "other": app("other")}
    live = with_operator_deployments(Local(), LiveState(), apps, known=())
    op = live.get("orders").operator
    assert op is not None and op.unreadable is not None and "the local runtime has no FlinkDeployments" in op.unreadable
    assert live.get("other").operator is None
    assert with_operator_deployments(None, LiveState(), apps, known=()) == LiveState()
