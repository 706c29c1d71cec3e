"""Issue 8, end to end on real Flink: the reconciler loses its memory, the app keeps its state.

The records (last applied spec, savepoint history, the in-flight step) live in the state directory
here (`records/<app>.json`). When they are gone (new pod, failover, a deleted state directory), the
first `apply` sees an app with no applied spec on record. It must adopt the app with the newest state
the records (savepoints recovered from Git notes), Flink or the storage show, never start it empty:

(a) suspend via Git, delete the whole state directory except `savepoints/`, resume via Git: the plan
    says it restores from the suspend savepoint, and every count continues.
(b) kill -9 `apply` right after the stop-with-savepoint of an upgrade completed, delete the journal
    and the records, apply again: exactly one job, restored from the savepoint just taken (Flink still
    lists the stopped job with it), and every count continues.
(c) the same at every step boundary of the upgrade (trigger journaled, stop done, cluster ready, job
    submitted, job running): one job, restored from a savepoint, counts continuous; never empty.

One Git repository, one state directory and one app for the module (tests run in order and build on
each other), reusing the driver of tests/e2e/test_apply_e2e.py. Nothing sleeps to assert.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.observed import LiveApp
from reconciler.live.observe import observe
from tests.e2e.test_apply_e2e import (
    APP,
    E2E,
    SPEC_FILE,
    app_yaml,
    kill_apply_when,
    running_counter,
    start_step,
    step_types,
)
from tests.fixtures.flink import wait_until
from tests.gitutil import Repo

pytestmark = [pytest.mark.flink, pytest.mark.slow]

NOTES: list[str] = []  # what the crash test saw (printed at the end of the module)


def commit_state(env: E2E, message: str, state: str, **changes: Any) -> str:
    """Commit the app's spec with `spec.job.state` set (the shared driver only writes running apps)."""
    if "rate" in changes:
        env.rate = changes["rate"]
    text = app_yaml(parallelism=env.parallelism, mode=env.mode, rate=env.rate, entry_class=env.entry_class)
    marker = f"    upgradeMode: {env.mode}\n"
    assert marker in text
    env.repo.write(SPEC_FILE, text.replace(marker, marker + f"    state: {state}\n"))
    rev = env.repo.commit(message)
    env.revisions.append(rev)
    return rev


def forget_everything_but(state_dir: Path, keep: set[str]) -> list[str]:
    """Delete every entry of the state directory whose name is not in `keep`; returns what went."""
    gone = []
    for p in sorted(state_dir.iterdir()):
        if p.name in keep:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        gone.append(p.name)
    return gone


def forget_records(state_dir: Path) -> list[str]:
    """The reconciler's memory: the records store (`records/`) and the 0.1 journal (`journal.sqlite*`),
    whichever exists."""
    gone = []
    for p in sorted(state_dir.iterdir()):
        if p.name.startswith("journal.sqlite") or p.name == "records":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            gone.append(p.name)
    return gone


def same_path(a: str | None, b: str | None) -> bool:
    """Flink writes `file:/x`, other places `file:///x`: compare the directories."""
    def norm(p: str) -> Path:
        return Path(p.removeprefix("file://").removeprefix("file:")).resolve()
    return a is not None and b is not None and norm(a) == norm(b)


