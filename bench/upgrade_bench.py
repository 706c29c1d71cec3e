"""One savepoint upgrade through `apply` (A) against the same upgrade by bare REST calls (B), same cluster.

Issue 3's benchmark. One local Flink session cluster runs the counter job; the bench alternates
A, B, A, B, ... (after unmeasured warm-up rounds), so machine load hits both alike:

- A: commit a job-argument change to the Git repo, then what `flink-reconciler apply` does in its
  process: make_reconciler (fresh runtime, journal, Git source; `--a-mode reuse` keeps one Reconciler
  as the daemon does), take the state-dir lock, fetch, resolve, Reconciler.apply -> plan
  [StopWithSavepoint, EnsureCluster, StartJob(restore captured), AwaitRunning]. Commit statuses are
  not posted (report=False): posting happens after the job runs and is not part of the cycle.
- B: httpx only: POST /jobs/{id}/stop, poll GET /jobs/{id}/savepoints/{trigger} until COMPLETED,
  POST /jars/{jar}/run with savepointPath and a new jobId (the jar A uploaded), poll GET
  /jobs/overview until every task runs. B polls every `--rest-poll` s (default 0.2 s, the executor's
  poll interval, so both poll alike; try 0.05 to see what polling costs).

Measured (seconds, time.monotonic):
- downtime = stop request -> new job RUNNING with all tasks running. The stop request is timestamped
  just before the POST /stop (B: in the loop; A: by wrapping FlinkRestClient.stop_with_savepoint).
  The end is seen by an observer thread polling GET /jobs/overview every `--observe-poll` s (default
  0.02) for both A and B: the same instrument, independent of each driver's own polling. Also shown:
  stopped -> running (old job first seen FINISHED -> new job first seen running, observer only), and
  A's event-based downtime (StopWithSavepoint started -> AwaitRunning done, from the executor's
  on_event callback).
- cycle: A from make_reconciler (or fetch, with reuse) to Reconciler.apply returning; B from the stop
  request to its own poll seeing every task running.

Checkpointing is off by default, so A's plan has no AwaitHealthy step and both cycles do the same
work; with `--checkpoint-interval 1s` A waits for a first checkpoint (AwaitHealthy) and so does B.

    .venv/bin/python bench/upgrade_bench.py [--cycles 5] [--warmup 1] [--a-mode fresh|reuse]
        [--rest-poll 0.2] [--observe-poll 0.02] [--checkpoint-interval 1s] [--json out.json] [--keep]

Prints one JSON line per cycle, then a JSON summary and a Markdown table of medians. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.apply.executor import EventPhase, StepEvent  # noqa: E402
from reconciler.clock import SystemClock  # noqa: E402
from reconciler.live.flink import FlinkRestClient  # noqa: E402
from reconciler.live.local.runtime import LocalRuntime  # noqa: E402
from reconciler.service.factories import make_reconciler  # noqa: E402
from reconciler.service.reconcile import Reconciler  # noqa: E402
from reconciler.settings import Settings, load_settings  # noqa: E402
from tests.fixtures.flink import COUNTER_DIR, COUNTER_MAIN  # noqa: E402

APP = "bench-upgrade"
KEYS = 4
BASE_RATE = 100
GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@localhost", "GIT_CONFIG_NOSYSTEM": "1"}


# ---------------------------------------------------------------------------------------------- setup


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, check=True,
                          capture_output=True, text=True).stdout.strip()


def spec_yaml(rate: int, checkpoint_interval: str | None) -> str:
    conf = f"  flinkConfiguration:\n    execution.checkpointing.interval: {checkpoint_interval}\n" \
        if checkpoint_interval else ""
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager:
    replicas: 1
    slots: 1
{conf}  job:
    jarURI: jobs/counter.jar
    entryClass: {COUNTER_MAIN}
    args: {json.dumps(job_args(rate))}
    parallelism: 1
    upgradeMode: savepoint
  deadlines:
    savepoint: 60s
    start: 90s
    healthy: 60s
"""


def job_args(rate: int) -> list[str]:
    return ["--output-dir", "out", "--keys", str(KEYS), "--rate", str(rate)]


