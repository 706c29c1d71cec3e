"""Warm standby on the kubernetes runtime without Flink: the session cluster's render (pure), and the runtime's
pointer switches against the stand-in API server (start, promote, discard, delete the retired cluster, a
leftover standby reported by observe). The real-Flink path is test_warm_standby_k8s_e2e.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import ClusterPhase
from reconciler.core.plan import ClusterStrategy
from reconciler.errors import PermanentStepError
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.generations import Pointers
from reconciler.live.kubernetes.quota import quantity
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.kubernetes.status import HA_CONFIGMAP_SELECTOR, ha_configmap_cluster_id
from reconciler.live.ports import StandbyRuntime
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.model import FlinkApp
from tests.apply.fakes import FakeStandbyRuntime
from tests.gitutil import Repo
from tests.kubernetes.apps import app
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.flink_backend import FlinkBackend
from tests.kubernetes.standin import Standin, parse_selector, selector_matches

pytestmark = pytest.mark.kubernetes

GEN, GEN2 = "3538ba14", "9f00c0de"
Obj = dict[str, Any]


def by_kind(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


# ---- render (pure) ----

def test_a_session_generation_renders_a_cluster_without_a_job_under_names_of_its_own() -> None:
    a = app("counter", "flink")
    objs = by_kind(r.render_app(a, revision="rev", job_id=None, restore_path=None, generation=GEN))
    p = f"counter-g{GEN}"
    assert set(objs) == {("ConfigMap", "counter-root"), ("ServiceAccount", "counter-flink"), ("Role", "counter-flink"),
                         ("RoleBinding", "counter-flink"), ("ConfigMap", f"{p}-config"), ("Service", f"{p}-jm"),
                         ("Service", f"{p}-rest"), ("Deployment", f"{p}-tm"), ("Deployment", f"{p}-jm")}
    jm = objs[("Deployment", f"{p}-jm")]["spec"]["template"]["spec"]
    args = jm["containers"][0]["args"]
    assert args[0] == "jobmanager" and "--job-id" not in args and "--fromSavepoint" not in args
    assert f"kubernetes.cluster-id=counter.g{GEN}" in args and f"high-availability.cluster-id=counter.g{GEN}" in args
    stage = jm["initContainers"][-1]
    assert stage["name"] == "stage-jar" and stage["image"] == "flink:2.3"
    env = {e["name"]: e["value"] for e in stage["env"]}
    assert env == {"JAR_PATH": "/opt/flink/usrlib/counter.jar", "JAR_DIR": "/opt/flink/web-upload/flink-web-upload",
                   "JAR_ID": r.STAGED_JAR}
    conf = objs[("ConfigMap", f"{p}-config")]["data"]["config.yaml"]
    assert 'web.upload.dir: "/opt/flink/web-upload"' in conf and f'jobmanager.rpc.address: "{p}-jm"' in conf
    tm = objs[("Deployment", f"{p}-tm")]["spec"]["template"]
    assert r.ANNOTATION_JOB_ID not in tm["metadata"]["annotations"]  # lives as long as the cluster
    assert f"kubernetes.cluster-id=counter.g{GEN}" in tm["spec"]["containers"][0]["args"]
    for key, o in objs.items():
        labels = o["metadata"]["labels"]
        shared = key[1] in ("counter-root", "counter-flink")
        assert (labels.get(r.LABEL_GENERATION) == GEN) is not shared, key


def test_the_first_clusters_selectors_never_select_a_session_clusters_pods() -> None:
    """Deployment selectors are immutable and Service selectors equality-only: the session cluster's pods must
    not carry every label the first cluster selects on, or its Services would route to them."""
    a = app("counter", "flink")
    base = r.render_app(a, revision="rev", job_id="0" * 32, restore_path=None)
    session = r.render_app(a, revision="rev", job_id=None, restore_path=None, generation=GEN)
    pods = [o["spec"]["template"]["metadata"]["labels"] for o in session if o["kind"] == "Deployment"]
    selectors = [o["spec"]["selector"] if o["kind"] == "Service" else o["spec"]["selector"]["matchLabels"]
                 for o in base if o["kind"] in ("Service", "Deployment")]
    for sel in selectors:
        reqs = parse_selector(",".join(f"{k}={v}" for k, v in sel.items()))
        assert not any(selector_matches(reqs, labels) for labels in pods), sel


def test_an_http_jar_is_fetched_then_staged_in_the_upload_dir() -> None:
    a = app("counter", "flink", job={"jarURI": "https://example.com/jobs/counter-1.2.jar", "entryClass": "C"})
    jm = by_kind(r.render_app(a, revision="rev", job_id=None, restore_path=None, generation=GEN))[
        ("Deployment", f"counter-g{GEN}-jm")]["spec"]["template"]["spec"]
    assert [c["name"] for c in jm["initContainers"]] == ["fetch-jar", "stage-jar"]
    assert {"name": "usrlib", "mountPath": r.USRLIB} in jm["initContainers"][1]["volumeMounts"]
    assert {e["name"]: e["value"] for e in jm["initContainers"][1]["env"]}["JAR_PATH"] == f"{r.USRLIB}/counter-1.2.jar"


def test_a_session_clusters_ha_configmaps_belong_to_its_app() -> None:
    def cm(cid: str, name: str) -> Obj:
        return {"metadata": {"name": name, "labels": {"app": cid, "type": "flink-native-kubernetes"}}}
    assert ha_configmap_cluster_id("counter", cm(f"counter.g{GEN}", f"counter.g{GEN}-cluster-config-map")) \
        == f"counter.g{GEN}"
    assert ha_configmap_cluster_id("counter", cm("counter.gzz", "counter.gzz-cluster-config-map")) is None
    assert ha_configmap_cluster_id("count", cm(f"counter.g{GEN}", f"counter.g{GEN}-cluster-config-map")) is None


def test_web_upload_dir_is_refused_in_flink_configuration() -> None:
    problems = r.kubernetes_problems(app("counter", "flink", flinkConfiguration={"web.upload.dir": "/tmp"}))
    assert any("web.upload.dir" in p.message for p in problems), problems


# ---- runtime against the stand-in ----

@pytest.fixture
def flink_url(standin_only: Standin, cluster: Cluster) -> Iterator[str]:
    """A JobManager REST API behind the standby's REST Service (one TaskManager, two slots registered)."""
    backend = FlinkBackend(cluster.clock)
    with backend.serve() as url:
        yield url


