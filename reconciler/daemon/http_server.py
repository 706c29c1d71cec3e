"""One HTTP listener: aiohttp's low-level server on an event loop of its own, in a thread of its own.

The daemon is a threaded program (APScheduler, a sync worker); each listener (the public port, the probe
port) runs its own asyncio loop in one thread, so a slow client costs a few kilobytes and no thread, and
nothing a client of one listener does can stall the other. Why aiohttp and not uvicorn or hypercorn, with
the slow-client figures that decided it: docs/daemon.md, "HTTP server".

What this module adds to aiohttp's server, every one of them a bound on what a client can hold:
- a header deadline: a connection that has not sent a whole request head within `header_timeout_s` of
  connecting (or of its previous answer, on a kept-alive connection) is closed. This is aiohttp's
  keep-alive timer, which starts at `connection_made` and is not pushed back by partial data;
- at most `max_connections` open connections, and at most `max_per_client` from one client address; one
  more gets a 503 written straight onto the socket, before any byte of it is parsed, and is closed a
  moment later (`REFUSED_LINGER_S`, so the client reads the 503 rather than a reset);
- every answer aiohttp makes by itself (400 for a malformed request, 431 for oversized headers, 500) carries
  the same headers as ours (`extra_headers`) and is logged as one INFO line, not a traceback: a hostile
  client is not our bug.

`stop()` is graceful: the listening socket closes first, then requests in progress get `grace_s` to finish,
then every connection is closed and the thread ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from reconciler.errors import ConfigError
from reconciler.logs import redact

log = logging.getLogger(__name__)

Handler = Callable[[BaseRequest], Awaitable[web.StreamResponse]]
REFUSED_LINGER_S = 1.0  # a refused connection: how long its 503 may take to be read before the socket closes


@dataclass(frozen=True)
class Limits:
    """What one listener lets its clients hold."""

    header_timeout_s: float = 5.0  # connect (or previous answer) -> whole request head; also the keep-alive idle
    max_connections: int = 512
    max_per_client: int = 32  # open connections from one address; a browser opens 6, a forge 1
    max_line: int = 8190  # request line / one header line, bytes (aiohttp: 400 / 431 past it)
    max_headers: int = 64
    grace_s: float = 5.0  # stop(): how long requests in progress may take to finish

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.max_connections < 1 or self.max_per_client < 1:
            raise ValueError("header_timeout_s must be > 0, max_connections and max_per_client >= 1")


class ConnectionGuard:
    """Counts open connections, in all and per client address. Used from the listener's loop only."""

    def __init__(self, limits: Limits, on_refused: Callable[[str], None]) -> None:
        self._limits = limits
        self._on_refused = on_refused
        self.total = 0
        self.per_client: dict[str, int] = {}

    def admit(self, client: str) -> str | None:
        """None when admitted (count it), else why not."""
        if self.total >= self._limits.max_connections:
            return "too_many_connections"
        if self.per_client.get(client, 0) >= self._limits.max_per_client:
            return "too_many_from_client"
        self.total += 1
        self.per_client[client] = self.per_client.get(client, 0) + 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        left = self.per_client.get(client, 1) - 1
        if left > 0:
            self.per_client[client] = left
        else:
            self.per_client.pop(client, None)

    def refused(self, reason: str) -> None:
        self._on_refused(reason)


def _busy(reason: str, headers: Mapping[str, str]) -> bytes:
    body = ("too many connections from this client\n" if reason == "too_many_from_client"
            else "too many connections\n").encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n{head}\r\n").encode() + body


