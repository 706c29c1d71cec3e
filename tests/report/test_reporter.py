"""The Reporter against real loopback forges: dedupe, supersede, backoff, Retry-After, never blocking.

Backoff runs on a FakeClock shared with the forge (so rate-limit resets line up); the tests move it
and then call flush(), which makes the workers re-check their due times at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import pytest

from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.report import CommitStatus, GitHubStatusSink, GitLabStatusSink, Reporter, RetryPolicy, StatusSink
from tests.forges.github import GitHubServer
from tests.forges.gitlab import GitLabServer

SHA = "89abcdef0123456789abcdef0123456789abcdef"
SHA2 = "fedcba9876543210fedcba9876543210fedcba98"
TOKEN = "reporter-SECRET-token"


def st(state: Outcome, app: str = "orders", rev: str = SHA, desc: str = "") -> CommitStatus:
    return CommitStatus(rev, app, state, desc or f"{app} {state.value}")


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def gh(clock: FakeClock) -> Iterator[GitHubServer]:
    with GitHubServer(TOKEN, clock=clock) as s:
        yield s  # type: ignore[misc]


@pytest.fixture
def reporter(gh: GitHubServer, clock: FakeClock) -> Iterator[Reporter]:
    sink = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=gh.url, clock=clock)
    r = Reporter([sink], clock, retry=RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=8.0))
    yield r
    r.close(timeout=1)


def states(server: GitHubServer) -> list[tuple[str, str]]:
    return [(s["context"].removeprefix("flink-reconciler/"), s["state"]) for s in server.accepted]


def test_unchanged_statuses_are_not_reposted(gh: GitHubServer, reporter: Reporter) -> None:
    reporter.report(st(Outcome.PENDING))
    assert reporter.flush(5)
    reporter.report(st(Outcome.PENDING))  # identical to the last posted
    reporter.report(st(Outcome.SUCCESS))
    assert reporter.flush(5)
    reporter.report(st(Outcome.SUCCESS))
    reporter.report(st(Outcome.SUCCESS, app="billing"))  # another context: posted
    reporter.report(st(Outcome.SUCCESS, rev=SHA2))  # another commit: posted
    assert reporter.flush(5)
    reporter.report(st(Outcome.SUCCESS, desc="orders success, now with other words"))  # changed text: posted
    assert reporter.flush(5)
    assert states(gh) == [("orders", "pending"), ("orders", "success"), ("billing", "success"),
                          ("orders", "success"), ("orders", "success")]
    stats = reporter.stats()["github"]
    assert (stats.posted, stats.skipped, stats.pending) == (5, 2, 0)


def test_report_never_blocks_and_newest_status_wins(gh: GitHubServer, reporter: Reporter) -> None:
    gh.hold()  # the forge hangs
    reporter.report(st(Outcome.PENDING))
    wait_for(lambda: len(gh.requests) == 1)  # in flight, stuck at the forge
    for state in (Outcome.SUCCESS, Outcome.FAILURE):  # returns at once although the worker is stuck
        reporter.report(st(state))
    reporter.report(st(Outcome.FAILURE))  # identical to the queued one: skipped
    assert reporter.flush(0.1) is False
    gh.release()
    assert reporter.flush(5)
    # success was superseded by failure before it could be posted
    assert states(gh) == [("orders", "pending"), ("orders", "failure")]


def test_5xx_is_retried_with_exponential_backoff(gh: GitHubServer, reporter: Reporter, clock: FakeClock) -> None:
    gh.fail_next("5xx", count=2)
    reporter.report(st(Outcome.SUCCESS))
    wait_for(lambda: reporter.stats()["github"].retries == 1)
    clock.advance(0.9)
    assert reporter.flush(0.2) is False and len(gh.requests) == 1  # 1 s backoff not over
    clock.advance(0.2)
    wait_for(lambda: reporter.stats()["github"].retries == 2)
    assert len(gh.requests) == 2
    clock.advance(1.9)
    assert reporter.flush(0.2) is False and len(gh.requests) == 2  # now 2 s
    clock.advance(0.2)
    assert reporter.flush(5)
    assert len(gh.requests) == 3 and states(gh) == [("orders", "success")]


def test_rate_limit_reset_is_honored_for_the_whole_sink(
    gh: GitHubServer, reporter: Reporter, clock: FakeClock
) -> None:
    gh.fail_next("ratelimit", status=403)  # x-ratelimit-reset = now + 60 s
    reporter.report(st(Outcome.SUCCESS))
    wait_for(lambda: reporter.stats()["github"].retries == 1)
    reporter.report(st(Outcome.SUCCESS, app="billing"))  # must wait too: the limit is per token
    clock.advance(58)
    assert reporter.flush(0.2) is False
    assert len(gh.requests) == 1
    clock.advance(2.5)
    assert reporter.flush(5)
    assert sorted(states(gh)) == [("billing", "success"), ("orders", "success")]
    assert len(gh.requests) == 3


def test_gitlab_retry_after_then_success(clock: FakeClock) -> None:
    with GitLabServer(TOKEN, clock=clock) as gl:
        sink = GitLabStatusSink(42, TOKEN, base_url=gl.url, clock=clock)
        with Reporter([sink], clock) as r:
            gl.fail_next("ratelimit", retry_after=30)
            r.report(st(Outcome.PENDING))
            wait_for(lambda: r.stats()["gitlab"].retries == 1)
            clock.advance(29)
            assert r.flush(0.2) is False
            clock.advance(1.5)
            assert r.flush(5)
            r.report(st(Outcome.PENDING))  # unchanged: GitLab would answer 400 "Cannot transition"
            r.report(st(Outcome.ERROR))
            assert r.flush(5)
            assert [s["status"] for s in gl.accepted] == ["pending", "failed"]
            assert r.stats()["gitlab"].failed == 0


def test_permanent_errors_are_not_retried_and_secrets_stay_out_of_logs(
    gh: GitHubServer, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = GitHubStatusSink("acme", "flink-apps", "wrong-" + TOKEN, api_url=gh.url, clock=clock)
    with Reporter([bad], clock) as r:
        r.report(st(Outcome.SUCCESS))
        assert r.flush(5)
        assert r.stats()["github"].failed == 1 and len(gh.requests) == 1
        r.report(st(Outcome.SUCCESS))  # a failed status is not "posted": a new report tries again
        assert r.flush(5)
        assert len(gh.requests) == 2
    assert "Bad credentials" in caplog.text
    assert TOKEN not in caplog.text


def test_gives_up_after_max_attempts(gh: GitHubServer, reporter: Reporter, clock: FakeClock) -> None:
    gh.fail_next("5xx", count=10)
    reporter.report(st(Outcome.SUCCESS))
    for n in range(1, 4):
        wait_for(lambda n=n: reporter.stats()["github"].retries == n)  # type: ignore[misc]
        clock.advance(10)
        reporter.flush(0.01)
    wait_for(lambda: reporter.stats()["github"].failed == 1)
    assert len(gh.requests) == 4 and gh.accepted == []


def test_bounded_queue_drops_and_counts(gh: GitHubServer, clock: FakeClock) -> None:
    sink = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=gh.url, clock=clock)
    r = Reporter([sink], clock, max_pending=2)
    gh.hold()
    for app in ("a", "b", "c", "d"):
        r.report(st(Outcome.SUCCESS, app=app))
    assert r.stats()["github"].dropped == 2
    gh.release()
    assert r.flush(5)
    assert sorted(states(gh)) == [("a", "success"), ("b", "success")]
    r.close()
    r.report(st(Outcome.SUCCESS, app="late"))  # after close: dropped with a warning, no exception


def test_one_slow_sink_does_not_delay_another(clock: FakeClock) -> None:
    with GitHubServer(TOKEN, clock=clock) as slow, GitLabServer(TOKEN, clock=clock) as fast:
        sinks: list[StatusSink] = [
            GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=slow.url, clock=clock),
            GitLabStatusSink(42, TOKEN, base_url=fast.url, clock=clock),
        ]
        with Reporter(sinks, clock) as r:
            slow.hold()
            r.report(st(Outcome.SUCCESS))
            wait_for(lambda: len(fast.accepted) == 1)
            assert slow.accepted == []
            slow.release()
            assert r.flush(5)
            assert len(slow.accepted) == 1


def test_duplicate_sink_names_are_refused(gh: GitHubServer, clock: FakeClock) -> None:
    s = GitHubStatusSink("acme", "flink-apps", TOKEN, api_url=gh.url, clock=clock)
    with pytest.raises(ValueError, match="unique"):
        Reporter([s, s], clock)


def test_a_failing_old_status_does_not_take_its_successor_down(gh: GitHubServer, reporter: Reporter) -> None:
    gh.fail_next("5xx", status=404)  # a permanent answer for the first post
    gh.hold()
    reporter.report(st(Outcome.PENDING))
    wait_for(lambda: len(gh.requests) == 1)
    reporter.report(st(Outcome.SUCCESS))  # arrives while the pending post is in flight
    gh.release()
    assert reporter.flush(5)
    assert states(gh) == [("orders", "success")]
    assert reporter.stats()["github"].failed == 0  # the failure concerned a superseded status
