"""API-level tests of the kubernetes runtime: apply, observe, drift, prune, delete, stuck transitions.

They run against the stand-in API server on loopback, or against a real cluster with
FLINK_RECONCILER_TEST_KUBECONFIG (see docs/kubernetes.md). Where the stand-in plays the kubelet (pods
with ImagePullBackOff) a real cluster produces the same state by itself from the invalid image.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from reconciler.core.observed import ClusterPhase
from reconciler.errors import DeadlineExceededError, PermanentStepError
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.api import ApplyConflictError
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.kubernetes.status import generation_failure, pod_problem, rewind_warning, workload_ready
from reconciler.spec.model import FlinkApp
from tests.kubernetes.apps import app
from tests.kubernetes.conftest import Cluster

pytestmark = pytest.mark.kubernetes


def runtime(c: Cluster, **kw: Any) -> KubernetesRuntime:
    return KubernetesRuntime(c.api_client, clock=c.clock, namespaces=[c.namespace], poll_interval=c.poll,
                             revision="rev-1", **kw)


def mk(c: Cluster, name: str = "counter", **spec: Any) -> FlinkApp:
    return app(name, c.namespace, **spec)


def names(c: Cluster, kind: str, app_name: str) -> set[str]:
    return {o["metadata"]["name"] for o in c.kube.list(kind, c.namespace, r.app_selector(app_name))}


def deadline(c: Cluster, seconds: float) -> float:
    return c.clock.monotonic() + seconds


def with_taskmanagers(rt: KubernetesRuntime, a: FlinkApp, job_id: str | None = "0" * 32) -> None:
    """An app whose TaskManagers run for `job_id`'s generation and whose JobManager is not there (yet):
    start_job's apply without the JobManager. None: TaskManagers as rendered before job generations."""
    jm = ("Deployment", r.object_names(a.name)["jobmanager"])
    rt.apply([o for o in rt.render(a, job_id=job_id) if (o["kind"], o["metadata"]["name"]) != jm])


def test_ensure_cluster_of_a_new_app_applies_everything_but_the_workloads_owned_by_the_root(
        cluster: Cluster) -> None:
    rt = runtime(cluster)
    a = mk(cluster)
    info = rt.ensure_cluster(a, deadline=deadline(cluster, 120 if cluster.real else 10))
    assert info.phase is ClusterPhase.READY and "TaskManagers start with the job" in (info.message or "")
    root = cluster.kube.get("ConfigMap", cluster.namespace, "counter-root")
    assert root is not None and "ownerReferences" not in root["metadata"]
    assert names(cluster, "ConfigMap", "counter") == {"counter-root", "counter-config"}
    assert names(cluster, "Service", "counter") == {"counter-jobmanager", "counter-rest"}
    assert names(cluster, "Deployment", "counter") == set()  # JobManager and TaskManagers come with the job
    for kind in ("ConfigMap", "Service", "ServiceAccount", "Role", "RoleBinding"):
        for o in cluster.kube.list(kind, cluster.namespace, r.app_selector("counter")):
            if o["metadata"]["name"] != "counter-root":
                assert [x["uid"] for x in o["metadata"]["ownerReferences"]] == [root["metadata"]["uid"]]
            mf = {m["manager"] for m in o["metadata"]["managedFields"]}
            assert "flink-reconciler" in mf
    assert root["metadata"]["annotations"][r.ANNOTATION_REVISION] == "rev-1"


@pytest.mark.usefixtures("pods_never_run")
def test_ensure_cluster_keeps_live_taskmanagers_in_their_job_generation(cluster: Cluster) -> None:
    """A scale or config change reaches the running TaskManagers, which stay in the generation (and, with
    HA, the HA identity) of the job they run: only start_job moves them to a new one."""
    rt = runtime(cluster)
    job = "ab" * 16
    with_taskmanagers(rt, mk(cluster), job)
    before = cluster.kube.get("Deployment", cluster.namespace, "counter-taskmanager")
    assert before is not None
    rt.ensure_cluster(mk(cluster, taskManager={"replicas": 3, "slots": 2}), deadline=deadline(cluster, 120))
    after = cluster.kube.get("Deployment", cluster.namespace, "counter-taskmanager")
    assert after is not None and after["spec"]["replicas"] == 3
    assert after["spec"]["template"] == before["spec"]["template"]  # no restart of the job's TaskManagers
    tmpl = after["spec"]["template"]
    assert tmpl["metadata"]["annotations"][r.ANNOTATION_JOB_ID] == job
    assert tmpl["spec"]["containers"][0]["args"] == [
        "taskmanager", "-D", f"kubernetes.cluster-id=counter.{job[:12]}",
        "-D", f"high-availability.cluster-id=counter.{job[:12]}"]
    # TaskManagers rendered before job generations (no annotation, no HA identity arguments) stay as they are.
    legacy = mk(cluster, "legacy")
    with_taskmanagers(rt, legacy, None)
    old = cluster.kube.get("Deployment", cluster.namespace, "legacy-taskmanager")
    assert old is not None and r.ANNOTATION_JOB_ID not in old["spec"]["template"]["metadata"]["annotations"]
    assert old["spec"]["template"]["spec"]["containers"][0]["args"] == ["taskmanager"]
    rt.ensure_cluster(legacy, deadline=deadline(cluster, 120))
    again = cluster.kube.get("Deployment", cluster.namespace, "legacy-taskmanager")
    assert again is not None and again["spec"]["template"] == old["spec"]["template"]


