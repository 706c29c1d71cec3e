"""The Git source at fleet scale: a poll that finds nothing new runs one git process, status notes are
written in time linear in their number, and writing them never holds up a fetch."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from reconciler.source.git import GitSource
from reconciler.source.git_text import merge_lines
from tests.source.gitrepo import Upstream, git


@pytest.fixture
def up(tmp_path: Path) -> Upstream:
    u = Upstream(tmp_path / "up")
    u.commit({"apps/orders.yaml": "name: orders\n"}, "first")
    u.push()
    return u


@pytest.fixture
def git_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `git` first on PATH that logs its arguments, then runs the real git."""
    real = next(Path(d) / "git" for d in os.environ["PATH"].split(os.pathsep) if (Path(d) / "git").is_file())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "git-calls.log"
    wrapper = bin_dir / "git"
    wrapper.write_text(f'#!/bin/sh\nfor a in "$@"; do case "$a" in --git-dir|/*) ;; *) printf "%s " "$a";; esac; done'
                       f' >> {log}\necho >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log: Path) -> list[str]:
    return [line.strip() for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def test_a_poll_that_finds_nothing_new_runs_one_git_process(up: Upstream, tmp_path: Path, git_calls: Path) -> None:
    src = GitSource(str(up.origin), tmp_path / "cache")
    first = src.fetch()
    git_calls.write_text("")
    again = src.fetch()
    assert again.new_sha == first.new_sha and not again.changed
    assert calls(git_calls) == ["ls-remote origin"]

    # A new commit, a new tag, a new branch: each is fetched (and only then the fetch runs).
    sha = up.commit({"apps/orders.yaml": "name: orders\nparallelism: 2\n"})
    up.push()
    git_calls.write_text("")
    moved = src.fetch()
    assert moved.changed and moved.new_sha == sha
    assert calls(git_calls)[0] == "ls-remote origin" and any(c.startswith("fetch ") for c in calls(git_calls))
    git(up.work, "tag", "v1")
    git(up.work, "push", "-q", "origin", "v1")
    src.fetch()
    assert src.resolve("v1") == sha
    git_calls.write_text("")
    src.fetch()
    assert calls(git_calls) == ["ls-remote origin"]


def test_a_force_push_back_to_an_older_commit_is_still_seen(up: Upstream, tmp_path: Path) -> None:
    src = GitSource(str(up.origin), tmp_path / "cache")
    first = src.fetch().new_sha
    second = up.commit({"apps/orders.yaml": "name: orders\nparallelism: 2\n"})
    up.push()
    assert src.fetch().new_sha == second
    git(up.work, "reset", "-q", "--hard", first)
    up.push(force=True)
    back = src.fetch()
    assert back.new_sha == first and back.changed


def test_merge_lines_replaces_in_place_appends_and_keeps_other_keys() -> None:
    lines = ["flink-reconciler/a: pending - x", "flink-reconciler/ab: success - y",
             'flink-reconciler-lineage/a: {"at": "t"}', "flink-reconciler/a: stale duplicate"]
    merged = merge_lines(lines, [("flink-reconciler/a", "flink-reconciler/a: success - z"),
                                  ("flink-reconciler/c", "flink-reconciler/c: error - w"),
                                  ("flink-reconciler/a", "flink-reconciler/a: failure - last wins")])
    assert merged == ["flink-reconciler/a: failure - last wins", "flink-reconciler/ab: success - y",
                      'flink-reconciler-lineage/a: {"at": "t"}', "flink-reconciler/c: error - w"]
    assert merge_lines(lines, []) == lines


def test_twenty_thousand_statuses_are_written_in_linear_time(up: Upstream, tmp_path: Path) -> None:
    """Merging line by line into the whole note took 35 s at 20,000 apps (quadratic); now well under one."""
    src = GitSource(str(up.origin), tmp_path / "cache")
    sha = src.fetch().new_sha
    first = {f"flink-reconciler/app-{i:05d}": f"flink-reconciler/app-{i:05d}: pending - create" for i in range(20_000)}
    t0 = time.monotonic()
    src.add_notes(sha, first)
    again = {k: v.replace("pending - create", "success - created") for k, v in first.items()}
    src.add_notes(sha, again)  # every line replaced in a note that already holds them all
    took = time.monotonic() - t0
    note = src.read_note(sha) or ""
    assert note.splitlines() == list(again.values())
    assert took < 5.0, f"writing 2 x 20,000 note lines took {took:.1f} s"


def test_writing_notes_never_holds_up_a_fetch(up: Upstream, tmp_path: Path) -> None:
    """A full pass's notes (written and pushed by the reporter's thread) must not stop the next poll."""
    src = GitSource(str(up.origin), tmp_path / "cache")
    src.fetch()
    sha = up.commit({"apps/orders.yaml": "name: orders\nparallelism: 3\n"})
    up.push()
    fetched: list[str] = []
    with src._notes_lock:  # as while a push of notes is in flight
        t = threading.Thread(target=lambda: fetched.append(src.fetch().new_sha))
        t.start()
        t.join(30)
        assert fetched == [sha], "fetch waited for the notes lock"
