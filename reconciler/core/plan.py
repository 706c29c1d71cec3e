"""The plan: a serializable, reviewable artifact (terraform's plan file, for Flink).

`apply` is driven by `AppPlan.steps` alone; `reason` and `risks` only explain. A plan records the
revision and the fingerprint of the live state it assumed, so `apply --plan` can refuse a stale one.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reconciler.spec.model import ChangeClass, ChangeClassJSON, content_hash

FORMAT_VERSION: Literal[1] = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Action(StrEnum):
    CREATE = "create"
    UPGRADE = "upgrade"
    SCALE = "scale"
    SUSPEND = "suspend"
    RESUME = "resume"
    RESTART = "restart"
    DELETE = "delete"
    REPAIR = "repair"  # live drifted from Git (job died, cluster removed): bring it back
    TAKEOVER = "takeover"  # an app the Apache Flink Kubernetes Operator runs moves here, from its savepoint
    NOOP = "no-op"
    BLOCKED = "blocked"  # needs a human; reason says exactly what to do
    ERROR = "error"  # the spec is invalid; nothing is done to this app


DISRUPTIVE = frozenset({Action.CREATE, Action.UPGRADE, Action.SUSPEND, Action.RESUME, Action.RESTART,
                        Action.DELETE, Action.REPAIR, Action.SCALE, Action.TAKEOVER})


class SpecRef(StrEnum):
    DESIRED = "desired"
    PREVIOUS = "previous"


class RestoreKind(StrEnum):
    NONE = "none"  # empty state: only ever planned with a risk line and the spec's consent
    CAPTURED = "captured"  # the restore point this plan captured (its savepoint, or the cancelled job's checkpoint)
    PATH = "path"  # a known savepoint/checkpoint path (fallback checkpoint, initialSavepointPath, last savepoint)


class Restore(_Frozen):
    kind: RestoreKind
    path: str | None = None

    def describe(self) -> str:
        if self.kind is RestoreKind.NONE:
            return "empty state"
        if self.kind is RestoreKind.CAPTURED:
            return "the savepoint/checkpoint captured above"
        return self.path or "?"


NO_STATE = Restore(kind=RestoreKind.NONE)
CAPTURED = Restore(kind=RestoreKind.CAPTURED)


class _Step(_Frozen):
    deadline_s: float = Field(gt=0, description="The step fails when it runs longer than this.")


class EnsureCluster(_Step):
    """Provision or reconfigure the app's cluster (resources only; the job is untouched).

    `keep_running`: a job runs on the cluster and keeps running (a scale, a repair of dead processes): the processes
    that run it are kept as they are, only TaskManagers are added, removed or restarted. What the spec did not ask
    for (the reconciler of a newer version renders a config or pod differently) never replaces them then; it comes
    with the app's next new job (docs/kubernetes.md, "Upgrading the reconciler")."""

    type: Literal["EnsureCluster"] = "EnsureCluster"
    spec: SpecRef = SpecRef.DESIRED
    keep_running: bool = False


class StopWithSavepoint(_Step):
    """Stop the job with a savepoint; the savepoint becomes the CAPTURED restore point."""

    type: Literal["StopWithSavepoint"] = "StopWithSavepoint"
    job_id: str
    drain: bool = False


class CancelJob(_Step):
    """Cancel a job. Retained checkpoints survive; with capture=True its latest one becomes CAPTURED."""

    type: Literal["CancelJob"] = "CancelJob"
    job_id: str
    capture_checkpoint: bool = False


class StartJob(_Step):
    type: Literal["StartJob"] = "StartJob"
    spec: SpecRef = SpecRef.DESIRED
    job_id: str
    restore: Restore
    allow_non_restored_state: bool = False


class AwaitRunning(_Step):
    """Until the job is RUNNING with every task running."""

    type: Literal["AwaitRunning"] = "AwaitRunning"
    job_id: str


class AwaitHealthy(_Step):
    """Until the job completed a checkpoint after it started (skipped when checkpointing is off)."""

    type: Literal["AwaitHealthy"] = "AwaitHealthy"
    job_id: str


class DeleteCluster(_Step):
    type: Literal["DeleteCluster"] = "DeleteCluster"
    # A job on a session cluster: only the app's part goes (its jobs, its jars); the shared cluster stays.
    session_cluster: str | None = None


# Warm standby (a change that needs new JVMs, on a runtime that can run two clusters of one app): the
# new cluster starts beside the running job, so its start is not downtime. `generation` names that
# cluster (deterministic per app, revision and attempt, like job ids), so a resumed step finds it.


