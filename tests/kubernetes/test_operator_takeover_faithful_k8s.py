"""Taking over from the Flink Kubernetes Operator when it behaves as its source says: the bad cases too.

The operator is `tests.kubernetes.flink_operator.FlinkOperator`, a controller written from apache/flink-kubernetes-
operator main at 6e9caeb (1.16-SNAPSHOT): `AbstractJobReconciler.getJobUpgrade` / `reconcileSpecChange`
(savepoint suspend, the last-state fallback and `kubernetes.operator.job.upgrade.last-state-fallback.enabled`,
`useStatusSavepoint`), `ApplicationReconciler.deploy` / `cleanupInternal` (`KUBERNETES_OPERATOR_LAST_STATE`,
cancel without savepoint on deletion, HA data deleted with the cluster), `SnapshotObserver.observeLatestCheckpoint`
and `FlinkStateSnapshotUtils.createUpgradeSnapshotResource`. It ticks whenever the code under test waits, on the
stand-in API server with the simulated kubelet and Flink REST backend (test_executor_k8s). The whole reconcile
pass runs (Git, planner, executor, records in ConfigMaps).

With FLINK_RECONCILER_TEST_KUBECONFIG the same tests run against a real API server (see the `move` fixture):
the refusals, the patch and its release, and the fallback's proof; the takeovers that start our cluster skip
there, since a real server's own controllers (and node, where one runs) would take our Deployments.

Every case ends in one of two ways: a start from the savepoint this suspend produced, or a refusal that leaves
the operator's app as it was. Never a stale savepoint, a checkpoint or the placeholder, never an empty start,
never our objects beside the operator's.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import Clock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action
from reconciler.live.kubernetes.records import ConfigMapRecordStore
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.operator_migration.status import before_suspend, suspension
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.gitutil import Repo
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.flink_backend import FlinkBackend
from tests.kubernetes.flink_operator import FALLBACK, PLACEHOLDER, FlinkOperator
from tests.kubernetes.test_executor_k8s import APP, SimClock, SimCluster, World

pytestmark = pytest.mark.kubernetes

Obj = dict[str, Any]
OPERATOR_JOB = "0123456789abcdef0123456789abcdef"
OLD_SAVEPOINT = f"s3://bucket/savepoints/{APP}/savepoint-012345-000000000001"
CONF = {"state.savepoints.dir": f"s3://bucket/savepoints/{APP}", "state.checkpoints.dir": f"s3://bucket/checkpoints/{APP}"}
JOB = {"jarURI": "local:///opt/flink/usrlib/counter.jar", "parallelism": 2, "upgradeMode": "last-state",
       "state": "running"}

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
  takeover: {{from: FlinkDeployment/{app}}}
  job:
    jarURI: local:///opt/flink/usrlib/counter.jar
    entryClass: com.example.Counter
    parallelism: 2{extra}
  flinkConfiguration:
    execution.checkpointing.dir: s3://bucket/checkpoints/{app}
    execution.checkpointing.savepoint-dir: s3://bucket/savepoints/{app}
    execution.checkpointing.interval: 10s
"""


class Move:
    """The world of one test: Git, the operator stand-in, a reconciler per process."""

    def __init__(self, w: World, tmp: Path) -> None:
        assert w.flink is not None and w.sim is not None
        self.w, self.tmp, self.n = w, tmp, 0
        self.flink = w.flink
        clock = w.clock
        self.operator = FlinkOperator(
            w.cluster.kube, w.cluster.namespace, w.sim.flink_url,
            now_ms=lambda: int(clock.now().timestamp() * 1000),
            start_job=lambda jid, restore: self.flink.start_jobmanager(jid, restore_path=restore),
            stop_jobmanager=self.flink.stop_jobmanager)
        self.flink.checkpoint_interval_s = 2.0
        self.repo = Repo(tmp)

    def needs_a_simulated_node(self) -> None:
        """A takeover that starts our cluster: on a real API server its own controllers and nodes would take our
        Deployments (the lab this was written on runs a kubelet), so only the stand-in's simulated one will do."""
        if self.w.cluster.real:
            pytest.skip("starts our cluster: needs the simulated kubelet and Flink REST backend of the stand-in")

    def tick(self) -> None:
        self.operator.tick()

    def commit(self, extra: str = "") -> str:
        self.repo.write("apps/counter.yaml", SPEC.format(app=APP, ns=self.w.cluster.namespace, extra=extra))
        return self.repo.commit("counter, moved over from the operator")

    def reconciler(self) -> Reconciler:
        self.n += 1
        w = self.w
        runtime = KubernetesRuntime(w.cluster.api_client, clock=w.clock, namespaces=[w.cluster.namespace],
                                    rest_via="service" if w.cluster.real else "proxy", poll_interval=w.cluster.poll,
                                    savepoint_probe=lambda uri: uri in self.flink.savepoints_taken)
        state = self.tmp / f"state-{self.n}"
        rec = Reconciler(source=GitSource(str(self.repo.origin), state / "git", branch="main"), runtime=runtime,
                         journal=Journal(state / "journal", w.clock,
                                         store=ConfigMapRecordStore(runtime.kube, runtime.namespaces)),
                         clock=w.clock, subdir="apps", max_parallel=1)
        rec.source.fetch()
        return rec

    def deploy(self, *, job: Obj | None = None, conf: Obj | None = None, status: Obj | None = None,
               mode: str = "native") -> None:
        self.operator.deploy(APP, OPERATOR_JOB, job=job or JOB, conf={**CONF, **(conf or {})}, status=status,
                             mode=mode)

    def fd(self) -> Obj:
        got = self.operator.deployment(APP)
        assert got is not None
        return got

    def ours(self) -> list[str]:
        return [d["metadata"]["name"] for d in self.w.cluster.kube.list(
            "Deployment", self.w.cluster.namespace, "app.kubernetes.io/managed-by=flink-reconciler")]


