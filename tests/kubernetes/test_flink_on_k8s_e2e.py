"""Issue 9, end to end on the Kubernetes runtime with real Flink: the real planner, Executor, journal and
KubernetesRuntime against the stand-in API server, with the process node (process_node.py) running every
pod as local processes: the rendered config.yaml, arguments, probes, Services and volumes start a real
Flink cluster in application mode that runs the counter job.

One app is shared by the module (module-scoped fixture, tests run in order), each test commits the next
revision on top of the last and checks the job's own output (per-key counts on a PVC) and Flink's restore
record (`GET /jobs/<id>/checkpoints` -> `latest.restored`), reached through the API server's service proxy:

- create: TaskManagers as a StatefulSet with a PVC per pod (seed 003), the job runs and checkpoints;
- savepoint upgrade: the counts continue from the savepoint just taken;
- the reconciler killed with SIGKILL mid-upgrade (after the stop-with-savepoint): a new executor resumes
  from the journal and the new job restores that savepoint;
- a failed savepoint leaves the old job running and Kubernetes untouched;
- a bad entry class is rolled back from the fresh savepoint;
- "JobManager restarted, Job not found" (seed): the JobManager container killed, then its pod deleted;
- deletion with a final savepoint, every pod and process gone well before the deadline;
- with Kubernetes HA: create as the release before job generations rendered it, then two savepoint
  upgrades with the product's runtime (no bypass): each new job generation has its own HA identity, so
  Flink never recovers the old job's leftovers; and the JobManager pod deleted: the job goes on from its
  latest checkpoint, never from the stale savepoint of its arguments.

**Kubernetes HA.** The stand-in serves watches, so Flink's Kubernetes HA services (fabric8 ConfigMap
informers, leader election, job graphs and checkpoint pointers in ConfigMaps) run against it. Doing so
found three bugs, fixed: the rendered `--host $(POD_IP)` is no option of the application entry point (its
parser stopped there, so --job-id, --job-classname and --fromSavepoint were ignored); Flink 2.3 labels
its HA ConfigMaps without `configmap-type` (the runtime never found them to delete); and an HA upgrade
failed at times with Flink's `Base job ID <new id> is not found in the recovered jobs`: the new JobManager
recovered the old job's dirty entry of the job result store under the shared HA identity (now one per job
generation). The scenarios before
the HA ones run the app without HA through `NoHaRuleRuntime`, a test-only runtime that skips exactly the
HA-required rule (durable storage is still checked), to show what that rule prevents: without HA a
restarted JobManager runs the job again from the stale `--fromSavepoint` of its arguments, and the counts
rewind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s_client

from reconciler.apply.executor import AppResult, Executor
from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.observed import ClusterPhase, Outcome
from reconciler.core.plan import Action, AppPlan, StartJob
from reconciler.core.planner import Desired, PlanInput, Policy, plan
from reconciler.errors import RenderError
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.kubernetes.status import HA_CONFIGMAP_SELECTOR, ha_configmap_cluster_id
from reconciler.live.kubernetes.storage import kubernetes_spec_problems
from reconciler.live.observe import observe
from reconciler.live.ports import ClusterInfo
from reconciler.spec.model import FlinkApp
from tests.fixtures.flink import COUNTER_MAIN, read_counts, wait_until
from tests.kubernetes.conftest import KUBECONFIG
from tests.kubernetes.process_node import Image, ProcessNode, needs_root_reason
from tests.kubernetes.standin import Standin

pytestmark = [pytest.mark.kubernetes, pytest.mark.flink, pytest.mark.slow]

APP = "kcounter"
IMAGE = "registry.example.com/kcounter:e2e"  # the node maps it to the counter jar in /opt/flink/usrlib
CLAIM = f"{APP}-data"
KEYS = 4
Obj = dict[str, Any]
# The tests' own polls of Flink's REST API share one client: no keep-alive (a new connection per request, as
# `httpx.get` makes), but not a new SSL context per request (`httpx.get` builds one: tens of ms of CPU each).
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


class NoHaRuleRuntime(KubernetesRuntime):
    """The kubernetes runtime minus the HA-required rule, to show what happens without HA (see the module
    docstring). Every other render check still applies."""

    def render(self, app: FlinkApp, *, job_id: str | None = None, restore_path: str | None = None,
               allow_non_restored_state: bool = False, root_uid: str | None = None,
               taskmanagers_for: str | r.Generation | None = r.Generation.OF_THE_JOB,
               generation: str = "") -> list[Obj]:
        problems = [p for p in kubernetes_spec_problems(app) if p.field != "spec.highAvailability.enabled"]
        if problems:
            raise RenderError(problems[0].message, app=app.name, field=problems[0].field)
        revision = app.metadata.annotations.get(r.ANNOTATION_REVISION, self.revision)
        return r._render(app, revision=revision, job_id=job_id, restore_path=restore_path,
                         allow_non_restored_state=allow_non_restored_state, root_uid=root_uid,
                         taskmanagers_for=taskmanagers_for, generation=generation)


class PreGenerationRuntime(KubernetesRuntime):
    """The product's runtime rendering as the release before job generations did: no HA identity arguments
    (every job of the app is `kubernetes.cluster-id: <app>` of config.yaml, `high-availability.cluster-id`
    Flink's `/default`), no job annotation, no termination message policy, no StatefulSet updateStrategy.
    It creates the HA app whose upgrade by the current runtime must work (clusters deployed before)."""

    def render(self, app: FlinkApp, *, job_id: str | None = None, restore_path: str | None = None,
               allow_non_restored_state: bool = False, root_uid: str | None = None,
               taskmanagers_for: str | r.Generation | None = r.Generation.OF_THE_JOB,
               generation: str = "") -> list[Obj]:
        objs = super().render(app, job_id=job_id, restore_path=restore_path,
                              allow_non_restored_state=allow_non_restored_state, root_uid=root_uid,
                              taskmanagers_for=taskmanagers_for, generation=generation)
        for o in objs:
            if o["kind"] not in ("Deployment", "StatefulSet"):
                continue
            o["spec"].pop("updateStrategy", None)
            tmpl = o["spec"]["template"]
            tmpl["metadata"]["annotations"].pop(r.ANNOTATION_JOB_ID, None)
            c = tmpl["spec"]["containers"][0]
            c.pop("terminationMessagePolicy", None)
            args, kept = c["args"], []
            i = 0
            while i < len(args):
                if args[i] == "-D" and args[i + 1:i + 2] and args[i + 1].startswith(
                        ("kubernetes.cluster-id=", "high-availability.cluster-id=")):
                    i += 2
                    continue
                kept.append(args[i])
                i += 1
            c["args"] = kept
        return objs


def app_spec(ns: str, *, rate: int = 100, entry_class: str = COUNTER_MAIN, name: str = APP,
             out: str = "out") -> FlinkApp:
    """The app as a user would write it for Kubernetes, minus highAvailability (see above)."""
    return FlinkApp.model_validate({
        "apiVersion": "flink-reconciler.io/v1alpha1", "kind": "FlinkApp",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "image": IMAGE,
            "job": {"jarURI": "local:///opt/flink/usrlib/counter.jar", "entryClass": entry_class,
                    "args": ["--output-dir", f"/flink-data/{out}", "--keys", str(KEYS), "--rate", str(rate)],
                    "parallelism": 2},
            "taskManager": {"replicas": 1, "slots": 2, "volumeClaimTemplates": [
                {"name": "local-state", "mountPath": "/flink-local", "storage": "1Gi"}]},
            "flinkConfiguration": {
                "execution.checkpointing.interval": "1 s",
                "execution.checkpointing.dir": "file:///flink-data/checkpoints",
                "execution.checkpointing.savepoint-dir": "file:///flink-data/savepoints",
                "process.taskmanager.working-dir": "/flink-local",
                "cluster.registration.error-delay": "500 ms",
                "web.refresh-interval": "1 s",
                # Without HA a kept TaskManager learns that its JobManager was replaced only when the heartbeat
                # times out (default 50 s): the JobManager pod scenarios below would wait for it (an upgrade
                # rolls the TaskManagers with the job instead, see docs/kubernetes.md).
                "heartbeat.interval": "2 s",
                "heartbeat.timeout": "10 s",
            },
            "podTemplate": {"spec": {
                "volumes": [{"name": "flink-data", "persistentVolumeClaim": {"claimName": CLAIM}}],
                "containers": [{"name": r.MAIN_CONTAINER,
                                "volumeMounts": [{"name": "flink-data", "mountPath": "/flink-data"}]}]}},
            "deadlines": {"start": "30s", "savepoint": "60s", "healthy": "60s", "delete": "90s"},
        },
    })


@dataclass
class K8sWorld:
    api: k8s_client.ApiClient
    ns: str
    node: ProcessNode
    runtime: KubernetesRuntime  # NoHaRuleRuntime until the HA tests
    journal: Journal
    state: Path
    revision: int = 0
    app: str = APP  # the app the helpers look at
    out: str = "out"

    def executor(self) -> Executor:
        return Executor(self.runtime, self.journal, SystemClock(), resolve_jar=lambda a: None, poll_interval=0.5)

    def run(self, revision: str, ap: AppPlan) -> AppResult:
        res = self.executor().run_app(revision, ap)
        print(f"{ap.action.value} {revision[-4:]}: {res.outcome.value} {res.step_timings}"
              + (f" {res.message}" if res.outcome is not Outcome.SUCCESS else ""))
        return res

    def next_revision(self) -> str:
        self.revision += 1
        return f"{self.revision:040x}"

    def plan(self, revision: str, desired: dict[str, FlinkApp], policy: Policy | None = None) -> AppPlan:
        self.journal.refresh()
        records = self.journal.records()
        previous = {n: FlinkApp.model_validate(rec.last_applied_spec) for n, rec in records.apps.items()
                    if rec.last_applied_spec}
        names = set(desired) | set(previous)
        p = plan(PlanInput(revision=revision, desired=Desired(apps=desired), previous=previous,
                           previous_sources={}, live=observe(self.runtime, names), records=records,
                           now=SystemClock().now(), policy=policy or Policy()), only=[self.app])
        return p.apps[0]

    def rest(self, path: str) -> Any:
        url = f"{self.runtime.kube.host}/api/v1/namespaces/{self.ns}/services/{self.app}-rest:{r.REST_PORT}/proxy{path}"
        resp = HTTP.get(url, timeout=10)
        resp.raise_for_status()
        return resp.json()

    def job_state(self, job_id: str) -> str | None:
        try:
            for j in self.rest("/jobs/overview")["jobs"]:
                if j["jid"] == job_id:
                    return str(j["state"]) if j["tasks"]["running"] == j["tasks"]["total"] or \
                        j["state"] != "RUNNING" else "STARTING"
        except httpx.HTTPError:
            return None
        return None

    def restored(self, job_id: str) -> Obj | None:
        try:
            latest = self.rest(f"/jobs/{job_id}/checkpoints").get("latest") or {}
        except httpx.HTTPError:
            return None
        out: Obj | None = latest.get("restored")
        return out

    def counts(self) -> dict[str, int]:
        return read_counts(self.node.pvc_dir(self.ns, CLAIM) / self.out)

    def growing_from(self, before: dict[str, int], what: str) -> dict[str, int]:
        """Counts that went past `before` on every key (the job runs and kept its state)."""
        def grown() -> dict[str, int] | None:
            c = self.counts()
            return c if len(c) == KEYS and all(c[k] > before.get(k, 0) + 20 for k in c) else None
        return wait_until(grown, timeout=90, interval=0.3, what=what)

    def jobmanager_pods(self) -> list[Obj]:
        return [p for p in self.runtime.kube.list("Pod", self.ns, f"{r.app_selector(self.app)},{r.LABEL_COMPONENT}="
                                                                  "jobmanager")
                if not p["metadata"].get("deletionTimestamp")]

    def jobmanager_pod(self) -> Obj:
        pods = self.jobmanager_pods()
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]

    def ha_configmaps(self) -> set[str]:
        """Flink's HA ConfigMaps of the app, of every job generation."""
        return {c["metadata"]["name"] for c in self.runtime.kube.list("ConfigMap", self.ns, HA_CONFIGMAP_SELECTOR)
                if ha_configmap_cluster_id(self.app, c) is not None}

    def jobmanager_args(self) -> list[str]:
        dep = self.runtime.kube.get("Deployment", self.ns, f"{self.app}-jobmanager")
        assert dep is not None
        return list(dep["spec"]["template"]["spec"]["containers"][0]["args"])


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def api_env(url: str, ns: str) -> dict[str, str]:
    """How Flink's fabric8 client in a pod finds the stand-in (a kubelet injects KUBERNETES_SERVICE_HOST)."""
    return {"KUBERNETES_MASTER": url, "KUBERNETES_NAMESPACE": ns, "KUBERNETES_AUTH_TRYKUBECONFIG": "false",
            "KUBERNETES_AUTH_TRYSERVICEACCOUNT": "false"}


@contextlib.contextmanager
def k8s_world(standin: Standin | None, flink_home: Path, counter_jar: Path, tmp: Path, *, ns_prefix: str,
              poll_interval: float) -> Iterator[K8sWorld]:
    """The stand-in API server, a process node running real Flink for its pods, the data claim, and the
    runtime with the HA rule off (the no-HA tests need it): one per module."""
    if standin is None or KUBECONFIG:
        pytest.skip("needs the stand-in: on a real API server the pods would need its service proxy to reach "
                    "127.0.0.x (refused)")
    if (why := needs_root_reason()) is not None:
        pytest.skip(why)
    usrlib = tmp / "image-usrlib"
    usrlib.mkdir()
    shutil.copy(counter_jar, usrlib / "counter.jar")
    cfg = k8s_client.Configuration()
    cfg.host = standin.url
    cfg.api_key["BearerToken"] = "Bearer stand-in-token"
    api = k8s_client.ApiClient(cfg)
    ns = f"{ns_prefix}-{os.getpid()}"
    standin.set_auto_ready(False)
    rt = NoHaRuleRuntime(api, clock=SystemClock(), namespaces=[ns], rest_via="proxy", poll_interval=poll_interval)
    # The data claim (ReadWriteMany in a real cluster): state dirs and the job's output.
    rt.kube.request("POST", f"/api/v1/namespaces/{ns}/persistentvolumeclaims", body={
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "5Gi"}}}})
    node = ProcessNode(k8s_client.ApiClient(cfg), namespaces=[ns], workdir=tmp / "node", flink_home=flink_home,
                       images={IMAGE: Image(flink=True, usrlib=usrlib)}, backoff_base_s=2.0,
                       pod_env=api_env(standin.url, ns))
    with node, Journal(tmp / "state" / "journal.sqlite", SystemClock()) as journal:
        try:
            yield K8sWorld(api, ns, node, rt, journal, tmp / "state")
        finally:
            if node.errors:
                print("process node errors:", *node.errors[-5:], sep="\n")
            for name, text in node.all_logs():
                if "Exception" in text or "ERROR" in text:
                    print(f"--- {name} (tail)\n{text[-1500:]}")
    standin.set_auto_ready(True)


