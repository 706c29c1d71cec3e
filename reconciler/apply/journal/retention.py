"""Savepoint retention: which recorded savepoints are kept, which are forgotten, and the disposal of their
files (deleted here when local, by Flink when remote; adopted checkpoints only forgotten). Never fatal: a
disposal that fails is a history line naming the path to delete by hand.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Collection
from datetime import timedelta
from pathlib import Path
from typing import Final, Protocol, runtime_checkable
from urllib.parse import unquote, urlparse

from reconciler.apply.journal.document import read_lineage, savepoints_of
from reconciler.apply.journal.history import History
from reconciler.core.observed import Outcome, SavepointRecord
from reconciler.core.rollback import protected_rollback_points
from reconciler.errors import JournalError, ReconcilerError
from reconciler.live.records import Doc

log = logging.getLogger(__name__)


DISPOSAL_DEADLINE_S: Final = 60.0  # per savepoint Flink is asked to dispose of
_NOT_FOUND: Final = "FileNotFoundException"  # Flink's disposal of a savepoint that does not exist


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


class Retention(History):
    """Keep the savepoints retention asks for; forget and dispose of the others."""

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