@pytest.fixture
def move(cluster: Cluster, flink_operator_crd: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Move]:
    """On the stand-in: `SimCluster` and the operator act whenever the code under test waits (no real time). On a
    real API server (FLINK_RECONCILER_TEST_KUBECONFIG): the same two, as controllers in a thread every 0.2 s, with
    real time; no node runs pods there, so `SimCluster` writes the pods' statuses, and the JobManager Service's
    in-cluster name reaches the Flink REST backend through an HTTP proxy (HTTP_PROXY: the backend answers
    absolute-URI requests), as a cluster network would route it."""
    if cluster.standin is not None:
        cluster.standin.set_auto_ready(False)
        clock: Clock = SimClock()
    else:
        clock = cluster.clock
    flink = FlinkBackend(clock)
    with flink.serve() as url, Journal(tmp_path / "journal", clock) as journal:
        sim = SimCluster(cluster, cluster.standin, flink, url)
        rt = KubernetesRuntime(cluster.api_client, clock=clock, namespaces=[cluster.namespace],
                               rest_via="proxy", poll_interval=cluster.poll)
        (tmp_path / "move").mkdir()
        m = Move(World(cluster, clock, rt, journal, flink, sim), tmp_path / "move")
        if cluster.real:
            m.operator.node_name = "fr-test-no-such-node"
        stop = threading.Event()
        if isinstance(clock, SimClock):
            clock.on_sleep += [sim.tick, m.tick]
        else:
            monkeypatch.setenv("HTTP_PROXY", url)
            monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")

            def controllers() -> None:
                while not stop.wait(0.2):
                    with contextlib.suppress(Exception):  # a controller keeps going; the test judges the outcome
                        sim.tick()
                        m.tick()
            threading.Thread(target=controllers, name="controllers", daemon=True).start()
        try:
            yield m
        finally:
            stop.set()
            if cluster.real:  # let the namespace go: nothing runs the operator's finalizer any more
                for fd in cluster.kube.list("FlinkDeployment", cluster.namespace, ""):
                    with contextlib.suppress(Exception):
                        cluster.patch("FlinkDeployment", fd["metadata"]["name"], {"metadata": {"finalizers": None}},
                                      manager="test")


def _taken_over_from_a_new_savepoint(m: Move, rec: Reconciler, rev: str) -> str:
    """Exactly one job runs, ours, started once from the savepoint this suspend produced; nothing of the
    operator's is left, and never was beside ours."""
    running = [j for j in m.flink.jobs.values() if j.state == "RUNNING"]
    assert len(running) == 1 and running[0].jid != OPERATOR_JOB
    assert m.operator.stops == 1 and len(m.flink.savepoints_taken) == 1
    new = m.flink.savepoints_taken[0]
    assert new != OLD_SAVEPOINT and running[0].restored_from == new
    assert [restore for _, restore in m.flink.starts[1:]] == [new]
    assert m.operator.objects(APP) == [] and m.operator.overlaps == []
    assert m.operator.cancelled_without_savepoint == []
    record = rec.journal.record(APP)
    assert record is not None and record.last_applied_revision == rev
    assert rec.plan(rev).app(APP).action is Action.NOOP
    return new