def test_reapplying_the_same_render_changes_nothing(cluster: Cluster) -> None:
    rt = runtime(cluster)
    a = mk(cluster)
    rt.ensure_cluster(a, deadline=deadline(cluster, 120))
    before = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
              for o in cluster.kube.list("ConfigMap", cluster.namespace, r.app_selector("counter"))}
    rt.ensure_cluster(a, deadline=deadline(cluster, 120))
    after = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
             for o in cluster.kube.list("ConfigMap", cluster.namespace, r.app_selector("counter"))}
    assert before == after


def test_list_clusters_is_a_constant_number_of_lists(cluster: Cluster, standin_only: Any) -> None:
    rt = runtime(cluster)
    for i in range(3):
        with_taskmanagers(rt, mk(cluster, f"app-{i}"))
    standin_only.api.reset_log()
    infos = rt.list_clusters()
    assert sorted(infos) == ["app-0", "app-1", "app-2"]
    assert all(i.phase is ClusterPhase.STARTING for i in infos.values())  # no JobManager yet
    calls = standin_only.api.calls()
    # 5 lists (roots, deployments, statefulsets, pods, Flink's HA ConfigMaps) + one event list for the namespace
    # (apps not READY)
    assert sorted((c.verb, c.resource) for c in calls) == sorted(
        [("list", "configmaps"), ("list", "configmaps"), ("list", "deployments"), ("list", "statefulsets"),
         ("list", "pods"), ("list", "events")])


@pytest.mark.usefixtures("pods_never_run")
def test_conflict_is_reported_with_the_other_manager_and_forced_only_when_configured(cluster: Cluster) -> None:
    rt = runtime(cluster)
    a = mk(cluster, taskManager={"replicas": 2, "slots": 2})
    with_taskmanagers(rt, a)
    rt.ensure_cluster(a, deadline=deadline(cluster, 120))
    cluster.patch("Deployment", "counter-taskmanager", {"spec": {"replicas": 5}}, manager="kubectl-edit")
    with pytest.raises(ApplyConflictError) as e:
        rt.ensure_cluster(a, deadline=deadline(cluster, 120))
    assert e.value.managers == ["kubectl-edit"]
    assert "spec.replicas" in str(e.value) and "kubectl-edit" in str(e.value)
    assert isinstance(e.value, PermanentStepError)
    live = cluster.kube.get("Deployment", cluster.namespace, "counter-taskmanager")
    assert live is not None and live["spec"]["replicas"] == 5  # untouched
    runtime(cluster, force_conflicts=True).ensure_cluster(a, deadline=deadline(cluster, 120))
    live = cluster.kube.get("Deployment", cluster.namespace, "counter-taskmanager")
    assert live is not None and live["spec"]["replicas"] == 2


def test_drift_ignores_server_defaults_and_finds_hand_edits(cluster: Cluster) -> None:
    rt = runtime(cluster)
    a = mk(cluster)
    objs = rt.render(a, job_id="0" * 32)
    rt.apply(objs)
    root_uid = cluster.kube.get("ConfigMap", cluster.namespace, "counter-root")["metadata"]["uid"]  # type: ignore[index]
    rendered = rt.render(a, job_id="0" * 32, root_uid=root_uid)
    assert rt.drift(rendered) == []
    cluster.patch("ConfigMap", "counter-config", {"data": {"config.yaml": "rest.port: 9999\n"}}, manager="kubectl")
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "counter-extra", "labels": r.selector_labels("counter")}})
    drift = rt.drift(rendered)
    assert any(d.startswith("ConfigMap/counter-config: .data.config.yaml: live 'rest.port: 9999") for d in drift)
    assert "ConfigMap/counter-extra: not rendered (would be pruned)" in drift


