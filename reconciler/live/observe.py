"""Observe: runtime clusters + each JobManager's REST API + the runtime's storage -> the planner's LiveState.

Failure to observe an app yields ClusterPhase.UNKNOWN for that app (never ABSENT), so the planner
cannot mistake "could not look" for "nothing runs" and plan a create or a delete from it. The same
holds for the evidence of an app's past (a stopped job's savepoint, stored savepoints and retained
checkpoints): storage that cannot be read is `evidence_error`, never "no evidence".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from reconciler.core.observed import (
    Checkpoint,
    ClusterPhase,
    JobPhase,
    LiveApp,
    LiveState,
    OperatorDeployment,
    job_phase,
)
from reconciler.errors import ReconcilerError
from reconciler.live.ports import ClusterInfo, FlinkApi, JobSummary, OperatorTakeover, RestartCount, Runtime
from reconciler.operator_migration.status import operator_view, wanted_deployment
from reconciler.spec.model import FlinkApp

_TERMINAL = {"CANCELED", "FINISHED", "FAILED", "SUSPENDED"}
_STOPPED = ("CANCELED", "FINISHED", "SUSPENDED")


def pick_job(jobs: Iterable[JobSummary]) -> JobSummary | None:
    """The app's job on its cluster: the live one if any, else the most recently started."""
    ordered = sorted(jobs, key=lambda j: j.start_time_ms, reverse=True)
    live = [j for j in ordered if j.state.upper() not in _TERMINAL]
    if live:
        return live[0]
    return ordered[0] if ordered else None


def observe_app(runtime: Runtime, info: ClusterInfo) -> LiveApp:
    """A READY cluster's job, checkpoints and (when it is not running) Flink's last error. A cluster that is
    not ready but whose JobManager answers (a TaskManager died) is asked too: its job is recovering, not gone,
    and the planner must see it so (a JobManager that does not answer then is no observation error)."""
    name = info.app
    base = LiveApp(name=name, cluster=info.phase, cluster_message=info.message, deployed_spec_hash=info.spec_hash,
                   standby_generation=info.standby_generation, retired_cluster=info.retired_cluster,
                   missing_processes=info.missing, unreadable=info.unreadable, ha_job_id=info.ha_job_id)
    ready = info.phase is ClusterPhase.READY
    if not ready and not (info.phase is ClusterPhase.STARTING and info.missing and info.rest_url):
        return base
    try:
        flink = runtime.flink(name)
        job = pick_job(flink.jobs())
        if job is None:
            return base
        stats = flink.checkpoints(job.job_id)
    except ReconcilerError as e:
        if not ready:
            return base
        return base.model_copy(update={"cluster": ClusterPhase.UNKNOWN, "cluster_message": str(e)})
    ckpt = None
    if stats.latest_completed_path and stats.latest_completed_at:
        ckpt = Checkpoint(path=stats.latest_completed_path, completed_at=stats.latest_completed_at)
    phase = job_phase(job.state, job.tasks_running, job.tasks_total, job.tasks_finished)
    update: dict[str, object] = {"job_id": job.job_id, "flink_state": job.state, "job": phase,
                                 "latest_checkpoint": ckpt, "checkpoints_failed": stats.failed_count}
    state = job.state.upper()
    if state not in _TERMINAL:
        update["restarts"] = _restarts(flink, job.job_id)
    if phase is not JobPhase.RUNNING and state not in _STOPPED:
        update["job_exception"] = _last_exception(runtime, name, job.job_id)
    if state in _STOPPED:
        update["job"] = JobPhase.STOPPED
        update["stopped_job_id"] = job.job_id
        if stats.latest_savepoint_path and stats.latest_savepoint_at:
            update["stopped_savepoint"] = Checkpoint(path=stats.latest_savepoint_path,
                                                     completed_at=stats.latest_savepoint_at, is_savepoint=True)
        if state == "FINISHED":
            # A retained checkpoint is discarded when its job FINISHES (stop-with-savepoint): only
            # CANCELED/FAILED/SUSPENDED jobs leave one behind (RETAIN_ON_CANCELLATION).
            update["latest_checkpoint"] = None
    return base.model_copy(update=update)


def _restarts(flink: FlinkApi, job_id: str) -> int | None:
    """Flink's numRestarts of a live job, for health metrics (docs/alerts.md): one request; None when it cannot
    say (never an observation error: no decision rests on it)."""
    if not isinstance(flink, RestartCount):
        return None
    try:
        return flink.restarts(job_id)
    except ReconcilerError:
        return None


