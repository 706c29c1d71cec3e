"""An app's cluster generations on Kubernetes: the root's pointers and what one cycle's lists say of each.

An app has its live cluster and, around a warm standby, a standby and a retired one, told apart by a
generation label ("" is the first cluster, in application mode). The root ConfigMap's annotations point
at the live, standby and retired generations, so moving an app between clusters is one write of those
pointers. The runtime's lifecycle and the warm standby both read an app through these views, and
`view_info` says what a view comes to: the `ClusterInfo` the planner sees (pure, like everything here).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from reconciler.core.observed import ClusterPhase
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.render import Obj
from reconciler.live.kubernetes.status import label, pod_problem, rewind_warning, taskmanager_generation, workload_ready
from reconciler.live.ports import ClusterInfo


@dataclass
class ClusterView:
    """The workloads and pods of one cluster generation of an app."""

    jobmanager: Obj | None = None
    taskmanager: Obj | None = None
    pods: list[Obj] = field(default_factory=list)


@dataclass
class AppView:
    """Everything one cycle's lists said about one app: its live cluster (the generation the root's pointer
    names; "" is the first cluster, in application mode) and the others beside it (standby, retired)."""

    namespace: str
    root: Obj | None = None
    jobmanager: Obj | None = None
    taskmanager: Obj | None = None
    pods: list[Obj] = field(default_factory=list)
    live_generation: str = ""
    others: dict[str, ClusterView] = field(default_factory=dict)
    ha_jobs: set[str] = field(default_factory=set)  # jobs Flink keeps HA data of, under their generation's identity


@dataclass(frozen=True)
class Pointers:
    """The root's generation pointers: the live cluster, a warm standby, the retired one ("" = the first)."""

    live: str = ""
    standby: str | None = None
    retired: str | None = None

    @staticmethod
    def of(root: Obj | None) -> Pointers:
        ann = ((root or {}).get("metadata") or {}).get("annotations") or {}

        def gen(v: str | None) -> str | None:
            return None if v is None else ("" if v == r.BASE else v)
        return Pointers(live=gen(ann.get(r.ANNOTATION_LIVE)) or "", standby=gen(ann.get(r.ANNOTATION_STANDBY)) or None,
                        retired=gen(ann.get(r.ANNOTATION_RETIRED)))

    def annotations(self) -> dict[str, str]:
        out = {r.ANNOTATION_LIVE: self.live or r.BASE}
        if self.standby:
            out[r.ANNOTATION_STANDBY] = self.standby
        if self.retired is not None:
            out[r.ANNOTATION_RETIRED] = self.retired or r.BASE
        return out


def of_generation(objs: list[Obj], generation: str) -> list[Obj]:
    """The objects of one cluster generation: what a standby adds beside the live cluster (the root
    ConfigMap and the RBAC objects are the app's, shared by its generations)."""
    return [o for o in objs if label(o, r.LABEL_GENERATION) == generation]



_GENERATION = re.compile(r"[a-z0-9]{1,16}\Z")  # a cluster generation: `base`, or a short token of the plan's


def pointer_problem(app: str, root: Obj | None) -> str | None:
    """What is wrong with the root ConfigMap's generation pointers (an annotation edited by hand), with what to
    do, or None. A pointer that names no generation we could have written leaves the live cluster unknown: that
    app waits, BLOCKED, instead of its running cluster being taken for a leftover or for nothing at all."""
    meta = (root or {}).get("metadata") or {}
    ann = meta.get("annotations") or {}
    bad = {k: v for k in (r.ANNOTATION_LIVE, r.ANNOTATION_STANDBY, r.ANNOTATION_RETIRED)
           if (v := ann.get(k)) is not None and not (isinstance(v, str) and _GENERATION.match(v))}
    if not bad:
        return None
    where = f"ConfigMap {meta.get('namespace')}/{meta.get('name')}"
    shown = ", ".join(f"{k}={v!r}" for k, v in sorted(bad.items()))
    return (f"{where}: unreadable cluster pointer(s) {shown} (expected {r.BASE!r} or a generation of lowercase "
            f"letters and digits): which cluster of app {app} is live is unknown, so it is left as it is. Set the "
            f"annotation back to the generation of the cluster that runs the job (the {r.LABEL_GENERATION} label "
            f"of its JobManager Deployment; {r.BASE!r} when it has none), e.g. `kubectl annotate --overwrite "
            f"configmap -n {meta.get('namespace')} {meta.get('name')} {r.ANNOTATION_LIVE}=base`")


