"""Issue 23 with real Flink: a stateful job run by the Apache Flink Kubernetes Operator is taken over, and the
reconciler is killed at three step boundaries of the takeover on the way.

The stand-in API server, the process node running every pod as real Flink JVMs (test_flink_on_k8s_e2e), the
product's reconcile pass (`Reconciler`: Git -> observe -> plan -> execute, records in ConfigMaps, the
`KubernetesRuntime` with its FlinkDeployment port) and `Operator`, a stand-in for the operator running in a
thread of the test, playing what a takeover asks of it:

- **its app**, as the operator deploys an application-mode FlinkDeployment: the FlinkDeployment (with the
  operator's finalizer and status), a JobManager Deployment `<name>` running the counter job under a fixed job
  id, a TaskManager pod `<name>-taskmanager-1-1`, the Services `<name>` and `<name>-rest` and the ConfigMap
  `flink-config-<name>`, all labelled `app=<name>, type=flink-native-kubernetes, component=...` as Flink's
  native Kubernetes integration labels them. Its config has `execution.shutdown-on-application-finish: false`,
  as the operator sets it (a stopped job leaves its JobManager up, for the operator to read the result);
- **`spec.job.state: suspended` with `upgradeMode: savepoint`**: it stops the job with a savepoint through the
  real JobManager's REST API (`POST /jobs/<id>/stop`, polling the operation, through the API server's service
  proxy), then deletes its JobManager Deployment and TaskManager pod and writes
  `status.jobStatus.upgradeSavepointPath` with `lifecycleState: SUSPENDED`;
- **deletion**: its finalizer removes its Services and ConfigMap, then lets the object go.

What it does not show: the operator's native mode itself (its JobManager starting TaskManager pods through the
API; here the TaskManager pod is created with the app), and on the process node (see process_node.py) the image's
entrypoint and garbage collection of the objects the operator's JobManager Deployment owns (the stand-in operator
deletes them itself).

With FLINK_RECONCILER_TEST_KUBECONFIG (the node lab, real_node.py) the same runs on a real node: the operator's
pods and ours in real containers of the e2e image, each asking a quarter core and tolerating the lab's taint as
the e2e apps do; the FlinkDeployment CRD is made for the module (conftest.flink_operator_crd); the operator's
REST calls go through the API server's service proxy with the kubeconfig's credentials.

The takeover runs as four reconciler processes, each a new `Reconciler` with an empty state directory (its
records are in the cluster); the first three die (kill -9: an exception nothing catches, raised just before a
record write, as in test_operator_takeover_k8s) at a step boundary, the next resumes from the record:
1. after the operator's savepoint is read and recorded, before the suspend step is marked done;
2. after the FlinkDeployment and all its objects are gone, before the delete step is marked done;
3. after our JobManager was created with the job (the submit), before the start step is marked done;
and the fourth finishes. The job's per-key counts (its own output, on the shared claim) are watched the whole
time: they never go below what they were when the operator's job stopped, and go on from there.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.cli import Progress
from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.api import Kube
from reconciler.live.kubernetes.operator import NATIVE_TYPE
from reconciler.live.kubernetes.records import ConfigMapRecordStore
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.records import Doc, Read
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.model import FlinkApp
from tests.fixtures.flink import COUNTER_MAIN, read_counts, wait_until
from tests.gitutil import Repo
from tests.kubernetes.test_flink_on_k8s_e2e import CLAIM, IMAGE, KEYS, LAB_TOLERATION, K8sWorld, app_spec, module_world

pytestmark = [pytest.mark.kubernetes, pytest.mark.flink, pytest.mark.slow]

APP = "kmove"
OUT = "out-move"
RATE = 40  # records per second over all keys
OPERATOR_JOB = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
FINALIZER = "flinkdeployments.flink.apache.org/finalizer"
OPERATOR = "flink-kubernetes-operator"
NATIVE = {"app": APP, "type": NATIVE_TYPE}
Obj = dict[str, Any]

world = module_world("k8s-takeover", ns_prefix="fr-move", poll_interval=0.3)


def our_spec(ns: str) -> FlinkApp:
    """The app as Git gets it (what `flink-reconciler import` gives, plus HA, which Kubernetes needs for state):
    the same job and output as the operator's, TaskManagers as a Deployment, and spec.takeover."""
    d = app_spec(ns, name=APP, out=OUT, rate=RATE).model_dump(by_alias=True, mode="json", exclude_none=True)
    s = d["spec"]
    s["taskManager"].pop("volumeClaimTemplates")
    s["flinkConfiguration"].pop("process.taskmanager.working-dir")
    s["highAvailability"] = {"enabled": True, "storageDir": "file:///flink-data/ha"}
    s["flinkConfiguration"] |= {
        "high-availability.kubernetes.leader-election.lease-duration": "8 s",
        "high-availability.kubernetes.leader-election.renew-deadline": "6 s",
        "high-availability.kubernetes.leader-election.retry-period": "1 s",
    }
    s["takeover"] = {"from": f"FlinkDeployment/{APP}"}
    return FlinkApp.model_validate(d)


