"""The HTTP listeners on real loopback sockets: every endpoint, every webhook answer. Hostile clients:
test_http_hostile.py."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.daemon.http import MAX_WEBHOOK_BODY, Endpoints, HttpServer, ProbeServer
from reconciler.daemon.http_server import Limits
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.webhooks import WebhookEvent, WebhookSecrets, sign_hmac_sha256
from reconciler.errors import ConfigError
from tests.daemon import forges
from tests.daemon.forges import AFTER, GITEA_SECRET, GITHUB_SECRET, GITLAB_TOKEN

SECRETS = WebhookSecrets(github=GITHUB_SECRET.encode(), gitlab=GITLAB_TOKEN.encode(), gitea=GITEA_SECRET.encode())


@dataclass
class Callbacks:
    pushes: list[WebhookEvent] = field(default_factory=list)
    accept: bool = True
    ready: tuple[bool, str] = (True, "git ok, runtime ok")
    status: str = "flink-reconciler status\norders: running abc123\n"

    def on_push(self, event: WebhookEvent) -> bool:
        self.pushes.append(event)
        return self.accept

    def readiness(self) -> tuple[bool, str]:
        return self.ready

    def status_page(self) -> str:
        if self.status == "boom":
            raise RuntimeError("status callback failed")
        return self.status


@dataclass
class Served:
    url: str
    client: httpx.Client
    probes: httpx.Client
    cb: Callbacks
    metrics: Metrics

    def webhook_counts(self) -> dict[tuple[str, str], float]:
        text = self.probes.get("/metrics").text
        out: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "flink_reconciler_webhook_requests":
                for s in family.samples:
                    if s.name.endswith("_total"):
                        out[(s.labels["forge"], s.labels["result"])] = s.value
        return out


@pytest.fixture
def served() -> Iterator[Served]:
    cb = Callbacks()
    metrics = Metrics()
    endpoints = Endpoints(
        secrets=SECRETS,
        branch="main",
        on_push=cb.on_push,
        readiness=cb.readiness,
        metrics=metrics,
        status_page=cb.status_page,
    )
    server = HttpServer("127.0.0.1", 0, endpoints)
    probes = ProbeServer("127.0.0.1", 0, readiness=cb.readiness, metrics=metrics, alive=server.alive)
    server.start()
    probes.start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client, \
                httpx.Client(base_url=probes.url, timeout=10) as probe_client:
            yield Served(server.url, client, probe_client, cb, metrics)
    finally:
        server.stop()
        probes.stop()


def test_healthz(served: Served) -> None:
    r = served.probes.get("/healthz")
    assert (r.status_code, r.text) == (200, "ok\n")
    assert r.headers["content-type"].startswith("text/plain")


def test_readyz_follows_the_callback(served: Served) -> None:
    r = served.probes.get("/readyz")
    assert (r.status_code, r.text) == (200, "git ok, runtime ok\n")
    served.cb.ready = (False, "git: origin unreachable (connection refused)")
    r = served.probes.get("/readyz")
    assert (r.status_code, r.text) == (503, "git: origin unreachable (connection refused)\n")


def test_status_page(served: Served) -> None:
    r = served.client.get("/")
    assert r.status_code == 200
    assert r.text == served.cb.status


def test_failing_callback_is_a_500_not_a_dead_server(served: Served) -> None:
    served.cb.status = "boom"
    assert served.client.get("/").status_code == 500
    assert served.client.get("/status.txt").status_code == 500
    assert served.probes.get("/healthz").status_code == 200


def test_unknown_paths_and_methods(served: Served) -> None:
    assert served.client.get("/nope").status_code == 404
    assert served.client.post("/nope", content=b"x").status_code == 404
    r = served.client.delete("/status.txt")
    assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD")
    r = served.client.get("/webhook")
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"


def test_probes_and_metrics_are_not_on_the_public_port(served: Served) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert served.client.get(path).status_code == 404, path
    for path in ("/", "/status.txt", "/webhook"):
        assert served.probes.get(path).status_code == 404, path


def test_metrics_exposition_parses_and_negotiates_openmetrics(served: Served) -> None:
    served.metrics.observe_reconcile("orders", 2.0, "success")
    r = served.probes.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert "flink_reconciler_reconcile_duration_seconds" in names
    r = served.probes.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")


@pytest.mark.parametrize(
    ("name", "delivery"),
    [
        ("github", forges.github(forges.github_push_payload())),
        ("gitlab", forges.gitlab(forges.gitlab_push_payload())),
        ("gitea", forges.gitea(forges.gitea_push_payload())),
    ],
)
def test_signed_push_is_202_and_triggers(served: Served, name: str, delivery: tuple[dict[str, str], bytes]) -> None:
    headers, body = delivery
    r = served.client.post("/webhook", content=body, headers=headers)
    assert r.status_code == 202, r.text
    assert AFTER in r.text
    assert [(e.forge.value, e.after) for e in served.cb.pushes] == [(name, AFTER)]
    assert served.webhook_counts()[(name, "triggered")] == 1


@pytest.mark.parametrize(
    ("name", "delivery", "secret"),
    [
        ("github", forges.github(forges.github_push_payload(), secret=None), GITHUB_SECRET),
        ("github", forges.github(forges.github_push_payload(), secret="wrong-secret"), GITHUB_SECRET),
        ("gitlab", forges.gitlab(forges.gitlab_push_payload(), token=None), GITLAB_TOKEN),
        ("gitlab", forges.gitlab(forges.gitlab_push_payload(), token="wrong-token"), GITLAB_TOKEN),
        ("gitea", forges.gitea(forges.gitea_push_payload(), secret=None), GITEA_SECRET),
        ("gitea", forges.gitea(forges.gitea_push_payload(), secret="wrong-secret"), GITEA_SECRET),
    ],
    ids=["github-unsigned", "github-wrong", "gitlab-unsigned", "gitlab-wrong", "gitea-unsigned", "gitea-wrong"],
)
def test_unsigned_or_wrongly_signed_is_401_and_logged_without_the_secret(
    served: Served,
    caplog: pytest.LogCaptureFixture,
    name: str,
    delivery: tuple[dict[str, str], bytes],
    secret: str,
) -> None:
    headers, body = delivery
    with caplog.at_level(logging.WARNING, logger="reconciler.daemon.http"):
        r = served.client.post("/webhook", content=body, headers=headers)
    assert r.status_code == 401
    assert served.cb.pushes == []
    refused = [rec for rec in caplog.records if "webhook refused" in rec.getMessage()]
    assert len(refused) == 1
    assert name in refused[0].getMessage()
    logged = caplog.text + str([rec.__dict__ for rec in caplog.records])
    for value in (secret, "wrong-secret", "wrong-token"):
        assert value not in logged
    assert secret not in r.text
    assert served.webhook_counts()[(name, "unauthorized")] == 1


def test_push_to_another_branch_is_200_ignored(served: Served) -> None:
    headers, body = forges.gitlab(forges.gitlab_push_payload(ref="refs/heads/feature"))
    r = served.client.post("/webhook", content=body, headers=headers)
    assert r.status_code == 200
    assert "ignored" in r.text
    assert "refs/heads/feature" in r.text
    assert served.cb.pushes == []
    assert served.webhook_counts()[("gitlab", "ignored")] == 1


def test_github_ping_is_200(served: Served) -> None:
    headers, body = forges.github(forges.github_ping_payload(), event="ping")
    r = served.client.post("/webhook", content=body, headers=headers)
    assert (r.status_code, r.text) == (200, "pong\n")
    assert served.cb.pushes == []


def test_body_too_large_is_413_without_calling_back(served: Served) -> None:
    payload = forges.github_push_payload()
    payload["padding"] = "x" * MAX_WEBHOOK_BODY
    headers, body = forges.github(payload)  # correctly signed, just too big
    assert len(body) > MAX_WEBHOOK_BODY
    r = served.client.post("/webhook", content=body, headers=headers)
    assert r.status_code == 413
    assert served.cb.pushes == []
    assert served.webhook_counts()[("github", "too_large")] == 1


def test_body_at_the_limit_is_read(served: Served) -> None:
    payload = forges.github_push_payload()
    headers, body = forges.github(payload)
    payload["padding"] = "x" * (MAX_WEBHOOK_BODY - len(body) - len(', "padding": ""'))
    headers, body = forges.github(payload)
    assert len(body) == MAX_WEBHOOK_BODY
    assert served.client.post("/webhook", content=body, headers=headers).status_code == 202


def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_missing_content_length_and_chunked_are_411(served: Served) -> None:
    no_length = b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: push\r\n\r\n"
    assert _raw(served.url, no_length).startswith(b"HTTP/1.1 411")
    chunked = (
        b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: push\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n"
    )
    assert _raw(served.url, chunked).startswith(b"HTTP/1.1 411")
    assert served.cb.pushes == []


def test_short_body_is_never_a_push(served: Served) -> None:
    headers, body = forges.github(forges.github_push_payload())
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = f"POST /webhook HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body) + 10}\r\n\r\n".encode()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request + body)
        s.shutdown(socket.SHUT_WR)  # the client gives up before sending everything it announced
        answer = _recv_all(s)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:100]  # the server may see EOF first
    assert served.cb.pushes == []
    assert served.probes.get("/healthz").status_code == 200


def test_signed_but_malformed_is_400(served: Served) -> None:
    headers, body = forges.github({"zen": "no ref here"})
    r = served.client.post("/webhook", content=body, headers=headers)
    assert r.status_code == 400
    assert served.webhook_counts()[("github", "bad_request")] == 1


def test_unknown_sender_is_400(served: Served) -> None:
    r = served.client.post("/webhook", content=b"{}", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert served.webhook_counts()[("unknown", "bad_request")] == 1


def test_refused_by_daemon_is_503(served: Served) -> None:
    served.cb.accept = False
    headers, body = forges.github(forges.github_push_payload())
    r = served.client.post("/webhook", content=body, headers=headers)
    assert r.status_code == 503
    assert served.webhook_counts()[("github", "unavailable")] == 1


def test_port_in_use_is_a_config_error(served: Served) -> None:
    port = int(served.url.rsplit(":", 1)[1])
    other = HttpServer(
        "127.0.0.1", port, Endpoints(SECRETS, "main", lambda e: True, lambda: (True, ""), Metrics(), str)
    )
    with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
        other.start()


def test_stop_closes_the_port() -> None:
    server = HttpServer("127.0.0.1", 0, Endpoints(SECRETS, "main", lambda e: True, lambda: (True, ""), Metrics(), str))
    server.start()
    url = server.url
    assert httpx.get(url + "/status.txt").status_code == 200
    server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/status.txt", timeout=2)


# --- hostile clients: deadlines, connection cap, malformed bodies ------------------------------------


@pytest.fixture
def strict() -> Iterator[tuple[HttpServer, Callbacks, Metrics]]:
    """A server with 1 s deadlines (head and body) and room for 2 connections (the defaults: 5 s, 10 s, 512)."""
    cb = Callbacks()
    metrics = Metrics()
    server = HttpServer(
        "127.0.0.1", 0, Endpoints(SECRETS, "main", cb.on_push, cb.readiness, metrics, cb.status_page),
        request_deadline_s=1.0, limits=Limits(header_timeout_s=1.0, max_connections=2),
    )
    server.start()
    try:
        yield server, cb, metrics
    finally:
        server.stop()


def _recv_all(s: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing logged at ERROR and no traceback anywhere: hostile clients are not our bugs."""
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert loud == [], [r.getMessage() for r in loud]


