"""Frozen pydantic models of a FlinkApp document.

Every field carries its *change class* (``x-change-class`` in the JSON Schema), the rung of the
change ladder a change to it climbs: IGNORE < SCALE < UPGRADE < REDEPLOY. The diff takes the highest
class of all changed fields; see `reconciler.core.diff`.

The field types the models are built from (change classes, durations, memory sizes, names) are `fields.py`;
their names are importable from here too.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import timedelta
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from reconciler.spec.fields import (
    FLINK_KEY_RE,
    MAX_DURATION,
    MAX_FLINK_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_NONCE,
    NAME_RE,
    SUBDOMAIN_RE,
    ChangeClass,
    ChangeClassJSON,
    Duration,
    MemorySize,
    SpecModel,
    change,
    format_duration,
    parse_duration,
    repo_jar_path,
    valid_name,
)

API_VERSION = "flink-reconciler.io/v1alpha1"
KIND = "FlinkApp"


class UpgradeMode(StrEnum):
    SAVEPOINT = "savepoint"
    LAST_STATE = "last-state"
    STATELESS = "stateless"


class JobState(StrEnum):
    RUNNING = "running"
    SUSPENDED = "suspended"


class DeletionPolicy(StrEnum):
    SAVEPOINT_THEN_DELETE = "savepoint-then-delete"  # final savepoint, then remove everything
    DELETE = "delete"  # remove without a final savepoint (state is dropped: flagged as a risk)
    ORPHAN = "orphan"  # stop managing; leave the cluster and job running


class RuntimeType(StrEnum):
    LOCAL = "local"
    KUBERNETES = "kubernetes"


class Resources(SpecModel):
    cpu: float = change(ChangeClass.UPGRADE, "CPU cores per pod (Kubernetes).", default=1.0, gt=0, le=1024,
                        allow_inf_nan=False)
    memory: MemorySize = change(
        ChangeClass.UPGRADE, "Total process memory of the JVM (Flink's *.memory.process.size).",
        default="1024m",
    )


class RuntimeHints(SpecModel):
    type: RuntimeType | None = change(
        ChangeClass.REDEPLOY,
        "Where this app runs. Unset: the daemon's configured runtime.",
        default=None,
    )
    service_account: str | None = change(
        ChangeClass.UPGRADE, "Kubernetes ServiceAccount of the Flink pods (in the app's namespace).", default=None
    )

    @field_validator("service_account")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 253 or not SUBDOMAIN_RE.fullmatch(v)):
            raise ValueError(f"{v!r} is not a ServiceAccount name (a DNS-1123 subdomain in the app's namespace)")
        return v


class JobManagerSpec(SpecModel):
    resources: Resources = change(ChangeClass.UPGRADE, "JobManager resources.", default=Resources())
    replicas: int = change(
        ChangeClass.UPGRADE, "JobManager replicas (more than 1 needs highAvailability).",
        default=1, ge=1, le=3,
    )


class VolumeClaimTemplate(SpecModel):
    """A PVC per TaskManager pod; asking for one makes TaskManagers a StatefulSet."""

    name: str = change(ChangeClass.REDEPLOY, "Volume name, also the PVC name prefix.")
    mount_path: str = change(ChangeClass.REDEPLOY, "Where the volume is mounted in the TaskManager.")
    storage: MemorySize = change(ChangeClass.REDEPLOY, "Requested size, e.g. '10Gi'.")
    storage_class_name: str | None = change(ChangeClass.REDEPLOY, "StorageClass.", default=None)
    access_modes: tuple[str, ...] = change(
        ChangeClass.REDEPLOY, "PVC access modes.", default=("ReadWriteOnce",)
    )

    @field_validator("name")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v) or len(v) > 63:
            raise ValueError(f"{v!r} is not a DNS-1123 label (lowercase letters, digits, '-')")
        return v


class TaskManagerSpec(SpecModel):
    resources: Resources = change(ChangeClass.UPGRADE, "TaskManager resources.", default=Resources(memory="1280m"))
    replicas: int = change(
        ChangeClass.SCALE, "Number of TaskManagers. Changing only this does not restart the job.",
        default=1, ge=0, le=1000,
    )
    slots: int = change(
        ChangeClass.UPGRADE, "taskmanager.numberOfTaskSlots.", default=1, ge=1, le=256
    )
    volume_claim_templates: tuple[VolumeClaimTemplate, ...] = change(
        ChangeClass.REDEPLOY,
        "PVCs per TaskManager. Non-empty makes TaskManagers a StatefulSet so local state survives restarts.",
        default=(),
    )


class HighAvailability(SpecModel):
    enabled: bool = change(ChangeClass.REDEPLOY, "Kubernetes HA for the JobManager.", default=False)
    storage_dir: str | None = change(
        ChangeClass.REDEPLOY, "high-availability.storageDir (required when enabled).", default=None
    )

    @model_validator(mode="after")
    def _storage_when_enabled(self) -> HighAvailability:
        if self.enabled and not self.storage_dir:
            raise ValueError("storageDir is required when highAvailability is enabled")
        return self


class JobSpec(SpecModel):
    jar_uri: str = change(
        ChangeClass.UPGRADE,
        "The job jar: a path inside the repository, relative to its root ('..' may not leave it), file://, local:// "
        "(inside the image) or http(s)://.",
        alias="jarURI",
    )
    jar_sha256: str | None = change(
        ChangeClass.UPGRADE, "Expected SHA-256 of an http(s) jar.", default=None,
        pattern=r"^[0-9a-f]{64}$",
    )
    entry_class: str | None = change(
        ChangeClass.UPGRADE, "Main class; unset: the jar manifest's.", default=None
    )
    args: tuple[str, ...] = change(
        ChangeClass.UPGRADE, "Program arguments (numbers are taken as their text).", default=()
    )
    parallelism: int = change(ChangeClass.UPGRADE, "Default parallelism of the job.", default=1, ge=1, le=32768)
    upgrade_mode: UpgradeMode = change(
        ChangeClass.IGNORE,
        "How state is carried across a restart: savepoint | last-state | stateless.",
        default=UpgradeMode.SAVEPOINT,
    )
    state: JobState = change(
        ChangeClass.IGNORE,
        "running | suspended. Suspending takes a savepoint (per upgradeMode) and stops the job.",
        default=JobState.RUNNING,
    )
    allow_non_restored_state: bool = change(
        ChangeClass.IGNORE, "Allow dropping state of operators that no longer exist.", default=False
    )
    initial_savepoint_path: str | None = change(
        ChangeClass.IGNORE,
        "Savepoint to start from on create (and on a savepointRedeployNonce change).",
        default=None,
    )
    restart_nonce: int | None = change(
        ChangeClass.UPGRADE, "Change to restart the job (state carried per upgradeMode).", default=None,
        ge=-MAX_NONCE, le=MAX_NONCE,
    )
    savepoint_redeploy_nonce: int | None = change(
        ChangeClass.UPGRADE,
        "Change to redeploy from initialSavepointPath, discarding the current state (or empty state if unset).",
        default=None, ge=-MAX_NONCE, le=MAX_NONCE,
    )
    @field_validator("jar_uri")
    @classmethod
    def _inside_the_repository(cls, v: str) -> str:
        # Normalised: `jobs/./x.jar` is `jobs/x.jar` (the same file: rewriting one as the other is no change).
        return repo_jar_path(v) or v

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_text(cls, v: Any) -> Any:
        if isinstance(v, list | tuple):
            return [str(x) if isinstance(x, int | float) and not isinstance(x, bool) else x for x in v]
        return v

    max_checkpoint_age: Duration | None = change(
        ChangeClass.IGNORE,
        "A cap on how old a checkpoint may be to restore from when no savepoint can be taken (the job died or "
        "is not healthy): an older one blocks the app with instructions instead. Unset: no cap; the newest "
        "checkpoint or savepoint of the job is used, as Flink's own high availability would.",
        default=None,
    )


class Deadlines(SpecModel):
    savepoint: Duration = change(ChangeClass.IGNORE, "Savepoint / stop-with-savepoint.", default=timedelta(minutes=5))
    start: Duration = change(
        ChangeClass.IGNORE, "Start until all tasks RUNNING (includes cluster start).", default=timedelta(minutes=5)
    )
    healthy: Duration = change(
        ChangeClass.IGNORE, "First completed checkpoint after start (when checkpointing is on).",
        default=timedelta(minutes=5),
    )
    delete: Duration = change(ChangeClass.IGNORE, "Tearing down the cluster.", default=timedelta(minutes=2))
    rescale: Duration = change(
        ChangeClass.IGNORE, "In-place rescale (upgrade.inPlaceRescale): until the job runs at the new parallelism "
        "and checkpointed; past it, the regular upgrade runs instead. Flink's adaptive scheduler first waits out "
        "its cooldown after the job's last (re)start (jobmanager.adaptive-scheduler.executing.cooldown-after-"
        "rescaling, 30s by default).", default=timedelta(minutes=2),
    )


class ClusterStrategy(StrEnum):
    WARM_STANDBY = "warmStandby"  # new cluster beside the running job; the job moves once it is ready
    COLD = "cold"  # stop the job, then restart the cluster (the cluster start is inside the downtime)


class UpgradeSpec(SpecModel):
    cluster_strategy: ClusterStrategy = change(
        ChangeClass.IGNORE,
        "How a change that needs new Flink JVMs (JobManager/TaskManager resources, slots, flinkConfiguration, "
        "flinkVersion, image) reaches a running job. warmStandby: a second cluster of the new spec starts beside "
        "the running job and the job moves to it once it is ready, so the cluster start is not downtime (the "
        "app needs room for two clusters meanwhile). cold: stop the job, then restart the cluster (for clusters "
        "too big to double). A runtime without warm standby goes cold; the plan says which.",
        default=ClusterStrategy.WARM_STANDBY,
    )
    in_place_rescale: bool = change(
        ChangeClass.IGNORE,
        "Apply a change of job.parallelism alone to the running job through Flink's adaptive scheduler (its "
        "resource requirements REST endpoint): the same job keeps running and rescales from its own latest "
        "checkpoint, no stop and no new job. Needs flinkConfiguration jobmanager.scheduler: adaptive and "
        "checkpointing; when Flink refuses or does not adopt the new parallelism in time, the regular upgrade "
        "runs instead.",
        default=False,
    )


ADAPTIVE_SCHEDULER_KEY = "jobmanager.scheduler"


def uses_adaptive_scheduler(flink_configuration: dict[str, str]) -> bool:
    """Whether this Flink configuration runs jobs with the adaptive scheduler (what in-place rescale needs)."""
    return flink_configuration.get(ADAPTIVE_SCHEDULER_KEY, "").strip().lower() == "adaptive"


class SavepointPolicy(SpecModel):
    retain: int = change(
        ChangeClass.IGNORE, "Savepoints kept per app; the one the app would restore from is never deleted, "
        "nor the rollback point of each of the newest `retain` commits that ran, nor a manual one.",
        default=5, ge=1, le=1000,
    )
    max_age: Duration | None = change(
        ChangeClass.IGNORE, "Also dispose of savepoints older than this (the same ones are kept). Unset: no age limit.",
        default=None,
    )


class RecoverySpec(SpecModel):
    grace_period: Duration = change(
        ChangeClass.IGNORE,
        "How long a job that Flink is restarting (RESTARTING, INITIALIZING, CREATED, RECONCILING, FAILING, or "
        "waiting for TaskManagers) is left to recover by itself before the reconciler restarts it from its newest "
        "checkpoint or savepoint. Keep it longer than the job's restart-strategy delay. Dead processes of the "
        "local runtime are restarted at once, whatever this says.",
        default=timedelta(seconds=60),
    )


TAKEOVER_KIND = "FlinkDeployment"


class TakeoverSpec(SpecModel):
    from_: str = change(
        ChangeClass.IGNORE,
        "The Apache Flink Kubernetes Operator's resource this app takes over, as FlinkDeployment/<name> (in the "
        "app's namespace): the plan asks the operator for a savepoint and a stop, deletes the FlinkDeployment and "
        "starts the job here from that savepoint. Without it, a FlinkDeployment of the app's name and namespace is "
        "taken over all the same; set it when the names differ.",
        alias="from",
    )

    @field_validator("from_")
    @classmethod
    def _reference(cls, v: str) -> str:
        kind, _, name = v.partition("/")
        if kind != TAKEOVER_KIND or not NAME_RE.fullmatch(name) or len(name) > 63:
            raise ValueError(f"expected {TAKEOVER_KIND}/<name> (a DNS-1123 label), got {v!r}")
        return v

    @property
    def name(self) -> str:
        return self.from_.partition("/")[2]
class AutoscaleMode(StrEnum):
    OFF = "off"
    RECOMMEND = "recommend"  # say what parallelism the metrics call for; change nothing
    COMMIT = "commit"  # write that change as a commit to Git, then apply it like any push


class AutoscaleCommit(SpecModel):
    branch: str | None = change(
        ChangeClass.IGNORE, "Push the autoscale commit to this branch (for a pull request) instead of the tracked "
        "branch, e.g. 'autoscale/<app>'. The branch is rewritten with each new proposal.", default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$",
    )

    @field_validator("branch")
    @classmethod
    def _ref_name(cls, v: str | None) -> str | None:
        if v is not None and (".." in v or "//" in v or v.endswith(("/", ".lock", "."))):
            raise ValueError(f"{v!r} is not a usable branch name")
        return v


MIN_AUTOSCALE_WINDOW = timedelta(seconds=1)


class AutoscaleSpec(SpecModel):
    """Autoscaling from Flink's own metrics, with Git the truth: a decision is a recommendation or a commit."""

    mode: AutoscaleMode = change(
        ChangeClass.IGNORE, "off | recommend (post the proposed parallelism with its evidence; change nothing) | "
        "commit (the daemon commits the new job.parallelism to Git and applies it like any push).",
        default=AutoscaleMode.OFF,
    )
    target_utilisation: float = change(
        ChangeClass.IGNORE, "How busy each vertex should be at the proposed parallelism (0.1-1.0): the headroom "
        "left for bursts.", default=0.7, ge=0.1, le=1.0, allow_inf_nan=False,
    )
    min: int = change(ChangeClass.IGNORE, "Lowest parallelism the autoscaler proposes.", default=1, ge=1, le=32768)
    max: int = change(
        ChangeClass.IGNORE, "Highest parallelism the autoscaler proposes (also capped by the task slots of the "
        "cluster and each vertex's max parallelism).", default=32, ge=1, le=32768,
    )
    stabilisation: Duration = change(
        ChangeClass.IGNORE, "No decision for this long after any applied change of the app (a rescale, an upgrade, "
        "a human edit of job.parallelism): the job settles first, and a human's edit wins.",
        default=timedelta(minutes=5),
    )
    scale_down_delay: Duration = change(
        ChangeClass.IGNORE, "A lower parallelism must be called for continuously this long before it is proposed "
        "(longer than scaling up: dropping capacity on a short lull is the expensive mistake).",
        default=timedelta(minutes=30),
    )
    catch_up_duration: Duration = change(
        ChangeClass.IGNORE, "When the sources report their lag (pendingRecords), extra capacity to work it off "
        "within this time.", default=timedelta(minutes=15),
    )
    window: Duration = change(
        ChangeClass.IGNORE, "Metrics are averaged over this window; no decision before a full window of samples "
        "since the last change.", default=timedelta(minutes=5),
    )
    min_change: int = change(
        ChangeClass.IGNORE, "Smallest parallelism change worth a rescale.", default=1, ge=1, le=32768,
    )
    utilisation_min: float | None = change(
        ChangeClass.IGNORE, "Lower edge of the utilisation band: no scale-down while every vertex is at least this "
        "busy at the current parallelism (the operator's job.autoscaler.utilization.min). Default: "
        "targetUtilisation - 0.1.", default=None, ge=0.0, le=1.0, allow_inf_nan=False,
    )
    utilisation_max: float | None = change(
        ChangeClass.IGNORE, "Upper edge of the utilisation band: no scale-up while no vertex is busier than this "
        "(the operator's job.autoscaler.utilization.max). Default: targetUtilisation + 0.1, at most 1.0.",
        default=None, ge=0.0, le=1.0, allow_inf_nan=False,
    )
    scale_up_max_factor: float = change(
        ChangeClass.IGNORE, "A scale-up goes at most to current x (1 + this) (the operator's "
        "job.autoscaler.scale-up.max-factor).", default=100000.0, gt=0.0, le=100000.0, allow_inf_nan=False,
    )
    scale_down_max_factor: float = change(
        ChangeClass.IGNORE, "A scale-down goes at least to current x (1 - this): 0.6 drops at most 60 % of the "
        "parallelism in one step, 1 any (the operator's job.autoscaler.scale-down.max-factor).", default=0.6,
        gt=0.0, le=1.0, allow_inf_nan=False,
    )
    max_task_managers: int | None = change(
        ChangeClass.IGNORE, "When set, a scale-up whose parallelism the task slots would not hold also raises "
        "taskManager.replicas, up to this many TaskManagers, in the same commit (an app with a cluster of its own; "
        "never lowered by the autoscaler). Unset: the parallelism is capped by the slots in the spec.",
        default=None, ge=1, le=1000,
    )
    commit: AutoscaleCommit = change(ChangeClass.IGNORE, "Where commit mode writes.", default=AutoscaleCommit())

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false.
        return "off" if v is False else v

    @field_validator("window")
    @classmethod
    def _window_positive(cls, v: timedelta) -> timedelta:
        # A zero window would decide on two samples taken a moment apart, or, never full, wait forever.
        if v < MIN_AUTOSCALE_WINDOW:
            raise ValueError(f"the autoscale window must be at least {MIN_AUTOSCALE_WINDOW.total_seconds():g}s "
                             "(the metrics it averages), e.g. '5m'")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleSpec:
        if self.min > self.max:
            raise ValueError(f"autoscale min ({self.min}) is above max ({self.max})")
        lo, hi = self.band
        if not lo <= self.target_utilisation <= hi:
            raise ValueError(f"autoscale targetUtilisation ({self.target_utilisation}) is outside its band "
                             f"utilisationMin..utilisationMax ({lo}..{hi})")
        return self

    @property
    def band(self) -> tuple[float, float]:
        """(utilisationMin, utilisationMax) with their defaults: the target +- 0.1."""
        lo = self.utilisation_min if self.utilisation_min is not None else max(0.0, self.target_utilisation - 0.1)
        hi = self.utilisation_max if self.utilisation_max is not None else min(1.0, self.target_utilisation + 0.1)
        return round(lo, 6), round(hi, 6)


