"""The journal: what the reconciler remembers between runs, in one SQLite file per state directory.

It holds, per app, the Flux-style record (last applied vs. last attempted revision), the in-flight
execution (plan, current step and its phase, and the step's scratch data such as a savepoint trigger
id), the savepoint history, and a transition log for `flink-reconciler history`.

Crash safety is the point, so every write is its own short transaction with `synchronous=FULL`:
the executor writes *before* a step has any effect outside and *after* it completes, and a process
killed at any moment leaves a record it can resume from. One connection is shared by all threads
behind a lock (calls are short; the executor's threads mostly wait on the network). WAL mode lets a
`status` process read while `apply` writes; `lock_exclusive()` keeps two `apply` processes apart.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import sqlite3
import threading
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlparse

from pydantic import ValidationError

from reconciler.clock import Clock
from reconciler.core.observed import AppRecord, Outcome, Records, SavepointRecord
from reconciler.core.plan import AppPlan, spec_hash
from reconciler.errors import JournalError

SCHEMA_VERSION: Final = 1

_SCHEMA = """
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

# Step scratch data a caller may set; anything else is a programming error.
SCRATCH_KEYS: Final = frozenset(
    {"trigger_id", "captured_path", "captured_kind", "submitted_job_id", "failed_step", "failure"}
)


# Records an attempt (revision, spec hash, outcome, counter) and keeps what it does not mention.
_UPSERT_ATTEMPT = (
    "INSERT INTO apps (name, source_file, last_attempted_revision, last_attempted_spec_hash, "
    "last_outcome, last_message, attempts) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET source_file = coalesce(excluded.source_file, source_file), "
    "last_attempted_revision = excluded.last_attempted_revision, "
    "last_attempted_spec_hash = excluded.last_attempted_spec_hash, "
    "last_outcome = excluded.last_outcome, last_message = excluded.last_message, "
    "attempts = excluded.attempts"
)


class Stage(StrEnum):
    FORWARD = "forward"  # the plan's steps
    ROLLBACK = "rollback"  # the plan's rollback steps, after a failure past rollback_after


class StepPhase(StrEnum):
    PENDING = "pending"  # the step at step_index has not started (nothing outside touched for it)
    STARTED = "started"  # it may have had effects outside; resuming re-enters it idempotently
    DONE = "done"  # it completed; resuming continues with the next one


class Keep(Enum):
    KEEP = "keep"


KEEP: Final = Keep.KEEP
"""Sentinel for `finish(job_id=...)`: leave the recorded job id as it is."""


@dataclass(frozen=True)
class InFlight:
    """An execution that started and has not finished: enough to resume it after a crash."""

    app: str
    revision: str
    plan: AppPlan
    stage: Stage
    step_index: int
    phase: StepPhase
    trigger_id: str | None  # savepoint trigger of the current StopWithSavepoint, once Flink returned it
    captured_path: str | None  # the CAPTURED restore point
    captured_kind: str | None  # savepoint | checkpoint
    submitted_job_id: str | None  # the job a StartJob submitted (or was about to submit)
    failed_step: str | None  # during rollback: the forward step that failed
    failure: str | None  # during rollback: why it failed
    started_at: datetime
    updated_at: datetime

    @property
    def steps(self) -> tuple[Any, ...]:
        return self.plan.rollback if self.stage is Stage.ROLLBACK else self.plan.steps


@dataclass(frozen=True)
class Transition:
    """One line of `flink-reconciler history APP`."""

    at: datetime
    revision: str | None
    action: str
    outcome: Outcome | None
    message: str | None


