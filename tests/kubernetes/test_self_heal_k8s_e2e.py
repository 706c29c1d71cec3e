"""Issue 20 on the Kubernetes runtime: routine faults of a running app heal without any Git change.

The reconcile pass of the service layer (`Reconciler`: Git -> observe -> plan -> execute, with the health
tracking the recovery grace period counts from) drives the product's `KubernetesRuntime` against the stand-in
API server; the process node runs the pods as real Flink JVMs and plays the Deployment controller (a deleted pod
is replaced) and the garbage collector (the pods of a deleted Deployment go). The test calls the pass the way
the daemon's drift timer does, and Git never changes after the first commit.

One stateful app with Kubernetes HA (TaskManagers as a Deployment) is shared by the module; the tests run in
order, each injecting one fault and waiting until the app runs exactly one job again and its per-key counts
(the job's own output, on the data claim) went on from where they were, never reset:
- a TaskManager pod deleted: the Deployment controller replaces it and Flink restores the job from its latest
  checkpoint; the reconciler waits (recovering), it repairs nothing;
- the JobManager pod deleted (HA): the new pod recovers the same job from its HA data at the latest checkpoint,
  never from the stale savepoint of its arguments;
- the TaskManager Deployment deleted: nothing would recreate it; a `repair` (kind taskmanager) recreates it for
  the running job, which goes on under its own id;
- the JobManager Deployment deleted: a `repair` (kind jobmanager) starts the same job id again, on the spec that
  ran: Flink recovers it from its HA data at its latest checkpoint. (A new job id would have started from the
  last savepoint on record, the only restore point the reconciler can see on Kubernetes: a silent rewind.)

Without HA a stateful app is refused on Kubernetes (a per-app error, see docs/kubernetes.md), so the case
"JobManager pod deleted without HA" applies to stateless apps only: `test_flink_on_k8s_e2e` shows what the rule
prevents (a stateful job re-run from the stale savepoint of its arguments), and the stateless case here runs
its job again, empty, as its spec allows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action
from reconciler.core.planner import Policy
from reconciler.daemon.metrics import Metrics
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.service.reconcile import PassResult, Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.model import FlinkApp
from tests.fixtures.flink import read_counts, wait_until
from tests.gitutil import Repo
from tests.kubernetes.test_flink_on_k8s_e2e import CLAIM, KEYS, K8sWorld, app_spec, module_world

pytestmark = [pytest.mark.kubernetes, pytest.mark.flink, pytest.mark.slow]

APP = "kheal"
OUT = "out-heal"
REWIND = 80  # a restore from the latest checkpoint (1 s apart) rewinds a count by far less (~25 per key per second)
Obj = dict[str, Any]

world = module_world("k8s-heal", ns_prefix="fr-heal", poll_interval=0.3)


def heal_spec(ns: str) -> FlinkApp:
    """A stateful app as Kubernetes needs it (HA, state on the shared claim), TaskManagers as a Deployment."""
    d = app_spec(ns, name=APP, out=OUT).model_dump(by_alias=True, mode="json", exclude_none=True)
    s = d["spec"]
    s["taskManager"].pop("volumeClaimTemplates")
    s["flinkConfiguration"].pop("process.taskmanager.working-dir")
    s["highAvailability"] = {"enabled": True, "storageDir": "file:///flink-data/ha"}
    s["flinkConfiguration"] |= {
        "high-availability.kubernetes.leader-election.lease-duration": "8 s",
        "high-availability.kubernetes.leader-election.renew-deadline": "6 s",
        "high-availability.kubernetes.leader-election.retry-period": "1 s",
    }
    s["recovery"] = {"gracePeriod": "60s"}
    return FlinkApp.model_validate(d)


@dataclass
class Heal:
    w: K8sWorld
    rec: Reconciler
    rev: str  # the only revision: Git never changes after the first commit
    metrics: Metrics

    def drift(self) -> PassResult:
        """One drift pass, as the daemon's timer runs it (Git unchanged)."""
        res = self.rec.apply(self.rev)
        for ap in res.plan.apps:
            out = res.results.get(ap.app)
            reason = ap.reason if ap.action is not Action.NOOP else ap.reason[:160]
            print(f"pass: {ap.action.value} {reason}" + (f" -> {out.outcome.value} {out.message[:200]}" if out else ""))
        return res

    def job(self) -> str | None:
        rec = self.rec.journal.record(APP)
        return rec.job_id if rec else None

    def jobs(self) -> list[Obj]:
        try:
            return list(self.w.rest("/jobs/overview")["jobs"])
        except Exception:
            return []

    def counts(self) -> dict[str, int]:
        return read_counts(self.w.node.pvc_dir(self.w.ns, CLAIM) / OUT)

    def repairs(self, kind: str, outcome: str = "success") -> float:
        v = self.metrics.registry.get_sample_value("flink_reconciler_repairs_total",
                                                   {"kind": kind, "outcome": outcome})
        return v or 0.0

    def actions(self) -> list[str]:
        return [t.action for t in self.rec.journal.history(APP)]

    def heal_until(self, before: dict[str, int], *, job: str | None = None, timeout: float = 120) -> list[PassResult]:
        """Drift passes until the app runs exactly one job (`job`, when given) with every count past `before`;
        no count may go back by more than one checkpoint's worth meanwhile. The passes run, in order."""
        lowest = dict(before)
        passes = []
        end = time.monotonic() + timeout
        while True:
            passes.append(self.drift())
            c = self.counts()
            for k, v in c.items():
                lowest[k] = min(lowest.get(k, v), v)
            live = [j for j in self.jobs() if j["state"] not in ("CANCELED", "FAILED", "FINISHED")]
            running = [j for j in live if j["state"] == "RUNNING" and j["tasks"]["running"] == j["tasks"]["total"]]
            if len(live) == 1 and running and (job is None or running[0]["jid"] == job) and len(c) == KEYS \
                    and all(c[k] > before.get(k, 0) + 20 for k in c):
                break
            if time.monotonic() > end:
                raise AssertionError(f"not healed after {timeout}s: jobs {live}, counts {c} (before {before}); "
                                     f"last plan: {passes[-1].plan.apps[0].reason}")
            time.sleep(1.0)
        for k, was in before.items():
            assert was - lowest[k] < REWIND, (k, was, lowest[k], "a count went back: state rewound")
        return passes


