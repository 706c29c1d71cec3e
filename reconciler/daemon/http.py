"""The daemon's small HTTP server: /webhook, /healthz, /readyz, /metrics, a plain-text status page and the
web dashboard (reconciler/ui: `/` for a browser, `/apps/<name>`, `/plan`, `/static/...`).

stdlib ThreadingHTTPServer in a background thread: a handful of requests a minute needs no framework.
The port is open to whoever can reach it, so every resource a client can hold is bounded:

- each connection has a total deadline (headers, body and answer; one request per connection): the
  server's loop cuts the socket's read side at the deadline and the whole socket shortly after, so a
  client trickling one byte at a time holds a thread for `request_deadline_s`, not forever;
- at most `max_connections` are served at once; one more gets 503 and is closed at once;
- the webhook body is bounded (413 over 1 MiB, read only up to Content-Length).

Handlers never raise into the server: a failing callback answers 500 and is logged with its traceback
(a bug); a client that goes away or runs out of time is one INFO line (not news).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from reconciler import __version__
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.webhooks import WebhookEvent, WebhookSecrets, verify_webhook
from reconciler.errors import ConfigError, WebhookRejectedError
from reconciler.logs import redact

if TYPE_CHECKING:
    from reconciler.ui.web import Dashboard

log = logging.getLogger(__name__)

MAX_WEBHOOK_BODY = 1024 * 1024  # GitHub caps payloads at 25 MB, but a push we care about is tiny.
REQUEST_DEADLINE_S = 10.0  # a whole request, from accept to the last byte of the answer
MAX_CONNECTIONS = 32  # served at once; forges, probes and scrapers need a handful
LISTEN_BACKLOG = 64  # accepted by the kernel before the serving loop takes them
CUT_GRACE_S = 2.0  # after the read side is cut, how long writing the answer may take
DRAIN_LIMIT = 8 * MAX_WEBHOOK_BODY  # past this, the client is not a forge; let it see a reset
DRAIN_TIMEOUT_S = 1.0
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 21\r\nRetry-After: 1\r\nConnection: close\r\n\r\ntoo many connections\n")


@dataclass(frozen=True)
class Endpoints:
    """What the server answers with. `on_push` returns False when the daemon refuses (shutting down)."""

    secrets: WebhookSecrets
    branch: str
    on_push: Callable[[WebhookEvent], bool]
    readiness: Callable[[], tuple[bool, str]]
    metrics: Metrics
    status_page: Callable[[], str]
    ui: Dashboard | None = None  # the web dashboard (`ui_enabled`); None: `/` is the plain-text page only


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with a connection cap and a total deadline per connection."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[_Handler], *, max_connections: int,
                 request_deadline_s: float, metrics: Metrics) -> None:
        self.request_deadline_s = request_deadline_s
        self.max_connections = max_connections
        self._metrics = metrics
        self._slots = threading.BoundedSemaphore(max_connections)
        self._deadlines: dict[socket.socket, list[float]] = {}  # socket -> [deadline, cuts done]
        self._deadlines_lock = threading.Lock()
        super().__init__(address, handler)

    def deadline_of(self, sock: socket.socket) -> float:
        with self._deadlines_lock:
            entry = self._deadlines.get(sock)
        return entry[0] if entry else time.monotonic() + self.request_deadline_s

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._metrics.count_http_refused("too_many_connections")
            log.warning("refusing a connection from %s: %d already open", client_address[0], self.max_connections)
            _answer_busy(request)
            self.shutdown_request(request)
            return
        with self._deadlines_lock:
            self._deadlines[request] = [time.monotonic() + self.request_deadline_s, 0.0]
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: socket.socket) -> None:
        with self._deadlines_lock:
            self._deadlines.pop(request, None)
        self._slots.release()

    def service_actions(self) -> None:
        """Called by serve_forever every poll interval: cut connections past their deadline. First the
        read side (a blocked read ends, the handler can still answer 408), then everything."""
        now = time.monotonic()
        cuts: list[tuple[socket.socket, int]] = []
        with self._deadlines_lock:
            for sock, entry in self._deadlines.items():
                deadline, done = entry
                if done == 0 and now >= deadline:
                    entry[1] = 1
                    cuts.append((sock, socket.SHUT_RD))
                elif done == 1 and now >= deadline + CUT_GRACE_S:
                    entry[1] = 2
                    cuts.append((sock, socket.SHUT_RDWR))
        for sock, how in cuts:
            if how == socket.SHUT_RD:
                self._metrics.count_http_refused("deadline")
            with contextlib.suppress(OSError):  # already closed by its handler
                sock.shutdown(how)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """An exception escaped a handler: a client that went away is not news; anything else is a bug."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.info("connection from %s ended early: %s", client_address[0], _oserror_text(error))
        else:
            log.error("HTTP handler failed for %s", client_address[0], exc_info=True)


def _answer_busy(request: socket.socket) -> None:
    """503 on a connection over the cap, without a thread: a short write that never blocks for long."""
    with contextlib.suppress(OSError):
        request.settimeout(0.5)
        request.sendall(_BUSY)


def _oserror_text(error: OSError) -> str:
    return f"{type(error).__name__}: {error.strerror or error}" if error.strerror else type(error).__name__


