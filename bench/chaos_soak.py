"""Chaos soak: a daemon, several stateful apps on real Flink, and a seeded random schedule of changes and faults.

Built the way a user runs the product: a Git working copy with a bare repository as origin, the example
counter job (examples-repo/jobs/counter) as N apps with checkpoints every 2 s, the local runtime, and
`flink-reconciler run` as its own process with short poll and drift intervals. Then rounds. Each round
draws from a `random.Random(seed)`:

- at most one spec change, committed and pushed: the job's `--rate` argument (a savepoint upgrade),
  `job.parallelism` (a rescale) or `taskManager.resources.memory` (new JVMs: a warm standby or a cold
  restart);
- at most one fault, of the kinds selected with `--faults`:
    daemon  kill -9 or SIGTERM of the daemon, mid-transition when the round has a change (as soon as an
            app's record shows an execution in flight, after a random delay), then a restart;
    tm, jm  kill -9 of a TaskManager or the JobManager JVM (PIDs from cluster.json): of a random app, or, half
            the time in a round with a change, of the changed app once its upgrade is past the stop;
    git     the bare origin renamed away for a few seconds right after the push;
    rest    Flink REST faults (503/500, connection resets, a lost answer, truncated JSON, an 11 s stall) on
            the requests of one app: a fault proxy (tests/faults/proxy.py) in front of its JobManager,
            put in by rewriting `rest_port` in the app's cluster.json under the runtime's per-app lock (the
            daemon reads that record for every Flink call), just before the round's push. The faults stay
            armed 5-15 s, and while that app's transition is still in flight (up to 30 s more); the proxy
            then passes everything through and the record is pointed back at the JobManager.
    stopfail  an upgrade whose stop-with-savepoint genuinely fails and whose old job then dies too: a `--rate`
            change (its first step is the stop), the app's savepoint directory replaced by a plain file before the
            push (Flink cannot create the savepoint under it), and once the upgrade has failed, kill -9 of its
            JobManager (then the directory is put back).
            The failed spec is not retried until Git changes it; the last applied spec must run again, from its
            newest state, and the commit's status must say both.

After each round it waits (bounded by --converge-timeout) until every app is converged, seen twice in a
row: its record has the pushed spec applied and nothing in flight, and its cluster runs exactly one
unfinished job, RUNNING with every task up, the job the record names, at the desired parallelism. After a
`stopfail`, until the next push to that app, "the pushed spec" is the one that ran before it, and its record must
name the pushed one as failed. The converge time runs from the round's first action to the first converged sample.

Invariants, checked on every sample (about once a second) and at the end:
- no job started from empty state: every job after an app's first was restored from a savepoint or a
  checkpoint (Flink's checkpoint stats, `latest.restored`), and each key's count (the counter job's output
  files) never goes back by more than what a restore from a checkpoint replays (rate per key x (3
  checkpoint intervals + 5 s)); smaller steps back are counted as replays (the sink is not transactional).
  After a JobManager kill the old TaskManagers run their tasks on, writing counts past the last checkpoint,
  until they miss its heartbeats (Flink's heartbeat.timeout, 50 s) or the repair replaces them: the time since
  that kill, capped at the timeout, is added to the replay allowed.
- no record lost: every app keeps its record in the state directory;
- one job per app: never two unfinished counter jobs over an app's clusters (live, standby, retired);
- the daemon only exits when the soak stops it;
- no app left without a job where Git wants one, unless every state of it is unusable and its status says so
  (checked at the end of every round).

Prints every round as it ends, then a summary (rounds, faults by kind, converge times median/max,
replays, violations). Exit code 1 on a violation or a round that did not converge. Every JVM and daemon
it started is stopped at the end (also on Ctrl-C). Not a test; tests/e2e/test_chaos_soak.py runs a short
seeded soak.

Run: .venv/bin/python bench/chaos_soak.py --seed 1 --minutes 30 --apps 3 --faults daemon,tm,jm,git,rest \
         --out soak.json [--state-dir DIR] [--rounds N] [--converge-timeout 240] [--jar counter.jar]
         [--stop-on-failure]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import yaml

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.plan import spec_hash
from reconciler.errors import ReconcilerError
from reconciler.live.local.config import MARKER_PROPERTY, find_flink_home
from reconciler.live.local.runtime import LocalRuntime
from reconciler.spec.model import FlinkApp
from tests.faults.proxy import FaultProxy, Rule
from tests.fixtures.flink import COUNTER_DIR, COUNTER_MAIN, read_counts, teardown_runtime
from tests.gitutil import Repo

ROOT = Path(__file__).resolve().parents[1]
FAULT_KINDS = ("daemon", "tm", "jm", "git", "rest", "stopfail")
CHANGE_KINDS = ("rate", "parallelism", "tm_memory")
JAR_PATH = "jobs/counter/counter.jar"
KEYS = 4
CHECKPOINT_S = 2.0
HEARTBEAT_TIMEOUT_S = 50.0  # Flink's heartbeat.timeout default; the soak's clusters keep it
RATES = (20, 40, 60, 80)  # records/s over all keys
PARALLELISMS = (1, 2)
TM_MEMORIES = ("1280m", "1536m")
TERMINAL = {"FINISHED", "CANCELED", "FAILED"}
BLOCKED_SP_SUFFIX = ".soak-blocked"  # a savepoint directory moved aside by the stopfail fault
# A status that says an app has no usable state (core.restore): the one reason it may be left without a job.
NO_USABLE_STATE = ("no retained checkpoint", "could not be read", "belongs to a job this app never ran",
                   "maxCheckpointAge")
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=5.0)


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ the apps


@dataclass(frozen=True)
class AppSpec:
    name: str
    rate: int = 40
    parallelism: int = 1
    tm_memory: str = "1280m"

    def text(self) -> str:
        return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {self.name}
spec:
  taskManager:
    slots: 2
    resources:
      memory: {self.tm_memory}
  flinkConfiguration:
    execution.checkpointing.interval: {CHECKPOINT_S:g} s
  job:
    jarURI: {JAR_PATH}
    entryClass: {COUNTER_MAIN}
    args: ["--output-dir", "out", "--keys", "{KEYS}", "--rate", "{self.rate}"]
    parallelism: {self.parallelism}
    upgradeMode: savepoint
  deadlines:
    start: 2m
"""

    def spec_hash(self) -> str:
        return FlinkApp.model_validate(yaml.safe_load(self.text())).spec_hash

    @property
    def path(self) -> str:
        return f"apps/{self.name}.yaml"


