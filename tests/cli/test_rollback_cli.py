"""`flink-reconciler rollback` and `savepoint` as a user types them, without Flink: a real Git repository
(bare origin), records on disk written through the journal as `apply` writes them, `--dry-run` (no
runtime: the plan sees no cluster). The real-Flink path is tests/e2e/test_rollback_e2e.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.cli import main
from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from reconciler.core.rollback import Refusal
from reconciler.errors import SourceError
from reconciler.service import rollback
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.apply.test_journal import plan_for
from tests.gitutil import Repo, git, spec


def three_upgrades(state: Path, commit: Callable[[int], str]) -> tuple[list[str], list[str]]:
    """Commits A, B, C of app `orders` (parallelism 1, 2, 3, each made by `commit`), each applied by an
    upgrade that stopped the previous job with a savepoint (a real directory), recorded through the
    journal as `apply` records it; returns (revisions, savepoints)."""
    journal = Journal(state / "journal", SystemClock())
    revs: list[str] = []
    sps: list[str] = []
    job: str | None = None
    for p in (1, 2, 3):
        rev = commit(p)
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
    return revs, sps


@pytest.fixture
def world(tmp_path: Path) -> tuple[Repo, Path, list[str], list[str]]:
    """A developer's clone with a bare origin; returns (repo, state dir, revisions, savepoints)."""
    repo = Repo(tmp_path)
    state = tmp_path / "state"

    def commit(p: int) -> str:
        repo.write("apps/orders.yaml", spec("orders", parallelism=p))
        return repo.commit(f"orders at parallelism {p}")

    revs, sps = three_upgrades(state, commit)
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


# ------------------------------------------------------------------ --write-commit on the user's own checkout


@pytest.fixture
def demo(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    """The README's demo repository: `demo/gitops`, a plain non-bare repository with `main` checked out,
    made as scripts/demo.sh makes it (its config untouched), then edited and committed in place as its
    user does; returns (the checkout, revisions, savepoints)."""
    work = tmp_path / "demo" / "gitops"
    (work / "jobs").mkdir(parents=True)
    (work / "jobs" / "counter.jar").write_bytes(b"not really a jar")
    (work / "README.md").write_text("the demo repo\n")
    (work / "apps").mkdir()

    def commit(p: int) -> str:
        (work / "apps" / "orders.yaml").write_text(spec("orders", parallelism=p))
        if p == 1:
            subprocess.run(["git", "-C", str(work), "init", "-q", "-b", "main"], check=True)
        subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(work), "-c", "user.name=demo", "-c", "user.email=demo@localhost",
                        "commit", "-q", "-m", f"orders at parallelism {p}"], check=True)
        return git(work, "rev-parse", "HEAD")

    revs, sps = three_upgrades(tmp_path / "demo" / "state", commit)
    return work, revs, sps


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: its own process, in `cwd`."""
    return subprocess.run([sys.executable, "-m", "reconciler.cli", *args], check=False, cwd=cwd,
                          capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, timeout=120)


def test_write_commit_on_the_demo_checkout_commits_to_its_branch(demo: tuple[Path, list[str], list[str]]) -> None:
    work, revs, sps = demo
    config = (work / ".git" / "config").read_text()
    done = cli(work.parent.parent, "rollback", "orders", "--to", revs[0][:8], "--write-commit",
               "--repo", "demo/gitops", "--state-dir", "demo/state", "--path", "apps", "--dry-run")
    assert done.returncode == 0, done.stderr
    sha = git(work, "rev-parse", "HEAD")
    assert git(work, "rev-parse", "HEAD~1") == revs[2]  # a fast-forward: history kept
    assert git(work, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert f"committed {sha[:12]} on main in {work} (checked out there: work tree updated)" in done.stdout
    assert git(work, "status", "--porcelain", "--untracked-files=all") == ""  # work tree and index have it
    assert (work / "apps" / "orders.yaml").read_text() == (
        spec("orders", parallelism=1).rstrip("\n") + f"\n    initialSavepointPath: {sps[0]}\n"
        "    savepointRedeployNonce: 1\n")
    subject = git(work, "log", "-1", "--format=%s")
    assert subject == f"rollback(orders): back to {revs[0][:12]}, restored from its savepoint"
    assert (work / ".git" / "config").read_text() == config  # nothing configured behind the user's back


def test_write_commit_refuses_a_dirty_checkout_naming_the_files(demo: tuple[Path, list[str], list[str]]) -> None:
    work, revs, _ = demo
    (work / "README.md").write_text("edited, not committed\n")
    (work / "jobs" / "counter.jar").unlink()
    (work / "notes.txt").write_text("untracked, elsewhere: not in the way\n")
    args = ("rollback", "orders", "--to", revs[0], "--write-commit", "--repo", "demo/gitops",
            "--state-dir", "demo/state", "--dry-run")
    done = cli(work.parent.parent, *args)
    assert done.returncode == 1
    assert (f"branch 'main' is checked out in {work} and its work tree is not clean: README.md (modified), "
            "jobs/counter.jar (deleted); nothing was committed: commit or stash these changes") in done.stderr
    assert "notes.txt" not in done.stderr and "refusing to update" not in done.stderr
    assert git(work, "rev-parse", "HEAD") == revs[2]
    git(work, "checkout", "--", "README.md", "jobs/counter.jar")
    git(work, "add", "-N", "notes.txt")  # staged (intent to add): a change like any other
    done = cli(work.parent.parent, *args)
    assert done.returncode == 1 and "not clean: notes.txt (added)" in done.stderr, done.stderr
    git(work, "rm", "-q", "--cached", "notes.txt")
    assert cli(work.parent.parent, *args).returncode == 0
    assert git(work, "rev-parse", "HEAD~1") == revs[2]
    assert git(work, "status", "--porcelain") == "?? notes.txt"


def test_write_commit_never_moves_a_checkout_whose_branch_moved(demo: tuple[Path, list[str], list[str]]) -> None:
    """The tip `rollback` read is not the checkout's any more (committed meanwhile, or rewound by hand):
    nothing is written over it, the user is told to run it again."""
    work, revs, _ = demo
    state = work.parent / "state"
    rec = Reconciler(source=GitSource(str(work), state / "git"), runtime=None,
                     journal=Journal(state / "journal", SystemClock()), clock=SystemClock())
    prepared = rollback.prepare(rec, "orders", revs[0])
    assert not isinstance(prepared, Refusal), prepared
    (work / "README.md").write_text("a commit meanwhile\n")
    git(work, "commit", "-q", "-am", "meanwhile")
    moved = git(work, "rev-parse", "HEAD")
    with pytest.raises(SourceError, match=r"branch 'main' on .* moved while the commit was written; nothing "
                                          r"was pushed: run the command again"):
        rollback.write_commit(rec, prepared)
    assert git(work, "rev-parse", "HEAD") == moved and git(work, "status", "--porcelain") == ""
