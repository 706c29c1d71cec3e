"""GitLab commit statuses (REST API v4): the only module that talks to GitLab's API."""

from __future__ import annotations

from urllib.parse import quote

import httpx
from pydantic import SecretStr

from reconciler.clock import Clock, SystemClock
from reconciler.core.observed import Outcome
from reconciler.errors import ReportError
from reconciler.report._http import make_client, post_json
from reconciler.report.status import CommitStatus, shorten

GITLAB_URL = "https://gitlab.com"
DESCRIPTION_LIMIT = 255  # GitLab documents no limit; we keep it to one short line
STATE = {
    Outcome.PENDING: "pending",
    Outcome.SUCCESS: "success",
    Outcome.FAILURE: "failed",
    Outcome.ERROR: "failed",  # GitLab has no "error" state
}


class GitLabStatusSink:
    """POST /api/v4/projects/:id/statuses/:sha. `project` is the numeric ID or "group/sub/project"."""

    def __init__(
        self,
        project: int | str,
        token: SecretStr | str,
        *,
        base_url: str = GITLAB_URL,
        ref: str | None = None,
        clock: Clock | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 10.0,
        name: str = "gitlab",
    ) -> None:
        secret = token.get_secret_value() if isinstance(token, SecretStr) else token
        self.name = name
        self._project = str(project)
        self._ref = ref
        self._secrets = (secret,)
        self._clock = clock or SystemClock()
        self._client = make_client(
            base_url.rstrip("/") + "/api/v4", transport=transport, timeout=timeout, headers={"PRIVATE-TOKEN": secret}
        )

    def __repr__(self) -> str:
        return f"GitLabStatusSink({self._project} at {self._client.base_url})"

    def body(self, status: CommitStatus) -> dict[str, str]:
        body = {
            "state": STATE[status.state],
            "name": status.context,
            "description": shorten(status.description, DESCRIPTION_LIMIT),
        }
        if status.target_url:
            body["target_url"] = status.target_url
        if self._ref:
            body["ref"] = self._ref
        return body

    def post(self, status: CommitStatus) -> None:
        path = f"/projects/{quote(self._project, safe='')}/statuses/{status.revision}"
        body = self.body(status)
        try:
            post_json(
                self._client,
                path,
                body,
                forge="GitLab",
                what=f"status {status.context} on project {self._project}@{status.revision[:12]}",
                clock=self._clock,
                secrets=self._secrets,
            )
        except ReportError as e:
            # GitLab refuses to move a pending/running status to the state it already has (after a
            # restart we no longer know what we posted): the commit already shows what we wanted.
            if "Cannot transition status via" in str(e) and str(e).endswith(f"from :{body['state']}"):
                return
            raise

    def close(self) -> None:
        self._client.close()
