"""The per-app record outside an execution: every app's record as the planner reads it, attempts that run no
step (blocked, invalid), what is recorded without a step (a metadata change, an adopted job, a deleted
cluster, a forgotten app), and what self-healing and the autoscaler keep there (since when the job is
unhealthy, whether a fault already interrupted this spec, a late recovery, the autoscaler's sample window).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.apply.journal.document import next_attempt, read_app_record, revive
from reconciler.apply.journal.history import History
from reconciler.core.observed import AppRecord, Outcome, Records
from reconciler.core.plan import reason_key
from reconciler.live.records import Doc


class AppRecords(History):
    """Each app's record outside an execution."""

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
