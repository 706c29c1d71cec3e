"""Which document of `flink-reconciler import`'s input becomes what (pure): the entry of the mapping.

An application-mode FlinkDeployment becomes a FlinkApp (`application`), a session-mode one (no spec.job) a
FlinkSessionCluster and a FlinkSessionJob a FlinkApp on it (`session`); every other document is
reported with the reason. Its own module so that both mappings sit below it (no import cycle).
"""

from __future__ import annotations

import re
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


def import_documents(docs: Iterable[Any], *, namespace: str | None = None) -> list[Imported]:
    """Every document of the input, converted or reported; never an exception for bad input. `namespace`: for
    documents that name none (else they are written as default, flagged)."""
    return import_groups([docs], namespace=namespace)[0]


def import_groups(groups: Iterable[Iterable[Any]], *, namespace: str | None = None) -> list[list[Imported]]:
    """`import_documents` of several inputs (files) read together: a FlinkSessionJob takes the operator options
    of its session FlinkDeployment and is checked against it wherever of the inputs that is
    (operator_migration.session). Documents are numbered per input."""
    items = [expand_lists(g) for g in groups]
    clusters = session.session_deployments([doc for g in items for doc in g])
    linked = session.link([import_document(doc, i, session_clusters=clusters, namespace=namespace) for g in items
                           for i, doc in enumerate(g)], clusters)
    out: list[list[Imported]] = []
    for g in items:
        out.append(linked[:len(g)])
        linked = linked[len(g):]
    return out


def import_document(doc: Any, index: int = 0, *,
                    session_clusters: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
                    namespace: str | None = None) -> Imported:
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
        conv = session.SessionJobConverter(doc, session_clusters or {}, namespace=namespace)
    elif session.is_session_deployment(doc):
        conv = session.SessionClusterConverter(doc, namespace=namespace)
    else:
        conv = Converter(doc, namespace=namespace)
    templated = tuple(Finding(where, f"{text!r} is a Helm template expression: imported as this literal text, "
                                     "which is not what runs; import what `helm template` renders instead", True)
                      for where, text in helm_expressions(doc))
    try:
        app = conv.run()
    except UnimportableError as e:
        return Imported(index, kind, name, None, findings=(*templated, Finding(e.field, e.message, True)))
    except (ArithmeticError, LookupError, TypeError, ValueError) as e:  # a shape no rule above foresaw
        return Imported(index, kind, name, None, findings=(*templated, Finding(
            "", f"cannot be imported ({type(e).__name__}: {e}); the other documents are not affected", True)))
    return Imported(index, kind, name, app, dict(conv.origins), (*templated, *conv.findings))


_HELM = re.compile(r"\{\{.*\}\}", re.DOTALL)
# The operator's own placeholders (spec.ingress.template: IngressUtils), not a chart's.
_OPERATOR_PLACEHOLDER = re.compile(r"\{\{(name|namespace)\}\}")


def _templated(text: str) -> bool:
    return bool(_HELM.search(_OPERATOR_PLACEHOLDER.sub("", text)))


def helm_expressions(doc: Any, where: str = "", limit: int = 20) -> list[tuple[str, str]]:
    """(path, text) of the string values (and keys) holding a Helm/Go template expression `{{ ... }}`: a chart's
    source file, not what was applied (quoted, it parses as YAML and would be carried over verbatim)."""
    out: list[tuple[str, str]] = []

    def walk(node: Any, path: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(node, Mapping):
            for k, v in node.items():
                sub = f"{path}.{k}" if path else str(k)
                if isinstance(k, str) and _templated(k):
                    out.append((sub, k))
                walk(v, sub)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif isinstance(node, str) and _templated(node):
            out.append((path, node))

    walk(doc, where)
    return out


def _other_kind(kind: str) -> str:
    if kind == "FlinkStateSnapshot":
        return ("a FlinkStateSnapshot is a savepoint or checkpoint record, not an app: not imported (start an "
                "imported app from its path with spec.job.initialSavepointPath)")
    if kind == "FlinkBlueGreenDeployment":
        return ("blue/green deployments have no FlinkApp equivalent (the reconciler's warm standby moves a job "
                "to a new cluster instead): not imported")
    return f"{kind} has no FlinkApp equivalent: not imported"
