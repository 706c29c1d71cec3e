"""The small cluster services the node lab (scripts/k8s-node-lab.sh) runs beside kubelet, in one process:

- **cluster DNS** on the bridge address: `<svc>.<ns>.svc.<domain>` -> the Service's ClusterIP (a headless
  Service: its ready endpoints), `<pod>.<svc>.<ns>.svc.<domain>` -> a StatefulSet pod's IP, answered from the
  API server on every query (no cache: a lab serves few queries). Everything else gets a fast NXDOMAIN, reverse
  lookups included: a resolver that does not answer stalls Flink's JobManager for seconds per lookup.
- **the API server on the pod network**: a TCP forwarder from `<bridge>:<port>` to the loopback API server, and
  the `kubernetes` Service's EndpointSlice pointing at it (the lab API server binds loopback and reconciles no
  endpoints), so pods reach it at its ClusterIP (Flink's Kubernetes HA, the reconciler's daemon).
- **a local-path provisioner**: each Pending PVC without a volume gets a hostPath PV under --pv-root, bound to
  it by claimRef (the controller-manager's PV binder completes the binding); a Released PV is deleted with its
  directory.
- **`openshift-service-ca.crt`** in every namespace: the lab's API server is OpenShift's fork, whose admission
  adds that ConfigMap to every pod's service-account volume (pods fail to start without it).

    python -m tests.kubernetes.node_lab.services --kubeconfig K --bridge-ip 10.244.0.1 --pv-root DIR --ca CA.crt
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSServer

from reconciler.live.kubernetes.api import Kube, KubernetesApiError, client_from_kubeconfig

log = logging.getLogger("node-lab")
PV_LABEL = "node-lab.flink-reconciler.io/provisioned"
SERVICE_CA = "openshift-service-ca.crt"
Obj = dict[str, Any]


def _ready_addresses(slices: list[Obj]) -> list[str]:
    return sorted({a for s in slices for ep in s.get("endpoints") or []
                   if (ep.get("conditions") or {}).get("ready") is not False for a in ep.get("addresses") or []})


class ClusterResolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, kube: Kube, domain: str) -> None:
        self.kube, self.suffix = kube, f".svc.{domain}."

    def _get(self, path: str) -> Obj | None:
        try:
            obj: Obj = self.kube.request("GET", path)
            return obj
        except KubernetesApiError as e:
            if e.code != 404:
                log.warning("DNS lookup %s: %s", path, e)
            return None

    def addresses(self, name: str) -> list[str] | None:
        """IPv4 addresses of a cluster name; None: not a name of ours (NXDOMAIN)."""
        if not name.endswith(self.suffix):
            return None
        labels = name.removesuffix(self.suffix).split(".")
        if len(labels) == 2:
            svc_name, ns = labels
            svc = self._get(f"/api/v1/namespaces/{ns}/services/{svc_name}")
            if svc is None:
                return None
            ip = (svc.get("spec") or {}).get("clusterIP")
            if ip and ip != "None":
                return [str(ip)]
            slices = self.kube.request("GET", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                                       query=[("labelSelector", f"kubernetes.io/service-name={svc_name}")])
            return _ready_addresses(slices.get("items") or [])
        if len(labels) == 3:
            pod_name, svc_name, ns = labels
            pod = self._get(f"/api/v1/namespaces/{ns}/pods/{pod_name}") or {}
            ip = (pod.get("status") or {}).get("podIP")
            if (pod.get("spec") or {}).get("subdomain") == svc_name and ip:
                return [str(ip)]
        return None

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        q = request.q
        addrs = self.addresses(str(q.qname).lower()) if q.qtype in (QTYPE.A, QTYPE.AAAA, QTYPE.ANY) else None
        if addrs is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif q.qtype != QTYPE.AAAA:  # a known name's AAAA: NOERROR, no answer (IPv4 only)
            for a in addrs:
                reply.add_answer(RR(q.qname, QTYPE.A, rdata=A(a), ttl=5))
        return reply


class QuietLogger:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def serve_dns(resolver: ClusterResolver, ip: str, port: int) -> list[DNSServer]:
    servers = [DNSServer(resolver, address=ip, port=port, tcp=tcp, logger=QuietLogger()) for tcp in (False, True)]
    for s in servers:
        s.start_thread()
    return servers


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def serve_forwarder(listen: tuple[str, int], target: tuple[str, int]) -> threading.Thread:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            tr, tw = await asyncio.open_connection(*target)
        except OSError:
            w.close()
            return
        await asyncio.gather(_pipe(r, tw), _pipe(tr, w))

    async def main() -> None:
        server = await asyncio.start_server(handle, *listen)
        async with server:
            await server.serve_forever()

    t = threading.Thread(target=asyncio.run, args=(main(),), daemon=True, name="api-forwarder")
    t.start()
    return t


def ensure_kubernetes_endpoints(kube: Kube, ip: str, port: int) -> None:
    """The `kubernetes` Service's EndpointSlice -> the forwarder (the lab API server reconciles none)."""
    path = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
    body: Obj = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": "kubernetes", "labels": {"kubernetes.io/service-name": "kubernetes",
                                                               "endpointslice.kubernetes.io/managed-by": "node-lab"}},
                 "addressType": "IPv4", "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
                 "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}
    kube.request("PATCH", f"{path}/kubernetes", query=[("fieldManager", "node-lab"), ("force", "true")],
                 body=body, content_type="application/apply-patch+yaml")


