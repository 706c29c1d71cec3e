"""The Apache Flink Kubernetes Operator's FlinkDeployments, for a takeover (`reconciler.live.ports.OperatorTakeover`).

A mixin of `KubernetesRuntime` (runtime), through the same `Kube` client: list, read, merge-patch and delete
`flink.apache.org/v1beta1` FlinkDeployments. The operator does everything to its own pods: a merge patch of
spec.job asks it to stop its job with a savepoint, and deleting the FlinkDeployment lets its finalizer remove the
rest. We only wait, with a deadline, until nothing of it is left that would clash with our objects (its
`<name>-rest` Service is ours once we start) or start a job of its own: its Deployments, pods, Services and
ConfigMaps (its Flink configuration, and its HA metadata, which a JobManager of the same cluster-id would recover
from), in native mode or standalone mode alike.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from reconciler.clock import Clock
from reconciler.errors import DeadlineExceededError, ObserveError, PermanentStepError
from reconciler.live.kubernetes.api import Kube, KubernetesApiError, KubernetesUnavailableError, Obj
from reconciler.live.kubernetes.storage import storage_problem

KIND = "FlinkDeployment"
GROUP_VERSION = "flink.apache.org/v1beta1"
# How long an answer of API discovery (is the operator's resource served?) is kept: asked only after a 403.
SERVED_TTL_S = 300.0
# The `type` label of the operator's objects: Flink's native Kubernetes integration (native mode, and every HA
# ConfigMap), and the operator's standalone mode (StandaloneKubernetesUtils).
NATIVE_TYPE = "flink-native-kubernetes"
STANDALONE_TYPE = "flink-standalone-kubernetes"
_LEFTOVER_KINDS = ("Deployment", "Pod", "ConfigMap")


def local_savepoint_probe(uri: str) -> bool | None:
    """`_metadata` of a file:// savepoint when this process sees its directory's parent (the same volume mounted at
    the same path as in Flink's pods); None otherwise (object storage, or a volume only the pods mount)."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    path = Path(parsed.path)
    if not path.parent.is_dir():
        return None
    return (path / "_metadata").is_file()


class OperatorDeployments:
    """The takeover half of `KubernetesRuntime`: the operator's FlinkDeployments."""

    if TYPE_CHECKING:  # KubernetesRuntime's, which this is mixed into
        kube: Kube
        clock: Clock
        namespaces: tuple[str, ...]
        poll_interval: float
        savepoint_probe: Callable[[str], bool | None]
        _served: tuple[float, bool] | None

    def flink_deployments(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every FlinkDeployment in the watched namespaces; none where the operator's resource is not served. One
        list per namespace. Raises ObserveError when they cannot be read: the caller must not read that as none."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for ns in self.namespaces:
            try:
                items = self.kube.list(KIND, ns, "")
            except KubernetesApiError as e:
                # 404: the operator's CRD is not installed, nothing to take over. A 403 says nothing about that
                # (the API server authorizes before it looks the resource up): discovery tells.
                if e.code == 404 or (e.code == 403 and not self._flinkdeployments_served()):
                    continue
                if e.code == 403:  # the API server's own words name the verb, the resource and who was refused
                    raise ObserveError(f"{e.code} {e.reason}: {e.api_message}") from e
                raise ObserveError(f"cannot list FlinkDeployments in namespace {ns}: {e}") from e
            except KubernetesUnavailableError as e:
                raise ObserveError(f"cannot list FlinkDeployments in namespace {ns}: {e}") from e
            for it in items:
                meta = it.get("metadata") or {}
                out[(str(meta.get("namespace") or ns), str(meta.get("name")))] = it
        return out

    def _flinkdeployments_served(self) -> bool:
        """Whether the API server serves the operator's FlinkDeployments (its CRD is installed), from API discovery,
        which every authenticated client may read (`system:discovery`). Kept for SERVED_TTL_S; asked only after a
        403, so a cluster without the operator pays nothing. An answer that cannot be had counts as served: unknown
        is never read as "no operator here"."""
        now = self.clock.monotonic()
        if self._served is not None and now - self._served[0] < SERVED_TTL_S:
            return self._served[1]
        try:
            found = self.kube.request("GET", f"/apis/{GROUP_VERSION}")
        except KubernetesApiError as e:
            if e.code != 404:
                return True
            served = False
        except KubernetesUnavailableError:
            return True
        else:
            served = any(r.get("name") == "flinkdeployments" for r in found.get("resources") or [])
        self._served = (now, served)
        return served

    def flink_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get(KIND, namespace, name)

    def suspend_flink_deployment(self, namespace: str, name: str, *, patch: Obj) -> None:
        self._patch(namespace, name, patch, missing_ok=False)

    def release_flink_deployment(self, namespace: str, name: str, *, patch: Obj) -> None:
        self._patch(namespace, name, patch, missing_ok=True)

    def savepoint_on_storage(self, uri: str) -> bool | None:
        return self.savepoint_probe(uri)

    def _patch(self, namespace: str, name: str, patch: Obj, *, missing_ok: bool) -> None:
        path = Kube.path(KIND, namespace, name)
        try:
            self.kube.request("PATCH", path, query=[("fieldManager", "flink-reconciler-takeover")],
                              body=patch, content_type="application/merge-patch+json")
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
        selector = f"app={name},type in ({NATIVE_TYPE},{STANDALONE_TYPE})"
        for kind in _LEFTOVER_KINDS:
            left += [f"{kind}/{o['metadata']['name']}" for o in self.kube.list(kind, namespace, selector)]
        # Its Services by label, and whatever holds the names our Services take (only while a takeover waits).
        clash = {name, f"{name}-rest"}
        for o in self.kube.list("Service", namespace, ""):
            meta = o.get("metadata") or {}
            labels = meta.get("labels") or {}
            if meta.get("name") in clash or (labels.get("app") == name
                                             and labels.get("type") in (NATIVE_TYPE, STANDALONE_TYPE)):
                left.append(f"Service/{meta.get('name')}")
        return left

    def savepoint_storage_problem(self, deployment: dict[str, Any], uri: str) -> str | None:
        spec = deployment.get("spec")
        template = spec.get("podTemplate") if isinstance(spec, dict) else None
        return storage_problem(uri, template if isinstance(template, dict) else None)
