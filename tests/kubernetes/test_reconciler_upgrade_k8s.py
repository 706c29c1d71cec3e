"""A reconciler upgrade that renders an app's objects differently must not roll its pods by itself
(docs/kubernetes.md, "Upgrading the reconciler").

The case at hand: the reconciler began rendering Flink's Java 17 options into config.yaml
(`env.java.default-opts.all`), so every app's config ConfigMap and its pods' config hash now differ from what a
reconciler of the previous version applied. The Flink Kubernetes Operator diffs the user's spec against the last
reconciled spec (`AbstractFlinkResourceReconciler#reconcile`, `ReflectiveDiffBuilder`, operator 1.13), so a new
default configuration reaches a deployment with its next spec change, never by itself. The same holds here:

- a pass over an app whose spec did not change plans nothing and writes nothing;
- a change that promises not to restart the job (`taskManager.replicas`, a repair of a deleted TaskManager workload)
  keeps the running pods' template and config file: only what it changes is applied;
- the new rendering reaches the pods with the app's next planned upgrade, a new job generation started from a
  savepoint (a `restartNonce` bump applies it at once, in the plan).

Real planner, Executor, Journal and KubernetesRuntime against the stand-in API server (`test_executor_k8s.World`:
its SimCluster plays the controllers, the kubelet and the JobManager's REST API)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from reconciler.core.observed import ClusterPhase, Outcome
from reconciler.core.plan import Action, StopWithSavepoint, deterministic_job_id
from reconciler.errors import DeadlineExceededError, ObserveError
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.api import KubernetesApiError
from reconciler.live.kubernetes.generations import Pointers
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.session import SessionRuntime
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import cluster_app, session_generation
from tests.kubernetes.apps import app
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.flink_backend import FlinkBackend
from tests.kubernetes.standin import Call, Standin
from tests.kubernetes.test_executor_k8s import APP, REV1, REV2, World, _running, world  # noqa: F401 (fixture)
from tests.kubernetes.test_render import CASES
from tests.kubernetes.test_session_k8s import member, session_cluster

pytestmark = pytest.mark.kubernetes

Obj = dict[str, Any]
JAVA_KEY = "env.java.default-opts.all"
BEFORE = Path(__file__).parent / "golden" / "before_java_opts"


def previous_version(objs: list[Obj]) -> list[Obj]:
    """`objs` as the reconciler rendered them before it wrote `env.java.default-opts.all`: config.yaml without that
    key, and the pods' config hash over that config (the same hash: config.yaml but `parallelism.default`, plus
    log4j). `test_previous_version_is_what_that_version_rendered` holds it to that version's golden files."""
    out = copy.deepcopy(objs)
    config_hash = None
    for o in out:
        data = o.get("data") or {}
        if o["kind"] == "ConfigMap" and "config.yaml" in data:
            lines = [ln for ln in data["config.yaml"].splitlines(keepends=True) if not ln.startswith(f"{JAVA_KEY}:")]
            data["config.yaml"] = "".join(lines)
            hashed = "".join(ln for ln in lines if not ln.startswith("parallelism.default:"))
            config_hash = hashlib.sha256((hashed + r.LOG4J_CONSOLE).encode()).hexdigest()[:16]
    assert config_hash is not None
    for o in out:
        if o["kind"] in ("Deployment", "StatefulSet"):
            o["spec"]["template"]["metadata"]["annotations"][r.ANNOTATION_CONFIG_HASH] = config_hash
    return out


@pytest.mark.parametrize("case", ["plain", "statefulset"])
def test_previous_version_is_what_that_version_rendered(case: str) -> None:
    assert r.to_yaml(previous_version(CASES[case])) == (BEFORE / f"{case}.yaml").read_text()
    assert r.to_yaml(CASES[case]) != (BEFORE / f"{case}.yaml").read_text()


def _as_previous_version(w: World) -> tuple[FlinkApp, str]:
    """A running app whose objects the previous version of the reconciler applied: what an upgrade finds."""
    spec, job = _running(w)
    rendered = w.runtime.render(spec, job_id=job, restore_path=None)
    root = w.cluster.kube.get("ConfigMap", w.cluster.namespace, f"{APP}-root")
    assert root is not None
    assert w.runtime.drift(r.with_owner(rendered, root_name=f"{APP}-root", root_uid=root["metadata"]["uid"])) == []
    w.runtime.apply(previous_version(rendered))
    w.clock.sleep(1)  # the rollout of the previous version's pods; the job runs again (HA recovers it) ...
    w.clock.sleep(30)  # ... and checkpoints
    assert w.flink is not None and w.flink.job_state(job) == "RUNNING"
    drift = w.runtime.drift(r.with_owner(rendered, root_name=f"{APP}-root", root_uid=root["metadata"]["uid"]))
    assert any(d.startswith(f"ConfigMap/{APP}-config: .data.config.yaml") for d in drift), drift
    assert any(d.startswith(f"Deployment/{APP}-taskmanager: .spec.template") for d in drift), drift
    return spec, job