def rt_of(c: Cluster) -> KubernetesRuntime:
    return KubernetesRuntime(c.api_client, clock=c.clock, namespaces=[c.namespace], rest_via="proxy",
                             poll_interval=c.poll, revision="rev-1")


def gens(c: Cluster, name: str = "counter") -> set[str]:
    return {(o["metadata"].get("labels") or {}).get(r.LABEL_GENERATION, "")
            for kind in ("Deployment", "Service") for o in c.kube.list(kind, c.namespace, r.app_selector(name))}


def pointers(c: Cluster) -> Pointers:
    return Pointers.of(c.kube.get("ConfigMap", c.namespace, "counter-root"))


def test_start_promote_discard_and_delete_retired_switch_one_pointer(
        cluster: Cluster, standin_only: Standin, flink_url: str) -> None:
    c = cluster
    rt = rt_of(c)
    assert isinstance(rt, StandbyRuntime)
    a = app("counter", c.namespace)
    rt.apply(rt.render(a, job_id="0" * 32))  # the first cluster, as start_job applies it
    for gen in (GEN, GEN2):
        standin_only.add_proxy_backend(c.namespace, f"counter-g{gen}-rest", str(r.REST_PORT), flink_url)
    bigger = app("counter", c.namespace, taskManager={"slots": 2, "resources": {"cpu": 1, "memory": "2g"}})
    info = rt.start_standby(bigger, generation=GEN, deadline=c.clock.monotonic() + 60)
    assert info.phase is ClusterPhase.READY and f"counter-g{GEN}-rest" in (info.rest_url or "")
    assert pointers(c) == Pointers(live="", standby=GEN) and gens(c) == {"", GEN}
    seen = rt_of(c).observe("counter")
    assert seen.standby_generation == GEN and not seen.retired_cluster
    assert "counter-rest" in (seen.rest_url or "")  # observe still reports the live (first) cluster

    rt.promote_standby("counter", generation=GEN, deadline=c.clock.monotonic() + 60)
    rt.promote_standby("counter", generation=GEN, deadline=c.clock.monotonic() + 60)  # a resumed step: done
    assert pointers(c) == Pointers(live=GEN, standby=None, retired="")
    seen = rt_of(c).observe("counter")  # a new reconciler finds the promoted cluster from the root alone
    assert seen.standby_generation is None and seen.retired_cluster
    assert f"counter-g{GEN}-rest" in (seen.rest_url or "") and seen.phase is ClusterPhase.READY

    rt.discard_standby("counter", generation=GEN, deadline=c.clock.monotonic() + 60)
    assert pointers(c) == Pointers(live="") and gens(c) == {""}
    rt.discard_standby("counter", generation=GEN, deadline=c.clock.monotonic() + 60)  # nothing left: no-op
    with pytest.raises(PermanentStepError, match="gone"):
        rt.promote_standby("counter", generation=GEN, deadline=c.clock.monotonic() + 60)

    # Flink's HA ConfigMaps: the first cluster's identities go with it, the standby's stay.
    for cid in ("counter", "counter." + "0" * 12, f"counter.g{GEN2}"):
        c.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": f"{cid}-cluster-config-map", "labels": {"app": cid, "type": "flink-native-kubernetes"}}})
    rt.start_standby(bigger, generation=GEN2, deadline=c.clock.monotonic() + 60)
    rt.promote_standby("counter", generation=GEN2, deadline=c.clock.monotonic() + 60)
    rt.delete_retired("counter", deadline=c.clock.monotonic() + 60)
    assert pointers(c) == Pointers(live=GEN2) and gens(c) == {GEN2}
    assert c.kube.get("Deployment", c.namespace, "counter-jobmanager") is None
    assert {o["metadata"]["name"] for o in c.kube.list("ConfigMap", c.namespace, HA_CONFIGMAP_SELECTOR)} == \
        {f"counter.g{GEN2}-cluster-config-map"}
    seen = rt_of(c).observe("counter")
    assert seen.standby_generation is None and not seen.retired_cluster and seen.phase is ClusterPhase.READY

    rt.delete_cluster("counter", deadline=c.clock.monotonic() + 60)
    assert gens(c) == set() and c.kube.list("ConfigMap", c.namespace, HA_CONFIGMAP_SELECTOR) == []


