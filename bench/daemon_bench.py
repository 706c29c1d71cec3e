"""The daemon as users run it (`flink-reconciler run` in its own process, a bare repo as origin).

1. Latency from `git push` to the new job RUNNING, with a signed GitHub webhook and with polling only,
   on the local runtime with real Flink JVMs (the counter example job, an args change = a savepoint
   upgrade). Split into pickup (push -> the upgrade starts, from the journal) and the upgrade itself
   (upgrade start -> every task of the new job RUNNING, seen in Flink's REST API at 50 ms).
2. Idle CPU and RSS of the daemon with N synthetic apps and no Flink (FLINK_RECONCILER_DRY_RUN=true),
   default intervals (poll 15 s, drift 60 s) and the git-notes status sink, sampled from /proc every
   second over a window after the first full pass and its notes are done. CPU includes the git
   processes the daemon runs (cutime/cstime) and is a percentage of one core.

Run: .venv/bin/python bench/daemon_bench.py [--trials 5] [--poll-interval 15] [--apps 100,1000]
         [--idle-seconds 60] [--skip-latency] [--skip-idle]
Prints one JSON document, then Markdown tables. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from reconciler.clock import SystemClock
from reconciler.live.local.config import find_flink_home
from reconciler.live.local.runtime import LocalRuntime
from tests.e2e.test_daemon_e2e import (
    APP,
    JAR_PATH,
    SPEC_FILE,
    DaemonProc,
    at_epoch,
    counter_spec,
    fetch_note,
    github_push,
    metric,
    note_line,
    running_job,
    transitions,
)
from tests.fixtures.flink import COUNTER_DIR, teardown_runtime
from tests.gitutil import Repo

SECRET = "bench-webhook-secret"
CLK_TCK = os.sysconf("SC_CLK_TCK")

SYNTH = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: app-{i:04d}
spec:
  taskManager:
    slots: 2
  flinkConfiguration:
    execution.checkpointing.interval: 10 s
  job:
    jarURI: jobs/app.jar
    entryClass: com.example.Job{i}
    args: ["--id", "{i}"]
    parallelism: {p}
    upgradeMode: savepoint
"""


def wait(probe: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "mean": round(statistics.fmean(xs), 3)}


# ---------------------------------------------------------------------------------------------- latency


def build_jar(out: Path, flink_home: Path) -> Path:
    env = {**os.environ, "PYTHON": sys.executable, "FLINK_HOME": str(flink_home)}
    subprocess.run(["bash", str(COUNTER_DIR / "build.sh"), str(out)], env=env, check=True, capture_output=True)
    return out