@pytest.mark.usefixtures("pods_never_run")
def test_prune_removes_what_the_render_no_longer_has_and_never_another_apps(cluster: Cluster) -> None:
    rt = runtime(cluster)
    vct = {"replicas": 2, "slots": 2, "volumeClaimTemplates": [{"name": "state", "mountPath": "/state",
                                                                "storage": "1Gi"}]}
    with_taskmanagers(rt, mk(cluster, taskManager=vct))
    rt.ensure_cluster(mk(cluster, taskManager=vct), deadline=deadline(cluster, 120))
    other = mk(cluster, "counter-two", taskManager=vct)
    with_taskmanagers(rt, other)
    rt.ensure_cluster(other, deadline=deadline(cluster, 120))
    unlabelled = cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "counter-notes"}})
    assert names(cluster, "StatefulSet", "counter") == {"counter-taskmanager"}
    rt.ensure_cluster(mk(cluster), deadline=deadline(cluster, 120))  # no volumeClaimTemplates any more
    assert names(cluster, "StatefulSet", "counter") == set()
    assert names(cluster, "Service", "counter") == {"counter-jobmanager", "counter-rest"}  # headless gone
    assert names(cluster, "Deployment", "counter") == {"counter-taskmanager"}
    assert names(cluster, "StatefulSet", "counter-two") == {"counter-two-taskmanager"}
    assert "counter-two-taskmanager" in names(cluster, "Service", "counter-two")
    assert cluster.kube.get("ConfigMap", cluster.namespace, unlabelled["metadata"]["name"]) is not None


def test_suspend_keeps_only_the_configuration(cluster: Cluster) -> None:
    rt = runtime(cluster)
    a = mk(cluster)
    rt.apply(rt.render(a, job_id="0" * 32))  # as start_job leaves it: JobManager included
    assert names(cluster, "Deployment", "counter") == {"counter-jobmanager", "counter-taskmanager"}
    info = rt.ensure_cluster(mk(cluster, job={"jarURI": "local:///opt/flink/usrlib/counter.jar",
                                              "state": "suspended"}), deadline=deadline(cluster, 60))
    assert names(cluster, "Deployment", "counter") == set()
    assert names(cluster, "Service", "counter") == set()
    assert names(cluster, "ConfigMap", "counter") == {"counter-root", "counter-config"}
    assert info.phase is ClusterPhase.ABSENT and info.spec_hash and "suspended" in (info.message or "")


def test_delete_cascades_from_the_root_and_waits(cluster: Cluster) -> None:
    rt = runtime(cluster)
    a = mk(cluster)
    rt.apply(rt.render(a, job_id="0" * 32))
    keep = mk(cluster, "keeper")
    rt.ensure_cluster(keep, deadline=deadline(cluster, 120))
    rt.delete_cluster("counter", deadline=deadline(cluster, 120))
    for kind in ("ConfigMap", "Service", "Deployment", "Pod"):
        assert names(cluster, kind, "counter") == set()
    assert rt.observe("counter").phase is ClusterPhase.ABSENT
    assert names(cluster, "ConfigMap", "keeper") == {"keeper-root", "keeper-config"}
    rt.delete_cluster("counter", deadline=deadline(cluster, 10))  # idempotent


def test_delete_blocked_by_a_finalizer_fails_at_the_deadline_without_touching_it(cluster: Cluster) -> None:
    rt = runtime(cluster)
    a = mk(cluster)
    rt.ensure_cluster(a, deadline=deadline(cluster, 120))
    root = cluster.kube.get("ConfigMap", cluster.namespace, "counter-root")
    assert root is not None
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "counter-held", "labels": r.selector_labels("counter"), "finalizers": ["example.com/hold"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "counter-root",
                             "uid": root["metadata"]["uid"]}]}}, manager="someone-else")
    with pytest.raises(DeadlineExceededError, match=r"still present: ConfigMap/counter-held \(finalizers: "
                                                    r"example\.com/hold\)"):
        rt.delete_cluster("counter", deadline=deadline(cluster, 20 if cluster.real else 5))
    held = cluster.kube.get("ConfigMap", cluster.namespace, "counter-held")
    assert held is not None and held["metadata"]["finalizers"] == ["example.com/hold"]
    cluster.patch("ConfigMap", "counter-held", {"metadata": {"finalizers": None}}, manager="someone-else")
    rt.delete_cluster("counter", deadline=deadline(cluster, 60))
    assert names(cluster, "ConfigMap", "counter") == set()


BAD_IMAGE = "registry.invalid/flink:does-not-exist"


