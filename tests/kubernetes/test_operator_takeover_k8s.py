"""Taking over an app from the Apache Flink Kubernetes Operator, end to end against the stand-in API server.

The whole reconcile pass runs (Git repository, planner, executor, journal in ConfigMaps, KubernetesRuntime); the
cluster is the stand-in plus `SimCluster` (test_executor_k8s: controllers, kubelet and the JobManager process
over the Flink REST contract server). `OperatorStandin` plays the operator, as it behaves for what a takeover
asks of it, between two polls of the code under test:

- its app: a FlinkDeployment (with the operator's finalizer and status), a JobManager Deployment, a TaskManager
  pod and the `<name>` / `<name>-rest` Services, labelled as Flink's native Kubernetes integration labels them,
  and its job running in the Flink REST server;
- `spec.job.state: suspended` (upgradeMode savepoint): it stops the job with a savepoint through Flink's REST API
  (`POST /jobs/<id>/stop`, then polls the operation), removes its JobManager and TaskManagers, and writes
  `status.jobStatus.upgradeSavepointPath` and `lifecycleState: SUSPENDED` through the status subresource; or,
  when told to fail, writes `status.error` as the operator does;
- deletion: its finalizer removes what is left (its Services) one poll later, then lets the object go.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.apply.journal import Journal
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action
from reconciler.live.kubernetes.records import ConfigMapRecordStore
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.records import Doc, Read
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.gitutil import Repo
from tests.kubernetes.test_executor_k8s import APP, SimClock, World, world  # noqa: F401  (fixture)

pytestmark = pytest.mark.kubernetes

Obj = dict[str, Any]
OPERATOR_JOB = "0123456789abcdef0123456789abcdef"
FINALIZER = "flinkdeployments.flink.apache.org/finalizer"
NATIVE = {"app": APP, "type": "flink-native-kubernetes"}

SPEC = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {app}
  namespace: {ns}
spec:
  image: flink:2.3
  taskManager: {{slots: 2}}
  deadlines: {{start: 2m, savepoint: 1m, healthy: 2m, delete: 1m}}
  highAvailability: {{enabled: true, storageDir: s3://bucket/ha/{app}}}
  job:
    jarURI: local:///opt/flink/usrlib/counter.jar
    entryClass: com.example.Counter
    args: ["--rate", "100"]
    parallelism: 2
  flinkConfiguration:
    execution.checkpointing.dir: s3://bucket/checkpoints/{app}
    execution.checkpointing.savepoint-dir: s3://bucket/savepoints/{app}
    execution.checkpointing.interval: 10s
"""


