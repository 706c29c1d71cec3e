"""Leader election on a Kubernetes Lease: which replica of the reconciler may act on the apps.

Its own module, not part of the runtime: the daemon's election, the shard leases (daemon/shards.py) and
the fencing of record writes (records) use it, and none of them runs an app's cluster.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from reconciler.clock import Clock
from reconciler.errors import ShutdownRequested
from reconciler.live.kubernetes.api import ApiClient, Kube, KubernetesApiError, KubernetesUnavailableError, Obj

log = logging.getLogger(__name__)


def _micro_time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Leader election on a coordination.k8s.io/v1 Lease, like client-go's leaderelection.

    - A candidate takes the lease when it is absent, or when its holder has not renewed it for
      `lease_duration` seconds *as measured on our own monotonic clock* since we last saw it change
      (no comparison of wall clocks across machines).
    - Every write carries the resourceVersion we read, so of two candidates racing for one lease the
      API server lets exactly one win (the other gets 409 Conflict).
    - `is_leader()` turns false at once when a renew fails or the lease was taken, and also when the
      last successful renew is older than `renew_deadline` (we may have been partitioned away).
    """

    def __init__(self, api_client: ApiClient, *, clock: Clock, namespace: str, name: str,
                 identity: str, lease_duration: float = 15.0, renew_deadline: float = 10.0,
                 retry_period: float = 2.0) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.kube = Kube(api_client, timeout=max(1.0, retry_period))
        self.clock = clock
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self._leader = False
        self._renewed_at: float | None = None
        self._observed: tuple[str | None, str | None] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self.last_error: str | None = None

    def is_leader(self) -> bool:
        if not self._leader or self._renewed_at is None:
            return False
        if self.clock.monotonic() - self._renewed_at >= self.renew_deadline:
            self._leader = False
        return self._leader

    def holder(self) -> str | None:
        return self._observed[0] if self._observed else None

    def try_acquire_or_renew(self) -> bool:
        """One election step; call it every `retry_period`. Returns is_leader()."""
        path = self.kube.path("Lease", self.namespace, self.name)
        now_wall = self.clock.now()
        now = self.clock.monotonic()
        try:
            lease = self.kube.get("Lease", self.namespace, self.name)
            if lease is None:
                self.kube.request("POST", self.kube.path("Lease", self.namespace), body=self._body(None, 0, now_wall))
                return self._won(now, "acquired a new lease")
            spec = lease.get("spec") or {}
            holder, renew = spec.get("holderIdentity"), spec.get("renewTime")
            if self._observed != (holder, renew):
                self._observed, self._observed_at = (holder, renew), now
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if holder and holder != self.identity and now - self._observed_at < duration:
                return self._lost(f"held by {holder}")
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
            body = self._body(lease, transitions, now_wall)
            if holder == self.identity:
                body["spec"]["acquireTime"] = spec.get("acquireTime") or body["spec"]["acquireTime"]
            self.kube.request("PUT", path, body=body)
            return self._won(now, "renewed" if holder == self.identity else f"took over from {holder or 'nobody'}")
        except KubernetesApiError as e:  # 409: someone else wrote first; anything else: cannot renew
            return self._lost(str(e))
        except KubernetesUnavailableError as e:
            return self._lost(str(e))

    def release(self) -> None:
        """Give the lease up (on shutdown) so a standby takes over without waiting for expiry."""
        if not self.is_leader():
            return
        lease = self.kube.get("Lease", self.namespace, self.name)
        self._leader = False
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        body = self._body(lease, int(lease["spec"].get("leaseTransitions") or 0), self.clock.now())
        body["spec"]["holderIdentity"] = None
        body["spec"]["leaseDurationSeconds"] = 1
        try:
            self.kube.request("PUT", self.kube.path("Lease", self.namespace, self.name), body=body)
        except (KubernetesApiError, KubernetesUnavailableError) as e:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, e)

    def _body(self, lease: Obj | None, transitions: int, now: datetime) -> Obj:
        meta: Obj = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": {
            "holderIdentity": self.identity, "leaseDurationSeconds": round(self.lease_duration),
            "acquireTime": _micro_time(now), "renewTime": _micro_time(now), "leaseTransitions": transitions}}

    def _won(self, now: float, how: str) -> bool:
        if not self._leader:
            log.info("leader election %s/%s: %s is now leader (%s)", self.namespace, self.name, self.identity, how)
        self._leader, self._renewed_at, self.last_error = True, now, None
        self._observed, self._observed_at = (self.identity, None), now
        return True

    def _lost(self, why: str) -> bool:
        if self._leader:
            log.warning("leader election %s/%s: %s lost the lease: %s", self.namespace, self.name, self.identity, why)
        self._leader, self.last_error = False, why
        return False

    def run(self, stop: Any) -> None:
        """Loop until `stop.is_set()` (a threading.Event), then release the lease."""
        while not stop.is_set():
            self.try_acquire_or_renew()
            try:
                self.clock.sleep(self.retry_period)
            except ShutdownRequested:  # the process stops: keep renewing until the service lets the lease go
                stop.wait(self.retry_period)
        self.release()

