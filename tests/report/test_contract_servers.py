"""The contract servers themselves reject what the real forges reject; otherwise the sink tests prove nothing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.forges.gitea import GiteaServer
from tests.forges.github import GitHubServer
from tests.forges.gitlab import GitLabServer

SHA = "a" * 40
GH_HEADERS = {
    "Authorization": "Bearer gh-token",
    "Accept": "application/vnd.github+json",
    "X-GitHub-Api-Version": "2022-11-28",
    "User-Agent": "t",
}


@pytest.fixture
def gh() -> Iterator[GitHubServer]:
    with GitHubServer("gh-token") as s:
        yield s  # type: ignore[misc]


@pytest.fixture
def gl() -> Iterator[GitLabServer]:
    with GitLabServer("gl-token") as s:
        yield s  # type: ignore[misc]


@pytest.fixture
def gt() -> Iterator[GiteaServer]:
    with GiteaServer("gt-token") as s:
        yield s  # type: ignore[misc]


def gh_post(
    server: GitHubServer, body: object, headers: dict[str, str] | None = None, path: str = ""
) -> httpx.Response:
    return httpx.post(
        server.url + (path or f"/repos/acme/flink-apps/statuses/{SHA}"),
        json=body,
        headers=GH_HEADERS if headers is None else headers,
    )


def test_github_accepts_a_valid_status(gh: GitHubServer) -> None:
    r = gh_post(gh, {"state": "success", "context": "c", "description": "d", "target_url": "https://x.example/1"})
    assert r.status_code == 201
    assert r.json()["state"] == "success" and r.json()["context"] == "c"
    assert len(gh.accepted) == 1


@pytest.mark.parametrize(
    ("body", "headers", "status", "text"),
    [
        ({"state": "ok"}, None, 422, "state is not included in the list"),
        ({"description": "x"}, None, 422, "state is missing"),
        ({"state": "success", "description": "x" * 141}, None, 422, "maximum is 140 characters"),
        ({"state": "success", "target_url": "not a url"}, None, 422, "target_url is not a valid URL"),
        ({"state": "success", "name": "x"}, None, 422, "name is not a field"),
        ({"state": "success"}, {**GH_HEADERS, "Authorization": "Bearer wrong"}, 401, "Bad credentials"),
        ({"state": "success"}, {k: v for k, v in GH_HEADERS.items() if k != "Authorization"}, 401,
         "Requires authentication"),
        ({"state": "success"}, {**GH_HEADERS, "X-GitHub-Api-Version": "2020-01-01"}, 400, "is not supported"),
        ({"state": "success"}, {k: v for k, v in GH_HEADERS.items() if k != "Accept"}, 400, "Accept"),
    ],
)
def test_github_rejects(
    gh: GitHubServer, body: object, headers: dict[str, str] | None, status: int, text: str
) -> None:
    r = gh_post(gh, body, headers)
    assert r.status_code == status
    assert text in r.text
    assert gh.accepted == []


def test_github_rejects_unknown_repo_and_short_sha(gh: GitHubServer) -> None:
    assert gh_post(gh, {"state": "success"}, path=f"/repos/acme/other/statuses/{SHA}").status_code == 404
    r = gh_post(gh, {"state": "success"}, path="/repos/acme/flink-apps/statuses/abc123")
    assert r.status_code == 422 and "No commit found for SHA: abc123" in r.text


def test_github_rate_limit_answer_has_reset(gh: GitHubServer) -> None:
    gh.fail_next("ratelimit", status=403)
    r = gh_post(gh, {"state": "success"})
    assert r.status_code == 403
    assert r.headers["x-ratelimit-remaining"] == "0" and int(r.headers["x-ratelimit-reset"]) > 0
    assert gh_post(gh, {"state": "success"}).status_code == 201


def test_gitlab_rules(gl: GitLabServer) -> None:
    url = f"{gl.url}/api/v4/projects/42/statuses/{SHA}"
    auth = {"PRIVATE-TOKEN": "gl-token"}
    assert httpx.post(url, json={"state": "success"}, headers={"PRIVATE-TOKEN": "bad"}).status_code == 401
    r = httpx.post(url, json={"state": "failure"}, headers=auth)
    assert r.status_code == 400 and "state does not have a valid value" in r.text
    r = httpx.post(url, json={"state": "success", "target_url": "https://x.example/" + "a" * 250}, headers=auth)
    assert r.status_code == 400 and "255" in r.text
    unencoded = f"{gl.url}/api/v4/projects/acme/platform/flink-apps/statuses/{SHA}"
    assert httpx.post(unencoded, json={"state": "success"}, headers=auth).status_code == 404
    encoded = f"{gl.url}/api/v4/projects/acme%2Fplatform%2Fflink-apps/statuses/{SHA}"
    assert httpx.post(encoded, json={"state": "pending", "name": "n"}, headers=auth).status_code == 201
    r = httpx.post(encoded, json={"state": "pending", "name": "n"}, headers=auth)
    assert r.status_code == 400 and "Cannot transition status via :enqueue from :pending" in r.text
    assert [s["status"] for s in gl.accepted] == ["pending"]


def test_gitea_rules(gt: GiteaServer) -> None:
    url = f"{gt.url}/api/v1/repos/acme/flink-apps/statuses/{SHA}"
    assert httpx.post(url, json={"state": "success"}, headers={"Authorization": "token bad"}).status_code == 401
    r = httpx.post(url, json={"state": "failed"}, headers={"Authorization": "token gt-token"})
    assert r.status_code == 422 and "invalid commit status state" in r.text
    r = httpx.post(url, json={"state": "error", "context": "c"}, headers={"Authorization": "token gt-token"})
    assert r.status_code == 201 and r.json()["status"] == "error"
