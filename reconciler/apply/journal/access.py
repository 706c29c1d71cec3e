"""Reading and writing records: the store, the journal's read cache, the records it will not touch, and the
one way every part writes (`_update`: a compare-and-set of the whole record); and the `apply` lock.

Records live with the runtime, not on the reconciler's disk (`reconciler.live.records`: files beside the
local clusters; ConfigMaps in the app's namespace on Kubernetes), so a new pod or a standby that takes over
finds every app's past and every half-done transition. The read cache is refreshed by `records()` (once per
pass: one LIST per namespace on Kubernetes). A record that cannot be read is broken: never written over, it is
what a human repairs (`flink-reconciler record rebuild`).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self, TypeVar

from reconciler.apply.journal.document import broken_reason, check_version, new_doc, read_app_record, read_inflight
from reconciler.clock import Clock
from reconciler.core.observed import AppRecord
from reconciler.errors import JournalError, RecordConflictError
from reconciler.live.records import BrokenRecord, Doc, FileRecordStore, Read, RecordStore, StoredRecord

T = TypeVar("T")


class RecordAccess:
    """The store, its read cache and broken records, the compare-and-set write, the lock."""

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
