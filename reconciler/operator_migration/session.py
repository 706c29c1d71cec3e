"""The session half of `flink-reconciler import` (pure): a session-mode FlinkDeployment (one without `spec.job`)
becomes a FlinkSessionCluster, a FlinkSessionJob a FlinkApp whose `spec.sessionCluster` names it.

Both build on the application-mode converter of `operator_migration.application`: image, version, configuration (nested
form, Flink 1.x names), resources, high availability and pod templates read the same. What differs:

- TaskManagers. In native mode (the operator's default) the operator's Flink starts TaskManagers as jobs need
  slots and stops idle ones; the FlinkSessionCluster does the same with `capacity.addTaskManagers` from
  `taskManager.replicas: 0`, but needs a ceiling the operator does not have: `slotmanager.number-of-slots.max`
  when set, else what the session jobs imported with it need (`link`). Standalone mode has a fixed count.
- Configuration. The operator runs a session job with its cluster's configuration and the job's own
  `flinkConfiguration` over it (FlinkConfigManager.getSessionJobConfig). The cluster's `kubernetes.operator.*`
  options therefore map onto each session job's FlinkApp (savepoint retention, deadlines) as in application
  mode; other keys of a job's own cannot be carried: flink-reconciler submits every job of a session cluster
  with the cluster's configuration.
- Takeover. The live takeover moves application-mode FlinkDeployments only: a session job's state moves by
  hand (suspend with a savepoint, `initialSavepointPath`), and each imported session job says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from reconciler.operator_migration.application import (
    FLINK_DEPLOYMENT,
    KNOWN_SPEC,
    OPERATOR_GROUP,
    Converter,
    Finding,
    Imported,
    UnimportableError,
    as_int,
    flatten_configuration,
)
from reconciler.spec.model import KIND, valid_name
from reconciler.spec.session import SESSION_KIND

Key = tuple[str, str]  # (namespace, name)

MAX_SLOTS_KEY = "slotmanager.number-of-slots.max"
_INHERITED = ("kubernetes.operator.", "job.autoscaler.", "parallelism.default")
_KNOWN_SESSION_JOB = {"deploymentName", "job", "restartNonce", "flinkConfiguration"}
# The origin of a maxTaskManagers that `link` sizes for the session jobs imported with the cluster.
_NO_JOBS_CEILING = "no session job imported with it: the operator's Flink has no ceiling (raise it for your jobs)"
BY_HAND = "docs/migrate-from-flink-operator.md#session-jobs-by-hand"


def _key(doc: Mapping[str, Any], name: str) -> Key:
    meta = doc.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    return str(ns or "default"), name


def is_session_deployment(doc: Any) -> bool:
    """A FlinkDeployment without spec.job: the operator runs it as a session cluster."""
    return (isinstance(doc, Mapping) and doc.get("kind") == FLINK_DEPLOYMENT
            and str(doc.get("apiVersion") or "").startswith(OPERATOR_GROUP + "/")
            and isinstance(doc.get("spec"), Mapping) and "job" not in doc["spec"])


def session_deployments(docs: list[Any]) -> dict[Key, Mapping[str, Any]]:
    """The session FlinkDeployments of one input by (namespace, name)."""
    out: dict[Key, Mapping[str, Any]] = {}
    for doc in docs:
        meta = doc.get("metadata") if isinstance(doc, Mapping) else None
        if is_session_deployment(doc) and isinstance(meta, Mapping) and meta.get("name"):
            out[_key(doc, str(meta["name"]))] = doc
    return out


class SessionClusterConverter(Converter):
    """A session-mode FlinkDeployment -> a FlinkSessionCluster."""

    NATIVE_MODE = ("native mode: the operator's Flink starts TaskManagers as jobs need slots; the "
                   "FlinkSessionCluster does the same with capacity.addTaskManagers")

    def __init__(self, doc: Mapping[str, Any], *, namespace: str | None = None) -> None:
        super().__init__(doc, namespace=namespace)
        self.app["kind"] = SESSION_KIND

    def run(self) -> dict[str, Any]:
        self._metadata()
        spec = self._spec(KNOWN_SPEC - {"job"})
        version = self._version(spec)
        conf = self._configuration(spec, version)
        self._image(spec)
        slots = self._slots(conf)
        self._components(spec, conf)
        self._task_managers(spec, conf, slots)
        if "parallelism.default" in conf:
            _value, src = conf.pop("parallelism.default")
            self.note(src, "a session cluster has no job: the FlinkApp of each FlinkSessionJob imported with it "
                      "sets job.parallelism (from this value when the job gives none)", False)
        self._ha(conf)
        self._operator_options(conf)
        self._rest_of_configuration(conf)
        self._pod_templates(spec)
        self._cluster_extras(spec)
        self.note("spec", "a session cluster is not taken over live: apply it beside the operator's, "
                  f"move its session jobs over by hand ({BY_HAND}), then delete the FlinkDeployment", False)
        return self.app

    def _task_managers(self, spec: Mapping[str, Any], conf: dict[str, tuple[str, str]], slots: int) -> None:
        tm = spec.get("taskManager")
        replicas = tm.get("replicas") if isinstance(tm, Mapping) else None
        if spec.get("mode") == "standalone":
            if replicas is not None:
                self.put(("spec", "taskManager", "replicas"), as_int(replicas, "spec.taskManager.replicas"),
                         "spec.taskManager.replicas")
            else:
                self.put(("spec", "taskManager", "replicas"), 1, "operator default for a standalone session "
                         "cluster (kubernetes.internal.taskmanager.replicas)")
            return
        if replicas is not None:
            self.note("spec.taskManager.replicas", "ignored by the operator in native mode (its Flink starts "
                      "TaskManagers as jobs need them), and so by the import", False)
        self.put(("spec", "taskManager", "replicas"), 0, "native mode: no TaskManager before a job needs one")
        self.put(("spec", "capacity", "addTaskManagers"), True,
                 "native mode: the operator's Flink starts TaskManagers as jobs need slots")
        most = conf.get(MAX_SLOTS_KEY)
        if most is not None:
            self.put(("spec", "capacity", "maxTaskManagers"), max(1, as_int(most[0], most[1]) // slots),
                     f"{most[1]} / {slots} slots")
        else:
            self.put(("spec", "capacity", "maxTaskManagers"), 1, _NO_JOBS_CEILING)

    def _operator_options(self, conf: dict[str, tuple[str, str]]) -> None:
        for key in sorted(k for k in conf if k.startswith(_INHERITED)):
            _value, src = conf.pop(key)
            self.note(src, "an operator option the operator applies to the session jobs on this cluster: carried "
                      "onto the FlinkApp of each FlinkSessionJob imported with it where it has an equivalent "
                      "(see their findings)", False)


class SessionJobConverter(Converter):
    """A FlinkSessionJob -> a FlinkApp on the FlinkSessionCluster its deploymentName names."""

    def __init__(self, doc: Mapping[str, Any], clusters: Mapping[Key, Mapping[str, Any]], *,
                 namespace: str | None = None) -> None:
        super().__init__(doc, namespace=namespace)
        self.clusters = clusters

    def run(self) -> dict[str, Any]:
        self._metadata()
        spec = self._spec(_KNOWN_SESSION_JOB)
        target = spec.get("deploymentName")
        if not target:
            raise UnimportableError("spec.deploymentName", "missing: a FlinkSessionJob names the session "
                                    "FlinkDeployment it runs on")
        if not isinstance(target, str):
            raise UnimportableError("spec.deploymentName", f"expected the name of a FlinkDeployment, got "
                                    f"{type(target).__name__}")
        if not valid_name(target):
            raise UnimportableError("spec.deploymentName", f"{target!r} is not a FlinkSessionCluster name (a "
                                    "DNS-1123 label of at most 45 characters)")
        job = spec.get("job")
        if job is None:
            raise UnimportableError("spec.job", "missing: a FlinkSessionJob without a job has nothing to run")
        if not isinstance(job, Mapping):
            raise UnimportableError("spec.job", f"expected a map, got {type(job).__name__}")
        self.put(("spec", "sessionCluster"), target, "spec.deploymentName")
        conf = self._session_configuration(spec, target)
        jar = self._jar_uri(job)
        if not jar.startswith(("local://", "http://", "https://")):
            self.note("spec.job.jarURI", f"{jar!r}: the operator fetched it for the session cluster; "
                      "flink-reconciler uploads a jar it reads itself (a repository path, file:// on its host, "
                      "http(s)://) or runs one of the image's (local://)", True)
        parallelism, p, p_src = self._parallelism(job, conf)
        self.put(("spec", "job", "parallelism"), p, p_src if parallelism is not None else "Flink default (1)")
        mode = self._job_fields(spec, job)
        self._operator_options(conf)
        self._job_configuration(conf)
        self._takeover_note(job, mode)
        return self.app

    def _session_configuration(self, spec: Mapping[str, Any], target: str) -> dict[str, tuple[str, str]]:
        """The job's own configuration, over the operator options (and default parallelism) of its cluster."""
        conf = flatten_configuration(spec.get("flinkConfiguration"))
        cluster = self.clusters.get(_key(self.doc, target))
        if cluster is None:
            return conf
        try:
            inherited = flatten_configuration(cluster["spec"].get("flinkConfiguration"),
                                              f"FlinkDeployment {target} spec.flinkConfiguration")
        except UnimportableError:
            return conf  # the cluster's own document reports it
        for key, item in inherited.items():
            if key.startswith(_INHERITED) and key not in conf:
                conf[key] = item
        return conf

    def _job_configuration(self, conf: dict[str, tuple[str, str]]) -> None:
        for key in sorted(conf):
            _value, src = conf[key]
            if key.startswith("$internal."):
                self.note(src, "an internal Flink key: not imported", False)
            else:
                self.note(src, "a session job's own Flink configuration: flink-reconciler submits every job of a "
                          "session cluster with the cluster's configuration: not imported (move it to the "
                          "FlinkSessionCluster's flinkConfiguration if every job on it may have it)", True)

    def _takeover_note(self, job: Mapping[str, Any], mode: str) -> None:
        live = "not taken over live (the takeover moves application-mode FlinkDeployments only)"
        if mode == "stateless":
            self.note("spec.job", f"{live}: delete the FlinkSessionJob before this app is applied, or the job runs "
                      f"twice ({BY_HAND})", False)
        elif job.get("initialSavepointPath"):
            self.note("spec.job.initialSavepointPath", f"{live}: the job starts from this path; make it the "
                      f"savepoint the operator took when you suspended the FlinkSessionJob ({BY_HAND})", False)
        else:
            self.note("spec.job.upgradeMode", f"{mode}: the job's state is {live}: suspend the FlinkSessionJob "
                      f"with a savepoint and set spec.job.initialSavepointPath to it, or the job starts from empty "
                      f"state ({BY_HAND})", True)