def latency(root: Path, trials: int, poll_interval: float) -> dict[str, Any]:
    flink_home = find_flink_home()
    repo = Repo(root)
    repo.write(JAR_PATH, build_jar(root / "counter.jar", flink_home).read_bytes())
    rate = 80
    repo.write(SPEC_FILE, counter_spec(rate=rate))
    first = repo.commit("counter")
    state = root / "state"
    runtime = LocalRuntime(state, clock=SystemClock(), flink_home=flink_home)
    d = DaemonProc.start(root / "daemon.log", repo_url=repo.origin, state_dir=state, poll_interval=poll_interval,
                         drift_interval=60, github_webhook_secret=SECRET, status_sink="notes")
    out: dict[str, Any] = {"poll_interval_s": poll_interval, "drift_interval_s": 60, "trials": {}}
    try:
        t0 = time.time()
        wait(lambda: (note_line(repo, first) or "").startswith(f"flink-reconciler/{APP}: success"), 600,
             "the app to be created")
        out["create_s"] = round(time.time() - t0, 2)
        runs: dict[str, list[dict[str, float]]] = {"webhook": [], "poll": []}
        for i in range(trials):
            for mode in ("webhook", "poll"):
                old = wait(lambda: running_job(runtime, APP), 120, "a running job")
                rate += 10
                repo.write(SPEC_FILE, counter_spec(rate=rate))
                sha = repo.commit(f"rate {rate}")  # returns once `git push` is done
                t_push = time.time()
                if mode == "webhook":
                    headers, body = github_push(SECRET, sha)
                    r = httpx.post(d.url + "/webhook", content=body, headers=headers, timeout=10)
                    assert r.status_code == 202, r.text
                new = wait(lambda o=old: (j := running_job(runtime, APP)) and j.job_id != o.job_id and j,
                           300, "the new job RUNNING", interval=0.05)
                t_running = time.time()
                wait(lambda s=sha: (note_line(repo, s) or "").split(": ", 1)[-1].startswith(("success", "failure")),
                     120, "the final note")
                line = note_line(repo, sha) or ""
                start = [t for t in transitions(state, str(repo.origin), revision=sha) if t["action"] == "upgrade"]
                t_start = at_epoch(start[0])
                runs[mode].append({
                    "push_to_running_s": round(t_running - t_push, 3),
                    "pickup_s": round(t_start - t_push, 3),
                    "upgrade_s": round(t_running - t_start, 3),
                    "ok": line.split(": ", 1)[-1].startswith("success"),
                    "job": new.job_id,
                })
                print(f"[latency] trial {i + 1} {mode}: {runs[mode][-1]}", file=sys.stderr, flush=True)
        for mode, rs in runs.items():
            out["trials"][mode] = rs
            out[mode] = {k: summary([r[k] for r in rs]) for k in ("push_to_running_s", "pickup_s", "upgrade_s")}
        out["webhook_passes"] = d.passes("webhook")
        out["poll_passes"] = d.passes("poll")
    finally:
        d.stop()
        teardown_runtime(runtime)
    return out


# ---------------------------------------------------------------------------------------------- idle


