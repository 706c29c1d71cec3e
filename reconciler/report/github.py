"""GitHub commit statuses (REST API 2022-11-28): the only module that talks to GitHub's API.

Gitea and Forgejo serve the same statuses API under /api/v1; `reconciler.report.gitea` reuses this
sink with its own authentication header and limits."""

from __future__ import annotations

from urllib.parse import quote

import httpx
from pydantic import SecretStr

from reconciler.clock import Clock, SystemClock
from reconciler.report._http import make_client, post_json
from reconciler.report.status import CommitStatus, shorten

GITHUB_API = "https://api.github.com"
DESCRIPTION_LIMIT = 140  # GitHub answers 422 above this


class StatusesApiSink:
    """POST {api}/repos/{owner}/{repo}/statuses/{sha} with {state, target_url, description, context}."""

    forge = "GitHub"
    description_limit = DESCRIPTION_LIMIT

    def __init__(
        self,
        api_url: str,
        owner: str,
        repo: str,
        token: SecretStr | str,
        *,
        headers: dict[str, str],
        name: str,
        clock: Clock | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 10.0,
    ) -> None:
        secret = token.get_secret_value() if isinstance(token, SecretStr) else token
        self.name = name
        self._owner, self._repo = owner, repo
        self._secrets = (secret,)
        self._clock = clock or SystemClock()
        auth = {k: v.replace("{token}", secret) for k, v in headers.items()}
        self._client = make_client(api_url, transport=transport, timeout=timeout, headers=auth)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._owner}/{self._repo} at {self._client.base_url})"

    def body(self, status: CommitStatus) -> dict[str, str]:
        body = {
            "state": status.state.value,  # both forges' states include ours: pending|success|failure|error
            "description": shorten(status.description, self.description_limit),
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
            forge=self.forge,
            what=f"status {status.context} on {self._owner}/{self._repo}@{status.revision[:12]}",
            clock=self._clock,
            secrets=self._secrets,
        )

    def close(self) -> None:
        self._client.close()


class GitHubStatusSink(StatusesApiSink):
    """`api_url` is https://HOST/api/v3 for GitHub Enterprise Server."""

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
        super().__init__(
            api_url, owner, repo, token, name=name, clock=clock, transport=transport, timeout=timeout,
            headers={
                "Authorization": "Bearer {token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
            },
        )
