"""GitLab "Set the pipeline status of a commit" contract server (REST API v4).

Published API (docs.gitlab.com/api/commits/#set-the-pipeline-status-of-a-commit):
  POST /api/v4/projects/:id/statuses/:sha
  :id is the numeric project ID or the URL-encoded path ("group%2Fproject")
  header PRIVATE-TOKEN: <token>
  body: state (required: pending|running|success|failed|canceled|skipped), ref, name or context
        (default "default"), target_url (a URL, at most 255 characters), description, coverage
        (float), pipeline_id (integer)
  201 with the status object; 401 {"message": "401 Unauthorized"}; 404 project or commit not found;
  400 {"error": "state does not have a valid value"} and 400 "Cannot transition status via ..." when
  the same running/pending state is posted again.
  Rate limit: 429 with Retry-After and RateLimit-* headers, body "Retry later".
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from reconciler.clock import Clock
from tests.forges.base import Answer, Failure, ForgeServer, Json, Request, is_http_url, json_body

STATES = {"pending", "running", "success", "failed", "canceled", "skipped"}
FIELDS = {"state", "ref", "name", "context", "target_url", "description", "coverage", "pipeline_id"}
_EVENTS = {"pending": "enqueue", "running": "run"}


class GitLabServer(ForgeServer):
    name = "gitlab"

    def __init__(
        self, token: str, *, project_id: int = 42, project_path: str = "acme/platform/flink-apps",
        known_shas: set[str] | None = None, clock: Clock | None = None,
    ) -> None:
        super().__init__(token, clock=clock)
        self.project_id, self.project_path = project_id, project_path
        self.known_shas = known_shas

    def route(self, request: Request) -> Answer:
        m = re.match(r"^/api/v4/projects/([^/]+)/statuses/([^/]+)$", request.path)
        if m is None:
            return Answer(404, {"error": "404 Not Found"})
        if request.method != "POST":
            return Answer(405, {"error": "405 Not Allowed"})
        if request.headers.get("private-token") != self.token:
            return Answer(401, {"message": "401 Unauthorized"})
        raw_id, sha = m.groups()
        # A path must arrive URL-encoded: a literal "/" would have split the route above.
        if raw_id != str(self.project_id) and unquote(raw_id) != self.project_path:
            return Answer(404, {"message": "404 Project Not Found"})
        if not re.fullmatch(r"[0-9a-f]{40}", sha) or (self.known_shas is not None and sha not in self.known_shas):
            return Answer(404, {"message": "404 Commit Not Found"})
        body = json_body(request)
        if body is None:
            return Answer(400, {"error": "state is missing"})
        error = self._validate(body)
        if error is not None:
            return Answer(400, error)
        name = body.get("name") or body.get("context") or "default"
        state = body["state"]
        previous = [s for s in self.statuses_of(sha) if s["name"] == name]
        if previous and previous[-1]["status"] == state and state in _EVENTS:
            return Answer(400, {"message": f"Cannot transition status via :{_EVENTS[state]} from :{state}"})
        now = self.clock.now().strftime("%Y-%m-%dT%H:%M:%S.000Z")
        finished = state in {"success", "failed", "canceled", "skipped"}
        status: Json = {
            "id": self.new_id(),
            "sha": sha,
            "ref": body.get("ref", "main"),
            "status": state,
            "name": name,
            "target_url": body.get("target_url"),
            "description": body.get("description"),
            "created_at": now,
            "started_at": now if state != "pending" else None,
            "finished_at": now if finished else None,
            "allow_failure": False,
            "coverage": body.get("coverage"),
            "pipeline_id": 1000,
            "author": {"id": 7, "username": "flink-bot", "name": "Flink Bot", "state": "active",
                       "web_url": "https://gitlab.example.com/flink-bot"},
            "_sha": sha,
        }
        self.accepted.append(status)
        return Answer(201, status)

    @staticmethod
    def _validate(body: dict[str, Any]) -> Json | None:
        if "state" not in body:
            return {"error": "state is missing"}
        if body["state"] not in STATES:
            return {"error": "state does not have a valid value"}
        for key in ("ref", "name", "context", "target_url", "description"):
            if key in body and body[key] is not None and not isinstance(body[key], str):
                return {"error": f"{key} is invalid"}
        url = body.get("target_url")
        if isinstance(url, str) and (len(url) > 255 or not is_http_url(url)):
            return {"message": {"target_url": ["is too long (maximum is 255 characters)" if len(url) > 255
                                               else "must be a valid URL"]}}
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            return {"error": f"contract: {', '.join(unknown)} is not a parameter of this endpoint"}
        return None

    def rate_limit_answer(self, failure: Failure) -> Answer:
        retry = int(failure.retry_after if failure.retry_after is not None else 60)
        reset = int(self.clock.now().timestamp()) + retry
        return Answer(
            429,
            "Retry later",
            {
                "Retry-After": str(retry),
                "RateLimit-Name": "throttle_authenticated_api",
                "RateLimit-Limit": "60",
                "RateLimit-Observed": "61",
                "RateLimit-Remaining": "0",
                "RateLimit-Reset": str(reset),
            },
        )
