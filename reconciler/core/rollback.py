"""Rolling an app back to a commit: which state to restore, what is dropped, and the plan. Pure.

Git holds every spec an app ever ran; the records hold which job each execution left running (the
lineage) and which job each savepoint was taken of. Joined, they answer "put the app back to how it
was at commit REV": REV's spec, restored from the newest savepoint a job of REV's spec produced. That is
normally the stop-with-savepoint of the upgrade that left REV (recorded under the NEW revision, since a
savepoint is recorded with the revision being applied), or a manual savepoint taken while REV ran.

Everything here is a function of values the shell read; checking that a savepoint still exists on its
storage is the shell's job (`reconciler.service.rollback`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from reconciler.core.context import start_steps
from reconciler.core.diff import diff, highest_class
from reconciler.core.observed import JobPhase, LiveApp, LiveState, Outcome, SavepointRecord
from reconciler.core.plan import (
    CAPTURED,
    Action,
    AppPlan,
    CancelJob,
    Plan,
    Restore,
    RestoreKind,
    SpecRef,
    Step,
    StopWithSavepoint,
    deterministic_job_id,
)
from reconciler.spec.model import FlinkApp, JobState

ROLLBACK_PURPOSE = "rollback-to"  # job ids of `rollback --apply` never collide with REV's own jobs


class Execution(Protocol):
    """One lineage entry (`reconciler.apply.journal.Lineage` is one)."""

    @property
    def revision(self) -> str: ...
    @property
    def at(self) -> datetime: ...
    @property
    def outcome(self) -> Outcome: ...
    @property
    def restored_from(self) -> str | None: ...
    @property
    def savepoints(self) -> tuple[str, ...]: ...
    @property
    def job_id(self) -> str | None: ...


@dataclass(frozen=True)
class RollbackPoint:
    """The state `rollback --to REV` restores, and everything newer that the rollback drops."""

    revision: str
    savepoint: SavepointRecord
    how: str  # where it comes from, said in the plan
    newer: tuple[SavepointRecord, ...]  # recorded savepoints taken after it: state the rollback drops
    older: tuple[SavepointRecord, ...] = ()  # other, older savepoints of REV's jobs (alternatives)


@dataclass(frozen=True)
class Refusal:
    """No rollback to REV is possible: why, in words a human can act on."""

    reason: str


def job_revisions(lineage: Sequence[Execution]) -> dict[str, str]:
    """Job id -> the revision whose spec that job ran.

    An execution that succeeded and left a job running ran its own revision's spec. One that failed and
    was rolled back left a job of the spec that ran before it (the plan's rollback starts the previous
    spec), so that job belongs to the revision that ran before."""
    running: str | None = None
    out: dict[str, str] = {}
    for e in lineage:
        if e.job_id is None:
            if e.outcome is Outcome.SUCCESS and e.restored_from is None:
                running = None if e.savepoints else running  # a suspend/delete took a final savepoint
            continue
        if e.outcome is Outcome.SUCCESS:
            running = e.revision
            out[e.job_id] = e.revision
        elif running is not None:
            out[e.job_id] = running
    return out


def ran(revision: str, lineage: Sequence[Execution]) -> bool:
    """Whether a job of `revision`'s spec ever ran (a successful execution at it started one)."""
    return any(e.revision == revision and e.outcome is Outcome.SUCCESS and e.restored_from is not None
               for e in lineage)


def rollback_point(revision: str, lineage: Sequence[Execution], savepoints: Sequence[SavepointRecord]
                   ) -> RollbackPoint | Refusal:
    """The newest savepoint a job of `revision`'s spec produced (the state it left `revision` with).

    Savepoints are matched to jobs by job id. Lineage without job ids (recovered from git notes) falls
    back to order: the savepoints taken by the first execution after the last one that applied `revision`."""
    short = revision[:12]
    if not ran(revision, lineage):
        seen = sorted({e.revision[:12] for e in lineage
                       if e.outcome is Outcome.SUCCESS and e.restored_from is not None})
        known = f" (revisions that ran: {', '.join(seen)})" if seen else " (no execution of it is on record)"
        return Refusal(f"revision {short} never ran this app: no successful execution at it started a job{known}")
    jobs = job_revisions(lineage)
    ordered = sorted(savepoints, key=lambda s: s.taken_at)
    mine = [s for s in ordered if s.job_id is not None and jobs.get(s.job_id) == revision]
    how_of: dict[str, str] = {}
    for s in mine:
        how_of[s.path] = (f"the {s.kind} taken of job {s.job_id} (running {short}'s spec)"
                          + (f" when revision {s.revision[:12]} replaced it" if s.revision and s.revision != revision
                             and s.kind != "manual" else ""))
    if not mine:
        mine = _by_order(revision, lineage, ordered)
        for s in mine:
            by = (s.revision or "?")[:12]
            how_of[s.path] = f"the savepoint taken when {short} was left (by the execution of {by})"
    if not mine:
        current = next((e.revision for e in reversed(lineage) if e.outcome is Outcome.SUCCESS
                        and e.restored_from is not None), None)
        if current == revision:
            return Refusal(f"revision {short} is what the app runs now, and no savepoint of its job is on record "
                           "yet: there is no earlier state of it to go back to (take one with "
                           "`flink-reconciler savepoint APP`)")
        return Refusal(f"revision {short} ran, but no savepoint of its job is on record (none was taken when "
                       "it was left, or retention disposed of it): there is no state of it to restore")
    point = mine[-1]
    newer = tuple(s for s in ordered if s.taken_at > point.taken_at and s.path != point.path)
    return RollbackPoint(revision=revision, savepoint=point, how=how_of[point.path], newer=newer,
                         older=tuple(reversed(mine[:-1])))


