"""Downtime of an in-place rescale against an args-only savepoint upgrade (issue 11 item 2).

One app (the counter job, 4 keys, 100 records/s), one local cluster with Flink's adaptive scheduler
(`jobmanager.scheduler: adaptive`, 2 slots, checkpointing on), `spec.upgrade.inPlaceRescale: true`. Each
round applies, in turn, through what `flink-reconciler apply` does (make_reconciler, lock, fetch,
Reconciler.apply; statuses not posted):

- args:    a job-argument change (`--rate + 1`): stop with a savepoint, start a new job from it;
- rescale: job.parallelism 1 <-> 2: the same job rescales in place (RescaleInPlace; no stop, no new job).

Measured (seconds), with the same instruments for both:

- output gap: the longest time without output of the job during the change. A watcher thread polls the
  counter's output files every `--output-poll` s and keeps each new newest-mtime (the sink writes every key
  about every 40 ms); the gap is the largest difference between consecutive ones inside the change;
- not running: how long no job of the app ran every task (RUNNING, tasks running + finished = total), by an
  observer polling GET /jobs/overview every `--observe-poll` s;
- whole apply: the rescale's includes waiting out the scheduler's cooldown after the job's last (re)start
  (`--cooldown`, here short; Flink's default is 30 s) and a checkpoint after the rescale: not downtime.

Every rescale must keep the job id and restore from its own checkpoint; every args upgrade must start a new
job from a savepoint.

    .venv/bin/python bench/rescale_bench.py [--cycles 3] [--warmup 1] [--cooldown '2 s']
        [--checkpoint-interval '1 s'] [--output-poll 0.005] [--observe-poll 0.02] [--json out.json] [--keep]

Prints one JSON line per change, then a JSON summary and a Markdown table of medians. Not a test.
"""

from __future__ import annotations

import argparse
import functools
import itertools
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

from bench.upgrade_bench import build_jar, git, job_args, remove_cluster, run_rounds  # noqa: E402
from reconciler.clock import SystemClock  # noqa: E402
from reconciler.live.local.runtime import LocalRuntime  # noqa: E402
from reconciler.service.factories import make_reconciler  # noqa: E402
from reconciler.service.reconcile import PassResult  # noqa: E402
from reconciler.settings import load_settings  # noqa: E402
from tests.fixtures.flink import COUNTER_MAIN  # noqa: E402

APP = "bench-rescale"
VARIANTS = ("args", "rescale")


def spec_yaml(rate: int, parallelism: int, args: argparse.Namespace) -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager:
    replicas: 1
    slots: 2
  flinkConfiguration:
    execution.checkpointing.interval: {args.checkpoint_interval}
    jobmanager.scheduler: adaptive
    jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling: {args.cooldown}
  upgrade:
    inPlaceRescale: true
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