def test_a_standby_left_without_its_pointer_is_reported_for_removal(cluster: Cluster, standin_only: Standin) -> None:
    """A crash between the objects and the pointer cannot happen (the pointer is written first), but objects of a
    generation nothing points at (a pointer lost with a hand edit) are still reported, so the plan removes them."""
    c = cluster
    rt = rt_of(c)
    a = app("counter", c.namespace)
    rt.apply(rt.render(a, job_id="0" * 32))
    rt.apply(rt.render(a, generation=GEN))
    info = rt_of(c).observe("counter")
    assert info.standby_generation == GEN and "counter-rest" in (info.rest_url or "")
    rt.discard_standby("counter", generation=GEN, deadline=c.clock.monotonic() + 60)
    assert gens(c) == {""} and rt_of(c).observe("counter").standby_generation is None


def test_a_standby_whose_taskmanager_cannot_start_fails_at_once(cluster: Cluster, standin_only: Standin) -> None:
    c = cluster
    rt = rt_of(c)
    a = app("counter", c.namespace)
    rt.apply(rt.render(a, job_id="0" * 32))
    standin_only.set_auto_ready(False)
    try:
        rt.apply(rt.render(a, generation=GEN))  # the standby's objects, as start_standby applies them
        c.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"counter-g{GEN}-tm-0", "labels": r.selector_labels("counter", "taskmanager", GEN)}})
        c.patch("Pod", f"counter-g{GEN}-tm-0", {"status": {"phase": "Pending", "containerStatuses": [{
            "name": r.MAIN_CONTAINER, "ready": False, "restartCount": 0, "state": {"waiting": {
                "reason": "RunContainerError", "message": "memory configuration refused"}}}]}},
            manager="kubelet", status=True)
        with pytest.raises(PermanentStepError, match=r"TaskManager of cluster .* failed to start.*RunContainerError"):
            rt.start_standby(a, generation=GEN, deadline=c.clock.monotonic() + 600)
    finally:
        standin_only.set_auto_ready(True)
    assert pointers(c).standby == GEN  # the abort's DiscardStandby removes it