def module_world(name: str, *, ns_prefix: str, poll_interval: float) -> Any:
    """The `world` fixture of a Kubernetes e2e module: one K8sWorld (one app, one namespace) for its tests,
    which run in order. Each module binds its own: `world = module_world(...)`."""
    @pytest.fixture(scope="module")
    def world(_standin: Standin | None, flink_home: Path, counter_jar: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sWorld]:
        with k8s_world(_standin, flink_home, counter_jar, tmp_path_factory.mktemp(name), ns_prefix=ns_prefix,
                       poll_interval=poll_interval) as w:
            yield w
    return world


world = module_world("k8s-e2e", ns_prefix="fr-e2e", poll_interval=0.5)


def test_create_runs_the_job_with_taskmanagers_as_a_statefulset_with_a_pvc(world: K8sWorld) -> None:
    w = world
    rev = w.next_revision()
    ap = w.plan(rev, {APP: app_spec(w.ns)})
    assert ap.action is Action.CREATE, ap.reason
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.job_id is not None
    assert w.job_state(res.job_id) == "RUNNING"
    assert w.restored(res.job_id) is None  # a new app starts empty
    w.growing_from({}, "the counts of the new job")
    # Seed 003: the TaskManagers are a StatefulSet; each pod has its own claim, mounted where Flink works.
    sts = w.runtime.kube.get("StatefulSet", w.ns, f"{APP}-taskmanager")
    assert sts is not None and sts["status"]["readyReplicas"] == 1
    pvc = f"local-state-{APP}-taskmanager-0"
    assert w.node._get("PersistentVolumeClaim", w.ns, pvc) is not None
    assert any(w.node.pvc_dir(w.ns, pvc).iterdir()), "Flink's working dir is on the TaskManager's claim"
    # The JobManager runs the official image's standalone-job with the rendered arguments.
    args = w.jobmanager_args()
    assert args[0] == "standalone-job" and _arg(args, "--job-id") == res.job_id
    assert "--fromSavepoint" not in args


