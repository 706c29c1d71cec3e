"""The reconcile pass in dry-run mode (no runtime): real Git, real journal, real git-notes statuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.plan import Action
from reconciler.report.gitnotes import GitNotesSink
from reconciler.report.reporter import Reporter
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.gitutil import Repo, git, spec


def _reconciler(repo: Repo, state: Path, *, leader: object = None) -> Reconciler:
    clock = SystemClock()
    source = GitSource(str(repo.origin), state / "git")
    return Reconciler(source=source, runtime=None, journal=Journal(state / "journal.sqlite", clock), clock=clock,
                      subdir="apps", reporter=Reporter([GitNotesSink(source)], clock),
                      leader=leader)  # type: ignore[arg-type]


def test_standby_replica_never_fetches_nor_reconciles(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("apps/a.yaml", spec("a"))
    repo.commit("a")
    rec = _reconciler(repo, tmp_path / "state", leader=lambda: False)
    rec.sync(full=True, reason="test")
    assert not (tmp_path / "state" / "git" / "repo.git").exists()
    assert rec.readiness() == (True, f"ok (standby): {repo.origin} at nothing fetched yet")


def test_incremental_pass_plans_only_changed_apps_and_reports_errors_on_the_commit(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("apps/a.yaml", spec("a"))
    repo.write("apps/b.yaml", spec("b"))
    repo.commit("two apps")
    rec = _reconciler(repo, tmp_path / "state")
    rec.source.fetch()
    first = rec.apply(rec.source.resolve("main"))
    assert {a.app for a in first.plan.apps} == {"a", "b"}
    repo.write("apps/b.yaml", spec("b").replace("parallelism:", "paralelism:"))
    bad = repo.commit("typo in b")
    rec.sync(full=False, reason="poll")
    assert rec.reporter is not None and rec.reporter.flush(10)
    git(repo.work, "fetch", "-q", "origin", "refs/notes/*:refs/notes/*")
    note = git(repo.work, "notes", "--ref=flink-reconciler", "show", bad)
    assert note.startswith("flink-reconciler/b: error - apps/b.yaml:10:5 spec.job.paralelism: unknown field"), note
    assert "flink-reconciler/a" not in note  # a did not change: not planned, not re-reported
    plan_b = rec.plan(bad, only={"b"}).app("b")
    assert plan_b.action is Action.ERROR and not plan_b.steps


class _BrokenRuntime:
    """A runtime double whose observation hits a bug (not a ReconcilerError) until `error` is cleared:
    the shape of "one bad value crashes every pass"."""

    name = "stub"

    def __init__(self) -> None:
        self.error: Exception | None = RuntimeError("bad value in the observed state")

    def list_clusters(self) -> dict[str, object]:
        if self.error is not None:
            raise self.error
        return {}


def test_readiness_follows_the_last_pass_and_a_failed_pass_is_retried_though_git_did_not_move(
    tmp_path: Path,
) -> None:
    repo = Repo(tmp_path)
    repo.write("README.md", "no apps yet\n")
    head = repo.commit("empty")
    clock = SystemClock()
    state = tmp_path / "state"
    runtime = _BrokenRuntime()
    rec = Reconciler(source=GitSource(str(repo.origin), state / "git"), runtime=runtime,  # type: ignore[arg-type]
                     journal=Journal(state / "journal.sqlite", clock), clock=clock, subdir="apps")
    with pytest.raises(RuntimeError):
        rec.sync(full=True, reason="startup")
    assert rec.readiness() == (
        False, f"the pass at {head[:12]} failed: RuntimeError: bad value in the observed state")
    # The next poll: Git did not move, but the pass is not skipped as "nothing changed": it fails again.
    with pytest.raises(RuntimeError):
        rec.sync(full=False, reason="poll")
    assert rec.readiness()[0] is False
    runtime.error = None
    rec.sync(full=False, reason="poll")
    assert rec.readiness() == (True, f"ok: {repo.origin} at {head[:12]}")


def test_an_app_that_waits_is_logged_once_not_on_every_pass(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = Repo(tmp_path)
    repo.write("apps/a.yaml", spec("a").replace("parallelism:", "paralelism:"))
    repo.write("apps/b.yaml", spec("b"))
    repo.commit("a is broken")
    rec = _reconciler(repo, tmp_path / "state")
    rec.source.fetch()
    head = rec.source.resolve("main")
    with caplog.at_level("INFO", logger="reconciler.service.reconcile"):
        for _ in range(3):
            rec.apply(head)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("a: error")]
    assert len(lines) == 1, lines
    assert "spec.job.paralelism: unknown field" in lines[0]
    assert not [r for r in caplog.records if r.getMessage().startswith("b:")], "an app that is fine says nothing"
