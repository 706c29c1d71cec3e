"""The app's history: the transition log (`flink-reconciler history`), the lineage (which state each
execution's job started from, which savepoints it took) and the savepoint list. Every other part writes its
history line through `_transition`; a repeat of the last line is folded into it (`_repeat`), so an app blocked
for an hour is one entry, not one a pass.
"""

from __future__ import annotations

from datetime import datetime

from reconciler.apply.journal.access import RecordAccess
from reconciler.apply.journal.document import (
    MAX_SAVEPOINTS,
    MAX_TRANSITIONS,
    REPEAT_EVERY,
    Lineage,
    Transition,
    read_lineage,
    read_transitions,
)
from reconciler.core.observed import Outcome, SavepointRecord
from reconciler.core.plan import reason_key
from reconciler.live.records import Doc


class History(RecordAccess):
    """The transition log, the lineage and the savepoint list of each app."""

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

    def _transition(self, doc: Doc, revision: str | None, action: str, *, outcome: Outcome | None,
                    message: str | None) -> None:
        lines = doc.setdefault("transitions", [])
        lines.append({"at": self._now(), "revision": revision, "action": action,
                      "outcome": outcome.value if outcome else None, "message": message})
        del lines[:-MAX_TRANSITIONS]

    def lineage(self, app: str) -> list[Lineage]:
        return read_lineage(app, self._doc(app), self.store.where)

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
