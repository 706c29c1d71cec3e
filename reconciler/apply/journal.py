"""The journal: what the reconciler remembers about each app, kept in one record per app.

A record holds the Flux-style pair (last applied vs. last attempted revision), the in-flight execution
(plan, current step and its phase, the step's scratch data such as a savepoint trigger id or the
captured restore point), the savepoint history, the lineage (which state each revision's job started
from and which savepoints it produced) and a capped transition log for `flink-reconciler history`.

Records live with the runtime, not on the reconciler's disk (`reconciler.live.records`: files beside
the local clusters; ConfigMaps in the app's namespace on Kubernetes), so a new pod or a standby that
takes over finds every app's past and every half-done transition. The journal keeps a read cache of
them, refreshed by `records()` (once per pass: one LIST per namespace on Kubernetes).

Crash safety is the point: the executor writes *before* a step has any effect outside and *after* it
completed, and every write is a compare-and-set of the whole record, so a process killed at any moment
leaves a record it can resume from, and two writers never silently overwrite each other.

Over 600 lines for one concern: the record's document and every transition of it (one compare-and-set
write each), which must be reviewed together for crash safety.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import fcntl
import logging
import os
import shutil
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Final, Protocol, Self, TypeVar, runtime_checkable
from urllib.parse import unquote, urlparse

from pydantic import ValidationError

from reconciler.clock import Clock
from reconciler.core.observed import AppRecord, Outcome, Records, SavepointRecord
from reconciler.core.plan import INTERRUPTED, Action, AppPlan, reason_key, spec_hash
from reconciler.core.rollback import protected_rollback_points
from reconciler.errors import JournalError, ReconcilerError, RecordConflictError
from reconciler.live.records import BrokenRecord, Doc, FileRecordStore, Read, RecordStore, StoredRecord

log = logging.getLogger(__name__)

RECORD_KIND: Final = "FlinkReconcilerRecord"
SCHEMA_VERSION: Final = 1
MAX_TRANSITIONS: Final = 200  # history lines kept per app (a ConfigMap holds at most 1 MiB)
MAX_SAVEPOINTS: Final = 100  # savepoint records kept per app; the newest are kept, files are never touched
MAX_LINEAGE: Final = 100  # revisions of lineage kept per app
MAX_REPAIRS: Final = 50  # automatic repair start times kept per app (the crash-loop window reads them)
REPEAT_EVERY: Final = timedelta(minutes=1)  # a repeated history line's last-seen time moves at most this often
DISPOSAL_DEADLINE_S: Final = 60.0  # per savepoint Flink is asked to dispose of
_NOT_FOUND: Final = "FileNotFoundException"  # Flink's disposal of a savepoint that does not exist

# Step scratch data a caller may set; anything else is a programming error.
SCRATCH_KEYS: Final = frozenset(
    {"trigger_id", "captured_path", "captured_kind", "submitted_job_id", "failed_step", "failure", "restored_from"}
)

T = TypeVar("T")


class Stage(StrEnum):
    FORWARD = "forward"  # the plan's steps
    ROLLBACK = "rollback"  # the plan's rollback steps, after a failure past rollback_after
    ABORT = "abort"  # the plan's abort steps, after a failure up to rollback_after (the old job still runs)


class StepPhase(StrEnum):
    PENDING = "pending"  # the step at step_index has not started (nothing outside touched for it)
    STARTED = "started"  # it may have had effects outside; resuming re-enters it idempotently
    DONE = "done"  # it completed; resuming continues with the next one


class Keep(Enum):
    KEEP = "keep"


KEEP: Final = Keep.KEEP
"""Sentinel for `finish(job_id=...)`: leave the recorded job id as it is."""


class _DisposalStatus(Protocol):
    @property
    def done(self) -> bool: ...
    @property
    def failure(self) -> str | None: ...


@runtime_checkable
class SavepointDisposer(Protocol):
    """What retention needs to have Flink dispose of a savepoint (`FlinkRestClient` is one)."""

    def trigger_disposal(self, savepoint_path: str) -> str: ...
    def disposal_status(self, trigger_id: str) -> _DisposalStatus: ...


@dataclass(frozen=True)
class InFlight:
    """An execution that started and has not finished: enough to resume it after a crash."""

    app: str
    revision: str
    plan: AppPlan
    stage: Stage
    step_index: int
    phase: StepPhase
    trigger_id: str | None  # our savepoint trigger id of the current StopWithSavepoint, journaled before the request
    captured_path: str | None  # the CAPTURED restore point
    captured_kind: str | None  # savepoint | checkpoint
    submitted_job_id: str | None  # the job a StartJob submitted (or was about to submit)
    failed_step: str | None  # during rollback: the forward step that failed
    failure: str | None  # during rollback: why it failed
    started_at: datetime
    updated_at: datetime
    restored_from: str | None = None  # what the last StartJob restored (None: not started yet; "": empty state)
    # "<stage>:<index>" -> (started, done) of each step run so far (records older than this know none)
    step_times: Mapping[str, tuple[datetime | None, datetime | None]] = dataclasses.field(default_factory=dict)

    @property
    def steps(self) -> tuple[Any, ...]:
        if self.stage is Stage.ABORT:
            return self.plan.abort
        return self.plan.rollback if self.stage is Stage.ROLLBACK else self.plan.steps


@dataclass(frozen=True)
class Transition:
    """One line of `flink-reconciler history APP`."""

    at: datetime
    revision: str | None
    action: str
    outcome: Outcome | None
    message: str | None
    last_seen: datetime | None = None  # the same line seen again until then (`count` times in all)
    count: int = 1


@dataclass(frozen=True)
class Lineage:
    """What one execution did to the app's state: where its job started from, which savepoints it took."""

    revision: str
    at: datetime
    action: str
    outcome: Outcome
    restored_from: str | None  # None: no job was started; "": started with empty state
    savepoints: tuple[str, ...]  # savepoints/checkpoints this execution captured
    job_id: str | None


