"""The daemon's small HTTP server: /webhook, /healthz, /readyz, /metrics and a plain-text status page.

stdlib ThreadingHTTPServer in a background thread: a handful of requests a minute needs no framework.
Every request has a socket timeout and the webhook body a size bound, so a slow or huge client can
tie up one thread for a bounded time but never memory. Handlers never raise into the server: a failing
callback answers 500 and is logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reconciler import __version__
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.webhooks import WebhookEvent, WebhookSecrets, verify_webhook
from reconciler.errors import ConfigError, WebhookRejectedError

log = logging.getLogger(__name__)

MAX_WEBHOOK_BODY = 1024 * 1024  # GitHub caps payloads at 25 MB, but a push we care about is tiny.
REQUEST_TIMEOUT_S = 10.0
DRAIN_LIMIT = 8 * MAX_WEBHOOK_BODY  # past this, the client is not a forge; let it see a reset
DRAIN_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Endpoints:
    """What the server answers with. `on_push` returns False when the daemon refuses (shutting down)."""

    secrets: WebhookSecrets
    branch: str
    on_push: Callable[[WebhookEvent], bool]
    readiness: Callable[[], tuple[bool, str]]
    metrics: Metrics
    status_page: Callable[[], str]


class HttpServer:
    def __init__(self, host: str, port: int, endpoints: Endpoints, *, poll_interval: float = 0.5) -> None:
        """`poll_interval`: how often the serving loop checks for stop(); stop() waits up to that long."""
        self._poll_interval = poll_interval
        self._host = host
        self._port = port
        self._endpoints = endpoints
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve in a background thread. Raises ConfigError when the address is unusable."""
        handler = type("_BoundHandler", (_Handler,), {"endpoints": self._endpoints})
        try:
            server = ThreadingHTTPServer((self._host, self._port), handler)
        except OSError as e:
            raise ConfigError(f"cannot listen on {self._host}:{self._port}: {e.strerror or e}") from e
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": self._poll_interval}, name="http", daemon=True
        )
        self._thread.start()
        log.info("listening on %s", self.url, extra={"host": self.address[0], "port": self.address[1]})

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("server not started")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    endpoints: Endpoints  # set on the per-server subclass
    timeout = REQUEST_TIMEOUT_S

    def version_string(self) -> str:
        return f"flink-reconciler/{__version__}"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s %s", self.address_string(), format % args)

    # --- routing ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/healthz":
                self._text(HTTPStatus.OK, "ok\n")
            elif path == "/readyz":
                ready, reason = self.endpoints.readiness()
                self._text(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, f"{reason}\n")
            elif path == "/metrics":
                body, content_type = self.endpoints.metrics.exposition(self.headers.get("Accept"))
                self._send(HTTPStatus.OK, body, content_type)
            elif path == "/":
                self._text(HTTPStatus.OK, self.endpoints.status_page())
            elif path == "/webhook":
                self._text(HTTPStatus.METHOD_NOT_ALLOWED, "POST a webhook here\n", allow="POST")
            else:
                self._text(HTTPStatus.NOT_FOUND, "not found\n")
        except Exception:
            log.exception("GET %s failed", path)
            self._text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error\n")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != "/webhook":
            self._text(HTTPStatus.NOT_FOUND, "not found\n")
            return
        try:
            self._webhook()
        except Exception:
            log.exception("webhook handling failed")
            self.endpoints.metrics.count_webhook("unknown", "error")
            self._text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error\n")

    # --- webhook ----------------------------------------------------------------------------------
    def _webhook(self) -> None:
        ep = self.endpoints
        forge = _forge_hint(self.headers)
        if self.headers.get("Transfer-Encoding"):
            self._refuse(forge, "length_required", HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._refuse(forge, "length_required", HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
            return
        if length < 0:
            self._refuse(forge, "bad_request", HTTPStatus.BAD_REQUEST, "negative Content-Length")
            return
        if length > MAX_WEBHOOK_BODY:
            self._refuse(forge, "too_large", HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_WEBHOOK_BODY} bytes")
            self._discard(min(length, DRAIN_LIMIT))
            return
        body = self.rfile.read(length)
        if len(body) != length:
            self._refuse(forge, "bad_request", HTTPStatus.BAD_REQUEST, "body shorter than Content-Length")
            return
        try:
            event = verify_webhook(dict(self.headers.items()), body, ep.secrets, ep.branch)
        except WebhookRejectedError as e:
            result = "unauthorized" if e.status == HTTPStatus.UNAUTHORIZED else "bad_request"
            self._refuse(forge, result, HTTPStatus(e.status), e.reason)
            return
        if event.kind == "ping":
            ep.metrics.count_webhook(event.forge, "ping")
            log.info("webhook ping from %s accepted", event.forge, extra={"delivery": event.delivery})
            self._text(HTTPStatus.OK, "pong\n")
        elif not event.triggers_sync:
            ep.metrics.count_webhook(event.forge, "ignored")
            why = f"ref {event.ref} is not refs/heads/{ep.branch}" if event.kind == "push" else f"event {event.event}"
            log.info("webhook %s ignored: %s", event.describe(), why, extra={"delivery": event.delivery})
            self._text(HTTPStatus.OK, f"ignored: {why}\n")
        elif ep.on_push(event):
            ep.metrics.count_webhook(event.forge, "triggered")
            log.info("webhook %s: sync requested", event.describe(), extra={"delivery": event.delivery})
            self._text(HTTPStatus.ACCEPTED, f"sync requested for {event.after or event.ref}\n")
        else:
            ep.metrics.count_webhook(event.forge, "unavailable")
            self._text(HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")

    def _refuse(self, forge: str, result: str, status: HTTPStatus, reason: str) -> None:
        self.endpoints.metrics.count_webhook(forge, result)
        log.warning(
            "webhook refused (%d): %s",
            status.value,
            reason,
            extra={"remote": self.client_address[0], "forge": forge},
        )
        if status in (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, HTTPStatus.LENGTH_REQUIRED):
            self.close_connection = True
        self._text(status, f"{reason}\n")

    def _discard(self, limit: int) -> None:
        """Read (and drop) what the client is still sending, briefly: closing a socket with unread
        data makes the kernel send RST, and the client would never see our 413."""
        self.connection.settimeout(DRAIN_TIMEOUT_S)
        try:
            while limit > 0:
                chunk = self.rfile.read1(min(limit, 65536))
                if not chunk:
                    break
                limit -= len(chunk)
        except OSError:
            pass

    # --- plumbing ---------------------------------------------------------------------------------
    def _text(self, status: HTTPStatus, text: str, **headers: str) -> None:
        self._send(status, text.encode("utf-8"), "text/plain; charset=utf-8", **headers)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers.items():
            self.send_header(name.capitalize(), value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _forge_hint(headers: Any) -> str:
    """Which forge a request claims to be from, for metrics labels before anything is verified."""
    if headers.get("X-Gitea-Event"):
        return "gitea"
    if headers.get("X-Gitlab-Event"):
        return "gitlab"
    if headers.get("X-GitHub-Event"):
        return "github"
    return "unknown"