def test_a_standby_that_would_not_fit_the_namespace_quota_fails_before_anything_is_created(
        cluster: Cluster, standin_only: Standin) -> None:
    c = cluster
    rt = rt_of(c)
    a = app("counter", c.namespace)
    rt.apply(rt.render(a, job_id="0" * 32))
    # What the quota controller reports with the first cluster and something else running.
    c.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team"},
              "spec": {"hard": {"requests.cpu": "4", "pods": "10"}}})
    c.patch("ResourceQuota", "team", {"status": {"hard": {"requests.cpu": "4", "pods": "10"},
                                                 "used": {"requests.cpu": "2500m", "pods": "2"}}},
            manager="kube-controller-manager", status=True)
    with pytest.raises(PermanentStepError, match=r"quota does not fit a standby.*requests\.cpu used 2500m of 4, "
                                                 r"a second cluster needs 2 more.*clusterStrategy: cold"):
        rt.start_standby(a, generation=GEN, deadline=c.clock.monotonic() + 60)
    assert gens(c) == {""} and pointers(c) == Pointers(live="")
    assert kubernetes_requests(rt, a) == {"pods": 2.0, "requests.cpu": 2.0}


def kubernetes_requests(rt: KubernetesRuntime, a: Any) -> dict[str, float]:
    from reconciler.live.kubernetes.quota import quota_need
    need = quota_need(rt.render(a, generation=GEN))
    return {k: round(need[k], 3) for k in ("pods", "requests.cpu")}


# ---- the plan: a standby the quota would not fit is planned cold, and the plan says why ----

def test_an_app_whose_standby_the_runtime_refuses_is_planned_cold_with_the_reason() -> None:
    from reconciler.core.planner import Policy, plan
    from tests.core.builders import app as core_app
    from tests.core.builders import inp, record, running

    ckpt: dict[str, Any] = {"execution.checkpointing.interval": "5s"}
    old = core_app(flinkConfiguration=ckpt)
    new = core_app(flinkConfiguration=ckpt, taskManager={"resources": {"memory": "1536m"}})
    why = "the namespace quota does not fit a second cluster beside the running one (ResourceQuota team: ...)"
    refused = Policy(warm_standby=True, standby_refused={"orders": why})
    p = plan(inp([new], [old], [running()], [record(savepoint_age=None)], policy=refused)).app("orders")
    assert p.cluster_strategy is ClusterStrategy.COLD and f"cold: {why}, so the cluster restarts" in p.reason
    assert [type(s).__name__ for s in p.steps][:2] == ["StopWithSavepoint", "EnsureCluster"]
    other = Policy(warm_standby=True, standby_refused={"payments": why})
    p = plan(inp([new], [old], [running()], [record(savepoint_age=None)], policy=other)).app("orders")
    assert p.cluster_strategy is ClusterStrategy.WARM_STANDBY


def test_standby_refusals_name_the_apps_the_quota_would_not_fit(cluster: Cluster, standin_only: Standin) -> None:
    c = cluster
    rt = rt_of(c)
    small, big = app("small", c.namespace), app("big", c.namespace, taskManager={"replicas": 4, "slots": 2})
    assert rt.standby_refusals([small, big]) == {}  # no quota: nothing to refuse, one list
    c.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team"},
              "spec": {"hard": {"requests.cpu": "8"}}})
    c.patch("ResourceQuota", "team", {"status": {"hard": {"requests.cpu": "8"}, "used": {"requests.cpu": "4"}}},
            manager="kube-controller-manager", status=True)
    standin_only.api.reset_log()
    refused = rt.standby_refusals([small, big])
    assert set(refused) == {"big"} and "requests.cpu used 4 of 8, a second cluster needs 5 more" in refused["big"]
    assert [(c.verb, c.resource) for c in standin_only.api.calls()] == [("list", "resourcequotas")]