def new_doc(app: str) -> Doc:
    return {"kind": RECORD_KIND, "version": SCHEMA_VERSION, "app": app, "namespace": None, "forgotten": False,
            "record": {"attempts": 0}, "savepoints": [], "inflight": None, "transitions": [], "lineage": []}


class Journal:
    """Per-app records in a `RecordStore` (default: `<state_dir>/records/`). Safe to share between threads.

    `path` names the journal in its state directory: the `apply` lock (`<path>.lock`) sits beside it."""

    def __init__(self, path: Path, clock: Clock, *, store: RecordStore | None = None) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._clock = clock
        self.store: RecordStore = store if store is not None else FileRecordStore(self.path.parent / "records")
        self._mutex = threading.RLock()
        self._cache: dict[str, StoredRecord] | None = None
        self._broken: dict[str, str] = {}  # app -> why its record cannot be used (never written over)
        self._checked: dict[str, str] = {}  # app -> version of its record that was read through without error
        # app -> (version, its AppRecord): an unchanged record is not parsed again (10,000 apps: 0.25 s a read)
        self._built: dict[str, tuple[str, AppRecord]] = {}

    # ---- plumbing -------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-read every record from the store (one LIST per namespace on Kubernetes)."""
        with self._mutex:
            self._cache, self._broken = self._readable(self.store.list())

    def _readable(self, loaded: dict[str, Read]) -> tuple[dict[str, StoredRecord], dict[str, str]]:
        """Split what the store listed into usable records and broken ones (app -> what is wrong and what to
        do). A record is read through once per version: a bad field makes its app broken at refresh, not a
        pass fail later when one of its parts is read."""
        good: dict[str, StoredRecord] = {}
        broken: dict[str, str] = {}
        for app, rec in loaded.items():
            if isinstance(rec, BrokenRecord):
                broken[app] = broken_reason(app, rec.reason)
                continue
            if self._checked.get(app) != rec.version:
                try:
                    check_version(rec.doc, f"{self.store.where}: record of app {app!r}")
                    if not rec.doc.get("forgotten"):
                        read_app_record(app, rec.doc, self.store.where)
                    if rec.doc.get("inflight"):
                        read_inflight(app, rec.doc["inflight"], self.store.where)
                except JournalError as e:
                    broken[app] = broken_reason(app, str(e))
                    continue
            good[app] = rec
        self._checked = {app: rec.version for app, rec in good.items()}
        return good, broken

    def broken(self) -> dict[str, str]:
        """Apps whose record cannot be used, as of the last read: app -> what is wrong and what to do."""
        with self._mutex:
            self._records()
            return dict(self._broken)

    def _records(self) -> dict[str, StoredRecord]:
        if self._cache is None:
            self.refresh()
        assert self._cache is not None
        return self._cache

    def _doc(self, app: str) -> Doc | None:
        with self._mutex:
            rec = self._records().get(app)
            return rec.doc if rec else None

    def _update(self, app: str, fn: Callable[[Doc], T], *, create: bool = True) -> T | None:
        """Apply `fn` to a copy of the app's record and compare-and-set it. No write when nothing changed.

        A lost compare-and-set is retried once when the stored document is the one we based our change on
        (someone touched only metadata, e.g. a label); otherwise it raises: another writer acted."""
        with self._mutex:
            cache = self._records()
            if app in self._broken:
                raise JournalError(f"not writing the record of app {app}: {self._broken[app]}")
            for attempt in (1, 2):
                current = cache.get(app)
                if current is None and not create:
                    return None
                doc = copy.deepcopy(current.doc) if current else new_doc(app)
                result = fn(doc)
                if current is not None and doc == current.doc:
                    return result
                doc["updated_at"] = self._now()
                try:
                    version = self.store.put(app, doc, expected=current.version if current else None)
                except RecordConflictError:
                    fresh = self.store.get(app)
                    if isinstance(fresh, BrokenRecord):  # it broke meanwhile: it is that app's problem now
                        cache.pop(app, None)
                        self._broken[app] = broken_reason(app, fresh.reason)
                        raise
                    if attempt == 1 and fresh is not None and current is not None and fresh.doc == current.doc:
                        cache[app] = fresh
                        continue
                    if fresh is not None:
                        cache[app] = fresh
                    else:
                        cache.pop(app, None)
                    raise
                cache[app] = StoredRecord(doc, version)
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _now(self) -> str:
        return self._clock.now().isoformat()

    def close(self) -> None:
        """Nothing to release: every write is already durable. Kept for `with Journal(...)`."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def lock_exclusive(self) -> Iterator[None]:
        """Hold the state directory for one `apply` process; a second one gets a clear JournalError.

        `flock` on a sibling file: the kernel drops it when the process dies, so a crash never leaves
        a stale lock. The file is never deleted (deleting it would let two holders lock two inodes)."""
        try:
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise JournalError(f"{self.lock_path}: cannot create the lock file: {e.strerror or e}") from e
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
        """Every app's record, freshly read from the store. An unchanged record (same version) is the same
        AppRecord object as at the last call: frozen, so callers may key caches on it."""
        with self._mutex:
            self.refresh()
            built: dict[str, tuple[str, AppRecord]] = {}
            apps: dict[str, AppRecord] = {}
            for app, r in sorted(self._records().items()):
                if r.doc.get("forgotten"):
                    continue
                hit = self._built.get(app)
                rec = (hit[1] if hit is not None and hit[0] == r.version
                       else read_app_record(app, r.doc, self.store.where))
                built[app] = (r.version, rec)
                apps[app] = rec
            self._built = built
            return Records(apps=apps, broken=dict(self._broken))

    def source_files(self) -> frozenset[str]:
        """The spec files the apps on record came from, as last read (no round trip to the store)."""
        with self._mutex:
            return frozenset(f for r in self._records().values()
                             if isinstance(f := (r.doc.get("record") or {}).get("source_file"), str))

    def record(self, app: str) -> AppRecord | None:
        doc = self._doc(app)
        if doc is None or doc.get("forgotten"):
            return None
        return read_app_record(app, doc, self.store.where)

    def namespace(self, app: str) -> str | None:
        doc = self._doc(app)
        return doc.get("namespace") if doc else None

    def set_source_file(self, app: str, path: str) -> None:
        """Follow an app that moved to another file. An app without a record gets none from this: its
        first execution or attempt records its file (a first pass over 10,000 new apps writes nothing)."""

        def fn(doc: Doc) -> None:
            if not doc.get("forgotten"):
                doc["record"]["source_file"] = path

        self._update(app, fn, create=False)

    def record_attempt(
        self, app: str, revision: str, outcome: Outcome, message: str, *, action: str,
        source_file: str | None = None,
    ) -> None:
        """Record an attempt that runs no step (a blocked or invalid app).

        The attempted spec hash is what the planner uses to refuse re-running a failed spec: it is
        kept when the app had already FAILED (the refusal stays in force) and cleared otherwise (a
        "blocked, needs a human" answer must not turn into "this spec failed" once the human acted).
        Idempotent per (revision, outcome, message): the daemon meets the same blocked app every
        tick, and neither the attempt counter nor the history should grow with each one (nor the
        number of writes to the store)."""

        def fn(doc: Doc) -> None:
            revive(doc)
            r = doc["record"]
            if (r.get("last_attempted_revision") == revision and r.get("last_outcome") == outcome.value
                    and r.get("last_message") == message):
                return
            same = reason_key(r.get("last_message") or "") == reason_key(message)
            if r.get("last_outcome") == outcome.value and same and self._repeat(doc, action, outcome, message):
                return  # the same answer again (an age grew): one history line, not one per pass
            keep_hash = r.get("last_outcome") == Outcome.FAILURE.value
            r.update(last_attempted_revision=revision,
                     last_attempted_spec_hash=r.get("last_attempted_spec_hash") if keep_hash else None,
                     last_outcome=outcome.value, last_message=message, attempts=next_attempt(r, revision))
            if source_file is not None:
                r["source_file"] = source_file
            self._transition(doc, revision, action, outcome=outcome, message=message)

        self._update(app, fn)

    def forget(self, app: str) -> None:
        """Stop remembering the app: its record, in-flight execution and savepoint list go (the
        savepoint files stay where they are); the transition log is kept for `history`."""

        def fn(doc: Doc) -> None:
            doc.update(forgotten=True, record={"attempts": 0}, savepoints=[], inflight=None)
            self._transition(doc, None, "forget", outcome=None,
                             message="no longer managed; savepoint files left in place")

        self._update(app, fn)

    # ---- in-flight execution --------------------------------------------------------------------

    def begin(self, app: str, revision: str, app_plan: AppPlan) -> None:
        """Start an execution: record the attempt and the plan, before any step touches anything."""
        now = self._now()

        def fn(doc: Doc) -> None:
            if doc.get("inflight") is not None:
                raise JournalError(f"{self.store.where}: app {app!r} has an unfinished execution; resume it first")
            revive(doc)
            r = doc["record"]
            desired_hash = spec_hash(app_plan.desired) if app_plan.desired is not None else None
            r.update(
                last_attempted_revision=revision,
                last_attempted_spec_hash=desired_hash,
                last_outcome=Outcome.PENDING.value, last_message=app_plan.reason, attempts=next_attempt(r, revision),
                last_action=app_plan.action.value,
            )
            if app_plan.failed and not r.get("failed_spec_hash") and r.get("last_attempted_spec_hash"):
                # A record from before `failed_spec_hash`: what failed is kept before this repair rewrites it.
                r.update(failed_spec_hash=r["last_attempted_spec_hash"],
                         failed_revision=r.get("last_attempted_revision"), failed_message=_failure_of(app_plan.failed))
            if app_plan.action is Action.REPAIR:  # the crash-loop window counts repairs of one spec
                earlier = r.get("repairs") or [] if r.get("repairs_spec_hash") == desired_hash else []
                r.update(repairs=[*earlier, now][-MAX_REPAIRS:], repairs_spec_hash=desired_hash)
                r.pop("unhealthy_since", None)  # a job down again after the repair gets a new grace period
            if app_plan.source_file:
                r["source_file"] = app_plan.source_file
            ns = plan_namespace(app_plan)
            if ns:
                doc["namespace"] = ns
            doc["inflight"] = {
                "revision": revision, "plan": app_plan.model_dump(mode="json"), "stage": Stage.FORWARD.value,
                "step_index": 0, "phase": StepPhase.PENDING.value, "started_at": now, "updated_at": now,
            }
            self._transition(doc, revision, app_plan.label, outcome=Outcome.PENDING, message=app_plan.reason)

        self._update(app, fn)

    def inflight(self, app: str) -> InFlight | None:
        doc = self._doc(app)
        if doc is None or not doc.get("inflight"):
            return None
        return read_inflight(app, doc["inflight"], self.store.where)

    def all_inflight(self) -> dict[str, InFlight]:
        with self._mutex:
            return {app: read_inflight(app, r.doc["inflight"], self.store.where)
                    for app, r in sorted(self._records().items())
                    if r.doc.get("inflight")}

    def step_started(self, app: str, index: int, **scratch: str | None) -> None:
        """Mark step `index` of the current stage as started, before it has any effect outside.

        Moving to another step clears the savepoint trigger id: a trigger belongs to one step."""
        self._set_step(app, index, StepPhase.STARTED, scratch)

    def step_done(self, app: str, index: int, **scratch: str | None) -> None:
        """Mark step `index` done (with what it produced), so a resume continues after it."""
        self._set_step(app, index, StepPhase.DONE, scratch)

    def set_scratch(self, app: str, **scratch: str | None) -> None:
        """Record what a running step learned (e.g. our trigger id, before the request goes out)."""
        check_scratch(scratch)
        if not scratch:
            return

        def fn(doc: Doc) -> None:
            f = self._require_inflight(doc, app)
            f.update(scratch)
            f["updated_at"] = self._now()

        self._update(app, fn)

    def start_rollback(self, app: str, *, failed_step: str, failure: str, stage: Stage = Stage.ROLLBACK) -> None:
        """Switch the execution to the plan's rollback (or abort) steps, remembering why."""

        def fn(doc: Doc) -> None:
            f = self._require_inflight(doc, app)
            f.update(stage=stage.value, step_index=0, phase=StepPhase.PENDING.value, trigger_id=None,
                     failed_step=failed_step, failure=failure, updated_at=self._now())
            self._transition(doc, f["revision"], stage.value, outcome=Outcome.PENDING,
                             message=f"{failed_step} failed: {failure}")

        self._update(app, fn)

    def _set_step(self, app: str, index: int, phase: StepPhase, scratch: dict[str, str | None]) -> None:
        check_scratch(scratch)

        def fn(doc: Doc) -> None:
            f = doc.get("inflight")
            if not f:
                return  # ForgetApp removed the execution along with the app: nothing left to mark
            if f["step_index"] != index and "trigger_id" not in scratch:
                f["trigger_id"] = None
            f.update(scratch)
            now = self._now()
            f.update(step_index=index, phase=phase.value, updated_at=now)
            # when each step started and ended, for the dashboard (nothing resumes from these)
            times = f.setdefault("step_times", {})
            key = f"{f.get('stage', Stage.FORWARD.value)}:{index}"
            if phase is StepPhase.STARTED and (times.get(key) or [None])[0] is None:
                times[key] = [now, None]
            elif phase is StepPhase.DONE:
                times[key] = [(times.get(key) or [None])[0], now]

        self._update(app, fn, create=False)

    def _require_inflight(self, doc: Doc, app: str) -> Doc:
        f = doc.get("inflight")
        if not f:
            raise JournalError(f"{self.store.where}: app {app!r} has no execution in flight")
        assert isinstance(f, dict)
        return f

    def finish(
        self,
        app: str,
        outcome: Outcome,
        message: str,
        *,
        applied_spec: dict[str, Any] | None,
        job_id: str | Keep | None = KEEP,
        rolled_back: bool = False,
        interrupted: bool = False,
    ) -> Lineage | None:
        """End the execution. `interrupted`: cut off by a fault, not refused by the spec (`core.plan.INTERRUPTED`),
        in the same write, so a crash cannot leave it looking like "this spec already failed". Flux-style: the
        applied revision/spec move only on success (and only
        when `applied_spec` is given); the attempted revision was recorded by `begin`.

        Returns the execution's lineage (what its job restored, which savepoints it took), also kept in
        the record, under the plan's label (`upgrade`, `rollback`, ...; `upgrade -> rolled back` when the
        failure path put the previous spec back). An app forgotten by its own plan (ForgetApp) gets a
        history line and no new record."""

        def fn(doc: Doc) -> Lineage | None:
            f = doc.get("inflight")
            r = doc["record"]
            revision = f["revision"] if f else r.get("last_attempted_revision")
            doc["inflight"] = None
            lineage = None
            if f:
                lineage = self._lineage(doc, f, outcome, job_id, rolled_back=rolled_back)
            if not doc.get("forgotten"):
                r.update(last_outcome=outcome.value, last_message=message)
                plan = (f or {}).get("plan") or {}
                if outcome is Outcome.SUCCESS and applied_spec is not None:
                    # A repair of the last applied spec (`AppPlan.desired_revision`: Git's spec failed, or waits) put
                    # back what ran: still applied at its own revision (its jar, its lineage), not at Git's head.
                    r.update(last_applied_spec=applied_spec,
                             last_applied_revision=plan.get("desired_revision") or revision)
                _remember_failure(r, plan, outcome, message, revision=revision, interrupted=interrupted)
                if not isinstance(job_id, Keep):
                    r["job_id"] = job_id
                if interrupted:
                    r.update(last_action=INTERRUPTED, interrupted_spec=r.get("last_attempted_spec_hash"))
            self._transition(doc, revision, "finish", outcome=outcome, message=message)
            return lineage

        return self._update(app, fn, create=False)

    def _lineage(self, doc: Doc, f: Doc, outcome: Outcome, job_id: str | Keep | None, *,
                 rolled_back: bool = False) -> Lineage:
        started = datetime.fromisoformat(f["started_at"])
        produced = tuple(sp.path for sp in savepoints_of(doc) if sp.revision == f["revision"] and (
            sp.taken_at >= started or sp.path == f.get("captured_path")))
        plan = f.get("plan") or {}
        action = str(plan.get("purpose") or plan.get("action", "?")) + (" -> rolled back" if rolled_back else "")
        entry = Lineage(
            # a repair of the last applied spec runs that spec: its job belongs to the revision it was applied at
            revision=plan.get("desired_revision") or f["revision"], at=started, action=action,
            outcome=outcome,
            restored_from=f.get("restored_from"), savepoints=produced,
            job_id=job_id if isinstance(job_id, str) else None,
        )
        doc.setdefault("lineage", []).append({
            "revision": entry.revision, "at": entry.at.isoformat(), "action": entry.action,
            "outcome": entry.outcome.value, "restored_from": entry.restored_from,
            "savepoints": list(entry.savepoints), "job_id": entry.job_id,
            "submitted_job_id": f.get("submitted_job_id"),
        })
        del doc["lineage"][:-MAX_LINEAGE]
        return entry

    def lineage(self, app: str) -> list[Lineage]:
        return read_lineage(app, self._doc(app), self.store.where)

    def mark_deleted(self, app: str) -> None:
        """The app's cluster is gone because Git said so: nothing is applied any more, but the record
        and its savepoint history stay, so re-adding the spec restores from the final savepoint."""

        def fn(doc: Doc) -> None:
            doc["record"].update(last_applied_spec=None, last_applied_revision=None, job_id=None)
            self._transition(doc, None, "deleted", outcome=None,
                             message="cluster deleted; savepoint history kept for a re-create")

        self._update(app, fn, create=False)

    def record_applied(self, app: str, revision: str, spec: dict[str, Any]) -> None:
        """A change that needs no step (metadata only) is applied by recording it."""

        def fn(doc: Doc) -> None:
            doc["record"].update(last_applied_revision=revision, last_applied_spec=spec)

        self._update(app, fn, create=False)

    def record_adopted(self, app: str, revision: str, spec: dict[str, Any], *, source_file: str | None) -> None:
        """A job of exactly this spec runs but no record said so (the records were lost): it is applied."""

        def fn(doc: Doc) -> None:
            revive(doc)
            if doc["record"].get("last_applied_spec") == spec:
                return
            message = "a job of this spec was running without a record: recorded as applied"
            doc["record"].update(last_applied_revision=revision, last_applied_spec=spec, last_outcome="success",
                                 last_message=message)
            if source_file:
                doc["record"]["source_file"] = source_file
            self._transition(doc, revision, "adopt", outcome=Outcome.SUCCESS, message=message)

        self._update(app, fn)

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

        def fn(doc: Doc) -> None:
            sps = doc.setdefault("savepoints", [])
            if any(s.get("path") == path for s in sps):
                return
            sps.append(rec.model_dump(mode="json"))
            if len(sps) > MAX_SAVEPOINTS:  # drop the oldest records (never their files)
                sps.sort(key=lambda s: s.get("taken_at") or "")
                del sps[:-MAX_SAVEPOINTS]
            self._transition(doc, revision, kind, outcome=None, message=path)

        self._update(app, fn)
        return rec

    def prune_savepoints(self, app: str, retain: int, *, protect: Collection[str] = (),
                         max_age: timedelta | None = None, disposer: object = None) -> list[SavepointRecord]:
        """Retention: keep the newest `retain` savepoints (and, with `max_age`, none older than that);
        forget the others and dispose of them.

        Never disposed of: the newest one; the in-flight CAPTURED restore point; `protect`ed paths (what
        the app would restore from); manual savepoints (`flink-reconciler savepoint`: the user's, and
        not counted against `retain`); and the rollback point of each of the newest `retain` revisions
        the app ran (within `max_age`), so `rollback --to` any of them keeps working.

        Disposal: local directories (plain absolute paths or file:// URIs named `savepoint-*`) are
        deleted here; other schemes go to `disposer` (the app's Flink REST client: Flink's savepoint
        disposal, through its own filesystem plugins) when it can, else they are only forgotten (their
        storage has its own lifecycle); adopted checkpoints are only forgotten. The records go first,
        then the files, so a crash in between can leak a savepoint but never leave a record pointing at
        a deleted one. A disposal that fails is logged and noted in the app's
        history (`dispose-failed`, with the path to delete by hand): never raised, never fatal."""
        retain = max(1, retain)
        since = self._clock.now() - max_age if max_age is not None else None

        def fn(doc: Doc) -> list[SavepointRecord]:
            savepoints = savepoints_of(doc)
            ordered = sorted(enumerate(savepoints), key=lambda x: (x[1].taken_at, x[0]), reverse=True)
            keep = set(protect)
            if ordered:
                keep.add(ordered[0][1].path)
            f = doc.get("inflight")
            if f and f.get("captured_path"):
                keep.add(f["captured_path"])
            lineage = read_lineage(app, doc, self.store.where)
            keep |= protected_rollback_points(lineage, savepoints, window=retain, since=since)
            counted = [sp for _, sp in ordered if sp.kind != "manual"]
            doomed = [sp for i, sp in enumerate(counted) if sp.path not in keep and (
                i >= retain or (since is not None and sp.taken_at < since))]
            gone = {sp.path for sp in doomed}
            doc["savepoints"] = [s for s in doc.get("savepoints", []) if s.get("path") not in gone]
            for sp in doomed:
                self._transition(doc, sp.revision, "prune", outcome=None, message=sp.path)
            return doomed

        pruned = self._update(app, fn, create=False) or []
        for sp in pruned:
            failure = self._dispose(sp, disposer)
            if failure is not None:
                log.warning("%s: could not dispose of savepoint %s: %s", app, sp.path, failure)
                with contextlib.suppress(JournalError):
                    self.note(app, "dispose-failed", f"{sp.path}: {failure} (its record is gone; delete it by hand)",
                              revision=sp.revision, outcome=Outcome.FAILURE)
        return pruned

    def _dispose(self, sp: SavepointRecord, disposer: object) -> str | None:
        """Delete one pruned savepoint; the reason it could not be, or None. `disposer` is a
        SavepointDisposer, or a function that makes one (called only when a remote one is due)."""
        if sp.kind == "checkpoint":
            return None  # an adopted checkpoint belongs to its job's checkpoint storage
        local = local_savepoint_dir(sp.path)
        try:
            if local is not None and local.exists():
                shutil.rmtree(local)
                return None
            # Remote storage, or a file: path this process does not see (a volume mounted in the Flink pods
            # on Kubernetes): the JobManager disposes of it, with its own filesystem plugins and credentials.
            if disposer is None or (local is None and urlparse(sp.path).scheme in ("", "file")):
                return None
            if not isinstance(disposer, SavepointDisposer) and callable(disposer):
                disposer = disposer()
            if isinstance(disposer, SavepointDisposer):
                trigger = disposer.trigger_disposal(sp.path)
                deadline = self._clock.monotonic() + DISPOSAL_DEADLINE_S
                while True:
                    status = disposer.disposal_status(trigger)
                    if status.done:
                        if status.failure and local is not None and _NOT_FOUND in status.failure:
                            return None  # a file: savepoint that is already gone: nothing left to dispose of
                        return status.failure
                    if self._clock.monotonic() >= deadline:
                        return f"Flink did not finish disposing of it within {DISPOSAL_DEADLINE_S:g}s"
                    self._clock.sleep(0.5)
        except OSError as e:
            return f"{type(e).__name__}: {e.strerror or e}"
        except ReconcilerError as e:
            return str(e)
        return None

    # ---- history --------------------------------------------------------------------------------

    def history(self, app: str) -> list[Transition]:
        return read_transitions(app, self._doc(app), self.store.where)

    def note(self, app: str, action: str, message: str, *, revision: str | None = None,
             outcome: Outcome | None = None) -> None:
        """Add a line to the app's history (e.g. a rollback step, a failed step)."""
        self._update(app, lambda doc: self._transition(doc, revision, action, outcome=outcome, message=message))

    def _repeat(self, doc: Doc, action: str, outcome: Outcome, message: str) -> bool:
        """Fold a repeat of the last history line into it (first seen = its `at`, `last_seen`, `count`), so an app
        blocked for an hour is one entry. Its last-seen time moves at most every REPEAT_EVERY: a pass that only
        sees the same answer again writes nothing."""
        lines = doc.get("transitions") or []
        last = lines[-1] if lines else None
        if (last is None or last.get("action") != action or last.get("outcome") != outcome.value
                or reason_key(last.get("message") or "") != reason_key(message)):
            return False
        now = self._clock.now()
        seen = datetime.fromisoformat(last.get("last_seen") or last["at"])
        if now - seen >= REPEAT_EVERY:
            last.update(last_seen=now.isoformat(), count=int(last.get("count") or 1) + 1, message=message)
            doc["record"]["last_message"] = message
        return True

    def autoscale_window(self, app: str) -> object:
        """The autoscaler's stored sample window of the app (`core.autoscale.window_doc`), None when there is none."""
        doc = self._doc(app)
        return None if doc is None or doc.get("forgotten") else doc.get("autoscale")

    def save_autoscale_window(self, app: str, window: Mapping[str, Any]) -> None:
        """Keep the autoscaler's sample window in the app's record (the caller budgets how often). Never creates
        a record: an app without one has nothing applied to autoscale."""

        def fn(doc: Doc) -> None:
            doc["autoscale"] = dict(window)

        self._update(app, fn, create=False)

    def mark_health(self, app: str, *, healthy: bool) -> None:
        """Remember since when the app's job is not running healthy (the recovery grace period counts from it).
        Written only when that changes, never for an app without a record."""
        now = self._now()

        def fn(doc: Doc) -> None:
            r = doc.get("record") or {}
            if healthy:
                r.pop("unhealthy_since", None)
            elif not r.get("unhealthy_since"):
                r["unhealthy_since"] = now

        self._update(app, fn, create=False)

    def interrupted_before(self, app: str) -> bool:
        """Whether an execution of the spec attempted now already ended as interrupted: a second fault under the
        same spec is treated as the spec's own doing, so a config that kills its JobManager never loops."""
        r = (self._doc(app) or {}).get("record") or {}
        return bool(r.get("interrupted_spec")) and r.get("interrupted_spec") == r.get("last_attempted_spec_hash")

    def mark_recovered(self, app: str, *, job_id: str, message: str) -> None:
        """A repair that failed only because its job checkpointed after the step's deadline: the job runs and
        checkpoints now, so the app's outcome is success again (one history line), not a failure until the next
        Git change. Only while the record still says so (a newer execution wins)."""

        def fn(doc: Doc) -> None:
            r = doc.get("record") or {}
            if r.get("last_action") != "repair" or r.get("last_outcome") != Outcome.FAILURE.value or doc.get(
                    "inflight"):
                return
            r.update(last_outcome=Outcome.SUCCESS.value, last_message=message, job_id=job_id)
            self._transition(doc, r.get("last_attempted_revision"), "recovered", outcome=Outcome.SUCCESS,
                             message=message)

        self._update(app, fn, create=False)

    def _transition(self, doc: Doc, revision: str | None, action: str, *, outcome: Outcome | None,
                    message: str | None) -> None:
        lines = doc.setdefault("transitions", [])
        lines.append({"at": self._now(), "revision": revision, "action": action,
                      "outcome": outcome.value if outcome else None, "message": message})
        del lines[:-MAX_TRANSITIONS]


