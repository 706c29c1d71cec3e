"""What the CLI prints never drives the terminal: a spec value, a failure message or a savepoint path holding an
escape sequence, a carriage return, a bell or a C1 control is printed with those spelled as escapes (a real Git
repository, records as the executor writes them, the real `main`)."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.cli import main
from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from reconciler.spec.load import LoadResult, load_dir
from reconciler.terminal import CONTROL
from tests.gitutil import Repo, spec
from tests.ui.records import execute, plans

EVIL = "\x1b[2J\rowned\x07\u009b"  # clear the screen, overwrite the line, ring, C1 CSI
SHOWN = "\\u001b[2J\\rowned\\u0007\\u009b"
OUR_COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # the plan's own SGR sequences (--color always)


def _cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(list(args))
    return code, out.getvalue()


def _assert_safe(text: str, *, colours: bool = False) -> None:
    rest = OUR_COLOURS.sub("", text) if colours else text
    assert not CONTROL.search(rest), f"a control character reached the terminal: {rest!r}"
    assert SHOWN in text, text


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("FLINK_RECONCILER_")]:
        monkeypatch.delenv(k)


def test_status_and_history_escape_control_characters_of_messages_and_paths(tmp_path: Path) -> None:
    """An upgrade that failed with a Flink message holding EVIL, after a savepoint written under a directory
    named with it: `status` (the table) and `history` (lineage, transitions, savepoints) show both escaped."""
    r = Repo(tmp_path)
    r.write("apps/orders.yaml", spec("orders"))
    first = r.commit("orders")
    base = load_dir(r.work / "apps")
    r.write("apps/orders.yaml", spec("orders", parallelism=2))
    second = r.commit("orders p=2")
    head = load_dir(r.work / "apps")
    state = tmp_path / "state"
    clock = SystemClock()
    journal = Journal(state / "journal", clock)
    [created] = plans(LoadResult(), base, base_revision="0" * 40, revision=first, now=clock.now())
    execute(journal, first, created)
    [upgrade] = plans(base, head, base_revision=first, revision=second, now=clock.now())
    execute(journal, second, upgrade, outcome=Outcome.FAILURE, savepoint_dir=f"file:///sp/{EVIL}",
            message=f"job failed: java.lang.RuntimeException: {EVIL}\n\tat Counter.map(Counter.java:12)")

    code, out = _cli("status", "--state-dir", str(state))
    assert code == 0, out
    _assert_safe(out)
    code, out = _cli("history", "orders", "--state-dir", str(state))
    assert code == 0, out
    _assert_safe(out)
    assert f"RuntimeException: {SHOWN}\n\tat Counter.map" in out  # multi-line by design: newline and tab kept


def test_plan_escapes_a_spec_value_in_plain_and_coloured_text(tmp_path: Path) -> None:
    r = Repo(tmp_path)
    r.write("apps/orders.yaml", spec("orders"))
    a = r.commit("orders")
    yaml_escapes = '"\\e[2J\\rowned\\a\\x9b"'  # YAML's own escapes for EVIL
    r.write("apps/orders.yaml", spec("orders", extra=f"  flinkConfiguration:\n    pipeline.name: {yaml_escapes}\n"))
    b = r.commit("orders: a pipeline name")
    cache = str(tmp_path / "cache")
    for colour in ("never", "always"):
        code, out = _cli("plan", "--repo", str(r.origin), "--base", a, "--head", b, "--cache-dir", cache,
                         "--color", colour)
        assert code == 0, out
        _assert_safe(out, colours=colour == "always")
        assert f"pipeline.name: {SHOWN}" in out
        assert ("\x1b[" in out) is (colour == "always")  # the colours themselves still reach the terminal
