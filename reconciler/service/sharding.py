"""Sharding: which apps one reconciler owns (sha256(name) mod N), and the views of records and runtime it sees.

Application-level: a sharded `Reconciler` plans, resumes and prunes only its own apps, whatever runs it (the
daemon's `shard: auto` replicas in `reconciler.daemon.shards`, or a one-off command with `shard: <i>`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, cast

from reconciler.errors import JournalError
from reconciler.live.ports import ClusterInfo, Runtime
from reconciler.live.records import Doc, Read, RecordStore, SetsAside


def shard_of(app: str, shards: int) -> int:
    """The shard of `app`: stable across processes, hosts and Python versions (not `hash()`)."""
    digest = hashlib.sha256(app.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") % shards


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def owns(self, app: str) -> bool:
        return self.count <= 1 or shard_of(app, self.count) == self.index

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count}"


class ShardRecordStore:
    """The records of one shard's apps: another shard's records are neither listed nor read, so this
    shard never resumes, plans or prunes an app it does not own."""

    def __init__(self, store: RecordStore, shard: Shard) -> None:
        self._store = store
        self._shard = shard
        self.where = f"{store.where} ({shard})"

    def list(self) -> dict[str, Read]:
        return {app: rec for app, rec in self._store.list().items() if self._shard.owns(app)}

    def get(self, app: str) -> Read | None:
        return self._store.get(app) if self._shard.owns(app) else None

    def set_aside(self, app: str, suffix: str) -> str:
        if not isinstance(self._store, SetsAside):
            raise JournalError(f"{self._store.where}: records there cannot be moved aside")
        return self._store.set_aside(app, suffix)

    def put(self, app: str, doc: Doc, *, expected: str | None) -> str:
        return self._store.put(app, doc, expected=expected)

    def delete(self, app: str, *, expected: str) -> None:
        self._store.delete(app, expected=expected)


class _ShardView:
    """A runtime whose cluster list holds only the shard's apps: observing never calls another shard's
    JobManagers, and another shard's cluster is never taken for an orphan of this one."""

    def __init__(self, runtime: Runtime, shard: Shard) -> None:
        self._runtime = runtime
        self._shard = shard

    def list_clusters(self) -> dict[str, ClusterInfo]:
        return {app: info for app, info in self._runtime.list_clusters().items() if self._shard.owns(app)}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)


def shard_view(runtime: Runtime | None, shard: Shard | None) -> Runtime | None:
    """`runtime` as the shard sees it (itself when there is no sharding)."""
    if runtime is None or shard is None or shard.count <= 1:
        return runtime
    return cast(Runtime, _ShardView(runtime, shard))