def read_app_record(app: str, doc: Doc, where: str) -> AppRecord:
    """The app's `AppRecord`, read from its document (`where` names the store in errors)."""
    r = doc.get("record") or {}
    try:
        return AppRecord(
            name=app,
            source_file=r.get("source_file"),
            last_applied_revision=r.get("last_applied_revision"),
            last_applied_spec=r.get("last_applied_spec"),
            last_attempted_revision=r.get("last_attempted_revision"),
            last_attempted_spec_hash=r.get("last_attempted_spec_hash"),
            last_outcome=Outcome(r["last_outcome"]) if r.get("last_outcome") else None,
            last_message=r.get("last_message"),
            attempts=int(r.get("attempts") or 0),
            job_id=r.get("job_id"),
            savepoints=tuple(savepoints_of(doc)),
            last_action=r.get("last_action"),
            unhealthy_since=datetime.fromisoformat(r["unhealthy_since"]) if r.get("unhealthy_since") else None,
            repairs=tuple(datetime.fromisoformat(t) for t in r.get("repairs") or ()),
            repairs_spec_hash=r.get("repairs_spec_hash"),
            job_ids=_job_ids(doc),
            failed_spec_hash=r.get("failed_spec_hash"),
            failed_revision=r.get("failed_revision"),
            failed_message=r.get("failed_message"),
        )
    except (ValueError, TypeError, ValidationError) as e:
        raise JournalError(f"{where}: unreadable record of app {app!r}: {e}") from e