class _GuardedHandler(RequestHandler):
    """aiohttp's per-connection protocol, admitted by the guard first, with our error answers."""

    guard: ConnectionGuard
    extra_headers: Mapping[str, str]
    _client: str | None = None
    _refused: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        why = self.guard.admit(client)
        if why is not None and isinstance(transport, asyncio.Transport):
            self.guard.refused(why)
            log.info("refusing a connection from %s: %s", client, why.replace("_", " "))
            # Answer, stop sending, and drop what the client still sends for a moment: closing a socket with
            # unread data makes the kernel send a reset, and the client would never read the 503.
            self._refused = transport
            transport.write(_busy(why, self.extra_headers))
            with contextlib.suppress(OSError, RuntimeError):
                transport.write_eof()
            self._loop.call_later(REFUSED_LINGER_S, transport.close)
            return
        self._client = client
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._refused is None:
            super().data_received(data)

    def eof_received(self) -> None:
        if self._refused is not None:
            self._refused.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._client is None:  # refused: aiohttp never saw it
            self._refused = None
            return
        self.guard.release(self._client)
        self._client = None
        super().connection_lost(exc)

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """aiohttp's own answers (malformed request, oversized header, a handler that raised)."""
        if status >= 500:
            log.error("HTTP handler failed for %s", request.remote, exc_info=exc)
            text = "internal error\n"
        else:
            log.info("bad request from %s (%d): %s", request.remote, status, redact(str(message or exc or ""))[:200])
            try:
                text = f"{status} {HTTPStatus(status).phrase}\n"
            except ValueError:
                text = f"{status}\n"
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was already being sent")
        resp = web.Response(status=status, text=text, content_type="text/plain", charset="utf-8",
                            headers=dict(self.extra_headers))
        resp.force_close()
        return resp


class Listener:
    """One aiohttp server in its own thread and loop. `handler` runs on that loop (it must not block)."""

    def __init__(self, name: str, host: str, port: int, handler: Handler, *, limits: Limits,
                 extra_headers: Mapping[str, str], on_refused: Callable[[str], None]) -> None:
        self.name = name
        self._host = host
        self._port = port
        self._handler = handler
        self._limits = limits
        self._extra_headers = dict(extra_headers)
        self._on_refused = on_refused
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._web: web.Server | None = None
        self._address: tuple[str, int] | None = None
        self.guard: ConnectionGuard | None = None

    def start(self) -> None:
        """Bind (in the caller's thread, so a used port is a ConfigError here) and serve in the background."""
        sock = _bind(self._host, self._port)
        bound_host, bound_port = sock.getsockname()[:2]
        self._address = (str(bound_host), int(bound_port))
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve(sock))
            except BaseException as e:  # pragma: no cover - reported to start()
                failed.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

        self._thread = threading.Thread(target=run, name=f"http-{self.name}", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise ConfigError(f"cannot serve on {self._host}:{self._port}: {failed[0]}")

    async def _serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        guard = self.guard = ConnectionGuard(self._limits, self._on_refused)
        kwargs: dict[str, Any] = {
            "keepalive_timeout": self._limits.header_timeout_s, "max_line_size": self._limits.max_line,
            "max_field_size": self._limits.max_line, "max_headers": self._limits.max_headers, "access_log": None,
            "lingering_time": 1.0}
        server = self._web = web.Server(self._handler, handler_cancellation=True, **kwargs)
        handler_type = type("_Bound", (_GuardedHandler,), {"guard": guard, "extra_headers": self._extra_headers})

        def protocol() -> RequestHandler:
            return handler_type(server, loop=loop, **kwargs)  # type: ignore[no-any-return]

        self._server = await loop.create_server(protocol, sock=sock, backlog=256)

    def stop(self) -> None:
        """Stop accepting, let requests in progress finish (up to `grace_s`), close everything."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = None

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            if self._web is not None:
                self._web.pre_shutdown()  # idle kept-alive connections go at once
                with contextlib.suppress(Exception):
                    await self._web.shutdown(self._limits.grace_s)
            if self._server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._server.wait_closed(), 1.0)

        if thread.is_alive() and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(close(), loop).result(self._limits.grace_s + 5)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=self._limits.grace_s + 5)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._loop is not None

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the listener's loop and wait for it (tests and stats read the guard this way)."""
        if self._loop is None:
            raise RuntimeError("listener not started")

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(5)

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError("server not started")
        return self._address

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(256)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    return sock
