"""Records on Kubernetes: a ConfigMap per app, compare-and-set, fenced by the leader Lease, and a standby
with an empty state dir that finishes what a dead leader left in flight.

The store tests run against the stand-in API server or, with FLINK_RECONCILER_TEST_KUBECONFIG, a real one.
The takeover test needs a Flink REST API behind the JobManager's Service, which only the stand-in fakes
(`test_executor_k8s.SimCluster` + `flink_backend.FlinkBackend`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action
from reconciler.errors import FencedError, JournalError, RecordConflictError
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.lease import LeaseElector
from reconciler.live.kubernetes.records import (
    ANNOTATION_FENCE,
    ConfigMapRecordStore,
    FenceToken,
    lease_fence,
    record_name,
)
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.records import Doc, Read, StoredRecord
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.gitutil import Repo
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.standin import Standin
from tests.kubernetes.test_executor_k8s import APP, SimClock, World, world  # noqa: F401  (fixture)

pytestmark = pytest.mark.kubernetes


def _doc(app: str, n: int = 0, namespace: str | None = None) -> Doc:
    return {"kind": "FlinkReconcilerRecord", "version": 1, "app": app, "namespace": namespace, "n": n}


def _elector(c: Cluster, identity: str, clock: FakeClock | None = None) -> LeaseElector:
    return LeaseElector(c.api_client, clock=clock or c.clock, namespace=c.namespace, name="fr-records",
                        identity=identity, lease_duration=15, renew_deadline=10, retry_period=2)


@pytest.fixture
def fake(cluster: Cluster) -> FakeClock:
    if not isinstance(cluster.clock, FakeClock):
        pytest.skip("lease expiry is tested with a FakeClock")
    return cluster.clock


# ---- the store ----------------------------------------------------------------------------------


def test_records_are_configmaps_outside_the_app_written_with_compare_and_set(cluster: Cluster) -> None:
    store = ConfigMapRecordStore(cluster.kube, [cluster.namespace])
    assert store.list() == {}
    v1 = store.put("orders", _doc("orders", 1, cluster.namespace), expected=None)
    cm = cluster.kube.get("ConfigMap", cluster.namespace, record_name("orders"))
    assert cm is not None and cm["metadata"]["name"] == "orders-flink-reconciler-record"
    # Not part of the app: no owner (outlives the cluster), not selected by the app's selector (never pruned).
    assert not cm["metadata"].get("ownerReferences")
    labels = cm["metadata"]["labels"]
    assert labels.get(r.LABEL_INSTANCE) is None and labels.get(r.LABEL_NAME) != "flink"
    assert cluster.kube.list("ConfigMap", cluster.namespace, r.app_selector("orders")) == []

    other = ConfigMapRecordStore(cluster.kube, [cluster.namespace])  # another replica, same API server
    assert other.list() == {"orders": StoredRecord(_doc("orders", 1, cluster.namespace), v1)}
    v2 = store.put("orders", _doc("orders", 2, cluster.namespace), expected=v1)
    with pytest.raises(RecordConflictError):  # the other replica's view is stale: refused, not overwritten
        other.put("orders", _doc("orders", 99, cluster.namespace), expected=v1)
    with pytest.raises(RecordConflictError):  # creating what exists is a conflict too
        other.put("orders", _doc("orders", 99, cluster.namespace), expected=None)
    got = other.get("orders")
    assert got == StoredRecord(_doc("orders", 2, cluster.namespace), v2)
    with pytest.raises(RecordConflictError):
        other.delete("orders", expected=v1)
    other.delete("orders", expected=v2)
    assert store.get("orders") is None


def test_one_list_per_namespace_whatever_the_number_of_apps(cluster: Cluster, standin_only: Standin) -> None:
    store = ConfigMapRecordStore(cluster.kube, [cluster.namespace])
    for i in range(25):
        store.put(f"app-{i}", _doc(f"app-{i}"), expected=None)
    standin_only.api.reset_log()
    assert len(ConfigMapRecordStore(cluster.kube, [cluster.namespace]).list()) == 25
    assert [(c.verb, c.resource) for c in standin_only.api.calls()] == [("list", "configmaps")]


def test_a_journal_on_configmaps_survives_a_new_replica(cluster: Cluster) -> None:
    """What a new pod with an empty state dir sees: the same records."""
    from tests.apply.test_journal import REV1, plan_for

    store = ConfigMapRecordStore(cluster.kube, [cluster.namespace])
    j1 = Journal(Path("/nonexistent/journal"), cluster.clock, store=store)
    ap = plan_for()
    assert ap.desired is not None
    ap = ap.model_copy(update={"desired": {**ap.desired, "metadata": {**ap.desired["metadata"],
                                                                     "namespace": cluster.namespace}}})
    with pytest.raises(JournalError, match="does not watch"):  # never a record where nobody looks
        j1.begin("elsewhere", REV1, plan_for("elsewhere"))
    j1.begin("orders", REV1, ap)
    j1.step_done("orders", 0, captured_path="s3://b/sp/savepoint-1", captured_kind="savepoint")
    j2 = Journal(Path("/other/journal"), cluster.clock, store=ConfigMapRecordStore(cluster.kube, [cluster.namespace]))
    inf = j2.inflight("orders")
    assert inf is not None and inf.captured_path == "s3://b/sp/savepoint-1"
    assert j2.records() == j1.records()


# ---- fencing --------------------------------------------------------------------------------------


def test_only_the_lease_holder_writes_and_a_deposed_leader_is_refused(cluster: Cluster, fake: FakeClock) -> None:
    a, b = _elector(cluster, "pod-a"), _elector(cluster, "pod-b")
    store_a = ConfigMapRecordStore(cluster.kube, [cluster.namespace], fence=lease_fence(a))
    store_b = ConfigMapRecordStore(cluster.kube, [cluster.namespace], fence=lease_fence(b))
    with pytest.raises(FencedError, match="does not hold lease"):  # nobody leads yet
        store_a.put("orders", _doc("orders"), expected=None)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    v1 = store_a.put("orders", _doc("orders", 1), expected=None)
    cm = cluster.kube.get("ConfigMap", cluster.namespace, record_name("orders"))
    assert cm is not None and cm["metadata"]["annotations"][ANNOTATION_FENCE] == "pod-a/0"
    with pytest.raises(FencedError):
        store_b.put("orders", _doc("orders", 2), expected=v1)

    fake.advance(16)  # a stops renewing (a long pause); b takes over after the lease expired
    assert b.try_acquire_or_renew()
    v2 = store_b.put("orders", _doc("orders", 2), expected=store_b.list()["orders"].version)
    cm = cluster.kube.get("ConfigMap", cluster.namespace, record_name("orders"))
    assert cm is not None and cm["metadata"]["annotations"][ANNOTATION_FENCE] == "pod-b/1"
    # a comes back believing it still leads (its renew timer was reset): the Lease on the server says no.
    a._leader, a._renewed_at = True, fake.monotonic()
    with pytest.raises(FencedError, match="held by pod-b"):
        store_a.put("orders", _doc("orders", 3), expected=v2)
    assert store_b.get("orders") == StoredRecord(_doc("orders", 2), v2)


def test_a_write_with_an_older_token_than_the_records_stamp_is_refused(cluster: Cluster) -> None:
    newer = ConfigMapRecordStore(cluster.kube, [cluster.namespace], fence=lambda: FenceToken("pod-b", 3))
    newer.put("orders", _doc("orders", 1), expected=None)
    older = ConfigMapRecordStore(cluster.kube, [cluster.namespace], fence=lambda: FenceToken("pod-a", 2))
    current = older.list()["orders"]
    with pytest.raises(FencedError, match="later term"):
        older.put("orders", _doc("orders", 2), expected=current.version)


# ---- a standby finishes the dead leader's transition ----------------------------------------------


class Crash(BaseException):
    """The leader process dying (not an Exception: nothing in the executor may catch it)."""


class CrashingStore:
    """A store whose process dies just before its `crash_at`-th write from now on."""

    def __init__(self, inner: ConfigMapRecordStore) -> None:
        self.inner = inner
        self.where = inner.where
        self.writes = 0
        self.crash_at: int | None = None

    def list(self) -> dict[str, Read]:
        return self.inner.list()

    def get(self, app: str) -> Read | None:
        return self.inner.get(app)

    def put(self, app: str, doc: Doc, *, expected: str | None) -> str:
        self.writes += 1
        if self.crash_at is not None and self.writes >= self.crash_at:
            raise Crash(f"leader died before record write {self.writes}")
        return self.inner.put(app, doc, expected=expected)

    def delete(self, app: str, *, expected: str) -> None:
        self.inner.delete(app, expected=expected)


SPEC = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {app}
  namespace: {ns}
spec:
  image: flink:2.3
  taskManager: {{slots: 2}}
  deadlines: {{start: 2m, savepoint: 1m, healthy: 2m, delete: 2m}}
  highAvailability: {{enabled: true, storageDir: s3://bucket/ha/{app}}}
  job:
    jarURI: local:///opt/flink/usrlib/counter.jar
    entryClass: com.example.Counter
    args: ["--rate", "{rate}"]
    parallelism: 2
  flinkConfiguration:
    execution.checkpointing.dir: s3://bucket/checkpoints/{app}
    execution.checkpointing.savepoint-dir: s3://bucket/savepoints/{app}
    execution.checkpointing.interval: 10s
"""

