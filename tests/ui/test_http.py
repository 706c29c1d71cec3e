"""The dashboard behind the daemon's HTTP server on a real loopback socket: content negotiation at `/`,
`/status.txt`, `ui_auth` (bearer token, basic-auth file), the security headers, static files, and a daemon
with the UI turned off."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.daemon.http import Endpoints, HttpServer
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.scheduler import Daemon
from reconciler.daemon.webhooks import WebhookSecrets
from reconciler.errors import ConfigError
from reconciler.settings import load_settings
from reconciler.ui.read import ReadSide
from reconciler.ui.web import CSP, Dashboard, UiAuth

TOKEN = "ui-token-0123456789"
TEXT = "flink-reconciler status (text)\n"


def serve(tmp_path: Path, auth: UiAuth | None) -> HttpServer:
    clock = SystemClock()
    journal = Journal(tmp_path / "journal", clock)
    read = ReadSide(journals=lambda: [journal], tip=lambda: None, clock=clock)
    server = HttpServer("127.0.0.1", 0, Endpoints(
        secrets=WebhookSecrets(), branch="main", on_push=lambda _e: False, readiness=lambda: (True, "ok"),
        metrics=Metrics(), status_page=lambda: TEXT, ui=Dashboard(read, auth=auth)))
    server.start()
    return server


@pytest.fixture
def open_server(tmp_path: Path) -> Iterator[str]:
    server = serve(tmp_path, None)
    yield server.url
    server.stop()


def test_a_browser_gets_the_dashboard_and_everything_else_the_text_page(open_server: str) -> None:
    html = httpx.get(open_server + "/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert html.headers["content-security-policy"] == CSP
    assert html.headers["x-frame-options"] == "DENY" and html.headers["x-content-type-options"] == "nosniff"
    assert "No app matches." in html.text or "Reading the records" in html.text
    assert httpx.get(open_server + "/").text == TEXT  # curl's Accept: */*
    assert httpx.get(open_server + "/status.txt", headers={"Accept": "text/html"}).text == TEXT
    css = httpx.get(open_server + "/static/ui.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert httpx.get(open_server + "/static/other.js").status_code == 404
    assert httpx.get(open_server + "/apps/nope").status_code == 404
    assert httpx.get(open_server + "/healthz").status_code == 404  # probes are on their own port


def test_bearer_token_guards_every_page(tmp_path: Path) -> None:
    server = serve(tmp_path, UiAuth.parse(f"bearer:{TOKEN}"))
    try:
        for path in ("/plan", "/apps/x", "/static/ui.js"):
            r = httpx.get(server.url + path)
            assert r.status_code == 401 and "Basic" in r.headers["www-authenticate"], path
            assert TOKEN not in r.text
        assert httpx.get(server.url + "/plan", headers={"Authorization": "Bearer wrong-token"}).status_code == 401
        assert httpx.get(server.url + "/plan", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert httpx.get(server.url + "/plan", auth=("anyone", TOKEN)).status_code == 200  # the browser prompt
        assert httpx.get(server.url + "/").text == TEXT  # the text page stays where it was
    finally:
        server.stop()


def test_basic_auth_file(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("# who may look\nalice:correct-horse-battery\nbob:staple-staple-1\n")
    server = serve(tmp_path, UiAuth.parse(f"basic-file:{users}"))
    try:
        assert httpx.get(server.url + "/plan", auth=("alice", "correct-horse-battery")).status_code == 200
        assert httpx.get(server.url + "/plan", auth=("alice", "staple-staple-1")).status_code == 401
        bad = base64.b64encode(b"\xff\xfe").decode()
        assert httpx.get(server.url + "/plan", headers={"Authorization": f"Basic {bad}"}).status_code == 401
        users.write_text("carol:new-password-1\n")  # read on each request
        assert httpx.get(server.url + "/plan", auth=("carol", "new-password-1")).status_code == 200
        assert httpx.get(server.url + "/plan", auth=("alice", "correct-horse-battery")).status_code == 401
    finally:
        server.stop()


@pytest.mark.parametrize("value", ["token", "bearer:short", "basic-file:/nonexistent/file"])
def test_a_bad_ui_auth_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigError, match="ui_auth"):
        UiAuth.parse(value)


class _Fake:
    def sync(self, *, full: bool, reason: str) -> None: ...
    def readiness(self) -> tuple[bool, str]:
        return True, "ok"
    def shutdown(self, *, deadline_s: float) -> None: ...


def test_ui_enabled_false_keeps_the_text_page_for_browsers_too(tmp_path: Path) -> None:
    from reconciler.service.factories import make_reconciler

    settings = load_settings({"repo_url": str(tmp_path / "none.git"), "state_dir": tmp_path / "s", "dry_run": True,
                              "listen_port": 0, "probe_port": 0, "ui_enabled": False})
    daemon = Daemon(make_reconciler(settings, SystemClock(), report=False), settings, Metrics())
    assert daemon.http._endpoints.ui is None
    on = load_settings({"repo_url": str(tmp_path / "none.git"), "state_dir": tmp_path / "s", "dry_run": True,
                        "listen_port": 0, "probe_port": 0})
    assert Daemon(make_reconciler(on, SystemClock(), report=False), on, Metrics()).http._endpoints.ui is not None
    assert Daemon(_Fake(), on, Metrics()).http._endpoints.ui is None  # not a reconciler of ours


def test_the_app_page_names_the_session_cluster_its_job_runs_on_and_the_apps_it_shares(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from reconciler.spec.load import LoadResult, load_files
    from tests.ui.records import execute, plans

    root = Path(__file__).resolve().parents[2] / "examples-repo" / "sessions"
    head = load_files({f"sessions/{p.name}": p.read_bytes() for p in root.glob("*.yaml")})
    assert sorted(head.apps) == ["metering", "tallies"], head.errors
    clock = SystemClock()
    journal = Journal(tmp_path / "journal", clock)
    for ap in plans(LoadResult(), head, base_revision="0" * 40, revision="1" * 40, now=datetime.now(UTC)):
        execute(journal, "1" * 40, ap)
    read = ReadSide(journals=lambda: [journal], tip=lambda: None, clock=clock)
    detail = read.app("tallies")
    assert detail is not None and detail.session == ("shared", ("metering",))
    server = HttpServer("127.0.0.1", 0, Endpoints(
        secrets=WebhookSecrets(), branch="main", on_push=lambda _e: False, readiness=lambda: (True, "ok"),
        metrics=Metrics(), status_page=lambda: TEXT, ui=Dashboard(read)))
    server.start()
    try:
        page = httpx.get(server.url + "/apps/tallies", headers={"Accept": "text/html"}, timeout=10).text
    finally:
        server.stop()
    assert "session cluster <code>shared</code>, shared with <a href=\"/apps/metering\">metering</a>" in page