@pytest.mark.parametrize("snapshot_resources", [False, True], ids=["savepointInfo", "FlinkStateSnapshot"])
def test_a_suspend_with_a_new_savepoint_is_taken_over_from_it_not_from_the_older_one(
        move: Move, snapshot_resources: bool) -> None:
    move.needs_a_simulated_node()
    move.operator.snapshot_resources = snapshot_resources
    move.deploy(status={"lifecycleState": "STABLE", "jobManagerDeploymentStatus": "READY",
                        "reconciliationStatus": {"state": "DEPLOYED"},
                        "jobStatus": {"jobId": OPERATOR_JOB, "state": "RUNNING", "upgradeSavepointPath": OLD_SAVEPOINT,
                                      "savepointInfo": {"lastSavepoint": {"location": OLD_SAVEPOINT,
                                                                          "timeStamp": 1, "triggerType": "MANUAL"}}}})
    rev = move.commit()
    rec = move.reconciler()
    assert rec.plan(rev).app(APP).action is Action.TAKEOVER
    res = rec.apply(rev).results[APP]
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.restored_from == _taken_over_from_a_new_savepoint(move, rec, rev)


def test_a_slow_finalizer_and_garbage_collection_are_waited_for(move: Move) -> None:
    move.needs_a_simulated_node()
    move.operator.finalizer_ticks, move.operator.gc_lag = 4, 3
    move.deploy()
    rev = move.commit()
    rec = move.reconciler()
    res = rec.apply(rev).results[APP]
    assert res.outcome is Outcome.SUCCESS, res.message
    _taken_over_from_a_new_savepoint(move, rec, rev)
    assert move.operator.managed[APP].held == 4


def test_standalone_mode_leftovers_are_waited_for(move: Move) -> None:
    move.needs_a_simulated_node()
    move.operator.gc_lag = 3  # its TaskManager Deployment outlives the FlinkDeployment a while
    move.deploy(mode="standalone")
    assert any(o.startswith("Deployment/") and "taskmanager" in o for o in move.operator.objects(APP))
    rev = move.commit()
    rec = move.reconciler()
    res = rec.apply(rev).results[APP]
    assert res.outcome is Outcome.SUCCESS, res.message
    _taken_over_from_a_new_savepoint(move, rec, rev)


def test_deleting_the_flinkdeployment_removes_its_ha_configmaps_before_ours_start(move: Move) -> None:
    move.needs_a_simulated_node()
    move.deploy()
    assert len(move.operator.ha_configmaps(APP)) == 2
    rev = move.commit()
    rec = move.reconciler()
    assert rec.apply(rev).results[APP].outcome is Outcome.SUCCESS
    assert move.operator.ha_configmaps(APP) == [] and move.operator.overlaps == []


@pytest.mark.parametrize(("status_job", "lifecycle", "why"), [
    ("INITIALIZING", "DEPLOYED", "job is INITIALIZING"),
    ("RECONCILING", "DEPLOYED", "job is RECONCILING"),
    ("FINISHED", "STABLE", "job is FINISHED"),
])
def test_a_job_not_running_is_refused_and_nothing_is_asked_of_the_operator(
        move: Move, status_job: str, lifecycle: str, why: str) -> None:
    move.deploy()
    move.flink.jobs[OPERATOR_JOB].state = status_job
    move.operator.tick()  # its observer reads the job's state
    assert move.fd()["status"]["jobStatus"]["state"] == status_job
    before = copy.deepcopy(move.fd()["spec"])
    rev = move.commit()
    rec = move.reconciler()
    ap = rec.plan(rev).app(APP)
    assert ap.action is Action.BLOCKED and why in ap.reason and "initialSavepointPath" in ap.reason, ap.reason
    rec.apply(rev)
    move.operator.tick()
    assert move.fd()["spec"] == before and move.ours() == [] and move.operator.stops == 0


def test_already_suspended_is_refused_with_the_way_out_then_taken_over_from_the_named_savepoint(move: Move) -> None:
    move.deploy(job={**JOB, "upgradeMode": "savepoint"})
    # Suspended under the operator, before any takeover: its job stopped with a savepoint, then more checkpoints
    # were taken by nobody; the status says what it says (here the checkpoint its observer saw last).
    move.w.cluster.patch("FlinkDeployment", APP, {"spec": {"job": {"state": "suspended"}}}, manager="kubectl")
    for _ in range(6):
        move.operator.tick()
    fd = move.fd()
    assert fd["status"]["lifecycleState"] == "SUSPENDED"
    taken_then = fd["status"]["jobStatus"]["upgradeSavepointPath"]
    rev = move.commit()
    rec = move.reconciler()
    ap = rec.plan(rev).app(APP)
    assert ap.action is Action.BLOCKED and "already suspended" in ap.reason and "initialSavepointPath" in ap.reason
    assert move.operator.objects(APP) != [] and move.ours() == []
    move.needs_a_simulated_node()
    # The way out: name the savepoint to start from. It is deleted (with its HA data), and ours starts from it.
    rev = move.commit(f"\n    initialSavepointPath: {taken_then}")
    rec = move.reconciler()
    ap = rec.plan(rev).app(APP)
    assert ap.action is Action.TAKEOVER and ap.steps[0].type == "DeleteOperatorDeployment"
    res = rec.apply(rev).results[APP]
    assert res.outcome is Outcome.SUCCESS, res.message
    running = [j for j in move.flink.jobs.values() if j.state == "RUNNING"]
    assert len(running) == 1 and running[0].restored_from == taken_then
    assert move.operator.objects(APP) == [] and move.operator.overlaps == []


