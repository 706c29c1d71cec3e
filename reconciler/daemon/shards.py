"""Sharding: several daemons split the apps of one repository, each reconciling only its own.

An app belongs to shard `sha256(name) mod shards`. The name alone, not its file or its namespace: app
names are unique in a repository, a renamed file or a namespace change must not move an app to another
shard (two shards would then both act on it), and an app known only from a record, a broken spec or a
cluster left behind has nothing but its name. A shard's daemon sees only its own apps everywhere it
looks (specs, records, clusters), so its plan, its prune decisions and its mass-deletion guard count its
own apps only. Errors no app can be named for (an unreadable file) stay visible to every shard: such a
file may hold any shard's app, so it blocks deletions everywhere.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, cast

from reconciler.live.ports import ClusterInfo, Runtime
from reconciler.live.records import Doc, RecordStore, StoredRecord


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

    def list(self) -> dict[str, StoredRecord]:
        return {app: rec for app, rec in self._store.list().items() if self._shard.owns(app)}

    def get(self, app: str) -> StoredRecord | None:
        return self._store.get(app) if self._shard.owns(app) else None

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