def _kubelet_pod(c: Cluster, name: str, component: str, waiting: dict[str, str]) -> None:
    """What a kubelet reports for a pod whose image cannot be pulled (stand-in only)."""
    labels = {**r.selector_labels("counter", component), r.LABEL_VERSION: "2.3"}
    c.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
              "spec": {"containers": [{"name": r.MAIN_CONTAINER, "image": BAD_IMAGE}]}})
    c.patch("Pod", name, {"status": {"phase": "Pending", "containerStatuses": [{
        "name": r.MAIN_CONTAINER, "ready": False, "restartCount": 0, "image": BAD_IMAGE, "imageID": "",
        "state": {"waiting": waiting}}]}}, manager="kubelet", status=True)
    c.create({"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{name}.1"}, "type": "Warning",
              "reason": "Failed", "message": f'Failed to pull image "{BAD_IMAGE}": no such host',
              "involvedObject": {"kind": "Pod", "name": name, "namespace": c.namespace},
              "lastTimestamp": "2026-01-01T00:00:00Z"})


def _stuck_workload_status(c: Cluster, name: str) -> None:
    c.patch("Deployment", name, {"status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                                            "readyReplicas": 0, "availableReplicas": 0,
                                            "unavailableReplicas": 1}}, manager="kube-controller-manager",
            status=True)


