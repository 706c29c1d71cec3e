"""Notifications against real receivers on loopback: the HMAC-signed webhook, a Slack-compatible webhook, e-mail
through a real SMTP server (aiosmtpd); nothing secret in any of them; and a sink that is down, slow or answering
500 never blocks the caller, is retried with backoff, and is counted when given up."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from pydantic import SecretStr

from reconciler.alerting.alerter import Alerter
from reconciler.alerting.conditions import Trigger
from reconciler.alerting.config import AlertingSettings, SinkConfig, Subscription
from reconciler.alerting.delivery import Delivery, Retry
from reconciler.alerting.facts import AppFacts, Phase, facts_of
from reconciler.alerting.message import Notification, email_text, notification, slack_body, webhook_body
from reconciler.alerting.sinks import SIGNATURE_HEADER, HttpSink, make_sink, sign, verify
from reconciler.alerting.state import Event, Status
from reconciler.clock import FakeClock
from reconciler.core.observed import ClusterPhase, LiveApp
from reconciler.core.plan import Action, AppPlan
from reconciler.daemon.app_metrics import AppHealthCollector
from reconciler.daemon.metrics import Metrics
from reconciler.logs import mask_secrets
from tests.alerting.receivers import HttpReceiver, SmtpReceiver
from tests.core.builders import NOW


def wait_for(pred, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    r = HttpReceiver(secret=b"hmac-key-123")
    yield r
    r.close()


def crash_loop(detail: str = "java.lang.IllegalStateException: count of key 3 passed --fail-above 150") -> Notification:
    from reconciler.alerting.conditions import Condition

    c = Condition(Trigger.CRASH_LOOP, "orders", "payments", "orders is crash-looping", detail)
    return notification(Event(Status.FIRING, c, NOW, NOW + timedelta(minutes=1)),
                        runbook_base="https://docs.example/alerts", dashboard_url="https://reconciler.example/")


def sent(metrics: Metrics, sink: str, result: str) -> float:
    return metrics.registry.get_sample_value("flink_reconciler_notifications_total",
                                             {"sink": sink, "result": result}) or 0.0


def dropped(metrics: Metrics, sink: str, reason: str) -> float:
    return metrics.registry.get_sample_value("flink_reconciler_notifications_dropped_total",
                                             {"sink": sink, "reason": reason}) or 0.0


def test_the_webhook_is_json_signed_with_hmac_that_a_receiver_verifies(receiver: HttpReceiver) -> None:
    cfg = SinkConfig(name="ops", type="webhook", url=SecretStr(receiver.url), hmac_secret=SecretStr("hmac-key-123"))
    sink = make_sink(cfg)
    sink.send(crash_loop())
    (got,) = receiver.got
    doc = got.json()
    assert doc["status"] == "firing" and doc["alert"] == "FlinkAppCrashLooping" and doc["app"] == "orders"
    assert doc["namespace"] == "payments" and doc["severity"] == "critical" and doc["version"] == 1
    assert doc["runbookURL"] == "https://docs.example/alerts#flinkappcrashlooping"
    assert doc["url"] == "https://reconciler.example/apps/orders"
    header = got.headers[SIGNATURE_HEADER.lower()]
    assert verify(b"hmac-key-123", got.body, header, now=time.time())
    assert not verify(b"hmac-key-123", got.body + b" ", header, now=time.time()), "a changed body must not verify"
    assert not verify(b"other-key", got.body, header, now=time.time())
    old = sign(b"hmac-key-123", got.body, int(time.time()) - 3600)
    assert not verify(b"hmac-key-123", got.body, old, now=time.time()), "an old signature is a replay"
    # a receiver with another key refuses it (401), which is not retried
    wrong = make_sink(cfg.model_copy(update={"hmac_secret": SecretStr("not-the-key")}))
    with pytest.raises(Exception, match="HTTP 401"):
        wrong.send(crash_loop())
    assert receiver.refused == 1


def test_the_slack_compatible_webhook_posts_text() -> None:
    r = HttpReceiver()
    try:
        make_sink(SinkConfig(name="chat", type="slack", url=SecretStr(r.url))).send(crash_loop())
        (got,) = r.got
        text = got.json()["text"]
        assert "[FIRING] FlinkAppCrashLooping payments/orders" in text and "orders is crash-looping" in text
        assert "<https://docs.example/alerts#flinkappcrashlooping|runbook>" in text
        assert SIGNATURE_HEADER.lower() not in got.headers
    finally:
        r.close()


def test_email_through_a_real_smtp_server_with_login() -> None:
    smtp = SmtpReceiver(password="s3cret-smtp-pass")
    try:
        cfg = SinkConfig(name="mail", type="smtp", smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_security="none",
                         username="alerts", password=SecretStr("s3cret-smtp-pass"), mail_from="reconciler@example.org",
                         mail_to=("oncall@example.org", "team@example.org"))
        make_sink(cfg).send(crash_loop())
        (msg,) = smtp.messages
        assert smtp.logins == [("alerts", "s3cret-smtp-pass")]
        assert msg["Subject"] == "[FIRING] FlinkAppCrashLooping payments/orders"
        assert smtp.envelopes[0].rcpt_tos == ["oncall@example.org", "team@example.org"]
        payload = msg.get_payload(decode=True)
        assert isinstance(payload, bytes)
        body = payload.decode()
        assert "passed --fail-above 150" in body
        assert "runbook:   https://docs.example/alerts#flinkappcrashlooping" in body
        assert "s3cret-smtp-pass" not in msg.as_string()
    finally:
        smtp.close()


def test_no_secret_in_any_message() -> None:
    mask_secrets("tok-ABCDEF-123")
    detail = ("savepoint to s3://bucket/sp failed: access denied for https://ci:hunter2@git.example/repo.git "
              "with token tok-ABCDEF-123")
    n = crash_loop(detail)
    for text in (webhook_body(n).decode(), slack_body(n).decode(), "\n".join(email_text(n))):
        assert "tok-ABCDEF-123" not in text and "hunter2" not in text
        assert "access denied" in text or "crash-looping" in text


def test_a_500_is_retried_with_backoff_and_then_sent() -> None:
    r = HttpReceiver(status=500)
    metrics = Metrics()
    try:
        d = Delivery(HttpSink("ops", "webhook", r.url), retry=Retry(5, 0.05, 0.2), queue_size=10, metrics=metrics)
        d.submit(crash_loop())
        wait_for(lambda: len(r.got) >= 2)
        r.status = 200
        wait_for(lambda: sent(metrics, "ops", "sent") == 1)
        assert sent(metrics, "ops", "error") >= 2
        gaps = [b.at - a.at for a, b in zip(r.got, r.got[1:], strict=False)]
        assert gaps[0] >= 0.04, gaps  # waited between attempts
        d.close(2)
    finally:
        r.close()


def test_a_sink_that_is_down_gives_up_after_its_attempts_and_counts_the_drop() -> None:
    r = HttpReceiver()
    url = r.url
    r.close()  # nothing listens: connection refused
    metrics = Metrics()
    d = Delivery(HttpSink("ops", "webhook", url), retry=Retry(3, 0.01, 0.02), queue_size=10, metrics=metrics)
    d.submit(crash_loop())
    wait_for(lambda: dropped(metrics, "ops", "failed") == 1)
    assert sent(metrics, "ops", "error") == 3 and sent(metrics, "ops", "sent") == 0
    d.close(1)


def test_a_slow_sink_never_blocks_the_caller_and_a_full_queue_drops() -> None:
    r = HttpReceiver(delay_s=1.0)
    metrics = Metrics()
    try:
        d = Delivery(HttpSink("ops", "webhook", r.url, timeout=5), retry=Retry(1, 0.01, 0.01), queue_size=2,
                     metrics=metrics)
        t0 = time.perf_counter()
        accepted = [d.submit(crash_loop()) for _ in range(10)]
        took = time.perf_counter() - t0
        assert took < 0.5, f"submitting 10 notifications to a slow sink took {took:.3f}s"
        assert accepted.count(True) <= 3 and accepted.count(False) >= 7  # one in flight, two queued
        assert dropped(metrics, "ops", "queue_full") == accepted.count(False)
        d.close(0.1)
    finally:
        r.close()


def facts(phase: Phase, app: str = "orders", ns: str = "payments") -> AppFacts:
    return AppFacts(app=app, namespace=ns, phase=phase, reason="crash loop: 3 automatic repairs ...",
                    want_running=True, job_state="RUNNING" if phase is Phase.IN_SYNC else "FAILED",
                    job_running=phase is Phase.IN_SYNC)


def test_the_alerter_notifies_subscribed_sinks_once_and_on_resolve(receiver: HttpReceiver) -> None:
    clock = FakeClock(NOW)
    other = HttpReceiver()
    try:
        cfg = AlertingSettings(
            sinks=(SinkConfig(name="ops", type="webhook", url=SecretStr(receiver.url),
                              hmac_secret=SecretStr("hmac-key-123")),
                   SinkConfig(name="team", type="slack", url=SecretStr(other.url))),
            subscriptions=(Subscription(sinks=("ops",)),
                           Subscription(sinks=("team",), triggers=(Trigger.CRASH_LOOP,), apps=("payments/*",))),
            resend_interval=3600, not_syncing_after=86400)
        alerter = Alerter(cfg, clock, metrics=Metrics())
        alerter.app_health([facts(Phase.CRASH_LOOP), facts(Phase.BLOCKED, app="billing", ns="finance")], full=True)
        wait_for(lambda: len(receiver.got) == 2 and len(other.got) == 1)
        assert sorted((g.json()["alert"], g.json()["app"]) for g in receiver.got) == [
            ("FlinkAppBlocked", "billing"), ("FlinkAppCrashLooping", "orders")]
        assert {a.alert for a in alerter.active()} == {"FlinkAppBlocked", "FlinkAppCrashLooping"}
        clock.advance(60)  # the next passes say the same: nothing new
        alerter.app_health([facts(Phase.CRASH_LOOP), facts(Phase.BLOCKED, app="billing", ns="finance")], full=True)
        alerter.tick()
        clock.advance(60)
        alerter.app_health([facts(Phase.IN_SYNC), facts(Phase.BLOCKED, app="billing", ns="finance")], full=True)
        wait_for(lambda: len(receiver.got) == 3 and len(other.got) == 2)
        assert receiver.got[-1].json()["status"] == "resolved" and receiver.got[-1].json()["app"] == "orders"
        assert "RESOLVED" in other.got[-1].json()["text"]
        assert [a.app for a in alerter.active()] == ["billing"]
        clock.advance(3600)  # resend interval: the one still firing is sent again, to its subscribers only
        alerter.tick()
        wait_for(lambda: len(receiver.got) == 4)
        assert receiver.got[-1].json()["repeat"] is True and len(other.got) == 2
        alerter.close(1)
    finally:
        other.close()


def test_the_daemons_own_conditions_fire_from_fetches_and_passes(receiver: HttpReceiver) -> None:
    clock = FakeClock(NOW)
    cfg = AlertingSettings(sinks=(SinkConfig(name="ops", type="webhook", url=SecretStr(receiver.url),
                                             hmac_secret=SecretStr("hmac-key-123")),),
                           git_fetch_failures=2, not_syncing_after=300)
    alerter = Alerter(cfg, clock)
    alerter.git_fetched(error="SourceAuthError")
    alerter.sync_finished(ok=False)
    alerter.git_fetched(error="SourceAuthError")
    wait_for(lambda: len(receiver.got) == 1)
    assert receiver.got[0].json()["alert"] == "FlinkReconcilerGitFetchFailing"
    clock.advance(301)
    alerter.tick()
    wait_for(lambda: len(receiver.got) == 2)
    assert receiver.got[1].json()["alert"] == "FlinkReconcilerNotSyncing"
    alerter.git_fetched(error=None)
    alerter.sync_finished(ok=True)
    wait_for(lambda: len(receiver.got) == 4)
    assert {g.json()["status"] for g in receiver.got[2:]} == {"resolved"}
    alerter.close(1)


def test_settings_refuse_incomplete_sinks_and_unknown_subscriptions() -> None:
    with pytest.raises(ValueError, match="needs exactly one of url, url_file"):
        SinkConfig(name="ops", type="webhook")
    with pytest.raises(ValueError, match="needs smtp_host, mail_to"):
        SinkConfig(name="mail", type="smtp", mail_from="a@b")
    with pytest.raises(ValueError, match="unknown sinks: nope"):
        AlertingSettings(subscriptions=(Subscription(sinks=("nope",)),))


def test_a_shard_given_up_is_forgotten_without_resolved_messages(receiver: HttpReceiver) -> None:
    clock = FakeClock(NOW)
    cfg = AlertingSettings(sinks=(SinkConfig(name="ops", type="webhook", url=SecretStr(receiver.url),
                                             hmac_secret=SecretStr("hmac-key-123")),), not_syncing_after=86400)
    alerter = Alerter(cfg, clock)
    alerter.app_health([facts(Phase.BLOCKED, app="a")], full=True, owner="shard-0")
    alerter.app_health([facts(Phase.BLOCKED, app="b")], full=True, owner="shard-1")
    wait_for(lambda: len(receiver.got) == 2)
    alerter.forget_owner("shard-0")  # another replica reconciles `a` now
    alerter.tick()
    alerter.app_health([facts(Phase.BLOCKED, app="b")], full=True, owner="shard-1")
    time.sleep(0.2)
    assert len(receiver.got) == 2 and [a.app for a in alerter.active()] == ["b"]
    alerter.close(1)


def test_an_app_not_observed_in_a_pass_keeps_its_live_alerts_as_they_were(receiver: HttpReceiver) -> None:
    clock = FakeClock(NOW)
    cfg = AlertingSettings(sinks=(SinkConfig(name="ops", type="webhook", url=SecretStr(receiver.url),
                                             hmac_secret=SecretStr("hmac-key-123")),), not_syncing_after=86400)
    alerter = Alerter(cfg, clock)
    old = AppFacts(app="a", namespace="n", phase=Phase.IN_SYNC, reason="", want_running=True, job_state="RUNNING",
                   job_running=True, checkpoint_at=NOW - timedelta(hours=1), checkpoint_interval_s=10.0)
    alerter.app_health([old], full=True)
    wait_for(lambda: len(receiver.got) == 1)
    assert receiver.got[0].json()["alert"] == "FlinkAppCheckpointTooOld"
    changing = AppFacts(app="a", namespace="n", phase=Phase.IN_SYNC, reason="upgraded", want_running=True,
                        observed=False)  # executed in this pass: observed before its change
    alerter.app_health([changing], full=True)
    time.sleep(0.2)
    assert len(receiver.got) == 1 and [a.alert for a in alerter.active()] == ["FlinkAppCheckpointTooOld"]
    fresh = AppFacts(app="a", namespace="n", phase=Phase.IN_SYNC, reason="", want_running=True, job_state="RUNNING",
                     job_running=True, checkpoint_at=NOW, checkpoint_interval_s=10.0)
    alerter.app_health([fresh], full=True)
    wait_for(lambda: len(receiver.got) == 2)
    assert receiver.got[1].json()["status"] == "resolved"
    alerter.close(1)


def test_a_pass_that_could_not_look_at_an_app_keeps_its_phase_and_its_alerts(receiver: HttpReceiver) -> None:
    # Chaos soak run 13: a pass whose JobManager did not answer plans "nothing until it can be observed" (a NOOP,
    # in sync by its action). The app's blocked alert neither resolves nor fires again; /metrics keeps its phase.
    clock = FakeClock(NOW)
    cfg = AlertingSettings(sinks=(SinkConfig(name="ops", type="webhook", url=SecretStr(receiver.url),
                                             hmac_secret=SecretStr("hmac-key-123")),), not_syncing_after=86400)
    alerter, collector = Alerter(cfg, clock), AppHealthCollector()
    blocked = AppFacts(app="a", namespace="n", phase=Phase.BLOCKED, reason="no state to restore from",
                       want_running=True)
    unknown = facts_of(AppPlan(app="a", action=Action.NOOP, reason="live state unknown (connection refused)"),
                       outcome=None, message=None, live=LiveApp(name="a", cluster=ClusterPhase.UNKNOWN), record=None,
                       spec=None)
    assert not unknown.judged and unknown.phase is Phase.IN_SYNC
    for f in (blocked, unknown, unknown):
        alerter.app_health([f], full=True)
        collector.update([f], full=True, owner="")
    time.sleep(0.2)
    assert [r.json()["status"] for r in receiver.got] == ["firing"]
    assert [a.alert for a in alerter.active()] == ["FlinkAppBlocked"]
    assert b'flink_reconciler_app_phase{app="a",namespace="",phase="blocked"} 1.0' in collector.render()
    seen = dataclasses.replace(unknown, judged=True)  # looked at again: it is what the pass says
    alerter.app_health([seen], full=True)
    wait_for(lambda: len(receiver.got) == 2)
    assert receiver.got[1].json()["status"] == "resolved"
    alerter.close(1)