def test_content_length_larger_than_the_body_is_408_at_the_deadline_not_a_500(
    strict: tuple[HttpServer, Callbacks, Metrics], caplog: pytest.LogCaptureFixture
) -> None:
    server, cb, metrics = strict
    headers, body = forges.github(forges.github_push_payload())
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = f"POST /webhook HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body) + 10}\r\n\r\n".encode()
    with caplog.at_level(logging.INFO, logger="reconciler.daemon.http"), \
            socket.create_connection(server.address, timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(request + body)  # ... and the 10 announced bytes never come; the client stays connected
        answer = _recv_all(s)
        took = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"body not received within 1s" in answer
    assert 0.9 <= took < 3.0
    assert cb.pushes == []
    assert metrics.webhook_requests.labels("github", "timeout")._value.get() == 1
    _quiet(caplog)


def test_half_sent_request_then_disconnect_is_one_info_line(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    host, port = served.url.removeprefix("http://").split(":")
    with caplog.at_level(logging.DEBUG, logger="reconciler.daemon.http"):
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: push\r\nContent-Length: 100\r\n\r\nab")
        assert served.client.get("/status.txt").status_code == 200  # the server still serves ...
        time.sleep(0.3)  # ... and its handler threads have logged what they had to say
    _quiet(caplog)
    assert served.cb.pushes == []
    assert sum(len(r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO) < 3 * 300


def test_deeply_nested_signed_json_is_400(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    body = b"[" * MAX_WEBHOOK_BODY
    headers = {"X-GitHub-Event": "push", "Content-Type": "application/json",
               "X-Hub-Signature-256": "sha256=" + sign_hmac_sha256(GITHUB_SECRET.encode(), body)}
    with caplog.at_level(logging.INFO, logger="reconciler.daemon.http"):
        r = served.client.post("/webhook", content=body, headers=headers)
    assert (r.status_code, r.text) == (400, "payload is not valid JSON: RecursionError\n")
    assert served.webhook_counts()[("github", "bad_request")] == 1
    _quiet(caplog)


def test_a_trickling_client_is_cut_at_the_deadline(
    strict: tuple[HttpServer, Callbacks, Metrics], caplog: pytest.LogCaptureFixture
) -> None:
    """One byte every 50 ms never trips a per-read timeout; the total deadline (1 s) ends it anyway."""
    server, _, _ = strict
    request = b"GET /status.txt HTTP/1.1\r\nHost: localhost\r\nX-Padding: " + b"p" * 200 + b"\r\n\r\n"
    with caplog.at_level(logging.INFO, logger="reconciler.daemon.http"), \
            socket.create_connection(server.address, timeout=10) as s:
        t0 = time.monotonic()
        sent = 0
        try:
            for byte in request:
                s.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.05)
                if time.monotonic() - t0 > 5:
                    break
        except OSError:
            pass  # the server closed its side
        answer = _recv_all(s)
        took = time.monotonic() - t0
    assert sent < len(request), "the whole trickled request was read: no deadline"
    assert took < 1.0 + 2.0 + 1.0  # the deadline, the grace to write an answer, slack for a loaded machine
    assert b" 200 " not in answer[:20], answer[:200]  # an error page (or nothing): the request was never served
    _quiet(caplog)


def test_connections_over_the_cap_get_503_and_the_cap_frees_up(
    strict: tuple[HttpServer, Callbacks, Metrics], caplog: pytest.LogCaptureFixture
) -> None:
    server, _, metrics = strict
    idle = [socket.create_connection(server.address, timeout=10) for _ in range(2)]  # hold both slots
    try:
        time.sleep(0.2)  # the serving loop accepted them
        with socket.create_connection(server.address, timeout=10) as s:
            s.sendall(b"GET /status.txt HTTP/1.0\r\nHost: localhost\r\n\r\n")
            answer = _recv_all(s)
        assert answer.startswith(b"HTTP/1.1 503") and answer.endswith(b"too many connections\n"), answer
        assert metrics.http_refused.labels("too_many_connections")._value.get() == 1
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 5
    while True:  # the slots come back when their handlers end (at once: the clients closed)
        with socket.create_connection(server.address, timeout=10) as s:
            s.sendall(b"GET /status.txt HTTP/1.0\r\nHost: localhost\r\n\r\n")
            answer = _recv_all(s)
        if answer.startswith(b"HTTP/1.0 200") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert answer.startswith(b"HTTP/1.0 200"), answer
    _quiet(caplog)


def test_idle_connections_do_not_hold_a_slot_past_the_deadline(
    strict: tuple[HttpServer, Callbacks, Metrics]
) -> None:
    """The header deadline runs from the connection's start; a client that says nothing is closed at it."""
    server, _, _ = strict
    idle = [socket.create_connection(server.address, timeout=10) for _ in range(2)]  # say nothing, ever
    try:
        time.sleep(1.0 + 0.5)  # the 1 s header deadline, + margin
        with socket.create_connection(server.address, timeout=10) as s:
            s.sendall(b"GET /status.txt HTTP/1.0\r\nHost: localhost\r\n\r\n")
            assert _recv_all(s).startswith(b"HTTP/1.0 200")
    finally:
        for s in idle:
            s.close()
