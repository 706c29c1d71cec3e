"""The Kubernetes API client: one `ApiClient`, plain JSON requests, and the API server's answers as our errors.

The only module that imports `kubernetes` (the client library; an import-linter contract in pyproject.toml
keeps it so). Everything else talks to the API server through `Kube`, so auth, TLS and proxies (from a
kubeconfig or the in-cluster service account) are set up in one place, and so is the mapping of the API's
answers to the one exception tree: a refusal (4xx) is permanent, an unreachable or overloaded server (5xx,
429, connection errors) is worth retrying. Every kind is handled alike as plain JSON through one generic
request helper, the way server-side apply wants it.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from reconciler.errors import PermanentStepError, TransientStepError
from reconciler.live.kubernetes import render as r

Obj = dict[str, Any]

# kind -> (API path prefix, plural). Everything the renderer can produce, plus what we observe.
RESOURCES: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Pod": ("/api/v1", "pods"),
    "Event": ("/api/v1", "events"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "ResourceQuota": ("/api/v1", "resourcequotas"),
    "FlinkDeployment": ("/apis/flink.apache.org/v1beta1", "flinkdeployments"),  # the operator's, for a takeover
}


class KubernetesApiError(PermanentStepError):
    """The API server refused a request (4xx). Carries its Status: `code`, `reason`, `message`, `causes`."""

    def __init__(self, what: str, code: int, reason: str, message: str, causes: list[Obj] | None = None) -> None:
        self.code, self.reason, self.api_message, self.causes = code, reason, message, causes or []
        super().__init__(f"{what}: {code} {reason}: {message}")


class ApplyConflictError(KubernetesApiError):
    """Server-side apply found fields owned by another manager (someone edited our objects by hand)."""

    @property
    def managers(self) -> list[str]:
        out = []
        for c in self.causes:
            msg = str(c.get("message", ""))
            if msg.startswith('conflict with "'):
                out.append(msg.split('"')[1])
        return sorted(set(out))


class KubernetesUnavailableError(TransientStepError):
    """The API server could not be reached or answered 5xx/429: worth retrying."""

    def __init__(self, what: str, code: int, message: str) -> None:
        self.code = code
        super().__init__(f"{what}: {code or 'connection failed'}: {message}")


def _parse_status(body: bytes) -> tuple[str, str, list[Obj]]:
    try:
        st = json.loads(body or b"{}")
    except ValueError:
        return "", body.decode("utf-8", "replace")[:500], []
    if not isinstance(st, dict):
        return "", str(st)[:500], []
    return str(st.get("reason", "")), str(st.get("message", "")), list((st.get("details") or {}).get("causes") or [])


class Kube:
    """JSON requests on one ApiClient. Raises KubernetesApiError / KubernetesUnavailableError."""

    def __init__(self, api_client: ApiClient, *, timeout: float = 30.0) -> None:
        self.api_client = api_client
        self.timeout = timeout

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host).rstrip("/")

    def request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                body: Any = None, content_type: str = "application/json") -> Any:
        what = f"{method} {path}"
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            ser = self.api_client.param_serialize(method, path, query_params=query or [], header_params=headers,
                                                  body=body, auth_settings=["BearerToken"])
            resp = self.api_client.call_api(*ser, _request_timeout=self.timeout)
            data: bytes = resp.read() or b""  # type: ignore[no-untyped-call]
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise KubernetesUnavailableError(what, getattr(e, "status", 0) or 0, str(e).strip()) from e
        if resp.status >= 400:
            reason, message, causes = _parse_status(data)
            if resp.status >= 500 or resp.status == 429:
                raise KubernetesUnavailableError(what, resp.status, f"{reason}: {message}")
            cls = ApplyConflictError if resp.status == 409 and content_type.startswith("application/apply-patch") \
                else KubernetesApiError
            raise cls(what, resp.status, reason, message, causes)
        return json.loads(data) if data else {}

    # Paths
    @staticmethod
    def path(kind: str, namespace: str | None, name: str | None = None) -> str:
        prefix, plural = RESOURCES[kind]
        p = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
        return f"{p}/{name}" if name else p

    def list(self, kind: str, namespace: str, selector: str) -> list[Obj]:
        items: list[Obj] = self.request("GET", self.path(kind, namespace), query=[("labelSelector", selector)]
                                        ).get("items", [])
        for it in items:  # list items come without kind (the real API omits it)
            it.setdefault("kind", kind)
        return items

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            obj: Obj = self.request("GET", self.path(kind, namespace, name))
            return obj
        except KubernetesApiError as e:
            if e.code == 404:
                return None
            raise

    def apply(self, obj: Obj, *, force: bool, manager: str = r.FIELD_MANAGER) -> Obj:
        meta = obj["metadata"]
        query = [("fieldManager", manager)] + ([("force", "true")] if force else [])
        out: Obj = self.request("PATCH", self.path(obj["kind"], meta.get("namespace"), meta["name"]),
                                query=query, body=obj, content_type="application/apply-patch+yaml")
        return out

    def delete(self, kind: str, namespace: str, name: str, *, policy: str = "Background") -> bool:
        """False when it was already gone."""
        try:
            self.request("DELETE", self.path(kind, namespace, name), query=[("propagationPolicy", policy)],
                         body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": policy})
            return True
        except KubernetesApiError as e:
            if e.code == 404:
                return False
            raise


def client_from_kubeconfig(path: str | None = None, *, context: str | None = None) -> ApiClient:
    """An ApiClient from a kubeconfig file (None: $KUBECONFIG or ~/.kube/config) and one of its contexts."""
    api: ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=path, context=context)
    return api


def in_cluster_client() -> ApiClient:
    """An ApiClient from the pod's service account (token, CA and the API server's address)."""
    cfg = k8s_client.Configuration()
    k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return ApiClient(cfg)


__all__ = [
    "RESOURCES",
    "ApiClient",
    "ApplyConflictError",
    "Kube",
    "KubernetesApiError",
    "KubernetesUnavailableError",
    "Obj",
    "client_from_kubeconfig",
    "in_cluster_client",
]