def read_inflight(app: str, f: Doc, where: str) -> InFlight:
    """The execution in flight, read from the document's `inflight` part."""
    try:
        return InFlight(
            app=app,
            revision=f["revision"],
            plan=AppPlan.model_validate(f["plan"]),
            stage=Stage(f["stage"]),
            step_index=int(f["step_index"]),
            phase=StepPhase(f["phase"]),
            trigger_id=f.get("trigger_id"),
            captured_path=f.get("captured_path"),
            captured_kind=f.get("captured_kind"),
            submitted_job_id=f.get("submitted_job_id"),
            failed_step=f.get("failed_step"),
            failure=f.get("failure"),
            started_at=datetime.fromisoformat(f["started_at"]),
            updated_at=datetime.fromisoformat(f["updated_at"]),
            restored_from=f.get("restored_from"),
            step_times=_step_times(f.get("step_times")),
        )
    except (KeyError, TypeError, ValueError, ValidationError) as e:
        raise JournalError(f"{where}: unreadable in-flight record of app {app!r}: {e}") from e


def read_lineage(app: str, doc: Doc | None, where: str) -> list[Lineage]:
    """The lineage kept in the document, oldest first."""
    out = []
    for e in (doc or {}).get("lineage", []):
        try:
            out.append(Lineage(revision=e["revision"], at=datetime.fromisoformat(e["at"]), action=e["action"],
                               outcome=Outcome(e["outcome"]), restored_from=e.get("restored_from"),
                               savepoints=tuple(e.get("savepoints") or ()), job_id=e.get("job_id")))
        except (KeyError, TypeError, ValueError) as err:
            raise JournalError(f"{where}: unreadable lineage of app {app!r}: {err}") from err
    return out


