"""Issue 10, end to end on real Flink: `rollback APP --to REV` puts the app back to how it was at REV,
spec and state together.

One Git repository, one state directory and one Flink session cluster for the module (the E2E driver
of test_apply_e2e.py). The app is created at A, upgraded at B and C while the counter job counts; each
upgrade is a stop-with-savepoint. B and C run the job at a higher rate than A, so the state C holds is soon
far ahead of where A was left (A's rate is what a rollback to A counts at). Then:

- `rollback --to A` shows the plan (nothing done) and says which newer state it drops;
- `rollback --to A --apply` runs A's spec from the savepoint taken when A was left (the upgrade to B):
  Flink reports that savepoint as the new job's restore point, and the counts go back to where they
  were when A was left (at least what they were before the upgrade to B, well below C's);
- `rollback --to A --write-commit` pushes a commit restoring A's spec with initialSavepointPath and a
  new savepointRedeployNonce; a plain `apply` of that commit gives the same result.

Nothing sleeps to assert: every wait polls with a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.live.ports import SavepointStatus
from tests.e2e.test_apply_e2e import APP, E2E, KEYS, SPEC_FILE, running_counter
from tests.fixtures.flink import wait_until
from tests.gitutil import Repo, git

pytestmark = [pytest.mark.flink, pytest.mark.slow]

SLACK = 150  # counts a key gains in ~6 s: between a restore and our first look at the files
FAST = 4  # B and C count this many times faster than A (whose job SLACK is about): C's state is soon far ahead


@pytest.fixture(scope="module")
def e2e(counter_jar: Path, flink_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    root = tmp_path_factory.mktemp("rollback-e2e")
    repo = Repo(root)  # `--write-commit` commits to the repository the reconciler follows: this checkout of main
    with running_counter(repo, counter_jar, flink_home, "A: counter app") as env:
        yield env


def rollback(e2e: E2E, *args: str) -> tuple[int, str]:
    return e2e.cli("rollback", APP, "--repo", str(e2e.repo.work), "--state-dir", str(e2e.state), *args)


def rewound(e2e: E2E, above: dict[str, int], timeout: float = 30) -> dict[str, int]:
    """The lowest count seen per key once the new job has written every key below `above` (polled fast:
    the files then hold the restored state plus what the job counted since)."""
    lowest: dict[str, int] = {}
    end = time.monotonic() + timeout
    while True:
        for k, v in e2e.counts().items():
            lowest[k] = min(lowest.get(k, v), v)
        if len(lowest) == KEYS and all(lowest[k] < above[k] for k in above):
            return lowest
        if time.monotonic() > end:
            pytest.fail(f"the counts did not go back below {above} within {timeout}s; lowest seen {lowest}")
        time.sleep(0.02)


def assert_back_at_a(e2e: E2E, lowest: dict[str, int], left_a: tuple[dict[str, int], dict[str, int]]) -> None:
    """Every count restarted from where A was left: not from zero, not from C's state."""
    before_b, after_b = left_a
    for k, v in lowest.items():
        assert before_b[k] <= v <= after_b[k] + SLACK, (k, v, before_b, after_b)


@pytest.fixture(scope="module")
def history(e2e: E2E) -> dict[str, object]:
    """Upgrade to B, then to C, each after the counts grew; returns what the test needs to judge."""
    a = e2e.revisions[0]
    job_a = e2e.only_running_job()
    e2e.counts_at_least(100)
    before_b = e2e.counts()
    b = e2e.commit(f"B: rate x {FAST}", rate=FAST * e2e.rate)
    code, out = e2e.apply()
    assert code == 0, out
    after_b = e2e.counts()
    (sp1,) = [s["path"] for s in e2e.savepoints(b)]
    e2e.counts_at_least(max(after_b.values()) + 4 * SLACK, timeout=60)  # B's state: far beyond where A was left
    c = e2e.commit("C: rate + 1", rate=e2e.next_rate())
    code, out = e2e.apply()
    assert code == 0, out
    (sp2,) = [s["path"] for s in e2e.savepoints(c)]
    return {"a": a, "b": b, "c": c, "job_a": job_a, "sp1": sp1, "sp2": sp2, "left_a": (before_b, after_b)}


