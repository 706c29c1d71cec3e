"""The runtime `make_runtime` builds for Kubernetes: `SessionRuntime` (live/session.py) over a `KubernetesRuntime`,
whose FlinkSessionCluster half is live/kubernetes/sessions.py. Its own module: it needs both, and runtime imports
sessions (no cycle)."""

from __future__ import annotations

from typing import Any

from reconciler.clock import Clock
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.session import SessionRuntime
from reconciler.spec.model import FlinkApp


class KubernetesSessionRuntime(SessionRuntime):
    """`SessionRuntime` over a `KubernetesRuntime` (what `make_runtime` builds): every app as before, session apps on
    their FlinkSessionClusters. The wrapped runtime's own protocols (`ports.StandbyCapacity`,
    `ports.OperatorTakeover`) are spelled out, so `isinstance` finds them without `__getattr__` (since Python 3.12 a
    protocol check looks attributes up statically)."""

    host: KubernetesRuntime

    def __init__(self, host: KubernetesRuntime, clock: Clock | None = None) -> None:
        super().__init__(host, clock)

    def standby_refusals(self, apps: list[FlinkApp]) -> dict[str, str]:
        return self.host.standby_refusals(apps)

    def flink_deployments(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.host.flink_deployments()

    def flink_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.host.flink_deployment(namespace, name)

    def suspend_flink_deployment(self, namespace: str, name: str, *, patch: dict[str, Any]) -> None:
        self.host.suspend_flink_deployment(namespace, name, patch=patch)

    def release_flink_deployment(self, namespace: str, name: str, *, patch: dict[str, Any]) -> None:
        self.host.release_flink_deployment(namespace, name, patch=patch)

    def savepoint_on_storage(self, uri: str) -> bool | None:
        return self.host.savepoint_on_storage(uri)

    def delete_flink_deployment(self, namespace: str, name: str, *, deadline: float) -> None:
        self.host.delete_flink_deployment(namespace, name, deadline=deadline)

    def savepoint_storage_problem(self, deployment: dict[str, Any], uri: str) -> str | None:
        return self.host.savepoint_storage_problem(deployment, uri)
