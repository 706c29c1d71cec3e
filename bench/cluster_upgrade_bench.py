"""Downtime of a cluster-level change: warm standby against cold, against an args-only upgrade (issue 11).

One app (the counter job, savepoint mode), one local runtime, one run. Each round applies, in turn:

- args:  a job-argument change (`--rate + 1`): job-only, the cluster is kept;
- warm:  a TaskManager memory change, `spec.upgrade.clusterStrategy: warmStandby` (the default): the new
         cluster starts beside the running job, which moves to it once it is ready;
- cold:  a TaskManager memory change with `clusterStrategy: cold`: stop the job, restart the cluster, start.

Each change goes through what `flink-reconciler apply` does (make_reconciler, lock, fetch, Reconciler.apply;
statuses not posted). Measured (seconds, time.monotonic):

- downtime: the stop request (timestamped just before FlinkRestClient.stop_with_savepoint's POST) -> the
  new job first seen with every task running, by an observer thread that polls GET /jobs/overview of every
  cluster of the app every `--observe-poll` s (it re-reads the runtime's cluster records, so it follows a
  job to a standby or a restarted cluster);
- cycle: the whole apply (for warm it includes the standby's start, which is not downtime).

Every new job must report a savepoint as its restore point. Memory alternates between two values, so
after the first round BashJavaUtils' answers are cached for both (as for any cluster seen before).

`--rescale` adds a fourth change, the same app in the same run:

- rescale: job.parallelism 1 <-> 2 in place (`spec.upgrade.inPlaceRescale`, RescaleInPlace): no stop, the
           same job restarts its tasks from its own latest checkpoint under Flink's adaptive scheduler.

For it the app gets, for every change, `jobmanager.scheduler: adaptive` (cooldown after rescaling
`--cooldown`), 2 task slots and checkpointing (`--checkpoint-interval`, default 1 s then). A rescale has no
stop request, so its downtime is the observer's: "not running", the longest stretch inside the apply from the
first poll in which no job of the app ran every task (RUNNING, every task running or finished; a cluster whose
REST port refuses counts as running nothing, a poll with no answer at all is left out) to the next poll in
which one did (reported for every change; for the others it starts at or after the stop request). Every
rescale must keep its job id and restore from a checkpoint of that job, not a savepoint.

    .venv/bin/python bench/cluster_upgrade_bench.py [--cycles 3] [--warmup 1] [--observe-poll 0.02]
        [--checkpoint-interval '1 s'] [--rescale [--cooldown '2 s']] [--json out.json] [--keep]

Prints one JSON line per change, then a JSON summary and a Markdown table of medians. Not a test.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.upgrade_bench import (  # noqa: E402
    build_jar,
    git,
    job_args,
    remove_cluster,
    run_rounds,
    stop_requests,
)
from reconciler.clock import SystemClock  # noqa: E402
from reconciler.core.observed import JobPhase, job_phase  # noqa: E402
from reconciler.live.local.runtime import LocalRuntime  # noqa: E402
from reconciler.service.factories import make_reconciler  # noqa: E402
from reconciler.service.reconcile import PassResult  # noqa: E402
from reconciler.settings import load_settings  # noqa: E402
from tests.fixtures.flink import COUNTER_MAIN  # noqa: E402

APP = "bench-cluster-upgrade"
MEMORIES = ("1280m", "1344m")
VARIANTS = ("args", "warm", "cold")


def spec_yaml(rate: int, memory: str, strategy: str, checkpoint_interval: str | None,
              rescale_cooldown: str | None = None, parallelism: int = 1) -> str:
    """`rescale_cooldown`: the adaptive scheduler (with that cooldown), in-place rescale on and 2 slots."""
    conf = f"    execution.checkpointing.interval: {checkpoint_interval}\n" if checkpoint_interval else ""
    if rescale_cooldown:
        conf += ("    jobmanager.scheduler: adaptive\n"
                 f"    jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling: {rescale_cooldown}\n")
    conf = f"  flinkConfiguration:\n{conf}" if conf else ""
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager:
    replicas: 1
    slots: {2 if rescale_cooldown else 1}
    resources:
      memory: {memory}
{conf}  upgrade:
    clusterStrategy: {strategy}
    inPlaceRescale: {"true" if rescale_cooldown else "false"}
  job:
    jarURI: jobs/counter.jar
    entryClass: {COUNTER_MAIN}
    args: {json.dumps(job_args(rate))}
    parallelism: {parallelism}
    upgradeMode: savepoint
  deadlines:
    savepoint: 60s
    start: 120s
    healthy: 60s
    rescale: 120s
"""


def longest_not_running(samples: list[tuple[float, bool]], t0: float, t1: float) -> float:
    """Of (time, some job runs every task) samples: the longest stretch inside [t0, t1] from a sample without a
    job running every task to the next sample with one (to t1 if none came)."""
    longest, down_since = 0.0, None
    for t, ok in (s for s in list(samples) if t0 <= s[0] <= t1):
        if not ok and down_since is None:
            down_since = t
        elif ok and down_since is not None:
            longest, down_since = max(longest, t - down_since), None
    return max(longest, t1 - down_since) if down_since is not None else longest