def test_plan_only_says_what_it_would_drop(e2e: E2E, history: dict[str, object]) -> None:
    a, c, sp1, sp2 = (str(history[k]) for k in ("a", "c", "sp1", "sp2"))
    job_c = e2e.only_running_job()
    code, out = rollback(e2e, "--to", a[:10])
    assert code == 0, out
    assert f"Plan for {a[:12]} (live)" in out
    assert f"rollback to {a[:12]}: its spec, restored from the savepoint taken of job {history['job_a']}" in out
    assert f"RISK: DISCARDS CURRENT STATE: app {APP} restarts from {sp1}" in out
    assert f"the state of the running job {job_c}" in out and f"of revisions {c[:12]}" in out and sp2 in out
    assert f"1. stop job {job_c} with a savepoint" in out
    assert "nothing done: --apply runs this plan now" in out
    assert e2e.only_running_job() == job_c  # nothing touched


def test_apply_runs_a_from_the_savepoint_taken_when_leaving_it(e2e: E2E, history: dict[str, object]) -> None:
    a, sp1 = str(history["a"]), str(history["sp1"])
    job_c = e2e.only_running_job()
    e2e.counts_at_least(max(history["left_a"][1].values()) + 4 * SLACK, timeout=60)  # type: ignore[index]
    before = e2e.counts()
    code, out = rollback(e2e, "--to", a, "--apply")
    assert code == 0, out
    assert f"{APP}: rollback to {a[:12]} -> success" in out, out
    job = e2e.only_running_job()
    assert job != job_c
    assert e2e.restored_from(job) == (sp1, True)
    assert {j.job_id: j.state for j in e2e.jobs()}[job_c] == "FINISHED"  # stopped with a savepoint: C's state kept
    assert_back_at_a(e2e, rewound(e2e, before), history["left_a"])  # type: ignore[arg-type]
    st = e2e.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (a, job, "success"), st
    # Recorded and shown as a rollback: lineage and transitions (JSON and text), and the note on A.
    hist = e2e.history_json()
    last = hist["lineage"][-1]
    assert (last["revision"], last["action"], last["restored_from"], last["job_id"]) == (a, "rollback", sp1, job), last
    mine = [t for t in hist["transitions"] if t["revision"] == a and t["action"] != "savepoint"][-2:]
    assert [(t["action"], t["outcome"]) for t in mine] == [("rollback", "pending"), ("finish", "success")], mine
    assert mine[1]["message"] == f"rollback applied at {a[:12]}; job {job} running"
    code, text = e2e.cli("history", APP, "--state-dir", str(e2e.state))
    assert code == 0 and f"{a[:12]}  rollback  success  took {last['savepoints'][0]}; started from {sp1}" in text, text
    note = git(e2e.repo.work, "notes", "--ref", "refs/notes/flink-reconciler", "show", a)
    assert f"flink-reconciler/{APP}: success - rollback to {a[:12]}: rollback applied at {a[:12]}" in note, note
    assert len(last["savepoints"]) == 1  # the savepoint of C's job, taken by step 1
    history["c_state"] = last["savepoints"][0]