def test_a_standby_is_checked_against_claim_storage_and_object_count_quotas_too(
        cluster: Cluster, standin_only: Standin) -> None:
    """A second cluster also doubles the TaskManagers' volume claims and the objects of its generation: a
    quota on those refuses the standby as a cpu quota does (the plan then restarts the cluster cold)."""
    c = cluster
    rt = rt_of(c)
    claims = {"replicas": 2, "volumeClaimTemplates": [
        {"name": "rocksdb", "mountPath": "/opt/flink/rocksdb", "storage": "20Gi", "storageClassName": "fast"}]}
    stateful, plain = app("stateful", c.namespace, taskManager=claims), app("plain", c.namespace)
    hard = {"persistentvolumeclaims": "10", "fast.storageclass.storage.k8s.io/requests.storage": "100Gi",
            "count/configmaps": "50"}
    c.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team"}, "spec": {"hard": hard}})
    c.patch("ResourceQuota", "team", {"status": {"hard": hard, "used": {
        "persistentvolumeclaims": "9", "fast.storageclass.storage.k8s.io/requests.storage": "70Gi",
        "count/configmaps": "48"}}}, manager="kube-controller-manager", status=True)
    refused = rt.standby_refusals([stateful, plain])
    assert set(refused) == {"stateful"}, refused  # plain: no claims, and one new ConfigMap (its config) fits
    assert "persistentvolumeclaims used 9 of 10, a second cluster needs 2 more" in refused["stateful"]
    assert "fast.storageclass.storage.k8s.io/requests.storage used 70Gi of 100Gi, a second cluster needs " \
           "40Gi more" in refused["stateful"]
    from reconciler.live.kubernetes.generations import of_generation
    from reconciler.live.kubernetes.quota import quota_need
    need = quota_need(of_generation(rt.render(plain, generation=GEN), GEN))
    assert need["count/configmaps"] == 1 and "persistentvolumeclaims" not in need


def test_drift_of_one_cluster_ignores_the_other_generation_beside_it(cluster: Cluster, standin_only: Standin) -> None:
    c = cluster
    rt = rt_of(c)
    a = app("counter", c.namespace)
    base, session = rt.render(a, job_id="0" * 32), rt.render(a, generation=GEN)
    rt.apply(base)
    rt.apply(session)
    assert rt.drift(base) == [] and rt.drift(session) == []
    c.kube.delete("Service", c.namespace, f"counter-g{GEN}-rest")
    assert rt.drift(session) == [f"Service/counter-g{GEN}-rest: missing"] and rt.drift(base) == []


class QuotaAwareFakeRuntime(FakeStandbyRuntime):
    """The fake standby runtime plus the kubernetes runtime's plan-time answer (StandbyCapacity)."""

    def __init__(self, clock: FakeClock, **kw: Any) -> None:
        super().__init__(clock, **kw)
        self.refuse: dict[str, str] = {}
        self.asked: list[list[str]] = []

    def standby_refusals(self, apps: list[FlinkApp]) -> dict[str, str]:
        self.asked.append(sorted(a.name for a in apps))
        return {a.name: self.refuse[a.name] for a in apps if a.name in self.refuse}


def orders_yaml(memory: str) -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata: {{name: orders}}
spec:
  taskManager: {{slots: 4, resources: {{memory: {memory}}}}}
  flinkConfiguration: {{execution.checkpointing.interval: 1s}}
  job: {{jarURI: jobs/counter.jar, parallelism: 2}}
"""


def test_the_daemons_pass_plans_cold_what_the_runtime_says_would_not_fit(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("jobs/counter.jar", b"not really a jar")
    repo.write("apps/orders.yaml", orders_yaml("1024m"))
    first = repo.commit("orders")
    clock = FakeClock()
    runtime = QuotaAwareFakeRuntime(clock, savepoint_dir=str(tmp_path / "savepoints"), create_savepoint_dirs=True)
    rec = Reconciler(source=GitSource(str(repo.origin), tmp_path / "state" / "git"), runtime=runtime,
                     journal=Journal(tmp_path / "state" / "journal", clock), clock=clock, runtime_name="local")
    rec.source.fetch()
    assert rec.apply(first).ok
    assert runtime.asked == []  # nothing changed for a running app: the runtime is not asked
    repo.write("apps/orders.yaml", orders_yaml("1536m"))
    second = repo.commit("more TaskManager memory")
    rec.source.fetch()
    assert rec.plan(second).app("orders").cluster_strategy is ClusterStrategy.WARM_STANDBY
    runtime.refuse["orders"] = "the namespace quota does not fit a second cluster beside the running one (...)"
    ap = rec.plan(second).app("orders")
    assert ap.cluster_strategy is ClusterStrategy.COLD, ap.reason
    assert "cold: the namespace quota does not fit a second cluster" in ap.reason
    assert runtime.asked == [["orders"], ["orders"]]


@pytest.mark.parametrize(("text", "value"), [("500m", 0.5), ("2", 2.0), ("1408Mi", 1408 * 2.0**20),
                                             ("1E", 1e18), ("1Ei", 2.0**60), ("1E3", 1000.0), ("3k", 3000.0)])
def test_quota_quantities_in_every_kubernetes_suffix(text: str, value: float) -> None:
    """A quota written in exa units must not fail the whole pass (it raised ValueError)."""
    assert quantity(text) == value
