"""Which state a job starts from when no savepoint can be taken (the job died, is failing, or the records were
lost): the newest restore point of the app's own lineage, as Flink's high availability would choose, or a
BLOCKED plan that says why none is safe. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from reconciler.core.context import Ctx, age_text
from reconciler.core.diff import highest_class
from reconciler.core.observed import Checkpoint
from reconciler.core.plan import NO_STATE, Action, AppPlan, Restore, RestoreKind
from reconciler.spec.model import ChangeClass, UpgradeMode


@dataclass(frozen=True)
class Found:
    """A restore point found in the records, on the app's cluster or in its storage."""

    path: str
    at: datetime
    is_savepoint: bool
    source: str  # what it is, said in reasons and instructions
    exact: bool = False  # the final state of the last job (the savepoint it was stopped with)
    ours: bool = True  # of a job this app ran (see of_lineage)

    def describe(self) -> str:
        return f"{self.source} {self.path} ({self.at:%Y-%m-%d %H:%M} UTC)"


def found_restore_points(ctx: Ctx) -> list[Found]:
    """Every restore point the planner can see, newest first. A snapshot that belongs to a job this app never
    ran (by the job id in its path) is marked foreign: it is never restored from without a human."""
    live = ctx.live
    rec = ctx.inp.records.get(ctx.name)
    # Lineage is checked against the jobs the record names; with none on record (first sight) it cannot be.
    known = {j for j in (*rec.job_ids, live.job_id, live.stopped_job_id) if j} if rec and rec.job_ids else set()
    out: list[Found] = []
    sp = rec.latest_savepoint if rec else None
    if sp:
        out.append(Found(sp.path, sp.taken_at, sp.kind != "checkpoint", f"its last {sp.kind} on record", ours=True))
    if live.stopped_savepoint:
        c = live.stopped_savepoint
        out.append(Found(c.path, c.completed_at, True, f"the savepoint job {live.stopped_job_id} stopped with",
                          exact=True, ours=True))
    if live.stored_savepoint:
        c = live.stored_savepoint
        out.append(Found(c.path, c.completed_at, True, "the newest savepoint in its savepoint directory",
                          ours=of_lineage(c, known)))
    if live.latest_checkpoint:
        c = live.latest_checkpoint
        job = live.job_id or live.stopped_job_id
        out.append(Found(c.path, c.completed_at, c.is_savepoint,
                          f"the latest checkpoint of job {job}" if job else "the latest checkpoint", ours=True))
    if live.stored_checkpoint:
        c = live.stored_checkpoint
        out.append(Found(c.path, c.completed_at, False, "the newest retained checkpoint in its checkpoint directory",
                          ours=of_lineage(c, known)))
    return sorted(out, key=lambda f: f.at, reverse=True)


_CHECKPOINT_JOB = re.compile(r"(?:^|/)([0-9a-f]{32})/chk-[0-9]+/?$")


_SAVEPOINT_JOB = re.compile(r"(?:^|/)savepoint-([0-9a-f]{6})-[0-9a-f]+/?$")


def of_lineage(c: Checkpoint, known: set[str]) -> bool:
    """Whether a stored snapshot belongs to one of the app's jobs. Flink names the job in the path (a checkpoint's
    directory is the job id, a savepoint's name starts with its first six digits); with no job on record, or a
    path that does not say, it is taken as the app's own (its own directory holds it)."""
    if not known:
        return True
    if m := _CHECKPOINT_JOB.search(c.path):
        return m.group(1) in known
    if m := _SAVEPOINT_JOB.search(c.path):
        return any(j.startswith(m.group(1)) for j in known)
    return True


