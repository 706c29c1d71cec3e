"""Logging setup: text or JSON lines on stderr, UTC ISO-8601 timestamps, `app` and `revision` on every
record logged inside `log_context(...)`.

The context lives in contextvars, so it follows the code that set it (a worker thread reconciling one
app) and never leaks into another thread's lines. A handler-level filter copies it onto each record,
so third-party loggers (apscheduler, httpx) get it too.

`redact()` is the one place credentials are taken out of text we emit: both formatters run every whole
line through it (message, fields, traceback), and the daemon's HTTP server runs every text answer
through it. It masks every value registered with `mask_secrets()` (the configured tokens and webhook
secrets), then URL credentials by the one rule of `redaction.redact_urls` (user-info up to the last `@`
of the authority, secret-looking query parameters).
`redact_config()` does the same for structured values (a spec shown by the dashboard) and also masks the
value of every key that looks secret (`looks_secret`: Flink's own rule for its configuration).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any, Literal

from reconciler.redaction import REDACTED, mask_config, redact_urls

_app: ContextVar[str | None] = ContextVar("log_app", default=None)
_revision: ContextVar[str | None] = ContextVar("log_revision", default=None)

CONTEXT_FIELDS = ("app", "revision")

_MIN_SECRET = 8  # shorter values would mask ordinary words (and are no secret anyway)


class _Secrets:
    """The registered secret values, longest first (so a secret containing another is masked whole)."""

    def __init__(self) -> None:
        self.values: tuple[str, ...] = ()
        self._lock = threading.Lock()

    def add(self, values: set[str]) -> None:
        with self._lock:
            self.values = tuple(sorted(set(self.values) | values, key=len, reverse=True))


_SECRETS = _Secrets()

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged as a field.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


@contextmanager
def log_context(*, app: str | None = None, revision: str | None = None) -> Iterator[None]:
    """Tag every record logged inside the block. Arguments left as None keep the outer value."""
    tokens = []
    if app is not None:
        tokens.append((_app, _app.set(app)))
    if revision is not None:
        tokens.append((_revision, _revision.set(revision)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def mask_secrets(*values: str | None) -> None:
    """Register secret values (tokens, webhook secrets) that `redact()` replaces wherever they appear,
    also in their JSON-escaped form. Process-wide, like logging itself; values under 8 characters
    are ignored."""
    new = {v for v in values if v and len(v) >= _MIN_SECRET}
    _SECRETS.add(new | {json.dumps(v, ensure_ascii=False)[1:-1] for v in new})


def redact(text: str) -> str:
    """`text` without credentials: URL user-info and registered secrets become `***`."""
    for secret in _SECRETS.values:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return redact_urls(text)


def redact_config(value: Any, key: str = "") -> Any:
    """`value` (a spec, a flinkConfiguration map, one entry's value under `key`) with the values of
    secret-looking keys replaced by `***`, at any depth (`redaction.mask_config`); every other string
    through `redact()`."""
    return _redact_strings(mask_config(value, key))


def _redact_strings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _redact_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_strings(v) for v in value]
    return redact(value) if isinstance(value, str) else value


def current_context() -> dict[str, str]:
    return {k: v for k, v in (("app", _app.get()), ("revision", _revision.get())) if v is not None}


class ContextFilter(logging.Filter):
    """Copies the current log_context onto the record (an explicit `extra={"app": ...}` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "app", None) is None:
            record.app = _app.get()
        if getattr(record, "revision", None) is None:
            record.revision = _revision.get()
        return True


def utc_timestamp(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """Fields passed with `extra=`; None values are left out (an unset field is no news)."""
    return {
        k: v for k, v in record.__dict__.items() if k not in _STANDARD and k not in CONTEXT_FIELDS and v is not None
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, app/revision when set, extras, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        for key, value in _extras(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = record.stack_info
        return redact(json.dumps(out, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """`<ts> <LEVEL> <logger> [app=.. revision=..] <msg> [key=value ...]`, for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [utc_timestamp(record.created), f"{record.levelname:<7}", record.name]
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                parts.append(f"{key}={value}")
        parts.append(record.getMessage())
        parts.extend(f"{k}={v}" for k, v in _extras(record).items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + record.stack_info
        return redact(line)


_HANDLER_MARK = "_flink_reconciler_handler"


def setup_logging(
    format: Literal["text", "json"] = "text",
    level: str | int = "INFO",
    *,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Install (or replace) our handler on the root logger; idempotent, so tests and the CLI can call it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    root.addHandler(handler)
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    root.setLevel(numeric)
    # Third-party request and scheduler logs (one INFO line per Flink REST request, per scheduled run) bury
    # the reconciler's own lines: WARNING and up unless the operator asked for debug.
    quiet = logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(quiet)
    return handler


THIRD_PARTY_LOGGERS = ("apscheduler", "httpx", "httpcore", "kubernetes", "urllib3", "git")