def _last_exception(runtime: Runtime, app: str, job_id: str) -> str | None:
    """Flink's newest exception of a job that is not running (what a crash loop reports); None when it has none
    or cannot say (it is only words for a human)."""
    try:
        found = runtime.flink(app).exceptions(job_id)
    except ReconcilerError:
        return None
    return found[0][:500] if found else None


def with_stored_evidence(runtime: Runtime, app: LiveApp) -> LiveApp:
    """Add the newest stored savepoint and retained checkpoint (for an app with no live job only:
    that is when a restore point has to be chosen)."""
    try:
        stored = runtime.stored_snapshots(app.name)
    except ReconcilerError as e:
        return app.model_copy(update={"evidence_error": str(e)})
    # The newest of each kind by its time, not the first listed: a runtime's list out of order (its contract is
    # newest first, tests/live/snapshot_contract.py) would otherwise be a silent rewind.
    sp = max((c for c in stored if c.is_savepoint), key=lambda c: c.completed_at, default=None)
    ck = max((c for c in stored if not c.is_savepoint), key=lambda c: c.completed_at, default=None)
    return app.model_copy(update={"stored_savepoint": sp, "stored_checkpoint": ck})


def observe(runtime: Runtime | None, names: Iterable[str]) -> LiveState:
    """One list call for every cluster, then REST only for the clusters that are up, and the runtime's
    storage for apps without a live job.

    A stopped job (CANCELED/FINISHED) on a live cluster counts as no job (the planner starts one), but
    what it leaves behind is kept as evidence: its id, the savepoint it stopped with, its checkpoint."""
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
        app = observe_app(runtime, info) if info is not None else LiveApp(name=name, cluster=ClusterPhase.ABSENT)
        if app.job is JobPhase.STOPPED:
            app = app.model_copy(update={"job_id": None, "job": JobPhase.NONE, "flink_state": None})
        if app.cluster is not ClusterPhase.UNKNOWN and app.job_id is None:
            app = with_stored_evidence(runtime, app)
        if app.cluster is ClusterPhase.ABSENT and not app.has_evidence and not app.ha_job_id:
            continue  # absent: LiveState.get() answers ABSENT
        apps[name] = app
    return LiveState(apps=apps, complete=all(a.cluster is not ClusterPhase.UNKNOWN for a in apps.values()))


def with_operator_deployments(runtime: object, live: LiveState, apps: Mapping[str, FlinkApp],
                              known: Collection[str]) -> LiveState:
    """Add the Flink Kubernetes Operator's FlinkDeployment each app would take over (operator_migration): for
    apps without a record (first sight) or whose spec.takeover names one, with one list per watched namespace, and
    only when there are such apps (a steady state costs no request). Unreadable is said, never "none"."""
    wanted = {n: wanted_deployment(n, a.metadata.namespace, a.spec.takeover.from_ if a.spec.takeover else None)
              for n, a in apps.items() if n not in known or a.spec.takeover is not None}
    if not isinstance(runtime, OperatorTakeover):  # spec.takeover on a runtime without FlinkDeployments: say so
        name = getattr(runtime, "name", None)
        wanted = {n: v for n, v in wanted.items() if apps[n].spec.takeover is not None}
        if runtime is None or not wanted:
            return live
        why = f"the {name} runtime has no FlinkDeployments; a takeover runs on the kubernetes runtime"
        views = {n: OperatorDeployment(namespace=ns, name=fd, unreadable=why) for n, (ns, fd) in wanted.items()}
        return live.model_copy(update={"apps": {**live.apps, **{n: live.get(n).model_copy(update={"operator": v})
                                                               for n, v in views.items()}}})
    if not wanted:
        return live
    views = {}
    try:
        found = runtime.flink_deployments()
    except ReconcilerError as e:
        views = {n: OperatorDeployment(namespace=ns, name=fd, unreadable=str(e)) for n, (ns, fd) in wanted.items()}
    else:
        for n, key in wanted.items():
            if key in found:
                views[n] = operator_view(found[key], _durable(runtime, found[key]))
    if not views:
        return live
    return live.model_copy(update={"apps": {**live.apps, **{n: live.get(n).model_copy(update={"operator": v})
                                                           for n, v in views.items()}}})


def _durable(runtime: OperatorTakeover, deployment: dict[str, Any]) -> Callable[[str], str | None]:
    return lambda uri: runtime.savepoint_storage_problem(deployment, uri)