@dataclass
class Observer:
    """Polls /jobs/overview of every cluster of the app; remembers when each job was first seen running."""

    rt: LocalRuntime
    interval: float
    running_at: dict[str, float] = field(default_factory=dict)
    samples: list[tuple[float, bool]] = field(default_factory=list)  # (monotonic, some job runs every task)
    errors: int = 0
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
                    urls = [r.rest_url for r in self.rt.cluster_records(APP).values()]
                except Exception:  # a record being replaced: look again next round
                    urls = []
                some, known = False, False
                for url in urls:
                    try:
                        jobs = client.get(f"{url}/jobs/overview").json()["jobs"]
                    except httpx.ConnectError:  # no JobManager listening: nothing of it runs
                        known = True
                        self.errors += 1
                        continue
                    except (httpx.HTTPError, ValueError, KeyError):  # e.g. a timeout under load: unknown
                        self.errors += 1
                        continue
                    known = True
                    now = time.monotonic()
                    for j in jobs:
                        # Every task running or finished (the executor's job_phase: a source subtask without a
                        # split ends at once, e.g. after a rescale above the parallelism the job started with).
                        tasks = j.get("tasks") or {}
                        if job_phase(j["state"], int(tasks.get("running", 0)), int(tasks.get("total", 0)),
                                     int(tasks.get("finished", 0))) is JobPhase.RUNNING:
                            self.running_at.setdefault(j["jid"], now)
                            some = True
                if known:
                    self.samples.append((time.monotonic(), some))
                self._stop.wait(self.interval)

    def not_running(self, t0: float, t1: float) -> float:
        return longest_not_running(self.samples, t0, t1)

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
        self.root = root
        self.work = root / "work"
        self.state = root / "state"
        origin = root / "origin.git"
        git(root, "init", "-q", "--bare", "-b", "main", str(origin))
        git(root, "clone", "-q", str(origin), str(self.work))
        git(self.work, "checkout", "-q", "-b", "main")
        (self.work / "jobs").mkdir()
        shutil.copy(jar, self.work / "jobs" / "counter.jar")
        (self.work / "apps").mkdir()
        self.rate, self.memory, self.parallelism = 100, MEMORIES[0], 1
        self.rt = LocalRuntime(self.state, clock=SystemClock())
        self.observer = Observer(self.rt, args.observe_poll)

    def commit(self, strategy: str = "warmStandby") -> str:
        (self.work / "apps" / f"{APP}.yaml").write_text(
            spec_yaml(self.rate, self.memory, strategy, self.args.checkpoint_interval,
                      self.args.cooldown if self.args.rescale else None, self.parallelism))
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "-m",
            f"rate {self.rate}, memory {self.memory}, {strategy}, parallelism {self.parallelism}")
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

    def rest(self, path: str) -> Any:
        rec = self.rt.read_record(APP)
        assert rec is not None
        return httpx.get(f"{rec.rest_url}{path}", timeout=10).json()

    def restored(self, job_id: str) -> dict[str, Any]:
        out: dict[str, Any] = (self.rest(f"/jobs/{job_id}/checkpoints").get("latest") or {}).get("restored") or {}
        return out

    def job(self) -> str:
        live = [j["jid"] for j in self.rest("/jobs/overview")["jobs"] if j["state"] not in ("FINISHED", "CANCELED")]
        assert len(live) == 1, live
        return str(live[0])

    def create(self) -> None:
        result, _ = self.apply(self.commit())
        assert result.ok, {k: v.message for k, v in result.results.items()}

    def change(self, variant: str) -> dict[str, Any]:
        strategy = "cold" if variant == "cold" else "warmStandby"
        before = self.job()
        if variant == "args":
            self.rate += 1
        elif variant == "rescale":
            self.parallelism = 3 - self.parallelism
        else:
            self.memory = MEMORIES[1] if self.memory == MEMORIES[0] else MEMORIES[0]
        rev = self.commit(strategy)
        t0 = time.monotonic()
        with stop_requests() as stops:
            result, cycle = self.apply(rev)
        res = result.results.get(APP)
        assert result.ok and res is not None and res.job_id, {k: v.message for k, v in result.results.items()}
        assert len(stops) == (variant != "rescale"), f"{variant}: saw {len(stops)} stop requests"
        plan = result.plan.app(APP)
        running = self.observer.wait_running(res.job_id)
        restored = self.restored(res.job_id)
        return {
            "variant": variant, "revision": rev[:12], "job": res.job_id, "same_job": res.job_id == before,
            "action": plan.action.value, "strategy": plan.cluster_strategy.value if plan.cluster_strategy else None,
            # A rescale has no stop and no new job: its downtime is the observer's longest stretch.
            "downtime": running - stops[0] if stops else self.observer.not_running(t0, t0 + cycle),
            "not_running": self.observer.not_running(t0, t0 + cycle), "cycle": cycle,
            "steps": {k: round(v, 4) for k, v in res.step_timings},
            "restored_from_savepoint": restored.get("is_savepoint"),
            "restored_own_checkpoint": f"/{before}/chk-" in (restored.get("external_path") or ""),
            "parallelism": sorted({v["parallelism"] for v in self.rest(f"/jobs/{res.job_id}")["vertices"]}),
            "clusters": len(self.rt.cluster_records(APP)),
        }


