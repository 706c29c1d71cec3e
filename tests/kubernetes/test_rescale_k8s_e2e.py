"""In-place rescale (`spec.upgrade.inPlaceRescale`, issue 11 item 2) on the Kubernetes runtime, end to end with
real Flink: the real planner, Executor, journal and KubernetesRuntime against the stand-in API server, the
process node running the pods (the world of test_flink_on_k8s_e2e, reused).

One app for the module (tests run in order): the counter job with Flink's adaptive scheduler, a short
cooldown after rescaling, checkpointing every 1 s, 1 TaskManager with 2 slots, no HA (`NoHaRuleRuntime`).
- create at parallelism 1;
- parallelism 1 -> 2: planned `scale` with RescaleInPlace first (the savepoint upgrade after it is its
  fallback). After the executor ran it: the same job is the only job of the JobManager, RUNNING every task (one
  source subtask finished: the counter's generator has one split per subtask it started with), its vertices
  at parallelism 2 (`GET /jobs/<id>`, through the API server's service proxy like every REST call here),
  restored from its own checkpoint (`latest.restored`, not a savepoint), no savepoint taken (Flink's
  `latest.savepoint`, the savepoint directory, the record), the JobManager and TaskManager pods neither
  replaced nor restarted, and the job's own output (per-key counts on the data claim) going on from where it
  was, never from zero;
- the record says parallelism 2 was applied with the same job id, and the same spec plans a no-op;
- the cluster's objects carry the new spec (config.yaml, the root's spec hash), and a TaskManager scale
  after the rescale keeps every running pod.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from reconciler.core.observed import Outcome
from reconciler.core.plan import Action, RescaleInPlace
from reconciler.live.kubernetes import render as r
from reconciler.spec.model import FlinkApp
from tests.fixtures.flink import wait_until
from tests.kubernetes.test_flink_on_k8s_e2e import APP, CLAIM, KEYS, K8sWorld, app_spec, module_world
from tests.kubernetes.test_warm_standby_k8s_e2e import live_pods

pytestmark = [pytest.mark.kubernetes, pytest.mark.flink, pytest.mark.slow]

COOLDOWN = "2 s"  # the adaptive scheduler's cooldown after the job's last (re)start (Flink's default: 30 s)
REWIND = 80  # a restore from the latest checkpoint (1 s) rewinds a count by far less (~25 per key per second)
Obj = dict[str, Any]


def spec(ns: str, parallelism: int) -> FlinkApp:
    d = app_spec(ns).canonical()
    d["spec"]["job"]["parallelism"] = parallelism
    d["spec"]["flinkConfiguration"].update({
        "jobmanager.scheduler": "adaptive",
        "jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling": COOLDOWN})
    d["spec"]["upgrade"]["inPlaceRescale"] = True
    d["spec"]["deadlines"]["rescale"] = "60s"
    return FlinkApp.model_validate(d)


world = module_world("k8s-rescale", ns_prefix="fr-rs", poll_interval=0.3)


def pods(w: K8sWorld) -> dict[str, tuple[str, str, list[int]]]:
    """Every live pod of the app: name -> (component, uid, restart count of each container)."""
    return {p["metadata"]["name"]: (p["metadata"]["labels"][r.LABEL_COMPONENT], p["metadata"]["uid"],
                                    [c["restartCount"] for c in (p.get("status") or {}).get("containerStatuses") or []])
            for p in live_pods(w)}


def parallelisms(w: K8sWorld, job_id: str) -> list[int]:
    return [int(v["parallelism"]) for v in w.rest(f"/jobs/{job_id}")["vertices"]]


def savepoint_dirs(w: K8sWorld) -> set[str]:
    d = w.node.pvc_dir(w.ns, CLAIM) / "savepoints"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


@contextlib.contextmanager
def lowest_counts(w: K8sWorld) -> Iterator[dict[str, int]]:
    """The lowest count of each key seen while the block runs (sampled every 50 ms)."""
    lowest: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for k, v in w.counts().items():
                lowest[k] = min(lowest.get(k, v), v)
            stop.wait(0.05)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield lowest
    finally:
        stop.set()
        t.join(5)


def test_create_at_parallelism_1(world: K8sWorld) -> None:
    w = world
    rev = w.next_revision()
    ap = w.plan(rev, {APP: spec(w.ns, 1)})
    assert ap.action is Action.CREATE, ap.reason
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.job_id is not None and w.job_state(res.job_id) == "RUNNING"
    assert set(parallelisms(w, res.job_id)) == {1}
    # Enough counted that a restart from empty state could not pass for a rewind to the last checkpoint.
    wait_until(lambda: len(c := w.counts()) == KEYS and min(c.values()) > 2 * REWIND, timeout=60,
               what="the counts of the new job")
    assert sorted(c for c, _, _ in pods(w).values()) == ["jobmanager", "taskmanager"]


def test_parallelism_1_to_2_rescales_the_same_job_in_place(world: K8sWorld) -> None:
    w = world
    job = w.journal.records().apps[APP].job_id
    assert job is not None
    pods_before, savepoints_before = pods(w), savepoint_dirs(w)
    rev = w.next_revision()
    ap = w.plan(rev, {APP: spec(w.ns, 2)})
    assert ap.action is Action.SCALE, ap.reason
    first = ap.steps[0]
    assert isinstance(first, RescaleInPlace), ap.steps
    assert (first.job_id, first.previous_parallelism, first.parallelism) == (job, 1, 2)
    assert ap.steps[1].type == "StopWithSavepoint", "the savepoint upgrade follows as the fallback"
    before = w.counts()

    with lowest_counts(w) as lowest:
        res = w.run(rev, ap)
        assert res.outcome is Outcome.SUCCESS, res.message
        assert [s for s, _ in res.step_timings] == ["RescaleInPlace"], "the fallback steps did not run"
        assert res.job_id == job and res.savepoint is None
        after = w.growing_from(before, "the counts going on after the rescale")

    # Flink: the same job is the only one, RUNNING every task at the new parallelism (or finished: the counter's
    # generator source has as many splits as the job had subtasks at its start, so a subtask added without one
    # ends at once, as the executor's job_phase allows since FLIP-147).
    [only] = w.rest("/jobs/overview")["jobs"]
    assert (only["jid"], only["state"]) == (job, "RUNNING"), only
    tasks = only["tasks"]
    assert tasks["running"] > 0 and tasks["running"] + tasks["finished"] == tasks["total"], tasks
    assert set(parallelisms(w, job)) == {2}
    # It restarted its tasks from its own checkpoint; no savepoint was taken.
    stats = w.rest(f"/jobs/{job}/checkpoints")
    restored = stats["latest"]["restored"]
    assert restored is not None and restored["is_savepoint"] is False, restored
    assert f"/{job}/chk-" in restored["external_path"], restored
    assert "savepoint" in stats["latest"] and stats["latest"]["savepoint"] is None, stats["latest"]
    assert savepoint_dirs(w) == savepoints_before
    # Kubernetes: no pod replaced (same names and uids) or restarted (same restart counts).
    assert pods(w) == pods_before
    # The job's own output: every key went on from where it was, at most a checkpoint interval back.
    assert set(lowest) == set(before), (lowest, before)
    assert all(before[k] - lowest[k] < REWIND for k in before), (before, lowest)
    assert all(after[k] > before[k] for k in before)


def test_the_record_says_parallelism_2_and_the_same_spec_plans_nothing(world: K8sWorld) -> None:
    w = world
    w.journal.refresh()
    rec = w.journal.records().apps[APP]
    last = w.journal.lineage(APP)[-1]
    assert (last.action, last.outcome, last.job_id, last.restored_from, last.savepoints) == (
        "scale", Outcome.SUCCESS, rec.job_id, None, ())
    assert rec.last_applied_revision == last.revision and rec.last_outcome is Outcome.SUCCESS
    assert rec.last_applied_spec is not None and rec.last_applied_spec["spec"]["job"]["parallelism"] == 2
    assert not [sp for sp in rec.savepoints if sp.revision == last.revision]
    assert not [t for t in w.journal.history(APP) if t.action == "fallback"]

    rev = w.next_revision()
    ap = w.plan(rev, {APP: spec(w.ns, 2)})
    assert ap.action is Action.NOOP and not ap.steps, ap.reason
    assert rec.job_id is not None and set(parallelisms(w, rec.job_id)) == {2}


def test_a_taskmanager_replicas_change_after_the_rescale_keeps_the_running_pods(world: K8sWorld) -> None:
    """The rescale brought the cluster's objects to the new spec (config.yaml's parallelism, the root's spec hash
    that first sight adopts when the records are lost) without rolling a pod; so does the next EnsureCluster
    (here a `scale` of the TaskManagers): the job's default parallelism is not part of the pods' config hash
    (it was, and the TaskManager running the job was replaced)."""
    w = world
    job = w.journal.records().apps[APP].job_id
    assert job is not None
    config = w.runtime.kube.get("ConfigMap", w.ns, r.object_names(APP)["config"])
    assert config is not None and 'parallelism.default: "2"' in config["data"]["config.yaml"]
    root = w.runtime.kube.get("ConfigMap", w.ns, r.object_names(APP)["root"])
    assert root is not None and root["metadata"]["annotations"][r.ANNOTATION_SPEC_HASH] == spec(w.ns, 2).spec_hash
    pods_before = pods(w)
    d = spec(w.ns, 2).canonical()
    d["spec"]["taskManager"]["replicas"] = 2
    rev = w.next_revision()
    ap = w.plan(rev, {APP: FlinkApp.model_validate(d)})
    assert ap.action is Action.SCALE and [s.type for s in ap.steps] == ["EnsureCluster"], ap.reason
    before = w.counts()
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    config = w.runtime.kube.get("ConfigMap", w.ns, r.object_names(APP)["config"])
    assert config is not None and 'parallelism.default: "2"' in config["data"]["config.yaml"]
    now = pods(w)
    assert {n: p for n, p in now.items() if n in pods_before} == pods_before, "a running pod was replaced"
    assert sorted(c for c, _, _ in now.values()) == ["jobmanager", "taskmanager", "taskmanager"]
    [only] = w.rest("/jobs/overview")["jobs"]
    assert (only["jid"], only["state"]) == (job, "RUNNING"), only
    after = w.growing_from(before, "the counts going on after the TaskManager scale")
    assert all(after[k] > before[k] for k in before)
