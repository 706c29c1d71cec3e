"""One app's unreadable record stops that app only: real Git, real record files, the pass in dry run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.plan import Action
from reconciler.daemon.metrics import Metrics
from reconciler.report.gitnotes import GitNotesSink
from reconciler.report.reporter import Reporter
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.load import load_files
from tests.gitutil import Repo, git, spec


def _reconciler(repo: Repo, state: Path, metrics: Metrics | None = None) -> Reconciler:
    clock = SystemClock()
    source = GitSource(str(repo.origin), state / "git")
    return Reconciler(source=source, runtime=None, journal=Journal(state / "journal", clock), clock=clock,
                      subdir="apps", reporter=Reporter([GitNotesSink(source)], clock), metrics=metrics)


def _three_apps(tmp_path: Path) -> tuple[Repo, str, Path]:
    """Apps a, b (new) and victim (on record, applied at the first commit, then changed in Git)."""
    repo = Repo(tmp_path)
    for name in ("a", "b", "victim"):
        repo.write(f"apps/{name}.yaml", spec(name))
    first = repo.commit("three apps")
    state = tmp_path / "state"
    applied = load_files({"apps/victim.yaml": spec("victim").encode()}).apps["victim"].app.canonical()
    Journal(state / "journal", SystemClock()).record_adopted("victim", first, applied, source_file="apps/victim.yaml")
    repo.write("apps/victim.yaml", spec("victim", parallelism=2))
    head = repo.commit("victim: parallelism 2")
    return repo, head, state / "records" / "victim.json"


def _note(repo: Repo, rev: str) -> str:
    git(repo.work, "fetch", "-q", "origin", "refs/notes/*:refs/notes/*")
    return git(repo.work, "notes", "--ref=flink-reconciler", "show", rev)


@pytest.mark.parametrize("damage", ["truncated", "newer-version", "not-a-record"])
def test_one_unreadable_record_blocks_its_app_and_the_pass_goes_on_for_the_others(tmp_path: Path, damage: str) -> None:
    repo, head, victim = _three_apps(tmp_path)
    raw = victim.read_bytes()
    if damage == "truncated":  # what a full disk or an interrupted copy leaves
        victim.write_bytes(raw[: len(raw) // 2])
    elif damage == "newer-version":  # written by a newer flink-reconciler during a rollout
        victim.write_text(json.dumps({**json.loads(raw), "version": 99}))
    else:
        victim.write_text('{"kind": "SomethingElse"}')
    before = victim.read_bytes()
    metrics = Metrics()
    rec = _reconciler(repo, tmp_path / "state", metrics)

    for reason in ("startup", "poll", "drift"):  # every pass succeeds, and keeps the app waiting
        rec.sync(full=reason != "poll", reason=reason)
    assert rec.readiness() == (True, f"ok: {repo.origin} at {head[:12]}")
    result = rec.apply(head)
    assert {a.app: a.action for a in result.plan.apps} == {"a": Action.CREATE, "b": Action.CREATE,
                                                          "victim": Action.BLOCKED}
    blocked = result.plan.app("victim")
    assert not blocked.steps and str(victim.parent) in blocked.reason
    if damage == "newer-version":
        assert "written by a newer flink-reconciler (record version 99" in blocked.reason
        assert "upgrade" in blocked.reason and "record rebuild" not in blocked.reason
    else:
        assert "`flink-reconciler record rebuild victim`" in blocked.reason
    assert victim.read_bytes() == before  # never written over, byte for byte
    assert not (victim.parent / "a.json").exists()  # dry run: nothing executed, nothing recorded

    assert rec.reporter is not None and rec.reporter.flush(10)
    note = _note(repo, head)
    assert "flink-reconciler/a: pending - create:" in note and "flink-reconciler/b: pending - create:" in note
    assert "flink-reconciler/victim: failure - blocked: " in note

    body = metrics.exposition()[0].decode()
    for state, n in (("ok", 2), ("blocked", 1), ("error", 0), ("failure", 0)):
        assert f'flink_reconciler_apps{{state="{state}"}} {n}.0' in body
    page = rec.status_text()
    assert "apps: 3 after the last pass (2 ok, 1 blocked, 0 error, 0 failure)" in page
    assert "records that cannot be read: 1 (victim)" in page
    assert "  blocked  victim: " in page


def test_a_repaired_record_lets_the_app_be_planned_again(tmp_path: Path) -> None:
    repo, head, victim = _three_apps(tmp_path)
    good = victim.read_bytes()
    victim.write_bytes(good[:10])
    rec = _reconciler(repo, tmp_path / "state")
    rec.sync(full=True, reason="startup")
    assert rec.apply(head).plan.app("victim").action is Action.BLOCKED
    victim.write_bytes(good)  # restored from a copy
    after = rec.apply(head).plan.app("victim")
    # planned from its record again (in a dry run its cluster is gone: a repair, which waits for a restore point)
    assert after.previous is not None and "record rebuild" not in after.reason and "cluster is gone" in after.reason