def read_transitions(app: str, doc: Doc | None, where: str) -> list[Transition]:
    """The history lines kept in the document, oldest first."""
    try:
        return [
            Transition(at=datetime.fromisoformat(t["at"]), revision=t.get("revision"), action=t["action"],
                       outcome=Outcome(t["outcome"]) if t.get("outcome") else None, message=t.get("message"),
                       last_seen=datetime.fromisoformat(t["last_seen"]) if t.get("last_seen") else None,
                       count=int(t.get("count") or 1))
            for t in (doc or {}).get("transitions", [])
        ]
    except (KeyError, TypeError, ValueError) as e:
        raise JournalError(f"{where}: unreadable history of app {app!r}: {e}") from e


def _step_times(raw: object) -> dict[str, tuple[datetime | None, datetime | None]]:
    """The in-flight doc's step times; anything unreadable in them is dropped (they are for display only)."""
    out: dict[str, tuple[datetime | None, datetime | None]] = {}
    if not isinstance(raw, dict):
        return out
    for key, pair in raw.items():
        try:
            started, done = pair
            out[str(key)] = (datetime.fromisoformat(started) if started else None,
                             datetime.fromisoformat(done) if done else None)
        except (TypeError, ValueError):
            continue
    return out


def savepoints_of(doc: Doc) -> list[SavepointRecord]:
    sps = [SavepointRecord.model_validate(s) for s in doc.get("savepoints", [])]
    return [sp for _, sp in sorted(enumerate(sps), key=lambda x: (x[1].taken_at, x[0]))]