# Record writes of one savepoint upgrade (set_source_file, begin, per step started/done, finish ...):
# every one is a crash point. An upgrade that writes fewer fails the last point: keep this in step.
CRASH_POINTS = range(1, 15)


@pytest.fixture
def replicas(world: World, tmp_path: Path) -> Iterator[dict[str, Any]]:  # noqa: F811
    if world.sim is None or world.flink is None:
        pytest.skip("needs the stand-in's simulated kubelet and Flink REST backend")
    repo = Repo(tmp_path)
    ns = world.cluster.namespace
    repo.write("apps/counter.yaml", SPEC.format(app=APP, ns=ns, rate=100))
    rev1 = repo.commit("counter at 100/s")
    repo.write("apps/counter.yaml", SPEC.format(app=APP, ns=ns, rate=200))
    rev2 = repo.commit("counter at 200/s")
    assert isinstance(world.clock, SimClock)
    clock = world.clock
    # The fake Flink checkpoints every 2 s instead of 10 s: AwaitHealthy (a checkpoint after the job's start)
    # polls it every 0.2 s of the simulated clock, each poll real requests (as in test_standby_takeover_k8s).
    world.flink.checkpoint_interval_s = 2.0
    alive: dict[str, bool] = {}
    electors: dict[str, LeaseElector] = {}

    def replica(identity: str) -> tuple[Reconciler, LeaseElector, CrashingStore]:
        elector = _elector(world.cluster, identity, clock)
        runtime = KubernetesRuntime(world.cluster.api_client, clock=clock, namespaces=[ns], rest_via="proxy",
                                    poll_interval=world.cluster.poll)
        store = CrashingStore(ConfigMapRecordStore(runtime.kube, runtime.namespaces, fence=lease_fence(elector)))
        state = tmp_path / f"state-{identity}"  # each replica's own, empty, state dir
        source = GitSource(str(repo.origin), state / "git", branch="main")
        rec = Reconciler(source=source, runtime=runtime, journal=Journal(state / "journal", clock, store=store),
                         clock=clock, subdir="apps", leader=elector.is_leader, max_parallel=1)
        alive[identity] = True
        electors[identity] = elector
        last = [float("-inf")]

        # What the election thread does in a live process: renew every retry_period while the process lives.
        def renew() -> None:
            if alive[identity] and clock.monotonic() - last[0] >= elector.retry_period:
                last[0] = clock.monotonic()
                elector.try_acquire_or_renew()

        clock.on_sleep.append(renew)
        return rec, elector, store

    yield {"world": world, "revs": (rev1, rev2), "replica": replica, "alive": alive, "clock": clock,
           "electors": electors, "repo": repo}


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_a_standby_with_an_empty_state_dir_finishes_the_dead_leaders_upgrade(
        replicas: dict[str, Any], crash_at: int) -> None:
    w: World = replicas["world"]
    clock: SimClock = replicas["clock"]
    rev1, rev2 = replicas["revs"]
    assert w.flink is not None
    leader, el_a, store_a = replicas["replica"]("pod-a")
    assert el_a.try_acquire_or_renew()
    leader.source.fetch()
    first = leader.apply(rev1)
    assert first.results[APP].outcome is Outcome.SUCCESS, first.results[APP].message
    old_job = first.results[APP].job_id
    clock.sleep(30)  # it runs and checkpoints

    store_a.crash_at = store_a.writes + crash_at
    try:
        done = leader.apply(rev2)
    except Crash:
        pass
    else:
        assert done.results[APP].outcome is Outcome.SUCCESS
        pytest.fail(f"an upgrade makes fewer than {crash_at} record writes: update CRASH_POINTS")
    replicas["alive"]["pod-a"] = False  # stopped hard: no release, no renewal

    standby, el_b, _ = replicas["replica"]("pod-b")
    assert not el_b.try_acquire_or_renew()  # sees pod-a's lease...
    clock.advance(16)
    assert el_b.try_acquire_or_renew()  # ...and takes it over once it expired on its own clock
    standby.source.fetch()
    in_flight = standby.journal.inflight(APP)  # read from the cluster: this replica has no state dir of its own
    after = standby.apply(rev2)
    assert (APP in after.resumed) == (in_flight is not None)
    outcomes = {**after.resumed, **after.results}
    assert all(res.outcome is Outcome.SUCCESS for res in outcomes.values()), outcomes
    if APP in after.resumed:  # the in-flight upgrade was finished from the record: nothing left to plan
        assert after.plan.app(APP).action is Action.NOOP, after.plan.app(APP).reason
    else:  # the leader died before recording anything of it: the standby plans it anew
        assert after.plan.app(APP).action is Action.UPGRADE, after.plan.app(APP).reason

    # Exactly one job, the new revision's, restored from the one savepoint of the upgrade.
    running = [j for j in w.flink.jobs.values() if j.state == "RUNNING"]
    assert len(running) == 1 and running[0].jid != old_job
    record = standby.journal.record(APP)
    assert record is not None and record.last_applied_revision == rev2
    upgrade_sps = [s.path for s in record.savepoints if s.revision == rev2]
    assert len(upgrade_sps) == 1, f"a second savepoint was triggered: {upgrade_sps}"
    assert running[0].restored_from == upgrade_sps[0]
    assert standby.journal.inflight(APP) is None

    # The deposed leader wakes up believing it still leads, and tries to write: refused.
    el_a._leader, el_a._renewed_at = True, clock.monotonic()
    store_a.crash_at = None
    with pytest.raises(FencedError):
        leader.journal.note(APP, "late", "a write from a deposed leader")


