"""How user-supplied text is shown on a page: redacted, control characters made visible, long text cut.

Every string a page prints came from somewhere a person does not fully control: an app name, a file path,
a commit subject, a Flink stack trace. Three things go wrong with such text on a page, and each is handled
here once, for every template:

- **secrets**: URL credentials and the configured tokens (`logs.redact`, the same rule as the logs);
- **invisible characters**: a bidi override (U+202E) turns `gnp.exe` into what reads as `exe.png`; other
  C0/C1 controls and zero-width characters hide or reorder text. Each is shown as `<U+202E>` instead (in a
  distinct style where markup is allowed, as plain text inside attributes); the set is `terminal.CONTROL`,
  which the CLI and status.txt escape too;
- **size**: a 100 KB failure message or commit subject is cut to a line where a line is meant, and shown
  whole once per page (a `<details>`), not once per place it appears.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup, escape

from reconciler.logs import redact
from reconciler.terminal import CONTROL  # the same characters the CLI and status.txt escape

_LINE_BREAKS = re.compile("\r\n?")  # a lone CR is a line break too; U+2028/2029 and NEL are shown
ELLIPSIS = "…"
LONG_AT = 2000  # characters: longer text is shown cut, with the whole behind a <details>
LONG_LINES = 24  # lines: likewise (a stack trace)
PAGE_BUDGET = 512 * 1024  # characters of whole long text per page; past it, text is only cut


def marker(ch: str) -> str:
    return f"<U+{ord(ch):04X}>"


def _name(ch: str) -> str:
    return unicodedata.name(ch, "control character")


def plain(value: Any) -> str:
    """The text of `value` as Jinja's finalize prints it (autoescaping follows): redacted, with every
    control character spelled `<U+XXXX>`. Safe in any context, attributes included."""
    text = redact(str(value))
    return CONTROL.sub(lambda m: marker(m.group(0)), text) if CONTROL.search(text) else text


def _marked(text: str) -> Markup:
    """`text` escaped, each control character as a styled `<U+XXXX>` (only for element content)."""
    out: list[str] = []
    pos = 0
    for m in CONTROL.finditer(text):
        ch = m.group(0)
        out.append(str(escape(text[pos:m.start()])))
        out.append(f'<span class="ctl" title="{escape(_name(ch))}">{escape(marker(ch))}</span>')
        pos = m.end()
    out.append(str(escape(text[pos:])))
    return Markup("".join(out))


def one_line(text: str, limit: int) -> tuple[str, bool]:
    """(the first line of `text`, at most `limit` characters with an ellipsis, whether anything was cut)."""
    text = _LINE_BREAKS.sub("\n", text)
    first, _, rest = text.partition("\n")
    if len(first) <= limit and not rest.strip():
        return first, False
    return first[: max(1, limit - 1)].rstrip() + ELLIPSIS, True


def shown(value: Any, cut: int | None = None) -> Markup:
    """The filter for user-supplied text in element content: redacted, escaped, control characters shown;
    with `cut`, only its first line and at most `cut` characters."""
    if value is None:
        return Markup("")
    text = _LINE_BREAKS.sub("\n", redact(str(value)))
    if cut is not None:
        text, _ = one_line(text, cut)
    return _marked(text)


def clip(value: Any, cut: int = 300) -> str:
    """The filter for user-supplied text in an attribute (a `title`): redacted, one line, at most `cut`
    characters; finalize then spells its control characters as text."""
    if value is None:
        return ""
    return one_line(redact(str(value)), cut)[0]


def is_long(text: str) -> bool:
    return len(text) > LONG_AT or text.count("\n") >= LONG_LINES


@dataclass
class LongText:
    """Long text on one page: the first time a text appears it is shown cut with the whole in a `<details>`
    (its id is the text's hash, stable across the page's refreshes, so an opened one stays open); each
    later appearance is cut, with a link to that one. One per rendered page."""

    cut: int = 300
    budget: int = PAGE_BUDGET
    _seen: dict[str, str] = field(default_factory=dict)

    def __call__(self, value: Any, cut: int | None = None) -> Markup:
        if value is None:
            return Markup("")
        text = _LINE_BREAKS.sub("\n", redact(str(value)))
        if not is_long(text):
            return _marked(text)
        n = cut or self.cut
        head = _marked(one_line(text, n)[0])
        anchor = self._seen.get(text)
        if anchor is not None:
            return Markup('{} <a class="more" href="#{}">(whole text above)</a>').format(head, anchor)
        size = f"{len(text):,} characters, {text.count(chr(10)) + 1:,} lines"
        if len(text) > self.budget:
            return Markup('{} <span class="more">({}: cut here; <code>flink-reconciler history</code> prints it'
                          ' whole)</span>').format(head, size)
        self.budget -= len(text)
        anchor = "long-" + hashlib.sha1(text.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()[:12]
        self._seen[text] = anchor
        return Markup('<details class="long" id="{}"><summary><span class="head">{}</span> '
                      '<span class="more">show all ({})</span></summary><pre class="whole">{}</pre></details>'
                      ).format(anchor, head, size, _marked(text))