def test_a_savepoint_upgrade_continues_every_count_from_the_savepoint(world: K8sWorld) -> None:
    w = world
    rev = w.next_revision()
    ap = w.plan(rev, {APP: app_spec(w.ns, rate=120)})
    assert ap.action is Action.UPGRADE, ap.reason
    before = w.counts()
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.savepoint is not None and res.savepoint.startswith("file:/flink-data/savepoints/savepoint-")
    assert res.job_id is not None
    restored = wait_until(lambda: w.restored(res.job_id or ""), timeout=30, what="Flink's restore record")
    assert restored["external_path"] == res.savepoint and restored["is_savepoint"] is True
    assert _arg(w.jobmanager_args(), "--fromSavepoint") == res.savepoint
    # The TaskManagers rolled with the job: its tasks did not wait for a kept TaskManager's heartbeat to the
    # replaced JobManager to time out (10 s here, 50 s by Flink's default).
    sts = w.runtime.kube.get("StatefulSet", w.ns, f"{APP}-taskmanager")
    assert sts is not None and sts["spec"]["template"]["metadata"]["annotations"][r.ANNOTATION_JOB_ID] == res.job_id
    assert dict(res.step_timings)["AwaitRunning"] < 8, res.step_timings
    after = w.growing_from(before, "counts continuing after the upgrade")
    assert all(after[k] > before[k] for k in before)  # continued, never restarted from zero


