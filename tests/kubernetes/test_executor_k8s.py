"""The executor's failure paths on Kubernetes: real planner, real Executor and Journal, real
KubernetesRuntime, against the stand-in API server (DESIGN.md safety rules 2, 3 and 4).

The stand-in stores objects; it does not run pods. Its `auto_ready` controller is switched off here and
`SimCluster` plays the rest of a cluster *between two polls of the code under test* (it runs whenever
the injected clock is slept on, so nothing here waits for real):

- the Deployment controller: each new generation of a Deployment is a Recreate rollout (the old pods
  are deleted first, as the rendered `strategy: Recreate` asks), then the status says what the pods do;
- the kubelet and the scheduler: the new pods are Running and ready, or stuck the way a scenario says
  (ImagePullBackOff, CrashLoopBackOff, Unschedulable), with the Warning event a kubelet/scheduler writes;
- the endpoints controller and the JobManager process: a ready JobManager starts the job named by its
  args (`--job-id`, `--fromSavepoint`) in the Flink REST contract server (`flink_backend.py`), reached
  through the API server's service proxy; a JobManager without a ready pod has no endpoints (the proxy
  answers 503, as the real API server does).

Only the deletion test also runs against a real cluster (FLINK_RECONCILER_TEST_KUBECONFIG): the others
need a Flink REST API behind the JobManager's Service, which only the stand-in can fake.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.executor import AppResult, Executor
from reconciler.apply.journal import Journal
from reconciler.clock import Clock, FakeClock
from reconciler.core.observed import ClusterPhase, Outcome
from reconciler.core.plan import Action, AppPlan, EnsureCluster, StartJob, describe_step
from reconciler.core.planner import Desired, PlanInput, Policy, plan
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.kubernetes.status import workload_ready
from reconciler.live.observe import observe
from reconciler.spec.model import FlinkApp
from tests.kubernetes.apps import app
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.flink_backend import FlinkBackend
from tests.kubernetes.standin import Standin

pytestmark = pytest.mark.kubernetes

Obj = dict[str, Any]
APP = "counter"
REV1, REV2 = "1" * 40, "2" * 40
START_DEADLINE_S = 120.0  # spec.deadlines.start of the test apps ("2m")
BAD_IMAGE = "registry.example.com/data/counter:2.3-build-42"  # not in the registry
CRASH_IMAGE = "registry.example.com/data/counter:2.3-build-43"  # pulls, then its JobManager exits 1
HUGE_CPU = r.cpu_quantity(64)


class SimClock(FakeClock):
    """A FakeClock that lets the simulated cluster act whenever the code under test waits."""

    def __init__(self) -> None:
        super().__init__()
        self.on_sleep: list[Callable[[], None]] = []

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        for fn in self.on_sleep:
            fn()


@dataclass(frozen=True)
class Stuck:
    """A rollout whose pod never becomes ready, and what the kubelet or scheduler writes about it."""

    id: str
    change: dict[str, Any]  # the spec fields the new revision changes
    broken: Callable[[str, Obj], bool]  # (component, main container) -> this pod gets stuck
    pod_status: Callable[[str], Obj]  # image -> pod status
    event: Callable[[str, str], tuple[str, str]]  # (pod, image) -> Warning event (reason, message)
    expect: tuple[str, ...]  # what the failure must name
    # A container that ended with an error fails StartJob at once (its pods are of the new job's generation);
    # the other states may still heal (an image pushed late, a node added) and wait for the deadline.
    fails_early: bool = False


def _waiting(reason: str, message: str, image: str, **extra: Any) -> Obj:
    return {"phase": "Pending" if "Pull" in reason else "Running", "containerStatuses": [{
        "name": r.MAIN_CONTAINER, "ready": False, "image": image, "imageID": "", "started": False,
        "state": {"waiting": {"reason": reason, "message": message}}, **extra}]}


IMAGE_PULL = Stuck(
    id="ImagePullBackOff",
    change={"image": BAD_IMAGE},
    broken=lambda comp, c: comp == "jobmanager" and c["image"] == BAD_IMAGE,
    pod_status=lambda image: _waiting("ImagePullBackOff", f'Back-off pulling image "{image}"', image,
                                      restartCount=0),
    event=lambda pod, image: ("Failed", f'Failed to pull image "{image}": rpc error: code = NotFound desc = '
                                        f'failed to resolve reference "{image}": not found'),
    expect=("ImagePullBackOff", BAD_IMAGE),
)
CRASH_LOOP = Stuck(
    id="CrashLoopBackOff",
    change={"image": CRASH_IMAGE},
    broken=lambda comp, c: comp == "jobmanager" and c["image"] == CRASH_IMAGE,
    pod_status=lambda image: _waiting(
        "CrashLoopBackOff", f"back-off 1m20s restarting failed container={r.MAIN_CONTAINER} pod=jm", image,
        restartCount=4, lastState={"terminated": {"reason": "Error", "exitCode": 1,
                                                  "startedAt": "2026-01-01T00:00:00Z",
                                                  "finishedAt": "2026-01-01T00:00:03Z"}}),
    event=lambda pod, image: ("BackOff", "Back-off restarting failed container flink-main-container in pod "
                                         f"{pod}"),
    expect=("CrashLoopBackOff", "exited with code 1 (Error), restarted 4 time(s)"),
    fails_early=True,
)
UNSCHEDULABLE = Stuck(
    id="Unschedulable",
    change={"jobManager": {"resources": {"cpu": 64, "memory": "1024m"}}},
    broken=lambda comp, c: comp == "jobmanager" and c["resources"]["requests"]["cpu"] == HUGE_CPU,
    pod_status=lambda image: {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: "
                   "3 No preemption victims found for incoming pod."}]},
    event=lambda pod, image: ("FailedScheduling", "0/3 nodes are available: 3 Insufficient cpu."),
    expect=("Unschedulable", "Insufficient cpu"),
)
STUCK = [IMAGE_PULL, CRASH_LOOP, UNSCHEDULABLE]


class SimCluster:
    """The controllers, kubelet and JobManager process of a cluster (see the module docstring)."""

    def __init__(self, c: Cluster, standin: Standin | None, flink: FlinkBackend, flink_url: str) -> None:
        """`standin` None: a real API server, whose Services reach Flink by other means (the test's)."""
        self.c, self.standin, self.flink, self.flink_url = c, standin, flink, flink_url
        self.stuck: Stuck | None = None
        self.rollouts: list[tuple[str, str, Obj]] = []  # (deployment, "ready" | stuck id, main container)

    def tick(self) -> None:
        for dep in self.c.kube.list("Deployment", self.c.namespace, r.MANAGED_SELECTOR):
            meta = dep["metadata"]
            if meta.get("deletionTimestamp") or (dep.get("status") or {}).get("observedGeneration") == \
                    meta.get("generation"):
                continue
            self._rollout(dep)

    def _rollout(self, dep: Obj) -> None:
        ns, meta = self.c.namespace, dep["metadata"]
        name, gen = meta["name"], int(meta["generation"])
        app_name = meta["labels"][r.LABEL_INSTANCE]
        comp = meta["labels"][r.LABEL_COMPONENT]
        template = dep["spec"]["template"]
        container = template["spec"]["containers"][0]
        replicas = int(dep["spec"].get("replicas", 1))
        # Recreate: the old pods go before any new one exists; a JobManager going away takes its
        # process and the Service's endpoints with it.
        for old in self.c.kube.list("Pod", ns, r.app_selector(app_name)):
            if old["metadata"]["labels"].get(r.LABEL_COMPONENT) == comp:
                self.c.kube.delete("Pod", ns, old["metadata"]["name"])
        if comp == "jobmanager":
            self.flink.stop_jobmanager()
            if self.standin is not None:
                self.standin.call(self.standin.api.proxy_backends.pop, (ns, f"{app_name}-rest", str(r.REST_PORT)),
                                  None)
        stuck = self.stuck if self.stuck is not None and self.stuck.broken(comp, container) else None
        for i in range(replicas):
            pod = f"{name}-g{gen}-{i}"
            self.c.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod, "labels": template["metadata"]["labels"],
                "annotations": template["metadata"].get("annotations") or {},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
                "spec": template["spec"]}, manager="kube-controller-manager")
            if stuck is None:
                status: Obj = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                               "containerStatuses": [{"name": r.MAIN_CONTAINER, "ready": True, "restartCount": 0,
                                                      "image": container["image"], "started": True,
                                                      "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
            else:
                status = stuck.pod_status(container["image"])
                reason, message = stuck.event(pod, container["image"])
                self.c.create({"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{pod}.{gen}"},
                               "type": "Warning", "reason": reason, "message": message, "count": 3,
                               "involvedObject": {"kind": "Pod", "name": pod, "namespace": ns},
                               "lastTimestamp": "2026-01-01T00:05:00Z"}, manager="kubelet")
            self.c.patch("Pod", pod, {"status": status}, manager="kubelet", status=True)
        ready = 0 if stuck else replicas
        self.c.patch("Deployment", name, {"status": {
            "observedGeneration": gen, "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready,
            "availableReplicas": ready, **({"unavailableReplicas": replicas} if stuck else {}),
            "conditions": [{"type": "Available", "status": "False" if stuck else "True",
                            "reason": "MinimumReplicasUnavailable" if stuck else "MinimumReplicasAvailable"}]}},
            manager="kube-controller-manager", status=True)
        self.rollouts.append((name, stuck.id if stuck else "ready", container))
        if comp == "jobmanager" and not stuck:
            args = container["args"]
            job_id = args[args.index("--job-id") + 1]
            restore = args[args.index("--fromSavepoint") + 1] if "--fromSavepoint" in args else None
            self.flink.start_jobmanager(job_id, restore_path=restore)
            if self.standin is not None:
                self.standin.add_proxy_backend(ns, f"{app_name}-rest", str(r.REST_PORT), self.flink_url)


@dataclass
class World:
    cluster: Cluster
    clock: Clock
    runtime: KubernetesRuntime
    journal: Journal
    flink: FlinkBackend | None  # None on a real cluster
    sim: SimCluster | None

    def executor(self) -> Executor:
        return Executor(self.runtime, self.journal, self.clock, resolve_jar=lambda a: None, poll_interval=1.0)

    def app(self, **spec: Any) -> FlinkApp:
        deadlines = {"start": "2m", "savepoint": "1m", "healthy": "2m",
                     "delete": "20s" if self.cluster.real else "2m"}
        return app(APP, self.cluster.namespace, deadlines=deadlines, **spec)

    def plan(self, revision: str, desired: dict[str, FlinkApp], policy: Policy | None = None) -> AppPlan:
        """What the reconciler's pass plans (service.plan_input): records from the journal, live state observed."""
        records = self.journal.records()
        previous = {n: FlinkApp.model_validate(rec.last_applied_spec) for n, rec in records.apps.items()
                    if rec.last_applied_spec}
        names = set(desired) | set(previous)
        the_plan = plan(PlanInput(revision=revision, desired=Desired(apps=desired), previous=previous,
                                  previous_sources={}, live=observe(self.runtime, names), records=records,
                                  now=self.clock.now(), policy=policy or Policy()), only=[APP])
        assert [a.app for a in the_plan.apps] == [APP]
        return the_plan.apps[0]

    def deployment(self, component: str) -> Obj:
        dep = self.cluster.kube.get("Deployment", self.cluster.namespace, f"{APP}-{component}")
        assert dep is not None, f"{APP}-{component} is gone"
        return dep


@pytest.fixture
def world(cluster: Cluster, tmp_path: Path) -> Iterator[World]:
    if cluster.standin is None:  # a real cluster: its own controllers, no Flink behind the Service
        rt = KubernetesRuntime(cluster.api_client, clock=cluster.clock, namespaces=[cluster.namespace],
                               rest_via="proxy", poll_interval=cluster.poll)
        with Journal(tmp_path / "journal.sqlite", cluster.clock) as journal:
            yield World(cluster, cluster.clock, rt, journal, None, None)
        return
    cluster.standin.set_auto_ready(False)  # SimCluster decides what every rollout does
    clock = SimClock()
    flink = FlinkBackend(clock)
    with flink.serve() as url, Journal(tmp_path / "journal.sqlite", clock) as journal:
        sim = SimCluster(cluster, cluster.standin, flink, url)
        clock.on_sleep.append(sim.tick)
        rt = KubernetesRuntime(cluster.api_client, clock=clock, namespaces=[cluster.namespace], rest_via="proxy",
                               poll_interval=cluster.poll)
        yield World(cluster, clock, rt, journal, flink, sim)


def _running(w: World) -> tuple[FlinkApp, str]:
    """Create the app at REV1 the way the reconciler would, and let it checkpoint for a while."""
    old = w.app()
    ap = w.plan(REV1, {APP: old})
    assert ap.action is Action.CREATE, ap.reason
    res = w.executor().run_app(REV1, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.job_id is not None
    w.clock.sleep(30)
    assert w.flink is not None and w.flink.job_state(res.job_id) == "RUNNING"
    return old, res.job_id


def _main_container(dep: Obj) -> Obj:
    c: Obj = dep["spec"]["template"]["spec"]["containers"][0]
    return c


def _rendered_main_container(w: World, spec: FlinkApp, component: str) -> Obj:
    for o in w.runtime.render(spec, job_id="0" * 32):
        if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{APP}-{component}":
            return _main_container(o)
    raise AssertionError(f"no {component} Deployment rendered")


def _stuck_upgrade(w: World, stuck: Stuck) -> tuple[FlinkApp, str, AppPlan, AppResult, float]:
    """A running app, then a new revision whose JobManager never becomes ready."""
    old, old_job = _running(w)
    assert w.sim is not None
    w.sim.stuck = stuck
    new = w.app(**stuck.change)
    ap = w.plan(REV2, {APP: new})
    assert ap.action is Action.UPGRADE, ap.reason
    assert [s.type for s in ap.steps] == ["StopWithSavepoint", "EnsureCluster", "StartJob", "AwaitRunning",
                                          "AwaitHealthy"]
    assert ap.rollback_after == 0
    assert [s.type for s in ap.rollback] == ["EnsureCluster", "StartJob", "AwaitRunning"]
    wall = time.monotonic()
    res = w.executor().run_app(REV2, ap)
    return old, old_job, ap, res, time.monotonic() - wall


@pytest.mark.parametrize("stuck", STUCK, ids=[s.id for s in STUCK])
def test_a_jobmanager_that_never_becomes_ready_fails_start_job_at_its_deadline_with_the_pod_reason(
        world: World, standin_only: Standin, stuck: Stuck) -> None:
    old, old_job, ap, res, wall = _stuck_upgrade(world, stuck)
    assert world.flink is not None and world.sim is not None
    start = ap.steps[2]
    assert isinstance(start, StartJob)
    assert res.outcome is Outcome.FAILURE
    assert res.failed_step == describe_step(start)
    if stuck.fails_early:
        assert f"{describe_step(start)} failed: {APP}: the JobManager of job {start.job_id} failed to start " \
               f"after " in res.message and f"pod {APP}-jobmanager-g" in res.message
        # The step ended at the first poll that saw the crash, long before its deadline ...
        assert dict(res.step_timings)["StartJob"] <= 2 * world.cluster.poll
    else:
        assert f"{describe_step(start)} failed: {APP}: JobManager not available after {START_DEADLINE_S:.0f}s: " \
               f"pod {APP}-jobmanager-g" in res.message
        # The step ended at its deadline (on the injected clock), not before and not long after ...
        assert dict(res.step_timings)["StartJob"] == pytest.approx(START_DEADLINE_S, abs=world.cluster.poll)
    for text in stuck.expect:
        assert text in res.message, res.message
    assert wall < 15  # ... and nothing waited for real.
    # The stuck rollout is the one the plan asked for: the new spec, the new job, from the savepoint just taken.
    sp = res.savepoint
    assert sp is not None and sp.startswith("s3://bucket/savepoints/counter/savepoint-")
    jm_rollouts = [(what, c) for name, what, c in world.sim.rollouts if name == f"{APP}-jobmanager"]
    assert [what for what, _ in jm_rollouts[:2]] == ["ready", stuck.id]
    stuck_jm = jm_rollouts[1][1]
    new_jm = _rendered_main_container(world, world.app(**stuck.change), "jobmanager")
    assert (stuck_jm["image"], stuck_jm["resources"]) == (new_jm["image"], new_jm["resources"])
    assert stuck_jm["args"][stuck_jm["args"].index("--job-id") + 1] == start.job_id
    assert stuck_jm["args"][stuck_jm["args"].index("--fromSavepoint") + 1] == sp
    assert world.flink.starts[0] == (old_job, None)
    assert start.job_id not in [job for job, _ in world.flink.starts]  # the new job never ran
    # Git stays the truth, and the journal does not claim the new revision.
    rec = world.journal.record(APP)
    assert rec is not None
    assert rec.last_applied_revision == REV1 and rec.last_attempted_revision == REV2
    assert rec.last_outcome is Outcome.FAILURE
    assert [(s.path, s.job_id, s.revision) for s in rec.savepoints] == [(sp, old_job, REV2)]
    assert world.journal.inflight(APP) is None  # the execution ended (no resume would pick it up)
    assert FlinkApp.model_validate(rec.last_applied_spec) == old


@pytest.mark.parametrize("stuck", STUCK, ids=[s.id for s in STUCK])
def test_a_jobmanager_that_never_becomes_ready_is_rolled_back_to_the_previous_spec_from_the_savepoint(
        world: World, standin_only: Standin, stuck: Stuck) -> None:
    old, _, ap, res, _ = _stuck_upgrade(world, stuck)
    assert world.flink is not None
    rollback_start = ap.rollback[1]
    assert isinstance(rollback_start, StartJob)
    assert res.outcome is Outcome.FAILURE, res.message
    assert res.message.startswith(f"rolled back to the previous spec: {describe_step(ap.steps[2])} failed: ")
    assert res.rolled_back is True, res.message
    sp = res.savepoint
    assert sp is not None
    jm = world.deployment("jobmanager")
    main = _main_container(jm)
    prev = _rendered_main_container(world, old, "jobmanager")
    assert main["image"] == prev["image"] and main["resources"] == prev["resources"]
    assert main["args"][main["args"].index("--job-id") + 1] == rollback_start.job_id
    assert main["args"][main["args"].index("--fromSavepoint") + 1] == sp
    assert workload_ready(jm) == (True, None)
    assert world.runtime.observe(APP).phase is ClusterPhase.READY
    assert world.flink.starts[-1] == (rollback_start.job_id, sp)
    assert world.flink.job_state(rollback_start.job_id) == "RUNNING"
    rec = world.journal.record(APP)
    assert rec is not None and rec.last_applied_revision == REV1 and rec.job_id == rollback_start.job_id


def test_a_bad_image_everywhere_stops_at_the_taskmanagers_and_rolls_back_from_the_savepoint(
        world: World, standin_only: Standin) -> None:
    """What a real cluster does with an image that cannot be pulled: the TaskManagers (applied first)
    get stuck too, EnsureCluster fails at its deadline, and the rollback restores the previous spec."""
    old, _ = _running(world)
    assert world.flink is not None and world.sim is not None
    world.sim.stuck = dataclasses.replace(IMAGE_PULL, broken=lambda comp, c: c["image"] == BAD_IMAGE)
    ap = world.plan(REV2, {APP: world.app(image=BAD_IMAGE)})
    assert ap.action is Action.UPGRADE
    res = world.executor().run_app(REV2, ap)

    ensure = ap.steps[1]
    rollback_start = ap.rollback[1]
    assert isinstance(ensure, EnsureCluster) and isinstance(rollback_start, StartJob)
    assert res.outcome is Outcome.FAILURE and res.rolled_back is True, res.message
    assert res.failed_step == describe_step(ensure)
    assert res.message.startswith(f"rolled back to the previous spec: {describe_step(ensure)} failed: "
                                  f"{APP}: TaskManagers not available after {START_DEADLINE_S:.0f}s: pod ")
    assert "ImagePullBackOff" in res.message and BAD_IMAGE in res.message
    sp = res.savepoint
    assert sp is not None and res.job_id == rollback_start.job_id
    for comp in ("taskmanager", "jobmanager"):
        dep = world.deployment(comp)
        assert _main_container(dep)["image"] == "flink:2.3", comp
        assert workload_ready(dep) == (True, None), comp
    args = _main_container(world.deployment("jobmanager"))["args"]
    assert args[args.index("--job-id") + 1] == rollback_start.job_id
    assert args[args.index("--fromSavepoint") + 1] == sp
    assert world.flink.starts[-1] == (rollback_start.job_id, sp)
    assert world.flink.job_state(rollback_start.job_id) == "RUNNING"
    assert world.runtime.observe(APP).phase is ClusterPhase.READY
    rec = world.journal.record(APP)
    assert rec is not None and rec.last_applied_revision == REV1 and rec.last_outcome is Outcome.FAILURE
    assert FlinkApp.model_validate(rec.last_applied_spec) == old
    # The same commit is not retried in a loop (safety rule 3): the next pass is blocked.
    again = world.plan(REV2, {APP: world.app(image=BAD_IMAGE)})
    assert again.action is Action.BLOCKED and "already failed" in again.reason


SAVEPOINT_FAILURE = (
    "java.util.concurrent.CompletionException: org.apache.flink.runtime.checkpoint.CheckpointException: "
    "Failure to finalize checkpoint.\n"
    "\tat org.apache.flink.runtime.checkpoint.CheckpointCoordinator.finalizeCheckpoint"
    "(CheckpointCoordinator.java:1497)\n"
    "Caused by: org.apache.flink.runtime.checkpoint.CheckpointException: Failure to finalize checkpoint.\n"
    "\t... 12 more\n"
    "Caused by: java.nio.file.AccessDeniedException: s3://bucket/savepoints/counter/savepoint-4f2a1c: "
    "getFileStatus on s3://bucket/savepoints/counter: 403 Forbidden\n"
    "\tat org.apache.hadoop.fs.s3a.S3AUtils.translateException(S3AUtils.java:255)\n"
)


def test_a_failed_savepoint_leaves_the_old_jobmanager_untouched(world: World, standin_only: Standin) -> None:
    _, old_job = _running(world)
    assert world.flink is not None
    before = {c: world.deployment(c) for c in ("jobmanager", "taskmanager")}
    world.flink.savepoint_failure = SAVEPOINT_FAILURE
    ap = world.plan(REV2, {APP: world.app(image=CRASH_IMAGE)})
    assert ap.action is Action.UPGRADE and ap.steps[0].type == "StopWithSavepoint"
    standin_only.api.reset_log()
    res = world.executor().run_app(REV2, ap)

    assert res.outcome is Outcome.FAILURE and res.rolled_back is False
    assert res.failed_step == describe_step(ap.steps[0])
    assert "stop-with-savepoint failed: java.util.concurrent.CompletionException" in res.message
    assert "AccessDeniedException" in res.message and "403 Forbidden" in res.message
    for comp, dep in before.items():
        now = world.deployment(comp)
        for key in ("generation", "resourceVersion"):
            assert now["metadata"][key] == dep["metadata"][key], (comp, key)
        assert _main_container(now)["image"] == "flink:2.3"
    writes = [c for c in standin_only.api.calls() if c.verb in ("create", "update", "patch", "delete")
              and c.resource != "services/proxy"]
    assert writes == []  # nothing on Kubernetes was changed
    assert world.flink.job_state(old_job) == "RUNNING"  # Flink keeps a job whose savepoint failed running
    rec = world.journal.record(APP)
    assert rec is not None and rec.last_applied_revision == REV1 and rec.job_id == old_job
    assert rec.savepoints == ()


def test_deleting_an_app_held_by_a_foreign_finalizer_fails_at_the_deadline_and_patches_nothing(
        world: World) -> None:
    c = world.cluster
    old = world.app()
    if world.sim is not None:  # the stand-in: a running job, so the deletion takes a final savepoint
        _, job = _running(world)
    else:  # a real cluster has no Flink behind the Service: an app whose job is not running (yet)
        setup = AppPlan(app=APP, action=Action.CREATE, reason="test setup: cluster without a job",
                        steps=(EnsureCluster(deadline_s=180),), desired=old.canonical())
        assert world.executor().run_app(REV1, setup).outcome is Outcome.SUCCESS
    keeper = app("keeper", c.namespace)  # one app stays: deleting the only app trips the empty-checkout guard
    finalizer = "backup.example.com/protect"
    c.patch("ConfigMap", f"{APP}-config", {"metadata": {"finalizers": [finalizer]}}, manager="backup-operator")
    try:
        ap = world.plan(REV2, {"keeper": keeper}, policy=Policy(prune=True))
        assert ap.action is Action.DELETE, ap.reason
        assert [s.type for s in ap.steps] == (["StopWithSavepoint"] if world.sim else []) + ["DeleteCluster"]
        if c.standin:
            c.standin.api.reset_log()
        res = world.executor().run_app(REV2, ap)

        assert res.outcome is Outcome.FAILURE
        assert res.failed_step == "delete the cluster"
        assert f"{APP} not deleted after " in res.message
        assert f"still present: ConfigMap/{APP}-config (finalizers: {finalizer})" in res.message
        held = c.kube.get("ConfigMap", c.namespace, f"{APP}-config")
        assert held is not None and held["metadata"]["finalizers"] == [finalizer]
        assert held["metadata"].get("deletionTimestamp")
        assert c.kube.get("ConfigMap", c.namespace, f"{APP}-root") is None
        assert world.journal.inflight(APP) is None
        if c.standin:
            deadline = ap.steps[-1].deadline_s
            assert dict(res.step_timings)["DeleteCluster"] == pytest.approx(deadline, abs=c.poll)
            writes = [(x.verb, x.resource) for x in c.standin.api.calls()
                      if x.verb in ("patch", "update") and not x.resource.endswith("/status")]
            assert writes == []  # no finalizer (nor anything else) was patched away
            rec = world.journal.record(APP)
            assert rec is not None and [s.job_id for s in rec.savepoints] == [job]  # the final savepoint
    finally:  # let the deletion finish (a real namespace would hang on it otherwise)
        if c.kube.get("ConfigMap", c.namespace, f"{APP}-config") is not None:
            c.patch("ConfigMap", f"{APP}-config", {"metadata": {"finalizers": None}}, manager="backup-operator")