def _labels(component: str | None = None) -> dict[str, str]:
    return {**NATIVE, **({"component": component} if component else {})}


# What its FlinkDeployment asks of each pod. The operator sets requests and limits from `spec.*.resource`
# (cpu times `kubernetes.*.cpu.limit-factor`, 1.0 by default); a quarter core, as our e2e apps ask, so that on a
# two-core lab node (scripts/k8s-node-lab.sh) its pods and the takeover's new ones fit side by side.
CPU, MEMORY = 0.25, "1024m"
RESOURCES = {"requests": {"cpu": str(CPU), "memory": "1024Mi"}, "limits": {"cpu": str(CPU), "memory": "1024Mi"}}


def _pod_spec(args: list[str], probe: Obj) -> Obj:
    return {"tolerations": [LAB_TOLERATION], "containers": [{
        "name": r.MAIN_CONTAINER, "image": IMAGE, "args": args, "readinessProbe": probe, "resources": RESOURCES,
        "volumeMounts": [{"name": "flink-config-volume", "mountPath": "/opt/flink/conf"},
                         {"name": "flink-data", "mountPath": "/flink-data"}]}],
        "volumes": [{"name": "flink-config-volume", "configMap": {"name": f"flink-config-{APP}"}},
                    {"name": "flink-data", "persistentVolumeClaim": {"claimName": CLAIM}}]}