def variants(args: argparse.Namespace) -> tuple[str, ...]:
    return (*VARIANTS, "rescale") if args.rescale else VARIANTS


def summarize(rows: list[dict[str, Any]], kinds: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in kinds:
        mine = [r for r in rows if r["variant"] == v]
        out[v] = {"n": len(mine),
                  "downtime_median": round(statistics.median(r["downtime"] for r in mine), 4),
                  "downtime_min": round(min(r["downtime"] for r in mine), 4),
                  "downtime_max": round(max(r["downtime"] for r in mine), 4),
                  "not_running_median": round(statistics.median(r["not_running"] for r in mine), 4),
                  "cycle_median": round(statistics.median(r["cycle"] for r in mine), 4)}
    base = out["args"]["downtime_median"]
    for v in kinds[1:]:
        out[f"ratio_{v}_to_args"] = round(out[v]["downtime_median"] / base, 3)
    return out


def markdown(summary: dict[str, Any], args: argparse.Namespace, kinds: tuple[str, ...]) -> str:
    label = {"args": "args-only upgrade (job-only)", "warm": "TaskManager memory, warm standby",
             "cold": "TaskManager memory, cold", "rescale": "parallelism 1 <-> 2, in place (not running)"}
    sched = f"; adaptive scheduler, cooldown {args.cooldown}, 2 slots" if args.rescale else ""
    lines = [f"local runtime, one app, {summary['args']['n']} rounds of each (after {args.warmup} warm-up); "
             f"checkpointing {args.checkpoint_interval or 'off'}{sched}; observer poll {args.observe_poll:g}s", "",
             "| change | downtime median (s) | min | max | x args-only | not running, observed median (s) | "
             "whole apply median (s) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    base = summary["args"]["downtime_median"]
    for v in kinds:
        m = summary[v]
        lines.append(f"| {label[v]} | {m['downtime_median']:.3f} | {m['downtime_min']:.3f} | "
                     f"{m['downtime_max']:.3f} | {m['downtime_median'] / base:.2f} | {m['not_running_median']:.3f} | "
                     f"{m['cycle_median']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=3, help="measured rounds of args, warm, cold (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    p.add_argument("--observe-poll", type=float, default=0.02, help="observer's poll interval (default 0.02)")
    p.add_argument("--checkpoint-interval", default=None, help="e.g. '1 s': checkpointing on (AwaitHealthy)")
    p.add_argument("--rescale", action="store_true",
                   help="also a parallelism 1 <-> 2 change in place (adaptive scheduler, 2 slots, for every change)")
    p.add_argument("--cooldown", default="2 s", help="--rescale: the adaptive scheduler's cooldown (default 2 s)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds between changes (default 1)")
    p.add_argument("--jar", type=Path, help="a built counter.jar (default: build it)")
    p.add_argument("--json", type=Path, help="also write all results as JSON to this file")
    p.add_argument("--keep", action="store_true", help="leave the cluster and temp dir (printed) in place")
    args = p.parse_args(argv)
    if args.rescale and not args.checkpoint_interval:
        args.checkpoint_interval = "1 s"  # an in-place rescale is planned only with checkpointing on
    kinds = variants(args)

    root = Path(tempfile.mkdtemp(prefix="cluster-upgrade-bench-"))
    jar = args.jar or build_jar(root / "counter.jar")
    bench = Bench(args, root, jar)
    try:
        t = time.monotonic()
        bench.create()
        print(json.dumps({"setup": "created app and cluster", "seconds": round(time.monotonic() - t, 2)}), flush=True)
        bench.observer.start()

        def check(variant: str, row: dict[str, Any]) -> None:
            assert row["clusters"] == 1, f"{variant}: {row['clusters']} clusters of the app left"
            assert row["parallelism"] == [bench.parallelism], f"{variant}: vertices at {row['parallelism']}"
            if variant == "rescale":
                assert row["action"] == "scale" and row["same_job"], f"not rescaled in place: {row}"
                assert row["restored_from_savepoint"] is False and row["restored_own_checkpoint"], row
                return
            assert row["restored_from_savepoint"], f"{variant}: the new job did not restore from a savepoint"
            want = {"args": "job-only", "warm": "warm-standby", "cold": "cold"}[variant]
            assert row["strategy"] == want, f"{variant}: planned {row['strategy']}, expected {want}"

        changes = [(v, functools.partial(bench.change, v)) for v in kinds]
        rows = run_rounds(args, changes, lambda: time.sleep(args.settle), check)
        summary = summarize(rows, kinds)
        print(json.dumps({"summary": summary}, indent=2))
        print()
        print(markdown(summary, args, kinds))
        if args.json:
            args.json.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()},
                                             "summary": summary, "rows": rows}, indent=2))
    finally:
        bench.observer.stop()
        remove_cluster(bench.rt, APP, root, keep=args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
