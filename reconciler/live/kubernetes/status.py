"""What Kubernetes' objects say about an app's clusters, read without a request.

Pure functions over the JSON the API server returns: whether a workload has rolled out, what is wrong
with a pod, why a new job generation cannot start, which of Flink's own HA ConfigMaps belong to an app,
and how a live object differs from what we render. Kept apart from the runtime so that these readings,
which decide between waiting, failing and rolling back, are table-tested on plain dicts.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.render import Obj

# Flink's own labels on its Kubernetes HA ConfigMaps: `app=<kubernetes.cluster-id>` and this type. Flink 2.3
# sets only these two (no `configmap-type`: seen on real Flink with the test process node), so the names
# are checked too: `<cluster-id>-cluster-config-map` and `<cluster-id>-<job id>-config-map`. The cluster-id
# is the HA identity of one job generation, `<app>.<12 hex>` (render.ha_cluster_id), or the app name
# for clusters rendered before generations.
HA_CONFIGMAP_SELECTOR = "type=flink-native-kubernetes"

# Container states that do not heal by waiting: the cluster is FAILED (a deadline still decides).
FAILING_REASONS = frozenset({
    "ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull", "CrashLoopBackOff",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "OOMKilled",
})


def _hex(text: str, length: int) -> bool:
    return len(text) == length and all(ch in "0123456789abcdef" for ch in text)


def is_ha_configmap_name(cluster_id: str, name: str) -> bool:
    """Flink's HA ConfigMap names for `cluster_id`: the cluster's, and one per job (32 hex digits)."""
    if name == f"{cluster_id}-cluster-config-map":
        return True
    middle = name.removeprefix(f"{cluster_id}-").removesuffix("-config-map")
    return name.startswith(f"{cluster_id}-") and name.endswith("-config-map") and _hex(middle, 32)


def ha_configmap_cluster_id(app: str, cm: Obj) -> str | None:
    """The HA identity (cluster-id) of `app` that Flink's HA ConfigMap `cm` belongs to, or None when it is not
    one of `app`'s: its `app` label is the app name (a cluster rendered before generations) or
    `<app>.<12 hex>`, and its name is one of that identity's HA names. App names have no dot, so another
    app's identity never matches."""
    cid = label(cm, "app") or ""
    if cid != app:
        prefix, dot, digits = cid.rpartition(".")
        if not dot or prefix != app or not (_hex(digits, r.HA_ID_DIGITS) or is_session_suffix(digits)):
            return None
    return cid if is_ha_configmap_name(cid, str((cm.get("metadata") or {}).get("name", ""))) else None


def ha_job_of(cm: Obj) -> tuple[str, str] | None:
    """(app, job id) of Flink's HA ConfigMap of one job kept under the HA identity of that job's own generation
    (`<app>.<first digits of the job id>`, render.ha_cluster_id); None for anything else: the cluster's own HA
    ConfigMap, a warm standby's session identity, an identity from before generations (the app name)."""
    cid = label(cm, "app") or ""
    app, dot, digits = cid.rpartition(".")
    name = str((cm.get("metadata") or {}).get("name", ""))
    if not dot or not app or not _hex(digits, r.HA_ID_DIGITS):
        return None
    job = name.removeprefix(f"{cid}-").removesuffix("-config-map")
    if not (name.startswith(f"{cid}-") and name.endswith("-config-map") and _hex(job, 32) and job.startswith(digits)):
        return None
    return app, job


def is_session_suffix(text: str) -> bool:
    """`g<8 hex>`: the HA identity suffix of a warm standby's session cluster (render.ha_cluster_id)."""
    return text.startswith("g") and _hex(text[1:], 8)


