"""The dashboard's pages: routing, authentication, headers and rendering, independent of the HTTP server
that carries them (the daemon's, or the one `flink-reconciler ui` starts: both are daemon/http.py).

Every page is rendered by Jinja2 with autoescaping on, and every value printed goes through the log
redaction first (`finalize`), so an app name, a commit message or a Flink error is text, never markup, and
a token that reached a message is `***`; control characters (a bidi override in a commit subject) are shown
as `<U+202E>`, and long text is cut where a line is meant and shown whole once per page (ui/text.py).
Scripts and styles are files of this package only (the CSP allows nothing else); there are no inline
scripts, styles or event handlers.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from http import HTTPStatus
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from reconciler import __version__
from reconciler.alerting.alerter import ActiveAlert
from reconciler.errors import ConfigError
from reconciler.logs import mask_secrets, redact
from reconciler.redaction import redact_url
from reconciler.ui.model import SORTS, STATE, STATES, Query
from reconciler.ui.read import ReadSide, plan_page
from reconciler.ui.text import LongText, clip, plain, shown

log = logging.getLogger(__name__)

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATIC = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8",
          "favicon.svg": "image/svg+xml"}
PER_PAGE = 100
REFRESH_MS_SMALL, REFRESH_MS_LARGE = 1000, 5000  # the page's polling; over 2,000 apps, less often
# An app's page. The name may hold a '/' (a row named after a spec file whose app name is invalid), sent as
# %2F or, by a client or server that decodes it, as a second segment.
_APP_PATH = re.compile(r"/apps/(.{1,1000})\Z", re.DOTALL)


@dataclass(frozen=True)
class Answer:
    status: HTTPStatus
    body: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class UiAuth:
    """`ui_auth`: `bearer:<token>` or `basic-file:<path>` (lines `user:password`, `#` comments)."""

    token: str | None = None
    basic_file: Path | None = None

    @classmethod
    def parse(cls, value: str | None) -> UiAuth | None:
        if not value:
            return None
        kind, _, rest = value.partition(":")
        if kind == "bearer" and len(rest) >= 8:
            mask_secrets(rest)
            return cls(token=rest)
        if kind == "basic-file" and rest:
            path = Path(rest)
            if not path.is_file():
                raise ConfigError(f"ui_auth: basic-file {path} is not a readable file")
            return cls(basic_file=path)
        raise ConfigError("ui_auth must be bearer:<token of 8 characters or more> or basic-file:<path>")

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, cred = header.strip().partition(" ")
        if scheme.lower() == "bearer" and self.token is not None:
            return hmac.compare_digest(cred.strip().encode(), self.token.encode())
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(cred.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if self.token is not None:  # a browser's login prompt: any user, the token as password
            return hmac.compare_digest(password.encode(), self.token.encode())
        return any(hmac.compare_digest(f"{user}:{password}".encode(), line.encode()) for line in self._lines())

    def _lines(self) -> list[str]:
        assert self.basic_file is not None
        try:
            text = self.basic_file.read_text(encoding="utf-8")
        except OSError as e:
            log.warning("ui_auth: cannot read %s: %s", self.basic_file, e.strerror or e)
            return []
        lines = [ln.strip() for ln in text.splitlines()]
        for ln in lines:
            if ln and not ln.startswith("#"):
                mask_secrets(ln.partition(":")[2])
        return [ln for ln in lines if ln and not ln.startswith("#") and ":" in ln]


def _finalize(value: Any) -> Any:
    """Every `{{ value }}`: None prints nothing, text is redacted and its control characters spelled out
    (autoescaping comes after); the `shown` filter does the same with markup, for element content."""
    if value is None:
        return ""
    if isinstance(value, str) and not isinstance(value, Markup):
        return plain(value)
    return value


class Dashboard:
    def __init__(self, read: ReadSide, *, auth: UiAuth | None = None, title: str = "flink-reconciler",
                 alerts: Callable[[], Sequence[ActiveAlert]] | None = None) -> None:
        self.read = read
        self.alerts = alerts  # the daemon's firing alerts (alerting/alerter.py); None: `ui` has no alerter
        self.auth = auth
        self.title = title
        self.env = Environment(loader=PackageLoader("reconciler.ui", "templates"), autoescape=True,
                               finalize=_finalize, undefined=StrictUndefined, trim_blocks=True,
                               lstrip_blocks=True)
        self.env.filters.update(short=_short, ago=self._ago, ts=_ts, duration=_duration, shown=shown, clip=clip,
                                segment=_segment)
        self.env.globals.update(STATES=STATES, STATE=STATE, version=__version__, title=title,
                                subject=read.subject, commit_url=read.commit_url, SORTS=SORTS)
        self._static = {name: resources.files("reconciler.ui").joinpath("static", name).read_bytes()
                        for name in STATIC}

    # ---- routing ------------------------------------------------------------------------------------

    def handles(self, path: str) -> bool:
        return path in ("/", "/plan") or path.startswith(("/apps/", "/static/"))

    def handle(self, path: str, query: str, headers: Mapping[str, str]) -> Answer:
        """Answer a GET of a dashboard path (`handles(path)`)."""
        authorization = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
        if self.auth is not None and not self.auth.allows(authorization):
            return Answer(HTTPStatus.UNAUTHORIZED, b"authentication required\n", "text/plain; charset=utf-8",
                          {**SECURITY_HEADERS, "WWW-Authenticate": 'Basic realm="flink-reconciler", charset="UTF-8"'})
        if path.startswith("/static/"):
            name = path[len("/static/"):]
            if name not in self._static:
                return self._page(HTTPStatus.NOT_FOUND, "missing.html", what=path)
            return Answer(HTTPStatus.OK, self._static[name], STATIC[name],
                          {**SECURITY_HEADERS, "Cache-Control": "max-age=300"})
        args = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        if path == "/":
            return self.overview(args)
        if path == "/plan":
            return self.plan(args)
        m = _APP_PATH.match(path)
        if m:
            return self.app(unquote(m.group(1)))
        return self._page(HTTPStatus.NOT_FOUND, "missing.html", what=path)

    # ---- pages --------------------------------------------------------------------------------------

    def overview(self, args: Mapping[str, str]) -> Answer:
        query = Query(q=args.get("q", "")[:200], namespace=args.get("ns", "")[:253],
                      state=args.get("state", "") if args.get("state", "") in STATE else "",
                      sort=args.get("sort", "name") if args.get("sort") in SORTS else "name",
                      desc=args.get("desc") == "1", page=_int(args.get("page"), 1), per_page=PER_PAGE)
        ov = self.read.overview(query)

        def link(**change: object) -> str:
            current = {"q": query.q, "ns": query.namespace, "state": query.state, "sort": query.sort,
                       "desc": "1" if query.desc else "", "page": str(ov.selection.page)}
            current.update({k: str(v) for k, v in change.items()})
            return "/?" + urlencode({k: v for k, v in current.items() if v and not (k == "sort" and v == "name")
                                     and not (k == "page" and v == "1")})

        refresh = REFRESH_MS_SMALL if ov.selection.total <= 2000 else REFRESH_MS_LARGE
        return self._page(HTTPStatus.OK, "overview.html", ov=ov, sel=ov.selection, query=query, link=link,
                          refresh=refresh, tip=ov.tip)

    def app(self, name: str) -> Answer:
        detail = self.read.app(name)
        if detail is None:
            return self._page(HTTPStatus.NOT_FOUND, "missing.html", what=f"app {name}")
        return self._page(HTTPStatus.OK, "app.html", d=detail, row=detail.row, tip=self.read.tip(),
                          refresh=REFRESH_MS_SMALL)

    def plan(self, args: Mapping[str, str] | None = None) -> Answer:
        """The branch tip's plan, PLAN_PER_PAGE apps a page (`?page=N`), each app's block collapsible."""
        tip, the_plan, why = self.read.plan()
        pp = plan_page(the_plan, _int((args or {}).get("page"), 1)) if the_plan else None
        head = [(_plan_line_class(ln), ln) for ln in pp.head] if pp else []
        blocks = [(b, _plan_line_class(b.head), [(_plan_line_class(ln), ln) for ln in b.lines])
                  for b in pp.blocks] if pp else []
        computing = the_plan is None and why is None  # in the background: the page refreshes until it is there
        return self._page(HTTPStatus.OK, "plan.html", tip=tip, head=head, blocks=blocks, pp=pp, why=why,
                          computing=computing, has_changes=the_plan.has_changes if the_plan else False,
                          refresh=REFRESH_MS_SMALL if computing else 0)

    def _page(self, status: HTTPStatus, template: str, **ctx: Any) -> Answer:
        ctx.setdefault("tip", None)
        ctx.setdefault("refresh", 0)
        ctx.setdefault("nav", {"overview.html": "apps", "plan.html": "plan"}.get(template, ""))
        ctx.setdefault("alerts", list(self.alerts()) if self.alerts is not None else [])
        html = self.env.get_template(template).render(now=self.read.clock.now(), mode=self.read.mode,
                                                      repo=redact(redact_url(self.read.repo_url or "")),
                                                      long=LongText(), **ctx)
        return Answer(status, html.encode("utf-8"), "text/html; charset=utf-8", SECURITY_HEADERS)

    def _ago(self, when: datetime | None) -> str:
        if when is None:
            return ""
        return _duration((self.read.clock.now() - when).total_seconds()) + " ago"


def _plan_line_class(line: str) -> str:
    s = line.strip()
    if s.startswith("RISK:") or s.startswith("GUARD:"):
        return "risk"
    if s.startswith("+ ") or s.startswith("+"):
        return "add" if line.startswith("    ") else "head"
    if s.startswith("- ") and line.startswith("    "):
        return "del"
    if line.startswith(("! ", "x ")):
        return "bad"
    if line and not line.startswith(" "):
        return "head"
    return ""


def _int(raw: str | None, default: int) -> int:
    try:
        return max(1, int(raw or default))
    except ValueError:
        return default


def _segment(name: str) -> str:
    """`name` as one path segment of a link: a row named after its file (`apps/x.yaml`) keeps its `/` inside
    the segment (`/apps/apps%2Fx.yaml`)."""
    return quote(name, safe="")


def _short(sha: str | None) -> str:
    return (sha or "")[:12]


def _ts(when: datetime | None) -> str:
    return f"{when:%Y-%m-%d %H:%M:%S}" if when is not None else ""


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"
