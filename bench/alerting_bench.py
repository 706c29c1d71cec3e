"""Cost of per-app health and alerting (docs/alerts.md#what-it-costs).

1. Metrics at N apps (default 10,000): RSS of this process before and after the per-app facts are handed to the
   daemon's Metrics (the `flink_reconciler_app_*` collector) and its alerter; time to hand over one full pass of
   facts; time to scrape /metrics (the exposition Prometheus would get: median and max of 20), its size and
   series count. Every app is running and checkpointing; 1% are crash-looping (so the alerter has state).
2. Sinks down / slow / answering 500 do not change the reconcile pass: a dry-run Reconciler over a real Git repo
   (M apps, a fifth of them with an unreadable record: two alerts each on the first pass) runs full passes with
   the alerter's webhook pointing at a receiver that is fine, answers 500, answers after 2 s, or is not listening.
   Pass durations (median and max of P), notifications sent and dropped per mode.
3. Notification latency: condition seen (a pass hands its facts over) -> the webhook receiver has the request,
   on loopback (median and max of 50).

Run: .venv/bin/python bench/alerting_bench.py [--apps 10000] [--pass-apps 500] [--passes 5]
Prints one JSON document, then Markdown tables. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import SecretStr

from reconciler.alerting.alerter import Alerter
from reconciler.alerting.config import AlertingSettings, SinkConfig
from reconciler.alerting.facts import AppFacts, Phase
from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.daemon.metrics import Metrics
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.alerting.receivers import HttpReceiver
from tests.gitutil import Repo, spec


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def facts(n: int, now: datetime) -> list[AppFacts]:
    out = []
    for i in range(n):
        looping = i % 100 == 0
        out.append(AppFacts(
            app=f"app-{i:05d}", namespace=f"team-{i % 20:02d}",
            phase=Phase.CRASH_LOOP if looping else Phase.IN_SYNC, reason="crash loop" if looping else "in sync",
            want_running=True, job_state="FAILED" if looping else "RUNNING",
            job_running=not looping, restarts=i % 7, checkpoint_at=now - timedelta(seconds=i % 30),
            checkpoint_interval_s=10.0, checkpoints_failed=i % 3, savepoint_at=now - timedelta(hours=1),
            unhealthy_since=now if looping else None))
    return out


def metrics_cost(n: int) -> dict[str, Any]:
    gc.collect()
    before = rss_mib()
    m = Metrics()
    alerter = Alerter(AlertingSettings(), SystemClock())  # no sinks: conditions and state only
    m.add_listener(alerter)
    now = datetime.now(UTC)
    fs = facts(n, now)
    t0 = time.perf_counter()
    m.app_health(fs, full=True)
    first = time.perf_counter() - t0
    fs = facts(n, now + timedelta(seconds=60))  # the next pass: new values, same apps
    t0 = time.perf_counter()
    m.app_health(fs, full=True)
    again = time.perf_counter() - t0
    t0 = time.perf_counter()
    alerter.tick()
    tick = time.perf_counter() - t0
    scrapes = []
    body = b""
    for _ in range(20):
        t0 = time.perf_counter()
        body, _ = m.exposition()
        scrapes.append(time.perf_counter() - t0)
    gc.collect()
    after = rss_mib()
    series = sum(1 for line in body.decode().splitlines() if line.startswith("flink_reconciler_app_"))
    return {"apps": n, "rss_before_mib": round(before, 1), "rss_after_mib": round(after, 1),
            "rss_delta_mib": round(after - before, 1), "hand_over_first_s": round(first, 3),
            "hand_over_next_s": round(again, 3), "alerter_tick_s": round(tick, 3),
            "scrape_median_s": round(statistics.median(scrapes), 3), "scrape_max_s": round(max(scrapes), 3),
            "body_kib": round(len(body) / 1024), "app_series": series, "firing": len(alerter.active())}


def pass_timing(apps: int, passes: int) -> list[dict[str, Any]]:
    out = []
    for mode in ("no sink", "ok", "500", "slow 2s", "down"):
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            repo = Repo(tmp)
            for i in range(apps):
                repo.write(f"apps/app-{i:04d}.yaml", spec(f"app-{i:04d}"))
            repo.commit("apps")
            records = tmp / "state" / "records"
            records.mkdir(parents=True)
            for i in range(0, apps, 5):
                (records / f"app-{i:04d}.json").write_text('{"truncated')
            receiver = HttpReceiver(status=500 if mode == "500" else 200, delay_s=2.0 if mode == "slow 2s" else 0.0)
            url = receiver.url
            if mode == "down":
                receiver.close()
            sinks = () if mode == "no sink" else (SinkConfig(name="hook", type="webhook", url=SecretStr(url)),)
            clock = SystemClock()
            metrics = Metrics()
            alerter = Alerter(AlertingSettings(sinks=sinks, queue_size=100, max_attempts=3, retry_backoff=0.5),
                              clock, metrics=metrics)  # a queue of 100 for 200 alerts at once: drops show
            metrics.add_listener(alerter)
            rec = Reconciler(source=GitSource(str(repo.origin), tmp / "state" / "git"), runtime=None,
                             journal=Journal(tmp / "state" / "journal", clock), clock=clock, subdir="apps",
                             metrics=metrics)
            durations = []
            for _ in range(passes):
                t0 = time.perf_counter()
                rec.sync(full=True, reason="bench")
                durations.append(time.perf_counter() - t0)
            time.sleep(1.0)

            def count(name: str, m: Metrics = metrics, **labels: str) -> int:
                return int(m.registry.get_sample_value(name, labels) or 0)

            out.append({"mode": mode, "apps": apps, "alerts": len(alerter.active()), "queued": alerter.pending(),
                        "pass_median_s": round(statistics.median(durations), 3),
                        "first_pass_s": round(durations[0], 3), "pass_max_s": round(max(durations), 3),
                        "sent": count("flink_reconciler_notifications_total", sink="hook", result="sent"),
                        "dropped_queue_full": count("flink_reconciler_notifications_dropped_total", sink="hook",
                                                    reason="queue_full"),
                        "dropped_failed": count("flink_reconciler_notifications_dropped_total", sink="hook",
                                                reason="failed")})
            alerter.close(0.1)
            if mode != "down":
                receiver.close()
    return out


def latency(samples: int) -> dict[str, Any]:
    receiver = HttpReceiver()
    alerter = Alerter(AlertingSettings(sinks=(SinkConfig(name="hook", type="webhook", url=SecretStr(receiver.url),
                                                         hmac_secret=SecretStr("k")),)), SystemClock())
    got = []
    for i in range(samples):
        f = AppFacts(app=f"a{i}", namespace="n", phase=Phase.BLOCKED, reason="blocked")
        n0 = len(receiver.got)
        t0 = time.monotonic()
        alerter.app_health([f], full=False)
        while len(receiver.got) == n0:
            time.sleep(0.0005)
        got.append(receiver.got[-1].at - t0)
    alerter.close(1)
    receiver.close()
    return {"samples": samples, "median_ms": round(statistics.median(got) * 1000, 2),
            "max_ms": round(max(got) * 1000, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--apps", type=int, default=10_000)
    ap.add_argument("--pass-apps", type=int, default=500)
    ap.add_argument("--passes", type=int, default=10)
    args = ap.parse_args()
    doc: dict[str, Any] = {"metrics": metrics_cost(args.apps), "passes": pass_timing(args.pass_apps, args.passes),
                           "latency": latency(50)}
    print(json.dumps(doc, indent=2))
    m = doc["metrics"]
    print(f"\n| apps | app series | RSS delta | hand-over (first / next pass) | alerter tick | scrape median / max |"
          f" body |\n| --- | --- | --- | --- | --- | --- | --- |\n| {m['apps']:,} | {m['app_series']:,} | "
          f"{m['rss_delta_mib']} MiB | {m['hand_over_first_s']} s / {m['hand_over_next_s']} s | "
          f"{m['alerter_tick_s']} s | {m['scrape_median_s']} s / {m['scrape_max_s']} s | {m['body_kib']} KiB |")
    print("\n| sink | pass median | first pass | max | sent | dropped (queue full) | dropped (failed) | queued |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in doc["passes"]:
        print(f"| {p['mode']} | {p['pass_median_s']} s | {p['first_pass_s']} s | {p['pass_max_s']} s | {p['sent']} | "
              f"{p['dropped_queue_full']} | {p['dropped_failed']} | {p['queued']} |")
    lat = doc["latency"]
    print(f"\nnotification latency (facts handed over -> receiver has it): median {lat['median_ms']} ms, "
          f"max {lat['max_ms']} ms over {lat['samples']}")


if __name__ == "__main__":
    main()