def view_info(app: str, v: AppView, events: list[Obj] | None, rest_url: str) -> ClusterInfo:
    """What the lists of one cycle say of an app's clusters (`events`: the namespace's, to explain a problem;
    `rest_url`: its live JobManager's REST address)."""
    info = _live_info(app, v, events, rest_url)
    ptr = Pointers.of(v.root)
    # Any cluster beside the live one that is not the retired one is a standby (or what is left of one).
    standby = ptr.standby if ptr.standby and ptr.standby != v.live_generation else None
    standby = standby or next((g for g in sorted(v.others) if g and g != ptr.retired), None)
    retired = ptr.retired is not None and ptr.retired != v.live_generation
    if standby or retired:
        info = dataclasses.replace(info, standby_generation=standby, retired_cluster=retired)
    return info


def _live_info(app: str, v: AppView, events: list[Obj] | None, rest_url: str) -> ClusterInfo:
    spec_hash = None
    for o in (v.jobmanager, v.root):
        if o is not None:
            spec_hash = ((o.get("metadata") or {}).get("annotations") or {}).get(r.ANNOTATION_SPEC_HASH)
            break
    rest: str | None = rest_url
    ha_job = _ha_job(v)
    if v.root is None and v.jobmanager is None and v.taskmanager is None:
        return ClusterInfo(app=app, phase=ClusterPhase.ABSENT, message="only leftover pods" if v.pods else None,
                           ha_job_id=ha_job)
    if v.jobmanager is None and v.taskmanager is None:
        return ClusterInfo(app=app, phase=ClusterPhase.ABSENT, spec_hash=spec_hash, ha_job_id=ha_job,
                           message="no JobManager or TaskManagers (suspended, or its workloads were deleted): "
                                   "configuration kept")
    # In application mode nothing but a repair recreates a deleted workload (the kubelet and the workload
    # controllers only replace pods): the planner is told at once, it does not wait for it to come back.
    missing: tuple[str, ...] = ()
    if not v.live_generation and v.jobmanager is None:
        missing = ("jobmanager",)
        rest = None  # a JobManager still terminating may answer for a moment: it is no live JobManager
    elif not v.live_generation and v.taskmanager is None:
        missing = ("taskmanager",)
    gone = [f"the {'JobManager' if m == 'jobmanager' else 'TaskManager'} workload "
            f"{r.object_names(app)[m]} is gone" for m in missing]
    problems: list[tuple[bool, str]] = []
    for comp, w in (("JobManager", v.jobmanager), ("TaskManagers", v.taskmanager)):
        if w is None:
            continue
        ok, why = workload_ready(w)
        if not ok and why:
            fatal = why.startswith(("ProgressDeadlineExceeded", "FailedCreate", "ReplicaFailure"))
            problems.append((fatal, f"{comp}: {why}"))
    pod_issues = _pod_issues(v, events)
    if any(f for f, _ in pod_issues) or any(f for f, _ in problems):
        msgs = gone + [m for f, m in pod_issues if f] + [m for f, m in problems if f]
        return ClusterInfo(app=app, phase=ClusterPhase.FAILED, rest_url=rest, message="; ".join(msgs),
                           spec_hash=spec_hash, missing=missing, ha_job_id=ha_job)
    if problems or pod_issues or missing:
        return ClusterInfo(app=app, phase=ClusterPhase.STARTING, rest_url=rest,
                           message="; ".join(gone + [m for _, m in pod_issues] + [m for _, m in problems]),
                           spec_hash=spec_hash, missing=missing, ha_job_id=ha_job)
    return ClusterInfo(app=app, phase=ClusterPhase.READY, rest_url=rest, spec_hash=spec_hash,
                       message=rewind_warning(v.root, v.jobmanager, v.pods))


def _pod_issues(v: AppView, events: list[Obj] | None) -> list[tuple[bool, str]]:
    out: list[tuple[bool, str]] = []
    for pod in v.pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        prob = pod_problem(pod)
        if prob is None:
            continue
        fatal, why = prob
        pod_name = pod["metadata"]["name"]
        ev = _latest_warning(events or [], pod_name)
        if ev and ev not in why:
            why = f"{why} (event: {ev})"
        out.append((fatal, f"pod {pod_name}: {why}"))
    return out


def _latest_warning(events: list[Obj], name: str) -> str | None:
    mine = [e for e in events if (e.get("involvedObject") or {}).get("name") == name and e.get("type") == "Warning"]
    if not mine:
        return None
    e = max(mine, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return f"{e.get('reason')}: {e.get('message')}"


def _ha_job(v: AppView) -> str | None:
    """The job whose JobManager is gone while Flink keeps its HA data (the cluster in application mode only: a
    session cluster recovers its jobs by itself): the TaskManagers' job when they are left, else the only one."""
    if v.jobmanager is not None or v.live_generation or not v.ha_jobs:
        return None
    tm_job = taskmanager_generation(v.taskmanager)
    if tm_job in v.ha_jobs:
        return tm_job
    return next(iter(v.ha_jobs)) if len(v.ha_jobs) == 1 else None
