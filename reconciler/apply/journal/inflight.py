"""The in-flight step log, the write-ahead part of the journal: how a crash resumes.

`begin` records the plan before any step touches anything; the executor marks each step started *before* it
has any effect outside and done *after* it completed, with what the step learned (our savepoint trigger id,
written before the request goes out; the captured restore point; the submitted job id). A process killed at
any moment leaves a record that says where to continue and with what. `finish` ends the execution in one write:
the outcome, the applied revision (on success only, Flux-style) and the execution's lineage.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reconciler.apply.journal.document import (
    KEEP,
    MAX_LINEAGE,
    MAX_REPAIRS,
    InFlight,
    Keep,
    Lineage,
    Stage,
    StepPhase,
    check_scratch,
    next_attempt,
    plan_namespace,
    read_inflight,
    revive,
    savepoints_of,
)
from reconciler.apply.journal.history import History
from reconciler.core.observed import Outcome
from reconciler.core.plan import INTERRUPTED, Action, AppPlan, spec_hash
from reconciler.errors import JournalError
from reconciler.live.records import Doc


class InFlightLog(History):
    """The write-ahead step log of each app's execution in flight."""

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


def _remember_failure(r: Doc, plan: Doc, outcome: Outcome, message: str, *, revision: str | None,
                      interrupted: bool) -> None:
    """The spec whose own execution failed is remembered apart from `last_attempted_*`, which a repair rewrites to
    the spec it runs: that spec is not tried again until Git changes it (`core.context.failed_before`). A repair's
    failure is the crash-loop guard's, an interruption is a fault's; a spec applied since is a fresh start, whichever
    execution applied it: a repair that finished Git's spec after an interrupted upgrade too (not one that put the
    last applied spec back while Git's spec is the failed one: `desired_revision`)."""
    action, desired = plan.get("action"), plan.get("desired")
    if not isinstance(desired, dict):
        return
    forget = outcome is Outcome.SUCCESS
    if action == Action.REPAIR.value:
        forget = forget and not plan.get("desired_revision") and r.get("failed_spec_hash") != spec_hash(desired)
    elif outcome is Outcome.FAILURE and not interrupted:
        r.update(failed_spec_hash=spec_hash(desired), failed_revision=revision, failed_message=message)
    if forget:
        for k in ("failed_spec_hash", "failed_revision", "failed_message"):
            r.pop(k, None)


def _failure_of(failed: str) -> str:
    """The failure itself out of `AppPlan.failed` ("this spec already failed at revision R: <what>")."""
    head, sep, what = failed.partition(": ")
    return what if sep and head.startswith("this spec already failed") else failed
