"""Issue 24, end to end on real Flink (local runtime): two apps' jobs on one FlinkSessionCluster.

One Git repository, one state directory and one session cluster (1 JobManager, 1 TaskManager with 2 slots) for
the module; the counter job runs as two apps, `alpha` and `beta`, each writing its own counts. Tests run in
order and build on each other:

1. both apps start on the one cluster (one JobManager, both jobs there, each job id tagged with its app);
2. a job change of alpha is alpha's own job-only upgrade: alpha restarts from its savepoint, every count goes on,
   and beta's job is never touched (same job id, its checkpoints and counts go on);
3. kill -9 of `apply` (a process) in the middle of alpha's next upgrade, right after its stop-with-savepoint: the
   next `apply` resumes from the journal, alpha runs from that savepoint, beta's job and counts go on untouched;
4. a TaskManager memory change of the cluster moves both jobs to a new cluster (warm standby), each from its own
   savepoint with every count continuous, and the old cluster is gone;
5. a second cluster change in a commit that also breaks alpha's entry class: the plan says up front that a job
   failing on the new cluster goes back to the old one, which is kept; beta moves, alpha is rolled back onto the
   old cluster from its savepoint; the next commit (entry class fixed) moves alpha and the old cluster goes;
6. removing alpha (with --prune) takes its final savepoint and leaves the cluster and beta untouched;
7. removing beta and the cluster: beta's final savepoint, then the cluster goes.

Nothing sleeps to assert: every wait polls with a deadline.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main
from reconciler.clock import SystemClock
from reconciler.core.plan import is_job_of
from reconciler.live.local.runtime import LocalRuntime
from reconciler.live.ports import JobSummary
from tests.fixtures.flink import COUNTER_MAIN, REPO_ROOT, read_counts, teardown_runtime, wait_until
from tests.gitutil import Repo

pytestmark = [pytest.mark.flink, pytest.mark.slow]

CLUSTER = "shared"
APPS = ("alpha", "beta")
KEYS = 2
JAR_PATH = "jobs/counter/counter.jar"
TERMINAL = ("FINISHED", "CANCELED", "FAILED")


def cluster_yaml(memory: str) -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkSessionCluster
metadata:
  name: {CLUSTER}
spec:
  taskManager:
    replicas: 1
    slots: 2
    resources:
      memory: {memory}
  flinkConfiguration:
    execution.checkpointing.interval: 1 s
"""


def app_yaml(name: str, rate: int, entry_class: str = COUNTER_MAIN, jar: str = JAR_PATH) -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
spec:
  sessionCluster: {CLUSTER}
  job:
    jarURI: {jar}
    entryClass: {entry_class}
    args: ["--output-dir", "out-{name}", "--keys", "{KEYS}", "--rate", "{rate}"]