def provision(kube: Kube, pv_root: Path) -> None:
    for pvc in kube.request("GET", "/api/v1/persistentvolumeclaims").get("items") or []:
        meta, spec = pvc["metadata"], pvc.get("spec") or {}
        if (pvc.get("status") or {}).get("phase") != "Pending" or spec.get("volumeName") \
                or meta.get("deletionTimestamp"):
            continue
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        path = pv_root / f"{ns}-{name}-{uid[:8]}"
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)  # pods run as any uid (Flink's image: 9999)
        requests = (spec.get("resources") or {}).get("requests") or {}
        pv: Obj = {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{uid}", "labels": {PV_LABEL: "true"}},
            "spec": {"capacity": {"storage": requests.get("storage", "1Gi")},
                     "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Delete", "storageClassName": spec.get("storageClassName") or "",
                     "volumeMode": spec.get("volumeMode") or "Filesystem",
                     "hostPath": {"path": str(path), "type": "Directory"},
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns,
                                  "name": name, "uid": uid}}}
        try:
            kube.request("POST", "/api/v1/persistentvolumes", body=pv)
            log.info("provisioned %s for %s/%s", path, ns, name)
        except KubernetesApiError as e:
            if e.code != 409:
                log.warning("PV for %s/%s: %s", ns, name, e)
    ours = kube.request("GET", "/api/v1/persistentvolumes", query=[("labelSelector", f"{PV_LABEL}=true")])
    for pv in ours.get("items") or []:
        if (pv.get("status") or {}).get("phase") not in ("Released", "Failed"):
            continue
        try:
            kube.request("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
        except KubernetesApiError as e:
            if e.code != 404:
                raise
        host_path = str(((pv.get("spec") or {}).get("hostPath") or {}).get("path") or "")
        if host_path.startswith(f"{pv_root}/"):
            shutil.rmtree(host_path, ignore_errors=True)
        log.info("deleted released %s", pv["metadata"]["name"])


def service_ca_configmaps(kube: Kube, ca: str) -> None:
    have = {c["metadata"]["namespace"] for c in kube.request(
        "GET", "/api/v1/configmaps", query=[("fieldSelector", f"metadata.name={SERVICE_CA}")]).get("items") or []}
    for ns in kube.request("GET", "/api/v1/namespaces").get("items") or []:
        name = ns["metadata"]["name"]
        if name in have or (ns.get("status") or {}).get("phase") != "Active":
            continue
        try:
            kube.request("POST", f"/api/v1/namespaces/{name}/configmaps", body={
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": SERVICE_CA},
                "data": {"service-ca.crt": ca}})
        except KubernetesApiError as e:
            if e.code not in (409, 403, 404):
                raise


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--bridge-ip", required=True)
    p.add_argument("--api", default="127.0.0.1:6443")
    p.add_argument("--api-port", type=int, default=6443, help="the forwarder's port on the bridge address")
    p.add_argument("--dns-port", type=int, default=53)
    p.add_argument("--domain", default="cluster.local")
    p.add_argument("--pv-root", type=Path, required=True)
    p.add_argument("--ca", type=Path, required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    kube = Kube(client_from_kubeconfig(a.kubeconfig), timeout=10.0)
    host, port = a.api.rsplit(":", 1)
    serve_forwarder((a.bridge_ip, a.api_port), (host, int(port)))
    ensure_kubernetes_endpoints(kube, a.bridge_ip, a.api_port)
    serve_dns(ClusterResolver(kube, a.domain), a.bridge_ip, a.dns_port)
    with socket.create_connection((a.bridge_ip, a.api_port), timeout=5):
        pass
    log.info("serving DNS on %s:%d, the API server on %s:%d", a.bridge_ip, a.dns_port, a.bridge_ip, a.api_port)
    ca = a.ca.read_text()
    a.pv_root.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            provision(kube, a.pv_root)
            service_ca_configmaps(kube, ca)
        except Exception as e:  # a lab helper: log and go on (the API server may be restarting)
            log.warning("loop: %s", e)
        time.sleep(1.0)


if __name__ == "__main__":
    main()
