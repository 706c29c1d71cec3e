"""The seams between the executor and the outside: a Flink REST API and a runtime.

The executor, `status` and the daemon code against these Protocols; `live.flink.FlinkRestClient`,
`live.local.runtime.LocalRuntime` and `live.kubernetes.runtime.KubernetesRuntime` implement them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from reconciler.core.observed import Checkpoint, ClusterPhase
from reconciler.spec.model import FlinkApp


@dataclass(frozen=True)
class ClusterOverview:
    taskmanagers: int
    slots_total: int
    slots_available: int
    flink_version: str


@dataclass(frozen=True)
class JobSummary:
    job_id: str
    name: str
    state: str  # Flink's own state name: RUNNING, FAILED, ...
    tasks_running: int
    tasks_total: int
    start_time_ms: int
    tasks_finished: int = 0  # e.g. a source subtask without splits; it counts as done, not as missing


@dataclass(frozen=True)
class CheckpointStats:
    completed_count: int
    latest_completed_id: int | None
    latest_completed_path: str | None
    latest_completed_at: datetime | None  # when it completed (UTC)
    restored_path: str | None
    restored_is_savepoint: bool | None
    # `latest.savepoint`: Flink lists savepoints apart from checkpoints; for a job ended by
    # stop-with-savepoint this is the savepoint it stopped with.
    latest_savepoint_path: str | None = None
    latest_savepoint_at: datetime | None = None
    failed_count: int = 0  # `counts.failed`: checkpoints of this job that failed (health only)


@dataclass(frozen=True)
class SavepointStatus:
    done: bool
    location: str | None = None  # set on success
    failure: str | None = None  # Flink's failure cause, set on failure


@runtime_checkable
class RestartCount(Protocol):
    """A JobManager that can say how often a job restarted (Flink's numRestarts), for health metrics only."""

    def restarts(self, job_id: str) -> int | None: ...


class FlinkApi(Protocol):
    """A JobManager's REST API. Every call has a timeout; errors are `FlinkRestError`s that are
    `TransientStepError` or `PermanentStepError` by class; unknown jobs raise `JobNotFoundError`, unknown
    savepoint triggers `TriggerNotFoundError`."""

    def overview(self) -> ClusterOverview: ...
    def jobs(self) -> list[JobSummary]: ...
    def job(self, job_id: str) -> JobSummary: ...
    # trigger_id: the caller's own id (32 hex), journaled before the call, so a resent request is
    # recognised by Flink instead of starting a second savepoint (FLINK-24208).
    def trigger_savepoint(self, job_id: str, *, cancel_job: bool = False, trigger_id: str | None = None) -> str: ...
    def stop_with_savepoint(self, job_id: str, *, drain: bool = False, trigger_id: str | None = None) -> str: ...
    def savepoint_status(self, job_id: str, trigger_id: str) -> SavepointStatus: ...
    def cancel(self, job_id: str) -> None: ...
    def checkpoints(self, job_id: str) -> CheckpointStats: ...
    def upload_jar(self, path: Path) -> str: ...
    def run_jar(
        self,
        jar_id: str,
        *,
        job_id: str,
        entry_class: str | None = None,
        args: tuple[str, ...] = (),
        parallelism: int | None = None,
        savepoint_path: str | None = None,
        allow_non_restored_state: bool = False,
        flink_configuration: dict[str, str] | None = None,
    ) -> str: ...
    def exceptions(self, job_id: str) -> list[str]: ...


@dataclass(frozen=True)
class ClusterInfo:
    app: str
    phase: ClusterPhase
    rest_url: str | None = None
    message: str | None = None  # why it is FAILED/STARTING (pod reason, JVM exit)
    spec_hash: str | None = None  # hash of the spec the cluster was provisioned for
    # Besides the live cluster (StandbyRuntime): a warm standby's generation, and whether an old cluster a
    # promotion retired is still there. Seen with no execution in flight, they are leftovers to remove.
    standby_generation: str | None = None
    retired_cluster: bool = False
    # Processes of the cluster that died while its JobManager is up (names like taskmanager-1): a runtime with
    # nothing else to restart them reports them (local: a dead process; Kubernetes: a deleted workload, as
    # "jobmanager"/"taskmanager"), and EnsureCluster (StartJob for a JobManager) brings them back.
    missing: tuple[str, ...] = ()
    # A job of this app whose JobManager is gone while Flink's HA data of it remains (Kubernetes HA: its job graph
    # and latest checkpoint): started again under the same id, Flink resumes it from that checkpoint.
    ha_job_id: str | None = None
    # The runtime's own files/objects about this app cannot be read (phase UNKNOWN): what is wrong, what to do.
    unreadable: str | None = None
    session: bool = False  # the cluster of a FlinkSessionCluster (live/session.py), not of one app


class Runtime(Protocol):
    """Provisions one Flink cluster per app and says where its REST API is.

    Every method is idempotent, so a resumed step can simply call it again. `deadline` is a value of
    the injected clock's `monotonic()`; a method that cannot finish by then raises DeadlineExceededError
    with the most specific reason it knows (JVM exit code, pod status)."""

    name: str
    # Whether something outside the reconciler restarts dead Flink processes (Kubernetes: Deployments, the kubelet).
    # Where nothing does (local processes), a JobManager found dead mid-upgrade was killed, not crash-looping, and a
    # killed TaskManager comes back only if a step restarts it.
    restarts_processes: bool

    def list_clusters(self) -> dict[str, ClusterInfo]:
        """Every cluster this runtime manages, in one call (not one per app)."""
        ...

    def observe(self, app: str) -> ClusterInfo: ...

    def ensure_cluster(self, app: FlinkApp, *, deadline: float, keep_running: bool = False) -> ClusterInfo:
        """Start or reconfigure the cluster for `app` (no job) and wait until it is READY. `keep_running`
        (`core.plan.EnsureCluster`): a job runs on it and must go on running: the JobManager and the running
        TaskManagers are kept as they are (their config, their JVMs or pods); only TaskManagers are added,
        removed or brought back."""
        ...

    def start_job(
        self,
        app: FlinkApp,
        *,
        job_id: str,
        jar: Path | None,
        restore_path: str | None,
        allow_non_restored_state: bool,
        deadline: float,
    ) -> str:
        """Submit the job with this id (or find it already submitted). `jar` is the resolved local jar
        (None when the runtime takes it from the image, e.g. local:// on Kubernetes)."""
        ...

    def delete_cluster(self, app: str, *, deadline: float) -> None: ...

    def flink(self, app: str) -> FlinkApi:
        """The REST client of the app's JobManager."""
        ...

    def stored_snapshots(self, app: str) -> list[Checkpoint]:
        """Complete savepoints and retained checkpoints of `app` in its storage, newest first: the
        evidence of a past that outlives the cluster and the records. Raises ObserveError when the
        storage cannot be read (never answers [] for "could not look")."""
        ...


@runtime_checkable
class StandbyRuntime(Runtime, Protocol):
    """A runtime that can run a second cluster of an app beside its live one: a warm standby, so a change
    that needs new JVMs does not put the cluster start into the job's downtime. A runtime without these
    methods gets cold plans (`core.planner.Policy.warm_standby`); the plan says so.

    The clusters of one app are told apart by a generation (a short token the plan chooses, deterministic
    per revision and attempt). At most three exist for a moment: the live one (which `observe`, `flink`,
    `start_job` and `ensure_cluster` address), a standby, and the retired one a promotion left for a
    rollback. Every method is idempotent and holds across a crash of the caller at any point: the runtime's
    own records say which cluster is live. `delete_cluster` removes all of them."""

    def start_standby(self, app: FlinkApp, *, generation: str, deadline: float, jar: Path | None = None
                      ) -> ClusterInfo:
        """Start (or find) standby `generation` for `app`, without a job, and wait until it is READY (every
        TaskManager's slots registered). A standby of another generation is deleted first. `jar` (the resolved
        job jar, None when the image has it) may be made ready there, out of the downtime window."""
        ...

    def promote_standby(self, app: str, *, generation: str, deadline: float) -> None:
        """Standby `generation` becomes the live cluster; the live one is retired (kept, not stopped). Done
        already when `generation` is live; PermanentStepError when there is no such standby."""
        ...

    def discard_standby(self, app: str, *, generation: str, deadline: float) -> None:
        """Undo: when `generation` is live, the retired cluster is live again; then cluster `generation` is
        deleted. No such cluster: nothing to do."""
        ...

    def delete_retired(self, app: str, *, deadline: float) -> None:
        """Delete the retired cluster, if there is one."""
        ...


@runtime_checkable
class StandbyCapacity(Protocol):
    """A StandbyRuntime that can tell, before planning, when a second cluster of an app would not fit (the
    kubernetes runtime: the namespace's ResourceQuotas). Those apps are planned cold, and the plan says why."""

    def standby_refusals(self, apps: list[FlinkApp]) -> dict[str, str]:
        """app name -> why a warm standby of it (at its desired spec) would not fit now; apps that fit are absent.
        Raises ObserveError when it cannot look."""
        ...


@runtime_checkable
class OperatorTakeover(Protocol):
    """A runtime that can take over apps from the Apache Flink Kubernetes Operator (the kubernetes runtime): it
    reads, patches and deletes the operator's FlinkDeployments. It never touches the operator's pods: the operator
    stops its job itself, and its pods go with the FlinkDeployment. Documents are the API server's JSON."""

    def flink_deployments(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every FlinkDeployment in the watched namespaces, by (namespace, name); none where the operator's
        CustomResourceDefinition is not installed. Raises ObserveError when they cannot be listed."""
        ...

    def flink_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One FlinkDeployment, None when there is none."""
        ...

    def suspend_flink_deployment(self, namespace: str, name: str, *, patch: dict[str, Any]) -> None:
        """Merge-patch `patch` (operator_migration.status.suspend_patch: a stop with a savepoint, never without).
        Idempotent. PermanentStepError when there is no such FlinkDeployment."""
        ...

    def release_flink_deployment(self, namespace: str, name: str, *, patch: dict[str, Any]) -> None:
        """Merge-patch `patch` (release_patch: the fields the suspend set, as they were); nothing to do when it is
        gone."""
        ...

    def savepoint_on_storage(self, uri: str) -> bool | None:
        """Whether the savepoint at `uri` has its `_metadata` on storage: True / False, None when this runtime
        cannot look there."""
        ...

    def delete_flink_deployment(self, namespace: str, name: str, *, deadline: float) -> None:
        """Delete it and wait until it, its pods, Deployments, Services and ConfigMaps (HA metadata included;
        native or standalone mode) are gone (DeadlineExceededError naming what is left). Nothing to do when it is
        gone."""
        ...

    def savepoint_storage_problem(self, deployment: dict[str, Any], uri: str) -> str | None:
        """Why `uri` (its savepoint directory) would not outlive the FlinkDeployment's pods; None when durable."""
class JarApi(FlinkApi, Protocol):
    """A JobManager's REST API with its jar store (a session cluster holds the jars of many apps), and savepoints
    into a directory of the caller's choice (each app's own, not the shared cluster's)."""

    def jars(self) -> dict[str, str]: ...
    def delete_jar(self, jar_id: str) -> None: ...
    def trigger_savepoint(self, job_id: str, *, cancel_job: bool = False, trigger_id: str | None = None,
                          target_directory: str | None = None) -> str: ...
    def stop_with_savepoint(self, job_id: str, *, drain: bool = False, trigger_id: str | None = None,
                            target_directory: str | None = None) -> str: ...
    def plan_jar(self, jar_id: str, *, entry_class: str | None = None, args: tuple[str, ...] = (),
                 parallelism: int | None = None) -> None: ...


@dataclass(frozen=True)
class SessionGeneration:
    """One running cluster of a session cluster: the live one, a standby, or the retired one a move left."""

    slot: str  # cluster (live) | standby | retired
    generation: str
    config_key: str  # equal for clusters started from equal cluster specs (`SessionHost.config_key`)
    cluster_id: str
    client: JarApi


@runtime_checkable
class SessionHost(StandbyRuntime, Protocol):
    """A runtime that can host FlinkSessionClusters (live/session.py puts the apps' jobs on them)."""

    def session_generations(self, cluster: str) -> list[SessionGeneration]:
        """The running clusters of session cluster `cluster`, the live one first."""
        ...

    def config_key(self, app: FlinkApp) -> str: ...

    def jar_id(self, cluster: str, slot: str, jar: Path, *, deadline: float, again: bool = False,
               job_id: str | None = None) -> str:
        """The jar's id on one cluster of session cluster `cluster`, uploaded once per content (`again`: the
        upload is gone, upload it anew); `job_id` is recorded as submitted from it."""
        ...

    def jar_uses(self, cluster: str, slot: str) -> tuple[dict[str, str], dict[str, str]]:
        """The jars we uploaded there (jar id -> content digest) and the jobs submitted from them (job -> jar id)."""
        ...

    def forget_jars(self, cluster: str, slot: str, jar_ids: Collection[str], gone_jobs: Collection[str], *,
                    deadline: float) -> None:
        """Forget deleted jars and ended jobs."""
        ...

    def job_storage(self, app: str) -> dict[str, str]:
        """Job-level Flink configuration that keeps an app's checkpoints and savepoints in its own storage."""
        ...


@runtime_checkable
class ImageJars(Protocol):
    """A SessionHost whose clusters hold the jars of their image (Kubernetes: `local://` jarURIs), staged when a
    JobManager starts: a job is submitted from one without an upload, and they are never pruned."""

    def image_jar_id(self, cluster: str, slot: str, app: FlinkApp) -> str:
        """The id of `app`'s image jar on the cluster in `slot` of session cluster `cluster`; PermanentStepError
        when the image has no such jar."""
        ...

    def is_image_jar(self, jar_id: str) -> bool: ...
