"""`flink-reconciler rollback APP --to REV` and `flink-reconciler savepoint APP`: the shell around
`reconciler.core.rollback`.

`prepare` reads what the decision needs (REV's spec from Git, the app's lineage and savepoints from
its record, the live app, whether the chosen savepoint still exists) and returns the plan, or a refusal
that says why. `execute` runs that plan through the normal executor, journaled like any upgrade.
`write_commit` instead puts REV's spec back on the branch with `initialSavepointPath` and a bumped
`savepointRedeployNonce`, so Git stays the truth and the normal apply path (the daemon) redeploys it.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from reconciler.apply.executor import AppResult, Executor, StepEvent
from reconciler.core.observed import JobPhase, Outcome, SavepointRecord
from reconciler.core.plan import Plan
from reconciler.core.rollback import Refusal, RollbackPoint, plan_rollback, rollback_point
from reconciler.errors import ObserveError, PermanentStepError, ReconcilerError, TransientStepError
from reconciler.live.artifacts import resolve_jar
from reconciler.live.observe import observe
from reconciler.report.status import CommitStatus
from reconciler.service.reconcile import Reconciler
from reconciler.source.specs import load_at
from reconciler.spec.load import load_files
from reconciler.spec.model import MAX_NONCE, FlinkApp
from reconciler.spec.policy import SpecPolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A rollback that can run: its plan and everything `execute` / `write_commit` need."""

    app: str
    revision: str  # full sha of REV
    head: str  # the branch tip it was computed against
    plan: Plan
    point: RollbackPoint
    target: FlinkApp  # the app's spec at REV
    target_file: str  # where REV kept it
    target_index: int  # its document index in that file
    head_file: str | None  # where the tip keeps it (None: the tip has no spec of it)
    head_index: int | None
    head_spec: FlinkApp | None
    current: FlinkApp | None  # what runs now, per the record
    current_revision: str | None


def prepare(rec: Reconciler, app: str, to: str) -> Prepared | Refusal:
    """The rollback plan of `app` to revision `to`, or why there is none. Reads, never writes."""
    rec.source.fetch()
    revision = rec.source.resolve(to)
    head = rec.source.head()
    short = revision[:12]
    pending = rec.journal.inflight(app)
    if pending is not None:
        return Refusal(f"app {app} has an unfinished execution of revision {pending.revision[:12]} "
                       f"({pending.plan.action.value}); run `flink-reconciler apply` to finish it first")
    lineage = rec.journal.lineage(app)
    record = rec.journal.record(app)
    if not lineage and record is None:
        return Refusal(f"no record of app {app}: nothing is known of the state it ran with (is --state-dir the "
                       "one `apply` or the daemon uses?)")
    point = rollback_point(revision, lineage, record.savepoints if record else ())
    if isinstance(point, Refusal):
        return point
    # Only the local runtime's savepoints are on this host (on Kubernetes a file: path is a volume of the
    # Flink pods): elsewhere Flink refuses a missing one at the start, and the plan's failure path runs.
    gone = savepoint_missing(point.savepoint.path) if rec.runtime_name == "local" else None
    if gone:
        older = [s.path for s in point.older if not savepoint_missing(s.path)]
        alt = (f"; an older savepoint of it still exists ({older[0]}): to use it, set spec.job.initialSavepointPath "
               "to it and bump spec.job.savepointRedeployNonce in a commit") if older else ""
        return Refusal(f"the state to restore revision {short} from is gone: {point.savepoint.path} {gone}{alt}")
    at_rev = load_at(rec.source, revision, rec.subdir, policy=SpecPolicy.PERMISSIVE)
    loaded = at_rev.apps.get(app)
    if loaded is None:
        why = "; ".join(str(e) for e in at_rev.errors if e.app == app)
        return Refusal(f"revision {short} has no valid spec of app {app}" + (f" ({why})" if why else ""))
    at_head = load_at(rec.source, head, rec.subdir, policy=SpecPolicy.PERMISSIVE) if head != revision else at_rev
    head_loaded = at_head.apps.get(app)
    current = FlinkApp.model_validate(record.last_applied_spec) if record and record.last_applied_spec else None
    live = observe(rec.runtime, {app}).get(app)
    if live.cluster.value == "unknown":
        return Refusal(f"app {app} cannot be observed ({live.cluster_message}); nothing is changed until it can be")
    head_note = None
    if head_loaded is None or head_loaded.app.canonical() != loaded.app.canonical():
        head_note = (f"the branch tip {head[:12]} has another spec of it: the next `apply` or daemon pass goes "
                     "back to that one unless Git changes (`--write-commit` puts this rollback on the branch)")
    the_plan = plan_rollback(app=app, revision=revision, target=loaded.app, current=current, live=live, point=point,
                             attempt=len(lineage) + 1, source_file=loaded.file, head_note=head_note)
    return Prepared(app=app, revision=revision, head=head, plan=the_plan, point=point, target=loaded.app,
                    target_file=loaded.file, target_index=loaded.doc_index,
                    head_file=head_loaded.file if head_loaded else None,
                    head_index=head_loaded.doc_index if head_loaded else None,
                    head_spec=head_loaded.app if head_loaded else None, current=current,
                    current_revision=record.last_applied_revision if record else None)