class OperatorStandin:
    """The Flink Kubernetes Operator, for one FlinkDeployment (see the module docstring)."""

    def __init__(self, w: World, flink_url: str) -> None:
        self.w, self.flink_url = w, flink_url
        self.ns = w.cluster.namespace
        self.trigger: str | None = None
        self.fail_suspend: str | None = None  # the operator's error text instead of a savepoint
        self.stops = 0  # stop-with-savepoint requests it sent to Flink

    # ---- its app, as the operator deployed it ----
    def deploy(self, status: Obj | None = None) -> None:
        c, ns = self.w.cluster, self.ns
        c.create({"apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkDeployment",
                  "metadata": {"name": APP, "namespace": ns, "finalizers": [FINALIZER]},
                  "spec": {"image": "flink:2.3", "flinkVersion": "v2_0", "serviceAccount": "flink",
                           "flinkConfiguration": {"state.savepoints.dir": f"s3://bucket/savepoints/{APP}",
                                                  "state.checkpoints.dir": f"s3://bucket/checkpoints/{APP}"},
                           "job": {"jarURI": "local:///opt/flink/usrlib/counter.jar", "parallelism": 2,
                                   "upgradeMode": "last-state", "state": "running"}}}, manager="kubectl")
        c.patch("FlinkDeployment", APP, {"status": status or {
            "lifecycleState": "STABLE", "reconciliationStatus": {"state": "DEPLOYED"},
            "jobStatus": {"jobId": OPERATOR_JOB, "state": "RUNNING"}}}, manager="flink-kubernetes-operator",
            status=True)
        c.create({"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": APP, "labels": {**NATIVE, "component": "jobmanager"}},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {**NATIVE, "component": "jobmanager"}},
                           "template": {"metadata": {"labels": {**NATIVE, "component": "jobmanager"}},
                                        "spec": {"containers": [{"name": "flink-main-container",
                                                                 "image": "flink:2.3"}]}}}},
                 manager="flink-kubernetes-operator")
        for pod, comp in ((f"{APP}-jm-0", "jobmanager"), (f"{APP}-taskmanager-1-1", "taskmanager")):
            c.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "labels": {**NATIVE,
                                                                                            "component": comp}},
                      "spec": {"containers": [{"name": "flink-main-container", "image": "flink:2.3"}]}},
                     manager="kube-controller-manager")
        for svc in (APP, f"{APP}-rest"):
            c.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc, "labels": NATIVE},
                      "spec": {"ports": [{"name": "rest", "port": 8081}]}}, manager="flink-kubernetes-operator")
        assert self.w.flink is not None and self.w.cluster.standin is not None
        self.w.flink.start_jobmanager(OPERATOR_JOB, restore_path=None)

    def deployment(self) -> Obj | None:
        return self.w.cluster.kube.get("FlinkDeployment", self.ns, APP)

    def native_objects(self) -> list[str]:
        kube, sel = self.w.cluster.kube, f"app={APP},type=flink-native-kubernetes"
        return [f"{k}/{o['metadata']['name']}" for k in ("Deployment", "Pod", "Service")
                for o in kube.list(k, self.ns, sel)]

    # ---- its reconcile loop ----
    def tick(self) -> None:
        fd = self.deployment()
        if fd is None:
            return
        kube, c = self.w.cluster.kube, self.w.cluster
        if fd["metadata"].get("deletionTimestamp"):  # its finalizer: clean up, then let the object go
            for svc in (APP, f"{APP}-rest"):
                kube.delete("Service", self.ns, svc)
            c.patch("FlinkDeployment", APP, {"metadata": {"finalizers": None}}, manager="flink-kubernetes-operator")
            return
        job, status = fd["spec"]["job"], fd.get("status") or {}
        if job.get("state") == "running" and status.get("lifecycleState") != "SUSPENDED":
            return
        if job.get("state") != "suspended" or status.get("lifecycleState") == "SUSPENDED" or status.get("error"):
            return
        assert job.get("upgradeMode") == "savepoint", job
        if self.fail_suspend:
            c.patch("FlinkDeployment", APP, {"status": {"error": self.fail_suspend}},
                    manager="flink-kubernetes-operator", status=True)
            return
        base = f"{self.flink_url}/jobs/{OPERATOR_JOB}"
        if self.trigger is None:
            r = httpx.post(f"{base}/stop", json={"drain": False})
            assert r.status_code == 202, r.text
            self.trigger = r.json()["request-id"]
            self.stops += 1
            c.patch("FlinkDeployment", APP, {"status": {"lifecycleState": "SUSPENDING"}},
                    manager="flink-kubernetes-operator", status=True)
            return
        op = httpx.get(f"{base}/savepoints/{self.trigger}").json()
        if op["status"]["id"] != "COMPLETED":
            return
        location = op["operation"]["location"]
        # Suspended: the operator deletes its JobManager (and with it the TaskManagers), then records the path.
        kube.delete("Deployment", self.ns, APP)
        for pod in kube.list("Pod", self.ns, f"app={APP},type=flink-native-kubernetes"):
            kube.delete("Pod", self.ns, pod["metadata"]["name"])
        assert self.w.flink is not None
        self.w.flink.stop_jobmanager()
        c.patch("FlinkDeployment", APP, {"status": {
            "lifecycleState": "SUSPENDED", "jobStatus": {"state": "FINISHED", "upgradeSavepointPath": location}}},
            manager="flink-kubernetes-operator", status=True)


class Crash(BaseException):
    """The reconciler process dying (kill -9): nothing in the executor catches it."""


