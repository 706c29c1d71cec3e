"""The listeners as a hostile client meets them, on real loopback sockets (bounded loops, a few seconds):
slow connections cannot fail the probes nor starve other clients, every answer carries the security headers,
HEAD works wherever GET does, the Host allow-list, per-client limits, a graceful stop, and a daemon that
refuses to serve an unguarded dashboard or webhook on an address other than loopback."""

from __future__ import annotations

import base64
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.daemon.http import (
    Endpoints,
    HttpServer,
    ProbeServer,
    allowed_hosts,
    exposure_problems,
    is_loopback,
)
from reconciler.daemon.http_server import Limits
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.scheduler import Daemon
from reconciler.daemon.webhooks import WebhookSecrets
from reconciler.errors import ConfigError
from reconciler.settings import Settings
from reconciler.ui.read import ReadSide
from reconciler.ui.web import Dashboard, UiAuth
from tests.daemon import forges
from tests.daemon.forges import GITHUB_SECRET

SECURITY = ("content-security-policy", "x-content-type-options", "x-frame-options", "referrer-policy")
OTHER_CLIENT = "127.0.0.2"  # a second client address on loopback (the slow one is 127.0.0.1)


@dataclass
class World:
    public: HttpServer
    probes: ProbeServer
    metrics: Metrics
    pushes: list[object]

    @property
    def host_port(self) -> tuple[str, int]:
        return self.public.address


def _world(tmp_path: Path, *, limits: Limits, auth: UiAuth | None = None, slow_page_s: float = 0.0) -> World:
    clock = SystemClock()
    journal = Journal(tmp_path / "journal", clock)
    read = ReadSide(journals=lambda: [journal], tip=lambda: None, clock=clock)
    metrics = Metrics()
    pushes: list[object] = []

    def status_page() -> str:
        time.sleep(slow_page_s)
        return "flink-reconciler status\n"

    def push(event: object) -> bool:
        pushes.append(event)
        return True

    public = HttpServer("127.0.0.1", 0, Endpoints(
        secrets=WebhookSecrets(github=GITHUB_SECRET.encode()), branch="main", on_push=push,
        readiness=lambda: (True, "ok"), metrics=metrics, status_page=status_page, ui=Dashboard(read, auth=auth)),
        hosts=allowed_hosts("127.0.0.1", ()), limits=limits)
    probes = ProbeServer("127.0.0.1", 0, readiness=lambda: (True, "ok"), metrics=metrics, alive=public.alive)
    public.start()
    probes.start()
    return World(public, probes, metrics, pushes)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = _world(tmp_path, limits=Limits(header_timeout_s=2.0, max_connections=64, max_per_client=8))
    yield w
    w.public.stop()
    w.probes.stop()


def _client(source: str = OTHER_CLIENT) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10)


def _raw(address: tuple[str, int], request: bytes, *, source: str | None = None) -> bytes:
    with socket.socket() as s:
        s.settimeout(10)
        if source:
            s.bind((source, 0))
        s.connect(address)
        s.sendall(request)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


def _headers(raw: bytes) -> dict[str, str]:
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head)}


