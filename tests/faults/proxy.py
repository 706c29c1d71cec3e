"""A fault-injecting HTTP proxy on loopback, to put between the real REST client and a real JobManager.

Each request is matched against the rules in order; the first rule with hits left decides:

- `status`: answer that status with a Flink-shaped error body, without forwarding (Flink never sees it);
- `reset`: reset the connection (RST) without forwarding;
- `reset_after`: forward to Flink, then reset instead of answering (Flink acted, the answer is lost);
- `stall`: wait `stall_s` (longer than the client's timeout), then forward and answer to nobody;
- `truncate`: forward, then answer the first half of Flink's JSON with a matching Content-Length.

Requests that match no rule pass through unchanged. Every request is recorded (`seen`) with what the
proxy did, so a test can count what actually reached Flink.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import urlsplit

FaultKind = Literal["status", "reset", "reset_after", "stall", "truncate"]
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection"}


@dataclass
class Rule:
    method: str
    path: str  # a regex that must match the whole path (query string excluded)
    kind: FaultKind
    times: int = 1  # how many matching requests get the fault (then the rule is spent)
    status: int = 503
    stall_s: float = 11.0
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return self.hits < self.times and method == self.method and re.fullmatch(self.path, path) is not None


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    action: str  # "forwarded <status>" or the fault kind
    forwarded: bool


@dataclass
class FaultProxy:
    upstream: str  # http://host:port of the JobManager's REST API
    rules: list[Rule] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self)

            def do_POST(self) -> None:
                proxy._handle(self)

            def do_PATCH(self) -> None:
                proxy._handle(self)

            def do_DELETE(self) -> None:
                proxy._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, *rules: Rule) -> None:
        with self._lock:
            self.rules.extend(rules)

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self.seen.clear()

    def count(self, method: str, path: str, *, forwarded: bool = True) -> int:
        """Requests that matched `method` and the `path` regex (and reached Flink, by default)."""
        with self._lock:
            return sum(1 for s in self.seen if s.method == method and re.fullmatch(path, s.path)
                       and (s.forwarded or not forwarded))

    def spent(self) -> list[Rule]:
        with self._lock:
            return [r for r in self.rules if r.hits >= r.times]

    # -- one request ---------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        with self._lock:
            rule = next((r for r in self.rules if r.matches(h.command, path)), None)
            if rule is not None:
                rule.hits += 1
        kind = rule.kind if rule is not None else None
        if kind == "status":
            assert rule is not None
            self._record(h.command, path, f"status {rule.status}", forwarded=False)
            self._answer(h, rule.status, b'{"errors":["Service temporarily unavailable (injected by the test proxy)"]}')
            return
        if kind == "reset":
            self._record(h.command, path, "reset", forwarded=False)
            _reset(h)
            return
        if kind == "stall":
            assert rule is not None
            time.sleep(rule.stall_s)
        try:
            status, headers, answer = self._forward(h, body)
        except OSError:  # the JobManager is gone (stopped at teardown): the client sees a reset too
            self._record(h.command, path, "upstream unreachable", forwarded=False)
            _reset(h)
            return
        self._record(h.command, path, kind or f"forwarded {status}", forwarded=True)
        if kind == "reset_after":
            _reset(h)
            return
        if kind == "truncate":
            answer = answer[: max(1, len(answer) // 2)]
        with contextlib.suppress(OSError):  # a stalled client gave up long ago
            self._answer(h, status, answer, headers)

    def _record(self, method: str, path: str, action: str, *, forwarded: bool) -> None:
        with self._lock:
            self.seen.append(Seen(method, path, action, forwarded))

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=120)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(h.command, h.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            return resp.status, kept, data
        finally:
            conn.close()

    @staticmethod
    def _answer(h: BaseHTTPRequestHandler, status: int, body: bytes,
                headers: list[tuple[str, str]] | None = None) -> None:
        h.send_response(status)
        for k, v in headers if headers is not None else [("Content-Type", "application/json")]:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)
        h.close_connection = True


def _reset(h: BaseHTTPRequestHandler) -> None:
    """Close with RST (SO_LINGER 0): the client sees 'connection reset', not a clean end."""
    h.close_connection = True
    sock: socket.socket = h.connection
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