def generation_failure(pod: Obj) -> str | None:
    """Why a pod of a new job generation will not come up, from what Kubernetes reports, or None.

    Only a container that really ended with an error counts: a non-zero exit code now, or before its last
    restart while it is not ready again, or CrashLoopBackOff. Never a container that is still being
    created, pulled or probed, nor one that came back ready after a crash (the job's own wait decides)."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        state, last = cs.get("state") or {}, (cs.get("lastState") or {}).get("terminated") or {}
        term = state.get("terminated") or {}
        waiting = state.get("waiting") or {}
        failed = term if term and int(term.get("exitCode", 0)) != 0 else \
            last if last and int(last.get("exitCode", 0)) != 0 and not cs.get("ready") else None
        if failed is None and waiting.get("reason") != "CrashLoopBackOff":
            continue
        failed = failed or {}
        restarts = int(cs.get("restartCount") or 0)
        what = f"container {cs.get('name')} exited with code {failed.get('exitCode', '?')}"
        if failed.get("reason"):
            what += f" ({failed['reason']})"
        if restarts:
            what += f", restarted {restarts} time(s)"
        if waiting.get("reason") == "CrashLoopBackOff":
            what += ", CrashLoopBackOff"
        cause = _termination_cause(str(failed.get("message") or ""))
        return f"{what}{': ' + cause if cause else ''}"
    return None


def _termination_cause(message: str) -> str:
    """The telling line of a termination message (with FallbackToLogsOnError: the log's tail): the last
    `Caused by:` of a Java stack trace, else the last line that names an exception or error, else the last."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for pick in (lambda ln: ln.startswith("Caused by:"), lambda ln: "Exception" in ln or "ERROR" in ln):
        found = [ln for ln in lines if pick(ln)]
        if found:
            return found[-1][:400]
    return lines[-1][:400] if lines else ""


def workload_ready(obj: Obj) -> tuple[bool, str | None]:
    """(available, why-not) from a Deployment/StatefulSet's status, the way `kubectl rollout status` reads it."""
    spec, status, meta = obj.get("spec", {}), obj.get("status") or {}, obj.get("metadata", {})
    want = int(spec.get("replicas", 1))
    for c in status.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("status") == "False":
            return False, f"{c.get('reason')}: {c.get('message')}"
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return False, f"{c.get('reason')}: {c.get('message')}"
    if int(status.get("observedGeneration", 0)) < int(meta.get("generation", 1)):
        return False, "the controller has not yet seen the latest spec"
    ready_key = "availableReplicas" if obj.get("kind") == "Deployment" else "readyReplicas"
    if int(status.get("updatedReplicas", 0)) < want or int(status.get(ready_key, 0)) < want:
        return False, f"{status.get(ready_key, 0) or 0}/{want} replicas available"
    if int(status.get("replicas", 0)) > want:
        return False, "old replicas are still terminating"
    return True, None

# Of those, the ones a new cluster (a warm standby) fails on at once: its configuration cannot run (a crash
# loop of an init container too: `generation_failure` looks at the main containers only).
NEVER_HEALS = ("RunContainerError", "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff")


def pod_problem(pod: Obj) -> tuple[bool, str] | None:
    """(fatal, reason) of the most telling problem of a pod, or None when it is fine or just starting."""
    status = pod.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return False, f"{c.get('reason') or 'Unschedulable'}: {c.get('message', '')}".rstrip(": ")
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in FAILING_REASONS:
            last = ((cs.get("lastState") or {}).get("terminated") or {})
            extra = f" (last exit: {last.get('reason')}, code {last.get('exitCode')})" if last else ""
            return True, f"{reason}: {waiting.get('message', '')}{extra}".strip()
        term = (cs.get("state") or {}).get("terminated") or {}
        if term.get("reason") == "OOMKilled" or (term and int(term.get("exitCode", 0)) != 0):
            return True, f"{term.get('reason', 'Error')}: container {cs.get('name')} exited {term.get('exitCode')}"
    if status.get("phase") == "Failed":
        return True, f"{status.get('reason', 'Failed')}: {status.get('message', '')}"
    return None


def rewind_warning(root: Obj | None, jobmanager: Obj | None, pods: list[Obj]) -> str | None:
    """After the fact: a stateful app deployed without HA (before HA was required) whose JobManager
    container restarted ran its job again from the arguments' --fromSavepoint (or empty), not from its
    latest checkpoint. Container restarts only: a pod replaced by a drain starts at restartCount 0."""
    try:
        spec = json.loads(((root or {}).get("data") or {}).get("flinkapp.json") or "{}").get("spec") or {}
    except (ValueError, AttributeError):
        return None
    if not isinstance(spec, dict) or (spec.get("highAvailability") or {}).get("enabled") \
            or (spec.get("job") or {}).get("upgradeMode") == "stateless" or jobmanager is None:
        return None
    restarts = 0
    for pod in pods:
        if label(pod, r.LABEL_COMPONENT) != "jobmanager" or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") == r.MAIN_CONTAINER:
                restarts += int(cs.get("restartCount") or 0)
    if not restarts:
        return None
    containers = ((jobmanager.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or [{}]
    args = list(containers[0].get("args") or [])
    origin = f"savepoint {args[args.index('--fromSavepoint') + 1]}" if "--fromSavepoint" in args[:-1] \
        else "empty state"
    return (f"the JobManager restarted {restarts} time(s) without highAvailability: each restart ran the job "
            f"again from {origin}, not from its latest checkpoint, so its state may have rewound. Enable "
            "spec.highAvailability (required for stateful apps on Kubernetes)")


def subset_diff(want: Any, have: Any, path: str = "") -> list[str]:
    """Where `have` differs from `want`, ignoring fields `want` does not set (server defaults, status)."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return [f"{path or '.'}: live {have!r}, rendered a map"]
        out = []
        for k, v in want.items():
            if k not in have:
                out.append(f"{path}.{k}: missing live")
            else:
                out += subset_diff(v, have[k], f"{path}.{k}")
        return out
    if isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            return [f"{path}: live has {len(have) if isinstance(have, list) else have!r} items, rendered {len(want)}"]
        out = []
        for i, (w, h) in enumerate(zip(want, have, strict=True)):
            out += subset_diff(w, h, f"{path}[{i}]")
        return out
    if want != have and str(want) != str(have):
        return [f"{path}: live {have!r}, rendered {want!r}"]
    return []

def label(obj: Obj, key: str) -> str | None:
    labels: dict[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(key)


def taskmanager_generation(workload: Obj | None) -> str | None:
    """The job id the live TaskManagers were started for (None: none live, or rendered before generations)."""
    job: str | None = _template_annotations(workload or {}).get(r.ANNOTATION_JOB_ID)
    return job


def _template_annotations(workload: Obj) -> dict[str, str]:
    meta = ((workload.get("spec") or {}).get("template") or {}).get("metadata") or {}
    annotations: dict[str, str] = meta.get("annotations") or {}
    return annotations


def keep_running_pods(objs: list[Obj], live: list[Obj]) -> tuple[list[Obj], tuple[tuple[str, str], ...]]:
    """`objs` (one cluster, rendered) as applied onto `live` workloads of that cluster whose job keeps running
    (`ensure_cluster(keep_running=True)`: a scale, a repair of dead processes). A pod template that changed would
    make Kubernetes replace every pod of its workload; the spec asked for no such change here (the planner plans a
    new job for those), so a difference is the reconciler's own rendering (a newer version's). Hence:

    - a live workload keeps its pod template: only its replicas and what lies outside its pods follow `objs`;
    - when the live pods were started from another config (their config hash differs), the config ConfigMap is
      left out, so a pod started later (a new TaskManager, a restarted JobManager) reads the config its peers run
      with; a recreated workload's pods say so by that config's hash.

    Like the Flink Kubernetes Operator, whose default configuration reaches a deployment only with its next spec
    change: the new rendering comes with the app's next job. Returns what to apply and what was left out (kept)."""
    by_key = {(o["kind"], o["metadata"]["name"]): o for o in live if not o["metadata"].get("deletionTimestamp")}
    if not by_key:
        return objs, ()
    running = next((h for o in by_key.values() if (h := _template_annotations(o).get(r.ANNOTATION_CONFIG_HASH))),
                   None)
    rendered = next((h for o in objs if o["kind"] in ("Deployment", "StatefulSet")
                     and (h := _template_annotations(o).get(r.ANNOTATION_CONFIG_HASH))), None)
    other_config = running is not None and rendered is not None and running != rendered
    out: list[Obj] = []
    kept: list[tuple[str, str]] = []
    for o in objs:
        key = (o["kind"], o["metadata"]["name"])
        if other_config and o["kind"] == "ConfigMap" and label(o, r.LABEL_COMPONENT) == "config":
            kept.append(key)
        elif key in by_key:
            out.append({**o, "spec": {**o["spec"], "template": copy.deepcopy(by_key[key]["spec"]["template"])}})
        elif other_config and o["kind"] in ("Deployment", "StatefulSet"):
            template = o["spec"]["template"]
            meta = {**template["metadata"],
                    "annotations": {**template["metadata"]["annotations"], r.ANNOTATION_CONFIG_HASH: running}}
            out.append({**o, "spec": {**o["spec"], "template": {**template, "metadata": meta}}})
        else:
            out.append(o)
    return out, tuple(kept)
