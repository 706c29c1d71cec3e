"""`flink-reconciler status` on a state directory with nothing recorded: it says so and creates nothing; on
records, URL credentials in their messages are masked."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from reconciler.cli import main
from tests.ui.records import failed_create


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


def test_status_and_history_mask_url_credentials_in_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure message naming a URL whose password holds a raw '@': `status` and `history` (text and JSON)
    show it masked whole, by the rule of every other place (redaction.redact_urls)."""
    for k in [k for k in os.environ if k.startswith("FLINK_RECONCILER_")]:
        monkeypatch.delenv(k)
    leak = "fetch of http://bot:pa@ss@word99@git.example/x.git?access_token=t0k3n failed"
    state = failed_create(tmp_path, leak).state
    shown = "fetch of http://***@git.example/x.git?access_token=*** failed"
    for args in (["status", "--dry-run"], ["status", "--dry-run", "--output", "json"], ["history", "orders"],
                 ["history", "orders", "--output", "json"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main([*args, "--state-dir", str(state)])
        assert code == 0, out.getvalue()
        text = out.getvalue()
        assert "word99" not in text and "pa@ss" not in text and "t0k3n" not in text, (args, text)
        if args[0] == "history":
            assert shown in text, text
