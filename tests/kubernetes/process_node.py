"""A process node for tests: the kubelet, scheduler and workload/endpoints controllers of a one-node cluster,
running each pod's containers as local processes. Test code only, never the product.

It plays the node for the stand-in API server (and, opt-in, for a real API server without nodes):

- **controllers** (optional, on by default): a Deployment is rolled out as its ``strategy`` says
  (``Recreate``: old pods terminated and gone before any new one is created; anything else is also done as
  Recreate), a StatefulSet gets pods ``<name>-<i>`` and a PersistentVolumeClaim ``<claim>-<name>-<i>`` per
  ``volumeClaimTemplates`` entry; a deleted pod is replaced; workload status (``observedGeneration``,
  ``replicas``, ``updatedReplicas``, ``readyReplicas``, ``availableReplicas``) follows the pods' readiness;
- **scheduler + kubelet**: Pending pods are bound to this node, get their own loopback address
  (127.N.M.2, 127.N.M.3, ...: ports never collide, a block of 4,096 per test process, so two nodes of two
  pytest workers or two runs at once do not either) and their containers run as processes: init containers
  in order, then the main containers. The official Flink image's commands are interpreted
  (``standalone-job``, ``jobmanager``, ``taskmanager`` with their flags) and run as JVMs from the Flink
  distribution of ``apache-flink-libraries``, the way its ``docker-entrypoint.sh`` would (BashJavaUtils
  memory flags, ``--configDir /opt/flink/conf``, ``usrlib`` on the user classpath). Env vars are resolved
  (``value``, ``fieldRef`` such as ``status.podIP``, ``$(VAR)`` in args). Volumes are real mounts in a
  private mount namespace per container (``unshare -m``): ConfigMap volumes are files, PVCs and emptyDirs
  directories; ``/opt/flink`` is the image (Flink's lib/plugins plus the test's ``usrlib``);
- **probes and status**: readiness probes (``httpGet``, ``tcpSocket``) run for real against the pod's
  address and set ``Ready``; a container that exits is restarted (``restartPolicy: Always``) with the
  kubelet's back-off, its ``restartCount``, ``lastState.terminated`` (real exit code; with
  ``terminationMessagePolicy: FallbackToLogsOnError`` a failed run's log tail as its ``message``, 80 lines
  or 2048 bytes at most, as a kubelet does) and ``waiting`` reason ``CrashLoopBackOff``, plus a Warning
  event; an image the node does not know is ``ImagePullBackOff``; a pod whose PVC does not exist stays
  Pending (``Unschedulable``);
- **Services**: Endpoints follow the ready pods (the stand-in's service proxy reaches the pods through
  them) and each pod gets a hosts file (``-Djdk.net.hosts.file``) that resolves Service names the way
  cluster DNS would (to a pod of the Service);
- **deletion**: a pod marked for deletion has its processes terminated (SIGTERM, SIGKILL after the grace
  period), then the node removes the pod object (``gracePeriodSeconds=0``), as a kubelet does.

Where it differs from a kubelet + the official image (what it cannot catch):
- no image pulls, no real image: ``/opt/flink`` is this machine's Flink distribution (lib: log4j and
  flink-dist only) plus the files a test maps to an image name; the image's entrypoint script itself is not run;
- no cgroups: cpu/memory limits are not enforced (the JVM sizes come from Flink's own memory flags);
- no network namespace: every pod shares the host's network, isolated only by its own loopback address;
  Flink's bind hosts (``0.0.0.0`` in the rendered config) are overridden with ``-D`` to that address;
- no cluster DNS and no ClusterIP: Service names resolve through a per-pod JVM hosts file straight to a pod
  (the ready one if any), with a 1 s JVM DNS cache; Endpoints are written, EndpointSlices are not;
- liveness and startup probes are not run; ConfigMap volumes are written once when the pod starts;
- Deployments have no ReplicaSets (pods are owned by the Deployment); StatefulSets replace stale pods all
  at once (the rendered ``podManagementPolicy: Parallel``), not one ordinal at a time;
- it needs root (``unshare -m``, ``mount --bind``) and creates missing mount points (e.g. ``/opt/flink``)
  as empty directories on this machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s_client

from reconciler.live.kubernetes.api import Kube, KubernetesApiError, KubernetesUnavailableError
from reconciler.live.local.config import FAST_START_FLAGS, FlinkDist

log = logging.getLogger(__name__)
Obj = dict[str, Any]

FLINK_IMAGE_HOME = "/opt/flink"
JM_SESSION = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
JM_APPLICATION = "org.apache.flink.container.entrypoint.StandaloneApplicationClusterEntryPoint"
TM_ENTRY = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
BASH_UTILS = "org.apache.flink.runtime.util.bash.BashJavaUtils"
NO_ENDPOINT = "127.255.255.254"  # a Service without pods: connections are refused
IP_BLOCK = 4096  # pod addresses per test process
IP_BLOCKS = 4000  # blocks 1..4000: above 127.0.0.1 (the stand-in), below NO_ENDPOINT


def ip_block_start(pid: int) -> int:
    """The first pod address (as an offset in 127.0.0.0/8) of a process's block: two process nodes running at
    once (two pytest workers, two test runs) would otherwise both hand out 127.0.0.2 with Flink's fixed ports."""
    return (1 + pid % IP_BLOCKS) * IP_BLOCK + 2
