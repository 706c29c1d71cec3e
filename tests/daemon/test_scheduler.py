"""The Daemon in-process with a recording fake service and short real intervals."""

from __future__ import annotations

import io
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.clock import SystemClock
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.scheduler import Daemon
from reconciler.errors import SourceError
from reconciler.logs import ContextFilter, JsonFormatter, TextFormatter
from reconciler.settings import Settings
from tests.daemon import forges
from tests.daemon.conftest import FakeService

MakeDaemon = Callable[..., Daemon]


@pytest.fixture
def make_daemon(make_settings: Callable[..., Settings], fake_service: FakeService) -> Iterator[MakeDaemon]:
    started: list[Daemon] = []

    def make(**overrides: Any) -> Daemon:
        d = Daemon(fake_service, make_settings(**overrides), Metrics(), SystemClock())
        d.start()
        started.append(d)
        return d

    yield make
    for d in started:
        d.stop(deadline_s=5)


def sample(d: Daemon, name: str, **labels: str) -> float:
    body, _ = d.metrics.exposition()
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def post_push(d: Daemon, after: str = forges.AFTER) -> httpx.Response:
    headers, body = forges.github(forges.github_push_payload(after=after))
    return httpx.post(d.http.url + "/webhook", content=body, headers=headers, timeout=10)


def test_startup_pass_is_full_then_polling_calls_incremental_sync(
    make_daemon: MakeDaemon, fake_service: FakeService
) -> None:
    d = make_daemon(poll_interval=0.2)
    calls = fake_service.wait_calls(4)
    assert (calls[0].full, calls[0].reason) == (True, "startup")
    assert all((c.full, c.reason) == (False, "poll") for c in calls[1:4])
    assert sample(d, "flink_reconciler_sync_passes_total", trigger="poll", result="ok") >= 3
    assert sample(d, "flink_reconciler_last_successful_sync_timestamp_seconds") > 0


def test_drift_job_calls_full_sync(make_daemon: MakeDaemon, fake_service: FakeService) -> None:
    d = make_daemon(drift_interval=0.2)
    calls = fake_service.wait_calls(3)
    assert all((c.full, c.reason) == (True, "drift") for c in calls[1:3])
    assert sample(d, "flink_reconciler_sync_passes_total", trigger="drift", result="ok") >= 2


def test_shard_drift_timers_are_staggered_over_one_interval(make_daemon: MakeDaemon) -> None:
    """Shard processes started together must not run their full passes at the same moment."""
    first = {}
    for shard in (0, 2, 4):
        d = make_daemon(drift_interval=100, shards=5, shard=shard)
        job = d._scheduler.get_job("drift")
        assert job is not None and job.next_run_time is not None
        first[shard] = (job.next_run_time - datetime.now(UTC)).total_seconds()
    assert 99 < first[0] <= 100 + 10 and 139 < first[2] <= 140 + 10 and 179 < first[4] <= 180 + 10, first


def test_webhook_triggers_an_immediate_sync(make_daemon: MakeDaemon, fake_service: FakeService) -> None:
    d = make_daemon()  # poll and drift: an hour away
    fake_service.wait_calls(1)
    assert d.runner.wait_idle(5)
    r = post_push(d)
    assert r.status_code == 202
    calls = fake_service.wait_calls(2)
    assert calls[1].full is False
    assert calls[1].reason == "webhook: github push refs/heads/main bffeb7422404"
    assert sample(d, "flink_reconciler_sync_passes_total", trigger="webhook", result="ok") == 1
    assert sample(d, "flink_reconciler_webhook_requests_total", forge="github", result="triggered") == 1


def test_a_service_can_ask_for_a_pass_before_the_next_poll(make_settings: Callable[..., Settings]) -> None:
    """`shard: auto` asks for a pass of a shard it just took, instead of waiting up to a poll interval."""

    class Asking(FakeService):
        request: Callable[[str], None] | None = None

        def ask_for_passes_with(self, request: Callable[[str], None]) -> None:
            self.request = request

    service = Asking()
    d = Daemon(service, make_settings(), Metrics(), SystemClock())  # poll and drift: an hour away
    d.start()
    try:
        service.wait_calls(1)
        assert d.runner.wait_idle(5) and service.request is not None
        service.request("shard 3 taken")
        calls = service.wait_calls(2)
        assert (calls[1].full, calls[1].reason) == (False, "shard 3 taken")
        d.stop(deadline_s=5)
        service.request("shard 4 taken")  # after stop: refused, not run
        assert len(service.calls) == 2
    finally:
        d.stop(deadline_s=5)