def test_a_reconciler_killed_mid_upgrade_resumes_from_the_journal(world: K8sWorld) -> None:
    """SIGKILL of the process running the upgrade right after its stop-with-savepoint; a new executor
    (a new reconciler process, same journal) finishes it from the savepoint the journal recorded."""
    w = world
    rev = w.next_revision()
    ap = w.plan(rev, {APP: app_spec(w.ns, rate=110)})
    assert ap.action is Action.UPGRADE, ap.reason
    old_job = w.journal.records().apps[APP].job_id
    assert old_job is not None
    before = w.counts()
    plan_file = w.state / "plan.json"
    plan_file.write_text(json.dumps({"revision": rev, "plan": ap.model_dump(mode="json"), "ns": w.ns,
                                     "host": w.runtime.kube.host, "journal": str(w.journal.path)}))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(plan_file)], cwd=Path(__file__).parents[2],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: w.job_state(old_job) in ("FINISHED", None), timeout=60, interval=0.05,
                   what="the old job stopped with a savepoint")
    finally:
        child.send_signal(signal.SIGKILL)
        out = child.communicate(timeout=10)[0].decode(errors="replace")
    assert child.returncode == -signal.SIGKILL, out
    w.journal.refresh()
    inflight = w.journal.inflight(APP)
    assert inflight is not None, "the killed execution left its in-flight record"
    res = w.executor().resume(APP)
    assert res is not None and res.outcome is Outcome.SUCCESS, res and res.message
    assert res.job_id is not None and res.savepoint is not None
    restored = wait_until(lambda: w.restored(res.job_id or ""), timeout=30, what="Flink's restore record")
    assert restored["external_path"] == res.savepoint
    w.growing_from(before, "counts continuing after the resumed upgrade")


