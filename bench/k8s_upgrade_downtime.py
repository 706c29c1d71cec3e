"""Upgrade downtime on the kubernetes runtime (the test process node) next to the local runtime: same
counter job, same spec values, same run, upgrades alternating K, L, K, L ... so machine load hits both alike.

- local: LocalRuntime, a Flink session cluster on this host; an upgrade stops the job with a savepoint
  and submits the new one to the same JobManager.
- kubernetes: KubernetesRuntime against the stand-in API server with tests/kubernetes/process_node.py
  running the pods (real Flink JVMs); an upgrade stops the job with a savepoint, then replaces the
  JobManager Deployment (application mode: the new pod runs the new job with --fromSavepoint) and, at the
  same time, the TaskManagers of the StatefulSet (they roll with each job generation; kept TaskManagers
  waited for their heartbeat to the old JobManager to time out). The app runs without HA (NoHaRuleRuntime of
  tests/kubernetes/test_flink_on_k8s_e2e.py) and with Flink's default heartbeats (`heartbeat.interval`
  10 s, `heartbeat.timeout` 50 s), as a user's app would; `--heartbeat-timeout 10s` sets the e2e
  module's values instead.

Each upgrade is the real planner + Executor (a job-argument change, upgradeMode savepoint). Measured from
the executor's step timings: downtime = StopWithSavepoint + EnsureCluster + StartJob + AwaitRunning
(stop request -> every task of the new job running), and each step apart.

    sudo .venv/bin/python bench/k8s_upgrade_downtime.py [--cycles 3] [--json out.json]

`--standby` measures the kubernetes runtime alone, issue 11's comparison: an args-only upgrade, a TaskManager
memory change by warm standby (a session cluster of the new spec started beside the running job, the job
moved once it is ready) and the same change cold (`spec.upgrade.clusterStrategy: cold`), in turns. The first
args-only upgrade runs on the first cluster (application mode: a new JobManager and TaskManagers per job);
every later upgrade on a session cluster a warm standby left (the job is submitted over REST). Downtime of a
warm standby = StopWithSavepoint + PromoteStandby + StartJob + AwaitRunning (its cluster start,
StartStandbyCluster, runs while the old job still runs and is reported apart).

With `--rescale` the same app, in the same run, also gets a `rescale` round: job.parallelism 2 -> 1 -> 2 ... in place
(`spec.upgrade.inPlaceRescale`, RescaleInPlace: the same job, restarted by Flink's adaptive scheduler from its
own latest checkpoint), right after each warm standby, so each args-only upgrade on the session cluster follows
a rescale (whose last act applied the new parallelism to the cluster's config, keeping every pod). For that the
app runs with `jobmanager.scheduler: adaptive` (a cooldown after rescaling of `--cooldown`, default 2 s) for
every kind. A rescale has no stop and no new job, so its step timings say nothing about downtime (RescaleInPlace
also waits out the cooldown and a checkpoint after the rescale, while the job runs): every kind is also measured
by an observer thread that polls GET /jobs/overview of the app's live cluster (the root's live pointer, re-read
after every miss) through the API server's service proxy every `--observe-poll` s (default 0.05). "not running"
is the longest stretch inside the change from the first sample in which no job of the app ran every task
(RUNNING, every task running or finished, as the executor's job_phase; an error answer counts as not running, a
timeout is left out) to the next sample in which one did: downtime as the script sees it, to about one poll
interval plus a proxied request.

    sudo .venv/bin/python bench/k8s_upgrade_downtime.py --standby [--rescale] [--cycles 3]

Needs root (the process node's mount namespaces), Java 17, javac and apache-flink-libraries. Prints one
JSON line per upgrade, then a JSON summary and a Markdown table of medians. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from kubernetes import client as k8s_client  # noqa: E402

from bench.cluster_upgrade_bench import longest_not_running  # noqa: E402
from reconciler.apply.executor import AppResult, Executor  # noqa: E402
from reconciler.apply.journal import Journal  # noqa: E402
from reconciler.apply.rescale import RescaleApi  # noqa: E402
from reconciler.clock import SystemClock  # noqa: E402
from reconciler.core.observed import JobPhase, Outcome, job_phase  # noqa: E402
from reconciler.core.plan import Action  # noqa: E402
from reconciler.core.planner import Desired, PlanInput, Policy, plan  # noqa: E402
from reconciler.live.kubernetes import render as k8s_render  # noqa: E402
from reconciler.live.kubernetes.generations import Pointers  # noqa: E402
from reconciler.live.local.config import find_flink_home  # noqa: E402
from reconciler.live.local.runtime import LocalRuntime  # noqa: E402
from reconciler.live.observe import observe  # noqa: E402
from reconciler.live.ports import Runtime  # noqa: E402
from reconciler.spec.model import FlinkApp  # noqa: E402
from tests.fixtures.flink import COUNTER_DIR, counter_app  # noqa: E402
from tests.kubernetes.process_node import Image, ProcessNode, needs_root_reason  # noqa: E402
from tests.kubernetes.standin import Standin  # noqa: E402
from tests.kubernetes.test_flink_on_k8s_e2e import APP, CLAIM, IMAGE, NoHaRuleRuntime, app_spec  # noqa: E402

STEPS = ("StopWithSavepoint", "EnsureCluster", "StartJob", "AwaitRunning")
STANDBY_STEPS = ("StopWithSavepoint", "EnsureCluster", "PromoteStandby", "StartJob", "AwaitRunning")
APART = ("StartStandbyCluster", "RescaleInPlace")  # outside the downtime: the old (or same) job runs meanwhile


class Driver:
    """One runtime, one app, one journal: create once, then upgrade on demand."""

    def __init__(self, name: str, runtime: Runtime, journal: Journal, spec: Callable[[int], FlinkApp],
                 jar: Path | None, policy: Policy | None = None) -> None:
        self.name, self.runtime, self.journal, self.spec, self.jar = name, runtime, journal, spec, jar
        self.policy = policy or Policy()
        self.rev = 0

    def step(self, rate: int, desired: FlinkApp | None = None) -> AppResult:
        self.rev += 1
        revision = f"{self.rev:040x}"
        desired = desired or self.spec(rate)
        records = self.journal.records()
        previous = {n: FlinkApp.model_validate(r.last_applied_spec) for n, r in records.apps.items()
                    if r.last_applied_spec}
        names = {desired.name} | set(previous)
        p = plan(PlanInput(revision=revision, desired=Desired(apps={desired.name: desired}), previous=previous,
                           previous_sources={}, live=observe(self.runtime, names), records=records,
                           now=SystemClock().now(), policy=self.policy), only=[desired.name])
        ap = p.apps[0]
        if ap.action not in (Action.CREATE, Action.UPGRADE, Action.SCALE):
            raise SystemExit(f"{self.name}: unexpected plan {ap.action}: {ap.reason}")
        ex = Executor(self.runtime, self.journal, SystemClock(), resolve_jar=lambda a: self.jar, poll_interval=0.2)
        res = ex.run_app(revision, ap)
        if res.outcome is not Outcome.SUCCESS:
            raise SystemExit(f"{self.name}: {ap.action.value} failed: {res.message}")
        return res


def k8s_spec(ns: str, rate: int, heartbeat_timeout: str | None) -> FlinkApp:
    """The e2e module's app; with Flink's default heartbeats unless `heartbeat_timeout` is given."""
    doc = app_spec(ns, rate=rate).model_dump(by_alias=True, mode="json")
    conf = doc["spec"]["flinkConfiguration"]
    doc["spec"]["deadlines"]["start"] = "120s"  # the e2e module's 30 s is shorter than a default heartbeat
    if heartbeat_timeout:
        conf["heartbeat.timeout"] = heartbeat_timeout
    else:
        conf.pop("heartbeat.interval", None)
        conf.pop("heartbeat.timeout", None)
    return FlinkApp.model_validate(doc)


def with_memory(app: FlinkApp, memory: str, strategy: str) -> FlinkApp:
    doc = app.model_dump(by_alias=True, mode="json")
    doc["spec"]["taskManager"]["resources"]["memory"] = memory
    doc["spec"].setdefault("upgrade", {})["clusterStrategy"] = strategy
    return FlinkApp.model_validate(doc)


def adaptive(app: FlinkApp, cooldown: str, parallelism: int) -> FlinkApp:
    """The app with the adaptive scheduler and in-place rescale on, at `parallelism` (1 or 2: 2 slots)."""
    doc = app.model_dump(by_alias=True, mode="json")
    doc["spec"]["flinkConfiguration"].update({
        "jobmanager.scheduler": "adaptive",
        "jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling": cooldown})
    doc["spec"].setdefault("upgrade", {})["inPlaceRescale"] = True
    doc["spec"]["job"]["parallelism"] = parallelism
    return FlinkApp.model_validate(doc)


class JobWatch:
    """An observer thread: every `interval` s, GET /jobs/overview of the app's live cluster through the API
    server's service proxy (its own HTTP client; the live cluster from the root's pointer, read again after every
    sample without a running job and every second), kept as (monotonic time, some job runs every task)."""

    def __init__(self, host: str, ns: str, interval: float) -> None:
        self.host, self.ns, self.interval = host, ns, interval
        self.samples: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="job-watch", daemon=True)

    def __enter__(self) -> JobWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _overview_url(self, client: httpx.Client) -> str:
        root = client.get(f"{self.host}/api/v1/namespaces/{self.ns}/configmaps/{k8s_render.object_names(APP)['root']}")
        gen = Pointers.of(root.json() if root.status_code == 200 else None).live
        svc = f"{k8s_render.object_names(APP, gen)['rest']}:{k8s_render.REST_PORT}"
        return f"{self.host}/api/v1/namespaces/{self.ns}/services/{svc}/proxy/jobs/overview"

    def _loop(self) -> None:
        with httpx.Client(timeout=2, headers={"Authorization": "Bearer stand-in-token"}) as client:
            url, resolved, ok = "", 0.0, False
            while not self._stop.is_set():
                try:
                    if not ok or time.monotonic() - resolved > 1.0:
                        url, resolved = self._overview_url(client), time.monotonic()
                    resp = client.get(url)
                    # Every task running or finished (the executor's job_phase: a source subtask without a split
                    # ends at once). An error answer (no endpoints: the JobManager is not ready) runs nothing.
                    ok = resp.status_code == 200 and any(
                        job_phase(j["state"], int(j["tasks"]["running"]), int(j["tasks"]["total"]),
                                  int(j["tasks"]["finished"])) is JobPhase.RUNNING
                        for j in resp.json()["jobs"])
                except httpx.TimeoutException:  # no answer in 2 s (a loaded machine): unknown, no sample
                    ok = False
                    self._stop.wait(self.interval)
                    continue
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    ok = False
                self.samples.append((time.monotonic(), ok))
                self._stop.wait(self.interval)

    def not_running(self, t0: float, t1: float) -> float:
        return longest_not_running(self.samples, t0, t1)


def standby_row(kind: str, cycle: int, res: AppResult, not_running: float) -> dict[str, Any]:
    t = dict(res.step_timings)
    out: dict[str, Any] = {"upgrade": kind, "cycle": cycle,
                           **{s: round(t.get(s, 0.0), 3) for s in (*STANDBY_STEPS, *APART)}}
    # Downtime by the step timings: the steps from the stop to every task of the new job running. A rescale has
    # none of them (no stop, no new job): its downtime is only what the observer saw.
    out["downtime"] = round(sum(t.get(s, 0.0) for s in STANDBY_STEPS), 3) if "RescaleInPlace" not in t else None
    out["not_running"] = round(not_running, 3)
    return out


def standby_markdown(rows: list[dict[str, Any]]) -> str:
    cols = (*STANDBY_STEPS, *APART)
    lines = ["| upgrade | runs | downtime by steps (median s) | not running, observed (median s) | "
             + " | ".join(cols) + " |", "|---|---:|---:|---:|" + "---:|" * len(cols)]
    for kind in dict.fromkeys(r["upgrade"] for r in rows):
        mine = [r for r in rows if r["upgrade"] == kind]
        med = {k: statistics.median(r[k] for r in mine) for k in ("not_running", *cols)}
        steps = [r["downtime"] for r in mine if r["downtime"] is not None]
        by_steps = f"{statistics.median(steps):.2f}" if steps else "-"
        lines.append(f"| {kind} | {len(mine)} | {by_steps} | {med['not_running']:.2f} | "
                     + " | ".join(f"{med[c]:.2f}" for c in cols) + " |")
    return "\n".join(lines)


def run_standby(args: argparse.Namespace, tmp: Path, flink_home: Path, usrlib: Path) -> list[dict[str, Any]]:
    """The kubernetes runtime alone: args-only vs TaskManager memory by warm standby vs cold, in turns."""
    rows: list[dict[str, Any]] = []
    with Standin() as standin, Journal(tmp / "k8s" / "journal.sqlite", SystemClock()) as kj:
        standin.set_auto_ready(False)
        cfg = k8s_client.Configuration()
        cfg.host = standin.url
        cfg.api_key["BearerToken"] = "Bearer stand-in-token"
        ns = "bench"
        rt = NoHaRuleRuntime(k8s_client.ApiClient(cfg), clock=SystemClock(), namespaces=[ns], rest_via="proxy",
                             poll_interval=0.2)
        rt.kube.request("POST", f"/api/v1/namespaces/{ns}/persistentvolumeclaims", body={
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
        with ProcessNode(k8s_client.ApiClient(cfg), namespaces=[ns], workdir=tmp / "node", flink_home=flink_home,
                         images={IMAGE: Image(flink=True, usrlib=usrlib)}, backoff_base_s=2.0):
            rate, memory, parallelism = 100, 1280, 2

            def spec(rate: int) -> FlinkApp:
                base = k8s_spec(ns, rate, args.heartbeat_timeout)
                return adaptive(base, args.cooldown, parallelism) if args.rescale else base

            d = Driver("kubernetes", rt, kj, spec, None, policy=Policy(warm_standby=True))
            try:
                created = d.step(rate)  # create (not measured)
                job = created.job_id

                def upgrade(kind: str, cycle: int) -> None:
                    nonlocal rate, memory, parallelism, job
                    if kind.startswith("args-only"):
                        rate += 1
                        desired = with_memory(d.spec(rate), f"{memory}m", "warmStandby")
                    elif kind.startswith("rescale"):
                        parallelism = 3 - parallelism
                        desired = with_memory(d.spec(rate), f"{memory}m", "warmStandby")
                    else:
                        memory += 64
                        desired = with_memory(d.spec(rate), f"{memory}m",
                                              "cold" if kind.endswith("cold") else "warmStandby")
                    t0 = time.monotonic()
                    res = d.step(rate, desired)
                    t1 = time.monotonic()
                    if kind.startswith("rescale"):
                        check_rescaled(rt, res, job, parallelism)
                    row = standby_row(kind, cycle, res, watch.not_running(t0, t1))
                    job = res.job_id
                    rows.append(row)
                    print(json.dumps(row), flush=True)

                with JobWatch(standin.url, ns, args.observe_poll) as watch:
                    upgrade("args-only, first cluster (application mode)", 0)
                    for cycle in range(args.cycles):
                        upgrade("TaskManager memory, warm standby", cycle)
                        if args.rescale:
                            upgrade("rescale 1 <-> 2 in place, session cluster", cycle)
                        upgrade("args-only, session cluster", cycle)  # its EnsureCluster follows a rescale
                        upgrade("TaskManager memory, cold", cycle)
            finally:
                rt.delete_cluster(APP, deadline=SystemClock().monotonic() + 90)
    return rows


def check_rescaled(rt: Runtime, res: AppResult, job: str | None, parallelism: int) -> None:
    """A rescale kept its job, ran no fallback, and Flink says: every vertex at the new parallelism, restored
    from a checkpoint (its own), not a savepoint."""
    steps = [s for s, _ in res.step_timings]
    if res.job_id != job or steps != ["RescaleInPlace"]:
        raise SystemExit(f"not rescaled in place: job {job} -> {res.job_id}, steps {steps}: {res.message}")
    api = rt.flink(APP)
    assert isinstance(api, RescaleApi) and res.job_id is not None
    at = {v.parallelism for v in api.vertices(res.job_id)}
    st = api.checkpoints(res.job_id)
    if at != {parallelism} or st.restored_is_savepoint is not False or f"/{job}/chk-" not in (st.restored_path or ""):
        raise SystemExit(f"rescale of {job}: vertices at {at}, restored {st.restored_path} "
                         f"(savepoint: {st.restored_is_savepoint})")


def build_jar(out: Path, flink_home: Path) -> Path:
    env = {**os.environ, "FLINK_HOME": str(flink_home)}
    subprocess.run(["bash", str(COUNTER_DIR / "build.sh"), str(out)], env=env, check=True, capture_output=True)
    return out


def row(runtime: str, cycle: int, res: AppResult) -> dict[str, Any]:
    t = dict(res.step_timings)
    out: dict[str, Any] = {"runtime": runtime, "cycle": cycle, **{s: round(t.get(s, 0.0), 3) for s in STEPS}}
    out["downtime"] = round(sum(t.get(s, 0.0) for s in STEPS), 3)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| runtime | upgrades | downtime (median s) | " + " | ".join(STEPS) + " |",
             "|---|---:|---:|" + "---:|" * len(STEPS)]
    for rt in ("local", "kubernetes"):
        mine = [r for r in rows if r["runtime"] == rt]
        if not mine:
            continue
        med = {k: statistics.median(r[k] for r in mine) for k in ("downtime", *STEPS)}
        lines.append(f"| {rt} | {len(mine)} | {med['downtime']:.2f} | "
                     + " | ".join(f"{med[s]:.2f}" for s in STEPS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3, help="upgrades per runtime (default 3)")
    ap.add_argument("--json", type=Path, help="also write the rows and the summary here")
    ap.add_argument("--heartbeat-timeout", help="e.g. '10 s' (interval 2 s); default: Flink's own (50 s)")
    ap.add_argument("--standby", action="store_true",
                    help="kubernetes only: args-only vs TaskManager memory by warm standby vs cold vs rescale in place")
    ap.add_argument("--rescale", action="store_true",
                    help="--standby: also rescale in place (the app then runs the adaptive scheduler for every kind)")
    ap.add_argument("--cooldown", default="2 s",
                    help="--standby: the adaptive scheduler's cooldown after rescaling (default 2 s; Flink's: 30 s)")
    ap.add_argument("--observe-poll", type=float, default=0.05,
                    help="--standby: the observer's poll of GET /jobs/overview through the proxy (default 0.05 s)")
    args = ap.parse_args(argv)
    if (why := needs_root_reason()) is not None:
        raise SystemExit(why)
    flink_home = find_flink_home()
    tmp = Path(tempfile.mkdtemp(prefix="k8s-downtime-"))
    rows: list[dict[str, Any]] = []
    try:
        jar = build_jar(tmp / "counter.jar", flink_home)
        usrlib = tmp / "usrlib"
        usrlib.mkdir()
        shutil.copy(jar, usrlib / "counter.jar")
        if args.standby:
            rows = run_standby(args, tmp, flink_home, usrlib)
            print(json.dumps({"rows": rows}))
            print(standby_markdown(rows))
            if args.json:
                args.json.write_text(json.dumps({"rows": rows}, indent=2))
            return 0
        local_rt = LocalRuntime(tmp / "local", clock=SystemClock(), flink_home=flink_home)

        def local_spec(rate: int) -> FlinkApp:
            return counter_app("bench-local", jar_uri="counter.jar", output_dir=str(tmp / "local-out"), rate=rate,
                               parallelism=2, slots=2)

        with Standin() as standin, Journal(tmp / "local" / "journal.sqlite", SystemClock()) as lj, \
                Journal(tmp / "k8s" / "journal.sqlite", SystemClock()) as kj:
            standin.set_auto_ready(False)
            cfg = k8s_client.Configuration()
            cfg.host = standin.url
            cfg.api_key["BearerToken"] = "Bearer stand-in-token"
            ns = "bench"
            k8s_rt = NoHaRuleRuntime(k8s_client.ApiClient(cfg), clock=SystemClock(), namespaces=[ns],
                                     rest_via="proxy", poll_interval=0.2)
            k8s_rt.kube.request("POST", f"/api/v1/namespaces/{ns}/persistentvolumeclaims", body={
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
            with ProcessNode(k8s_client.ApiClient(cfg), namespaces=[ns], workdir=tmp / "node", flink_home=flink_home,
                             images={IMAGE: Image(flink=True, usrlib=usrlib)}, backoff_base_s=2.0):
                drivers = [Driver("kubernetes", k8s_rt, kj, lambda rate: k8s_spec(ns, rate, args.heartbeat_timeout),
                                  None),
                           Driver("local", local_rt, lj, local_spec, jar)]
                try:
                    for d in drivers:
                        d.step(100)  # create (not measured)
                    for cycle in range(args.cycles):
                        for d in drivers:
                            res = d.step(101 + cycle)
                            r = row(d.name, cycle, res)
                            rows.append(r)
                            print(json.dumps(r), flush=True)
                finally:
                    for d in drivers:
                        app = APP if d.name == "kubernetes" else "bench-local"
                        d.runtime.delete_cluster(app, deadline=SystemClock().monotonic() + 90)
        local_rt.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {rt: {k: statistics.median(r[k] for r in rows if r["runtime"] == rt) for k in ("downtime", *STEPS)}
               for rt in ("local", "kubernetes") if any(r["runtime"] == rt for r in rows)}
    print(json.dumps({"summary": summary}))
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