def test_a_job_that_stops_running_after_the_patch_makes_the_operator_wait_not_fall_back(move: Move) -> None:
    """The plan saw it RUNNING; it restarts right after our patch. With the fallback on (its default) the operator
    would suspend it last-state, without a savepoint, leaving the old path in its status; our patch turned the
    fallback off, so it waits, our suspend runs into its deadline, and the FlinkDeployment is given back."""
    move.deploy(job={**JOB, "upgradeMode": "last-state"})
    original = copy.deepcopy(move.fd()["spec"])
    rev = move.commit()
    rec = move.reconciler()
    assert rec.plan(rev).app(APP).action is Action.TAKEOVER
    flipped: list[Obj] = []

    def restart_once(fd: Obj) -> None:  # as the operator reads our patch, its job restarts
        if not flipped and fd["spec"]["job"].get("state") == "suspended":
            move.flink.jobs[OPERATOR_JOB].state = "RESTARTING"
            flipped.append(fd["spec"])
    move.operator.on_read.append(restart_once)
    res = rec.apply(rev).results[APP]
    assert res.outcome is Outcome.FAILURE, res.message
    assert flipped and flipped[0]["flinkConfiguration"][FALLBACK] == "false"
    assert move.operator.stops == 0 and move.flink.savepoints_taken == []
    fd = move.fd()
    assert fd["spec"] == original  # every field we patched, back as it was (fallback key and upgradeMode too)
    assert fd["status"].get("lifecycleState") != "SUSPENDED"
    assert move.ours() == [] and move.operator.overlaps == []


def test_an_abort_gives_back_a_flinkdeployment_that_had_no_upgrade_mode(move: Move) -> None:
    """A stateless FlinkDeployment (no upgradeMode): the suspend patch sets savepoint mode; the savepoint fails;
    the abort removes what we added, so the operator's validation and behaviour are what they were."""
    job = {k: v for k, v in JOB.items() if k != "upgradeMode"}
    move.deploy(job=job, conf={FALLBACK: "true"})
    original = copy.deepcopy(move.fd()["spec"])
    move.flink.savepoint_failure = "java.util.concurrent.CompletionException: savepoint declined"
    rev = move.commit()
    rec = move.reconciler()
    res = rec.apply(rev).results[APP]
    assert res.outcome is Outcome.FAILURE
    assert "the operator reported an error while suspending" in res.message, res.message
    assert move.fd()["spec"] == original
    assert move.ours() == []


def test_the_stand_in_falls_back_to_last_state_as_the_operator_does_and_the_proof_rejects_it(move: Move) -> None:
    """What the old suspend patch (no fallback setting) met: a job not RUNNING is suspended last-state, the status
    keeps the path it had (here the placeholder of its last last-state deploy), and its HA metadata is all that
    holds the state. The suspend step's proof rejects that status, so the FlinkDeployment is never deleted."""
    move.deploy(status={"lifecycleState": "STABLE", "jobManagerDeploymentStatus": "READY",
                        "reconciliationStatus": {"state": "DEPLOYED"},
                        "jobStatus": {"jobId": OPERATOR_JOB, "state": "RUNNING", "upgradeSavepointPath": PLACEHOLDER}})
    move.flink.jobs[OPERATOR_JOB].state = "RESTARTING"
    move.operator.tick()
    before = before_suspend(move.fd())
    move.w.cluster.patch("FlinkDeployment", APP, {"spec": {"job": {"state": "suspended", "upgradeMode": "savepoint"}}},
                         manager="an older flink-reconciler")
    move.operator.tick()
    fd = move.fd()
    assert fd["status"]["lifecycleState"] == "SUSPENDED" and move.operator.stops == 0
    assert fd["status"]["jobStatus"]["upgradeSavepointPath"] == PLACEHOLDER
    assert len(move.operator.ha_configmaps(APP)) == 2  # the state is only there
    answer = suspension(fd, before, lambda uri: uri in move.flink.savepoints_taken)
    assert answer.done and answer.savepoint is None and answer.problem and PLACEHOLDER in answer.problem
