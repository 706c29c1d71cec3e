"""Issue 20 end to end: a daemon on the local runtime (real Flink JVMs) heals routine faults without any Git change.

One daemon, module-scoped, two apps of the counter job: `heal` (Flink's default restart strategy) loses a
TaskManager, then its JobManager, to kill -9; each time its job must run again (exactly one job), its counts go on
from its own state (never reset), and its record says what was repaired. `loop` fails on every start once its
counts pass `--fail-above` (no Flink restart strategy): the daemon repairs it a few times, backing off, then stops
with Flink's exception in its status instead of restarting it forever.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.plan import StartJob, StopWithSavepoint
from reconciler.live.local.runtime import LocalRuntime
from tests.e2e.test_daemon_e2e import HTTP, DaemonProc, Job, poll, running_job
from tests.fixtures.flink import COUNTER_MAIN, read_counts, teardown_runtime
from tests.gitutil import Repo

pytestmark = [pytest.mark.flink, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JAR = "jobs/counter/counter.jar"
KEYS = 4
RATE = 40  # records/s over all keys: 10 per key and second


def spec(name: str, *, extra_conf: str = "", extra_args: str = "", interval: str = "1 s") -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
spec:
  taskManager:
    slots: 1
  flinkConfiguration:
    execution.checkpointing.interval: {interval}
{extra_conf}  job:
    jarURI: {JAR}
    entryClass: {COUNTER_MAIN}
    args: ["--output-dir", "out", "--keys", "{KEYS}", "--rate", "{RATE}"{extra_args}]
    parallelism: 1
  recovery:
    gracePeriod: 20s
  deadlines:
    start: 90s
    healthy: 60s
"""


