"""Lineage on the commit: statuses name the state a job restored and the savepoints it produced, git notes
carry it as a structured line, and a reconciler whose records are gone recovers savepoints from it.

Real Git (a bare origin), real notes pushed and fetched, the real pass in dry-run mode (no runtime)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import AppRecord, Outcome, Records, SavepointRecord
from reconciler.core.plan import Action, RestoreKind, StartJob
from reconciler.report.gitnotes import GitNotesSink, shard_notes_ref
from reconciler.report.status import CommitStatus
from reconciler.service.reconcile import Reconciler, lineage_from_notes, with_recovered
from reconciler.source.git import NOTES_REF, GitSource
from tests.gitutil import Repo, git, spec

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SP = "file:/data/savepoints/a/savepoint-1a2b3c-0123456789ab"


def _status(rev: str, **kw: object) -> CommitStatus:
    return CommitStatus(revision=rev, app="a", state=Outcome.SUCCESS, description="suspend applied", at=T0,
                        **kw)  # type: ignore[arg-type]


def test_a_note_carries_a_structured_lineage_line_beside_the_status(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("apps/a.yaml", spec("a"))
    rev = repo.commit("a")
    source = GitSource(str(repo.origin), tmp_path / "state" / "git")
    source.fetch()
    GitNotesSink(source).post_batch([_status(rev, restored_from="", savepoints=(SP,))])
    git(repo.work, "fetch", "-q", "origin", f"{NOTES_REF}:{NOTES_REF}")  # what any clone sees
    note = git(repo.work, "notes", "--ref", NOTES_REF, "show", rev)
    status_line, lineage_line = note.splitlines()
    assert status_line == "flink-reconciler/a: success - suspend applied"
    key, _, body = lineage_line.partition(": ")
    assert key == "flink-reconciler-lineage/a"
    assert json.loads(body) == {"at": T0.isoformat(), "restored_from": "", "savepoints": [SP], "state": "success"}
    # A status without lineage (a blocked app, a no-op) replaces the status line and keeps the lineage.
    GitNotesSink(source).post_batch([CommitStatus(revision=rev, app="a", state=Outcome.FAILURE, description="x")])
    git(repo.work, "fetch", "-q", "-f", "origin", f"{NOTES_REF}:{NOTES_REF}")
    assert git(repo.work, "notes", "--ref", NOTES_REF, "show", rev).splitlines() == [
        "flink-reconciler/a: failure - x", lineage_line]


def test_forge_descriptions_name_the_lineage() -> None:
    assert _status("0" * 40, restored_from=SP, savepoints=("s3://b/sp-2",)).lineage_text() == (
        f"restored from {SP}; savepoint s3://b/sp-2")
    assert _status("0" * 40, restored_from="").lineage_text() == "restored from empty state"
    assert not _status("0" * 40).has_lineage


def test_lineage_from_notes_ignores_other_and_unreadable_lines() -> None:
    notes = {
        "1" * 40: "flink-reconciler/a: success - x\n"
                  f'flink-reconciler-lineage/a: {{"at": "{T0.isoformat()}", "savepoints": ["{SP}"]}}\n',
        "2" * 40: "flink-reconciler-lineage/b: not json\nflink-reconciler-lineage/c: {\"savepoints\": [\"x\"]}\n",
    }
    got = lineage_from_notes(notes)
    assert got == {"a": (SavepointRecord(path=SP, taken_at=T0, revision="1" * 40),)}


def test_recovered_savepoints_fill_only_records_that_know_none() -> None:
    sp = SavepointRecord(path=SP, taken_at=T0)
    known = SavepointRecord(path="file:/x/savepoint-known", taken_at=T0)
    records = Records(apps={"kept": AppRecord(name="kept", savepoints=(known,)), "empty": AppRecord(name="empty")})
    got = with_recovered(records, {"kept": (sp,), "empty": (sp,), "gone": (sp,)})
    assert got.apps["kept"].savepoints == (known,)  # the record knows better (retention, later savepoints)
    assert got.apps["empty"].savepoints == (sp,)
    assert got.apps["gone"] == AppRecord(name="gone", savepoints=(sp,))
    assert with_recovered(records, {}) is records


@pytest.mark.parametrize("writer", ["unsharded", "a shard"])
def test_a_reconciler_without_records_restores_from_the_savepoint_the_notes_name(tmp_path: Path, writer: str) -> None:
    """A new pod, a lost state dir: the records are gone, the notes on origin are not. Written by a shard
    (its own notes ref), they are found by a reconciler sharded otherwise or not at all."""
    repo = Repo(tmp_path)
    repo.write("apps/a.yaml", spec("a", extra="    state: suspended\n"))
    suspended = repo.commit("suspend a")
    old = GitSource(str(repo.origin), tmp_path / "old-state" / "git")
    old.fetch()
    sink = GitNotesSink(old, ref_for=None if writer == "unsharded" else lambda app: shard_notes_ref(3))
    sink.post_batch([_status(suspended, savepoints=(SP,))])  # what the suspend reported

    repo.write("apps/a.yaml", spec("a"))
    resumed = repo.commit("resume a")
    clock = FakeClock(start=T0)
    state = tmp_path / "new-state"  # empty: no records, no Git cache
    source = GitSource(str(repo.origin), state / "git")
    rec = Reconciler(source=source, runtime=None, journal=Journal(state / "journal", clock), clock=clock,
                     subdir="apps")
    source.fetch()
    assert rec.journal.records().apps == {}
    ap = rec.plan(resumed).app("a")
    assert ap.action is Action.CREATE, ap.reason
    start = next(s for s in ap.steps if isinstance(s, StartJob))
    assert start.restore.kind is RestoreKind.PATH and start.restore.path == SP, ap.reason
    assert not any("WITHOUT STATE" in r for r in ap.risks)
