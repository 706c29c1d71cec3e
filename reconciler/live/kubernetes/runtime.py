"""The kubernetes runtime: server-side apply of the rendered objects, observe by label, delete by cascade.

It talks to the API server through `api.Kube` (the only module importing `kubernetes`); the warm standby
is mixed in from `standby`; what it reads from objects' status is in `status` and `generations`.

Costs per reconcile cycle (`list_clusters`): one list per kind (ConfigMap roots, Deployment,
StatefulSet, Pod, Flink's HA ConfigMaps) per watched namespace, whatever the number of apps, plus one Event list
per namespace only when some app is not ready (to explain why). Never one GET per object per app.

What the runtime owns of an app (see `render` for the objects):
- `ensure_cluster` applies everything but the JobManager Deployment (which carries the job: its args
  name the job id and the savepoint) and waits for the TaskManagers;
- `start_job` applies the JobManager with the job and waits until the JobManager is available and its
  REST API knows the job id;
- `delete_cluster` deletes the root object and lets Kubernetes' garbage collector cascade; it waits
  until every object of the app is gone and never touches finalizers.
"""

from __future__ import annotations

import logging
import ssl
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx

from reconciler.clock import Clock
from reconciler.core.observed import Checkpoint, ClusterPhase
from reconciler.errors import (
    DeadlineExceededError,
    ObserveError,
    PermanentStepError,
    RenderError,
    TransientStepError,
)
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.api import (
    ApiClient,
    ApplyConflictError,
    Kube,
    KubernetesApiError,
    KubernetesUnavailableError,
    Obj,
    client_from_kubeconfig,
    in_cluster_client,
)
from reconciler.live.kubernetes.generations import AppView, ClusterView, Pointers, pointer_problem, view_info
from reconciler.live.kubernetes.operator import OperatorDeployments, local_savepoint_probe
from reconciler.live.kubernetes.sessions import SessionClusters, session_info
from reconciler.live.kubernetes.standby import WarmStandby
from reconciler.live.kubernetes.status import (
    HA_CONFIGMAP_SELECTOR,
    generation_failure,
    ha_configmap_cluster_id,
    ha_job_of,
    is_session_suffix,
    keep_running_pods,
    label,
    subset_diff,
    taskmanager_generation,
    workload_ready,
)
from reconciler.live.ports import ClusterInfo, FlinkApi
from reconciler.spec.model import FlinkApp, JobState

if TYPE_CHECKING:
    from reconciler.live.flink import FlinkRestClient

log = logging.getLogger(__name__)

# Kinds an app may own, in the order pruning deletes them (workloads first).
PRUNABLE = ("Deployment", "StatefulSet", "Service", "ConfigMap", "RoleBinding", "Role", "ServiceAccount")
# Kinds whose disappearance delete_cluster waits for.
OWNED_KINDS = ("Deployment", "StatefulSet", "Service", "ConfigMap", "RoleBinding", "Role", "ServiceAccount", "Pod")