# ------------------------------------------------------------------------------------------ the daemon


@dataclass
class Daemon:
    """`flink-reconciler run` in its own process, logging JSON lines to a file."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, log_path: Path, **settings: object) -> Daemon:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FLINK_RECONCILER_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        for key, value in {"listen_port": 0, "probe_port": 0, "log_format": "json", **settings}.items():
            env[f"FLINK_RECONCILER_{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
        with log_path.open("ab") as err:
            # Its own session: a Ctrl-C meant for the soak must not reach it (the soak stops it itself).
            proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "run"], cwd=ROOT, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)
        return cls(proc, log_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> int | None:
        return self.proc.poll()

    def tail(self, n: int = 15) -> list[str]:
        """The last lines of its log, without per-request HTTP client lines."""
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return []
        out: list[str] = []
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                out.append(line)
                continue
            if not isinstance(rec, dict):
                out.append(line)
            elif rec.get("logger") not in ("httpx", "httpcore") and not _routine(rec):
                extra = {k: v for k, v in rec.items() if k not in ("msg", "logger", "level", "time", "ts")}
                out.append(f"{rec.get('level', '')} {rec.get('msg', '')} {json.dumps(extra) if extra else ''}".strip())
        return out[-n:]

    def stop(self, sig: signal.Signals, timeout: float) -> int | None:
        """Send `sig` and wait up to `timeout` s; None when it is still running."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


# ------------------------------------------------------------------------------------------ what one sample sees


@dataclass(frozen=True)
class AppView:
    app: str
    converged: bool
    why_not: str
    cluster: str  # JobManager / TaskManager processes, from cluster.json and /proc
    jobs: str  # the cluster's jobs as Flink lists them
    record: str  # the reconciler's record: applied spec, outcome, in flight
    unfinished_jobs: int  # over the app's clusters (live, standby, retired)
    job_id: str | None = None  # the one unfinished job of its live cluster
    rest_url: str | None = None


@dataclass
class RoundResult:
    index: int
    change: dict[str, Any] | None
    faults: list[dict[str, Any]]
    converged: bool
    converge_s: float | None
    replays: int = 0
    violations: list[str] = field(default_factory=list)
    not_converged: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ProxySwap:
    """A fault proxy in front of one app's JobManager, and what cluster.json said before."""

    app: str
    cluster_id: str
    real_port: int
    proxy: FaultProxy

    @property
    def proxy_port(self) -> int:
        return int(self.proxy.url.rsplit(":", 1)[1])


# ------------------------------------------------------------------------------------------ the soak


