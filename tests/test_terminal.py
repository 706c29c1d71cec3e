"""terminal_safe: the characters that can rewrite a terminal as escapes; newlines kept or spelled; JSON kept valid."""

from __future__ import annotations

import json

import pytest

from reconciler.terminal import CONTROL, terminal_safe


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b[2J\x1b]0;title\x07", "\\u001b[2J\\u001b]0;title\\u0007"),  # clear the screen, set the window title
    ("progress 10%\rdone", "progress 10%\\rdone"),  # a carriage return would overwrite the line
    ("c1 \u009b31m \x85", "c1 \\u009b31m \\u0085"),  # C1 CSI and NEL
    ("back\bspace\x7f", "back\\bspace\\u007f"),
    ("gnp\u202eexe.png \u2066x\u2069", "gnp\\u202eexe.png \\u2066x\\u2069"),  # bidi override and isolates
    ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
    ("tab\tkept\nnewline kept", "tab\tkept\nnewline kept"),
    ("crlf\r\nline end", "crlf\nline end"),
    ("héllo ✓ 日本 \U0001f468\u200d\U0001f469", "héllo ✓ 日本 \U0001f468\u200d\U0001f469"),  # ZWJ joins emoji
])
def test_control_characters_become_escapes(raw: str, shown: str) -> None:
    assert terminal_safe(raw) == shown
    assert terminal_safe(shown) == shown  # idempotent


def test_one_line_text_spells_its_newlines() -> None:
    assert terminal_safe("failed:\r\n\tat X\n", newlines=False) == "failed:\\r\\n\tat X\\n"
    assert not CONTROL.search(terminal_safe("\n".join(chr(c) for c in range(0x20)), newlines=False).replace("\t", ""))


def test_a_json_line_stays_valid_json_with_the_same_value() -> None:
    """A JSON log line (`ensure_ascii=False` keeps C1 and bidi characters raw) read back gives the same value."""
    value = {"msg": "job failed: \u009b2J \u202eexe \u2028 \\ \x1b", "app": "orders"}
    line = json.dumps(value, ensure_ascii=False)
    safe = terminal_safe(line)
    assert not CONTROL.search(safe)
    assert json.loads(safe) == value