CHILD = """
import json, sys
from kubernetes import client as k8s_client
from reconciler.apply.executor import AppResult, Executor
from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.plan import AppPlan
from tests.kubernetes.test_flink_on_k8s_e2e import NoHaRuleRuntime
doc = json.load(open(sys.argv[1]))
cfg = k8s_client.Configuration()
cfg.host = doc["host"]
cfg.api_key["BearerToken"] = "Bearer stand-in-token"
rt = NoHaRuleRuntime(k8s_client.ApiClient(cfg), clock=SystemClock(), namespaces=[doc["ns"]], rest_via="proxy",
                     poll_interval=0.5)
from pathlib import Path
with Journal(Path(doc["journal"]), SystemClock()) as j:
    Executor(rt, j, SystemClock(), resolve_jar=lambda a: None, poll_interval=0.5).run_app(
        doc["revision"], AppPlan.model_validate(doc["plan"]))
"""


def test_a_failed_savepoint_leaves_the_old_job_running(world: K8sWorld) -> None:
    w = world
    savepoints = w.node.pvc_dir(w.ns, CLAIM) / "savepoints"
    aside = savepoints.with_name("savepoints.aside")
    job = w.journal.records().apps[APP].job_id
    assert job is not None
    jm_before = w.runtime.kube.get("Deployment", w.ns, f"{APP}-jobmanager")
    savepoints.rename(aside)
    savepoints.write_text("not a directory: Flink cannot write a savepoint here\n")  # root ignores chmod
    try:
        rev = w.next_revision()
        ap = w.plan(rev, {APP: app_spec(w.ns, rate=130)})
        assert ap.action is Action.UPGRADE
        res = w.run(rev, ap)
    finally:
        savepoints.unlink()
        aside.rename(savepoints)
    assert res.outcome is Outcome.FAILURE and not res.rolled_back, res.message
    assert res.failed_step is not None and "savepoint" in res.failed_step
    assert w.job_state(job) == "RUNNING"
    jm_after = w.runtime.kube.get("Deployment", w.ns, f"{APP}-jobmanager")
    assert jm_before is not None and jm_after is not None
    assert jm_after["metadata"]["generation"] == jm_before["metadata"]["generation"]
    w.growing_from(w.counts(), "the old job still counting")