@pytest.fixture(scope="module")
def heal(world: K8sWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Heal]:
    w = world
    w.runtime = KubernetesRuntime(w.api, clock=SystemClock(), namespaces=[w.ns], rest_via="proxy", poll_interval=0.3)
    w.app, w.out = APP, OUT
    root = tmp_path_factory.mktemp("heal-repo")
    repo = Repo(root)
    repo.write(f"apps/{APP}.yaml", json.dumps(heal_spec(w.ns).canonical(), indent=1))  # JSON is YAML
    rev = repo.commit("the app")
    metrics = Metrics()
    journal = Journal(root / "state" / "journal", SystemClock())
    rec = Reconciler(source=GitSource(str(repo.origin), root / "state" / "git"), runtime=w.runtime, journal=journal,
                     clock=SystemClock(), metrics=metrics, runtime_name="kubernetes",
                     policy=Policy(repair_backoff=timedelta(seconds=1)))
    rec.source.fetch()
    try:
        yield Heal(w, rec, rev, metrics)
    finally:
        journal.close()


def live_pod(w: K8sWorld, component: str) -> Obj:
    pods = [p for p in w.runtime.kube.list("Pod", w.ns, f"{r.app_selector(APP)},{r.LABEL_COMPONENT}={component}")
            if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def test_create(heal: Heal) -> None:
    res = heal.drift()
    assert res.plan.apps[0].action is Action.CREATE, res.plan.apps[0].reason
    assert res.results[APP].outcome is Outcome.SUCCESS, res.results[APP].message
    heal.heal_until({}, job=heal.job())


def test_a_deleted_taskmanager_pod_is_replaced_and_flink_recovers_the_job(heal: Heal) -> None:
    job = heal.job()
    before = heal.counts()
    old = live_pod(heal.w, "taskmanager")["metadata"]["name"]
    heal.w.runtime.kube.delete("Pod", heal.w.ns, old)
    passes = heal.heal_until(before, job=job)
    assert live_pod(heal.w, "taskmanager")["metadata"]["name"] != old
    assert not [p for p in passes if p.results], "the controllers and Flink healed it: nothing was executed"
    assert heal.repairs("taskmanager") == 0


def test_with_ha_a_deleted_jobmanager_pod_recovers_the_same_job_at_its_latest_checkpoint(heal: Heal) -> None:
    job = heal.job()
    assert job is not None
    before = heal.counts()
    old = live_pod(heal.w, "jobmanager")["metadata"]["name"]
    heal.w.runtime.kube.delete("Pod", heal.w.ns, old)
    passes = heal.heal_until(before, job=job)
    assert live_pod(heal.w, "jobmanager")["metadata"]["name"] != old
    assert not [p for p in passes if p.results], "the controllers and Flink's HA healed it: nothing was executed"
    restored = heal.w.restored(job)
    assert restored is not None and "/chk-" in restored["external_path"], restored


def test_a_deleted_taskmanager_deployment_is_recreated_by_a_repair(heal: Heal) -> None:
    job = heal.job()
    before = heal.counts()
    heal.w.runtime.kube.delete("Deployment", heal.w.ns, f"{APP}-taskmanager")
    wait_until(lambda: heal.w.runtime.kube.get("Deployment", heal.w.ns, f"{APP}-taskmanager") is None, timeout=10,
               what="the TaskManager Deployment gone")
    heal.heal_until(before, job=job)
    assert heal.repairs("taskmanager") == 1
    assert "repair" in heal.actions()
    assert heal.job() == job


def test_a_deleted_jobmanager_deployment_restarts_the_same_job_from_its_ha_data(heal: Heal) -> None:
    job = heal.job()
    assert job is not None
    assert heal.rec.journal.record(APP).latest_savepoint is None  # type: ignore[union-attr]
    # No savepoint on record: a new job id would start this app empty (it was created empty), every count at 0.
    before = heal.counts()
    heal.w.runtime.kube.delete("Deployment", heal.w.ns, f"{APP}-jobmanager")
    wait_until(lambda: heal.w.runtime.kube.get("Deployment", heal.w.ns, f"{APP}-jobmanager") is None, timeout=10,
               what="the JobManager Deployment gone")
    heal.heal_until(before, job=job)
    # One repair brings it back; on a loaded machine a pass may still see the new JobManager pod not ready just
    # after it and repeat the (idempotent) EnsureCluster: never more, and never a new job (checked above).
    assert 1 <= heal.repairs("jobmanager") <= 2
    restored = heal.w.restored(job)
    assert restored is not None and "/chk-" in restored["external_path"], restored
