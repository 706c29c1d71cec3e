"""Per-app health series on /metrics (`flink_reconciler_app_*`), from the facts of each pass.

A custom collector rather than labelled Gauges: the facts are kept as they come (one frozen value per app) and
turned into series only when Prometheus scrapes, so a pass over 10,000 apps costs a dict update, and a deleted
app's series vanish with its facts (no `remove` bookkeeping). Labels are `app` and `namespace` only (never a job
id: a new job would be a new series), and a phase is one series per app (the current one, value 1), so the
series count is linear in apps (docs/alerts.md#metrics has the figures at 10,000 apps).

Times are exported as Unix timestamps, not ages (Prometheus' instrumentation practice): `time() - ...` in a
rule stays right between passes and scrapes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reconciler.alerting.facts import AppFacts

APP = "flink_reconciler_app"
LABELS = ("app", "namespace")


class AppHealthCollector(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts: dict[str, dict[str, AppFacts]] = {}  # owner -> app -> facts
        self._heals: dict[str, int] = {}  # app -> repairs that succeeded, since this process started

    def update(self, facts: Sequence[AppFacts], *, full: bool, owner: str) -> None:
        with self._lock:
            mine = self._facts.setdefault(owner, {})
            if full:
                mine.clear()
            for f in facts:
                mine[f.app] = f
                if f.repaired:
                    self._heals[f.app] = self._heals.get(f.app, 0) + 1

    def forget(self, owner: str) -> None:
        with self._lock:
            self._facts.pop(owner, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            facts = [f for mine in self._facts.values() for f in mine.values()]
            heals = dict(self._heals)
        phase = GaugeMetricFamily(f"{APP}_phase", "The app's phase after the last pass (1 for the current one): "
                                  "in_sync, changing, healing, crash_loop, blocked, failed, invalid.",
                                  labels=(*LABELS, "phase"))
        wanted = GaugeMetricFamily(f"{APP}_job_desired_running", "1 when Git wants the app's job running.",
                                   labels=LABELS)
        running = GaugeMetricFamily(f"{APP}_job_running", "1 when the app's job runs with every task running, 0 "
                                    "when it does not (absent: not observed in the last pass).", labels=LABELS)
        state = GaugeMetricFamily(f"{APP}_job_state", "Flink's state of the app's job (1 for the current one).",
                                  labels=(*LABELS, "state"))
        restarts = CounterMetricFamily(f"{APP}_job_restarts", "Flink's numRestarts of the app's current job "
                                       "(a new job starts from 0: a counter reset).", labels=LABELS)
        ckpt = GaugeMetricFamily(f"{APP}_last_checkpoint_timestamp_seconds", "When the app's job last completed a "
                                 "checkpoint (Unix time).", labels=LABELS)
        interval = GaugeMetricFamily(f"{APP}_checkpoint_interval_seconds", "execution.checkpointing.interval of "
                                     "the app's spec (absent: checkpointing off).", labels=LABELS)
        failed = CounterMetricFamily(f"{APP}_checkpoints_failed", "Failed checkpoints of the app's current job "
                                     "(Flink's counts.failed; a new job starts from 0).", labels=LABELS)
        savepoint = GaugeMetricFamily(f"{APP}_last_savepoint_timestamp_seconds", "When the newest savepoint on the "
                                      "app's record was taken (Unix time).", labels=LABELS)
        healed = CounterMetricFamily(f"{APP}_heals", "Automatic repairs of the app that succeeded (self-healing), "
                                     "since this process started.", labels=LABELS)
        unreadable = GaugeMetricFamily("flink_reconciler_records_unreadable", "Apps whose record cannot be read "
                                       "(each is blocked until `flink-reconciler record rebuild APP`).")
        broken = 0
        for f in facts:
            lv = (f.app, f.namespace)
            phase.add_metric((*lv, f.phase.value), 1)
            if f.want_running is not None:
                wanted.add_metric(lv, 1 if f.want_running else 0)
            if f.record_unreadable is not None:
                broken += 1
            if f.checkpoint_interval_s:
                interval.add_metric(lv, f.checkpoint_interval_s)
            if f.savepoint_at is not None:
                savepoint.add_metric(lv, f.savepoint_at.timestamp())
            if f.app in heals:
                healed.add_metric(lv, heals[f.app])
            if not f.observed:
                continue
            running.add_metric(lv, 1 if f.job_running else 0)
            if f.job_state is not None:
                state.add_metric((*lv, f.job_state), 1)
            if f.restarts is not None:
                restarts.add_metric(lv, f.restarts)
            if f.checkpoints_failed is not None:
                failed.add_metric(lv, f.checkpoints_failed)
            if f.checkpoint_at is not None:
                ckpt.add_metric(lv, f.checkpoint_at.timestamp())
        unreadable.add_metric((), broken)
        yield from (phase, wanted, running, state, restarts, ckpt, interval, failed, savepoint, healed, unreadable)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked collector: its families come and go with the apps
