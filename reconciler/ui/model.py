"""The dashboard's read model: one row per app, built from what `status` and `history` read (the journal's
records and in-flight executions), the branch tip's specs and the last pass's per-app states. Pure: no I/O,
no clock (`now` is passed in), so the sync-state rules are table-tested.

A row is memoised per app on the identity of its inputs (the journal hands back the same frozen AppRecord
for an unchanged record), so a page over 10,000 apps rebuilds only the rows that changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconciler.apply.journal import InFlight, StepPhase
from reconciler.core.observed import AppRecord, Outcome, Records
from reconciler.core.plan import describe_step, spec_hash
from reconciler.spec.load import LoadedApp, LoadResult
from reconciler.spec.model import JobState


@dataclass(frozen=True)
class State:
    key: str
    label: str
    icon: str
    rank: int  # sort order: what needs a person first


STATES: tuple[State, ...] = (
    State("error", "error", "✕", 0),
    State("blocked", "blocked", "⊘", 1),
    State("applying", "applying", "↻", 2),
    State("recovering", "recovering", "♥", 3),
    State("out-of-sync", "out of sync", "≠", 4),
    State("in-sync", "in sync", "✓", 5),
    State("unknown", "unknown", "?", 6),
)
STATE = {s.key: s for s in STATES}


@dataclass(frozen=True)
class Tip:
    """The branch tip as this process last saw it, and its specs."""

    revision: str
    loaded: LoadResult
    subject: str | None = None


@dataclass(frozen=True)
class AppRow:
    name: str
    namespace: str
    state: str  # a key of STATE
    why: str
    applied_revision: str | None = None
    attempted_revision: str | None = None
    job_id: str | None = None
    last_savepoint: str | None = None
    last_savepoint_at: datetime | None = None
    last_outcome: str | None = None
    last_message: str | None = None
    source_file: str | None = None
    step: str | None = None  # applying: "2/5 stop the running job with a savepoint"

    @property
    def badge(self) -> State:
        return STATE[self.state]


def namespace_of(spec: Mapping[str, Any] | None) -> str | None:
    ns = ((spec or {}).get("metadata") or {}).get("namespace")
    return ns if isinstance(ns, str) and ns else None


def step_text(f: InFlight) -> str:
    steps = f.steps
    stage = "" if f.stage.value == "forward" else f"{f.stage.value} "
    if not steps:
        return f"{stage}{f.plan.action.value}"
    i = min(f.step_index, len(steps) - 1)
    return f"{stage}{i + 1}/{len(steps)} {describe_step(steps[i])} ({f.phase.value})"


def sync_state(*, record: AppRecord | None, broken: str | None, inflight: InFlight | None, tip_known: bool,
               desired: LoadedApp | None, desired_hash: str | None, applied_hash: str | None,
               spec_error: str | None, pass_state: tuple[str, str] | None) -> tuple[str, str]:
    """(state key, why). The order is the order of what a person must know first."""
    if broken is not None:
        return "blocked", broken
    if inflight is not None:
        return "applying", f"{inflight.plan.action.value} of {inflight.revision[:12]}: {step_text(inflight)}"
    if spec_error is not None:
        return "error", spec_error
    if pass_state is not None and pass_state[0] == "blocked":
        return "blocked", pass_state[1]
    failed = record is not None and record.last_outcome in (Outcome.FAILURE, Outcome.ERROR)
    if not tip_known:
        if record is None:
            return "unknown", "no record and no branch tip to compare with"
        if failed:
            return "error", record.last_message or "the last attempt failed"
        if record.unhealthy_since is not None:
            return "recovering", f"job not running healthy since {record.unhealthy_since:%Y-%m-%d %H:%M:%S}"
        return "unknown", "no repository given: the sync state needs the branch tip (--repo)"
    if desired is None:
        if applied_hash is not None:
            return "out-of-sync", "its spec is gone from the branch; it is deleted only with prune on"
        return "in-sync", "not on the branch and nothing applied"
    if applied_hash is not None and applied_hash == desired_hash:
        assert record is not None
        if record.unhealthy_since is not None:
            return "recovering", f"job not running healthy since {record.unhealthy_since:%Y-%m-%d %H:%M:%S}"
        return "in-sync", "the applied spec is the branch tip's"
    if record is not None and failed and record.last_attempted_spec_hash == desired_hash:
        return "error", record.last_message or "the last attempt at this spec failed"
    if pass_state is not None and pass_state[0] in ("error", "failure"):
        return "error", pass_state[1]
    if applied_hash is None and desired.app.spec.job.state is JobState.SUSPENDED:
        return "in-sync", "suspended in Git and never started: nothing to run"  # `apply` does nothing for it
    if applied_hash is None:
        return "out-of-sync", "not created yet"
    return "out-of-sync", "the branch tip's spec differs from the applied one"


@dataclass
class RowBuilder:
    """Builds (and memoises) the overview rows."""

    _memo: dict[str, tuple[tuple[Any, ...], AppRow]] = field(default_factory=dict)
    _hashes: dict[str, tuple[object, str | None]] = field(default_factory=dict)

    def _hash(self, key: str, obj: object, spec: Mapping[str, Any] | None) -> str | None:
        hit = self._hashes.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = spec_hash(dict(spec)) if spec else None
        self._hashes[key] = (obj, value)
        return value

    def rows(self, records: Records, inflight: Mapping[str, InFlight], tip: Tip | None,
             pass_states: Mapping[str, tuple[str, str]]) -> list[AppRow]:
        loaded = tip.loaded if tip is not None else None
        errors: dict[str, str] = {}
        for e in loaded.errors if loaded is not None else ():
            if e.app and e.app not in errors:
                errors[e.app] = f"{e.location()}: {e.message}"
        names = set(records.apps) | set(records.broken) | set(inflight)
        if loaded is not None:
            names |= set(loaded.apps) | set(errors)
        out: list[AppRow] = []
        memo: dict[str, tuple[tuple[Any, ...], AppRow]] = {}
        for name in sorted(names):
            rec = records.apps.get(name)
            la = loaded.apps.get(name) if loaded is not None else None
            f = inflight.get(name)
            key = (rec, la, f, records.broken.get(name), errors.get(name), pass_states.get(name), loaded is None)
            hit = self._memo.get(name)
            row = hit[1] if hit is not None and hit[0] == key else self._row(name, rec, la, f, key)
            memo[name] = (key, row)
            out.append(row)
        self._memo = memo
        return out

    def _row(self, name: str, rec: AppRecord | None, la: LoadedApp | None, f: InFlight | None,
             key: tuple[Any, ...]) -> AppRow:
        broken, spec_error, pass_state, no_tip = key[3], key[4], key[5], key[6]
        applied = rec.last_applied_spec if rec is not None else None
        desired_hash = _desired_hash(self, name, la) if la is not None else None
        state, why = sync_state(
            record=rec, broken=broken, inflight=f, tip_known=not no_tip, desired=la, desired_hash=desired_hash,
            applied_hash=self._hash("a:" + name, rec, applied), spec_error=spec_error, pass_state=pass_state)
        sp = rec.savepoints[-1] if rec is not None and rec.savepoints else None
        ns = (la.app.metadata.namespace if la is not None else None) or namespace_of(applied) or "default"
        if f is not None:
            ns = namespace_of(f.plan.desired) or namespace_of(f.plan.previous) or ns
        return AppRow(
            name=name, namespace=ns, state=state, why=why,
            applied_revision=rec.last_applied_revision if rec else None,
            attempted_revision=rec.last_attempted_revision if rec else None,
            job_id=rec.job_id if rec else None,
            last_savepoint=sp.path if sp else None, last_savepoint_at=sp.taken_at if sp else None,
            last_outcome=rec.last_outcome.value if rec and rec.last_outcome else None,
            last_message=rec.last_message if rec else None,
            source_file=(la.file if la is not None else None) or (rec.source_file if rec else None),
            step=step_text(f) if f is not None else None,
        )


def _desired_hash(builder: RowBuilder, name: str, la: LoadedApp) -> str | None:
    hit = builder._hashes.get("d:" + name)
    if hit is not None and hit[0] is la:
        return hit[1]
    value = la.app.spec_hash
    builder._hashes["d:" + name] = (la, value)
    return value


# ------------------------------------------------------------------------------------------------ selection

SORTS = ("name", "namespace", "state", "applied", "outcome")


@dataclass(frozen=True)
class Query:
    q: str = ""
    namespace: str = ""
    state: str = ""
    sort: str = "name"
    desc: bool = False
    page: int = 1
    per_page: int = 100


@dataclass(frozen=True)
class Selection:
    rows: tuple[AppRow, ...]  # this page's
    matched: int  # rows that pass the filter
    total: int
    counts: dict[str, int]  # state key -> apps (all apps, not only the filtered ones)
    namespaces: tuple[str, ...]
    page: int
    pages: int


def select(rows: Sequence[AppRow], query: Query) -> Selection:
    counts = {s.key: 0 for s in STATES}
    namespaces: set[str] = set()
    for r in rows:
        counts[r.state] += 1
        namespaces.add(r.namespace)
    needle = query.q.strip().lower()
    hits = [r for r in rows
            if (not needle or needle in r.name.lower())
            and (not query.namespace or r.namespace == query.namespace)
            and (not query.state or r.state == query.state)]
    if query.sort == "state":
        hits.sort(key=lambda r: (STATE[r.state].rank, r.name), reverse=query.desc)
    elif query.sort == "namespace":
        hits.sort(key=lambda r: (r.namespace, r.name), reverse=query.desc)
    elif query.sort == "applied":
        hits.sort(key=lambda r: (r.applied_revision or "", r.name), reverse=query.desc)
    elif query.sort == "outcome":
        hits.sort(key=lambda r: (r.last_outcome or "", r.name), reverse=query.desc)
    elif query.desc:
        hits.reverse()  # rows come sorted by name
    per = max(1, query.per_page)
    pages = max(1, -(-len(hits) // per))
    page = min(max(1, query.page), pages)
    return Selection(rows=tuple(hits[(page - 1) * per: page * per]), matched=len(hits), total=len(rows),
                     counts=counts, namespaces=tuple(sorted(namespaces)), page=page, pages=pages)


# ------------------------------------------------------------------------------------------------ app page


@dataclass(frozen=True)
class StepView:
    number: str  # "1", "r2", "u1"
    text: str
    status: str  # done | running | pending | failed
    started: datetime | None
    done: datetime | None


def step_views(f: InFlight) -> tuple[tuple[str, tuple[StepView, ...]], ...]:
    """The forward steps, then the rollback/abort steps when the execution switched to them: each step's
    status from the journal's step index and phase, with the times the journal kept."""
    stages: list[tuple[str, tuple[StepView, ...]]] = []
    forward_done = f.stage.value != "forward"

    def views(stage: str, steps: tuple[Any, ...], prefix: str, current: bool) -> tuple[StepView, ...]:
        out = []
        for i, s in enumerate(steps):
            started, done = f.step_times.get(f"{stage}:{i}", (None, None))
            if not current:
                status = "done" if stage == "forward" and i < f.step_index else "pending"
                if stage == "forward" and forward_done:
                    status = "done" if done is not None else (
                        "failed" if started is not None and describe_step(s) == f.failed_step else "skipped")
            elif i < f.step_index or (i == f.step_index and f.phase is StepPhase.DONE):
                status = "done"
            elif i == f.step_index and f.phase is StepPhase.STARTED:
                status = "running"
            else:
                status = "pending"
            out.append(StepView(f"{prefix}{i + 1}", describe_step(s), status, started, done))
        return tuple(out)

    stages.append(("steps", views("forward", f.plan.steps, "", f.stage.value == "forward")))
    if f.stage.value == "rollback":
        stages.append(("rollback", views("rollback", f.plan.rollback, "r", True)))
    elif f.stage.value == "abort":
        stages.append(("undo", views("abort", f.plan.abort, "u", True)))
    return tuple(stages)


SAVEPOINT_KINDS = {"manual": "manual", "checkpoint": "retained checkpoint"}


def savepoint_kind(kind: str, revision: str | None, final_revisions: frozenset[str]) -> str:
    """upgrade / manual / final / retained: what the record's kind and the execution that took it say."""
    if kind in SAVEPOINT_KINDS:
        return SAVEPOINT_KINDS[kind]
    return "final" if revision is not None and revision in final_revisions else "upgrade"
