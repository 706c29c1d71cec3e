"""The process node's own contract, with small host processes instead of Flink (fast): it binds pods, gives
each its own loopback address, resolves env and mounts volumes, runs readiness probes for real, restarts a
crashing container with a CrashLoopBackOff status from its real exit code, keeps Endpoints in step so the
stand-in's service proxy reaches the pod, rolls Deployments out with Recreate, and stops a deleted pod's
processes before its object goes."""

from __future__ import annotations

import ipaddress
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from reconciler.live.kubernetes.api import Kube
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.process_node import Image, ProcessNode, expand, needs_root_reason

pytestmark = pytest.mark.kubernetes
T = TypeVar("T")
Obj = dict[str, Any]
PY = "python:3"  # an image name the node runs as host commands
SERVER = ("import http.server, os, sys\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        body = (os.environ['POD_IP'] + ' ' + os.environ['GREETING'] + ' '\n"
          "                + open('/etc/demo/greeting.txt').read()).encode()\n"
          "        open(os.path.join('/data', 'hits'), 'a').write('x')\n"
          "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
          "http.server.HTTPServer((os.environ['POD_IP'], 8080), H).serve_forever()\n")


def wait(probe: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    end = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < end:
        last = probe()
        if last:
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}; last {last!r}")


@pytest.fixture
def node(cluster: Cluster, tmp_path: Path) -> Iterator[ProcessNode]:
    if cluster.standin is None:
        pytest.skip("the process node's own tests use the stand-in (pods on a real server need its proxy to "
                    "reach 127.0.0.x, which a real API server refuses)")
    if (why := needs_root_reason()) is not None:
        pytest.skip(why)
    cluster.standin.set_auto_ready(False)
    with ProcessNode(cluster.api_client, namespaces=[cluster.namespace], workdir=tmp_path / "node",
                     images={PY: Image()}, backoff_base_s=0.5, probe_period_s=0.2, tick_s=0.1) as n:
        yield n
    assert n.errors == []


