"""The shipped alert rules (deploy/alerts/): unit-tested with the real `promtool test rules`, the PrometheusRule
kept equal to the rule file, one runbook section per alert, the same names as the daemon's own triggers, and
every series a rule reads is one the daemon exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.alerting.conditions import ALERTS
from reconciler.alerting.facts import AppFacts, Phase
from reconciler.daemon.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "alerts" / "flink-reconciler.rules.yaml"
OPERATOR = ROOT / "deploy" / "alerts" / "prometheusrule.yaml"
RUNBOOKS = ROOT / "docs" / "alerts.md"


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; scripts/setup.sh does it)")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "rules_test.yaml"], cwd=Path(__file__).parent,
                          capture_output=True, text=True, timeout=120, check=False)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def test_the_prometheusrule_has_exactly_the_groups_of_the_rule_file() -> None:
    doc = yaml.safe_load(OPERATOR.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert doc["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], \
        "regenerate deploy/alerts/prometheusrule.yaml from the rule file"


def test_every_alert_is_a_trigger_of_the_daemon_with_its_severity_and_a_runbook() -> None:
    shipped = {r["alert"]: r for r in rules()}
    assert set(shipped) == {name for name, _ in ALERTS.values()}
    docs = RUNBOOKS.read_text()
    headings = set(re.findall(r"^### (\w+)$", docs, re.MULTILINE))
    for name, severity in ALERTS.values():
        r = shipped[name]
        assert r["labels"]["severity"] == severity, name
        assert r["annotations"]["runbook_url"] == f"docs/alerts.md#{name.lower()}"
        assert name in headings, f"docs/alerts.md has no runbook section '### {name}'"
        section = docs.split(f"### {name}\n", 1)[1].split("\n### ", 1)[0]
        for part in ("**What it means.**", "**What to do.**", "flink-reconciler"):
            assert part in section, f"the runbook of {name} lacks {part!r}"


def test_every_series_a_rule_reads_is_exported() -> None:
    metrics = Metrics()
    now = datetime(2026, 12, 5, tzinfo=UTC)
    metrics.app_health([AppFacts(app="a", namespace="n", phase=Phase.IN_SYNC, reason="", want_running=True,
                                 job_state="RUNNING", job_running=True, restarts=1, checkpoint_at=now,
                                 checkpoint_interval_s=10.0, checkpoints_failed=0, savepoint_at=now)], full=True)
    metrics.observe_git_fetch(0.1, error="SourceAuthError")
    metrics.observe_git_fetch(0.1)
    metrics.last_sync_success.set(1)
    exported = set(re.findall(r"^([a-z_]+)[{ ]", metrics.exposition()[0].decode(), re.MULTILINE))
    used = {m for r in rules() for m in re.findall(r"\b(flink_reconciler_[a-z_]+)", r["expr"])}
    assert used and used <= exported, used - exported


def test_per_app_series_in_both_formats_with_one_eof_and_rendered_once_per_pass() -> None:
    metrics = Metrics()
    now = datetime(2026, 12, 5, tzinfo=UTC)
    f = AppFacts(app="a", namespace="n", phase=Phase.CRASH_LOOP, reason="", want_running=True, job_state="FAILED",
                 restarts=3, checkpoints_failed=2)
    metrics.app_health([f], full=True)
    text, ctype = metrics.exposition()
    assert ctype.startswith("text/plain")
    assert b'flink_reconciler_app_phase{app="a",namespace="n",phase="crash_loop"} 1.0' in text
    assert b'flink_reconciler_app_job_restarts_total{app="a",namespace="n"} 3.0' in text
    assert b'flink_reconciler_app_job_state{app="a",namespace="n",state="FAILED"} 1.0' in text
    om, ctype = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and om.count(b"# EOF") == 1 and om.endswith(b"# EOF\n")
    assert b'flink_reconciler_app_checkpoints_failed_total{app="a",namespace="n"} 2.0' in om
    assert metrics.exposition()[0] is not None
    first = metrics._app_text
    metrics.exposition()
    assert metrics._app_text is first, "no re-render without new facts"
    metrics.app_health([f.__class__(**{**f.__dict__, "phase": Phase.IN_SYNC, "checkpoint_at": now})], full=True)
    text, _ = metrics.exposition()
    assert b'phase="in_sync"} 1.0' in text and b'phase="crash_loop"' not in text
    metrics.app_health([], full=True)  # the app is gone from Git: its series go too
    assert b'app="a"' not in metrics.exposition()[0]


def test_both_formats_parse_with_prometheus_clients_parsers() -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
    from prometheus_client.parser import text_string_to_metric_families

    metrics = Metrics()
    now = datetime(2026, 12, 5, tzinfo=UTC)
    metrics.app_health([AppFacts(app=f"a{i}", namespace="n", phase=Phase.IN_SYNC, reason="", want_running=True,
                                 job_state="RUNNING", job_running=True, restarts=i, checkpoint_at=now,
                                 checkpoint_interval_s=10.0, checkpoints_failed=0, savepoint_at=now, repaired=True)
                        for i in range(3)], full=True)
    text = metrics.exposition()[0].decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert [s.value for s in fams["flink_reconciler_app_job_restarts"].samples] == [0.0, 1.0, 2.0]
    assert fams["flink_reconciler_app_heals"].type == "counter"
    om = metrics.exposition("application/openmetrics-text; version=1.0.0")[0].decode()
    fams = {f.name: f for f in om_families(om)}  # type: ignore[no-untyped-call]  # raises on anything OpenMetrics does not allow (a second EOF ...)
    assert fams["flink_reconciler_app_last_checkpoint_timestamp_seconds"].samples[0].value == now.timestamp()
    assert fams["flink_reconciler_records_unreadable"].samples[0].value == 0.0


def test_the_podmonitor_scrapes_a_port_the_daemons_pods_have() -> None:
    kustomization = yaml.safe_load((ROOT / "deploy" / "alerts" / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {"prometheusrule.yaml", "podmonitor.yaml"}
    monitor = yaml.safe_load((ROOT / "deploy" / "alerts" / "podmonitor.yaml").read_text())
    deployment = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", ())}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in ports, f"the PodMonitor scrapes port {endpoint['port']!r}; the pods have {ports}"
        assert endpoint["path"] == "/metrics"
