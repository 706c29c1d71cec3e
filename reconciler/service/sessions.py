"""Session clusters in a reconcile pass: tell the runtime which app runs where, observe the shared clusters, and
run the cluster entries of a plan after their apps (jobs first, then clusters). See docs/session-clusters.md."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from reconciler.core.observed import ClusterPhase, Outcome
from reconciler.core.plan import Action, ClusterPlan, Plan
from reconciler.core.session_planner import SessionLive, Sessions, sessions_from
from reconciler.errors import ReconcilerError
from reconciler.live.ports import Runtime
from reconciler.live.session import SessionRuntime
from reconciler.spec.load import LoadResult
from reconciler.spec.model import FlinkApp, JobState

log = logging.getLogger(__name__)


def prepare(runtime: Runtime | None, loaded: LoadResult, previous: Mapping[str, FlinkApp]) -> None:
    """Tell a session runtime which app runs on which session cluster, before anything is observed."""
    if not isinstance(runtime, SessionRuntime):
        return
    members = {n: c for n, a in previous.items() if (c := a.spec.session_cluster)}
    members.update({n: c for n, la in loaded.apps.items() if (c := la.app.spec.session_cluster)})
    suspended = [n for n, la in loaded.apps.items()
                 if la.app.spec.session_cluster and la.app.spec.job.state is JobState.SUSPENDED]
    runtime.set_sessions(members, clusters=loaded.clusters, suspended=suspended)


def observe(runtime: Runtime | None, loaded: LoadResult) -> Sessions:
    """The session clusters of Git and what runs of them (one list call, then each running cluster's jobs)."""
    live: dict[str, SessionLive] = {}
    if isinstance(runtime, SessionRuntime):
        try:
            clusters = runtime.session_clusters()
        except ReconcilerError as e:
            clusters = {}
            live = {n: SessionLive(phase=ClusterPhase.UNKNOWN, message=str(e)) for n in loaded.clusters}
        for name, info in clusters.items():
            if info.phase is ClusterPhase.ABSENT:
                continue
            try:
                jobs = runtime.cluster_jobs(name)
                count = len(runtime.host.session_generations(name))
            except ReconcilerError as e:
                live[name] = SessionLive(phase=ClusterPhase.UNKNOWN, message=str(e))
                continue
            live[name] = SessionLive(phase=info.phase, message=info.message, jobs=jobs, generations=max(count, 1))
    return sessions_from(loaded, live)


def run_clusters(runtime: Runtime | None, the_plan: Plan, outcomes: Mapping[str, Outcome],
                 deadline: float) -> dict[str, str]:
    """Delete the session clusters the plan deletes, each only once all its apps' steps succeeded (their final
    savepoints taken); on the others, delete the jars no job uses any more. Returns cluster -> what happened."""
    done: dict[str, str] = {}
    if runtime is None:
        return done
    for cp in the_plan.clusters:
        if cp.action is not Action.DELETE or not cp.steps:
            if isinstance(runtime, SessionRuntime):  # an upgrade or a removed app left a jar no job uses
                runtime.prune_jars(cp.cluster, deadline=deadline)
            continue
        failed = [a for a in cp.apps if outcomes.get(a) is not Outcome.SUCCESS]
        if failed:
            done[cp.cluster] = f"not deleted: {', '.join(failed)} did not finish"
            continue
        done[cp.cluster] = _delete(runtime, cp, deadline)
    return done


def _delete(runtime: Runtime, cp: ClusterPlan, deadline: float) -> str:
    try:
        runtime.delete_cluster(cp.cluster, deadline=deadline)
    except ReconcilerError as e:
        log.warning("session cluster %s: delete failed: %s", cp.cluster, e)
        return f"delete failed: {e}"
    log.info("session cluster %s deleted", cp.cluster)
    return "deleted"


def prepare_from_records(runtime: Runtime | None, applied: Mapping[str, dict[str, object] | None]) -> dict[str, str]:
    """`prepare` for a command without Git (status, history): which app runs where, by the specs on record.
    Returns app -> session cluster."""
    members: dict[str, str] = {}
    for name, spec in applied.items():
        inner = spec.get("spec") if isinstance(spec, dict) else None
        cluster = inner.get("sessionCluster") if isinstance(inner, dict) else None
        if isinstance(cluster, str):
            members[name] = cluster
    if isinstance(runtime, SessionRuntime):
        runtime.set_sessions(members)
    return members


def cluster_lines(runtime: Runtime | None) -> list[dict[str, object]]:
    """One row per running session cluster: its phase, its clusters and the apps whose jobs run on it."""
    if not isinstance(runtime, SessionRuntime):
        return []
    rows: list[dict[str, object]] = []
    for name, info in sorted(runtime.session_clusters().items()):
        try:
            jobs = runtime.cluster_jobs(name)
            count = len(runtime.host.session_generations(name))
        except ReconcilerError as e:
            rows.append({"cluster": name, "state": "unknown", "clusters": None, "jobs": {}, "message": str(e)})
            continue
        rows.append({"cluster": name, "state": info.phase.value, "clusters": count, "jobs": jobs,
                     "message": info.message})
    return rows
