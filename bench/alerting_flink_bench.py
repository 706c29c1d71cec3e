"""Notification latency on real Flink (docs/alerts.md#what-it-costs): a daemon on the local runtime, one app of the
counter job that fails on every start (`--fail-above`, no Flink restart strategy), its crash-loop notification to
a webhook receiver on loopback. Prints, for one run: the first job failure (Flink's end-time of the first FAILED
job) -> the notification; the end of the first failed repair (its history line) -> the notification; the
condition first seen by a pass (the message's `since`) -> the receiver having it.

Run: .venv/bin/python bench/alerting_flink_bench.py [--poll-interval 2] [--repair-backoff 20]
Not a test: nothing is asserted. Takes a minute or two (JVMs start).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from reconciler.clock import SystemClock
from reconciler.live.local.config import find_flink_home
from reconciler.live.local.runtime import LocalRuntime
from tests.alerting.receivers import HttpReceiver
from tests.alerting.test_alerts_flink import JAR, LOOP, spec
from tests.e2e.test_daemon_e2e import ROOT, DaemonProc
from tests.fixtures.flink import COUNTER_DIR, teardown_runtime
from tests.gitutil import Repo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--poll-interval", type=float, default=2.0)
    ap.add_argument("--repair-backoff", type=float, default=20.0)
    args = ap.parse_args()
    home = find_flink_home()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        jar = tmp / "counter.jar"
        subprocess.run(["bash", str(COUNTER_DIR / "build.sh"), str(jar)], check=True, capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "FLINK_HOME": str(home)})
        repo = Repo(tmp)
        repo.write(JAR, jar.read_bytes())
        repo.write("apps/loop.yaml", spec("loop", **LOOP))
        repo.commit("a crash-looping app")
        hook = HttpReceiver()
        state = tmp / "state"
        daemon = DaemonProc.start(tmp / "daemon.log", repo_url=str(repo.origin), state_dir=state,
                                  poll_interval=args.poll_interval, drift_interval=args.poll_interval,
                                  repair_max_attempts=5, repair_backoff=args.repair_backoff, repair_window=600,
                                  alerting=json.dumps({"sinks": [{"name": "ops", "type": "webhook", "url": hook.url}]}))
        runtime = LocalRuntime(state, clock=SystemClock(), flink_home=home)
        try:
            deadline = time.monotonic() + 600
            while not any(g.json()["alert"] == "FlinkAppCrashLooping" for g in hook.got):
                if time.monotonic() > deadline or daemon.died():
                    raise SystemExit(f"no notification: {daemon.died() or 'timeout'}\n{daemon.log_tail()}")
                time.sleep(0.05)
            got = next(g for g in hook.got if g.json()["alert"] == "FlinkAppCrashLooping")
            arrived = time.time() - (time.monotonic() - got.at)
            rec = runtime.read_record("loop")
            assert rec is not None
            jobs = httpx.get(rec.rest_url + "/jobs/overview", timeout=5).json()["jobs"]
            failed = sorted(j["end-time"] / 1000 for j in jobs if j["state"] == "FAILED" and j["end-time"] > 0)
            out = subprocess.run([sys.executable, "-m", "reconciler.cli", "history", "loop", "--state-dir", str(state),
                                  "--output", "json"], cwd=ROOT, env=daemon.env, capture_output=True, text=True,
                                 check=True)
            repairs = [t for t in json.loads(out.stdout)["transitions"] if t["action"] == "repair"]
            since = datetime.fromisoformat(got.json()["since"]).timestamp()
            doc = {
                "poll_interval_s": args.poll_interval, "repair_backoff_s": args.repair_backoff,
                "first_job_failure_to_notification_s": round(arrived - failed[0], 2) if failed else None,
                "first_repair_end_to_notification_s": round(arrived - datetime.fromisoformat(repairs[0]["at"])
                                                            .timestamp(), 2) if repairs else None,
                "condition_seen_to_received_ms": round((arrived - since) * 1000, 1),
            }
            print(json.dumps(doc, indent=2))
        finally:
            daemon.stop()
            teardown_runtime(runtime)
            hook.close()


if __name__ == "__main__":
    main()
