"""Field diff between two FlinkApp documents, classified by the change ladder.

Operations are JSON Patch (RFC 6902, via jsonpatch) between canonical documents; each op gets the
change class of the deepest model field its path reaches (dict and list fields pass their class down
to everything inside them).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonpatch
from jsonpointer import resolve_pointer
from pydantic import BaseModel

from reconciler.core.plan import FieldChange
from reconciler.redaction import REDACTED, looks_secret, mask_config
from reconciler.spec.model import ChangeClass, FlinkApp

_MISSING = object()


def diff(old: dict[str, Any] | None, new: dict[str, Any]) -> tuple[FieldChange, ...]:
    """Changes from `old` to `new` (canonical FlinkApp JSON). `old` None: everything is added."""
    if old is None or old == new:
        return ()
    ops = jsonpatch.make_patch(old, new).patch
    out: list[FieldChange] = []
    for op in ops:
        kind = op["op"]
        if kind == "move":  # jsonpatch folds remove+add of equal values; unfold for reviewers
            out.append(_change("remove", op["from"], old, new))
            out.append(_change("add", op["path"], old, new, new_value=op.get("value", _value(new, op["path"]))))
        elif kind == "copy":
            out.append(_change("add", op["path"], old, new, new_value=_value(new, op["path"])))
        elif kind in ("add", "remove", "replace"):
            out.append(_change(kind, op["path"], old, new, new_value=op.get("value", _MISSING)))
    return tuple(sorted(out, key=lambda c: c.path))


def highest_class(changes: tuple[FieldChange, ...]) -> ChangeClass:
    return max((c.change_class for c in changes), default=ChangeClass.IGNORE)


def _change(kind: str, path: str, old: dict[str, Any], new: dict[str, Any], new_value: Any = _MISSING) -> FieldChange:
    before = _value(old, path) if kind in ("remove", "replace") else None
    return FieldChange(
        op=kind,
        path=path,
        old=_shown((old, new), path, None if before is _MISSING else before),
        new=_shown((old, new), path, None if new_value is _MISSING else new_value),
        change_class=class_of(path),
    )


def _shown(docs: tuple[dict[str, Any], dict[str, Any]], path: str, value: Any) -> Any:
    """What a reviewer sees of a changed value: a secret (by its key, at any depth, or as the value of an env entry
    whose name looks secret) is masked. A diff is display only; the plan carries the spec itself."""
    tokens = pointer_tokens(path)
    if value is None:
        return None
    if any(looks_secret(t) for t in tokens):
        return REDACTED
    if tokens and tokens[-1] == "value":  # {name: AWS_SECRET_ACCESS_KEY, value: ...}, named before or after
        parent = path.rsplit("/", 1)[0]
        for doc in docs:
            entry = _value(doc, parent)
            if isinstance(entry, dict) and isinstance(entry.get("name"), str) and looks_secret(entry["name"]):
                return REDACTED
    return mask_config(value)


def _value(doc: dict[str, Any], path: str) -> Any:
    return resolve_pointer(doc, path, _MISSING)


def pointer_tokens(pointer: str) -> tuple[str, ...]:
    """The unescaped tokens of a JSON pointer (RFC 6901: '~1' is '/', '~0' is '~')."""
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:])


def field_name(pointer: str) -> str:
    """The field a change is in, as users write it: 'spec.job.args' for '/spec/job/args/2' (list indexes
    folded, at most 4 levels; a Flink key keeps its dots)."""
    return ".".join([t for t in pointer_tokens(pointer) if not t.isdigit()][:4])


def class_of(pointer: str) -> ChangeClass:
    """The change class of a JSON pointer into a FlinkApp document."""
    return _class_of(pointer_tokens(pointer))


@cache
def _class_of(tokens: tuple[str, ...]) -> ChangeClass:
    model: type[BaseModel] | None = FlinkApp
    cls = ChangeClass.IGNORE
    for tok in tokens:
        if model is None:
            break  # inside a dict/list field: its class covers everything below
        field = _field(model, tok)
        if field is None:
            break
        extra = field.json_schema_extra
        tag = extra.get("x-change-class") if isinstance(extra, dict) else None
        cls = ChangeClass[str(tag).upper()] if tag else ChangeClass.IGNORE
        model = _submodel(field.annotation)
    return cls


def _field(model: type[BaseModel], alias: str) -> Any:
    for name, f in model.model_fields.items():
        if alias in (f.alias, name):
            return f
    return None


def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if getattr(annotation, "__origin__", None) in (tuple, list, dict):
        return None  # containers: the field's own class covers its items
    for arg in getattr(annotation, "__args__", ()):  # Optional[Model]
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None