class Soak:
    def __init__(self, root: Path, *, seed: int, apps: int, faults: Sequence[str], jar: Path | None,
                 converge_timeout: float, poll_interval: float, drift_interval: float) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.seed = seed
        self.fault_kinds = tuple(faults)
        self.converge_timeout = converge_timeout
        self.poll_interval = poll_interval
        self.drift_interval = drift_interval
        self.state_dir = root / "state"
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.flink_home = find_flink_home()
        self.jar = jar
        self.repo: Repo | None = None
        self.origin_away = root / "origin-away.git"
        self.specs = {f"soak-{i}": AppSpec(f"soak-{i}", rate=RATES[i % 2 + 1]) for i in range(apps)}
        self.runtime = LocalRuntime(self.state_dir, clock=SystemClock(), flink_home=self.flink_home)
        self.journal = Journal(self.state_dir / "journal", SystemClock())
        self.daemon: Daemon | None = None
        self.daemon_starts = 0
        self.swaps: list[ProxySwap] = []
        self.counts: dict[str, dict[str, int]] = {}
        self.max_rate = max(s.rate for s in self.specs.values())
        self.replays = 0
        self.jm_killed: dict[str, float] = {}  # app -> when its JobManager was last killed (time.monotonic())
        self.violations: list[str] = []
        self.rounds: list[RoundResult] = []
        self.create_s: float | None = None
        self.leftovers: list[str] = []  # clusters beside the live one at the end (not a violation: a leak)
        self.jobs_seen: dict[str, set[str]] = {}  # app -> job ids already checked
        self.restores: Counter[str] = Counter()  # how the jobs after the first were started
        self.empty_starts = 0  # jobs after an app's first that were not restored from anything
        # app -> (the spec that runs, the pushed commit whose spec failed): after a stopfail, until the next push
        self.failed: dict[str, tuple[AppSpec, str]] = {}
        self.without_job: list[str] = []  # at a round's end: apps with no job where Git wants one (unexplained)
        self.without_job_said: list[str] = []  # ... whose every state is unusable, as their status says

    # ---- setup and teardown --------------------------------------------------------------------

    def setup(self) -> None:
        jar = self.jar or self._build_jar()
        (self.root / "git").mkdir(exist_ok=True)
        self.repo = Repo(self.root / "git")
        self.repo.write("README.md", "GitOps repo of the chaos soak\n")
        self.repo.write(JAR_PATH, jar.read_bytes())
        for s in self.specs.values():
            self.repo.write(s.path, s.text())
        self.repo.commit(f"{len(self.specs)} counter apps")
        self.start_daemon()
        t0 = time.monotonic()
        view = self.wait_converged(max(self.converge_timeout, 300.0), t0)
        if view is None:
            raise SystemExit("the apps were never created:\n" + self.describe())
        self.create_s = round(view, 2)
        log(f"{len(self.specs)} apps created and running in {self.create_s} s")

    def _build_jar(self) -> Path:
        out = self.root / "counter.jar"
        env = {**os.environ, "PYTHON": sys.executable, "FLINK_HOME": str(self.flink_home)}
        subprocess.run(["bash", str(COUNTER_DIR / "build.sh"), str(out)], env=env, check=True, capture_output=True)
        return out

    def start_daemon(self) -> None:
        assert self.repo is not None
        self.daemon_starts += 1
        self.daemon = Daemon.start(
            self.logs / f"daemon-{self.daemon_starts}.log", repo_url=self.repo.origin, state_dir=self.state_dir,
            poll_interval=self.poll_interval, drift_interval=self.drift_interval, status_sink="notes",
            max_parallel=max(2, len(self.specs)), shutdown_deadline=20, prune=False)
        log(f"daemon #{self.daemon_starts} started (pid {self.daemon.pid})")

    def teardown(self) -> None:
        """Stop everything this soak started: the daemon, every cluster, proxies; put origin back."""
        if self.daemon is not None:
            rc = self.daemon.stop(signal.SIGTERM, 40)
            if rc is None:
                self.violations.append("teardown: the daemon ignored SIGTERM for 40 s (killed)")
                self.daemon.kill()
            elif rc != 0:
                self.violations.append(f"teardown: the daemon exited with {rc} on SIGTERM")
        for s in self.swaps:
            s.proxy.clear()
        try:
            teardown_runtime(self.runtime)
        except (ReconcilerError, OSError) as e:
            log(f"teardown of the clusters failed ({e}); killing their JVMs")
        killed = kill_jvms_under(self.state_dir)
        if killed:
            log(f"killed {killed} JVM(s) left under {self.state_dir}")
        for s in self.swaps:
            s.proxy.stop()
        if self.repo is not None and self.origin_away.exists() and not self.repo.origin.exists():
            shutil.move(self.origin_away, self.repo.origin)
        HTTP.close()

    # ---- observing -------------------------------------------------------------------------------

    def rest_url(self, app: str, slot: str = "cluster") -> tuple[str | None, dict[str, Any] | None]:
        """The app's JobManager REST URL (past a proxy this soak put in) and its cluster.json."""
        path = self.runtime.paths(app).slot(slot)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None, None
        port = int(doc["rest_port"])
        for s in self.swaps:
            if s.app == app and s.cluster_id == doc.get("cluster_id") and port == s.proxy_port:
                port = s.real_port
        return f"http://127.0.0.1:{port}", doc

    def jobs(self, url: str) -> list[dict[str, Any]] | None:
        try:
            r = HTTP.get(url + "/jobs/overview")
            jobs: list[dict[str, Any]] = r.json().get("jobs", [])
            return jobs
        except (httpx.HTTPError, ValueError):
            return None

    def parallelism(self, url: str, jid: str) -> int | None:
        try:
            body = HTTP.get(f"{url}/jobs/{jid}").json()
            return max(int(v.get("parallelism", 0)) for v in body.get("vertices", []))
        except (httpx.HTTPError, ValueError, TypeError):
            return None

    def view(self, app: str) -> AppView:
        want, failed = self.specs[app], self.failed.get(app)
        runs = failed[0] if failed else want  # after a stopfail: the spec that ran before the failed push
        url, doc = self.rest_url(app)
        cluster, procs_up = "no cluster.json", False
        if doc is not None:
            marker = f"-D{MARKER_PROPERTY}={doc.get('cluster_id')}"
            jm = alive(int(doc["jobmanager"]["pid"]), marker)
            tms = doc.get("taskmanagers") or []
            up = sum(1 for p in tms if alive(int(p["pid"]), marker))
            procs_up = jm and up == len(tms) > 0
            cluster = f"JobManager {'up' if jm else 'DEAD'}, TaskManagers {up}/{len(tms)} up"
        unfinished = 0
        for slot in ("standby", "retired"):
            other, _ = self.rest_url(app, slot)
            if other is not None:
                unfinished += sum(1 for j in self.jobs(other) or [] if j.get("state") not in TERMINAL
                                  and j.get("name") != "flink-reconciler warm-up")
        jobs = self.jobs(url) if url else None
        live = [j for j in jobs or [] if j.get("state") not in TERMINAL]
        unfinished += len(live)
        jobs_text = "REST not answering" if jobs is None else ", ".join(
            f"{j['jid'][:8]} {j.get('state')} {(t := j.get('tasks', {})).get('running', 0)}/{t.get('total', 0)}"
            for j in jobs) or "no jobs"
        rec = self.journal.record(app)
        inflight = self.journal.inflight(app)
        if rec is None:
            record = "NO RECORD"
        else:
            applied = spec_hash(rec.last_applied_spec) if rec.last_applied_spec else None
            record = (f"applied {'the desired spec' if applied == runs.spec_hash() else 'another spec'} "
                      f"({(rec.last_applied_revision or '-')[:8]}), outcome {rec.last_outcome}, "
                      f"job {(rec.job_id or '-')[:8]}")
            if inflight is not None:
                record += f", in flight: {inflight.stage} step {inflight.step_index} {inflight.phase}"
            if rec.last_message and rec.last_outcome is not None and rec.last_outcome.value != "success":
                record += f", message: {rec.last_message[:300]}"
        why = ""
        if rec is None:
            why = "no record"
        elif inflight is not None:
            why = "an execution is in flight"
        elif not rec.last_applied_spec or spec_hash(rec.last_applied_spec) != runs.spec_hash():
            why = "the desired spec is not applied" if failed is None else "the last applied spec is not the one before"
        elif failed is not None and rec.failed_spec_hash != want.spec_hash():
            why = "the pushed spec is not recorded as failed"
        elif not procs_up:
            why = f"cluster processes down ({cluster})"
        elif jobs is None:
            why = "Flink REST not answering"
        elif len(live) != 1:
            why = f"{len(live)} unfinished jobs"
        else:
            j = live[0]
            tasks = j.get("tasks", {})
            total, running, finished = (int(tasks.get(k, 0)) for k in ("total", "running", "finished"))
            if j.get("state") != "RUNNING" or running == 0 or running + finished != total:
                why = f"job {j['jid'][:8]} is {j.get('state')} with {running}/{total} tasks running"
            elif rec.job_id and rec.job_id != j["jid"]:
                why = f"Flink runs {j['jid'][:8]}, the record names {rec.job_id[:8]}"
            elif url is not None and (p := self.parallelism(url, j["jid"])) != runs.parallelism:
                why = f"job parallelism {p}, desired {runs.parallelism}"
        return AppView(app, not why, why, cluster, jobs_text, record, unfinished,
                       live[0]["jid"] if len(live) == 1 else None, url)

    def sample(self) -> list[AppView]:
        """One look at every app: views, counts (checked), the daemon."""
        self.journal.refresh()
        views = [self.view(app) for app in self.specs]
        for v in views:
            if v.record == "NO RECORD" and self.create_s is not None:
                self.violate(f"{v.app}: its record is gone")
            if v.unfinished_jobs > 1:
                self.violate(f"{v.app}: {v.unfinished_jobs} unfinished jobs at once ({v.jobs})")
        for app in self.specs:
            self.check_counts(app)
        d = self.daemon
        if d is not None and (rc := d.exited()) is not None:
            self.violate(f"the daemon exited by itself with {rc}: " + " | ".join(d.tail(8)))
            self.start_daemon()
        return views

    def check_counts(self, app: str) -> None:
        """Compare each key's count with the previous sample of the same app (see `count_steps_back`)."""
        now = read_counts(self.runtime.paths(app).work / "out")
        allowance = self.max_rate / KEYS * (3 * CHECKPOINT_S + 5 + self.orphaned_s(app))
        replayed, lost = count_steps_back(self.counts.get(app, {}), now, allowance)
        if replayed:
            self.replays += 1
            log(f"{app}: counts replayed from a checkpoint: {replayed}")
        if lost:
            self.violate(f"{app}: counts went back by more than a checkpoint replay ({allowance:.0f}): {lost} "
                         "(state lost: a job started from empty state?)")
        self.counts[app] = {**self.counts.get(app, {}), **now}

    def orphaned_s(self, app: str) -> float:
        """How long the app's TaskManagers may have run tasks with their JobManager dead (see the docstring)."""
        killed = self.jm_killed.get(app)
        return 0.0 if killed is None else min(time.monotonic() - killed, HEARTBEAT_TIMEOUT_S)

    def violate(self, what: str) -> None:
        if what not in self.violations:
            log(f"VIOLATION: {what}")
            self.violations.append(what)

    def wait_converged(self, timeout: float, t0: float) -> float | None:
        """Seconds from `t0` to the first of two converged samples in a row; None after `timeout`."""
        first: float | None = None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            views = self.sample()
            if all(v.converged for v in views):
                if first is not None:
                    self.check_restored(views)
                    return first
                first = time.monotonic() - t0
            else:
                first = None
            time.sleep(1.0)
        return None

    def check_restored(self, views: list[AppView]) -> None:
        """Every job after an app's first must have been restored from a savepoint or checkpoint (Flink's own
        checkpoint stats say so): a job started from empty state is a violation, however small its counts."""
        for v in views:
            if v.job_id is None or v.rest_url is None or v.job_id in self.jobs_seen.setdefault(v.app, set()):
                continue
            first = not self.jobs_seen[v.app]
            self.jobs_seen[v.app].add(v.job_id)
            if first and self.create_s is None:
                continue  # created in setup, from empty state by design
            restored = None
            end = time.monotonic() + 10  # Flink caches checkpoint stats for web.refresh-interval
            while restored is None and time.monotonic() < end:
                try:
                    latest = HTTP.get(f"{v.rest_url}/jobs/{v.job_id}/checkpoints").json().get("latest") or {}
                    restored = latest.get("restored")
                except (httpx.HTTPError, ValueError, AttributeError):
                    pass
                if restored is None:
                    time.sleep(0.5)
            if restored is None:
                self.empty_starts += 1
                self.violate(f"{v.app}: job {v.job_id} was not restored from any savepoint or checkpoint "
                             "(started from empty state)")
            else:
                self.restores["savepoint" if restored.get("is_savepoint") else "checkpoint"] += 1

    def describe(self) -> str:
        lines = []
        self.journal.refresh()
        rows = {r.get("app"): r for r in self.status_rows()}
        for app in self.specs:
            v = self.view(app)
            lines += [f"  {app}: {'converged' if v.converged else 'NOT converged: ' + v.why_not}",
                      f"    cluster: {v.cluster}", f"    jobs:    {v.jobs}", f"    record:  {v.record}",
                      f"    status:  {json.dumps(rows.get(app))}"]
        if self.daemon is not None:
            lines.append("  daemon log (last lines):")
            lines += [f"    {x[:400]}" for x in self.daemon.tail(12)]
        return "\n".join(lines)

    def status_rows(self) -> list[dict[str, Any]]:
        """`flink-reconciler status --output json`, as an operator would run it."""
        assert self.repo is not None
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FLINK_RECONCILER_")}
        env |= {"FLINK_RECONCILER_STATE_DIR": str(self.state_dir), "FLINK_RECONCILER_REPO_URL": str(self.repo.origin),
                "PYTHONPATH": str(ROOT)}
        try:
            proc = subprocess.run([sys.executable, "-m", "reconciler.cli", "status", "--output", "json"], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=60, check=False)
            rows: list[dict[str, Any]] = json.loads(proc.stdout)
            return rows
        except (subprocess.TimeoutExpired, ValueError):
            return []

    # ---- changes ------------------------------------------------------------------------------------

    def pick_change(self, kinds: Sequence[str] = CHANGE_KINDS) -> AppSpec:
        app = self.rng.choice(sorted(self.specs))
        cur = self.specs[app]
        kind = self.rng.choice(kinds)
        if kind == "rate":
            return replace(cur, rate=self.rng.choice([r for r in RATES if r != cur.rate]))
        if kind == "parallelism":
            return replace(cur, parallelism=self.rng.choice([p for p in PARALLELISMS if p != cur.parallelism]))
        return replace(cur, tm_memory=self.rng.choice([m for m in TM_MEMORIES if m != cur.tm_memory]))

    def push(self, new: AppSpec) -> dict[str, Any]:
        assert self.repo is not None
        old = self.specs[new.name]
        changed = {k: (getattr(old, k), getattr(new, k)) for k in ("rate", "parallelism", "tm_memory")
                   if getattr(old, k) != getattr(new, k)}
        self.repo.write(new.path, new.text())
        sha = self.repo.commit(f"{new.name}: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()))
        self.specs[new.name] = new
        self.failed.pop(new.name, None)  # Git changed the spec: the new one is tried
        self.max_rate = max(self.max_rate, new.rate)
        return {"app": new.name, "sha": sha[:12], "commit": sha,
                **{k: f"{a} -> {b}" for k, (a, b) in changed.items()}}

    # ---- faults -----------------------------------------------------------------------------------------

    def fault_daemon(self, with_change: bool) -> dict[str, Any]:
        """kill -9 or SIGTERM the daemon: mid-transition when something is in flight; then start a new one."""
        assert self.daemon is not None
        seen_inflight = False
        if with_change:
            end = time.monotonic() + 30
            while time.monotonic() < end and not seen_inflight:
                self.journal.refresh()
                seen_inflight = bool(self.journal.all_inflight())
                time.sleep(0.1)
        time.sleep(self.rng.uniform(0.0, 0.6) if seen_inflight else self.rng.uniform(0.0, 4.0))
        self.journal.refresh()
        inflight = {a: f"{f.stage} step {f.step_index} {f.phase}" for a, f in self.journal.all_inflight().items()}
        sig = self.rng.choice([signal.SIGKILL, signal.SIGTERM])
        rc = self.daemon.stop(sig, 60)
        note = ""
        if rc is None:
            self.violate(f"the daemon ignored {sig.name} for 60 s: " + " | ".join(self.daemon.tail(8)))
            self.daemon.kill()
        elif sig is signal.SIGTERM and rc != 0:
            note = f" (exit code {rc})"
        time.sleep(self.rng.uniform(0.5, 2.0))
        self.start_daemon()
        return {"kind": "daemon", "signal": sig.name, "in_flight": inflight or None, "exit": rc, "note": note}

    def fault_jvm(self, role: str, *, changed: str | None = None) -> dict[str, Any]:
        """kill -9 the JobManager or one TaskManager of a random app (only PIDs carrying its cluster marker). With
        `changed` (the app of the round's push), half the time that app's, mid-transition: once its execution is
        past the stop-with-savepoint (the old job stopped, the new one being started), the window where a dead
        JobManager has no job left to recover."""
        app = self.rng.choice(sorted(self.specs))
        when = "at random"
        if changed is not None and self.rng.random() < 0.5:
            app, when = changed, "before the stop"
            end = time.monotonic() + 30
            while time.monotonic() < end:
                self.journal.refresh()
                f = self.journal.inflight(app)
                if f is not None and f.captured_path:
                    when = f"after the stop ({f.stage} step {f.step_index} {f.phase})"
                    break
                time.sleep(0.05)
        else:
            time.sleep(self.rng.uniform(0.0, 5.0))
        _, doc = self.rest_url(app)
        if doc is None:
            return {"kind": role, "app": app, "skipped": "no cluster.json"}
        marker = f"-D{MARKER_PROPERTY}={doc['cluster_id']}"
        procs = [doc["jobmanager"]] if role == "jm" else list(doc.get("taskmanagers") or [])
        procs = [p for p in procs if alive(int(p["pid"]), marker)]
        if not procs:
            return {"kind": role, "app": app, "skipped": "no live process"}
        p = self.rng.choice(procs)
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(p["pid"]), signal.SIGKILL)
        if role == "jm":
            self.jm_killed[app] = time.monotonic()
        return {"kind": role, "app": app, "pid": int(p["pid"]), "process": f"{p['role']}-{p['index']}", "when": when}

    def fault_git(self) -> dict[str, Any]:
        """The bare origin is renamed away for a few seconds (fetches and notes pushes fail meanwhile)."""
        assert self.repo is not None
        away = round(self.rng.uniform(3.0, 10.0), 1)
        shutil.move(self.repo.origin, self.origin_away)
        try:
            self.sleep_sampling(away)
        finally:
            shutil.move(self.origin_away, self.repo.origin)
        return {"kind": "git", "unreachable_s": away}

    def fault_rest(self, app: str | None, then: Callable[[], object]) -> dict[str, Any]:
        """A fault proxy in front of one app's JobManager for a few seconds (see the module docstring);
        `then` (the round's push) runs once it is in place, so the transition meets the faults."""
        app = app or self.rng.choice(sorted(self.specs))
        rules = self.rng.sample(rest_rules(), k=3)
        window = round(self.rng.uniform(5.0, 15.0), 1)
        path = self.runtime.paths(app).record
        with app_lock(self.state_dir, app, timeout=10) as locked:
            if not locked:
                then()
                return {"kind": "rest", "app": app, "skipped": "the app's lock stayed busy"}
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                then()
                return {"kind": "rest", "app": app, "skipped": "no cluster.json"}
            proxy = FaultProxy(f"http://127.0.0.1:{doc['rest_port']}", rules=list(rules)).start()
            swap = ProxySwap(app, str(doc["cluster_id"]), int(doc["rest_port"]), proxy)
            self.swaps.append(swap)
            write_json(path, {**doc, "rest_port": swap.proxy_port})
        armed = time.monotonic()
        then()
        self.sleep_sampling(window)
        end = time.monotonic() + 30  # a transition still under way (e.g. a warm standby starting) keeps them armed
        while time.monotonic() < end and self.journal.inflight(app) is not None:
            self.sleep_sampling(1.0)
        hits = sorted({f"{s.method} {s.path}: {s.action}" for s in list(proxy.seen)
                       if not s.action.startswith("forwarded")})
        proxy.clear()  # from here on it passes everything through, even if the record keeps pointing at it
        self.unswap()
        return {"kind": "rest", "app": app, "window_s": round(time.monotonic() - armed, 1),
                "rules": [f"{r.kind} {r.method} {r.path} x{r.times}" for r in rules], "injected": hits}

    def fault_stopfail(self, change: AppSpec, then: Callable[[], str | None]) -> dict[str, Any]:
        """A stop-with-savepoint that genuinely fails, then the old job killed with its JobManager (see the module
        docstring). `then` (the round's push) runs once the savepoint directory is blocked; returns its commit."""
        app = change.name
        runs = self.failed[app][0] if app in self.failed else self.specs[app]
        sp = self.runtime.paths(app).savepoints
        if not sp.is_dir():
            then()
            return {"kind": "stopfail", "app": app, "skipped": "no savepoint directory"}
        moved = sp.with_name(sp.name + BLOCKED_SP_SUFFIX)
        os.replace(sp, moved)
        sp.write_text("not a directory: the chaos soak blocks savepoints here\n")
        try:
            commit = then()
            outcome, message = None, ""
            end = time.monotonic() + 120  # a warm standby starts first
            while time.monotonic() < end:
                self.journal.refresh()
                rec = self.journal.record(app)
                if rec is not None and rec.last_attempted_revision == commit and self.journal.inflight(app) is None \
                        and rec.last_outcome is not None and rec.last_outcome.value in ("failure", "success"):
                    outcome, message = rec.last_outcome.value, rec.last_message or ""
                    break
                self.sample()
                time.sleep(0.2)
            if outcome != "failure":
                return {"kind": "stopfail", "app": app, "skipped": f"the upgrade did not fail ({outcome}: "
                                                                   f"{message[:200]})"}
            _, doc = self.rest_url(app)
            pid = None
            if doc is not None and alive(int(doc["jobmanager"]["pid"]), f"-D{MARKER_PROPERTY}={doc['cluster_id']}"):
                pid = int(doc["jobmanager"]["pid"])
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.jm_killed[app] = time.monotonic()
        finally:
            sp.unlink()
            os.replace(moved, sp)
        assert commit is not None
        self.failed[app] = (runs, commit)
        return {"kind": "stopfail", "app": app, "commit": commit[:12], "killed_jobmanager": pid,
                "failure": message[:300]}

    def check_failed_status(self, app: str, commit: str) -> None:
        """After a stopfail round converged: the failed commit's status says both facts (git notes on origin)."""
        assert self.repo is not None
        line = ""
        end = time.monotonic() + 30  # statuses are pushed in the background
        while time.monotonic() < end:
            proc = subprocess.run(["git", "--git-dir", str(self.repo.origin), "notes", "--ref=flink-reconciler",
                                   "show", commit], capture_output=True, text=True, check=False)
            line = next((x for x in proc.stdout.splitlines() if x.startswith(f"flink-reconciler/{app}: ")), "")
            if "runs again" in line:
                break
            time.sleep(1.0)
        if not (line.startswith(f"flink-reconciler/{app}: failure - ") and "runs again" in line
                and "already failed" in line):
            self.violate(f"{app}: the status of {commit[:12]} does not say that its spec failed and the last applied "
                         f"one runs again: {line[:400]!r}")

    def check_jobs_where_wanted(self, index: int) -> None:
        """At a round's end: an app Git wants running has a job, or its status says why none can be started
        (every state unusable). Anything else is an app left without a job."""
        rows: dict[str, Any] | None = None
        for app in self.specs:
            v = self.view(app)
            if v.unfinished_jobs >= 1:
                continue
            if rows is None:
                rows = {str(r.get("app")): r for r in self.status_rows()}
            row = json.dumps(rows.get(app))
            if any(s in row for s in NO_USABLE_STATE):
                self.without_job_said.append(f"round {index}: {app}: {row[:300]}")
            else:
                self.without_job.append(f"round {index}: {app}")
                self.violate(f"{app}: left without a job after round {index} ({v.why_not}; status {row[:300]})")

    def unswap(self) -> None:
        """Point every cluster.json back at its JobManager; a proxy is stopped once nothing names it."""
        for s in list(self.swaps):
            path = self.runtime.paths(s.app).record
            with app_lock(self.state_dir, s.app, timeout=30) as locked:
                if not locked:
                    continue
                try:
                    doc = json.loads(path.read_text())
                except (OSError, ValueError):
                    doc = {}
                if doc.get("cluster_id") == s.cluster_id and doc.get("rest_port") == s.proxy_port:
                    write_json(path, {**doc, "rest_port": s.real_port})
                retired = self.runtime.paths(s.app).slot("retired")
                with contextlib.suppress(OSError, ValueError):
                    if json.loads(retired.read_text()).get("rest_port") == s.proxy_port:
                        continue  # the retired cluster still reaches its JobManager through the proxy
            s.proxy.stop()
            self.swaps.remove(s)

    def sleep_sampling(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.sample()
            time.sleep(min(1.0, max(0.0, left)))

    # ---- rounds -----------------------------------------------------------------------------------------

    def round(self, index: int) -> RoundResult:
        violations_before, replays_before = len(self.violations), self.replays
        change = self.pick_change() if self.rng.random() < 0.8 else None
        fault = self.rng.choice(self.fault_kinds) if self.fault_kinds and self.rng.random() < 0.8 else None
        if change is None and fault is None:
            change = self.pick_change()
        if fault == "stopfail" and (change is None or change.rate == self.specs[change.name].rate):
            # A job-only upgrade: its first step is the stop (a parallelism change rescales in place, a TaskManager
            # memory change may start a warm standby first, which the blocked directory fails before the stop).
            change = self.pick_change(("rate",))
        if fault == "stopfail" and change is not None and change.name in self.failed:
            runs = self.failed[change.name][0]  # not the spec that runs after an earlier stopfail: nothing to stop
            change = replace(change, rate=self.rng.choice([r for r in RATES if r not in (runs.rate,
                                                                                      self.specs[change.name].rate)]))
        t0 = time.monotonic()
        pushed: dict[str, Any] | None = None

        def push() -> str | None:
            nonlocal pushed
            if change is not None:
                pushed = self.push(change)
                return str(pushed["commit"])
            return None

        faults: list[dict[str, Any]] = []
        if fault == "rest":
            faults.append(self.fault_rest(change.name if change is not None else None, then=push))
        elif fault == "stopfail":
            assert change is not None
            faults.append(self.fault_stopfail(change, then=push))
        else:
            push()
        if fault == "daemon":
            faults.append(self.fault_daemon(with_change=pushed is not None))
        elif fault in ("tm", "jm"):
            faults.append(self.fault_jvm(fault, changed=change.name if change is not None else None))
        elif fault == "git":
            faults.append(self.fault_git())
        log(f"round {index}: change {pushed}, faults {faults}")
        took = self.wait_converged(self.converge_timeout, t0)
        res = RoundResult(index, pushed, faults, took is not None, None if took is None else round(took, 2))
        if took is None:
            text = self.describe()
            log(f"round {index} did NOT converge within {self.converge_timeout:.0f} s:\n{text}")
            res.not_converged = [asdict(self.view(app)) for app in self.specs]
            res.not_converged.append({"describe": text})
        for f in faults:
            if f["kind"] == "stopfail" and "skipped" not in f and took is not None:
                self.check_failed_status(f["app"], self.failed[f["app"]][1])
        self.check_jobs_where_wanted(index)
        res.violations = self.violations[violations_before:]
        res.replays = self.replays - replays_before
        state = f"converged in {took:.1f} s" if took is not None else "NOT converged"
        log(f"round {index}: {state}" + (f", {res.replays} replay(s)" if res.replays else "")
            + (f", {len(res.violations)} violation(s)" if res.violations else ""))
        self.sleep_sampling(self.rng.uniform(2.0, 5.0))  # let checkpoints of the new jobs complete
        return res

    def run(self, *, rounds: int | None, minutes: float | None, stop_on_failure: bool = False) -> None:
        self.setup()
        end = time.monotonic() + minutes * 60 if minutes else None
        i = 0
        while (rounds is None or i < rounds) and (end is None or time.monotonic() < end):
            i += 1
            self.rounds.append(self.round(i))
            if stop_on_failure and (not self.rounds[-1].converged or self.violations):
                log("stopping at the first failed round (--stop-on-failure)")
                break
        self.final_checks()

    def final_checks(self) -> None:
        for app in self.specs:
            for slot in ("standby", "retired"):
                _, doc = self.rest_url(app, slot)
                if doc is not None and alive(int(doc["jobmanager"]["pid"]),
                                             f"-D{MARKER_PROPERTY}={doc.get('cluster_id')}"):
                    self.leftovers.append(f"{app}: a {slot} cluster still runs (JobManager pid "
                                          f"{doc['jobmanager']['pid']})")
        self.journal.refresh()
        records = self.journal.records()
        for app in self.specs:
            if records.get(app) is None:
                self.violate(f"end: {app} has no record")
        for v in self.sample():
            if v.unfinished_jobs != 1:
                self.violate(f"end: {v.app} has {v.unfinished_jobs} unfinished jobs ({v.jobs})")

    # ---- figures ------------------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        times = [r.converge_s for r in self.rounds if r.converge_s is not None]
        faults = Counter(f["kind"] for r in self.rounds for f in r.faults if "skipped" not in f)
        changes = Counter(k for r in self.rounds if r.change for k in ("rate", "parallelism", "tm_memory")
                          if k in r.change)
        return {
            "seed": self.seed, "apps": len(self.specs), "fault_kinds": list(self.fault_kinds),
            "create_s": self.create_s, "rounds": len(self.rounds),
            "converged": sum(1 for r in self.rounds if r.converged),
            "not_converged": [r.index for r in self.rounds if not r.converged],
            "changes": dict(changes), "faults": dict(faults),
            "mid_transition": sum(1 for r in self.rounds for f in r.faults
                                  if str(f.get("when", "")).startswith("after")),
            "skipped_faults": [f for r in self.rounds for f in r.faults if "skipped" in f],
            "converge_s": {"median": round(statistics.median(times), 2), "max": max(times),
                           "min": min(times)} if times else None,
            "replays": self.replays, "restored_jobs": dict(self.restores), "violations": self.violations,
            "empty_starts": self.empty_starts, "apps_without_job": self.without_job,
            "apps_without_usable_state": self.without_job_said,
            "daemon_starts": self.daemon_starts, "leftover_clusters": self.leftovers,
            "round_log": [asdict(r) for r in self.rounds],
        }


# ------------------------------------------------------------------------------------------ helpers


def count_steps_back(before: dict[str, int], now: dict[str, int], allowance: float) -> tuple[str, str]:
    """Keys whose count went back since the last sample: (within `allowance`, beyond it or vanished), as text.

    The counter job's sink is not transactional, so a job restored from a checkpoint rewrites counts up to one
    checkpoint interval (plus the restart) lower than what was already written: a replay, not a loss. More
    than that, above all a count back near zero, is state lost."""
    replayed: list[str] = []
    lost: list[str] = []
    for key, was in sorted(before.items()):
        got = now.get(key)
        if got is None:
            lost.append(f"{key} {was} -> (file gone)")
        elif got < was:
            (lost if was - got > allowance else replayed).append(f"{key} {was} -> {got}")
    return ", ".join(replayed), ", ".join(lost)


def rest_rules() -> list[Rule]:
    """Faults a healthy reconciler rides out: each one is short and retried within the step deadlines."""
    return [
        Rule("GET", r"/jobs/overview", "status", times=2, status=503),
        Rule("GET", r"/overview", "reset", times=2),
        Rule("POST", r"/jobs/[^/]+/stop", "status", times=1, status=503),
        Rule("POST", r"/jobs/[^/]+/stop", "truncate", times=1),
        Rule("GET", r"/jobs/[^/]+/savepoints/[^/]+", "reset", times=1),
        Rule("POST", r"/jars/[^/]+/run", "reset_after", times=1),
        Rule("GET", r"/jobs/[^/]+/checkpoints", "status", times=2, status=500),
        Rule("GET", r"/jobs/[^/]+/checkpoints", "stall", times=1, stall_s=11.0),
    ]


def _routine(rec: dict[str, Any]) -> bool:
    """A daemon log line that says nothing when a round is stuck: a pass started, a pass that went fine."""
    return rec.get("msg") == "sync started" or (rec.get("msg") == "sync finished" and rec.get("result") == "ok")


def alive(pid: int, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def kill_jvms_under(state_dir: Path) -> int:
    """SIGKILL every process whose command line names `state_dir` (the JVMs of its clusters). Returns how many."""
    needle = str(state_dir.resolve()).encode()
    killed = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd and b"java" in cmd.split(b"\0", 1)[0]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(d.name), signal.SIGKILL)
                killed += 1
    return killed


@contextlib.contextmanager
def app_lock(state_dir: Path, app: str, *, timeout: float) -> Iterator[bool]:
    """The local runtime's per-app lock (`LocalRuntime._lock`): yields whether it was taken in time."""
    path = state_dir / "locks" / f"{app}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        end = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    yield False
                    return
                time.sleep(0.05)
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".soak.tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    os.replace(tmp, path)


def report(fig: dict[str, Any]) -> str:
    lines = [f"chaos soak: seed {fig['seed']}, {fig['apps']} apps, faults {','.join(fig['fault_kinds']) or '-'}"
             + (" (INTERRUPTED)" if fig.get("interrupted") else ""),
             f"  create: {fig['create_s']} s"]
    for r in fig["round_log"]:
        change = r["change"] or {}
        what = ", ".join(f"{k} {v}" for k, v in change.items() if k not in ("sha", "commit")) or "no change"
        faults = "; ".join(
            f["kind"] + ("" if "skipped" not in f else f" (skipped: {f['skipped']})")
            + (f" {f['signal']}" if "signal" in f else "") + (f" {f['app']}/{f['process']}" if "process" in f else "")
            + (" after the stop" if str(f.get("when", "")).startswith("after") else "")
            + (f" {f['app']}: {len(f['injected'])} fault(s) hit" if "injected" in f else "")
            + (f" {f['unreachable_s']} s" if "unreachable_s" in f else "")
            + (f" {f['app']}: stop failed, JobManager killed" if f["kind"] == "stopfail" and "skipped" not in f
               else "")
            for f in r["faults"]) or "no fault"
        state = f"converged in {r['converge_s']} s" if r["converged"] else "NOT CONVERGED"
        lines.append(f"  round {r['index']:>3}: {what:<44} | {faults:<40} | {state}"
                     + (f", {r['replays']} replay(s)" if r["replays"] else "")
                     + (f", {len(r['violations'])} violation(s)" if r["violations"] else ""))
    cs = fig["converge_s"]
    lines += [
        f"rounds: {fig['rounds']} ({fig['converged']} converged"
        + (f"; not converged: {fig['not_converged']}" if fig["not_converged"] else "") + ")",
        f"changes: {fig['changes'] or '-'}",
        f"faults: {fig['faults'] or '-'}"
        + (f" (+{len(fig['skipped_faults'])} skipped)" if fig["skipped_faults"] else "")
        + (f"; {fig['mid_transition']} JVM kill(s) after an upgrade's stop" if fig.get("mid_transition") else ""),
        "converge time: " + (f"median {cs['median']} s, max {cs['max']} s, min {cs['min']} s" if cs else "-"),
        f"new jobs restored from: {fig['restored_jobs'] or '-'}; started from empty state: {fig['empty_starts']}",
        f"apps left without a job where Git wants one: {len(fig['apps_without_job'])}"
        + (f" (and {len(fig['apps_without_usable_state'])} whose every state is unusable, said in their status)"
           if fig["apps_without_usable_state"] else ""),
        f"count replays (restores from a checkpoint): {fig['replays']}",
        f"daemon starts: {fig['daemon_starts']}",
        f"clusters left beside the live ones: {fig['leftover_clusters'] or 'none'}",
        f"invariant violations: {len(fig['violations'])}",
        *[f"  - {v}" for v in fig["violations"]],
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, *, jar: Path | None = None,
         on_figures: Callable[[dict[str, Any]], None] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=None, help="stop after this many rounds")
    ap.add_argument("--minutes", type=float, default=None, help="start no round after this many minutes")
    ap.add_argument("--apps", type=int, default=3)
    ap.add_argument("--faults", default=",".join(FAULT_KINDS), help=f"comma-separated from {','.join(FAULT_KINDS)}")
    ap.add_argument("--converge-timeout", type=float, default=240.0, help="seconds a round may take to converge")
    ap.add_argument("--poll-interval", type=float, default=1.0)
    ap.add_argument("--drift-interval", type=float, default=3.0)
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="where the repo, the daemon's state and the logs go (default: a new temp dir, kept)")
    ap.add_argument("--jar", type=Path, default=jar, help="a built counter job jar (default: build it)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    ap.add_argument("--stop-on-failure", action="store_true",
                    help="no further round after one that did not converge or broke an invariant")
    args = ap.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    if bad := [f for f in faults if f not in FAULT_KINDS]:
        ap.error(f"unknown fault kind(s) {bad}; choose from {','.join(FAULT_KINDS)}")
    if args.rounds is None and args.minutes is None:
        args.rounds = 3
    root = args.state_dir or Path(tempfile.mkdtemp(prefix="chaos-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    log(f"working in {root}")
    soak = Soak(root.resolve(), seed=args.seed, apps=args.apps, faults=faults, jar=args.jar,
                converge_timeout=args.converge_timeout, poll_interval=args.poll_interval,
                drift_interval=args.drift_interval)
    interrupted = False

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # a CI timeout or `kill`: stop everything like a Ctrl-C

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        soak.run(rounds=args.rounds, minutes=args.minutes, stop_on_failure=args.stop_on_failure)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: stopping everything")
    finally:
        try:
            soak.teardown()
        finally:
            signal.signal(signal.SIGTERM, previous)
    fig = soak.figures() | {"interrupted": interrupted}
    print(report(fig))
    if args.out is not None:
        args.out.write_text(json.dumps(fig, indent=2, default=str))
    if on_figures is not None:
        on_figures(fig)
    return 1 if (fig["violations"] or fig["not_converged"] or interrupted) else 0


if __name__ == "__main__":
    sys.exit(main())
