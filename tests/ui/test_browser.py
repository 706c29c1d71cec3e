"""The dashboard in a real browser, from real servers: `flink-reconciler ui` and a dry-run daemon
(`flink-reconciler run`), each over a real Git repository with a bare origin and records written as the
executor writes them. No Flink here (tests/e2e/test_daemon_e2e.py watches a real upgrade)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
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
from tests.e2e.test_daemon_e2e import DaemonProc
from tests.gitutil import Repo, git, spec
from tests.ui.browser import chromium, need_browser, open_page
from tests.ui.records import execute, plans

if TYPE_CHECKING:
    from playwright.sync_api import Browser

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 1.0
GIT_TOKEN = "ghp_testtoken0123456789abcdef"  # given as the Git token: must never appear on a page
CONF_SECRET = "s3cr3t-value-in-flink-conf"  # a flinkConfiguration value under a secret-looking key
URL_PASSWORD = "urlpassw0rd-xyz"  # credentials in a URL inside an error message
HOSTILE_SUBJECT = "break <script>window.__pwned = 1</script> it"
HOSTILE_ERROR = f'StartJob failed: <img src=x id="pwn"> at https://bob:{URL_PASSWORD}@git.example/x.git'
SECRETS = (GIT_TOKEN, CONF_SECRET, URL_PASSWORD)

pytestmark = pytest.mark.slow


@dataclass
class Setup:
    repo: Repo
    state_dir: Path
    revs: list[str]


def _write_records(repo: Repo, state_dir: Path) -> list[str]:
    """Three apps applied at the first commit; `payments` then failed at a second one (a hostile subject and
    error text); `orders` is mid-upgrade (in flight at its second step)."""
    repo.write("apps/orders.yaml", spec("orders", extra="  flinkConfiguration:\n"
                                                       f"    s3.secret-key: {CONF_SECRET}\n"
                                                       "    state.checkpoints.num-retained: '3'\n"))
    repo.write("apps/clicks.yaml", spec("clicks"))
    repo.write("apps/payments.yaml", spec("payments"))
    first = repo.commit("three apps")
    clock = SystemClock()
    journal = Journal(state_dir / "journal", clock)
    base = load_dir(repo.work / "apps")
    for ap in plans(LoadResult(), base, base_revision="0" * 40, revision=first, now=clock.now()):
        execute(journal, first, ap)
    repo.write("apps/payments.yaml", spec("payments", parallelism=2))
    repo.write("apps/orders.yaml", spec("orders", parallelism=3, extra="  flinkConfiguration:\n"
                                                                      f"    s3.secret-key: {CONF_SECRET}\n"))
    second = repo.commit(HOSTILE_SUBJECT)
    head = load_dir(repo.work / "apps")
    by_app = {ap.app: ap for ap in plans(base, head, base_revision=first, revision=second, now=clock.now())}
    execute(journal, second, by_app["payments"], outcome=Outcome.FAILURE, message=HOSTILE_ERROR)
    execute(journal, second, by_app["orders"], stop_at=1)
    return [first, second]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    need_browser()
    root = tmp_path_factory.mktemp("ui")
    repo = Repo(root)
    state_dir = root / "state"
    return Setup(repo, state_dir, _write_records(repo, state_dir))


class UiProc:
    """`flink-reconciler ui` on a free port."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLINK_RECONCILER_")} | (env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "ui", "--listen", "127.0.0.1:0", *args],
                                     cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"dashboard: (http://\S+?)/ ", line)
        assert m, f"no 'dashboard: URL' line: {line!r}"
        self.url = m.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def ui(setup: Setup) -> Iterator[UiProc]:
    proc = UiProc("--state-dir", str(setup.state_dir), "--repo", str(setup.repo.origin),
                  "--poll-interval", str(POLL_S), "--cache-dir", str(setup.state_dir.parent / "cache"),
                  env={"FLINK_RECONCILER_GIT_TOKEN": GIT_TOKEN, "FLINK_RECONCILER_DRY_RUN": "true"})
    yield proc
    proc.stop()


def _wait(check: object, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:g} s: {what}")


def _no_secret(text: str, where: str) -> None:
    for s in SECRETS:
        assert s not in text, f"{where} shows the secret {s!r}"


def test_overview_lists_the_apps_and_every_page_is_clean(setup: Setup, ui: UiProc, browser: Browser) -> None:
    w = open_page(browser)
    w.page.goto(ui.url + "/")
    rows = w.page.locator("table.apps tbody tr")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.app)")) == ["clicks", "orders", "payments"]
    states = {r.get_attribute("data-app"): r.locator(".badge").inner_text() for r in rows.all()}
    assert "applying" in states["orders"] and "error" in states["payments"] and "in sync" in states["clicks"]
    # the step of the in-flight upgrade is named on the overview
    assert "2/" in w.page.locator("tr[data-app=orders] .sub").inner_text()
    pages = ["/", "/plan", "/apps/orders", "/apps/clicks", "/apps/payments", "/?state=error", "/?q=ord"]
    for path in pages:
        w.page.goto(ui.url + path)
        w.page.wait_for_load_state("networkidle")
        _no_secret(w.page.content(), path)
        body = httpx.get(ui.url + path, headers={"Accept": "text/html"}).text
        _no_secret(body, path)
    assert not w.errors, w.errors
    assert not w.dialogs, w.dialogs
    # the applied spec is shown, with the secret-looking value masked
    w.page.goto(ui.url + "/apps/orders")
    w.page.locator("#spec summary").click()
    yaml_text = w.page.locator("#spec pre").inner_text()
    assert "s3.secret-key: '***'" in yaml_text and "num-retained" in yaml_text, yaml_text
    # the in-flight transition: every step with its phase
    steps = w.page.locator("#inflight .step")
    assert steps.count() >= 3
    assert [s.get_attribute("class") for s in steps.all()][:2] == ["step s-done", "step s-running"]