class StartStandbyCluster(_Step):
    """Start a second cluster of the app for `spec`, beside the live one and without a job, and wait until
    its TaskManagers' slots registered. The running job is not touched."""

    type: Literal["StartStandbyCluster"] = "StartStandbyCluster"
    spec: SpecRef = SpecRef.DESIRED
    generation: str = Field(pattern=r"^[a-z0-9]{1,12}$")


class PromoteStandby(_Step):
    """The standby becomes the app's live cluster (where its job is submitted and watched); the old one is
    kept, retired, so a rollback can restart the previous job on it."""

    type: Literal["PromoteStandby"] = "PromoteStandby"
    generation: str = Field(pattern=r"^[a-z0-9]{1,12}$")


class DiscardStandby(_Step):
    """Undo a warm standby: the retired cluster is live again (when the standby was promoted) and the
    standby is deleted. A no-op when neither exists."""

    type: Literal["DiscardStandby"] = "DiscardStandby"
    generation: str = Field(pattern=r"^[a-z0-9]{1,12}$")


class DeleteRetiredCluster(_Step):
    """Delete the app's old cluster, retired by PromoteStandby, once the job runs on the new one."""

    type: Literal["DeleteRetiredCluster"] = "DeleteRetiredCluster"


class RescaleInPlace(_Step):
    """Ask the running job for a new parallelism through Flink's adaptive scheduler (its resource requirements)
    and wait until its vertices run at it, RUNNING, and it completed a checkpoint since. The same job keeps
    running. Done: the app is applied and the steps after it are skipped. Failed (Flink refuses, or does not
    adopt it before the deadline): they are its fallback, the regular upgrade, and run instead."""

    type: Literal["RescaleInPlace"] = "RescaleInPlace"
    job_id: str
    parallelism: int = Field(ge=1)
    previous_parallelism: int = Field(ge=1)  # vertices running at this (the job's default) move to `parallelism`


# Takeover of an app the Apache Flink Kubernetes Operator runs (core.takeover): the operator stops its own job
# (its pods are never ours to kill), we read where its savepoint went, remove its FlinkDeployment, and the job
# starts here from that savepoint. `namespace`/`name` name the FlinkDeployment.


class SuspendOperatorDeployment(_Step):
    """Ask the operator for a savepoint and a stop (its FlinkDeployment's spec.job.state: suspended, upgradeMode:
    savepoint), wait until its status says SUSPENDED, and keep status.jobStatus.upgradeSavepointPath as the
    CAPTURED restore point (journaled as soon as it is read) only once it is proven to be a savepoint this suspend
    produced (operator_migration.status.suspension)."""

    type: Literal["SuspendOperatorDeployment"] = "SuspendOperatorDeployment"
    namespace: str
    name: str


class DeleteOperatorDeployment(_Step):
    """Delete the suspended FlinkDeployment and wait until it, its pods and its Services are gone (our Services
    take their names). Savepoints are in object storage, which no propagation policy touches."""

    type: Literal["DeleteOperatorDeployment"] = "DeleteOperatorDeployment"
    namespace: str
    name: str


class ReleaseOperatorDeployment(_Step):
    """Undo a suspend request that did not complete: every field the suspend patched (spec.job.state,
    spec.job.upgradeMode, the last-state fallback setting) as it was before, from what the suspend step journaled
    before patching, so the operator runs its job on. A no-op when nothing was patched or it is gone. `state` and
    `upgrade_mode` are what the plan saw (for its text)."""

    type: Literal["ReleaseOperatorDeployment"] = "ReleaseOperatorDeployment"
    namespace: str
    name: str
    state: str = "running"
    upgrade_mode: str | None = None  # None: leave it as it is


class ForgetApp(_Step):
    """Stop managing the app (deletionPolicy orphan): history is kept, the cluster keeps running."""

    type: Literal["ForgetApp"] = "ForgetApp"


Step = Annotated[
    EnsureCluster | StopWithSavepoint | CancelJob | StartJob | AwaitRunning | AwaitHealthy | DeleteCluster
    | ForgetApp | StartStandbyCluster | PromoteStandby | DiscardStandby | DeleteRetiredCluster
    | RescaleInPlace | SuspendOperatorDeployment | DeleteOperatorDeployment | ReleaseOperatorDeployment,
    Field(discriminator="type"),
]