@pytest.fixture(scope="module")
def env(counter_jar: Path, flink_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    root = tmp_path_factory.mktemp("adoption")
    repo = Repo(root)
    with running_counter(repo, counter_jar, flink_home, "counter app", notes=NOTES, label="adoption e2e") as e:
        yield e


# ------------------------------------------------------------------------------------------------
# (a) suspended app, state directory lost except its savepoints, resumed in Git


def test_resume_after_losing_the_state_dir_restores_the_suspend_savepoint(env: E2E) -> None:
    env.only_running_job()
    commit_state(env, "suspend", "suspended")
    code, out = env.apply()
    assert code == 0, out
    assert env.rt.read_record(APP) is None, "suspend should have removed the cluster"
    suspend_sp = env.status()["last_savepoint"]
    assert suspend_sp, env.status()
    before = env.counts()  # what the job wrote up to its stop-with-savepoint

    gone = forget_everything_but(env.state, {"savepoints"})
    assert "journal.sqlite" in gone or "records" in gone, gone
    NOTES.append(f"(a) deleted from the state dir: {', '.join(gone)}")

    rev = commit_state(env, "resume", "running")
    plan = env.plan_live()
    assert plan["action"] == "create", plan["reason"]
    assert plan["reason"].startswith("adopted: restoring from"), plan["reason"]
    start = start_step(plan)
    assert start["restore"]["kind"] == "path" and same_path(start["restore"]["path"], suspend_sp), (
        start["restore"], suspend_sp)
    assert not plan["risks"], plan["risks"]
    NOTES.append(f"(a) plan: {plan['reason']}")

    code, out = env.apply()
    assert code == 0, out
    job = env.only_running_job()
    assert job == start["job_id"]
    restored, is_savepoint = env.restored_from(job)
    assert same_path(restored, suspend_sp) and is_savepoint, (restored, suspend_sp)
    env.assert_counts_continue(before)
    st = env.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (rev, job, "success"), st


# ------------------------------------------------------------------------------------------------
# (b) kill -9 right after the upgrade's stop-with-savepoint, the reconciler's memory deleted


def test_kill_after_stop_then_lost_records_restores_the_savepoint_just_taken(env: E2E) -> None:
    for attempt in range(1, 4):
        old_job = env.only_running_job()
        before = env.counts_at_least(1)
        rev = env.commit(f"rate + 1 (killed after the stop, attempt {attempt})", rate=env.next_rate())
        killed = kill_apply_when(env, lambda r: bool(r.get("captured_path")), "the stop's savepoint in the records")
        if killed is not None:
            row = killed[1]
            break
        NOTES.append(f"(b) attempt {attempt}: apply finished before the kill")
    else:
        pytest.fail("three applies finished before the kill could land")
    taken = row["captured_path"]
    plan_killed = row["plan"]
    planned_job = start_step(plan_killed)["job_id"]
    jobs = {j.job_id: j.state for j in env.jobs()}
    assert jobs.get(old_job) == "FINISHED", jobs
    submitted = planned_job in jobs
    NOTES.append(f"(b) killed at step {row['step_index']} with the savepoint {taken}; the new job "
                 f"{'had' if submitted else 'had not'} been submitted; jobs: {jobs}")

    gone = forget_records(env.state)
    assert gone, sorted(p.name for p in env.state.iterdir())
    NOTES.append(f"(b) deleted: {', '.join(gone)}")

    plan = env.plan_live()
    NOTES.append(f"(b) plan after the memory loss: {plan['action']}: {plan['reason']}")
    if not submitted:
        # What Flink still shows: the old job, FINISHED, and the savepoint it stopped with (in its
        # checkpoint statistics, which the REST API caches for web.refresh-interval).
        def stopped_with_savepoint() -> LiveApp | None:
            la = observe(env.rt, [APP]).get(APP)
            return la if la.stopped_savepoint is not None else None

        live = wait_until(stopped_with_savepoint, timeout=15,
                          what="the stopped job's savepoint in Flink's checkpoint statistics")
        assert live.stopped_job_id == old_job and live.stopped_savepoint is not None, live
        assert same_path(live.stopped_savepoint.path, taken), (live.stopped_savepoint, taken)
        assert plan["action"] == "create" and plan["reason"].startswith("adopted: restoring from"), plan["reason"]
        assert step_types(plan) == ["EnsureCluster", "StartJob", "AwaitRunning", "AwaitHealthy"], plan["steps"]
        start = start_step(plan)
        assert start["restore"]["kind"] == "path" and same_path(start["restore"]["path"], taken), start
        assert not any("WITHOUT STATE" in r for r in plan["risks"]), plan["risks"]
    else:  # the kill came after the submit: the job runs from the savepoint; nothing to start
        assert plan["action"] in ("no-op", "upgrade"), plan

    code, out = env.apply_subprocess()
    assert code == 0, out
    job = env.only_running_job()  # exactly one job runs
    restored, is_savepoint = env.restored_from(job)
    if plan["action"] == "upgrade":  # upgraded again from a savepoint of the adopted job: still continuous
        assert is_savepoint, (restored, taken)
    else:
        assert same_path(restored, taken) and is_savepoint, (restored, taken)
    env.assert_counts_continue(before)
    st = env.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (rev, job, "success"), st


# ------------------------------------------------------------------------------------------------
# (c) the same at every step boundary of a savepoint upgrade


_PHASES = {"pending": 0, "started": 1, "done": 2}


def _at(step: int, phase: str) -> Any:
    """At this boundary or the first one after it the poll sees (some windows last microseconds)."""
    return lambda row: row["stage"] == "forward" and (row["step_index"], _PHASES[row["phase"]]) >= (
        step, _PHASES[phase])


MOMENTS = {  # in-flight record -> kill now (a savepoint upgrade: stop, ensure, start, await running, healthy)
    "trigger-journaled": lambda row: bool(row.get("trigger_id")) or bool(row.get("captured_path")),
    "stop-done": _at(0, "done"),
    "cluster-ready": _at(1, "done"),
    "job-submitted": _at(2, "done"),
    "job-running": _at(3, "done"),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_kill_at_every_step_boundary_then_lost_records_never_starts_empty(env: E2E, moment: str) -> None:
    """kill -9 of `apply` at a step boundary, the records deleted, `apply` again: exactly one job, restored
    from a savepoint (the one just taken whenever the kill came after it), counts continuous."""
    for attempt in range(1, 4):
        env.only_running_job()
        before = env.counts_at_least(1)
        rev = env.commit(f"rate + 1 (killed at {moment}, attempt {attempt})", rate=env.next_rate())
        killed = kill_apply_when(env, MOMENTS[moment], f"the moment {moment}")
        if killed is not None:
            row = killed[1]
            break
        NOTES.append(f"(c) {moment}, attempt {attempt}: apply finished before the kill")  # pragma: no cover
    else:
        pytest.fail(f"three applies finished before the kill at {moment} could land")
    taken = row.get("captured_path")
    forget_records(env.state)
    plan = env.plan_live()
    NOTES.append(f"(c) {moment}: killed at step {row['step_index']} ({row['phase']}); after the memory loss "
                 f"the plan is {plan['action']}: {plan['reason']}")
    assert not any("WITHOUT STATE" in r for r in plan["risks"]), plan["risks"]
    if plan["action"] == "blocked":  # allowed, with an instruction: then nothing was started empty
        assert "To proceed" in plan["reason"] or "set spec" in plan["reason"], plan["reason"]
        pytest.skip(f"blocked with an instruction: {plan['reason']}")
    code, out = env.apply_subprocess()
    assert code == 0, out
    job = env.only_running_job()  # exactly one job
    restored, is_savepoint = env.restored_from(job)
    assert is_savepoint, (restored, moment)
    if taken is not None and plan["action"] != "upgrade":
        assert same_path(restored, taken), (restored, taken)
    env.assert_counts_continue(before)
    st = env.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (rev, job, "success"), st


# ------------------------------------------------------------------------------------------------
# (d) the record is truncated (a full disk): the app waits; `record rebuild` adopts it from its savepoint


def test_a_truncated_record_blocks_the_app_until_record_rebuild_adopts_it_from_its_savepoint(env: E2E) -> None:
    env.only_running_job()
    commit_state(env, "suspend before the disk fills up", "suspended")
    code, out = env.apply()
    assert code == 0, out
    suspend_sp = env.status()["last_savepoint"]
    assert suspend_sp, env.status()
    before = env.counts()
    record = env.state / "records" / f"{APP}.json"
    raw = record.read_bytes()
    record.write_bytes(raw[: len(raw) // 2])  # what a full disk or an interrupted copy leaves
    broken = record.read_bytes()

    rev = commit_state(env, "resume", "running")
    plan = env.plan_live()  # `plan --live` works, and says what is wrong and what to do
    assert plan["action"] == "blocked" and not plan["steps"], plan
    assert f"`flink-reconciler record rebuild {APP}`" in plan["reason"], plan["reason"]
    code, out = env.apply()  # the app waits: nothing is started, the record is not written over
    assert code == 1 and f"{APP}: blocked -> failure" in out, out
    assert record.read_bytes() == broken and env.rt.read_record(APP) is None
    st = env.status()
    assert st["outcome"] == "blocked" and "record rebuild" in st["message"], st

    code, out = env.cli("record", "rebuild", APP, "--state-dir", str(env.state), "--repo", str(env.repo.work))
    assert code == 0, out
    aside = next(record.parent.glob(f"{APP}.json.broken-*"))
    assert aside.read_bytes() == broken, "the broken record is kept, byte for byte"
    assert "next pass: create: adopted: restoring from" in out, out
    NOTES.append(f"(d) record rebuild said: {out.strip()}")

    plan = env.plan_live()
    start = start_step(plan)
    assert start["restore"]["kind"] == "path" and same_path(start["restore"]["path"], suspend_sp), (
        start["restore"], suspend_sp)
    code, out = env.apply()
    assert code == 0, out
    job = env.only_running_job()
    restored, is_savepoint = env.restored_from(job)
    assert same_path(restored, suspend_sp) and is_savepoint, (restored, suspend_sp)
    env.assert_counts_continue(before)
    st = env.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (rev, job, "success"), st
