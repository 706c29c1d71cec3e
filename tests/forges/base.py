"""Shared plumbing of the loopback forge contract servers.

A server parses each request, lets its forge subclass validate it against the published API and
answer like that forge, records what it accepted, and can be told to fail the next calls with a 5xx
or a rate-limit answer. Only the HTTP plumbing lives here; every rule is in the forge's module.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

from reconciler.clock import Clock, SystemClock

Json = dict[str, Any]


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # raw, still percent-encoded, as the forge's router sees it
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Answer:
    status: int
    body: Json | str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Failure:
    kind: Literal["5xx", "ratelimit"]
    status: int
    retry_after: float | None = None  # seconds


class ForgeServer:
    """Base: subclasses implement `route(request) -> Answer` and `rate_limit_answer(failure)`."""

    name = "forge"

    def __init__(self, token: str, *, clock: Clock | None = None) -> None:
        self.token = token
        self.clock: Clock = clock or SystemClock()
        self.requests: list[Request] = []
        self.answers: list[Answer] = []
        self.accepted: list[Json] = []  # status objects the forge stored, in order
        self._failures: list[Failure] = []
        self._lock = threading.Lock()
        self._next_id = 1
        self._gate = threading.Event()
        self._gate.set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True, name=f"{self.name}-server"
        )

    # ---- test controls

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail_next(
        self, kind: Literal["5xx", "ratelimit"], count: int = 1, *, status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        default = 502 if kind == "5xx" else 429
        with self._lock:
            self._failures.extend(Failure(kind, status or default, retry_after) for _ in range(count))

    def hold(self) -> None:
        """Keep answers back (requests are still recorded) until `release()`: a forge that hangs."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def statuses_of(self, sha: str) -> list[Json]:
        return [s for s in self.accepted if s.get("_sha") == sha]

    def new_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id

    def start(self) -> ForgeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._gate.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ForgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- subclass API

    def route(self, request: Request) -> Answer:
        raise NotImplementedError

    def rate_limit_answer(self, failure: Failure) -> Answer:
        raise NotImplementedError

    def server_error_answer(self, failure: Failure) -> Answer:
        headers = {"Retry-After": str(int(failure.retry_after))} if failure.retry_after is not None else {}
        return Answer(failure.status, {"message": "Server Error"}, headers)

    # ---- plumbing

    def _dispatch(self, request: Request) -> Answer:
        with self._lock:
            self.requests.append(request)
            failure = self._failures.pop(0) if self._failures else None
        self._gate.wait(30)
        if failure is not None:
            return self.rate_limit_answer(failure) if failure.kind == "ratelimit" else self.server_error_answer(failure)
        return self.route(request)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                answer = outer._dispatch(Request(self.command, self.path, headers, body))
                with outer._lock:
                    outer.answers.append(answer)
                if isinstance(answer.body, str):
                    data, ctype = answer.body.encode(), "text/plain"
                elif answer.body is None:
                    data, ctype = b"", "text/plain"
                else:
                    public = {k: v for k, v in answer.body.items() if not k.startswith("_")}
                    data, ctype = json.dumps(public).encode(), "application/json; charset=utf-8"
                self.send_response(answer.status)
                self.send_header("Content-Type", ctype)
                for k, v in answer.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def do_PUT(self) -> None:
                self._serve()

            def do_PATCH(self) -> None:
                self._serve()

        return Handler


def json_body(request: Request) -> Json | None:
    """The body as a JSON object, or None when it is not one (the forge answers 400)."""
    if not request.headers.get("content-type", "").startswith("application/json"):
        return None
    try:
        body = request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def is_http_url(value: object) -> bool:
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)
