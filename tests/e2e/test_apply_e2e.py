"""Issue 3, end to end on real Flink: Git commits -> `flink-reconciler apply` -> the counter job's state.

One Git repository (a working copy with a bare origin), one state directory and one running app are
shared by every test of this module (module-scoped fixture), so the whole module starts a single Flink
session cluster (1 JobManager + 1 TaskManager with 2 slots). Each test commits the next change on top
of whatever the previous test left and checks:

- what the plan says (`plan --live --format json`),
- what `apply` did (exit code, `status --output json`, `history`, the journal),
- what Flink runs (`GET /jobs/overview`, `GET /jobs/{id}/checkpoints`),
- and what the counter job's keyed state did, through the per-key count files it writes: a restore from
  a savepoint continues every count, a start from empty state restarts them.

Nothing sleeps to assert: every wait polls with a deadline and fails with the last value seen.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.cli import main
from reconciler.clock import SystemClock
from reconciler.core.plan import deterministic_job_id
from reconciler.live.local.runtime import LocalRuntime
from reconciler.live.ports import JobSummary
from tests.fixtures.flink import COUNTER_MAIN, REPO_ROOT, read_counts, teardown_runtime, wait_until
from tests.gitutil import Repo

pytestmark = [pytest.mark.flink, pytest.mark.slow]

APP = "e2e-counter"
KEYS = 4
RATE = 100  # records/s over all keys: each count grows by ~25/s (each change adds 1 to it)
SPEC_FILE = "apps/counter.yaml"
JAR_PATH = "jobs/counter/counter.jar"
TRANSIENT_SP_DIR_SUFFIX = ".e2e-moved-away"

# What a crash test saw when it killed `apply` (printed at the end of the module; see the report).
CRASH_NOTES: list[str] = []
# For the tests' own polls of Flink's REST API: a new connection per request (no keep-alive, as `httpx.get`), but
# not a new SSL context per request as `httpx.get` builds (tens of ms of CPU: slow in a tight poll).
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def app_yaml(*, parallelism: int, mode: str, rate: int = RATE, entry_class: str = COUNTER_MAIN) -> str:
    """The app's spec file as a user would write it."""
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
    execution.checkpointing.interval: 1 s
  job:
    jarURI: {JAR_PATH}
    entryClass: {entry_class}
    args: ["--output-dir", "out", "--keys", "{KEYS}", "--rate", "{rate}"]
    parallelism: {parallelism}
    upgradeMode: {mode}
  deadlines:
    savepoint: 60s
    start: 90s
    healthy: 30s
