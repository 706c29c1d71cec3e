"""Hostile text in a real browser, at desktop (1400 px) and phone (390 px) widths, from `flink-reconciler ui`
over a real repository: a bidi override in a commit subject shows as a visible marker, a 100 KB failure
message is on the app page once and opens on demand (and stays open across the page's refreshes), a 100 KB
commit subject is one cut line in the header, a row named after an invalid spec file links to a page that
exists, and /plan over 121 entries is two pages of collapsible apps."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from reconciler.spec.load import LoadResult, load_dir
from tests.gitutil import Repo, spec
from tests.ui.browser import chromium, need_browser, open_page
from tests.ui.records import execute, plans
from tests.ui.test_browser import POLL_S, UiProc

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = pytest.mark.slow

APPS = 120
BIDI_SUBJECT = "add the logo gnp\u202eexe.png"  # reads as "add the logo gnpgnp.exe" reversed without the marker
END = "END-OF-THE-LONG-MESSAGE"
LONG_MESSAGE = ("StartJob failed: java.lang.IllegalStateException: boom\n"
                + "\tat org.example.Pipeline.step(Pipeline.java:42)\n" * 2100 + END)
LONG_SUBJECT = "huge subject " + "s" * 100_000 + " SUBJECT-TAIL"
BROKEN = "apps/broken.yaml"
WIDTHS = [(1400, 900), (390, 844)]


@dataclass
class World:
    repo: Repo
    state_dir: Path


def _app(i: int) -> str:
    return f"app-{i:05d}"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """120 apps applied; app-00001 upgraded at a commit whose subject holds U+202E; app-00002's upgrade at the
    tip (a 100 KB subject, plus a spec file that does not parse) failed with a 100 KB message."""
    need_browser()
    root = tmp_path_factory.mktemp("display")
    repo, state = Repo(root), root / "state"
    for i in range(APPS):
        repo.write(f"apps/{_app(i)}.yaml", spec(_app(i)))
    first = repo.commit("120 apps")
    clock = SystemClock()
    journal = Journal(state / "journal", clock)
    base = load_dir(repo.work / "apps")
    for ap in plans(LoadResult(), base, base_revision="0" * 40, revision=first, now=clock.now()):
        execute(journal, first, ap)
    repo.write(f"apps/{_app(1)}.yaml", spec(_app(1), parallelism=2))
    second = repo.commit(BIDI_SUBJECT)
    mid = load_dir(repo.work / "apps")
    [ap1] = [a for a in plans(base, mid, base_revision=first, revision=second, now=clock.now()) if a.app == _app(1)]
    execute(journal, second, ap1)
    repo.write(f"apps/{_app(2)}.yaml", spec(_app(2), parallelism=3))
    repo.write(BROKEN, "metadata: [unclosed\n")
    third = repo.commit(LONG_SUBJECT)
    head = load_dir(repo.work / "apps")
    [ap2] = [a for a in plans(mid, head, base_revision=second, revision=third, now=clock.now()) if a.app == _app(2)]
    execute(journal, third, ap2, outcome=Outcome.FAILURE, message=LONG_MESSAGE)
    return World(repo, state)


@pytest.fixture(scope="module")
def ui(world: World) -> Iterator[UiProc]:
    proc = UiProc("--state-dir", str(world.state_dir), "--repo", str(world.repo.origin), "--poll-interval",
                  str(POLL_S), "--cache-dir", str(world.state_dir.parent / "cache"),
                  env={"FLINK_RECONCILER_DRY_RUN": "true"})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def _no_sideways_scroll(page: object, width: int) -> None:
    scroll = page.evaluate("document.documentElement.scrollWidth")  # type: ignore[attr-defined]
    assert scroll <= width, f"the page scrolls sideways at {width} px ({scroll} px)"


@pytest.mark.parametrize(("width", "height"), WIDTHS)
def test_a_bidi_override_shows_as_a_marker(ui: UiProc, browser: Browser, width: int, height: int) -> None:
    w = open_page(browser, width=width, height=height)
    for path in (f"/?q={_app(1)}", f"/apps/{_app(1)}"):
        w.page.goto(ui.url + path)
        w.page.wait_for_load_state("networkidle")
        main = w.page.locator("main").inner_text()
        assert "\u202e" not in w.page.content(), f"{path}: the raw U+202E reached the page"
        assert "add the logo gnp<U+202E>exe.png" in main, main[:2000]
        marker = w.page.locator("main .subject .ctl").first
        assert marker.inner_text() == "<U+202E>"
        assert marker.get_attribute("title") == "RIGHT-TO-LEFT OVERRIDE"
        # A distinct style. Read in the live document: the page's live refresh may swap `main` under a located node
        # (a detached node has no computed style: it read '' once under load).
        w.page.wait_for_function("() => { const e = document.querySelector('main .subject .ctl');"
                                 " return e !== null && getComputedStyle(e).borderStyle === 'solid'; }", timeout=10_000)
        _no_sideways_scroll(w.page, width)
    assert not w.errors, w.errors


@pytest.mark.parametrize(("width", "height"), WIDTHS)
def test_a_long_message_is_on_the_page_once_and_opens(ui: UiProc, browser: Browser, width: int,
                                                       height: int) -> None:
    html = httpx.get(ui.url + f"/apps/{_app(2)}", headers={"Accept": "text/html"}).text
    assert html.count(END) == 1, f"the 100 KB message is on the page {html.count(END)} times"
    assert html.count("SUBJECT-TAIL") == 0 and len(html) < len(LONG_MESSAGE) + 60_000, len(html)
    w = open_page(browser, width=width, height=height)
    w.page.goto(ui.url + f"/apps/{_app(2)}")
    details = w.page.locator("details.long")
    assert details.count() == 1 and details.get_attribute("open") is None
    assert not w.page.get_by_text(END).is_visible()
    height_closed = w.page.evaluate("document.documentElement.scrollHeight")
    assert height_closed < 20_000, f"{height_closed} px tall with the message closed"
    details.locator("summary").click()
    assert w.page.get_by_text(END).count() == 1
    w.page.locator("details.long pre.whole").evaluate("e => e.scrollTop = e.scrollHeight")
    assert w.page.get_by_text(END).is_visible()
    w.page.wait_for_timeout(POLL_S * 1000 * 2.5)  # the live regions refresh: an opened message stays open
    assert w.page.locator("details.long").get_attribute("open") is not None
    # the other places the message appears are cut, each with a link to the whole
    assert w.page.locator("a.more[href='#failure'], a.more[href^='#long-']").count() >= 2
    _no_sideways_scroll(w.page, width)
    # the 100 KB tip subject: one cut line in the header, on every page
    tip = w.page.locator("#tip .subject").inner_text()
    assert tip.startswith("huge subject sss") and tip.endswith("…") and len(tip) <= 120
    assert not w.errors, w.errors


def test_pages_stay_small_with_long_text(ui: UiProc) -> None:
    for path in ("/", "/plan", f"/apps/{_app(1)}"):
        body = httpx.get(ui.url + path, headers={"Accept": "text/html"}).text
        assert END not in body and "SUBJECT-TAIL" not in body
        assert len(body) < 250_000, f"{path}: {len(body):,} bytes"


@pytest.mark.parametrize(("width", "height"), WIDTHS)
def test_a_row_named_after_a_file_links_to_its_page(ui: UiProc, browser: Browser, width: int,
                                                    height: int) -> None:
    w = open_page(browser, width=width, height=height)
    w.page.goto(ui.url + "/?state=error")
    link = w.page.locator(f"tr[data-app='{BROKEN}'] td.name a")
    assert link.get_attribute("href") == "/apps/apps%2Fbroken.yaml"
    link.click()
    w.page.wait_for_load_state("networkidle")
    assert w.page.locator("h1.app-name").inner_text().startswith(BROKEN)
    assert "Not found" not in w.page.locator("main").inner_text()
    # the same page when a proxy decoded the %2F
    assert httpx.get(ui.url + "/apps/apps/broken.yaml", headers={"Accept": "text/html"}).status_code == 200
    assert not w.errors, w.errors


@pytest.mark.parametrize(("width", "height"), WIDTHS)
def test_the_plan_is_paginated_and_collapsible(ui: UiProc, browser: Browser, width: int, height: int) -> None:
    w = open_page(browser, width=width, height=height)
    w.page.goto(ui.url + "/plan")
    head = w.page.locator("#plan-head").inner_text()
    assert f"{APPS + 1} apps:" in head and "1 error" in head, head
    blocks = w.page.locator("details.plan-app")
    assert blocks.count() == 100
    assert "page 1 of 2" in w.page.locator("nav.pages").first.inner_text()
    # what needs a person first, open; unchanged apps closed
    first = blocks.first
    assert first.get_attribute("data-app") == BROKEN and first.get_attribute("open") is not None
    upgraded = w.page.locator(f"details.plan-app[data-app='{_app(2)}']")
    assert upgraded.get_attribute("open") is not None
    assert "/spec/job/parallelism" in upgraded.locator("pre").inner_text()
    unchanged = w.page.locator(f"details.plan-app[data-app='{_app(0)}']")
    assert unchanged.get_attribute("open") is None
    unchanged.locator("summary").click()
    assert unchanged.get_attribute("open") is not None and unchanged.locator("pre").is_visible()
    _no_sideways_scroll(w.page, width)
    w.page.locator("nav.pages a[rel=next]").first.click()
    w.page.wait_for_load_state("networkidle")
    assert "page=2" in w.page.url
    assert w.page.locator("details.plan-app").count() == APPS + 1 - 100
    assert "page 2 of 2" in w.page.locator("nav.pages").first.inner_text()
    assert w.page.locator("nav.pages a[rel=prev]").count() >= 1
    _no_sideways_scroll(w.page, width)
    assert not w.errors, w.errors

