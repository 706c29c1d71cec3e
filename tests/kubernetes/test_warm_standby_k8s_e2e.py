"""Issue 11 item 1 on the Kubernetes runtime, end to end with real Flink on the process node: a TaskManager
memory change moves the job to a warm standby (a session cluster of its own generation, started beside the
running job), the real planner, Executor, journal and KubernetesRuntime against the stand-in API server.

One app for the module (tests run in order, each commits the next revision):
- create: the first cluster, application mode;
- a TaskManager memory change: the plan is warm standby; the counts continue from the savepoint just taken
  (Flink's `latest.restored`), the job runs on the standby's session JobManager (submitted over REST from
  the jar the stage-jar init container put in its upload directory), and every object and pod of the old
  cluster is gone;
- a standby that cannot start (memory Flink refuses) fails before the stop: the old job keeps running and
  the standby's objects are gone;
- the reconciler killed with SIGKILL at "standby ready" and at "promoted": a new executor resumes from the
  journal to exactly one job on exactly one cluster, restored from the savepoint.
The app runs without HA through the e2e module's `NoHaRuleRuntime` (see test_flink_on_k8s_e2e).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action, AppPlan, ClusterStrategy, StartJob
from reconciler.core.planner import Policy
from reconciler.live.flink import FlinkRestClient
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.generations import Pointers
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.kubernetes.status import HA_CONFIGMAP_SELECTOR, ha_configmap_cluster_id
from reconciler.spec.model import FlinkApp
from tests.fixtures.flink import wait_until
from tests.kubernetes.test_flink_on_k8s_e2e import (
    APP,
    CHILD,
    HA_APP,
    K8sWorld,
    app_spec,
    ha_spec,
    module_world,
)

pytestmark = [pytest.mark.kubernetes, pytest.mark.flink, pytest.mark.slow]

WARM = Policy(warm_standby=True)  # what the daemon sets for a StandbyRuntime
Obj = dict[str, Any]


def spec(ns: str, memory: str, *, ha: bool = False) -> FlinkApp:
    d = (ha_spec(ns) if ha else app_spec(ns)).canonical()
    d["spec"]["taskManager"]["resources"]["memory"] = memory
    return FlinkApp.model_validate(d)


world = module_world("k8s-ws", ns_prefix="fr-ws", poll_interval=0.3)


def live_pods(w: K8sWorld) -> list[Obj]:
    return [p for p in w.runtime.kube.list("Pod", w.ns, r.app_selector(w.app))
            if not p["metadata"].get("deletionTimestamp")]


def jobmanager_pods(w: K8sWorld) -> list[str]:
    return [p["metadata"]["name"] for p in live_pods(w) if "jobmanager" in p["metadata"]["labels"][r.LABEL_COMPONENT]]


def generations(w: K8sWorld) -> dict[str, set[str]]:
    """Every cluster generation of the app with objects ("" the first cluster) -> their kind/name."""
    out: dict[str, set[str]] = {}
    for kind in ("Deployment", "StatefulSet", "Service", "Pod"):
        for o in w.runtime.kube.list(kind, w.ns, r.app_selector(w.app)):
            gen = (o["metadata"].get("labels") or {}).get(r.LABEL_GENERATION, "")
            out.setdefault(gen, set()).add(f"{kind}/{o['metadata']['name']}")
    return out


def pointers(w: K8sWorld) -> Pointers:
    return Pointers.of(w.runtime.kube.get("ConfigMap", w.ns, r.object_names(w.app)["root"]))


def jobs(w: K8sWorld) -> list[tuple[str, str]]:
    """(job id, state) of every job on every JobManager of the app that is not finished."""
    w.runtime.observe(w.app)
    out = []
    for gen in generations(w):
        try:
            api = FlinkRestClient(w.runtime._rest_url(w.app, w.ns, gen), client=w.runtime._proxy_client())
            out += [(j.job_id, j.state) for j in api.jobs() if j.state not in ("FINISHED", "CANCELED")]
        except Exception:  # a cluster without a ready JobManager has no jobs to count
            continue
    return sorted(out)


def restored(w: K8sWorld, job_id: str) -> tuple[str, bool] | None:
    w.runtime.observe(w.app)
    st = w.runtime.flink(w.app).checkpoints(job_id)
    return (st.restored_path, bool(st.restored_is_savepoint)) if st.restored_path else None


def assert_one_job_on_one_cluster(w: K8sWorld, job_id: str, gen: str) -> None:
    assert set(generations(w)) == {gen}, generations(w)
    assert pointers(w) == Pointers(live=gen), pointers(w)
    info = w.runtime.observe(w.app)
    assert info.standby_generation is None and not info.retired_cluster, info
    assert jobs(w) == [(job_id, "RUNNING")]


def test_create_runs_the_first_cluster(world: K8sWorld) -> None:
    w = world
    rev = w.next_revision()
    ap = w.plan(rev, {APP: app_spec(w.ns)}, WARM)
    assert ap.action is Action.CREATE, ap.reason
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    w.growing_from({}, "the counts of the new job")
    assert set(generations(w)) == {""}


def test_a_taskmanager_memory_change_moves_the_job_to_a_warm_standby(world: K8sWorld) -> None:
    w = world
    rev = w.next_revision()
    ap = w.plan(rev, {APP: spec(w.ns, "1344m")}, WARM)
    assert ap.action is Action.UPGRADE and ap.cluster_strategy is ClusterStrategy.WARM_STANDBY, ap.reason
    gen = ap.steps[0].generation  # type: ignore[union-attr]
    before = w.counts()
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.job_id is not None and res.savepoint is not None
    assert wait_until(lambda: restored(w, res.job_id or ""), timeout=30, what="restore record") == (res.savepoint, True)
    # The old cluster (application mode) is gone, objects and pods; the job runs on the session JobManager.
    assert_one_job_on_one_cluster(w, res.job_id, gen)
    assert w.runtime.kube.get("Deployment", w.ns, f"{APP}-jobmanager") is None
    jm = w.runtime.kube.get("Deployment", w.ns, r.object_names(APP, gen)["jobmanager"])
    assert jm is not None and jm["spec"]["template"]["spec"]["containers"][0]["args"][0] == "jobmanager"
    timings = dict(res.step_timings)
    downtime = sum(timings[s] for s in ("StopWithSavepoint", "PromoteStandby", "StartJob", "AwaitRunning"))
    print(f"warm standby: standby start {timings['StartStandbyCluster']:.2f}s, downtime window {downtime:.2f}s")
    # The cluster start is outside the downtime window: the standby was ready before the stop.
    assert timings["StartStandbyCluster"] > downtime, timings
    after = w.growing_from(before, "counts continuing on the standby")
    assert all(after[k] > before[k] for k in before)


def test_a_standby_that_cannot_start_leaves_the_old_job_running(world: K8sWorld) -> None:
    w = world
    job = w.journal.records().apps[APP].job_id
    live = pointers(w).live
    rev = w.next_revision()
    ap = w.plan(rev, {APP: spec(w.ns, "300m")}, WARM)  # below Flink's fixed JVM overhead + metaspace
    assert ap.cluster_strategy is ClusterStrategy.WARM_STANDBY, ap.reason
    res = w.run(rev, ap)
    assert res.outcome is Outcome.FAILURE and not res.rolled_back, res.message
    assert res.failed_step is not None and "standby" in res.failed_step, res.failed_step
    assert "failed to start" in (res.message or ""), res.message
    assert job is not None
    assert_one_job_on_one_cluster(w, job, live)
    w.growing_from(w.counts(), "the old job still counting")


def kill_at(w: K8sWorld, ap: AppPlan, rev: str, step: int) -> None:
    """Run the plan in a child process (a reconciler) and SIGKILL it once step `step` is done."""
    plan_file = w.state / "plan.json"
    plan_file.write_text(json.dumps({"revision": rev, "plan": ap.model_dump(mode="json"), "ns": w.ns,
                                     "host": w.runtime.kube.host, "journal": str(w.journal.path)}))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(plan_file)], cwd=Path(__file__).parents[2],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 90
        while True:
            w.journal.refresh()
            f = w.journal.inflight(APP)
            if f is not None and f.stage.value == "forward" and (f.step_index > step or (
                    f.step_index == step and f.phase.value == "done")):
                break
            assert child.poll() is None, child.communicate()[0].decode(errors="replace")
            assert time.monotonic() < end, "the moment never came"
            time.sleep(0.005)
    finally:
        child.send_signal(signal.SIGKILL)
        out = child.communicate(timeout=10)[0].decode(errors="replace")
    assert child.returncode == -signal.SIGKILL, out
    # The child may have journaled once more between our last read and the SIGKILL: read the record as a
    # new process would (acting on the cached version is what the store's fencing refuses).
    w.journal.refresh()


@pytest.mark.parametrize(("moment", "step", "memory"), [("standby-ready", 0, "1408m"), ("promoted", 2, "1472m")])
def test_a_reconciler_killed_during_a_warm_standby_resumes_to_one_job_on_one_cluster(
        world: K8sWorld, moment: str, step: int, memory: str) -> None:
    w = world
    rev = w.next_revision()
    ap = w.plan(rev, {APP: spec(w.ns, memory)}, WARM)
    assert ap.cluster_strategy is ClusterStrategy.WARM_STANDBY, ap.reason
    gen = ap.steps[0].generation  # type: ignore[union-attr]
    before = w.counts()
    kill_at(w, ap, rev, step)
    assert len([g for g in generations(w) if any(n.startswith("Pod/") for n in generations(w)[g])]) == 2, \
        f"killed at {moment}: the standby (or the promoted one) beside the old cluster: {generations(w)}"
    res = w.executor().resume(APP)
    assert res is not None and res.outcome is Outcome.SUCCESS, res and res.message
    assert res.job_id is not None and res.savepoint is not None
    assert_one_job_on_one_cluster(w, res.job_id, gen)
    assert restored(w, res.job_id) == (res.savepoint, True)
    w.growing_from(before, f"counts continuing after the resume ({moment})")


def test_an_args_only_upgrade_on_the_session_cluster_submits_the_new_job_to_the_same_jobmanager(
        world: K8sWorld) -> None:
    """After a warm standby the live cluster is a session cluster: a job-only change stops the job with a
    savepoint and submits the new one over REST to the same JobManager (no pod restarts)."""
    w = world
    live = pointers(w).live
    jm_pods = sorted(p["metadata"]["name"] for p in live_pods(w))
    rev = w.next_revision()
    d = spec(w.ns, "1472m").canonical()
    d["spec"]["job"]["args"] = ["--output-dir", "/flink-data/out", "--keys", "4", "--rate", "130"]
    ap = w.plan(rev, {APP: FlinkApp.model_validate(d)}, WARM)
    assert ap.action is Action.UPGRADE and ap.cluster_strategy is ClusterStrategy.JOB_ONLY, ap.reason
    before = w.counts()
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.job_id is not None and res.savepoint is not None
    assert_one_job_on_one_cluster(w, res.job_id, live)
    assert restored(w, res.job_id) == (res.savepoint, True)
    assert sorted(p["metadata"]["name"] for p in live_pods(w)) == jm_pods, "no pod was replaced"
    w.growing_from(before, "counts continuing after the args-only upgrade")


def test_a_new_job_that_fails_on_the_standby_is_rolled_back_onto_the_old_cluster(world: K8sWorld) -> None:
    """After the stop and the promotion the new job cannot start (its entry class does not exist): the standby
    is discarded, the old cluster is live again and the previous job restarts there from the savepoint."""
    w = world
    live = pointers(w).live
    before = w.counts()
    rev = w.next_revision()
    d = spec(w.ns, "1536m").canonical()
    d["spec"]["job"]["args"] = ["--output-dir", "/flink-data/out", "--keys", "4", "--rate", "130"]
    d["spec"]["job"]["entryClass"] = "io.flinkreconciler.examples.NoSuchJob"
    ap = w.plan(rev, {APP: FlinkApp.model_validate(d)}, WARM)
    assert ap.cluster_strategy is ClusterStrategy.WARM_STANDBY, ap.reason
    res = w.run(rev, ap)
    assert res.outcome is Outcome.FAILURE and res.rolled_back, res.message
    assert res.failed_step is not None and "start job" in res.failed_step, res.failed_step
    job = w.journal.records().apps[APP].job_id
    assert job is not None and job == next(s.job_id for s in ap.rollback if isinstance(s, StartJob))
    assert_one_job_on_one_cluster(w, job, live)
    assert restored(w, job) == (res.savepoint, True)
    w.growing_from(before, "counts continuing on the old cluster after the rollback")

def test_with_ha_the_session_cluster_recovers_its_job_when_its_jobmanager_pod_is_replaced(world: K8sWorld) -> None:
    """The HA-required rule on (the product's runtime): a warm standby moves the HA app to a session cluster with
    its own HA identity (`<app>.g<generation>`); the first cluster's HA data goes with it. Then the session
    JobManager pod is deleted: the new one recovers the job submitted over REST from its HA data (same job id)
    and restores the latest checkpoint."""
    w = world
    w.runtime = KubernetesRuntime(w.api, clock=SystemClock(), namespaces=[w.ns], rest_via="proxy", poll_interval=0.3)
    w.app, w.out = HA_APP, "out-ha"
    rev = w.next_revision()
    ap = w.plan(rev, {HA_APP: spec(w.ns, "1280m", ha=True)}, WARM)
    assert ap.action is Action.CREATE, ap.reason
    assert w.run(rev, ap).outcome is Outcome.SUCCESS
    before = w.growing_from({}, "counts of the HA app")

    rev = w.next_revision()
    ap = w.plan(rev, {HA_APP: spec(w.ns, "1344m", ha=True)}, WARM)
    assert ap.cluster_strategy is ClusterStrategy.WARM_STANDBY, ap.reason
    gen = ap.steps[0].generation  # type: ignore[union-attr]
    res = w.run(rev, ap)
    assert res.outcome is Outcome.SUCCESS, res.message
    job = res.job_id
    assert job is not None and restored(w, job) == (res.savepoint, True)
    assert_one_job_on_one_cluster(w, job, gen)
    cid = r.ha_cluster_id(HA_APP, None, gen)
    ha = {c["metadata"]["name"] for c in w.runtime.kube.list("ConfigMap", w.ns, HA_CONFIGMAP_SELECTOR)
          if ha_configmap_cluster_id(HA_APP, c) is not None}
    assert ha == {f"{cid}-cluster-config-map", f"{cid}-{job}-config-map"}, ha
    before = w.growing_from(before, "counts continuing on the HA session cluster")

    wait_until(lambda: "/chk-" in (w.runtime.flink(HA_APP).checkpoints(job).latest_completed_path or ""),
               timeout=30, what="a checkpoint of the job on the session cluster")
    [old] = jobmanager_pods(w)
    w.runtime.kube.delete("Pod", w.ns, old)

    def recovered() -> tuple[str, bool] | None:
        # Until the node has stopped the old pod's processes and removed it, its JobManager may still answer
        # through the Service: only the new one's answer counts.
        if jobmanager_pods(w) in ([], [old]) or w.runtime.kube.get("Pod", w.ns, old) is not None:
            return None
        try:
            return restored(w, job) if jobs(w) == [(job, "RUNNING")] else None
        except Exception:  # the new JobManager's REST API is not up yet
            return None
    path, is_savepoint = wait_until(recovered, timeout=120, what="the job recovered by the new session JobManager")
    assert not is_savepoint and "/chk-" in path, path
    w.growing_from(before, "counts continuing after the session JobManager pod was replaced")
    w.runtime.delete_cluster(HA_APP, deadline=SystemClock().monotonic() + 90)
    assert generations(w) == {} and w.runtime.kube.list("ConfigMap", w.ns, HA_CONFIGMAP_SELECTOR) == []
