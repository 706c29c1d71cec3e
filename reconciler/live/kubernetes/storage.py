"""What a stateful app needs to run on Kubernetes without ever losing or rewinding its state (pure).

A pod's disk goes with the pod, so savepoints and checkpoints must live on durable storage that every
Flink pod of the app reaches: an object store or distributed filesystem (s3://, gs://, hdfs://, abfs://,
oss://, ...) or a path on a shared volume that ``spec.podTemplate`` mounts into the Flink container.

The JobManager runs in application mode with ``--fromSavepoint <path>`` in its arguments. Without HA, a
JobManager pod that restarts (OOM kill, node drain, eviction) starts the job again from that savepoint:
a silent rewind to the state of the last upgrade. With Kubernetes HA the job graph and the pointer to
the latest completed checkpoint are kept in ConfigMaps and ``high-availability.storageDir``, and a
restarted JobManager restores the latest checkpoint; the savepoint of its arguments is used only when
no checkpoint exists yet (Flink's ``DefaultExecutionGraphFactory``: ``restoreInitialCheckpointIfPresent``
first, ``tryRestoreExecutionGraphFromSavepoint`` only when that found nothing). So stateful apps on
Kubernetes require HA; there is no opt-out short of ``upgradeMode: stateless``. See docs/kubernetes.md.

`kubernetes_spec_problems` lists what is missing, each with the field path to fix and what to set; the
renderer refuses such apps, `validate --runtime kubernetes` lists them, and the daemon turns them into
per-app errors before planning anything for the app.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from reconciler.spec.model import FlinkApp, RuntimeType, UpgradeMode

SAVEPOINT_DIR = "execution.checkpointing.savepoint-dir"
CHECKPOINT_DIR = "execution.checkpointing.dir"
# Flink still reads these deprecated spellings (CheckpointingOptions' deprecated keys).
_LEGACY = {SAVEPOINT_DIR: "state.savepoints.dir", CHECKPOINT_DIR: "state.checkpoints.dir"}

# Filesystems whose data outlives any pod and is shared by all of them (Flink's filesystem plugins and
# Hadoop-compatible ones).
DURABLE_SCHEMES = frozenset({
    "s3", "s3a", "s3n", "s3p", "gs", "hdfs", "viewfs", "webhdfs", "swebhdfs", "abfs", "abfss", "wasb", "wasbs",
    "adl", "oss", "cosn", "obs", "ofs", "o3fs", "jfs", "alluxio", "swift",
})
# Pod volume sources that outlive the pod and can be mounted by every Flink pod at once.
SHARED_VOLUME_SOURCES = frozenset({"persistentVolumeClaim", "nfs", "cephfs", "azureFile", "glusterfs"})
MAIN_CONTAINER = "flink-main-container"  # render.MAIN_CONTAINER (a test keeps them equal)


@dataclass(frozen=True)
class SpecProblem:
    """One reason an app cannot run on Kubernetes.

    `field` is the dotted path users read (``spec.flinkConfiguration.execution.checkpointing.dir``);
    `loc` the same path as keys, since a Flink key has dots of its own (for locating a line in YAML)."""

    loc: tuple[str, ...]
    message: str

    @property
    def field(self) -> str:
        return ".".join(self.loc)


def is_stateful(app: FlinkApp) -> bool:
    return app.spec.job.upgrade_mode is not UpgradeMode.STATELESS


def runs_on_kubernetes(app: FlinkApp, default_runtime: str) -> bool:
    """`spec.runtime.type` when set, else the daemon's (or CLI's) runtime."""
    chosen = app.spec.runtime.type
    return (chosen.value if chosen is not None else default_runtime) == RuntimeType.KUBERNETES.value


def kubernetes_spec_problems(app: FlinkApp) -> list[SpecProblem]:
    """Everything that keeps `app`'s state from being durable on Kubernetes; empty when it may run.

    Stateful apps (upgradeMode savepoint or last-state): a savepoint dir and a checkpoint dir on durable
    storage, and Kubernetes HA. Any app with HA: a durable HA storageDir."""
    s = app.spec
    mounts = _mounts(s.pod_template)
    claims = {v.mount_path: v.name for v in s.task_manager.volume_claim_templates}
    mode = s.job.upgrade_mode.value
    out: list[SpecProblem] = []
    if is_stateful(app):
        for key, what, example in ((SAVEPOINT_DIR, "savepoints", "savepoints"),
                                   (CHECKPOINT_DIR, "checkpoints", "checkpoints")):
            loc = ("spec", "flinkConfiguration", key)
            value = s.flink_configuration.get(key) or s.flink_configuration.get(_LEGACY[key])
            if not value:
                out.append(SpecProblem(loc, (
                    f"upgradeMode {mode} on Kubernetes keeps its state in {what}, which must outlive the pods: "
                    f"set spec.flinkConfiguration.{key} to durable storage, e.g. "
                    f"s3://<bucket>/{example}/{app.name} (or a path on a PersistentVolumeClaim that "
                    "spec.podTemplate mounts into flink-main-container)")))
                continue
            why = _storage_problem(value, mounts, claims)
            if why:
                out.append(SpecProblem(loc, f"{key} {value!r} is not durable storage: {why}"))
        if not s.high_availability.enabled:
            out.append(SpecProblem(("spec", "highAvailability", "enabled"), (
                f"upgradeMode {mode} on Kubernetes needs highAvailability: without it a restarted JobManager "
                "pod runs the job again from the savepoint in its arguments and silently rewinds its state. "
                "Set spec.highAvailability.enabled: true and spec.highAvailability.storageDir: "
                f"s3://<bucket>/ha/{app.name} (durable storage), or use upgradeMode: stateless")))
    if s.high_availability.enabled and s.high_availability.storage_dir:
        why = _storage_problem(s.high_availability.storage_dir, mounts, claims)
        if why:
            out.append(SpecProblem(("spec", "highAvailability", "storageDir"), (
                f"storageDir {s.high_availability.storage_dir!r} is not durable storage: {why}. A restarted "
                "JobManager recovers its jobs and their latest checkpoint from there")))
    return out


def storage_problem(uri: str, pod_template: Mapping[str, Any] | None) -> str | None:
    """Why `uri` is not durable, shared storage for pods built from `pod_template` (its flink-main-container's
    volumes); None when it is. For a FlinkDeployment's savepoint directory (a takeover starts from it)."""
    return _storage_problem(uri, _mounts(pod_template), {})