class HttpServer:
    def __init__(
        self,
        host: str,
        port: int,
        endpoints: Endpoints,
        *,
        poll_interval: float = 0.5,
        request_deadline_s: float = REQUEST_DEADLINE_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        """`poll_interval`: how often the serving loop checks for stop() and cuts connections past
        their deadline (so a deadline is enforced to within that); stop() waits up to that long."""
        if request_deadline_s <= 0 or max_connections < 1:
            raise ValueError("request_deadline_s must be > 0 and max_connections >= 1")
        self._poll_interval = poll_interval
        self._host = host
        self._port = port
        self._endpoints = endpoints
        self._request_deadline_s = request_deadline_s
        self._max_connections = max_connections
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve in a background thread. Raises ConfigError when the address is unusable."""
        handler = type("_BoundHandler", (_Handler,), {"endpoints": self._endpoints,
                                                       "timeout": self._request_deadline_s})
        try:
            server = _Server((self._host, self._port), handler, max_connections=self._max_connections,
                             request_deadline_s=self._request_deadline_s, metrics=self._endpoints.metrics)
        except OSError as e:
            raise ConfigError(f"cannot listen on {self._host}:{self._port}: {e.strerror or e}") from e
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
    timeout = REQUEST_DEADLINE_S  # per socket operation; the server's deadline bounds the whole request
    server: _Server

    def version_string(self) -> str:
        return f"flink-reconciler/{__version__}"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s %s", self.address_string(), format % args)

    # --- routing ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if self._late():
            return
        try:
            if path == "/healthz":
                self._text(HTTPStatus.OK, "ok\n")
            elif path == "/readyz":
                ready, reason = self.endpoints.readiness()
                self._text(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, f"{reason}\n")
            elif path == "/metrics":
                body, content_type = self.endpoints.metrics.exposition(self.headers.get("Accept"))
                self._send(HTTPStatus.OK, body, content_type)
            elif path == "/status.txt" or (path == "/" and not self._wants_html()):
                self._text(HTTPStatus.OK, self.endpoints.status_page())
            elif self.endpoints.ui is not None and self.endpoints.ui.handles(path):
                answer = self.endpoints.ui.handle(path, self.path.partition("?")[2], dict(self.headers.items()))
                self._send(answer.status, answer.body, answer.content_type, **answer.headers)
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
        if self._late(forge=_forge_hint(self.headers)):
            return
        try:
            self._webhook()
        except Exception:
            log.exception("webhook handling failed")
            self.endpoints.metrics.count_webhook("unknown", "error")
            self._text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error\n")

    def _wants_html(self) -> bool:
        """A browser asks for HTML and gets the dashboard at `/`; curl, probes and scripts keep the text page."""
        return self.endpoints.ui is not None and "text/html" in (self.headers.get("Accept") or "")

    def _late(self, *, forge: str | None = None) -> bool:
        """Past the connection's deadline (headers trickled in until the server cut the read side):
        answer 408 and close."""
        if time.monotonic() < self.server.deadline_of(self.connection):
            return False
        reason = f"request not received within {self.server.request_deadline_s:g}s"
        if forge is not None:
            self._refuse(forge, "timeout", HTTPStatus.REQUEST_TIMEOUT, reason)
        else:
            log.info("%s %s from %s: %s", self.command, self.path[:100], self.client_address[0], reason)
            self.close_connection = True
            self._text(HTTPStatus.REQUEST_TIMEOUT, reason + "\n")
        return True

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
        try:
            body: bytes | None = self.rfile.read(length)
        except OSError:  # reset, or the read side cut at the deadline mid-read
            body = None
        if body is None or len(body) != length:
            got = "part" if body is None else f"{len(body)} bytes"
            if time.monotonic() >= self.server.deadline_of(self.connection):
                self._refuse(forge, "timeout", HTTPStatus.REQUEST_TIMEOUT,
                             f"body not received within {self.server.request_deadline_s:g}s "
                             f"({got} of {length})")
            else:
                self._refuse(forge, "bad_request", HTTPStatus.BAD_REQUEST,
                             f"body shorter than Content-Length ({got} of {length})")
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
        """Every text answer (readiness reasons, the status page, webhook refusals) passes `redact`:
        whatever a callback put in, no credential leaves through HTTP."""
        self._send(status, redact(text).encode("utf-8"), "text/plain; charset=utf-8", **headers)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, **headers: str) -> None:
        """Write the answer; a client that is gone by now costs one INFO line, not a traceback."""
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if not any(name.lower() in ("cache_control", "cache-control") for name in headers):
                self.send_header("Cache-Control", "no-store")
            for name, value in headers.items():
                self.send_header(name if "-" in name else name.capitalize(), value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError as e:
            self.close_connection = True
            log.info("%s %s from %s: the client went away before the %d answer: %s", self.command,
                     self.path[:100], self.client_address[0], status.value, _oserror_text(e))


def _forge_hint(headers: Any) -> str:
    """Which forge a request claims to be from, for metrics labels before anything is verified."""
    if headers.get("X-Gitea-Event"):
        return "gitea"
    if headers.get("X-Gitlab-Event"):
        return "gitlab"
    if headers.get("X-GitHub-Event"):
        return "github"
    return "unknown"
