"""Real receivers on loopback for the notification tests: an HTTP server that records what it is sent (and can
answer 500, be slow, or verify the webhook's HMAC), and an SMTP server (aiosmtpd) that keeps the mail it gets."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class HttpReceiver:
    """`status` answers every request; `delay_s` makes it slow; `secret` makes it check the HMAC like a real
    receiver would (401 when the signature is wrong: independent of the code under test)."""

    status: int = 200
    delay_s: float = 0.0
    secret: bytes | None = None
    got: list[Received] = field(default_factory=list)
    refused: int = 0

    def __post_init__(self) -> None:
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if me.delay_s:
                    time.sleep(me.delay_s)
                headers = {k.lower(): v for k, v in self.headers.items()}
                signature = headers.get("x-flink-reconciler-signature")
                if me.secret is not None and not signed_ok(me.secret, body, signature):
                    me.refused += 1
                    self.send_response(401)
                else:
                    me.got.append(Received(self.path, headers, body, time.monotonic()))
                    self.send_response(me.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def signed_ok(secret: bytes, body: bytes, header: str | None, tolerance_s: float = 300) -> bool:
    """A receiver's check, written from the docs (docs/alerts.md#webhook), not with the code under test."""
    if not header:
        return False
    fields = dict(part.split("=", 1) for part in header.split(","))
    ts = fields.get("t", "")
    if not ts.isdigit() or abs(time.time() - int(ts)) > tolerance_s:
        return False
    want = hmac.new(secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, fields.get("v1", ""))


class SmtpReceiver:
    """aiosmtpd on a socket bound to port 0 (no race for a port), with LOGIN/PLAIN auth over plain text."""

    def __init__(self, *, user: str = "alerts", password: str = "s3cret-smtp-pass") -> None:
        self.messages: list[Message] = []
        self.envelopes: list[Envelope] = []
        self.logins: list[tuple[str, str]] = []
        self._user, self._password = user, password
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        self.port = sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        me = self

        class Handler:
            async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
                me.envelopes.append(envelope)
                raw = envelope.content if isinstance(envelope.content, bytes) else str(envelope.content).encode()
                me.messages.append(message_from_bytes(raw))
                return "250 OK"

        def authenticate(server: SMTP, session: Session, envelope: Envelope, mechanism: str,
                         data: Any) -> AuthResult:
            if isinstance(data, LoginPassword):
                login = (data.login.decode(), data.password.decode())
                me.logins.append(login)
                return AuthResult(success=login == (me._user, me._password))
            return AuthResult(success=False)

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(self._loop.create_server(
                lambda: SMTP(Handler(), authenticator=authenticate, auth_require_tls=False), sock=sock))
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)

    def close(self) -> None:
        def stop() -> None:
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(5)
