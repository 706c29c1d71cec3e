"""The daemon's two HTTP listeners (daemon/http_server.py runs each in a thread and loop of its own):

- the public port (`HttpServer`): forge webhooks (`POST /webhook`), the plain-text status page and the web
  dashboard (reconciler/ui: `/` for a browser, `/apps/<name>`, `/plan`, `/static/...`);
- the probe port (`ProbeServer`): `/healthz`, `/readyz` and `/metrics`, for the kubelet and Prometheus only
  (the controller-runtime convention). Nothing a client of the public port does (slow connections, a
  burst of page loads) reaches this listener's loop, so it can neither fail the liveness probe nor stall
  a scrape.

Every answer of both (errors, 404, 405, 421, 503, plain text, JSON, metrics, webhook answers, aiohttp's own
400/431) carries the security headers (`SECURITY_HEADERS`); HEAD is answered wherever GET is. On the public
port a request whose Host header is not in the allow-list gets 421 (a DNS-rebinding page in a browser
names its own host), except `/webhook`, whose signature is its guard and which forges reach through any name.

Callbacks (the status page, a dashboard page, readiness, a push) are blocking code: they run on a small
thread pool, at most `IN_FLIGHT_PER_CLIENT` at once per client address, so one client's burst waits for its
own turn and the others' pages are rendered in between. Handlers never raise into the server: a failing
callback answers 500 and is logged with its traceback (a bug); a client that goes away is one INFO line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web
from aiohttp.web_request import BaseRequest

from reconciler import __version__
from reconciler.daemon.http_server import Limits, Listener
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.webhooks import WebhookEvent, WebhookSecrets, verify_webhook
from reconciler.errors import ConfigError, WebhookRejectedError
from reconciler.logs import redact
from reconciler.settings import Settings
from reconciler.terminal import terminal_safe
from reconciler.ui.web import SECURITY_HEADERS

if TYPE_CHECKING:
    from reconciler.ui.web import Dashboard

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_WEBHOOK_BODY = 1024 * 1024  # GitHub caps payloads at 25 MB, but a push we care about is tiny.
REQUEST_DEADLINE_S = 10.0  # a webhook body, from the end of its head to its last byte
IN_FLIGHT_PER_CLIENT = 1  # callbacks of one client address running at once; the rest wait their turn
WORKERS = 2  # threads that run callbacks (page renders, readiness, pushes): CPU-bound under the GIL
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
HEADERS = {**SECURITY_HEADERS, "Server": f"flink-reconciler/{__version__}"}
PAGE_METHODS = "GET, HEAD"


@dataclass(frozen=True)
class Endpoints:
    """What the servers answer with. `on_push` returns False when the daemon refuses (shutting down)."""

    secrets: WebhookSecrets
    branch: str
    on_push: Callable[[WebhookEvent], bool]
    readiness: Callable[[], tuple[bool, str]]
    metrics: Metrics
    status_page: Callable[[], str]
    ui: Dashboard | None = None  # the web dashboard (`ui_enabled`); None: `/` is the plain-text page only
    webhook: bool = True  # serve POST /webhook (`webhook_enabled`)


def allowed_hosts(listen_host: str, extra: Iterable[str]) -> frozenset[str] | None:
    """The Host names the public port answers: the listen address (unless a wildcard), localhost, 127.0.0.1,
    [::1], and `extra` (`allowed_hosts`). None when `extra` holds `*`: any Host."""
    names = {_host_name(h) for h in extra}
    if "*" in names:
        return None
    if listen_host not in ("", "0.0.0.0", "::"):
        names.add(_host_name(listen_host))
    return frozenset(names | LOCAL_HOSTS)


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable from this host only (`localhost`, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _host_name(value: str) -> str:
    """`Example.com:8080` -> `example.com`, `[::1]:80` -> `::1`, `::1` -> `::1`."""
    v = value.strip().lower().rstrip(".")
    if v.startswith("["):
        return v[1:].partition("]")[0]
    if v.count(":") == 1:
        return v.partition(":")[0]
    return v


def _text(status: HTTPStatus, text: str, **headers: str) -> web.Response:
    """Every text answer passes `redact` and `terminal_safe`: whatever a callback put in, no credential leaves
    through HTTP, and no control character reaches the terminal of whoever curls the page."""
    return _answer(status, terminal_safe(redact(text)).encode("utf-8"), "text/plain; charset=utf-8", headers)


def _answer(status: HTTPStatus | int, body: bytes, content_type: str,
            headers: Mapping[str, str] | None = None) -> web.Response:
    merged = {**HEADERS, **{(k if "-" in k else k.capitalize()): v for k, v in (headers or {}).items()},
              "Content-Type": content_type}
    return web.Response(status=int(status), body=body, headers=merged)


class _Callbacks:
    """Blocking callbacks on a thread pool, at most `per_client` at once for one client address."""

    def __init__(self, name: str, workers: int, per_client: int) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"http-{name}")
        self._per_client = per_client
        self._slots: dict[str, tuple[asyncio.Semaphore, int]] = {}

    async def run(self, client: str, fn: Callable[[], T]) -> T:
        sem, users = self._slots.get(client) or (asyncio.Semaphore(self._per_client), 0)
        self._slots[client] = (sem, users + 1)
        try:
            async with sem:
                return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        finally:
            sem, users = self._slots[client]
            if users <= 1:
                del self._slots[client]
            else:
                self._slots[client] = (sem, users - 1)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class HttpServer:
    """The public port: webhooks, the status page and the dashboard."""

    def __init__(
        self,
        host: str,
        port: int,
        endpoints: Endpoints,
        *,
        hosts: frozenset[str] | None = None,
        limits: Limits | None = None,
        request_deadline_s: float = REQUEST_DEADLINE_S,
        in_flight_per_client: int = IN_FLIGHT_PER_CLIENT,
        workers: int = WORKERS,
    ) -> None:
        """`hosts`: the Host allow-list (`allowed_hosts()`); None: any Host."""
        if request_deadline_s <= 0:
            raise ValueError("request_deadline_s must be > 0")
        self._endpoints = endpoints
        self._hosts = hosts
        self._request_deadline_s = request_deadline_s
        self._callbacks = _Callbacks("public", workers, in_flight_per_client)
        self._listener = Listener("public", host, port, self._handle, limits=limits or Limits(),
                                  extra_headers=HEADERS, on_refused=endpoints.metrics.count_http_refused)

    def start(self) -> None:
        """Bind and serve in a background thread. Raises ConfigError when the address is unusable."""
        self._listener.start()
        log.info("listening on %s (webhooks, dashboard)", self.url,
                 extra={"host": self.address[0], "port": self.address[1]})

    def stop(self) -> None:
        self._listener.stop()
        self._callbacks.close()

    def alive(self) -> bool:
        return self._listener.alive()

    @property
    def listener(self) -> Listener:
        return self._listener

    @property
    def address(self) -> tuple[str, int]:
        return self._listener.address

    @property
    def url(self) -> str:
        return self._listener.url

    # --- routing ----------------------------------------------------------------------------------
    async def _handle(self, request: BaseRequest) -> web.StreamResponse:
        path, _, query = request.raw_path.partition("?")
        ep = self._endpoints
        try:
            if path == "/webhook" and ep.webhook:
                if request.method == "POST":
                    return await self._webhook(request)
                return _text(HTTPStatus.METHOD_NOT_ALLOWED, "POST a webhook here\n", allow="POST")
            if not self._host_allowed(request):
                ep.metrics.count_http_refused("host")
                log.info("%s %s from %s: Host %r is not allowed", request.method, path[:100], request.remote,
                         request.host[:100])
                return _text(HTTPStatus.MISDIRECTED_REQUEST,
                             "this Host is not served here (allowed_hosts)\n")
            ui = ep.ui
            if not (path in ("/", "/status.txt") or (ui is not None and ui.handles(path))):
                return _text(HTTPStatus.NOT_FOUND, "not found\n")
            if request.method not in ("GET", "HEAD"):
                return _text(HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method[:20]} is not served here\n",
                             allow=PAGE_METHODS)
            client = request.remote or "?"
            if path == "/status.txt" or (path == "/" and not self._wants_html(request)):
                return _text(HTTPStatus.OK, await self._callbacks.run(client, ep.status_page))
            if ui is not None:
                headers = dict(request.headers.items())
                answer = await self._callbacks.run(client, lambda: ui.handle(path, query, headers))
                return _answer(answer.status, answer.body, answer.content_type, answer.headers)
            return _text(HTTPStatus.NOT_FOUND, "not found\n")  # pragma: no cover - handles() said yes
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            log.exception("%s %s failed", request.method, path[:100])
            return _text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error\n")

    def _host_allowed(self, request: BaseRequest) -> bool:
        return self._hosts is None or _host_name(request.headers.get("Host", "")) in self._hosts

    def _wants_html(self, request: BaseRequest) -> bool:
        """A browser asks for HTML and gets the dashboard at `/`; curl, probes and scripts keep the text page."""
        return self._endpoints.ui is not None and "text/html" in request.headers.get("Accept", "")

    # --- webhook ----------------------------------------------------------------------------------
    async def _webhook(self, request: BaseRequest) -> web.StreamResponse:
        ep = self._endpoints
        forge = _forge_hint(request.headers)
        if request.headers.get("Transfer-Encoding"):
            return self._refuse(request, forge, "length_required", HTTPStatus.LENGTH_REQUIRED,
                                "chunked bodies are not accepted")
        length = request.content_length
        if length is None:
            return self._refuse(request, forge, "length_required", HTTPStatus.LENGTH_REQUIRED,
                                "Content-Length required")
        if length > MAX_WEBHOOK_BODY:
            return self._refuse(request, forge, "too_large", HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                f"body over {MAX_WEBHOOK_BODY} bytes")
        try:
            async with asyncio.timeout(self._request_deadline_s):
                body = await request.content.readexactly(length)
        except TimeoutError:
            ep.metrics.count_http_refused("deadline")
            got = request.content.total_bytes
            return self._refuse(request, forge, "timeout", HTTPStatus.REQUEST_TIMEOUT,
                                f"body not received within {self._request_deadline_s:g}s ({got} of {length} bytes)")
        except asyncio.IncompleteReadError as e:
            return self._refuse(request, forge, "bad_request", HTTPStatus.BAD_REQUEST,
                                f"body shorter than Content-Length ({len(e.partial)} of {length} bytes)")
        try:
            event = verify_webhook(dict(request.headers.items()), body, ep.secrets, ep.branch)
        except WebhookRejectedError as e:
            result = "unauthorized" if e.status == HTTPStatus.UNAUTHORIZED else "bad_request"
            return self._refuse(request, forge, result, HTTPStatus(e.status), e.reason)
        if event.kind == "ping":
            ep.metrics.count_webhook(event.forge, "ping")
            log.info("webhook ping from %s accepted", event.forge, extra={"delivery": event.delivery})
            return _text(HTTPStatus.OK, "pong\n")
        if not event.triggers_sync:
            ep.metrics.count_webhook(event.forge, "ignored")
            why = f"ref {event.ref} is not refs/heads/{ep.branch}" if event.kind == "push" else f"event {event.event}"
            log.info("webhook %s ignored: %s", event.describe(), why, extra={"delivery": event.delivery})
            return _text(HTTPStatus.OK, f"ignored: {why}\n")
        if await self._callbacks.run("webhook", lambda: ep.on_push(event)):
            ep.metrics.count_webhook(event.forge, "triggered")
            log.info("webhook %s: sync requested", event.describe(), extra={"delivery": event.delivery})
            return _text(HTTPStatus.ACCEPTED, f"sync requested for {event.after or event.ref}\n")
        ep.metrics.count_webhook(event.forge, "unavailable")
        return _text(HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")

    def _refuse(self, request: BaseRequest, forge: str, result: str, status: HTTPStatus,
                reason: str) -> web.Response:
        self._endpoints.metrics.count_webhook(forge, result)
        log.warning("webhook refused (%d): %s", status.value, reason,
                    extra={"remote": request.remote, "forge": forge})
        answer = _text(status, f"{reason}\n")
        answer.force_close()
        return answer


class ProbeServer:
    """The probe port: `/healthz` (the process serves: liveness), `/readyz` (the readiness callback) and
    `/metrics` (Prometheus text or OpenMetrics, as the scraper asks). Nothing else."""

    def __init__(self, host: str, port: int, *, readiness: Callable[[], tuple[bool, str]], metrics: Metrics,
                 alive: Callable[[], bool] = lambda: True, limits: Limits | None = None) -> None:
        """`alive`: False fails `/healthz` (the public listener's thread died: a restart brings it back)."""
        self._readiness = readiness
        self._metrics = metrics
        self._alive = alive
        self._callbacks = _Callbacks("probes", 2, 2)
        self._listener = Listener("probes", host, port, self._handle, limits=limits or Limits(max_per_client=16),
                                  extra_headers=HEADERS, on_refused=lambda _reason: None)

    def start(self) -> None:
        self._listener.start()
        log.info("probes and metrics on %s (/healthz, /readyz, /metrics)", self.url,
                 extra={"host": self.address[0], "port": self.address[1]})

    def stop(self) -> None:
        self._listener.stop()
        self._callbacks.close()

    @property
    def address(self) -> tuple[str, int]:
        return self._listener.address

    @property
    def url(self) -> str:
        return self._listener.url

    async def _handle(self, request: BaseRequest) -> web.StreamResponse:
        path = request.raw_path.partition("?")[0]
        if path not in ("/healthz", "/readyz", "/metrics"):
            return _text(HTTPStatus.NOT_FOUND, "not found: this port serves /healthz, /readyz and /metrics\n")
        if request.method not in ("GET", "HEAD"):
            return _text(HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method[:20]} is not served here\n",
                         allow=PAGE_METHODS)
        try:
            if path == "/healthz":
                if self._alive():
                    return _text(HTTPStatus.OK, "ok\n")
                return _text(HTTPStatus.SERVICE_UNAVAILABLE, "the public listener stopped\n")
            if path == "/readyz":
                ready, reason = await self._callbacks.run("readyz", self._readiness)
                return _text(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, f"{reason}\n")
            accept = request.headers.get("Accept")
            body, content_type = await self._callbacks.run("metrics", lambda: self._metrics.exposition(accept))
            return _answer(HTTPStatus.OK, body, content_type)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            log.exception("GET %s failed", path)
            return _text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error\n")


