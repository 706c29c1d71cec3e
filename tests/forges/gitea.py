"""Gitea (and Forgejo) "Create a commit status" contract server.

Published API (Gitea swagger, repoCreateStatus / CreateStatusOption):
  POST /api/v1/repos/{owner}/{repo}/statuses/{sha}
  header Authorization: token <token> (Gitea also takes "Bearer <token>")
  body CreateStatusOption: context, description, state (CommitStatusState: pending|success|error|
       failure|warning|skipped), target_url — all strings
  201 with CommitStatus {id, status, target_url, description, url, context, creator, created_at,
  updated_at}; 401 on a bad token; 404 unknown repo; 422 on invalid fields.
Gitea has no API rate limit of its own; a proxy in front of it answers 429 with Retry-After.
"""

from __future__ import annotations

import re
from typing import Any

from reconciler.clock import Clock
from tests.forges.base import Answer, Failure, ForgeServer, Json, Request, is_http_url, json_body

STATES = {"pending", "success", "error", "failure", "warning", "skipped"}
FIELDS = {"state", "target_url", "description", "context"}


class GiteaServer(ForgeServer):
    name = "gitea"

    def __init__(
        self, token: str, *, owner: str = "acme", repo: str = "flink-apps", clock: Clock | None = None
    ) -> None:
        super().__init__(token, clock=clock)
        self.owner, self.repo = owner, repo

    def _error(self, status: int, message: str) -> Answer:
        return Answer(status, {"message": message, "url": f"{self.url}/api/swagger"})

    def route(self, request: Request) -> Answer:
        m = re.match(r"^/api/v1/repos/([^/]+)/([^/]+)/statuses/([^/]+)$", request.path)
        if m is None or request.method != "POST":
            return self._error(404, "not found")
        if request.headers.get("authorization") not in (f"token {self.token}", f"Bearer {self.token}"):
            return self._error(401, "user does not exist [uid: 0, name: ]")
        owner, repo, sha = m.groups()
        if (owner, repo) != (self.owner, self.repo):
            return self._error(404, "The target couldn't be found.")
        body = json_body(request)
        if body is None:
            return self._error(422, "invalid JSON body")
        error = self._validate(body)
        if error:
            return self._error(422, error)
        if not re.fullmatch(r"[0-9a-f]{40}", sha):
            return self._error(422, f"object does not exist [id: {sha}, rel_path: ]")
        now = self.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        status_id = self.new_id()
        status: Json = {
            "id": status_id,
            "status": body["state"],
            "target_url": body.get("target_url", ""),
            "description": body.get("description", ""),
            "url": f"{self.url}/api/v1/repos/{owner}/{repo}/statuses/{sha}",
            "context": body.get("context", ""),
            "creator": {"id": 3, "login": "flink-bot"},
            "created_at": now,
            "updated_at": now,
            "_sha": sha,
        }
        self.accepted.append(status)
        return Answer(201, status)

    @staticmethod
    def _validate(body: dict[str, Any]) -> str | None:
        for key in FIELDS:
            if key in body and not isinstance(body[key], str):
                return f"[{key}]: must be a string"
        if body.get("state") not in STATES:
            return f"[State]: invalid commit status state {body.get('state')!r}"
        url = body.get("target_url")
        if url and not is_http_url(url):
            return "[TargetURL]: invalid url"
        unknown = sorted(set(body) - FIELDS)
        return f"contract: unknown fields {unknown}" if unknown else None

    def rate_limit_answer(self, failure: Failure) -> Answer:
        retry = int(failure.retry_after if failure.retry_after is not None else 30)
        return Answer(429, "Too Many Requests", {"Retry-After": str(retry)})