class CrashingStore:
    """The records in ConfigMaps, and a process that dies just before its `crash_at`-th write from now on."""

    def __init__(self, inner: ConfigMapRecordStore) -> None:
        self.inner, self.where = inner, inner.where
        self.writes = 0
        self.crash_at: int | None = None

    def list(self) -> dict[str, Read]:
        return self.inner.list()

    def get(self, app: str) -> Read | None:
        return self.inner.get(app)

    def put(self, app: str, doc: Doc, *, expected: str | None) -> str:
        self.writes += 1
        if self.crash_at is not None and self.writes >= self.crash_at:
            raise Crash(f"killed before record write {self.writes}")
        return self.inner.put(app, doc, expected=expected)

    def delete(self, app: str, *, expected: str) -> None:
        self.inner.delete(app, expected=expected)


@pytest.fixture
def setup(world: World, tmp_path: Path) -> Iterator[dict[str, Any]]:  # noqa: F811
    if world.sim is None or world.flink is None or world.cluster.standin is None:
        pytest.skip("needs the stand-in's simulated kubelet, Flink REST backend and the operator stand-in")
    flink_url = world.sim.flink_url
    operator = OperatorStandin(world, flink_url)
    assert isinstance(world.clock, SimClock)
    world.clock.on_sleep.append(operator.tick)
    world.flink.checkpoint_interval_s = 2.0  # AwaitHealthy polls every 0.2 s of the simulated clock
    repo = Repo(tmp_path)
    repo.write("apps/counter.yaml", SPEC.format(app=APP, ns=world.cluster.namespace))
    rev = repo.commit("counter, moved over from the operator")
    n = [0]

    def reconciler() -> tuple[Reconciler, CrashingStore]:
        """A new reconciler process: its own empty state dir, the records in the cluster."""
        n[0] += 1
        runtime = KubernetesRuntime(world.cluster.api_client, clock=world.clock, namespaces=[world.cluster.namespace],
                                    rest_via="proxy", poll_interval=world.cluster.poll)
        store = CrashingStore(ConfigMapRecordStore(runtime.kube, runtime.namespaces))
        state = tmp_path / f"state-{n[0]}"
        rec = Reconciler(source=GitSource(str(repo.origin), state / "git", branch="main"), runtime=runtime,
                         journal=Journal(state / "journal", world.clock, store=store), clock=world.clock,
                         subdir="apps", max_parallel=1)
        rec.source.fetch()
        return rec, store

    yield {"world": world, "operator": operator, "rev": rev, "reconciler": reconciler}


def _assert_taken_over(w: World, operator: OperatorStandin, rec: Reconciler, rev: str) -> None:
    assert w.flink is not None
    # Exactly one job runs, ours, started from the savepoint the operator's job stopped with (taken once).
    running = [j for j in w.flink.jobs.values() if j.state == "RUNNING"]
    assert len(running) == 1 and running[0].jid != OPERATOR_JOB
    assert operator.stops == 1 and len(w.flink.savepoints_taken) == 1
    taken = w.flink.savepoints_taken[0]
    assert running[0].restored_from == taken
    assert [restore for _, restore in w.flink.starts[1:]] == [taken]  # started once, from it
    # Nothing of the operator's is left; the app is ours, on record with that savepoint.
    assert operator.deployment() is None and operator.native_objects() == []
    record = rec.journal.record(APP)
    assert record is not None and record.last_applied_revision == rev and record.job_id == running[0].jid
    assert [s.path for s in record.savepoints] == [taken]
    assert rec.journal.inflight(APP) is None
    assert rec.plan(rev).app(APP).action is Action.NOOP


def test_takeover_stops_the_operators_job_with_a_savepoint_and_starts_ours_from_it(setup: dict[str, Any]) -> None:
    w, operator, rev = setup["world"], setup["operator"], setup["rev"]
    operator.deploy()
    rec, _ = setup["reconciler"]()
    the_plan = rec.plan(rev)
    ap = the_plan.app(APP)
    assert ap.action is Action.TAKEOVER, ap.reason
    assert [s.type for s in ap.steps] == ["SuspendOperatorDeployment", "DeleteOperatorDeployment", "EnsureCluster",
                                          "StartJob", "AwaitRunning", "AwaitHealthy"]
    done = rec.apply(rev)
    res = done.results[APP]
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.restored_from == w.flink.savepoints_taken[0]
    _assert_taken_over(w, operator, rec, rev)
    assert [t.action for t in rec.journal.history(APP)] == ["takeover", "savepoint", "finish"]
    assert [e.action for e in rec.journal.lineage(APP)] == ["takeover"]