def restore_when_not_running(ctx: Ctx, what: str) -> tuple[Restore, tuple[str, ...], Found | None] | AppPlan:
    """No savepoint can be taken (no job runs): restore from the newest state of the app's own lineage, as Flink's
    HA does (the latest completed checkpoint, or a savepoint when that is newer). Blocked, with an instruction,
    only when no state can be found safely: none at all for an app that had some, storage that cannot be read,
    the newest state belongs to another job, or a checkpoint is older than the spec's maxCheckpointAge cap.
    Never empty state without the spec's consent (stateless)."""
    mode = ctx.desired.spec.job.upgrade_mode
    live = ctx.live
    found = found_restore_points(ctx)
    first_sight = ctx.previous is None
    if mode is UpgradeMode.STATELESS:
        ignored = ([f"ignores {found[0].describe()}"] if found else []) + (
            [f"ignores state it could not read ({live.evidence_error})"] if live.evidence_error else [])
        if first_sight and not ignored:
            return NO_STATE, (), None
        return NO_STATE, ("; ".join([f"STARTS WITHOUT STATE: upgradeMode stateless ({what})", *ignored]),), None
    if live.evidence_error:
        return ctx.app_plan(Action.BLOCKED, f"{what}, and its stored savepoints/checkpoints could not be read "
                                            f"({live.evidence_error}): nothing is started until they can be, so no "
                                            "state is dropped. To proceed: fix that access, or set "
                                            "spec.job.initialSavepointPath to the savepoint to start from.")
    if first_sight and not found and not live.stopped_job_id:
        return NO_STATE, (), None  # no trace of any state: a new app
    ours = [f for f in found if f.ours]
    newest = ours[0] if ours else None
    foreign = found[0] if found and not found[0].ours else None
    if foreign is not None:  # something newer than anything of ours: whose state is it?
        return ctx.app_plan(Action.BLOCKED, f"{what}, and the newest state in its storage, {foreign.describe()}, "
                                            "belongs to a job this app never ran (by its path): it is not restored "
                                            "from automatically. To proceed: set spec.job.initialSavepointPath to the "
                                            "state to start from and bump spec.job.savepointRedeployNonce"
                                            + (f" (the app's own newest is {newest.describe()})" if newest else "")
                                            + ".")
    max_age = ctx.desired.spec.job.max_checkpoint_age
    if newest is not None and (newest.is_savepoint or max_age is None or mode is UpgradeMode.LAST_STATE
                               or ctx.inp.now - newest.at <= max_age):
        risks: tuple[str, ...] = ()
        # Said for review where it changes what starts: a new spec from a non-final state, or an app adopted
        # from a checkpoint (first sight). A repair of the same spec from its latest checkpoint is Flink's own HA.
        upgrade = ctx.previous is not None and highest_class(ctx.changes) >= ChangeClass.UPGRADE
        adopted_ckpt = first_sight and not newest.is_savepoint
        if mode is UpgradeMode.SAVEPOINT and not newest.exact and (upgrade or adopted_ckpt):
            kind = "SAVEPOINT" if newest.is_savepoint else "CHECKPOINT"
            risks = (f"RESTORES FROM {kind} {newest.path} ({age_text(ctx.inp.now - newest.at)} old): {what}, so no "
                     "savepoint can be taken; the new spec starts from the newest state of the job",)
        return Restore(kind=RestoreKind.PATH, path=newest.path), risks, newest
    ckpt = newest
    if mode is UpgradeMode.LAST_STATE and ckpt is None:
        return blocked_no_state(ctx, what, "no retained checkpoint or savepoint exists")
    if ckpt:
        why = f"the latest checkpoint is {age_text(ctx.inp.now - ckpt.at)} old" + (
            f", older than maxCheckpointAge {age_text(max_age)}" if max_age else " and maxCheckpointAge is unset")
    elif live.stopped_job_id and not found:
        # Flink's REST API serves checkpoint statistics from a cache (web.refresh-interval): right after
        # a stop the savepoint may not show yet. A job that ended is a trace of a past: never "new".
        why = (f"job {live.stopped_job_id} on its cluster has ended, and neither Flink nor the storage shows a "
               "savepoint or checkpoint of it (yet: Flink's statistics can lag a few seconds; the next pass "
               "looks again)")
    else:
        why = "there is no retained checkpoint"
    newest_sp = next((f for f in found if f.is_savepoint), None)
    return blocked_no_state(ctx, what, why, savepoint=newest_sp.path if newest_sp else None, ckpt=ckpt)


def blocked_no_state(ctx: Ctx, what: str, why: str, savepoint: str | None = None,
                      ckpt: Found | None = None) -> AppPlan:
    options = []
    if ckpt:
        options.append(f"set spec.job.maxCheckpointAge above {age_text(ctx.inp.now - ckpt.at)} to restore "
                       f"from checkpoint {ckpt.path}")
    if savepoint:
        options.append(f"set spec.job.initialSavepointPath: {savepoint} and bump spec.job.savepointRedeployNonce "
                       "to restore from the last savepoint")
    options.append("set spec.job.upgradeMode: stateless and bump restartNonce to start with empty state")
    return ctx.app_plan(Action.BLOCKED, f"{what} and upgradeMode is {ctx.desired.spec.job.upgrade_mode.value}: {why}. "
                                        "To proceed: " + "; or ".join(options) + ".")
