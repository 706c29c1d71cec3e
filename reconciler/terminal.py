"""Text that is safe to print on a terminal: the characters that can rewrite or hide what a person reads are
shown as escapes.

An app's message, a Flink exception, a Git error or a commit subject can carry an ANSI escape (`ESC[2J` clears
the screen, `ESC]8;;` makes a link, `ESC]0;` sets the window title), a carriage return that overwrites the line,
a bell, a C1 control (`U+009B` is CSI on a terminal that honours C1 in UTF-8), or a bidi override that makes
`gnp.exe` read as `exe.png`. `CONTROL` is that set, shared with the dashboard (ui/text.py spells them
`<U+XXXX>` on a page); `terminal_safe` spells them as JSON escapes (`\\u001b`, `\\r`), which read the same as
Python's and keep a JSON line valid when the text is inside a JSON string (a JSON log line with
`ensure_ascii=False` carries C1 and bidi characters raw). Tabs stay; newlines stay where text is multi-line by
design (a stack trace in `history`), and are spelled `\\n` where one line is meant.

Pure: no I/O.
"""

from __future__ import annotations

import re

# C0 and C1 controls (but tab and newline), DEL, the bidi embeddings, overrides, isolates and marks, the
# Arabic letter mark, zero-width space / word joiner / BOM, and the Unicode line and paragraph separators.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e"
                     "\u2060\u2066-\u2069\ufeff]")
_CONTROL_OR_NEWLINE = re.compile(f"{CONTROL.pattern[:-1]}\n]")
_SHORT = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r"}


def escape(ch: str) -> str:
    """One character as a JSON escape: `\\r`, `\\u001b`."""
    return _SHORT.get(ch) or f"\\u{ord(ch):04x}"


def terminal_safe(text: str, *, newlines: bool = True) -> str:
    """`text` with every `CONTROL` character spelled as an escape; with `newlines=False` (text meant as one line:
    a table cell, one app's line of a status page) newlines too. A CRLF line end of multi-line text is a newline.
    Idempotent: what it returns holds no character it would change."""
    pattern = CONTROL if newlines else _CONTROL_OR_NEWLINE
    if newlines and "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return pattern.sub(lambda m: escape(m.group(0)), text) if pattern.search(text) else text
