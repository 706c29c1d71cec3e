"""Each forge sink against its loopback contract server: one post at a time, errors classified."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.errors import ReportError, TransientReportError
from reconciler.report import CommitStatus, GiteaStatusSink, GitHubStatusSink, GitLabStatusSink
from tests.forges.gitea import GiteaServer
from tests.forges.github import GitHubServer
from tests.forges.gitlab import GitLabServer

SHA = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "tok-SECRET-123"


def status(state: Outcome = Outcome.SUCCESS, app: str = "orders", desc: str = "applied, job RUNNING") -> CommitStatus:
    return CommitStatus(SHA, app, state, desc, "http://reconciler.example:8080/apps/orders")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def gh(clock: FakeClock) -> Iterator[GitHubServer]:
    with GitHubServer(TOKEN, known_shas={SHA}, clock=clock) as s:
        yield s  # type: ignore[misc]


@pytest.fixture
def gl(clock: FakeClock) -> Iterator[GitLabServer]:
    with GitLabServer(TOKEN, clock=clock) as s:
        yield s  # type: ignore[misc]


@pytest.fixture
def gt(clock: FakeClock) -> Iterator[GiteaServer]:
    with GiteaServer(TOKEN, clock=clock) as s:
        yield s  # type: ignore[misc]


# ---------------------------------------------------------------- GitHub


def test_github_posts_the_documented_request(gh: GitHubServer, clock: FakeClock) -> None:
    sink = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=gh.url, clock=clock)
    sink.post(status())
    [req] = gh.requests
    assert req.method == "POST" and req.path == f"/repos/acme/flink-apps/statuses/{SHA}"
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    assert req.headers["accept"] == "application/vnd.github+json"
    assert req.headers["x-github-api-version"] == "2022-11-28"
    assert req.json() == {
        "state": "success",
        "description": "applied, job RUNNING",
        "context": "flink-reconciler/orders",
        "target_url": "http://reconciler.example:8080/apps/orders",
    }
    assert gh.accepted[0]["state"] == "success"


def test_github_enterprise_prefix_and_long_description(clock: FakeClock) -> None:
    with GitHubServer(TOKEN, prefix="/api/v3", clock=clock) as ghe:
        sink = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=ghe.url + "/api/v3", clock=clock)
        long = "step StartJob failed: " + "java.lang.RuntimeException: boom\n\tat x.y.Z " * 10
        sink.post(status(Outcome.FAILURE, desc=long))
        desc = ghe.accepted[0]["description"]
        assert len(desc) <= 140 and desc.endswith("…") and "\n" not in desc
        assert desc.startswith("step StartJob failed: java.lang.RuntimeException: boom at x.y.Z")


@pytest.mark.parametrize("state", list(Outcome))
def test_github_every_outcome_is_a_github_state(gh: GitHubServer, clock: FakeClock, state: Outcome) -> None:
    GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=gh.url, clock=clock).post(status(state))
    assert gh.accepted[-1]["state"] == state.value


def test_github_bad_token_is_permanent_and_secret_free(gh: GitHubServer, clock: FakeClock) -> None:
    sink = GitHubStatusSink("acme", "flink-apps", "wrong-" + TOKEN, api_url=gh.url, clock=clock)
    with pytest.raises(ReportError) as e:
        sink.post(status())
    assert not isinstance(e.value, TransientReportError)
    assert "HTTP 401" in str(e.value) and "Bad credentials" in str(e.value)
    assert TOKEN not in str(e.value) and TOKEN not in repr(sink)


def test_github_unknown_commit_is_permanent(gh: GitHubServer, clock: FakeClock) -> None:
    sink = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=gh.url, clock=clock)
    with pytest.raises(ReportError, match=r"No commit found for SHA: f{40}") as e:
        sink.post(CommitStatus("f" * 40, "orders", Outcome.SUCCESS, "x"))
    assert not isinstance(e.value, TransientReportError)


def test_github_5xx_is_transient(gh: GitHubServer, clock: FakeClock) -> None:
    gh.fail_next("5xx", status=503)
    sink = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=gh.url, clock=clock)
    with pytest.raises(TransientReportError, match="HTTP 503: Server Error") as e:
        sink.post(status())
    assert e.value.retry_after is None
    sink.post(status())
    assert len(gh.accepted) == 1


@pytest.mark.parametrize("code", [403, 429])
def test_github_primary_rate_limit_waits_until_reset(gh: GitHubServer, clock: FakeClock, code: int) -> None:
    gh.fail_next("ratelimit", status=code)
    sink = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=gh.url, clock=clock)
    with pytest.raises(TransientReportError, match="API rate limit exceeded") as e:
        sink.post(status())
    assert e.value.retry_after is not None and 59 <= e.value.retry_after <= 60


def test_github_secondary_rate_limit_uses_retry_after(gh: GitHubServer, clock: FakeClock) -> None:
    gh.fail_next("ratelimit", status=403, retry_after=17)
    sink = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=gh.url, clock=clock)
    with pytest.raises(TransientReportError, match="secondary rate limit") as e:
        sink.post(status())
    assert e.value.retry_after == 17


def test_unreachable_forge_is_transient(clock: FakeClock) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=f"http://127.0.0.1:{port}", clock=clock, timeout=2)
    with pytest.raises(TransientReportError, match="ConnectError"):
        sink.post(status())


# ---------------------------------------------------------------- GitLab


@pytest.mark.parametrize(
    ("state", "gitlab_state"),
    [(Outcome.PENDING, "pending"), (Outcome.SUCCESS, "success"), (Outcome.FAILURE, "failed"),
     (Outcome.ERROR, "failed")],
)
def test_gitlab_state_mapping_and_request(
    gl: GitLabServer, clock: FakeClock, state: Outcome, gitlab_state: str
) -> None:
    sink = GitLabStatusSink(42, TOKEN, base_url=gl.url, clock=clock)
    sink.post(status(state))
    req = gl.requests[-1]
    assert req.path == f"/api/v4/projects/42/statuses/{SHA}"
    assert req.headers["private-token"] == TOKEN and "authorization" not in req.headers
    assert req.json() == {
        "state": gitlab_state,
        "name": "flink-reconciler/orders",
        "description": "applied, job RUNNING",
        "target_url": "http://reconciler.example:8080/apps/orders",
    }
    assert gl.accepted[-1]["status"] == gitlab_state and gl.accepted[-1]["name"] == "flink-reconciler/orders"


def test_gitlab_project_path_is_url_encoded(gl: GitLabServer, clock: FakeClock) -> None:
    sink = GitLabStatusSink("acme/platform/flink-apps", TOKEN, base_url=gl.url + "/", ref="main", clock=clock)
    sink.post(status())
    assert gl.requests[-1].path == f"/api/v4/projects/acme%2Fplatform%2Fflink-apps/statuses/{SHA}"
    assert gl.accepted[-1]["ref"] == "main"


def test_gitlab_errors(gl: GitLabServer, clock: FakeClock) -> None:
    bad = GitLabStatusSink(42, "nope", base_url=gl.url, clock=clock)
    with pytest.raises(ReportError, match="HTTP 401: 401 Unauthorized"):
        bad.post(status())
    sink = GitLabStatusSink(42, TOKEN, base_url=gl.url, clock=clock)
    with pytest.raises(ReportError, match="404 Project Not Found"):
        GitLabStatusSink(7, TOKEN, base_url=gl.url, clock=clock).post(status())
    sink.post(status(Outcome.PENDING))
    # GitLab refuses pending -> pending (400 "Cannot transition status via :enqueue from :pending");
    # the commit already shows what we wanted, so this is not an error.
    sink.post(status(Outcome.PENDING))
    assert gl.answers[-1].status == 400
    gl.fail_next("ratelimit", retry_after=42)
    with pytest.raises(TransientReportError, match="HTTP 429: Retry later") as e:
        sink.post(status())
    assert e.value.retry_after == 42
    gl.fail_next("5xx", status=500)
    with pytest.raises(TransientReportError, match="HTTP 500"):
        sink.post(status())
    sink.post(status())
    assert [s["status"] for s in gl.accepted] == ["pending", "success"]


# ---------------------------------------------------------------- Gitea


@pytest.mark.parametrize("state", list(Outcome))
def test_gitea_request_and_states(gt: GiteaServer, clock: FakeClock, state: Outcome) -> None:
    sink = GiteaStatusSink(gt.url, "acme", "flink-apps", TOKEN, clock=clock)
    sink.post(status(state))
    req = gt.requests[-1]
    assert req.path == f"/api/v1/repos/acme/flink-apps/statuses/{SHA}"
    assert req.headers["authorization"] == f"token {TOKEN}"
    assert req.json()["context"] == "flink-reconciler/orders"
    assert gt.accepted[-1]["status"] == state.value


def test_gitea_errors(gt: GiteaServer, clock: FakeClock) -> None:
    with pytest.raises(ReportError, match="HTTP 401") as e:
        GiteaStatusSink(gt.url, "acme", "flink-apps", "bad", clock=clock).post(status())
    assert not isinstance(e.value, TransientReportError)
    with pytest.raises(ReportError, match="HTTP 404"):
        GiteaStatusSink(gt.url, "acme", "missing", TOKEN, clock=clock).post(status())
    gt.fail_next("ratelimit", retry_after=5)
    with pytest.raises(TransientReportError) as t:
        GiteaStatusSink(gt.url, "acme", "flink-apps", TOKEN, clock=clock).post(status())
    assert t.value.retry_after == 5
