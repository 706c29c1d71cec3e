"""The Apache Flink Kubernetes Operator's FlinkDeployments, for a takeover (`reconciler.live.ports.OperatorTakeover`).

A mixin of `KubernetesRuntime` (runtime), through the same `Kube` client: list, read, merge-patch and delete
`flink.apache.org/v1beta1` FlinkDeployments. The operator does everything to its own pods: a merge patch of
spec.job asks it to stop its job with a savepoint, and deleting the FlinkDeployment lets its finalizer remove the
rest. We only wait, with a deadline, until nothing of it is left that would clash with our objects (its
`<name>-rest` Service is ours once we start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reconciler.clock import Clock
from reconciler.errors import DeadlineExceededError, ObserveError, PermanentStepError
from reconciler.live.kubernetes.api import Kube, KubernetesApiError, KubernetesUnavailableError, Obj
from reconciler.live.kubernetes.storage import storage_problem

KIND = "FlinkDeployment"
# Labels Flink's native Kubernetes integration puts on the operator's pods, Services and Deployments.
NATIVE_TYPE = "flink-native-kubernetes"


class OperatorDeployments:
    """The takeover half of `KubernetesRuntime`: the operator's FlinkDeployments."""

    if TYPE_CHECKING:  # KubernetesRuntime's, which this is mixed into
        kube: Kube
        clock: Clock
        namespaces: tuple[str, ...]
        poll_interval: float

    def flink_deployments(self) -> dict[tuple[str, str], dict[str, Any]]:
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for ns in self.namespaces:
            try:
                items = self.kube.list(KIND, ns, "")
            except KubernetesApiError as e:
                if e.code == 404:  # the operator's CRD is not installed: nothing to take over
                    continue
                raise ObserveError(f"cannot list FlinkDeployments in namespace {ns}: {e}") from e
            except KubernetesUnavailableError as e:
                raise ObserveError(f"cannot list FlinkDeployments in namespace {ns}: {e}") from e
            for it in items:
                meta = it.get("metadata") or {}
                out[(str(meta.get("namespace") or ns), str(meta.get("name")))] = it
        return out

    def flink_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get(KIND, namespace, name)

    def suspend_flink_deployment(self, namespace: str, name: str) -> None:
        self._patch_job(namespace, name, {"state": "suspended", "upgradeMode": "savepoint"}, missing_ok=False)

    def release_flink_deployment(self, namespace: str, name: str, *, state: str, upgrade_mode: str | None) -> None:
        self._patch_job(namespace, name, {"state": state, **({"upgradeMode": upgrade_mode} if upgrade_mode else {})},
                        missing_ok=True)

    def _patch_job(self, namespace: str, name: str, job: Obj, *, missing_ok: bool) -> None:
        path = Kube.path(KIND, namespace, name)
        try:
            self.kube.request("PATCH", path, query=[("fieldManager", "flink-reconciler-takeover")],
                              body={"spec": {"job": job}}, content_type="application/merge-patch+json")
        except KubernetesApiError as e:
            if e.code != 404:
                raise
            if not missing_ok:
                raise PermanentStepError(f"FlinkDeployment {namespace}/{name} does not exist") from e

    def delete_flink_deployment(self, namespace: str, name: str, *, deadline: float) -> None:
        start = self.clock.monotonic()
        # Background: the FlinkDeployment goes first, the operator's finalizer and the garbage collector remove
        # its objects; savepoints and checkpoints are in object storage, which no propagation policy reaches.
        self.kube.delete(KIND, namespace, name, policy="Background")
        while True:
            left = self._leftovers(namespace, name)
            if not left:
                return
            if self.clock.monotonic() >= deadline:
                raise DeadlineExceededError(
                    f"FlinkDeployment {namespace}/{name} not gone after {self.clock.monotonic() - start:.0f}s; still "
                    f"present: {'; '.join(left)}")
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - self.clock.monotonic())))

    def _leftovers(self, namespace: str, name: str) -> list[str]:
        left: list[str] = []
        fd = self.kube.get(KIND, namespace, name)
        if fd is not None:
            fins = (fd.get("metadata") or {}).get("finalizers") or []
            left.append(f"{KIND}/{name}" + (f" (finalizers: {', '.join(fins)})" if fins else ""))
        selector = f"app={name},type={NATIVE_TYPE}"
        for kind in ("Deployment", "Pod"):
            left += [f"{kind}/{o['metadata']['name']}" for o in self.kube.list(kind, namespace, selector)]
        # Its Services by label, and whatever holds the names our Services take (only while a takeover waits).
        clash = {name, f"{name}-rest"}
        for o in self.kube.list("Service", namespace, ""):
            meta = o.get("metadata") or {}
            labels = meta.get("labels") or {}
            if meta.get("name") in clash or (labels.get("app") == name and labels.get("type") == NATIVE_TYPE):
                left.append(f"Service/{meta.get('name')}")
        return left

    def savepoint_storage_problem(self, deployment: dict[str, Any], uri: str) -> str | None:
        spec = deployment.get("spec")
        template = spec.get("podTemplate") if isinstance(spec, dict) else None
        return storage_problem(uri, template if isinstance(template, dict) else None)
