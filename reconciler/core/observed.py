"""What the planner knows about the world besides Git: live state and recorded history.

Both are plain frozen values built by the shell (`reconciler.live`, `reconciler.apply.journal`), so
the planner stays a pure function that tests can feed from tables.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClusterPhase(StrEnum):
    ABSENT = "absent"  # nothing provisioned for this app
    STARTING = "starting"
    READY = "ready"  # REST reachable, TaskManagers registered
    FAILED = "failed"  # provisioned but not coming up (crash loop, image pull, unschedulable)
    UNKNOWN = "unknown"  # could not observe: never treated as absent


class JobPhase(StrEnum):
    """Flink job states folded into what a decision needs."""

    NONE = "none"  # no job on the cluster
    STARTING = "starting"  # CREATED / INITIALIZING / RUNNING with tasks not all running / RESTARTING
    RUNNING = "running"  # RUNNING and every task running
    FAILING = "failing"  # FAILING / FAILED
    STOPPED = "stopped"  # CANCELED / FINISHED / SUSPENDED
    UNKNOWN = "unknown"


FLINK_STATE_TO_PHASE: dict[str, JobPhase] = {
    "CREATED": JobPhase.STARTING,
    "INITIALIZING": JobPhase.STARTING,
    "RESTARTING": JobPhase.STARTING,
    "RECONCILING": JobPhase.STARTING,
    "RUNNING": JobPhase.STARTING,  # promoted to RUNNING only when every task runs
    "FAILING": JobPhase.FAILING,
    "FAILED": JobPhase.FAILING,
    "CANCELLING": JobPhase.STOPPED,
    "CANCELED": JobPhase.STOPPED,
    "FINISHED": JobPhase.STOPPED,
    "SUSPENDED": JobPhase.STOPPED,
}


def job_phase(flink_state: str | None, tasks_running: int = 0, tasks_total: int = 0,
              tasks_finished: int = 0) -> JobPhase:
    """RUNNING means every task runs, or has finished (a source subtask with nothing to read ends
    early; since FLIP-147 such a job still checkpoints and takes savepoints)."""
    if flink_state is None:
        return JobPhase.NONE
    phase = FLINK_STATE_TO_PHASE.get(flink_state.upper(), JobPhase.UNKNOWN)
    if (flink_state.upper() == "RUNNING" and tasks_total > 0 and tasks_running > 0
            and tasks_running + tasks_finished == tasks_total):
        return JobPhase.RUNNING
    return phase


class Checkpoint(Frozen):
    """A retained checkpoint or savepoint a job could be restored from."""

    path: str
    completed_at: datetime
    is_savepoint: bool = False


class OperatorDeployment(Frozen):
    """A FlinkDeployment of the Apache Flink Kubernetes Operator that an app of ours would take over (its name
    and namespace, or the app's spec.takeover), as far as a takeover needs to know it."""

    namespace: str
    name: str
    job_state: str | None = None  # its spec.job.state (running | suspended), restored if a suspend is undone
    upgrade_mode: str | None = None  # its spec.job.upgradeMode, likewise
    lifecycle: str | None = None  # status.lifecycleState
    refusal: str | None = None  # why it must not be taken over now (operator_migration.status.takeover_refusal)
    # Why no suspend may be asked of it (already suspended, or its job not RUNNING): operator_migration.status's
    # suspend_refusal. Already suspended, a spec naming initialSavepointPath is taken over from that.
    not_suspendable: str | None = None
    fallback: str | None = None  # its kubernetes.operator.job.upgrade.last-state-fallback.enabled, as it was
    unreadable: str | None = None  # the FlinkDeployments could not be listed: why


class LiveApp(Frozen):
    name: str
    cluster: ClusterPhase
    cluster_message: str | None = None
    job_id: str | None = None
    flink_state: str | None = None
    job: JobPhase = JobPhase.NONE
    latest_checkpoint: Checkpoint | None = None
    # Health only (metrics and alerts, docs/alerts.md), never a decision, not part of the fingerprint: Flink's
    # numRestarts of the job and its failed checkpoints (None: not known).
    restarts: int | None = None
    checkpoints_failed: int | None = None
    # What the runtime says it deployed (k8s annotation / local cluster metadata), if it says.
    deployed_spec_hash: str | None = None
    # Evidence of a past, for an app the records forgot (lost disk, new pod): the planner adopts the
    # app with this state or blocks, never starts it empty. Not part of the fingerprint.
    stopped_job_id: str | None = None  # the newest job on the cluster, ended (CANCELED/FINISHED/...)
    stopped_savepoint: Checkpoint | None = None  # the savepoint that job was stopped with
    stored_savepoint: Checkpoint | None = None  # newest complete savepoint in the app's savepoint dir
    stored_checkpoint: Checkpoint | None = None  # newest complete retained checkpoint in its checkpoint dir
    evidence_error: str | None = None  # some evidence could not be read: never read as "no evidence"
    # Other clusters of the app beside the live one (a warm standby's generation; an old, retired cluster).
    # Not part of the fingerprint. With nothing in flight they are leftovers: the planner removes them.
    standby_generation: str | None = None
    retired_cluster: bool = False
    # Processes of the live cluster that died while its JobManager stays up (a kill -9'd TaskManager): the
    # runtime restarts them in place (EnsureCluster) and Flink restores the job from its latest checkpoint.
    # Only what nothing else restarts is reported: a dead local process; on Kubernetes, where the kubelet and the
    # workload controllers replace pods, a deleted workload ("jobmanager" / "taskmanager").
    missing_processes: tuple[str, ...] = ()
    # A job whose JobManager is gone while the runtime keeps Flink's HA data of it (Kubernetes HA: its job graph
    # and the pointer to its latest checkpoint, which the reconciler cannot read itself): the same job id started
    # again resumes from that checkpoint. Not part of the fingerprint.
    ha_job_id: str | None = None
    job_exception: str | None = None  # the root exception Flink reports for a job that is not running
    # The runtime's own account of this app cannot be read (a corrupt cluster.json, a root ConfigMap's pointer
    # edited by hand): what is wrong and what to do. The app is BLOCKED until a human repairs it.
    unreadable: str | None = None
    # The operator's FlinkDeployment this app would take over (observed only for apps without a record, or
    # whose spec names one); None: there is none, or nobody looked.
    operator: OperatorDeployment | None = None

    @property
    def has_evidence(self) -> bool:
        return any((self.stopped_savepoint, self.stored_savepoint, self.stored_checkpoint, self.latest_checkpoint,
                    self.evidence_error))

    def fingerprint_fields(self) -> dict[str, Any]:
        # Checkpoint paths move every few seconds; they do not make a plan stale.
        out: dict[str, Any] = {
            "cluster": self.cluster.value,
            "job_id": self.job_id,
            "job": self.job.value,
            "spec": self.deployed_spec_hash,
        }
        if self.operator is not None:  # only then: every other app's fingerprint stays what it was
            out["operator"] = [self.operator.namespace, self.operator.name, self.operator.lifecycle]
        return out


class LiveState(Frozen):
    apps: dict[str, LiveApp] = {}
    complete: bool = True  # False: some apps could not be observed (their LiveApp is UNKNOWN)

    def get(self, name: str) -> LiveApp:
        return self.apps.get(name) or LiveApp(name=name, cluster=ClusterPhase.ABSENT)

    def fingerprint(self) -> str:
        # An ABSENT app listed only for its stored evidence fingerprints like an app not listed at all.
        body = {n: a.fingerprint_fields() for n, a in sorted(self.apps.items())
                if a.cluster is not ClusterPhase.ABSENT or a.operator is not None}
        return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]


