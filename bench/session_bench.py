"""Downtime of each job on a session cluster: a cluster change (every job moves, warm standby) against a job-only
upgrade of one app (issue 24; goal: a move's per-job downtime <= 1.5x a job-only upgrade's).

One FlinkSessionCluster (1 TaskManager, 2 slots) and two counter apps on it, `bench-a` and `bench-b`, on the
local runtime; each change goes through what `flink-reconciler apply` does (make_reconciler, lock, fetch,
Reconciler.apply). Each round applies, in turn:

- job:     a job-argument change of bench-a alone (`--rate + 1`): bench-a's job-only upgrade; bench-b's job must
           stay the same job;
- cluster: a TaskManager memory change of the session cluster: both jobs move to a new cluster (warm standby),
           each from its own savepoint.

Downtime of a job: its stop request (timestamped just before FlinkRestClient.stop_with_savepoint's POST) -> the
app's new job first seen with every task running by an observer thread polling GET /jobs/overview of every
cluster of the session cluster every `--observe-poll` s. Every new job must restore from a savepoint.

    .venv/bin/python bench/session_bench.py [--cycles 3] [--warmup 1] [--observe-poll 0.02] [--json out.json]

Prints one JSON line per change, then a summary and a Markdown table of medians per job. Not a test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.upgrade_bench import build_jar, git  # noqa: E402
from reconciler.clock import SystemClock  # noqa: E402
from reconciler.core.observed import JobPhase, job_phase  # noqa: E402
from reconciler.core.plan import is_job_of  # noqa: E402
from reconciler.live.flink import FlinkRestClient  # noqa: E402
from reconciler.live.local.runtime import LocalRuntime  # noqa: E402
from reconciler.service.factories import make_reconciler  # noqa: E402
from reconciler.service.reconcile import PassResult  # noqa: E402
from reconciler.settings import load_settings  # noqa: E402
from tests.fixtures.flink import COUNTER_MAIN  # noqa: E402

CLUSTER = "bench-shared"
APPS = ("bench-a", "bench-b")
MEMORIES = ("1280m", "1344m")


def cluster_yaml(memory: str) -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkSessionCluster
metadata:
  name: {CLUSTER}
spec:
  taskManager:
    replicas: 1
    slots: 2
    resources:
      memory: {memory}
  flinkConfiguration:
    execution.checkpointing.interval: 1 s
"""


def app_yaml(name: str, rate: int) -> str:
    args = ["--output-dir", f"out-{name}", "--keys", "4", "--rate", str(rate)]
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
spec:
  sessionCluster: {CLUSTER}
  job:
    jarURI: jobs/counter.jar
    entryClass: {COUNTER_MAIN}
    args: {json.dumps(args)}
  deadlines:
    savepoint: 60s
    start: 120s
    healthy: 60s
