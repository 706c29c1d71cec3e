"""The stand-in's own contract: each extension over kmock behaves as the real API server does for it.

Marked `kubernetes`: with FLINK_RECONCILER_TEST_KUBECONFIG these same assertions run against a real
API server, which is how the stand-in is kept honest.
"""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.live.kubernetes.api import ApplyConflictError, Kube, KubernetesApiError
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.standin import parse_selector, selector_matches

pytestmark = pytest.mark.kubernetes


def cm(name: str, data: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta}, "data": data or {}}


def apply(c: Cluster, obj: dict[str, Any], manager: str = "flink-reconciler", force: bool = False) -> Any:
    obj["metadata"]["namespace"] = c.namespace
    q = [("fieldManager", manager)] + ([("force", "true")] if force else [])
    return c.kube.request("PATCH", Kube.path(obj["kind"], c.namespace, obj["metadata"]["name"]), query=q, body=obj,
                          content_type="application/apply-patch+yaml")


def test_label_selectors(cluster: Cluster) -> None:
    apply(cluster, cm("a", labels={"app": "x", "tier": "db"}))
    apply(cluster, cm("b", labels={"app": "y"}))
    apply(cluster, cm("c"))

    def sel(s: str) -> set[str]:
        return {o["metadata"]["name"] for o in cluster.kube.list("ConfigMap", cluster.namespace, s)} & {"a", "b", "c"}

    assert sel("app=x") == {"a"}
    assert sel("app!=x") == {"b", "c"}
    assert sel("app in (x,y)") == {"a", "b"}
    assert sel("app notin (x)") == {"b", "c"}
    assert sel("app") == {"a", "b"}
    assert sel("!app") == {"c"}
    assert sel("app=x,tier=db") == {"a"}
    assert sel("app=x,tier=web") == set()


def test_selector_parser_edge_cases() -> None:
    reqs = parse_selector("a in (1, 2),b==3,!c")
    assert selector_matches(reqs, {"a": "2", "b": "3"})
    assert not selector_matches(reqs, {"a": "2", "b": "3", "c": ""})


