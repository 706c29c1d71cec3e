"""Alerts from real Flink (the local runtime's JVMs), module-scoped: one daemon, two apps of the counter job.

- `loop` fails on every start (`--fail-above`, no Flink restart strategy): the daemon's repairs back off, and its
  webhook says FlinkAppCrashLooping within the backoff plus one poll of the first failed repair; a fix pushed to Git
  resolves it (one "resolved" message).
- `ckpt` runs, then its checkpoint directory is made unusable (replaced by a file: the tests run as root, for whom
  a chmod is no obstacle): checkpoints fail while the job runs on (tolerable failures), and
  FlinkAppCheckpointTooOld fires; the directory back, checkpoints complete again and it resolves.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.clock import SystemClock
from reconciler.live.local.runtime import LocalRuntime
from tests.alerting.receivers import HttpReceiver, Received
from tests.e2e.test_daemon_e2e import DaemonProc, metric, poll, running_job
from tests.fixtures.flink import COUNTER_MAIN, teardown_runtime
from tests.gitutil import Repo

pytestmark = [pytest.mark.flink, pytest.mark.slow]

JAR = "jobs/counter/counter.jar"
POLL_S = 2
BACKOFF_S = 20


def spec(name: str, *, conf: str = "", args: str = "") -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
  namespace: team-a
spec:
  taskManager:
    slots: 1
  flinkConfiguration:
    execution.checkpointing.interval: 1 s
{conf}  job:
    jarURI: {JAR}
    entryClass: {COUNTER_MAIN}
    args: ["--output-dir", "out", "--keys", "4", "--rate", "40"{args}]
    parallelism: 1
  recovery:
    gracePeriod: 10s
  deadlines:
    start: 90s
    healthy: 60s
"""


LOOP = dict(conf="    restart-strategy.type: none\n", args=', "--fail-above", "100"')


@dataclass
class Env:
    repo: Repo
    runtime: LocalRuntime
    daemon: DaemonProc
    hook: HttpReceiver
    state_dir: Path

    def sent(self, alert: str, app: str, status: str = "firing") -> list[Received]:
        return [g for g in self.hook.got
                if (d := g.json())["alert"] == alert and d["app"] == app and d["status"] == status]


@pytest.fixture(scope="module")
def env(flink_home: Path, counter_jar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("alerts-flink")
    repo = Repo(root)
    repo.write(JAR, counter_jar.read_bytes())
    repo.write("apps/loop.yaml", spec("loop", **LOOP))
    repo.write("apps/ckpt.yaml", spec("ckpt", conf="    execution.checkpointing.tolerable-failed-checkpoints: 1000\n"))
    repo.commit("two apps")
    hook = HttpReceiver(secret=b"flink-e2e-key")
    state_dir = root / "state"
    alerting = {"sinks": [{"name": "ops", "type": "webhook", "url": hook.url, "hmac_secret": "flink-e2e-key"}],
                "checkpoint_age_min": "5s", "checkpoint_age_factor": 3}
    daemon = DaemonProc.start(root / "daemon.log", repo_url=str(repo.origin), state_dir=state_dir,
                              poll_interval=POLL_S, drift_interval=POLL_S, max_parallel=2, shutdown_deadline=30,
                              repair_max_attempts=5, repair_backoff=BACKOFF_S, repair_window=600,
                              alerting=json.dumps(alerting))
    runtime = LocalRuntime(state_dir, clock=SystemClock(), flink_home=flink_home)
    e = Env(repo, runtime, daemon, hook, state_dir)
    try:
        yield e
    finally:
        rc = daemon.stop()
        teardown_runtime(runtime)
        hook.close()
        assert rc == 0, daemon.log_tail()


def _history(env: Env, app: str) -> list[dict[str, Any]]:
    import subprocess
    import sys

    from tests.e2e.test_daemon_e2e import ROOT

    out = subprocess.run([sys.executable, "-m", "reconciler.cli", "history", app, "--state-dir", str(env.state_dir),
                          "--output", "json"], cwd=ROOT, env={**env.daemon.env}, capture_output=True, text=True,
                         timeout=120, check=True)
    return list(json.loads(out.stdout)["transitions"])


def test_a_job_that_fails_on_every_start_alerts_crash_loop_within_the_backoff_and_resolves_on_a_fix(env: Env) -> None:
    fired = poll(lambda: env.sent("FlinkAppCrashLooping", "loop"), timeout=300, interval=0.5,
                 what="the crash-loop notification of loop", alive=env.daemon.died)
    arrived = time.time() - (time.monotonic() - fired[0].at)  # wall time of its arrival
    repairs = [t for t in _history(env, "loop") if t["action"] == "repair"]
    assert repairs, "it fired after a repair"
    first_done = datetime.fromisoformat(repairs[0]["at"]).timestamp()
    assert arrived - first_done <= BACKOFF_S + POLL_S, (
        f"notified {arrived - first_done:.1f}s after the first repair ended (backoff {BACKOFF_S}s + poll {POLL_S}s)")
    doc = fired[0].json()
    assert doc["namespace"] == "team-a" and doc["severity"] == "critical"
    assert "repair" in doc["detail"], doc
    assert env.daemon.metric("flink_reconciler_app_phase", app="loop", namespace="team-a", phase="crash_loop") == 1
    assert len(env.sent("FlinkAppCrashLooping", "loop")) == 1, "once, not once per pass"

    env.repo.write("apps/loop.yaml", spec("loop", conf=LOOP["conf"]))  # the fix: no --fail-above
    env.repo.commit("loop: fixed")
    poll(lambda: env.sent("FlinkAppCrashLooping", "loop", "resolved"), timeout=240, interval=0.5,
         what="the crash loop resolved after the fix", alive=env.daemon.died)
    assert running_job(env.runtime, "loop") is not None
    assert len(env.sent("FlinkAppCrashLooping", "loop")) == 1


def test_checkpoints_that_fail_alert_checkpoint_age_and_resolve_when_they_complete_again(env: Env) -> None:
    def checkpointing() -> str | None:
        job = running_job(env.runtime, "ckpt")
        if job is None or env.runtime.flink("ckpt").checkpoints(job.job_id).completed_count < 2:
            return None
        return job.job_id

    job_id = poll(checkpointing, timeout=240, interval=1, what="ckpt running and checkpointing",
                  alive=env.daemon.died)
    assert not env.sent("FlinkAppCheckpointTooOld", "ckpt")
    job_dir = env.runtime.paths("ckpt").checkpoints / job_id
    assert job_dir.is_dir()
    shutil.rmtree(job_dir)
    job_dir.write_text("not a directory: checkpoints cannot be written\n")
    try:
        fired = poll(lambda: env.sent("FlinkAppCheckpointTooOld", "ckpt"), timeout=120, interval=0.5,
                     what="the checkpoint-age notification of ckpt", alive=env.daemon.died)
        assert "failed checkpoints" in fired[0].json()["summary"], fired[0].json()
        text = env.daemon.metrics()
        assert metric(text, "flink_reconciler_app_checkpoints_failed_total", app="ckpt", namespace="team-a") > 0
        assert metric(text, "flink_reconciler_app_job_running", app="ckpt", namespace="team-a") == 1
    finally:
        job_dir.unlink()
        job_dir.mkdir()
    poll(lambda: env.sent("FlinkAppCheckpointTooOld", "ckpt", "resolved"), timeout=120, interval=0.5,
         what="the checkpoint-age alert resolved", alive=env.daemon.died)
    still = running_job(env.runtime, "ckpt")
    assert still is not None and still.job_id == job_id, "the job ran on throughout"