class Journal:
    """Durable per-app records in one SQLite file. Safe to share between threads."""

    def __init__(self, path: Path, clock: Clock) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self._clock = clock
        self._mutex = threading.RLock()
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise JournalError(f"{path}: cannot open the journal: {e}") from e
        self._conn.row_factory = sqlite3.Row
        try:
            self._open()
        except JournalError:
            self._conn.close()
            raise
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise JournalError(f"{path}: not a readable flink-reconciler journal ({e})") from e

    def _open(self) -> None:
        conn = self._conn
        conn.execute("PRAGMA busy_timeout = 30000")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise JournalError(f"{self.path}: cannot switch the journal to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous = FULL")
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise JournalError(f"{self.path}: the journal is corrupt ({check})")
        with self._tx() as c:
            version = int(c.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise JournalError(
                    f"{self.path}: written by a newer flink-reconciler (journal schema {version}, "
                    f"this version knows up to {SCHEMA_VERSION}); upgrade flink-reconciler"
                )
            if version == 0:
                tables = c.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
                if tables:
                    raise JournalError(f"{self.path}: a SQLite file that is not a flink-reconciler journal")
                c.executescript_in_tx(_SCHEMA)
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # ---- plumbing -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _tx(self) -> Iterator[_Cursor]:
        """One short write transaction (BEGIN IMMEDIATE: other processes wait, never interleave)."""
        with self._mutex:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError as e:
                raise JournalError(f"{self.path}: cannot write the journal: {e}") from e
            try:
                yield _Cursor(self._conn, self.path)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.DatabaseError as e:
                raise JournalError(f"{self.path}: cannot write the journal: {e}") from e

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._mutex:
            try:
                return list(self._conn.execute(sql, args).fetchall())
            except sqlite3.DatabaseError as e:
                raise JournalError(f"{self.path}: cannot read the journal: {e}") from e

    def _now(self) -> str:
        return self._clock.now().isoformat()

    def close(self) -> None:
        with self._mutex:
            self._conn.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def lock_exclusive(self) -> Iterator[None]:
        """Hold the state directory for one `apply` process; a second one gets a clear JournalError.

        `flock` on a sibling file: the kernel drops it when the process dies, so a crash never leaves
        a stale lock. The file is never deleted (deleting it would let two holders lock two inodes)."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise JournalError(f"{self.lock_path}: cannot lock: {e}") from e
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                who = f" (pid {holder})" if holder.isdigit() else ""
                raise JournalError(
                    f"{self.lock_path} is held by another flink-reconciler apply{who}; "
                    "wait for it to finish (only one apply may run per state directory)"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # ---- app records ----------------------------------------------------------------------------

    def records(self) -> Records:
        rows = self._read("SELECT * FROM apps ORDER BY name")
        sps = self._savepoints_by_app()
        return Records(apps={r["name"]: self._app_record(r, sps.get(r["name"], ())) for r in rows})

    def record(self, app: str) -> AppRecord | None:
        rows = self._read("SELECT * FROM apps WHERE name = ?", (app,))
        if not rows:
            return None
        return self._app_record(rows[0], self._savepoints_by_app(app).get(app, ()))

    def _savepoints_by_app(self, app: str | None = None) -> dict[str, tuple[SavepointRecord, ...]]:
        sql = "SELECT * FROM savepoints" + (" WHERE app = ?" if app else "") + " ORDER BY taken_at, id"
        out: dict[str, list[SavepointRecord]] = {}
        for r in self._read(sql, (app,) if app else ()):
            out.setdefault(r["app"], []).append(
                SavepointRecord(
                    path=r["path"],
                    taken_at=datetime.fromisoformat(r["taken_at"]),
                    job_id=r["job_id"],
                    revision=r["revision"],
                    kind=r["kind"],
                )
            )
        return {k: tuple(v) for k, v in out.items()}

    def _app_record(self, r: sqlite3.Row, savepoints: tuple[SavepointRecord, ...]) -> AppRecord:
        try:
            spec = json.loads(r["last_applied_spec"]) if r["last_applied_spec"] else None
            return AppRecord(
                name=r["name"],
                source_file=r["source_file"],
                last_applied_revision=r["last_applied_revision"],
                last_applied_spec=spec,
                last_attempted_revision=r["last_attempted_revision"],
                last_attempted_spec_hash=r["last_attempted_spec_hash"],
                last_outcome=Outcome(r["last_outcome"]) if r["last_outcome"] else None,
                last_message=r["last_message"],
                attempts=r["attempts"],
                job_id=r["job_id"],
                savepoints=savepoints,
            )
        except (ValueError, ValidationError) as e:
            raise JournalError(f"{self.path}: unreadable record of app {r['name']!r}: {e}") from e

    def set_source_file(self, app: str, path: str) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT INTO apps (name, source_file) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET source_file = excluded.source_file",
                (app, path),
            )

    def record_attempt(
        self, app: str, revision: str, outcome: Outcome, message: str, *, action: str,
        source_file: str | None = None,
    ) -> None:
        """Record an attempt that runs no step (a blocked or invalid app).

        The attempted spec hash is what the planner uses to refuse re-running a failed spec: it is
        kept when the app had already FAILED (the refusal stays in force) and cleared otherwise (a
        "blocked, needs a human" answer must not turn into "this spec failed" once the human acted).
        Idempotent per (revision, outcome, message): the daemon meets the same blocked app every
        tick, and neither the attempt counter nor the history should grow with each one."""
        with self._tx() as c:
            row = c.one("SELECT * FROM apps WHERE name = ?", (app,))
            if (
                row is not None
                and row["last_attempted_revision"] == revision
                and row["last_outcome"] == outcome.value
                and row["last_message"] == message
            ):
                return
            keep_hash = row is not None and row["last_outcome"] == Outcome.FAILURE.value
            shash = row["last_attempted_spec_hash"] if row is not None and keep_hash else None
            c.execute(_UPSERT_ATTEMPT,
                      (app, source_file, revision, shash, outcome.value, message, self._next_attempt(row, revision)))
            self._transition(c, app, revision, action, outcome=outcome, message=message)

    @staticmethod
    def _next_attempt(row: sqlite3.Row | None, revision: str) -> int:
        if row is not None and row["last_attempted_revision"] == revision:
            return int(row["attempts"]) + 1
        return 1

    def forget(self, app: str) -> None:
        """Stop remembering the app: its record, in-flight execution and savepoint list go (the
        savepoint files stay on disk); the transition log is kept for `history`."""
        with self._tx() as c:
            c.execute("DELETE FROM inflight WHERE app = ?", (app,))
            c.execute("DELETE FROM savepoints WHERE app = ?", (app,))
            c.execute("DELETE FROM apps WHERE name = ?", (app,))
            self._transition(c, app, None, "forget", outcome=None,
                             message="no longer managed; savepoint files left in place")

    # ---- in-flight execution --------------------------------------------------------------------

    def begin(self, app: str, revision: str, app_plan: AppPlan) -> None:
        """Start an execution: record the attempt and the plan, before any step touches anything."""
        now = self._now()
        with self._tx() as c:
            if c.one("SELECT 1 FROM inflight WHERE app = ?", (app,)) is not None:
                raise JournalError(f"{self.path}: app {app!r} has an unfinished execution; resume it first")
            row = c.one("SELECT * FROM apps WHERE name = ?", (app,))
            attempts = self._next_attempt(row, revision)
            shash = spec_hash(app_plan.desired) if app_plan.desired is not None else None
            c.execute(_UPSERT_ATTEMPT,
                      (app, app_plan.source_file, revision, shash, Outcome.PENDING.value, app_plan.reason, attempts))
            c.execute(
                "INSERT INTO inflight (app, revision, plan, stage, step_index, phase, started_at, updated_at) "
                "VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
                (app, revision, app_plan.model_dump_json(), Stage.FORWARD.value, StepPhase.PENDING.value, now, now),
            )
            self._transition(c, app, revision, app_plan.action.value, outcome=Outcome.PENDING,
                             message=app_plan.reason)

    def inflight(self, app: str) -> InFlight | None:
        rows = self._read("SELECT * FROM inflight WHERE app = ?", (app,))
        return self._inflight(rows[0]) if rows else None

    def all_inflight(self) -> dict[str, InFlight]:
        return {r["app"]: self._inflight(r) for r in self._read("SELECT * FROM inflight ORDER BY app")}

    def _inflight(self, r: sqlite3.Row) -> InFlight:
        try:
            return InFlight(
                app=r["app"],
                revision=r["revision"],
                plan=AppPlan.model_validate_json(r["plan"]),
                stage=Stage(r["stage"]),
                step_index=int(r["step_index"]),
                phase=StepPhase(r["phase"]),
                trigger_id=r["trigger_id"],
                captured_path=r["captured_path"],
                captured_kind=r["captured_kind"],
                submitted_job_id=r["submitted_job_id"],
                failed_step=r["failed_step"],
                failure=r["failure"],
                started_at=datetime.fromisoformat(r["started_at"]),
                updated_at=datetime.fromisoformat(r["updated_at"]),
            )
        except (ValueError, ValidationError) as e:
            raise JournalError(f"{self.path}: unreadable in-flight record of app {r['app']!r}: {e}") from e

    def step_started(self, app: str, index: int, **scratch: str | None) -> None:
        """Mark step `index` of the current stage as started, before it has any effect outside.

        Moving to another step clears the savepoint trigger id: a trigger belongs to one step."""
        self._set_step(app, index, StepPhase.STARTED, scratch)

    def step_done(self, app: str, index: int, **scratch: str | None) -> None:
        """Mark step `index` done (with what it produced), so a resume continues after it."""
        self._set_step(app, index, StepPhase.DONE, scratch)

    def set_scratch(self, app: str, **scratch: str | None) -> None:
        """Record what a running step learned (e.g. the trigger id the moment Flink returns it)."""
        cols = self._scratch_sql(scratch)
        if not cols:
            return
        with self._tx() as c:
            self._require_inflight(c, app)
            c.execute(
                f"UPDATE inflight SET {cols}, updated_at = ? WHERE app = ?",
                (*scratch.values(), self._now(), app),
            )

    def start_rollback(self, app: str, *, failed_step: str, failure: str) -> None:
        """Switch the execution to the plan's rollback steps, remembering why."""
        with self._tx() as c:
            self._require_inflight(c, app)
            c.execute(
                "UPDATE inflight SET stage = ?, step_index = 0, phase = ?, trigger_id = NULL, failed_step = ?, "
                "failure = ?, updated_at = ? WHERE app = ?",
                (Stage.ROLLBACK.value, StepPhase.PENDING.value, failed_step, failure, self._now(), app),
            )
            rev = c.one("SELECT revision FROM inflight WHERE app = ?", (app,))
            self._transition(c, app, rev["revision"] if rev else None, "rollback", outcome=Outcome.PENDING,
                             message=f"{failed_step} failed: {failure}")

    def _set_step(self, app: str, index: int, phase: StepPhase, scratch: dict[str, str | None]) -> None:
        cols = self._scratch_sql(scratch)
        with self._tx() as c:
            cur = c.one("SELECT step_index, phase FROM inflight WHERE app = ?", (app,))
            if cur is None:
                return  # ForgetApp removed the execution along with the app: nothing left to mark
            clear = ", trigger_id = NULL" if cur["step_index"] != index and "trigger_id" not in scratch else ""
            c.execute(
                f"UPDATE inflight SET step_index = ?, phase = ?{clear}{', ' + cols if cols else ''}, "
                "updated_at = ? WHERE app = ?",
                (index, phase.value, *scratch.values(), self._now(), app),
            )

    @staticmethod
    def _scratch_sql(scratch: dict[str, str | None]) -> str:
        unknown = set(scratch) - SCRATCH_KEYS
        if unknown:
            raise ValueError(f"unknown scratch keys {sorted(unknown)}; known: {sorted(SCRATCH_KEYS)}")
        return ", ".join(f"{k} = ?" for k in scratch)

    def _require_inflight(self, c: _Cursor, app: str) -> None:
        if c.one("SELECT 1 FROM inflight WHERE app = ?", (app,)) is None:
            raise JournalError(f"{self.path}: app {app!r} has no execution in flight")

    def finish(
        self,
        app: str,
        outcome: Outcome,
        message: str,
        *,
        applied_spec: dict[str, Any] | None,
        job_id: str | Keep | None = KEEP,
    ) -> None:
        """End the execution. Flux-style: the applied revision/spec move only on success (and only
        when `applied_spec` is given); the attempted revision was recorded by `begin`.

        An app forgotten by its own plan (ForgetApp) gets a history line and no new record."""
        with self._tx() as c:
            inflight = c.one("SELECT revision FROM inflight WHERE app = ?", (app,))
            exists = c.one("SELECT last_attempted_revision FROM apps WHERE name = ?", (app,))
            revision = inflight["revision"] if inflight else exists["last_attempted_revision"] if exists else None
            c.execute("DELETE FROM inflight WHERE app = ?", (app,))
            if exists is not None:
                sets = ["last_outcome = ?", "last_message = ?"]
                args: list[Any] = [outcome.value, message]
                if outcome is Outcome.SUCCESS and applied_spec is not None:
                    sets += ["last_applied_revision = ?", "last_applied_spec = ?"]
                    args += [revision, json.dumps(applied_spec, sort_keys=True)]
                if not isinstance(job_id, Keep):
                    sets.append("job_id = ?")
                    args.append(job_id)
                c.execute(f"UPDATE apps SET {', '.join(sets)} WHERE name = ?", (*args, app))
            self._transition(c, app, revision, "finish", outcome=outcome, message=message)

    def mark_deleted(self, app: str) -> None:
        """The app's cluster is gone because Git said so: nothing is applied any more, but the record
        and its savepoint history stay, so re-adding the spec restores from the final savepoint."""
        with self._tx() as c:
            c.execute("UPDATE apps SET last_applied_spec = NULL, last_applied_revision = NULL, job_id = NULL "
                      "WHERE name = ?", (app,))
            self._transition(c, app, None, "deleted", outcome=None,
                             message="cluster deleted; savepoint history kept for a re-create")

    def record_applied(self, app: str, revision: str, spec: dict[str, Any]) -> None:
        """A change that needs no step (metadata only) is applied by recording it."""
        with self._tx() as c:
            c.execute("UPDATE apps SET last_applied_revision = ?, last_applied_spec = ? WHERE name = ?",
                      (revision, json.dumps(spec, sort_keys=True), app))

    # ---- savepoints -----------------------------------------------------------------------------

    def add_savepoint(
        self,
        app: str,
        path: str,
        *,
        job_id: str | None,
        revision: str | None,
        kind: str = "savepoint",
        taken_at: datetime | None = None,
    ) -> SavepointRecord:
        rec = SavepointRecord(
            path=path, taken_at=taken_at or self._clock.now(), job_id=job_id, revision=revision, kind=kind
        )
        with self._tx() as c:
            c.execute("INSERT INTO apps (name) VALUES (?) ON CONFLICT (name) DO NOTHING", (app,))
            c.execute(
                "INSERT INTO savepoints (app, path, taken_at, job_id, revision, kind) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (app, path) DO NOTHING",
                (app, path, rec.taken_at.isoformat(), job_id, revision, kind),
            )
            self._transition(c, app, revision, kind, outcome=None, message=path)
        return rec

    def prune_savepoints(self, app: str, retain: int, *, protect: Collection[str] = ()) -> list[SavepointRecord]:
        """Keep the newest `retain` savepoints; forget the others and delete their directories.

        Never pruned: the newest one, the in-flight CAPTURED restore point and `protect`ed paths (what
        the app would restore from). Only savepoint directories on the local filesystem (plain
        absolute paths or file:// URIs) named `savepoint-*` are deleted on disk; records of other
        schemes (s3://, hdfs://, ...) and adopted checkpoints are only forgotten: their storage has
        its own lifecycle. The records go first, then the files, so a crash in between can leak a
        directory but never leave a record pointing at a deleted savepoint."""
        retain = max(1, retain)
        with self._tx() as c:
            rows = c.all("SELECT * FROM savepoints WHERE app = ? ORDER BY taken_at DESC, id DESC", (app,))
            captured = c.one("SELECT captured_path FROM inflight WHERE app = ?", (app,))
            keep = set(protect)
            if captured is not None and captured["captured_path"]:
                keep.add(captured["captured_path"])
            doomed = [r for r in rows[retain:] if r["path"] not in keep]
            for r in doomed:
                c.execute("DELETE FROM savepoints WHERE id = ?", (r["id"],))
                self._transition(c, app, r["revision"], "prune", outcome=None, message=r["path"])
        pruned = [
            SavepointRecord(
                path=r["path"], taken_at=datetime.fromisoformat(r["taken_at"]), job_id=r["job_id"],
                revision=r["revision"], kind=r["kind"],
            )
            for r in doomed
        ]
        for sp in pruned:
            local = local_savepoint_dir(sp.path) if sp.kind == "savepoint" else None
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)
        return pruned

    # ---- history --------------------------------------------------------------------------------

    def history(self, app: str) -> list[Transition]:
        return [
            Transition(
                at=datetime.fromisoformat(r["at"]),
                revision=r["revision"],
                action=r["action"],
                outcome=Outcome(r["outcome"]) if r["outcome"] else None,
                message=r["message"],
            )
            for r in self._read("SELECT * FROM transitions WHERE app = ? ORDER BY id", (app,))
        ]

    def note(self, app: str, action: str, message: str, *, revision: str | None = None,
             outcome: Outcome | None = None) -> None:
        """Add a line to the app's history (e.g. a rollback step, a failed step)."""
        with self._tx() as c:
            self._transition(c, app, revision, action, outcome=outcome, message=message)

    def _transition(
        self, c: _Cursor, app: str, revision: str | None, action: str, *, outcome: Outcome | None,
        message: str | None,
    ) -> None:
        c.execute(
            "INSERT INTO transitions (app, at, revision, action, outcome, message) VALUES (?, ?, ?, ?, ?, ?)",
            (app, self._now(), revision, action, outcome.value if outcome else None, message),
        )


def local_savepoint_dir(location: str) -> Path | None:
    """The local directory of a savepoint location we may delete, or None (remote or unexpected).

    Flink reports `file:/x`, `file:///x` or a plain `/x`; only absolute paths whose last component
    is Flink's `savepoint-*` name qualify, so a bad record can never delete anything else."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            return None
        raw = unquote(parsed.path)
    elif parsed.scheme == "":
        raw = location
    else:
        return None
    path = Path(raw)
    if not path.is_absolute() or not path.name.startswith("savepoint-") or ".." in path.parts:
        return None
    return path


class _Cursor:
    """The handful of helpers used inside a transaction, with sqlite errors turned into JournalError."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self._path = path

    def execute(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, args)
        except sqlite3.DatabaseError as e:
            raise JournalError(f"{self._path}: journal write failed: {e}") from e

    def all(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        return list(self.execute(sql, args).fetchall())

    def one(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        rows = self.all(sql, args)
        return rows[0] if rows else None

    def executescript_in_tx(self, script: str) -> None:
        # executescript() would COMMIT first; run statement by statement inside our transaction.
        for stmt in script.split(";"):
            if stmt.strip():
                self.execute(stmt)
