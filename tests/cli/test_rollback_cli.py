"""`flink-reconciler rollback` and `savepoint` as a user types them, without Flink: a real Git repository
(bare origin), records on disk written through the journal as `apply` writes them, `--dry-run` (no
runtime: the plan sees no cluster). The real-Flink path is tests/e2e/test_rollback_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.cli import main
from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from tests.apply.test_journal import plan_for
from tests.gitutil import Repo, git, spec


@pytest.fixture
def world(tmp_path: Path) -> tuple[Repo, Path, list[str], list[str]]:
    """Commits A, B, C of app `orders` (parallelism 1, 2, 3), each applied by an upgrade that stopped the
    previous job with a savepoint (a real directory); returns (repo, state dir, revisions, savepoints)."""
    repo = Repo(tmp_path)
    state = tmp_path / "state"
    journal = Journal(state / "journal", SystemClock())
    revs: list[str] = []
    sps: list[str] = []
    job: str | None = None
    for p in (1, 2, 3):
        repo.write("apps/orders.yaml", spec("orders", parallelism=p))
        rev = repo.commit(f"orders at parallelism {p}")
        revs.append(rev)
        journal.begin("orders", rev, plan_for())
        taken = ""
        if job is not None:
            d = state / "savepoints" / "orders" / f"savepoint-{job[:6]}-{p:012x}"
            d.mkdir(parents=True)
            taken = f"file:{d}"
            sps.append(taken)
            journal.add_savepoint("orders", taken, job_id=job, revision=rev)
        job = f"{p:032x}"
        journal.step_started("orders", 1, restored_from=taken, submitted_job_id=job)
        journal.finish("orders", Outcome.SUCCESS, "ok", applied_spec=None, job_id=job)
    return repo, state, revs, sps


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_only_changes_nothing(world: tuple[Repo, Path, list[str], list[str]],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    repo, state, revs, sps = world
    code, out, err = run(capsys, "rollback", "orders", "--to", revs[0][:8], "--repo", str(repo.origin),
                         "--state-dir", str(state), "--dry-run")
    assert code == 0, err
    assert out.startswith(f"Plan for {revs[0][:12]} (live)\n")
    assert f"restored from the savepoint taken of job {1:032x}" in out and sps[0] in out
    assert f"RISK: DISCARDS CURRENT STATE: app orders restarts from {sps[0]}" in out
    assert f"1 newer savepoint(s) on record (of revisions {revs[2][:12]}" in out
    assert "1. ensure cluster resources" in out and "2. start job" in out and f"from {sps[0]}  (deadline" in out
    assert out.rstrip().endswith("nothing done: --apply runs this plan now, --write-commit puts it on the branch")
    assert git(repo.origin, "rev-parse", "main") == revs[2]


def test_refusals_exit_1_with_the_reason(world: tuple[Repo, Path, list[str], list[str]],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    repo, state, revs, sps = world
    common = ("--repo", str(repo.origin), "--state-dir", str(state), "--dry-run")
    code, _, err = run(capsys, "rollback", "orders", "--to", revs[2], *common)
    assert code == 1
    assert err.startswith(f"error: rollback of orders to {revs[2]} refused: revision {revs[2][:12]} is what the "
                          "app runs now")
    Path(sps[0].removeprefix("file:")).rmdir()
    code, _, err = run(capsys, "rollback", "orders", "--to", revs[0], *common)
    assert code == 1 and f"from is gone: {sps[0]} does not exist any more" in err
    code, _, err = run(capsys, "rollback", "nobody", "--to", revs[0], *common)
    assert code == 1 and "no record of app nobody" in err
    code, _, err = run(capsys, "rollback", "orders", "--to", revs[1], "--apply", "--write-commit", *common)
    assert code == 1 and "give --apply or --write-commit, not both" in err
    code, _, err = run(capsys, "rollback", "orders", "--to", revs[1], "--apply", *common)
    assert code == 1 and "a rollback cannot be executed" in err  # --dry-run: no runtime


def test_write_commit_pushes_the_old_spec_with_its_savepoint(world: tuple[Repo, Path, list[str], list[str]],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    repo, state, revs, sps = world
    code, out, err = run(capsys, "rollback", "orders", "--to", revs[0], "--write-commit", "--repo", str(repo.origin),
                         "--state-dir", str(state), "--dry-run")
    assert code == 0, err
    sha = git(repo.origin, "rev-parse", "main")
    assert sha != revs[2] and git(repo.origin, "rev-parse", "main~1") == revs[2]
    assert f"committed {sha[:12]} on main and pushed" in out
    text = git(repo.origin, "show", f"{sha}:apps/orders.yaml")
    assert text == (spec("orders", parallelism=1).rstrip("\n")
                    + f"\n    initialSavepointPath: {sps[0]}\n    savepointRedeployNonce: 1")


def test_savepoint_needs_a_running_job(world: tuple[Repo, Path, list[str], list[str]],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _, state, _, _ = world
    code, _, err = run(capsys, "savepoint", "orders", "--state-dir", str(state), "--dry-run")
    assert code == 1 and "no runtime (dry run): no savepoint can be taken" in err
