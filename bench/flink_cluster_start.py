"""Local runtime: cluster launch -> ready time, JVM memory, job start and teardown, on this machine.

For each run, in a fresh state dir: ensure_cluster (launch -> GET /overview shows the TaskManagers
and their slots), RSS of the JobManager and TaskManager at ready, start the counter job and wait until
every task runs, RSS again, then delete_cluster. Variants (alternated run by run, so machine load hits
both alike):
- default: what LocalRuntime does (memory flags cached per state dir: the first start of a config pays
  two BashJavaUtils JVMs, so `cold` runs use a fresh state dir, `warm` runs reuse the cache);
- appcds: the same plus a dynamic AppCDS archive per role (dumped by a first, unmeasured run).

    .venv/bin/python bench/flink_cluster_start.py [--runs 3] [--variants cold,warm,appcds] [--json out.json]

Prints one JSON line per run and a Markdown table of medians. Not a test: nothing is asserted.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.clock import SystemClock  # noqa: E402
from reconciler.core.observed import JobPhase, job_phase  # noqa: E402
from reconciler.live.local.runtime import LocalRuntime  # noqa: E402
from tests.fixtures.flink import COUNTER_DIR, counter_app  # noqa: E402

JOB_ID = "b" * 32


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def build_jar(out: Path) -> Path:
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(["bash", str(COUNTER_DIR / "build.sh"), str(out)], env=env, check=True, capture_output=True)
    return out


def one_run(variant: str, work: Path, jar: Path, cds_dir: Path, run: int) -> dict[str, object]:
    clock = SystemClock()
    state = work / ("warm-state" if variant in ("warm", "appcds") else f"cold-{run}")
    conf: dict[str, str] = {}
    if variant == "appcds":
        for role in ("jobmanager", "taskmanager"):
            jsa = cds_dir / f"{role}.jsa"
            flag = f"-XX:SharedArchiveFile={jsa}" if jsa.exists() else f"-XX:ArchiveClassesAtExit={jsa}"
            conf[f"env.java.opts.{role}"] = flag
    app = counter_app("bench", jar_uri=str(jar), output_dir=str(work / "out"), rate=100, flink_configuration=conf)
    rt = LocalRuntime(state, clock=clock)
    t0 = time.monotonic()
    rt.ensure_cluster(app, deadline=clock.monotonic() + 180)
    ready = time.monotonic() - t0
    rec = rt.read_record("bench")
    assert rec is not None
    jm_rss, tm_rss = rss_mib(rec.jobmanager.pid), rss_mib(rec.taskmanagers[0].pid)
    t1 = time.monotonic()
    rt.start_job(app, job_id=JOB_ID, jar=jar, restore_path=None, allow_non_restored_state=False,
                 deadline=clock.monotonic() + 120)
    flink = rt.flink("bench")
    while True:
        j = flink.job(JOB_ID)
        if job_phase(j.state, j.tasks_running, j.tasks_total) is JobPhase.RUNNING:
            break
        time.sleep(0.05)
    running = time.monotonic() - t1
    time.sleep(3)  # a few checkpoints
    jm_rss_job, tm_rss_job = rss_mib(rec.jobmanager.pid), rss_mib(rec.taskmanagers[0].pid)
    t2 = time.monotonic()
    rt.delete_cluster("bench", deadline=clock.monotonic() + 60)
    delete = time.monotonic() - t2
    rt.close()
    return {
        "variant": variant, "run": run, "launch_to_ready_s": round(ready, 2), "submit_to_running_s": round(running, 2),
        "delete_with_job_s": round(delete, 2), "jm_rss_ready_mib": round(jm_rss), "tm_rss_ready_mib": round(tm_rss),
        "jm_rss_job_mib": round(jm_rss_job), "tm_rss_job_mib": round(tm_rss_job),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variants", default="cold,warm,appcds")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    variants = args.variants.split(",")
    work = Path(tempfile.mkdtemp(prefix="flink-bench-"))
    try:
        jar = build_jar(work / "counter.jar")
        cds = work / "cds"
        cds.mkdir()
        if "appcds" in variants:
            one_run("appcds", work, jar, cds, -1)  # dumps the archives at JVM exit; not measured
        if "warm" in variants or "appcds" in variants:
            one_run("warm", work, jar, cds, -1)  # fills the memory-flag cache; not measured
        rows = []
        for run in range(args.runs):
            for v in variants:
                row = one_run(v, work, jar, cds, run)
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keys = ["launch_to_ready_s", "submit_to_running_s", "delete_with_job_s", "jm_rss_ready_mib", "tm_rss_ready_mib",
            "jm_rss_job_mib", "tm_rss_job_mib"]
    print(f"\nmedians of {args.runs} runs ({os.cpu_count()} CPUs)\n")
    print("| variant | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    summary = {}
    for v in variants:
        med = {k: statistics.median(float(r[k]) for r in rows if r["variant"] == v) for k in keys}  # type: ignore[arg-type]
        summary[v] = med
        print(f"| {v} | " + " | ".join(f"{med[k]:g}" for k in keys) + " |")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "medians": summary}, indent=2))


if __name__ == "__main__":
    main()
