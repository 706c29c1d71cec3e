"""Headless Debian chromium driven by Playwright's Python package (`executable_path`, never `playwright
install`). Tests skip with the reason when either is missing; scripts/setup.sh installs both."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = os.environ.get("FLINK_RECONCILER_TEST_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


def need_browser() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM}: `bash scripts/setup.sh` installs Debian's chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright Python package is missing: pip install -e '.[dev]'")


@contextmanager
def chromium() -> Iterator[Browser]:
    need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watched:
    """A page and every console error, uncaught exception and dialog it produced."""

    page: Page
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


def open_page(browser: Browser, *, width: int = 1280, height: int = 900, scheme: str = "light",
              **context: Any) -> Watched:
    ctx = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme,  # type: ignore[arg-type]
                              **context)
    page = ctx.new_page()
    w = Watched(page)
    page.on("console", lambda m: w.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: w.errors.append(f"page error: {e}"))

    def dialog(d: Any) -> None:
        w.dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", dialog)
    return w