def _job(job_id: str) -> str:
    return "the running job" if job_id.startswith("<") else f"job {job_id}"


def describe_step(step: Step) -> str:
    """One line a reviewer can read."""
    match step:
        case EnsureCluster(spec=spec, keep_running=True):
            return f"ensure cluster resources ({spec.value} spec; the running job's processes are kept)"
        case EnsureCluster(spec=spec):
            return f"ensure cluster resources ({spec.value} spec)"
        case StopWithSavepoint(job_id=job_id, drain=drain):
            return f"stop {_job(job_id)} with a savepoint" + (" (drain)" if drain else "")
        case CancelJob(job_id=job_id, capture_checkpoint=cap):
            return f"cancel {_job(job_id)}" + (" (keep its latest checkpoint as restore point)" if cap else "")
        case StartJob(spec=spec, job_id=job_id, restore=restore, allow_non_restored_state=anrs):
            extra = ", allowNonRestoredState" if anrs else ""
            return f"start job {job_id} ({spec.value} spec) from {restore.describe()}{extra}"
        case AwaitRunning(job_id=job_id):
            return f"wait until job {job_id} is RUNNING with all tasks running"
        case AwaitHealthy(job_id=job_id):
            return f"wait until job {job_id} completes a checkpoint"
        case DeleteCluster(session_cluster=str(session)):
            return f"remove the app from session cluster {session} (the cluster keeps running its other jobs)"
        case DeleteCluster():
            return "delete the cluster"
        case ForgetApp():
            return "stop managing the app (cluster left running)"
        case StartStandbyCluster(spec=spec, generation=gen):
            return f"start standby cluster {gen} ({spec.value} spec) beside the running job, wait until it is ready"
        case PromoteStandby(generation=gen):
            return f"make standby cluster {gen} the live one (the old cluster is kept for a rollback)"
        case DiscardStandby(generation=gen):
            return f"discard standby cluster {gen} (the old cluster stays or is live again)"
        case DeleteRetiredCluster():
            return "delete the old cluster"
        case RescaleInPlace(job_id=job_id, parallelism=p, previous_parallelism=old):
            return (f"rescale {_job(job_id)} in place from parallelism {old} to {p} (adaptive scheduler), wait until "
                    "its vertices run at it and it checkpoints, then apply the cluster at the new spec (no restart); "
                    "if Flink refuses or does not adopt it in time, the steps below run instead")
        case SuspendOperatorDeployment(namespace=ns, name=name):
            return (f"ask the Flink Kubernetes Operator to stop FlinkDeployment {ns}/{name} with a savepoint, never "
                    "without one (spec.job.state: suspended, upgradeMode: savepoint, last-state fallback off), wait "
                    "until it is SUSPENDED, keep the savepoint only if this suspend produced it")
        case DeleteOperatorDeployment(namespace=ns, name=name):
            return (f"delete FlinkDeployment {ns}/{name}, wait until its pods, Services and ConfigMaps (HA metadata "
                    "included) are gone (savepoints kept)")
        case ReleaseOperatorDeployment(namespace=ns, name=name):
            return (f"give FlinkDeployment {ns}/{name} back to the operator (every field the suspend set, as it "
                    "was)")
    raise AssertionError(step)  # pragma: no cover


class FieldChange(_Frozen):
    op: Literal["add", "remove", "replace"]
    path: str  # JSON pointer into the FlinkApp document, e.g. /spec/job/parallelism
    old: Any = None
    new: Any = None
    change_class: ChangeClassJSON


class ClusterStrategy(StrEnum):
    """How an upgrade reaches the job's cluster (shown in the plan)."""

    JOB_ONLY = "job-only"  # the cluster is kept: only the job restarts
    WARM_STANDBY = "warm-standby"  # a new cluster starts beside the running job; the job moves when it is ready
    COLD = "cold"  # the job stops, then the cluster restarts (its start is downtime)