def savepoint_missing(location: str) -> str | None:
    """Why a savepoint on the local filesystem is gone (None: it is there, or its storage is remote
    and is not checked here: Flink says so when the job starts)."""
    parsed = urlparse(location)
    if parsed.scheme not in ("", "file"):
        return None
    path = Path(unquote(parsed.path) if parsed.scheme == "file" else location)
    if not path.exists():
        return "does not exist any more (disposed of by retention, or deleted by hand)"
    return None


def execute(rec: Reconciler, prepared: Prepared, *, on_event: Callable[[StepEvent], None] | None = None
            ) -> AppResult:
    """Run the rollback plan through the executor (journaled and resumable like any upgrade), record
    it under REV, and report it on REV's commit."""
    if rec.runtime is None:
        raise PermanentStepError("no runtime (dry run): a rollback cannot be executed")

    def jar(app: FlinkApp) -> Path | None:
        rev = prepared.revision if app.canonical() == prepared.target.canonical() else (
            prepared.current_revision or prepared.revision)
        uri = app.spec.job.jar_uri
        if "://" not in uri and not uri.startswith("/"):
            return rec.source.materialize(rev, uri, rec.artifact_cache / "git")
        return resolve_jar(uri, repo_root=None, cache_dir=rec.artifact_cache / "http", sha256=app.spec.job.jar_sha256)

    for ap in prepared.plan.apps:
        if ap.source_file:
            rec.journal.set_source_file(ap.app, ap.source_file)
    executor = Executor(rec.runtime, rec.journal, rec.clock, resolve_jar=jar, on_event=on_event, max_parallel=1)
    result = executor.run(prepared.plan)[prepared.app]
    if rec.reporter is not None:
        status = CommitStatus(revision=prepared.revision, app=prepared.app, state=result.outcome,
                              target_url=rec.target_url, restored_from=result.restored_from,
                              savepoints=result.savepoints, at=rec.clock.now(), description="")
        text = f"rollback to {prepared.revision[:12]}: {result.message}"
        if status.has_lineage:
            text += f" ({status.lineage_text()})"
        rec.reporter.report(dataclasses.replace(status, description=text))
    return result


# ------------------------------------------------------------------------------------------ write-commit


def next_nonce(*specs: FlinkApp | None) -> int:
    """A savepointRedeployNonce that none of the given specs has (the planner redeploys on a change)."""
    seen = [s.spec.job.savepoint_redeploy_nonce for s in specs if s is not None]
    top = max((n for n in seen if n is not None), default=0)
    return top + 1 if top < MAX_NONCE else min(n for n in seen if n is not None) - 1


def rollback_file(rec: Reconciler, prepared: Prepared) -> tuple[str, bytes, int]:
    """(path, new content, nonce) of the spec file that puts REV's spec back on the branch, restored
    from the rollback point: REV's document of the app with initialSavepointPath and a new
    savepointRedeployNonce, in the file the tip keeps it in (other documents of that file untouched)."""
    nonce = next_nonce(prepared.target, prepared.head_spec, prepared.current)
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        rev_docs = list(yaml.load_all(rec.source.read_file(prepared.revision, prepared.target_file).decode()))
        doc = rev_docs[prepared.target_index]
        job = doc["spec"]["job"]
        job["initialSavepointPath"] = prepared.point.savepoint.path
        job["savepointRedeployNonce"] = nonce
        path = prepared.head_file or prepared.target_file
        docs: list[Any] = [doc]
        if prepared.head_file is not None and prepared.head_index is not None:
            docs = list(yaml.load_all(rec.source.read_file(prepared.head, prepared.head_file).decode()))
            docs[prepared.head_index] = doc
        else:
            try:
                existing = rec.source.read_file(prepared.head, path)
            except ReconcilerError:
                existing = None
            if existing is not None:
                docs = [*yaml.load_all(existing.decode()), doc]
        out = io.StringIO()
        yaml.dump_all(docs, out)
    except (YAMLError, KeyError, TypeError, IndexError, UnicodeDecodeError) as e:
        raise PermanentStepError(f"cannot rewrite the spec of app {prepared.app} from {prepared.target_file} at "
                                 f"{prepared.revision[:12]}: {e}") from e
    data = out.getvalue().encode()
    check = load_files({path: data}, policy=SpecPolicy.PERMISSIVE).apps.get(prepared.app)
    expect = prepared.target.canonical()["spec"]["job"] | {
        "initialSavepointPath": prepared.point.savepoint.path, "savepointRedeployNonce": nonce}
    if check is None or check.app.canonical()["spec"]["job"] != expect:
        raise PermanentStepError(f"the rewritten {path} does not hold the spec of app {prepared.app} at "
                                 f"{prepared.revision[:12]} (a bug): nothing was committed")
    return path, data, nonce