class AppSpec(SpecModel):
    flink_version: str = change(ChangeClass.UPGRADE, "Flink version, e.g. '2.3'.", default="2.3")
    image: str | None = change(ChangeClass.UPGRADE, "Container image (kubernetes runtime).", default=None)
    runtime: RuntimeHints = change(ChangeClass.REDEPLOY, "Runtime hints.", default=RuntimeHints())
    job_manager: JobManagerSpec = change(ChangeClass.UPGRADE, "JobManager.", default=JobManagerSpec())
    task_manager: TaskManagerSpec = change(ChangeClass.UPGRADE, "TaskManagers.", default=TaskManagerSpec())
    flink_configuration: dict[str, str] = change(
        ChangeClass.UPGRADE, "Extra Flink configuration (string values).", default_factory=dict
    )
    pod_template: dict[str, Any] | None = change(
        ChangeClass.UPGRADE, "A Pod template merged into every Flink pod (kubernetes).", default=None
    )
    high_availability: HighAvailability = change(
        ChangeClass.REDEPLOY, "JobManager high availability.", default=HighAvailability()
    )
    job: JobSpec = change(ChangeClass.UPGRADE, "The Flink job.")
    upgrade: UpgradeSpec = change(ChangeClass.IGNORE, "How upgrades are carried out.", default=UpgradeSpec())
    deletion_policy: DeletionPolicy = change(
        ChangeClass.IGNORE, "What removing this spec from Git does (with pruning enabled).",
        default=DeletionPolicy.SAVEPOINT_THEN_DELETE,
    )
    savepoints: SavepointPolicy = change(ChangeClass.IGNORE, "Savepoint retention.", default=SavepointPolicy())
    deadlines: Deadlines = change(ChangeClass.IGNORE, "Per-step deadlines.", default=Deadlines())
    recovery: RecoverySpec = change(
        ChangeClass.IGNORE, "Self-healing: how long Flink may recover a failing job by itself before the "
        "reconciler repairs it.", default=RecoverySpec(),
    )
    takeover: TakeoverSpec | None = change(
        ChangeClass.IGNORE, "Take over a running app from the Apache Flink Kubernetes Operator "
        "(docs/migrate-from-flink-operator.md).", default=None,
        exclude_if=lambda v: v is None,  # unset, it is no part of the canonical form: every app's hash stays as it was
    )
    session_cluster: str | None = change(
        ChangeClass.REDEPLOY,
        "The FlinkSessionCluster (by metadata.name, in this repository) this app's job runs on, beside other "
        "apps' jobs. Set, the app has no cluster of its own: its cluster fields (flinkVersion, image, runtime, "
        "jobManager, taskManager, flinkConfiguration, podTemplate, highAvailability) are the session cluster's "
        "and may not be set here.",
        default=None, exclude_if=lambda v: v is None,  # unset: every other app's hash stays as it was
    )
    autoscale: AutoscaleSpec = change(
        ChangeClass.IGNORE, "Autoscaling from Flink's metrics (docs/autoscale.md); off by default.",
        default=AutoscaleSpec(),
        exclude_if=lambda v: v == AutoscaleSpec(),  # left at its default, no app's spec hash changes
    )

    @field_validator("flink_configuration", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        # YAML turns `parallelism.default: 2` into an int; Flink reads strings. Booleans -> 'true'.
        if isinstance(v, dict):
            return {
                str(k): (str(x).lower() if isinstance(x, bool) else x if isinstance(x, str) else str(x))
                for k, x in v.items()
            }
        return v

    @field_validator("flink_configuration")
    @classmethod
    def _flink_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if len(key) > MAX_FLINK_KEY_LENGTH or not FLINK_KEY_RE.fullmatch(key):
                raise ValueError(f"{key!r} is not a Flink option key (letters, digits, '.', '-', '_', "
                                 f"at most {MAX_FLINK_KEY_LENGTH} characters)")
        return v

    @field_validator("session_cluster")
    @classmethod
    def _session_cluster_name(cls, v: str | None) -> str | None:
        if v is not None and not valid_name(v):
            raise ValueError(f"{v!r} is not a session cluster name (a DNS-1123 label of at most {MAX_NAME_LENGTH} "
                             "characters)")
        return v

    @field_validator("upgrade")
    @classmethod
    def _rescale_needs_adaptive(cls, v: UpgradeSpec, info: ValidationInfo) -> UpgradeSpec:
        # A field validator (not the model's) so the error points at spec.upgrade, the line to fix.
        conf = info.data.get("flink_configuration")
        if v.in_place_rescale and isinstance(conf, dict) and not uses_adaptive_scheduler(conf):
            raise ValueError("inPlaceRescale needs Flink's adaptive scheduler: set flinkConfiguration "
                             f"{ADAPTIVE_SCHEDULER_KEY}: adaptive (or turn inPlaceRescale off)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> AppSpec:
        if self.job_manager.replicas > 1 and not self.high_availability.enabled:
            raise ValueError("jobManager.replicas > 1 needs highAvailability.enabled: true")
        slots = self.task_manager.replicas * self.task_manager.slots
        # A session cluster's slots are shared by its jobs: spec/session.py checks them all together.
        if self.session_cluster is None and self.job.state is JobState.RUNNING and self.job.parallelism > slots:
            raise ValueError(
                f"job.parallelism ({self.job.parallelism}) exceeds the task slots of the cluster "
                f"(taskManager.replicas {self.task_manager.replicas} x slots {self.task_manager.slots} = {slots})"
            )
        return self


GENERATION_SUFFIX_RE = re.compile(r"-g[0-9a-f]{8}$")  # <app>-g<gen>-*: a standby's objects (kubernetes.render)


class Metadata(SpecModel):
    name: str = change(ChangeClass.IGNORE, "App name: a DNS-1123 label, unique in the repository; not ending in "
                       "`-g` and 8 hex digits (a warm standby's generation suffix).")
    namespace: str = change(ChangeClass.REDEPLOY, "Kubernetes namespace.", default="default")
    labels: dict[str, str] = change(ChangeClass.IGNORE, "Labels copied to every object.", default_factory=dict)
    annotations: dict[str, str] = change(ChangeClass.IGNORE, "Annotations.", default_factory=dict)

    @field_validator("name", "namespace")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not a DNS-1123 label: lowercase letters, digits and '-', "
                             "starting and ending with a letter or digit")
        if len(v) > MAX_NAME_LENGTH:
            raise ValueError(f"{v!r} is {len(v)} characters; at most {MAX_NAME_LENGTH} "
                             "(object names get suffixes like '-taskmanager')")
        return v

    @field_validator("name")
    @classmethod
    def _not_a_generation(cls, v: str) -> str:
        if GENERATION_SUFFIX_RE.search(v):
            raise ValueError(f"{v!r} ends like a warm standby's cluster generation ('-g' and 8 hex digits): app "
                             f"{v.rsplit('-g', 1)[0]!r}'s standby objects would carry this app's object names")
        return v


def content_hash(spec: dict[str, Any]) -> str:
    """The one hash of a canonical `spec` dict: the journal, the planner and the runtimes compare it."""
    body = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


class FlinkApp(SpecModel):
    """One Flink application, as written in Git."""

    api_version: Literal["flink-reconciler.io/v1alpha1"] = Field(
        alias="apiVersion", description="Always flink-reconciler.io/v1alpha1."
    )
    kind: Literal["FlinkApp"] = Field(description="Always FlinkApp.")
    metadata: Metadata
    spec: AppSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    @cached_property
    def spec_hash(self) -> str:
        """Short content hash of `spec` (what a cluster was deployed from); metadata does not count."""
        return content_hash(self.canonical()["spec"])

    def canonical(self) -> dict[str, Any]:
        """The JSON form used for diffs and hashes: aliases, defaults filled in.

        Built on each call (10 us), never kept: kept with every loaded spec it was a third of a daemon's
        memory at 10,000 apps (bench/scale_bench.py)."""
        return self.model_dump(mode="json", by_alias=True)


__all__ = [  # with the names of fields.py, which callers import from here
    "ADAPTIVE_SCHEDULER_KEY", "API_VERSION", "FLINK_KEY_RE", "GENERATION_SUFFIX_RE", "KIND", "MAX_DURATION",
    "MAX_FLINK_KEY_LENGTH", "MAX_NAME_LENGTH", "MAX_NONCE", "NAME_RE", "SUBDOMAIN_RE", "TAKEOVER_KIND", "AppSpec",
    "AutoscaleCommit", "AutoscaleMode", "AutoscaleSpec", "ChangeClass", "ChangeClassJSON", "ClusterStrategy",
    "Deadlines", "DeletionPolicy", "Duration", "FlinkApp", "HighAvailability", "JobManagerSpec", "JobSpec",
    "JobState", "MemorySize", "Metadata", "RecoverySpec", "Resources", "RuntimeHints", "RuntimeType",
    "SavepointPolicy", "SpecModel", "TakeoverSpec", "TaskManagerSpec", "UpgradeMode", "UpgradeSpec",
    "VolumeClaimTemplate", "change", "content_hash", "format_duration", "parse_duration", "repo_jar_path",
    "uses_adaptive_scheduler", "valid_name",
]