@dataclass
class Env:
    repo: Repo
    state_dir: Path
    runtime: LocalRuntime
    daemon: DaemonProc

    def counts(self, app: str) -> dict[str, int]:
        return read_counts(self.runtime.paths(app).work / "out")

    def job(self, app: str) -> Job | None:
        return running_job(self.runtime, app)

    def jobs(self, app: str) -> list[dict[str, Any]]:
        rec = self.runtime.read_record(app)
        assert rec is not None
        try:
            return list(HTTP.get(rec.rest_url + "/jobs/overview", timeout=5).json()["jobs"])
        except Exception:
            return []

    def cli(self, *args: str) -> Any:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLINK_RECONCILER_")}
        env["FLINK_RECONCILER_REPO_URL"] = str(self.repo.origin)
        out = subprocess.run([sys.executable, "-m", "reconciler.cli", *args, "--state-dir", str(self.state_dir),
                              "--output", "json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                             check=True)
        return json.loads(out.stdout)

    def transitions(self, app: str) -> list[dict[str, Any]]:
        return list(self.cli("history", app)["transitions"])

    def wait_counting(self, app: str, past: dict[str, int], timeout: float = 150) -> tuple[Job, dict[str, int]]:
        """The one running job of `app` once every key counted past `past`."""
        def probe() -> tuple[Job, dict[str, int]] | None:
            job, c = self.job(app), self.counts(app)
            if job and len(c) == KEYS and all(c[k] > past.get(k, 0) for k in c):
                return job, c
            return None

        return poll(probe, timeout=timeout, what=f"{app} running and counting past {past}", alive=self.daemon.died)


@pytest.fixture(scope="module")
def env(flink_home: Path, counter_jar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("self-heal")
    repo = Repo(root)
    repo.write(JAR, counter_jar.read_bytes())
    repo.write("apps/heal.yaml", spec("heal"))
    repo.write("apps/loop.yaml", spec("loop", extra_conf="    restart-strategy.type: none\n",
                                      extra_args=', "--fail-above", "150"'))
    repo.commit("two apps")
    state_dir = root / "state"
    runtime = LocalRuntime(state_dir, clock=SystemClock(), flink_home=flink_home)
    daemon = DaemonProc.start(root / "daemon.log", repo_url=str(repo.origin), state_dir=state_dir, poll_interval=2,
                              drift_interval=2, status_sink="notes", max_parallel=2, shutdown_deadline=30,
                              repair_max_attempts=3, repair_backoff=1, repair_window=600)
    e = Env(repo, state_dir, runtime, daemon)
    try:
        yield e
    finally:
        rc = daemon.stop()
        teardown_runtime(runtime)
        assert rc == 0, daemon.log_tail()


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def test_a_killed_taskmanager_is_restarted_and_the_job_goes_on_from_its_state(env: Env) -> None:
    job, before = env.wait_counting("heal", {})
    rec = env.runtime.read_record("heal")
    assert rec is not None
    (tm,) = rec.taskmanagers
    _kill(tm.pid)
    seen: list[dict[str, int]] = []

    def healed() -> tuple[Job, dict[str, int]] | None:
        c = env.counts("heal")
        seen.append(c)
        j = env.job("heal")
        after = env.runtime.read_record("heal")
        if j and after and after.taskmanagers[0].pid != tm.pid and all(c.get(k, 0) > before[k] for k in before):
            return j, c
        return None

    job2, _ = poll(healed, timeout=150, what="the TaskManager restarted and the job counting again",
                       alive=env.daemon.died)
    assert job2.job_id == job.job_id, "Flink recovered its own job: no new job was submitted"
    assert [j["jid"] for j in env.jobs("heal") if j["state"] not in ("CANCELED", "FAILED", "FINISHED")] == [job.job_id]
    # never reset: every count seen stayed at or above what the last checkpoint before the kill held
    floor = {k: v - 3 * RATE // KEYS for k, v in before.items()}
    assert all(c.get(k, floor[k]) >= floor[k] for c in seen for k in floor), (before, seen)
    repairs = [t for t in env.transitions("heal") if t["action"] == "repair"]
    assert repairs and "taskmanager-0 not running" in repairs[-1]["message"], env.transitions("heal")
    assert env.daemon.metric("flink_reconciler_repairs_total", kind="taskmanager", outcome="success") >= 1


def test_a_killed_jobmanager_gets_a_new_cluster_and_the_job_restores_its_newest_checkpoint(env: Env) -> None:
    job, _ = env.wait_counting("heal", {})
    # What it restores from: a checkpoint of this job (with none, BLOCKED is the right answer: nothing to restore).
    poll(lambda: env.runtime.flink("heal").checkpoints(job.job_id).completed_count > 0, timeout=90, interval=1,
         what="a completed checkpoint of the running job", alive=env.daemon.died)
    job, before = env.wait_counting("heal", {})
    rec = env.runtime.read_record("heal")
    assert rec is not None
    _kill(rec.jobmanager.pid)
    job2, _ = env.wait_counting("heal", before, timeout=240)  # a new cluster's JVMs start: slow on a loaded machine
    assert job2.job_id != job.job_id, "a JobManager without HA forgets its job: a new one restores the state"
    assert len([j for j in env.jobs("heal") if j["state"] == "RUNNING"]) == 1

    def started_by_repair() -> list[dict[str, Any]] | None:
        # The repair that started the running job; its history entry is written when the repair ends (after the
        # job counts again: it waits for a checkpoint). A later process-only repair, if any, starts no job.
        # (Under load its first checkpoint can miss the step's deadline: the repair is then a failure whose job
        # runs on.)
        lineage = env.cli("history", "heal")["lineage"]
        return [e for e in lineage if e["action"] == "repair" and job2.job_id in (e.get("job_id"),
                                                                                  e.get("submitted_job_id"))] or None

    started = poll(started_by_repair, timeout=120, interval=1, what="the repair's history entry",
                   alive=env.daemon.died)
    assert "/chk-" in (started[-1]["restored_from"] or ""), (job.job_id[:8], job2.job_id[:8], started)
    # A repair whose checkpoint came after its deadline is recorded as recovered once the job has checkpointed.
    def healthy() -> dict[str, Any] | None:
        row = {r["app"]: r for r in env.cli("status")}["heal"]
        return row if row["state"] == "RUNNING" and row["outcome"] == "success" else None

    poll(healthy, timeout=60, interval=1, what="status RUNNING and success", alive=env.daemon.died)


def test_a_job_that_fails_on_every_start_backs_off_then_fails_with_flinks_error(env: Env) -> None:
    def stopped() -> dict[str, Any] | None:
        row = {r["app"]: r for r in env.cli("status")}.get("loop")
        return row if row and row["outcome"] == "failure" and "crash loop" in (row["message"] or "") else None

    row = poll(stopped, timeout=240, what="the crash-looping app failed as a crash loop", alive=env.daemon.died)
    assert "passed --fail-above 150" in row["message"], row
    repairs = [t for t in env.transitions("loop") if t["action"] == "repair"]
    assert len(repairs) == 3, repairs
    starts = [t["at"] for t in repairs]
    assert starts == sorted(starts)
    counts = env.counts("loop")
    assert counts and max(counts.values()) <= 150, "never past the failure point, and never reset to zero"
    n = len(env.transitions("loop"))
    env.daemon.wait_passes("drift", env.daemon.passes("drift") + 3, timeout=60)
    assert len([t for t in env.transitions("loop") if t["action"] == "repair"]) == 3, "no more restarts"
    assert len(env.transitions("loop")) == n, "the repeated crash-loop answer adds no history line"


def test_a_jobmanager_killed_after_the_upgrades_stop_ends_in_the_new_spec_from_the_stops_savepoint(env: Env) -> None:
    """kill -9 of the JobManager once the upgrade's stop-with-savepoint is done and the new job started, while the
    upgrade waits for its first checkpoint: not a rollback onto the dead cluster, not "this spec already failed"
    until a push. The execution is interrupted and the next pass runs the new spec from the savepoint the stop
    took. The new spec's first checkpoint comes 8 s after its start: that wait is long enough to kill in on a
    loaded machine too (at 1 s, an upgrade on a reused cluster could finish within a poll or two of the stop), and
    no checkpoint of the new job can be newer than the stop's savepoint."""
    job, before = env.wait_counting("heal", {})
    journal = Journal(env.state_dir / "journal", SystemClock())
    # Flink starts a job's first checkpoint at a random moment between min-pause and the interval: both 8 s
    env.repo.write("apps/heal.yaml", spec("heal", extra_args=', "--work-us", "1"', interval="8 s",
                                          extra_conf="    execution.checkpointing.min-pause: 8 s\n"))
    env.repo.commit("heal: 1 us of work per record, a checkpoint every 8 s")

    def past_the_start() -> int | None:
        journal.refresh()  # the daemon writes the record; this process reads it anew
        f = journal.inflight("heal")
        if f is None or f.plan.action.value != "upgrade":
            return None
        stops = [i for i, s in enumerate(f.plan.steps) if isinstance(s, StopWithSavepoint)]
        starts = [i for i, s in enumerate(f.plan.steps) if isinstance(s, StartJob)]
        assert stops and starts and stops[0] < starts[0], f.plan.steps
        return f.step_index if f.step_index > starts[0] and f.captured_path else None

    poll(past_the_start, timeout=120, interval=0.05, what="the upgrade's new job started after its stop",
         alive=env.daemon.died)
    rec = env.runtime.read_record("heal")
    assert rec is not None
    _kill(rec.jobmanager.pid)

    def upgraded() -> Job | None:
        journal.refresh()
        j = env.job("heal")
        r = journal.record("heal")
        ok = r is not None and r.last_applied_spec is not None and "--work-us" in json.dumps(r.last_applied_spec)
        return j if j and ok and journal.inflight("heal") is None and j.job_id != job.job_id else None

    job2 = poll(upgraded, timeout=300, interval=1, what="the new spec applied and running", alive=env.daemon.died)
    history = env.transitions("heal")
    assert any(t["message"].startswith("interrupted: ") for t in history), history
    assert not any("rolled back" in t["message"] or "already failed" in t["message"] for t in history[-4:]), history
    lineage = [e for e in env.cli("history", "heal")["lineage"] if job2.job_id in (e.get("job_id"),
                                                                                    e.get("submitted_job_id"))]
    assert lineage and "savepoint-" in (lineage[-1]["restored_from"] or ""), lineage
    env.wait_counting("heal", before)  # counts go on from the savepoint, never reset
    assert len([j for j in env.jobs("heal") if j["state"] == "RUNNING"]) == 1
