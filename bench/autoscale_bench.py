"""The autoscaler's timeline on real Flink (issue 25): scale up under overload, scale down after the rate drops.

One `flink-reconciler run` process (poll every second) and one local cluster (adaptive scheduler, 2 slots,
`upgrade.inPlaceRescale`), the counter job costing `--work-us` per record in its counting operator and fed
`--rate` records/s: overloaded at parallelism 1. `spec.autoscale.mode: commit`. Then the input rate drops to
`--low-rate` (the job reads it from its rate file: no change in Git) and the autoscaler scales back down once
the lower parallelism has been called for for `--scale-down-delay`.

Printed, from the outside only (the daemon's JSON log, origin's branch, Flink's REST API, the job's output):

- detect: from what calls for the change (the overloaded job running; the human's commit of a lower rate) to
  the autoscaler's decision in the daemon's log: stabilisation, a full window and, down, the scaleDownDelay;
- commit: from the decision to the autoscale commit on origin's main;
- rescale: from the commit until every vertex of the same job runs at the new parallelism;
- busy % of the counting vertex and backpressured % of the source before and after (Flink's accumulated
  busy/backpressured time over `--measure` seconds);
- whether any count went back (it must not: in-place rescales restore from the job's own checkpoint);
- what sampling costs: the REST requests the daemon made for autoscaling per app per minute (its own counter,
  `flink_reconciler_autoscale_rest_requests_total`, at its poll interval), and, to check that counter, the same
  autoscaler code driven for `--count-seconds` at one pass every `--count-interval` seconds through a counting
  proxy in front of the JobManager: the requests that reached Flink against what the autoscaler counted.

    .venv/bin/python bench/autoscale_bench.py [--rate 120] [--low-rate 40] [--work-us 10000]
        [--work-mode sleep|spin] [--window 20s] [--stabilisation 10s] [--scale-down-delay 30s]
        [--count-seconds 60] [--count-interval 15] [--keep]

Not a test (not collected by pytest): takes a few minutes. Hold the machine's Flink lock while it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.apply.journal import Journal  # noqa: E402
from reconciler.clock import SystemClock  # noqa: E402
from reconciler.daemon.metrics import Metrics  # noqa: E402
from reconciler.live.local.config import find_flink_home  # noqa: E402
from reconciler.live.local.runtime import LocalRuntime  # noqa: E402
from reconciler.service.autoscale import Autoscaler  # noqa: E402
from reconciler.service.reconcile import Reconciler  # noqa: E402
from reconciler.source.git import GitSource  # noqa: E402
from tests.e2e.test_daemon_e2e import DaemonProc  # noqa: E402
from tests.faults.test_rest_faults import ProxiedRuntime  # noqa: E402
from tests.fixtures.flink import COUNTER_DIR, COUNTER_MAIN, read_counts, teardown_runtime  # noqa: E402
from tests.gitutil import Repo, git  # noqa: E402

APP = "auto"


def app_yaml(a: argparse.Namespace, *, rate: float, parallelism: int) -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager: {{replicas: 1, slots: 2}}
  flinkConfiguration:
    execution.checkpointing.interval: 1 s
    jobmanager.scheduler: adaptive
    jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling: 1 s
    taskmanager.network.memory.buffer-debloat.enabled: "true"
    metrics.fetcher.update-interval: 1 s
  upgrade: {{inPlaceRescale: true}}
  autoscale:
    mode: commit
    targetUtilisation: {a.target_utilisation}
    max: 2
    stabilisation: {a.stabilisation}
    window: {a.window}
    scaleDownDelay: {a.scale_down_delay}
  job:
    jarURI: jobs/counter/counter.jar
    entryClass: {COUNTER_MAIN}
    args: ["--output-dir", "out", "--keys", "64", "--rate", "{rate:g}", "--work-us", "{a.work_us}",
           "--work-mode", "{a.work_mode}", "--rate-scope", "taskmanager", "--rate-file", "rate"]
    parallelism: {parallelism}
"""


