"""`flink-reconciler run` in one call: lock the state dir, build the service, run the daemon.

The CLI parses flags into Settings and sets up logging; this takes it from there. The service is built
by a factory *after* the lock is held, so a second daemon never opens the journal at all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from reconciler.alerting.alerter import Alerter
from reconciler.clock import Clock, SystemClock
from reconciler.daemon.lock import DaemonLock
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.ports import ReconcileService
from reconciler.daemon.scheduler import Daemon
from reconciler.daemon.shards import ShardedService, ShardLeases
from reconciler.errors import ConfigError
from reconciler.memory import limit_arenas, tune_gc
from reconciler.service.sharding import Shard, ShardRecordStore
from reconciler.settings import Settings

if TYPE_CHECKING:
    from reconciler.source.git import GitSource

log = logging.getLogger(__name__)

ServiceFactory = Callable[[Settings, Metrics, Clock], ReconcileService]


def make_service(settings: Settings, metrics: Metrics, clock: Clock) -> ReconcileService:
    """The daemon's service: one Reconciler (its shard's with `shard: i`), or with `shard: auto` the set
    of shards this replica holds through their Leases (daemon/shards.py)."""
    from reconciler.service.factories import make_reconciler

    if settings.shard == "auto":
        return make_auto_sharded(settings, metrics, clock)
    return make_reconciler(settings, clock, metrics=metrics)


def make_auto_sharded(settings: Settings, metrics: Metrics | None, clock: Clock) -> ShardedService:
    """`shard: auto`: the shard Leases (in `lease_namespace`, default $POD_NAMESPACE) kept by a thread,
    and per held shard a Reconciler whose records are fenced by that shard's Lease."""
    import threading

    from reconciler.apply.journal import Journal
    from reconciler.live.kubernetes.runtime import KubernetesRuntime
    from reconciler.service.autoscale import Autoscaler
    from reconciler.service.factories import (
        kubernetes_runtime,
        lease_identity,
        make_policy,
        make_record_store,
        make_reporter,
        make_runtime,
        make_source,
    )
    from reconciler.service.reconcile import Reconciler
    from reconciler.spec.policy import SpecPolicy

    if settings.runtime != "kubernetes":
        raise ConfigError("shard: auto needs runtime: kubernetes (the shards are Kubernetes Leases, and a shard's "
                          "records must be readable by whichever replica takes it); with runtime: local give each "
                          "daemon shard: <i>")
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    runtime = make_runtime(settings, clock)
    # A dry run has no runtime but still needs the API server for the Leases.
    api = kubernetes_runtime(runtime) or kubernetes_runtime(make_runtime(
        settings.model_copy(update={"dry_run": False}), clock))
    assert isinstance(api, KubernetesRuntime)
    namespace, identity = lease_identity(settings)
    leases = ShardLeases(api.kube.api_client, clock=clock, namespace=namespace, lease_name=settings.lease_name,
                         shards=settings.shards, identity=identity)
    source = make_source(settings)
    reporter = make_reporter(settings, source, clock)

    def make_shard(shard: Shard, shard_source: GitSource) -> Reconciler:
        elector = leases.electors[shard.index]
        store = ShardRecordStore(make_record_store(settings, runtime, elector), shard)
        rec = Reconciler(
            source=shard_source, runtime=runtime, journal=Journal(settings.state_dir / "journal", clock, store=store),
            clock=clock, subdir=settings.path, shard=shard,
            # the Lease, not `holds`: a pass of a shard being given up still holds it (release waits for the pass)
            # and must report what it did; new passes are gated by `leases.reconciling`
            leader=elector.is_leader,
            policy=make_policy(settings),
            reporter=reporter, metrics=metrics, target_url=settings.status_target_url,
            max_parallel=settings.max_parallel, runtime_name=settings.runtime,
            spec_policy=SpecPolicy(settings.spec_policy))
        if runtime is not None:  # spec.autoscale, for this shard's apps
            rec.autoscaler = Autoscaler(rec, metrics=metrics)
        return rec

    stop = threading.Event()
    threading.Thread(target=leases.run, args=(stop,), name="shard-leases", daemon=True).start()
    log.info("automatic sharding: %d shards, Leases %s-shard-<i> in namespace %s, identity %s",
             settings.shards, settings.lease_name, namespace, identity)
    return ShardedService(leases, source, make_shard, reporter=reporter, stop_leases=stop.set)


def run(settings: Settings, make_service: ServiceFactory, *, clock: Clock | None = None) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the process exit code (exits at once when a pass outlives the
    shutdown deadline). Raises ConfigError early."""
    if not settings.repo_url:
        raise ConfigError("`run` needs a repository: --repo or FLINK_RECONCILER_REPO_URL")
    clock = clock if clock is not None else SystemClock()
    limit_arenas()  # before any thread of the daemon allocates
    tune_gc()
    with DaemonLock(settings.state_dir) as lock:
        log.info("starting flink-reconciler daemon", extra={"lock": str(lock.path), "settings": settings.redacted()})
        metrics = Metrics()
        alerter = make_alerter(settings, metrics, clock)
        service = make_service(settings, metrics, clock)
        code = Daemon(service, settings, metrics, clock, alerter=alerter).run_forever()
    if code != 0:
        exit_now(code)
    return code


def make_alerter(settings: Settings, metrics: Metrics, clock: Clock) -> Alerter:
    """The alerter, told every pass's facts through the metrics; it notifies the configured sinks, if any."""
    alerter = Alerter(settings.alerting, clock, metrics=metrics)
    metrics.add_listener(alerter)
    if settings.alerting.sinks:
        log.info("notifications: %s", ", ".join(f"{s.name} ({s.type})" for s in settings.alerting.sinks))
    return alerter


def exit_now(code: int) -> NoReturn:
    """A pass still ran at the shutdown deadline (a step retrying, a JVM slow to stop): exit anyway, as the
    kubelet's SIGKILL would a little later. Every step is journaled, so the next start resumes it. Returning
    would leave the interpreter waiting for the pass's worker threads, and the process ignoring SIGTERM."""
    log.warning("exiting with a pass still running: its current step resumes from the journal on the next start")
    logging.shutdown()
    os._exit(code)