def link(results: list[Imported], deployments: Mapping[Key, Mapping[str, Any]]) -> list[Imported]:
    """Session jobs against the session clusters of the same input: a job whose cluster is missing or was not
    imported says so, and a native session cluster's TaskManager ceiling is sized for its running jobs."""
    clusters = {_key(i.app, i.app["metadata"]["name"]): i for i in results
                if i.app is not None and i.out_kind == SESSION_KIND}
    need: dict[Key, int] = {}
    out: list[Imported] = []
    for imp in results:
        target = imp.app["spec"].get("sessionCluster") if imp.app is not None and imp.out_kind == KIND else None
        if target is None:
            out.append(imp)
            continue
        assert imp.app is not None
        key = _key(imp.app, target)
        job = imp.app["spec"]["job"]
        if key in clusters:
            if job.get("state", "running") == "running":
                need[key] = need.get(key, 0) + int(job["parallelism"])
            out.append(imp)
            continue
        if key in deployments:
            why = (f"the session FlinkDeployment {key[0]}/{target} was not imported (see its findings): this app has "
                   "no cluster to run on")
        else:
            why = (f"the session FlinkDeployment {key[0]}/{target} is not among the imported documents: import it "
                   "in the same run (a file or directory holding both), or validate refuses this app (no "
                   f"FlinkSessionCluster {target!r} in the repository)")
        out.append(replace(imp, findings=(*imp.findings, Finding("spec.deploymentName", why, True))))
    return [_sized(imp, need) for imp in out]