"""


@dataclass
class Env:
    repo: Repo
    state: Path
    rt: LocalRuntime  # to observe only; the CLI runs its own runtime
    rates: dict[str, int] = field(default_factory=lambda: dict.fromkeys(APPS, 20))
    memory: str = "1280m"
    entry_classes: dict[str, str] = field(default_factory=lambda: dict.fromkeys(APPS, COUNTER_MAIN))
    jars: dict[str, str] = field(default_factory=lambda: dict.fromkeys(APPS, JAR_PATH))

    def new_jar(self, app: str, tag: str) -> None:
        """Give `app` a jar of its own with other bytes (the same classes, a zip comment): a new jar digest."""
        path = f"jobs/counter/counter-{tag}.jar"
        data = (self.repo.work / JAR_PATH).read_bytes()
        self.repo.write(path, data)
        with zipfile.ZipFile(self.repo.work / path, "a") as z:
            z.comment = tag.encode()
        self.jars[app] = path

    def uploaded(self) -> list[str]:
        """The file names of the jars on the live cluster (Flink's GET /jars), without the fetched jar's digest
        prefix."""
        live = next(g for g in self.rt.session_generations(CLUSTER) if g.slot == "cluster")
        return sorted(re.sub(r"^[0-9a-f]{16}-", "", n) for n in live.client.jars().values())

    def commit(self, message: str, *, apps: tuple[str, ...] = APPS, cluster: bool = True) -> str:
        for name in APPS:
            path = f"apps/{name}.yaml"
            if name in apps:
                self.repo.write(path, app_yaml(name, self.rates[name], self.entry_classes[name], self.jars[name]))
            elif (self.repo.work / path).exists():
                self.repo.remove(path)
        if cluster:
            self.repo.write("apps/shared.yaml", cluster_yaml(self.memory))
        elif (self.repo.work / "apps/shared.yaml").exists():
            self.repo.remove("apps/shared.yaml")
        return self.repo.commit(message)

    def cli(self, *args: str) -> tuple[int, str]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = main(list(args))
        return code, buf.getvalue()

    def apply(self, *extra: str) -> str:
        code, out = self.cli("apply", "--repo", str(self.repo.work), "--state-dir", str(self.state), *extra)
        assert code == 0, out
        return out

    def apply_process(self) -> subprocess.Popen[str]:
        """`flink-reconciler apply` as a real process, to be killed."""
        cmd = [sys.executable, "-m", "reconciler.cli", "apply", "--repo", str(self.repo.work),
               "--state-dir", str(self.state)]
        return subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)

    def inflight(self, app: str) -> dict[str, Any] | None:
        """The app's in-flight row as another process reads it (records are written by rename: never torn)."""
        try:
            doc: dict[str, Any] = json.loads((self.state / "records" / f"{app}.json").read_text())
        except FileNotFoundError:
            return None
        row: dict[str, Any] | None = doc.get("inflight")
        return row

    def record(self, app: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.state / "records" / f"{app}.json").read_text())
        row: dict[str, Any] = doc["record"]
        return row

    def plan(self, *extra: str) -> dict[str, Any]:
        code, out = self.cli("plan", "--repo", str(self.repo.work), "--live", "--state-dir", str(self.state),
                             "--format", "json", *extra)
        assert code in (0, 2), out
        doc: dict[str, Any] = json.loads(out)
        return doc

    def jobs(self) -> list[tuple[str, JobSummary]]:
        """(slot, job) of every job on every cluster of the session cluster."""
        return [(g.slot, j) for g in self.rt.session_generations(CLUSTER) for j in g.client.jobs()]

    def job_of(self, app: str) -> str:
        """The one live job of `app`, once all its tasks run."""
        def probe() -> str | None:
            live = [j for _, j in self.jobs() if is_job_of(j.job_id, app) and j.state not in TERMINAL]
            if len(live) == 1 and live[0].state == "RUNNING" and live[0].tasks_running == live[0].tasks_total:
                return live[0].job_id
            return None
        return wait_until(probe, timeout=60, interval=0.2, what=f"exactly one running job of {app}")

    def out(self, app: str) -> Path:
        return self.rt.paths(CLUSTER).work / f"out-{app}"

    def counts(self, app: str) -> dict[str, int]:
        return read_counts(self.out(app))

    def counting(self, app: str, minimum: int = 1) -> dict[str, int]:
        def probe() -> dict[str, int] | None:
            c = self.counts(app)
            return c if len(c) == KEYS and min(c.values()) >= minimum else None
        return wait_until(probe, timeout=60, interval=0.2, what=f"{app} counting past {minimum}")

    def continues(self, app: str, before: dict[str, int], timeout: float = 30) -> dict[str, int]:
        """Every count of `app` moves past where it was at this call, never below `before` (a reset writes 1)."""
        start = self.counts(app)
        end = time.monotonic() + timeout
        while True:
            now = self.counts(app)
            low = {k: v for k, v in now.items() if v < before.get(k, 0)}
            assert not low, f"{app}: counts went below their values before ({before}): {now}"
            if len(now) == KEYS and all(now[k] > start.get(k, -1) for k in now):
                return now
            assert time.monotonic() < end, f"{app}: counts did not move within {timeout}s: {start} -> {now}"
            time.sleep(0.1)

    def restored(self, app: str, job_id: str) -> tuple[str | None, bool | None]:
        client = next(g.client for g in self.rt.session_generations(CLUSTER)
                      if any(j.job_id == job_id for j in g.client.jobs()))
        stats = client.checkpoints(job_id)
        return stats.restored_path, stats.restored_is_savepoint

    def completed_checkpoints(self, job_id: str) -> int:
        client = next(g.client for g in self.rt.session_generations(CLUSTER)
                      if any(j.job_id == job_id for j in g.client.jobs()))
        return client.checkpoints(job_id).completed_count


