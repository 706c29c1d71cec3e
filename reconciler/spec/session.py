"""FlinkSessionCluster: one Flink cluster whose slots the jobs of several FlinkApps share.

A FlinkSessionCluster is the cluster half of a FlinkApp (the same models, the same validation). An app
with `spec.sessionCluster: <name>` has no cluster of its own: the loader refuses its cluster fields and
then gives the rest of the system the app's *effective* spec, its job with the session cluster's fields
filled in (`effective_app`). Everything downstream (diff, planner, records, executor) sees an ordinary
FlinkApp, so a change of the session cluster is a cluster-level change of every app on it, and a change
of one app's job touches that app alone.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from reconciler.spec.fields import ChangeClass, SpecModel, change
from reconciler.spec.model import (
    AppSpec,
    FlinkApp,
    HighAvailability,
    JobManagerSpec,
    JobState,
    Metadata,
    RuntimeHints,
    TaskManagerSpec,
    content_hash,
)

SESSION_KIND = "FlinkSessionCluster"
# Set on the stand-in FlinkApp a runtime provisions a session cluster from (`cluster_app`): its clusters are
# shared, never an app's own, and never pruned as an orphan app.
SESSION_LABEL = "flink-reconciler.io/session-cluster"

# The fields of AppSpec that belong to the cluster, not the job: a session cluster's, never a session app's.
CLUSTER_FIELDS = ("flink_version", "image", "runtime", "job_manager", "task_manager", "flink_configuration",
                  "pod_template", "high_availability")


def alias(field: str) -> str:
    return AppSpec.model_fields[field].alias or field


class CapacitySpec(SpecModel):
    """What happens when the running jobs of a session cluster's apps need more task slots than
    `taskManager.replicas x slots`: refused (the default), or more TaskManagers, up to a ceiling."""

    add_task_managers: bool = change(
        ChangeClass.SCALE, "When the running jobs need more slots than taskManager.replicas x slots, start as many "
        "more TaskManagers as they need (at most maxTaskManagers), before the job that needs them starts; false: "
        "such a spec is refused, naming the numbers. taskManager.replicas stays the least count; TaskManagers "
        "added for jobs that are gone are stopped again once idle (never one that runs tasks).", default=False,
    )
    max_task_managers: int | None = change(
        ChangeClass.SCALE, "The most TaskManagers addTaskManagers may run (at least taskManager.replicas); "
        "required with addTaskManagers.", default=None, ge=1, le=1000,
    )

    @model_validator(mode="after")
    def _ceiling(self) -> CapacitySpec:
        if self.add_task_managers and self.max_task_managers is None:
            raise ValueError("capacity.addTaskManagers needs capacity.maxTaskManagers (the most TaskManagers it may "
                             "run)")
        return self


class SessionClusterSpec(SpecModel):
    """The cluster half of a FlinkApp's spec (see AppSpec for what each field does)."""

    flink_version: str = change(ChangeClass.UPGRADE, "Flink version, e.g. '2.3'.", default="2.3")
    image: str | None = change(ChangeClass.UPGRADE, "Container image (kubernetes runtime).", default=None)
    runtime: RuntimeHints = change(ChangeClass.REDEPLOY, "Runtime hints.", default=RuntimeHints())
    job_manager: JobManagerSpec = change(ChangeClass.UPGRADE, "JobManager.", default=JobManagerSpec())
    task_manager: TaskManagerSpec = change(
        ChangeClass.UPGRADE, "TaskManagers. Their slots (replicas x slots) are shared by the jobs of every app on "
        "this cluster: the sum of those jobs' parallelism must fit.", default=TaskManagerSpec())
    flink_configuration: dict[str, str] = change(
        ChangeClass.UPGRADE, "Flink configuration of the cluster (string values); every job on it runs with it.",
        default_factory=dict,
    )
    pod_template: dict[str, Any] | None = change(
        ChangeClass.UPGRADE, "A Pod template merged into every Flink pod (kubernetes).", default=None
    )
    high_availability: HighAvailability = change(
        ChangeClass.REDEPLOY, "JobManager high availability.", default=HighAvailability()
    )
    capacity: CapacitySpec = change(
        ChangeClass.SCALE, "When the running jobs need more slots than the TaskManagers have: refuse (default) or "
        "add TaskManagers.", default=CapacitySpec(),
    )

    @field_validator("flink_configuration", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        return AppSpec._stringify(v)

    @field_validator("flink_configuration")
    @classmethod
    def _flink_keys(cls, v: dict[str, str]) -> dict[str, str]:
        return AppSpec._flink_keys(v)

    @model_validator(mode="after")
    def _consistent(self) -> SessionClusterSpec:
        if self.job_manager.replicas > 1 and not self.high_availability.enabled:
            raise ValueError("jobManager.replicas > 1 needs highAvailability.enabled: true")
        most = self.capacity.max_task_managers
        if self.capacity.add_task_managers and most is not None and most < self.task_manager.replicas:
            raise ValueError(f"capacity.maxTaskManagers ({most}) is below taskManager.replicas "
                             f"({self.task_manager.replicas})")
        return self

    @property
    def slots(self) -> int:
        return self.task_manager.replicas * self.task_manager.slots


class FlinkSessionCluster(SpecModel):
    """One shared Flink cluster, as written in Git."""

    api_version: Literal["flink-reconciler.io/v1alpha1"] = Field(
        alias="apiVersion", description="Always flink-reconciler.io/v1alpha1."
    )
    kind: Literal["FlinkSessionCluster"] = Field(description="Always FlinkSessionCluster.")
    metadata: Metadata
    spec: SessionClusterSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    @cached_property
    def spec_hash(self) -> str:
        return content_hash(self.canonical()["spec"])

    def canonical(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def cluster_fields_given(doc: Any) -> list[str]:
    """The cluster fields a session app's document sets (by their YAML names): each one is refused."""
    spec = doc.get("spec") if isinstance(doc, dict) else None
    if not isinstance(spec, dict):
        return []
    names = {f: alias(f) for f in CLUSTER_FIELDS}
    return [a for f, a in names.items() if a in spec or f in spec]


def effective_app(app: FlinkApp, cluster: FlinkSessionCluster, replicas: int | None = None) -> FlinkApp:
    """`app` with the cluster fields of its session cluster: what it runs on, what is diffed and recorded.
    `replicas`: the TaskManagers the cluster runs for its jobs (`fit_replicas`), when more than its spec's."""
    fields = {f: getattr(cluster.spec, f) for f in CLUSTER_FIELDS}
    if replicas is not None and replicas != cluster.spec.task_manager.replicas:
        fields["task_manager"] = cluster.spec.task_manager.model_copy(update={"replicas": replicas})
    spec = app.spec.model_copy(update=fields)
    out = app.model_copy(update={"spec": spec})
    out.__dict__.pop("spec_hash", None)  # a cached hash of the app's own spec would be stale
    return out


def cluster_of(app: FlinkApp) -> dict[str, Any]:
    """The cluster-shaping part of an (effective) app's canonical spec."""
    spec = app.canonical()["spec"]
    return {alias(f): spec[alias(f)] for f in CLUSTER_FIELDS}


def session_generation(app: FlinkApp) -> str:
    """The generation of the session cluster an effective app runs on, from the cluster's spec alone: every app
    moved by one change of a session cluster names the same new cluster, and a resumed step finds it."""
    body = json.dumps(cluster_of(app), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:8]


def cluster_app(name: str, member: FlinkApp) -> FlinkApp:
    """The stand-in FlinkApp a runtime provisions session cluster `name` from: the cluster fields of `member`
    (an effective app on it), labelled as a session cluster. Its job is `member`'s, suspended: a standby's warm-up
    compiles that job's graph before the stop, and no slots are claimed for it."""
    meta = Metadata(name=name, namespace=member.metadata.namespace, labels={SESSION_LABEL: "true"})
    spec = AppSpec.model_validate({
        **{f: getattr(member.spec, f) for f in CLUSTER_FIELDS},
        "job": member.spec.job.model_copy(update={"state": JobState.SUSPENDED}),
    })
    return FlinkApp(api_version="flink-reconciler.io/v1alpha1", kind="FlinkApp", metadata=meta, spec=spec)


def running_parallelism(apps: list[FlinkApp]) -> int:
    return sum(a.spec.job.parallelism for a in apps if a.spec.job.state is JobState.RUNNING)


def fit_replicas(cluster: FlinkSessionCluster, apps: list[FlinkApp]) -> int:
    """The TaskManagers `cluster` runs for the running jobs of `apps`: its taskManager.replicas, or with
    capacity.addTaskManagers as many as their slots need (at most maxTaskManagers; `capacity_problem` says when
    that is not enough)."""
    tm, cap = cluster.spec.task_manager, cluster.spec.capacity
    if not cap.add_task_managers or cap.max_task_managers is None:
        return tm.replicas
    need = -(-running_parallelism(apps) // tm.slots)  # ceiling
    return max(tm.replicas, min(need, cap.max_task_managers))


def capacity_problem(cluster: FlinkSessionCluster, apps: list[FlinkApp]) -> str | None:
    """Why the running jobs of `apps` do not fit into `cluster`'s slots, naming the numbers; None when they fit."""
    need = running_parallelism(apps)
    tm, cap = cluster.spec.task_manager, cluster.spec.capacity
    replicas = fit_replicas(cluster, apps)
    if need <= replicas * tm.slots:
        return None
    each = ", ".join(f"{a.name} {a.spec.job.parallelism}" for a in sorted(apps, key=lambda a: a.name)
                     if a.spec.job.state is JobState.RUNNING)
    if cap.add_task_managers:
        return (f"session cluster {cluster.name!r} may run at most {cap.max_task_managers} TaskManagers "
                f"(capacity.maxTaskManagers) x {tm.slots} slots = {replicas * tm.slots} task slots, but its running "
                f"jobs need {need} ({each}): raise capacity.maxTaskManagers or taskManager.slots, or lower a job's "
                "parallelism")
    return (f"session cluster {cluster.name!r} has {cluster.spec.slots} task slots (taskManager.replicas "
            f"{tm.replicas} x slots {tm.slots}) but its running jobs need {need} ({each}): raise the cluster's "
            "taskManager.replicas or slots, set capacity.addTaskManagers (with maxTaskManagers), or lower a job's "
            "parallelism")