def test_suspend_then_resume_and_delete_then_recreate_on_a_new_replica_restore_their_savepoints(
        replicas: dict[str, Any]) -> None:
    """The record outlives the cluster: a replica with an empty state dir resumes a suspended app from its
    suspend savepoint, and a re-created app from the final savepoint its deletion took."""
    w: World = replicas["world"]
    clock: SimClock = replicas["clock"]
    rev1, _ = replicas["revs"]
    assert w.flink is not None
    repo: Repo = replicas["repo"]
    spec_text = (repo.work / "apps" / "counter.yaml").read_text()

    a, el_a, _ = replicas["replica"]("pod-a")
    assert el_a.try_acquire_or_renew()
    a.source.fetch()
    assert a.apply(rev1).results[APP].outcome is Outcome.SUCCESS
    clock.sleep(30)
    suspend = spec_text.replace("    parallelism: 2\n", "    parallelism: 2\n    state: suspended\n")
    repo.write("apps/counter.yaml", suspend)
    suspended = repo.commit("suspend")
    a.source.fetch()
    res = a.apply(suspended).results[APP]
    assert (res.action, res.outcome) == (Action.SUSPEND, Outcome.SUCCESS), res.message
    suspend_sp = res.savepoints[0]
    assert a.runtime is not None and a.runtime.observe(APP).phase.value == "absent"

    def new_replica(identity: str, previous: LeaseElector) -> Reconciler:
        replicas["alive"][previous.identity] = False
        rec: Reconciler
        rec, el, _ = replicas["replica"](identity)
        el.try_acquire_or_renew()
        clock.advance(16)
        assert el.try_acquire_or_renew()
        rec.source.fetch()
        return rec

    b = new_replica("pod-b", el_a)  # a new pod: empty state dir, the suspend savepoint only in the cluster
    repo.write("apps/counter.yaml", spec_text)
    resumed = repo.commit("resume")
    b.source.fetch()
    res = b.apply(resumed).results[APP]
    assert (res.action, res.outcome, res.restored_from) == (Action.RESUME, Outcome.SUCCESS, suspend_sp), res.message
    assert w.flink.starts[-1][1] == suspend_sp
    clock.sleep(30)

    b.policy = dataclasses.replace(b.policy, prune=True, allow_mass_delete=True)  # its only app: not a mistake
    repo.remove("apps/counter.yaml")
    deleted = repo.commit("delete counter")
    b.source.fetch()
    res = b.apply(deleted).results[APP]
    assert (res.action, res.outcome) == (Action.DELETE, Outcome.SUCCESS), res.message
    final_sp = res.savepoints[0]
    assert w.cluster.kube.get("ConfigMap", w.cluster.namespace, record_name(APP)) is not None  # outlives it

    c = new_replica("pod-c", replicas["electors"]["pod-b"])
    repo.write("apps/counter.yaml", spec_text)
    recreated = repo.commit("re-create counter")
    c.source.fetch()
    res = c.apply(recreated).results[APP]
    assert (res.action, res.outcome, res.restored_from) == (Action.CREATE, Outcome.SUCCESS, final_sp), res.message
    assert w.flink.starts[-1][1] == final_sp