@dataclass
class Operator:
    """The Flink Kubernetes Operator for one FlinkDeployment (see the module docstring), ticking in a thread."""

    w: K8sWorld
    kube: Kube
    trigger: str | None = None
    savepoint: str | None = None  # where its job stopped
    stopped_at: float = 0.0  # when it learnt that (monotonic)
    counts_at_stop: dict[str, int] = field(default_factory=dict)
    stops: int = 0  # stop-with-savepoint requests it sent to Flink
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def ns(self) -> str:
        return self.w.ns

    def rest(self, method: str, path: str, body: Obj | None = None) -> Any:
        url = f"{self.kube.host}/api/v1/namespaces/{self.ns}/services/{APP}-rest:{r.REST_PORT}/proxy{path}"
        resp = self.w.http.request(method, url, json=body, timeout=10)  # a real API server wants credentials
        resp.raise_for_status()
        return resp.json()

    # ---- its app, as the operator deployed it ----
    def deploy(self) -> None:
        spec = our_spec(self.ns)
        d = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
        d["spec"]["highAvailability"] = {"enabled": False}
        plain = FlinkApp.model_validate(d)
        # Flink's config as the operator writes it: the same memory sizes and job settings as ours; its own
        # JobManager Service name for RPC; no HA (upgradeMode savepoint needs none).
        conf = {k: v for k, v in r.flink_config(plain).items() if not k.startswith("kubernetes.")}
        conf |= {"jobmanager.rpc.address": APP, "rest.address": f"{APP}-rest",
                 "execution.shutdown-on-application-finish": "false"}
        body = {"image": IMAGE, "flinkVersion": "v2_0", "serviceAccount": "flink",
                "flinkConfiguration": {"taskmanager.numberOfTaskSlots": "2",
                                       "state.savepoints.dir": "file:///flink-data/savepoints",
                                       "state.checkpoints.dir": "file:///flink-data/checkpoints",
                                       "execution.checkpointing.interval": "1 s"},
                "podTemplate": {"spec": {"tolerations": [LAB_TOLERATION], "containers": [{
                    "name": r.MAIN_CONTAINER, "volumeMounts": [{"name": "flink-data", "mountPath": "/flink-data"}]}],
                    "volumes": [{"name": "flink-data", "persistentVolumeClaim": {"claimName": CLAIM}}]}},
                "jobManager": {"resource": {"memory": MEMORY, "cpu": CPU}},
                "taskManager": {"resource": {"memory": MEMORY, "cpu": CPU}},
                "job": {"jarURI": "local:///opt/flink/usrlib/counter.jar", "entryClass": COUNTER_MAIN,
                        "args": list(spec.spec.job.args), "parallelism": 2, "upgradeMode": "savepoint",
                        "state": "running"}}
        self.create({"apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkDeployment",
                     "metadata": {"name": APP, "finalizers": [FINALIZER]}, "spec": body}, manager="kubectl")
        self.create({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": f"flink-config-{APP}", "labels": _labels()},
                     "data": {"config.yaml": r.config_yaml(conf), "log4j-console.properties": r.LOG4J_CONSOLE}})
        jm_args = ["standalone-job", "--job-classname", COUNTER_MAIN, "--job-id", OPERATOR_JOB, *spec.spec.job.args]
        self.create({"apiVersion": "apps/v1", "kind": "Deployment",
                     "metadata": {"name": APP, "labels": _labels("jobmanager")},
                     "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                              "selector": {"matchLabels": _labels("jobmanager")},
                              "template": {"metadata": {"labels": _labels("jobmanager")}, "spec": _pod_spec(
                                  jm_args, {"httpGet": {"path": "/config", "port": r.REST_PORT}})}}})
        self.create({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"{APP}-taskmanager-1-1", "labels": _labels("taskmanager")},
                     "spec": _pod_spec(["taskmanager"], {"tcpSocket": {"port": r.TM_RPC_PORT}})})
        self.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": APP, "labels": _labels()},
                     "spec": {"clusterIP": "None", "selector": _labels("jobmanager"), "ports": [
                         {"name": "jobmanager-rpc", "port": r.RPC_PORT}, {"name": "blobserver", "port": r.BLOB_PORT}]}})
        self.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{APP}-rest", "labels": _labels()},
                     "spec": {"selector": _labels("jobmanager"), "ports": [{"name": "rest", "port": r.REST_PORT}]}})

    def create(self, obj: Obj, manager: str = OPERATOR) -> None:
        self.kube.request("POST", Kube.path(obj["kind"], self.ns), query=[("fieldManager", manager)], body=obj)

    def write_status(self, status: Obj) -> None:
        self.kube.request("PATCH", Kube.path("FlinkDeployment", self.ns, APP) + "/status",
                          query=[("fieldManager", OPERATOR)], body={"status": status},
                          content_type="application/merge-patch+json")

    def deployment(self) -> Obj | None:
        return self.kube.get("FlinkDeployment", self.ns, APP)

    def objects(self) -> list[str]:
        """Every object of its app that is left (Flink's native labels, or the names it used)."""
        sel = f"app={APP},type={NATIVE_TYPE}"
        left = [f"{k}/{o['metadata']['name']}" for k in ("Deployment", "Pod", "Service", "ConfigMap")
                for o in self.kube.list(k, self.ns, sel)]
        left += [f"ConfigMap/{n}" for n in (f"flink-config-{APP}",) if self.kube.get("ConfigMap", self.ns, n)]
        return sorted(set(left)) + (["FlinkDeployment/" + APP] if self.deployment() else [])

    # ---- its reconcile loop ----
    def start(self) -> None:
        threading.Thread(target=self._run, name="operator", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # an operator keeps reconciling; the test looks at `errors`
                self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(0.3)

    def tick(self) -> None:
        fd = self.deployment()
        if fd is None:
            return
        if fd["metadata"].get("deletionTimestamp"):  # its finalizer: clean up, then let the object go
            for kind, name in (("Service", APP), ("Service", f"{APP}-rest"), ("ConfigMap", f"flink-config-{APP}")):
                self.kube.delete(kind, self.ns, name)
            self.kube.request("PATCH", Kube.path("FlinkDeployment", self.ns, APP), query=[("fieldManager", OPERATOR)],
                              body={"metadata": {"finalizers": None}}, content_type="application/merge-patch+json")
            return
        job, status = fd["spec"]["job"], fd.get("status") or {}
        if job.get("state") != "suspended" or status.get("lifecycleState") == "SUSPENDED":
            return
        if job.get("upgradeMode") != "savepoint":
            raise AssertionError(f"suspended with upgradeMode {job.get('upgradeMode')}: the job would lose its state")
        if self.trigger is None:
            self.trigger = self.rest("POST", f"/jobs/{OPERATOR_JOB}/stop", {"drain": False})["request-id"]
            self.stops += 1
            # What the operator says while it suspends (a takeover is refused in this state, but one in flight
            # waits through it).
            self.write_status({"lifecycleState": "UPGRADING", "reconciliationStatus": {"state": "UPGRADING"}})
            return
        op = self.rest("GET", f"/jobs/{OPERATOR_JOB}/savepoints/{self.trigger}")
        if op["status"]["id"] != "COMPLETED":
            return
        if "location" not in op["operation"]:
            self.write_status({"error": f"savepoint failed: {op['operation'].get('failure-cause')}"})
            return
        self.savepoint = op["operation"]["location"]
        self.stopped_at = time.monotonic()
        self.counts_at_stop = read_counts(self.w.node.pvc_dir(self.ns, CLAIM) / OUT)
        # Suspended: its JobManager goes (and with it, by the garbage collector, its TaskManagers), then the status.
        self.kube.delete("Deployment", self.ns, APP)
        self.kube.delete("Pod", self.ns, f"{APP}-taskmanager-1-1")
        self.write_status({"lifecycleState": "SUSPENDED", "reconciliationStatus": {"state": "DEPLOYED"},
                           "jobStatus": {"jobId": OPERATOR_JOB, "state": "FINISHED",
                                         "upgradeSavepointPath": self.savepoint}})


class Crash(BaseException):
    """The reconciler process dying (kill -9): nothing in the executor catches it."""


class CrashingStore:
    """The records in ConfigMaps, and a process that dies just before it would write that step `index` of the
    takeover is `phase` (a step boundary: the step's effect happened, its record says it has not)."""

    def __init__(self, inner: ConfigMapRecordStore, crash_before: tuple[int, str] | None) -> None:
        self.inner, self.where = inner, inner.where
        self.crash_before = crash_before

    def list(self) -> dict[str, Read]:
        return self.inner.list()

    def get(self, app: str) -> Read | None:
        return self.inner.get(app)

    def put(self, app: str, doc: Doc, *, expected: str | None) -> str:
        f = doc.get("inflight") or {}
        if self.crash_before is not None and f.get("stage") == "forward" and \
                (f.get("step_index"), f.get("phase")) == self.crash_before:
            raise Crash(f"killed before recording step {self.crash_before[0] + 1} {self.crash_before[1]}")
        return self.inner.put(app, doc, expected=expected)

    def delete(self, app: str, *, expected: str) -> None:
        self.inner.delete(app, expected=expected)


@dataclass
class Counts:
    """The job's per-key counts, sampled ten times a second in a thread (monotonic time, counts)."""

    w: K8sWorld
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def now(self) -> dict[str, int]:
        return read_counts(self.w.node.pvc_dir(self.w.ns, CLAIM) / OUT)

    def start(self) -> None:
        threading.Thread(target=self._run, name="counts", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):  # a sample lost is no reason to stop sampling
                self.samples.append((time.monotonic(), self.now()))
            self._stop.wait(0.1)

    def lowest_since(self, t: float) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, c in (s for s in self.samples if s[0] >= t):
            for k, v in c.items():
                out[k] = min(out.get(k, v), v)
        return out


@dataclass
class Move:
    w: K8sWorld
    operator: Operator
    counts: Counts
    repo: Repo
    rev: str
    root: Path
    journals: list[Journal] = field(default_factory=list)

    def reconciler(self, crash_before: tuple[int, str] | None = None) -> Reconciler:
        """A new reconciler process: its own empty state dir and Git clone; the records are in the cluster."""
        n = len(self.journals) + 1
        runtime = KubernetesRuntime(self.w.api, clock=SystemClock(), namespaces=[self.w.ns], rest_via="proxy",
                                    poll_interval=0.3)
        store = CrashingStore(ConfigMapRecordStore(runtime.kube, runtime.namespaces), crash_before)
        state = self.root / f"state-{n}"
        journal = Journal(state / "journal", SystemClock(), store=store)
        self.journals.append(journal)
        rec = Reconciler(source=GitSource(str(self.repo.origin), state / "git", branch="main"), runtime=runtime,
                         journal=journal, clock=SystemClock(), runtime_name="kubernetes", max_parallel=1,
                         on_event=Progress(sys.stdout).event)
        rec.source.fetch()
        return rec


@pytest.fixture(scope="module")
def move(world: K8sWorld, flink_operator_crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Move]:
    w = world
    w.app, w.out = APP, OUT
    root = tmp_path_factory.mktemp("move-repo")
    repo = Repo(root)
    repo.write(f"apps/{APP}.yaml", json.dumps(our_spec(w.ns).canonical(), indent=1))  # JSON is YAML
    rev = repo.commit(f"{APP}: moved over from the Flink Kubernetes Operator")
    operator = Operator(w, w.runtime.kube)
    counts = Counts(w)
    m = Move(w, operator, counts, repo, rev, root)
    try:
        yield m
    finally:
        operator.stop()
        counts.stop()
        for j in m.journals:
            j.close()


def _jobs(w: K8sWorld) -> list[Obj]:
    return list(w.rest("/jobs/overview")["jobs"])


def test_the_operators_job_runs_and_counts(move: Move) -> None:
    w, operator = move.w, move.operator
    operator.deploy()
    wait_until(lambda: w.job_state(OPERATOR_JOB) == "RUNNING", timeout=60, interval=0.3,
               what="the operator's job RUNNING")
    operator.write_status({"lifecycleState": "STABLE", "reconciliationStatus": {"state": "DEPLOYED"},
                           "jobManagerDeploymentStatus": "READY",
                           "jobStatus": {"jobId": OPERATOR_JOB, "state": "RUNNING"}})
    operator.start()
    move.counts.start()
    wait_until(lambda: (w.rest(f"/jobs/{OPERATOR_JOB}/checkpoints")["counts"]["completed"] or None), timeout=30,
               interval=0.3, what="a checkpoint of the operator's job")
    w.growing_from({}, "the counts of the operator's job")


def test_a_takeover_killed_at_three_step_boundaries_continues_the_counts_from_the_operators_savepoint(
        move: Move) -> None:
    w, operator, rev = move.w, move.operator, move.rev
    first = move.reconciler(crash_before=(0, "done"))
    ap = first.plan(rev).app(APP)
    assert ap.action is Action.TAKEOVER, ap.reason
    assert [s.type for s in ap.steps] == ["SuspendOperatorDeployment", "DeleteOperatorDeployment", "EnsureCluster",
                                          "StartJob", "AwaitRunning", "AwaitHealthy"]
    t0 = time.monotonic()

    # 1. Killed once the operator's savepoint is read and recorded: its job stopped, the FlinkDeployment is still
    # there (SUSPENDED), no job runs anywhere.
    with pytest.raises(Crash) as crash:
        first.apply(rev)
    print(f"# reconciler process killed ({crash.value}); a new one resumes the takeover")
    assert operator.savepoint is not None and operator.stops == 1
    record = first.journal.record(APP)
    assert record is not None and [s.path for s in record.savepoints] == [operator.savepoint]
    fd = operator.deployment()
    assert fd is not None and fd["status"]["lifecycleState"] == "SUSPENDED"
    assert w.job_state(OPERATOR_JOB) in ("FINISHED", None)

    # 2. Killed after the FlinkDeployment and every object of it is gone, before that was recorded.
    second = move.reconciler(crash_before=(1, "done"))
    with pytest.raises(Crash) as crash:
        second.apply(rev)
    print(f"# reconciler process killed ({crash.value}); a new one resumes the takeover")
    assert operator.objects() == []
    inflight = second.journal.inflight(APP)
    assert inflight is not None and inflight.step_index == 1 and inflight.captured_path == operator.savepoint

    # 3. Killed after our JobManager was created with the job from that savepoint (the submit).
    third = move.reconciler(crash_before=(3, "done"))
    with pytest.raises(Crash) as crash:
        third.apply(rev)
    print(f"# reconciler process killed ({crash.value}); a new one resumes the takeover")
    inflight = third.journal.inflight(APP)
    assert inflight is not None and inflight.submitted_job_id is not None
    ours = inflight.submitted_job_id
    args = w.jobmanager_args()
    assert args[args.index("--job-id") + 1] == ours and args[args.index("--fromSavepoint") + 1] == operator.savepoint

    # 4. The next process finishes it.
    last = move.reconciler()
    done = last.apply(rev)
    took = time.monotonic() - t0
    results = {**done.resumed, **done.results}
    assert results[APP].outcome is Outcome.SUCCESS, results[APP].message
    print(f"{APP}: takeover -> {results[APP].outcome.value}: {results[APP].message} ({took:.1f}s with three kills)")

    # Exactly one job runs, ours, restored from the savepoint the operator's job stopped with (asked for once).
    live = [j for j in _jobs(w) if j["state"] not in ("CANCELED", "FAILED", "FINISHED")]
    assert [j["jid"] for j in live] == [ours] and live[0]["state"] == "RUNNING", live
    restored = wait_until(lambda: w.restored(ours), timeout=30, what="Flink's restore record")
    assert restored["external_path"] == operator.savepoint and restored["is_savepoint"] is True, restored
    assert operator.stops == 1
    # The counts went on from where the operator's job stopped: never below, and past it on every key.
    stopped = operator.counts_at_stop
    assert len(stopped) == KEYS, stopped
    after = w.growing_from(stopped, "counts continuing after the takeover")
    assert all(after[k] > stopped[k] for k in stopped)
    print(f"# the operator's job stopped at counts {dict(sorted(stopped.items()))} with savepoint {operator.savepoint}")
    print(f"# job {ours}: restored from {restored['external_path']}, counts now {dict(sorted(after.items()))}")
    move.counts.stop()
    lowest = move.counts.lowest_since(operator.stopped_at)
    # Sampled every 0.1 s throughout (a quick takeover is ~10 s of samples), never below where the operator stopped.
    assert len(move.counts.samples) > 20 and all(lowest[k] >= stopped[k] for k in stopped), (lowest, stopped)

    # Nothing of the operator's is left; every pod of the app is ours; on record, with its savepoint, applied.
    assert operator.objects() == [] and operator.errors == []
    pods = w.runtime.kube.list("Pod", w.ns, "")
    assert pods and all(p["metadata"]["labels"].get(r.LABEL_MANAGED_BY) == r.MANAGED_BY for p in pods), \
        [p["metadata"]["name"] for p in pods]
    with w.node._lock:  # and so is every JVM the node runs (a process node's PodRun, a real node's pod)
        runs = [run if isinstance(run, dict) else run.pod for run in w.node.pods.values()]
    assert runs and all(pod["metadata"]["labels"].get(r.LABEL_MANAGED_BY) == r.MANAGED_BY for pod in runs)
    record = last.journal.record(APP)
    assert record is not None and record.last_applied_revision == rev and record.job_id == ours
    assert [s.path for s in record.savepoints] == [operator.savepoint]
    assert last.journal.inflight(APP) is None
    assert last.plan(rev).app(APP).action is Action.NOOP
    assert [t.action for t in last.journal.history(APP)] == ["takeover", "savepoint", "finish"]
