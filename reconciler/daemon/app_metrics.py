"""Per-app health series on /metrics (`flink_reconciler_app_*`), from the facts of each pass.

Not labelled Gauges: the facts are kept as they come (one frozen value per app) and rendered into series when
Prometheus scrapes (once per change: metrics.py caches the text), so a pass over 10,000 apps costs a dict update,
and a deleted app's series vanish with its facts (no `remove` bookkeeping). Labels are `app` and `namespace` only
(never a job id: a new job would be a new series), and a phase is one series per app (the current one, value 1),
so the series count is linear in apps (docs/alerts.md#metrics has the figures at 10,000 apps).

Times are exported as Unix timestamps, not ages (Prometheus' instrumentation practice): `time() - ...` in a
rule stays right between passes and scrapes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from reconciler.alerting.facts import AppFacts, carry_over

APP = "flink_reconciler_app"
LABELS = ("app", "namespace")


class AppHealthCollector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts: dict[str, dict[str, AppFacts]] = {}  # owner -> app -> facts
        self._heals: dict[str, int] = {}  # app -> repairs that succeeded, since this process started
        self.version = 0  # bumped on every change: the rendered exposition is cached per version (metrics.py)

    def update(self, facts: Sequence[AppFacts], *, full: bool, owner: str) -> None:
        with self._lock:
            mine = self._facts.setdefault(owner, {})
            kept = [carry_over(f, mine.get(f.app)) for f in facts]
            if full:
                mine.clear()
            for f in kept:
                mine[f.app] = f
                if f.repaired:
                    self._heals[f.app] = self._heals.get(f.app, 0) + 1
            self.version += 1

    def forget(self, owner: str) -> None:
        with self._lock:
            self._facts.pop(owner, None)
            self.version += 1

    def render(self, *, openmetrics: bool = False) -> bytes:
        """The per-app series in the text format (0.0.4) or OpenMetrics (without its `# EOF`). Written here rather
        than through prometheus_client's encoder: 10,000 apps are ~100,000 samples, which the generic encoder takes
        seconds to format; this takes a small fraction of that (bench/alerting_bench.py)."""
        with self._lock:
            facts = [f for mine in self._facts.values() for f in mine.values()]
            heals = dict(self._heals)
        out: list[str] = []
        for name, kind, help_text, rows in _families(facts, heals):
            counter = kind == "counter"
            family = name if openmetrics or not counter else f"{name}_total"
            sample = f"{name}_total" if counter else name
            out.append(f"# HELP {family} {help_text}\n# TYPE {family} {kind}\n")
            out.extend(f"{sample}{{{labels}}} {value!r}\n" if labels else f"{sample} {value!r}\n"
                       for labels, value in rows)
        return "".join(out).encode()


def _families(facts: Sequence[AppFacts], heals: dict[str, int]) -> list[tuple[str, str, str, list[tuple[str, float]]]]:
    names = ("phase", "change_failed", "job_desired_running", "job_running", "job_state", "job_restarts",
             "last_checkpoint_timestamp_seconds", "checkpoint_interval_seconds", "checkpoints_failed",
             "last_savepoint_timestamp_seconds", "heals")
    rows: dict[str, list[tuple[str, float]]] = {n: [] for n in names}
    broken = 0
    for f in sorted(facts, key=lambda f: (f.namespace, f.app)):
        lv = f'app="{_esc(f.app)}",namespace="{_esc(f.namespace)}"'
        rows["phase"].append((f'{lv},phase="{f.phase.value}"', 1.0))
        rows["change_failed"].append((lv, 1.0 if f.change_failed else 0.0))
        if f.want_running is not None:
            rows["job_desired_running"].append((lv, 1.0 if f.want_running else 0.0))
        if f.record_unreadable is not None:
            broken += 1
        if f.checkpoint_interval_s:
            rows["checkpoint_interval_seconds"].append((lv, float(f.checkpoint_interval_s)))
        if f.savepoint_at is not None:
            rows["last_savepoint_timestamp_seconds"].append((lv, f.savepoint_at.timestamp()))
        if f.app in heals:
            rows["heals"].append((lv, float(heals[f.app])))
        if not f.observed:
            continue
        rows["job_running"].append((lv, 1.0 if f.job_running else 0.0))
        if f.job_state is not None:
            rows["job_state"].append((f'{lv},state="{_esc(f.job_state)}"', 1.0))
        if f.restarts is not None:
            rows["job_restarts"].append((lv, float(f.restarts)))
        if f.checkpoints_failed is not None:
            rows["checkpoints_failed"].append((lv, float(f.checkpoints_failed)))
        if f.checkpoint_at is not None:
            rows["last_checkpoint_timestamp_seconds"].append((lv, f.checkpoint_at.timestamp()))
    out = [(f"{APP}_{n}", KIND.get(n, "gauge"), HELP[n], rows[n]) for n in names]
    out.append(("flink_reconciler_records_unreadable", "gauge", HELP["records_unreadable"], [("", float(broken))]))
    return out


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


KIND = {"job_restarts": "counter", "checkpoints_failed": "counter", "heals": "counter"}
HELP = {
    "phase": "The app's phase after the last pass (1 for the current one): in_sync, changing, healing, crash_loop, "
             "blocked, failed, invalid.",
    "change_failed": "1 while the app's last change failed and is not retried until Git changes it (also while the "
                     "last applied spec is healed meanwhile).",
    "job_desired_running": "1 when Git wants the app's job running.",
    "job_running": "1 when the app's job runs with every task running, 0 when it does not (absent: not observed in "
                   "the last pass).",
    "job_state": "Flink's state of the app's job (1 for the current one).",
    "job_restarts": "Flink's numRestarts of the app's current job (a new job starts from 0: a counter reset).",
    "last_checkpoint_timestamp_seconds": "When the app's job last completed a checkpoint (Unix time).",
    "checkpoint_interval_seconds": "execution.checkpointing.interval of the app's spec (absent: checkpointing off).",
    "checkpoints_failed": "Failed checkpoints of the app's current job (Flink's counts.failed; a new job starts "
                          "from 0).",
    "last_savepoint_timestamp_seconds": "When the newest savepoint on the app's record was taken (Unix time).",
    "heals": "Automatic repairs of the app that succeeded (self-healing), since this process started.",
    "records_unreadable": "Apps whose record cannot be read (each is blocked until `flink-reconciler record rebuild "
                          "APP`).",
}