def _state(w: World) -> dict[str, Any]:
    """What decides whether Kubernetes restarts a pod: the workloads' pod templates, and the config file pods read."""
    kube, ns = w.cluster.kube, w.cluster.namespace
    config = kube.get("ConfigMap", ns, f"{APP}-config")
    assert config is not None
    return {"config": config["data"]["config.yaml"],
            **{c: w.deployment(c)["spec"]["template"] for c in ("jobmanager", "taskmanager")}}


def _writes(standin: Standin) -> list[Call]:
    """The reconciler's writes: everything but reads and what SimCluster does (pods, events, workload status)."""
    return [c for c in standin.api.calls() if c.verb not in ("get", "list", "watch")
            and c.resource not in ("pods", "events", "pods/status", "deployments/status", "statefulsets/status")]


def test_a_pass_over_an_unchanged_spec_writes_nothing(world: World, standin_only: Standin) -> None:  # noqa: F811
    spec, job = _as_previous_version(world)
    before = _state(world)
    standin_only.api.reset_log()
    ap = world.plan(REV1, {APP: spec})
    assert ap.action is Action.NOOP and ap.reason == "up to date" and ap.steps == (), ap.reason
    res = world.executor().run_app(REV1, ap)
    assert res.outcome is not Outcome.FAILURE, res.message
    assert _writes(standin_only) == []
    assert _state(world) == before
    assert world.flink is not None and world.flink.job_state(job) == "RUNNING"


