"""The record's document: its schema, its limits, and how each part of it is read into a value. Pure: no
store, no clock, no file (import-linter keeps it so), so what a record holds can be read in one place.

A record is one JSON document per app: the Flux-style pair (last applied vs. last attempted revision), the
in-flight execution (plan, current step and its phase, the step's scratch data such as a savepoint trigger id
or the captured restore point), the savepoint history, the lineage (which state each revision's job started
from and which savepoints it produced) and a capped transition log for `flink-reconciler history`. Every part
is capped (`MAX_*`): a ConfigMap holds at most 1 MiB.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError

from reconciler.core.observed import AppRecord, Outcome, SavepointRecord
from reconciler.core.plan import AppPlan
from reconciler.errors import JournalError

if TYPE_CHECKING:
    from reconciler.live.records import Doc

RECORD_KIND: Final = "FlinkReconcilerRecord"
SCHEMA_VERSION: Final = 1
MAX_TRANSITIONS: Final = 200  # history lines kept per app (a ConfigMap holds at most 1 MiB)
MAX_SAVEPOINTS: Final = 100  # savepoint records kept per app; the newest are kept, files are never touched
MAX_LINEAGE: Final = 100  # revisions of lineage kept per app
MAX_REPAIRS: Final = 50  # automatic repair start times kept per app (the crash-loop window reads them)
REPEAT_EVERY: Final = timedelta(minutes=1)  # a repeated history line's last-seen time moves at most this often

# Step scratch data a caller may set; anything else is a programming error.
SCRATCH_KEYS: Final = frozenset(
    {"trigger_id", "captured_path", "captured_kind", "submitted_job_id", "failed_step", "failure", "restored_from",
     "operator_before"}
)


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
    # A takeover: the FlinkDeployment as it was before our suspend patch (operator_migration.status.Before, as
    # JSON), journaled before the patch; None: nothing was patched.
    operator_before: str | None = None
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
            operator_before=f.get("operator_before"),
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