def _sized(imp: Imported, need: Mapping[Key, int]) -> Imported:
    """A native session cluster's capacity.maxTaskManagers from the slots its imported running jobs need."""
    if imp.app is None or imp.origins.get(("spec", "capacity", "maxTaskManagers")) != _NO_JOBS_CEILING:
        return imp
    key = _key(imp.app, imp.app["metadata"]["name"])
    if key not in need:
        return replace(imp, findings=(*imp.findings, Finding(
            "spec.taskManager", "the operator's Flink starts TaskManagers without a ceiling; the import allows one "
            "(capacity.maxTaskManagers: 1) as no running session job was imported with it: raise it for the jobs "
            "you add", False)))
    slots = int(imp.app["spec"].get("taskManager", {}).get("slots", 1))
    most = max(1, -(-need[key] // slots))
    app = {**imp.app, "spec": {**imp.app["spec"], "capacity": {**imp.app["spec"]["capacity"],
                                                               "maxTaskManagers": most}}}
    origins = {**imp.origins, ("spec", "capacity", "maxTaskManagers"):
               f"the running session jobs imported with it: {need[key]} slots / {slots} per TaskManager"}
    note = Finding("spec.taskManager", f"the operator's Flink starts TaskManagers without a ceiling; the import "
                   f"sets capacity.maxTaskManagers to what the session jobs imported with it need ({most}): raise it "
                   "before adding jobs", False)
    return replace(imp, app=app, origins=origins, findings=(*imp.findings, note))

