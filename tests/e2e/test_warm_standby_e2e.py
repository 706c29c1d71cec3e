"""Issue 11, end to end on real Flink (local runtime): a TaskManager memory change by warm standby.

One Git repository, one state directory and one counter app for the module (the E2E driver of
tests/e2e/test_apply_e2e.py); tests run in order and build on each other:

1. a TaskManager memory change: the plan says `warm-standby`; `apply` starts the new cluster beside the
   running job, stops the job with a savepoint, starts it on the new cluster from that savepoint and
   deletes the old cluster. Every count continues, Flink reports the savepoint as the restore point
   (`/jobs/<id>/checkpoints` latest.restored), the new TaskManager has the new memory, and the old
   cluster's JVMs are gone.
2. a standby that cannot start (a TaskManager memory Flink rejects): the old job keeps running, untouched,
   and nothing of the standby is left.
3. a new job that fails after the stop (a typo in the entry class) is rolled back onto the old cluster,
   still there, from the savepoint just taken; the standby is gone.
4. kill -9 of `apply` at the step boundaries of the warm-standby plan (standby ready, standby promoted),
   then `apply` again: exactly one job on exactly one cluster of the app, restored from a savepoint, every
   count continuous. (Every call boundary is covered cheaply by tests/apply/test_warm_standby.py.)

Nothing sleeps to assert: every wait polls with a deadline.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.live.flink import FlinkRestClient
from reconciler.live.local.config import ClusterRecord
from tests.e2e.test_apply_e2e import APP, E2E, SPEC_FILE, app_yaml, kill_apply_when, running_counter, start_step
from tests.gitutil import Repo

pytestmark = [pytest.mark.flink, pytest.mark.slow]

NOTES: list[str] = []
WARM_STEPS = ["StartStandbyCluster", "StopWithSavepoint", "PromoteStandby", "StartJob", "AwaitRunning",
              "AwaitHealthy", "DeleteRetiredCluster"]
_PHASES = {"pending": 0, "started": 1, "done": 2}


def commit_memory(env: E2E, memory: str, message: str) -> str:
    """The counter app with `taskManager.resources.memory` set (the shared driver writes no resources)."""
    text = app_yaml(parallelism=env.parallelism, mode=env.mode, rate=env.rate, entry_class=env.entry_class)
    marker = "    slots: 2\n"
    assert marker in text
    env.repo.write(SPEC_FILE, text.replace(marker, marker + f"    resources:\n      memory: {memory}\n"))
    rev = env.repo.commit(message)
    env.revisions.append(rev)
    return rev


def clusters(env: E2E) -> dict[str, ClusterRecord]:
    return env.rt.cluster_records(APP)


def jvm_alive(pid: int, rec: ClusterRecord) -> bool:
    try:
        return rec.marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def cluster_alive(rec: ClusterRecord) -> bool:
    return any(jvm_alive(p.pid, rec) for p in (rec.jobmanager, *rec.taskmanagers))


def live_jobs_everywhere(env: E2E) -> list[tuple[str, str]]:
    """(slot, job id) of every job not ended on any cluster of the app."""
    out = []
    for slot, rec in clusters(env).items():
        with FlinkRestClient(rec.rest_url, timeout=10) as client:
            out += [(slot, j.job_id) for j in client.jobs() if j.state not in ("FINISHED", "CANCELED", "FAILED")]
    return out


def savepoint_of(env: E2E, rev: str) -> str:
    sps = env.savepoints(rev)
    assert len(sps) == 1, sps
    path: str = sps[0]["path"]
    return path


@pytest.fixture(scope="module")
def env(counter_jar: Path, flink_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    repo = Repo(tmp_path_factory.mktemp("warm-standby"))
    with running_counter(repo, counter_jar, flink_home, "counter app", notes=NOTES, label="warm standby e2e") as e:
        yield e


def test_taskmanager_memory_change_moves_the_job_to_a_warm_standby(env: E2E) -> None:
    old_job = env.only_running_job()
    old = clusters(env)
    assert list(old) == ["cluster"] and old["cluster"].generation == "", old
    before = env.counts_at_least(1)
    rev = commit_memory(env, "1344m", "TaskManager memory 1280m -> 1344m")

    plan = env.plan_live()
    assert plan["action"] == "upgrade" and plan["cluster_strategy"] == "warm-standby", plan["reason"]
    assert "warm standby" in plan["reason"], plan["reason"]
    assert [s["type"] for s in plan["steps"]] == WARM_STEPS
    gen = plan["steps"][0]["generation"]
    assert plan["steps"][1]["job_id"] == old_job and plan["rollback_after"] == 1
    assert [s["type"] for s in plan["abort"]] == ["DiscardStandby"]

    t0 = time.monotonic()
    code, out = env.apply()
    assert code == 0, out
    NOTES.append(f"(1) apply took {time.monotonic() - t0:.1f} s")

    new_job = env.only_running_job()
    assert new_job == start_step(plan)["job_id"] != old_job
    now = clusters(env)
    assert list(now) == ["cluster"] and now["cluster"].generation == gen, now
    assert not cluster_alive(old["cluster"]), "the old cluster's JVMs still run"
    assert live_jobs_everywhere(env) == [("cluster", new_job)]
    if shutil.which("javac"):  # the standby ran the warm-up job to its end before the old job stopped
        warm = [j for j in env.jobs() if j.name == "flink-reconciler warm-up"]
        assert [j.state for j in warm] == ["FINISHED"], env.jobs()
    sp = savepoint_of(env, rev)
    assert env.restored_from(new_job) == (sp, True)
    env.assert_counts_continue(before)
    # the new TaskManager runs with the new memory
    conf = (env.rt.paths(APP, gen).conf / "config.yaml").read_text()
    assert '"taskmanager.memory.process.size": "1344m"' in conf, conf
    with FlinkRestClient(now["cluster"].rest_url, timeout=10) as client:
        tms = client.taskmanagers()
    total = [tm.get("memoryConfiguration", {}).get("totalProcessMemory") for tm in tms]
    assert total == [1344 * 2**20], total
    st = env.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (rev, new_job, "success"), st
    history = env.history_json()["transitions"]
    NOTES.append("(1) " + "; ".join(f"{t['action']} {t.get('outcome') or ''}" for t in history
                                   if t["revision"] == rev))


def test_a_standby_that_cannot_start_leaves_the_old_job_running(env: E2E) -> None:
    old_job = env.only_running_job()
    live = clusters(env)["cluster"]
    applied = env.status()["applied"]
    rev = commit_memory(env, "200m", "TaskManager memory 200m (Flink rejects it)")
    plan = env.plan_live()
    assert plan["cluster_strategy"] == "warm-standby"
    gen = plan["steps"][0]["generation"]
    after_plan = env.counts()

    code, out = env.apply()
    assert code == 1, out
    st = env.status()
    assert st["outcome"] == "failure" and (st["applied"], st["attempted"]) == (applied, rev), st
    assert "Flink rejected the TaskManager memory" in st["message"], st["message"]
    assert "the old job keeps running" in st["message"], st["message"]
    NOTES.append(f"(2) {st['message'][:300]}")
    assert env.only_running_job() == old_job
    assert env.savepoints(rev) == [], "the old job was stopped"
    assert {s: r.cluster_id for s, r in clusters(env).items()} == {"cluster": live.cluster_id}
    assert not env.rt.paths(APP, gen).conf.exists(), "the standby's files were left"
    assert env.inflight() is None
    env.counts_at_least(min(after_plan.values()) + 1)  # still counting


def test_a_new_job_that_fails_is_rolled_back_onto_the_old_cluster(env: E2E) -> None:
    """After the stop: the standby is discarded, and the previous spec's job restarts on the old cluster
    (still there) from the savepoint just taken."""
    env.only_running_job()
    live = clusters(env)["cluster"]
    before = env.counts_at_least(1)
    good = env.entry_class
    env.entry_class = "com.example.DoesNotExist"
    try:
        rev = commit_memory(env, "1536m", "TaskManager memory 1536m and a typo in the entry class")
    finally:
        env.entry_class = good
    plan = env.plan_live()
    assert plan["cluster_strategy"] == "warm-standby"
    assert [s["type"] for s in plan["rollback"]] == ["DiscardStandby", "EnsureCluster", "StartJob", "AwaitRunning"]
    code, out = env.apply()
    assert code == 1, out
    st = env.status()
    assert st["message"].startswith("rolled back to the previous spec") and "DoesNotExist" in st["message"], st
    job = env.only_running_job()
    assert job == next(s for s in plan["rollback"] if s["type"] == "StartJob")["job_id"]
    assert {s: r.cluster_id for s, r in clusters(env).items()} == {"cluster": live.cluster_id}, "not the old cluster"
    assert live_jobs_everywhere(env) == [("cluster", job)]
    assert env.restored_from(job) == (savepoint_of(env, rev), True)
    env.assert_counts_continue(before)
    NOTES.append(f"(rollback) {st['message'][:200]}")


def _at(step: int, phase: str) -> Any:
    return lambda row: row["stage"] == "forward" and (row["step_index"], _PHASES[row["phase"]]) >= (
        step, _PHASES[phase])


MOMENTS = {"standby-ready": _at(0, "done"), "promoted": _at(2, "done")}
MEMORY = {"standby-ready": "1408m", "promoted": "1472m"}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_kill_at_a_step_boundary_resumes_to_one_job_on_one_cluster(env: E2E, moment: str) -> None:
    env.only_running_job()
    before = env.counts_at_least(1)
    rev = commit_memory(env, MEMORY[moment], f"TaskManager memory {MEMORY[moment]} (killed at {moment})")
    killed = kill_apply_when(env, MOMENTS[moment], f"the moment {moment}")
    assert killed is not None, "apply finished before the kill"
    row = killed[1]
    left = {s: r.generation for s, r in clusters(env).items()}
    NOTES.append(f"(3) {moment}: killed at step {row['step_index']} ({row['phase']}); clusters then: {left}")
    assert len(left) == 2, left  # the standby (or the promoted one) beside the old: what the resume must sort out

    code, out = env.apply_subprocess()
    assert code == 0, out
    job = env.only_running_job()
    gen = row["plan"]["steps"][0]["generation"]
    now = clusters(env)
    assert {s: r.generation for s, r in now.items()} == {"cluster": gen}, now
    assert live_jobs_everywhere(env) == [("cluster", job)]
    assert env.restored_from(job) == (savepoint_of(env, rev), True)
    env.assert_counts_continue(before)
    st = env.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (rev, job, "success"), st
