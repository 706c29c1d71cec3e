"""What a spec may ask of the cluster and of the reconciler's host: the spec policy.

Whoever can push to the GitOps repository writes the specs; the reconciler runs them with its own
credentials. Under the `restricted` policy (the default) a spec cannot ask for what would let it step
out of its app: host namespaces, privileged or privilege-escalating containers, added capabilities,
host paths and host ports, a pod template aimed at another namespace or at a ServiceAccount by
anything but its plain name, a job jar fetched from a loopback, link-local or cloud-metadata address
(the reconciler would fetch it: request forgery), or read from system directories of the reconciler's
host. `permissive` turns these checks off, for repositories only trusted people can push to.

Violations are spec errors of the app (the planner leaves it as it is), found at load time so
`validate` and `plan` report them too.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from reconciler.spec.model import SUBDOMAIN_RE, FlinkApp


class SpecPolicy(StrEnum):
    RESTRICTED = "restricted"
    PERMISSIVE = "permissive"


# Hosts a jar must never be fetched from: the reconciler would be the one making the request.
METADATA_HOSTS = frozenset({
    "localhost", "metadata", "metadata.google.internal", "metadata.azure.internal", "instance-data",
    "instance-data.ec2.internal", "metadata.tencentyun.com", "100.100.100.200",
})
# Directories of the reconciler's host a local jar path may not point into.
SYSTEM_DIRS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/var/run", "/var/lib/kubelet")
_HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_HARMLESS_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})


def violations(app: FlinkApp, policy: SpecPolicy) -> list[tuple[str, str]]:
    """(field path, message) of everything `policy` refuses in `app`; empty when it may run."""
    if policy is SpecPolicy.PERMISSIVE:
        return []
    found = list(_jar(app.spec.job.jar_uri))
    if app.spec.pod_template:
        found += _pod_template(app.spec.pod_template, app.metadata.namespace)
    hint = " (the reconciler's spec policy is restricted; see docs/security.md)"
    return [(field, message + hint) for field, message in found]


# scheme://[userinfo@]host[:port][/path] (no urllib: the pure core imports this module)
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?:[^/?#@]*@)?(?P<host>\[[^\]]*\]|[^/?#:]*)[^/?#]*(?P<path>[^?#]*)")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")


def _jar(uri: str) -> Iterator[tuple[str, str]]:
    field = "spec.job.jarURI"
    m = _URL.match(uri)
    scheme = m.group("scheme").lower() if m else ""
    if m and scheme in ("http", "https"):
        host = _unquote(m.group("host")).strip("[]").rstrip(".").lower()
        if host in METADATA_HOSTS or _internal_ip(host):
            yield field, f"the jar host {host!r} is a loopback, link-local or cloud-metadata address"
        return
    if (m and scheme == "file") or (not m and uri.startswith("/")):
        path = re.sub(r"/+", "/", _unquote(m.group("path")) if m else uri).replace("/./", "/")
        if ".." in path.split("/"):
            yield field, "a local jar path may not contain '..'"
        elif any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS):
            yield field, f"a local jar may not be read from {path!r} (a system directory of the reconciler's host)"


def _unquote(text: str) -> str:
    return _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), text)


def _inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """IPv4 the way resolvers read it too: 2852039166, 0xa9fea9fe, 0251.0376.0251.0376, 169.254.43518."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    try:
        nums = [int(p, 16) if p.lower().startswith("0x") else int(p, 8) if p.startswith("0") and p != "0"
                else int(p) for p in parts]
    except ValueError:
        return None
    last_bits = 8 * (5 - len(nums))
    if any(n < 0 or n > 255 for n in nums[:-1]) or not 0 <= nums[-1] < 2**last_bits:
        return None
    value = 0
    for n in nums[:-1]:
        value = value << 8 | n
    return ipaddress.IPv4Address(value << last_bits | nums[-1])


@functools.lru_cache(maxsize=1024)  # a fleet's jars come from a few hosts; parsing one costs ~10 us
def _internal_ip(host: str) -> bool:
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = _inet_aton(host) if host and host[0].isdigit() else None
    if ip is None:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_link_local or ip.is_unspecified


def _pod_template(template: dict[str, Any], namespace: str) -> Iterator[tuple[str, str]]:
    base = "spec.podTemplate"
    meta = template.get("metadata")
    if isinstance(meta, dict) and meta.get("namespace") not in (None, namespace):
        yield f"{base}.metadata.namespace", "a pod template may not move pods to another namespace"
    spec = template.get("spec")
    if not isinstance(spec, dict):
        return
    for key in _HOST_NAMESPACES:
        if spec.get(key):
            yield f"{base}.spec.{key}", f"{key} shares the node's namespace with the job"
    for key in ("serviceAccountName", "serviceAccount"):
        sa = spec.get(key)
        if sa is not None and not (isinstance(sa, str) and len(sa) <= 253 and SUBDOMAIN_RE.fullmatch(sa)):
            yield f"{base}.spec.{key}", f"{sa!r} is not a ServiceAccount name of the app's namespace"
    volumes = spec.get("volumes")
    for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if isinstance(volume, dict) and "hostPath" in volume:
            yield f"{base}.spec.volumes[{i}].hostPath", "hostPath volumes expose the node's file system"
    security = spec.get("securityContext")
    if isinstance(security, dict) and security.get("sysctls"):
        yield f"{base}.spec.securityContext.sysctls", "sysctls change the node's kernel settings"
    for list_key in _CONTAINER_LISTS:
        containers = spec.get(list_key)
        for i, container in enumerate(containers if isinstance(containers, list) else []):
            if isinstance(container, dict):
                yield from _container(container, f"{base}.spec.{list_key}[{i}]")


def _container(container: dict[str, Any], where: str) -> Iterator[tuple[str, str]]:
    sc = container.get("securityContext")
    if isinstance(sc, dict):
        if sc.get("privileged"):
            yield f"{where}.securityContext.privileged", "privileged containers control the node"
        if sc.get("allowPrivilegeEscalation"):
            yield f"{where}.securityContext.allowPrivilegeEscalation", "privilege escalation is not allowed"
        caps = sc.get("capabilities")
        added = caps.get("add") if isinstance(caps, dict) else None
        extra = [c for c in added if c not in _HARMLESS_CAPABILITIES] if isinstance(added, list) else []
        if extra:
            yield f"{where}.securityContext.capabilities.add", f"added capabilities {extra!r} are not allowed"
    ports = container.get("ports")
    for j, port in enumerate(ports if isinstance(ports, list) else []):
        if isinstance(port, dict) and port.get("hostPort"):
            yield f"{where}.ports[{j}].hostPort", "host ports bind on the node"
