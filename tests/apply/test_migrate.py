"""The SQLite journal of flink-reconciler 0.1 is imported into per-app records, once, losing nothing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from reconciler.apply.journal import Journal, Stage, StepPhase
from reconciler.apply.migrate import migrate_sqlite_journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from tests.apply.test_journal import REV1, plan_for

# The schema 0.1 wrote (reconciler/apply/journal.py at 0.1), as the user's file has it.
LEGACY_SCHEMA = """
CREATE TABLE apps (
    name TEXT PRIMARY KEY,
    source_file TEXT,
    last_applied_revision TEXT,
    last_applied_spec TEXT,
    last_attempted_revision TEXT,
    last_attempted_spec_hash TEXT,
    last_outcome TEXT,
    last_message TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    job_id TEXT
);
CREATE TABLE inflight (
    app TEXT PRIMARY KEY,
    revision TEXT NOT NULL,
    plan TEXT NOT NULL,
    stage TEXT NOT NULL,
    step_index INTEGER NOT NULL,
    phase TEXT NOT NULL,
    trigger_id TEXT,
    captured_path TEXT,
    captured_kind TEXT,
    submitted_job_id TEXT,
    failed_step TEXT,
    failure TEXT,
    started_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE savepoints (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    app TEXT NOT NULL,
    path TEXT NOT NULL,
    taken_at TEXT NOT NULL,
    job_id TEXT,
    revision TEXT,
    kind TEXT NOT NULL,
    UNIQUE (app, path)
);
CREATE INDEX savepoints_app ON savepoints (app, taken_at);
CREATE TABLE transitions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    app TEXT NOT NULL,
    at TEXT NOT NULL,
    revision TEXT,
    action TEXT NOT NULL,
    outcome TEXT,
    message TEXT
);
CREATE INDEX transitions_app ON transitions (app, id);
"""


def _legacy(path: Path) -> None:
    p = plan_for()
    with sqlite3.connect(path) as conn:
        for stmt in LEGACY_SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.execute("PRAGMA user_version = 1")
        conn.execute("INSERT INTO apps (name, source_file, last_applied_revision, last_applied_spec, "
                     "last_attempted_revision, last_outcome, last_message, attempts, job_id) "
                     "VALUES ('orders', 'apps/orders.yaml', ?, ?, ?, 'pending', 'upgrading', 1, ?)",
                     (REV1, json.dumps(p.previous), REV1, "o" * 32))
        conn.execute("INSERT INTO savepoints (app, path, taken_at, job_id, revision, kind) VALUES "
                     "('orders', 'file:/sp/savepoint-1', '2026-11-30T10:00:00+00:00', ?, ?, 'savepoint')",
                     ("o" * 32, REV1))
        conn.execute("INSERT INTO inflight (app, revision, plan, stage, step_index, phase, trigger_id, "
                     "captured_path, captured_kind, started_at, updated_at) VALUES ('orders', ?, ?, 'forward', 0, "
                     "'done', NULL, 'file:/sp/savepoint-1', 'savepoint', '2026-11-30T10:00:00+00:00', "
                     "'2026-11-30T10:00:01+00:00')", (REV1, p.model_dump_json()))
        conn.execute("INSERT INTO transitions (app, at, revision, action, outcome, message) VALUES "
                     "('orders', '2026-11-30T10:00:00+00:00', ?, 'upgrade', 'pending', 'upgrading')", (REV1,))


def test_the_old_journal_is_imported_once_with_its_in_flight_upgrade(tmp_path: Path) -> None:
    _legacy(tmp_path / "journal.sqlite")
    journal = Journal(tmp_path / "journal", FakeClock())
    assert migrate_sqlite_journal(tmp_path, journal) == ["orders"]
    assert not (tmp_path / "journal.sqlite").exists() and (tmp_path / "journal.sqlite.migrated").is_file()
    rec = journal.record("orders")
    assert rec is not None
    assert (rec.last_applied_revision, rec.last_outcome, rec.job_id, rec.source_file) == (
        REV1, Outcome.PENDING, "o" * 32, "apps/orders.yaml")
    assert [s.path for s in rec.savepoints] == ["file:/sp/savepoint-1"]
    inf = journal.inflight("orders")
    assert inf is not None and (inf.stage, inf.step_index, inf.phase, inf.captured_path) == (
        Stage.FORWARD, 0, StepPhase.DONE, "file:/sp/savepoint-1")
    assert inf.plan == plan_for()
    assert [t.action for t in journal.history("orders")] == ["upgrade"]
    assert migrate_sqlite_journal(tmp_path, journal) == []  # once


def test_records_already_in_the_store_win(tmp_path: Path) -> None:
    _legacy(tmp_path / "journal.sqlite")
    journal = Journal(tmp_path / "journal", FakeClock())
    journal.note("orders", "note", "written by the new version")
    assert migrate_sqlite_journal(tmp_path, journal) == []
    assert [t.message for t in journal.history("orders")] == ["written by the new version"]
