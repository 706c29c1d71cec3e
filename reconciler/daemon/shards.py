"""Sharding: several daemons split the apps of one repository, each reconciling only its own.

An app belongs to shard `sha256(name) mod shards`. The name alone, not its file or its namespace: app
names are unique in a repository, a renamed file or a namespace change must not move an app to another
shard (two shards would then both act on it), and an app known only from a record, a broken spec or a
cluster left behind has nothing but its name. A shard's daemon sees only its own apps everywhere it
looks (specs, records, clusters), so its plan, its prune decisions and its mass-deletion guard count its
own apps only. Errors no app can be named for (an unreadable file) stay visible to every shard: such a
file may hold any shard's app, so it blocks deletions everywhere. A file whose lines plainly name
another shard's app is not even parsed (spec/prescan.py); a shard always parses the files its own apps
came from, so an app whose file broke or was renamed away is still protected by its own shard.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from reconciler.clock import Clock
from reconciler.service.sharding import Shard, shard_of

if TYPE_CHECKING:
    from reconciler.report.reporter import Reporter
    from reconciler.service.reconcile import Reconciler
    from reconciler.source.git import FetchResult, GitSource

log = logging.getLogger(__name__)


# ---- automatic sharding (`shard: auto`): replicas share the shards through one Lease per shard -----------


def member_lease_name(lease_name: str, identity: str) -> str:
    """`<lease_name>-member-<identity>` as a valid object name (lower case, DNS-1123 subdomain)."""
    safe = re.sub(r"[^a-z0-9.-]+", "-", identity.lower()).strip("-.") or "replica"
    return f"{lease_name}-member-{safe}"[:253].rstrip("-.")


def quota(shards: int, replicas: int) -> int:
    """The most shards one replica holds: ceil(shards / live replicas), so the replicas together can hold
    every shard, and none holds more than its fair part (5 shards, 2 replicas: 3 and 2)."""
    return -(-shards // max(1, replicas))


class ShardLeases:
    """The shard Leases one replica holds, kept by `tick()` every `retry_period` (the `run` thread).

    - Every shard `i` has a Lease `<lease_name>-shard-<i>`, held through the same `LeaseElector` as a single
      leader's (renew, expiry on our own monotonic clock, compare-and-set writes), and that Lease fences
      the records of the shard's apps (`lease_fence`).
    - Every replica keeps a membership Lease `<lease_name>-member-<identity>`; the live replicas R are the
      membership Leases renewed within their duration (as seen on our clock), and a replica holds at most
      `quota(shards, R)` shards. Below it, it takes free (released) shard Leases, and expired ones (a
      lost replica's) once they went unrenewed for the Lease duration; above it (a replica joined), it
      gives the surplus up, highest index first, between two passes of that shard (never mid-pass).
    - A first tick only announces the replica (no shard is taken), and a tick takes at most one shard, so
      replicas started together see each other before taking many shards (a lone replica holds all 5
      after 6 rounds, 12 s; a lost replica's shards are taken one per round by each taker).
    - `release_all()` (shutdown) gives every shard up and deletes the membership Lease, so the other
      replicas take the shards at their next tick instead of after expiry.
    """

    def __init__(self, api_client: Any, *, clock: Clock, namespace: str, lease_name: str, shards: int,
                 identity: str, lease_duration: float = 15.0, renew_deadline: float = 10.0,
                 retry_period: float = 2.0) -> None:
        from reconciler.live.kubernetes.lease import LeaseElector

        class _Elector(LeaseElector):
            def observe(self, lease: dict[str, Any] | None) -> None:
                """Note a Lease read in the shared LIST, so its expiry is timed even while we do not try
                to take it (a replica at its quota still sees how long a shard went unrenewed)."""
                spec = (lease or {}).get("spec") or {}
                seen = (spec.get("holderIdentity"), spec.get("renewTime"))
                if lease is not None and self._observed != seen and spec.get("holderIdentity") != self.identity:
                    self._observed, self._observed_at = seen, self.clock.monotonic()

        kw: dict[str, Any] = {"clock": clock, "namespace": namespace, "identity": identity,
                              "lease_duration": lease_duration, "renew_deadline": renew_deadline,
                              "retry_period": retry_period}
        self.shards, self.identity, self.namespace, self.lease_name = shards, identity, namespace, lease_name
        self.clock, self.lease_duration, self.retry_period = clock, lease_duration, retry_period
        self.electors = {i: _Elector(api_client, name=f"{lease_name}-shard-{i}", **kw) for i in range(shards)}
        self.member = LeaseElector(api_client, name=member_lease_name(lease_name, identity), **kw)
        self.kube = self.member.kube
        self._busy = {i: threading.Lock() for i in range(shards)}  # held while a pass of the shard runs
        self._surrender: set[int] = set()
        self._terms = dict.fromkeys(range(shards), 0)  # shard -> how many times this replica took it
        self._members: dict[str, tuple[tuple[Any, Any], float]] = {}  # lease -> ((holder, renewTime), seen at)
        self._live = 1
        self._ticks = 0
        self._stopped = False
        self._mutex = threading.RLock()
        self.on_taken: Callable[[int], None] | None = None  # called with each shard a round took
        self.last_error: str | None = None

    # ---- what the service asks --------------------------------------------------------------------

    def holds(self, shard: int) -> bool:
        """Whether this replica may reconcile the shard now (its Lease held, not being given up)."""
        return shard not in self._surrender and self.electors[shard].is_leader()

    def held(self) -> frozenset[int]:
        return frozenset(i for i in self.electors if self.holds(i))

    def term(self, shard: int) -> int:
        """Changes each time this replica takes the shard (again): what it knew of it before is stale."""
        return self._terms[shard]

    @contextlib.contextmanager
    def reconciling(self, shard: int) -> Iterator[bool]:
        """Around one pass of a shard: yields whether it is still ours; the shard is not given up meanwhile."""
        with self._busy[shard]:
            yield self.holds(shard)

    def describe(self) -> str:
        held = sorted(self.held())
        return (f"holds shard(s) {', '.join(map(str, held)) or 'none'} of {self.shards}; "
                f"{self._live} live replica(s), at most {quota(self.shards, self._live)} shard(s) each")

    # ---- the election loop ------------------------------------------------------------------------

    def tick(self) -> None:
        """One round: announce ourselves, renew what we hold, give up the surplus, take what is free."""
        from reconciler.live.kubernetes.api import KubernetesApiError, KubernetesUnavailableError

        taken: list[int] = []
        with self._mutex:
            if self._stopped:
                return
            self._ticks += 1
            self.member.try_acquire_or_renew()
            for i in sorted(self._surrender | {i for i, el in self.electors.items() if el.is_leader()}):
                self.electors[i].try_acquire_or_renew()
            try:
                items = self.kube.request("GET", self.kube.path("Lease", self.namespace)).get("items", [])
                leases: dict[str, dict[str, Any]] = {str((o.get("metadata") or {}).get("name") or ""): o
                                                     for o in items}
            except (KubernetesApiError, KubernetesUnavailableError) as e:
                self.last_error = f"cannot list the Leases in {self.namespace}: {e}"
                log.warning("shard leases: %s", self.last_error)
                return
            self.last_error = None
            self._live = self._count_members(leases)
            limit = quota(self.shards, self._live)
            mine = sorted(i for i, el in self.electors.items() if el.is_leader())
            self._surrender &= set(mine)
            keep = [i for i in mine if i not in self._surrender]
            for i in reversed(keep[limit:]):
                log.info("shard leases: %d live replicas, at most %d shards each: giving shard %d up",
                         self._live, limit, i)
                self._surrender.add(i)
            for i in sorted(self._surrender):
                if self._busy[i].acquire(blocking=False):  # not between two steps of a pass of it
                    try:
                        self.electors[i].release()
                        self._surrender.discard(i)
                    finally:
                        self._busy[i].release()
            for i, el in self.electors.items():
                if i not in mine:
                    el.observe(leases.get(el.name))
            if self._ticks < 2:
                return  # announced; take shards from the next tick on, once the others saw us
            # One shard per round: replicas starting together (or one slow to start) do not grab every
            # shard before they see each other, and a replica's first passes come one shard at a time.
            free = min(1, limit - len([i for i in mine if i not in self._surrender]))
            start = shard_of(self.identity, self.shards)  # replicas starting together try different shards first
            for k in range(self.shards):
                if free <= 0:
                    break
                i = (start + k) % self.shards
                if i in mine:
                    continue
                if self.electors[i].try_acquire_or_renew():
                    log.info("shard leases: %s took shard %d of %d", self.identity, i, self.shards)
                    self._terms[i] += 1
                    free -= 1
                    taken.append(i)
        for i in taken:  # outside the mutex: the service asks the daemon for a pass of it
            if self.on_taken is not None:
                self.on_taken(i)

    def _count_members(self, leases: dict[str, dict[str, Any]]) -> int:
        """Live replicas: our own membership plus every other one renewed within its duration on our clock.
        Membership Leases unrenewed for ten durations (replicas gone for good) are deleted."""
        from reconciler.live.kubernetes.api import KubernetesApiError, KubernetesUnavailableError

        now = self.clock.monotonic()
        prefix = f"{self.lease_name}-member-"
        live = 1
        for name, lease in leases.items():
            if not name or not name.startswith(prefix) or name == self.member.name:
                continue
            spec = lease.get("spec") or {}
            seen = (spec.get("holderIdentity"), spec.get("renewTime"))
            old = self._members.get(name)
            at = old[1] if old and old[0] == seen else now
            self._members[name] = (seen, at)
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if seen[0] and now - at < duration:
                live += 1
            elif now - at >= 10 * duration:
                rv = (lease.get("metadata") or {}).get("resourceVersion")
                try:
                    self.kube.request("DELETE", self.kube.path("Lease", self.namespace, name),
                                      body={"apiVersion": "v1", "kind": "DeleteOptions",
                                            "preconditions": {"resourceVersion": rv}})
                    self._members.pop(name, None)
                except (KubernetesApiError, KubernetesUnavailableError) as e:
                    log.debug("could not delete the stale membership Lease %s: %s", name, e)
        for name in set(self._members) - set(leases):
            del self._members[name]
        return live

    def release_all(self, *, timeout: float | None = None) -> None:
        """Shutdown: give every shard up and leave (others take the shards at their next tick). A shard
        whose pass is still running after `timeout` seconds is not released: two replicas would then act
        on it at once. Its Lease expires instead, and its next holder resumes the pass from the records."""
        from reconciler.live.kubernetes.api import KubernetesApiError, KubernetesUnavailableError

        until = None if timeout is None else time.monotonic() + timeout
        with self._mutex:
            self._stopped = True
            for i, el in self.electors.items():
                if not el.is_leader():
                    continue
                if not self._busy[i].acquire(timeout=-1 if until is None else max(0.0, until - time.monotonic())):
                    log.warning("shutdown: a pass of shard %d is still running; its Lease is left to expire "
                                "(its next holder resumes from the records)", i)
                    continue
                try:
                    el.release()
                finally:
                    self._busy[i].release()
            self._surrender.clear()
            try:
                self.kube.request("DELETE", self.kube.path("Lease", self.namespace, self.member.name))
            except (KubernetesApiError, KubernetesUnavailableError) as e:
                log.warning("could not delete membership Lease %s: %s", self.member.name, e)

    def run(self, stop: threading.Event) -> None:
        """Tick every `retry_period` until `stop` is set. Releasing is the service's (after its pass)."""
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # the election must outlive a bug in one round; holds() expires on its own
                log.exception("shard leases: a round failed")
            stop.wait(self.retry_period)


class _FetchedOnce:
    """The Git source as a shard's Reconciler sees it: `fetch()` answers what the replica fetched for this
    sync (one `git ls-remote` per poll for the replica, not one per shard it holds)."""

    def __init__(self, source: GitSource) -> None:
        self._source = source
        self.result: FetchResult | None = None

    def fetch(self) -> FetchResult:
        assert self.result is not None, "the sharded service fetches before its shards sync"
        return self.result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)


class ShardedService:
    """`shard: auto`: the daemon's service is the set of shards this replica holds, one Reconciler each.

    Each shard's Reconciler is the one of `shard: i` with leader election: it loads, sees, plans and
    prunes only its shard's apps (mass-deletion guard per shard), and its records are fenced by its
    shard's Lease. A shard taken gets a new Reconciler and a full pass at once; a shard lost or
    given up is dropped with everything it held. Passes of the held shards run one after the other in
    the sync thread; the Leases are kept by `ShardLeases.run` in their own thread."""

    def __init__(self, leases: ShardLeases, source: GitSource, make_shard: Callable[[Shard, GitSource], Reconciler],
                 *, reporter: Reporter | None = None, stop_leases: Callable[[], None] | None = None) -> None:
        self.leases = leases
        self.source = source
        self._shared = _FetchedOnce(source)
        self._make = make_shard
        self.reporter = reporter
        self._stop_leases = stop_leases
        self._recs: dict[int, tuple[int, Reconciler]] = {}  # shard -> (the term it was built in, its Reconciler)
        self._lock = threading.Lock()
        self._stopping = False

    def reconcilers(self) -> dict[int, Reconciler]:
        return {i: rec for i, (_, rec) in self._recs.items()}

    def ask_for_passes_with(self, request: Callable[[str], None]) -> None:
        """A shard taken gets its first pass at once, not at the next poll (up to a poll interval later):
        after a replica was lost, its apps wait out the Lease duration already."""
        self.leases.on_taken = lambda i: request(f"shard {i} taken")

    def sync(self, *, full: bool, reason: str) -> None:
        with self._lock:
            if self._stopping:
                return
            held = self.leases.held()
            for i in sorted(self._recs):
                if i not in held or self._recs[i][0] != self.leases.term(i):  # lost, maybe taken again since
                    log.info("shard %d is no longer ours (or was lost and taken again): dropping what this "
                             "replica knew of it", i)
                    self._recs[i][1].drop_states()
                    del self._recs[i]
            if not held:
                log.debug("standby: no shard held (%s); not reconciling (%s)", self.leases.describe(), reason)
                return
            self._shared.result = self.source.fetch()
            failed: list[tuple[int, Exception]] = []
            for i in sorted(held):
                if i in self._recs:
                    rec = self._recs[i][1]
                else:
                    log.info("shard %d of %d is ours now: a full pass of its apps", i, self.leases.shards)
                    rec = self._make(Shard(i, self.leases.shards), cast("GitSource", self._shared))
                    self._recs[i] = (self.leases.term(i), rec)
                with self.leases.reconciling(i) as mine:
                    if not mine:
                        continue
                    try:
                        rec.sync(full=full, reason=reason)
                    except Exception as e:  # the other shards still get their pass
                        log.error("shard %d: the pass failed: %s: %s", i, type(e).__name__, e)
                        failed.append((i, e))
            if failed:
                raise failed[0][1]

    def status_text(self) -> str:
        """The app lines of every shard this replica holds."""
        return "".join(rec.status_text() for _, (_, rec) in sorted(self._recs.items())) or "apps: no shard held\n"

    def readiness(self) -> tuple[bool, str]:
        recs = {i: r for i, (_, r) in sorted(self._recs.items()) if self.leases.holds(i)}
        if self.leases.last_error:
            return False, f"shard leases: {self.leases.last_error}"
        for i, rec in recs.items():
            ok, why = rec.readiness()
            if not ok:
                return False, f"shard {i}: {why}"
        return True, f"ok: {self.leases.describe()}"

    def shutdown(self, *, deadline_s: float) -> None:
        """Finish the running pass, then give every shard up (the others take them at once), then flush
        the statuses. A pass still running at the deadline resumes from its records on the new holder."""
        self._stopping = True
        until = time.monotonic() + max(0.0, deadline_s)
        if self._lock.acquire(timeout=max(0.0, deadline_s)):
            self._lock.release()
        else:
            log.warning("shutdown: a pass is still running after %.0fs; its shard's next holder resumes it",
                        deadline_s)
        if self._stop_leases is not None:
            self._stop_leases()
        self.leases.release_all(timeout=max(0.0, until - time.monotonic()))
        if self.reporter is not None:
            self.reporter.close(timeout=min(5.0, max(0.1, deadline_s)))
