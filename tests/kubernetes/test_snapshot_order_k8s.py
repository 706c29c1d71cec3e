"""Issue 35: the `stored_snapshots` contract (tests/live/snapshot_contract.py: newest first) on Kubernetes.

This runtime lists no storage yet: an app's savepoints and checkpoints are in its object store (s3://...), out of
the reconciler's reach, so its answer is the empty list, which keeps the contract; the evidence of a past comes from
the records and from Flink's REST API. The case is here so a listing added later is held to the same order."""

from __future__ import annotations

import pytest

from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.observe import observe
from tests.kubernetes.apps import app
from tests.kubernetes.conftest import Cluster
from tests.live.snapshot_contract import assert_newest_first

pytestmark = pytest.mark.kubernetes


def test_the_kubernetes_runtime_keeps_the_snapshot_order_contract(cluster: Cluster) -> None:
    rt = KubernetesRuntime(cluster.api_client, clock=cluster.clock, namespaces=[cluster.namespace],
                           poll_interval=cluster.poll, revision="rev-1")
    a = app("counter", cluster.namespace)
    rt.ensure_cluster(a, deadline=cluster.clock.monotonic() + (120 if cluster.real else 10))
    found = rt.stored_snapshots(a.name)
    assert_newest_first(found, None)
    assert found == [], "an object store is out of reach: nothing is listed (and nothing made up)"
    live = observe(rt, [a.name]).get(a.name)
    assert live.stored_savepoint is None and live.stored_checkpoint is None and live.evidence_error is None
