"""Kubernetes API requests for app records per idle reconcile pass, for 10, 100 and 1,000 apps.

Writes one record per app (a ConfigMap each, as after a first pass) into the loopback stand-in API server,
then runs what an idle pass does with records, on a fresh journal (a new pod) and again on the warm one:
`records()` (the planner's input), `set_source_file` for every app (unchanged: must not write),
`record_attempt` for a blocked app (unchanged: must not write), `all_inflight()`. Prints JSON and a
Markdown table. Target: a constant number of requests (one LIST per namespace), zero writes.

    .venv/bin/python -m bench.records_requests [--apps 10,100,1000] [--namespaces 1]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.live.kubernetes.api import Kube
from reconciler.live.kubernetes.records import ConfigMapRecordStore
from tests.kubernetes.standin import Standin

REV = "1" * 40


def _idle_pass(journal: Journal, names: list[str]) -> int:
    journal.records()
    for name in names:
        journal.set_source_file(name, f"apps/{name}.yaml")
    journal.record_attempt(names[0], REV, Outcome.FAILURE, "blocked: waiting for a human", action="blocked")
    return len(journal.all_inflight())


def measure(standin: Standin, n_apps: int, n_namespaces: int) -> dict[str, Any]:
    cfg = k8s_client.Configuration()
    cfg.host = standin.url
    kube = Kube(k8s_client.ApiClient(cfg))
    namespaces = [f"records-{n_apps}-{i}" for i in range(n_namespaces)]
    clock = FakeClock()
    names = [f"app-{i}" for i in range(n_apps)]
    first = Journal(Path("/nonexistent/journal"), clock, store=ConfigMapRecordStore(kube, namespaces))
    for i, name in enumerate(names):  # what the first pass leaves: a record per app, in the app's namespace
        first.store.put(name, {"kind": "FlinkReconcilerRecord", "version": 1, "app": name,
                               "namespace": namespaces[i % n_namespaces], "forgotten": False,
                               "record": {"attempts": 0}, "savepoints": [], "inflight": None,
                               "transitions": [], "lineage": []}, expected=None)
    _idle_pass(first, names)  # the blocked app's attempt is written once, here
    rows: dict[str, Any] = {"apps": n_apps, "namespaces": n_namespaces}
    for label, journal in (("new pod", Journal(Path("/x/journal"), clock,
                                                 store=ConfigMapRecordStore(kube, namespaces))),
                           ("warm", first)):
        standin.api.reset_log()
        t0 = time.perf_counter()
        _idle_pass(journal, names)
        seconds = time.perf_counter() - t0
        counts = standin.api.counts()
        rows[label] = {"requests": sum(counts.values()), "by_verb": counts, "seconds": round(seconds, 3)}
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--apps", default="10,100,1000")
    p.add_argument("--namespaces", type=int, default=1)
    args = p.parse_args()
    rows = []
    with Standin() as standin:
        for n in [int(x) for x in args.apps.split(",")]:
            rows.append(measure(standin, n, args.namespaces))
    print(json.dumps(rows, indent=2))
    print()
    print("| apps | namespaces | requests, new pod | requests, warm | writes | idle pass time, warm (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        writes = sum(v for k, v in {**r["new pod"]["by_verb"], **r["warm"]["by_verb"]}.items()
                     if not k.startswith(("list ", "get ")))
        print(f"| {r['apps']} | {r['namespaces']} | {r['new pod']['requests']} | {r['warm']['requests']} "
              f"| {writes} | {r['warm']['seconds']} |")


if __name__ == "__main__":
    main()