def test_write_commit_is_applied_with_the_same_result(e2e: E2E, history: dict[str, object]) -> None:
    a, sp1 = str(history["a"]), str(history["sp1"])
    tip = git(e2e.repo.work, "rev-parse", "HEAD")
    e2e.counts_at_least(max(history["left_a"][1].values()) + 4 * SLACK, timeout=60)  # type: ignore[index]
    code, out = rollback(e2e, "--to", a, "--write-commit")
    assert code == 0, out
    sha = git(e2e.repo.work, "rev-parse", "HEAD")
    assert sha != tip and git(e2e.repo.work, "rev-parse", "HEAD~1") == tip
    assert f"committed {sha[:12]} on main in {e2e.repo.work} (checked out there: work tree updated)" in out
    assert git(e2e.repo.work, "status", "--porcelain") == ""
    spec = (e2e.repo.work / SPEC_FILE).read_text()
    assert f"initialSavepointPath: {sp1}" in spec and "savepointRedeployNonce: 1" in spec
    assert git(e2e.repo.work, "diff", "--name-only", a, sha) == SPEC_FILE
    e2e.revisions.append(sha)

    plan = e2e.plan_live()
    assert plan["reason"] == f"savepointRedeployNonce changed: redeploy from {sp1}", plan["reason"]
    assert any(r.startswith("DISCARDS CURRENT STATE") for r in plan["risks"]), plan["risks"]
    before = e2e.counts()
    code, out = e2e.apply()
    assert code == 0, out
    job = e2e.only_running_job()
    assert e2e.restored_from(job) == (sp1, True)
    assert_back_at_a(e2e, rewound(e2e, before), history["left_a"])  # type: ignore[arg-type]
    st = e2e.status()
    assert (st["applied"], st["job_id"], st["outcome"]) == (sha, job, "success"), st
    # Applied: the next pass has nothing to do.
    assert e2e.plan_live()["action"] == "no-op"


def test_a_manual_savepoint_and_a_disposed_one(e2e: E2E, history: dict[str, object]) -> None:
    """`savepoint APP` records a manual savepoint of the running job; Flink's savepoint disposal (what
    retention uses for remote storage) deletes one, and a rollback that needs it is then refused."""
    job = e2e.only_running_job()
    code, out = e2e.cli("savepoint", APP, "--repo", str(e2e.repo.work), "--state-dir", str(e2e.state))
    assert code == 0, out
    rec = e2e._record()
    assert rec is not None
    manual = [s for s in rec["savepoints"] if s["kind"] == "manual"]
    assert len(manual) == 1 and manual[0]["job_id"] == job and manual[0]["revision"] == e2e.revisions[-1]
    assert f"{APP}: savepoint {manual[0]['path']} of job {job}" in out
    assert Path(manual[0]["path"].removeprefix("file:")).is_dir() and e2e.only_running_job() == job
    # Reported on the applied commit (notes pushed to the repository followed: this working copy).
    note = git(e2e.repo.work, "notes", "--ref", "refs/notes/flink-reconciler", "show", e2e.revisions[-1])
    assert manual[0]["path"] in note and "manual savepoint" in note, note

    flink = e2e.rt.flink(APP)
    sp2 = str(history["sp2"])  # B's rollback point: the savepoint of B's job, taken by the upgrade to C

    def disposed(trigger: str) -> SavepointStatus | None:
        st = flink.disposal_status(trigger)
        return st if st.done else None

    trigger = flink.trigger_disposal(sp2)
    assert wait_until(lambda: disposed(trigger), timeout=30, what="the disposal").failure is None
    assert not Path(sp2.removeprefix("file:")).exists()
    trigger = flink.trigger_disposal(sp2 + "-nowhere")
    missing = wait_until(lambda: disposed(trigger), timeout=30, what="the disposal of a missing savepoint")
    assert missing.failure and "FileNotFoundException" in missing.failure, missing  # retention: "already gone"
    code, out = rollback(e2e, "--to", str(history["b"]))
    assert code == 1 and f"from is gone: {sp2} does not exist any more" in out, out


def test_refused_for_a_revision_that_never_ran(e2e: E2E) -> None:
    e2e.repo.write("README.md", "a docs-only commit\n")
    docs = e2e.repo.commit("docs")
    code, out = rollback(e2e, "--to", docs)
    assert code == 1
    assert f"error: rollback of {APP} to {docs} refused: revision {docs[:12]} never ran this app" in out, out