def test_a_bad_entry_class_is_rolled_back_from_the_fresh_savepoint(world: K8sWorld) -> None:
    w = world
    rev = w.next_revision()
    ap = w.plan(rev, {APP: app_spec(w.ns, rate=130, entry_class="io.flinkreconciler.examples.NoSuchJob")})
    assert ap.action is Action.UPGRADE, ap.reason
    before = w.counts()
    res = w.run(rev, ap)
    assert res.outcome is Outcome.FAILURE and res.rolled_back is True, res.message
    assert res.savepoint is not None and res.job_id is not None
    # The crashing JobManager fails StartJob at once (not at its 30 s deadline), with Kubernetes' account
    # of it: the exit code and, from the log tail of its termination message, Flink's exception.
    new_job = next(s.job_id for s in ap.steps if isinstance(s, StartJob))
    assert f"the JobManager of job {new_job} failed to start" in res.message, res.message
    assert "exited with code 1" in res.message and "io.flinkreconciler.examples.NoSuchJob" in res.message
    assert dict(res.step_timings)["StartJob"] < 25, res.step_timings
    args = w.jobmanager_args()
    assert _arg(args, "--job-classname") == COUNTER_MAIN and _arg(args, "--fromSavepoint") == res.savepoint
    restored = wait_until(lambda: w.restored(res.job_id or ""), timeout=30, what="Flink's restore record")
    assert restored["external_path"] == res.savepoint
    after = w.growing_from(before, "counts continuing after the rollback")
    assert all(after[k] > before[k] for k in before)