def test_start_job_fails_at_its_deadline_with_the_pods_image_pull_reason(cluster: Cluster) -> None:
    rt = runtime(cluster)
    # Without HA: with it, start_job first waits for JobManager pods of another job to go (the kubelet pod
    # made below stands for the new one); see test_start_job_with_ha_*.
    a = mk(cluster, image=BAD_IMAGE, job={"upgradeMode": "stateless"},
           highAvailability={"enabled": False, "storageDir": None})
    if cluster.standin:
        cluster.standin.set_auto_ready(False)
        _kubelet_pod(cluster, "counter-jobmanager-5d9f-abcde", "jobmanager",
                     {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{BAD_IMAGE}"'})
    seconds = 120 if cluster.real else 300
    t0 = cluster.clock.monotonic()
    with pytest.raises(DeadlineExceededError) as e:
        rt.start_job(a, job_id="0" * 32, jar=None, restore_path=None, allow_non_restored_state=False,
                     deadline=deadline(cluster, seconds))
    msg = str(e.value)
    assert msg.startswith(f"counter: JobManager not available after {seconds}s: ")
    assert "ImagePullBackOff" in msg or "ErrImagePull" in msg
    assert BAD_IMAGE in msg
    if cluster.standin:
        assert "event: Failed: Failed to pull image" in msg
        assert cluster.clock.monotonic() - t0 == pytest.approx(seconds)  # FakeClock: no real waiting
    info = rt.observe("counter")
    assert info.phase is ClusterPhase.FAILED and "ImagePull" in (info.message or "")


def test_ensure_cluster_reports_crash_loop_and_unschedulable(cluster: Cluster, standin_only: Any) -> None:
    rt = runtime(cluster)
    a = mk(cluster)
    standin_only.set_auto_ready(False)
    with_taskmanagers(rt, a)
    _kubelet_pod(cluster, "counter-taskmanager-1", "taskmanager",
                 {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"})
    cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "counter-taskmanager-2", "labels": r.selector_labels("counter", "taskmanager")},
        "spec": {"containers": [{"name": r.MAIN_CONTAINER, "image": "flink:2.3"}]}})
    cluster.patch("Pod", "counter-taskmanager-2", {"status": {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 pod has unbound immediate PersistentVolumeClaims."}]}},
        manager="kube-scheduler", status=True)
    with pytest.raises(DeadlineExceededError) as e:
        rt.ensure_cluster(a, deadline=deadline(cluster, 60))
    assert "TaskManagers not available after 60s" in str(e.value)
    assert "CrashLoopBackOff: back-off 5m0s" in str(e.value)
    info = rt.list_clusters()["counter"]
    assert info.phase is ClusterPhase.FAILED
    assert "unbound immediate PersistentVolumeClaims" in (info.message or "") or "CrashLoop" in (info.message or "")


def test_unsupported_jar_fails_the_step_before_any_request(cluster: Cluster) -> None:
    rt = runtime(cluster)
    with pytest.raises(PermanentStepError, match=r"local:///path/in/image\.jar"):
        rt.ensure_cluster(mk(cluster, job={"jarURI": "file:///tmp/x.jar"}), deadline=deadline(cluster, 10))
    assert names(cluster, "ConfigMap", "counter") == set()


class _FakeFlinkRest(BaseHTTPRequestHandler):
    """Flink's /jobs/overview answer for one job, behind the API server's service proxy."""

    job_id = ""

    def do_GET(self) -> None:
        if self.path == "/jobs/overview":
            body = json.dumps({"jobs": [{"jid": self.job_id, "name": "counter", "state": "RUNNING",
                                         "start-time": 1, "tasks": {"running": 2, "total": 2}}]}).encode()
            self.send_response(200)
        else:
            body = json.dumps({"errors": ["Not found: " + self.path]}).encode()
            self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def flink_backend() -> Iterator[tuple[str, type[_FakeFlinkRest]]]:
    handler = type("H", (_FakeFlinkRest,), {"job_id": "1" * 32})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()
    srv.server_close()


def test_start_job_through_the_service_proxy_with_the_api_servers_credentials(
        cluster: Cluster, standin_only: Any, flink_backend: tuple[str, type[_FakeFlinkRest]]) -> None:
    url, handler = flink_backend
    standin_only.add_proxy_backend(cluster.namespace, "counter-rest", "8081", url)
    rt = runtime(cluster, rest_via="proxy")
    a = mk(cluster)
    assert rt.start_job(a, job_id=handler.job_id, jar=None, restore_path="s3://b/sp-1",
                        allow_non_restored_state=False, deadline=deadline(cluster, 30)) == handler.job_id
    jm = cluster.kube.get("Deployment", cluster.namespace, "counter-jobmanager")
    assert jm is not None
    args = jm["spec"]["template"]["spec"]["containers"][0]["args"]
    i = args.index("--job-id")
    assert args[i + 1] == handler.job_id and "--fromSavepoint" in args
    proxied = [h for c, h in zip(standin_only.api.calls(), standin_only.api.headers_log, strict=True)
               if c.resource == "services/proxy"]
    assert proxied and all(h.get("Authorization") == "Bearer stand-in-token" for h in proxied)
    info = rt.observe("counter")
    assert info.phase is ClusterPhase.READY
    ns = cluster.namespace
    assert info.rest_url == f"{standin_only.url}/api/v1/namespaces/{ns}/services/counter-rest%3A8081/proxy"


def test_no_endpoints_behind_the_proxy_times_out_with_the_api_servers_reason(
        cluster: Cluster, standin_only: Any) -> None:
    rt = runtime(cluster, rest_via="proxy")
    with pytest.raises(DeadlineExceededError, match=r"not found on its JobManager after 20s: .*no endpoints available"):
        rt.start_job(mk(cluster), job_id="2" * 32, jar=None, restore_path=None, allow_non_restored_state=False,
                     deadline=deadline(cluster, 20))


def test_status_readers() -> None:
    dep: dict[str, Any] = {"kind": "Deployment", "metadata": {"generation": 2}, "spec": {"replicas": 1},
           "status": {"observedGeneration": 1, "availableReplicas": 1, "updatedReplicas": 1, "replicas": 1}}
    assert workload_ready(dep) == (False, "the controller has not yet seen the latest spec")
    dep["status"]["observedGeneration"] = 2
    assert workload_ready(dep) == (True, None)
    dep["status"]["conditions"] = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                    "message": 'ReplicaSet "x" has timed out progressing.'}]
    assert workload_ready(dep)[1] == 'ProgressDeadlineExceeded: ReplicaSet "x" has timed out progressing.'
    oom = {"status": {"containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                                                "message": "back-off"}},
                                             "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}
    assert pod_problem(oom) == (True, "CrashLoopBackOff: back-off (last exit: OOMKilled, code 137)")
    assert pod_problem({"status": {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}}) is None


def test_generation_failure_counts_only_containers_that_ended_with_an_error() -> None:
    def pod(**cs: Any) -> dict[str, Any]:
        return {"status": {"containerStatuses": [{"name": r.MAIN_CONTAINER, "restartCount": 0, **cs}]}}

    crash = {"terminated": {"exitCode": 1, "reason": "Error",
                            "message": "2026 ERROR Could not create application program.\n"
                                       "Caused by: java.lang.ClassNotFoundException: com.example.Nope\n"
                                       "\tat java.base/java.net.URLClassLoader.findClass(URLClassLoader.java:445)"}}
    looping = pod(restartCount=2, ready=False, lastState=crash,
                  state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}})
    assert generation_failure(looping) == (
        f"container {r.MAIN_CONTAINER} exited with code 1 (Error), restarted 2 time(s), CrashLoopBackOff: "
        "Caused by: java.lang.ClassNotFoundException: com.example.Nope")
    assert "exited with code 137 (OOMKilled)" in (generation_failure(pod(state={"terminated": {
        "exitCode": 137, "reason": "OOMKilled"}})) or "")
    assert generation_failure(pod(restartCount=1, ready=False, lastState=crash, state={"running": {}})) is not None
    # Not failures: being created or pulled, a probe not passing yet, back and ready after one crash, exit 0.
    assert generation_failure(pod(ready=False, state={"waiting": {"reason": "ContainerCreating"}})) is None
    assert generation_failure(pod(ready=False, state={"waiting": {"reason": "ImagePullBackOff"}})) is None
    assert generation_failure(pod(ready=False, state={"running": {}})) is None
    assert generation_failure(pod(restartCount=1, ready=True, lastState=crash, state={"running": {}})) is None
    assert generation_failure(pod(state={"terminated": {"exitCode": 0, "reason": "Completed"}})) is None
    assert generation_failure({"status": {"phase": "Pending"}}) is None


# ---- Flink's HA data between two jobs of one app -------------------------------------------------

def _ha_configmap(c: Cluster, name: str, app_name: str) -> None:
    """A ConfigMap as Flink 2.3's Kubernetes HA services label it (seen with the process node: no
    `configmap-type` label). Only its name tells Flink's HA data from someone else's with the same labels."""
    labels = {"app": app_name, "type": "flink-native-kubernetes"}
    c.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels},
              "data": {"leader": "x"}}, manager="flink")