def _by_order(revision: str, lineage: Sequence[Execution], ordered: Sequence[SavepointRecord]
              ) -> list[SavepointRecord]:
    last = max((i for i, e in enumerate(lineage) if e.revision == revision and e.outcome is Outcome.SUCCESS
                and e.restored_from is not None), default=None)
    if last is None or last + 1 >= len(lineage):
        return []
    paths = set(lineage[last + 1].savepoints)
    return [s for s in ordered if s.path in paths]


def protected_rollback_points(lineage: Sequence[Execution], savepoints: Sequence[SavepointRecord], *,
                              window: int, since: datetime | None = None) -> set[str]:
    """Paths that retention must keep: the rollback point of each of the newest `window` revisions that
    ran (and, with `since`, only of those that ran at or after it; the newest revision always counts)."""
    revisions: list[str] = []
    for e in reversed(lineage):
        if e.outcome is not Outcome.SUCCESS or e.restored_from is None or e.revision in revisions:
            continue
        if since is not None and e.at < since and revisions:
            continue
        revisions.append(e.revision)
        if len(revisions) >= window:
            break
    out: set[str] = set()
    for rev in revisions:
        point = rollback_point(rev, lineage, savepoints)
        if isinstance(point, RollbackPoint):
            out.add(point.savepoint.path)
    return out


def plan_rollback(*, app: str, revision: str, target: FlinkApp, current: FlinkApp | None, live: LiveApp,
                  point: RollbackPoint, attempt: int, source_file: str | None, head_note: str | None = None
                  ) -> Plan:
    """Run `target` (the app's spec at `revision`) restored from `point`.

    The running job is stopped WITH a savepoint first, so the state the rollback drops stays
    recoverable (and a failed start rolls back to the current spec from it). A job that is not running
    healthily cannot take one: it is cancelled, and the plan says so."""
    job_id = deterministic_job_id(app, revision, attempt, purpose=ROLLBACK_PURPOSE)
    d = target.spec.deadlines
    sp_s, start_s, healthy_s = (max(1.0, x.total_seconds()) for x in (d.savepoint, d.start, d.healthy))
    sp = point.savepoint
    when = f"{sp.taken_at:%Y-%m-%d %H:%M:%S} UTC"
    reason = f"rollback to {revision[:12]}: its spec, restored from {point.how}, {sp.path} ({when})"
    if head_note:
        reason += f"; {head_note}"
    changes = diff(current.canonical() if current else None, target.canonical())
    base = {"app": app, "change_class": highest_class(changes), "diff": changes, "desired": target.canonical(),
            "previous": current.canonical() if current else None, "source_file": source_file,
            "upgrade_mode": target.spec.job.upgrade_mode.value}
    if target.spec.job.state is not JobState.RUNNING:
        return _plan(revision, live, AppPlan(**base, action=Action.BLOCKED,
                                             reason=f"the spec of app {app} at {revision[:12]} suspends it: there "
                                                    "is no job to roll back to"))
    dropped: list[str] = []
    first: list[Step] = []
    if live.job_id and live.job is JobPhase.RUNNING:
        first.append(StopWithSavepoint(job_id=live.job_id, deadline_s=sp_s))
        dropped.append(f"the state of the running job {live.job_id} (kept in the savepoint step 1 takes)")
    elif live.job_id and live.job in (JobPhase.STARTING, JobPhase.FAILING, JobPhase.UNKNOWN):
        first.append(CancelJob(job_id=live.job_id, deadline_s=sp_s))
        dropped.append(f"the state of job {live.job_id} since its last checkpoint ({live.flink_state}: no "
                       "savepoint can be taken of it)")
    if point.newer:
        revs = sorted({(s.revision or "?")[:12] for s in point.newer})
        dropped.append(f"{len(point.newer)} newer savepoint(s) on record (of revisions {', '.join(revs)}; "
                       f"newest {point.newer[-1].path})")
    risks: tuple[str, ...] = ()
    if dropped:
        risks = (f"DISCARDS CURRENT STATE: app {app} restarts from {sp.path}, taken {when}; newer state is "
                 "dropped: " + "; ".join(dropped),)
    steps: list[Step] = [*first, *start_steps(target, SpecRef.DESIRED, Restore(kind=RestoreKind.PATH, path=sp.path),
                                               job_id, start_s=start_s, healthy_s=healthy_s)]
    rollback: tuple[Step, ...] = ()
    if first and isinstance(first[0], StopWithSavepoint) and current is not None:
        back = deterministic_job_id(app, revision, attempt, purpose=ROLLBACK_PURPOSE + "-undo")
        rollback = tuple(start_steps(current, SpecRef.PREVIOUS, CAPTURED, back, start_s=start_s,
                                              healthy_s=healthy_s))
    ap = AppPlan(**base, action=Action.UPGRADE, purpose="rollback", reason=reason, risks=risks, steps=tuple(steps),
                 rollback_after=0 if rollback else None, rollback=rollback)
    return _plan(revision, live, ap)


def _plan(revision: str, live: LiveApp, ap: AppPlan) -> Plan:
    return Plan(revision=revision, mode="live", live_fingerprint=LiveState(apps={live.name: live}).fingerprint(),
                apps=(ap,))
