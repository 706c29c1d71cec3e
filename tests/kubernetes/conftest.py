"""The API under test: the loopback stand-in by default, a real cluster when
FLINK_RECONCILER_TEST_KUBECONFIG names a kubeconfig (each test then gets a throwaway namespace)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from reconciler.clock import Clock, FakeClock, SystemClock
from reconciler.live.kubernetes.api import Kube
from tests.kubernetes.standin import Standin

KUBECONFIG = os.environ.get("FLINK_RECONCILER_TEST_KUBECONFIG")


@dataclass
class Cluster:
    api_client: k8s_client.ApiClient
    namespace: str
    clock: Clock
    poll: float
    standin: Standin | None  # None: a real API server

    @property
    def kube(self) -> Kube:
        return Kube(self.api_client)

    @property
    def real(self) -> bool:
        return self.standin is None

    def create(self, obj: dict[str, Any], manager: str = "kubelet") -> dict[str, Any]:
        """Create an object as another actor would (a kubelet, a user)."""
        meta = obj["metadata"]
        out: dict[str, Any] = self.kube.request("POST", Kube.path(obj["kind"], meta.get("namespace", self.namespace)),
                                                query=[("fieldManager", manager)], body=obj)
        return out

    def patch(self, kind: str, name: str, body: dict[str, Any], *, manager: str, status: bool = False) -> Any:
        path = Kube.path(kind, self.namespace, name) + ("/status" if status else "")
        return self.kube.request("PATCH", path, query=[("fieldManager", manager)], body=body,
                                 content_type="application/merge-patch+json")


@pytest.fixture(scope="session")
def _standin() -> Iterator[Standin | None]:
    if KUBECONFIG:
        yield None
        return
    with Standin() as s:
        yield s


@pytest.fixture
def cluster(_standin: Standin | None) -> Iterator[Cluster]:
    if _standin is None:
        assert KUBECONFIG
        api = k8s_config.new_client_from_config(config_file=KUBECONFIG)  # type: ignore[no-untyped-call]
        ns = f"fr-test-{uuid.uuid4().hex[:8]}"
        k8s_client.CoreV1Api(api).create_namespace(k8s_client.V1Namespace(metadata=k8s_client.V1ObjectMeta(name=ns)))
        try:
            yield Cluster(api, ns, SystemClock(), 1.0, None)
        finally:
            k8s_client.CoreV1Api(api).delete_namespace(ns, propagation_policy="Background")
        return
    cfg = k8s_client.Configuration()
    cfg.host = _standin.url
    cfg.api_key["BearerToken"] = "Bearer stand-in-token"
    _standin.set_auto_ready(True)
    _standin.reset_access()
    _standin.api.reset_log()
    ns = f"fr-test-{uuid.uuid4().hex[:8]}"
    yield Cluster(k8s_client.ApiClient(cfg), ns, FakeClock(), 5.0, _standin)  # FakeClock: polls cost no time


def real_kubelet(cluster: Cluster) -> str | None:
    """The name of a node whose kubelet runs containers (it reports a container runtime), on a real cluster."""
    if cluster.standin is not None:
        return None
    for node in k8s_client.CoreV1Api(cluster.api_client).list_node().items:
        if node.status and node.status.node_info and node.status.node_info.container_runtime_version:
            return str(node.metadata.name if node.metadata else "?")
    return None


@pytest.fixture
def pods_never_run(cluster: Cluster) -> Cluster:
    """`cluster` where nothing runs this module's example app (s3:// storage, a job jar no image has): the stand-in
    or a bare API server, whose workloads the test (or the stand-in) reports ready. On a real kubelet its pods
    crash-loop; the node lane's e2e modules cover the same runtime calls with pods that run."""
    if node := real_kubelet(cluster):
        pytest.skip(f"node {node} runs containers: this test's app (s3:// storage) cannot run there")
    return cluster


@pytest.fixture
def standin_only(cluster: Cluster) -> Standin:
    if cluster.standin is None:
        pytest.skip("needs the stand-in (request log / proxy backends)")
    return cluster.standin


FLINKDEPLOYMENT_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "flinkdeployments.flink.apache.org"},
    "spec": {"group": "flink.apache.org", "scope": "Namespaced",
             "names": {"kind": "FlinkDeployment", "plural": "flinkdeployments", "singular": "flinkdeployment",
                       "listKind": "FlinkDeploymentList"},
             "versions": [{"name": "v1beta1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest.fixture(scope="module")
def flink_operator_crd(_standin: Standin | None) -> Iterator[None]:
    """On a real API server: the operator's CustomResourceDefinition (a schemaless stand-in of its CRD), made for
    a module (the operator takeover tests) when it is not installed, and removed again if it was made here."""
    if _standin is not None:
        yield
        return
    assert KUBECONFIG
    api = k8s_config.new_client_from_config(config_file=KUBECONFIG)  # type: ignore[no-untyped-call]
    ext = k8s_client.ApiextensionsV1Api(api)
    made = False
    try:
        ext.read_custom_resource_definition(FLINKDEPLOYMENT_CRD["metadata"]["name"])
    except k8s_client.ApiException as e:
        if e.status != 404:
            raise
        ext.create_custom_resource_definition(FLINKDEPLOYMENT_CRD)  # type: ignore[arg-type]  # the client takes a plain dict too
        made = True
        for _ in range(100):  # established: served
            got = ext.read_custom_resource_definition(FLINKDEPLOYMENT_CRD["metadata"]["name"])
            conditions = (got.status.conditions if got.status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            time.sleep(0.1)
    try:
        yield
    finally:
        if made:
            ext.delete_custom_resource_definition(FLINKDEPLOYMENT_CRD["metadata"]["name"])
            # Gone before the next module looks for it: a CRD still terminating reads as installed, then vanishes.
            for _ in range(300):
                try:
                    ext.read_custom_resource_definition(FLINKDEPLOYMENT_CRD["metadata"]["name"])
                except k8s_client.ApiException as e:
                    if e.status == 404:
                        break
                    raise
                time.sleep(0.1)
