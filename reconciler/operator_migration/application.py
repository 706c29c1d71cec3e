"""The FlinkDeployment -> FlinkApp mapping of `flink-reconciler import` (pure: documents in, documents out).
Session mode (a FlinkDeployment without spec.job, a FlinkSessionJob) builds on it in `session`;
`documents` says which document becomes what.

Input: parsed YAML documents as the Apache Flink Kubernetes Operator's users keep them (`flink.apache.org/v1beta1`
FlinkDeployment, plus whatever else shares the file, `kind: List` included). Output per document: a FlinkApp
document (plain dict, or None when the document cannot become one), where each of its values came from (for
the YAML comments), and every finding: what could not be mapped and why, and whether that changes how the
job runs. The CLI reads and writes YAML around this; nothing here touches a file.

What the operator does to its pods that the spec does not say (resource requests routed into Flink's process
memory, TaskManager count from parallelism and slots, its configuration defaults) is reproduced here so that
the imported app runs the same: see `docs/migrate-from-flink-operator.md` for the field table.

Over 600 lines for one concern: the field-by-field mapping of a FlinkDeployment, each field with its
reason when it cannot be carried over, which reads best as one table in code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from reconciler.spec.model import API_VERSION, KIND, MAX_NAME_LENGTH, NAME_RE

OPERATOR_GROUP = "flink.apache.org"
FLINK_DEPLOYMENT = "FlinkDeployment"
FLINK_SESSION_JOB = "FlinkSessionJob"
MAIN_CONTAINER = "flink-main-container"
MIB = 1 << 20

Path = tuple[str, ...]

# Flink 1.x keys and the 2.x names Flink renamed them to (the deprecated keys of Flink 2.3's option classes;
# Flink 2.x still reads most old spellings, but the new ones are what its docs and our checks name).
RENAMED_KEYS: dict[str, tuple[str, ...]] = {
    "state.savepoints.dir": ("execution.checkpointing.savepoint-dir",),
    "savepoints.state.backend.fs.dir": ("execution.checkpointing.savepoint-dir",),
    "state.checkpoints.dir": ("execution.checkpointing.dir",),
    "state.backend.fs.checkpointdir": ("execution.checkpointing.dir",),
    "state.checkpoints.num-retained": ("execution.checkpointing.num-retained",),
    "state.checkpoints.create-subdir": ("execution.checkpointing.create-subdir",),
    "state.checkpoint-storage": ("execution.checkpointing.storage",),
    "state.checkpoint.cleaner.parallel-mode": ("execution.checkpointing.cleaner.parallel-mode",),
    "state.backend": ("state.backend.type",),
    "state.backend.incremental": ("execution.checkpointing.incremental",),
    "state.backend.local-recovery": ("execution.checkpointing.local-backup.enabled",
                                     "execution.state-recovery.from-local"),
    "taskmanager.state.local.root-dirs": ("execution.checkpointing.local-backup.dirs",),
    "state.storage.fs.memory-threshold": ("execution.checkpointing.data-inline-threshold",),
    "state.backend.fs.memory-threshold": ("execution.checkpointing.data-inline-threshold",),
    "state.storage.fs.write-buffer-size": ("execution.checkpointing.write-buffer-size",),
    "state.backend.fs.write-buffer-size": ("execution.checkpointing.write-buffer-size",),
    "state.backend.changelog.enabled": ("state.changelog.enabled",),
    "state.backend.changelog.storage": ("state.changelog.storage",),
    "state.backend.changelog.max-failures-allowed": ("state.changelog.max-failures-allowed",),
    "state.backend.changelog.periodic-materialize.enabled": ("state.changelog.periodic-materialize.enabled",),
    "state.backend.changelog.periodic-materialize.interval": ("state.changelog.periodic-materialize.interval",),
    "execution.checkpointing.unaligned": ("execution.checkpointing.unaligned.enabled",),
    "execution.checkpointing.alignment-timeout": ("execution.checkpointing.aligned-checkpoint-timeout",),
    "execution.checkpointing.approximate-local-recovery": ("execution.state-recovery.approximate-local-recovery",),
    "execution.checkpointing.recover-without-channel-state.checkpoint-id": (
        "execution.state-recovery.without-channel-state.checkpoint-id",),
    "execution.savepoint.path": ("execution.state-recovery.path",),
    "execution.savepoint.ignore-unclaimed-state": ("execution.state-recovery.ignore-unclaimed-state",),
    "execution.savepoint-restore-mode": ("execution.state-recovery.claim-mode",),
    "execution.buffer-timeout": ("execution.buffer-timeout.interval",),
    "restart-strategy": ("restart-strategy.type",),
    "high-availability": ("high-availability.type",),
    "recovery.mode": ("high-availability.type",),
    "high-availability.zookeeper.storageDir": ("high-availability.storageDir",),
    "pipeline.operator-chaining": ("pipeline.operator-chaining.enabled",),
    "env.java.opts": ("env.java.opts.all",),
    "kubernetes.jobmanager.cpu": ("kubernetes.jobmanager.cpu.amount",),
    "kubernetes.taskmanager.cpu": ("kubernetes.taskmanager.cpu.amount",),
    "kubernetes.container.image": ("kubernetes.container.image.ref",),
    "taskmanager.memory.size": ("taskmanager.memory.managed.size",),
    "taskmanager.network.memory.fraction": ("taskmanager.memory.network.fraction",),
    "taskmanager.network.memory.max": ("taskmanager.memory.network.max",),
    "taskmanager.network.memory.min": ("taskmanager.memory.network.min",),
    "slotmanager.taskmanager-timeout": ("resourcemanager.taskmanager-timeout",),
    "jobstore.cache-size": ("completed-application-store.cache-size",),
    "jobstore.max-capacity": ("completed-application-store.max-capacity",),
    "jobstore.type": ("completed-application-store.type",),
    "akka.ask.timeout": ("pekko.ask.timeout",),
    "akka.framesize": ("pekko.framesize",),
    "akka.tcp.timeout": ("pekko.tcp.timeout",),
    "akka.lookup.timeout": ("pekko.lookup.timeout",),
    "akka.client.timeout": ("client.timeout",),
    "web.port": ("rest.port",),
    "jobmanager.web.address": ("rest.bind-address",),
    "jobmanager.web.upload.dir": ("web.upload.dir",),
    "security.keytab": ("security.kerberos.login.keytab",),
    "security.principal": ("security.kerberos.login.principal",),
}

# Keys the reconciler's runtime sets itself (kubernetes.render), with the FlinkApp field that carries them instead.
_OWNED_PORTS = {"jobmanager.rpc.port": "6123", "blob.server.port": "6124", "rest.port": "8081",
                "taskmanager.rpc.port": "6122"}
_OWNED_DROPPED = {
    "jobmanager.rpc.address": "derived from the app name (the JobManager Service)",
    "kubernetes.cluster-id": "derived from the app name and the job",
    "high-availability.cluster-id": "derived from the app name and the job",
    "web.upload.dir": "used by the reconciler's warm standby",
    "kubernetes.namespace": "the app's metadata.namespace",
}
# The restore point as configuration (1.x name and 2.x name): the operator owns it (ApplicationReconciler.deploy).
_RESTORE_PATH_KEYS = {"execution.savepoint.path", "execution.state-recovery.path"}
_HA_KUBERNETES = {"kubernetes", "org.apache.flink.kubernetes.highavailability.kuberneteshaservicesfactory"}
_HA_NONE = {"none", "", "false"}

# kubernetes.operator.* options with a FlinkApp equivalent: key -> (target path, note).
_OPERATOR_MAPPED: dict[str, tuple[Path, str]] = {
    "kubernetes.operator.savepoint.history.max.count": (("spec", "savepoints", "retain"), "savepoints kept per app"),
    "kubernetes.operator.savepoint.history.max.age": (("spec", "savepoints", "maxAge"), "savepoint age limit"),
    "kubernetes.operator.job.upgrade.last-state.max.allowed.checkpoint.age": (
        ("spec", "job", "maxCheckpointAge"), "newest checkpoint age allowed to restore from"),
    "kubernetes.operator.deployment.readiness.timeout": (("spec", "deadlines", "start"), "start deadline"),
}
# kubernetes.operator.* options that need no counterpart (what they turn on is how the reconciler always works).
_OPERATOR_BUILT_IN: dict[str, str] = {
    "kubernetes.operator.deployment.rollback.enabled": "the reconciler always rolls a failed upgrade back to "
    "the previous spec from the savepoint just taken (deadlines.start / deadlines.healthy)",
    "kubernetes.operator.job.restart.failed": "the reconciler restarts a failed job from its newest checkpoint "
    "after spec.recovery.gracePeriod",
    "kubernetes.operator.cluster.health-check.enabled": "the reconciler repairs a job Flink cannot recover "
    "itself after spec.recovery.gracePeriod",
    "kubernetes.operator.savepoint.format.type": "savepoints are taken in Flink's default (canonical) format; "
    "either format restores",
    "kubernetes.operator.job.upgrade.ignore-pending-savepoint": "an upgrade never starts while a savepoint of "
    "the reconciler is in flight",
    "kubernetes.operator.pod-template.merge-arrays-by-name": "podTemplate lists of containers, volumes, env and "
    "mounts are always merged by name",
}
# What these operator options do has no FlinkApp counterpart; dropping them changes behaviour.
_OPERATOR_CHANGES: dict[str, str] = {
    "kubernetes.operator.periodic.savepoint.interval": "periodic savepoints: the reconciler takes savepoints on "
    "upgrades, suspends and `flink-reconciler savepoint`, not on a schedule",
    "kubernetes.operator.periodic.checkpoint.interval": "periodic checkpoint triggers: set "
    "execution.checkpointing.interval instead",
    "kubernetes.operator.job.drain-on-savepoint-deletion": "drain on deletion",
    "kubernetes.operator.job.savepoint-on-deletion": "deleting a FlinkApp (with pruning) always takes a final "
    "savepoint unless deletionPolicy says otherwise",
}
# Operator defaults the operator writes into every application cluster's configuration unless the spec sets them.
OPERATOR_CONF_DEFAULTS: dict[str, str] = {
    "web.cancel.enable": "false",
}
LAST_STATE_CHECKPOINT_INTERVAL = "5 min"  # the operator's default interval for last-state (FlinkConfigBuilder)

KNOWN_SPEC = {"image", "imagePullPolicy", "serviceAccount", "flinkVersion", "ingress", "podTemplate", "jobManager",
               "taskManager", "job", "restartNonce", "flinkConfiguration", "logConfiguration", "mode"}
_KNOWN_JOB = {"jarURI", "parallelism", "entryClass", "args", "state", "savepointTriggerNonce",
              "initialSavepointPath", "checkpointTriggerNonce", "upgradeMode", "allowNonRestoredState",
              "savepointRedeployNonce", "autoscalerResetNonce"}
_KNOWN_COMPONENT = {"resource", "resources", "replicas", "podTemplate"}
_SERVER_METADATA = {"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink",
                    "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences", "generateName"}


@dataclass(frozen=True)
class Finding:
    """One thing of the source document that the FlinkApp does not carry as it was, and why.

    `changes_behaviour`: the imported app would not run the same (or not at all) because of it."""

    field: str
    message: str
    changes_behaviour: bool


@dataclass(frozen=True)
class Imported:
    """The outcome of one source document."""

    index: int  # position in the input stream (list items count as their own documents)
    kind: str
    name: str | None
    app: dict[str, Any] | None  # the FlinkApp document; None: not convertible
    origins: Mapping[Path, str] = field(default_factory=dict)  # FlinkApp path -> where its value came from
    findings: tuple[Finding, ...] = ()

    @property
    def out_kind(self) -> str | None:
        """FlinkApp or FlinkSessionCluster (None: nothing imported)."""
        return str(self.app["kind"]) if self.app is not None else None

    @property
    def changes_behaviour(self) -> bool:
        return self.app is None or any(f.changes_behaviour for f in self.findings)


class UnimportableError(Exception):
    """A document that cannot be imported at all (the message names the field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def flatten_configuration(conf: Any, where: str = "spec.flinkConfiguration") -> dict[str, tuple[str, str]]:
    """Flat Flink keys from the operator's flat or nested (YAML) form: key -> (string value, source path).
    Raises UnimportableError for a key given twice (nested and flat) with different values, lists of maps, and
    values that are not scalars."""
    if conf is None:
        return {}
    if not isinstance(conf, Mapping):
        raise UnimportableError(where, f"expected a map of Flink options, got {type(conf).__name__}")
    out: dict[str, tuple[str, str]] = {}

    def walk(node: Mapping[Any, Any], prefix: str, depth: int) -> None:
        if depth > 32:
            raise UnimportableError(where, "nested more than 32 levels deep")
        for k, v in node.items():
            if not isinstance(k, str | int | float) or isinstance(k, bool) or str(k) == "":
                raise UnimportableError(where, f"key {k!r} is not a Flink option name")
            key = f"{prefix}.{k}" if prefix else str(k)
            src = f"{where}.{key}"
            if isinstance(v, Mapping):
                walk(v, key, depth + 1)
                continue
            text = _scalar_text(v, src)
            if key in out and out[key][0] != text:
                raise UnimportableError(src, f"given twice with different values ({out[key][0]!r} and {text!r}): "
                                         "once nested and once flat")
            out[key] = (text, src)

    walk(conf, "", 0)
    return out


def _scalar_text(v: Any, src: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str | int | float):
        return str(v)
    if v is None:
        return ""
    if isinstance(v, list) and all(isinstance(x, str | int | float) and not isinstance(x, bool) for x in v):
        return ";".join(str(x) for x in v)  # Flink's list syntax
    raise UnimportableError(src, f"a {type(v).__name__} is not a Flink option value")


def memory_bytes(value: Any, src: str) -> int:
    """A memory size as the operator reads it: Flink's MemorySize first ('2048m' is MiB), else a Kubernetes
    quantity ('2Gi', '1.5G')."""
    text = str(value).strip()
    m = re.fullmatch(r"([0-9]+)\s*([a-zA-Z]*)", text)
    flink_units = {"": 1, "b": 1, "bytes": 1, "k": 1 << 10, "kb": 1 << 10, "kibibytes": 1 << 10,
                   "m": MIB, "mb": MIB, "mebibytes": MIB, "g": 1 << 30, "gb": 1 << 30, "gibibytes": 1 << 30,
                   "t": 1 << 40, "tb": 1 << 40, "tebibytes": 1 << 40}
    if m and m.group(2).lower() in flink_units:
        return int(m.group(1)) * flink_units[m.group(2).lower()]
    q = text.replace(" ", "").upper()
    if q.endswith("B"):
        q = q[:-1]
    if q.endswith("I"):
        q = q[:-1] + "i"
    k8s_units = {"Ki": 1 << 10, "Mi": MIB, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "K": 10**3,
                 "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "": 1}
    m2 = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([KMGTP]i?|)", q)
    if not m2:
        raise UnimportableError(src, f"cannot read memory size {value!r}")
    try:
        return int(Decimal(m2.group(1)) * k8s_units[m2.group(2)])
    except (InvalidOperation, KeyError):
        raise UnimportableError(src, f"cannot read memory size {value!r}") from None


def memory_text(n_bytes: int) -> str:
    """Bytes as a FlinkApp memory size (Flink units: 'm' is MiB), exact where it can be."""
    for unit, size in (("g", 1 << 30), ("m", MIB), ("k", 1 << 10)):
        if n_bytes % size == 0:
            return f"{n_bytes // size}{unit}"
    return f"{n_bytes // 1024}k"


def cpu_cores(value: Any, src: str) -> float:
    text = str(value).strip()
    try:
        cores = float(Decimal(text[:-1]) / 1000) if text.endswith("m") else float(Decimal(text))
    except InvalidOperation:
        raise UnimportableError(src, f"cannot read CPU amount {value!r}") from None
    if not math.isfinite(cores) or cores <= 0:
        raise UnimportableError(src, f"CPU amount {value!r} must be positive")
    return cores


def flink_version(value: Any) -> tuple[str, tuple[int, int]] | None:
    """`v1_20` / `v2_2` (the operator's enum) -> ('1.20', (1, 20))."""
    m = re.fullmatch(r"v?(\d+)[_.](\d+)", str(value).strip())
    if not m:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    return f"{major}.{minor}", (major, minor)


class Converter:
    """One FlinkDeployment; collects origins and findings while building the FlinkApp dict."""

    NATIVE_MODE = ("native mode: flink-reconciler runs Flink in standalone application mode with a TaskManager "
                   "Deployment of a fixed size (the same count the operator's Flink asks for)")

    def __init__(self, doc: Mapping[str, Any], *, namespace: str | None = None) -> None:
        self.doc = doc
        self.namespace = namespace  # for a document that names none (import --namespace)
        self.origins: dict[Path, str] = {}
        self.findings: list[Finding] = []
        self.app: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {}, "spec": {}}
        self.pull: tuple[str, str] | None = None  # kubernetes.container.image.pull-policy, for the pod template

    def put(self, path: Path, value: Any, origin: str) -> None:
        node = self.app
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = value
        self.origins[path] = origin

    def note(self, where: str, message: str, changes: bool) -> None:
        self.findings.append(Finding(where, message, changes))

    def run(self) -> dict[str, Any]:
        self._metadata()
        name = self.app["metadata"]["name"]
        self.put(("spec", "takeover", "from"), f"{FLINK_DEPLOYMENT}/{name}",
                 "the FlinkDeployment itself: take its running job over with a savepoint, never start beside it")
        spec = self._spec(KNOWN_SPEC)
        job = spec.get("job")
        if not isinstance(job, Mapping):
            raise UnimportableError("spec.job", f"expected a map, got {type(job).__name__}")
        version = self._version(spec)
        conf = self._configuration(spec, version)
        self._image(spec)
        slots = self._slots(conf)
        self._components(spec, conf)
        self._job(spec, job, conf, slots)
        self._ha(conf)
        self._operator_options(conf)
        self._rest_of_configuration(conf)
        self._pod_templates(spec)
        self._cluster_extras(spec)
        return self.app

    def _spec(self, known: set[str]) -> Mapping[str, Any]:
        spec = self.doc.get("spec")
        if not isinstance(spec, Mapping):
            raise UnimportableError("spec", f"missing (or not a map): a {self.doc.get('kind')} needs a spec")
        for key in spec:
            if key not in known:
                self.note(f"spec.{key}", f"unknown {self.doc.get('kind')} field: not imported", True)
        return spec

    def _cluster_extras(self, spec: Mapping[str, Any]) -> None:
        if spec.get("ingress") is not None:
            self.note("spec.ingress", "flink-reconciler creates no Ingress for the Flink UI: not imported (create "
                      "one for the Service <name>-rest, port 8081, yourself)", True)
        if spec.get("logConfiguration") is not None:
            self.note("spec.logConfiguration", "flink-reconciler ships one log4j-console.properties (console "
                      "logging at INFO); a custom logging configuration is not imported", True)
        if spec.get("mode") not in (None, "native", "standalone"):
            self.note("spec.mode", f"unknown deployment mode {spec.get('mode')!r}", True)
        elif spec.get("mode") == "native":
            self.note("spec.mode", self.NATIVE_MODE, False)

    # --- metadata -------------------------------------------------------------------------------------------
    def _metadata(self) -> None:
        meta = self.doc.get("metadata")
        if not isinstance(meta, Mapping) or not meta.get("name"):
            raise UnimportableError("metadata.name", "missing")
        name = str(meta["name"])
        if len(name) > MAX_NAME_LENGTH or not NAME_RE.fullmatch(name):
            raise UnimportableError("metadata.name", f"{name!r} is not a FlinkApp name (a DNS-1123 label of at most "
                                f"{MAX_NAME_LENGTH} characters): rename the app")
        self.put(("metadata", "name"), name, "metadata.name")
        if meta.get("namespace"):
            self.put(("metadata", "namespace"), str(meta["namespace"]), "metadata.namespace")
        elif self.namespace:
            self.put(("metadata", "namespace"), self.namespace, "--namespace (the source names none)")
        else:
            self.put(("metadata", "namespace"), "default", "not set in the source: written as default")
            self.note("metadata.namespace", "not set: the FlinkDeployment runs in the namespace it was applied to "
                      "(kubectl's, or Argo CD's / Flux's destination), which the file does not say; written as "
                      "default. Set the namespace it runs in (or import with --namespace): an app takes over the "
                      "FlinkDeployment of its own namespace, and none there blocks the takeover", True)
        labels = meta.get("labels")
        if isinstance(labels, Mapping):
            kept = {}
            for k, v in labels.items():
                if str(k).startswith("app.kubernetes.io/"):
                    self.note(f"metadata.labels.{k}", "the reconciler sets app.kubernetes.io/* labels itself: "
                              "not imported", False)
                else:
                    kept[str(k)] = str(v)
            if kept:
                self.put(("metadata", "labels"), kept, "metadata.labels")
        annotations = meta.get("annotations")
        if isinstance(annotations, Mapping):
            kept = {str(k): str(v) for k, v in annotations.items()
                    if not str(k).startswith(("kubectl.kubernetes.io/", "argocd.argoproj.io/"))}
            if kept:
                self.put(("metadata", "annotations"), kept, "metadata.annotations")

    # --- versions and configuration ----------------------------------------------------------------------------
    def _version(self, spec: Mapping[str, Any]) -> tuple[int, int]:
        raw = spec.get("flinkVersion")
        if raw is None:
            raise UnimportableError("spec.flinkVersion", "missing (the operator requires it)")
        parsed = flink_version(raw)
        if parsed is None:
            raise UnimportableError("spec.flinkVersion", f"cannot read Flink version {raw!r} (expected e.g. v2_2)")
        text, version = parsed
        self.put(("spec", "flinkVersion"), text, f"spec.flinkVersion {raw}")
        if version < (1, 19):
            self.note("spec.flinkVersion", f"Flink {text} does not read config.yaml, the configuration file the "
                      "reconciler writes: upgrade the job to Flink 2.x first (check its state compatibility)", True)
        elif version < (2, 0):
            self.note("spec.flinkVersion", f"Flink {text}: the reconciler is built and tested for Flink 2.x; "
                      "1.19 and 1.20 read its config.yaml but are untested", False)
        return version

    def _configuration(self, spec: Mapping[str, Any], version: tuple[int, int]) -> dict[str, tuple[str, str]]:
        flat = flatten_configuration(spec.get("flinkConfiguration"))
        if version < (2, 0):
            return flat  # 1.x reads its own key names; several 2.x names do not exist there
        out = {key: item for key, item in flat.items() if key not in RENAMED_KEYS}
        for key, (value, src) in flat.items():
            for new in RENAMED_KEYS.get(key, ()):
                if new in out and out[new][0] != value:
                    raise UnimportableError(src, f"{key}: {value!r} contradicts {new}: {out[new][0]!r} "
                                             f"({out[new][1]}), its Flink 2.x name; keep one of them")
                if new not in out:
                    out[new] = (value, f"{src} (the Flink 1.x name of {new})")
                    if new not in _RESTORE_PATH_KEYS:  # that one is not imported at all (_rest_of_configuration)
                        self.note(src, f"renamed to {new}, its Flink 2.x name", False)
        return out

    def _image(self, spec: Mapping[str, Any]) -> None:
        if spec.get("image"):
            self.put(("spec", "image"), str(spec["image"]), "spec.image")
        else:
            self.note("spec.image", "not set: the operator's Flink picks its default image, the reconciler uses "
                      "flink:<flinkVersion>", True)

    def _slots(self, conf: dict[str, tuple[str, str]]) -> int:
        item = conf.pop("taskmanager.numberOfTaskSlots", None)
        if item is None:
            return 1  # Flink's default
        value, src = item
        try:
            slots = int(value)
        except ValueError:
            raise UnimportableError(src, f"{value!r} is not a number of task slots") from None
        if slots < 1:
            raise UnimportableError(src, f"{slots} task slots: a TaskManager needs at least 1 (Flink refuses to "
                                    "start one with fewer)")
        self.put(("spec", "taskManager", "slots"), slots, src)
        return slots

    def _components(self, spec: Mapping[str, Any], conf: dict[str, tuple[str, str]]) -> None:
        for comp, target in (("jobManager", "jobManager"), ("taskManager", "taskManager")):
            node = spec.get(comp)
            where = f"spec.{comp}"
            if node is None:
                node = {}
            if not isinstance(node, Mapping):
                raise UnimportableError(where, f"expected a map, got {type(node).__name__}")
            for key in node:
                if key not in _KNOWN_COMPONENT:
                    self.note(f"{where}.{key}", "unknown field: not imported", True)
            flink_prefix = "jobmanager" if comp == "jobManager" else "taskmanager"
            mem_key = f"{flink_prefix}.memory.process.size"
            memory, cpu = self._resources(node, where)
            conf_mem = conf.pop(mem_key, None)
            if memory is None and conf_mem is not None:
                memory = (memory_bytes(conf_mem[0], conf_mem[1]), conf_mem[1])
            elif conf_mem is not None and memory is not None:
                self.note(conf_mem[1], f"overridden by {memory[1]} (as the operator does): not imported", False)
            if memory is None:
                raise UnimportableError(f"{where}.resources.requests.memory",
                                    "missing: the operator requires the memory of every Flink process")
            mem_bytes, mem_src = memory
            if mem_bytes % MIB:
                self.note(mem_src, f"{mem_bytes} bytes is not a whole number of MiB: the reconciler rounds the "
                          "process memory down to MiB", False)
            self.put(("spec", target, "resources", "memory"), memory_text(mem_bytes), mem_src)
            cpu_key = f"kubernetes.{flink_prefix}.cpu.amount"
            conf_cpu = conf.pop(cpu_key, None)
            if cpu is None and conf_cpu is not None:
                cpu = (cpu_cores(conf_cpu[0], conf_cpu[1]), conf_cpu[1])
            if cpu is not None:
                self.put(("spec", target, "resources", "cpu"), cpu[0], cpu[1])
            replicas = node.get("replicas")
            if comp == "jobManager":
                # The operator writes kubernetes.jobmanager.replicas from spec.jobManager.replicas (default 1)
                # over the configuration's (FlinkConfigBuilder.applyJobManagerSpec): the spec's count runs.
                conf_rep = conf.pop("kubernetes.jobmanager.replicas", None)
                count = as_int(replicas, f"{where}.replicas") if replicas is not None else 1
                if conf_rep is not None and as_int(conf_rep[0], conf_rep[1]) != count:
                    self.note(conf_rep[1], f"{conf_rep[0]} is overridden by the operator with spec.jobManager."
                              f"replicas ({count}{'' if replicas is not None else ', its default'}): the operator "
                              f"ran {count} JobManager(s), and so does the import; set jobManager.replicas for "
                              "more", True)
                if replicas is not None or conf_rep is not None:
                    self.put(("spec", "jobManager", "replicas"), count,
                             f"{where}.replicas" if replicas is not None else "operator default (1)")

    def _resources(self, node: Mapping[str, Any], where: str) -> tuple[tuple[int, str] | None,
                                                                        tuple[float, str] | None]:
        """(memory bytes, cpu cores) each with its source; the new `resources` form wins over `resource`."""
        new = node.get("resources")
        old = node.get("resource")
        memory: tuple[int, str] | None = None
        cpu: tuple[float, str] | None = None
        for key, v in (("resources", new), ("resource", old)):
            if v is not None and not isinstance(v, Mapping):
                raise UnimportableError(f"{where}.{key}", f"expected a map, got {type(v).__name__}")
        if isinstance(new, Mapping) and (new.get("requests") or new.get("limits")):
            req = new.get("requests") or {}
            lim = new.get("limits") or {}
            if not isinstance(req, Mapping) or not isinstance(lim, Mapping):
                raise UnimportableError(f"{where}.resources", "requests and limits must be maps")
            for res, value in (*req.items(), *lim.items()):
                if res not in ("cpu", "memory"):
                    self.note(f"{where}.resources.{res}", f"{res}: {value} has no FlinkApp field: not imported "
                              "(put it on flink-main-container's resources in spec.podTemplate)", True)
            for res in ("memory", "cpu"):
                src_kind = "requests" if res in req else "limits" if res in lim else None
                if src_kind is None:
                    continue
                value = (req if src_kind == "requests" else lim)[res]
                src = f"{where}.resources.{src_kind}.{res}"
                if res == "memory":
                    memory = (memory_bytes(value, src), src)
                else:
                    cpu = (cpu_cores(value, src), src)
                if res in req and res in lim and str(req[res]) != str(lim[res]):
                    self.note(f"{where}.resources.limits.{res}", f"limit {lim[res]} differs from request "
                              f"{req[res]}: the reconciler sets the limit to the request"
                              + (" plus headroom for native memory" if res == "memory" else ""), True)
            if isinstance(old, Mapping):
                self.note(f"{where}.resource", "ignored: resources is set too (as the operator does)", False)
        elif isinstance(old, Mapping):
            if old.get("memory") is not None:
                src = f"{where}.resource.memory"
                memory = (memory_bytes(old["memory"], src), src)
            if old.get("cpu") is not None:
                src = f"{where}.resource.cpu"
                cpu = (cpu_cores(old["cpu"], src), src)
            if old.get("ephemeralStorage") is not None:
                self.note(f"{where}.resource.ephemeralStorage", "has no FlinkApp field: not imported (put it on "
                          "flink-main-container's resources in spec.podTemplate)", True)
        return memory, cpu

    # --- job ---------------------------------------------------------------------------------------------------
    def _job(self, spec: Mapping[str, Any], job: Mapping[str, Any], conf: dict[str, tuple[str, str]],
             slots: int) -> None:
        jar = self._jar_uri(job)
        if not jar.startswith(("local://", "http://", "https://")):
            self.note("spec.job.jarURI", f"{jar!r}: on Kubernetes the reconciler runs jars baked into the image "
                      "(local://) or fetched over http(s)://", True)
        parallelism, p, p_src = self._parallelism(job, conf)
        tm = spec.get("taskManager")
        tm_replicas = tm.get("replicas") if isinstance(tm, Mapping) else None
        if tm_replicas is not None:
            replicas = as_int(tm_replicas, "spec.taskManager.replicas")
            effective = replicas * slots
            if parallelism is not None and p != effective:
                self.note(p_src, f"{p} is ignored by the operator when taskManager.replicas is set: the job runs "
                          f"at replicas x slots = {effective}, and so does the import", False)
            self.put(("spec", "taskManager", "replicas"), replicas, "spec.taskManager.replicas")
            self.put(("spec", "job", "parallelism"), effective,
                     "spec.taskManager.replicas x taskmanager.numberOfTaskSlots (the operator's rule)")
        else:
            if job.get("parallelism") is None:
                p_src = p_src if p_src != "spec.job.parallelism" else "Flink default (1)"
                self.note("spec.job.parallelism", "missing (and no taskManager.replicas): the operator refuses such "
                          "a FlinkDeployment (\"Job parallelism must be larger than 0\", DefaultValidator), so it "
                          f"never ran from this spec; imported at {p} ({p_src}): check it against the running job",
                          True)
            self.put(("spec", "job", "parallelism"), p, p_src)
            self.put(("spec", "taskManager", "replicas"), -(-p // slots),
                     f"parallelism {p} / {slots} slots, rounded up (the TaskManagers Flink asks the operator for)")
        mode = self._job_fields(spec, job)
        # Configuration the operator derives from the job (FlinkConfigBuilder.applyJobConfig).
        name = self.app["metadata"]["name"]
        if "pipeline.name" not in conf:
            conf["pipeline.name"] = (name, "operator default: the job is named after the FlinkDeployment")
        if mode == "last-state" and "execution.checkpointing.interval" not in conf:
            conf["execution.checkpointing.interval"] = (
                LAST_STATE_CHECKPOINT_INTERVAL, "operator default for upgradeMode last-state")
        for key, value in OPERATOR_CONF_DEFAULTS.items():
            if key not in conf:
                conf[key] = (value, "operator default")

    def _parallelism(self, job: Mapping[str, Any], conf: dict[str, tuple[str, str]]) -> tuple[Any, int, str]:
        """(as given or None, the parallelism, where it came from): the job's own, else the configuration's
        parallelism.default (taken out of `conf`: the renderer writes it from job.parallelism), else Flink's 1."""
        given = job.get("parallelism")
        src = "spec.job.parallelism"
        if given is None and "parallelism.default" in conf:
            given, src = conf["parallelism.default"]
        p = as_int(given, src) if given is not None else 1
        if p < 1:
            raise UnimportableError(src, f"parallelism {p} must be at least 1")
        conf.pop("parallelism.default", None)
        return given, p, src

    def _jar_uri(self, job: Mapping[str, Any]) -> str:
        jar = job.get("jarURI")
        if not jar:
            raise UnimportableError("spec.job.jarURI", "missing: a job needs a jar (Python and SQL jobs run a jar too)")
        self.put(("spec", "job", "jarURI"), str(jar), "spec.job.jarURI")
        return str(jar)

    def _job_fields(self, spec: Mapping[str, Any], job: Mapping[str, Any]) -> str:
        """The job fields an application and a session job share (all but the jar and the parallelism);
        returns the upgrade mode."""
        for key in job:
            if key not in _KNOWN_JOB:
                self.note(f"spec.job.{key}", "unknown job field: not imported", True)
        if job.get("entryClass"):
            self.put(("spec", "job", "entryClass"), str(job["entryClass"]), "spec.job.entryClass")
        if job.get("args") is not None:
            args = job["args"]
            if not isinstance(args, list):
                raise UnimportableError("spec.job.args", "expected a list of arguments")
            self.put(("spec", "job", "args"), [_scalar_text(a, "spec.job.args") for a in args], "spec.job.args")
        mode = str(job.get("upgradeMode") or "stateless")
        if mode not in ("savepoint", "last-state", "stateless"):
            raise UnimportableError("spec.job.upgradeMode", f"unknown upgrade mode {mode!r}")
        self.put(("spec", "job", "upgradeMode"), mode,
                 "spec.job.upgradeMode" if job.get("upgradeMode") else "operator default (stateless)")
        state = str(job.get("state") or "running")
        if state not in ("running", "suspended"):
            raise UnimportableError("spec.job.state", f"unknown job state {state!r}")
        if job.get("state"):
            self.put(("spec", "job", "state"), state, "spec.job.state")
        for key, target in (("allowNonRestoredState", "allowNonRestoredState"),
                            ("initialSavepointPath", "initialSavepointPath"),
                            ("savepointRedeployNonce", "savepointRedeployNonce")):
            if job.get(key) is not None:
                self.put(("spec", "job", target), job[key], f"spec.job.{key}")
        if spec.get("restartNonce") is not None:
            self.put(("spec", "job", "restartNonce"), spec["restartNonce"], "spec.restartNonce")
        for nonce in ("savepointTriggerNonce", "checkpointTriggerNonce"):
            if job.get(nonce) is not None:
                self.note(f"spec.job.{nonce}", "a one-shot trigger the operator already acted on: not imported "
                          "(take a savepoint with `flink-reconciler savepoint APP`)", False)
        if job.get("autoscalerResetNonce") is not None:
            self.note("spec.job.autoscalerResetNonce", "the operator's autoscaler is not imported", False)
        return mode

    # --- high availability -------------------------------------------------------------------------------------
    def _ha(self, conf: dict[str, tuple[str, str]]) -> None:
        kind = conf.pop("high-availability.type", None)
        storage = conf.pop("high-availability.storageDir", None)
        mode = self.app["spec"].get("job", {}).get("upgradeMode")
        if kind is None or kind[0].strip().lower() in _HA_NONE:
            if storage is not None:
                self.note(storage[1], "high availability is off: not imported", False)
            if mode == "last-state":
                self.note("spec.job.upgradeMode", "last-state without high availability: the operator cannot run "
                          "it either; the reconciler needs highAvailability for every stateful app on Kubernetes",
                          True)
            return
        if kind[0].strip().lower() not in _HA_KUBERNETES:
            self.note(kind[1], f"high-availability.type {kind[0]!r}: the reconciler runs Kubernetes HA only "
                      "(spec.highAvailability)", True)
            return
        self.put(("spec", "highAvailability", "enabled"), True, kind[1])
        if storage is None:
            raise UnimportableError("spec.flinkConfiguration.high-availability.storageDir",
                                "missing: Kubernetes HA needs a storage directory")
        self.put(("spec", "highAvailability", "storageDir"), storage[0], storage[1])

    # --- operator options and the rest of the configuration -----------------------------------------------------
    def _operator_options(self, conf: dict[str, tuple[str, str]]) -> None:
        for key in sorted(k for k in conf if k.startswith("kubernetes.operator.")):
            value, src = conf.pop(key)
            if key in _OPERATOR_MAPPED:
                path, _what = _OPERATOR_MAPPED[key]
                target: Any = value
                if path[-1] == "retain":
                    target = as_int(value, src)
                elif path[-1] in ("maxAge", "maxCheckpointAge", "start"):
                    target = _flink_duration(value, src)
                self.put(path, target, src)
            elif key in _OPERATOR_BUILT_IN:
                self.note(src, f"not needed: {_OPERATOR_BUILT_IN[key]}", False)
            elif key in _OPERATOR_CHANGES:
                self.note(src, f"no FlinkApp equivalent ({_OPERATOR_CHANGES[key]}): not imported", True)
            else:
                self.note(src, "an operator option without a FlinkApp equivalent: not imported", True)
        for key in sorted(k for k in conf if k.startswith("job.autoscaler.")):
            value, src = conf.pop(key)
            enabled = key == "job.autoscaler.enabled" and value.strip().lower() == "true"
            self.note(src, "the operator's autoscaler is not imported" + (
                ": the job keeps the parallelism it is given" if enabled else ""), enabled)

    def _rest_of_configuration(self, conf: dict[str, tuple[str, str]]) -> None:
        kept: dict[str, str] = {}
        for key in sorted(conf):
            value, src = conf[key]
            if key.startswith("$internal."):
                self.note(src, "an internal Flink key: not imported", False)
            elif key in _OWNED_PORTS:
                if value != _OWNED_PORTS[key]:
                    self.note(src, f"the reconciler fixes {key} at {_OWNED_PORTS[key]}: not imported", True)
            elif key in _RESTORE_PATH_KEYS:
                self.note(src.split(" (the Flink 1.x name")[0], f"{value}: the operator removes or replaces it "
                          "on every deploy (ApplicationReconciler.deploy: the restore point is its own), so the job "
                          "never started from it there; carried over it would make every start here restore from "
                          "it: not imported (a first start from a savepoint is spec.job.initialSavepointPath)", True)
            elif key in _OWNED_DROPPED:
                self.note(src, f"set by the reconciler ({_OWNED_DROPPED[key]}): not imported", False)
            elif key == "kubernetes.container.image.pull-policy":
                self._pull_policy(value, src)
            elif key == "kubernetes.service-account":
                if "serviceAccount" not in self.app["spec"].get("runtime", {}):
                    self.put(("spec", "runtime", "serviceAccount"), value, src)
            elif key.startswith("kubernetes."):
                self.note(src, "a Flink native-Kubernetes option: the reconciler renders the pods itself, so it "
                          "would have no effect: not imported", True)
            else:
                kept[key] = value
                self.origins[("spec", "flinkConfiguration", key)] = src
        if kept:
            self.app["spec"]["flinkConfiguration"] = kept

    def _pull_policy(self, value: str, src: str) -> None:
        self.pull = (value, src)

    # --- pod templates ----------------------------------------------------------------------------------------
    def _pod_templates(self, spec: Mapping[str, Any]) -> None:
        if spec.get("serviceAccount"):
            self.put(("spec", "runtime", "serviceAccount"), str(spec["serviceAccount"]), "spec.serviceAccount")
        common = spec.get("podTemplate")
        if common is not None and not isinstance(common, Mapping):
            raise UnimportableError("spec.podTemplate", "expected a Pod template (a map)")
        template: dict[str, Any] = _plain(common) if common else {}
        origin = "spec.podTemplate" if common else ""
        for comp in ("jobManager", "taskManager"):
            node = spec.get(comp)
            if isinstance(node, Mapping) and node.get("podTemplate"):
                self.note(f"spec.{comp}.podTemplate", "a FlinkApp has one podTemplate for every Flink pod: the "
                          f"{comp} template is not imported (merge what both kinds of pods need into "
                          "spec.podTemplate)", True)
        pull = self.pull
        policy, p_src = (str(spec["imagePullPolicy"]), "spec.imagePullPolicy") if spec.get("imagePullPolicy") \
            else pull if pull else (None, "")
        if policy:
            pod_spec = template.setdefault("spec", {})
            containers = pod_spec.setdefault("containers", [])
            main = next((c for c in containers if isinstance(c, dict) and c.get("name") == MAIN_CONTAINER), None)
            if main is None:
                main = {"name": MAIN_CONTAINER}
                containers.insert(0, main)
            main["imagePullPolicy"] = policy
            origin = f"{origin} + {p_src}" if origin else p_src
        if template:
            self.put(("spec", "podTemplate"), template, origin)


def _plain(v: Any) -> Any:
    """A deep copy as plain dicts and lists (the input may be a YAML library's own types)."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def as_int(value: Any, src: str) -> int:
    if isinstance(value, bool):
        raise UnimportableError(src, f"{value!r} is not a whole number")
    try:
        return int(str(value).strip())
    except ValueError:
        raise UnimportableError(src, f"{value!r} is not a whole number") from None


_FLINK_DURATION = re.compile(r"\s*([0-9]+)\s*([a-z]*)\s*")
_FLINK_DURATION_UNITS = {"": "ms", "ms": "ms", "milli": "ms", "millis": "ms", "millisecond": "ms",
                         "milliseconds": "ms", "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
                         "min": "m", "m": "m", "minute": "m", "minutes": "m", "h": "h", "hour": "h", "hours": "h",
                         "d": "d", "day": "d", "days": "d"}


def _flink_duration(value: str, src: str) -> str:
    """A Flink duration ('5 min', '1h', '30000' ms) as a FlinkApp duration ('5m', '1h', '30s')."""
    m = _FLINK_DURATION.fullmatch(value.lower())
    if not m or m.group(2) not in _FLINK_DURATION_UNITS:
        raise UnimportableError(src, f"cannot read duration {value!r}")
    unit = _FLINK_DURATION_UNITS[m.group(2)]
    if unit == "ms":
        return f"{int(m.group(1)) / 1000:g}s"
    return f"{m.group(1)}{unit}"
