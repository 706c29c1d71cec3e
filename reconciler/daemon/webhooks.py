"""Pure webhook verification for GitHub, GitLab and Gitea push events (no I/O, no clock).

The signature is checked on the raw body *before* the JSON is parsed, so unauthenticated input is never
interpreted. Every compare is constant-time. A forge with no secret configured is refused outright:
an unsigned webhook could otherwise make anyone on the network trigger fetches.

Forge detection: Gitea also sends X-GitHub-Event / X-Gogs-Event for compatibility, so X-Gitea-Event is
checked first.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal
from urllib.parse import parse_qs

from reconciler.errors import WebhookRejectedError

_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


class Forge(StrEnum):
    GITHUB = "github"
    GITLAB = "gitlab"
    GITEA = "gitea"


@dataclass(frozen=True)
class WebhookSecrets:
    """The configured secrets as bytes; None means that forge's webhooks are refused."""

    github: bytes | None = None
    gitlab: bytes | None = None
    gitea: bytes | None = None

    def __repr__(self) -> str:
        shown = {f: "set" if getattr(self, f) else None for f in ("github", "gitlab", "gitea")}
        return f"WebhookSecrets({shown})"


@dataclass(frozen=True)
class WebhookEvent:
    """A verified delivery. `triggers_sync` is True only for a push to the branch we follow."""

    forge: Forge
    kind: Literal["push", "ping", "other"]
    event: str  # the forge's own event name, e.g. "push", "Push Hook", "ping"
    delivery: str | None = None
    ref: str | None = None
    after: str | None = None
    branch_matches: bool = False

    @property
    def triggers_sync(self) -> bool:
        return self.kind == "push" and self.branch_matches

    def describe(self) -> str:
        if self.kind == "push":
            sha = (self.after or "?")[:12]
            return f"{self.forge} push {self.ref} {sha}"
        return f"{self.forge} {self.event}"


def verify_webhook(headers: Mapping[str, str], body: bytes, secrets: WebhookSecrets, branch: str) -> WebhookEvent:
    """Authenticate and parse one delivery, or raise WebhookRejectedError (401 auth, 400 malformed)."""
    h = {k.lower(): v for k, v in headers.items()}
    if "x-gitea-event" in h:
        forge, event = Forge.GITEA, h["x-gitea-event"]
        _check_hmac_hex(Forge.GITEA, secrets.gitea, h.get("x-gitea-signature"), body, prefix="")
        delivery = h.get("x-gitea-delivery")
        kind: Literal["push", "ping", "other"] = "push" if event == "push" else "other"
    elif "x-gitlab-event" in h:
        forge, event = Forge.GITLAB, h["x-gitlab-event"]
        _check_token(secrets.gitlab, h.get("x-gitlab-token"))
        delivery = h.get("x-gitlab-event-uuid")
        kind = "push" if event == "Push Hook" else "other"
    elif "x-github-event" in h:
        forge, event = Forge.GITHUB, h["x-github-event"]
        _check_hmac_hex(Forge.GITHUB, secrets.github, h.get("x-hub-signature-256"), body, prefix="sha256=")
        delivery = h.get("x-github-delivery")
        kind = "push" if event == "push" else "ping" if event == "ping" else "other"
    else:
        raise WebhookRejectedError("not a GitHub, GitLab or Gitea webhook (no X-*-Event header)", status=400)

    if kind != "push":
        return WebhookEvent(forge=forge, kind=kind, event=event, delivery=delivery)
    payload = _payload(body, h.get("content-type", ""))
    ref = payload.get("ref")
    after = payload.get("after")
    if not isinstance(ref, str) or not ref:
        raise WebhookRejectedError("push payload has no 'ref'", status=400)
    if after is not None and (not isinstance(after, str) or not _SHA.match(after)):
        raise WebhookRejectedError("push payload 'after' is not a commit sha", status=400)
    return WebhookEvent(
        forge=forge,
        kind="push",
        event=event,
        delivery=delivery,
        ref=ref,
        after=after,
        branch_matches=ref == f"refs/heads/{branch}",
    )


def sign_hmac_sha256(secret: bytes, body: bytes) -> str:
    """Hex HMAC-SHA256 as GitHub (after `sha256=`) and Gitea send it; used by tests and docs."""
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def _check_hmac_hex(forge: Forge, secret: bytes | None, header: str | None, body: bytes, *, prefix: str) -> None:
    name = "X-Hub-Signature-256" if forge is Forge.GITHUB else "X-Gitea-Signature"
    if not secret:
        raise WebhookRejectedError(f"{forge} webhooks are not accepted: no {forge}_webhook_secret configured")
    if not header:
        raise WebhookRejectedError(f"unsigned {forge} webhook: no {name} header")
    expected = (prefix + sign_hmac_sha256(secret, body)).encode("ascii")
    if not hmac.compare_digest(expected, header.strip().lower().encode("utf-8", "replace")):
        raise WebhookRejectedError(f"{forge} webhook signature ({name}) does not match the body")


def _check_token(secret: bytes | None, header: str | None) -> None:
    if not secret:
        raise WebhookRejectedError("gitlab webhooks are not accepted: no gitlab_webhook_token configured")
    if not header:
        raise WebhookRejectedError("unsigned gitlab webhook: no X-Gitlab-Token header")
    if not hmac.compare_digest(secret, header.encode("utf-8", "replace")):
        raise WebhookRejectedError("gitlab webhook X-Gitlab-Token does not match")


def _payload(body: bytes, content_type: str) -> dict[str, Any]:
    """JSON body, or GitHub's form encoding (`payload=<json>`). Deeply nested JSON (`[[[[...`) makes
    the stdlib parser raise RecursionError: that is malformed input too, not a server error."""
    try:
        text = body.decode("utf-8")
        if content_type.split(";", maxsplit=1)[0].strip().lower() == "application/x-www-form-urlencoded":
            text = parse_qs(text).get("payload", [""])[0]
        data = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WebhookRejectedError(f"payload is not valid JSON: {e.__class__.__name__}", status=400) from None
    if not isinstance(data, dict):
        raise WebhookRejectedError("payload is not a JSON object", status=400)
    return data
