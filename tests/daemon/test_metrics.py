"""Metrics: every family in the exposition, parsed back with prometheus_client's parser."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from reconciler.core.observed import Outcome
from reconciler.daemon.metrics import Metrics


def samples(m: Metrics) -> list[Sample]:
    body, _ = m.exposition()
    return [s for family in text_string_to_metric_families(body.decode()) for s in family.samples]


def value(m: Metrics, name: str, **labels: str) -> float | None:
    for s in samples(m):
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def test_every_family_is_exposed_with_help_and_type() -> None:
    body, content_type = Metrics().exposition()
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    expected = {
        "flink_reconciler_build": "info",
        "flink_reconciler_reconcile_duration_seconds": "histogram",
        "flink_reconciler_reconcile_outcomes": "counter",
        "flink_reconciler_last_applied_revision": "info",
        "flink_reconciler_git_fetch_duration_seconds": "histogram",
        "flink_reconciler_git_fetch_errors": "counter",
        "flink_reconciler_step_duration_seconds": "histogram",
        "flink_reconciler_journal_inflight_steps": "gauge",
        "flink_reconciler_webhook_requests": "counter",
        "flink_reconciler_sync_passes": "counter",
        "flink_reconciler_sync_duration_seconds": "histogram",
        "flink_reconciler_sync_requests_coalesced": "counter",
        "flink_reconciler_last_successful_sync_timestamp_seconds": "gauge",
    }
    # The text format has no info type; the parser sees info metrics as gauges named *_info.
    seen = {name: f.type for name, f in families.items()}
    for name, kind in expected.items():
        key = f"{name}_info" if kind == "info" else name
        assert key in seen, name
        assert seen[key] == ("gauge" if kind == "info" else kind)
        assert families[key].documentation


def test_per_app_reconcile_metrics() -> None:
    m = Metrics()
    m.observe_reconcile("orders", 12.0, Outcome.SUCCESS)
    m.observe_reconcile("orders", 3.0, Outcome.FAILURE)
    m.observe_reconcile("payments", 0.2, "error")
    m.set_applied_revision("orders", "4f2a9c1e")
    m.set_applied_revision("orders", "77aa0b3d")  # replaces, does not add a series
    assert value(m, "flink_reconciler_reconcile_duration_seconds_count", app="orders") == 2
    assert value(m, "flink_reconciler_reconcile_duration_seconds_sum", app="orders") == 15.0
    assert value(m, "flink_reconciler_reconcile_duration_seconds_bucket", app="orders", le="5.0") == 1
    assert value(m, "flink_reconciler_reconcile_outcomes_total", app="orders", outcome="success") == 1
    assert value(m, "flink_reconciler_reconcile_outcomes_total", app="orders", outcome="failure") == 1
    assert value(m, "flink_reconciler_reconcile_outcomes_total", app="payments", outcome="error") == 1
    revisions = [s.labels["revision"] for s in samples(m) if s.name == "flink_reconciler_last_applied_revision_info"]
    assert revisions == ["77aa0b3d"]


def test_forget_app_drops_its_series() -> None:
    m = Metrics()
    m.observe_reconcile("gone", 1.0, Outcome.SUCCESS)
    m.set_applied_revision("gone", "abc")
    m.observe_reconcile("kept", 1.0, Outcome.SUCCESS)
    m.forget_app("gone")
    m.forget_app("never-seen")
    apps = {s.labels.get("app") for s in samples(m)} - {None}
    assert apps == {"kept"}


def test_git_fetch_steps_journal_webhooks_syncs() -> None:
    m = Metrics()
    m.observe_git_fetch(0.03)
    m.observe_git_fetch(5.0, error="SourceUnreachableError")
    with m.time_git_fetch():
        pass
    with pytest.raises(OSError), m.time_git_fetch():
        raise OSError("connection refused")
    for step, seconds in (("savepoint", 4.0), ("stop", 1.0), ("start", 8.0), ("downtime", 9.5)):
        m.observe_step(step, seconds)
    m.set_inflight_steps(2)
    m.count_webhook("github", "triggered")
    m.count_webhook("github", "triggered")
    m.count_webhook("gitlab", "unauthorized")
    m.observe_sync("poll", "ok", 0.5)
    m.observe_sync("webhook", "error", 0.1)
    m.sync_requests_coalesced.labels("poll").inc()
    m.last_sync_success.set(1767225600)

    assert value(m, "flink_reconciler_git_fetch_duration_seconds_count") == 4
    assert value(m, "flink_reconciler_git_fetch_errors_total", kind="SourceUnreachableError") == 1
    assert value(m, "flink_reconciler_git_fetch_errors_total", kind="OSError") == 1
    assert value(m, "flink_reconciler_step_duration_seconds_sum", step="downtime") == 9.5
    assert value(m, "flink_reconciler_journal_inflight_steps") == 2
    assert value(m, "flink_reconciler_webhook_requests_total", forge="github", result="triggered") == 2
    assert value(m, "flink_reconciler_webhook_requests_total", forge="gitlab", result="unauthorized") == 1
    assert value(m, "flink_reconciler_sync_passes_total", trigger="poll", result="ok") == 1
    assert value(m, "flink_reconciler_sync_passes_total", trigger="webhook", result="error") == 1
    assert value(m, "flink_reconciler_sync_duration_seconds_count", trigger="poll") == 1
    assert value(m, "flink_reconciler_sync_requests_coalesced_total", trigger="poll") == 1
    assert value(m, "flink_reconciler_last_successful_sync_timestamp_seconds") == 1767225600


def test_registries_are_private() -> None:
    a, b = Metrics(), Metrics()  # the global registry would refuse the second set of names
    a.count_webhook("gitea", "triggered")
    assert value(b, "flink_reconciler_webhook_requests_total", forge="gitea", result="triggered") is None
    global_names = {f.name for f in REGISTRY.collect()}
    assert not any(n.startswith("flink_reconciler") for n in global_names)


def test_no_created_series() -> None:
    m = Metrics()
    m.observe_reconcile("orders", 1.0, Outcome.SUCCESS)
    assert not [s for s in samples(m) if s.name.endswith("_created")]


def test_openmetrics_on_request() -> None:
    m = Metrics()
    m.count_webhook("github", "ping")
    body, content_type = m.exposition("application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert content_type.startswith("application/openmetrics-text")
    assert body.decode().rstrip().endswith("# EOF")