def _jobmanager_pod(c: Cluster, name: str, owner: dict[str, Any] | None) -> None:
    labels = {**r.selector_labels("counter", "jobmanager"), r.LABEL_VERSION: "2.3"}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if owner is not None:  # owned by the Deployment directly (the stand-in has no ReplicaSets)
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "controller": True}]
    c.create({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
              "spec": {"containers": [{"name": r.MAIN_CONTAINER, "image": "flink:2.3"}]}})


def _configmaps(c: Cluster) -> set[str]:
    return {o["metadata"]["name"] for o in c.kube.request("GET", c.kube.path("ConfigMap", c.namespace))["items"]}


def _old_jobmanager(c: Cluster, rt: KubernetesRuntime, a: FlinkApp, job_id: str) -> None:
    rt.apply(rt.render(a, job_id=job_id, restore_path="s3://b/sp-old"))
    jm = c.kube.get("Deployment", c.namespace, "counter-jobmanager")
    assert jm is not None
    _jobmanager_pod(c, "counter-jobmanager-old", jm)


def test_start_job_with_ha_removes_the_old_jobmanager_then_flinks_ha_data_of_another_job(
        cluster: Cluster, standin_only: Any, flink_backend: tuple[str, type[_FakeFlinkRest]]) -> None:
    """A job that never reached a terminal state (a failed upgrade being rolled back) stays in Flink's HA
    store; a new JobManager would recover it next to the new job. The old JobManager goes first, then the
    HA ConfigMaps of this app, and only Flink's HA ones."""
    url, handler = flink_backend
    standin_only.add_proxy_backend(cluster.namespace, "counter-rest", "8081", url)
    rt = runtime(cluster, rest_via="proxy")
    a = mk(cluster)
    _old_jobmanager(cluster, rt, a, "a" * 32)
    _ha_configmap(cluster, "counter-cluster-config-map", "counter")
    _ha_configmap(cluster, f"counter-{'a' * 32}-config-map", "counter")
    _ha_configmap(cluster, "other-cluster-config-map", "other")  # another app's HA data
    _ha_configmap(cluster, "counter-notes", "counter")  # someone's ConfigMap with a common label
    standin_only.api.reset_log()
    assert rt.start_job(a, job_id=handler.job_id, jar=None, restore_path="s3://b/sp-1",
                        allow_non_restored_state=False, deadline=deadline(cluster, 30)) == handler.job_id
    left = _configmaps(cluster)
    assert "counter-cluster-config-map" not in left and f"counter-{'a' * 32}-config-map" not in left
    assert {"other-cluster-config-map", "counter-notes", "counter-root", "counter-config"} <= left
    assert names(cluster, "Pod", "counter") == set()  # the old JobManager pod went with its Deployment
    jm = cluster.kube.get("Deployment", cluster.namespace, "counter-jobmanager")
    assert jm is not None and handler.job_id in jm["spec"]["template"]["spec"]["containers"][0]["args"]
    calls = [(c.verb, c.resource) for c in standin_only.api.calls()]
    first = {k: calls.index(k) for k in (("delete", "deployments"), ("delete", "configmaps"), ("patch", "deployments"))}
    assert first[("delete", "deployments")] < first[("delete", "configmaps")] < first[("patch", "deployments")]