def test_hostile_strings_render_as_text(setup: Setup, ui: UiProc, browser: Browser) -> None:
    w = open_page(browser)
    w.page.goto(ui.url + "/apps/payments")
    text = w.page.locator("main").inner_text()
    assert HOSTILE_SUBJECT in text  # the commit subject, as text
    assert "StartJob failed: <img src=x" in text  # the error, as text
    assert w.page.evaluate("window.__pwned") is None
    assert w.page.locator("#pwn").count() == 0
    assert "https://***@git.example/x.git" in text  # URL credentials redacted
    # the instruction text the CLI shows, exactly
    assert w.page.locator("#failure .instruction").first.inner_text().strip().endswith(
        HOSTILE_ERROR.replace(f"bob:{URL_PASSWORD}", "***"))
    assert not w.dialogs and not w.errors, (w.dialogs, w.errors)
    w.page.goto(ui.url + "/apps/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert "There is no app <script>alert(1)</script> here" in w.page.locator("main").inner_text()
    assert not w.dialogs
    headers = httpx.get(ui.url + "/", headers={"Accept": "text/html"}).headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "default-src 'none'" in headers["content-security-policy"]
    html = httpx.get(ui.url + "/apps/payments").text
    assert not re.search(r"\son[a-z]+\s*=", html), "an inline event handler"
    assert "<script>" not in html.replace('<script src="/static/ui.js" defer></script>', "")


def test_a_push_shows_on_the_open_page_without_a_reload(setup: Setup, ui: UiProc, browser: Browser) -> None:
    w = open_page(browser)
    w.page.goto(ui.url + "/")
    w.page.evaluate("window.__same_page = true")
    setup.repo.write("apps/clicks.yaml", spec("clicks", parallelism=4))
    sha = setup.repo.commit("clicks: parallelism 4")
    t0 = time.monotonic()
    took = _wait(lambda: sha[:12] in w.page.locator("#tip").inner_text(), POLL_S + 2 + 3,
                 "the new branch tip in the page header")
    assert time.monotonic() - t0 <= POLL_S + 2 + 1, f"took {took:.1f} s"
    _wait(lambda: "out of sync" in w.page.locator("tr[data-app=clicks] .badge").inner_text(), 5,
          "clicks out of sync")
    assert w.page.evaluate("window.__same_page") is True, "the page was reloaded"
    w.page.goto(ui.url + "/apps/clicks")
    diff = w.page.locator("#diff pre").inner_text()
    assert "- /spec/job/parallelism: 1" in diff and "+ /spec/job/parallelism: 4" in diff, diff
    assert not w.errors, w.errors


def test_filters_and_phone_width(setup: Setup, ui: UiProc, browser: Browser) -> None:
    w = open_page(browser, width=390, height=844)
    w.page.goto(ui.url + "/")
    w.page.evaluate("window.__same_page = true")
    w.page.fill("input[name=q]", "pay")
    _wait(lambda: w.page.locator("table.apps tbody tr").count() == 1, 5, "one row after filtering")
    assert "q=pay" in w.page.url and w.page.evaluate("window.__same_page") is True
    width = w.page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways at phone width ({width} px)"
    w.page.goto(ui.url + "/apps/orders")
    assert w.page.evaluate("document.documentElement.scrollWidth") <= 390
    assert not w.errors, w.errors


def test_the_daemon_serves_the_dashboard_on_its_port(setup: Setup, tmp_path: Path, browser: Browser) -> None:
    """A dry-run daemon: a browser gets the dashboard at `/`, curl keeps the text page; a push shows up."""
    state = tmp_path / "state"
    d = DaemonProc.start(tmp_path / "daemon.log", repo_url=setup.repo.origin, state_dir=state, dry_run=True,
                         poll_interval=POLL_S, drift_interval=60, git_token=GIT_TOKEN)
    try:
        assert d.get("/").text.startswith("flink-reconciler ")  # Accept */*: the plain-text page, as before
        assert d.get("/status.txt").text.startswith("flink-reconciler ")
        w = open_page(browser)
        w.page.goto(d.url + "/")
        _wait(lambda: w.page.locator("table.apps tbody tr").count() == 3, 30, "three apps listed")
        assert w.page.locator(".mode").inner_text().startswith("daemon")
        w.page.evaluate("window.__same_page = true")
        setup.repo.write("apps/payments.yaml", spec("payments", parallelism=5))
        sha = setup.repo.commit("payments: parallelism 5")
        took = _wait(lambda: sha[:12] in w.page.locator("#tip").inner_text(), POLL_S + 2 + 3,
                     "the new branch tip in the page header")
        assert took <= POLL_S + 2 + 1, f"took {took:.1f} s"
        assert w.page.evaluate("window.__same_page") is True
        for path in ("/", "/plan", "/apps/payments"):
            w.page.goto(d.url + path)
            _no_secret(w.page.content(), path)
        assert "payments" in w.page.locator("main").inner_text()
        assert not w.errors, w.errors
    finally:
        assert d.proc.poll() is None, d.log_tail()
        d.proc.terminate()
        d.proc.wait(timeout=30)
    git(setup.repo.work, "log", "-1")