def test_webhook_to_another_branch_does_not_sync(make_daemon: MakeDaemon, fake_service: FakeService) -> None:
    d = make_daemon()
    fake_service.wait_calls(1)
    headers, body = forges.gitea(forges.gitea_push_payload(ref="refs/heads/dev"))
    assert httpx.post(d.http.url + "/webhook", content=body, headers=headers).status_code == 200
    unsigned_headers, body = forges.gitlab(forges.gitlab_push_payload(), token=None)
    assert httpx.post(d.http.url + "/webhook", content=body, headers=unsigned_headers).status_code == 401
    assert d.runner.wait_idle(5)
    assert len(fake_service.calls) == 1


def test_triggers_during_a_pass_coalesce_into_one_follow_up_never_two_at_once(
    make_daemon: MakeDaemon, fake_service: FakeService
) -> None:
    fake_service.block()  # the startup pass hangs like a long upgrade
    d = make_daemon()
    assert fake_service.in_sync.wait(5)
    answers = []

    def hammer() -> None:
        answers.append(post_push(d).status_code)

    threads = [threading.Thread(target=hammer) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert d.request_sync(full=True, trigger="drift", reason="drift")  # a drift tick lands too
    assert answers == [202] * 5  # the webhooks were answered while the pass was still running
    assert len(fake_service.calls) == 0

    fake_service.unblock()
    assert d.runner.wait_idle(10)
    calls = fake_service.wait_calls(2)
    assert len(calls) == 2  # startup + exactly one follow-up
    assert calls[1].full is True  # any full request makes the follow-up full
    assert "webhook" in calls[1].reason
    assert "drift" in calls[1].reason
    assert fake_service.max_active == 1
    assert calls[0].ended <= calls[1].started
    assert sample(d, "flink_reconciler_sync_requests_coalesced_total", trigger="webhook") == 4
    assert sample(d, "flink_reconciler_sync_requests_coalesced_total", trigger="drift") == 1


def test_fast_polling_with_webhooks_never_overlaps(make_daemon: MakeDaemon, fake_service: FakeService) -> None:
    d = make_daemon(poll_interval=0.05, drift_interval=0.07)
    for _ in range(5):
        post_push(d)
    calls = fake_service.wait_calls(10)
    assert fake_service.max_active == 1
    ordered = sorted(calls, key=lambda c: c.started)
    assert all(a.ended <= b.started for a, b in itertools.pairwise(ordered))


def test_sync_errors_are_logged_and_counted_and_the_daemon_keeps_going(
    make_daemon: MakeDaemon, fake_service: FakeService, caplog: pytest.LogCaptureFixture
) -> None:
    fake_service.failures = [SourceError("origin unreachable"), RuntimeError("bug in a pass")]
    d = make_daemon(poll_interval=0.1)
    fake_service.wait_calls(4)
    assert sample(d, "flink_reconciler_sync_passes_total", trigger="startup", result="error") == 1
    assert sample(d, "flink_reconciler_sync_passes_total", trigger="poll", result="error") == 1
    assert sample(d, "flink_reconciler_sync_passes_total", trigger="poll", result="ok") >= 1
    assert "sync failed: SourceError: origin unreachable" in caplog.text
    crash = [r for r in caplog.records if r.getMessage() == "sync crashed"]
    assert crash
    assert crash[0].exc_info is not None
    page = httpx.get(d.http.url + "/").text
    assert "last error:" in page
    assert "RuntimeError: bug in a pass" in page


def test_readyz_reflects_the_service_and_shutdown(make_daemon: MakeDaemon, fake_service: FakeService) -> None:
    d = make_daemon()
    url = d.probes.url
    fake_service.wait_calls(1)
    assert d.runner.wait_idle(5)
    assert httpx.get(url + "/readyz").status_code == 200
    fake_service.ready = (False, "git: authentication failed for https://git.example.com")
    r = httpx.get(url + "/readyz")
    assert (r.status_code, r.text) == (503, "git: authentication failed for https://git.example.com\n")
    fake_service.readiness_error = OSError("boom")
    r = httpx.get(url + "/readyz")
    assert r.status_code == 503
    assert "readiness check failed: OSError: boom" in r.text


def test_status_page(make_daemon: MakeDaemon, fake_service: FakeService) -> None:
    d = make_daemon(repo_url="https://user:s3cr3t-token@git.example.com/acme/apps.git", path="apps", dry_run=True)
    fake_service.wait_calls(1)
    assert d.runner.wait_idle(5)
    page = httpx.get(d.http.url + "/").text
    assert page.startswith("flink-reconciler ")
    assert "s3cr3t-token" not in page
    assert "git.example.com/acme/apps.git branch=main path=/apps" in page
    assert "runtime: local (dry run)" in page
    assert "ready: yes (git reachable; runtime usable)" in page
    assert "sync: idle" in page
    assert "trigger=startup full=True result=ok" in page
    assert "passes: 1 ok, 0 failed" in page


def test_status_page_includes_service_lines_when_offered(
    make_settings: Callable[..., Settings],
) -> None:
    class WithStatus(FakeService):
        def status_text(self) -> str:
            return "orders     success  4f2a9c1e  RUNNING\n"

    d = Daemon(WithStatus(), make_settings(), Metrics())
    d.start()
    try:
        assert "orders     success  4f2a9c1e  RUNNING" in httpx.get(d.http.url + "/").text
    finally:
        d.stop(deadline_s=5)


def test_stop_parks_the_running_sync_via_service_shutdown(
    make_settings: Callable[..., Settings], fake_service: FakeService
) -> None:
    fake_service.block()
    d = Daemon(fake_service, make_settings(), Metrics())
    d.start()
    assert fake_service.in_sync.wait(5)
    during: dict[str, Any] = {}

    def while_parking() -> None:
        # HTTP is still up while the service parks; the daemon refuses new work and is not ready.
        during["readyz"] = httpx.get(d.probes.url + "/readyz").status_code
        during["healthz"] = httpx.get(d.probes.url + "/healthz").status_code
        during["webhook"] = post_push(d).status_code
        during["poll"] = d.request_sync(full=False, trigger="poll", reason="poll")

    fake_service.on_shutdown = while_parking
    url = d.probes.url
    assert d.stop(deadline_s=5) is True
    assert len(fake_service.shutdowns) == 1
    assert 0 < fake_service.shutdowns[0] <= 5
    assert during == {"readyz": 503, "healthz": 200, "webhook": 503, "poll": False}
    assert len(fake_service.calls) == 1  # nothing ran after the parked pass
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/healthz", timeout=2)


def test_stop_reports_a_sync_that_overruns_the_deadline(
    make_settings: Callable[..., Settings], fake_service: FakeService
) -> None:
    fake_service.block()

    def slow_park() -> None:  # a service too slow to park
        fake_service.gate.wait(0.6)

    fake_service.on_shutdown = slow_park
    original = fake_service.unblock
    fake_service.unblock = lambda: None  # type: ignore[method-assign]
    d = Daemon(fake_service, make_settings(), Metrics())
    d.start()
    assert fake_service.in_sync.wait(5)
    try:
        assert d.stop(deadline_s=0.3) is False
    finally:
        original()
    assert d.runner.join(5)


def test_stop_reports_a_failing_service_shutdown(
    make_settings: Callable[..., Settings], fake_service: FakeService
) -> None:
    def fail() -> None:
        raise RuntimeError("journal locked")

    fake_service.on_shutdown = fail
    d = Daemon(fake_service, make_settings(), Metrics())
    d.start()
    fake_service.wait_calls(1)
    assert d.stop(deadline_s=2) is False


def test_stop_is_idempotent(make_settings: Callable[..., Settings], fake_service: FakeService) -> None:
    d = Daemon(fake_service, make_settings(), Metrics())
    d.start()
    fake_service.wait_calls(1)
    assert d.stop(deadline_s=2) is True
    assert d.stop(deadline_s=2) is True
    assert len(fake_service.shutdowns) == 1


def test_stop_without_start(make_settings: Callable[..., Settings], fake_service: FakeService) -> None:
    d = Daemon(fake_service, make_settings(), Metrics())
    assert d.stop(deadline_s=1) is True
    assert fake_service.calls == []


def test_not_ready_before_the_first_pass_completes(make_daemon: MakeDaemon, fake_service: FakeService) -> None:
    fake_service.block()
    d = make_daemon()
    assert fake_service.in_sync.wait(5)
    r = httpx.get(d.probes.url + "/readyz")
    assert r.status_code == 503
    assert r.text.startswith("starting: no sync pass has completed yet (a startup pass is running since "), r.text
    fake_service.unblock()
    fake_service.wait_calls(1)
    assert d.runner.wait_idle(5)
    r = httpx.get(d.probes.url + "/readyz")
    assert (r.status_code, r.text) == (200, "git reachable; runtime usable\n")


def test_a_failed_first_pass_is_not_ready_and_says_why(make_daemon: MakeDaemon, fake_service: FakeService) -> None:
    fake_service.failures = [SourceError("origin unreachable")]
    d = make_daemon()
    fake_service.wait_calls(1)
    assert d.runner.wait_idle(5)
    r = httpx.get(d.probes.url + "/readyz")
    assert r.status_code == 503
    assert r.text == "starting: no sync pass has completed yet; the last one failed: SourceError: origin unreachable\n"


def test_readyz_follows_the_last_pass_not_the_service_alone(
    make_daemon: MakeDaemon, fake_service: FakeService
) -> None:
    """The service says ready (its Git fetch works), but a pass crashes: not ready until one succeeds."""
    d = make_daemon()
    fake_service.wait_calls(1)
    assert d.runner.wait_idle(5)
    assert httpx.get(d.probes.url + "/readyz").status_code == 200
    fake_service.failures = [RuntimeError("bad value in apps/orders.yaml")]
    assert d.request_sync(full=False, trigger="poll", reason="poll")
    fake_service.wait_calls(2)
    assert d.runner.wait_idle(5)
    r = httpx.get(d.probes.url + "/readyz")
    assert r.status_code == 503
    assert "the last sync pass (poll, " in r.text
    assert r.text.endswith(") failed: unexpected RuntimeError: bad value in apps/orders.yaml\n"), r.text
    assert "ready: no (the last sync pass" in httpx.get(d.http.url + "/").text
    assert d.request_sync(full=False, trigger="poll", reason="poll")
    fake_service.wait_calls(3)
    assert d.runner.wait_idle(5)
    assert httpx.get(d.probes.url + "/readyz").status_code == 200


TOKEN = "ghp_daemonTestToken0123456789"


def test_no_credential_in_logs_readyz_or_the_status_page(
    make_settings: Callable[..., Settings], fake_service: FakeService
) -> None:
    """A token used as the URL's user, and a configured secret, reach no log line (text or JSON) and
    no HTTP answer, whatever text the service hands over."""
    leaky_url = f"https://{TOKEN}@git.example.com/acme/flink-apps.git"
    fake_service.failures = [SourceError(f"git fetch failed: fatal: unable to access '{leaky_url}/': 403"),
                             RuntimeError(f"bug while reading {leaky_url} with token {TOKEN}")]
    fake_service.ready = (False, f"git fetch failed for {leaky_url}")
    root = logging.getLogger()
    level = root.level
    outputs = {"text": io.StringIO(), "json": io.StringIO()}
    handlers: list[logging.Handler] = []
    for formatter, out in ((TextFormatter(), outputs["text"]), (JsonFormatter(), outputs["json"])):
        handler = logging.StreamHandler(out)  # what setup_logging installs, once per format
        handler.setFormatter(formatter)
        handler.addFilter(ContextFilter())
        root.addHandler(handler)
        handlers.append(handler)
    root.setLevel(logging.DEBUG)
    d = Daemon(fake_service, make_settings(repo_url=leaky_url, github_webhook_secret="webhook-secret-value"),
               Metrics())
    d.start()
    try:
        fake_service.wait_calls(1)
        assert d.runner.wait_idle(5)
        assert d.request_sync(full=False, trigger="poll", reason="poll")
        fake_service.wait_calls(2)
        assert d.runner.wait_idle(5)
        logging.getLogger("reconciler.test").info("echo %s", "webhook-secret-value")
        answers = [httpx.get(d.probes.url + "/readyz").text, httpx.get(d.http.url + "/").text]
    finally:
        d.stop(deadline_s=5)
        for h in handlers:
            root.removeHandler(h)
        root.setLevel(level)
    text, js = outputs["text"].getvalue(), outputs["json"].getvalue()
    assert "sync failed: SourceError: git fetch failed" in text and "sync crashed" in js
    assert "Traceback" in text and "RuntimeError: bug while reading https://***@git.example.com" in js
    for where, output in {"text log": text, "json log": js, "/readyz": answers[0], "/": answers[1]}.items():
        assert TOKEN not in output, where
        assert "webhook-secret-value" not in output, where
    assert "https://***@git.example.com/acme/flink-apps.git" in answers[1]