def test_start_job_with_ha_removes_the_ha_data_of_older_generations_and_never_another_apps(
        cluster: Cluster, standin_only: Any, flink_backend: tuple[str, type[_FakeFlinkRest]]) -> None:
    """Each job generation has its own HA identity `<app>.<12 hex>` (kubernetes.render.ha_cluster_id). Between two
    jobs the older generations' ConfigMaps go (housekeeping); an app whose name looks like a generation of
    this one (`counter-aaaaaaaaaaaa`) is another app, and the new generation's data stays."""
    url, handler = flink_backend
    standin_only.add_proxy_backend(cluster.namespace, "counter-rest", "8081", url)
    rt = runtime(cluster, rest_via="proxy")
    a = mk(cluster)
    old_job = "a" * 32
    _old_jobmanager(cluster, rt, a, old_job)
    old_cid, new_cid = r.ha_cluster_id("counter", old_job), r.ha_cluster_id("counter", handler.job_id)
    assert old_cid == "counter.aaaaaaaaaaaa"
    stale = {f"{old_cid}-cluster-config-map", f"{old_cid}-{old_job}-config-map", "counter-cluster-config-map"}
    for name in stale:
        _ha_configmap(cluster, name, name.split("-cluster-config-map")[0] if "cluster-config" in name
                      else old_cid)
    kept = {"counter-aaaaaaaaaaaa-cluster-config-map": "counter-aaaaaaaaaaaa",  # another app, old-style identity
            f"counter-two.{'a' * 12}-cluster-config-map": f"counter-two.{'a' * 12}",  # another app's generation
            "counter.aaaa-cluster-config-map": "counter.aaaa",  # not a generation identity
            f"{new_cid}-cluster-config-map": new_cid}  # the new job's own (as if its JobManager wrote it already)
    for name, label in kept.items():
        _ha_configmap(cluster, name, label)
    assert rt.start_job(a, job_id=handler.job_id, jar=None, restore_path="s3://b/sp-1",
                        allow_non_restored_state=False, deadline=deadline(cluster, 30)) == handler.job_id
    left = _configmaps(cluster)
    assert not stale & left and set(kept) <= left
    jm = cluster.kube.get("Deployment", cluster.namespace, "counter-jobmanager")
    assert jm is not None
    args = jm["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"kubernetes.cluster-id={new_cid}" in args and f"high-availability.cluster-id={new_cid}" in args
    tm = cluster.kube.get("Deployment", cluster.namespace, "counter-taskmanager")
    assert tm is not None and tm["spec"]["template"]["metadata"]["annotations"][r.ANNOTATION_JOB_ID] == handler.job_id
    assert f"kubernetes.cluster-id={new_cid}" in tm["spec"]["template"]["spec"]["containers"][0]["args"]


def test_start_job_with_ha_for_the_same_job_keeps_flinks_ha_data(
        cluster: Cluster, standin_only: Any, flink_backend: tuple[str, type[_FakeFlinkRest]]) -> None:
    """A retried StartJob of the same job id: Flink recovers that job from HA; nothing is removed."""
    url, handler = flink_backend
    standin_only.add_proxy_backend(cluster.namespace, "counter-rest", "8081", url)
    rt = runtime(cluster, rest_via="proxy")
    a = mk(cluster)
    _old_jobmanager(cluster, rt, a, handler.job_id)
    _ha_configmap(cluster, "counter-cluster-config-map", "counter")
    standin_only.api.reset_log()
    rt.start_job(a, job_id=handler.job_id, jar=None, restore_path="s3://b/sp-old", allow_non_restored_state=False,
                 deadline=deadline(cluster, 30))
    assert "counter-cluster-config-map" in _configmaps(cluster)
    assert not [c for c in standin_only.api.calls() if c.verb == "delete"]


def test_start_job_with_ha_fails_at_its_deadline_while_an_old_jobmanager_lingers_and_keeps_the_ha_data(
        cluster: Cluster, standin_only: Any) -> None:
    rt = runtime(cluster)
    a = mk(cluster)
    _jobmanager_pod(cluster, "counter-jobmanager-stray", None)  # nothing deletes it
    _ha_configmap(cluster, "counter-cluster-config-map", "counter")
    with pytest.raises(DeadlineExceededError, match=r"the old JobManager did not go away after 20s "
                                                   r"\(still present: counter-jobmanager-stray\)"):
        rt.start_job(a, job_id="b" * 32, jar=None, restore_path=None, allow_non_restored_state=False,
                     deadline=deadline(cluster, 20))
    assert "counter-cluster-config-map" in _configmaps(cluster)
    assert cluster.kube.get("Deployment", cluster.namespace, "counter-jobmanager") is None  # no second JobManager


def test_delete_cluster_removes_flinks_ha_data_of_the_app(cluster: Cluster, standin_only: Any) -> None:
    """Deleted without a final savepoint (deletionPolicy delete), a job stays in the HA store; an app created
    later under the same name would recover it."""
    rt = runtime(cluster)
    rt.ensure_cluster(mk(cluster), deadline=deadline(cluster, 10))
    _ha_configmap(cluster, "counter-cluster-config-map", "counter")
    _ha_configmap(cluster, "other-cluster-config-map", "other")
    rt.delete_cluster("counter", deadline=deadline(cluster, 10))
    left = _configmaps(cluster)
    assert "counter-cluster-config-map" not in left and "counter-root" not in left
    assert "other-cluster-config-map" in left


# ---- a rewind after the fact (apps deployed without HA before it was required) ------------------

def _legacy_root(upgrade_mode: str = "savepoint", ha: bool = False) -> dict[str, Any]:
    spec = {"highAvailability": {"enabled": ha, "storageDir": "s3://b/ha" if ha else None},
            "job": {"upgradeMode": upgrade_mode}}
    return {"data": {"flinkapp.json": json.dumps({"spec": spec})}}


def _jm(args: list[str]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": [{"name": r.MAIN_CONTAINER, "args": args}]}}}}


def _pod(component: str, restarts: int) -> dict[str, Any]:
    return {"metadata": {"labels": {r.LABEL_COMPONENT: component}},
            "status": {"containerStatuses": [{"name": r.MAIN_CONTAINER, "restartCount": restarts}]}}


def test_rewind_warning_names_the_restarts_and_what_the_job_restarted_from() -> None:
    jm = _jm(["standalone-job", "--job-id", "a" * 32, "--fromSavepoint", "s3://b/sp-7"])
    msg = rewind_warning(_legacy_root(), jm, [_pod("jobmanager", 2), _pod("taskmanager", 5)])
    assert msg is not None and msg.startswith("the JobManager restarted 2 time(s) without highAvailability: ")
    assert "from savepoint s3://b/sp-7, not from its latest checkpoint" in msg
    empty = rewind_warning(_legacy_root("last-state"), _jm(["standalone-job"]), [_pod("jobmanager", 1)])
    assert empty is not None and "from empty state" in empty
    assert rewind_warning(_legacy_root(), jm, [_pod("jobmanager", 0), _pod("taskmanager", 3)]) is None
    assert rewind_warning(_legacy_root(ha=True), jm, [_pod("jobmanager", 2)]) is None  # HA restores the checkpoint
    assert rewind_warning(_legacy_root("stateless"), jm, [_pod("jobmanager", 2)]) is None
    assert rewind_warning({"data": {"flinkapp.json": "{broken"}}, jm, [_pod("jobmanager", 2)]) is None


def test_observe_reports_a_rewind_of_an_app_deployed_without_ha(cluster: Cluster, standin_only: Any) -> None:
    """A savepoint-mode app from before HA was required (its root says so), whose JobManager restarted."""
    rt = runtime(cluster)
    old = mk(cluster, job={"upgradeMode": "stateless"}, highAvailability={"enabled": False, "storageDir": None})
    rt.apply(rt.render(old, job_id="a" * 32, restore_path="s3://b/sp-7"))
    root = cluster.kube.get("ConfigMap", cluster.namespace, "counter-root")
    assert root is not None
    spec = json.loads(root["data"]["flinkapp.json"])
    spec["spec"]["job"]["upgradeMode"] = "savepoint"
    cluster.patch("ConfigMap", "counter-root", {"data": {"flinkapp.json": json.dumps(spec)}}, manager="before")
    assert rt.observe("counter").message is None  # no restart yet
    jm = cluster.kube.get("Deployment", cluster.namespace, "counter-jobmanager")
    assert jm is not None
    _jobmanager_pod(cluster, "counter-jobmanager-1", jm)
    cluster.patch("Pod", "counter-jobmanager-1", {"status": {"phase": "Running", "containerStatuses": [{
        "name": r.MAIN_CONTAINER, "ready": True, "restartCount": 1, "image": "flink:2.3",
        "state": {"running": {}}}]}}, manager="kubelet", status=True)
    info = rt.observe("counter")
    assert info.phase is ClusterPhase.READY
    assert info.message is not None and "restarted 1 time(s) without highAvailability" in info.message
    assert "savepoint s3://b/sp-7" in info.message