def proc_sample(pid: int) -> tuple[int, int, int]:
    """(CPU ticks incl. waited-for children, VmRSS kB, VmHWM kB)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return ticks, int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


def idle(root: Path, n: int, seconds: float) -> dict[str, Any]:
    repo = Repo(root)
    for i in range(n):
        repo.write(f"apps/app-{i:04d}.yaml", SYNTH.format(i=i, p=1 + i % 2))
    head = repo.commit(f"{n} apps")
    t0 = time.time()
    d = DaemonProc.start(root / "daemon.log", repo_url=repo.origin, state_dir=root / "state", dry_run=True)
    pid = d.proc.pid
    try:
        wait(lambda: d.passes("startup") >= 1, 900, "the first full pass", interval=0.5)
        first_pass = d.metric("flink_reconciler_sync_duration_seconds_sum", trigger="startup")
        wait(lambda: len(fetch_note(repo, head).splitlines()) >= n, 900, f"{n} note lines", interval=1)
        ready_after = time.time() - t0
        time.sleep(2)
        text = d.metrics()
        before = {t: metric(text, "flink_reconciler_sync_passes_total", trigger=t) for t in ("poll", "drift")}
        log_start = len(d.log())
        ticks0, _, _ = proc_sample(pid)
        t_start = time.monotonic()
        rss: list[int] = []
        while time.monotonic() - t_start < seconds:
            time.sleep(1.0)
            rss.append(proc_sample(pid)[1])
        ticks1, rss_now, hwm = proc_sample(pid)
        elapsed = time.monotonic() - t_start
        text = d.metrics()
        after = {t: metric(text, "flink_reconciler_sync_passes_total", trigger=t) for t in ("poll", "drift")}
        full = full_passes(d.log()[log_start:])
        return {
            "apps": n,
            "window_s": round(elapsed, 1),
            "cpu_percent": round(100.0 * (ticks1 - ticks0) / CLK_TCK / elapsed, 3),
            "rss_mb_mean": round(statistics.fmean(rss) / 1024, 1),
            "rss_mb_max": round(max(rss) / 1024, 1),
            "rss_mb_end": round(rss_now / 1024, 1),
            "rss_mb_peak_since_start": round(hwm / 1024, 1),
            "first_full_pass_s": round(first_pass, 2),
            "start_to_notes_done_s": round(ready_after, 1),
            "passes_in_window": sum(after.values()) - sum(before.values()),
            # A drift tick that fires with a poll tick is folded into that pass (then labelled "poll"),
            # so full passes are counted from the log, not from the per-trigger metric.
            "full_passes_in_window": len(full),
            "full_pass_s": round(statistics.fmean(full), 3) if full else None,
        }
    finally:
        d.stop()


def full_passes(records: list[dict[str, Any]]) -> list[float]:
    """Durations of the full (drift) passes in these daemon log records."""
    out: list[float] = []
    in_full = False
    for rec in records:
        if rec.get("msg") == "sync started":
            in_full = bool(rec.get("full"))
        elif rec.get("msg") == "sync finished" and in_full:
            out.append(float(rec.get("seconds", 0.0)))
            in_full = False
    return out


# ---------------------------------------------------------------------------------------------- output


def markdown(result: dict[str, Any]) -> str:
    out: list[str] = []
    lat = result.get("latency")
    if lat:
        out += [f"Push -> new job RUNNING (local runtime, savepoint upgrade of the counter job; poll interval "
                f"{lat['poll_interval_s']:g} s; {len(lat['trials']['webhook'])} trials each; seconds, "
                "median [min-max])", "",
                "| trigger | push -> RUNNING | pickup (push -> upgrade starts) | upgrade (start -> RUNNING) |",
                "| --- | --- | --- | --- |"]
        for mode in ("webhook", "poll"):
            m = lat[mode]
            cells = [f"{m[k]['median']:.2f} [{m[k]['min']:.2f}-{m[k]['max']:.2f}]"
                     for k in ("push_to_running_s", "pickup_s", "upgrade_s")]
            out.append(f"| {mode} | " + " | ".join(cells) + " |")
        out.append("")
    rows = result.get("idle")
    if rows:
        out += ["Idle daemon, dry run (no Flink), poll 15 s, drift 60 s, git-notes sink", "",
                "| apps | window | CPU % (1 core) | RSS mean / max MB | peak RSS since start MB | first full pass s "
                "| later full pass s |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            drift = f"{r['full_pass_s']:.2f}" if r["full_pass_s"] is not None else "-"
            out.append(f"| {r['apps']} | {r['window_s']:.0f} s ({r['passes_in_window']:.0f} passes, "
                       f"{r['full_passes_in_window']} full) | {r['cpu_percent']:.2f} | {r['rss_mb_mean']:.1f}"
                       f" / {r['rss_mb_max']:.1f} | {r['rss_mb_peak_since_start']:.1f} | "
                       f"{r['first_full_pass_s']:.2f} | {drift} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--poll-interval", type=float, default=15.0)
    ap.add_argument("--apps", default="100,1000")
    ap.add_argument("--idle-seconds", type=float, default=60.0, help="sampling window (default: one drift interval)")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-idle", action="store_true")
    args = ap.parse_args()
    result: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="daemon-bench-") as tmp:
        if not args.skip_latency:
            (Path(tmp) / "latency").mkdir()
            result["latency"] = latency(Path(tmp) / "latency", args.trials, args.poll_interval)
        if not args.skip_idle:
            result["idle"] = []
            for n in (int(x) for x in args.apps.split(",")):
                (Path(tmp) / f"idle-{n}").mkdir()
                result["idle"].append(idle(Path(tmp) / f"idle-{n}", n, args.idle_seconds))
                print(f"[idle] {result['idle'][-1]}", file=sys.stderr, flush=True)
    result["loadavg_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    print()
    print(markdown(result))


if __name__ == "__main__":
    main()