def exposure_problems(settings: Settings, host: str, *, webhook: bool) -> list[str]:
    """What a non-loopback listen address must not serve unguarded (deploy safe by default): the dashboard
    without `ui_auth` (unless `insecure_ui`), and `/webhook` without any forge secret."""
    if is_loopback(host):
        return []
    problems = []
    if settings.ui_enabled and settings.ui_auth is None and not settings.insecure_ui:
        problems.append(f"the dashboard on {host} would be open to anyone who reaches it: set ui_auth "
                        "(bearer:<token> or basic-file:<path>), or ui_enabled: false, or insecure_ui: true (`ui`: "
                        "--insecure-ui) to serve it without authentication")
    secrets = (settings.github_webhook_secret, settings.gitlab_webhook_token, settings.gitea_webhook_secret)
    if webhook and all(s is None for s in secrets):
        problems.append(f"/webhook on {host} has no secret to check deliveries with: set github_webhook_secret, "
                        "gitlab_webhook_token or gitea_webhook_secret, or webhook_enabled: false")
    return problems


def refuse_unsafe_exposure(settings: Settings, host: str, *, webhook: bool) -> None:
    """ConfigError naming every problem of `exposure_problems`, before anything listens."""
    problems = exposure_problems(settings, host, webhook=webhook)
    if problems:
        raise ConfigError("refusing to listen: " + "; ".join(problems))


def _forge_hint(headers: Mapping[str, str]) -> str:
    """Which forge a request claims to be from, for metrics labels before anything is verified."""
    if headers.get("X-Gitea-Event"):
        return "gitea"
    if headers.get("X-Gitlab-Event"):
        return "gitlab"
    if headers.get("X-GitHub-Event"):
        return "github"
    return "unknown"
