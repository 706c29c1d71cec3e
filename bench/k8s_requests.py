"""Kubernetes API requests per reconcile cycle with nothing to do, for 10, 100 and 1,000 apps.

Creates N apps (ensure_cluster, with the stand-in's controllers making every workload available) in
one namespace of the loopback stand-in API server, then measures one `list_clusters()` (the observe
step of a cycle). Prints JSON and a Markdown table. Target: a constant number of list requests.

    .venv/bin/python -m bench.k8s_requests [--apps 10,100,1000] [--namespaces 1]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from kubernetes import client as k8s_client

from reconciler.clock import FakeClock
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from tests.kubernetes.apps import app
from tests.kubernetes.standin import Standin


def measure(standin: Standin, n_apps: int, n_namespaces: int) -> dict[str, Any]:
    cfg = k8s_client.Configuration()
    cfg.host = standin.url
    namespaces = [f"bench-{n_apps}-{i}" for i in range(n_namespaces)]
    rt = KubernetesRuntime(k8s_client.ApiClient(cfg), clock=FakeClock(), namespaces=namespaces)
    for i in range(n_apps):
        a = app(f"app-{i}", namespaces[i % n_namespaces])
        rt.apply(rt.render(a, job_id=f"{i:032x}"))
    standin.api.reset_log()
    t0 = time.perf_counter()
    infos = rt.list_clusters()
    seconds = time.perf_counter() - t0
    counts = standin.api.counts()
    assert len(infos) == n_apps and all(i.phase.value == "ready" for i in infos.values()), "setup not ready"
    return {"apps": n_apps, "namespaces": n_namespaces, "requests": sum(counts.values()),
            "lists": sum(v for k, v in counts.items() if k.startswith("list ")), "by_kind": counts,
            "list_clusters_seconds": round(seconds, 3)}


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
    print("| apps | namespaces | requests per cycle | of which lists | list_clusters time (s) |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['apps']} | {r['namespaces']} | {r['requests']} | {r['lists']} | {r['list_clusters_seconds']} |")


if __name__ == "__main__":
    main()