class KubernetesRuntime(SessionClusters, WarmStandby, OperatorDeployments):
    """`reconciler.live.ports.StandbyRuntime` on Kubernetes: one cluster per app, in application mode, and a warm
    standby beside it as a session cluster of its own generation (`standby.WarmStandby`). It hosts
    FlinkSessionClusters (`sessions.SessionClusters`: `ports.SessionHost`, wrapped by live/session.py) and takes
    over apps from the Flink Kubernetes Operator (`operator.OperatorDeployments`: `ports.OperatorTakeover`)."""

    name = "kubernetes"
    restarts_processes = True

    def __init__(
        self,
        api_client: ApiClient,
        *,
        clock: Clock,
        namespaces: list[str] | tuple[str, ...],
        rest_via: Literal["service", "proxy"] = "service",
        force_conflicts: bool = False,
        revision: str = "unknown",
        poll_interval: float = 2.0,
        request_timeout: float = 30.0,
        savepoint_probe: Callable[[str], bool | None] | None = None,
    ) -> None:
        if not namespaces:
            raise ValueError("KubernetesRuntime needs at least one namespace")
        self.kube = Kube(api_client, timeout=request_timeout)
        self.clock = clock
        self.namespaces = tuple(dict.fromkeys(namespaces))
        self.rest_via = rest_via
        self.force_conflicts = force_conflicts
        self.revision = revision  # stamped on objects; the Runtime protocol does not pass it (yet)
        self.poll_interval = poll_interval
        # Does a savepoint have its _metadata (a takeover's proof): file:// paths this process sees, by default.
        self.savepoint_probe = savepoint_probe or local_savepoint_probe
        self._ns_of: dict[str, str] = {}
        self._live_gen: dict[str, str] = {}  # the live cluster generation per app, as last read from its root
        self._served: tuple[float, bool] | None = None  # (when, whether) FlinkDeployments are served: operator.py
        self._http: httpx.Client | None = None
        self._http_token: str | None = None

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, *, context: str | None = None, **kw: Any) -> KubernetesRuntime:
        return cls(client_from_kubeconfig(path, context=context), **kw)

    @classmethod
    def in_cluster(cls, **kw: Any) -> KubernetesRuntime:
        return cls(in_cluster_client(), **kw)

    # ---- observe ----
    def _views(self, namespaces: tuple[str, ...], selector: str) -> dict[str, AppView]:
        views: dict[str, AppView] = {}
        try:
            for ns in namespaces:
                roots = self.kube.list("ConfigMap", ns, f"{selector},{r.LABEL_COMPONENT}=root")
                deps = self.kube.list("Deployment", ns, selector)
                stss = self.kube.list("StatefulSet", ns, selector)
                pods = self.kube.list("Pod", ns, selector)
                ha = self.kube.list("ConfigMap", ns, HA_CONFIGMAP_SELECTOR)
                clusters: dict[str, dict[str, ClusterView]] = {}
                for obj in roots + deps + stss + pods:
                    app = label(obj, r.LABEL_INSTANCE)
                    if not app:
                        continue
                    v = views.setdefault(app, AppView(namespace=ns))
                    if obj["kind"] == "ConfigMap":
                        v.root = obj
                        continue
                    c = clusters.setdefault(app, {}).setdefault(label(obj, r.LABEL_GENERATION) or "", ClusterView())
                    comp = (label(obj, r.LABEL_COMPONENT) or "").removeprefix("session-")
                    if obj["kind"] == "Pod":
                        c.pods.append(obj)
                    elif comp == "jobmanager":
                        c.jobmanager = obj
                    elif comp == "taskmanager":
                        c.taskmanager = obj
                for app, by_gen in clusters.items():
                    v = views[app]
                    v.live_generation = Pointers.of(v.root).live
                    live = by_gen.pop(v.live_generation, ClusterView())
                    v.jobmanager, v.taskmanager, v.pods = live.jobmanager, live.taskmanager, live.pods
                    v.others = by_gen
                for cm in ha:  # Flink's HA data outlives the objects we own (a deleted cluster, a deleted JobManager)
                    found = ha_job_of(cm)
                    if found is not None and _selects(selector, found[0]):
                        views.setdefault(found[0], AppView(namespace=ns)).ha_jobs.add(found[1])
        except (KubernetesApiError, KubernetesUnavailableError) as e:
            raise ObserveError(f"cannot observe Kubernetes apps: {e}") from e
        for app, v in views.items():
            self._live_gen[app] = Pointers.of(v.root).live
        return views

    def _events(self, namespace: str) -> list[Obj]:
        try:
            evs: list[Obj] = self.kube.request("GET", self.kube.path("Event", namespace)).get("items", [])
        except (KubernetesApiError, KubernetesUnavailableError) as e:
            log.warning("cannot list events in %s: %s", namespace, e)
            return []
        return evs

    def _info(self, app: str, v: AppView, events: list[Obj] | None) -> ClusterInfo:
        self._ns_of[app] = v.namespace
        problem = pointer_problem(app, v.root)
        if problem is not None:
            return session_info(ClusterInfo(app=app, phase=ClusterPhase.UNKNOWN, message=problem, unreadable=problem),
                                v.root)
        try:
            return session_info(view_info(app, v, events, self._rest_url(app, v.namespace)), v.root)
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # an object edited out of shape: that app's
            return ClusterInfo(app=app, phase=ClusterPhase.UNKNOWN,
                               message=f"cannot read the objects of app {app} in namespace {v.namespace}: "
                                       f"{type(e).__name__}: {e}")

    def list_clusters(self) -> dict[str, ClusterInfo]:
        views = self._views(self.namespaces, r.MANAGED_SELECTOR)
        return self._infos(views)

    def _infos(self, views: dict[str, AppView]) -> dict[str, ClusterInfo]:
        infos = {app: self._info(app, v, None) for app, v in views.items()}
        troubled = {views[a].namespace for a, i in infos.items() if i.phase in (ClusterPhase.STARTING,
                                                                               ClusterPhase.FAILED)}
        for ns in sorted(troubled):  # one Event list per namespace, only to explain
            events = self._events(ns)
            for app, v in views.items():
                if v.namespace == ns and infos[app].phase in (ClusterPhase.STARTING, ClusterPhase.FAILED):
                    infos[app] = self._info(app, v, events)
        return infos

    def observe(self, app: str) -> ClusterInfo:
        ns = self._namespace(app)
        namespaces = (ns,) if ns else self.namespaces
        views = self._views(namespaces, r.app_selector(app))
        v = views.get(app)
        if v is None:
            return ClusterInfo(app=app, phase=ClusterPhase.ABSENT)
        return self._infos({app: v})[app]

    def _namespace(self, app: str) -> str | None:
        return self._ns_of.get(app)

    # ---- apply / prune / drift ----
    def render(self, app: FlinkApp, *, job_id: str | None = None, restore_path: str | None = None,
               allow_non_restored_state: bool = False, root_uid: str | None = None,
               taskmanagers_for: str | r.Generation | None = r.Generation.OF_THE_JOB,
               generation: str = "") -> list[Obj]:
        revision = app.metadata.annotations.get(r.ANNOTATION_REVISION, self.revision)
        return r.render_app(app, revision=revision, job_id=job_id, restore_path=restore_path,
                            allow_non_restored_state=allow_non_restored_state, root_uid=root_uid,
                            taskmanagers_for=taskmanagers_for, generation=generation)

    def apply(self, objs: list[Obj]) -> list[Obj]:
        """Apply the root first, then the rest owned by it. Conflicts are reported with the other managers."""
        root, rest = objs[0], objs[1:]
        try:
            live_root = self.kube.apply(root, force=self.force_conflicts)
            uid = live_root["metadata"]["uid"]
            owned = r.with_owner(rest, root_name=root["metadata"]["name"], root_uid=uid)
            return [live_root, *[self.kube.apply(o, force=self.force_conflicts) for o in owned]]
        except ApplyConflictError as e:
            raise ApplyConflictError(
                f"server-side apply of {e} (fields owned by {', '.join(e.managers) or 'another manager'}; "
                "someone changed them outside Git: revert that change, or run with force_conflicts",
                e.code, e.reason, e.api_message, e.causes) from e

    def prune(self, app: FlinkApp, keep: list[Obj], *, spare: tuple[tuple[str, str], ...] = (),
              generation: str = "") -> list[str]:
        """Delete this app's objects of cluster `generation` (and shared ones, for the first cluster) that `keep`
        no longer has (label and name checked), except `spare`. Another generation's cluster is never touched."""
        ns = app.metadata.namespace
        wanted = {(o["kind"], o["metadata"]["name"]) for o in keep} | set(spare)
        deleted = []
        for kind in PRUNABLE:
            for obj in self.kube.list(kind, ns, r.app_selector(app.name)):
                name = obj["metadata"]["name"]
                if (kind, name) in wanted or label(obj, r.LABEL_INSTANCE) != app.name:
                    continue
                if (label(obj, r.LABEL_GENERATION) or "") != generation:
                    continue
                if not name.startswith(app.name + "-"):
                    continue
                if self.kube.delete(kind, ns, name):
                    deleted.append(f"{kind}/{name}")
        return deleted

    def drift(self, rendered: list[Obj]) -> list[str]:
        """Differences between what we would apply and what is live, ignoring server-set fields.
        One list per kind for the app, not one GET per object."""
        if not rendered:
            return []
        ns = rendered[0]["metadata"]["namespace"]
        app = label(rendered[0], r.LABEL_INSTANCE) or ""
        gen = next((g for o in rendered if (g := label(o, r.LABEL_GENERATION))), "")
        wanted = {(o["kind"], o["metadata"]["name"]) for o in rendered}
        live: dict[tuple[str, str], Obj] = {}
        for kind in sorted({o["kind"] for o in rendered} | set(PRUNABLE)):
            for o in self.kube.list(kind, ns, r.app_selector(app)):
                key = (kind, o["metadata"]["name"])
                if (label(o, r.LABEL_GENERATION) or "") == gen or key in wanted:  # another cluster: not ours
                    live[key] = o
        out = []
        for o in rendered:
            key = (o["kind"], o["metadata"]["name"])
            have = live.pop(key, None)
            if have is None:
                out.append(f"{key[0]}/{key[1]}: missing")
                continue
            want = {k: v for k, v in o.items() if k not in ("apiVersion", "kind", "metadata")}
            meta = o["metadata"]
            want["metadata"] = {k: meta[k] for k in ("labels", "annotations") if k in meta}
            out += [f"{key[0]}/{key[1]}: {d}" for d in subset_diff(want, have)]
            if "ownerReferences" in meta:
                have_uids = {x.get("uid") for x in have["metadata"].get("ownerReferences") or []}
                if not {x["uid"] for x in meta["ownerReferences"]} <= have_uids:
                    out.append(f"{key[0]}/{key[1]}: not owned by the root object")
        out += [f"{k}/{n}: not rendered (would be pruned)" for (k, n) in sorted(live)]
        return out

    # ---- Runtime protocol ----
    def ensure_cluster(self, app: FlinkApp, *, deadline: float, keep_running: bool = False) -> ClusterInfo:
        """Everything but the workloads that carry a job generation: the JobManager is start_job's, and so
        are the TaskManagers of a cluster that has none yet (they are started for the job, see render).
        Live TaskManagers are kept in step (scale, config) within their own generation; with `keep_running` (a
        job runs on them) only their number changes: `status.keep_running_pods`."""
        if r.is_session_cluster(app):
            return self._ensure_session_cluster(app, deadline=deadline, keep_running=keep_running)
        views = self._views((app.metadata.namespace,), r.app_selector(app.name))
        view = views.get(app.name) or AppView(namespace=app.metadata.namespace)
        if view.live_generation:
            return self._ensure_session(app, view.live_generation, deadline=deadline, keep_running=keep_running)
        live_tm = view.taskmanager
        # TaskManagers deleted under a live JobManager (nothing else recreates them): back, for the job it runs.
        tm_job = taskmanager_generation(live_tm if live_tm is not None else view.jobmanager)
        objs = self._render_or_fail(app, taskmanagers_for=tm_job)
        names = r.object_names(app.name)
        jm = ("Deployment", names["jobmanager"])
        tm = {("Deployment", names["taskmanager"]), ("StatefulSet", names["taskmanager"])}
        suspended = app.spec.job.state is JobState.SUSPENDED
        deferred = {jm} | (tm if live_tm is None and tm_job is None else set())
        kept: tuple[tuple[str, str], ...] = ()
        if keep_running and not suspended:
            objs, kept = keep_running_pods(objs, [w for w in (view.jobmanager, live_tm) if w is not None])
        keep = [o for o in objs if (o["kind"], o["metadata"]["name"]) not in deferred]
        self.apply(keep)
        self._ns_of[app.name] = app.metadata.namespace
        self.prune(app, keep, spare=tuple(sorted(kept)) if suspended else tuple(sorted({*deferred, *kept})))
        if suspended:
            return self.observe(app.name)
        if live_tm is None and tm_job is None:
            return ClusterInfo(app=app.name, phase=ClusterPhase.READY, rest_url=self._rest_url(app.name,
                               app.metadata.namespace), spec_hash=(objs[0]["metadata"].get("annotations") or {}
                                                                   ).get(r.ANNOTATION_SPEC_HASH),
                               message="configuration applied; the TaskManagers start with the job")
        return self._wait(app, deadline, need_jobmanager=False, what="TaskManagers not available")

    def start_job(self, app: FlinkApp, *, job_id: str, jar: Path | None, restore_path: str | None,
                  allow_non_restored_state: bool, deadline: float) -> str:
        """`jar` is ignored: on Kubernetes the jar comes from the image (local://) or an init container. On a
        session cluster (a promoted warm standby) the job is submitted over REST from the jar staged there."""
        del jar
        start = self.clock.monotonic()
        view = self._views((app.metadata.namespace,), r.app_selector(app.name)).get(app.name)
        if view is not None and view.live_generation:
            self._ensure_session(app, view.live_generation, deadline=deadline, start=start)
            return self._submit(app, job_id=job_id, restore_path=restore_path,
                                allow_non_restored_state=allow_non_restored_state, deadline=deadline, start=start)
        objs = self._render_or_fail(app, job_id=job_id, restore_path=restore_path,
                                    allow_non_restored_state=allow_non_restored_state)
        if app.spec.high_availability.enabled:
            self._forget_other_jobs(app, job_id, deadline=deadline, start=start)
        # The JobManager and the TaskManagers of this job's generation (both roll when the job id is new).
        self.apply(objs)
        self._ns_of[app.name] = app.metadata.namespace
        self.prune(app, objs)
        self._wait(app, deadline, need_jobmanager=True, what="JobManager not available", start=start,
                   generation=job_id)
        api = self.flink(app.name)
        last: Exception | None = None
        while True:
            try:
                api.job(job_id)
                return job_id
            except (TransientStepError, ObserveError) as e:  # REST not up yet, job not submitted yet
                last = e
            if self.clock.monotonic() >= deadline:
                raise DeadlineExceededError(
                    f"job {job_id} of {app.name} not found on its JobManager after "
                    f"{self.clock.monotonic() - start:.0f}s: {last}")
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - self.clock.monotonic())))

    def delete_cluster(self, app: str, *, deadline: float) -> None:
        start = self.clock.monotonic()
        ns = self._namespace(app)
        if ns is None:
            views = self._views(self.namespaces, r.app_selector(app))
            if app not in views:
                return
            ns = views[app].namespace
        self.kube.delete("ConfigMap", ns, r.object_names(app)["root"], policy="Background")
        while True:
            left = []
            for kind in OWNED_KINDS:
                for o in self.kube.list(kind, ns, r.app_selector(app)):
                    meta = o["metadata"]
                    refs = meta.get("ownerReferences") or []
                    if kind != "Pod" and not refs and not meta.get("deletionTimestamp"):
                        # Orphaned by an interrupted apply (no root uid yet): delete it directly.
                        self.kube.delete(kind, ns, meta["name"])
                    fins = meta.get("finalizers") or []
                    left.append(f"{kind}/{meta['name']}" + (f" (finalizers: {', '.join(fins)})" if fins else ""))
            if not left:
                self._delete_ha_configmaps(app, ns)  # no JobManager is left to recover from them
                self._ns_of.pop(app, None)
                return
            if self.clock.monotonic() >= deadline:
                raise DeadlineExceededError(
                    f"{app} not deleted after {self.clock.monotonic() - start:.0f}s; still present: {'; '.join(left)}")
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - self.clock.monotonic())))

    def flink(self, app: str) -> FlinkApi:
        ns = self._namespace(app)
        if ns is None:
            self.observe(app)
            ns = self._namespace(app)
        if ns is None:
            raise ObserveError(f"{app} has no cluster in namespaces {', '.join(self.namespaces)}")
        return self._rest_client(self._rest_url(app, ns))

    def _rest_client(self, base: str) -> FlinkRestClient:
        """A Flink REST client for `base`, through the API server's proxy when rest_via says so."""
        from reconciler.live.flink import FlinkRestClient  # lazy: keeps this module importable alone

        if self.rest_via == "proxy":
            return FlinkRestClient(base, client=self._proxy_client())
        return FlinkRestClient(base)

    def stored_snapshots(self, app: str) -> list[Checkpoint]:
        """Not listed yet: savepoints live in the app's object store (s3://...), out of this runtime's reach.
        The finished job's savepoint and its retained checkpoint still come from Flink's REST API."""
        return []

    # ---- Flink's HA data ----
    def _forget_other_jobs(self, app: FlinkApp, job_id: str, *, deadline: float, start: float) -> None:
        """Before a JobManager for a new job id starts: remove the old JobManager, then Flink's HA ConfigMaps.

        The reconciler always names the restore point (--fromSavepoint), so nothing is lost; but an HA store
        that still holds another job of this app (one that never reached a terminal state: a failed upgrade
        being rolled back, a cluster deleted without a final savepoint) makes the new JobManager recover that
        job too (Flink before 2.3 runs every recovered job): two jobs of one app. The old JobManager must be
        gone first, or it would re-create the data, or lose leadership and restart from its own stale
        arguments. The same job id keeps the data: a restarted submit is recovered, not duplicated."""
        ns, name = app.metadata.namespace, r.object_names(app.name)["jobmanager"]
        selector = f"{r.app_selector(app.name)},{r.LABEL_COMPONENT}=jobmanager"
        # A list, not a GET: the Role grants list on workloads (docs/kubernetes.md, Permissions).
        live = next((d for d in self.kube.list("Deployment", ns, selector) if d["metadata"]["name"] == name), None)
        if live is not None:
            containers = (((live.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
            args = list(containers[0].get("args") or []) if containers else []
            if "--job-id" in args[:-1] and args[args.index("--job-id") + 1] == job_id:
                return
            self.kube.delete("Deployment", ns, name)
        while pods := [p["metadata"]["name"] for p in self.kube.list("Pod", ns, selector)]:
            now = self.clock.monotonic()
            if now >= deadline:
                raise DeadlineExceededError(
                    f"{app.name}: the old JobManager did not go away after {now - start:.0f}s "
                    f"(still present: {', '.join(sorted(pods))}); its HA data is kept and no new job was started")
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - now)))
        keep = r.ha_cluster_id(app.name, job_id)
        # A warm standby's session cluster keeps its own HA data (it has its own identity).
        self._delete_ha_configmaps(app.name, ns,
                                   which=lambda c: c != keep and not is_session_suffix(c.rpartition(".")[2]))

    def _delete_ha_configmaps(self, app: str, ns: str, *, which: Callable[[str], bool] = lambda c: True) -> list[str]:
        """Flink's Kubernetes HA ConfigMaps of every HA identity of `app` but `keep`: leader, job graphs,
        checkpoint pointers. Flink labels them itself (KubernetesUtils.getConfigMapLabels); they are not owned
        by our root. Each generation has its own identity, so this is housekeeping, not what keeps a new job
        from recovering an old one's data (see render)."""
        deleted = []
        for cm in self.kube.list("ConfigMap", ns, HA_CONFIGMAP_SELECTOR):
            cid = ha_configmap_cluster_id(app, cm)
            if cid is None or not which(cid):
                continue
            if self.kube.delete("ConfigMap", ns, cm["metadata"]["name"]):
                deleted.append(cm["metadata"]["name"])
        if deleted:
            log.info("%s: deleted Flink's HA ConfigMaps %s", app, ", ".join(deleted))
        return deleted

    # ---- helpers ----
    def _rest_url(self, app: str, ns: str, generation: str | None = None) -> str:
        """The REST address of cluster `generation` of `app` (default: the live one)."""
        gen = self._live_gen.get(app, "") if generation is None else generation
        if self.rest_via == "proxy":
            svc = urllib.parse.quote(f"{r.object_names(app, gen)['rest']}:{r.REST_PORT}")
            return f"{self.kube.host}/api/v1/namespaces/{ns}/services/{svc}/proxy"
        return r.rest_service_url(app, ns, gen)

    def _proxy_client(self) -> httpx.Client:
        """An httpx client with the API server's credentials (token, client cert, CA) from the loaded config.
        Rebuilt per call so refreshed tokens (exec plugins, projected tokens) are picked up."""
        cfg = self.kube.api_client.configuration
        token = (cfg.auth_settings().get("BearerToken") or {}).get("value")
        if self._http is None or self._http_token != token:
            headers = {"Authorization": token} if token else {}
            self._http = httpx.Client(headers=headers, verify=tls_context(cfg), timeout=10.0)
            self._http_token = token
        return self._http

    def _fail_on_crashed_generation(self, app: str, v: AppView, job_id: str, start: float) -> None:
        for pod in v.pods:
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp") or (meta.get("annotations") or {}).get(r.ANNOTATION_JOB_ID) != job_id:
                continue
            why = generation_failure(pod)
            if why is not None:
                comp = "JobManager" if label(pod, r.LABEL_COMPONENT) == "jobmanager" else "TaskManager"
                raise PermanentStepError(
                    f"{app}: the {comp} of job {job_id} failed to start after "
                    f"{self.clock.monotonic() - start:.0f}s: pod {meta.get('name')}: {why}")

    def _render_or_fail(self, app: FlinkApp, **kw: Any) -> list[Obj]:
        try:
            return self.render(app, **kw)
        except RenderError as e:
            raise PermanentStepError(f"cannot render {app.name} for Kubernetes: {e}") from e

    def _wait(self, app: FlinkApp, deadline: float, *, need_jobmanager: bool, what: str,
              start: float | None = None, generation: str | None = None) -> ClusterInfo:
        """Until the cluster is READY (or, without need_jobmanager, its TaskManagers are). With `generation`
        (a job id), a pod of that job's generation whose container ended with an error fails the wait at
        once, with Kubernetes' own account: a JobManager that cannot start its job (bad entry class, bad
        arguments) crash-loops, and waiting for the deadline would only delay the rollback."""
        start = self.clock.monotonic() if start is None else start
        while True:
            views = self._views((app.metadata.namespace,), r.app_selector(app.name))
            v = views.get(app.name) or AppView(namespace=app.metadata.namespace)
            if generation is not None:
                self._fail_on_crashed_generation(app.name, v, generation, start)
            info = self._infos({app.name: v})[app.name]
            tm_ok = v.taskmanager is not None and workload_ready(v.taskmanager)[0]
            # Without need_jobmanager only the TaskManagers count: a stuck JobManager of a failed upgrade
            # is replaced by the StartJob that follows (the rollback's), not waited for here.
            if info.phase is ClusterPhase.READY or (tm_ok and not need_jobmanager):
                return ClusterInfo(app=app.name, phase=ClusterPhase.READY, rest_url=info.rest_url,
                                   spec_hash=info.spec_hash, message=info.message if v.jobmanager is None else None)
            now = self.clock.monotonic()
            if now >= deadline:
                reason = info.message or "no reason reported by Kubernetes"
                raise DeadlineExceededError(f"{app.name}: {what} after {now - start:.0f}s: {reason}")
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - now)))


def _selects(selector: str, app: str) -> bool:
    """Whether `selector` (every managed app's, or one app's: r.app_selector) takes in `app`."""
    instance = next((p.partition("=")[2] for p in selector.split(",") if p.startswith(f"{r.LABEL_INSTANCE}=")), None)
    return instance is None or instance == app


__all__ = ["OWNED_KINDS", "PRUNABLE", "KubernetesRuntime"]


def tls_context(cfg: Any) -> ssl.SSLContext:
    """One SSLContext with the kubeconfig's CA (or the system's) and its client certificate, if any.

    httpx (0.28+) ignores `cert=` when `verify` is a CA path: a kubeconfig that logs in with a client certificate
    (kind's, kubeadm's) went out anonymous through the service proxy (403 for system:anonymous); found on a real
    node. A context carrying both is what httpx uses as given."""
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return ctx
