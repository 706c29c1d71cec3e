"""The journal: what the reconciler remembers about each app, kept in one record per app.

Crash safety is the point: the executor writes *before* a step has any effect outside and *after* it
completed, and every write is a compare-and-set of the whole record, so a process killed at any moment
leaves a record it can resume from, and two writers never silently overwrite each other.

`Journal` is the one object callers hold; its parts, one concern per module, each a class over `History`
over `RecordAccess` (import-linter keeps the layers, the document pure, and the executor out):
  document.py    the record's document: schema, limits, and how each part is read into a value (pure)
  access.py      the store, the read cache, broken records, the compare-and-set write; the `apply` lock
  history.py     the transition log, the lineage, the savepoint list
  inflight.py    the in-flight step log (the write-ahead part): `begin`, `step_started`/`step_done`, `finish`
  app_record.py  the record outside an execution: attempts, adoption, deletion, health, the autoscaler's window
  retention.py   which savepoints are kept, and the disposal of the others
"""

from __future__ import annotations

from reconciler.apply.journal.app_record import AppRecords
from reconciler.apply.journal.document import (
    KEEP,
    MAX_TRANSITIONS,
    NEWER,
    SCHEMA_VERSION,
    InFlight,
    Keep,
    Lineage,
    Stage,
    StepPhase,
    Transition,
    broken_reason,
    new_doc,
)
from reconciler.apply.journal.inflight import InFlightLog
from reconciler.apply.journal.retention import Retention, SavepointDisposer, local_savepoint_dir

__all__ = [
    "KEEP",
    "MAX_TRANSITIONS",
    "NEWER",
    "SCHEMA_VERSION",
    "InFlight",
    "Journal",
    "Keep",
    "Lineage",
    "SavepointDisposer",
    "Stage",
    "StepPhase",
    "Transition",
    "broken_reason",
    "local_savepoint_dir",
    "new_doc",
]


class Journal(InFlightLog, Retention, AppRecords):
    """Per-app records in a `RecordStore` (default: `<state_dir>/records/`). Safe to share between threads.

    `path` names the journal in its state directory: the `apply` lock (`<path>.lock`) sits beside it."""
