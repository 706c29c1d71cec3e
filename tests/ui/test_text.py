"""How user-supplied text is shown (ui/text.py): control characters made visible, secrets masked, markup
escaped, long text cut and shown whole once per page."""

from __future__ import annotations

import pytest
from markupsafe import Markup

from reconciler.terminal import CONTROL
from reconciler.ui.text import LONG_AT, LongText, clip, one_line, plain, shown


@pytest.mark.parametrize(("raw", "seen"), [
    ("gnp\u202eexe.png", "gnp<U+202E>exe.png"),  # RIGHT-TO-LEFT OVERRIDE: reads as 'gnpgnp.exe' reversed
    ("a\u202ab\u202bc\u202cd\u202de", "a<U+202A>b<U+202B>c<U+202C>d<U+202D>e"),
    ("x\u2066y\u2067z\u2068w\u2069", "x<U+2066>y<U+2067>z<U+2068>w<U+2069>"),
    ("l\u200er\u200fa\u061c", "l<U+200E>r<U+200F>a<U+061C>"),
    ("nul\x00bel\x07esc\x1b[31m", "nul<U+0000>bel<U+0007>esc<U+001B>[31m"),
    ("c1\x85\x9b", "c1<U+0085><U+009B>"),
    ("del\x7f", "del<U+007F>"),
    ("zero\u200bwidth\ufeff", "zero<U+200B>width<U+FEFF>"),
    ("tab\tand\nnewline", "tab\tand\nnewline"),  # kept: they are what they look like
    ("family \U0001f468\u200d\U0001f469", "family \U0001f468\u200d\U0001f469"),  # ZWJ joins emoji: kept
    ("héllo wörld ✓ 日本", "héllo wörld ✓ 日本"),
])
def test_control_characters_are_spelled_out(raw: str, seen: str) -> None:
    assert plain(raw) == seen
    html = shown(raw)
    assert isinstance(html, Markup)
    assert not CONTROL.search(str(html)), "a control character reached the page"
    for m in CONTROL.finditer(raw):
        assert '<span class="ctl" title="' in html and f"&lt;U+{ord(m.group(0)):04X}&gt;</span>" in html


def test_markup_is_escaped_and_secrets_masked() -> None:
    html = str(shown('<img src=x onerror=alert(1)> from http://u:pa@ss@word99@host/x.git'))
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "word99" not in html and "http://***@host/x.git" in html
    assert "word99" not in clip("see http://u:pa@ss@word99@host/x.git")


def test_a_title_attribute_gets_plain_text_on_one_line() -> None:
    value = clip("first\u202eline\nsecond line " + "x" * 1000, 80)
    assert "\n" not in value and len(value) <= 80 and value.endswith("…")
    assert "<span" not in plain(value) and "<U+202E>" in plain(value)


@pytest.mark.parametrize(("text", "limit", "line", "cut"), [
    ("short", 10, "short", False),
    ("a" * 20, 10, "a" * 9 + "…", True),
    ("one\ntwo", 10, "one…", True),
    ("one\r\ntwo", 10, "one…", True),
    ("one\n", 10, "one", False),
    ("one\u2028two", 10, "one\u2028two", False),  # shown as <U+2028>, not a break
])
def test_one_line(text: str, limit: int, line: str, cut: bool) -> None:
    assert one_line(text, limit) == (line, cut)
    if limit:
        assert len(one_line(text, limit)[0]) <= limit


def test_a_long_text_is_shown_whole_once_per_page() -> None:
    message = "java.lang.RuntimeException: boom\n" + "\tat org.example.Job.run(Job.java:42)\n" * 3000
    assert len(message) > 100_000
    long = LongText()
    first, again, third = str(long(message)), str(long(message)), str(long(message))
    assert first.count("at org.example.Job.run") == 3000  # the whole, once
    assert first.startswith('<details class="long" id="long-') and "show all (" in first
    anchor = first.split('id="', 1)[1].split('"', 1)[0]
    for later in (again, third):
        assert len(later) < 600 and f'href="#{anchor}"' in later and "boom" in later
    assert LongText()(message) == first, "the id must not change between renders (an opened one stays open)"
    assert str(long("short text")) == "short text"


def test_long_text_past_the_page_budget_is_only_cut() -> None:
    long = LongText(budget=3 * LONG_AT)
    texts = [f"{i}: " + "y" * (LONG_AT * 2) for i in range(3)]
    shown_ = [str(long(t)) for t in texts]
    assert "<details" in shown_[0] and "<details" not in shown_[1] and "flink-reconciler history" in shown_[1]
    assert sum(len(s) for s in shown_) < 3 * LONG_AT