"""


@dataclass
class E2E:
    repo: Repo
    state: Path
    rt: LocalRuntime  # only to observe (REST client, paths); the CLI runs its own runtime
    parallelism: int = 1
    mode: str = "savepoint"
    rate: int = RATE
    entry_class: str = COUNTER_MAIN
    revisions: list[str] = field(default_factory=list)

    # -- Git -------------------------------------------------------------------------------------

    def commit(self, message: str, *, parallelism: int | None = None, mode: str | None = None,
               rate: int | None = None, entry_class: str | None = None) -> str:
        self.parallelism = parallelism or self.parallelism
        self.mode = mode or self.mode
        self.rate = rate or self.rate
        self.entry_class = entry_class or self.entry_class
        self.repo.write(SPEC_FILE, app_yaml(parallelism=self.parallelism, mode=self.mode, rate=self.rate,
                                            entry_class=self.entry_class))
        rev = self.repo.commit(message)
        self.revisions.append(rev)
        return rev

    def next_rate(self) -> int:
        """A job argument change (an upgrade that needs a restart) that keeps the job's meaning. Never
        back to an earlier value, so every commit differs from every spec applied before it."""
        return self.rate + 1

    # -- the CLI ---------------------------------------------------------------------------------

    def cli(self, *args: str) -> tuple[int, str]:
        """`flink-reconciler ARGS` in this process; returns (exit code, stdout + stderr)."""
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = main(list(args))
        return code, buf.getvalue()

    def apply(self) -> tuple[int, str]:
        return self.cli("apply", "--repo", str(self.repo.work), "--state-dir", str(self.state))

    def apply_cmd(self) -> list[str]:
        return [sys.executable, "-m", "reconciler.cli", "apply", "--repo", str(self.repo.work),
                "--state-dir", str(self.state)]

    def apply_process(self) -> subprocess.Popen[str]:
        """`flink-reconciler apply` as a real process (for the crash tests)."""
        return subprocess.Popen(self.apply_cmd(), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def apply_subprocess(self, timeout: float = 240) -> tuple[int, str]:
        proc = subprocess.run(self.apply_cmd(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                              check=False)
        return proc.returncode, proc.stdout + proc.stderr

    def plan_live(self) -> dict[str, Any]:
        code, out = self.cli("plan", "--repo", str(self.repo.work), "--live", "--state-dir", str(self.state),
                             "--format", "json")
        assert code == 0, out
        plan: dict[str, Any] = json.loads(out)
        assert plan["revision"] == self.revisions[-1] and plan["mode"] == "live"
        apps = {a["app"]: a for a in plan["apps"]}
        assert set(apps) == {APP}, plan
        app_plan: dict[str, Any] = apps[APP]
        return app_plan

    def status(self) -> dict[str, Any]:
        code, out = self.cli("status", "--output", "json", "--state-dir", str(self.state))
        assert code == 0, out
        rows = {r["app"]: r for r in json.loads(out)}
        row: dict[str, Any] = rows[APP]
        return row

    def history_json(self) -> dict[str, Any]:
        code, out = self.cli("history", APP, "--output", "json", "--state-dir", str(self.state))
        assert code == 0, out
        doc: dict[str, Any] = json.loads(out)
        return doc

    # -- the journal, read only (what another process sees) ----------------------------------------

    def _record(self) -> dict[str, Any] | None:
        """The app's record as another process reads it (written atomically by rename: never torn)."""
        try:
            doc: dict[str, Any] = json.loads((self.state / "records" / f"{APP}.json").read_text())
        except FileNotFoundError:
            return None
        return doc

    def inflight(self) -> dict[str, Any] | None:
        doc = self._record()
        row: dict[str, Any] | None = doc.get("inflight") if doc else None
        return row

    def app_row(self) -> dict[str, Any]:
        doc = self._record()
        assert doc, "the journal has no record of the app"
        row: dict[str, Any] = doc["record"]
        return row

    def savepoints(self, revision: str) -> list[dict[str, Any]]:
        doc = self._record()
        return [s for s in (doc or {}).get("savepoints", []) if s.get("revision") == revision]

    # -- Flink -----------------------------------------------------------------------------------

    def jobs(self) -> list[JobSummary]:
        return self.rt.flink(APP).jobs()

    def running(self) -> list[str]:
        return [j.job_id for j in self.jobs() if j.state == "RUNNING"]

    def only_running_job(self) -> str:
        """The single job in state RUNNING with all its tasks running (or finished, like an idle source
        subtask); fails on zero or several."""
        def probe() -> str | None:
            live = [j for j in self.jobs() if j.state not in ("FINISHED", "CANCELED", "FAILED")]
            if len(live) == 1 and live[0].state == "RUNNING" and live[0].tasks_running > 0 and (
                    live[0].tasks_running + live[0].tasks_finished == live[0].tasks_total):
                return live[0].job_id
            return None

        job = wait_until(probe, timeout=30, interval=0.2, what="exactly one job with all tasks RUNNING")
        assert self.running() == [job], [(j.job_id, j.state) for j in self.jobs()]
        return job

    def restored_from(self, job_id: str) -> tuple[str | None, bool | None]:
        stats = self.rt.flink(APP).checkpoints(job_id)
        return stats.restored_path, stats.restored_is_savepoint

    def submissions(self, job_id: str) -> int:
        """How often the JobManager was asked to run this job id (its log, never truncated)."""
        log = self.rt.paths(APP).log / "jobmanager.log"
        return sum(1 for line in log.read_text(errors="replace").splitlines()
                   if f"Submitting Job with JobId={job_id}" in line)

    # -- the counter job's state -------------------------------------------------------------------

    @property
    def out_dir(self) -> Path:
        return self.rt.paths(APP).work / "out"

    def counts(self) -> dict[str, int]:
        return read_counts(self.out_dir)

    def counts_at_least(self, minimum: int, timeout: float = 60) -> dict[str, int]:
        def probe() -> dict[str, int] | None:
            c = self.counts()
            return c if len(c) == KEYS and min(c.values()) >= minimum else None

        return wait_until(probe, timeout=timeout, interval=0.2, what=f"every key's count >= {minimum}")

    def assert_counts_continue(self, before: dict[str, int], timeout: float = 30) -> dict[str, int]:
        """The running job writes fresh counts that all continue from `before` (no reset).

        `before` was read while the old job ran, before the upgrade. Counts are polled until every key
        has moved past what the files held when this check started (so the new job has written each
        key); every value seen meanwhile must be >= the key's value in `before`. A job restored from
        empty state writes 1, 2, 3, ... and fails this at its first write."""
        assert len(before) == KEYS, before
        start = self.counts()
        lowest = dict(start)
        end = time.monotonic() + timeout
        while True:
            now = self.counts()
            for k, v in now.items():
                lowest[k] = min(lowest.get(k, v), v)
            dropped = {k: (before[k], lowest[k]) for k in before if lowest.get(k, before[k]) < before[k]}
            assert not dropped, f"counts went below their pre-upgrade values (before, lowest seen): {dropped}"
            if len(now) == KEYS and all(now[k] > start.get(k, -1) for k in now):
                return now
            if time.monotonic() > end:
                pytest.fail(f"the new job did not write every key within {timeout}s: at start {start}, now {now}")
            time.sleep(0.05)


