"""The vocabulary the spec models are built from: change classes, durations, memory sizes, names, the base.

Every field of a FlinkApp or a FlinkSessionCluster is declared with `change(...)`, which tags it with its
change class; `Duration` and `MemorySize` are how the YAML spells time and memory; `SpecModel` is the frozen,
camelCase, closed base of every model. `model.py` and `session.py` build on these.
"""

from __future__ import annotations

import functools
import math
import re
from datetime import timedelta
from enum import IntEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

# Kubernetes object names are derived as <name>-taskmanager etc.; keep room for the suffixes.
MAX_NAME_LENGTH = 45
# ASCII only, whole string: `$` would also match before a trailing newline ("victim\n" a second app).
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# Flink option keys: dotted words (letters, digits, '-', '_'); nothing that could break config.yaml.
FLINK_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
MAX_FLINK_KEY_LENGTH = 256
# A DNS-1123 subdomain (Kubernetes object names such as a ServiceAccount): no namespace form.
SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_DURATION = timedelta(days=365)  # a deadline or an age beyond a year is a typo (and overflows)
MAX_NONCE = 2**63 - 1  # nonces travel as Kubernetes annotations and Java longs


def repo_jar_path(uri: str) -> str | None:
    """The repository path a jarURI names, normalised (`jobs/./x.jar`, `jobs/sub/../x.jar` -> `jobs/x.jar`);
    None when it is not a repository path (a scheme://, or an absolute path on the reconciler's host).
    Raises ValueError when it names no file inside the repository (`../x.jar`, `jobs/../../x.jar`, `.`):
    Git holds only what is inside it, so such a spec could never be applied."""
    if "://" in uri or uri.startswith("/"):
        return None
    parts: list[str] = []
    for part in uri.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ValueError(f"{uri!r} leaves the repository: a relative jarURI is a path inside the "
                                 "repository, and '..' here goes above its root")
            parts.pop()
        else:
            parts.append(part)
    if not parts:
        raise ValueError(f"{uri!r} names the repository root, not a jar file in it")
    return "/".join(parts)


def valid_name(value: str) -> bool:
    """An app name (or namespace): a DNS-1123 label of at most MAX_NAME_LENGTH characters."""
    return len(value) <= MAX_NAME_LENGTH and NAME_RE.fullmatch(value) is not None


class ChangeClass(IntEnum):
    """How disruptive applying a change to a field is (the Flink operator's DiffType ladder)."""

    IGNORE = 0  # metadata, policies: record only, never touch the job
    SCALE = 1  # resources that change without restarting the job
    UPGRADE = 2  # the job restarts, carrying state per upgradeMode
    REDEPLOY = 3  # the whole cluster is recreated (state still carried per upgradeMode)

    @property
    def label(self) -> str:
        return self.name.lower()


def _to_change_class(v: Any) -> ChangeClass:
    if isinstance(v, str):
        try:
            return ChangeClass[v.upper()]
        except KeyError:
            raise ValueError(f"unknown change class {v!r}") from None
    return ChangeClass(v)


# ChangeClass in JSON: its lower-case name ("upgrade"), not a number.
ChangeClassJSON = Annotated[
    ChangeClass,
    BeforeValidator(_to_change_class),
    PlainSerializer(lambda c: c.label, return_type=str),
    WithJsonSchema({"enum": ["ignore", "scale", "upgrade", "redeploy"]}),
]


def change(cls: ChangeClass, description: str, **kw: Any) -> Any:
    """A Field tagged with its change class; the tag lands in the JSON Schema and drives the diff."""
    return Field(
        description=description, json_schema_extra={"x-change-class": cls.label}, **kw
    )


_DURATION_RE = re.compile(r"[ \t]*([0-9]+(?:\.[0-9]+)?)[ \t]*(ms|s|m|h|d)?[ \t]*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> timedelta:
    """Accept '90s', '5m', '1h', '1.5h', 300 (seconds) or a timedelta; at most MAX_DURATION."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError("expected a duration like '30s', '5m' or '1h'")
    elif isinstance(value, int | float):
        seconds = float(value) if not isinstance(value, int) or abs(value) < 10**20 else math.inf
    elif isinstance(value, str) and (m := _DURATION_RE.fullmatch(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError(f"expected a duration like '30s', '5m' or '1h', got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a finite, non-negative duration, got {value!r}")
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"{value!r} is longer than {MAX_DURATION.days} days")
    return timedelta(seconds=seconds)


@functools.lru_cache(maxsize=256)  # a few distinct values, each formatted for every app on every pass
def format_duration(value: timedelta) -> str:
    secs = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size and secs % size == 0:
            return f"{int(secs // size)}{unit}"
    return f"{secs:g}s"


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^[ \t]*[0-9]+(\.[0-9]+)?[ \t]*(ms|s|m|h|d)?[ \t]*$"},
                {"type": "number", "minimum": 0, "maximum": MAX_DURATION.total_seconds()},
            ],
            "examples": ["30s", "5m", "1h"],
        }
    ),
]

_QUANTITY_RE = re.compile(r"[0-9]{1,15}(\.[0-9]{1,9})?([kmgt]b?|[KMGT]i?|[kmgt])?")


def _check_memory(value: str) -> str:
    if not _QUANTITY_RE.fullmatch(value):
        raise ValueError(f"expected a memory size like '1024m', '2g' or '2Gi', got {value!r}")
    return value


MemorySize = Annotated[str, BeforeValidator(lambda v: _check_memory(str(v)))]


class SpecModel(BaseModel):
    """Frozen, camelCase in YAML, no unknown fields."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
    )

