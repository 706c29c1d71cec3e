"""`flink-reconciler status` on a state directory with nothing recorded: it says so and creates nothing."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from reconciler.cli import main


def _status(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["status", *args])
    return code, out.getvalue()


def test_status_of_a_missing_state_dir_says_nothing_is_recorded_and_creates_nothing(tmp_path: Path) -> None:
    state = tmp_path / "no-such-state"
    code, out = _status("--state-dir", str(state))
    assert code == 0
    assert out.startswith(f"nothing recorded in {state}: no journal there"), out
    code, out = _status("--state-dir", str(state), "--output", "json")
    assert (code, json.loads(out)) == (0, [])
    assert not state.exists()


def test_status_of_an_empty_existing_dir_creates_no_journal(tmp_path: Path) -> None:
    code, out = _status("--state-dir", str(tmp_path))
    assert code == 0 and "nothing recorded" in out
    assert list(tmp_path.iterdir()) == []
