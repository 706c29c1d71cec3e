"""FlinkSessionClusters on the Kubernetes runtime, end to end with real Flink on the process node: two apps' jobs on
one shared session cluster, specs loaded from YAML as the daemon loads them, planned with the session planner,
run by the real Executor and journal through `SessionRuntime(KubernetesRuntime)` against the stand-in API server.

One session cluster and two apps for the module (tests run in order, each the next revision):
- create: one JobManager and one TaskManager Deployment for the cluster (its own generation), both jobs submitted
  over REST from the jar the JobManager's init container staged from the image, both counting;
- a job-only upgrade of one app: its counts continue from its savepoint; the other's job id and counts go on;
- a TaskManager memory change of the cluster: both jobs move to a new cluster (a second generation, started
  once beside the old one), each restored from its own savepoint, counts continuing; the old cluster is gone;
- removing one app (prune): its final savepoint, its job gone; the other untouched, the cluster kept;
- removing the other app and the cluster: jobs first (final savepoint), then every object of the cluster.
The apps run without HA through the e2e module's `NoHaRuleRuntime` (see test_flink_on_k8s_e2e).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.apply.executor import AppResult, Executor
from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action, ClusterStrategy, Plan, is_job_of
from reconciler.core.planner import Desired, PlanInput, Policy
from reconciler.core.session_planner import plan_with_sessions
from reconciler.live.kubernetes import render as r
from reconciler.live.observe import observe
from reconciler.live.session import SessionRuntime
from reconciler.service import sessions
from reconciler.spec.load import LoadResult, load_files
from reconciler.spec.model import FlinkApp
from tests.fixtures.flink import COUNTER_MAIN, read_counts, wait_until
from tests.kubernetes.conftest import KUBECONFIG
from tests.kubernetes.standin import Standin
from tests.kubernetes.test_flink_on_k8s_e2e import CLAIM, IMAGE, K8sWorld, k8s_world

pytestmark = [pytest.mark.kubernetes, pytest.mark.flink, pytest.mark.slow]

CLUSTER, A, B = "shared", "sa", "sb"
KEYS = 2


def cluster_yaml(ns: str, tm_memory: str = "1280m") -> str:
    return f"""apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkSessionCluster
metadata:
  name: {CLUSTER}
  namespace: {ns}
spec:
  image: {IMAGE}
  taskManager:
    replicas: 1
    slots: 2
    resources:
      memory: {tm_memory}
  flinkConfiguration:
    execution.checkpointing.interval: 1 s
    execution.checkpointing.dir: file:///flink-data/checkpoints
    execution.checkpointing.savepoint-dir: file:///flink-data/savepoints
    cluster.registration.error-delay: 500 ms
    heartbeat.interval: 2 s
    heartbeat.timeout: 10 s
  podTemplate:
    spec:
      volumes:
      - name: flink-data
        persistentVolumeClaim:
          claimName: {CLAIM}
      containers:
      - name: {r.MAIN_CONTAINER}
        volumeMounts:
        - name: flink-data
          mountPath: /flink-data
"""


JARS = {A: "local:///opt/flink/usrlib/counter.jar",  # staged from the image by the JobManager's init container
        B: "jobs/counter.jar"}  # a repository jar: uploaded by the reconciler over REST


def app_yaml(ns: str, name: str, rate: int) -> str:
    return f"""apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
  namespace: {ns}
spec:
  sessionCluster: {CLUSTER}
  job:
    jarURI: {JARS[name]}
    entryClass: {COUNTER_MAIN}
    args: ["--output-dir", "/flink-data/out-{name}", "--keys", "{KEYS}", "--rate", "{rate}"]
    parallelism: 1
  deadlines: {{start: 30s, savepoint: 60s, healthy: 60s, delete: 60s}}
