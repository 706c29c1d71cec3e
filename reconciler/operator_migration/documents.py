"""Which document of `flink-reconciler import`'s input becomes what (pure): the entry of the mapping.

An application-mode FlinkDeployment becomes a FlinkApp (`application`), a session-mode one (no spec.job) a
FlinkSessionCluster and a FlinkSessionJob a FlinkApp on it (`session`); every other document is
reported with the reason. Its own module so that both mappings sit below it (no import cycle).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.operator_migration import session
from reconciler.operator_migration.application import (
    FLINK_DEPLOYMENT,
    FLINK_SESSION_JOB,
    OPERATOR_GROUP,
    Converter,
    Finding,
    Imported,
    UnimportableError,
)


def expand_lists(docs: Iterable[Any]) -> list[Any]:
    """`kind: List` (as `kubectl get -o yaml` prints) becomes its items, in order; empty documents are dropped."""
    out: list[Any] = []
    for doc in docs:
        if doc is None:
            continue
        if isinstance(doc, Mapping) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out += [item for item in doc["items"] if item is not None]
        else:
            out.append(doc)
    return out


def import_documents(docs: Iterable[Any]) -> list[Imported]:
    """Every document of the input, converted or reported; never an exception for bad input."""
    return import_groups([docs])[0]


def import_groups(groups: Iterable[Iterable[Any]]) -> list[list[Imported]]:
    """`import_documents` of several inputs (files) read together: a FlinkSessionJob takes the operator options
    of its session FlinkDeployment and is checked against it wherever of the inputs that is
    (operator_migration.session). Documents are numbered per input."""
    items = [expand_lists(g) for g in groups]
    clusters = session.session_deployments([doc for g in items for doc in g])
    linked = session.link([import_document(doc, i, session_clusters=clusters) for g in items
                           for i, doc in enumerate(g)], clusters)
    out: list[list[Imported]] = []
    for g in items:
        out.append(linked[:len(g)])
        linked = linked[len(g):]
    return out


def import_document(doc: Any, index: int = 0, *,
                    session_clusters: Mapping[tuple[str, str], Mapping[str, Any]] | None = None) -> Imported:
    """One document. `session_clusters`: the session FlinkDeployments of the same input by (namespace, name),
    whose operator options a FlinkSessionJob on them inherits (as the operator merges them)."""
    if not isinstance(doc, Mapping):
        return Imported(index, "?", None, None, findings=(
            Finding("", f"document {index + 1} is a {type(doc).__name__}, not a Kubernetes object", True),))
    kind = str(doc.get("kind") or "?")
    api = str(doc.get("apiVersion") or "")
    meta = doc.get("metadata")
    name = str(meta.get("name")) if isinstance(meta, Mapping) and meta.get("name") is not None else None
    if not api.startswith(OPERATOR_GROUP + "/"):
        return Imported(index, kind, name, None, findings=(Finding(
            "apiVersion", f"{api or 'no apiVersion'} {kind} is not a Flink Kubernetes Operator resource: "
            "not imported (keep it, or manage it apart from flink-reconciler)", True),))
    if kind not in (FLINK_DEPLOYMENT, FLINK_SESSION_JOB):
        return Imported(index, kind, name, None, findings=(Finding("kind", _other_kind(kind), True),))
    if api != f"{OPERATOR_GROUP}/v1beta1":
        return Imported(index, kind, name, None, findings=(Finding(
            "apiVersion", f"{api} is not a version this import reads (flink.apache.org/v1beta1)", True),))
    conv: Converter
    if kind == FLINK_SESSION_JOB:
        conv = session.SessionJobConverter(doc, session_clusters or {})
    elif session.is_session_deployment(doc):
        conv = session.SessionClusterConverter(doc)
    else:
        conv = Converter(doc)
    try:
        app = conv.run()
    except UnimportableError as e:
        return Imported(index, kind, name, None, findings=(Finding(e.field, e.message, True),))
    return Imported(index, kind, name, app, dict(conv.origins), tuple(conv.findings))


def _other_kind(kind: str) -> str:
    if kind == "FlinkStateSnapshot":
        return ("a FlinkStateSnapshot is a savepoint or checkpoint record, not an app: not imported (start an "
                "imported app from its path with spec.job.initialSavepointPath)")
    if kind == "FlinkBlueGreenDeployment":
        return ("blue/green deployments have no FlinkApp equivalent (the reconciler's warm standby moves a job "
                "to a new cluster instead): not imported")
    return f"{kind} has no FlinkApp equivalent: not imported"