def _job_ids(doc: Doc) -> tuple[str, ...]:
    """The jobs this app ran: the recorded one, those its lineage names, the one an execution in flight submitted."""
    r = doc.get("record") or {}
    found = [r.get("job_id"), *((e.get("job_id"), e.get("submitted_job_id")) for e in doc.get("lineage") or ()),
             (doc.get("inflight") or {}).get("submitted_job_id")]
    flat: list[object] = []
    for x in found:
        flat.extend(x if isinstance(x, tuple) else (x,))
    return tuple(dict.fromkeys(j for j in flat if isinstance(j, str) and j))


def next_attempt(r: Doc, revision: str) -> int:
    if r.get("last_attempted_revision") == revision:
        return int(r.get("attempts") or 0) + 1
    return 1


def _remember_failure(r: Doc, plan: Doc, outcome: Outcome, message: str, *, revision: str | None,
                      interrupted: bool) -> None:
    """The spec whose own execution failed is remembered apart from `last_attempted_*`, which a repair rewrites to
    the spec it runs: that spec is not tried again until Git changes it (`core.context.failed_before`). A repair's
    failure is the crash-loop guard's, an interruption is a fault's; a spec applied since is a fresh start."""
    action, desired = plan.get("action"), plan.get("desired")
    if action == Action.REPAIR.value or not isinstance(desired, dict):
        return
    if outcome is Outcome.FAILURE and not interrupted:
        r.update(failed_spec_hash=spec_hash(desired), failed_revision=revision, failed_message=message)
    elif outcome is Outcome.SUCCESS:
        for k in ("failed_spec_hash", "failed_revision", "failed_message"):
            r.pop(k, None)


