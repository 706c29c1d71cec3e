"""The spec reference (docs/spec.md) generated from the models, so the docs cannot drift from the code."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from reconciler.spec.model import FlinkApp


def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _submodel(arg)
        if found:
            return found
    return None


def _default(f: FieldInfo) -> str:
    if f.is_required():
        return "**required**"
    value = f.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return ""
    if isinstance(value, BaseModel):
        return "(see below)"
    if hasattr(value, "total_seconds"):
        secs = value.total_seconds()
        return f"`{int(secs // 60)}m`" if secs % 60 == 0 else f"`{secs:g}s`"
    if hasattr(value, "value"):
        value = value.value
    return f"`{json.dumps(value)}`"


def rows(model: type[BaseModel] = FlinkApp, prefix: str = "") -> list[tuple[str, str, str, str]]:
    out: list[tuple[str, str, str, str]] = []
    for name, f in model.model_fields.items():
        key = prefix + (f.alias or name)
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        cls = str(extra.get("x-change-class", ""))
        out.append((key, _default(f), cls, (f.description or "").replace("|", "\\|")))
        sub = _submodel(f.annotation)
        if sub is not None:
            list_like = getattr(f.annotation, "__origin__", None) is tuple
            out.extend(rows(sub, key + ("[]." if list_like else ".")))
    return out


def markdown() -> str:
    lines = [
        "# FlinkApp spec reference",
        "",
        "Generated from `reconciler/spec/model.py` by `flink-reconciler schema --reference` (a test keeps it in",
        "sync). The JSON Schema is `schemas/flinkapp.schema.json`; editors that speak yaml-language-server pick it",
        "up from the first line of a spec: `# yaml-language-server: $schema=<path>/flinkapp.schema.json`.",
        "",
        "**Change class** says what changing a field does to a running app (the change ladder; the highest class",
        "among the changed fields wins): `ignore` records the change and never touches the job; `scale` applies",
        "resources without restarting the job; `upgrade` restarts the job carrying its state per",
        "`spec.job.upgradeMode`; `redeploy` recreates the cluster, state still carried per `upgradeMode`.",
        "Unknown fields are errors (with a *did you mean* hint). Durations are `30s`, `5m`, `1h` or seconds",
        "(at most 365 days). What a spec may ask of the cluster (host access, privileged pods, jar hosts) is",
        "limited by the reconciler's spec policy: see [security.md](security.md).",
        "",
        "| field | default | change class | meaning |",
        "|---|---|---|---|",
    ]
    for key, default, cls, desc in rows():
        lines.append(f"| `{key}` | {default} | {cls} | {desc} |")
    return "\n".join(lines) + "\n"