class Outcome(StrEnum):
    PENDING = "pending"
    SUCCESS = "success"
    FAILURE = "failure"
    ERROR = "error"


class SavepointRecord(Frozen):
    path: str
    taken_at: datetime
    job_id: str | None = None
    revision: str | None = None
    kind: str = "savepoint"  # savepoint | checkpoint (a checkpoint adopted as restore point)


class AppRecord(Frozen):
    """The journal's durable memory of one app (Flux-style: attempted and applied kept apart)."""

    name: str
    source_file: str | None = None
    last_applied_revision: str | None = None
    last_applied_spec: dict[str, Any] | None = None  # canonical FlinkApp JSON
    last_attempted_revision: str | None = None
    last_attempted_spec_hash: str | None = None
    last_outcome: Outcome | None = None
    last_message: str | None = None
    attempts: int = 0  # attempts at last_attempted_revision
    job_id: str | None = None
    savepoints: tuple[SavepointRecord, ...] = ()
    last_action: str | None = None  # the action of the last attempt (a failed repair is not a failed spec)
    # Self-healing (docs/plan.md#self-healing): since when the job is seen not running healthy (None:
    # healthy or unknown), and when automatic repairs of `repairs_spec_hash` began (the crash-loop window).
    unhealthy_since: datetime | None = None
    repairs: tuple[datetime, ...] = ()
    repairs_spec_hash: str | None = None
    # Every job id this app's executions submitted, as far as its lineage goes back: a retained checkpoint of
    # another job is not this app's newest state (a copied directory, a reused name).
    job_ids: tuple[str, ...] = ()
    # The last spec whose own execution failed (an upgrade, a create, a scale; not a repair, not an interruption),
    # kept while repairs run meanwhile: a repair rewrites `last_attempted_*` to the spec it runs, and the failed spec
    # must still not be tried again until Git changes it (`core.context.failed_before`). A success of a new spec
    # clears it.
    failed_spec_hash: str | None = None
    failed_revision: str | None = None
    failed_message: str | None = None

    @property
    def latest_savepoint(self) -> SavepointRecord | None:
        return max(self.savepoints, key=lambda s: s.taken_at, default=None)

    @property
    def ran_here(self) -> bool:
        """Whether the app ran here: a spec of it was applied, or a job or savepoint of it is on record. A record of
        blocked or refused attempts alone is no run: such an app is still seen for the first time (a takeover from
        the Flink Kubernetes Operator is still looked for, core.takeover)."""
        return self.last_applied_spec is not None or self.job_id is not None or bool(self.job_ids or self.savepoints)


class Records(Frozen):
    apps: dict[str, AppRecord] = {}
    # Apps whose record exists but cannot be used (unreadable, or written by a newer version): app -> what is
    # wrong and what to do. Such an app is BLOCKED, never planned as if it had no record (a "first sight").
    broken: dict[str, str] = {}

    def get(self, name: str) -> AppRecord | None:
        return self.apps.get(name)
