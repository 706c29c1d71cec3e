"""Where an app's record is kept: the records port and its local backend.

A record is one JSON document per app (see `reconciler.apply.journal` for what it holds). It lives with
the runtime it describes, never only on the reconciler's own disk:

- local runtime: `<state_dir>/records/<app>.json`, beside `clusters/` and `savepoints/` (this module);
- kubernetes: a ConfigMap per app in the app's namespace (`reconciler.live.kubernetes.records`).

Every write is a compare-and-set on the version the writer last read, so a writer that raced another
never overwrites it silently (`RecordConflictError`); the Kubernetes backend also checks the leader
Lease before each write (`FencedError`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from reconciler.errors import JournalError, RecordConflictError

Doc = dict[str, Any]

# App names are DNS-1123 subdomains (validated by the spec model); anything else never becomes a path.
_SAFE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")


@dataclass(frozen=True)
class StoredRecord:
    """A record as read, with the version a compare-and-set write must name."""

    doc: Doc
    version: str


@dataclass(frozen=True)
class BrokenRecord:
    """A record that is there but cannot be read (a truncated file, a ConfigMap edited by hand).

    Listed beside the readable ones, so one bad record blocks its own app only; `version` is what a
    compare-and-set would have to name, so a writer that did not see it can never overwrite it."""

    reason: str  # names the file or ConfigMap and what is wrong with it
    version: str
    where: str  # the file path, or "ConfigMap <namespace>/<name>"
    raw: bytes  # the bytes as stored, for `flink-reconciler record show` and for moving them aside


Read = StoredRecord | BrokenRecord


class RecordStore(Protocol):
    """Durable per-app documents with compare-and-set writes."""

    where: str  # for messages: "<state_dir>/records", "ConfigMaps in namespaces a, b"

    def list(self) -> dict[str, Read]:
        """Every record, in as few requests as the backend allows (never one per app). A record that cannot
        be read is a BrokenRecord of its app: it never hides the others."""
        ...

    def get(self, app: str) -> Read | None: ...

    def put(self, app: str, doc: Doc, *, expected: str | None) -> str:
        """Write `doc` if the stored version is still `expected` (None: the record must not exist yet).
        Returns the new version; raises RecordConflictError when someone else wrote first."""
        ...

    def delete(self, app: str, *, expected: str) -> None: ...


@runtime_checkable
class SetsAside(Protocol):
    """A store that can move an app's record aside (`flink-reconciler record rebuild`): the bytes are kept under
    another name the store no longer lists, so the next pass meets the app as if its record were lost."""

    def set_aside(self, app: str, suffix: str) -> str:
        """Move the record; returns where it went. JournalError when there is none."""
        ...


def encode(doc: Doc) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()


def decode(raw: bytes | str, where: str) -> Doc:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise JournalError(f"{where}: not a readable flink-reconciler record ({e})") from e
    if not isinstance(doc, dict):
        raise JournalError(f"{where}: not a readable flink-reconciler record (not a JSON object)")
    return doc


def is_record_name(app: str) -> bool:
    """Whether `app` can have a record: an app name, not the file path an unreadable file is planned under."""
    return bool(_SAFE_NAME.match(app))


def safe_name(app: str) -> str:
    if not _SAFE_NAME.match(app):
        raise JournalError(f"refusing to keep a record for an app named {app!r} (not a DNS-1123 name)")
    return app


class FileRecordStore:
    """`<dir>/<app>.json`, written atomically (temp file, fsync, rename, fsync of the directory).

    The version is the SHA-256 of the file's bytes. Compare-and-set holds across processes through an
    flock on `<dir>/.lock` around read-compare-write. Parsed files are cached by (inode, mtime, size),
    so listing 10,000 unchanged records costs 10,000 stat calls and no parsing."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.where = str(self.dir)
        self._cache: dict[str, tuple[tuple[int, int, int], Read]] = {}

    def list(self) -> dict[str, Read]:
        out: dict[str, Read] = {}
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise JournalError(f"{self.dir}: cannot list records: {e.strerror or e}") from e
        for entry in entries:
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                rec = self._read(entry.name[: -len(".json")])
            except JournalError as e:  # e.g. a file we may not read: that app's problem only
                rec = BrokenRecord(str(e), "unreadable", entry.path, b"")
            if rec is not None:
                out[entry.name[: -len(".json")]] = rec
        return out

    def get(self, app: str) -> Read | None:
        return self._read(safe_name(app))

    def set_aside(self, app: str, suffix: str) -> str:
        """Move the app's record file to `<app>.json.<suffix>` (kept, never deleted; no longer listed).
        Returns where it went. Nothing there: JournalError."""
        path = self._path(app)
        aside = path.with_name(f"{path.name}.{suffix}")
        with self._locked():
            if not path.exists():
                raise JournalError(f"{path}: there is no record of app {app} to move aside")
            if aside.exists():
                raise JournalError(f"{aside} exists already; not overwriting it")
            try:
                os.link(path, aside)  # the bytes are under the new name before the old one goes
                path.unlink()
                self._fsync_dir()
            except OSError as e:
                raise JournalError(f"{path}: cannot move the record aside: {e.strerror or e}") from e
        self._cache.pop(app, None)
        return str(aside)

    def put(self, app: str, doc: Doc, *, expected: str | None) -> str:
        path = self._path(app)
        data = encode(doc)
        with self._locked():
            current = self._read(app, fresh=True)
            have = current.version if current else None
            if have != expected:
                raise RecordConflictError(
                    f"{path}: the record changed since it was read (expected version {expected or 'none'}, "
                    f"found {have or 'none'}); another flink-reconciler wrote it")
            tmp = path.with_name(f".{path.name}.tmp")
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                self._fsync_dir()
            except OSError as e:
                raise JournalError(f"{path}: cannot write the record: {e.strerror or e}") from e
        version = _digest(data)
        self._cache.pop(app, None)
        return version

    def delete(self, app: str, *, expected: str) -> None:
        path = self._path(app)
        with self._locked():
            current = self._read(app, fresh=True)
            if current is None:
                return
            if current.version != expected:
                raise RecordConflictError(f"{path}: the record changed since it was read; not deleting it")
            path.unlink(missing_ok=True)
            self._fsync_dir()
        self._cache.pop(app, None)

    # ---- plumbing -----------------------------------------------------------------------------

    def _path(self, app: str) -> Path:
        return self.dir / f"{safe_name(app)}.json"

    def _read(self, app: str, *, fresh: bool = False) -> Read | None:
        path = self.dir / f"{app}.json"
        try:
            st = path.stat()
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            hit = self._cache.get(app)
            if hit is not None and hit[0] == key and not fresh:
                return hit[1]
            raw = path.read_bytes()
        except FileNotFoundError:
            self._cache.pop(app, None)
            return None
        except OSError as e:
            raise JournalError(f"{path}: cannot read the record: {e.strerror or e}") from e
        rec: Read
        try:
            rec = StoredRecord(decode(raw, str(path)), _digest(raw))
        except JournalError as e:
            rec = BrokenRecord(str(e), _digest(raw), str(path), raw)
        self._cache[app] = (key, rec)
        return rec

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise JournalError(f"{self.dir}: cannot open the records lock: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]
