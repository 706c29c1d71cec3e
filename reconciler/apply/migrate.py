"""Import the SQLite journal of flink-reconciler 0.1 (`<state_dir>/journal.sqlite`) into per-app records.

Run once, when the state dir still has the old file: every app it knew gets a record (unless the store
already has one: the store wins), then the file is renamed `journal.sqlite.migrated`, never deleted.
Without this, an upgraded reconciler would meet its running apps with no past (FLINK-38479 is the
Flink operator's version of that bug: records that a new version cannot read).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

from reconciler.apply.journal import MAX_TRANSITIONS, Journal, new_doc
from reconciler.errors import JournalError

log = logging.getLogger(__name__)

LEGACY_NAME = "journal.sqlite"


def migrate_sqlite_journal(state_dir: Path, journal: Journal) -> list[str]:
    """Import `<state_dir>/journal.sqlite` if it exists; returns the apps imported."""
    path = Path(state_dir) / LEGACY_NAME
    if not path.is_file():
        return []
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as e:
        raise JournalError(f"{path}: cannot open the old journal to import it: {e}") from e
    conn.row_factory = sqlite3.Row
    try:
        docs = _docs(conn)
    except sqlite3.Error as e:
        raise JournalError(f"{path}: cannot read the old journal to import it: {e}") from e
    finally:
        conn.close()
    existing = journal.store.list()
    imported = []
    for app, doc in sorted(docs.items()):
        if app in existing:
            continue
        journal.store.put(app, doc, expected=None)
        imported.append(app)
    journal.refresh()
    path.rename(path.with_name(LEGACY_NAME + ".migrated"))
    log.info("imported %d app record(s) from %s (renamed to %s.migrated)", len(imported), path, LEGACY_NAME)
    return imported


def _docs(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}

    def doc(app: str) -> dict[str, Any]:
        return docs.setdefault(app, new_doc(app))

    for r in conn.execute("SELECT * FROM apps"):
        d = doc(r["name"])
        d["record"] = {
            "source_file": r["source_file"], "last_applied_revision": r["last_applied_revision"],
            "last_applied_spec": json.loads(r["last_applied_spec"]) if r["last_applied_spec"] else None,
            "last_attempted_revision": r["last_attempted_revision"],
            "last_attempted_spec_hash": r["last_attempted_spec_hash"], "last_outcome": r["last_outcome"],
            "last_message": r["last_message"], "attempts": r["attempts"], "job_id": r["job_id"],
        }
        ns = ((d["record"]["last_applied_spec"] or {}).get("metadata") or {}).get("namespace")
        d["namespace"] = ns
    for r in conn.execute("SELECT * FROM savepoints ORDER BY taken_at, id"):
        doc(r["app"])["savepoints"].append({"path": r["path"], "taken_at": r["taken_at"], "job_id": r["job_id"],
                                            "revision": r["revision"], "kind": r["kind"]})
    for r in conn.execute("SELECT * FROM inflight"):
        doc(r["app"])["inflight"] = {
            "revision": r["revision"], "plan": json.loads(r["plan"]), "stage": r["stage"],
            "step_index": r["step_index"], "phase": r["phase"], "trigger_id": r["trigger_id"],
            "captured_path": r["captured_path"], "captured_kind": r["captured_kind"],
            "submitted_job_id": r["submitted_job_id"], "failed_step": r["failed_step"], "failure": r["failure"],
            "started_at": r["started_at"], "updated_at": r["updated_at"],
        }
    for r in conn.execute("SELECT * FROM transitions ORDER BY id"):
        lines = doc(r["app"])["transitions"]
        lines.append({"at": r["at"], "revision": r["revision"], "action": r["action"], "outcome": r["outcome"],
                      "message": r["message"]})
        del lines[:-MAX_TRANSITIONS]
    return docs