class GitRepo:
    """A working copy with a bare origin, like a developer's clone of the GitOps repo."""

    def __init__(self, root: Path, jar: Path, checkpoint_interval: str | None) -> None:
        self.origin = root / "origin.git"
        self.work = root / "work"
        self.checkpoint_interval = checkpoint_interval
        git(root, "init", "-q", "--bare", "-b", "main", str(self.origin))
        git(root, "clone", "-q", str(self.origin), str(self.work))
        git(self.work, "checkout", "-q", "-b", "main")
        (self.work / "jobs").mkdir()
        shutil.copy(jar, self.work / "jobs" / "counter.jar")
        (self.work / "apps").mkdir()

    def commit_rate(self, rate: int) -> str:
        (self.work / "apps" / f"{APP}.yaml").write_text(spec_yaml(rate, self.checkpoint_interval))
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "-m", f"rate {rate}")
        git(self.work, "push", "-q", "origin", "HEAD:main")
        return git(self.work, "rev-parse", "HEAD")


def build_jar(out: Path) -> Path:
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(["bash", str(COUNTER_DIR / "build.sh"), str(out)], env=env, check=True, capture_output=True)
    return out


# ---------------------------------------------------------------------------------------------- observer


@dataclass
class Observer:
    """Polls GET /jobs/overview and remembers when each job was first seen fully running / ended."""

    url: str
    interval: float
    running_at: dict[str, float] = field(default_factory=dict)
    ended_at: dict[str, float] = field(default_factory=dict)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="observer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                try:
                    jobs = client.get(f"{self.url}/jobs/overview").json()["jobs"]
                except (httpx.HTTPError, ValueError, KeyError):
                    self.errors += 1
                    jobs = []
                now = time.monotonic()
                with self._cond:
                    for j in jobs:
                        jid, state, tasks = j["jid"], j["state"], j.get("tasks") or {}
                        total = int(tasks.get("total", 0))
                        if state == "RUNNING" and total > 0 and int(tasks.get("running", 0)) == total:
                            self.running_at.setdefault(jid, now)
                        if state in ("FINISHED", "CANCELED", "FAILED"):
                            self.ended_at.setdefault(jid, now)
                    self._cond.notify_all()
                self._stop.wait(self.interval)

    def wait_running(self, job_id: str, timeout: float = 60) -> float:
        end = time.monotonic() + timeout
        with self._cond:
            while job_id not in self.running_at:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"observer never saw job {job_id} running")
                self._cond.wait(left)
            return self.running_at[job_id]

    def wait_ended(self, job_id: str, timeout: float = 60) -> float:
        end = time.monotonic() + timeout
        with self._cond:
            while job_id not in self.ended_at:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"observer never saw job {job_id} end")
                self._cond.wait(left)
            return self.ended_at[job_id]


# ---------------------------------------------------------------------------------------------- A and B


@contextlib.contextmanager
def stop_requests() -> Iterator[list[float]]:
    """Timestamps of every FlinkRestClient.stop_with_savepoint call (just before its POST)."""
    stamps: list[float] = []
    original = FlinkRestClient.stop_with_savepoint

    def wrapped(self: FlinkRestClient, *args: Any, **kwargs: Any) -> str:
        stamps.append(time.monotonic())
        return original(self, *args, **kwargs)

    FlinkRestClient.stop_with_savepoint = wrapped  # type: ignore[method-assign]
    try:
        yield stamps
    finally:
        FlinkRestClient.stop_with_savepoint = original  # type: ignore[method-assign]


