"""GitHub commit statuses (REST API 2022-11-28): the only module that talks to GitHub's API."""

from __future__ import annotations

from urllib.parse import quote

import httpx
from pydantic import SecretStr

from reconciler.clock import Clock, SystemClock
from reconciler.report._http import make_client, post_json
from reconciler.report.status import CommitStatus, shorten

GITHUB_API = "https://api.github.com"
DESCRIPTION_LIMIT = 140  # GitHub answers 422 above this


class GitHubStatusSink:
    """POST /repos/{owner}/{repo}/statuses/{sha}. `api_url` is https://HOST/api/v3 for Enterprise Server."""

    def __init__(
        self,
        owner: str,
        repo: str,
        token: SecretStr | str,
        *,
        api_url: str = GITHUB_API,
        clock: Clock | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 10.0,
        name: str = "github",
    ) -> None:
        secret = token.get_secret_value() if isinstance(token, SecretStr) else token
        self.name = name
        self._owner, self._repo = owner, repo
        self._secrets = (secret,)
        self._clock = clock or SystemClock()
        self._client = make_client(
            api_url,
            transport=transport,
            timeout=timeout,
            headers={
                "Authorization": f"Bearer {secret}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
            },
        )

    def __repr__(self) -> str:
        return f"GitHubStatusSink({self._owner}/{self._repo} at {self._client.base_url})"

    def body(self, status: CommitStatus) -> dict[str, str]:
        body = {
            "state": status.state.value,  # GitHub's states are ours: pending|success|failure|error
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
            forge="GitHub",
            what=f"status {status.context} on {self._owner}/{self._repo}@{status.revision[:12]}",
            clock=self._clock,
            secrets=self._secrets,
        )

    def close(self) -> None:
        self._client.close()