NODE_NAME = "process-node"


@dataclass(frozen=True)
class Image:
    """What an image name means on this node. ``flink``: the Flink commands run from the local distribution,
    with ``usrlib`` as /opt/flink/usrlib. Otherwise commands run as host commands (e.g. sh, curl, python)."""

    flink: bool = False
    usrlib: Path | None = None


def needs_root_reason() -> str | None:
    """Why the node cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "the process node needs root (unshare -m and mount --bind for pod volumes)"
    if shutil.which("unshare") is None:
        return "the process node needs unshare (util-linux)"
    return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, $$(VAR) escapes, unknown refs stay as written."""
    def sub(m: re.Match[str]) -> str:
        if m[1] is not None:
            return f"$({m[1]})"
        return env.get(m[2], m[0])
    return re.sub(r"\$\$\(([A-Za-z_]\w*)\)|\$\(([A-Za-z_]\w*)\)", sub, text)


def _path(kind: str, ns: str, name: str | None = None) -> str:
    extra = {"PersistentVolumeClaim": "persistentvolumeclaims", "Endpoints": "endpoints"}
    if kind in extra:
        p = f"/api/v1/namespaces/{ns}/{extra[kind]}"
        return f"{p}/{name}" if name else p
    return Kube.path(kind, ns, name)


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass
class ContainerRun:
    name: str
    spec: Obj
    init: bool
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: str | None = None
    last_term: Obj | None = None
    next_start: float = 0.0
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    done: bool = False  # an init container that exited 0
    ready: bool = False
    probe_fail: int = 0
    next_probe: float = 0.0


@dataclass
class PodRun:
    ns: str
    name: str
    uid: str
    ip: str
    dir: Path
    pod: Obj
    containers: list[ContainerRun] = field(default_factory=list)
    terminating: bool = False
    last_status: Obj | None = None