class Bench:
    def __init__(self, args: argparse.Namespace, root: Path, jar: Path) -> None:
        self.args = args
        self.repo = GitRepo(root, jar, args.checkpoint_interval)
        self.state = root / "state"
        self.rate = BASE_RATE
        self.events: list[tuple[float, StepEvent]] = []
        self._reused: Reconciler | None = None
        self.rt = LocalRuntime(self.state, clock=SystemClock())
        self.http = httpx.Client(timeout=60)
        self.observer: Observer | None = None

    # -- plumbing --------------------------------------------------------------------------------

    def settings(self) -> Settings:
        return load_settings({"repo_url": str(self.repo.work), "state_dir": self.state, "status_sink": "none"})

    def on_event(self, ev: StepEvent) -> None:
        self.events.append((time.monotonic(), ev))

    def reconciler(self) -> Reconciler:
        if self.args.a_mode == "reuse" and self._reused is not None:
            return self._reused
        rec = make_reconciler(self.settings(), SystemClock(), on_event=self.on_event, report=False)
        if self.args.a_mode == "reuse":
            self._reused = rec
        return rec

    @property
    def url(self) -> str:
        rec = self.rt.read_record(APP)
        assert rec is not None, "no cluster"
        return rec.rest_url

    def running_job(self) -> str:
        jobs = self.http.get(f"{self.url}/jobs/overview").json()["jobs"]
        live = [j["jid"] for j in jobs if j["state"] not in ("FINISHED", "CANCELED", "FAILED")]
        assert len(live) == 1, jobs
        return str(live[0])

    def restored_from_savepoint(self, job_id: str) -> bool:
        body = self.http.get(f"{self.url}/jobs/{job_id}/checkpoints").json()
        restored = (body.get("latest") or {}).get("restored") or {}
        return bool(restored.get("is_savepoint"))

    def wait_checkpoint(self, job_id: str, poll: float, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while True:
            body = self.http.get(f"{self.url}/jobs/{job_id}/checkpoints").json()
            if int((body.get("counts") or {}).get("completed", 0)) > 0:
                return
            if time.monotonic() > end:
                raise TimeoutError(f"job {job_id} completed no checkpoint")
            time.sleep(poll)

    # -- create -------------------------------------------------------------------------------------

    def create(self) -> None:
        rev = self.repo.commit_rate(self.rate)
        rec = self.reconciler()
        with rec.journal.lock_exclusive():
            rec.source.fetch()
            result = rec.apply(rec.source.resolve(rev))
        assert result.ok, {k: v.message for k, v in result.results.items()}
        self._close(rec)

    def _close(self, rec: Reconciler) -> None:
        if rec is self._reused:
            return
        rec.journal.close()
        if rec.runtime is not None:
            rec.runtime.close()  # type: ignore[attr-defined]

    # -- A: through apply -----------------------------------------------------------------------------

    def cycle_a(self) -> dict[str, Any]:
        assert self.observer is not None
        old_job = self.running_job()
        self.rate += 1
        rev = self.repo.commit_rate(self.rate)
        self.events.clear()
        with stop_requests() as stops:
            t0 = time.monotonic()
            rec = self.reconciler()
            with rec.journal.lock_exclusive():
                rec.source.fetch()
                result = rec.apply(rec.source.resolve(rev))
            t_end = time.monotonic()
        self._close(rec)
        res = result.results.get(APP)
        assert result.ok and res is not None and res.job_id, {k: v.message for k, v in result.results.items()}
        assert len(stops) == 1, f"expected one stop request, saw {len(stops)}"
        new_job = res.job_id
        running = self.observer.wait_running(new_job)
        ended = self.observer.wait_ended(old_job)
        ev_stop = next(t for t, e in self.events if e.index == 0 and e.phase is EventPhase.STARTED
                       and e.description.startswith("stop job"))
        ev_run = next(t for t, e in self.events if e.phase is EventPhase.DONE
                      and e.description.startswith("wait until") and "RUNNING" in e.description)
        return {
            "variant": "A", "revision": rev[:12], "old_job": old_job, "new_job": new_job,
            "downtime": running - stops[0], "stopped_to_running": running - ended,
            "downtime_events": ev_run - ev_stop, "cycle": t_end - t0, "before_stop": stops[0] - t0,
            "steps": {k: round(v, 4) for k, v in res.step_timings},
            "restored_from_savepoint": self.restored_from_savepoint(new_job),
        }

    # -- B: bare REST ----------------------------------------------------------------------------------

    def cycle_b(self) -> dict[str, Any]:
        assert self.observer is not None
        poll = self.args.rest_poll
        url = self.url
        rec = self.rt.read_record(APP)
        assert rec is not None and rec.jars, "A's create uploaded the jar"
        jar_id = next(iter(rec.jars.values()))
        old_job = self.running_job()
        self.rate += 1
        new_job = uuid.uuid4().hex
        http = self.http

        t_stop = time.monotonic()
        r = http.post(f"{url}/jobs/{old_job}/stop", json={"drain": False, "formatType": "CANONICAL"})
        r.raise_for_status()
        trigger = r.json()["request-id"]
        while True:
            body = http.get(f"{url}/jobs/{old_job}/savepoints/{trigger}").json()
            if body["status"]["id"] == "COMPLETED":
                op = body.get("operation") or {}
                if "failure-cause" in op or not op.get("location"):
                    raise RuntimeError(f"stop-with-savepoint failed: {op}")
                location = op["location"]
                break
            time.sleep(poll)
        t_saved = time.monotonic()
        r = http.post(f"{url}/jars/{jar_id}/run", json={
            "entryClass": COUNTER_MAIN, "programArgsList": job_args(self.rate), "parallelism": 1,
            "savepointPath": location, "allowNonRestoredState": False, "claimMode": "NO_CLAIM", "jobId": new_job,
        })
        r.raise_for_status()
        t_submitted = time.monotonic()
        while True:
            jobs = http.get(f"{url}/jobs/overview").json()["jobs"]
            mine = [j for j in jobs if j["jid"] == new_job]
            if mine and mine[0]["state"] == "RUNNING" and mine[0]["tasks"]["running"] == mine[0]["tasks"]["total"]:
                break
            time.sleep(poll)
        t_running = time.monotonic()
        if self.args.checkpoint_interval:
            self.wait_checkpoint(new_job, poll)
        t_end = time.monotonic()
        running = self.observer.wait_running(new_job)
        ended = self.observer.wait_ended(old_job)
        return {
            "variant": "B", "old_job": old_job, "new_job": new_job,
            "downtime": running - t_stop, "stopped_to_running": running - ended,
            "downtime_events": t_running - t_stop, "cycle": t_end - t_stop, "before_stop": 0.0,
            "steps": {"stop+savepoint": round(t_saved - t_stop, 4), "run": round(t_submitted - t_saved, 4),
                      "await_running": round(t_running - t_submitted, 4)},
            "restored_from_savepoint": self.restored_from_savepoint(new_job),
        }

    def settle(self) -> None:
        """Let the new job run a moment before stopping it again (a stop right after a start fails)."""
        time.sleep(self.args.settle)


# ---------------------------------------------------------------------------------------------- report


def median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    a = [r for r in rows if r["variant"] == "A"]
    b = [r for r in rows if r["variant"] == "B"]
    out: dict[str, Any] = {"n_a": len(a), "n_b": len(b)}
    for key in ("downtime", "stopped_to_running", "downtime_events", "cycle"):
        ma, mb = median(a, key), median(b, key)
        out[key] = {"a_median": round(ma, 4), "b_median": round(mb, 4), "ratio": round(ma / mb, 3) if mb else None,
                    "a_min": round(min(float(r[key]) for r in a), 4), "a_max": round(max(float(r[key]) for r in a), 4),
                    "b_min": round(min(float(r[key]) for r in b), 4), "b_max": round(max(float(r[key]) for r in b), 4)}
    steps: dict[str, list[float]] = {}
    for r in a:
        for k, v in r["steps"].items():
            steps.setdefault(k, []).append(v)
    out["a_step_medians"] = {k: round(statistics.median(v), 4) for k, v in steps.items()}
    out["a_before_stop_median"] = round(median(a, "before_stop"), 4)
    return out


def markdown(summary: dict[str, Any], args: argparse.Namespace) -> str:
    label = {
        "downtime": "downtime: stop request -> new job all tasks RUNNING (observer)",
        "stopped_to_running": "old job FINISHED -> new job all tasks RUNNING (observer)",
        "downtime_events": "downtime as the driver saw it (A: step events; B: its own poll)",
        "cycle": "whole cycle (A: make_reconciler/fetch -> apply returns; B: stop -> RUNNING)",
    }
    lines = [
        f"A = apply ({args.a_mode} Reconciler), B = bare REST (poll {args.rest_poll:g}s); "
        f"{summary['n_a']} + {summary['n_b']} alternating cycles; checkpointing "
        f"{args.checkpoint_interval or 'off'}; observer poll {args.observe_poll:g}s",
        "",
        "| metric (s, medians) | A apply | B REST | A/B |",
        "|---|---:|---:|---:|",
    ]
    for key, text in label.items():
        m = summary[key]
        lines.append(f"| {text} | {m['a_median']:.3f} | {m['b_median']:.3f} | {m['ratio']:.2f} |")
    steps = ", ".join(f"{k} {v:.3f}" for k, v in summary["a_step_medians"].items())
    lines += ["", f"A's steps (medians, s): {steps}; A before the stop request: "
              f"{summary['a_before_stop_median']:.3f}"]
    return "\n".join(lines)


def run_rounds(args: argparse.Namespace, changes: Sequence[tuple[str, Callable[[], dict[str, Any]]]],
               before: Callable[[], None], check: Callable[[str, dict[str, Any]], None]) -> list[dict[str, Any]]:
    """`args.warmup` unmeasured then `args.cycles` measured rounds of every change in order (`before` each);
    each row is checked and printed as a JSON line. The measured rows."""
    rows: list[dict[str, Any]] = []
    for i in range(args.warmup + args.cycles):
        for name, change in changes:
            before()
            row = change()
            row["round"], row["warmup"] = i, i < args.warmup
            check(name, row)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            if not row["warmup"]:
                rows.append(row)
    return rows


def remove_cluster(rt: LocalRuntime, app: str, root: Path, *, keep: bool) -> None:
    """The bench's cluster and temp dir deleted, or (`keep`) left in place and named."""
    if keep:
        print(f"kept: {root} (cluster of {app} still running)", file=sys.stderr)
        return
    rt.delete_cluster(app, deadline=time.monotonic() + 60)
    rt.close()
    shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=5, help="measured cycles of each of A and B (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured A+B rounds first (default 1)")
    p.add_argument("--a-mode", choices=["fresh", "reuse"], default="fresh",
                   help="fresh: a new Reconciler per cycle, as each `apply` process has; reuse: one, as the daemon")
    p.add_argument("--rest-poll", type=float, default=0.2, help="B's poll interval (default 0.2 = the executor's)")
    p.add_argument("--observe-poll", type=float, default=0.02, help="observer's poll interval (default 0.02)")
    p.add_argument("--checkpoint-interval", default=None, help="e.g. '1 s': checkpointing on (A: AwaitHealthy)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds between cycles (default 1)")
    p.add_argument("--jar", type=Path, help="a built counter.jar (default: build it)")
    p.add_argument("--json", type=Path, help="also write all results as JSON to this file")
    p.add_argument("--keep", action="store_true", help="leave the cluster and temp dir (printed) in place")
    args = p.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="upgrade-bench-"))
    jar = args.jar or build_jar(root / "counter.jar")
    bench = Bench(args, root, jar)
    try:
        t = time.monotonic()
        bench.create()
        print(json.dumps({"setup": "created app and cluster", "seconds": round(time.monotonic() - t, 2)}), flush=True)
        bench.observer = Observer(bench.url, args.observe_poll)
        bench.observer.start()
        order: list[tuple[str, Callable[[], dict[str, Any]]]] = [("A", bench.cycle_a), ("B", bench.cycle_b)]

        def check(name: str, row: dict[str, Any]) -> None:
            assert row["restored_from_savepoint"], f"{name}: the new job did not restore from a savepoint"

        rows = run_rounds(args, order, bench.settle, check)
        summary = summarize(rows)
        doc = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "summary": summary, "cycles": rows, "observer_errors": bench.observer.errors}
        print(json.dumps({"summary": summary}, indent=2))
        print()
        print(markdown(summary, args))
        if args.json:
            args.json.write_text(json.dumps(doc, indent=2))
    finally:
        if bench.observer:
            bench.observer.stop()
        bench.http.close()
        remove_cluster(bench.rt, APP, root, keep=args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
