"""Leader election on a coordination.k8s.io/v1 Lease (stand-in by default, real cluster opt-in)."""

from __future__ import annotations

import threading

import pytest

from reconciler.clock import FakeClock
from reconciler.live.kubernetes.api import KubernetesApiError
from reconciler.live.kubernetes.lease import LeaseElector
from tests.kubernetes.conftest import Cluster

pytestmark = pytest.mark.kubernetes


def elector(c: Cluster, identity: str, name: str = "flink-reconciler", clock: FakeClock | None = None) -> LeaseElector:
    return LeaseElector(c.api_client, clock=clock or c.clock, namespace=c.namespace, name=name, identity=identity,
                        lease_duration=15, renew_deadline=10, retry_period=2)


@pytest.fixture
def fake(cluster: Cluster) -> FakeClock:
    if not isinstance(cluster.clock, FakeClock):
        pytest.skip("expiry is tested with a FakeClock (a real cluster would need 15 s of real waiting)")
    return cluster.clock


def test_first_candidate_acquires_the_second_waits(cluster: Cluster) -> None:
    a, b = elector(cluster, "pod-a"), elector(cluster, "pod-b")
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and not b.is_leader()
    assert b.holder() == "pod-a" and b.last_error == "held by pod-a"
    lease = cluster.kube.get("Lease", cluster.namespace, "flink-reconciler")
    assert lease is not None and lease["spec"]["holderIdentity"] == "pod-a"
    assert lease["spec"]["leaseDurationSeconds"] == 15


def test_renewal_keeps_the_lease_and_expiry_hands_it_over(cluster: Cluster, fake: FakeClock) -> None:
    a, b = elector(cluster, "pod-a"), elector(cluster, "pod-b")
    assert a.try_acquire_or_renew()
    for _ in range(10):  # a renews every 2 s: b never sees it expire
        fake.advance(2)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    fake.advance(14)  # a stops renewing (crashed, partitioned)...
    assert not b.try_acquire_or_renew()  # ...not yet expired on b's own clock
    assert not a.is_leader()  # a's renew deadline (10 s) has passed: it stops on its own
    fake.advance(2)
    assert b.try_acquire_or_renew() and b.is_leader()
    lease = cluster.kube.get("Lease", cluster.namespace, "flink-reconciler")
    assert lease is not None and lease["spec"]["holderIdentity"] == "pod-b" and lease["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew() and not a.is_leader()  # a comes back: it is a follower now


def test_losing_the_lease_turns_is_leader_false_at_once(cluster: Cluster) -> None:
    a = elector(cluster, "pod-a")
    assert a.try_acquire_or_renew()
    lease = cluster.kube.get("Lease", cluster.namespace, "flink-reconciler")
    assert lease is not None
    lease["spec"]["holderIdentity"] = "intruder"  # someone else wrote the lease
    cluster.kube.request("PUT", cluster.kube.path("Lease", cluster.namespace, "flink-reconciler"), body=lease)
    assert not a.try_acquire_or_renew()
    assert not a.is_leader() and "held by intruder" in (a.last_error or "")


def test_a_stale_resource_version_is_refused(cluster: Cluster) -> None:
    """The optimistic concurrency the election relies on: a write based on an old read gets 409."""
    a = elector(cluster, "pod-a")
    assert a.try_acquire_or_renew()
    stale = cluster.kube.get("Lease", cluster.namespace, "flink-reconciler")
    assert a.try_acquire_or_renew()  # moves the resourceVersion on (renewTime changes on a real clock)
    if isinstance(cluster.clock, FakeClock):
        cluster.clock.advance(1)
        assert a.try_acquire_or_renew()
    assert stale is not None
    stale["spec"]["holderIdentity"] = "pod-b"
    with pytest.raises(KubernetesApiError) as e:
        cluster.kube.request("PUT", cluster.kube.path("Lease", cluster.namespace, "flink-reconciler"), body=stale)
    assert e.value.code == 409 and "the object has been modified" in e.value.api_message


@pytest.mark.parametrize("round_", range(8))
def test_two_racing_candidates_never_both_win(cluster: Cluster, round_: int) -> None:
    name = f"race-{round_}"
    clock = FakeClock()
    candidates = [elector(cluster, f"pod-{i}", name=name, clock=clock) for i in range(2)]
    barrier = threading.Barrier(len(candidates))
    results: dict[str, bool] = {}

    def run(e: LeaseElector) -> None:
        barrier.wait()
        results[e.identity] = e.try_acquire_or_renew()

    threads = [threading.Thread(target=run, args=(e,)) for e in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results.values()) == [False, True]
    winner = next(i for i, won in results.items() if won)
    lease = cluster.kube.get("Lease", cluster.namespace, name)
    assert lease is not None and lease["spec"]["holderIdentity"] == winner


def test_release_lets_a_standby_take_over_without_waiting(cluster: Cluster) -> None:
    a, b = elector(cluster, "pod-a"), elector(cluster, "pod-b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader()
    assert b.try_acquire_or_renew() and b.is_leader()


def test_timing_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        LeaseElector(None, clock=FakeClock(), namespace="n", name="l", identity="i",  # type: ignore[arg-type]
                     lease_duration=10, renew_deadline=10, retry_period=2)
