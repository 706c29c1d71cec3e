"""Building the application from settings: the runtime, the record store, the reporter, the leader election
and the `Reconciler` over them. `apply`, `plan --live`, `status`, `rollback` and the daemon all start here.

Runtime clients are imported lazily: a local or dry-run process never loads the Kubernetes client.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from reconciler.apply.executor import StepEvent
from reconciler.apply.journal import Journal
from reconciler.apply.migrate import migrate_sqlite_journal
from reconciler.clock import Clock
from reconciler.core.planner import Policy
from reconciler.errors import ConfigError
from reconciler.live.ports import Runtime
from reconciler.live.records import FileRecordStore, RecordStore
from reconciler.report.reporter import Reporter
from reconciler.service.ports import AutoscaleMetrics, PassMetrics
from reconciler.service.reconcile import Reconciler
from reconciler.service.sharding import Shard, ShardRecordStore, shard_of
from reconciler.settings import Settings
from reconciler.source.git import GitSource
from reconciler.spec.policy import SpecPolicy

if TYPE_CHECKING:
    from reconciler.live.kubernetes.lease import LeaseElector
    from reconciler.live.kubernetes.runtime import KubernetesRuntime




def make_runtime(settings: Settings, clock: Clock) -> Runtime | None:
    if settings.dry_run:
        return None
    if settings.runtime == "local":
        from reconciler.live.local.runtime import LocalRuntime
        from reconciler.live.session import SessionRuntime

        # FlinkSessionClusters: session apps' jobs on shared clusters, every other app as before
        return SessionRuntime(LocalRuntime(settings.state_dir, clock=clock), clock)
    import os

    from reconciler.live.kubernetes.runtime import KubernetesRuntime
    from reconciler.live.kubernetes.session_runtime import KubernetesSessionRuntime

    # FlinkSessionClusters: session apps' jobs on shared clusters, every other app as before
    kw: dict[str, Any] = {"clock": clock, "namespaces": settings.namespaces, "rest_via": settings.rest_via}
    if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return KubernetesSessionRuntime(KubernetesRuntime.in_cluster(**kw), clock)
    return KubernetesSessionRuntime(KubernetesRuntime.from_kubeconfig(
        str(settings.kubeconfig) if settings.kubeconfig else None, **kw), clock)


def kubernetes_runtime(runtime: Runtime | None) -> KubernetesRuntime | None:
    """The KubernetesRuntime `runtime` is, or wraps (live/session.py), or None."""
    k8s = sys.modules.get("reconciler.live.kubernetes.runtime")  # imported only when a KubernetesRuntime exists
    if k8s is None:
        return None
    inner = getattr(runtime, "host", runtime)
    return inner if isinstance(inner, k8s.KubernetesRuntime) else None


def make_reporter(settings: Settings, source: GitSource, clock: Clock) -> Reporter | None:
    sink_name = settings.status_sink
    if sink_name == "none":
        return None
    if sink_name == "notes":
        from reconciler.report.gitnotes import GitNotesSink, shard_notes_ref

        shards = settings.shards
        if shards <= 1:
            return Reporter([GitNotesSink(source)], clock)
        return Reporter([GitNotesSink(source, ref_for=lambda app: shard_notes_ref(shard_of(app, shards)))], clock)
    token = settings.forge_token
    if not token or not settings.forge_repo:
        raise ConfigError(f"status sink {sink_name} needs forge_token and forge_repo")
    owner, _, repo = settings.forge_repo.partition("/")
    if sink_name == "github":
        from reconciler.report.github import GitHubStatusSink

        return Reporter([GitHubStatusSink(owner, repo, token, clock=clock,
                                          api_url=settings.forge_api_url or "https://api.github.com")], clock)
    if sink_name == "gitlab":
        from reconciler.report.gitlab import GitLabStatusSink

        return Reporter([GitLabStatusSink(settings.forge_repo, token, clock=clock,
                                          base_url=settings.forge_api_url or "https://gitlab.com")], clock)
    from reconciler.report.gitea import GiteaStatusSink

    if not settings.forge_api_url:
        raise ConfigError("status sink gitea needs forge_api_url")
    return Reporter([GiteaStatusSink(settings.forge_api_url, owner, repo, token, clock=clock)], clock)


def _leader_election(settings: Settings, runtime: Runtime | None, clock: Clock
                     ) -> tuple[LeaseElector | None, Callable[[], None] | None]:
    """With leader_election on, a background thread keeps a Lease; only its holder reconciles.
    Returns (the LeaseElector or None, a function that stops it)."""
    if not settings.leader_election:
        return None, None
    from reconciler.live.kubernetes.lease import LeaseElector

    k8s_runtime = kubernetes_runtime(runtime)
    if k8s_runtime is None:
        raise ConfigError("leader_election needs runtime: kubernetes")
    namespace, identity = lease_identity(settings)
    elector = LeaseElector(k8s_runtime.kube.api_client, clock=clock, namespace=namespace,
                           name=settings.shard_lease_name, identity=identity)
    stop = threading.Event()
    threading.Thread(target=elector.run, args=(stop,), name="lease", daemon=True).start()
    return elector, stop.set


def lease_identity(settings: Settings) -> tuple[str, str]:
    """The namespace of the Leases and this replica's identity in them (the pod's, by the downward API)."""
    import os
    import socket

    namespace = settings.lease_namespace or os.environ.get("POD_NAMESPACE") or (settings.namespaces or ("default",))[0]
    return namespace, os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def make_policy(settings: Settings) -> Policy:
    return Policy(prune=settings.prune, mass_delete_fraction=settings.mass_delete_threshold,
                  mass_delete_min=settings.mass_delete_min_apps, repair_max_attempts=settings.repair_max_attempts,
                  repair_window=timedelta(seconds=settings.repair_window),
                  repair_backoff=timedelta(seconds=settings.repair_backoff),
                  repair_backoff_max=max(timedelta(minutes=5), timedelta(seconds=settings.repair_backoff)))


def make_record_store(settings: Settings, runtime: Runtime | None,
                      elector: LeaseElector | None = None) -> RecordStore:
    """Records live with the runtime: ConfigMaps beside the apps on Kubernetes (writes fenced by the
    leader Lease when there is one), files beside the clusters for the local runtime."""
    # A KubernetesRuntime exists only once its module is imported: a local or dry-run daemon does not pay
    # for importing the kubernetes client (a fifth of its start-up imports) just to ask.
    k8s_runtime = kubernetes_runtime(runtime)
    if k8s_runtime is not None:
        from reconciler.live.kubernetes.records import ConfigMapRecordStore, lease_fence

        return ConfigMapRecordStore(k8s_runtime.kube, k8s_runtime.namespaces,
                                    fence=lease_fence(elector) if elector is not None else None)
    return FileRecordStore(settings.state_dir / "records")


def make_source(settings: Settings) -> GitSource:
    if not settings.repo_url:
        raise ConfigError("no repository: --repo / FLINK_RECONCILER_REPO_URL")
    return GitSource(settings.repo_url, settings.state_dir / "git", branch=settings.branch,
                     token=settings.git_token, ssh_key_path=settings.git_ssh_key_path)


def make_reconciler(settings: Settings, clock: Clock, *, metrics: PassMetrics | None = None,
                    on_event: Callable[[StepEvent], None] | None = None,
                    report: bool = True) -> Reconciler:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    source = make_source(settings)
    runtime = make_runtime(settings, clock)
    elector, stop_election = _leader_election(settings, runtime, clock)
    store = make_record_store(settings, runtime, elector)
    # shard: auto is the daemon's (daemon/main.py); a one-off command sees every app, like an unsharded one
    shard = Shard(settings.shard, settings.shards) if settings.shards > 1 and settings.shard != "auto" else None
    if shard is not None:  # another shard's records are not ours to resume, plan or prune
        store = ShardRecordStore(store, shard)
    journal = Journal(settings.state_dir / "journal", clock, store=store)
    # The SQLite journal of 0.1 is imported once. With an election only the leader may write, and in a
    # cluster that journal lived in an emptyDir anyway: nothing to import there.
    if elector is None:
        migrate_sqlite_journal(settings.state_dir, journal)
    rec = Reconciler(
        source=source,
        runtime=runtime,
        leader=elector.is_leader if elector is not None else None,
        on_shutdown=stop_election,
        runtime_name=settings.runtime,
        spec_policy=SpecPolicy(settings.spec_policy),
        shard=shard,
        journal=journal,
        clock=clock,
        subdir=settings.path,
        policy=make_policy(settings),
        reporter=make_reporter(settings, source, clock) if report else None,
        metrics=metrics,
        target_url=settings.status_target_url,
        max_parallel=settings.max_parallel,
        on_event=on_event,
    )
    if runtime is not None:
        from reconciler.service.autoscale import Autoscaler

        rec.autoscaler = Autoscaler(rec, metrics=metrics if isinstance(metrics, AutoscaleMetrics) else None)
    return rec