# Record writes of one takeover (begin, each step started/done, the FlinkDeployment as it was before the suspend
# patch, the savepoint as soon as it is read, finish ...):
# every one is a crash point. A takeover that writes fewer fails the last point: keep this in step.
CRASH_POINTS = range(1, 18)


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_a_reconciler_killed_at_any_record_write_of_a_takeover_is_resumed_by_the_next_one(
        setup: dict[str, Any], crash_at: int) -> None:
    w, operator, rev = setup["world"], setup["operator"], setup["rev"]
    operator.deploy()
    first, store = setup["reconciler"]()
    store.crash_at = crash_at
    with pytest.raises(Crash):
        first.apply(rev)
    second, _ = setup["reconciler"]()  # a new process, empty state dir: the records are in the cluster
    after = second.apply(rev)
    outcomes = {**after.resumed, **after.results}
    assert all(r.outcome is Outcome.SUCCESS for r in outcomes.values()), {k: v.message for k, v in outcomes.items()}
    _assert_taken_over(w, operator, second, rev)


def test_the_writes_of_a_takeover_are_all_crash_points(setup: dict[str, Any]) -> None:
    """CRASH_POINTS covers every record write of a takeover (and no more)."""
    operator = setup["operator"]
    operator.deploy()
    rec, store = setup["reconciler"]()
    assert rec.apply(setup["rev"]).results[APP].outcome is Outcome.SUCCESS
    assert store.writes == CRASH_POINTS.stop - 1, store.writes


def test_a_failed_suspend_gives_the_app_back_to_the_operator(setup: dict[str, Any]) -> None:
    w, operator, rev = setup["world"], setup["operator"], setup["rev"]
    operator.deploy()
    operator.fail_suspend = "Savepoint failed: the job is not running all its tasks"
    rec, _ = setup["reconciler"]()
    res = rec.apply(rev).results[APP]
    assert res.outcome is Outcome.FAILURE
    assert "the operator reported an error while suspending" in res.message and "give FlinkDeployment" in res.message
    fd = operator.deployment()
    assert fd is not None and fd["spec"]["job"]["state"] == "running" and fd["spec"]["job"]["upgradeMode"] == \
        "last-state"
    assert w.flink.job_state(OPERATOR_JOB) == "RUNNING"  # its job was never touched by us
    assert w.cluster.kube.list("Deployment", w.cluster.namespace, "app.kubernetes.io/managed-by=flink-reconciler") == []
    # Not retried in a loop: the same commit is blocked until a new one (or restartNonce) retries.
    assert rec.plan(rev).app(APP).action is Action.BLOCKED


@pytest.mark.parametrize(("status", "why"), [
    ({"lifecycleState": "UPGRADING", "reconciliationStatus": {"state": "UPGRADING"},
      "jobStatus": {"jobId": OPERATOR_JOB, "state": "RUNNING"}}, "mid-upgrade"),
    ({"lifecycleState": "DEPLOYED", "error": "ImagePullBackOff", "reconciliationStatus": {"state": "DEPLOYED"},
      "jobStatus": {"jobId": OPERATOR_JOB, "state": "RUNNING"}}, "is in error (ImagePullBackOff)"),
])
def test_a_takeover_is_refused_while_the_operator_is_busy_or_in_error(
        setup: dict[str, Any], status: Obj, why: str) -> None:
    operator, rev = setup["operator"], setup["rev"]
    operator.deploy(status)
    rec, _ = setup["reconciler"]()
    ap = rec.plan(rev).app(APP)
    assert ap.action is Action.BLOCKED and why in ap.reason, ap.reason
    rec.apply(rev)
    fd = operator.deployment()
    assert fd is not None and fd["spec"]["job"]["state"] == "running"  # nothing was asked of it


def test_the_plan_json_names_the_flinkdeployment(setup: dict[str, Any]) -> None:
    operator, rev = setup["operator"], setup["rev"]
    operator.deploy()
    rec, _ = setup["reconciler"]()
    doc = json.loads(rec.plan(rev).to_json())
    steps = doc["apps"][0]["steps"]
    assert steps[0] == {"type": "SuspendOperatorDeployment", "namespace": operator.ns, "name": APP,
                        "deadline_s": 60.0}


FORBIDDEN = ("flink.apache.org", "flinkdeployments", "list")


