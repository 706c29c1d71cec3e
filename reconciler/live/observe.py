"""Observe: runtime clusters + each JobManager's REST API -> the planner's LiveState.

Failure to observe an app yields ClusterPhase.UNKNOWN for that app (never ABSENT), so the planner
cannot mistake "could not look" for "nothing runs" and plan a create or a delete from it.
"""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.core.observed import Checkpoint, ClusterPhase, JobPhase, LiveApp, LiveState, job_phase
from reconciler.errors import ReconcilerError
from reconciler.live.ports import ClusterInfo, JobSummary, Runtime

_TERMINAL = {"CANCELED", "FINISHED", "FAILED", "SUSPENDED"}


def pick_job(jobs: Iterable[JobSummary]) -> JobSummary | None:
    """The app's job on its cluster: the live one if any, else the most recently started."""
    ordered = sorted(jobs, key=lambda j: j.start_time_ms, reverse=True)
    live = [j for j in ordered if j.state.upper() not in _TERMINAL]
    if live:
        return live[0]
    return ordered[0] if ordered else None


def observe_app(runtime: Runtime, info: ClusterInfo) -> LiveApp:
    name = info.app
    base = LiveApp(name=name, cluster=info.phase, cluster_message=info.message, deployed_spec_hash=info.spec_hash)
    if info.phase is not ClusterPhase.READY:
        return base
    try:
        flink = runtime.flink(name)
        job = pick_job(flink.jobs())
        if job is None:
            return base
        stats = flink.checkpoints(job.job_id)
    except ReconcilerError as e:
        return base.model_copy(update={"cluster": ClusterPhase.UNKNOWN, "cluster_message": str(e)})
    ckpt = None
    if stats.latest_completed_path and stats.latest_completed_at:
        ckpt = Checkpoint(path=stats.latest_completed_path, completed_at=stats.latest_completed_at)
    phase = job_phase(job.state, job.tasks_running, job.tasks_total, job.tasks_finished)
    if job.state.upper() in ("CANCELED", "FINISHED", "SUSPENDED"):
        phase = JobPhase.STOPPED
    return base.model_copy(update={"job_id": job.job_id, "flink_state": job.state, "job": phase,
                                   "latest_checkpoint": ckpt})


def observe(runtime: Runtime | None, names: Iterable[str]) -> LiveState:
    """One list call for every cluster, then REST only for the clusters that are up.

    A stopped job (CANCELED/FINISHED) on a live cluster counts as no job: the planner starts one."""
    if runtime is None:  # dry run: an empty runtime
        return LiveState(apps={})
    try:
        clusters = runtime.list_clusters()
    except ReconcilerError as e:
        unknown = {n: LiveApp(name=n, cluster=ClusterPhase.UNKNOWN, cluster_message=str(e)) for n in names}
        return LiveState(apps=unknown, complete=False)
    wanted = set(names) | set(clusters)
    apps = {}
    for name in sorted(wanted):
        info = clusters.get(name)
        if info is None:
            continue  # absent: LiveState.get() answers ABSENT
        app = observe_app(runtime, info)
        if app.job is JobPhase.STOPPED:
            app = app.model_copy(update={"job_id": None, "job": JobPhase.NONE, "flink_state": None})
        apps[name] = app
    return LiveState(apps=apps, complete=all(a.cluster is not ClusterPhase.UNKNOWN for a in apps.values()))
