"""Session clusters in the plan: the app plans adjusted for jobs that share a cluster, and one entry per cluster.

The loader hands the planner each session app as its effective app (its job on the cluster's fields), so the
decision table already does most of it: a change of one app's job is a job-only upgrade of that app alone, and a
change of the cluster is a cluster-level change of every app on it, each a warm-standby upgrade of its own
(journaled on its own, so a crash resumes each job), all naming the one new cluster generation the cluster's
spec gives. What differs on a shared cluster is decided here, on top of `planner.plan`:

- a cold change would restart the cluster under every other job without their savepoints: blocked;
- an app moving between clusters is not done in one step: blocked with the way to do it (suspend, move, resume);
- removing an app takes its final savepoint and leaves the cluster; a suspended app does not stop the cluster;
- a cluster removed from Git that apps still name is refused with their names; one no app names is deleted
  with `--prune`, after the final savepoints of its apps (the executor runs cluster entries after the apps).
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from reconciler.core.diff import field_name
from reconciler.core.observed import ClusterPhase
from reconciler.core.plan import Action, AppPlan, ClusterPlan, ClusterStrategy, DeleteCluster, Plan, Step
from reconciler.core.planner import PlanInput, cluster_changes, plan
from reconciler.spec.load import LoadResult
from reconciler.spec.model import Deadlines, JobState
from reconciler.spec.session import FlinkSessionCluster, running_parallelism

_DELETE_S = Deadlines().delete.total_seconds()


@dataclass(frozen=True)
class SessionLive:
    """What the runtime shows of one session cluster, all its generations together."""

    phase: ClusterPhase
    message: str | None = None
    jobs: Mapping[str, str] = field(default_factory=dict)  # app -> Flink state of its live job on the cluster
    generations: int = 1  # clusters running for it: 2 while jobs move, or when a job was rolled back onto the old


@dataclass(frozen=True)
class Sessions:
    """The session clusters: desired (Git), which apps name each, and what runs."""

    clusters: Mapping[str, FlinkSessionCluster] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)  # cluster -> file
    named_by: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # cluster -> apps naming it in Git
    live: Mapping[str, SessionLive] = field(default_factory=dict)


def sessions_from(result: LoadResult, live: Mapping[str, SessionLive] | None = None) -> Sessions:
    return Sessions(clusters={n: lc.cluster for n, lc in result.clusters.items()},
                    sources={n: lc.file for n, lc in result.clusters.items()},
                    named_by=result.session_names, live=live or {})


def plan_with_sessions(inp: PlanInput, sessions: Sessions, only: Collection[str] | None = None) -> Plan:
    """`planner.plan`, with the apps on session clusters adjusted and one entry per session cluster."""
    base = plan(inp, only)
    if not sessions.clusters and not sessions.live and not sessions.named_by and not _any_session(inp):
        return base
    apps = tuple(_session_app(ap, inp) for ap in base.apps)
    clusters = _cluster_plans(inp, sessions, apps, base.guard)
    if only is not None:
        clusters = tuple(c for c in clusters if c.cluster in only or set(c.apps) & set(only))
    return base.model_copy(update={"apps": apps, "clusters": clusters})


def _any_session(inp: PlanInput) -> bool:
    return any(a.spec.session_cluster for a in (*inp.desired.apps.values(), *inp.previous.values()))


def session_of(name: str, inp: PlanInput) -> tuple[str | None, str | None]:
    """The session cluster app `name` runs on as applied (previous), and the one Git names (desired)."""
    desired, previous = inp.desired.apps.get(name), inp.previous.get(name)
    return (previous.spec.session_cluster if previous else None,
            desired.spec.session_cluster if desired else None)


def _session_app(ap: AppPlan, inp: PlanInput) -> AppPlan:
    before, now = session_of(ap.app, inp)
    if (before is None and now is None) or ap.action in (Action.ERROR, Action.BLOCKED, Action.NOOP):
        return ap
    desired = inp.desired.apps.get(ap.app)
    previous = inp.previous.get(ap.app)
    if desired is not None and previous is not None and before != now and ap.steps:
        return _blocked(ap, f"app moves from {_where(before)} to {_where(now)}, which is not done in one step: "
                            "suspend it first (spec.job.state: suspended takes a savepoint), then change "
                            "spec.sessionCluster and set it running again (it resumes from that savepoint on the new "
                            "cluster)")
    if ap.cluster_strategy is ClusterStrategy.COLD and now is not None:
        why = ap.reason.split(", cold", 1)[1] if ", cold" in ap.reason else ""
        fields = ", ".join(sorted({field_name(c.path) for c in cluster_changes(ap.diff)})) or "the cluster"
        return _blocked(ap, f"{fields} of session cluster {now} changed, and a cold change would restart the cluster "
                            "under every job on it, without their savepoints. Session clusters change only by warm "
                            f"standby (every job moves to a new cluster){': cold' + why if why else ''}. Change "
                            "it by warm standby, or suspend the cluster's apps first")
    if desired is None and before is not None:  # removed from Git: the app's part goes, the cluster stays
        steps = _on_session(ap.steps, before)
        reason = ap.reason.replace("then delete the cluster", f"then remove it from session cluster {before}")
        reason = reason.replace("; delete the cluster", f"; remove it from session cluster {before}")
        return ap.model_copy(update={"steps": steps, "reason": reason + f" (the session cluster {before} keeps "
                                                                         "running its other jobs)"})
    if ap.action is Action.SUSPEND and now is not None:
        if all(isinstance(s, DeleteCluster) for s in ap.steps):
            return ap.model_copy(update={"action": Action.NOOP, "steps": (),
                                         "reason": f"suspended (session cluster {now} runs on for its other jobs)"})
        return ap.model_copy(update={"steps": _on_session(ap.steps, now)})
    return ap


def _where(cluster: str | None) -> str:
    return f"session cluster {cluster}" if cluster else "its own cluster"


def _on_session(steps: tuple[Step, ...], cluster: str) -> tuple[Step, ...]:
    return tuple(s.model_copy(update={"session_cluster": cluster}) if isinstance(s, DeleteCluster) else s
                 for s in steps)


def _blocked(ap: AppPlan, reason: str) -> AppPlan:
    return ap.model_copy(update={"action": Action.BLOCKED, "reason": reason, "steps": (), "rollback": (),
                                 "abort": (), "rollback_after": None, "risks": (), "cluster_strategy": None})


def _cluster_plans(inp: PlanInput, sessions: Sessions, apps: tuple[AppPlan, ...],
                   guard: str | None) -> tuple[ClusterPlan, ...]:
    by_app = {a.app: a for a in apps}
    erroring = set(inp.desired.errors_by_app)
    on_record = {c for a in inp.previous.values() if (c := a.spec.session_cluster)}
    names = set(sessions.clusters) | set(sessions.live) | on_record
    out = []
    for name in sorted(names - erroring):  # an invalid cluster has its error entry already
        if name in sessions.clusters:
            out.append(_present(name, inp, sessions, by_app))
        else:
            entry = _removed(name, inp, sessions, by_app, guard)
            if entry is not None:
                out.append(entry)
    return tuple(out)


def _present(name: str, inp: PlanInput, sessions: Sessions, by_app: Mapping[str, AppPlan]) -> ClusterPlan:
    members = sorted(n for n, a in inp.desired.apps.items() if a.spec.session_cluster == name)
    running = [n for n in members if inp.desired.apps[n].spec.job.state is JobState.RUNNING]
    live = sessions.live.get(name)
    base = {"cluster": name, "apps": tuple(members), "source_file": sessions.sources.get(name)}
    moving = [n for n in members if n in by_app and by_app[n].cluster_strategy is ClusterStrategy.WARM_STANDBY]
    stuck = [n for n in members if n in by_app and by_app[n].action in (Action.BLOCKED, Action.ERROR)]
    if moving:
        fields = sorted({field_name(c.path) for n in moving for c in cluster_changes(by_app[n].diff)})
        reason = (f"cluster change ({', '.join(fields)}): its {len(moving)} job(s) ({', '.join(moving)}) move to a new "
                  "cluster at the new spec, started once beside the old one (warm standby); each job is its own "
                  "transition (savepoint -> stop -> start on the new cluster from it -> RUNNING and a checkpoint). "
                  "A job that fails on the new cluster is rolled back onto the old cluster, which is then kept while "
                  "the others go on; the old cluster is deleted once no job runs on it")
        if stuck:
            reason += f". Not moving now: {', '.join(stuck)} (see their entries), so the old cluster is kept for them"
        return ClusterPlan(**base, action=Action.UPGRADE, reason=reason)
    scaling = _scaling(name, inp, sessions, members)
    if scaling is not None and live is not None and live.phase is not ClusterPhase.ABSENT:
        return ClusterPlan(**base, action=Action.SCALE, reason=scaling)
    if live is None or live.phase is ClusterPhase.ABSENT:
        if running:
            return ClusterPlan(**base, action=Action.CREATE,
                               reason=f"new session cluster, started with the first of its jobs ({', '.join(running)})")
        return ClusterPlan(**base, action=Action.NOOP, reason="no running app names it: it starts with the first job")
    if live.generations > 1:
        old = sorted(set(live.jobs) - set(moving))
        return ClusterPlan(**base, action=Action.NOOP,
                           reason=f"{live.generations} clusters run for it: the old one is kept while a job rolled "
                                  f"back onto it runs there ({', '.join(old) or 'none seen'}); it is deleted once "
                                  "that job moves (a new commit or restartNonce retries it)")
    if not members:
        return ClusterPlan(**base, action=Action.NOOP, reason="up to date; no app names it")
    return ClusterPlan(**base, action=Action.NOOP, reason=f"up to date: {len(members)} app(s) on it")


def _scaling(name: str, inp: PlanInput, sessions: Sessions, members: list[str]) -> str | None:
    """What the plan says when the cluster's TaskManagers change because its jobs' slots do (capacity.addTaskManagers:
    the apps' entries scale the cluster, each before its own job starts); None when they do not change."""
    cluster = sessions.clusters[name]
    if not cluster.spec.capacity.add_task_managers or not members:
        return None
    apps = [inp.desired.apps[n] for n in members]
    want = apps[0].spec.task_manager.replicas
    before = {a.spec.task_manager.replicas for n, a in inp.previous.items() if a.spec.session_cluster == name}
    was = max(before) if before else None
    if was is None or was == want:
        return None
    tm = cluster.spec.task_manager
    each = ", ".join(f"{a.name} {a.spec.job.parallelism}" for a in apps if a.spec.job.state is JobState.RUNNING)
    need = running_parallelism(apps)
    floor = f"; taskManager.replicas {tm.replicas} is the least" if want == tm.replicas else ""
    return (f"TaskManagers {was} -> {want}: its running jobs need {need} slots ({each or 'none'}), {tm.slots} per "
            f"TaskManager (capacity.addTaskManagers, at most {cluster.spec.capacity.max_task_managers}){floor}. Each "
            "app's entry scales the cluster, before its own job starts; no job is restarted for it, and a TaskManager "
            "that runs tasks is never stopped")


def _removed(name: str, inp: PlanInput, sessions: Sessions, by_app: Mapping[str, AppPlan],
             guard: str | None) -> ClusterPlan | None:
    live = sessions.live.get(name)
    naming = sessions.named_by.get(name, ())
    base = {"cluster": name, "apps": tuple(naming)}
    if naming:
        return ClusterPlan(**base, action=Action.BLOCKED,
                           reason=f"session cluster {name} is no longer in Git but app(s) {', '.join(naming)} still "
                                  "name it (spec.sessionCluster): it is not deleted while they do. Move or delete "
                                  "those apps first, or add the cluster back")
    if live is None or live.phase is ClusterPhase.ABSENT:
        return None
    if not inp.policy.prune:
        return ClusterPlan(**base, action=Action.NOOP,
                           reason="session cluster removed from Git; pruning is disabled, so it keeps running "
                                  "(enable prune to delete it)")
    if guard:
        return ClusterPlan(**base, action=Action.BLOCKED, reason=guard)
    if live.phase is ClusterPhase.UNKNOWN:
        return ClusterPlan(**base, action=Action.BLOCKED,
                           reason=f"session cluster removed from Git but it could not be observed ({live.message}); "
                                  "deletion waits until its jobs can be seen")
    leaving = sorted(a for a in live.jobs if a in by_app and by_app[a].action is Action.DELETE)
    staying = sorted(set(live.jobs) - set(leaving))
    if staying:
        return ClusterPlan(**base, action=Action.BLOCKED,
                           reason=f"session cluster removed from Git, but job(s) of {', '.join(staying)} still run on "
                                  "it: it is deleted once they are gone")
    after = f", after the final savepoints of {', '.join(leaving)}" if leaving else ""
    return ClusterPlan(**{**base, "apps": tuple(leaving)}, action=Action.DELETE,
                       reason=f"session cluster removed from Git and no app names it: deleted{after}",
                       risks=(f"DELETES SESSION CLUSTER {name}: spec removed from Git",),
                       steps=(DeleteCluster(deadline_s=_DELETE_S),))