"""


@contextmanager
def stop_requests() -> Iterator[list[tuple[float, str]]]:
    """(time, job id) of every FlinkRestClient.stop_with_savepoint call, just before its POST."""
    stamps: list[tuple[float, str]] = []
    original = FlinkRestClient.stop_with_savepoint

    def wrapped(self: FlinkRestClient, job_id: str, **kwargs: Any) -> str:
        stamps.append((time.monotonic(), job_id))
        return original(self, job_id, **kwargs)

    FlinkRestClient.stop_with_savepoint = wrapped  # type: ignore[method-assign]
    try:
        yield stamps
    finally:
        FlinkRestClient.stop_with_savepoint = original  # type: ignore[method-assign]


@dataclass
class Observer:
    """Polls /jobs/overview of every cluster of the session cluster; when each job was first seen running."""

    rt: LocalRuntime
    interval: float
    running_at: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="observer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set():
                try:
                    urls = [r.rest_url for r in self.rt.cluster_records(CLUSTER).values()]
                except Exception:  # a record being replaced: look again next round
                    urls = []
                for url in urls:
                    try:
                        jobs = client.get(f"{url}/jobs/overview").json()["jobs"]
                    except (httpx.HTTPError, ValueError, KeyError):
                        continue
                    now = time.monotonic()
                    for j in jobs:
                        tasks = j.get("tasks") or {}
                        if job_phase(j["state"], int(tasks.get("running", 0)), int(tasks.get("total", 0)),
                                     int(tasks.get("finished", 0))) is JobPhase.RUNNING:
                            self.running_at.setdefault(j["jid"], now)
                self._stop.wait(self.interval)

    def wait_running(self, job_id: str, timeout: float = 120) -> float:
        end = time.monotonic() + timeout
        while job_id not in self.running_at:
            if time.monotonic() > end:
                raise TimeoutError(f"observer never saw job {job_id} running")
            time.sleep(self.interval)
        return self.running_at[job_id]


class Bench:
    def __init__(self, args: argparse.Namespace, root: Path, jar: Path) -> None:
        self.args = args
        self.work = root / "work"
        self.state = root / "state"
        origin = root / "origin.git"
        git(root, "init", "-q", "--bare", "-b", "main", str(origin))
        git(root, "clone", "-q", str(origin), str(self.work))
        git(self.work, "checkout", "-q", "-b", "main")
        (self.work / "jobs").mkdir()
        shutil.copy(jar, self.work / "jobs" / "counter.jar")
        (self.work / "apps").mkdir()
        self.rates = dict.fromkeys(APPS, 100)
        self.memory = MEMORIES[0]
        self.rt = LocalRuntime(self.state, clock=SystemClock())
        self.observer = Observer(self.rt, args.observe_poll)

    def commit(self, message: str) -> str:
        (self.work / "apps" / f"{CLUSTER}.yaml").write_text(cluster_yaml(self.memory))
        for name in APPS:
            (self.work / "apps" / f"{name}.yaml").write_text(app_yaml(name, self.rates[name]))
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "-m", message)
        git(self.work, "push", "-q", "origin", "HEAD:main")
        return git(self.work, "rev-parse", "HEAD")

    def apply(self, rev: str) -> tuple[PassResult, float]:
        settings = load_settings({"repo_url": str(self.work), "state_dir": self.state, "status_sink": "none"})
        t0 = time.monotonic()
        rec = make_reconciler(settings, SystemClock(), report=False)
        try:
            with rec.journal.lock_exclusive():
                rec.source.fetch()
                result = rec.apply(rec.source.resolve(rev))
        finally:
            rec.journal.close()
            if rec.runtime is not None:
                rec.runtime.close()  # type: ignore[attr-defined]
        return result, time.monotonic() - t0

    def jobs(self) -> dict[str, str]:
        """app -> its live job id, over every cluster of the session cluster."""
        out = {}
        for g in self.rt.session_generations(CLUSTER):
            for j in g.client.jobs():
                if j.state not in ("FINISHED", "CANCELED", "FAILED"):
                    out.update({a: j.job_id for a in APPS if is_job_of(j.job_id, a)})
        return out

    def restored_from_savepoint(self, job_id: str) -> bool:
        for g in self.rt.session_generations(CLUSTER):
            if any(j.job_id == job_id for j in g.client.jobs()):
                return bool(g.client.checkpoints(job_id).restored_is_savepoint)
        return False

    def create(self) -> None:
        result, _ = self.apply(self.commit("session cluster and two apps"))
        assert result.ok, {k: v.message for k, v in result.results.items()}

    def change(self, variant: str) -> dict[str, Any]:
        before = self.jobs()
        if variant == "job":
            self.rates["bench-a"] += 1
        else:
            self.memory = MEMORIES[1] if self.memory == MEMORIES[0] else MEMORIES[0]
        rev = self.commit(variant)
        with stop_requests() as stops:
            result, cycle = self.apply(rev)
        assert result.ok, {k: v.message for k, v in result.results.items()}
        after = self.jobs()
        moved = ("bench-a",) if variant == "job" else APPS
        row: dict[str, Any] = {"variant": variant, "revision": rev[:12], "cycle": cycle, "downtime": {}}
        for app in moved:
            stop = next(t for t, j in stops if is_job_of(j, app))
            row["downtime"][app] = self.observer.wait_running(after[app]) - stop
            row.setdefault("steps", {})[app] = {k: round(v, 3) for k, v in result.results[app].step_timings}
            assert after[app] != before[app] and self.restored_from_savepoint(after[app]), f"{variant}: {app}"
            plan = result.plan.app(app)
            want = "job-only" if variant == "job" else "warm-standby"
            assert plan.cluster_strategy and plan.cluster_strategy.value == want, plan.cluster_strategy
        if variant == "job":
            assert after["bench-b"] == before["bench-b"], "bench-b's job was touched by bench-a's upgrade"
        assert len(self.rt.cluster_records(CLUSTER)) == 1, "an old cluster was left"
        return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=3, help="measured rounds of job, cluster (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    p.add_argument("--observe-poll", type=float, default=0.02, help="observer's poll interval (default 0.02)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds between changes (default 2)")
    p.add_argument("--jar", type=Path, help="a built counter.jar (default: build it)")
    p.add_argument("--json", type=Path, help="also write all results as JSON to this file")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="session-bench-"))
    jar = args.jar or build_jar(root / "counter.jar")
    bench = Bench(args, root, jar)
    rows: list[dict[str, Any]] = []
    try:
        bench.create()
        bench.observer.start()
        for i in range(args.warmup + args.cycles):
            for variant in ("job", "cluster"):
                time.sleep(args.settle)
                row = bench.change(variant)
                row["round"], row["warmup"] = i, i < args.warmup
                print(json.dumps(row, default=lambda v: round(v, 4)), flush=True)
                if not row["warmup"]:
                    rows.append(row)
        job_only = statistics.median(r["downtime"]["bench-a"] for r in rows if r["variant"] == "job")
        summary: dict[str, Any] = {"job_only_upgrade": {"bench-a": round(job_only, 3)}, "cluster_change": {},
                                   "ratio": {}}
        for app in APPS:
            d = statistics.median(r["downtime"][app] for r in rows if r["variant"] == "cluster")
            summary["cluster_change"][app] = round(d, 3)
            summary["ratio"][app] = round(d / job_only, 2)
        summary["cycle"] = {v: round(statistics.median(r["cycle"] for r in rows if r["variant"] == v), 2)
                            for v in ("job", "cluster")}
        print(json.dumps({"summary": summary}, indent=2))
        print(f"\n| change ({args.cycles} rounds, medians) | bench-a downtime | bench-b downtime | apply |")
        print("|---|---|---|---|")
        print(f"| job-only upgrade of bench-a | {job_only:.2f} s | (untouched) | {summary['cycle']['job']:.1f} s |")
        ca, cb = summary["cluster_change"]["bench-a"], summary["cluster_change"]["bench-b"]
        print(f"| TaskManager memory (both jobs move) | {ca:.2f} s ({summary['ratio']['bench-a']}x) | {cb:.2f} s "
              f"({summary['ratio']['bench-b']}x) | {summary['cycle']['cluster']:.1f} s |")
        if args.json:
            args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2, default=str))
    finally:
        bench.observer.stop()
        bench.rt.delete_cluster(CLUSTER, deadline=time.monotonic() + 60)
        bench.rt.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
