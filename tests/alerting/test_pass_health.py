"""The reconcile pass hands each planned app's health to the daemon's metrics: real Git, real record files, a dry
run (no Flink). A deposed leader forgets it, so only the replica that reconciles the apps reports them."""

from __future__ import annotations

from pathlib import Path

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.daemon.metrics import Metrics
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.e2e.test_daemon_e2e import metric
from tests.gitutil import Repo, spec


def test_a_pass_reports_each_apps_phase_and_a_deposed_leader_forgets_them(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("apps/orders.yaml", spec("orders"))
    repo.write("apps/billing.yaml", spec("billing"))
    repo.commit("two apps")
    state = tmp_path / "state"
    (state / "records").mkdir(parents=True)
    (state / "records" / "orders.json").write_text('{"version": 1, "app": "ord')
    leading = [True]
    clock = SystemClock()
    metrics = Metrics()
    rec = Reconciler(source=GitSource(str(repo.origin), state / "git"), runtime=None,
                     journal=Journal(state / "journal", clock), clock=clock, subdir="apps", metrics=metrics,
                     leader=lambda: leading[0])
    rec.sync(full=True, reason="startup")
    text = metrics.exposition()[0].decode()
    assert metric(text, "flink_reconciler_app_phase", app="orders", namespace="default", phase="blocked") == 1
    assert metric(text, "flink_reconciler_app_phase", app="billing", namespace="default", phase="changing") == 1
    assert metric(text, "flink_reconciler_records_unreadable") == 1
    assert metric(text, "flink_reconciler_app_job_desired_running", app="billing", namespace="default") == 1

    leading[0] = False  # another replica took the Lease
    rec.sync(full=True, reason="poll")
    text = metrics.exposition()[0].decode()
    assert "flink_reconciler_app_phase{" not in text and metric(text, "flink_reconciler_records_unreadable") == 0
