"""End to end: `flink-reconciler run` as a real process, a bare Git repo as origin, real Flink JVMs.

What a user does is what these tests do: push a commit to origin (and maybe POST a webhook), then look
at the result from the outside: the git notes on the pushed commit (`git fetch origin refs/notes/*`),
the job in Flink's REST API, the counter job's output files, `flink-reconciler history`, and the
daemon's HTTP endpoints. Nothing reaches into the daemon's memory.

The Flink tests share one daemon state directory, one repository and one app (a module-scoped
fixture) and run in order: create -> upgrade -> broken spec -> job that cannot start -> restart of
the daemon with webhooks -> the mass-deletion guard. Each step checks its own preconditions, so a
failure names the step that broke. The last test needs no Flink (dry run).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.clock import SystemClock
from reconciler.live.local.runtime import LocalRuntime
from tests.fixtures.flink import COUNTER_MAIN, read_counts, teardown_runtime
from tests.gitutil import Repo, git

ROOT = Path(__file__).resolve().parents[2]
APP = "counter"
SPEC_FILE = "apps/counter.yaml"
JAR_PATH = "jobs/counter/counter.jar"
NOTES_REF = "refs/notes/flink-reconciler"
WEBHOOK_SECRET = "e2e-webhook-secret"
POLL_S = 2.0
DRIFT_S = 2.5  # the tests that wait for drift passes count them: a short interval only makes them come sooner
KEYS = 4
RATE = 80  # records/s over all keys

T = TypeVar("T")

# The polled GETs of the module share one client: plain HTTP to loopback and, without keep-alive, a new connection
# per request as `httpx.get` makes, but not a new SSL context per request (`httpx.get` builds one, tens of ms of CPU).
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


# ------------------------------------------------------------------------------------------ helpers


def poll(probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2,
         alive: Callable[[], str | None] | None = None) -> T:
    """Return `probe()`'s first truthy value; fail with `what` after `timeout` s (or when `alive` says why)."""
    end = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if alive is not None and (why := alive()):
            pytest.fail(f"{why} while waiting for {what}")
        if time.monotonic() >= end:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last value {last!r}")
        time.sleep(interval)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels` (0 when there are none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += float(sample.value)
    return total


@dataclass
class DaemonProc:
    """A `flink-reconciler run` subprocess logging JSON lines to a file."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str]
    _url: str | None = None
    _probe_url: str | None = None

    @classmethod
    def start(cls, log_path: Path, **settings: object) -> DaemonProc:
        """Settings become FLINK_RECONCILER_* variables (e.g. repo_url=..., poll_interval=2)."""
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FLINK_RECONCILER_")}
        for key, value in {"listen_port": 0, "probe_port": 0, "log_format": "json", **settings}.items():
            env[f"FLINK_RECONCILER_{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
        proc = subprocess.Popen(
            [sys.executable, "-m", "reconciler.cli", "run"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_path.open("ab"),
        )
        return cls(proc, log_path, env)

    def log(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                rec = {"msg": line}
            out.append(rec if isinstance(rec, dict) else {"msg": line})
        return out

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])

    def died(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"the daemon exited with {self.proc.returncode}:\n{self.log_tail()}"

    def _logged_url(self, line: str) -> str:
        def listening() -> str | None:
            for rec in self.log():
                if str(rec.get("msg", "")).startswith(line):
                    return f"http://{rec['host']}:{rec['port']}"
            return None

        return str(poll(listening, timeout=60, what=f"the daemon's {line!r} log line", alive=self.died))

    @property
    def url(self) -> str:
        """The public port: webhooks and the dashboard."""
        if self._url is None:
            self._url = self._logged_url("listening on")
        return self._url

    @property
    def probe_url(self) -> str:
        """The probe port: /healthz, /readyz, /metrics."""
        if self._probe_url is None:
            self._probe_url = self._logged_url("probes and metrics on")
        return self._probe_url

    def get(self, path: str) -> httpx.Response:
        probe = path.partition("?")[0] in ("/healthz", "/readyz", "/metrics")
        return HTTP.get((self.probe_url if probe else self.url) + path, timeout=10)

    def metrics(self) -> str:
        r = self.get("/metrics")
        assert r.status_code == 200, r.text
        return r.text

    def metric(self, name: str, **labels: str) -> float:
        return metric(self.metrics(), name, **labels)

    def passes(self, trigger: str) -> float:
        return self.metric("flink_reconciler_sync_passes_total", trigger=trigger)

    def wait_passes(self, trigger: str, more_than: float, *, timeout: float) -> float:
        def probe() -> float | None:
            n = self.passes(trigger)
            return n if n > more_than else None

        return poll(probe, timeout=timeout, what=f"a {trigger} sync pass beyond {more_than:g}", alive=self.died)

    def stop(self, timeout: float = 90) -> int:
        """SIGTERM and wait; SIGKILL only if it does not exit (then fail loudly)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"daemon ignored SIGTERM for {timeout} s:\n{self.log_tail()}") from None
        return self.proc.returncode


def github_push(secret: str | None, after: str, *, ref: str = "refs/heads/main",
                bad_signature: bool = False) -> tuple[dict[str, str], bytes]:
    """Headers and raw body of a GitHub push delivery, signed (X-Hub-Signature-256) when `secret`."""
    body = json.dumps({
        "ref": ref, "before": "0" * 40, "after": after,
        "repository": {"full_name": "acme/flink-apps"}, "pusher": {"name": "test"},
    }).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
               "X-GitHub-Delivery": hashlib.sha1(body).hexdigest()}
    if secret is not None:
        digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        if bad_signature:
            digest = hmac.new(b"not-the-secret", body, hashlib.sha256).hexdigest()
        headers["X-Hub-Signature-256"] = "sha256=" + digest
    return headers, body


def fetch_note(repo: Repo, sha: str) -> str:
    """The note on `sha` as origin has it (what anyone cloning the repo sees)."""
    git(repo.work, "fetch", "-q", "origin", "+refs/notes/*:refs/notes/*")
    proc = subprocess.run(["git", "notes", "--ref", NOTES_REF, "show", sha], cwd=repo.work,
                          capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else ""


def note_line(repo: Repo, sha: str, app: str = APP) -> str | None:
    for line in fetch_note(repo, sha).splitlines():
        if line.startswith(f"flink-reconciler/{app}: "):
            return line
    return None


def wait_note(repo: Repo, sha: str, state: str, daemon: DaemonProc, *, timeout: float,
              app: str = APP) -> str:
    """Poll origin's notes until the app's line on `sha` has `state` (fails early on another final state)."""
    def probe() -> str | None:
        line = note_line(repo, sha, app)
        if line is None:
            return None
        got = line.split(": ", 1)[1].split(" ", 1)[0]
        if got == state:
            return line
        if got != "pending":
            pytest.fail(f"note on {sha[:12]} says {got}, expected {state}: {line}\n{daemon.log_tail()}")
        return None

    return poll(probe, timeout=timeout, interval=0.3, what=f"a {state} note for {app} on {sha[:12]}",
                alive=daemon.died)


def history(state_dir: Path, repo_url: str, app: str = APP) -> dict[str, Any]:
    """`flink-reconciler history APP --output json`, run the way a user would, next to the daemon."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FLINK_RECONCILER_")}
    env |= {"FLINK_RECONCILER_STATE_DIR": str(state_dir), "FLINK_RECONCILER_REPO_URL": repo_url}
    proc = subprocess.run([sys.executable, "-m", "reconciler.cli", "history", app, "--output", "json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def transitions(state_dir: Path, repo_url: str, *, revision: str | None = None) -> list[dict[str, Any]]:
    ts: list[dict[str, Any]] = history(state_dir, repo_url)["transitions"]
    return [t for t in ts if revision is None or t["revision"] == revision]


def at_epoch(transition: dict[str, Any]) -> float:
    return datetime.fromisoformat(transition["at"]).timestamp()


def counter_spec(*, parallelism: int = 1, rate: int = RATE, entry_class: str = COUNTER_MAIN,
                 extra_job: str = "", healthy: str = "1m", tm_memory: str | None = None) -> str:
    resources = f"    resources:\n      memory: {tm_memory}\n" if tm_memory else ""
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager:
    slots: 2
{resources}  flinkConfiguration:
    execution.checkpointing.interval: 1 s
  job:
    jarURI: {JAR_PATH}
    entryClass: {entry_class}
    args: ["--output-dir", "out", "--keys", "{KEYS}", "--rate", "{rate}"]
    parallelism: {parallelism}
    upgradeMode: savepoint
{extra_job}  deadlines:
    start: 2m
    healthy: {healthy}
"""


# ------------------------------------------------------------------------------------------ the Flink module


@dataclass(frozen=True)
class Job:
    job_id: str
    tasks_total: int
    tasks_finished: int
    start_time_ms: int


def running_job(runtime: LocalRuntime, app: str) -> Job | None:
    """The one job Flink runs with every task RUNNING or FINISHED (None while none or several do).

    Read from Flink's REST API directly, not through the code under test: a subtask may finish early
    (a source without a split) while the job runs on, healthy."""
    rec = runtime.read_record(app)
    if rec is None:
        return None
    try:
        data = HTTP.get(rec.rest_url + "/jobs/overview", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None
    running = []
    for j in data.get("jobs", []):
        tasks = j.get("tasks", {})
        total, up, done = (int(tasks.get(k, 0)) for k in ("total", "running", "finished"))
        if j.get("state") == "RUNNING" and up > 0 and up + done == total:
            running.append(Job(j["jid"], total, done, int(j.get("start-time", 0))))
    return running[0] if len(running) == 1 else None


@dataclass
class FlinkEnv:
    repo: Repo
    state_dir: Path
    logs: Path
    runtime: LocalRuntime
    daemon: DaemonProc
    shas: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def repo_url(self) -> str:
        return str(self.repo.origin)

    def start_daemon(self, name: str, **settings: object) -> DaemonProc:
        base: dict[str, object] = {
            "repo_url": self.repo_url, "state_dir": self.state_dir, "status_sink": "notes",
            "prune": True, "mass_delete_min_apps": 1, "max_parallel": 2, "shutdown_deadline": 30,
        }
        self.daemon = DaemonProc.start(self.logs / f"{name}.log", **(base | settings))
        return self.daemon

    def out_dir(self) -> Path:
        return self.runtime.paths(APP).work / "out"

    def counts(self) -> dict[str, int]:
        return read_counts(self.out_dir())

    def running_job(self) -> Job | None:
        return running_job(self.runtime, APP)

    def wait_counts(self, at_least: int, timeout: float = 60, *,
                    above: dict[str, int] | None = None) -> dict[str, int]:
        """Counts once every key reached `at_least` (and went past its value in `above`)."""
        def probe() -> dict[str, int] | None:
            c = self.counts()
            ok = len(c) == KEYS and min(c.values()) >= at_least and all(c[k] > v for k, v in (above or {}).items())
            return c if ok else None

        return poll(probe, timeout=timeout, what=f"every key counted to >= {at_least} and past {above}",
                    alive=self.daemon.died)

    def history(self) -> dict[str, Any]:
        return history(self.state_dir, self.repo_url)

    def transitions(self, revision: str | None = None) -> list[dict[str, Any]]:
        return transitions(self.state_dir, self.repo_url, revision=revision)


@pytest.fixture(scope="module")
def env(flink_home: Path, counter_jar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlinkEnv]:
    root = tmp_path_factory.mktemp("daemon-e2e")
    repo = Repo(root)
    repo.write("README.md", "GitOps repo of the e2e test\n")
    repo.write(JAR_PATH, counter_jar.read_bytes())
    repo.commit("jar")
    state_dir = root / "state"
    logs = root / "logs"
    logs.mkdir()
    runtime = LocalRuntime(state_dir, clock=SystemClock(), flink_home=flink_home)
    e = FlinkEnv(repo=repo, state_dir=state_dir, logs=logs, runtime=runtime, daemon=None)  # type: ignore[arg-type]
    e.start_daemon("daemon-1", poll_interval=POLL_S, drift_interval=DRIFT_S)
    try:
        yield e
    finally:
        rc = e.daemon.stop()
        try:
            teardown_runtime(runtime)
        finally:
            timings = json.dumps(e.timings, indent=2, sort_keys=True)
            print(f"\ne2e timings (s): {timings}")
            (logs / "timings.json").write_text(timings)
        assert rc == 0, f"daemon exit code {rc} on SIGTERM:\n{e.daemon.log_tail()}"


def _need(e: FlinkEnv, *keys: str) -> None:
    missing = [k for k in keys if k not in e.shas]
    if missing:
        pytest.skip(f"an earlier step did not finish ({', '.join(missing)} missing)")


@pytest.mark.flink
@pytest.mark.slow
def test_push_creates_the_app_then_an_upgrade_keeps_its_state(env: FlinkEnv) -> None:
    d = env.daemon
    poll(lambda: d.get("/readyz").status_code == 200, timeout=60, what="/readyz 200", alive=d.died)

    # 1. A commit with the app: created, and the commit says success.
    env.repo.write(SPEC_FILE, counter_spec(parallelism=1))
    t_push = time.time()
    sha1 = env.repo.commit("add counter")
    line = wait_note(env.repo, sha1, "success", d, timeout=240)
    env.timings["create_push_to_success_note"] = time.time() - t_push
    assert line.startswith(f"flink-reconciler/{APP}: success")
    job1 = env.running_job()
    assert job1 is not None, "a success note but no running job"
    create = [t for t in env.transitions(sha1) if t["action"] == "create"]
    assert create, env.transitions()

    # 2. A change that needs a restart (the job's args): upgraded from a savepoint, counts continue.
    before = env.wait_counts(150)
    env.repo.write(SPEC_FILE, counter_spec(rate=RATE + 20))
    t_push = time.time()
    sha2 = env.repo.commit("rate +20")
    line = wait_note(env.repo, sha2, "success", d, timeout=120)
    t_note = time.time()
    upgrade = [t for t in env.transitions(sha2) if t["action"] == "upgrade"]
    assert upgrade, env.transitions()
    pickup = at_epoch(upgrade[0]) - t_push
    env.timings["poll_push_to_upgrade_start"] = pickup
    env.timings["poll_push_to_success_note"] = t_note - t_push
    # Within one poll interval, plus slack for a pass in progress (a drift pass) and a loaded machine.
    assert pickup <= POLL_S + 4, f"the upgrade started {pickup:.1f} s after the push (poll {POLL_S} s)"

    job2 = env.running_job()
    assert job2 is not None and job2.job_id != job1.job_id, (job1, job2)
    cp = env.runtime.flink(APP).checkpoints(job2.job_id)
    assert cp.restored_is_savepoint is True, cp
    savepoints = [s for s in env.history()["savepoints"] if s.get("revision") == sha2]
    assert cp.restored_path and any(_same_path(cp.restored_path, s["path"]) for s in savepoints), (cp, savepoints)
    after = env.counts()
    assert all(after[k] >= before[k] for k in before), f"a count went backwards: {before} -> {after}"
    assert min(after.values()) > fresh_start_bound(job2, RATE + 20), (after, job2)
    env.shas.update(created=sha1, upgraded=sha2)
    env.shas["job"] = job2.job_id


@pytest.mark.flink
@pytest.mark.slow
def test_broken_spec_reports_error_with_file_and_line_and_leaves_the_job(env: FlinkEnv) -> None:
    _need(env, "upgraded")
    d = env.daemon
    job = poll(env.running_job, timeout=30, what="a running job", alive=d.died).job_id
    spec = counter_spec(extra_job="    paralelism: 3\n")
    line_no = spec.splitlines().index("    paralelism: 3") + 1
    env.repo.write(SPEC_FILE, spec)
    sha3 = env.repo.commit("typo in a field name")
    line = wait_note(env.repo, sha3, "error", d, timeout=60)
    assert re.search(rf"{re.escape(SPEC_FILE)}:{line_no}\b", line), line
    assert "paralelism" in line, line

    # Untouched: same job, still counting, over a few more poll and drift passes.
    before = env.counts()
    polls, drifts = d.passes("poll"), d.passes("drift")
    d.wait_passes("poll", polls + 2, timeout=30)
    d.wait_passes("drift", drifts, timeout=30)
    still = env.running_job()
    assert still is not None and still.job_id == job, (job, still)
    after = env.counts()
    assert all(after[k] > before[k] for k in before), (before, after)
    executed = [t for t in env.transitions(sha3) if t["action"] not in ("error",)]
    assert not executed, executed
    env.shas["broken"] = sha3


@pytest.mark.flink
@pytest.mark.slow
def test_job_that_cannot_start_is_rolled_back_and_not_retried(env: FlinkEnv) -> None:
    _need(env, "upgraded")
    d = env.daemon
    old = poll(env.running_job, timeout=30, what="a running job", alive=d.died)
    job = old.job_id
    before = env.wait_counts(1)
    env.repo.write(SPEC_FILE, counter_spec(rate=RATE + 40, entry_class="io.flinkreconciler.examples.NoSuchJob"))
    sha4 = env.repo.commit("a job class that does not exist")
    line = wait_note(env.repo, sha4, "failure", d, timeout=180)
    # The note names what failed, with Flink's cause.
    assert "rolled back" in line and "ClassNotFoundException" in line and "NoSuchJob" in line, line

    # The old spec runs again, restored from the savepoint this attempt took, and counts continue.
    rolled = poll(env.running_job, timeout=60, what="the rolled-back job RUNNING", alive=d.died)
    assert rolled.job_id != job
    cp = env.runtime.flink(APP).checkpoints(rolled.job_id)
    assert cp.restored_is_savepoint is True, cp
    new_sps = [s for s in env.history()["savepoints"] if s.get("revision") == sha4]
    assert cp.restored_path and any(_same_path(cp.restored_path, s["path"]) for s in new_sps), (cp, new_sps)
    after = env.wait_counts(1, timeout=30, above=before)
    assert min(after.values()) > fresh_start_bound(rolled, RATE + 20), (after, rolled)
    assert rolled.tasks_total == old.tasks_total  # the previous spec

    # Not retried in a loop: poll and drift passes come and go; nothing is executed again, the job stays.
    for _ in range(2):
        polls, drifts = d.passes("poll"), d.passes("drift")
        d.wait_passes("drift", drifts + 1, timeout=30)
        d.wait_passes("poll", polls + 1, timeout=30)
    executed = [t for t in env.transitions(sha4) if t["action"] in ("upgrade", "restart", "create", "rollback",
                                                                    "savepoint", "finish")]
    assert [t["action"] for t in executed] == ["upgrade", "savepoint", "rollback", "finish"], executed
    now = env.running_job()
    assert now is not None and now.job_id == rolled.job_id, (rolled, now)
    final = note_line(env.repo, sha4, APP)
    assert final is not None and final.split(": ", 1)[1].startswith("failure"), final
    env.shas.update(failed=sha4, job=rolled.job_id)


@pytest.mark.flink
@pytest.mark.slow
def test_failed_commit_stays_quiet(env: FlinkEnv) -> None:
    _need(env, "failed")
    d = env.daemon
    sha4 = env.shas["failed"]

    def notes_tip() -> str:
        return git(env.repo.origin, "rev-parse", NOTES_REF)

    settled, note, tip = env.transitions(), note_line(env.repo, sha4), notes_tip()
    drifts = d.passes("drift")
    d.wait_passes("drift", drifts + 2, timeout=30)
    assert note_line(env.repo, sha4) == note, "the note on the failed commit keeps changing"
    assert notes_tip() == tip, "notes are pushed to origin on every drift pass"
    assert env.transitions() == settled, "a history row per drift pass while nothing changed"


@pytest.mark.flink
@pytest.mark.slow
def test_signed_webhook_triggers_a_sync_long_before_the_poll(env: FlinkEnv) -> None:
    _need(env, "failed")
    # Restart the daemon with a long poll interval and a webhook secret (same state dir and cluster).
    assert env.daemon.stop() == 0
    d = env.start_daemon("daemon-2", poll_interval=300, drift_interval=300, github_webhook_secret=WEBHOOK_SECRET)
    d.wait_passes("startup", 0, timeout=60)
    assert d.get("/healthz").status_code == 200
    ready = d.get("/readyz")
    assert ready.status_code == 200, ready.text
    # The restart did not retry the failed commit either.
    job = env.shas["job"]
    assert len([t for t in env.transitions(env.shas["failed"]) if t["action"] == "upgrade"]) == 1
    running = env.running_job()
    assert running is not None and running.job_id == job

    env.repo.write(SPEC_FILE, counter_spec(rate=RATE + 60))
    sha5 = env.repo.commit("rate +60")

    # Refused: no signature, a wrong signature. Nothing is triggered.
    for headers, body in (github_push(None, sha5), github_push(WEBHOOK_SECRET, sha5, bad_signature=True)):
        r = httpx.post(d.url + "/webhook", content=body, headers=headers, timeout=10)
        assert r.status_code == 401, (r.status_code, r.text)
    assert d.metric("flink_reconciler_webhook_requests_total", forge="github", result="unauthorized") == 2
    time.sleep(2.0)  # a negative check: give a wrongly triggered pass the time to show up
    assert d.passes("webhook") == 0
    assert note_line(env.repo, sha5) is None

    before = env.counts()
    headers, body = github_push(WEBHOOK_SECRET, sha5)
    t0 = time.time()
    r = httpx.post(d.url + "/webhook", content=body, headers=headers, timeout=10)
    assert r.status_code == 202, r.text
    wait_note(env.repo, sha5, "success", d, timeout=120)
    t_note = time.time()
    upgrade = [t for t in env.transitions(sha5) if t["action"] == "upgrade"]
    assert upgrade, env.transitions()
    env.timings["webhook_to_upgrade_start"] = at_epoch(upgrade[0]) - t0
    env.timings["webhook_to_success_note"] = t_note - t0
    # Issue 4's target: picked up within 3 s of the webhook (5 s here: a loaded 2-core machine).
    assert at_epoch(upgrade[0]) - t0 <= 5, "the webhook did not start the upgrade promptly"
    assert t_note - t0 < 60  # upgraded and reported, long before the 300 s poll
    new = env.running_job()
    assert new is not None and new.job_id != job
    assert env.runtime.flink(APP).checkpoints(new.job_id).restored_is_savepoint is True
    after = env.counts()
    assert all(after[k] >= before[k] for k in before), (before, after)
    assert d.passes("webhook") >= 1
    assert d.passes("poll") == 0

    # The operational endpoints.
    assert d.get("/healthz").status_code == 200
    assert d.get("/readyz").status_code == 200
    text = d.metrics()
    assert metric(text, "flink_reconciler_reconcile_outcomes_total", app=APP, outcome="success") >= 1
    assert metric(text, "flink_reconciler_reconcile_duration_seconds_count", app=APP) >= 1
    assert metric(text, "flink_reconciler_git_fetch_duration_seconds_count") >= 2
    assert metric(text, "flink_reconciler_step_duration_seconds_count", step="savepoint") >= 1 or \
        metric(text, "flink_reconciler_step_duration_seconds_count") >= 1, text
    assert f'flink_reconciler_last_applied_revision_info{{app="{APP}",revision="{sha5}"}} 1.0' in text
    page = d.get("/").text
    assert "flink-reconciler" in page and "ready: yes" in page, page
    env.shas.update(webhook=sha5, job=new.job_id)


@pytest.mark.flink
@pytest.mark.slow
def test_mass_deletion_guard_keeps_the_app(env: FlinkEnv) -> None:
    _need(env, "webhook")
    d = env.daemon
    job = env.shas["job"]

    def push_and_sync(sha: str) -> None:
        headers, body = github_push(WEBHOOK_SECRET, sha)
        assert httpx.post(d.url + "/webhook", content=body, headers=headers, timeout=10).status_code == 202

    # Every spec gone (an empty checkout, a wrong path...): prune is on, yet nothing is deleted.
    env.repo.remove(SPEC_FILE)
    sha6 = env.repo.commit("remove every spec")
    push_and_sync(sha6)
    line = wait_note(env.repo, sha6, "failure", d, timeout=60)
    assert "refusing to delete" in line and "no app specs at all" in line, line

    # The spec is back (unchanged): nothing to do.
    env.repo.write(SPEC_FILE, counter_spec(rate=RATE + 60))
    sha7 = env.repo.commit("restore the spec")
    push_and_sync(sha7)
    wait_note(env.repo, sha7, "success", d, timeout=60)

    # Most known apps gone in one commit (1 of 1, mass_delete_min_apps=1) while other specs remain.
    env.repo.remove(SPEC_FILE)
    env.repo.write("apps/other.yaml", counter_spec().replace(f"name: {APP}", "name: other").replace(
        "upgradeMode: savepoint", "upgradeMode: savepoint\n    state: suspended"))
    sha8 = env.repo.commit("counter gone, a new suspended app")
    push_and_sync(sha8)
    line = wait_note(env.repo, sha8, "failure", d, timeout=60)
    assert "mass-deletion guard" in line, line
    wait_note(env.repo, sha8, "success", d, timeout=30, app="other")
    blocked = [t for t in env.transitions(sha8) if t["action"] == "blocked"]
    assert blocked and "mass-deletion guard" in blocked[0]["message"], env.transitions(sha8)

    still = env.running_job()
    assert still is not None and still.job_id == job, (job, still)
    assert env.runtime.read_record(APP) is not None
    assert not [t for t in env.transitions() if t["action"] in ("delete", "deleted")]


def _push(env: FlinkEnv, spec: str, message: str) -> str:
    """Commit and tell daemon-2 by a signed webhook (its poll interval is 300 s)."""
    env.repo.write(SPEC_FILE, spec)
    sha = env.repo.commit(message)
    headers, body = github_push(WEBHOOK_SECRET, sha)
    assert httpx.post(env.daemon.url + "/webhook", content=body, headers=headers, timeout=10).status_code == 202
    return sha


@pytest.mark.flink
@pytest.mark.slow
def test_scale_up_from_a_savepoint_then_upgrade_again(env: FlinkEnv) -> None:
    _need(env, "webhook")
    d = env.daemon

    def push(spec: str, message: str) -> str:
        return _push(env, spec, message)

    # Scaling up from a savepoint leaves the new source subtask without a split: it FINISHES at once
    # while the job runs on and checkpoints. That job is healthy, and the next upgrade takes a savepoint.
    # Last in the module: whatever this leaves behind, no later test depends on it.
    sha = push(counter_spec(parallelism=2, rate=RATE + 60, healthy="15s"), "parallelism 2")
    wait_note(env.repo, sha, "success", d, timeout=120)
    job = poll(env.running_job, timeout=30, what="the scaled-up job", alive=d.died)
    assert env.runtime.flink(APP).checkpoints(job.job_id).restored_is_savepoint
    sha = push(counter_spec(parallelism=2, rate=RATE + 80, healthy="15s"), "rate +80 at parallelism 2")
    wait_note(env.repo, sha, "success", d, timeout=120)
    again = poll(env.running_job, timeout=30, what="the job upgraded again", alive=d.died)
    assert again.job_id != job.job_id
    cp = env.runtime.flink(APP).checkpoints(again.job_id)
    assert cp.restored_is_savepoint is True, cp
    sps = [s for s in env.history()["savepoints"] if s.get("revision") == sha]
    assert cp.restored_path and any(_same_path(cp.restored_path, s["path"]) for s in sps), (cp, sps)


@pytest.mark.flink
@pytest.mark.slow
def test_the_dashboard_shows_a_running_upgrade_step_by_step_and_the_failed_one(env: FlinkEnv) -> None:
    """In a real browser, on the daemon's port: the failed upgrade's reason (as the CLI says it), then an
    upgrade whose steps advance on the open page (no reload) until its lineage entry appears. After the
    scale test, which leaves the job running; nothing after this depends on what it leaves."""
    from tests.ui.browser import chromium, need_browser, open_page

    need_browser()
    _need(env, "failed", "webhook")
    d = env.daemon
    failed = env.shas["failed"]
    with chromium() as browser:
        w = open_page(browser)
        w.page.goto(f"{d.url}/apps/{APP}")
        failure = w.page.locator("#failure").inner_text()
        assert failed[:12] in failure and "ClassNotFoundException" in failure and "rolled back" in failure, failure
        w.page.evaluate("window.__same_page = true")

        # A TaskManager memory change: a new cluster starts (seconds of JVM start-up), so the page has time to
        # show the transition in flight. (A job-only upgrade on a warm cluster can finish in a third of a second.)
        sha = _push(env, counter_spec(parallelism=2, rate=RATE + 100, healthy="15s", tm_memory="1344m"),
                    "TaskManager memory 1344m, watched in the dashboard")
        seen: list[tuple[str, int]] = []  # (the running step, how many were done), each change as the page showed it
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            step = w.page.locator("#inflight .step.s-running .text")
            if step.count():
                now = (step.first.inner_text(), w.page.locator("#inflight .step.s-done").count())
                if not seen or seen[-1] != now:
                    seen.append(now)
            top = w.page.locator("#lineage li").first
            if top.count() and sha[:12] in top.inner_text() and not w.page.locator("#inflight .step").count():
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"no lineage entry of {sha[:12]} on the page within 150 s; steps seen: {seen}")
        # The transition appeared on the open page while it ran, then gave way to its lineage entry.
        assert seen, "the page never showed the transition in flight"
        assert any("cluster" in text.lower() for text, _ in seen), seen
        assert "success" in w.page.locator("#lineage li").first.inner_text()
        assert w.page.evaluate("window.__same_page") is True, "the page was reloaded"
        assert not w.errors, w.errors
    wait_note(env.repo, sha, "success", d, timeout=60)


def fresh_start_bound(job: Job, rate: int) -> float:
    """More than a job started without state at `rate` could have counted per key since it started."""
    return (rate / KEYS) * (time.time() - job.start_time_ms / 1000) * 1.5 + 5


def _same_path(a: str, b: str) -> bool:
    def norm(p: str) -> str:
        return re.sub(r"^file:/+", "/", p).rstrip("/")

    return norm(a) == norm(b)


# ------------------------------------------------------------------------------------------ Git robustness


SYNTH = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
spec:
  job:
    jarURI: jobs/app.jar
    parallelism: {p}
"""


@pytest.mark.slow
def test_git_unreachable_and_rewritten_history_keep_the_daemon_serving(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    for i in range(5):
        repo.write(f"apps/app-{i}.yaml", SYNTH.format(name=f"app-{i}", p=1))
    sha1 = repo.commit("five apps")
    d = DaemonProc.start(tmp_path / "daemon.log", repo_url=repo.origin, state_dir=tmp_path / "state",
                         dry_run=True, poll_interval=0.5, drift_interval=3, prune=True)
    try:
        poll(lambda: d.get("/readyz").status_code == 200, timeout=60, what="/readyz 200", alive=d.died)
        # Dry run: plans are reported (pending: nothing executes them), nothing starts.
        line = poll(lambda: note_line(repo, sha1, "app-0"), timeout=30, what="a note on the first commit",
                    alive=d.died)
        assert line.startswith("flink-reconciler/app-0: pending - create"), line

        # Origin gone: /readyz 503 with the reason, everything else keeps answering.
        moved = tmp_path / "origin-away.git"
        shutil.move(repo.origin, moved)
        def unready() -> httpx.Response | None:
            x = d.get("/readyz")
            return x if x.status_code == 503 else None

        r = poll(unready, timeout=30, what="/readyz 503", alive=d.died)
        assert "failed: SourceUnreachableError: git fetch" in r.text and "does not appear to be a git repository" \
            in r.text, r.text
        assert d.get("/healthz").status_code == 200
        assert "ready: no" in d.get("/").text
        assert d.metric("flink_reconciler_git_fetch_errors_total") >= 1
        fails = d.passes("poll")
        d.wait_passes("poll", fails + 2, timeout=30)  # keeps trying, never exits
        assert d.proc.poll() is None

        # Back: ready again, without a restart.
        shutil.move(moved, repo.origin)
        poll(lambda: d.get("/readyz").status_code == 200, timeout=30, what="/readyz 200 again", alive=d.died)

        # History rewritten (force push): the new tip is taken as is and reported on.
        repo.write("apps/app-0.yaml", SYNTH.format(name="app-0", p=1) + "  deadlines:\n    start: 3m\n")
        repo.write("apps/app-1.yaml", SYNTH.format(name="app-1", p=1) + "    paralelism: 2\n")
        git(repo.work, "add", "-A")
        git(repo.work, "commit", "-q", "--amend", "-m", "five apps, rewritten")
        git(repo.work, "push", "-q", "--force", "origin", "HEAD:main")
        sha2 = git(repo.work, "rev-parse", "HEAD")
        assert sha2 != sha1
        line = poll(lambda: note_line(repo, sha2, "app-1"), timeout=30, what="a note on the rewritten tip",
                    alive=d.died)
        assert line.startswith("flink-reconciler/app-1: error") and "apps/app-1.yaml:9" in line, line
        warned = [r for r in d.log() if "rewritten" in str(r.get("msg", ""))]
        assert warned, d.log_tail()
        assert d.get("/readyz").status_code == 200
    finally:
        rc = d.stop()
    assert rc == 0, d.log_tail()
