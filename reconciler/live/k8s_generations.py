"""An app's cluster generations on Kubernetes: the root's pointers and what one cycle's lists say of each.

An app has its live cluster and, around a warm standby, a standby and a retired one, told apart by a
generation label ("" is the first cluster, in application mode). The root ConfigMap's annotations point
at the live, standby and retired generations, so moving an app between clusters is one write of those
pointers. The runtime's lifecycle and the warm standby both read an app through these views.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from reconciler.live import k8s_render as r
from reconciler.live.k8s_render import Obj
from reconciler.live.k8s_status import label


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
