"""A stand-in for the Apache Flink Kubernetes Operator, as a controller of FlinkDeployments (application mode).

Written from the operator's source, apache/flink-kubernetes-operator main at 6e9caeb (July 2026, version
1.16-SNAPSHOT), for what a takeover meets. Each `tick()` reconciles every FlinkDeployment of its namespace:

- **Observe** (`JobStatusObserver`, `SnapshotObserver.observeLatestCheckpoint`): while its JobManager is up, the
  job's state from Flink's REST API into `status.jobStatus.state`; a job in a globally terminal state gets its
  latest checkpoint path written to `status.jobStatus.upgradeSavepointPath`.
- **A spec change to `job.state: suspended`** (`AbstractJobReconciler.reconcileSpecChange` / `getJobUpgrade`):
  - a job already terminal: `useStatusSavepoint`, a NOOP suspend; the status keeps the path it has (an older
    savepoint, a checkpoint, or `KUBERNETES_OPERATOR_LAST_STATE`, for which it reports "Manual restore required");
  - `upgradeMode: savepoint` and a RUNNING job: stop-with-savepoint through Flink's REST API, asynchronously
    (`reconciliationStatus.state: UPGRADING` meanwhile), then `setUpgradeSavepointPath`: the path, and either
    `savepointInfo.lastSavepoint` {timeStamp of the cancel, location, triggerType UPGRADE} or, with snapshot
    resources on, a FlinkStateSnapshot instead (`FlinkStateSnapshotUtils.createUpgradeSnapshotResource`; here only
    its effect on the status: no savepointInfo entry);
  - `upgradeMode: savepoint` and a job not RUNNING: with `kubernetes.operator.job.upgrade.last-state-fallback.
    enabled` (default true) it falls back to last-state: with Kubernetes HA the cluster is deleted and its HA
    ConfigMaps kept, no savepoint is taken and upgradeSavepointPath keeps what it had; with the option "false" it
    waits ("Last-state fallback is disabled, waiting for upgradable state");
  then `lifecycleState: SUSPENDED`. Its cluster (JobManager Deployment, TaskManager pods or Deployment, Services,
  config ConfigMap) is deleted; HA ConfigMaps too after a savepoint suspend.
- **`job.state: running` again** (a takeover aborted): the job is restored from upgradeSavepointPath (savepoint
  mode) or from its HA metadata (last-state), as `restoreJob`/`ApplicationReconciler.deploy` do.
- **Deletion** (`FlinkDeploymentController.cleanup` -> `ApplicationReconciler.cleanupInternal`): its finalizer
  is held for `finalizer_ticks` ticks (a slow operator); a job not terminal is cancelled without a savepoint
  (`kubernetes.operator.savepoint.on-deletion` defaults to false), then the cluster is deleted with its HA data
  (`deleteClusterDeployment(..., deleteHaData=true)`), then the finalizer is removed; what the garbage collector
  would remove later (`gc_lag` ticks) lingers meanwhile.

Objects are labelled as Flink labels them: `app=<name>`, `type=flink-native-kubernetes` (native mode, and every
HA ConfigMap with `configmap-type=high-availability`) or `type=flink-standalone-kubernetes` (standalone mode's
JobManager and TaskManager Deployments). Not modelled: validation webhooks, events, periodic savepoints, session
mode, and the operator's own restarts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from reconciler.live.kubernetes.api import Kube

Obj = dict[str, Any]
FINALIZER = "flinkdeployments.flink.apache.org/finalizer"
MANAGER = "flink-kubernetes-operator"
NATIVE, STANDALONE = "flink-native-kubernetes", "flink-standalone-kubernetes"
PLACEHOLDER = "KUBERNETES_OPERATOR_LAST_STATE"
FALLBACK = "kubernetes.operator.job.upgrade.last-state-fallback.enabled"
TERMINAL = {"FINISHED", "CANCELED", "FAILED"}


@dataclass
class Managed:
    """What the operator keeps in memory for one FlinkDeployment (the rest is in its status)."""

    job_id: str
    mode: str = "native"  # native | standalone
    trigger: str | None = None  # stop-with-savepoint in flight
    cancel_ts_ms: int = 0
    held: int = 0  # ticks the finalizer was held
    gc: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, name, ticks left) the GC removes later


@dataclass
class FlinkOperator:
    kube: Kube
    namespace: str
    flink_url: str
    now_ms: Any  # () -> int, the operator's clock
    start_job: Any  # (job_id, restore: str | None) -> None: its JobManager starting the job
    stop_jobmanager: Any  # () -> None: its JobManager process going away
    finalizer_ticks: int = 0
    gc_lag: int = 0
    snapshot_resources: bool = False  # FlinkStateSnapshot resources instead of savepointInfo
    node_name: str | None = None  # pin its pods here (on a real API server: a node that does not exist, so none runs)
    managed: dict[str, Managed] = field(default_factory=dict)
    cancelled_without_savepoint: list[str] = field(default_factory=list)
    stops: int = 0
    overlaps: list[str] = field(default_factory=list)  # ticks where its objects and ours lived side by side
    # A test's doings at the moment the operator reads a FlinkDeployment, before it acts on what it read.
    on_read: list[Any] = field(default_factory=list)

    # ---- its app, as the operator deployed it ----
    def deploy(self, name: str, job_id: str, *, job: Obj, conf: Obj, status: Obj | None = None,
               mode: str = "native", ha: bool = True) -> None:
        kind = NATIVE if mode == "native" else STANDALONE
        conf = {**conf, **({"high-availability.type": "kubernetes",
                            "high-availability.storageDir": f"s3://bucket/ha/{name}"} if ha else {})}
        spec = {"image": "flink:2.3", "flinkVersion": "v2_0", "serviceAccount": "flink", "mode": mode,
                "flinkConfiguration": conf, "job": job,
                "jobManager": {"resource": {"memory": "1024m", "cpu": 1}},
                "taskManager": {"resource": {"memory": "1024m", "cpu": 1}}}
        self._create({"apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkDeployment",
                      "metadata": {"name": name, "namespace": self.namespace, "finalizers": [FINALIZER]},
                      "spec": spec}, manager="kubectl")
        self._write_status(name, status or {
            "lifecycleState": "STABLE", "jobManagerDeploymentStatus": "READY",
            "reconciliationStatus": {"state": "DEPLOYED", "lastReconciledSpec": json.dumps({"job": job})},
            "jobStatus": {"jobId": job_id, "state": "RUNNING"}})
        self.managed[name] = Managed(job_id, mode)
        labels = {"app": name, "type": kind}
        pod_spec: Obj = {"containers": [{"name": "flink-main-container", "image": "flink:2.3"}],
                         **({"nodeName": self.node_name} if self.node_name else {})}
        self._create({"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": name, "labels": {**labels, "component": "jobmanager"}},
                      "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                               "template": {"metadata": {"labels": labels}, "spec": pod_spec}}})
        if mode == "standalone":
            self._create({"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": f"{name}-taskmanager", "labels": {**labels, "component": "taskmanager"}},
                          "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                                   "template": {"metadata": {"labels": labels}, "spec": pod_spec}}})
        for pod, comp in ((f"{name}-jm-0", "jobmanager"), (f"{name}-taskmanager-1-1", "taskmanager")):
            self._create({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": pod, "labels": {**labels, "component": comp}}, "spec": pod_spec})
        for svc in (name, f"{name}-rest"):
            self._create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc, "labels": labels},
                          "spec": {"ports": [{"name": "rest", "port": 8081}]}})
        self._create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": f"flink-config-{name}", "labels": labels}, "data": {"config.yaml": "{}"}})
        if ha:
            for cm in (f"{name}-cluster-config-map", f"{name}-{job_id}-config-map"):
                self._create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm, "labels": {
                    "app": name, "type": NATIVE, "configmap-type": "high-availability"}},
                    "data": {"checkpointID-0000000000000000042": "s3://bucket/ha/completedCheckpoint42"}})
        self.start_job(job_id, None)

    def deployment(self, name: str) -> Obj | None:
        return self.kube.get("FlinkDeployment", self.namespace, name)

    def objects(self, name: str) -> list[str]:
        """What is left of its app: its objects by label (either mode), and the FlinkDeployment."""
        sel = f"app={name},type in ({NATIVE},{STANDALONE})"
        left = [f"{k}/{o['metadata']['name']}" for k in ("Deployment", "Pod", "Service", "ConfigMap")
                for o in self.kube.list(k, self.namespace, sel)]
        return sorted(left) + ([f"FlinkDeployment/{name}"] if self.deployment(name) else [])

    def ha_configmaps(self, name: str) -> list[str]:
        sel = f"app={name},configmap-type=high-availability"
        return [o["metadata"]["name"] for o in self.kube.list("ConfigMap", self.namespace, sel)]

    # ---- its reconcile loop ----
    def tick(self) -> None:
        ours = self.kube.list("Deployment", self.namespace, "app.kubernetes.io/managed-by=flink-reconciler")
        for name, m in list(self.managed.items()):
            mine = [o for o in self.objects(name) if not o.startswith("FlinkDeployment/")]
            if ours and mine:
                self.overlaps.append(f"{mine} beside {[d['metadata']['name'] for d in ours]}")
            self._collect_garbage(m)
            fd = self.deployment(name)
            if fd is None:
                continue
            for fn in self.on_read:
                fn(fd)
            if fd["metadata"].get("deletionTimestamp"):
                self._cleanup(name, fd, m)
                continue
            self._observe(name, fd, m)
            observed = self.deployment(name)
            if observed is None:
                continue
            # One snapshot per reconcile, as the operator's informer gives it: the spec as read above (a patch that
            # lands meanwhile is the next reconcile's), the status as the observer just wrote it.
            self._reconcile(name, {**observed, "spec": fd["spec"]}, m)

    def _observe(self, name: str, fd: Obj, m: Managed) -> None:
        status = fd.get("status") or {}
        if status.get("jobManagerDeploymentStatus") != "READY":
            return
        job = self._flink("GET", f"/jobs/{m.job_id}")
        state = job.get("state") if job else None
        if state is None or state == (status.get("jobStatus") or {}).get("state"):
            return
        patch: Obj = {"state": state}
        if state in TERMINAL:  # SnapshotObserver.observeLatestCheckpoint: the last checkpoint is the restore point
            latest = ((self._flink("GET", f"/jobs/{m.job_id}/checkpoints") or {}).get("latest") or {})
            path = (latest.get("completed") or {}).get("external_path")
            if path:
                patch["upgradeSavepointPath"] = path
        self._write_status(name, {"jobStatus": patch})

    def _reconcile(self, name: str, fd: Obj, m: Managed) -> None:
        status = fd.get("status") or {}
        recon = status.get("reconciliationStatus") or {}
        last = json.loads(recon.get("lastReconciledSpec") or "{}").get("job") or {}
        job = fd["spec"].get("job") or {}
        desired, current = job.get("state", "running"), last.get("state", "running")
        job_status = status.get("jobStatus") or {}
        if desired == "suspended" and current == "running":
            self._suspend(name, fd, m, job, job_status)
        elif desired == "running" and current == "suspended":
            self._restore(name, m, job, last, job_status)

    def _suspend(self, name: str, fd: Obj, m: Managed, job: Obj, job_status: Obj) -> None:
        conf = fd["spec"].get("flinkConfiguration") or {}
        mode = job.get("upgradeMode", "stateless")
        state = job_status.get("state")
        if m.trigger is not None:
            self._await_savepoint(name, m, job)
            return
        if state in TERMINAL:  # useStatusSavepoint: a NOOP suspend from the observed latest state
            if job_status.get("upgradeSavepointPath") == PLACEHOLDER:
                self._write_status(name, {"error": "Job is in terminal state but last checkpoint is unknown, "
                                                   "possibly due to an unrecoverable restore error. Manual restore "
                                                   "required."})
                return
            self._suspended(name, job, delete_ha=True)
            return
        if mode == "savepoint":
            if state == "RUNNING":
                m.cancel_ts_ms = self.now_ms()
                m.trigger = self._flink("POST", f"/jobs/{m.job_id}/stop", {"drain": False})["request-id"]
                self.stops += 1
                self._write_status(name, {"reconciliationStatus": {"state": "UPGRADING"}})
                return
            if str(conf.get(FALLBACK, "true")).lower() == "false":
                return  # "Last-state fallback is disabled, waiting for upgradable state"
            mode = "last-state"
        if mode == "last-state":
            if conf.get("high-availability.type") != "kubernetes":
                return  # JobUpgrade.unavailable(): waits
            self._suspended(name, {**job, "upgradeMode": "last-state"}, delete_ha=False)  # HA metadata kept
            return
        self._flink("PATCH", f"/jobs/{m.job_id}?mode=cancel")  # stateless
        self._suspended(name, job, delete_ha=True)

    def _await_savepoint(self, name: str, m: Managed, job: Obj) -> None:
        op = self._flink("GET", f"/jobs/{m.job_id}/savepoints/{m.trigger}")
        if op["status"]["id"] != "COMPLETED":
            return
        m.trigger = None
        if "location" not in (op.get("operation") or {}):
            self._write_status(name, {"error": f"savepoint failed: {op['operation'].get('failure-cause')}",
                                      "reconciliationStatus": {"state": "DEPLOYED"}})
            return
        location = op["operation"]["location"]
        job_status: Obj = {"upgradeSavepointPath": location}
        if not self.snapshot_resources:
            job_status["savepointInfo"] = {"lastSavepoint": {
                "timeStamp": m.cancel_ts_ms, "location": location, "triggerType": "UPGRADE",
                "formatType": "CANONICAL"}}
        self._write_status(name, {"jobStatus": job_status})
        self._suspended(name, job, delete_ha=True)

    def _suspended(self, name: str, job: Obj, *, delete_ha: bool) -> None:
        m = self.managed[name]
        self._delete_cluster(name, m, delete_ha=delete_ha)
        self.stop_jobmanager()
        self._write_status(name, {"lifecycleState": "SUSPENDED", "jobManagerDeploymentStatus": "MISSING",
                                  "jobStatus": {"state": "FINISHED"},
                                  "reconciliationStatus": {"state": "DEPLOYED",
                                                           "lastReconciledSpec": json.dumps({"job": job})}})

    def _restore(self, name: str, m: Managed, job: Obj, last: Obj, job_status: Obj) -> None:
        if last.get("upgradeMode") == "last-state":
            restore = None  # from its HA metadata (the path set to the placeholder)
            path: str | None = PLACEHOLDER
        else:
            restore = path = job_status.get("upgradeSavepointPath")
        self.start_job(m.job_id, restore)
        self._write_status(name, {"lifecycleState": "STABLE", "jobManagerDeploymentStatus": "READY",
                                  "jobStatus": {"state": "RUNNING", "upgradeSavepointPath": path},
                                  "reconciliationStatus": {"state": "DEPLOYED",
                                                           "lastReconciledSpec": json.dumps({"job": job})}})

    def _cleanup(self, name: str, fd: Obj, m: Managed) -> None:
        if m.held < self.finalizer_ticks:
            m.held += 1
            return
        state = ((fd.get("status") or {}).get("jobStatus") or {}).get("state")
        if (fd.get("status") or {}).get("jobManagerDeploymentStatus") == "READY" and state not in TERMINAL:
            self._flink("PATCH", f"/jobs/{m.job_id}?mode=cancel")  # SuspendMode.STATELESS: no savepoint
            self.cancelled_without_savepoint.append(m.job_id)
            self.stop_jobmanager()
        self._delete_cluster(name, m, delete_ha=True)
        self.kube.request("PATCH", Kube.path("FlinkDeployment", self.namespace, name),
                          query=[("fieldManager", MANAGER)], body={"metadata": {"finalizers": None}},
                          content_type="application/merge-patch+json")

    def _delete_cluster(self, name: str, m: Managed, *, delete_ha: bool) -> None:
        """`deleteClusterDeployment`: the JobManager Deployment (its pods and, by the garbage collector, what it
        owns), the Services, the config ConfigMap, and with deleteHaData the HA ConfigMaps. With `gc_lag`, what
        the garbage collector removes (the TaskManagers) lingers that many ticks."""
        sel = f"app={name},type in ({NATIVE},{STANDALONE})"
        for kind in ("Deployment", "Pod", "Service", "ConfigMap"):
            for o in self.kube.list(kind, self.namespace, sel):
                obj, labels = o["metadata"]["name"], o["metadata"].get("labels") or {}
                if labels.get("configmap-type") == "high-availability" and not delete_ha:
                    continue
                if self.gc_lag and labels.get("component") == "taskmanager":
                    if all(g[1] != obj for g in m.gc):
                        m.gc.append((kind, obj, self.gc_lag))
                    continue
                self.kube.delete(kind, self.namespace, obj)

    def _collect_garbage(self, m: Managed) -> None:
        keep = []
        for kind, obj, left in m.gc:
            if left <= 1:
                self.kube.delete(kind, self.namespace, obj)
            else:
                keep.append((kind, obj, left - 1))
        m.gc = keep

    # ---- its clients ----
    def _flink(self, method: str, path: str, body: Obj | None = None) -> Any:
        r = httpx.request(method, f"{self.flink_url}{path}", json=body, timeout=10)
        if r.status_code in (404, 409):  # no such job (its JobManager is gone) / already terminal
            return None
        r.raise_for_status()
        return r.json() if r.content else None

    def _create(self, obj: Obj, manager: str = MANAGER) -> None:
        self.kube.request("POST", Kube.path(obj["kind"], self.namespace), query=[("fieldManager", manager)], body=obj)

    def _write_status(self, name: str, status: Obj) -> None:
        self.kube.request("PATCH", Kube.path("FlinkDeployment", self.namespace, name) + "/status",
                          query=[("fieldManager", MANAGER)], body={"status": status},
                          content_type="application/merge-patch+json")
