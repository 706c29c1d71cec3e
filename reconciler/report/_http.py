"""The HTTP plumbing the forge sinks share: one POST, and reading a forge's answer into our errors.

Each forge module owns its URL, headers and body; this module only knows HTTP: which answers are
worth retrying and how long the forge asked us to wait.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from reconciler.clock import Clock
from reconciler.errors import ReportError, TransientReportError
from reconciler.redaction import redact_urls

USER_AGENT = "flink-reconciler"
SECONDARY_RATE_LIMIT_WAIT = 60.0  # GitHub: "otherwise, wait for at least one minute"


def make_client(
    base_url: str, *, transport: httpx.BaseTransport | None, timeout: float, headers: Mapping[str, str]
) -> httpx.Client:
    return httpx.Client(
        base_url=base_url.rstrip("/"),
        transport=transport,
        timeout=timeout,
        headers={"User-Agent": USER_AGENT, **headers},
        follow_redirects=False,
    )


def post_json(
    client: httpx.Client,
    path: str,
    body: Mapping[str, Any],
    *,
    forge: str,
    what: str,
    clock: Clock,
    secrets: Sequence[str] = (),
) -> Any:
    """POST `body`; the decoded answer on 2xx, else ReportError / TransientReportError with the forge's text."""
    try:
        response = client.post(path, json=dict(body))
    except httpx.TransportError as e:  # connect, read, timeouts: the forge may be back soon
        raise TransientReportError(_redact(f"{forge}: {what}: {type(e).__name__}: {e}", secrets)) from None
    if response.is_success:
        try:
            return response.json()
        except ValueError:
            return None
    message = _redact(f"{forge}: {what}: HTTP {response.status_code}: {forge_message(response)}", secrets)
    retry_after = retry_after_seconds(response.headers, clock)
    if is_rate_limited(response):
        raise TransientReportError(
            message, retry_after=retry_after if retry_after is not None else SECONDARY_RATE_LIMIT_WAIT
        )
    if response.status_code >= 500 or response.status_code == 408:
        raise TransientReportError(message, retry_after=retry_after)
    raise ReportError(message)


def is_rate_limited(response: httpx.Response) -> bool:
    if response.status_code == 429:
        return True
    if response.status_code != 403:
        return False
    h = response.headers
    return (
        h.get("x-ratelimit-remaining") == "0"
        or "retry-after" in h
        or "rate limit" in forge_message(response).lower()
    )


def retry_after_seconds(headers: httpx.Headers, clock: Clock) -> float | None:
    """Seconds the forge asked us to wait: Retry-After (seconds or HTTP date), else an exhausted
    rate limit's reset time (GitHub x-ratelimit-reset, GitLab RateLimit-Reset: UTC epoch seconds)."""
    value = headers.get("retry-after")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
                return max(0.0, (when - clock.now()).total_seconds())
            except (TypeError, ValueError):
                pass
    pairs = (("x-ratelimit-remaining", "x-ratelimit-reset"), ("ratelimit-remaining", "ratelimit-reset"))
    for remaining, reset in pairs:
        if headers.get(remaining) == "0" and headers.get(reset):
            try:
                return max(0.0, float(headers[reset]) - clock.now().timestamp())
            except ValueError:
                continue
    return None


def forge_message(response: httpx.Response) -> str:
    """The forge's own error words: GitHub/Gitea `message` (+ `errors`), GitLab `message` or `error`."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if not isinstance(body, dict):
        return str(body)[:500]
    parts: list[str] = []
    for key in ("message", "error"):
        if key in body:
            parts.append(body[key] if isinstance(body[key], str) else str(body[key]))
    for err in body.get("errors") or []:
        if isinstance(err, dict):
            parts.append(str(err.get("message") or f"{err.get('field')}: {err.get('code')}"))
        else:
            parts.append(str(err))
    return "; ".join(parts)[:500] or response.reason_phrase


def _redact(text: str, secrets: Sequence[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return redact_urls(text)
