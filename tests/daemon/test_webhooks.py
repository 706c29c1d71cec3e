"""verify_webhook: the pure part. Signed, unsigned, wrongly signed and tampered deliveries per forge."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from reconciler.daemon.webhooks import Forge, WebhookSecrets, verify_webhook
from reconciler.errors import WebhookRejectedError
from tests.daemon import forges
from tests.daemon.forges import AFTER, GITEA_SECRET, GITHUB_SECRET, GITLAB_TOKEN

SECRETS = WebhookSecrets(github=GITHUB_SECRET.encode(), gitlab=GITLAB_TOKEN.encode(), gitea=GITEA_SECRET.encode())

Delivery = Callable[..., tuple[dict[str, str], bytes]]
PUSHES: list[tuple[Forge, Delivery, Callable[..., dict[str, Any]], str]] = [
    (Forge.GITHUB, forges.github, forges.github_push_payload, "secret"),
    (Forge.GITLAB, forges.gitlab, forges.gitlab_push_payload, "token"),
    (Forge.GITEA, forges.gitea, forges.gitea_push_payload, "secret"),
]


@pytest.mark.parametrize(("forge", "deliver", "payload", "key"), PUSHES, ids=[p[0].value for p in PUSHES])
def test_signed_push_to_our_branch_triggers(forge: Forge, deliver: Delivery, payload: Any, key: str) -> None:
    headers, body = deliver(payload())
    event = verify_webhook(headers, body, SECRETS, "main")
    assert event.forge is forge
    assert event.kind == "push"
    assert event.ref == "refs/heads/main"
    assert event.after == AFTER
    assert event.triggers_sync
    assert event.delivery


@pytest.mark.parametrize(("forge", "deliver", "payload", "key"), PUSHES, ids=[p[0].value for p in PUSHES])
def test_push_to_other_branch_is_verified_but_ignored(forge: Forge, deliver: Delivery, payload: Any, key: str) -> None:
    headers, body = deliver(payload(ref="refs/heads/feature-x"))
    event = verify_webhook(headers, body, SECRETS, "main")
    assert event.kind == "push"
    assert not event.branch_matches
    assert not event.triggers_sync


@pytest.mark.parametrize(("forge", "deliver", "payload", "key"), PUSHES, ids=[p[0].value for p in PUSHES])
def test_unsigned_push_is_rejected(forge: Forge, deliver: Delivery, payload: Any, key: str) -> None:
    headers, body = deliver(payload(), **{key: None})
    with pytest.raises(WebhookRejectedError) as err:
        verify_webhook(headers, body, SECRETS, "main")
    assert err.value.status == 401
    assert "unsigned" in err.value.reason


@pytest.mark.parametrize(("forge", "deliver", "payload", "key"), PUSHES, ids=[p[0].value for p in PUSHES])
def test_wrongly_signed_push_is_rejected(forge: Forge, deliver: Delivery, payload: Any, key: str) -> None:
    headers, body = deliver(payload(), **{key: "not-the-secret"})
    with pytest.raises(WebhookRejectedError) as err:
        verify_webhook(headers, body, SECRETS, "main")
    assert err.value.status == 401
    assert "not-the-secret" not in err.value.reason
    for secret in (GITHUB_SECRET, GITLAB_TOKEN, GITEA_SECRET):
        assert secret not in err.value.reason


@pytest.mark.parametrize("deliver", [forges.github, forges.gitea], ids=["github", "gitea"])
def test_tampered_body_fails_the_hmac(deliver: Delivery) -> None:
    headers, body = deliver(forges.github_push_payload())
    tampered = body.replace(b"refs/heads/main", b"refs/heads/evil")
    with pytest.raises(WebhookRejectedError, match="does not match"):
        verify_webhook(headers, tampered, SECRETS, "main")


@pytest.mark.parametrize(("forge", "deliver", "payload", "key"), PUSHES, ids=[p[0].value for p in PUSHES])
def test_forge_without_configured_secret_is_refused(forge: Forge, deliver: Delivery, payload: Any, key: str) -> None:
    headers, body = deliver(payload())
    with pytest.raises(WebhookRejectedError, match="not accepted") as err:
        verify_webhook(headers, body, WebhookSecrets(), "main")
    assert err.value.status == 401


def test_gitea_is_verified_with_the_gitea_secret_even_though_it_sends_github_headers() -> None:
    headers, body = forges.gitea(forges.gitea_push_payload())
    only_github = WebhookSecrets(github=GITEA_SECRET.encode())
    with pytest.raises(WebhookRejectedError, match="gitea"):
        verify_webhook(headers, body, only_github, "main")
    assert verify_webhook(headers, body, WebhookSecrets(gitea=GITEA_SECRET.encode()), "main").forge is Forge.GITEA


def test_headers_are_case_insensitive() -> None:
    headers, body = forges.github(forges.github_push_payload())
    lowered = {k.lower(): v for k, v in headers.items()}
    upper = {k.upper(): v for k, v in headers.items()}
    assert verify_webhook(lowered, body, SECRETS, "main").triggers_sync
    assert verify_webhook(upper, body, SECRETS, "main").triggers_sync


def test_github_sha1_signature_alone_is_not_enough() -> None:
    headers, body = forges.github(forges.github_push_payload())
    headers["X-Hub-Signature"] = "sha1=" + "0" * 40
    del headers["X-Hub-Signature-256"]
    with pytest.raises(WebhookRejectedError, match="unsigned"):
        verify_webhook(headers, body, SECRETS, "main")


def test_github_ping_is_verified_and_reported_as_ping() -> None:
    headers, body = forges.github(forges.github_ping_payload(), event="ping")
    event = verify_webhook(headers, body, SECRETS, "main")
    assert event.kind == "ping"
    assert not event.triggers_sync
    bad_headers, _ = forges.github(forges.github_ping_payload(), event="ping", secret="wrong")
    with pytest.raises(WebhookRejectedError):
        verify_webhook(bad_headers, body, SECRETS, "main")


def test_github_form_encoded_payload() -> None:
    from urllib.parse import urlencode

    body = urlencode({"payload": json.dumps(forges.github_push_payload())}).encode()
    headers, _ = forges.github({})
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    headers["X-Hub-Signature-256"] = "sha256=" + forges._hex(GITHUB_SECRET, body)
    event = verify_webhook(headers, body, SECRETS, "main")
    assert event.after == AFTER
    assert event.triggers_sync


def test_tag_pushes_do_not_trigger() -> None:
    headers, body = forges.github(forges.github_push_payload(ref="refs/tags/v1.0"))
    assert not verify_webhook(headers, body, SECRETS, "main").triggers_sync
    headers, body = forges.gitlab(forges.gitlab_push_payload(ref="refs/tags/v1.0"), event="Tag Push Hook")
    event = verify_webhook(headers, body, SECRETS, "main")
    assert event.kind == "other"
    assert not event.triggers_sync


def test_other_events_are_accepted_but_do_not_trigger() -> None:
    headers, body = forges.github({"action": "opened", "number": 1}, event="pull_request")
    event = verify_webhook(headers, body, SECRETS, "main")
    assert (event.kind, event.event, event.triggers_sync) == ("other", "pull_request", False)


def test_branch_is_matched_exactly() -> None:
    headers, body = forges.github(forges.github_push_payload(ref="refs/heads/main-old"))
    assert not verify_webhook(headers, body, SECRETS, "main").triggers_sync
    headers, body = forges.github(forges.github_push_payload(ref="refs/heads/release/2.x"))
    assert verify_webhook(headers, body, SECRETS, "release/2.x").triggers_sync


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"after": AFTER}, "no 'ref'"),
        ({"ref": "refs/heads/main", "after": "not-a-sha"}, "not a commit sha"),
        ({"ref": "refs/heads/main", "after": 42}, "not a commit sha"),
    ],
)
def test_malformed_push_payloads_are_400(payload: dict[str, Any], match: str) -> None:
    headers, body = forges.github(payload)
    with pytest.raises(WebhookRejectedError, match=match) as err:
        verify_webhook(headers, body, SECRETS, "main")
    assert err.value.status == 400


def test_signed_garbage_is_400_and_unsigned_garbage_401() -> None:
    body = b"\xff\xfe not json"
    headers, _ = forges.gitea({})
    headers["X-Gitea-Signature"] = forges._hex(GITEA_SECRET, body)
    with pytest.raises(WebhookRejectedError) as err:
        verify_webhook(headers, body, SECRETS, "main")
    assert err.value.status == 400
    headers["X-Gitea-Signature"] = "00" * 32
    with pytest.raises(WebhookRejectedError) as err:
        verify_webhook(headers, body, SECRETS, "main")
    assert err.value.status == 401


def test_no_forge_headers_is_400() -> None:
    with pytest.raises(WebhookRejectedError, match="not a GitHub") as err:
        verify_webhook({"Content-Type": "application/json"}, b"{}", SECRETS, "main")
    assert err.value.status == 400


def test_sha256_object_ids_are_accepted() -> None:
    sha256_id = "a" * 64
    headers, body = forges.gitlab(forges.gitlab_push_payload(after=sha256_id))
    assert verify_webhook(headers, body, SECRETS, "main").after == sha256_id


def test_secrets_repr_does_not_show_them() -> None:
    assert GITHUB_SECRET not in repr(SECRETS)
    assert "set" in repr(SECRETS)