def test_apply_creates_merges_and_drops_fields_its_manager_no_longer_sets(cluster: Cluster) -> None:
    first = apply(cluster, cm("x", {"a": "1", "b": "2"}))
    assert first["metadata"]["managedFields"][0]["manager"] == "flink-reconciler"
    assert first["metadata"]["managedFields"][0]["operation"] == "Apply"
    again = apply(cluster, cm("x", {"a": "1", "b": "2"}))
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]  # no-op apply
    later = apply(cluster, cm("x", {"a": "1"}))
    assert later["data"] == {"a": "1"}
    assert int(later["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    apply(cluster, cm("x", {"other": "z"}), manager="someone")  # a second manager adds its own field
    mine = apply(cluster, cm("x", {"a": "2"}))
    assert mine["data"] == {"a": "2", "other": "z"}


def test_apply_conflict_names_manager_and_field_and_force_takes_over(cluster: Cluster) -> None:
    apply(cluster, cm("x", {"a": "1"}))
    cluster.patch("ConfigMap", "x", {"data": {"a": "hand-edited"}}, manager="kubectl-edit")
    with pytest.raises(ApplyConflictError) as e:
        apply(cluster, cm("x", {"a": "1"}))
    assert e.value.code == 409 and e.value.reason == "Conflict"
    assert e.value.managers == ["kubectl-edit"]
    assert [c["field"] for c in e.value.causes] == [".data.a"]
    apply(cluster, cm("x", {"a": "hand-edited"}))  # the same value is shared ownership, no conflict
    out = apply(cluster, cm("x", {"a": "1"}), force=True)
    assert out["data"]["a"] == "1"


def test_apply_needs_a_field_manager(cluster: Cluster) -> None:
    obj = cm("x", {"a": "1"})
    obj["metadata"]["namespace"] = cluster.namespace
    with pytest.raises(KubernetesApiError) as e:
        cluster.kube.request("PATCH", Kube.path("ConfigMap", cluster.namespace, "x"), body=obj,
                             content_type="application/apply-patch+yaml")
    assert e.value.code in (400, 422) and "fieldManager" in e.value.api_message


def test_create_conflict_not_found_and_stale_resource_version(cluster: Cluster) -> None:
    created = cluster.create(cm("x", {"a": "1"}))
    with pytest.raises(KubernetesApiError) as e:
        cluster.create(cm("x"))
    assert (e.value.code, e.value.reason) == (409, "AlreadyExists")
    assert e.value.api_message == 'configmaps "x" already exists'
    assert cluster.kube.get("ConfigMap", cluster.namespace, "nope") is None
    with pytest.raises(KubernetesApiError) as e:
        cluster.kube.request("GET", Kube.path("Deployment", cluster.namespace, "nope"))
    assert (e.value.code, e.value.reason, e.value.api_message) == (404, "NotFound", 'deployments.apps "nope" not found')
    path = Kube.path("ConfigMap", cluster.namespace, "x")
    fresh = cluster.kube.request("PUT", path, body={**created, "data": {"a": "2"}})
    assert fresh["metadata"]["uid"] == created["metadata"]["uid"]
    with pytest.raises(KubernetesApiError) as e:
        cluster.kube.request("PUT", path, body={**created, "data": {"a": "3"}})  # created's rv is stale now
    assert (e.value.code, e.value.reason) == (409, "Conflict")


def test_generation_moves_with_spec_and_deployment_annotations(cluster: Cluster) -> None:
    """As the real API server (v1.36): a Deployment's generation also rises when only its annotations change
    (PrepareForUpdate of the apps Deployment strategy); labels do not move it."""
    dep: dict[str, Any] = {
           "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "labels": {"a": "b"}},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}},
                                 "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}}}
    one = apply(cluster, dep)
    assert one["metadata"]["generation"] == 1
    dep["metadata"]["labels"]["c"] = "d"
    assert apply(cluster, dep)["metadata"]["generation"] == 1
    dep["metadata"]["annotations"] = {"note": "x"}
    assert apply(cluster, dep)["metadata"]["generation"] == 2
    assert apply(cluster, dep)["metadata"]["generation"] == 2  # the same apply again changes nothing
    dep["spec"]["replicas"] = 0
    two = apply(cluster, dep)
    assert two["metadata"]["generation"] == 3
    assert two["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"  # defaulted


def test_garbage_collection_follows_owner_references(cluster: Cluster) -> None:
    root = cluster.create(cm("root"))
    ref = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "root", "uid": root["metadata"]["uid"]}]
    cluster.create(cm("child", ownerReferences=ref))
    child = cluster.kube.get("ConfigMap", cluster.namespace, "child")
    assert child is not None
    cluster.create(cm("grandchild", ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "child",
                                                      "uid": child["metadata"]["uid"]}]))
    root2 = cluster.create(cm("root2"))
    cluster.create(cm("orphan", ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "root2",
                                                  "uid": root2["metadata"]["uid"]}]))
    assert cluster.kube.delete("ConfigMap", cluster.namespace, "root")
    assert cluster.kube.delete("ConfigMap", cluster.namespace, "root2", policy="Orphan")
    assert not cluster.kube.delete("ConfigMap", cluster.namespace, "root")  # already gone: 404
    if cluster.real:  # the real collector is asynchronous
        import time
        for _ in range(30):
            if cluster.kube.get("ConfigMap", cluster.namespace, "grandchild") is None:
                break
            time.sleep(1)
    assert cluster.kube.get("ConfigMap", cluster.namespace, "child") is None
    assert cluster.kube.get("ConfigMap", cluster.namespace, "grandchild") is None
    orphan = cluster.kube.get("ConfigMap", cluster.namespace, "orphan")
    assert orphan is not None and not orphan["metadata"].get("ownerReferences")


def test_finalizers_hold_deletion(cluster: Cluster) -> None:
    cluster.create(cm("held", finalizers=["example.com/hold"]))
    assert cluster.kube.delete("ConfigMap", cluster.namespace, "held")
    held = cluster.kube.get("ConfigMap", cluster.namespace, "held")
    assert held is not None and held["metadata"]["deletionTimestamp"]
    cluster.patch("ConfigMap", "held", {"metadata": {"finalizers": None}}, manager="someone")
    assert cluster.kube.get("ConfigMap", cluster.namespace, "held") is None


def test_status_subresource_is_separate(cluster: Cluster, standin_only: Any) -> None:
    standin_only.set_auto_ready(False)
    pod = cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                          "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
                          "status": {"phase": "Running"}})
    assert "phase" not in (pod.get("status") or {})  # status is ignored on create
    cluster.patch("Pod", "p", {"status": {"phase": "Pending"}}, manager="kubelet", status=True)
    cluster.patch("Pod", "p", {"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Failed"}}, manager="me")
    live = cluster.kube.get("Pod", cluster.namespace, "p")
    assert live is not None and live["status"]["phase"] == "Pending" and live["metadata"]["labels"] == {"x": "y"}


def test_request_counter(cluster: Cluster, standin_only: Any) -> None:
    cluster.kube.list("ConfigMap", cluster.namespace, "a=b")
    cluster.kube.list("ConfigMap", cluster.namespace, "a=b")
    cluster.kube.get("Deployment", cluster.namespace, "x")
    assert standin_only.api.counts() == {"list configmaps": 2, "get deployments.apps": 1}