class AppPlan(_Frozen):
    app: str
    action: Action
    reason: str
    risks: tuple[str, ...] = ()
    change_class: ChangeClassJSON = ChangeClass.IGNORE
    diff: tuple[FieldChange, ...] = ()
    steps: tuple[Step, ...] = ()
    # Failure path: when a step at index > rollback_after fails, run `rollback` (back to `previous`).
    rollback_after: int | None = None
    rollback: tuple[Step, ...] = ()
    # When a step at index <= rollback_after fails (the old job was not stopped): undo what the plan did
    # beside it (a warm standby's cluster), so nothing of the failed attempt is left behind.
    abort: tuple[Step, ...] = ()
    cluster_strategy: ClusterStrategy | None = None  # upgrades: how the cluster is changed
    desired: dict[str, Any] | None = None  # canonical FlinkApp JSON this plan deploys
    previous: dict[str, Any] | None = None  # what ran before (the rollback target)
    source_file: str | None = None
    upgrade_mode: str | None = None
    # A repair (or the wait before one): what failed — taskmanager | jobmanager | cluster | job. Metrics count
    # repairs by it (flink_reconciler_repairs_total{kind}).
    repair: str | None = None
    # What the execution is, when its action alone does not say: "rollback" (`rollback APP --to REV`, an
    # upgrade to REV's spec). History and lineage name the execution by it.
    purpose: Literal["rollback"] | None = None
    # A repair at the last applied spec because Git's spec failed and nothing runs (`core.heal.heal_previous`):
    # why Git's spec failed (said with the repair on the commit, whose status stays a failure).
    failed: str | None = None
    # A repair that deploys the last applied spec while Git has another (the one above; a dead process restarted
    # at the spec that runs): the revision that spec was applied at, where its jar and its lineage belong.
    desired_revision: str | None = None

    @property
    def label(self) -> str:
        """The name history gives this execution: its purpose, else its action."""
        return self.purpose or self.action.value

    @property
    def changes(self) -> bool:
        return self.action not in (Action.NOOP,)


class ClusterPlan(_Frozen):
    """What happens to one FlinkSessionCluster. Its jobs move in their apps' own plans (each its own journaled
    transition); this entry says what that means for the cluster, and deletes it (after its apps, `--prune`)."""

    cluster: str
    action: Action
    reason: str
    apps: tuple[str, ...] = ()  # the apps whose jobs run on it (desired), or that still name it
    risks: tuple[str, ...] = ()
    steps: tuple[DeleteCluster, ...] = ()
    source_file: str | None = None


class Plan(_Frozen):
    format_version: Literal[1] = FORMAT_VERSION
    revision: str  # the Git revision whose specs this plan deploys
    base_revision: str | None = None
    mode: Literal["offline", "live"] = "live"
    live_fingerprint: str
    apps: tuple[AppPlan, ...] = ()
    guard: str | None = None  # set when the mass-deletion guard refused deletions
    clusters: tuple[ClusterPlan, ...] = ()  # FlinkSessionClusters (core/session_planner.py)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        return cls.model_validate_json(text)

    def app(self, name: str) -> AppPlan:
        for a in self.apps:
            if a.app == name:
                return a
        raise KeyError(name)

    @property
    def has_changes(self) -> bool:
        return (any(a.action is not Action.NOOP for a in self.apps)
                or any(c.action is not Action.NOOP for c in self.clusters))

    @property
    def has_errors(self) -> bool:
        return any(a.action is Action.ERROR for a in self.apps)


_NUMBER = re.compile(r"[0-9]+")


# The record's last action when an execution was cut off by a fault (its job died with its JobManager mid-way), not
# refused by the spec: its failure is not "this spec already failed" (core.context.failed_before).
INTERRUPTED = "interrupted"


def reason_key(text: str) -> str:
    """A reason with its numbers blanked: "the latest checkpoint is 12s old" said again a pass later (13s) is the
    same answer, so history, notes and commit statuses record it once, not on every pass."""
    return _NUMBER.sub("#", text)


def deterministic_job_id(app: str, revision: str, attempt: int, purpose: str = "start") -> str:
    """A Flink JobID (32 hex chars) that a retried submit reproduces, so it can never run twice. It ends in the
    app's tag, so the jobs of many apps on one session cluster are told apart (`is_job_of`)."""
    digest = hashlib.sha256(f"{app}\0{revision}\0{attempt}\0{purpose}".encode()).hexdigest()
    return digest[:24] + app_tag(app)


def app_tag(app: str) -> str:
    return hashlib.sha256(f"app\0{app}".encode()).hexdigest()[:8]


def is_job_of(job_id: str, app: str) -> bool:
    """Whether `job_id` is one of `app`'s (every job id we submit ends in its app's tag)."""
    return job_id.endswith(app_tag(app))


def spec_hash(canonical: dict[str, Any]) -> str:
    """`FlinkApp.spec_hash` of a canonical document (a plan's `desired`), without re-validating it."""
    return content_hash(canonical.get("spec", canonical))