class Bench:
    def __init__(self, a: argparse.Namespace, root: Path) -> None:
        self.a = a
        self.repo = Repo(root)
        self.state = root / "state"
        self.rt = LocalRuntime(self.state, clock=SystemClock(), flink_home=find_flink_home())
        self.log_path = root / "daemon.log"
        self.daemon: DaemonProc | None = None
        self.t0 = time.time()
        self.running = time.time()

    def t(self, at: float | None = None) -> str:
        return f"{(at if at is not None else time.time()) - self.t0:7.1f}s"

    def rest(self, path: str) -> Any:
        info = self.rt.observe(APP)
        assert info.rest_url
        return httpx.get(info.rest_url + path, timeout=10).json()

    def job(self) -> str | None:
        return next((j.job_id for j in self.rt.flink(APP).jobs() if j.state == "RUNNING"), None)

    def wait(self, probe: Any, timeout: float, what: str) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = probe()
            if got:
                return got
            if self.daemon is not None and self.daemon.proc.poll() is not None:
                raise SystemExit(f"the daemon exited while waiting for {what}:\n{self.daemon.log_tail()}")
            time.sleep(0.2)
        raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")

    def load(self, job: str) -> dict[str, tuple[int, float, float]]:
        """vertex -> (parallelism, busy %, backpressured %) over --measure seconds, from Flink's accumulators."""
        names = "accumulateBusyTimeMs,accumulateBackPressuredTimeMs"

        def take() -> dict[str, tuple[int, float, float]] | None:
            out = {}
            for v in self.rest(f"/jobs/{job}")["vertices"]:
                got = {m["id"]: m["sum"] for m in self.rest(
                    f"/jobs/{job}/vertices/{v['id']}/subtasks/metrics?get={names}&agg=sum")}
                if len(got) < 2:
                    return None
                out[v["name"]] = (v["parallelism"], got["accumulateBusyTimeMs"], got["accumulateBackPressuredTimeMs"])
            return out

        a = self.wait(take, 30, "vertex metrics")
        time.sleep(self.a.measure)
        b = self.wait(take, 30, "vertex metrics")
        s = self.a.measure
        return {n: (p, (b[n][1] - a[n][1]) / s / 10 / p, (b[n][2] - a[n][2]) / s / 10 / p)
                for n, (p, _, _) in b.items()}

    def log_events(self) -> list[tuple[float, str]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "autoscale" in str(d.get("msg", "")):
                out.append((datetime.fromisoformat(d["ts"].replace("Z", "+00:00")).timestamp(), str(d["msg"])))
        return out

    def autoscale_commits(self) -> list[tuple[str, str, float]]:
        out = git(self.repo.origin, "log", "--format=%H %ct %s", "main")
        rows = [line.split(" ", 2) for line in out.splitlines()]
        return [(sha, subject, float(ts)) for sha, ts, subject in rows if subject.startswith(f"autoscale({APP})")]

    def counts(self) -> dict[str, int]:
        return read_counts(self.rt.paths(APP).work / "out")

    def phase(self, name: str, frm: int, to: int, since: float) -> dict[str, Any]:
        job = self.wait(self.job, 60, "a running job")
        before = self.load(job)
        print(f"{self.t()} {name}: parallelism {frm}: " + describe(before), flush=True)
        n = len(self.autoscale_commits())
        sha, subject, _ = self.wait(lambda: (c := self.autoscale_commits()) and len(c) > n and c[0], 600,
                                    f"the autoscale commit {frm} -> {to}")
        committed = time.time()
        events = [e for e in self.log_events() if e[0] >= since]
        decided = next((t for t, m in events if f"autoscale scale-{'up' if to > frm else 'down'}:" in m), committed)
        assert subject == f"autoscale({APP}): parallelism {frm} -> {to}", subject
        counts = self.counts()

        def rescaled() -> bool:
            vs = self.rest(f"/jobs/{job}")["vertices"]
            # a source subtask without a split of the generator finishes: that is all of it running
            return all(v["parallelism"] == to and v["tasks"].get("RUNNING", 0) >= 1
                       and v["tasks"].get("RUNNING", 0) + v["tasks"].get("FINISHED", 0) == to for v in vs)
        self.wait(rescaled, 120, f"the same job at parallelism {to}")
        done = time.time()
        time.sleep(2)
        after = self.load(job)
        now = self.counts()
        back = {k: (counts[k], now.get(k)) for k in counts if now.get(k, 0) < counts[k]}
        print(f"{self.t(decided)} {name}: decided ({subject}), commit {sha[:12]}", flush=True)
        print(f"{self.t(done)} {name}: the same job {job[:12]} runs at parallelism {to}: " + describe(after),
              flush=True)
        return {"phase": name, "from": frm, "to": to, "commit": sha, "job": job, "detect_s": round(decided - since, 1),
                "commit_s": round(committed - decided, 1), "rescale_s": round(done - committed, 1),
                "busy_before": busiest(before), "busy_after": busiest(after),
                "backpressured_before": source_bp(before), "backpressured_after": source_bp(after),
                "counts_went_back": back}

    def run(self) -> list[dict[str, Any]]:
        a = self.a
        jar = Path(tempfile.mkdtemp(prefix="autoscale-jar-")) / "counter.jar"
        env = {**os.environ, "PYTHON": sys.executable, "FLINK_HOME": str(find_flink_home())}
        subprocess.run(["bash", str(COUNTER_DIR / "build.sh"), str(jar)], env=env, check=True, capture_output=True)
        self.repo.write("jobs/counter/counter.jar", jar.read_bytes())
        self.repo.write(f"apps/{APP}.yaml", app_yaml(a, rate=a.rate, parallelism=1))
        self.repo.commit("counter app, overloaded at parallelism 1, autoscale: commit")
        os.environ["FLINK_HOME"] = str(find_flink_home())
        self.t0 = time.time()
        self.daemon = DaemonProc.start(self.log_path, repo_url=str(self.repo.origin), state_dir=str(self.state),
                                       poll_interval=1, drift_interval=60)
        self.wait(lambda: len(self.counts()) == 64, 120, "the job to run")
        running = self.running = time.time()
        print(f"{self.t()} the job runs at parallelism 1, fed {a.rate:g} records/s, {a.work_us} us per record "
              f"({a.work_mode})", flush=True)
        up = self.phase("scale-up", 1, 2, running)
        # The input rate drops (the job reads it from its rate file): no change in Git.
        target = self.rt.paths(APP).work / "rate"
        target.with_name(".rate.tmp").write_text(f"{a.low_rate:g}\n")
        target.with_name(".rate.tmp").replace(target)
        dropped = time.time()
        print(f"{self.t()} the input rate drops to {a.low_rate:g}/s (the job's rate file)", flush=True)
        down = self.phase("scale-down", 2, 1, dropped)
        return [up, down]

    def daemon_requests(self, since: float) -> dict[str, Any]:
        """What the daemon counted for sampling the app since the job first ran, per minute."""
        assert self.daemon is not None
        n = self.daemon.metric("flink_reconciler_autoscale_rest_requests_total", app=APP)
        minutes = (time.time() - since) / 60
        return {"requests": int(n), "minutes": round(minutes, 2), "per_minute": round(n / minutes, 1),
                "poll_interval_s": 1}

    def counted_requests(self) -> dict[str, Any]:
        """The autoscaler's sampling through a counting proxy: requests that reached Flink vs. what it counted."""
        a = self.a
        clock = SystemClock()
        runtime = ProxiedRuntime(self.state, clock=clock, flink_home=find_flink_home())
        rec = Reconciler(source=GitSource(str(self.repo.origin), self.state.parent / "count-git"), runtime=runtime,
                         journal=Journal(self.state / "journal", clock), clock=clock)
        metrics = Metrics()
        scaler = Autoscaler(rec, metrics=metrics, stored=False)  # a second observer: reads, never writes
        rec.source.fetch()
        la = rec.load(rec.source.head()).apps[APP]
        rest = runtime.read_record(APP)
        assert rest is not None
        proxy = runtime.proxy_of(rest.rest_url)
        passes = 0
        start = time.monotonic()
        try:
            while time.monotonic() - start < a.count_seconds:
                scaler.evaluate(la, runtime)
                passes += 1
                time.sleep(max(0.0, start + passes * a.count_interval - time.monotonic()))
        finally:
            runtime.close()
        seen = len(proxy.seen)
        counted = scaler.requests.get(APP, 0)
        exported = metrics.registry.get_sample_value("flink_reconciler_autoscale_rest_requests_total", {"app": APP})
        minutes = (time.monotonic() - start) / 60
        paths = sorted({s.path.split("?")[0] for s in proxy.seen})
        print(f"{self.t()} sampling through a counting proxy: {passes} passes in {minutes * 60:.0f}s, one every "
              f"{a.count_interval:g}s: {seen} requests reached Flink, the autoscaler counted {counted} (exported "
              f"{exported:.0f}): {seen / passes:.1f} a pass, {seen / minutes:.1f} per app per minute", flush=True)
        for path in paths:
            print(f"          {sum(1 for s in proxy.seen if s.path.split('?')[0] == path):4d}  GET {path}")
        return {"passes": passes, "interval_s": a.count_interval, "reached_flink": seen, "counted": counted,
                "exported": exported, "per_pass": round(seen / passes, 2), "per_minute": round(seen / minutes, 1)}

def describe(load: dict[str, tuple[int, float, float]]) -> str:
    return "; ".join(f"{n.split(' ->')[0]} busy {b:.0f}% backpressured {bp:.0f}%" for n, (_, b, bp) in load.items())


def busiest(load: dict[str, tuple[int, float, float]]) -> float:
    return round(max(b for _, b, _ in load.values()), 1)


def source_bp(load: dict[str, tuple[int, float, float]]) -> float:
    return round(next(bp for n, (_, _, bp) in load.items() if n.startswith("Source")), 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=120.0, help="records/s at first (default: %(default)s)")
    p.add_argument("--low-rate", type=float, default=40.0, help="records/s after the rate drops (default: %(default)s)")
    p.add_argument("--work-us", type=int, default=10000, help="cost of one record (default: %(default)s)")
    p.add_argument("--work-mode", choices=["sleep", "spin"], default="sleep", help="(default: %(default)s)")
    p.add_argument("--target-utilisation", type=float, default=0.8, help="(default: %(default)s)")
    p.add_argument("--window", default="20s", help="(default: %(default)s)")
    p.add_argument("--stabilisation", default="10s", help="(default: %(default)s)")
    p.add_argument("--scale-down-delay", default="30s", help="(default: %(default)s)")
    p.add_argument("--measure", type=float, default=5.0, help="seconds per busy measurement (default: %(default)s)")
    p.add_argument("--count-seconds", type=float, default=60.0,
                   help="how long to sample through the counting proxy (default: %(default)s)")
    p.add_argument("--count-interval", type=float, default=15.0,
                   help="seconds between passes through the proxy; the daemon's default poll interval (default: "
                        "%(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="autoscale-bench-"))
    bench = Bench(a, root)
    try:
        rows = bench.run()
        daemon = bench.daemon_requests(bench.running)
        print(f"{bench.t()} the daemon (one pass a second) made {daemon['requests']} autoscale requests for the app "
              f"in {daemon['minutes']:.1f} min: {daemon['per_minute']} per app per minute", flush=True)
        counted = bench.counted_requests()
    finally:
        if bench.daemon is not None:
            bench.daemon.proc.terminate()
            try:
                bench.daemon.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                bench.daemon.proc.kill()
        teardown_runtime(bench.rt)
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"phases": rows, "daemon_requests": daemon, "proxy_counted": counted}))
    print()
    print("| phase | detect | commit | rescale | busiest vertex busy before -> after | source backpressured before "
          "-> after | counts went back |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} {r['from']} -> {r['to']} | {r['detect_s']} s | {r['commit_s']} s | {r['rescale_s']} s | "
              f"{r['busy_before']}% -> {r['busy_after']}% | {r['backpressured_before']}% -> "
              f"{r['backpressured_after']}% | {'none' if not r['counts_went_back'] else r['counts_went_back']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
