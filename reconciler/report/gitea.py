"""Gitea / Forgejo commit statuses (API v1): the only module that talks to Gitea's API."""

from __future__ import annotations

from urllib.parse import quote

import httpx
from pydantic import SecretStr

from reconciler.clock import Clock, SystemClock
from reconciler.report._http import make_client, post_json
from reconciler.report.status import CommitStatus, shorten

DESCRIPTION_LIMIT = 255


class GiteaStatusSink:
    """POST /api/v1/repos/{owner}/{repo}/statuses/{sha} on the Gitea at `base_url`."""

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
        secret = token.get_secret_value() if isinstance(token, SecretStr) else token
        self.name = name
        self._owner, self._repo = owner, repo
        self._secrets = (secret,)
        self._clock = clock or SystemClock()
        self._client = make_client(
            base_url.rstrip("/") + "/api/v1",
            transport=transport,
            timeout=timeout,
            headers={"Authorization": f"token {secret}", "Accept": "application/json"},
        )

    def __repr__(self) -> str:
        return f"GiteaStatusSink({self._owner}/{self._repo} at {self._client.base_url})"

    def body(self, status: CommitStatus) -> dict[str, str]:
        body = {
            "state": status.state.value,  # Gitea's states include ours: pending|success|error|failure
            "description": shorten(status.description, DESCRIPTION_LIMIT),
            "context": status.context,
        }
        if status.target_url:
            body["target_url"] = status.target_url
        return body

    def post(self, status: CommitStatus) -> None:
        path = f"/repos/{quote(self._owner, safe='')}/{quote(self._repo, safe='')}/statuses/{status.revision}"
        post_json(
            self._client,
            path,
            self.body(status),
            forge="Gitea",
            what=f"status {status.context} on {self._owner}/{self._repo}@{status.revision[:12]}",
            clock=self._clock,
            secrets=self._secrets,
        )

    def close(self) -> None:
        self._client.close()
