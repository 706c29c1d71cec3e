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

from reconciler.logs import current_context, log_context, setup_logging


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


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


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
