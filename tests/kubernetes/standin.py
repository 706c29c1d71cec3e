"""A Kubernetes API server stand-in on loopback: `kmock.KubernetesEmulator`, extended to behave like the
real API server for every call the kubernetes runtime makes.

kmock gives us the HTTP server, URL parsing into (group, version, plural, namespace, name, subresource),
API discovery and Status-shaped errors. Its emulator stores objects as plain merged dicts, so this
subclass takes over the object requests and adds what our code relies on (per the API conventions):

- label selectors on list and watch (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``), field
  selectors ``metadata.name`` / ``metadata.namespace``; watch as a stream of JSON lines (changes found by
  comparing the store every 50 ms: intermediate states are not sent), for Flink's Kubernetes HA;
- server-side apply (``application/apply-patch+yaml``): create or merge, minimal ``managedFields`` per
  manager, 409 ``Conflict`` naming the other manager and field when it owns a field with a different
  value and ``force`` is not set; ``force=true`` takes the fields over; fields a manager stops applying
  are removed unless another manager owns them;
- JSON merge patch and strategic merge patch (treated as merge patch: lists replaced; our code only
  uses them from tests), PUT replace; the ``status`` subresource (main-resource writes keep the status);
- ``resourceVersion`` from one counter, 409 ``Conflict`` on a stale resourceVersion, 409
  ``AlreadyExists`` on create, 404 ``NotFound`` with the real message format;
- ``metadata.generation`` bumped when ``spec`` changes, and for a Deployment also when its annotations
  change (the real apps strategy's ``PrepareForUpdate`` does so; a real API server showed it); a few
  server defaults (clusterIP, protocol, imagePullPolicy, restartPolicy, revisionHistoryLimit ...) so drift
  detection must ignore them;
- deletion: ``preconditions.resourceVersion`` (409 ``Conflict`` when stale); finalizers hold an object
  with ``deletionTimestamp``; a pod bound to a node (``spec.nodeName``) is deleted gracefully, as on the real
  server: it gets ``deletionTimestamp`` and stays until its node deletes it with ``gracePeriodSeconds=0``
  (the process node does; pods nobody bound go at once); ownerReference garbage collection
  (Background and Foreground cascade synchronously, Orphan strips the references);
- the service proxy ``/api/v1/namespaces/N/services/S:P/proxy/...`` to a backend registered by a test,
  else to the first ready address of the Service's Endpoints (written by the process node),
  503 ``ServiceUnavailable`` ("no endpoints available") otherwise;
- an optional stand-in for the Deployment/StatefulSet controllers (``auto_ready``): a workload becomes
  available as soon as it is written, which is what a healthy cluster converges to;
- a request log and counter per (verb, resource) for the benchmark and the RBAC test;
- RBAC and CRDs as a test sets them (`Standin.deny`, `Standin.unserve`): 403 ``Forbidden`` for a denied verb on a
  resource whether or not it is served (the real server authorizes before it looks the resource up), 404
  ``NotFound`` for a resource of a group that is not served, and discovery of that group 404 too (discovery
  itself is open to every authenticated user, through ``system:discovery``).

Known deviations from the real server, none of which our code depends on: no admission, no validation
beyond names, no namespace existence check, watches skip intermediate states, GC is synchronous
(the real collector is eventually consistent; our code waits for it anyway), lists are atomic in SSA
(the real server merges ``listType=map`` lists such as containers by key).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import json
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import aiohttp.web
import kmock
import yaml
from kmock._internal.k8s import KubernetesScaffold

Obj = dict[str, Any]
Path = tuple[str, ...]

# (group, plural) -> (kind, namespaced, has status subresource)
KINDS: dict[tuple[str, str], tuple[str, bool, bool]] = {
    ("", "namespaces"): ("Namespace", False, True),
    ("", "configmaps"): ("ConfigMap", True, False),
    ("", "secrets"): ("Secret", True, False),
    ("", "services"): ("Service", True, True),
    ("", "serviceaccounts"): ("ServiceAccount", True, False),
    ("", "pods"): ("Pod", True, True),
    ("", "events"): ("Event", True, False),
    ("", "persistentvolumeclaims"): ("PersistentVolumeClaim", True, True),
    ("", "endpoints"): ("Endpoints", True, False),
    ("", "resourcequotas"): ("ResourceQuota", True, True),
    ("apps", "deployments"): ("Deployment", True, True),
    ("apps", "statefulsets"): ("StatefulSet", True, True),
    ("rbac.authorization.k8s.io", "roles"): ("Role", True, False),
    ("rbac.authorization.k8s.io", "rolebindings"): ("RoleBinding", True, False),
    ("coordination.k8s.io", "leases"): ("Lease", True, False),
    # The Apache Flink Kubernetes Operator's custom resource (a takeover reads, patches and deletes it; the
    # operator stand-in of a test writes its status through the status subresource).
    ("flink.apache.org", "flinkdeployments"): ("FlinkDeployment", True, True),
}
VERSIONS = {"": "v1", "apps": "v1", "rbac.authorization.k8s.io": "v1", "coordination.k8s.io": "v1",
            "flink.apache.org": "v1beta1"}
STANDIN_USER = "system:serviceaccount:flink-reconciler:flink-reconciler"  # who RBAC denies (`Standin.deny`)
_PROXY_RE = re.compile(r"^/api/v1/namespaces/([^/]+)/services/([^/:]+)(?::([^/]+))?/proxy(/.*)?$")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


@dataclass(frozen=True)
class Call:
    """One request as RBAC sees it: verb, API group, resource (with subresource), namespace."""

    verb: str
    group: str
    resource: str
    namespace: str | None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _qualified(group: str, plural: str) -> str:
    return f"{plural}.{group}" if group else plural


# ---- label selectors ---------------------------------------------------------------------------

def parse_selector(text: str) -> list[tuple[str, str, set[str]]]:
    """`a=b,c!=d,e in (x,y),!f,g` -> [(key, op, values)], op in = != in notin exists !exists."""
    reqs: list[tuple[str, str, set[str]]] = []
    for raw in re.split(r",(?![^()]*\))", text.strip()):
        part = raw.strip()
        if not part:
            continue
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", part):
            reqs.append((m[1], m[2], {v.strip() for v in m[3].split(",") if v.strip()}))
        elif m := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)", part):
            reqs.append((m[1], "!=" if m[2] == "!=" else "=", {m[3]}))
        elif m := re.fullmatch(r"!\s*([\w./-]+)", part):
            reqs.append((m[1], "!exists", set()))
        elif re.fullmatch(r"[\w./-]+", part):
            reqs.append((part, "exists", set()))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return reqs


def selector_matches(reqs: list[tuple[str, str, set[str]]], labels: dict[str, str]) -> bool:
    for key, op, values in reqs:
        have = key in labels
        ok = {
            "=": have and labels.get(key) in values,
            "in": have and labels.get(key) in values,
            "!=": not have or labels.get(key) not in values,
            "notin": not have or labels.get(key) not in values,
            "exists": have,
            "!exists": not have,
        }[op]
        if not ok:
            return False
    return True


# ---- field paths (managedFields) -------------------------------------------------------------------

def leaf_paths(obj: Any, prefix: Path = ()) -> Iterator[Path]:
    """Fields a manager owns: dict leaves; lists count as one atomic field."""
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            yield from leaf_paths(v, (*prefix, k))
    else:
        yield prefix


def _applied_paths(body: Obj) -> set[Path]:
    out: set[Path] = set()
    for k, v in body.items():
        if k in ("apiVersion", "kind", "status"):
            continue
        if k == "metadata":
            for mk in ("labels", "annotations"):
                out |= {p for p in leaf_paths(v.get(mk) or {}, ("metadata", mk)) if len(p) > 2}
            if "ownerReferences" in v:
                out.add(("metadata", "ownerReferences"))
            if "finalizers" in v:
                out.add(("metadata", "finalizers"))
            continue
        out |= set(leaf_paths(v, (k,)))
    return out


def _get(obj: Any, path: Path) -> Any:
    for p in path:
        if not isinstance(obj, dict) or p not in obj:
            return _MISSING
        obj = obj[p]
    return obj


def _delete(obj: Obj, path: Path) -> None:
    parents = []
    cur: Any = obj
    for p in path[:-1]:
        if not isinstance(cur, dict) or p not in cur:
            return
        parents.append((cur, p))
        cur = cur[p]
    if isinstance(cur, dict):
        cur.pop(path[-1], None)
    for parent, key in reversed(parents):  # drop maps left empty
        if parent[key] == {}:
            del parent[key]


_MISSING = object()


def _overlap(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _fields_v1(paths: set[Path]) -> Obj:
    root: Obj = {}
    for path in sorted(paths):
        cur = root
        for p in path:
            cur = cur.setdefault(f"f:{p}", {})
    return root


def deep_merge(base: Any, top: Any) -> Any:
    if isinstance(base, dict) and isinstance(top, dict):
        out = dict(base)
        for k, v in top.items():
            out[k] = deep_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(top)


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# ---- server defaults ---------------------------------------------------------------------------

def _default_pod_spec(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for c in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        c.setdefault("imagePullPolicy", "Always" if str(c.get("image", "")).endswith(":latest") else "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        for port in c.get("ports", []):
            port.setdefault("protocol", "TCP")


def apply_defaults(kind: str, obj: Obj, ip_seq: int) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind in ("Deployment", "StatefulSet"):
        spec.setdefault("revisionHistoryLimit", 10)
        if kind == "Deployment":
            spec.setdefault("progressDeadlineSeconds", 600)
        tmpl = spec.get("template", {})
        tmpl.setdefault("metadata", {}).setdefault("creationTimestamp", None)
        _default_pod_spec(tmpl.setdefault("spec", {}))
    elif kind == "Pod":
        _default_pod_spec(spec)
    elif kind == "Service":
        if spec.get("clusterIP") != "None":
            spec.setdefault("clusterIP", f"10.96.{ip_seq // 250 % 250}.{ip_seq % 250 + 1}")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("type", "ClusterIP")
        for port in spec.get("ports", []):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))


_NOT_SERVED = ApiError(404, "NotFound", "the server could not find the requested resource")


class StandinApi(kmock.KubernetesEmulator):
    """The emulator with the object semantics above. State lives on the server's event loop; read it
    from another thread only through the locked helpers (`calls`, `counts`) or `Standin.call`."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for (group, plural), (kind, namespaced, status) in KINDS.items():
            key = f"{group}/{VERSIONS[group]}/{plural}" if group else f"v1/{plural}"
            self.resources[key] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, subresources={"status"} if status else set(),
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"})
        self.store: dict[tuple[str, str, str | None, str], Obj] = {}
        self.managers: dict[tuple[str, str, str | None, str], dict[str, set[Path]]] = {}
        self.rv = 1
        self.ip_seq = 0
        self.auto_ready = True
        self.denied: set[tuple[str, str, str]] = set()  # (group, plural, verb) the caller's RBAC does not grant
        self.unserved: set[str] = set()  # API groups not served (a CustomResourceDefinition not installed)
        self.proxy_backends: dict[tuple[str, str, str], str] = {}
        self.log_lock = threading.Lock()
        self.call_log: list[Call] = []
        self.headers_log: list[dict[str, str]] = []

    # ---- thread-safe views for tests and benchmarks ----
    def calls(self) -> list[Call]:
        with self.log_lock:
            return list(self.call_log)

    def counts(self) -> dict[str, int]:
        c: collections.Counter[str] = collections.Counter()
        for call in self.calls():
            c[f"{call.verb} {_qualified(call.group, call.resource)}"] += 1
        return dict(c)

    def reset_log(self) -> None:
        with self.log_lock:
            self.call_log.clear()
            self.headers_log.clear()

    # ---- dispatch ----
    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock decodes every request body as UTF-8 text and answers 500 when it is not; the service proxy passes
        a body through as its bytes (a jar upload to Flink's REST API is binary), as a real API server does."""
        if (m := _PROXY_RE.match(raw_request.path)) is not None:
            body = await raw_request.read()
            try:
                body.decode()
            except UnicodeDecodeError:
                request = kmock.Request(method=raw_request.method, url=raw_request.url, params=dict(raw_request.query),
                                        headers=dict(raw_request.headers), body=body)
                return await self._proxied(request, m)
        return await super().__call__(raw_request)

    async def _proxied(self, request: kmock.Request, m: re.Match[str]) -> aiohttp.web.StreamResponse:
        rbac_verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
                     "DELETE": "delete"}.get(request.method.value.upper(), request.method.value.lower())
        self._log(rbac_verb, "", "services/proxy", m[1], request)
        return await self._proxy(request, m[1], m[2], m[3] or "", m[4] or "/")

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        path = request.url.path
        res = request.resource
        if m := _PROXY_RE.match(path):
            return await self._proxied(request, m)
        if (res is None or not res.plural) and path.startswith("/apis/"):  # discovery of a group (version)
            self._log("get", path.removeprefix("/apis/"), "discovery", None, request)
            if any(path == f"/apis/{g}" or path.startswith(f"/apis/{g}/") for g in self.unserved):
                return aiohttp.web.json_response(_NOT_SERVED.status(), status=404)
        if res is None or not res.plural or (res.group, res.plural) not in KINDS:
            return await KubernetesScaffold._handle(self, request)  # discovery and unknown URLs
        group, plural = str(res.group), str(res.plural)
        method = request.method.value.upper()
        name, ns, sub = request.name, request.namespace, request.subresource
        verb = {"GET": "get" if name else ("watch" if request.params.get("watch") == "true" else "list"),
                "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())
        self._log(verb, group, plural + (f"/{sub}" if sub else ""), ns, request)
        if (group, plural, verb) in self.denied:
            where = f' in the namespace "{ns}"' if ns else ""
            forbidden = ApiError(403, "Forbidden", f'{_qualified(group, plural)} is forbidden: User "{STANDIN_USER}" '
                                                   f'cannot {verb} resource "{plural}" in API group "{group}"{where}',
                                 {"group": group, "kind": plural})
            return aiohttp.web.json_response(forbidden.status(), status=403)
        if group in self.unserved:
            return aiohttp.web.json_response(_NOT_SERVED.status(), status=404)
        try:
            if verb == "watch":
                return await self._watch(request, group, plural, ns)
            body = self._route(method, group, plural, ns, name, sub, request)
            code = 201 if method == "POST" or (method == "PATCH" and self._created) else 200
            return aiohttp.web.json_response(body, status=code)
        except ApiError as e:
            return aiohttp.web.json_response(e.status(), status=e.code)

    def _log_call(self, call: Call) -> None:
        with self.log_lock:
            self.call_log.append(call)
            self.headers_log.append({})

    def _log(self, verb: str, group: str, resource: str, ns: str | None, request: kmock.Request) -> None:
        with self.log_lock:
            self.call_log.append(Call(verb, group, resource, ns))
            self.headers_log.append(dict(request.headers))

    def _route(self, method: str, group: str, plural: str, ns: str | None, name: str | None, sub: str | None,
               request: kmock.Request) -> Obj:
        self._created = False
        namespaced = KINDS[(group, plural)][1]
        if not namespaced:
            ns = None
        if method == "GET" and name is None:
            return self._list(group, plural, ns, request.params.get("labelSelector", ""),
                              request.params.get("fieldSelector", ""))
        if method == "POST":
            data = self._json(request)
            return self._create(group, plural, ns, data, request.params.get("fieldManager") or "unknown")
        if name is None:
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on {plural}")
        key = (group, plural, ns, name)
        if method == "GET":
            return self._public(self._existing(key))
        if method == "DELETE":
            body = self._json(request) if request.body else {}
            policy = request.params.get("propagationPolicy") or body.get("propagationPolicy") or "Background"
            want_rv = (body.get("preconditions") or {}).get("resourceVersion")
            if want_rv is not None and want_rv != self._existing(key)["metadata"]["resourceVersion"]:
                what = f'{_qualified(group, plural)} "{name}"'
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on {what}: the ResourceVersion in the "
                                                "precondition does not match the ResourceVersion in record. The "
                                                "object might have been modified")
            grace = request.params.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
            return self._delete_obj(key, policy, grace=None if grace is None else int(grace))
        manager = request.params.get("fieldManager") or "unknown"
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if method == "PATCH" and ctype == "application/apply-patch+yaml":
            if sub:
                raise ApiError(415, "UnsupportedMediaType", "apply to subresources is not supported here")
            if not request.params.get("fieldManager"):
                raise ApiError(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: "
                                              "Required value: is required for apply patch")
            data = yaml.safe_load(request.text or "{}")
            return self._apply(key, data, manager, request.params.get("force") == "true")
        if method == "PATCH":
            if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format "
                                                            f"- accepted media types include: {ctype}")
            return self._update(key, self._json(request), manager, sub, replace=False)
        if method == "PUT":
            return self._update(key, self._json(request), manager, sub, replace=True)
        raise ApiError(405, "MethodNotAllowed", f"method {method} not allowed")

    @staticmethod
    def _json(request: kmock.Request) -> Obj:
        try:
            data = json.loads(request.text or "{}")
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"invalid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "the request body must be an object")
        return data

    # ---- verbs ----
    def _existing(self, key: tuple[str, str, str | None, str]) -> Obj:
        obj = self.store.get(key)
        if obj is None:
            group, plural, _, name = key
            raise ApiError(404, "NotFound", f'{_qualified(group, plural)} "{name}" not found',
                           {"name": name, "group": group, "kind": plural})
        return obj

    def _public(self, obj: Obj) -> Obj:
        out = copy.deepcopy(obj)
        return out

    def _matching(self, group: str, plural: str, ns: str | None, selector: str,
                  fields: str) -> dict[tuple[str, str, str | None, str], Obj]:
        reqs, freqs = parse_selector(selector), parse_selector(fields)
        found = [(k, o) for k, o in self.store.items()
                 if k[0] == group and k[1] == plural and (ns is None or k[2] == ns)
                 and selector_matches(reqs, o.get("metadata", {}).get("labels") or {})
                 and selector_matches(freqs, {"metadata.name": k[3], "metadata.namespace": k[2] or ""})]
        # Sorted after the filter (same order): the store holds every test's objects of the session.
        return dict(sorted(found, key=lambda kv: str(kv[0])))

    async def _watch(self, request: kmock.Request, group: str, plural: str,
                     ns: str | None) -> aiohttp.web.StreamResponse:
        """A watch as a stream of JSON lines: the store is compared every 50 ms with what the watcher has
        seen (intermediate states between two looks are not sent; informers only need the latest)."""
        if not KINDS[(group, plural)][1]:
            ns = None
        sel, fields = request.params.get("labelSelector", ""), request.params.get("fieldSelector", "")
        since = int(request.params.get("resourceVersion") or 0)
        end = asyncio.get_running_loop().time() + float(request.params.get("timeoutSeconds") or 1800)
        resp = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        raw = request._raw_request
        assert raw is not None
        await resp.prepare(raw)
        # No resourceVersion: every current object as ADDED first (as the real server does); with one: what
        # changed after it.
        seen = {k: o["metadata"]["resourceVersion"] for k, o in self._matching(group, plural, ns, sel, fields).items()
                if since and int(o["metadata"]["resourceVersion"]) <= since}
        while asyncio.get_running_loop().time() < end:
            now = self._matching(group, plural, ns, sel, fields)
            out: list[Obj] = []
            for k, o in now.items():
                rv = o["metadata"]["resourceVersion"]
                if seen.get(k) != rv:
                    out.append({"type": "MODIFIED" if k in seen else "ADDED", "object": self._public(o)})
                    seen[k] = rv
            for k in [k for k in seen if k not in now]:
                del seen[k]
                out.append({"type": "DELETED", "object": {"apiVersion": "v1", "kind": KINDS[(group, plural)][0],
                                                          "metadata": {"name": k[3], "namespace": k[2],
                                                                       "resourceVersion": str(self.rv)}}})
            try:
                for ev in out:
                    await resp.write(json.dumps(ev).encode() + b"\n")
            except (ConnectionError, RuntimeError):
                return resp
            await asyncio.sleep(0.05)
        await resp.write_eof()
        return resp

    def _list(self, group: str, plural: str, ns: str | None, selector: str, fields: str = "") -> Obj:
        # The real API omits apiVersion and kind on list items. A shallow copy each: the list is serialized (by
        # _handle) before anything else runs on the server's loop, so nothing can change what it shares meanwhile.
        items = [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")}
                 for o in self._matching(group, plural, ns, selector, fields).values()]
        kind = KINDS[(group, plural)][0]
        return {"kind": f"{kind}List", "apiVersion": f"{group}/v1" if group else "v1",
                "metadata": {"resourceVersion": str(self.rv)}, "items": items}

    def _stamp(self, key: tuple[str, str, str | None, str], obj: Obj, old: Obj | None) -> None:
        group, plural, ns, name = key
        kind, _, has_status = KINDS[(group, plural)]
        obj["apiVersion"] = f"{group}/{VERSIONS[group]}" if group else "v1"
        obj["kind"] = kind
        meta = obj.setdefault("metadata", {})
        meta["name"] = name
        if ns is not None:
            meta["namespace"] = ns
        if old is None:
            self.ip_seq += 1
        apply_defaults(kind, obj, self.ip_seq)  # before comparing specs: defaults are not a change
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            if "spec" in obj:
                meta["generation"] = 1
        else:
            om = old["metadata"]
            for k in ("uid", "creationTimestamp", "generation", "deletionTimestamp"):
                if k in om:
                    meta[k] = om[k]
                else:
                    meta.pop(k, None)
            if has_status and "status" in old:
                obj["status"] = old["status"]
            annotations_moved = kind == "Deployment" and \
                (om.get("annotations") or {}) != (meta.get("annotations") or {})
            if "spec" in obj and (old.get("spec") != obj.get("spec") or annotations_moved):
                meta["generation"] = int(om.get("generation", 0)) + 1
        if old is None or self._strip(old) != self._strip(obj):
            self.rv += 1
            meta["resourceVersion"] = str(self.rv)
        else:
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        meta["managedFields"] = [
            {"manager": m, "operation": op, "apiVersion": obj["apiVersion"], "time": _now(),
             "fieldsType": "FieldsV1", "fieldsV1": _fields_v1(paths)}
            for (m, op), paths in sorted(self._owner_entries(key).items()) if paths
        ]
        self._controller(key, obj)

    def _owner_entries(self, key: tuple[str, str, str | None, str]) -> dict[tuple[str, str], set[Path]]:
        out: dict[tuple[str, str], set[Path]] = {}
        for m, paths in self.managers.get(key, {}).items():
            name, _, op = m.partition("\0")
            out[(name, op or "Update")] = paths
        return out

    @staticmethod
    def _strip(obj: Obj) -> Obj:
        o = copy.deepcopy(obj)
        for k in ("resourceVersion", "managedFields"):
            o.get("metadata", {}).pop(k, None)
        return o

    def _controller(self, key: tuple[str, str, str | None, str], obj: Obj) -> None:
        """Stand-in for the workload controllers of a healthy cluster (off in 'stuck' tests)."""
        if not self.auto_ready or key[1] not in ("deployments", "statefulsets"):
            return
        n = int(obj.get("spec", {}).get("replicas", 1))
        status = {"observedGeneration": obj["metadata"].get("generation", 1), "replicas": n,
                  "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n}
        if key[1] == "statefulsets":
            status["currentReplicas"] = n
        obj["status"] = status

    def _create(self, group: str, plural: str, ns: str | None, data: Obj, manager: str) -> Obj:
        meta = data.get("metadata") or {}
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{KINDS[(group, plural)][0]} is invalid: metadata.name: Required value")
        if ns is not None and meta.get("namespace") not in (None, ns):
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                              "sent on the request")
        key = (group, plural, ns, name)
        if key in self.store:
            raise ApiError(409, "AlreadyExists", f'{_qualified(group, plural)} "{name}" already exists',
                           {"name": name, "group": group, "kind": plural})
        obj = copy.deepcopy(data)
        obj.get("metadata", {}).pop("resourceVersion", None)
        if KINDS[(group, plural)][2]:
            obj.pop("status", None)
        self.managers[key] = {f"{manager}\0Update": _applied_paths(obj)}
        self._stamp(key, obj, None)
        self.store[key] = obj
        return self._public(obj)

    def _apply(self, key: tuple[str, str, str | None, str], data: Obj, manager: str, force: bool) -> Obj:
        group, plural, _, name = key
        meta = data.get("metadata") or {}
        if meta.get("name") != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        new_paths = _applied_paths(data)
        me = f"{manager}\0Apply"
        old = self.store.get(key)
        if old is None:
            # The real server also authorizes an apply that creates as "create" (RBAC needs both verbs).
            self._log_call(Call("create", group, plural, key[2]))
            obj = copy.deepcopy(data)
            if KINDS[(group, plural)][2]:
                obj.pop("status", None)
            self.managers[key] = {me: new_paths}
            self._stamp(key, obj, None)
            self.store[key] = obj
            self._created = True
            return self._public(obj)
        owners = self.managers.setdefault(key, {})
        conflicts: list[tuple[str, Path]] = []
        for other, paths in owners.items():
            if other == me:
                continue
            for p in new_paths:
                for q in paths:
                    if _overlap(p, q) and _get(old, p) != _get(data, p):
                        conflicts.append((other.partition("\0")[0], p))
        if conflicts and not force:
            conflicts = sorted(set(conflicts))
            api = old["apiVersion"]
            causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}" using {api}',
                       "field": "." + ".".join(p)} for m, p in conflicts]
            text = "; ".join(f'conflict with "{m}" using {api}: .{".".join(p)}' for m, p in conflicts)
            n = len(conflicts)
            raise ApiError(409, "Conflict", f"Apply failed with {n} conflict{'s' if n > 1 else ''}: {text}",
                           {"name": name, "group": group, "kind": plural, "causes": causes})
        obj = copy.deepcopy(old)
        others = set().union(*[p for m, p in owners.items() if m != me]) if len(owners) > 1 else set()
        for p in owners.get(me, set()) - new_paths:
            if not any(_overlap(p, q) for q in others):
                _delete(obj, p)
        body = {k: v for k, v in data.items() if k not in ("status", "apiVersion", "kind")}
        body["metadata"] = {k: v for k, v in meta.items() if k in ("labels", "annotations", "ownerReferences",
                                                                   "finalizers")}
        obj = deep_merge(obj, body)
        if force:
            for m in list(owners):
                if m != me:
                    owners[m] = {q for q in owners[m] if not any(_overlap(p, q) for p in new_paths)}
        owners[me] = new_paths
        self._stamp(key, obj, old)
        self.store[key] = obj
        self._after_write(key)
        return self._public(self.store.get(key, obj))

    def _update(self, key: tuple[str, str, str | None, str], data: Obj, manager: str, sub: str | None,
                *, replace: bool) -> Obj:
        old = self._existing(key)
        if sub not in (None, "status"):
            raise ApiError(404, "NotFound", f"subresource {sub!r} not found")
        want_rv = (data.get("metadata") or {}).get("resourceVersion")
        if want_rv is not None and want_rv != old["metadata"]["resourceVersion"]:
            group, plural, _, name = key
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(group, plural)} "{name}": '
                                            "the object has been modified; please apply your changes to the latest "
                                            "version and try again", {"name": name, "group": group, "kind": plural})
        has_status = KINDS[(key[0], key[1])][2]
        if sub == "status":
            obj = copy.deepcopy(old)
            obj["status"] = data.get("status", {}) if replace else merge_patch(old.get("status", {}),
                                                                                data.get("status", {}))
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.store[key] = obj
            return self._public(obj)
        obj = copy.deepcopy(data) if replace else merge_patch(old, data)
        if has_status:
            obj.pop("status", None)
        changed = {p for p in _applied_paths(data) if _get(old, p) != _get(obj, p)} if not replace \
            else _applied_paths(obj)
        owners = self.managers.setdefault(key, {})
        me = f"{manager}\0Update"
        for m in list(owners):  # an update takes ownership of what it changed
            if m != me:
                owners[m] = {q for q in owners[m] if not any(_overlap(p, q) for p in changed)}
        owners[me] = owners.get(me, set()) | changed
        self._stamp(key, obj, old)
        self.store[key] = obj
        self._after_write(key)
        return self._public(self.store.get(key, obj))

    def _after_write(self, key: tuple[str, str, str | None, str]) -> None:
        """An object marked for deletion goes once its last finalizer is removed."""
        obj = self.store.get(key)
        if obj and obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            self._remove(key, "Background")

    def _delete_obj(self, key: tuple[str, str, str | None, str], policy: str, *, grace: int | None = None) -> Obj:
        obj = self._existing(key)
        if policy not in ("Background", "Foreground", "Orphan"):
            raise ApiError(422, "Invalid", f"propagationPolicy: Unsupported value: {policy!r}")
        if key[1] == "pods" and (obj.get("spec") or {}).get("nodeName") and grace != 0:
            # Graceful deletion: the pod's node stops its containers, then deletes it with grace 0.
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = _now()
                obj["metadata"]["deletionGracePeriodSeconds"] = grace if grace is not None else int(
                    obj["spec"].get("terminationGracePeriodSeconds", 30))
                self.rv += 1
                obj["metadata"]["resourceVersion"] = str(self.rv)
            return self._public(obj)
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = _now()
                self.rv += 1
                obj["metadata"]["resourceVersion"] = str(self.rv)
            return self._public(obj)
        out = self._public(obj)
        self._remove(key, policy)
        return out

    def _remove(self, key: tuple[str, str, str | None, str], policy: str) -> None:
        obj = self.store.pop(key)
        self.managers.pop(key, None)
        self.rv += 1
        uid = obj["metadata"]["uid"]
        for dkey, dep in list(self.store.items()):
            refs = dep["metadata"].get("ownerReferences") or []
            if not any(r.get("uid") == uid for r in refs):
                continue
            rest = [r for r in refs if r.get("uid") != uid]
            if rest or policy == "Orphan":
                dep["metadata"]["ownerReferences"] = rest
                if not rest:
                    del dep["metadata"]["ownerReferences"]
                self.rv += 1
                dep["metadata"]["resourceVersion"] = str(self.rv)
            elif dkey in self.store:
                self._delete_obj(dkey, policy)

    # ---- service proxy ----
    def _endpoint_backend(self, ns: str, svc: str, port: str) -> str | None:
        """The first ready address of the Service's Endpoints, on the target port of `port` (name or number)."""
        service, eps = self.store.get(("", "services", ns, svc)), self.store.get(("", "endpoints", ns, svc))
        if service is None or eps is None:
            return None
        sports = (service.get("spec") or {}).get("ports") or []
        sport = next((p for p in sports if port in ("", str(p.get("port")), p.get("name"))), None)
        if sport is None:
            return None
        for subset in eps.get("subsets") or []:
            for p in subset.get("ports") or []:
                if p.get("name") == sport.get("name") or p.get("port") == sport.get("targetPort", sport.get("port")):
                    for addr in subset.get("addresses") or []:
                        return f"http://{addr['ip']}:{p['port']}"
        return None

    async def _proxy(self, request: kmock.Request, ns: str, svc: str, port: str,
                     rest: str) -> aiohttp.web.StreamResponse:
        backend = self.proxy_backends.get((ns, svc, port)) or self._endpoint_backend(ns, svc, port)
        if backend is None:
            err = ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{svc}:{port}"')
            return aiohttp.web.json_response(err.status(), status=503)
        url = backend.rstrip("/") + rest + (f"?{request.url.query_string}" if request.url.query_string else "")
        async with aiohttp.ClientSession() as s, s.request(
            request.method.value.upper(), url, data=request.body or None,
            headers={k: v for k, v in request.headers.items() if k.lower() == "content-type"},
        ) as resp:
            body = await resp.read()
            return aiohttp.web.Response(body=body, status=resp.status,
                                        content_type=resp.content_type or "application/json")


class Standin:
    """The stand-in API server on 127.0.0.1, served from a background thread with its own event loop."""

    def __init__(self) -> None:
        self.api = StandinApi(strict=False)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="k8s-standin", daemon=True)
        self.url = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with self.api, kmock.Server(self.api) as srv:
            self.url = str(srv.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> Standin:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the stand-in API server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` on the server's loop (state is touched only there)."""
        async def run() -> Any:
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def set_auto_ready(self, value: bool) -> None:
        self.call(setattr, self.api, "auto_ready", value)

    def deny(self, group: str, plural: str, *verbs: str) -> None:
        """The caller's RBAC no longer grants `verbs` on `plural` of `group`: 403 Forbidden, as the real server."""
        self.call(self.api.denied.update, {(group, plural, v) for v in verbs})

    def unserve(self, group: str) -> None:
        """API group `group` is not served (its CustomResourceDefinition is not installed)."""
        self.call(self.api.unserved.add, group)

    def reset_access(self) -> None:
        self.call(self.api.denied.clear)
        self.call(self.api.unserved.clear)

    def add_proxy_backend(self, namespace: str, service: str, port: str, url: str) -> None:
        self.call(self.api.proxy_backends.__setitem__, (namespace, service, port), url)