def _failure_of(failed: str) -> str:
    """The failure itself out of `AppPlan.failed` ("this spec already failed at revision R: <what>")."""
    head, sep, what = failed.partition(": ")
    return what if sep and head.startswith("this spec already failed") else failed


def revive(doc: Doc) -> None:
    """A forgotten app that Git brings back starts a new record (its history lines stay)."""
    if doc.get("forgotten"):
        doc.update(forgotten=False, record={"attempts": 0})


def check_scratch(scratch: dict[str, str | None]) -> None:
    unknown = set(scratch) - SCRATCH_KEYS
    if unknown:
        raise ValueError(f"unknown scratch keys {sorted(unknown)}; known: {sorted(SCRATCH_KEYS)}")


NEWER: Final = "written by a newer flink-reconciler"  # in the reason of a record whose version we do not know


def broken_reason(app: str, problem: str) -> str:
    """What is wrong with an app's record and what to do about it, for the plan, `status` and `record show`."""
    if NEWER in problem:
        return (f"{problem}. The app waits, its record untouched, until a flink-reconciler that knows this "
                "version runs (or this one is upgraded)")
    return (f"{problem}. Nothing is done to the app until it is repaired: run `flink-reconciler record rebuild "
            f"{app}` to move the record aside (kept) and adopt the app from what its runtime and the lineage "
            "in git notes show (from a savepoint or checkpoint, or blocked; never from empty state)")


def check_version(doc: Doc, where: str) -> None:
    if doc.get("kind") != RECORD_KIND:
        raise JournalError(f"{where}: not a flink-reconciler record (kind {doc.get('kind')!r})")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise JournalError(f"{where}: record without a valid version ({version!r})")
    if version > SCHEMA_VERSION:
        raise JournalError(f"{where}: written by a newer flink-reconciler (record version {version}, this "
                           f"version knows up to {SCHEMA_VERSION}); upgrade flink-reconciler")


def plan_namespace(app_plan: AppPlan) -> str | None:
    for spec in (app_plan.desired, app_plan.previous):
        ns = ((spec or {}).get("metadata") or {}).get("namespace")
        if isinstance(ns, str) and ns:
            return ns
    return None


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