def test_a_killed_jobmanager_container_without_ha_reruns_the_job_from_its_stale_savepoint(world: K8sWorld) -> None:
    """The seed's "JobManager restarted": the kubelet restarts the container, Flink reads its arguments
    again. Without HA the job restarts from --fromSavepoint (rewinding its counts) and observe says so."""
    w = world
    job = w.journal.records().apps[APP].job_id
    assert job is not None
    stale = _arg(w.jobmanager_args(), "--fromSavepoint")
    assert stale is not None
    latest = wait_until(lambda: (w.rest(f"/jobs/{job}/checkpoints").get("latest") or {}).get("completed"),
                        timeout=30, what="a checkpoint newer than the savepoint")
    before = w.counts()
    pod = w.jobmanager_pod()
    w.node.kill_container(w.ns, pod["metadata"]["name"], r.MAIN_CONTAINER)
    restored = wait_until(lambda: w.restored(job) if w.job_state(job) == "RUNNING" else None, timeout=120,
                          what="the job running again after the restart")
    # Never the checkpoint it had before the kill: the new process started from --fromSavepoint (a failover
    # of its own may since have restored from a checkpoint of that new run).
    assert restored["external_path"] != latest["external_path"], (restored, latest)
    rewound = wait_until(lambda: (c := w.counts()) and any(c[k] < before[k] for k in before) and c, timeout=60,
                         what="a count below its value before the restart")
    assert rewound
    live = w.jobmanager_pod()
    assert live["metadata"]["name"] == pod["metadata"]["name"]
    assert live["status"]["containerStatuses"][0]["restartCount"] == 1
    assert live["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    message = w.runtime.observe(APP).message or ""
    assert "restarted 1 time(s) without highAvailability" in message and stale in message


def test_a_deleted_jobmanager_pod_without_ha_is_replaced_and_reruns_from_its_stale_savepoint(
        world: K8sWorld) -> None:
    w = world
    job = w.journal.records().apps[APP].job_id
    assert job is not None
    stale = _arg(w.jobmanager_args(), "--fromSavepoint")
    old = w.jobmanager_pod()["metadata"]["name"]
    w.runtime.kube.delete("Pod", w.ns, old)
    # Until the node has stopped the old pod's processes and removed it, its JobManager may still answer through
    # the Service: only the new one's answer counts.
    wait_until(lambda: [p["metadata"]["name"] for p in w.jobmanager_pods()] not in ([], [old])
               and w.runtime.kube.get("Pod", w.ns, old) is None and w.job_state(job) == "RUNNING",
               timeout=120, what="a new JobManager pod running the job")
    restored = wait_until(lambda: w.restored(job), timeout=30, what="Flink's restore record")
    assert restored["external_path"] == stale
    # A replaced pod starts at restartCount 0: observe cannot see this rewind (docs/kubernetes.md says so).
    assert w.jobmanager_pod()["status"]["containerStatuses"][0]["restartCount"] == 0


def test_deletion_takes_a_final_savepoint_and_stops_every_pod(world: K8sWorld) -> None:
    w = world
    job = w.journal.records().apps[APP].job_id
    assert job is not None
    # Without HA the kept TaskManager of the replaced JobManager pod offers its slots to the new JobMaster when
    # their heartbeat times out, but it registers with the new ResourceManager only when that heartbeat times
    # out too, and the job restarts once more then. Settled: the new JobManager counts the TaskManager.
    def settled() -> bool:
        try:
            registered = int(w.rest("/overview").get("taskmanagers", 0)) >= 1
        except httpx.HTTPError:
            return False
        return registered and w.job_state(job) == "RUNNING"
    # Until its tasks run, the job fails over (checkpoints cannot be triggered) and is RUNNING for moments at a
    # time: settled for 5 s in a row.
    since: list[float] = []

    def settled_for_5_s() -> bool:
        if not settled():
            since.clear()
            return False
        since[:] = since or [time.monotonic()]
        return time.monotonic() - since[0] >= 5
    wait_until(settled_for_5_s, timeout=90, interval=0.3,
               what="the TaskManager registered with the new JobManager, the job running, for 5 s")
    w.growing_from(w.counts(), "the job counting")
    assert settled()
    rev = w.next_revision()
    keeper = app_spec(w.ns).model_copy(update={"metadata": app_spec(w.ns).metadata.model_copy(
        update={"name": "keeper"})})  # one app stays: deleting the only app trips the empty-checkout guard
    ap = w.plan(rev, {"keeper": keeper}, policy=Policy(prune=True))
    assert ap.action is Action.DELETE, ap.reason
    assert [s.type for s in ap.steps] == ["StopWithSavepoint", "DeleteCluster"]
    started = time.monotonic()
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert time.monotonic() - started < 60
    assert res.savepoint is not None
    sp_dir = w.node.pvc_dir(w.ns, CLAIM) / res.savepoint.removeprefix("file:/flink-data/")
    assert (sp_dir / "_metadata").is_file()
    assert w.runtime.kube.list("Pod", w.ns, r.app_selector(APP)) == []
    wait_until(lambda: not w.node.pods, timeout=30, what="every pod's processes stopped")


HA_APP = "kcounter-ha"  # a new app: the deleted one's records would (rightly) block its re-creation


def ha_spec(ns: str, *, rate: int = 100) -> FlinkApp:
    """The same job as a user must write it for Kubernetes: with HA (storage on the PVC)."""
    spec = app_spec(ns, rate=rate, name=HA_APP, out="out-ha").model_dump(by_alias=True, mode="json")
    spec["spec"]["highAvailability"] = {"enabled": True, "storageDir": "file:///flink-data/ha"}
    # A JobManager pod deleted before it gives up its leader lease leaves the new one waiting for the lease to expire
    # (15 s by default, then a retry every 5 s): shorter here, as the heartbeat above, for the pod scenarios.
    spec["spec"]["flinkConfiguration"] |= {
        "high-availability.kubernetes.leader-election.lease-duration": "8 s",
        "high-availability.kubernetes.leader-election.renew-deadline": "6 s",
        "high-availability.kubernetes.leader-election.retry-period": "1 s",
    }
    return FlinkApp.model_validate(spec)


def test_with_ha_an_app_deployed_before_job_generations_runs(world: K8sWorld) -> None:
    """HA as the HA-required rule wants it, created the way the release before job generations rendered it
    (one HA identity, the app name, for every job): the next test upgrades it with the current runtime.
    Flink's Kubernetes HA services run against the stand-in (watches, leader election, ConfigMaps)."""
    w = world
    w.runtime = PreGenerationRuntime(w.api, clock=SystemClock(), namespaces=[w.ns], rest_via="proxy",
                                     poll_interval=0.5)
    w.app, w.out = HA_APP, "out-ha"
    rev = w.next_revision()
    ap = w.plan(rev, {HA_APP: ha_spec(w.ns)})
    assert ap.action is Action.CREATE, ap.reason
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.job_id is not None and w.job_state(res.job_id) == "RUNNING"
    assert not [a for a in w.jobmanager_args() if "cluster-id=" in a]
    assert w.ha_configmaps() == {f"{HA_APP}-cluster-config-map", f"{HA_APP}-{res.job_id}-config-map"}
    w.growing_from({}, "counts of the HA app")


def test_with_ha_savepoint_upgrades_continue_the_counts(world: K8sWorld) -> None:
    """Two upgrades with the product's runtime: from the cluster deployed before job generations, then from
    a generation of its own. Each new job has its own HA identity: its JobManager recovers nothing of the
    old job (whose dirty job result store entry made Flink 2.3 refuse the application's job in 2 of 3 runs
    when all jobs shared one identity), the old HA ConfigMaps are gone, and the counts continue."""
    w = world
    w.runtime = KubernetesRuntime(w.api, clock=SystemClock(), namespaces=[w.ns], rest_via="proxy",
                                  poll_interval=0.5)
    jrs = w.node.pvc_dir(w.ns, CLAIM) / "ha" / "job-result-store"
    for rate, old_store in ((120, "default"), (130, None)):
        old_job = w.journal.records().apps[HA_APP].job_id
        assert old_job is not None
        before = w.counts()
        rev = w.next_revision()
        ap = w.plan(rev, {HA_APP: ha_spec(w.ns, rate=rate)})
        assert ap.action is Action.UPGRADE, ap.reason
        up = w.run(rev, ap)
        assert up.outcome is Outcome.SUCCESS, up.message
        assert up.job_id is not None and up.savepoint is not None
        job = up.job_id
        restored = wait_until(lambda: w.restored(job), timeout=30, what="Flink's restore record")  # noqa: B023
        assert restored["external_path"] == up.savepoint and restored["is_savepoint"] is True
        cid = r.ha_cluster_id(HA_APP, job)
        assert f"kubernetes.cluster-id={cid}" in w.jobmanager_args()
        assert w.ha_configmaps() == {f"{cid}-cluster-config-map", f"{cid}-{job}-config-map"}
        # One job result store per generation (the one before generations: Flink's default cluster-id).
        assert (jrs / cid).is_dir() and (jrs / (old_store or r.ha_cluster_id(HA_APP, old_job))).is_dir()
        w.growing_from(before, "counts continuing after the HA upgrade")


def test_with_ha_a_deleted_jobmanager_pod_goes_on_from_the_latest_checkpoint(world: K8sWorld) -> None:
    """The seed's "JobManager restarted, Job not found", with HA: the new JobManager recovers the job from
    its HA data and restores the latest checkpoint, never the stale --fromSavepoint of its arguments."""
    w = world
    job = w.journal.records().apps[HA_APP].job_id
    assert job is not None
    stale = _arg(w.jobmanager_args(), "--fromSavepoint")
    assert stale is not None
    time.sleep(6)  # the savepoint gets old: a restore from it would rewind ~150 per key
    wait_until(lambda: (w.rest(f"/jobs/{job}/checkpoints").get("latest") or {}).get("completed"), timeout=30,
               what="a checkpoint newer than the savepoint")
    before = w.counts()
    old = w.jobmanager_pod()["metadata"]["name"]
    w.runtime.kube.delete("Pod", w.ns, old)
    lowest = dict(before)

    def recovered() -> Obj | None:
        for k, v in w.counts().items():
            lowest[k] = min(lowest.get(k, v), v)
        names = [p["metadata"]["name"] for p in w.jobmanager_pods()]
        # Until the node has stopped the old pod's processes and removed it, its JobManager may still answer
        # through the Service: only the new one's answer counts.
        if names in ([], [old]) or w.runtime.kube.get("Pod", w.ns, old) is not None:
            return None
        return w.restored(job) if w.job_state(job) == "RUNNING" else None
    restored = wait_until(recovered, timeout=120, what="the job recovered by a new JobManager pod")
    assert restored["is_savepoint"] is False and restored["external_path"] != stale
    assert "/chk-" in restored["external_path"]
    after = w.growing_from(before, "counts continuing after the JobManager pod was replaced")
    for k in before:
        lowest[k] = min(lowest[k], after[k])
        assert before[k] - lowest[k] < 80, (k, before[k], lowest[k])  # at most one checkpoint interval back
    def ready() -> ClusterInfo | None:
        i = w.runtime.observe(HA_APP)
        return i if i.phase is ClusterPhase.READY else None
    info = wait_until(ready, timeout=30, what="the app READY again")
    assert info.message is None  # nothing rewound, nothing to warn about
    w.runtime.delete_cluster(HA_APP, deadline=SystemClock().monotonic() + 90)
    assert w.ha_configmaps() == set()