def write_commit(rec: Reconciler, prepared: Prepared) -> str:
    """Commit the rollback on the tracked branch (on top of the tip `prepare` read) and push it; returns
    the new commit's sha. A branch that moved meanwhile is never overwritten."""
    path, data, nonce = rollback_file(rec, prepared)
    sp = prepared.point.savepoint
    message = (f"rollback({prepared.app}): back to {prepared.revision[:12]}, restored from its savepoint\n\n"
               f"Restores the spec of app {prepared.app} at {prepared.revision} in {path},\n"
               f"with spec.job.initialSavepointPath: {sp.path}\n"
               f"({prepared.point.how}, {sp.taken_at:%Y-%m-%d %H:%M:%S} UTC)\n"
               f"and spec.job.savepointRedeployNonce: {nonce}, so the next pass redeploys it from there.\n\n"
               "Written by `flink-reconciler rollback --write-commit`.\n")
    sha = rec.source.commit_file(prepared.head, path, data, message)
    rec.source.push_commit(sha)
    return sha


# ------------------------------------------------------------------------------------------ manual savepoint


@dataclass(frozen=True)
class TakenSavepoint:
    record: SavepointRecord
    revision: str | None  # the applied revision its job runs


def take_savepoint(rec: Reconciler, app: str, *, deadline_s: float = 300.0, poll_s: float = 0.5) -> TakenSavepoint:
    """Trigger a savepoint of the app's running job now (the job keeps running), wait for it, record it
    as kind "manual" (retention never disposes of one) and report it on the applied revision's commit."""
    if rec.runtime is None:
        raise PermanentStepError("no runtime (dry run): no savepoint can be taken")
    record = rec.journal.record(app)
    live = observe(rec.runtime, {app}).get(app)
    if live.job_id is None or live.job is not JobPhase.RUNNING:
        state = f"job {live.job_id} is {live.flink_state}" if live.job_id else f"its cluster is {live.cluster.value}"
        raise PermanentStepError(f"app {app} has no running job to take a savepoint of ({state})")
    flink = rec.runtime.flink(app)
    trigger = flink.trigger_savepoint(live.job_id, trigger_id=uuid.uuid4().hex)
    end = rec.clock.monotonic() + deadline_s
    while True:
        try:
            status = flink.savepoint_status(live.job_id, trigger)
        except (TransientStepError, ObserveError):
            status = None
        if status is not None and status.done:
            if status.failure or not status.location:
                raise PermanentStepError(f"the savepoint of job {live.job_id} failed: "
                                         f"{status.failure or 'no location reported'}")
            break
        if rec.clock.monotonic() >= end:
            raise PermanentStepError(f"the savepoint of job {live.job_id} did not complete within {deadline_s:g}s "
                                     f"(trigger {trigger}); it may still complete in Flink")
        rec.clock.sleep(poll_s)
    revision = record.last_applied_revision if record else None
    sp = rec.journal.add_savepoint(app, status.location, job_id=live.job_id, revision=revision, kind="manual")
    if rec.reporter is not None and revision is not None:
        lineage = [e for e in rec.journal.lineage(app) if e.revision == revision]
        last = lineage[-1] if lineage else None
        taken = (*(last.savepoints if last else ()), sp.path)
        rec.reporter.report(CommitStatus(
            revision=revision, app=app, state=Outcome.SUCCESS, target_url=rec.target_url,
            restored_from=last.restored_from if last else None, savepoints=taken, at=rec.clock.now(),
            description=f"{(last.action if last else 'applied')} applied at {revision[:12]}; job {live.job_id} "
                        f"running; manual savepoint {sp.path}"))
    return TakenSavepoint(record=sp, revision=revision)
