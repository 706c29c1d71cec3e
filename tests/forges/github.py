"""GitHub "Create a commit status" contract server.

Published API (docs.github.com/rest/commits/statuses, API version 2022-11-28):
  POST /repos/{owner}/{repo}/statuses/{sha}
  headers: Authorization: Bearer <token> (or "token <token>"), Accept: application/vnd.github+json,
           X-GitHub-Api-Version: 2022-11-28, a User-Agent (required by the REST API)
  body: state (required: error|failure|pending|success), target_url (string|null),
        description (string|null, at most 140 characters), context (string, default "default")
  201 with the status object; 401 Bad credentials; 404 unknown repo; 422 Validation Failed / no commit.
  Rate limit: 403 or 429, x-ratelimit-remaining: 0 and x-ratelimit-reset (UTC epoch seconds);
  secondary limits may carry retry-after instead.
GitHub Enterprise Server serves the same under /api/v3.
"""

from __future__ import annotations

import re
from typing import Any

from reconciler.clock import Clock
from tests.forges.base import Answer, Failure, ForgeServer, Json, Request, is_http_url, json_body

DOCS = "https://docs.github.com/rest/commits/statuses#create-a-commit-status"
STATES = {"error", "failure", "pending", "success"}
API_VERSIONS = {"2022-11-28", "2026-03-10"}
FIELDS = {"state", "target_url", "description", "context"}


class GitHubServer(ForgeServer):
    name = "github"

    def __init__(
        self, token: str, *, owner: str = "acme", repo: str = "flink-apps", prefix: str = "",
        known_shas: set[str] | None = None, clock: Clock | None = None,
    ) -> None:
        super().__init__(token, clock=clock)
        self.owner, self.repo, self.prefix = owner, repo, prefix
        self.known_shas = known_shas
        self._path = re.compile(rf"^{re.escape(prefix)}/repos/([^/]+)/([^/]+)/statuses/([^/]+)$")

    def _error(self, status: int, message: str, errors: list[Json] | None = None) -> Answer:
        body: Json = {"message": message, "documentation_url": DOCS, "status": str(status)}
        if errors:
            body["errors"] = errors
        return Answer(status, body)

    def route(self, request: Request) -> Answer:
        m = self._path.match(request.path)
        if request.method != "POST" or m is None:
            return self._error(404, "Not Found")
        if "user-agent" not in request.headers:
            return Answer(403, "Request forbidden by administrative rules. Please make sure your request has a "
                          "User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api"
                          "#user-agent-required). Check https://developer.github.com for other possible causes.")
        auth = request.headers.get("authorization")
        if auth is None:
            return self._error(401, "Requires authentication")
        if auth not in (f"Bearer {self.token}", f"token {self.token}"):
            return self._error(401, "Bad credentials")
        version = request.headers.get("x-github-api-version")
        if version is not None and version not in API_VERSIONS:
            return self._error(400, f"API version {version} is not supported.")
        if version is None or request.headers.get("accept") != "application/vnd.github+json":
            return self._error(400, "contract: send Accept: application/vnd.github+json and X-GitHub-Api-Version")
        owner, repo, sha = m.groups()
        if (owner, repo) != (self.owner, self.repo):
            return self._error(404, "Not Found")
        body = json_body(request)
        if body is None:
            return self._error(400, "Problems parsing JSON")
        errors = self._validate(body)
        if errors:
            return self._error(422, "Validation Failed", errors)
        if not re.fullmatch(r"[0-9a-f]{40}", sha) or (self.known_shas is not None and sha not in self.known_shas):
            return self._error(422, f"No commit found for SHA: {sha}")
        now = self.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        status_id = self.new_id()
        status: Json = {
            "url": f"https://api.github.com/repos/{owner}/{repo}/statuses/{sha}",
            "avatar_url": "https://github.com/images/error/hubot_happy.gif",
            "id": status_id,
            "node_id": f"SC_{status_id:08d}",
            "state": body["state"],
            "description": body.get("description"),
            "target_url": body.get("target_url"),
            "context": body.get("context", "default"),
            "created_at": now,
            "updated_at": now,
            "creator": {"login": "flink-bot", "id": 1, "type": "Bot"},
            "_sha": sha,
        }
        self.accepted.append(status)
        return Answer(201, status, {"Location": status["url"]})

    @staticmethod
    def _validate(body: dict[str, Any]) -> list[Json]:
        errs: list[Json] = []

        def err(field: str, message: str, code: str = "custom") -> None:
            errs.append({"resource": "Status", "code": code, "field": field, "message": message})

        if "state" not in body:
            err("state", "state is missing", "missing_field")
        elif body["state"] not in STATES:
            err("state", "state is not included in the list")
        for name in ("target_url", "description", "context"):
            if name in body and body[name] is not None and not isinstance(body[name], str):
                err(name, f"{name} is not a string", "invalid")
        desc = body.get("description")
        if isinstance(desc, str) and len(desc) > 140:
            err("description", "description is too long (maximum is 140 characters)")
        url = body.get("target_url")
        if isinstance(url, str) and url and not is_http_url(url):
            err("target_url", "target_url is not a valid URL")
        for unknown in sorted(set(body) - FIELDS):
            err(unknown, f"contract: {unknown} is not a field of this endpoint", "invalid")
        return errs

    def rate_limit_answer(self, failure: Failure) -> Answer:
        if failure.retry_after is not None:  # secondary rate limit
            return Answer(
                failure.status,
                {"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try "
                 "again.", "documentation_url": DOCS, "status": str(failure.status)},
                {"retry-after": str(int(failure.retry_after))},
            )
        reset = int(self.clock.now().timestamp()) + 60
        return Answer(
            failure.status,
            {"message": "API rate limit exceeded for user ID 1.", "documentation_url": DOCS,
             "status": str(failure.status)},
            {
                "x-ratelimit-limit": "5000",
                "x-ratelimit-remaining": "0",
                "x-ratelimit-used": "5000",
                "x-ratelimit-reset": str(reset),
                "x-ratelimit-resource": "core",
            },
        )