def server_template(greeting: str = "hello", command: list[str] | None = None, logs_on_error: bool = False) -> Obj:
    extra = {"terminationMessagePolicy": "FallbackToLogsOnError"} if logs_on_error else {}
    return {"metadata": {"labels": {"app": "web"}}, "spec": {
        "terminationGracePeriodSeconds": 5,
        "containers": [{
            "name": "main", "image": PY, "command": command or [sys.executable, "-c", SERVER], **extra,
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "WHO", "value": "node"}, {"name": "GREETING", "value": f"{greeting} $(WHO)"}],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
            "volumeMounts": [{"name": "conf", "mountPath": "/etc/demo"}, {"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "conf", "configMap": {"name": "demo", "items": [{"key": "g", "path": "greeting.txt"}]}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}


def setup_objects(c: Cluster, replicas: int = 1, **kw: Any) -> None:
    c.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo"}, "data": {"g": "from-cm"}})
    c.kube.request("POST", f"/api/v1/namespaces/{c.namespace}/persistentvolumeclaims", body={
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    c.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
              "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    c.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
              "spec": {"replicas": replicas, "strategy": {"type": "Recreate"},
                       "selector": {"matchLabels": {"app": "web"}}, "template": server_template(**kw)}})


def pods(c: Cluster) -> list[Obj]:
    return c.kube.list("Pod", c.namespace, "app=web")


def ready_pod(c: Cluster) -> Obj | None:
    for p in pods(c):
        if not p["metadata"].get("deletionTimestamp") and any(
                x["type"] == "Ready" and x["status"] == "True" for x in (p.get("status") or {}).get("conditions", [])):
            return p
    return None


def test_expand_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "x"}
    assert expand("$(A)-$(B)-$(C)-$$(A)", env) == "1-x-$(C)-$(A)"


def test_a_deployment_runs_as_ready_pods_reached_through_the_service_proxy(cluster: Cluster,
                                                                             node: ProcessNode) -> None:
    c = cluster
    setup_objects(c, replicas=2)
    wait(lambda: len([p for p in pods(c) if ready_pod(c)]) == 2 and all(
        any(x["type"] == "Ready" and x["status"] == "True" for x in (p.get("status") or {}).get("conditions", []))
        for p in pods(c)), "two ready pods")
    ps = pods(c)
    ips = sorted(p["status"]["podIP"] for p in ps)
    # each its own loopback address, never the host's 127.0.0.1 (in the block of this process: ip_block_start)
    assert len(set(ips)) == 2 and all(ipaddress.ip_address(ip).is_loopback and ip != "127.0.0.1" for ip in ips)
    assert {p["spec"]["nodeName"] for p in ps} == {"process-node"}
    dep = wait(lambda: (d := c.kube.get("Deployment", c.namespace, "web")) and
               (d.get("status") or {}).get("availableReplicas") == 2 and d, "the Deployment's status")
    assert dep["status"]["observedGeneration"] == dep["metadata"]["generation"]
    # Each pod answers on its own address with its env ($(VAR) expanded, fieldRef) and its ConfigMap file.
    for ip in ips:
        assert httpx.get(f"http://{ip}:8080/").text == f"{ip} hello node from-cm"
    eps = c.kube.request("GET", f"/api/v1/namespaces/{c.namespace}/endpoints/web")
    assert sorted(a["ip"] for a in eps["subsets"][0]["addresses"]) == ips
    assert eps["subsets"][0]["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    # The API server's service proxy reaches a pod through the Endpoints.
    proxied = httpx.get(f"{c.kube.host}/api/v1/namespaces/{c.namespace}/services/web:http/proxy/")
    assert proxied.status_code == 200 and proxied.text.split()[0] in ips
    # Both pods share the claim's directory.
    assert (node.pvc_dir(c.namespace, "data") / "hits").read_text().count("x") >= 3


def test_a_crashing_container_is_restarted_with_crashloopbackoff_and_its_exit_code(cluster: Cluster,
                                                                                  node: ProcessNode) -> None:
    c = cluster
    setup_objects(c, command=[sys.executable, "-c", "import sys; print('starting'); print('Caused by: boom'); "
                                                    "sys.exit(3)"], logs_on_error=True)

    def crashed() -> Obj | None:
        for p in pods(c):
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                if cs["restartCount"] >= 2 and cs.get("lastState"):
                    return p
        return None
    p = wait(crashed, "restarts")
    cs = p["status"]["containerStatuses"][0]
    assert cs["lastState"]["terminated"]["exitCode"] == 3 and cs["lastState"]["terminated"]["reason"] == "Error"
    # FallbackToLogsOnError: the failed run's own log tail is the termination message, as a kubelet writes it.
    assert cs["lastState"]["terminated"]["message"].splitlines() == ["starting", "Caused by: boom"]
    assert cs["ready"] is False
    wait(lambda: any(((x.get("status") or {}).get("containerStatuses") or [{}])[0].get("state", {}).get(
        "waiting", {}).get("reason") == "CrashLoopBackOff" for x in pods(c)), "CrashLoopBackOff")
    events = c.kube.request("GET", Kube.path("Event", c.namespace))["items"]
    assert any(e["reason"] == "BackOff" and e["involvedObject"]["name"] == p["metadata"]["name"] for e in events)
    dep = c.kube.get("Deployment", c.namespace, "web")
    assert dep is not None and dep["status"]["availableReplicas"] == 0


def test_an_unknown_image_and_a_missing_claim_are_reported_like_a_kubelet(cluster: Cluster,
                                                                          node: ProcessNode) -> None:
    c = cluster
    c.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nope"},
              "spec": {"containers": [{"name": "main", "image": "registry.example.com/missing:1"}]}})
    c.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "noclaim"},
              "spec": {"containers": [{"name": "main", "image": PY, "command": ["sleep", "60"]}],
                       "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "absent"}}]}})

    def state(name: str) -> Obj | None:
        p = c.kube.get("Pod", c.namespace, name)
        return (p or {}).get("status")
    st = wait(lambda: (s := state("nope")) and s.get("containerStatuses") and s, "image status")
    assert st["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
    st = wait(lambda: (s := state("noclaim")) and s.get("conditions") and s, "unschedulable")
    assert st["conditions"][0]["reason"] == "Unschedulable" and '"absent" not found' in st["conditions"][0]["message"]


def test_recreate_rollout_and_deletion_stop_the_old_processes_before_the_pod_object_goes(
        cluster: Cluster, node: ProcessNode) -> None:
    c = cluster
    setup_objects(c)
    old = wait(lambda: ready_pod(c), "a ready pod")
    old_ip = old["status"]["podIP"]
    run = node.run_of(c.namespace, old["metadata"]["name"])
    assert run is not None
    proc = run.containers[0].proc
    assert proc is not None
    # A template change: Recreate deletes the old pod (gracefully: it stays, marked, until its process is
    # gone), then creates the new one.
    c.patch("Deployment", "web", {"spec": {"template": server_template(greeting="bye")}}, manager="user")
    new = wait(lambda: (p := ready_pod(c)) and p["metadata"]["name"] != old["metadata"]["name"] and p, "new pod")
    assert proc.poll() is not None  # the old process was stopped
    assert c.kube.get("Pod", c.namespace, old["metadata"]["name"]) is None
    assert httpx.get(f"http://{new['status']['podIP']}:8080/").text.endswith("bye node from-cm")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{old_ip}:8080/", timeout=1)
    # Deleting the Deployment cascades to the pod; the node stops it and removes the object.
    c.kube.delete("Deployment", c.namespace, "web")
    marked = c.kube.get("Pod", c.namespace, new["metadata"]["name"])
    assert marked is None or marked["metadata"].get("deletionTimestamp")
    wait(lambda: not pods(c), "pods gone")
    eps = c.kube.request("GET", f"/api/v1/namespaces/{c.namespace}/endpoints/web")
    assert eps.get("subsets") == []
    assert httpx.get(f"{c.kube.host}/api/v1/namespaces/{c.namespace}/services/web:http/proxy/").status_code == 503