def _slowloris(address: tuple[str, int], n: int, stop: threading.Event, cut: list[int]) -> None:
    """`n` connections that send a partial request head, one more byte a second; reopened when cut."""
    socks: list[socket.socket | None] = [None] * n
    while not stop.is_set():
        for i in range(n):
            s = socks[i]
            try:
                if s is None:
                    s = socket.create_connection(address, timeout=2)
                    s.sendall(b"GET /status.txt HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                    socks[i] = s
                else:
                    s.sendall(b"a")
            except OSError:
                cut[0] += 1
                if s is not None:
                    s.close()
                socks[i] = None
        stop.wait(0.5)
    for s in socks:
        if s is not None:
            s.close()


def test_slow_connections_fail_neither_the_probes_nor_other_clients(world: World) -> None:
    """200 slow connections from one client (8 held at a time, the rest refused and reopened, the held ones cut
    at the 2 s head deadline): /healthz on the probe port and the public port for another client answer."""
    stop = threading.Event()
    cut = [0]
    attacker = threading.Thread(target=_slowloris, args=(world.host_port, 200, stop, cut))
    attacker.start()
    try:
        time.sleep(1.0)
        probe_ok, page_ok, took = 0, 0, []
        with httpx.Client(timeout=5) as probe, _client() as other:
            t_end = time.monotonic() + 4.0  # past one head deadline
            while time.monotonic() < t_end:
                probe_ok += probe.get(world.probes.url + "/healthz").status_code == 200
                t0 = time.monotonic()
                page_ok += other.get(world.public.url + "/status.txt").status_code == 200
                took.append(time.monotonic() - t0)
                time.sleep(0.1)
        held = world.public.listener.call(lambda: dict(world.public.listener.guard.per_client))  # type: ignore[union-attr]
    finally:
        stop.set()
        attacker.join(20)
    assert probe_ok == len(took) and page_ok == len(took), (probe_ok, page_ok, len(took))
    assert max(took) < 2.0, max(took)  # a few ms when the machine is idle; slack for a loaded one
    assert held.get("127.0.0.1", 0) <= 8  # the per-client cap
    assert world.metrics.http_refused.labels("too_many_from_client")._value.get() > 0
    assert cut[0] > 0  # refused or cut at the head deadline, not held forever


def test_a_burst_from_one_client_leaves_room_for_the_others(tmp_path: Path) -> None:
    """One client keeps 8 connections busy with pages that take 0.2 s each; another client's page waits for
    at most one of them (one callback per client at once, two workers), not for the burst."""
    w = _world(tmp_path, limits=Limits(max_per_client=8), slow_page_s=0.2)
    stop = threading.Event()

    def burst() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                c.get(w.public.url + "/status.txt")

    threads = [threading.Thread(target=burst) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        took = []
        with _client() as other:
            for _ in range(5):
                t0 = time.monotonic()
                assert other.get(w.public.url + "/status.txt").status_code == 200
                took.append(time.monotonic() - t0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        w.public.stop()
        w.probes.stop()
    assert max(took) < 0.2 * 2 + 0.5, took  # its own 0.2 s, at most one page of the burst ahead, slack


def test_every_answer_carries_the_security_headers(world: World, caplog: pytest.LogCaptureFixture) -> None:
    pub, probes = world.public.url, world.probes.url
    signed_headers, signed_body = forges.github(forges.github_push_payload())
    unsigned_headers, unsigned_body = forges.github(forges.github_push_payload(), secret=None)
    with httpx.Client(timeout=10) as c:
        answers = {
            "text page": c.get(pub + "/"),
            "status.txt": c.get(pub + "/status.txt"),
            "dashboard": c.get(pub + "/", headers={"Accept": "text/html"}),
            "static": c.get(pub + "/static/ui.css"),
            "404": c.get(pub + "/nope"),
            "405": c.delete(pub + "/status.txt"),
            "webhook 405": c.get(pub + "/webhook"),
            "webhook 202": c.post(pub + "/webhook", content=signed_body, headers=signed_headers),
            "webhook 401": c.post(pub + "/webhook", content=unsigned_body, headers=unsigned_headers),
            "webhook 413": c.post(pub + "/webhook", content=b"x" * (2 * 1024 * 1024), headers=signed_headers),
            "421": c.get(pub + "/", headers={"Host": "rebind.example"}),
            "healthz": c.get(probes + "/healthz"),
            "readyz": c.get(probes + "/readyz"),
            "metrics": c.get(probes + "/metrics"),
            "probe 404": c.get(probes + "/"),
            "probe 405": c.post(probes + "/healthz"),
        }
    seen = {name: (r.status_code, {h: r.headers.get(h) for h in SECURITY}) for name, r in answers.items()}
    assert [s for s, _ in seen.values()] == [200, 200, 200, 200, 404, 405, 405, 202, 401, 413, 421, 200, 200, 200,
                                             404, 405], seen
    raw = {
        "400 malformed": _raw(world.host_port, b"NOT HTTP AT ALL\r\n\r\n"),
        "431 or 400 long header": _raw(world.host_port, b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: "
                                       + b"a" * 20000 + b"\r\n\r\n"),
        "400 bad version": _raw(world.host_port, b"GET / HTTP/9.9\r\nHost: localhost\r\n\r\n"),
        "411": _raw(world.host_port, b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: push\r\n\r\n"),
    }
    for name, answer in raw.items():
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500, (name, answer[:100])
        seen[name] = (status, {h: _headers(answer).get(h) for h in SECURITY})
    missing = {name: [h for h, v in hs.items() if not v] for name, (_, hs) in seen.items() if not all(hs.values())}
    assert missing == {}
    assert answers["text page"].headers["x-content-type-options"] == "nosniff"
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert loud == []  # a malformed request is the client's problem: one INFO line, no traceback


def test_a_connection_over_the_cap_gets_503_with_the_headers(tmp_path: Path) -> None:
    w = _world(tmp_path, limits=Limits(max_connections=64, max_per_client=2))
    held = [socket.create_connection(w.public.address, timeout=5) for _ in range(2)]
    try:
        time.sleep(0.2)
        answer = _raw(w.public.address, b"GET /status.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503"), answer[:100]
        assert answer.endswith(b"too many connections from this client\n")
        assert all(_headers(answer).get(h) for h in SECURITY)
        other = _raw(w.public.address, b"GET /status.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                     source=OTHER_CLIENT)
        assert other.startswith(b"HTTP/1.1 200"), other[:100]
    finally:
        for s in held:
            s.close()
        w.public.stop()
        w.probes.stop()


@pytest.mark.parametrize("path", ["/", "/status.txt", "/plan", "/static/ui.js", "/nope", "/healthz", "/readyz",
                                  "/metrics"])
def test_head_is_answered_wherever_get_is(world: World, path: str) -> None:
    base = world.probes.url if path in ("/healthz", "/readyz", "/metrics") else world.public.url
    with httpx.Client(timeout=10) as c:
        get, head = c.get(base + path), c.head(base + path)
    assert head.status_code == get.status_code, path
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    if path != "/metrics":  # its counters move between the two requests
        assert head.headers["content-length"] == str(len(get.content))


def test_the_host_allow_list_answers_421_to_other_names(world: World) -> None:
    port = world.public.address[1]
    with httpx.Client(timeout=10) as c:
        for host in ("localhost", f"localhost:{port}", "127.0.0.1", f"[::1]:{port}", "LOCALHOST."):
            assert c.get(world.public.url + "/status.txt", headers={"Host": host}).status_code == 200, host
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.2", "localhost.attacker.example"):
            r = c.get(world.public.url + "/status.txt", headers={"Host": host})
            assert (r.status_code, r.text) == (421, "this Host is not served here (allowed_hosts)\n"), host
        # /webhook is reached through any name (an Ingress's); its signature is its guard.
        headers, body = forges.github(forges.github_push_payload())
        assert c.post(world.public.url + "/webhook", content=body,
                      headers={**headers, "Host": "hooks.example"}).status_code == 202
    assert world.metrics.http_refused.labels("host")._value.get() == 4


def test_allowed_hosts_defaults() -> None:
    assert allowed_hosts("127.0.0.1", ()) == frozenset({"localhost", "127.0.0.1", "::1"})
    assert allowed_hosts("0.0.0.0", ()) == frozenset({"localhost", "127.0.0.1", "::1"})
    assert allowed_hosts("10.1.2.3", ["Flink.Example:443", "[fd00::1]"]) == frozenset({
        "localhost", "127.0.0.1", "::1", "10.1.2.3", "flink.example", "fd00::1"})
    assert allowed_hosts("0.0.0.0", ["a.example", "*"]) is None
    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost", "0.0.0.0", "::",
                                     "10.0.0.1", "reconciler.example")] == [True] * 5 + [False] * 4


def test_the_dashboard_needs_its_auth_from_a_stranger_too(tmp_path: Path) -> None:
    token = "ui-token-0123456789"
    w = _world(tmp_path, limits=Limits(), auth=UiAuth.parse(f"bearer:{token}"))
    try:
        with httpx.Client(timeout=10) as c:
            r = c.get(w.public.url + "/plan")
            assert r.status_code == 401 and all(r.headers.get(h) for h in SECURITY)
            assert c.head(w.public.url + "/plan").status_code == 401
            basic = base64.b64encode(f"x:{token}".encode()).decode()
            assert c.get(w.public.url + "/plan", headers={"Authorization": f"Basic {basic}"}).status_code == 200
    finally:
        w.public.stop()
        w.probes.stop()


def test_stop_lets_a_request_in_progress_finish(tmp_path: Path) -> None:
    w = _world(tmp_path, limits=Limits(grace_s=5.0), slow_page_s=1.0)
    got: list[httpx.Response] = []
    t = threading.Thread(target=lambda: got.append(httpx.get(w.public.url + "/status.txt", timeout=10)))
    t.start()
    time.sleep(0.3)  # the request is in its callback
    t0 = time.monotonic()
    w.public.stop()
    w.probes.stop()
    t.join(10)
    assert [r.status_code for r in got] == [200]
    assert time.monotonic() - t0 < 5.0
    with pytest.raises(httpx.ConnectError):
        httpx.get(w.public.url + "/status.txt", timeout=2)


# --- deploy safe by default ----------------------------------------------------------------------------


class _Idle:
    def sync(self, *, full: bool, reason: str) -> None: ...
    def readiness(self) -> tuple[bool, str]:
        return True, "ok"
    def shutdown(self, *, deadline_s: float) -> None: ...


def test_a_daemon_on_a_public_address_refuses_an_open_dashboard_or_an_unsigned_webhook(
    make_settings: Callable[..., Settings],
) -> None:
    """Checked before anything binds (nothing here listens on 0.0.0.0)."""
    no_secrets = {"github_webhook_secret": None, "gitlab_webhook_token": None, "gitea_webhook_secret": None}
    with pytest.raises(ConfigError, match=r"dashboard on 0.0.0.0 .* set ui_auth") as e:
        Daemon(_Idle(), make_settings(listen_host="0.0.0.0"), Metrics())
    assert "webhook" not in str(e.value)  # the webhook has its secrets here
    with pytest.raises(ConfigError, match=r"/webhook on 0.0.0.0 has no secret"):
        Daemon(_Idle(), make_settings(listen_host="0.0.0.0", ui_auth="bearer:0123456789", **no_secrets), Metrics())
    for fine in ({"ui_auth": "bearer:0123456789"}, {"insecure_ui": True}, {"ui_enabled": False},
                 {"ui_auth": "bearer:0123456789", "webhook_enabled": False, **no_secrets}):
        settings = make_settings(listen_host="0.0.0.0", **fine)
        assert exposure_problems(settings, "0.0.0.0", webhook=settings.webhook_enabled) == [], fine
    assert exposure_problems(make_settings(**no_secrets), "127.0.0.1", webhook=True) == []  # loopback: as before


def test_the_ui_command_refuses_a_public_address_without_auth(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from reconciler.cli import main

    code = main(["ui", "--listen", "0.0.0.0:0", "--state-dir", str(tmp_path / "state")])
    err = capsys.readouterr().err
    assert code != 0
    assert "the dashboard on 0.0.0.0 would be open to anyone" in err and "--insecure-ui" in err
