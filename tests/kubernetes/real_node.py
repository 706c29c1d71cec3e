"""A real kubelet in the process node's place, for the Kubernetes e2e modules (test_*_k8s_e2e.py).

When FLINK_RECONCILER_TEST_KUBECONFIG names a cluster with a Ready node whose containerd this machine can reach
(the node lab, scripts/k8s-node-lab.sh: FLINK_RECONCILER_TEST_CONTAINERD, default
/run/k8s-node-lab/containerd.sock), the e2e modules run their app in real containers: the test's image is built
from deploy/flink-image with the counter jar baked into /opt/flink/usrlib (build-local.sh --usrlib) and loaded
into that containerd. `RealNode` answers what the tests ask of a node (a claim's directory, a pod's logs, a
container killed) from the API server, the PVs' host paths and containerd.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from reconciler.live.kubernetes.api import Kube, KubernetesApiError

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
CONTAINERD = os.environ.get("FLINK_RECONCILER_TEST_CONTAINERD", "/run/k8s-node-lab/containerd.sock")


def real_node_reason(api: k8s_client.ApiClient) -> str | None:
    """Why the e2e modules cannot run on this cluster's node from here (None when they can)."""
    if os.geteuid() != 0:
        return "a real node's e2e run needs root (containerd's socket, the PVs' host paths)"
    if not Path(CONTAINERD).exists():
        return (f"no containerd socket at {CONTAINERD} to load the test image into (scripts/k8s-node-lab.sh up, or "
                "set FLINK_RECONCILER_TEST_CONTAINERD)")
    nodes = Kube(api).request("GET", "/api/v1/nodes").get("items", [])
    ready = [n for n in nodes if any(c.get("type") == "Ready" and c.get("status") == "True"
                                     for c in (n.get("status") or {}).get("conditions") or [])]
    if not ready:
        return "the cluster has no Ready node"
    return None


def load_image(tag: str, usrlib: Path) -> None:
    """The Flink image of deploy/flink-image plus `usrlib`'s jars, as `tag`, into the node's containerd."""
    out = subprocess.run(["bash", str(REPO / "deploy" / "flink-image" / "build-local.sh"), "--tag", tag,
                          "--usrlib", str(usrlib)], check=False, env={**os.environ, "CONTAINERD_ADDRESS": CONTAINERD},
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"build-local.sh failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


class RealNode:
    """The process node's test-facing surface over a real node."""

    def __init__(self, api_client: k8s_client.ApiClient, namespaces: list[str]) -> None:
        self.kube = Kube(api_client, timeout=10.0)
        self.core = k8s_client.CoreV1Api(api_client)
        self.namespaces = namespaces
        self.errors: list[str] = []
        self._lock = threading.RLock()

    def __enter__(self) -> RealNode:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def pods(self) -> dict[str, Obj]:
        """The namespaces' pods that still exist (a deleted pod is gone once its containers stopped)."""
        return {f"{ns}/{p['metadata']['name']}": p for ns in self.namespaces for p in self.kube.list("Pod", ns, "")}

    def _get(self, kind: str, ns: str, name: str) -> Obj | None:
        path = f"/api/v1/namespaces/{ns}/{kind.lower()}s/{name}"  # core kinds (Pod, PersistentVolumeClaim)
        try:
            obj: Obj = self.kube.request("GET", path)
            return obj
        except KubernetesApiError as e:
            if e.code == 404:
                return None
            raise

    def pvc_dir(self, ns: str, claim: str, timeout: float = 60.0) -> Path:
        """The host directory of a bound claim (the node lab's provisioner makes hostPath PVs)."""
        end = time.monotonic() + timeout
        while True:
            pvc = self._get("PersistentVolumeClaim", ns, claim)
            volume = ((pvc or {}).get("spec") or {}).get("volumeName")
            if volume:
                pv: Obj = self.kube.request("GET", f"/api/v1/persistentvolumes/{volume}")
                path = (((pv or {}).get("spec") or {}).get("hostPath") or {}).get("path")
                if path:
                    return Path(path)
            if time.monotonic() > end:
                raise TimeoutError(f"claim {ns}/{claim} is not bound to a hostPath volume")
            time.sleep(0.2)

    def container_id(self, ns: str, pod: str, container: str) -> str:
        p = self.kube.get("Pod", ns, pod) or {}
        for s in (p.get("status") or {}).get("containerStatuses") or []:
            if s.get("name") == container and s.get("containerID"):
                return str(s["containerID"]).split("://", 1)[-1]
        raise LookupError(f"pod {ns}/{pod} has no running container {container}")

    def kill_container(self, ns: str, pod: str, container: str) -> None:
        """kill -9 of the container's process (the kubelet restarts it, as after an OOM kill or a crash)."""
        cid = self.container_id(ns, pod, container)
        subprocess.run(["ctr", "--address", CONTAINERD, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", cid],
                       check=True, capture_output=True, timeout=30)

    def all_logs(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for key, p in self.pods.items():
            ns, name = key.split("/", 1)
            for c in (p.get("spec") or {}).get("containers") or []:
                try:
                    text = self.core.read_namespaced_pod_log(name, ns, container=c["name"], tail_lines=200)
                except k8s_client.ApiException as e:
                    text = f"(no log: {e.status} {e.reason})"
                out.append((f"{name}/{c['name']}", str(text)))
        return out