@dataclass(frozen=True)
class _Mount:
    path: str
    volume: str
    source: str | None  # the volume's source kind (persistentVolumeClaim, emptyDir, ...); None: no such volume
    read_only: bool = False


def _storage_problem(value: str, mounts: list[_Mount], claims: Mapping[str, str]) -> str | None:
    """Why `value` (a Flink filesystem URI or path) is not durable, shared storage; None when it is.

    `mounts`: the Flink container's volume mounts from the podTemplate; `claims`: mountPath -> name of the
    TaskManager volumeClaimTemplates (one PVC per TaskManager pod: neither shared nor on the JobManager)."""
    value = value.strip()
    try:
        parts = urlsplit(value)
    except ValueError:
        return "not a valid URI"
    scheme = parts.scheme.lower()
    if scheme in DURABLE_SCHEMES:
        return None if parts.netloc or parts.path.strip("/") else f"{scheme}:// names no bucket or path"
    if scheme and scheme != "file":
        return (f"unknown filesystem scheme {scheme}://; durable ones are "
                f"{', '.join(s + '://' for s in sorted(DURABLE_SCHEMES))}, or file:// on a shared volume")
    if scheme == "file" and parts.netloc:
        return f"a file:// URI takes three slashes (file:///path), got host {parts.netloc!r}"
    path = parts.path
    if not path.startswith("/"):
        return "a relative path ends up on the JobManager's own disk; use an absolute path on a shared volume"
    path = posixpath.normpath(path)
    fix = ("use an object store (s3://, gs://, hdfs://, abfs://, oss://, ...) or mount a PersistentVolumeClaim "
           "(ReadWriteMany) there through spec.podTemplate's flink-main-container")
    for mount_path, name in sorted(claims.items(), key=lambda kv: -len(kv[0])):
        if _under(path, mount_path):
            return (f"{path} is on the TaskManager volumeClaimTemplate {name!r}: one volume per TaskManager pod, "
                    f"not mounted on the JobManager, so no pod sees a whole checkpoint; {fix}")
    for m in sorted(mounts, key=lambda m: -len(m.path)):
        if not _under(path, m.path):
            continue
        if m.source in SHARED_VOLUME_SOURCES:
            if m.read_only:
                return f"{path} is on volume {m.volume!r}, mounted read-only: drop readOnly from that volumeMount"
            return None
        if m.source is None:
            return f"{path} is mounted from volume {m.volume!r}, which spec.podTemplate does not define; {fix}"
        return f"{path} is on volume {m.volume!r} ({m.source}), which does not outlive its pod or is not shared; {fix}"
    return f"{path} is on the container's own disk, lost with the pod; {fix}"


def _under(path: str, mount_path: str) -> bool:
    base = posixpath.normpath(mount_path) if mount_path.startswith("/") else None
    return base is not None and (path == base or path.startswith(base.rstrip("/") + "/"))


def _mounts(pod_template: Mapping[str, Any] | None) -> list[_Mount]:
    """The Flink container's volume mounts in a (free-form, unvalidated) podTemplate, with their sources."""
    spec = pod_template.get("spec") if isinstance(pod_template, Mapping) else None
    if not isinstance(spec, Mapping):
        return []
    sources: dict[str, str | None] = {}
    for v in _seq(spec.get("volumes")):
        if isinstance(v, Mapping) and isinstance(v.get("name"), str):
            kinds = [k for k in v if k != "name"]
            sources[v["name"]] = str(kinds[0]) if len(kinds) == 1 else None
    out: list[_Mount] = []
    for c in _seq(spec.get("containers")):
        if not (isinstance(c, Mapping) and c.get("name") == MAIN_CONTAINER):
            continue
        for vm in _seq(c.get("volumeMounts")):
            if isinstance(vm, Mapping) and isinstance(vm.get("mountPath"), str) and isinstance(vm.get("name"), str):
                out.append(_Mount(vm["mountPath"], vm["name"], sources.get(vm["name"]), vm.get("readOnly") is True))
    return out


def _seq(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []
