"""Gitea / Forgejo commit statuses (API v1): the only module that talks to Gitea's API."""

from __future__ import annotations

import httpx
from pydantic import SecretStr

from reconciler.clock import Clock
from reconciler.report.github import StatusesApiSink

DESCRIPTION_LIMIT = 255


class GiteaStatusSink(StatusesApiSink):
    """POST /api/v1/repos/{owner}/{repo}/statuses/{sha} on the Gitea at `base_url` (GitHub's shape)."""

    forge = "Gitea"
    description_limit = DESCRIPTION_LIMIT

    def __init__(
        self,
        base_url: str,
        owner: str,
        repo: str,
        token: SecretStr | str,
        *,
        clock: Clock | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 10.0,
        name: str = "gitea",
    ) -> None:
        super().__init__(
            base_url.rstrip("/") + "/api/v1", owner, repo, token, name=name, clock=clock, transport=transport,
            timeout=timeout, headers={"Authorization": "token {token}", "Accept": "application/json"},
        )