@contextlib.contextmanager
def running_counter(repo: Repo, counter_jar: Path, flink_home: Path, message: str, *,
                    notes: list[str] | None = None, label: str = "e2e") -> Iterator[E2E]:
    """The counter app committed to `repo`, applied on a local runtime beside it and counting; torn down
    after (printing `notes`, what crash tests saw). One per test module."""
    state = repo.origin.parent / "state"
    rt = LocalRuntime(state, clock=SystemClock(), flink_home=flink_home)
    env = E2E(repo=repo, state=state, rt=rt)
    repo.write(JAR_PATH, counter_jar.read_bytes())
    env.commit(message)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLINK_HOME", str(flink_home))
        try:
            code, out = env.apply()
            assert code == 0, f"creating the app failed:\n{out}"
            env.counts_at_least(1)
            yield env
        finally:
            teardown_runtime(rt)
            if notes:
                print(f"\n[{label}] " + f"\n[{label}] ".join(notes))


@pytest.fixture(scope="module")
def e2e(counter_jar: Path, flink_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    repo = Repo(tmp_path_factory.mktemp("e2e"))
    repo.write("README.md", "GitOps repo of the e2e tests\n")
    with running_counter(repo, counter_jar, flink_home, "counter app", notes=CRASH_NOTES,
                         label="e2e crash tests") as env:
        yield env


def step_types(app_plan: dict[str, Any]) -> list[str]:
    return [s["type"] for s in app_plan["steps"]]


def start_step(app_plan: dict[str, Any]) -> dict[str, Any]:
    starts = [s for s in app_plan["steps"] if s["type"] == "StartJob"]
    assert len(starts) == 1, app_plan["steps"]
    step: dict[str, Any] = starts[0]
    return step


def finished_source_subtasks(e2e: E2E, job_id: str) -> int | None:
    """FINISHED subtasks of a RUNNING job (from /jobs/overview), None when it is not RUNNING."""
    for j in e2e.jobs():
        if j.job_id == job_id and j.state == "RUNNING":
            return j.tasks_finished
    return None


# ------------------------------------------------------------------------------------------------
# 1. savepoint upgrade keeps state


@pytest.mark.parametrize("change", ["parallelism 1 -> 2", "a job argument"])
def test_savepoint_upgrade_continues_every_count(e2e: E2E, change: str) -> None:
    """The issue's two examples of a change that needs a restart, in this order: the second upgrades
    the job the first scaled up (see `finished_source_subtasks`)."""
    old_job = e2e.only_running_job()
    e2e.counts_at_least(100)
    if change.startswith("parallelism"):
        assert e2e.parallelism == 1
        rev = e2e.commit(change, parallelism=2)
        expected_diff: list[tuple[str, object, object]] = [("/spec/job/parallelism", 1, 2)]
    else:
        # x 2: from now on one of the two source readers has no split, and the job counts at half its rate.
        old_rate = e2e.rate
        rev = e2e.commit(change + ": --rate x 2", rate=2 * e2e.rate)
        expected_diff = [("/spec/job/args/5", str(old_rate), str(e2e.rate))]

    plan = e2e.plan_live()
    assert plan["action"] == "upgrade", plan["reason"]
    assert [(c["path"], c["old"], c["new"]) for c in plan["diff"]] == expected_diff
    assert step_types(plan) == ["StopWithSavepoint", "EnsureCluster", "StartJob", "AwaitRunning", "AwaitHealthy"]
    assert plan["steps"][0]["job_id"] == old_job
    start = start_step(plan)
    assert start["restore"]["kind"] == "captured"
    assert not any("WITHOUT STATE" in r for r in plan["risks"]), plan["risks"]
    new_job = start["job_id"]
    assert plan["steps"][3]["job_id"] == plan["steps"][4]["job_id"] == new_job != old_job

    before = e2e.counts()
    code, out = e2e.apply()
    assert code == 0, out

    assert e2e.only_running_job() == new_job
    old = {j.job_id: j.state for j in e2e.jobs()}[old_job]
    assert old == "FINISHED", f"the old job should have ended by stop-with-savepoint, is {old}"
    e2e.assert_counts_continue(before)

    st = e2e.status()
    assert (st["applied"], st["attempted"], st["job_id"], st["outcome"]) == (rev, rev, new_job, "success"), st
    assert st["last_savepoint"], st
    restored, is_savepoint = e2e.restored_from(new_job)
    assert (restored, is_savepoint) == (st["last_savepoint"], True)
    assert [s["path"] for s in e2e.savepoints(rev)] == [st["last_savepoint"]]
    assert Path(st["last_savepoint"].removeprefix("file:")).is_dir()
    # `history` tells the lineage: this revision's job started from the savepoint the upgrade took.
    lineage = e2e.history_json()["lineage"][-1]
    assert (lineage["revision"], lineage["outcome"], lineage["restored_from"], lineage["savepoints"],
            lineage["job_id"]) == (rev, "success", st["last_savepoint"], [st["last_savepoint"]], new_job), lineage
    if change.startswith("parallelism"):
        # The source made one split at parallelism 1: restored at 2, one of its readers has nothing to
        # read and FINISHES, and the job runs on (a RUNNING job, which the next upgrade must treat so).
        wait_until(lambda: finished_source_subtasks(e2e, new_job) == 1, timeout=30,
                   what="the idle source subtask to finish")
        assert e2e.only_running_job() == new_job


# ------------------------------------------------------------------------------------------------
# 2. crash resume: kill -9 `apply` after the savepoint was triggered, and after the new job was submitted


def kill_apply_when(e2e: E2E, ready: Callable[[dict[str, Any]], bool], what: str,
                    timeout: float = 120) -> tuple[subprocess.Popen[str], dict[str, Any]] | None:
    """Start `apply` as a process, poll the journal (read only) until `ready(in-flight row)`, then SIGKILL it.

    Returns the killed process and the in-flight row as it was after the kill, or None when `apply`
    finished before the moment came (the window was missed)."""
    proc = e2e.apply_process()
    end = time.monotonic() + timeout
    try:
        while True:
            row = e2e.inflight()
            if row is not None and ready(row):
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                after = e2e.inflight()
                assert after is not None, "the killed apply left no in-flight record"
                return proc, after
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                assert proc.returncode == 0, f"apply failed before the kill:\n{out}"
                return None
            if time.monotonic() > end:
                pytest.fail(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.003)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()


def describe_row(row: dict[str, Any]) -> str:
    plan = row["plan"]
    steps = plan["rollback"] if row["stage"] == "rollback" else plan["steps"]
    step = steps[row["step_index"]]["type"] if row["step_index"] < len(steps) else "?"
    return (f"stage={row['stage']} step={row['step_index']}:{step} phase={row['phase']} "
            f"trigger_id={'set' if row.get('trigger_id') else 'unset'} "
            f"captured={'set' if row.get('captured_path') else 'unset'} submitted_job_id={row.get('submitted_job_id')}")


def trigger_status(e2e: E2E, job_id: str, trigger_id: str) -> int:
    """HTTP status of GET /jobs/{job}/savepoints/{trigger}: 200 once Flink accepted the stop, 404 before."""
    rec = e2e.rt.read_record(APP)
    assert rec is not None
    return HTTP.get(f"{rec.rest_url}/jobs/{job_id}/savepoints/{trigger_id}", timeout=10).status_code


@pytest.mark.parametrize("moment", ["journaled", "accepted"])
def test_kill_after_savepoint_trigger_resumes(e2e: E2E, moment: str) -> None:
    """kill -9 once the trigger id is in the journal ("journaled": the executor writes it before the
    request, so the kill may land before Flink has the stop) or once Flink answers for that trigger
    ("accepted": the savepoint is under way). The next `apply` finishes the upgrade from the journal."""
    old_job = e2e.only_running_job()

    def ready(row: dict[str, Any]) -> bool:
        trigger = row.get("trigger_id")
        if trigger is None:
            return False
        return moment == "journaled" or trigger_status(e2e, old_job, trigger) == 200

    for attempt in range(1, 4):
        rev = e2e.commit(f"savepoint mode, rate + 1 (crash after trigger {moment}, attempt {attempt})",
                         rate=e2e.next_rate(), mode="savepoint")
        before = e2e.counts_at_least(1)
        killed = kill_apply_when(e2e, ready, f"the savepoint trigger ({moment})")
        if killed is not None:
            break
        CRASH_NOTES.append(f"trigger {moment}, attempt {attempt}: apply finished before the moment came")
        e2e.assert_counts_continue(before)
        old_job = e2e.only_running_job()
    else:
        pytest.fail(f"three applies finished before their savepoint trigger was {moment}")
    assert killed is not None
    proc, row = killed
    assert proc.returncode == -signal.SIGKILL
    plan = row["plan"]
    assert row["revision"] == rev and plan["steps"][0] == {**plan["steps"][0], "type": "StopWithSavepoint",
                                                           "job_id": old_job}
    known = trigger_status(e2e, old_job, row["trigger_id"])
    CRASH_NOTES.append(f"trigger {moment}, attempt {attempt}: killed at {describe_row(row)}; "
                       f"Flink {'had' if known == 200 else 'did not have'} the stop request (HTTP {known})")
    new_job = start_step(plan)["job_id"]

    code, out = e2e.apply_subprocess()
    assert code == 0, out
    assert "-> success" in out, out
    assert e2e.inflight() is None
    assert e2e.only_running_job() == new_job
    # One savepoint for this revision (polled or re-sent under the same trigger id, never a second
    # one), and it is what the new job restored from.
    sps = e2e.savepoints(rev)
    assert len(sps) == 1, sps
    assert e2e.restored_from(new_job) == (sps[0]["path"], True)
    assert e2e.submissions(new_job) == 1
    e2e.assert_counts_continue(before)
    st = e2e.status()
    assert (st["applied"], st["job_id"], st["outcome"], st["last_savepoint"]) == (rev, new_job, "success",
                                                                                 sps[0]["path"]), st


def test_kill_after_submit_does_not_submit_twice(e2e: E2E) -> None:
    e2e.only_running_job()
    seen: dict[str, JobSummary] = {}

    def submitted(row: dict[str, Any]) -> bool:
        """The StartJob step recorded its job id and Flink has that job: the submit reached Flink."""
        job_id = row.get("submitted_job_id")
        if job_id is None or row["stage"] != "forward":
            return False
        for j in e2e.jobs():
            if j.job_id == job_id:
                seen[job_id] = j
                return True
        return False

    for attempt in range(1, 4):
        rev = e2e.commit(f"rate + 1 (crash after submit, attempt {attempt})", rate=e2e.next_rate())
        before = e2e.counts_at_least(1)
        killed = kill_apply_when(e2e, submitted, "the new job on the cluster")
        if killed is not None:
            break
        CRASH_NOTES.append(f"after submit, attempt {attempt}: apply finished before the new job was seen")
        e2e.assert_counts_continue(before)
    else:
        pytest.fail("three applies finished before their new job could be seen on the cluster")
    assert killed is not None
    proc, row = killed
    assert proc.returncode == -signal.SIGKILL
    CRASH_NOTES.append(f"after submit, attempt {attempt}: killed at {describe_row(row)}")
    new_job = row.get("submitted_job_id")
    assert new_job == start_step(row["plan"])["job_id"] == deterministic_job_id(APP, rev, 1)

    code, out = e2e.apply_subprocess()
    assert code == 0, out
    assert "-> success" in out, out
    assert e2e.inflight() is None
    assert e2e.only_running_job() == new_job
    jobs = [j for j in e2e.jobs() if j.job_id == new_job]
    assert len(jobs) == 1 and jobs[0].start_time_ms == seen[new_job].start_time_ms, (jobs, seen)
    assert e2e.submissions(new_job) == 1, "the resumed apply submitted the job again"
    sps = e2e.savepoints(rev)
    assert len(sps) == 1 and e2e.restored_from(new_job) == (sps[0]["path"], True), sps
    e2e.assert_counts_continue(before)
    st = e2e.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (rev, new_job, "success"), st


# ------------------------------------------------------------------------------------------------
# 3. an upgrade with upgradeMode stateless: the plan says so, and the counts restart. After the crash
# tests, which keep every count: by then the counts are high enough to see the restart at once.


def test_stateless_upgrade_says_so_and_restarts_counts(e2e: E2E) -> None:
    old_job = e2e.only_running_job()
    before = e2e.counts_at_least(400)
    rev = e2e.commit("stateless, rate + 1", rate=e2e.next_rate(), mode="stateless")

    plan = e2e.plan_live()
    assert plan["action"] == "upgrade" and plan["upgrade_mode"] == "stateless"
    assert any("STARTS WITHOUT STATE" in r for r in plan["risks"]), plan["risks"]
    assert step_types(plan) == ["CancelJob", "EnsureCluster", "StartJob", "AwaitRunning", "AwaitHealthy"]
    assert plan["steps"][0]["job_id"] == old_job
    start = start_step(plan)
    assert start["restore"]["kind"] == "none"

    before = e2e.counts()
    code, out = e2e.apply()
    assert code == 0, out
    new_job = e2e.only_running_job()
    assert new_job == start["job_id"]
    assert e2e.restored_from(new_job) == (None, None)

    # Every key restarts from zero: all counts fall far below what they were.
    ceiling = min(before.values()) // 2

    def reset() -> dict[str, int] | None:
        c = e2e.counts()
        return c if len(c) == KEYS and max(c.values()) < ceiling else None

    wait_until(reset, timeout=15, interval=0.05, what=f"every count to restart (below {ceiling}, before {before})")
    st = e2e.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (rev, new_job, "success"), st


# ------------------------------------------------------------------------------------------------
# 4. a savepoint that fails leaves the old job running and the app failed


@contextlib.contextmanager
def savepoint_dir_blocked(e2e: E2E) -> Iterator[Path]:
    """Put a plain file where the cluster's savepoint directory is: Flink cannot create savepoint-*
    under it (chmod would not do: the tests may run as root). Restores the directory afterwards."""
    sp_dir = e2e.rt.paths(APP).savepoints
    moved = sp_dir.with_name(sp_dir.name + TRANSIENT_SP_DIR_SUFFIX)
    os.replace(sp_dir, moved)
    sp_dir.write_text("not a directory: the e2e test blocks savepoints here\n")
    try:
        yield sp_dir
    finally:
        sp_dir.unlink()
        os.replace(moved, sp_dir)


def test_failed_savepoint_leaves_the_old_job_running(e2e: E2E) -> None:
    old_job = e2e.only_running_job()
    applied_before = e2e.status()["applied"]
    e2e.counts_at_least(1)
    with savepoint_dir_blocked(e2e) as blocked:
        rev = e2e.commit("rate + 1 while savepoints cannot be written", rate=e2e.next_rate(), mode="savepoint")
        plan = e2e.plan_live()
        assert step_types(plan)[0] == "StopWithSavepoint"
        code, out = e2e.apply()
        assert code == 1, out
        after_apply = e2e.counts()

        st = e2e.status()
        assert st["outcome"] == "failure", st
        message = st["message"]
        assert "stop-with-savepoint failed" in message, message
        # Flink's own cause, down to the path it could not create the savepoint under.
        assert "CheckpointException" in message and "FileAlreadyExistsException" in message, message
        assert str(blocked) in message, message
        assert (st["applied"], st["attempted"]) == (applied_before, rev), st
        row = e2e.app_row()
        assert row["last_applied_revision"] == applied_before != rev
        assert row["last_attempted_revision"] == rev and row["last_outcome"] == "failure"
        assert e2e.inflight() is None
        assert e2e.savepoints(rev) == []

        # The old job is still the one running, and it keeps counting.
        assert e2e.only_running_job() == old_job
        assert st["job_id"] == old_job

        def growing() -> dict[str, int] | None:
            c = e2e.counts()
            return c if all(c[k] > after_apply[k] for k in after_apply) else None

        wait_until(growing, timeout=30, interval=0.1, what="the old job's counts to keep growing")
    print(f"\n[e2e failed savepoint] status message: {message}")


# ------------------------------------------------------------------------------------------------
# 5. a bad entry class is rolled back to the previous spec from the savepoint just taken


def test_bad_entry_class_is_rolled_back_from_the_fresh_savepoint(e2e: E2E) -> None:
    e2e.only_running_job()
    applied_before = e2e.status()["applied"]
    before = e2e.counts_at_least(1)
    rev = e2e.commit("a typo in the entry class", rate=e2e.next_rate(), entry_class="com.example.DoesNotExist")
    plan = e2e.plan_live()
    assert step_types(plan)[0] == "StopWithSavepoint"
    assert [s["type"] for s in plan["rollback"]] == ["EnsureCluster", "StartJob", "AwaitRunning"]
    rollback_start = next(s for s in plan["rollback"] if s["type"] == "StartJob")
    assert rollback_start["spec"] == "previous" and rollback_start["restore"]["kind"] == "captured"

    before = e2e.counts()
    code, out = e2e.apply()
    assert code == 1, out

    st = e2e.status()
    assert st["outcome"] == "failure", st
    assert st["message"].startswith("rolled back to the previous spec"), st["message"]
    assert "DoesNotExist" in st["message"], st["message"]
    assert (st["applied"], st["attempted"]) == (applied_before, rev), st

    job = e2e.only_running_job()
    assert job == rollback_start["job_id"] == deterministic_job_id(APP, rev, 1, purpose="rollback")
    assert st["job_id"] == job
    sps = e2e.savepoints(rev)
    assert len(sps) == 1, sps
    assert e2e.restored_from(job) == (sps[0]["path"], True)
    assert st["last_savepoint"] == sps[0]["path"]
    e2e.assert_counts_continue(before)

    code, text = e2e.cli("history", APP, "--state-dir", str(e2e.state))
    assert code == 0, text
    assert "rollback" in text and "DoesNotExist" in text, text
    assert f"{rev[:12]}  upgrade -> rolled back failure  took {sps[0]['path']}; started from {sps[0]['path']}" in text
    transitions = e2e.history_json()["transitions"]
    mine = [t for t in transitions if t["revision"] == rev]
    assert [t["action"] for t in mine if t["action"] in ("upgrade", "savepoint", "rollback", "finish")] == [
        "upgrade", "savepoint", "rollback", "finish"], mine
    assert mine[-1]["outcome"] == "failure" and "rolled back" in mine[-1]["message"]
    last = e2e.history_json()["lineage"][-1]
    assert (last["revision"], last["action"], last["outcome"], last["job_id"]) == (
        rev, "upgrade -> rolled back", "failure", job), last


# ------------------------------------------------------------------------------------------------
# 6. a saved plan: `apply --plan F` runs exactly F, and refuses F once the live state moved


def test_saved_plan_runs_exactly_and_a_stale_one_is_refused(e2e: E2E, tmp_path: Path) -> None:
    e2e.only_running_job()
    e2e.commit("fix the entry class", rate=e2e.next_rate(), entry_class=COUNTER_MAIN)
    saved = tmp_path / "plan.json"
    code, out = e2e.cli("plan", "--repo", str(e2e.repo.work), "--live", "--state-dir", str(e2e.state),
                        "--format", "json", "--out", str(saved))
    assert code == 0, out
    planned = json.loads(saved.read_text())
    start = next(s for s in planned["apps"][0]["steps"] if s["type"] == "StartJob")
    code, out = e2e.cli("apply", "--repo", str(e2e.repo.work), "--state-dir", str(e2e.state), "--plan", str(saved))
    assert code == 0, out
    assert e2e.only_running_job() == start["job_id"]

    rev = e2e.commit("one more change", rate=e2e.next_rate())
    code, out = e2e.cli("plan", "--repo", str(e2e.repo.work), "--live", "--state-dir", str(e2e.state),
                        "--format", "json", "--out", str(saved))
    assert code == 0, out
    victim = e2e.only_running_job()
    e2e.rt.flink(APP).cancel(victim)  # the job dies behind our back after the plan was made
    wait_until(lambda: e2e.rt.flink(APP).job(victim).state == "CANCELED", timeout=30, what="the job cancelled")
    code, out = e2e.cli("apply", "--repo", str(e2e.repo.work), "--state-dir", str(e2e.state), "--plan", str(saved))
    assert code == 1 and "live state changed since this plan was made" in out, out
    assert e2e.running() == []  # nothing of the stale plan was executed
    assert e2e.status()["attempted"] != rev