@dataclass
class Watchers:
    """Two threads: the newest output-file mtime (wall clock), and when every task of a job ran (monotonic)."""

    rt: LocalRuntime
    out_dir: Path
    output_poll: float
    observe_poll: float
    outputs: list[float] = field(default_factory=list)  # each new newest mtime, wall seconds
    running: list[tuple[float, bool]] = field(default_factory=list)  # (monotonic, some job runs every task)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for fn in (self._outputs, self._jobs):
            t = threading.Thread(target=fn, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def _outputs(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            try:
                newest = max((f.stat().st_mtime for f in self.out_dir.iterdir() if not f.name.startswith(".")),
                             default=0.0)
            except OSError:
                newest = last
            if newest > last:
                self.outputs.append(newest)
                last = newest
            self._stop.wait(self.output_poll)

    def _jobs(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set():
                rec = self.rt.read_record(APP)
                ok: bool | None = None
                if rec is not None:
                    try:
                        jobs = client.get(f"{rec.rest_url}/jobs/overview").json()["jobs"]
                        ok = any(j["state"] == "RUNNING" and int(j["tasks"]["total"]) > 0 and int(
                            j["tasks"]["running"]) + int(j["tasks"].get("finished", 0)) == int(j["tasks"]["total"])
                            and int(j["tasks"]["running"]) > 0 for j in jobs)
                    except (httpx.HTTPError, ValueError, KeyError):
                        ok = None
                if ok is not None:
                    self.running.append((time.monotonic(), ok))
                self._stop.wait(self.observe_poll)

    def output_gap(self, t0_wall: float, t1_wall: float) -> float:
        """The longest time between two outputs inside [t0, t1] (the last output before t0 counts)."""
        seen = [t for t in self.outputs if t <= t1_wall]
        before = [t for t in seen if t < t0_wall]
        inside = ([before[-1]] if before else []) + [t for t in seen if t >= t0_wall]
        return max((b - a for a, b in itertools.pairwise(inside)), default=float("nan"))

    def not_running(self, t0: float, t1: float) -> float:
        """Seconds inside [t0, t1] during which no job of the app ran every task."""
        samples = [(t, ok) for t, ok in self.running if t0 <= t <= t1]
        down = 0.0
        for (ta, ok), (tb, _) in itertools.pairwise(samples):
            if not ok:
                down += tb - ta
        return down


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
        self.rate, self.parallelism = 100, 1
        self.rt = LocalRuntime(self.state, clock=SystemClock())
        self.watch = Watchers(self.rt, self.rt.paths(APP).work / "out", args.output_poll, args.observe_poll)

    def commit(self) -> str:
        (self.work / "apps" / f"{APP}.yaml").write_text(spec_yaml(self.rate, self.parallelism, self.args))
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "-m", f"rate {self.rate}, parallelism {self.parallelism}")
        git(self.work, "push", "-q", "origin", "HEAD:main")
        return git(self.work, "rev-parse", "HEAD")

    def apply(self, rev: str) -> PassResult:
        settings = load_settings({"repo_url": str(self.work), "state_dir": self.state, "status_sink": "none"})
        rec = make_reconciler(settings, SystemClock(), report=False)
        try:
            with rec.journal.lock_exclusive():
                rec.source.fetch()
                return rec.apply(rec.source.resolve(rev))
        finally:
            rec.journal.close()
            if rec.runtime is not None:
                rec.runtime.close()  # type: ignore[attr-defined]

    def rest(self, path: str) -> Any:
        rec = self.rt.read_record(APP)
        assert rec is not None
        return httpx.get(f"{rec.rest_url}{path}", timeout=10).json()

    def job(self) -> str:
        live = [j["jid"] for j in self.rest("/jobs/overview")["jobs"] if j["state"] not in ("FINISHED", "CANCELED")]
        assert len(live) == 1, live
        return str(live[0])

    def create(self) -> None:
        result = self.apply(self.commit())
        assert result.ok, {k: v.message for k, v in result.results.items()}

    def change(self, variant: str) -> dict[str, Any]:
        before = self.job()
        if variant == "args":
            self.rate += 1
        else:
            self.parallelism = 2 if self.parallelism == 1 else 1
        rev = self.commit()
        t0, w0 = time.monotonic(), time.time()
        result = self.apply(rev)
        t1 = time.monotonic()
        time.sleep(self.args.settle)  # the end of the gap may be seen a moment after apply returns
        t2, w2 = time.monotonic(), time.time()
        res = result.results.get(APP)
        assert result.ok and res is not None and res.job_id, {k: v.message for k, v in result.results.items()}
        restored = (self.rest(f"/jobs/{res.job_id}/checkpoints").get("latest") or {}).get("restored") or {}
        parallelism = [v["parallelism"] for v in self.rest(f"/jobs/{res.job_id}")["vertices"]]
        return {
            "variant": variant, "revision": rev[:12], "action": result.plan.app(APP).action.value,
            "same_job": res.job_id == before, "parallelism": parallelism,
            "restored_savepoint": restored.get("is_savepoint"),
            "output_gap": self.watch.output_gap(w0, w2), "not_running": self.watch.not_running(t0, t2),
            "cycle": t1 - t0, "steps": {k: round(v, 4) for k, v in res.step_timings},
        }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in VARIANTS:
        mine = [r for r in rows if r["variant"] == v]
        out[v] = {"n": len(mine)} | {
            f"{m}_{agg}": round(fn(r[m] for r in mine), 4)
            for m in ("output_gap", "not_running", "cycle")
            for agg, fn in (("median", statistics.median), ("min", min), ("max", max))}
    base = out["args"]["output_gap_median"]
    out["ratio_rescale_to_args_output_gap"] = round(out["rescale"]["output_gap_median"] / base, 3) if base else None
    return out


def markdown(summary: dict[str, Any], args: argparse.Namespace) -> str:
    label = {"args": "args-only upgrade (savepoint, new job)", "rescale": "parallelism 1 <-> 2, in place"}
    lines = [f"local runtime, adaptive scheduler, one app, {summary['args']['n']} rounds of each (after "
             f"{args.warmup} warm-up); checkpointing {args.checkpoint_interval}; cooldown {args.cooldown}; "
             f"output poll {args.output_poll:g}s, REST poll {args.observe_poll:g}s", "",
             "| change | longest time without output, median (s) | min | max | no job running every task, "
             "median (s) | whole apply median (s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for v in VARIANTS:
        m = summary[v]
        lines.append(f"| {label[v]} | {m['output_gap_median']:.3f} | {m['output_gap_min']:.3f} | "
                     f"{m['output_gap_max']:.3f} | {m['not_running_median']:.3f} | {m['cycle_median']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=3, help="measured rounds of args and rescale (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    p.add_argument("--cooldown", default="2 s", help="adaptive scheduler's cooldown after a rescale (default 2 s)")
    p.add_argument("--checkpoint-interval", default="1 s", help="checkpointing (in-place rescale needs it)")
    p.add_argument("--output-poll", type=float, default=0.005, help="output watcher's poll (default 0.005)")
    p.add_argument("--observe-poll", type=float, default=0.02, help="REST observer's poll (default 0.02)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds watched after each apply (default 1)")
    p.add_argument("--jar", type=Path, help="a built counter.jar (default: build it)")
    p.add_argument("--json", type=Path, help="also write all results as JSON to this file")
    p.add_argument("--keep", action="store_true", help="leave the cluster and temp dir (printed) in place")
    args = p.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="rescale-bench-"))
    jar = args.jar or build_jar(root / "counter.jar")
    bench = Bench(args, root, jar)
    try:
        t = time.monotonic()
        bench.create()
        print(json.dumps({"setup": "created app and cluster", "seconds": round(time.monotonic() - t, 2)}), flush=True)
        bench.watch.start()

        def check(variant: str, row: dict[str, Any]) -> None:
            if variant == "rescale":
                assert row["action"] == "scale" and row["same_job"], f"not rescaled in place: {row}"
                assert row["restored_savepoint"] is False, f"the rescale did not restore a checkpoint: {row}"
                assert set(row["parallelism"]) == {bench.parallelism}, row
            else:
                assert not row["same_job"] and row["restored_savepoint"] is True, row

        changes = [(v, functools.partial(bench.change, v)) for v in VARIANTS]
        rows = run_rounds(args, changes, lambda: time.sleep(args.settle), check)
        summary = summarize(rows)
        print(json.dumps({"summary": summary}, indent=2))
        print()
        print(markdown(summary, args))
        if args.json:
            args.json.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()},
                                             "summary": summary, "rows": rows}, indent=2))
    finally:
        bench.watch.stop()
        remove_cluster(bench.rt, APP, root, keep=args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