def _ours(w: World) -> list[Obj]:
    return w.cluster.kube.list("Deployment", w.cluster.namespace, "app.kubernetes.io/managed-by=flink-reconciler")


def test_an_app_is_not_started_beside_the_operator_while_its_flinkdeployments_are_forbidden(
        setup: dict[str, Any]) -> None:
    """The operator runs the app's job, and the reconciler's RBAC lacks `list` on flinkdeployments: a new app
    without spec.takeover is blocked, with the missing verb and resource, on every pass (a blocked attempt on record
    is no run of it here); with the permission back, the takeover is planned."""
    w, operator, rev = setup["world"], setup["operator"], setup["rev"]
    operator.deploy()
    w.cluster.standin.deny(*FORBIDDEN)
    rec, _ = setup["reconciler"]()
    for _ in range(2):
        ap = rec.plan(rev).app(APP)
        assert ap.action is Action.BLOCKED, ap.reason
        ns = w.cluster.namespace
        assert ap.reason.startswith(f"FlinkDeployments in namespace {ns} cannot be read (403 Forbidden: "
                                    "flinkdeployments.flink.apache.org is forbidden: User ")
        assert f'cannot list resource "flinkdeployments" in API group "flink.apache.org" in the namespace "{ns}"' \
            in ap.reason
        assert f"Grant the reconciler list on flinkdeployments.flink.apache.org in namespace {ns}" in ap.reason
        assert rec.apply(rev).results[APP].outcome is Outcome.FAILURE
        assert _ours(w) == [] and w.flink.job_state(OPERATOR_JOB) == "RUNNING"
    fd = operator.deployment()
    assert fd is not None and fd["spec"]["job"]["state"] == "running"  # nothing was asked of it
    w.cluster.standin.reset_access()
    assert rec.plan(rev).app(APP).action is Action.TAKEOVER


def test_a_refused_takeover_is_not_followed_by_a_create_beside_the_operators_job(setup: dict[str, Any]) -> None:
    """A takeover refused on first sight (the FlinkDeployment is mid-upgrade) leaves a blocked attempt on record:
    the next pass still sees the FlinkDeployment, and once it settled, takes it over."""
    w, operator, rev = setup["world"], setup["operator"], setup["rev"]
    operator.deploy({"lifecycleState": "UPGRADING", "reconciliationStatus": {"state": "UPGRADING"},
                     "jobStatus": {"jobId": OPERATOR_JOB, "state": "RUNNING"}})
    rec, _ = setup["reconciler"]()
    assert rec.apply(rev).results[APP].action is Action.BLOCKED
    ap = rec.plan(rev).app(APP)
    assert ap.action is Action.BLOCKED and "mid-upgrade" in ap.reason, ap.reason
    w.cluster.patch("FlinkDeployment", APP, {"status": {"lifecycleState": "STABLE", "reconciliationStatus": {
        "state": "DEPLOYED"}}}, manager="flink-kubernetes-operator", status=True)
    assert rec.plan(rev).app(APP).action is Action.TAKEOVER
    assert _ours(w) == []


@pytest.mark.parametrize(("access", "discovered"), [
    ("readable", 0),  # the operator's CRD installed, no FlinkDeployment of the app
    ("not installed", 0),  # 404 on the resource: nothing to take over, nothing more asked
    ("forbidden, not installed", 1),  # 403 says nothing of the CRD (RBAC comes first): discovery says it is absent
])
def test_without_the_operator_a_new_app_is_created_as_ever(setup: dict[str, Any], access: str,
                                                            discovered: int) -> None:
    w, rev = setup["world"], setup["rev"]
    standin = w.cluster.standin
    if "not installed" in access:
        standin.unserve("flink.apache.org")
    if "forbidden" in access:
        standin.deny(*FORBIDDEN)
    rec, _ = setup["reconciler"]()
    for _ in range(3):
        standin.api.reset_log()
        ap = rec.plan(rev).app(APP)
        assert ap.action is Action.CREATE, ap.reason
        calls = [(c.verb, c.resource) for c in standin.api.calls() if c.resource in ("flinkdeployments", "discovery")]
        assert calls == [("list", "flinkdeployments")] + [("get", "discovery")] * discovered
        discovered = 0  # what discovery said is kept: asked once, not per pass
