"""End to end with real parts: a daemon (`flink-reconciler run`, dry run: no Flink) with one app whose record is
unreadable; the real Prometheus (Debian's package) scrapes its /metrics and evaluates the shipped rules; the real
Alertmanager (Debian's prometheus-alertmanager) routes what fires to a local webhook receiver. The same daemon
notifies without Prometheus too, to an HMAC-checking receiver, and shows the alerts on its dashboard.

Fast by test configuration only: 1 s scrape and evaluation intervals, Alertmanager's group waits of 1 s, and the
rules' `for:` set to 0s in the copy Prometheus loads (their expressions are the shipped ones; `for:` itself is
covered by `promtool test rules`, test_rules.py). Skipped, saying why, when the binaries are missing.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerting.receivers import HttpReceiver
from tests.e2e.test_daemon_e2e import HTTP, DaemonProc, poll
from tests.gitutil import Repo, spec

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "alerts" / "flink-reconciler.rules.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(f"{' / '.join(names)} not installed (Debian: apt-get install prometheus prometheus-alertmanager; "
                "scripts/setup.sh does it)")


class Proc:
    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("ab"), stdin=subprocess.DEVNULL)

    def died(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"{self.log.name} exited with {self.proc.returncode}:\n" + self.log.read_text()[-3000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp_path = tmp_path_factory.mktemp("alerts-e2e")
    prometheus = binary("prometheus")
    alertmanager = binary("prometheus-alertmanager", "alertmanager")
    am_hook, direct = HttpReceiver(), HttpReceiver(secret=b"e2e-hmac-key")
    repo = Repo(tmp_path)
    repo.write("apps/orders.yaml", spec("orders"))
    repo.write("apps/billing.yaml", spec("billing"))
    repo.commit("two apps")
    state = tmp_path / "state"
    (state / "records").mkdir(parents=True)
    (state / "records" / "orders.json").write_text('{"version": 1, "app": "ord')  # truncated: unreadable
    alerting = {"sinks": [{"name": "ops", "type": "webhook", "url": direct.url, "hmac_secret": "e2e-hmac-key"}],
                "dashboard_url": "http://reconciler.example"}
    daemon = DaemonProc.start(tmp_path / "daemon.log", repo_url=str(repo.origin), state_dir=state, dry_run=True,
                              poll_interval=1, drift_interval=2, alerting=json.dumps(alerting))
    procs: list[Proc] = []
    try:
        target = daemon.probe_url.removeprefix("http://")  # /metrics is on the probe port
        rules = yaml.safe_load(RULES.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                rule["for"] = "0s"
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
        am_port, prom_port = free_port(), free_port()
        (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname", "app"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": am_hook.url, "send_resolved": True}]}],
        }))
        procs.append(Proc([alertmanager, f"--config.file={tmp_path / 'alertmanager.yml'}",
                           f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
                           "--cluster.listen-address="], tmp_path / "alertmanager.log"))
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "rules.yaml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "flink-reconciler", "static_configs": [{"targets": [target]}]}],
        }))
        procs.append(Proc([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                           f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                          tmp_path / "prometheus.log"))
        yield {"daemon": daemon, "am_hook": am_hook, "direct": direct, "procs": procs,
               "prometheus": f"http://127.0.0.1:{prom_port}"}
    finally:
        for p in procs:
            p.stop()
        daemon.stop()
        am_hook.close()
        direct.close()


def test_prometheus_fires_the_shipped_rules_and_alertmanager_routes_them(world: dict[str, Any]) -> None:
    daemon: DaemonProc = world["daemon"]
    am_hook: HttpReceiver = world["am_hook"]
    procs: list[Proc] = world["procs"]

    def alive() -> str | None:
        return daemon.died() or next((why for p in procs if (why := p.died())), None)

    def routed() -> dict[str, dict[str, Any]] | None:
        alerts = {a["labels"]["alertname"]: a for g in am_hook.got for a in g.json()["alerts"]
                  if a["status"] == "firing"}
        return alerts if {"FlinkAppBlocked", "FlinkReconcilerRecordsUnreadable"} <= set(alerts) else None

    alerts = poll(routed, timeout=90, interval=0.5, what="Alertmanager delivering the two alerts", alive=alive)
    blocked = alerts["FlinkAppBlocked"]
    assert blocked["labels"]["app"] == "orders" and blocked["labels"]["severity"] == "warning"
    assert blocked["annotations"]["runbook_url"] == "docs/alerts.md#flinkappblocked"
    assert alerts["FlinkReconcilerRecordsUnreadable"]["annotations"]["summary"].startswith("1 app record(s)")
    # the healthy app raised nothing: the only app alerts are about orders
    assert {a["labels"].get("app") for g in am_hook.got for a in g.json()["alerts"]} <= {"orders", None}
    # what Prometheus scraped: the per-app series of both apps
    got = HTTP.get(world["prometheus"] + "/api/v1/query",
                   params={"query": "flink_reconciler_app_phase"}, timeout=10).json()["data"]["result"]
    assert {(r["metric"]["app"], r["metric"]["phase"]) for r in got} == {("orders", "blocked"), ("billing", "changing")}


def test_the_daemon_notifies_without_prometheus_and_shows_its_alerts(world: dict[str, Any]) -> None:
    daemon: DaemonProc = world["daemon"]
    direct: HttpReceiver = world["direct"]

    def sent() -> set[str] | None:
        names = {g.json()["alert"] for g in direct.got}
        return names if {"FlinkAppBlocked", "FlinkReconcilerRecordsUnreadable"} <= names else None

    poll(sent, timeout=60, what="the daemon's own webhook notifications", alive=daemon.died)
    assert direct.refused == 0  # every one carried a valid HMAC signature
    docs = [g.json() for g in direct.got]
    assert all(d["app"] == "orders" and d["status"] == "firing" for d in docs)
    assert {d["url"] for d in docs} == {"http://reconciler.example/apps/orders"}
    assert len(docs) == 2, "each condition once, not once per pass"
    html = {"Accept": "text/html"}
    page = HTTP.get(daemon.url + "/", headers=html, timeout=10).text
    assert re.search(r"2 active alerts", page) and "FlinkAppBlocked" in page, page[:2000]
    assert "FlinkReconcilerRecordsUnreadable" in HTTP.get(daemon.url + "/apps/orders", headers=html, timeout=10).text
    assert "FlinkAppBlocked" not in HTTP.get(daemon.url + "/apps/billing", headers=html, timeout=10).text
    text_page = daemon.get("/status.txt").text
    assert "active alerts: 2" in text_page and re.search(r"FlinkAppBlocked +orders: orders is blocked", text_page)
    text = daemon.metrics()
    assert 'flink_reconciler_notifications_total{result="sent",sink="ops"} 2.0' in text
