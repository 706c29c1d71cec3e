"""Issue 11: kill -9 at every step of a warm-standby upgrade on the kubernetes runtime, then a new replica with an
EMPTY state dir takes the Lease and finishes from the record in its ConfigMap (no real Flink: the stand-in API
server, `test_executor_k8s.SimCluster` as the cluster's controllers, `flink_backend.FlinkBackend` as each
JobManager process).

The app's TaskManager memory changes, planned `warm-standby`: StartStandbyCluster, StopWithSavepoint,
PromoteStandby, StartJob, AwaitRunning, AwaitHealthy, DeleteRetiredCluster. The leader dies just before each of
its record writes (CrashingStore), or just after each runtime call that changes the clusters (CrashingRuntime);
and in the two failure paths: the abort (a standby whose TaskManager crash-loops is discarded before the stop)
and the rollback (the promoted standby refuses the submit: the old cluster is live again and runs the previous
job from the stop's savepoint). After the takeover: exactly one job RUNNING in the fake Flink, exactly one
cluster of the app in the stand-in (no other generation's objects, the root's annotations name only the live
generation), the record says the execution finished (an upgrade killed anywhere finishes with success: the
stop's outcome is always in the record, so no crash point turns it into a rollback), and every savepoint the
fake Flink took is in the record.

Real-Flink kills (at "standby ready" and "promoted") are in test_warm_standby_k8s_e2e.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.generations import Pointers
from reconciler.live.kubernetes.lease import LeaseElector
from reconciler.live.kubernetes.records import ConfigMapRecordStore, lease_fence
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.service.reconcile import PassResult, Reconciler
from reconciler.source.git import GitSource
from tests.gitutil import Repo
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.flink_backend import FlinkBackend
from tests.kubernetes.standin import Standin
from tests.kubernetes.test_executor_k8s import APP, CRASH_LOOP, SimClock, SimCluster
from tests.kubernetes.test_records_k8s import Crash, CrashingStore

pytestmark = pytest.mark.kubernetes

Obj = dict[str, Any]

SPEC = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {app}
  namespace: {ns}
spec:
  image: flink:2.3
  taskManager: {{slots: 2, resources: {{cpu: 1, memory: {memory}}}}}
  deadlines: {{start: 2m, savepoint: 1m, healthy: 2m, delete: 2m}}
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

# The fake Flink's pace in simulated seconds: its tasks run 0.25 s after a start and it checkpoints every 0.5 s.
# AwaitRunning and AwaitHealthy poll it (every 0.05 s and 0.2 s of the simulated clock), each poll real requests
# to the stand-in: fewer polls, and the module runs dozens of upgrades.
TASKS_S = 0.25
CHECKPOINT_S = 0.5

BAD_SUBMIT = ("org.apache.flink.runtime.rest.handler.RestHandlerException: Could not execute application.\n"
              "Caused by: java.lang.ClassNotFoundException: com.example.Counter")

# A standby whose TaskManager crash-loops: StartStandbyCluster fails at once and the abort discards it.
TM_CRASH_LOOP = dataclasses.replace(CRASH_LOOP, id="session-tm-crash-loop", change={},
                                    broken=lambda comp, c: comp == "session-taskmanager")


class StandbySim(SimCluster):
    """SimCluster, plus session clusters: a session JobManager that becomes ready is a session process in a
    FlinkBackend of its own generation, behind its `<app>-g<g>-rest` Service; a JobManager Deployment that is
    deleted takes its process (and the Service's endpoints) with it."""

    def __init__(self, c: Cluster, standin: Standin, flink: FlinkBackend, flink_url: str,
                 session: Callable[[str], tuple[FlinkBackend, str]]) -> None:
        super().__init__(c, standin, flink, flink_url)
        self.session = session
        self.sessions: dict[str, FlinkBackend] = {}
        self.run_failure: str | None = None  # what every session JobManager answers to a submit

    def _unproxy(self, service: str) -> None:
        assert self.standin is not None
        self.standin.call(self.standin.api.proxy_backends.pop, (self.c.namespace, service, str(r.REST_PORT)), None)

    def tick(self) -> None:
        deps = set()
        for dep in self.c.kube.list("Deployment", self.c.namespace, r.MANAGED_SELECTOR):  # one list per tick
            meta = dep["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            deps.add(meta["name"])
            if (dep.get("status") or {}).get("observedGeneration") != meta.get("generation"):
                self._rollout(dep)
        if self.flink.up and r.object_names(APP)["jobmanager"] not in deps:
            self.flink.stop_jobmanager()
            self._unproxy(r.object_names(APP)["rest"])
        for gen, backend in self.sessions.items():
            if backend.up and r.object_names(APP, gen)["jobmanager"] not in deps:
                backend.stop_jobmanager()
                self._unproxy(r.object_names(APP, gen)["rest"])

    def _rollout(self, dep: Obj) -> None:
        super()._rollout(dep)
        labels = dep["metadata"]["labels"]
        if labels[r.LABEL_COMPONENT] != "session-jobmanager" or self.rollouts[-1][1] != "ready":
            return
        gen = labels[r.LABEL_GENERATION]
        backend, url = self.session(gen)
        self.sessions[gen] = backend
        backend.start_session()
        backend.run_failure = self.run_failure
        assert self.standin is not None
        self.standin.add_proxy_backend(self.c.namespace, r.object_names(APP, gen)["rest"], str(r.REST_PORT), url)

    def running(self) -> list[tuple[str, str, str | None]]:
        """(generation, job id, restored from) of every RUNNING job in every JobManager process."""
        out = [("", j.jid, j.restored_from) for j in self.flink.jobs.values() if j.state == "RUNNING"]
        for gen, backend in self.sessions.items():
            out += [(gen, j.jid, j.restored_from) for j in backend.jobs.values() if j.state == "RUNNING"]
        return out

    def savepoints_taken(self) -> list[str]:
        return [*self.flink.savepoints_taken, *(p for b in self.sessions.values() for p in b.savepoints_taken)]


class CrashingRuntime(KubernetesRuntime):
    """The process dies just after the `crash_after` call (method, nth) has returned."""

    crash_after: tuple[str, int] | None = None
    calls: dict[str, int]

    def _after(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        if self.crash_after == (method, self.calls[method]):
            raise Crash(f"leader died just after {method} #{self.calls[method]}")

    def start_standby(self, *a: Any, **kw: Any) -> Any:
        out = super().start_standby(*a, **kw)
        self._after("start_standby")
        return out

    def promote_standby(self, *a: Any, **kw: Any) -> None:
        super().promote_standby(*a, **kw)
        self._after("promote_standby")

    def start_job(self, *a: Any, **kw: Any) -> str:
        out = super().start_job(*a, **kw)
        self._after("start_job")
        return out

    def discard_standby(self, *a: Any, **kw: Any) -> None:
        super().discard_standby(*a, **kw)
        self._after("discard_standby")

    def delete_retired(self, *a: Any, **kw: Any) -> None:
        super().delete_retired(*a, **kw)
        self._after("delete_retired")


@dataclasses.dataclass
class Replica:
    rec: Reconciler
    elector: LeaseElector
    store: CrashingStore
    runtime: CrashingRuntime


@dataclasses.dataclass
class World:
    cluster: Cluster
    clock: SimClock
    sim: StandbySim
    repo: Repo
    revs: tuple[str, str]
    alive: dict[str, bool]
    tmp: Path

    def replica(self, identity: str) -> Replica:
        ns = self.cluster.namespace
        elector = LeaseElector(self.cluster.api_client, clock=self.clock, namespace=ns, name="fr-records",
                               identity=identity, lease_duration=15, renew_deadline=10, retry_period=2)
        runtime = CrashingRuntime(self.cluster.api_client, clock=self.clock, namespaces=[ns], rest_via="proxy",
                                  poll_interval=self.cluster.poll)
        runtime.calls = {}
        store = CrashingStore(ConfigMapRecordStore(runtime.kube, runtime.namespaces, fence=lease_fence(elector)))
        state = self.tmp / f"state-{identity}"  # each replica's own, empty, state dir
        source = GitSource(str(self.repo.origin), state / "git", branch="main")
        rec = Reconciler(source=source, runtime=runtime, journal=Journal(state / "journal", self.clock, store=store),
                         clock=self.clock, subdir="apps", leader=elector.is_leader, max_parallel=1)
        self.alive[identity] = True

        last = [float("-inf")]

        def renew() -> None:  # the election thread of a live process, every retry_period
            if self.alive[identity] and self.clock.monotonic() - last[0] >= elector.retry_period:
                last[0] = self.clock.monotonic()
                elector.try_acquire_or_renew()

        self.clock.on_sleep.append(renew)
        return Replica(rec, elector, store, runtime)

    def objects(self) -> dict[str, set[str]]:
        """Every cluster generation of the app with objects in the stand-in ("" the first) -> kind/name."""
        out: dict[str, set[str]] = {}
        ns = self.cluster.namespace
        for kind in ("Deployment", "StatefulSet", "Service", "ConfigMap", "Pod"):
            for o in self.cluster.kube.list(kind, ns, r.app_selector(APP)):
                meta = o["metadata"]
                if meta["name"] in (f"{APP}-root", f"{APP}-flink") or meta.get("deletionTimestamp"):
                    continue
                gen = (meta.get("labels") or {}).get(r.LABEL_GENERATION, "")
                out.setdefault(gen, set()).add(f"{kind}/{meta['name']}")
        return out

    def root_annotations(self) -> dict[str, str]:
        root = self.cluster.kube.get("ConfigMap", self.cluster.namespace, f"{APP}-root")
        assert root is not None
        ann = root["metadata"].get("annotations") or {}
        return {k: v for k, v in ann.items() if k in (r.ANNOTATION_LIVE, r.ANNOTATION_STANDBY, r.ANNOTATION_RETIRED)}


@pytest.fixture
def world(cluster: Cluster, standin_only: Standin, tmp_path: Path) -> Iterator[World]:
    standin_only.set_auto_ready(False)  # the sim decides what every rollout does
    clock = SimClock()
    repo = Repo(tmp_path)
    ns = cluster.namespace
    repo.write("apps/counter.yaml", SPEC.format(app=APP, ns=ns, memory="1536m"))
    rev1 = repo.commit("counter")
    repo.write("apps/counter.yaml", SPEC.format(app=APP, ns=ns, memory="2048m"))
    rev2 = repo.commit("counter: TaskManager memory 2048m")
    with ExitStack() as stack:
        def session(gen: str) -> tuple[FlinkBackend, str]:
            backend = FlinkBackend(clock, tasks_after_s=TASKS_S, checkpoint_interval_s=CHECKPOINT_S)
            return backend, stack.enter_context(backend.serve())

        flink = FlinkBackend(clock, tasks_after_s=TASKS_S, checkpoint_interval_s=CHECKPOINT_S)
        url = stack.enter_context(flink.serve())
        sim = StandbySim(cluster, standin_only, flink, url, session)
        clock.on_sleep.append(sim.tick)
        yield World(cluster, clock, sim, repo, (rev1, rev2), {}, tmp_path)


def _running_app(w: World) -> tuple[Replica, str]:
    a = w.replica("pod-a")
    assert a.elector.try_acquire_or_renew()
    a.rec.source.fetch()
    first = a.rec.apply(w.revs[0])
    assert first.results[APP].outcome is Outcome.SUCCESS, first.results[APP].message
    job = first.results[APP].job_id
    assert job is not None
    w.clock.sleep(30)  # it runs and checkpoints
    return a, job


def _crash(w: World, a: Replica, point: tuple[str, Any]) -> None:
    kind, where = point
    if kind == "write":
        a.store.crash_at = a.store.writes + where
    else:
        a.runtime.crash_after = (where, a.runtime.calls.get(where, 0) + 1)
    try:
        done = a.rec.apply(w.revs[1])
    except Crash:
        pass
    else:
        pytest.skip(f"no crash at {point}: {done.results[APP].outcome.value}, {a.store.writes} writes")
    w.alive["pod-a"] = False  # stopped hard: no release, no renewal


def _take_over(w: World) -> tuple[Replica, PassResult, bool]:
    b = w.replica("pod-b")
    assert not b.elector.try_acquire_or_renew()  # pod-a's lease...
    w.clock.advance(16)
    assert b.elector.try_acquire_or_renew()  # ...expired on its own clock: taken over
    b.rec.source.fetch()
    in_flight = b.rec.journal.inflight(APP) is not None  # read from the cluster: b has no state dir of its own
    after = b.rec.apply(w.revs[1])
    assert (APP in after.resumed) == in_flight
    return b, after, in_flight


# Record writes of the warm-standby upgrade (set_source_file, begin, per step started/done, finish ...): every
# boundary up to the last one is a crash point; a point past it is skipped. And just after each runtime call.
UPGRADE_POINTS = [("write", n) for n in range(1, 19)] + [
    ("after", m) for m in ("start_standby", "promote_standby", "start_job", "delete_retired")]


@pytest.mark.parametrize("point", UPGRADE_POINTS, ids=[f"{k}-{v}" for k, v in UPGRADE_POINTS])
def test_a_crash_anywhere_in_a_warm_standby_upgrade_resumes_to_one_job_on_the_standby(
        world: World, point: tuple[str, Any]) -> None:
    w = world
    rev2 = w.revs[1]
    a, old_job = _running_app(w)
    _crash(w, a, point)
    b, after, in_flight = _take_over(w)

    res = after.resumed.get(APP) or after.results[APP]
    assert (res.outcome, res.rolled_back) == (Outcome.SUCCESS, False), (point, res.message)
    if in_flight:  # finished from the record: nothing left to plan
        assert after.plan.app(APP).action is Action.NOOP, after.plan.app(APP).reason
    else:  # the leader died before recording anything of it: the new replica plans it anew
        assert after.plan.app(APP).action is Action.UPGRADE, after.plan.app(APP).reason
        assert after.plan.app(APP).steps[0].type == "StartStandbyCluster"

    record = b.rec.journal.record(APP)
    assert record is not None and record.last_applied_revision == rev2 and b.rec.journal.inflight(APP) is None
    sps = [s.path for s in record.savepoints if s.revision == rev2]
    assert len(sps) == 1, f"a second savepoint was triggered: {sps}"
    # Exactly one job, on the standby's session cluster, restored from the stop's savepoint.
    running = w.sim.running()
    assert len(running) == 1, (point, running)
    gen, job, restored = running[0]
    assert gen and job != old_job and restored == sps[0], (point, running)
    assert w.sim.savepoints_taken() == sps, "a savepoint the fake Flink took is not in the record"
    # Exactly one cluster of the app: the standby's generation; the root names only it.
    assert set(w.objects()) == {gen}, (point, w.objects())
    assert w.root_annotations() == {r.ANNOTATION_LIVE: gen}, point
    assert Pointers.of(w.cluster.kube.get("ConfigMap", w.cluster.namespace, f"{APP}-root")) == Pointers(live=gen)
    assert w.sim.sessions[gen].starts == [(job, sps[0])], f"submitted more than once: {w.sim.sessions[gen].starts}"
    # A resumed step re-applies the standby stamped with its execution's revision: no annotation changed, so no
    # rollout restarted the standby (a new replica used to stamp "unknown": its JobManager and TaskManagers rolled).
    standby_jms = [n for n, _, _ in w.sim.rollouts if n == r.object_names(APP, gen)["jobmanager"]]
    assert len(standby_jms) == 1, "the standby's JobManager was started again"
    for name in ("jobmanager", "taskmanager"):
        dep = w.cluster.kube.get("Deployment", w.cluster.namespace, r.object_names(APP, gen)[name])
        assert dep is not None and dep["metadata"]["annotations"][r.ANNOTATION_REVISION] == rev2


ABORT_POINTS = [("write", n) for n in range(1, 7)] + [("after", "discard_standby")]


@pytest.mark.parametrize("point", ABORT_POINTS, ids=[f"{k}-{v}" for k, v in ABORT_POINTS])
def test_a_crash_while_a_standby_that_cannot_start_is_discarded_leaves_the_old_job_alone(
        world: World, point: tuple[str, Any]) -> None:
    w = world
    rev1, rev2 = w.revs
    a, old_job = _running_app(w)
    w.sim.stuck = TM_CRASH_LOOP
    _crash(w, a, point)
    b, after, in_flight = _take_over(w)

    res = after.resumed.get(APP) or after.results[APP]
    assert res.outcome is Outcome.FAILURE and "old job keeps running" in res.message, (point, res.message)
    assert "failed to start" in res.message, res.message
    if in_flight:  # the failed commit is not retried (a new commit or a nonce retries)
        assert after.plan.app(APP).action is Action.BLOCKED, after.plan.app(APP)
        assert "already failed" in after.plan.app(APP).reason, after.plan.app(APP).reason
    standby_tms = [n for n, _, _ in w.sim.rollouts if n.startswith(f"{APP}-g") and n.endswith("-tm")]
    assert len(standby_tms) == 1, f"the standby was started again: {standby_tms}"
    record = b.rec.journal.record(APP)
    assert record is not None and record.last_applied_revision == rev1 and b.rec.journal.inflight(APP) is None
    assert record.last_attempted_revision == rev2
    # The old job never stopped: the only job, on the first cluster; no savepoint was taken.
    assert w.sim.running() == [("", old_job, None)], (point, w.sim.running())
    assert w.sim.savepoints_taken() == []
    assert set(w.objects()) == {""}, (point, w.objects())
    assert set(w.root_annotations()) <= {r.ANNOTATION_LIVE} and Pointers.of(
        w.cluster.kube.get("ConfigMap", w.cluster.namespace, f"{APP}-root")) == Pointers(live=""), point


# The rollback path's writes up to StartJob's start are the upgrade's (covered above); from there on its own: the
# submit refused on the promoted standby, then DiscardStandby (the old cluster live again), EnsureCluster, StartJob
# and AwaitRunning of the previous spec on the old cluster, from the stop's savepoint.
ROLLBACK_POINTS = [("write", n) for n in range(11, 21)]


@pytest.mark.parametrize("point", ROLLBACK_POINTS, ids=[f"{k}-{v}" for k, v in ROLLBACK_POINTS])
def test_a_crash_while_a_failed_upgrade_rolls_back_onto_the_old_cluster_resumes_the_rollback(
        world: World, point: tuple[str, Any]) -> None:
    w = world
    rev1, rev2 = w.revs
    a, old_job = _running_app(w)
    w.sim.run_failure = BAD_SUBMIT  # the new job cannot be submitted to the promoted standby
    _crash(w, a, point)
    b, after, in_flight = _take_over(w)
    assert in_flight, point

    res = after.resumed[APP]  # the stop's outcome is known (journaled): the resumed execution rolls back
    assert (res.outcome, res.rolled_back) == (Outcome.FAILURE, True), (point, res.message)
    assert "ClassNotFoundException" in res.message, res.message
    assert after.plan.app(APP).action is Action.BLOCKED, after.plan.app(APP)  # the failed commit is not retried
    record = b.rec.journal.record(APP)
    assert record is not None and b.rec.journal.inflight(APP) is None
    assert (record.last_applied_revision, record.last_attempted_revision) == (rev1, rev2)
    sps = [s.path for s in record.savepoints if s.revision == rev2]
    assert len(sps) == 1 and w.sim.savepoints_taken() == sps, (sps, w.sim.savepoints_taken())
    # Exactly one job: the previous spec's, on the old (first) cluster, restored from the stop's savepoint, started
    # once (the resumed steps re-applied its JobManager unchanged).
    running = w.sim.running()
    assert len(running) == 1, (point, running)
    gen, job, restored = running[0]
    assert (gen, restored) == ("", sps[0]) and job not in (old_job, None), (point, running)
    assert [s for s in w.sim.flink.starts if s[0] == job] == [(job, sps[0])], w.sim.flink.starts
    assert all(not backend.starts for backend in w.sim.sessions.values())
    assert set(w.objects()) == {""}, (point, w.objects())
    assert set(w.root_annotations()) <= {r.ANNOTATION_LIVE} and Pointers.of(
        w.cluster.kube.get("ConfigMap", w.cluster.namespace, f"{APP}-root")) == Pointers(live=""), point


@pytest.mark.parametrize("path", ["upgrade", "abort", "rollback"])
def test_the_crash_points_are_every_record_write_of_each_path(world: World, path: str) -> None:
    """One crash point per record write of each path, no more (a point past the last write would only skip):
    when the executor writes more or fewer records, the points above must change with it."""
    w = world
    a, _ = _running_app(w)
    if path == "abort":
        w.sim.stuck = TM_CRASH_LOOP
    if path == "rollback":
        w.sim.run_failure = BAD_SUBMIT
    before = a.store.writes
    done = a.rec.apply(w.revs[1])
    res = done.results[APP]
    assert res.outcome is (Outcome.SUCCESS if path == "upgrade" else Outcome.FAILURE), res.message
    assert res.rolled_back is (path == "rollback"), res.message
    ap = done.plan.app(APP)
    assert [s.type for s in ap.steps] == ["StartStandbyCluster", "StopWithSavepoint", "PromoteStandby", "StartJob",
                                          "AwaitRunning", "AwaitHealthy", "DeleteRetiredCluster"]
    assert [s.type for s in ap.abort] == ["DiscardStandby"]
    by_path: dict[str, list[tuple[str, Any]]] = {"upgrade": UPGRADE_POINTS, "abort": ABORT_POINTS,
                                                 "rollback": ROLLBACK_POINTS}
    points = by_path[path]
    assert a.store.writes - before == max(n for k, n in points if k == "write")
