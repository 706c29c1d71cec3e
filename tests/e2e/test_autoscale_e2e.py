"""Issue 25 on real Flink: the daemon in `autoscale.mode: commit` scales an app up and back down through Git,
and in `mode: recommend` only says what it would do.

One local cluster and one `flink-reconciler run` process for the module (windows shortened to seconds); the
tests run in order on it. The counter job costs 10 ms per record in its counting operator (`--work-mode
sleep`: as busy to Flink's metrics, without taking a core from the CI machine), so one subtask counts at most
100 records/s; it is fed 120/s, from its `--rate` or, once the test writes one, from its rate file (the input
rate drops without any change in Git). What a user would see, from the outside only:

1. the daemon pushes a commit `autoscale(auto): parallelism 1 -> 2` onto main with the evidence in its message;
   `plan` of that commit (offline, against its parent) is an in-place rescale; the same job then runs at
   parallelism 2, the counting vertex is no longer saturated and the source is not backpressured, and no count
   ever went back (state carried);
2. the input rate drops to 40/s: after `scaleDownDelay` the daemon commits `parallelism 2 -> 1` and the same
   job runs at parallelism 1, counts continuing;
3. a human commits `parallelism: 2` with `autoscale.mode: recommend`: the human's parallelism runs; the
   recommendation (scale down 2 -> 1) shows on the commit's notes, in `status`, `scale-advice` (table and JSON)
   and /metrics, and nothing is committed.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.cli import main
from reconciler.clock import SystemClock
from reconciler.live.local.runtime import LocalRuntime
from tests.e2e.test_daemon_e2e import DaemonProc, metric, poll
from tests.fixtures.flink import COUNTER_MAIN, read_counts, teardown_runtime
from tests.gitutil import Repo, git

pytestmark = [pytest.mark.flink, pytest.mark.slow]

APP = "auto"
KEYS = 64  # many keys: two subtasks get about the same share


def app_yaml(parallelism: int, mode: str = "commit") -> str:
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
    jobmanager.scheduler: adaptive
    jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling: 1 s
    taskmanager.network.memory.buffer-debloat.enabled: "true"
    metrics.fetcher.update-interval: 1 s
  upgrade:
    inPlaceRescale: true
  autoscale:
    mode: {mode}
    targetUtilisation: 0.8
    max: 2
    stabilisation: 3s
    window: 8s
    scaleDownDelay: 5s
  job:
    jarURI: jobs/counter/counter.jar
    entryClass: {COUNTER_MAIN}
    args: ["--output-dir", "out", "--keys", "{KEYS}", "--rate", "120", "--work-us", "10000", "--work-mode", "sleep",
           "--rate-scope", "taskmanager", "--rate-file", "rate"]
    parallelism: {parallelism}
  deadlines:
    start: 90s
    healthy: 30s
    rescale: 60s
"""


@dataclass
class Env:
    repo: Repo
    state: Path
    rt: LocalRuntime
    daemon: DaemonProc

    def cli(self, *args: str) -> tuple[int, str]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = main(list(args))
        return code, buf.getvalue()

    def rest(self, path: str) -> Any:
        info = self.rt.observe(APP)
        assert info.rest_url
        return httpx.get(info.rest_url + path, timeout=10).json()

    def origin_log(self) -> list[tuple[str, str]]:
        out = git(self.repo.origin, "log", "--format=%H %s", "main")
        return [(line[:40], line[41:]) for line in out.splitlines()]

    def counts(self) -> dict[str, int]:
        return read_counts(self.rt.paths(APP).work / "out")

    def set_rate(self, rate: float) -> None:
        """The job's input rate from now on (its rate file, read by its sources every half second)."""
        target = self.rt.paths(APP).work / "rate"
        tmp = target.with_name(".rate.tmp")
        tmp.write_text(f"{rate:g}\n")
        tmp.replace(target)

    def dead(self) -> str | None:
        return self.daemon.died()

    def autoscale_commits(self) -> list[tuple[str, str]]:
        return [(sha, s) for sha, s in self.origin_log() if s.startswith(f"autoscale({APP})")]

    def runs_at(self, job: str, parallelism: int) -> bool:
        vs = self.rest(f"/jobs/{job}")["vertices"]
        # a source subtask without a split of the generator finishes: that is all of it running
        return all(v["parallelism"] == parallelism and v["tasks"].get("RUNNING", 0) >= 1
                   and v["tasks"].get("RUNNING", 0) + v["tasks"].get("FINISHED", 0) == parallelism for v in vs)

    def running_job(self) -> str:
        return poll(lambda: next((j.job_id for j in self.rt.flink(APP).jobs() if j.state == "RUNNING"), None),
                    timeout=10, what="the running job")

    def vertex_load(self, job: str, seconds: float = 4.0) -> dict[str, tuple[int, float, float]]:
        """vertex name -> (parallelism, busy %, backpressured %) measured from Flink's counters over `seconds`."""
        names = "accumulateBusyTimeMs,accumulateBackPressuredTimeMs"

        def take_once() -> dict[str, tuple[int, float, float]] | None:
            out = {}
            for v in self.rest(f"/jobs/{job}")["vertices"]:
                got = {m["id"]: m["sum"] for m in self.rest(
                    f"/jobs/{job}/vertices/{v['id']}/subtasks/metrics?get={names}&agg=sum")}
                if len(got) < 2:
                    return None  # new tasks (after a rescale) report their metrics a moment later
                out[v["name"]] = (v["parallelism"], got["accumulateBusyTimeMs"], got["accumulateBackPressuredTimeMs"])
            return out

        def take() -> dict[str, tuple[int, float, float]]:
            return poll(take_once, timeout=20, what="the job's vertex metrics")

        a = take()
        time.sleep(seconds)
        b = take()
        return {n: (p, (b[n][1] - a[n][1]) / seconds / 10 / p, (b[n][2] - a[n][2]) / seconds / 10 / p)
                for n, (p, _, _) in b.items()}


