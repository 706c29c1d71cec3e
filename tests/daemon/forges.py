"""Webhook deliveries shaped like the real ones (headers and trimmed payloads from the forges' docs)."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

GITHUB_SECRET = "gh-s3cret-value"
GITLAB_TOKEN = "gl-t0ken-value"
GITEA_SECRET = "gt-s3cret-value"

AFTER = "bffeb74224043ba2feb48d137756c8a9331c449a"
BEFORE = "28e1879d029cb852e4844d9c718537df08844e03"


def _hex(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_push_payload(ref: str = "refs/heads/main", after: str = AFTER) -> dict[str, Any]:
    return {
        "ref": ref,
        "before": BEFORE,
        "after": after,
        "created": False,
        "deleted": False,
        "forced": False,
        "base_ref": None,
        "compare": f"https://github.com/acme/flink-apps/compare/{BEFORE[:12]}...{after[:12]}",
        "commits": [
            {
                "id": after,
                "message": "orders: parallelism 4",
                "timestamp": "2026-01-01T12:00:00Z",
                "author": {"name": "Dev", "email": "dev@example.com", "username": "dev"},
                "added": [],
                "removed": [],
                "modified": ["apps/orders.yaml"],
            }
        ],
        "head_commit": {"id": after, "message": "orders: parallelism 4"},
        "repository": {
            "id": 1296269,
            "name": "flink-apps",
            "full_name": "acme/flink-apps",
            "clone_url": "https://github.com/acme/flink-apps.git",
            "default_branch": "main",
        },
        "pusher": {"name": "dev", "email": "dev@example.com"},
        "sender": {"login": "dev", "id": 1},
    }


def github(
    payload: dict[str, Any], *, event: str = "push", secret: str | None = GITHUB_SECRET
) -> tuple[dict[str, str], bytes]:
    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/044aadd",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "X-GitHub-Hook-ID": "292430182",
    }
    if secret is not None:
        headers["X-Hub-Signature-256"] = "sha256=" + _hex(secret, body)
    return headers, body


def github_ping_payload() -> dict[str, Any]:
    return {
        "zen": "Encourage flow.",
        "hook_id": 292430182,
        "hook": {"type": "Repository", "id": 292430182, "name": "web", "active": True, "events": ["push"]},
        "repository": {"full_name": "acme/flink-apps"},
    }


def gitlab_push_payload(ref: str = "refs/heads/main", after: str = AFTER) -> dict[str, Any]:
    return {
        "object_kind": "push",
        "event_name": "push",
        "before": BEFORE,
        "after": after,
        "ref": ref,
        "ref_protected": True,
        "checkout_sha": after,
        "user_id": 4,
        "user_name": "Dev",
        "user_username": "dev",
        "project_id": 15,
        "project": {
            "id": 15,
            "name": "flink-apps",
            "path_with_namespace": "acme/flink-apps",
            "default_branch": "main",
            "git_http_url": "https://gitlab.example.com/acme/flink-apps.git",
        },
        "commits": [
            {
                "id": after,
                "message": "orders: parallelism 4",
                "title": "orders: parallelism 4",
                "timestamp": "2026-01-01T12:00:00+00:00",
                "author": {"name": "Dev", "email": "dev@example.com"},
                "added": [],
                "modified": ["apps/orders.yaml"],
                "removed": [],
            }
        ],
        "total_commits_count": 1,
        "repository": {"name": "flink-apps", "url": "git@gitlab.example.com:acme/flink-apps.git"},
    }


def gitlab(
    payload: dict[str, Any], *, event: str = "Push Hook", token: str | None = GITLAB_TOKEN
) -> tuple[dict[str, str], bytes]:
    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitLab/17.0.0",
        "X-Gitlab-Event": event,
        "X-Gitlab-Event-UUID": "13792a34-cac6-4fda-95a8-c58e00a3954e",
        "X-Gitlab-Instance": "https://gitlab.example.com",
        "X-Gitlab-Webhook-UUID": "2bd6f8ba-6c4b-4d2b-8e1b-7d0a4c1b9f11",
    }
    if token is not None:
        headers["X-Gitlab-Token"] = token
    return headers, body


def gitea_push_payload(ref: str = "refs/heads/main", after: str = AFTER) -> dict[str, Any]:
    return {
        "ref": ref,
        "before": BEFORE,
        "after": after,
        "compare_url": f"http://gitea.example.com/acme/flink-apps/compare/{BEFORE}...{after}",
        "commits": [
            {
                "id": after,
                "message": "orders: parallelism 4\n",
                "url": f"http://gitea.example.com/acme/flink-apps/commit/{after}",
                "author": {"name": "Dev", "email": "dev@example.com", "username": "dev"},
                "committer": {"name": "Dev", "email": "dev@example.com", "username": "dev"},
                "timestamp": "2026-01-01T12:00:00Z",
            }
        ],
        "repository": {"id": 140, "name": "flink-apps", "full_name": "acme/flink-apps", "default_branch": "main"},
        "pusher": {"login": "dev"},
        "sender": {"login": "dev"},
    }


def gitea(
    payload: dict[str, Any], *, event: str = "push", secret: str | None = GITEA_SECRET
) -> tuple[dict[str, str], bytes]:
    """Gitea also sends the GitHub and Gogs event headers, and (1.19+) X-Hub-Signature-256."""
    body = json.dumps(payload).encode()
    delivery = "f6266f16-1bf3-46a5-9ea4-602e06ead473"
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Go-http-client/1.1",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": event,
        "X-Gogs-Delivery": delivery,
        "X-Gogs-Event": event,
        "X-Gitea-Delivery": delivery,
        "X-Gitea-Event": event,
    }
    if secret is not None:
        sig = _hex(secret, body)
        headers |= {"X-Gitea-Signature": sig, "X-Gogs-Signature": sig, "X-Hub-Signature-256": "sha256=" + sig}
    return headers, body
