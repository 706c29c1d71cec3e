"""App records on Kubernetes: one ConfigMap per app, in the app's namespace, beside its cluster.

`<app>-flink-reconciler-record` holds the record as `data["record.json"]`. It has no ownerReferences
(it outlives suspend and deletion of the app's cluster, so a re-created app finds its last savepoint)
and not the app's selector labels (so pruning and the cascade delete of the app never touch it). It is
removed only by an explicit forget.

- Reads: one LIST per watched namespace for every record (never one GET per app).
- Writes: PUT with the resourceVersion last read (409 -> RecordConflictError), create with POST
  (409 AlreadyExists -> RecordConflictError).
- Fencing: with a `fence` (the leader Lease), every write first asks it for a token; a replica that lost
  the Lease gets FencedError before anything is written. The token (holder/leaseTransitions) is stamped
  on the record, and a write whose token is older than the stamp found on the record is refused too, so
  a deposed leader cannot overwrite what its successor wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reconciler.errors import FencedError, JournalError, RecordConflictError
from reconciler.live.kubernetes.api import Kube, KubernetesApiError, KubernetesUnavailableError
from reconciler.live.kubernetes.lease import LeaseElector
from reconciler.live.records import BrokenRecord, Doc, Read, StoredRecord, decode, encode, safe_name

DATA_KEY = "record.json"
NAME_SUFFIX = "-flink-reconciler-record"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_APP = "flink-reconciler.io/app"
LABEL_APP_ASIDE = "flink-reconciler.io/record-set-aside-of"  # a record moved aside by `record rebuild`
ANNOTATION_FENCE = "flink-reconciler.io/fence"
RECORD_SELECTOR = f"{LABEL_MANAGED_BY}=flink-reconciler,{LABEL_NAME}=flink-reconciler-record"
MAX_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB, metadata included


@dataclass(frozen=True)
class FenceToken:
    """Who leads, and which leadership term: leaseTransitions only grows."""

    holder: str
    transitions: int

    def __str__(self) -> str:
        return f"{self.holder}/{self.transitions}"

    @classmethod
    def parse(cls, text: str | None) -> FenceToken | None:
        if not text or "/" not in text:
            return None
        holder, _, n = text.rpartition("/")
        return cls(holder, int(n)) if n.isdigit() else None


def lease_fence(elector: LeaseElector) -> Callable[[], FenceToken]:
    """A fence backed by the leader Lease: asks the API server, not only our own renew timer, so a
    replica that believes it leads but was replaced (a long GC pause, a partition) is refused."""

    def fence() -> FenceToken:
        if not elector.is_leader():
            raise FencedError(f"this replica ({elector.identity}) does not hold lease "
                              f"{elector.namespace}/{elector.name}: it must not write records or act on apps")
        try:
            lease = elector.kube.get("Lease", elector.namespace, elector.name)
        except (KubernetesApiError, KubernetesUnavailableError) as e:
            raise FencedError(f"cannot confirm lease {elector.namespace}/{elector.name}: {e}") from e
        spec = (lease or {}).get("spec") or {}
        holder = spec.get("holderIdentity")
        if holder != elector.identity:
            raise FencedError(f"lease {elector.namespace}/{elector.name} is held by {holder or 'nobody'}, "
                              f"not by this replica ({elector.identity}): not writing")
        return FenceToken(holder, int(spec.get("leaseTransitions") or 0))

    return fence


def record_name(app: str) -> str:
    return safe_name(app) + NAME_SUFFIX


class ConfigMapRecordStore:
    """`reconciler.live.records.RecordStore` on ConfigMaps."""

    def __init__(self, kube: Kube, namespaces: tuple[str, ...] | list[str], *,
                 fence: Callable[[], FenceToken] | None = None) -> None:
        if not namespaces:
            raise ValueError("ConfigMapRecordStore needs at least one namespace")
        self.kube = kube
        self.namespaces = tuple(dict.fromkeys(namespaces))
        self.fence = fence
        self.where = "ConfigMaps *" + NAME_SUFFIX + " in namespace(s) " + ", ".join(self.namespaces)
        self._ns: dict[str, str] = {}  # app -> namespace of its record
        self._stamp: dict[str, FenceToken | None] = {}  # app -> fence token found on its record

    def list(self) -> dict[str, Read]:
        out: dict[str, Read] = {}
        for ns in self.namespaces:
            try:
                items = self.kube.list("ConfigMap", ns, RECORD_SELECTOR)
            except (KubernetesApiError, KubernetesUnavailableError) as e:
                raise JournalError(f"cannot list records in namespace {ns}: {e}") from e
            for obj in items:
                app = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_APP)
                if not app:
                    continue
                if app in out:
                    first = out[app]
                    out[app] = BrokenRecord(
                        f"app {app!r} has records in two namespaces ({self._ns[app]} and {ns}); app names must be "
                        "unique across the watched namespaces: delete or rename the wrong one",
                        first.version, f"ConfigMap {self._ns[app]}/{record_name(app)}",
                        first.raw if isinstance(first, BrokenRecord) else encode(first.doc))
                    continue
                out[app] = self._remember(app, obj)
        return out

    def get(self, app: str) -> Read | None:
        for ns in self._candidates(app):
            try:
                obj = self.kube.get("ConfigMap", ns, record_name(app))
            except (KubernetesApiError, KubernetesUnavailableError) as e:
                raise JournalError(f"cannot read the record of {app} in namespace {ns}: {e}") from e
            if obj is not None:
                return self._remember(app, obj)
        return None

    def put(self, app: str, doc: Doc, *, expected: str | None) -> str:
        token = self._check_fence(app)
        ns = self._ns.get(app) or doc.get("namespace") or self.namespaces[0]
        if ns not in self.namespaces:  # a record we would never list again is a record lost
            raise JournalError(f"app {app} is in namespace {ns}, which this reconciler does not watch "
                               f"({', '.join(self.namespaces)}): add it to `namespaces`")
        data = encode(doc).decode()
        if len(data) > MAX_BYTES:
            raise JournalError(f"the record of {app} would be {len(data)} bytes, more than a ConfigMap holds")
        meta: dict[str, Any] = {
            "name": record_name(app), "namespace": ns,
            "labels": {LABEL_MANAGED_BY: "flink-reconciler", LABEL_NAME: "flink-reconciler-record", LABEL_APP: app},
            "annotations": {ANNOTATION_FENCE: str(token)} if token else {},
        }
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {DATA_KEY: data}}
        try:
            if expected is None:
                out = self.kube.request("POST", Kube.path("ConfigMap", ns), body=body)
            else:
                meta["resourceVersion"] = expected
                out = self.kube.request("PUT", Kube.path("ConfigMap", ns, record_name(app)), body=body)
        except KubernetesApiError as e:
            if e.code in (404, 409):
                raise RecordConflictError(
                    f"record {ns}/{record_name(app)} changed since it was read ({e.reason}); not overwriting it"
                ) from e
            raise JournalError(f"cannot write record {ns}/{record_name(app)}: {e}") from e
        except KubernetesUnavailableError as e:
            raise JournalError(f"cannot write record {ns}/{record_name(app)}: {e}") from e
        self._ns[app] = ns
        self._stamp[app] = token
        return str(out["metadata"]["resourceVersion"])

    def delete(self, app: str, *, expected: str) -> None:
        self._check_fence(app)
        ns = self._ns.get(app) or self.namespaces[0]
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": expected}}
        try:
            self.kube.request("DELETE", Kube.path("ConfigMap", ns, record_name(app)), body=body)
        except KubernetesApiError as e:
            if e.code == 404:
                return
            if e.code == 409:
                raise RecordConflictError(f"record {ns}/{record_name(app)} changed since it was read") from e
            raise JournalError(f"cannot delete record {ns}/{record_name(app)}: {e}") from e
        except KubernetesUnavailableError as e:
            raise JournalError(f"cannot delete record {ns}/{record_name(app)}: {e}") from e
        self._ns.pop(app, None)
        self._stamp.pop(app, None)

    # ---- plumbing -----------------------------------------------------------------------------

    def _check_fence(self, app: str) -> FenceToken | None:
        if self.fence is None:
            return None
        token = self.fence()  # raises FencedError when this replica does not hold the Lease
        stamp = self._stamp.get(app)
        if stamp is not None and stamp.transitions > token.transitions:
            raise FencedError(f"the record of {app} was written by leader {stamp} (a later term than ours, "
                              f"{token}): this replica was deposed and must not write")
        return token

    def _candidates(self, app: str) -> tuple[str, ...]:
        known = self._ns.get(app)
        return (known,) if known else self.namespaces

    def _remember(self, app: str, obj: dict[str, Any]) -> Read:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or ""
        where = f"ConfigMap {ns}/{meta.get('name')}"
        raw = (obj.get("data") or {}).get(DATA_KEY)
        version = str(meta.get("resourceVersion"))
        self._ns[app] = ns
        self._stamp[app] = FenceToken.parse((meta.get("annotations") or {}).get(ANNOTATION_FENCE))
        if not isinstance(raw, str):
            return BrokenRecord(f"{where}: has no {DATA_KEY}", version, where, b"")
        try:
            return StoredRecord(decode(raw, where), version)
        except JournalError as e:
            return BrokenRecord(str(e), version, where, raw.encode())

    def set_aside(self, app: str, suffix: str) -> str:
        """Copy the record ConfigMap to `<name>-<suffix>` (without the record labels, so it is never listed
        again), then delete the original on its resourceVersion. A crash in between leaves both: the copy
        is there before the original goes, so the bytes are never lost."""
        self._check_fence(app)
        obj = None
        for ns in self._candidates(app):
            try:
                obj = self.kube.get("ConfigMap", ns, record_name(app))
            except (KubernetesApiError, KubernetesUnavailableError) as e:
                raise JournalError(f"cannot read the record of {app} in namespace {ns}: {e}") from e
            if obj is not None:
                break
        if obj is None:
            raise JournalError(f"there is no record of app {app} in namespace(s) {', '.join(self.namespaces)}")
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace") or "", f"{record_name(app)}-{suffix}"
        copy = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns,
                             "labels": {LABEL_MANAGED_BY: "flink-reconciler", LABEL_APP_ASIDE: app},
                             "annotations": dict(meta.get("annotations") or {})},
                "data": dict(obj.get("data") or {})}
        try:
            self.kube.request("POST", Kube.path("ConfigMap", ns), body=copy)
            body = {"apiVersion": "v1", "kind": "DeleteOptions",
                    "preconditions": {"resourceVersion": str(meta.get("resourceVersion"))}}
            self.kube.request("DELETE", Kube.path("ConfigMap", ns, record_name(app)), body=body)
        except KubernetesApiError as e:
            if e.code == 409:
                raise RecordConflictError(f"record {ns}/{record_name(app)} or {ns}/{name} changed meanwhile "
                                          f"({e.reason}); nothing more was done, look again") from e
            raise JournalError(f"cannot move record {ns}/{record_name(app)} aside: {e}") from e
        except KubernetesUnavailableError as e:
            raise JournalError(f"cannot move record {ns}/{record_name(app)} aside: {e}") from e
        self._ns.pop(app, None)
        self._stamp.pop(app, None)
        return f"ConfigMap {ns}/{name}"
