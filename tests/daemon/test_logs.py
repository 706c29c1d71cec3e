"""Logging: JSON and text lines carry app/revision from log_context; UTC ISO-8601 timestamps."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from reconciler.logs import current_context, log_context, mask_secrets, redact, setup_logging


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = setup_logging("json", "DEBUG", stream=out)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


# The loggers these tests write to. The root handler also takes lines of threads that earlier tests of the same
# process left running (a daemon's HTTP server, a scheduler): those are not this test's lines.
OURS = frozenset({"x", "reconciler.test", "apscheduler", "apscheduler.other"})


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [d for d in parsed if d["logger"] in OURS]


def test_json_lines_carry_app_and_revision(stream: io.StringIO) -> None:
    log = logging.getLogger("reconciler.test")
    with log_context(app="orders", revision="4f2a9c1e"):
        log.info("upgrading from %s", "savepoint", extra={"step": "savepoint"})
        logging.getLogger("apscheduler.other").warning("third-party line")
    log.info("outside")
    first, third_party, outside = lines(stream)
    assert first["msg"] == "upgrading from savepoint"
    assert (first["app"], first["revision"], first["step"]) == ("orders", "4f2a9c1e", "savepoint")
    assert (first["level"], first["logger"]) == ("INFO", "reconciler.test")
    assert (third_party["app"], third_party["revision"]) == ("orders", "4f2a9c1e")
    assert "app" not in outside
    assert "revision" not in outside


def test_timestamps_are_utc_iso8601(stream: io.StringIO) -> None:
    before = datetime.now(UTC)
    logging.getLogger("x").info("tick")
    ts = lines(stream)[0]["ts"]
    assert ts.endswith("Z")
    parsed = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    assert parsed.utcoffset() is not None
    assert parsed.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert abs((parsed - before).total_seconds()) < 5


def test_nested_contexts_restore_and_keep_outer_values(stream: io.StringIO) -> None:
    log = logging.getLogger("x")
    with log_context(revision="r1"):
        with log_context(app="a"):
            log.info("inner")
            assert current_context() == {"app": "a", "revision": "r1"}
        with log_context(app="b", revision="r2"):
            log.info("override")
        log.info("outer")
    inner, override, outer = lines(stream)
    assert (inner["app"], inner["revision"]) == ("a", "r1")
    assert (override["app"], override["revision"]) == ("b", "r2")
    assert "app" not in outer
    assert outer["revision"] == "r1"
    assert current_context() == {}


def test_context_does_not_leak_across_threads(stream: io.StringIO) -> None:
    log = logging.getLogger("x")
    barrier = threading.Barrier(2)

    def other() -> None:
        with log_context(app="other-app"):
            barrier.wait()
            log.info("from thread")
            barrier.wait()

    t = threading.Thread(target=other)
    with log_context(app="main-app"):
        t.start()
        barrier.wait()
        log.info("from main")
        barrier.wait()
    t.join()
    by_msg = {rec["msg"]: rec.get("app") for rec in lines(stream)}
    assert by_msg == {"from thread": "other-app", "from main": "main-app"}


def test_exceptions_are_in_the_json(stream: io.StringIO) -> None:
    try:
        raise ValueError("bad spec")
    except ValueError:
        logging.getLogger("x").exception("failed")
    rec = lines(stream)[0]
    assert rec["level"] == "ERROR"
    assert "ValueError: bad spec" in rec["exc"]


def test_text_format_and_level() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = setup_logging("text", "warning", stream=out)
    try:
        with log_context(app="orders", revision="abc"):
            logging.getLogger("x").info("hidden")
            logging.getLogger("x").warning("shown", extra={"port": 8080})
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    (line,) = out.getvalue().splitlines()
    ts, rest = line.split(" ", 1)
    assert ts.endswith("Z")
    assert rest.split() == ["WARNING", "x", "app=orders", "revision=abc", "shown", "port=8080"]


def test_setup_is_idempotent() -> None:
    root = logging.getLogger()
    level = root.level
    before = list(root.handlers)
    first = setup_logging("json", "INFO", stream=io.StringIO())
    second = setup_logging("text", "INFO", stream=io.StringIO())
    try:
        ours = [h for h in root.handlers if h not in before]
        assert ours == [second]
        assert first not in root.handlers
        assert logging.getLogger("apscheduler").level == logging.WARNING
    finally:
        root.removeHandler(second)
        root.setLevel(level)


def test_credentials_are_redacted_from_every_part_of_a_line(stream: io.StringIO) -> None:
    mask_secrets("s3cret-webhook-value", 'quo"ted-secret', "short")
    log = logging.getLogger("reconciler.test")
    url = "https://ghp_tokenAsUser123@git.example.com/acme/apps.git"
    try:
        raise RuntimeError(f"fetch of {url} failed; user:pw form https://bot:hunter2-pass@example.com/x")
    except RuntimeError:
        log.exception("pass failed for %s", url, extra={"repo": url, "secret": "s3cret-webhook-value"})
    log.info('quoted %s and a word that is short', 'quo"ted-secret')
    raw = stream.getvalue()
    for leaked in ("ghp_tokenAsUser123", "hunter2-pass", "bot:", "s3cret-webhook-value", "ted-secret"):
        assert leaked not in raw
    first, second = lines(stream)
    assert first["msg"] == "pass failed for https://***@git.example.com/acme/apps.git"
    assert first["repo"] == "https://***@git.example.com/acme/apps.git"
    assert first["secret"] == "***"
    assert "https://***@example.com/x" in first["exc"]
    assert second["msg"] == "quoted *** and a word that is short"  # under 8 characters: not a secret


def test_redact_leaves_ordinary_text_alone() -> None:
    for text in ("ssh to git@github.com:acme/apps.git", "mail dev@example.com", "https://git.example.com/a@b",
                 "s3://bucket/savepoints/sp-1", "http://127.0.0.1:8081/jobs/overview"):
        assert redact(text) == text
    assert redact("ssh://git@host/repo.git") == "ssh://git@host/repo.git"  # an ssh user is no secret
    assert redact("ssh://git:pw-in-url@host/repo.git") == "ssh://***@host/repo.git"


def test_text_lines_are_redacted_too() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = setup_logging("text", "INFO", stream=out)
    try:
        logging.getLogger("reconciler.test").warning("sync failed: https://tok3n-as-user@host/r.git",
                                                     extra={"url": "http://u:p4ssw0rd@host"})
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    line = out.getvalue()
    assert "sync failed: https://***@host/r.git url=http://***@host" in line
    assert "tok3n" not in line and "p4ssw0rd" not in line


@pytest.mark.parametrize("name", ["httpx", "httpcore.connection", "kubernetes.client.rest", "urllib3.connectionpool"])
def test_third_party_request_logs_are_quiet_unless_debug(name: str) -> None:
    root = logging.getLogger()
    level = root.level
    out = io.StringIO()
    handler = setup_logging("text", "INFO", stream=out)
    try:
        logging.getLogger(name).info("HTTP Request: GET http://127.0.0.1/jobs/overview 200 OK")
        logging.getLogger(name).warning("connection pool is full")
        assert "jobs/overview" not in out.getvalue()
        assert "connection pool is full" in out.getvalue()
        handler = setup_logging("text", "DEBUG", stream=out)
        logging.getLogger(name).info("HTTP Request: GET http://127.0.0.1/jobs/overview 200 OK")
        assert "jobs/overview" in out.getvalue()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        logging.getLogger(name.split(".", maxsplit=1)[0]).setLevel(logging.WARNING)
