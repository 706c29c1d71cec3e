"""Git notes end to end: Reporter -> GitNotesSink -> bare origin -> `git log --notes` in another clone."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.errors import ReportError, TransientReportError
from reconciler.report import CommitStatus, GitNotesSink, Reporter, note_line
from reconciler.source.git import GitSource
from tests.source.gitrepo import Upstream, git


@pytest.fixture
def up(tmp_path: Path) -> Upstream:
    u = Upstream(tmp_path / "up")
    u.commit({"apps/orders.yaml": "name: orders\n", "apps/billing.yaml": "name: billing\n"}, "two apps")
    u.push()
    return u


def notes_in_fresh_clone(up: Upstream, where: Path) -> str:
    git(where.parent, "clone", "-q", str(up.origin), str(where))
    git(where, "fetch", "-q", "origin", "refs/notes/*:refs/notes/*")
    return git(where, "log", "-1", "--notes=flink-reconciler", "--format=%h %s%n%N").strip()


def test_note_line_format() -> None:
    s = CommitStatus("a" * 40, "orders", Outcome.FAILURE, "step StartJob failed:\n  ClassNotFound", "http://r/x")
    assert note_line(s) == "flink-reconciler/orders: failure - step StartJob failed: ClassNotFound (http://r/x)"



def test_a_note_masks_url_credentials() -> None:
    """A note is pushed to origin, where every clone reads it: a message naming a URL with a password (one
    holding a raw '@') carries `***` instead."""
    s = CommitStatus("a" * 40, "orders", Outcome.FAILURE, "fetch of https://bot:pa@ss@word99@jars.example/x.jar failed")
    assert note_line(s) == "flink-reconciler/orders: failure - fetch of https://***@jars.example/x.jar failed"


def test_statuses_become_one_note_with_a_line_per_app(up: Upstream, tmp_path: Path) -> None:
    src = GitSource(str(up.origin), tmp_path / "cache")
    sha = src.fetch().new_sha
    clock = FakeClock()
    with Reporter([GitNotesSink(src)], clock) as reporter:
        reporter.report(CommitStatus(sha, "orders", Outcome.PENDING, "upgrade (savepoint) started"))
        reporter.report(CommitStatus(sha, "billing", Outcome.PENDING, "create started"))
        assert reporter.flush(10)
        reporter.report(CommitStatus(sha, "orders", Outcome.SUCCESS, "applied, job RUNNING"))
        reporter.report(CommitStatus(sha, "billing", Outcome.ERROR, "apps/billing.yaml:3:5 spec.job: field required"))
        assert reporter.flush(10)
    shown = notes_in_fresh_clone(up, tmp_path / "viewer")
    assert shown.splitlines()[1:] == [
        "flink-reconciler/orders: success - applied, job RUNNING",
        "flink-reconciler/billing: error - apps/billing.yaml:3:5 spec.job: field required",
    ]


def test_unreachable_origin_is_retried_until_it_is_back(up: Upstream, tmp_path: Path) -> None:
    src = GitSource(str(up.origin), tmp_path / "cache")
    sha = src.fetch().new_sha
    sink = GitNotesSink(src)
    moved = up.root / "away.git"
    up.origin.rename(moved)
    with pytest.raises(TransientReportError, match="does not appear to be a git repository"):
        sink.post(CommitStatus(sha, "orders", Outcome.SUCCESS, "applied"))
    moved.rename(up.origin)
    clock = FakeClock()
    with Reporter([sink], clock) as reporter:
        up.origin.rename(moved)
        reporter.report(CommitStatus(sha, "orders", Outcome.SUCCESS, "applied, job RUNNING"))
        deadline = 50
        while reporter.stats()["git-notes"].retries == 0 and deadline:
            reporter.flush(0.1)
            deadline -= 1
        assert reporter.stats()["git-notes"].retries >= 1
        moved.rename(up.origin)
        clock.advance(60)
        assert reporter.flush(10)
    assert git(up.origin, "notes", "--ref=flink-reconciler", "show", sha) == (
        "flink-reconciler/orders: success - applied, job RUNNING\n"
    )


def test_unknown_commit_is_a_permanent_error(up: Upstream, tmp_path: Path) -> None:
    src = GitSource(str(up.origin), tmp_path / "cache")
    src.fetch()
    with pytest.raises(ReportError, match="unknown revision") as e:
        GitNotesSink(src).post(CommitStatus("e" * 40, "orders", Outcome.SUCCESS, "x"))
    assert not isinstance(e.value, TransientReportError)


def test_local_only_mode_does_not_push(up: Upstream, tmp_path: Path) -> None:
    src = GitSource(str(up.origin), tmp_path / "cache")
    sha = src.fetch().new_sha
    GitNotesSink(src, push=False).post(CommitStatus(sha, "orders", Outcome.SUCCESS, "ok"))
    assert src.read_note(sha) == "flink-reconciler/orders: success - ok\n"
    assert git(up.origin, "for-each-ref", "refs/notes") == ""


def test_a_batch_for_one_commit_writes_its_note_once(tmp_path: Path) -> None:
    """Many apps on one commit: one read and one write of the note, whatever the number of apps."""
    from reconciler.core.observed import Outcome
    from reconciler.report.gitnotes import GitNotesSink
    from reconciler.report.status import CommitStatus
    from reconciler.source.git import GitSource
    from tests.gitutil import Repo, git

    repo = Repo(tmp_path)
    repo.write("a.txt", "a")
    sha = repo.commit("one")
    src = GitSource(str(repo.origin), tmp_path / "cache")
    src.fetch()
    statuses = [CommitStatus(revision=sha, app=f"app-{i}", state=Outcome.SUCCESS, description="ok") for i in range(50)]
    statuses.append(CommitStatus(revision=sha, app="app-3", state=Outcome.FAILURE, description="later wins"))
    GitNotesSink(src).post_batch(statuses)
    log = git(src.git_dir, "log", "--format=%s", "refs/notes/flink-reconciler")
    assert len(log.splitlines()) == 1  # one notes commit for the whole batch
    git(repo.work, "fetch", "-q", "origin", "refs/notes/*:refs/notes/*")
    note = git(repo.work, "notes", "--ref=flink-reconciler", "show", sha).splitlines()
    assert len(note) == 50 and "flink-reconciler/app-3: failure - later wins" in note


def test_a_pass_reported_at_once_is_one_note_push(up: Upstream, tmp_path: Path) -> None:
    """A pass hands its statuses over together (report_many): the notes worker takes them as one batch,
    not the first few it woke up to and then the rest (twice the pushes, each racing other shards')."""
    src = GitSource(str(up.origin), tmp_path / "cache")
    sha = src.fetch().new_sha
    statuses = [CommitStatus(sha, f"app-{i:04d}", Outcome.PENDING, "create") for i in range(3000)]
    switch = sys.getswitchinterval()
    with Reporter([GitNotesSink(src)], FakeClock()) as reporter:  # its worker idles, waiting for a status
        sys.setswitchinterval(1e-6)  # the worker gets the GIL whenever it could take a part of the batch
        try:
            reporter.report_many(statuses)
        finally:
            sys.setswitchinterval(switch)
        assert reporter.flush(30)
    assert git(up.origin, "rev-list", "--count", "refs/notes/flink-reconciler").strip() == "1"
    assert len(git(up.origin, "notes", "--ref=flink-reconciler", "show", sha).splitlines()) == 3000


def test_a_failed_push_of_a_whole_pass_is_one_warning_not_one_per_app(
    up: Upstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = GitSource(str(up.origin), tmp_path / "cache")
    sha = src.fetch().new_sha
    up.origin.rename(up.root / "away.git")
    with caplog.at_level("WARNING", logger="reconciler.report.reporter"), Reporter([GitNotesSink(src)],
                                                                                    FakeClock()) as reporter:
        for i in range(200):
            reporter.report(CommitStatus(sha, f"app-{i:03d}", Outcome.PENDING, "create"))
        deadline = 100
        while reporter.stats()["git-notes"].retries < 200 and deadline:
            reporter.flush(0.1)
            deadline -= 1
        assert reporter.stats()["git-notes"].retries == 200  # the clock stands still: one attempt each
        lines = [r.getMessage() for r in caplog.records if "git-notes: posting" in r.getMessage()]
        counted = sum(int(m.split("posting ")[1].split(" ")[0]) if " statuses (" in m else 1 for m in lines)
        assert counted == 200 and len(lines) <= 3, lines
        up.root.joinpath("away.git").rename(up.origin)


def test_shards_write_their_own_notes_refs_and_never_race(up: Upstream, tmp_path: Path) -> None:
    """Two shard daemons report a pass on the same commit at once. Each app's lines go under its shard's
    ref, so neither push has another writer's notes to merge: each ref's history is one commit, where
    a shared ref has the second writer's commit on top of the first's (a lost race, a re-merged note)."""
    from reconciler.report.gitnotes import shard_notes_ref

    shard = {"orders": 0, "billing": 1, "payments": 1, "search": 0}
    sources = [GitSource(str(up.origin), tmp_path / f"shard-{i}") for i in (0, 1)]
    sha = sources[0].fetch().new_sha
    sources[1].fetch()
    sinks = [GitNotesSink(src, ref_for=lambda app: shard_notes_ref(shard[app])) for src in sources]
    barrier = threading.Barrier(2)

    def report(i: int) -> None:
        barrier.wait()
        sinks[i].post_batch([CommitStatus(sha, app, Outcome.SUCCESS, f"applied by shard {i}")
                             for app, s in shard.items() if s == i])

    threads = [threading.Thread(target=report, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (0, 1):
        ref = shard_notes_ref(i)
        assert git(up.origin, "rev-list", "--count", ref).strip() == "1"
        assert git(up.origin, "notes", f"--ref={ref}", "show", sha).splitlines() == [
            f"flink-reconciler/{app}: success - applied by shard {i}" for app, s in shard.items() if s == i]
    assert git(up.origin, "for-each-ref", "refs/notes/flink-reconciler") == ""  # nothing in the unsharded ref
    # What a user sees: every shard's section under one glob.
    viewer = tmp_path / "viewer"
    git(viewer.parent, "clone", "-q", str(up.origin), str(viewer))
    git(viewer, "fetch", "-q", "origin", "refs/notes/*:refs/notes/*")
    shown = git(viewer, "log", "-1", "--notes=flink-reconciler*", "--format=%N")
    assert sorted(line for line in shown.splitlines() if line) == sorted(
        f"flink-reconciler/{app}: success - applied by shard {s}" for app, s in shard.items())


def test_a_ref_that_cannot_be_pushed_does_not_hold_back_the_others(up: Upstream, tmp_path: Path) -> None:
    """A daemon holding two shards (shard: auto) pushes both refs; one refused by origin (a server-side
    hook here) is a transient failure of the batch, and the other ref's lines are on origin meanwhile."""
    from reconciler.report.gitnotes import shard_notes_ref

    src = GitSource(str(up.origin), tmp_path / "cache")
    sha = src.fetch().new_sha
    hook = up.origin / "hooks" / "update"
    hook.write_text('#!/bin/sh\n[ "$1" = refs/notes/flink-reconciler-shard-0 ] && exit 1\nexit 0\n')
    hook.chmod(0o755)
    sink = GitNotesSink(src, ref_for=lambda app: shard_notes_ref(0 if app in ("orders", "search") else 1))
    with pytest.raises(TransientReportError, match="shard-0"):
        sink.post_batch([CommitStatus(sha, "orders", Outcome.SUCCESS, "s0"),
                         CommitStatus(sha, "billing", Outcome.SUCCESS, "s1")])
    assert git(up.origin, "notes", f"--ref={shard_notes_ref(1)}", "show", sha).strip() == \
        "flink-reconciler/billing: success - s1"
    hook.unlink()
    sink.post_batch([])  # nothing new: the refused lines are still pending, pushed with the next batch
    sink.post_batch([CommitStatus(sha, "search", Outcome.SUCCESS, "s0 again")])
    assert git(up.origin, "notes", f"--ref={shard_notes_ref(0)}", "show", sha).splitlines() == [
        "flink-reconciler/orders: success - s0", "flink-reconciler/search: success - s0 again"]