"""


@dataclass
class SessionWorld:
    w: K8sWorld
    runtime: SessionRuntime
    jar: Path  # what the repository's jobs/counter.jar resolves to
    revision: int = 0
    files: dict[str, str] = field(default_factory=dict)

    def load(self) -> LoadResult:
        loaded = load_files({f: t.encode() for f, t in self.files.items()})
        assert not loaded.errors, loaded.errors
        return loaded

    def plan(self, rev: str, *, prune: bool = False, everything: bool = False) -> Plan:
        self.w.journal.refresh()
        records = self.w.journal.records()
        previous = {n: FlinkApp.model_validate(rec.last_applied_spec) for n, rec in records.apps.items()
                    if rec.last_applied_spec}
        loaded = self.load()
        sessions.prepare(self.runtime, loaded, previous)
        desired = {n: la.app for n, la in loaded.apps.items()}
        sources = {n: la.file for n, la in loaded.apps.items()}
        live = observe(self.runtime, set(desired) | set(previous))
        inp = PlanInput(revision=rev, desired=Desired(apps=desired, sources=sources), previous=previous,
                        previous_sources={}, live=live, records=records, now=SystemClock().now(),
                        policy=Policy(prune=prune, warm_standby=True, allow_mass_delete=everything))
        return plan_with_sessions(inp, sessions.observe(self.runtime, loaded))

    def apply(self, *, prune: bool = False, everything: bool = False
              ) -> tuple[Plan, dict[str, AppResult], dict[str, str]]:
        self.revision += 1
        rev = f"{self.revision:040x}"
        p = self.plan(rev, prune=prune, everything=everything)
        results = Executor(self.runtime, self.w.journal, SystemClock(), poll_interval=0.5,
                           resolve_jar=lambda a: None if a.spec.job.jar_uri.startswith("local://") else self.jar,
                           ).run(p)
        for name, res in results.items():
            print(f"{name} {rev[-4:]}: {res.outcome.value} {res.step_timings} {res.message or ''}")
            if p.app(name).action is Action.DELETE and res.outcome is Outcome.SUCCESS:
                self.w.journal.mark_deleted(name)  # as the Reconciler does after a pass
        done = sessions.run_clusters(self.runtime, p, {n: res.outcome for n, res in results.items()},
                                     deadline=SystemClock().monotonic() + 60)
        return p, results, done

    def jobs(self) -> dict[str, tuple[str, str]]:
        """app -> (job id, state) of its live job on the session cluster (job ids end in their app's tag)."""
        out = {}
        for g in self.runtime.host.session_generations(CLUSTER):
            for j in g.client.jobs():
                if j.state not in ("FINISHED", "CANCELED", "FAILED"):
                    out[next((a for a in (A, B) if is_job_of(j.job_id, a)), j.job_id)] = (j.job_id, j.state)
        return out

    def counts(self, app: str) -> dict[str, int]:
        return read_counts(self.w.node.pvc_dir(self.w.ns, CLAIM) / f"out-{app}")

    def growing(self, app: str, before: dict[str, int], what: str) -> dict[str, int]:
        def grown() -> dict[str, int] | None:
            c = self.counts(app)
            return c if len(c) == KEYS and all(c[k] > before.get(k, 0) + 10 for k in c) else None
        return wait_until(grown, timeout=60, interval=0.3, what=what)

    def objects(self) -> set[str]:
        return {f"{kind}/{o['metadata']['name']}" for kind in ("ConfigMap", "Deployment", "Service", "Pod")
                for o in self.w.runtime.kube.list(kind, self.w.ns, r.app_selector(CLUSTER))
                if not o["metadata"].get("deletionTimestamp")}


@pytest.fixture(scope="module")
def world(_standin: Standin | None, flink_home: Path, counter_jar: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionWorld]:
    if KUBECONFIG:
        pytest.skip("needs the stand-in: the process node's pods are reached through its service proxy")
    with k8s_world(_standin, flink_home, counter_jar, tmp_path_factory.mktemp("k8s-session"), ns_prefix="fr-ss",
                   poll_interval=0.3) as w:
        sw = SessionWorld(w, SessionRuntime(w.runtime), counter_jar)
        sw.files = {"shared.yaml": cluster_yaml(w.ns), "sa.yaml": app_yaml(w.ns, A, 40),
                    "sb.yaml": app_yaml(w.ns, B, 40)}
        yield sw


def test_two_apps_start_on_one_session_cluster(world: SessionWorld) -> None:
    sw = world
    p, results, _ = sw.apply()
    assert [(a.app, a.action) for a in p.apps] == [(A, Action.CREATE), (B, Action.CREATE)], p.apps
    assert [(c.cluster, c.action) for c in p.clusters] == [(CLUSTER, Action.CREATE)], p.clusters
    assert all(res.outcome is Outcome.SUCCESS for res in results.values()), results
    jobs = sw.jobs()
    assert set(jobs) == {A, B} and all(state == "RUNNING" for _, state in jobs.values()), jobs
    # One cluster of its own generation: one JobManager and one TaskManager Deployment for both jobs.
    deployments = {o for o in sw.objects() if o.startswith("Deployment/")}
    gen = sw.runtime.host.session_generations(CLUSTER)[0].generation
    assert deployments == {f"Deployment/{CLUSTER}-g{gen}-jm", f"Deployment/{CLUSTER}-g{gen}-tm"}, deployments
    assert sw.runtime.host.list_clusters()[CLUSTER].session
    assert set(sw.runtime.list_clusters()) == {A, B}  # the apps see it as theirs, never as an orphan app
    for app in (A, B):
        sw.growing(app, {}, f"{app} counting")
    # B's jar was uploaded once, under its content's name; A's came from the image.
    listed = sorted(sw.runtime.host.session_generations(CLUSTER)[0].client.jars().values())
    assert listed == sorted([f"{hashlib.sha256(sw.jar.read_bytes()).hexdigest()[:32]}.jar", "counter.jar"]), listed


def test_a_job_only_upgrade_leaves_the_other_job_alone(world: SessionWorld) -> None:
    sw = world
    before = sw.jobs()
    counts_a, counts_b = sw.counts(A), sw.counts(B)
    pods = {o for o in sw.objects() if o.startswith("Pod/")}
    sw.files["sa.yaml"] = app_yaml(sw.w.ns, A, 60)
    p, results, _ = sw.apply()
    assert p.app(A).action is Action.UPGRADE and p.app(B).action is Action.NOOP, p.apps
    assert results[A].outcome is Outcome.SUCCESS, results[A].message
    assert results[A].savepoint is not None
    after = sw.jobs()
    assert after[B] == before[B]  # the same job, still running
    assert after[A][0] != before[A][0] and after[A][1] == "RUNNING"
    assert {o for o in sw.objects() if o.startswith("Pod/")} == pods  # no pod of the cluster restarted
    restored = sw.runtime.flink(A).checkpoints(after[A][0]).restored_path
    assert restored == results[A].savepoint
    grown_a = sw.growing(A, counts_a, "the upgraded job counting on from its savepoint")
    grown_b = sw.growing(B, counts_b, "the other job counting on")
    assert all(grown_a[k] > counts_a[k] for k in counts_a) and all(grown_b[k] > counts_b[k] for k in counts_b)


def test_a_cluster_change_moves_both_jobs_to_a_new_cluster(world: SessionWorld) -> None:
    sw = world
    old = sw.runtime.host.session_generations(CLUSTER)[0].generation
    before = sw.jobs()
    counts = {app: sw.counts(app) for app in (A, B)}
    sw.files["shared.yaml"] = cluster_yaml(sw.w.ns, "1344m")
    p, results, _ = sw.apply()
    assert [(a.app, a.action, a.cluster_strategy) for a in p.apps] == [
        (A, Action.UPGRADE, ClusterStrategy.WARM_STANDBY), (B, Action.UPGRADE, ClusterStrategy.WARM_STANDBY)], p.apps
    assert [(c.cluster, c.action) for c in p.clusters] == [(CLUSTER, Action.UPGRADE)], p.clusters
    assert all(res.outcome is Outcome.SUCCESS for res in results.values()), results
    [live] = sw.runtime.host.session_generations(CLUSTER)  # the old cluster is gone: objects and pods
    assert live.generation != old and live.slot == "cluster"
    assert {o for o in sw.objects() if o.startswith("Deployment/")} == {
        f"Deployment/{CLUSTER}-g{live.generation}-jm", f"Deployment/{CLUSTER}-g{live.generation}-tm"}
    assert not any(f"-g{old}-" in o for o in sw.objects()), sw.objects()
    after = sw.jobs()
    for app in (A, B):
        assert after[app][0] != before[app][0] and after[app][1] == "RUNNING"
        assert sw.runtime.flink(app).checkpoints(after[app][0]).restored_path == results[app].savepoint
        grown = sw.growing(app, counts[app], f"{app} counting on on the new cluster")
        assert all(grown[k] > counts[app][k] for k in counts[app])


def test_removing_an_app_takes_its_final_savepoint_and_keeps_the_cluster(world: SessionWorld) -> None:
    sw = world
    before = sw.jobs()
    counts_b = sw.counts(B)
    del sw.files["sa.yaml"]
    p, results, done = sw.apply(prune=True)
    assert p.app(A).action is Action.DELETE and p.app(B).action is Action.NOOP, p.apps
    assert results[A].outcome is Outcome.SUCCESS and results[A].savepoint is not None, results[A].message
    assert done == {}
    assert sw.jobs() == {B: before[B]}
    sw.growing(B, counts_b, "the other job untouched")
    assert any(o.endswith("-jm") for o in sw.objects())


def test_removing_the_last_app_and_the_cluster_deletes_jobs_first_then_the_cluster(world: SessionWorld) -> None:
    sw = world
    del sw.files["sb.yaml"], sw.files["shared.yaml"]
    p, results, done = sw.apply(prune=True, everything=True)  # no spec left: `--allow-mass-delete`
    assert p.app(B).action is Action.DELETE, p.apps
    assert [(c.cluster, c.action) for c in p.clusters] == [(CLUSTER, Action.DELETE)], p.clusters
    assert results[B].outcome is Outcome.SUCCESS and results[B].savepoint is not None, results[B].message
    assert done == {CLUSTER: "deleted"}
    assert sw.objects() == set()