@pytest.fixture(scope="module")
def env(counter_jar: Path, flink_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    repo = Repo(tmp_path_factory.mktemp("session"))
    repo.write(JAR_PATH, counter_jar.read_bytes())
    state = repo.origin.parent / "state"
    rt = LocalRuntime(state, clock=SystemClock(), flink_home=flink_home)
    e = Env(repo=repo, state=state, rt=rt)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLINK_HOME", str(flink_home))
        try:
            yield e
        finally:
            teardown_runtime(rt)


def test_both_apps_start_on_one_session_cluster(env: Env) -> None:
    env.commit("a session cluster and two apps on it")
    plan = env.plan()
    assert {a["app"]: a["action"] for a in plan["apps"]} == {"alpha": "create", "beta": "create"}
    assert [(c["cluster"], c["action"]) for c in plan["clusters"]] == [(CLUSTER, "create")]
    env.apply()
    assert list(env.rt.cluster_records(CLUSTER)) == ["cluster"]  # one cluster: one JobManager, one TaskManager
    assert not (env.state / "clusters" / "alpha").exists() and not (env.state / "clusters" / "beta").exists()
    for app in APPS:
        env.job_of(app)
        env.counting(app)
    code, out = env.cli("status", "--state-dir", str(env.state))
    assert code == 0 and "session cluster shared: ready; jobs: alpha RUNNING, beta RUNNING" in out, out


def test_a_job_change_upgrades_that_app_alone(env: Env) -> None:
    alpha_before, beta_job = env.job_of("alpha"), env.job_of("beta")
    beta_checkpoints = env.completed_checkpoints(beta_job)
    before = {app: env.counting(app, 2) for app in APPS}
    env.rates["alpha"] += 1
    env.new_jar("alpha", "v2")
    env.commit("alpha: a new rate and a new jar")
    plan = env.plan()
    alpha = next(a for a in plan["apps"] if a["app"] == "alpha")
    beta = next(a for a in plan["apps"] if a["app"] == "beta")
    assert alpha["action"] == "upgrade" and alpha["cluster_strategy"] == "job-only", alpha
    assert beta["action"] == "no-op" and not beta["steps"]
    env.apply()
    alpha_now = env.job_of("alpha")
    assert alpha_now != alpha_before
    path, is_savepoint = env.restored("alpha", alpha_now)
    assert is_savepoint and path and "/savepoints/alpha/" in path  # the app's own savepoint directory
    env.continues("alpha", before["alpha"])
    # beta: the same job all along, still checkpointing, its counts going on
    assert env.job_of("beta") == beta_job
    env.continues("beta", before["beta"])
    wait_until(lambda: env.completed_checkpoints(beta_job) > beta_checkpoints, timeout=20,
               what="beta checkpointing on")
    assert list(env.rt.cluster_records(CLUSTER)) == ["cluster"]
    assert env.uploaded() == ["counter-v2.jar", "counter.jar"]  # alpha's old jar is beta's: kept


def test_kill_9_of_apply_mid_upgrade_resumes_from_the_journal(env: Env) -> None:
    alpha_before, beta_job = env.job_of("alpha"), env.job_of("beta")
    beta_checkpoints = env.completed_checkpoints(beta_job)
    before = {app: env.counting(app, 2) for app in APPS}
    env.rates["alpha"] += 1
    env.new_jar("alpha", "v3")
    env.commit("alpha: a new rate and jar (its apply is killed mid-upgrade)")
    proc = env.apply_process()
    try:
        def stopped() -> dict[str, Any] | None:
            row = env.inflight("alpha")
            if row is not None and row.get("captured_path"):
                return row
            assert proc.poll() is None, f"apply ended (exit {proc.returncode}) before alpha's stop was journaled"
            return None
        wait_until(stopped, timeout=60, interval=0.003, what="alpha's stop-with-savepoint in its journal")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    row = env.inflight("alpha")
    assert row is not None and row["stage"] == "forward", row  # killed mid-upgrade: still in flight
    taken = row["captured_path"]
    assert "/savepoints/alpha/" in taken
    assert {j.job_id: j.state for _, j in env.jobs()}[alpha_before] == "FINISHED"  # stopped with its savepoint
    out = env.apply()  # resumes alpha's upgrade from the journal first
    assert "alpha: upgrade -> success" in out, out
    assert env.inflight("alpha") is None
    alpha_now = env.job_of("alpha")
    assert alpha_now != alpha_before
    path, is_savepoint = env.restored("alpha", alpha_now)
    assert is_savepoint and path and Path(taken.removeprefix("file:")).name in path, (path, taken)
    live_alpha = [j for _, j in env.jobs() if is_job_of(j.job_id, "alpha") and j.state not in TERMINAL]
    assert [j.job_id for j in live_alpha] == [alpha_now]  # exactly one job of alpha, never two
    env.continues("alpha", before["alpha"])
    assert env.job_of("beta") == beta_job  # beta untouched all along
    env.continues("beta", before["beta"])
    wait_until(lambda: env.completed_checkpoints(beta_job) > beta_checkpoints, timeout=20,
               what="beta checkpointing on")
    assert env.uploaded() == ["counter-v3.jar", "counter.jar"]  # v2, which no job runs from any more, is deleted


def test_a_cluster_change_moves_both_jobs_with_their_counts(env: Env) -> None:
    old = env.rt.cluster_records(CLUSTER)["cluster"]
    jobs = {app: env.job_of(app) for app in APPS}
    before = {app: env.counting(app, 2) for app in APPS}
    env.memory = "1344m"
    env.commit("shared: TaskManager memory")
    plan = env.plan()
    for a in plan["apps"]:
        assert a["action"] == "upgrade" and a["cluster_strategy"] == "warm-standby", a
    (cluster,) = plan["clusters"]
    assert cluster["action"] == "upgrade" and cluster["apps"] == list(APPS)
    env.apply()
    recs = env.rt.cluster_records(CLUSTER)
    assert list(recs) == ["cluster"] and recs["cluster"].cluster_id != old.cluster_id  # the old one is gone
    for app in APPS:
        job = env.job_of(app)
        assert job != jobs[app]
        assert env.restored(app, job)[1] is True
        env.continues(app, before[app])
    conf = (env.rt.paths(CLUSTER, recs["cluster"].generation).conf / "config.yaml").read_text()
    assert "1344m" in conf


def test_a_job_that_cannot_start_on_the_new_cluster_goes_back_to_the_old_one(env: Env) -> None:
    old = env.rt.cluster_records(CLUSTER)["cluster"]
    jobs = {app: env.job_of(app) for app in APPS}
    before = {app: env.counting(app, 2) for app in APPS}
    env.memory = "1408m"
    env.entry_classes["alpha"] = COUNTER_MAIN + "Missing"
    env.commit("shared: TaskManager memory again; alpha: an entry class its jar does not have")
    plan = env.plan()
    (cluster,) = plan["clusters"]
    assert cluster["action"] == "upgrade", cluster
    assert ("A job that fails on the new cluster is rolled back onto the old cluster, which is then kept while the "
            "others go on; the old cluster is deleted once no job runs on it") in cluster["reason"]
    alpha = next(a for a in plan["apps"] if a["app"] == "alpha")
    assert alpha["cluster_strategy"] == "warm-standby"
    assert [s["type"] for s in alpha["rollback"]] == ["DiscardStandby", "EnsureCluster", "StartJob", "AwaitRunning"]
    code, out = env.cli("apply", "--repo", str(env.repo.work), "--state-dir", str(env.state))
    assert code == 1, out
    assert "alpha: upgrade -> failure" in out and "beta: upgrade -> success" in out, out
    recs = env.rt.cluster_records(CLUSTER)
    assert set(recs) == {"cluster", "retired"}, recs  # the old cluster is kept, for alpha
    assert recs["retired"].cluster_id == old.cluster_id
    new = recs["cluster"].cluster_id
    alpha_back, beta_moved = env.job_of("alpha"), env.job_of("beta")
    where = {j.job_id: slot for slot, j in env.jobs() if j.state not in TERMINAL}
    assert where[alpha_back] == "retired" and where[beta_moved] == "cluster", where
    assert alpha_back != jobs["alpha"] and beta_moved != jobs["beta"]
    for app, job in (("alpha", alpha_back), ("beta", beta_moved)):
        path, is_savepoint = env.restored(app, job)
        assert is_savepoint and path and f"/savepoints/{app}/" in path, (app, path)
        env.continues(app, before[app])
    assert env.record("alpha")["last_outcome"] == "failure"
    code, out = env.cli("status", "--state-dir", str(env.state))
    assert "session cluster shared: ready" in out and "2 clusters" in out, out
    # the fix: alpha moves to the new cluster, and the old one goes with its last job
    before = {app: env.counting(app, 2) for app in APPS}
    env.entry_classes["alpha"] = COUNTER_MAIN
    env.commit("alpha: its entry class fixed")
    plan = env.plan()
    actions = {a["app"]: (a["action"], a.get("cluster_strategy")) for a in plan["apps"]}
    assert actions == {"alpha": ("upgrade", "warm-standby"), "beta": ("no-op", None)}, actions
    env.apply()
    recs = env.rt.cluster_records(CLUSTER)
    assert list(recs) == ["cluster"] and recs["cluster"].cluster_id == new
    assert env.job_of("beta") == beta_moved
    alpha_now = env.job_of("alpha")
    assert env.restored("alpha", alpha_now)[1] is True
    for app in APPS:
        env.continues(app, before[app])


def test_removing_an_app_takes_its_final_savepoint_and_leaves_the_cluster(env: Env) -> None:
    alpha, beta = env.job_of("alpha"), env.job_of("beta")
    cluster = env.rt.cluster_records(CLUSTER)["cluster"].cluster_id
    before = env.counting("beta", 2)
    env.commit("alpha is gone", apps=("beta",))
    plan = env.plan("--prune")
    gone = next(a for a in plan["apps"] if a["app"] == "alpha")
    assert gone["action"] == "delete" and [s["type"] for s in gone["steps"]] == ["StopWithSavepoint", "DeleteCluster"]
    assert gone["steps"][1]["session_cluster"] == CLUSTER
    assert env.uploaded() == ["counter-v3.jar", "counter.jar"]
    env.apply("--prune")
    assert env.uploaded() == ["counter.jar"]  # alpha's jar went with alpha; beta's stays
    states = {j.job_id: j.state for _, j in env.jobs()}
    assert states[alpha] == "FINISHED"  # stopped with its final savepoint
    finals = sorted((env.state / "savepoints" / "alpha").glob("savepoint-*/_metadata"))
    assert finals, "no final savepoint of alpha in its savepoint directory"
    assert env.job_of("beta") == beta and env.rt.cluster_records(CLUSTER)["cluster"].cluster_id == cluster
    env.continues("beta", before)


def test_removing_the_last_app_and_the_cluster_deletes_the_cluster_after_the_job(env: Env) -> None:
    env.commit("everything is gone", apps=(), cluster=False)
    plan = env.plan("--prune", "--allow-mass-delete")
    assert [(c["cluster"], c["action"]) for c in plan["clusters"]] == [(CLUSTER, "delete")], plan["clusters"]
    env.apply("--prune", "--allow-mass-delete")
    assert env.rt.cluster_records(CLUSTER) == {}
    assert sorted((env.state / "savepoints" / "beta").glob("savepoint-*/_metadata"))