def test_a_scale_change_keeps_the_running_pods_as_the_previous_version_made_them(
        world: World, standin_only: Standin) -> None:  # noqa: F811
    _, job = _as_previous_version(world)
    before = _state(world)
    jm_version = world.deployment("jobmanager")["metadata"]["resourceVersion"]
    ap = world.plan(REV2, {APP: world.app(taskManager={"replicas": 2, "slots": 2})})
    assert ap.action is Action.SCALE, ap.reason
    res = world.executor().run_app(REV2, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert world.deployment("taskmanager")["spec"]["replicas"] == 2
    assert _state(world) == before  # the same pod template and config file: no pod is replaced
    assert world.deployment("jobmanager")["metadata"]["resourceVersion"] == jm_version
    assert world.flink is not None and world.flink.job_state(job) == "RUNNING"


def test_a_repaired_taskmanager_workload_reads_the_config_its_jobmanager_runs_with(
        world: World, standin_only: Standin) -> None:  # noqa: F811
    spec, _ = _as_previous_version(world)
    before = _state(world)
    world.cluster.kube.delete("Deployment", world.cluster.namespace, f"{APP}-taskmanager")
    ap = world.plan(REV1, {APP: spec})
    assert ap.action is Action.REPAIR and [s.type for s in ap.steps] == ["EnsureCluster", "AwaitRunning"], ap.reason
    res = world.executor().run_app(REV1, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert _state(world)["config"] == before["config"]  # the JobManager's config file, unchanged
    tm = world.deployment("taskmanager")["spec"]["template"]
    assert tm["metadata"]["annotations"] == before["taskmanager"]["metadata"]["annotations"]  # that config's hash
    assert _state(world)["jobmanager"] == before["jobmanager"]


def test_the_new_rendering_comes_with_a_planned_upgrade_from_a_savepoint(
        world: World, standin_only: Standin) -> None:  # noqa: F811
    _, job = _as_previous_version(world)
    bumped = world.app(job={"restartNonce": 1})
    ap = world.plan(REV2, {APP: bumped})
    assert ap.action is Action.RESTART and isinstance(ap.steps[0], StopWithSavepoint), ap.reason
    res = world.executor().run_app(REV2, ap)
    assert res.outcome is Outcome.SUCCESS and res.job_id not in (None, job), res.message
    assert res.savepoint is not None
    after = _state(world)
    assert JAVA_KEY in after["config"]
    rendered = {o["metadata"]["name"]: o for o in world.runtime.render(bumped, job_id=res.job_id)}
    for c in ("jobmanager", "taskmanager"):
        want = rendered[f"{APP}-{c}"]["spec"]["template"]["metadata"]["annotations"][r.ANNOTATION_CONFIG_HASH]
        assert after[c]["metadata"]["annotations"][r.ANNOTATION_CONFIG_HASH] == want


def _previous_session_objects(k8s: KubernetesRuntime, stand_in: FlinkApp, generation: str) -> list[Obj]:
    """A FlinkSessionCluster's cluster as the previous version applied it: its rendering (`previous_version`), and
    the key that version wrote: a hash of the rendered pods (at generation 00000000), under the legacy annotation."""
    objs = previous_version(k8s.render(stand_in, generation=generation))
    at_key = previous_version(k8s.render(stand_in, generation="0" * 8))
    parts = [[o["kind"], o["spec"]["template"], o["spec"].get("volumeClaimTemplates")]
             for o in at_key if o["kind"] in ("Deployment", "StatefulSet")]
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet"):
            annotations = o["metadata"]["annotations"]
            del annotations[r.ANNOTATION_SESSION_KEY]
            annotations[r.LEGACY_ANNOTATION_SESSION_KEY] = key
    return objs


def test_a_session_cluster_the_previous_version_started_still_runs_its_apps_jobs(
        cluster: Cluster, standin_only: Standin) -> None:
    """A job-only upgrade of one app on a shared FlinkSessionCluster after the upgrade: the cluster is found at the
    app's spec (its key is of the spec, not of the rendering), its pods are not replaced under the other app's job,
    and the job is submitted to it."""
    c = cluster
    sc = session_cluster(c.namespace, taskManager={"replicas": 1, "slots": 2})
    a, b = member("a", sc), member("b", sc)
    gen = session_generation(a)
    k8s = KubernetesRuntime(c.api_client, clock=c.clock, namespaces=[c.namespace], rest_via="proxy",
                            poll_interval=c.poll, revision="rev-1")
    rt = SessionRuntime(k8s)
    rt.set_sessions({"a": "shared", "b": "shared"}, clusters=["shared"])
    stand_in = cluster_app("shared", a)
    k8s.apply(_previous_session_objects(k8s, stand_in, gen))
    root = c.kube.get("ConfigMap", c.namespace, "shared-root")
    assert root is not None
    k8s._set_pointers("shared", root, Pointers(live=gen))
    backend = FlinkBackend(c.clock, parallelism=2)
    backend.start_session()
    staged = r.image_jar_id(a.spec.job.jar_uri)
    assert staged is not None
    backend.jar_files[staged] = "a.jar"
    deadline = c.clock.monotonic() + 120
    with backend.serve() as url:
        standin_only.add_proxy_backend(c.namespace, f"shared-g{gen}-rest", str(r.REST_PORT), url)
        [live] = k8s.session_generations("shared")
        assert live.config_key == k8s.config_key(cluster_app("shared", b)) == k8s.config_key(stand_in)
        jb = deterministic_job_id("b", "1" * 40, 1)
        backend.jar_files[r.image_jar_id(b.spec.job.jar_uri) or ""] = "b.jar"
        rt.start_job(b, job_id=jb, jar=None, restore_path=None, allow_non_restored_state=False, deadline=deadline)
        pods = {n: c.kube.get("Deployment", c.namespace, f"shared-g{gen}-{n}") for n in ("jm", "tm")}
        config = c.kube.get("ConfigMap", c.namespace, f"shared-g{gen}-config")
        # a's job-only upgrade (its job stopped with a savepoint): EnsureCluster as planned, then StartJob.
        a2 = member("a", sc, args=["--rate", "2"])
        assert rt.ensure_cluster(a2, deadline=deadline).phase is ClusterPhase.READY
        ja = deterministic_job_id("a", "2" * 40, 1)
        assert rt.start_job(a2, job_id=ja, jar=None, restore_path="s3://b/sp/savepoint-a",
                            allow_non_restored_state=False, deadline=deadline) == ja
        for n, before in pods.items():
            after = c.kube.get("Deployment", c.namespace, f"shared-g{gen}-{n}")
            assert before is not None and after is not None
            assert after["spec"]["template"] == before["spec"]["template"], n  # b's job runs on, on the same pods
            assert after["metadata"]["annotations"][r.ANNOTATION_SESSION_KEY] == live.config_key  # keyed anew
        after_config = c.kube.get("ConfigMap", c.namespace, f"shared-g{gen}-config")
        assert config is not None and after_config is not None and after_config["data"] == config["data"]
        assert JAVA_KEY not in after_config["data"]["config.yaml"]
        assert rt.cluster_jobs("shared") == {"a": "RUNNING", "b": "RUNNING"}


def test_a_scale_under_the_running_job_applies_the_live_template_back_unchanged(cluster: Cluster) -> None:
    """The API-level half, for a real API server too: objects as the previous version applied them, then
    `ensure_cluster(keep_running=True)` at more TaskManagers. The stored pod templates (what decides a rollout) and the
    config file stay as they were, server defaults and all; only the replicas change."""
    rt = KubernetesRuntime(cluster.api_client, clock=cluster.clock, namespaces=[cluster.namespace],
                           poll_interval=cluster.poll, revision="rev-1")
    spec = app(APP, cluster.namespace)
    job = "ab" * 16
    rt.apply(previous_version(rt.render(spec, job_id=job, restore_path=None)))
    kube, ns = cluster.kube, cluster.namespace

    def live() -> tuple[Obj, Obj, Obj]:
        tm, jm = kube.get("Deployment", ns, f"{APP}-taskmanager"), kube.get("Deployment", ns, f"{APP}-jobmanager")
        config = kube.get("ConfigMap", ns, f"{APP}-config")
        assert tm is not None and jm is not None and config is not None
        return tm, jm, config

    tm, jm, config = live()
    try:
        rt.ensure_cluster(app(APP, cluster.namespace, taskManager={"replicas": 3, "slots": 2}),
                          deadline=cluster.clock.monotonic() + (3 if cluster.real else 120), keep_running=True)
    except DeadlineExceededError:
        # no Deployment controller in a bare API server; on a node this app's pods (s3:// storage) crash-loop:
        # either way its TaskManagers never become ready
        assert cluster.real
    tm2, jm2, config2 = live()
    assert tm2["spec"]["replicas"] == 3
    assert tm2["spec"]["template"] == tm["spec"]["template"]
    # not written: its spec and generation as they were (a real Deployment controller writes its status meanwhile)
    assert jm2["spec"] == jm["spec"] and jm2["metadata"]["generation"] == jm["metadata"]["generation"]
    assert {m["manager"] for m in jm2["metadata"]["managedFields"] if m.get("subresource") != "status"} == {
        m["manager"] for m in jm["metadata"]["managedFields"] if m.get("subresource") != "status"}
    assert config2["data"] == config["data"] and JAVA_KEY not in config2["data"]["config.yaml"]
    owners = {m["manager"] for m in tm2["metadata"]["managedFields"]}
    assert owners <= {r.FIELD_MANAGER, "kube-controller-manager", "kubelet"}, owners


@pytest.fixture
def impersonated(cluster: Cluster) -> Cluster:
    """`cluster` as a ServiceAccount that RBAC grants nothing (a real API server), or with `list` on
    flinkdeployments denied (the stand-in)."""
    if cluster.standin is not None:
        cluster.standin.deny("flink.apache.org", "flinkdeployments", "list")
        return cluster
    cfg = copy.copy(cluster.api_client.configuration)
    api = ApiClient(cfg)
    api.set_default_header(  # type: ignore[no-untyped-call]
        "Impersonate-User", f"system:serviceaccount:{cluster.namespace}:nobody")
    return Cluster(api, cluster.namespace, cluster.clock, cluster.poll, None)


def test_a_forbidden_list_of_flinkdeployments_is_nothing_only_where_their_crd_is_not_installed(
        cluster: Cluster, impersonated: Cluster) -> None:
    """The API server refuses a resource the caller may not list with 403 whether or not it is served (RBAC comes
    first); discovery, open to every authenticated client, tells. Against a real API server without the operator's
    CRD, or the stand-in with the group unserved."""
    c = impersonated
    if c.standin is not None:
        c.standin.unserve("flink.apache.org")
    else:
        try:
            cluster.kube.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                        "flinkdeployments.flink.apache.org")
            pytest.skip("the operator's CustomResourceDefinition is installed on this cluster")
        except KubernetesApiError as absent:
            assert absent.code == 404
    rt = KubernetesRuntime(c.api_client, clock=c.clock, namespaces=[c.namespace])
    with pytest.raises(KubernetesApiError) as e:
        c.kube.list("FlinkDeployment", c.namespace, "")
    assert e.value.code == 403
    assert rt.flink_deployments() == {}


def test_a_forbidden_list_of_installed_flinkdeployments_is_unreadable(impersonated: Cluster,
                                                                      flink_operator_crd: None) -> None:
    c = impersonated
    rt = KubernetesRuntime(c.api_client, clock=c.clock, namespaces=[c.namespace])
    with pytest.raises(ObserveError) as e:
        rt.flink_deployments()
    assert str(e.value).startswith("403 Forbidden: flinkdeployments.flink.apache.org is forbidden: User ")
    assert f'cannot list resource "flinkdeployments" in API group "flink.apache.org" in the namespace "{c.namespace}"' \
        in str(e.value)