@pytest.fixture(scope="module")
def env(counter_jar: Path, flink_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    repo = Repo(tmp_path_factory.mktemp("autoscale"))
    state = repo.origin.parent / "state"
    repo.write("jobs/counter/counter.jar", counter_jar.read_bytes())
    repo.write(f"apps/{APP}.yaml", app_yaml(1))
    repo.commit("counter app, overloaded at parallelism 1, autoscale: commit")
    rt = LocalRuntime(state, clock=SystemClock(), flink_home=flink_home)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLINK_HOME", str(flink_home))
        daemon = DaemonProc.start(repo.origin.parent / "daemon.log", repo_url=str(repo.origin), state_dir=str(state),
                                  poll_interval=1, drift_interval=30)
    e = Env(repo, state, rt, daemon)
    try:
        yield e
    finally:
        daemon.proc.terminate()
        try:
            daemon.proc.wait(timeout=30)
        except Exception:
            daemon.proc.kill()
        teardown_runtime(rt)


def test_the_daemon_commits_a_scale_up_and_rescales_in_place(env: Env) -> None:
    alive = env.daemon.proc

    def dead() -> str | None:
        return f"the daemon exited ({alive.returncode}):\n{env.daemon.log_tail()}" if alive.poll() is not None else None

    poll(lambda: len(env.counts()) == KEYS, timeout=90, what="the counter job to run", alive=dead)
    job = poll(lambda: next((j.job_id for j in env.rt.flink(APP).jobs() if j.state == "RUNNING"), None),
               timeout=10, what="the running job")
    before = env.vertex_load(job)
    count_vertex = next(n for n in before if n.startswith("count-per-key"))
    assert before[count_vertex][1] > 90, f"the job is not overloaded at parallelism 1: {before}"
    t0 = time.monotonic()
    commit = poll(lambda: next(((sha, s) for sha, s in env.origin_log() if s.startswith(f"autoscale({APP})")), None),
                  timeout=60, what="an autoscale commit on main", alive=dead)
    detected = time.monotonic() - t0
    assert commit[1] == f"autoscale({APP}): parallelism 1 -> 2"
    message = git(env.repo.origin, "log", "-1", "--format=%B", commit[0])
    assert "count-per-key" in message and "BUSY" in message and "Autoscaled-by: flink-reconciler" in message
    counts = env.counts()

    # plan of the autoscale commit against its parent: an in-place rescale
    code, out = env.cli("plan", "--repo", str(env.repo.origin), "--head", commit[0], "--format", "json")
    assert code == 0, out
    (app,) = json.loads(out)["apps"]
    assert app["action"] == "scale" and app["steps"][0]["type"] == "RescaleInPlace", app

    poll(lambda: env.runs_at(job, 2), timeout=60, what="the same job to run at parallelism 2", alive=dead)
    assert [j.job_id for j in env.rt.flink(APP).jobs() if j.state == "RUNNING"] == [job]
    source = next(n for n in before if n.startswith("Source"))
    # the rescaled tasks start from the job's checkpoint and work off what queued up meanwhile, then settle
    after = poll(lambda: m if (m := env.vertex_load(job))[count_vertex][1] < 90 and m[source][2] < 10 else None,
                 timeout=45, interval=0, what="the counting vertex below 90 % busy and the source not backpressured")
    assert after[count_vertex][0] == 2
    now = env.counts()
    went_back = {k: (counts[k], now.get(k)) for k in counts if now.get(k, 0) < counts[k]}
    assert not went_back, f"counts reset: {went_back}"
    print(f"\nautoscale: commit {detected:.1f}s after the overload was measured; busy {before[count_vertex][1]:.0f}% "
          f"-> {after[count_vertex][1]:.0f}%, source backpressured {before[source][2]:.0f}% -> {after[source][2]:.0f}%")


def test_when_the_input_rate_drops_it_scales_back_down_after_the_delay(env: Env) -> None:
    """No Git change lowers the rate: the job reads it from a file. At parallelism 2 and 40 records/s the counting
    vertex is busy about 20 %: one subtask is enough (40 / (100 x 0.8)), called for continuously for the 5 s
    scaleDownDelay before the commit."""
    job = env.running_job()
    assert env.runs_at(job, 2), "the scale-up test did not leave the job at parallelism 2"
    ups = env.autoscale_commits()
    env.set_rate(40)
    dropped = time.monotonic()

    def new_commit() -> tuple[str, str] | None:
        c = env.autoscale_commits()
        return c[0] if len(c) > len(ups) else None
    commit = poll(new_commit, timeout=60, what="an autoscale commit scaling down", alive=env.dead)
    decided = time.monotonic() - dropped
    assert commit[1] == f"autoscale({APP}): parallelism 2 -> 1"
    message = git(env.repo.origin, "log", "-1", "--format=%B", commit[0])
    assert "scale down 2 -> 1 (called for since" in message, message
    assert decided >= 5, f"scaled down {decided:.1f}s after the rate dropped: before its 5 s scaleDownDelay"
    counts = env.counts()
    poll(lambda: env.runs_at(job, 1), timeout=60, what="the same job to run at parallelism 1", alive=env.dead)
    assert [j.job_id for j in env.rt.flink(APP).jobs() if j.state == "RUNNING"] == [job]

    def moved_on() -> dict[str, int] | None:
        now = env.counts()
        return now if sum(now.values()) > sum(counts.values()) + 40 else None
    grown = poll(moved_on, timeout=30, what="the counts to move on at parallelism 1")
    went_back = {k: (counts[k], grown.get(k)) for k in counts if grown.get(k, 0) < counts[k]}
    assert not went_back, f"counts reset: {went_back}"
    print(f"\nautoscale: scale-down committed {decided:.1f}s after the input rate dropped")


def test_recommend_mode_says_what_it_would_do_and_a_humans_parallelism_runs(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A human sets parallelism 2 by hand and switches the autoscaler to recommend. The human's parallelism runs;
    the advice (at 40 records/s: scale down to 1) is shown everywhere a user looks, and never committed."""
    job = env.running_job()
    git(env.repo.work, "pull", "-q", "--rebase", "origin", "main")
    env.repo.write(f"apps/{APP}.yaml", app_yaml(2, mode="recommend"))
    human = env.repo.commit("parallelism 2 by hand; the autoscaler only recommends")
    poll(lambda: env.runs_at(job, 2), timeout=60, what="the human's parallelism 2 to run", alive=env.dead)

    prefix = f"flink-reconciler/{APP}/autoscale: success - autoscale: "

    def advice_note() -> str | None:
        try:
            notes = git(env.repo.origin, "notes", "--ref", "flink-reconciler", "show", human)
        except Exception:
            return None
        line = next((x for x in notes.splitlines() if x.startswith(prefix)), "")
        return line if line.startswith(prefix + "scale down 2 -> 1 (called for since") else None

    note = poll(advice_note, timeout=60, what="the scale-down advice on the human's commit", alive=env.dead)
    assert " needs 1: target " in note and "rec/s per subtask" in note, note
    metrics = env.daemon.metrics()
    assert metric(metrics, "flink_reconciler_autoscale_parallelism", app=APP, kind="current") == 2
    assert metric(metrics, "flink_reconciler_autoscale_parallelism", app=APP, kind="wanted") == 1
    assert metric(metrics, "flink_reconciler_autoscale_verdict", app=APP, verdict="scale-down") == 1
    assert metric(metrics, "flink_reconciler_autoscale_rest_requests_total", app=APP) > 0

    monkeypatch.setenv("FLINK_RECONCILER_REPO_URL", str(env.repo.origin))
    code, out = env.cli("status", "--state-dir", str(env.state))
    assert code == 0, out
    assert f"{APP}: autoscale: scale down 2 -> 1 (called for since" in out, out
    code, out = env.cli("scale-advice", APP, "--state-dir", str(env.state), "--seconds", "4")
    assert code == 0, out
    head, reason = out.splitlines()[:2]
    # a one-off look cannot know since when a scale-down is called for: it shows it waiting its delay
    assert head == f"{APP}: wait: parallelism 2 -> 2" and reason.startswith("scale down 2 -> 1 called for since"), out
    assert "VERTEX" in out and "count-per-key" in out
    code, out = env.cli("scale-advice", APP, "--state-dir", str(env.state), "--seconds", "4", "--output", "json")
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["verdict"], doc["current"], doc["wanted"]) == ("wait", 2, 1), doc
    count = next(v for v in doc["vertices"] if v["name"].startswith("count-per-key"))
    assert count["current"] == 2 and count["proposed"] == 1 and 0 < count["busyPct"] < 50, count

    # recommend: nothing was committed, and the human's parallelism still runs
    assert env.origin_log()[0][0] == human
    assert env.runs_at(job, 2)