class ProcessNode:
    """Start with `with ProcessNode(...) as node:`; the node ticks in a background thread."""

    def __init__(self, api_client: k8s_client.ApiClient, *, namespaces: list[str], workdir: Path,
                 images: dict[str, Image], flink_home: Path | None = None, controllers: bool = True,
                 bind_via_subresource: bool = False, tick_s: float = 0.3, probe_period_s: float = 1.0,
                 backoff_base_s: float = 10.0, extra_java_opts: tuple[str, ...] = (),
                 pod_env: dict[str, str] | None = None) -> None:
        self.kube = Kube(api_client, timeout=10.0)
        self.namespaces = namespaces
        self.workdir = workdir
        self.images = images
        self.flink_home = flink_home
        self.controllers = controllers
        self.bind_via_subresource = bind_via_subresource  # a real API server: POST pods/binding
        self.tick_s, self.probe_period_s, self.backoff_base_s = tick_s, probe_period_s, backoff_base_s
        self.extra_java_opts = extra_java_opts
        self.pod_env = pod_env or {}  # what a kubelet adds to every container (e.g. how to reach the API)
        self.pods: dict[tuple[str, str], PodRun] = {}
        self.errors: list[str] = []
        self._ip_next = ip_block_start(os.getpid())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()
        self._dist: FlinkDist | None = None
        self._mem_cache: dict[str, tuple[list[str], list[str]]] = {}
        self._events = 0
        # Readiness probes: a new connection each (no keep-alive), without a new SSL context each as `httpx.get`.
        self._http = httpx.Client(timeout=1.0, limits=httpx.Limits(max_keepalive_connections=0))

    # ---- lifecycle ----
    def __enter__(self) -> ProcessNode:
        why = needs_root_reason()
        if why:
            raise RuntimeError(why)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="process-node", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(30)
        with self._lock:
            for run in list(self.pods.values()):
                self._kill(run, grace=5.0)
        self._http.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # a node keeps running; tests look at `errors`
                log.exception("process node tick failed")
                self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(self.tick_s)

    @property
    def dist(self) -> FlinkDist:
        if self._dist is None:
            self._dist = FlinkDist.discover(self.flink_home)
        return self._dist

    # ---- one pass ----
    def tick(self) -> None:
        with self._lock:
            for ns in self.namespaces:
                if self.controllers:
                    self._deployments(ns)
                    self._statefulsets(ns)
                    self._collect_orphans(ns)
                pods = {p["metadata"]["name"]: p for p in self.kube.list("Pod", ns, "")}
                self._kubelet(ns, pods)
                self._endpoints(ns)

    # ---- controllers ----
    def _collect_orphans(self, ns: str) -> None:
        """The garbage collector's part for pods: a pod whose controlling Deployment/StatefulSet is gone (it
        was deleted while the controller created the pod) is deleted, as the real collector eventually does."""
        owners = {o["metadata"]["uid"] for kind in ("Deployment", "StatefulSet") for o in self.kube.list(kind, ns, "")}
        for p in self.kube.list("Pod", ns, ""):
            refs = [r for r in p["metadata"].get("ownerReferences") or [] if r.get("controller")
                    and r.get("kind") in ("Deployment", "StatefulSet")]
            if refs and refs[0].get("uid") not in owners and not p["metadata"].get("deletionTimestamp"):
                self._delete_pod(ns, p["metadata"]["name"])

    def _owned_pods(self, ns: str, owner: Obj) -> list[Obj]:
        uid = owner["metadata"]["uid"]
        return [p for p in self.kube.list("Pod", ns, "")
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]

    def _new_pod(self, ns: str, owner: Obj, kind: str, name: str, template: Obj, labels: dict[str, str]) -> None:
        meta = template.get("metadata") or {}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": ns, "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": meta.get("annotations") or {},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": owner["metadata"]["name"],
                                 "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": template["spec"]}
        try:
            self.kube.request("POST", Kube.path("Pod", ns), query=[("fieldManager", "kube-controller-manager")],
                              body=body)
        except KubernetesApiError as e:
            if e.code != 409:  # already created
                raise

    def _get(self, kind: str, ns: str, name: str) -> Obj | None:
        try:
            obj: Obj = self.kube.request("GET", _path(kind, ns, name))
            return obj
        except KubernetesApiError as e:
            if e.code == 404:
                return None
            raise

    def _delete_pod(self, ns: str, name: str) -> None:
        with contextlib.suppress(KubernetesApiError):
            self.kube.delete("Pod", ns, name)

    def _ready(self, pod: Obj) -> bool:
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (pod.get("status") or {}).get("conditions") or [])

    def _write_status(self, kind: str, obj: Obj, status: Obj) -> None:
        if {k: v for k, v in (obj.get("status") or {}).items() if k in status} == status and \
                set(obj.get("status") or {}) <= set(status):
            return
        try:
            self.kube.request("PATCH", Kube.path(kind, obj["metadata"]["namespace"], obj["metadata"]["name"])
                              + "/status", query=[("fieldManager", "kube-controller-manager")], body={"status": status},
                              content_type="application/merge-patch+json")
        except KubernetesApiError as e:
            if e.code != 404:  # deleted since it was listed
                raise

    def _deployments(self, ns: str) -> None:
        for dep in self.kube.list("Deployment", ns, ""):
            meta, spec = dep["metadata"], dep["spec"]
            if meta.get("deletionTimestamp"):
                continue
            h = _hash(spec["template"])
            want = int(spec.get("replicas", 1))
            pods = self._owned_pods(ns, dep)
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            current = [p for p in live if p["metadata"].get("labels", {}).get("pod-template-hash") == h]
            old = [p for p in pods if p["metadata"].get("labels", {}).get("pod-template-hash") != h]
            if old:  # Recreate: every old pod is gone before a new one is made
                for p in old:
                    if not p["metadata"].get("deletionTimestamp"):
                        self._delete_pod(ns, p["metadata"]["name"])
            else:
                for _ in range(want - len(current)):
                    self._new_pod(ns, dep, "Deployment", f"{meta['name']}-{h}-{uuid.uuid4().hex[:5]}",
                                  spec["template"], {"pod-template-hash": h})
                for p in current[want:]:
                    self._delete_pod(ns, p["metadata"]["name"])
            ready = len([p for p in current if self._ready(p)])
            status: Obj = {"observedGeneration": meta.get("generation", 1), "replicas": len(live),
                           "updatedReplicas": len(current), "readyReplicas": ready, "availableReplicas": ready,
                           "unavailableReplicas": max(0, want - ready),
                           "conditions": [{"type": "Available", "status": "True" if ready >= want else "False",
                                           "reason": "MinimumReplicasAvailable" if ready >= want
                                           else "MinimumReplicasUnavailable"}]}
            self._write_status("Deployment", dep, status)

    def _statefulsets(self, ns: str) -> None:
        for sts in self.kube.list("StatefulSet", ns, ""):
            meta, spec = sts["metadata"], sts["spec"]
            if meta.get("deletionTimestamp"):
                continue
            name = meta["name"]
            h = _hash(spec["template"])
            want = int(spec.get("replicas", 1))
            pods = {p["metadata"]["name"]: p for p in self._owned_pods(ns, sts)}
            for i in range(want):
                pod_name = f"{name}-{i}"
                template = json.loads(json.dumps(spec["template"]))
                vols = template["spec"].setdefault("volumes", [])
                for vct in spec.get("volumeClaimTemplates") or []:
                    claim = f"{vct['metadata']['name']}-{pod_name}"
                    self._ensure_pvc(ns, sts, claim, vct)
                    vols.append({"name": vct["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
                p = pods.get(pod_name)
                if p is None:
                    self._new_pod(ns, sts, "StatefulSet", pod_name, template,
                                  {"controller-revision-hash": h, "statefulset.kubernetes.io/pod-name": pod_name})
                elif p["metadata"].get("labels", {}).get("controller-revision-hash") != h and \
                        not p["metadata"].get("deletionTimestamp"):
                    self._delete_pod(ns, pod_name)
            for pod_name, p in pods.items():
                idx = pod_name.rsplit("-", 1)[-1]
                if idx.isdigit() and int(idx) >= want and not p["metadata"].get("deletionTimestamp"):
                    self._delete_pod(ns, pod_name)
            live = [p for p in pods.values() if not p["metadata"].get("deletionTimestamp")]
            current = [p for p in live if p["metadata"].get("labels", {}).get("controller-revision-hash") == h]
            ready = len([p for p in current if self._ready(p)])
            self._write_status("StatefulSet", sts, {
                "observedGeneration": meta.get("generation", 1), "replicas": len(live),
                "currentReplicas": len(current), "updatedReplicas": len(current), "readyReplicas": ready,
                "availableReplicas": ready})

    def _ensure_pvc(self, ns: str, sts: Obj, claim: str, vct: Obj) -> None:
        if self._get("PersistentVolumeClaim", ns, claim) is not None:
            return
        body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
            "name": claim, "namespace": ns, "labels": (vct.get("metadata") or {}).get("labels") or {},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"],
                                 "uid": sts["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": vct.get("spec") or {}}
        with contextlib.suppress(KubernetesApiError):
            self.kube.request("POST", _path("PersistentVolumeClaim", ns),
                              query=[("fieldManager", "kube-controller-manager")], body=body)

    # ---- kubelet ----
    def _kubelet(self, ns: str, pods: dict[str, Obj]) -> None:
        for (pns, name), gone in list(self.pods.items()):
            if pns != ns:
                continue
            pod = pods.get(name)
            if pod is None or pod["metadata"]["uid"] != gone.uid:
                self._kill(gone, grace=self._grace(gone.pod))
                self._forget(gone)
            elif pod["metadata"].get("deletionTimestamp") and not gone.terminating:
                gone.terminating = True
                threading.Thread(target=self._terminate, args=(gone, pod), daemon=True).start()
        for name, pod in pods.items():
            if pod["metadata"].get("deletionTimestamp"):
                if (ns, name) not in self.pods and pod["spec"].get("nodeName") == NODE_NAME:
                    self._final_delete(ns, name)  # ours, but its processes are gone already
                continue
            node = pod["spec"].get("nodeName")
            if node not in (None, "", NODE_NAME):
                continue
            known = self.pods.get((ns, name))
            run = known if known is not None else self._admit(ns, pod)
            if run is None:
                continue
            run.pod = pod
            if not run.terminating:
                self._step(run)
                self._report(run)

    def _grace(self, pod: Obj) -> float:
        return float(pod["spec"].get("terminationGracePeriodSeconds", 30))

    def _admit(self, ns: str, pod: Obj) -> PodRun | None:
        name = pod["metadata"]["name"]
        for v in pod["spec"].get("volumes") or []:
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and self._get("PersistentVolumeClaim", ns, claim) is None:
                self._patch_pod_status(ns, name, {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": f'0/1 nodes are available: persistentvolumeclaim "{claim}" not found.'}]})
                return None
        try:
            self._bind(ns, name)
        except KubernetesApiError as e:
            if e.code == 404:  # deleted since it was listed
                return None
            raise
        ip = self._alloc_ip()
        d = self.workdir / "pods" / ns / f"{name}-{pod['metadata']['uid'][:8]}"
        d.mkdir(parents=True, exist_ok=True)
        run = PodRun(ns, name, pod["metadata"]["uid"], ip, d, pod)
        spec = pod["spec"]
        run.containers = [ContainerRun(c["name"], c, True) for c in spec.get("initContainers") or []]
        run.containers += [ContainerRun(c["name"], c, False) for c in spec.get("containers") or []]
        self.pods[(ns, name)] = run
        self._write_volumes(run)
        return run

    def _alloc_ip(self) -> str:
        """Never reused while the node runs (a new pod must not answer on a deleted pod's address)."""
        n = self._ip_next
        self._ip_next += 1
        return f"127.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}" if n % 256 not in (0, 255) else self._alloc_ip()

    def _bind(self, ns: str, name: str) -> None:
        if self.bind_via_subresource:
            self.kube.request("POST", Kube.path("Pod", ns, name) + "/binding", body={
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME}})
        else:
            self.kube.request("PATCH", Kube.path("Pod", ns, name), query=[("fieldManager", "kube-scheduler")],
                              body={"spec": {"nodeName": NODE_NAME}}, content_type="application/merge-patch+json")

    def _write_volumes(self, run: PodRun) -> None:
        for v in run.pod["spec"].get("volumes") or []:
            target = self._volume_dir(run, v)
            target.mkdir(parents=True, exist_ok=True)
            cm = v.get("configMap")
            if cm:
                obj = self.kube.get("ConfigMap", run.ns, cm["name"]) or {}
                data = obj.get("data") or {}
                items = cm.get("items") or [{"key": k, "path": k} for k in data]
                for it in items:
                    if it["key"] in data:
                        (target / it["path"]).write_text(data[it["key"]])

    def _volume_dir(self, run: PodRun, v: Obj) -> Path:
        claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            return self.workdir / "pvcs" / run.ns / str(claim)
        return run.dir / "volumes" / str(v["name"])

    def pvc_dir(self, ns: str, claim: str) -> Path:
        """Where a PersistentVolumeClaim's files are on this machine (tests read job output there)."""
        return self.workdir / "pvcs" / ns / claim

    def _step(self, run: PodRun) -> None:
        now = time.monotonic()
        inits = [c for c in run.containers if c.init]
        for c in inits:
            if c.done:
                continue
            self._advance(run, c, now)
            return  # init containers run one at a time, in order
        for c in run.containers:
            if not c.init:
                self._advance(run, c, now)
                self._probe(run, c, now)

    def _advance(self, run: PodRun, c: ContainerRun, now: float) -> None:
        if c.proc is not None:
            rc = c.proc.poll()
            if rc is None:
                return
            code = 128 - rc if rc < 0 else rc
            c.last_term = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                          "startedAt": c.started_at, "finishedAt": _now()}}
            if code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                c.last_term["terminated"]["message"] = self._log_tail(run, c)
            c.proc, c.ready, c.probe_fail = None, False, 0
            if c.init and code == 0:
                c.done = True
                return
            c.restarts += 1
            delay = 0.0 if c.restarts == 1 else min(self.backoff_base_s * 2 ** (c.restarts - 2), 300.0)
            c.next_start = now + delay
            c.waiting = ("CrashLoopBackOff", f"back-off {delay:.0f}s restarting failed container={c.name} "
                                             f"pod={run.name}")
            self._event(run, "BackOff", f"Back-off restarting failed container {c.name} in pod {run.name}")
            return
        if now < c.next_start:
            return
        image = self.images.get(str(c.spec.get("image", "")))
        if image is None:
            c.waiting = ("ImagePullBackOff", f'Back-off pulling image "{c.spec.get("image")}"')
            if c.restarts == 0 and c.next_start == 0.0:
                self._event(run, "Failed", f'Failed to pull image "{c.spec.get("image")}": not known to the '
                                           "process node")
            c.next_start = now + 1e9
            return
        try:
            c.proc = self._start(run, c, image)
        except Exception as e:  # a container that cannot be started is a failed start, not a node failure
            c.waiting = ("RunContainerError", str(e)[:300])
            c.next_start = now + self.backoff_base_s
            return
        c.started_at, c.waiting, c.next_probe = _now(), None, now

    @staticmethod
    def _log_tail(run: PodRun, c: ContainerRun) -> str:
        """What a kubelet puts in the termination message under FallbackToLogsOnError: the end of this run's
        log, at most 80 lines and 2048 bytes."""
        try:
            text = (run.dir / f"{c.name}.log").read_bytes()
        except OSError:
            return ""
        marker = b"--- start "  # the node's own header line before each run: not the container's output
        pos = text.rfind(b"\n" + marker)
        start = pos + 1 if pos >= 0 else (0 if text.startswith(marker) else -1)
        if start >= 0:
            end = text.find(b"\n", start)
            text = text[end + 1:] if end >= 0 else b""
        lines = text.splitlines()[-80:]
        return b"\n".join(lines)[-2048:].decode("utf-8", "replace")

    def _probe(self, run: PodRun, c: ContainerRun, now: float) -> None:
        probe = c.spec.get("readinessProbe")
        if c.proc is None:
            c.ready = False
            return
        if not probe:
            c.ready = True
            return
        if now < c.next_probe:
            return
        c.next_probe = now + min(float(probe.get("periodSeconds", 10)), self.probe_period_s)
        ok = False
        port = self._port(c.spec, (probe.get("httpGet") or probe.get("tcpSocket") or {}).get("port"))
        try:
            if "httpGet" in probe:
                resp = self._http.get(f"http://{run.ip}:{port}{probe['httpGet'].get('path', '/')}")
                ok = 200 <= resp.status_code < 400
            elif "tcpSocket" in probe:
                with socket.create_connection((run.ip, int(port)), timeout=1.0):
                    ok = True
        except (httpx.HTTPError, OSError, ValueError):
            ok = False
        if ok:
            c.ready, c.probe_fail = True, 0
        else:
            c.probe_fail += 1
            if not c.ready or c.probe_fail >= int(probe.get("failureThreshold", 3)):
                c.ready = False

    @staticmethod
    def _port(spec: Obj, port: Any) -> int:
        if isinstance(port, str) and not port.isdigit():
            for p in spec.get("ports") or []:
                if p.get("name") == port:
                    return int(p["containerPort"])
        return int(port)

    # ---- processes ----
    def _env(self, run: PodRun, spec: Obj) -> dict[str, str]:
        pod = run.pod
        fields = {"status.podIP": run.ip, "status.hostIP": "127.0.0.1", "metadata.name": run.name,
                  "metadata.namespace": run.ns, "metadata.uid": run.uid, "spec.nodeName": NODE_NAME,
                  "spec.serviceAccountName": str(pod["spec"].get("serviceAccountName", "default"))}
        env: dict[str, str] = dict(self.pod_env)
        for e in spec.get("env") or []:
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
            elif (ref := (e.get("valueFrom") or {}).get("fieldRef")) is not None:
                env[e["name"]] = fields.get(ref["fieldPath"], "")
            elif (ref := (e.get("valueFrom") or {}).get("configMapKeyRef")) is not None:
                cm = self.kube.get("ConfigMap", run.ns, ref["name"]) or {}
                env[e["name"]] = str((cm.get("data") or {}).get(ref["key"], ""))
        return env

    def _start(self, run: PodRun, c: ContainerRun, image: Image) -> subprocess.Popen[bytes]:
        spec = c.spec
        env = self._env(run, spec)
        argv = [expand(a, env) for a in [*(spec.get("command") or []), *(spec.get("args") or [])]]
        mounts: list[tuple[Path, str]] = []
        vols = {v["name"]: v for v in run.pod["spec"].get("volumes") or []}
        for m in spec.get("volumeMounts") or []:
            v = vols.get(m["name"])
            if v is not None:
                mounts.append((self._volume_dir(run, v), m["mountPath"]))
        hosts = run.dir / "hosts"
        if not hosts.exists():
            self._write_hosts(run, {})
        if image.flink and not spec.get("command"):
            argv = self._flink_argv(run, argv, image, mounts, hosts)
            root: Path | None = self._image_root(image)
        else:
            root = self._image_root(image) if image.flink else None
        base_env = {k: v for k, v in os.environ.items() if k in ("PATH", "JAVA_HOME", "LANG", "TZ")}
        full_env = {**base_env, "HOSTNAME": run.name, **env}
        if image.flink:
            full_env.update({"FLINK_HOME": FLINK_IMAGE_HOME, "FLINK_CONF_DIR": f"{FLINK_IMAGE_HOME}/conf",
                             "FLINK_LIB_DIR": f"{FLINK_IMAGE_HOME}/lib",
                             "FLINK_PLUGINS_DIR": f"{FLINK_IMAGE_HOME}/plugins",
                             "FLINK_OPT_DIR": f"{FLINK_IMAGE_HOME}/opt"})
        script = ["set -e", f"hostname {shlex.quote(run.name)}"]
        targets: list[str] = []
        if root is not None:
            Path(FLINK_IMAGE_HOME).mkdir(parents=True, exist_ok=True)
            script.append(f"mount --bind {shlex.quote(str(root))} {FLINK_IMAGE_HOME}")
        for src, path in mounts:
            if root is not None and (path == FLINK_IMAGE_HOME or path.startswith(FLINK_IMAGE_HOME + "/")):
                (root / path[len(FLINK_IMAGE_HOME) + 1:]).mkdir(parents=True, exist_ok=True)
            else:
                Path(path).mkdir(parents=True, exist_ok=True)  # a mount point on this machine
            script.append(f"mount --bind {shlex.quote(str(src))} {shlex.quote(path)}")
            targets.append(path)
        workdir = spec.get("workingDir") or (FLINK_IMAGE_HOME if root is not None else str(run.dir))
        script.append(f"cd {shlex.quote(workdir)}")
        script.append('exec "$@"')
        log_path = run.dir / f"{c.name}.log"
        with open(log_path, "ab") as out:
            out.write(f"--- start {_now()}: {shlex.join(argv)}\n".encode())
            out.flush()
            return subprocess.Popen(
                ["unshare", "-m", "-u", "--propagation", "private", "--", "sh", "-c", "\n".join(script), "sh",
                 *argv],
                env=full_env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)

    def _image_root(self, image: Image) -> Path:
        """The image's /opt/flink: the local distribution's lib, opt, plugins and bin, plus usrlib."""
        key = _hash(str(image.usrlib))
        root = self.workdir / "images" / key
        if not root.exists():
            root.mkdir(parents=True)
            for sub in ("lib", "opt", "plugins", "bin"):
                if (self.dist.home / sub).exists():
                    (root / sub).symlink_to(self.dist.home / sub)
            (root / "usrlib").mkdir()
            if image.usrlib is not None:
                for f in image.usrlib.iterdir():
                    shutil.copy2(f, root / "usrlib" / f.name)
        return root

    def _memory(self, role: str, conf_dir: Path) -> tuple[list[str], list[str]]:
        text = (conf_dir / "config.yaml").read_text()
        key = f"{role}:{_hash(text)}"
        if key not in self._mem_cache:
            d = self.dist
            cmd = ["java", *FAST_START_FLAGS, "-Xmx128m", "-cp", f"{d.utils_jar}{os.pathsep}{d.dist_jar}", BASH_UTILS,
                   "GET_JM_RESOURCE_PARAMS" if role == "jm" else "GET_TM_RESOURCE_PARAMS", "--configDir",
                   str(conf_dir)]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False).stdout
            lines = [ln.removeprefix("BASH_JAVA_UTILS_EXEC_RESULT:") for ln in out.splitlines()
                     if ln.startswith("BASH_JAVA_UTILS_EXEC_RESULT:")]
            if len(lines) < 2:
                raise RuntimeError(f"BashJavaUtils refused {conf_dir / 'config.yaml'}: {out[-500:]}")
            self._mem_cache[key] = (lines[-2].split(), lines[-1].split())
        return self._mem_cache[key]

    def _flink_argv(self, run: PodRun, argv: list[str], image: Image, mounts: list[tuple[Path, str]],
                    hosts: Path) -> list[str]:
        """The official image's commands as the JVM command lines its entrypoint would run."""
        if not argv or argv[0] not in ("standalone-job", "jobmanager", "taskmanager"):
            return argv
        conf_host = next((src for src, path in mounts if path == f"{FLINK_IMAGE_HOME}/conf"), None)
        if conf_host is None:
            raise RuntimeError("no volume mounted at /opt/flink/conf")
        role = "tm" if argv[0] == "taskmanager" else "jm"
        jvm, dynamic = self._memory(role, conf_host)
        lib = f"{FLINK_IMAGE_HOME}/lib"
        cp = os.pathsep.join(f"{lib}/{Path(p).name}" for p in self.dist.classpath.split(os.pathsep))
        # No network namespace: bind to the pod's own address instead of 0.0.0.0.
        own = ["-D", f"jobmanager.bind-host={run.ip}", "-D", f"rest.bind-address={run.ip}",
               "-D", f"taskmanager.bind-host={run.ip}", "-D", f"taskmanager.host={run.ip}"]
        cmd = ["java", *jvm, *self.dist.java_opts_all, *FAST_START_FLAGS, *self.extra_java_opts,
               f"-Djdk.net.hosts.file={hosts}", "-Dsun.net.inetaddr.ttl=1", "-Dsun.net.inetaddr.negative.ttl=0",
               f"-Dlog4j.configurationFile=file:{FLINK_IMAGE_HOME}/conf/log4j-console.properties",
               "-Dlog4j2.formatMsgNoLookups=true", "-classpath", cp]
        conf = ["--configDir", f"{FLINK_IMAGE_HOME}/conf"]
        if argv[0] == "standalone-job":
            return [*cmd, JM_APPLICATION, *conf, *dynamic, *own, *argv[1:]]
        if argv[0] == "jobmanager":
            # No `--executionMode cluster` (Flink 1.x's jobmanager.sh): Flink 2's entry point parser does not know
            # it and stops there, so every -D after it (the memory flags, the bind hosts) was ignored.
            return [*cmd, JM_SESSION, *conf, *dynamic, *own, *argv[1:]]
        return [*cmd, TM_ENTRY, *conf, *dynamic, *own, *argv[1:]]

    def _kill(self, run: PodRun, *, grace: float) -> None:
        procs = [c.proc for c in run.containers if c.proc is not None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        for c in run.containers:
            c.proc = None

    def _terminate(self, run: PodRun, pod: Obj) -> None:
        self._kill(run, grace=float(pod["metadata"].get("deletionGracePeriodSeconds") or self._grace(pod)))
        with self._lock:
            self._forget(run)
            self._final_delete(run.ns, run.name)

    def _final_delete(self, ns: str, name: str) -> None:
        with contextlib.suppress(KubernetesApiError, KubernetesUnavailableError):
            self.kube.request("DELETE", Kube.path("Pod", ns, name), query=[("gracePeriodSeconds", "0")],
                              body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})

    def _forget(self, run: PodRun) -> None:
        if self.pods.get((run.ns, run.name)) is run:
            del self.pods[(run.ns, run.name)]

    def kill_container(self, ns: str, pod: str, container: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """What an OOM kill or a crash does to a container: its process dies, the kubelet restarts it."""
        with self._lock:
            run = self.pods[(ns, pod)]
            c = next(c for c in run.containers if c.name == container)
            assert c.proc is not None, f"{pod}/{container} is not running"
            os.killpg(c.proc.pid, sig)

    # ---- status ----
    def _patch_pod_status(self, ns: str, name: str, status: Obj) -> None:
        with contextlib.suppress(KubernetesApiError):
            self.kube.request("PATCH", Kube.path("Pod", ns, name) + "/status", query=[("fieldManager", "kubelet")],
                              body={"status": status}, content_type="application/merge-patch+json")

    def _container_status(self, c: ContainerRun) -> Obj:
        st: Obj = {"name": c.name, "image": c.spec.get("image"), "imageID": "", "restartCount": c.restarts,
                   "ready": c.ready, "started": c.proc is not None}
        if c.proc is not None:
            st["state"] = {"running": {"startedAt": c.started_at}}
        elif c.done and c.last_term:
            st["state"] = c.last_term
        else:
            reason, message = c.waiting or ("ContainerCreating", "")
            st["state"] = {"waiting": {"reason": reason, "message": message}}
        if c.last_term and not c.done:
            st["lastState"] = c.last_term
        return st

    def _report(self, run: PodRun) -> None:
        inits = [c for c in run.containers if c.init]
        mains = [c for c in run.containers if not c.init]
        initialized = all(c.done for c in inits)
        ready = initialized and all(c.ready for c in mains)
        running = initialized and any(c.proc is not None for c in mains)
        status: Obj = {
            "phase": "Running" if running else "Pending", "hostIP": "127.0.0.1", "podIP": run.ip,
            "podIPs": [{"ip": run.ip}],
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True" if initialized else "False"},
                {"type": "ContainersReady", "status": "True" if ready else "False"},
                {"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [self._container_status(c) for c in mains]}
        if inits:
            status["initContainerStatuses"] = [self._container_status(c) for c in inits]
        if status != run.last_status:
            status["startTime"] = (run.pod.get("status") or {}).get("startTime") or _now()
            self._patch_pod_status(run.ns, run.name, status)
            status.pop("startTime")
            run.last_status = status

    def _event(self, run: PodRun, reason: str, message: str) -> None:
        self._events += 1
        with contextlib.suppress(KubernetesApiError):
            self.kube.request("POST", Kube.path("Event", run.ns), query=[("fieldManager", "kubelet")], body={
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{run.name}.{self._events:x}{uuid.uuid4().hex[:6]}", "namespace": run.ns},
                "type": "Warning", "reason": reason, "message": message, "count": 1,
                "involvedObject": {"kind": "Pod", "name": run.name, "namespace": run.ns, "uid": run.uid},
                "lastTimestamp": _now(), "source": {"component": "kubelet", "host": NODE_NAME}})

    # ---- Services: Endpoints and names ----
    def _endpoints(self, ns: str) -> None:
        services = self.kube.list("Service", ns, "")
        runs = [r for (pns, _), r in self.pods.items() if pns == ns and not r.terminating]
        names: dict[str, str] = {}
        for svc in services:
            sel = (svc.get("spec") or {}).get("selector") or {}
            if not sel:
                continue
            members = [r for r in runs if matches(sel, r.pod["metadata"].get("labels") or {})]
            ready = [r for r in members if all(c.ready for c in r.containers if not c.init)
                     and all(c.done for c in r.containers if c.init)]
            not_ready = [r for r in members if r not in ready]
            svc_name = svc["metadata"]["name"]
            target = (ready or members)[0].ip if members else NO_ENDPOINT
            for alias in (svc_name, f"{svc_name}.{ns}", f"{svc_name}.{ns}.svc", f"{svc_name}.{ns}.svc.cluster.local"):
                names[alias] = target
            subset: Obj = {"ports": [{"name": p.get("name"), "port": int(p.get("targetPort", p["port"])),
                                      "protocol": p.get("protocol", "TCP")} for p in svc["spec"].get("ports") or []]}
            if ready:
                subset["addresses"] = [{"ip": r.ip, "nodeName": NODE_NAME,
                                        "targetRef": {"kind": "Pod", "name": r.name, "namespace": ns}} for r in ready]
            if not_ready:
                subset["notReadyAddresses"] = [{"ip": r.ip, "targetRef": {"kind": "Pod", "name": r.name,
                                                                          "namespace": ns}} for r in not_ready]
            body = {"apiVersion": "v1", "kind": "Endpoints",
                    "metadata": {"name": svc_name, "namespace": ns, "labels": svc["metadata"].get("labels") or {}},
                    "subsets": [subset] if members else []}
            self._put_endpoints(ns, svc_name, body)
        for r in runs:
            self._write_hosts(r, names)

    def _put_endpoints(self, ns: str, name: str, body: Obj) -> None:
        path = f"/api/v1/namespaces/{ns}/endpoints"
        try:
            have = self.kube.request("GET", f"{path}/{name}")
        except KubernetesApiError as e:
            if e.code != 404:
                raise
            self.kube.request("POST", path, query=[("fieldManager", "endpoint-controller")], body=body)
            return
        if (have.get("subsets") or []) != body["subsets"]:
            self.kube.request("PUT", f"{path}/{name}", query=[("fieldManager", "endpoint-controller")], body={
                **body, "metadata": {**body["metadata"], "resourceVersion": have["metadata"]["resourceVersion"]}})

    def _write_hosts(self, run: PodRun, names: dict[str, str]) -> None:
        lines = ["127.0.0.1 localhost", f"{run.ip} {run.name} {socket.gethostname()}"]
        lines += [f"{ip} {n}" for n, ip in sorted(names.items())]
        text = "\n".join(lines) + "\n"
        path = run.dir / "hosts"
        if not path.exists() or path.read_text() != text:
            tmp = run.dir / "hosts.tmp"
            tmp.write_text(text)
            tmp.replace(path)

    # ---- for tests ----
    def run_of(self, ns: str, pod: str) -> PodRun | None:
        with self._lock:
            return self.pods.get((ns, pod))

    def logs(self, ns: str, pod: str, container: str) -> str:
        run = self.run_of(ns, pod)
        if run is None:
            return ""
        p = run.dir / f"{container}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def all_logs(self) -> Iterator[tuple[str, str]]:
        for p in sorted((self.workdir / "pods").rglob("*.log")):
            yield str(p.relative_to(self.workdir)), p.read_text(errors="replace")[-4000:]
