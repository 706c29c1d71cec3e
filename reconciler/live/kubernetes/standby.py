"""The warm standby on Kubernetes: a second cluster at the new spec, started before the old job stops.

A standby is a session cluster of its own generation (objects `<app>-g<generation>-*`, labelled with it),
started beside the live cluster; the job is submitted to it over REST once it is promoted. The root's
annotations point at the live, standby and retired generations: a promotion or a discard is one write of
those pointers (server-side apply by a field manager of their own), so a crash leaves either the old or the
new state, and observe always finds the live cluster.

`WarmStandby` is a mixin of `KubernetesRuntime` (runtime), the one class it is meant for: together they
implement `reconciler.live.ports.StandbyRuntime`. It is its own module because the standby's lifecycle
(quota check, start, promote, discard, retire, and the promoted session cluster's submit) is a concern of its
own beside the runtime's application-mode clusters; it uses the runtime's observation and apply helpers,
declared below for the type checker.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.clock import Clock
from reconciler.core.observed import ClusterPhase
from reconciler.errors import (
    DeadlineExceededError,
    JobNotFoundError,
    ObserveError,
    PermanentStepError,
    RenderError,
    TransientStepError,
)
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.api import Kube, KubernetesApiError, KubernetesUnavailableError, Obj
from reconciler.live.kubernetes.generations import AppView, ClusterView, Pointers, of_generation
from reconciler.live.kubernetes.quota import quota_need, quota_shortfall
from reconciler.live.kubernetes.status import (
    NEVER_HEALS,
    generation_failure,
    is_session_suffix,
    keep_running_pods,
    label,
    pod_problem,
    workload_ready,
)
from reconciler.live.ports import ClusterInfo, FlinkApi
from reconciler.spec.model import FlinkApp

if TYPE_CHECKING:
    from reconciler.live.flink import FlinkRestClient

log = logging.getLogger(__name__)


class WarmStandby:
    """The warm standby half of `KubernetesRuntime`'s `StandbyRuntime`: start, promote, discard, retire."""

    if TYPE_CHECKING:  # KubernetesRuntime's, which this is mixed into
        kube: Kube
        clock: Clock
        namespaces: tuple[str, ...]
        force_conflicts: bool
        poll_interval: float
        _ns_of: dict[str, str]
        _live_gen: dict[str, str]

        def _views(self, namespaces: tuple[str, ...], selector: str) -> dict[str, AppView]: ...
        def _namespace(self, app: str) -> str | None: ...
        def _render_or_fail(self, app: FlinkApp, **kw: Any) -> list[Obj]: ...
        def _rest_url(self, app: str, ns: str, generation: str | None = None) -> str: ...
        def _rest_client(self, base: str) -> FlinkRestClient: ...
        def _delete_ha_configmaps(self, app: str, ns: str, *, which: Callable[[str], bool] = ...) -> list[str]: ...
        def render(self, app: FlinkApp, *, generation: str = "") -> list[Obj]: ...
        def apply(self, objs: list[Obj]) -> list[Obj]: ...
        def prune(self, app: FlinkApp, keep: list[Obj], *, spare: tuple[tuple[str, str], ...] = (),
                  generation: str = "") -> list[str]: ...
        def flink(self, app: str) -> FlinkApi: ...

    def start_standby(self, app: FlinkApp, *, generation: str, deadline: float, jar: Path | None = None
                      ) -> ClusterInfo:
        """Start (or find) session cluster `generation` beside the live one and wait until every TaskManager's
        slots are registered. A standby of another generation is deleted first. `jar` is not needed: the
        stage-jar init container copies the image's (or the fetched) jar into the JobManager's upload dir."""
        del jar
        start = self.clock.monotonic()
        ns = app.metadata.namespace
        view = self._views((ns,), r.app_selector(app.name)).get(app.name)
        if view is None or view.root is None:
            raise PermanentStepError(f"{app.name}: no live cluster to start a standby beside")
        ptr = Pointers.of(view.root)
        if ptr.live == generation:  # promoted already (a resumed step)
            return self._wait_session(app, generation, deadline=deadline, start=start)
        objs = of_generation(self._render_or_fail(app, generation=generation), generation)
        if ptr.standby != generation and (short := self._quota_shortfall(ns, objs)):
            # Checked before anything is created: Kubernetes would refuse the pods and the standby would wait
            # for its deadline. (A standby of this generation already exists: it was counted when it started.)
            raise PermanentStepError(
                f"{app.name}: the namespace quota does not fit a standby cluster beside the running one ({short}); "
                "raise the quota, or set spec.upgrade.clusterStrategy: cold to restart the cluster in place")
        for other in sorted({g for g in view.others if g and g not in (generation, ptr.retired)}
                            | ({ptr.standby} if ptr.standby and ptr.standby != generation else set())):
            self._delete_generation(app.name, ns, other, deadline=deadline, start=start)
        # The pointer first: a crash after it leaves a standby that observe reports, and the plan removes.
        self._set_pointers(app.name, view.root, dataclasses.replace(ptr, standby=generation))
        uid = view.root["metadata"]["uid"]
        for o in r.with_owner(objs, root_name=r.object_names(app.name)["root"], root_uid=uid):
            self.kube.apply(o, force=self.force_conflicts)
        self.prune(app, objs, generation=generation)
        info = self._wait_session(app, generation, deadline=deadline, start=start)
        if not r.is_session_cluster(app):  # a FlinkSessionCluster's jobs bring their own jars (sessions)
            self._warm_up(app, generation)
        return info

    def _warm_up(self, app: FlinkApp, generation: str) -> None:
        """Before the old job stops: the job graph compiled once on the standby's JobManager (`POST
        /jars/job.jar/plan`), so the submit after the stop finds the program's classes loaded."""
        from reconciler.live.flink import FlinkRestError

        client = self._rest_client(self._rest_url(app.name, app.metadata.namespace, generation))
        job = app.spec.job
        try:
            client.plan_jar(r.STAGED_JAR, entry_class=job.entry_class, args=job.args, parallelism=job.parallelism)
        except (FlinkRestError, TransientStepError, ObserveError) as e:  # only a warm-up: the submit will tell
            log.info("%s: compiling the job graph on standby %s failed (the submit will tell): %s", app.name,
                     generation, e)

    def _quotas(self, ns: str) -> list[Obj]:
        """The namespace's ResourceQuotas; none when the Role does not grant listing them (a Role from before
        warm standby: the check is skipped, with a warning, rather than failing every standby)."""
        try:
            return self.kube.list("ResourceQuota", ns, "")
        except KubernetesApiError as e:
            if e.code != 403:
                raise
            log.warning("cannot list ResourceQuotas in %s (%s): a warm standby is not checked against them; grant "
                        "list on resourcequotas (deploy/kubernetes/rbac-apps.yaml)", ns, e)
            return []

    def _quota_shortfall(self, ns: str, objs: list[Obj]) -> str | None:
        return quota_shortfall(self._quotas(ns), quota_need(objs))

    def standby_refusals(self, apps: list[FlinkApp]) -> dict[str, str]:
        """For the plan: the apps of which a warm standby would not fit the namespace's ResourceQuotas beside
        what runs now, with the reason (one list per namespace). An app that cannot be rendered is left to
        the errors that refuse it."""
        out: dict[str, str] = {}
        by_ns: dict[str, list[FlinkApp]] = {}
        for a in apps:
            by_ns.setdefault(a.metadata.namespace, []).append(a)
        for ns, mine in sorted(by_ns.items()):
            try:
                quotas = self._quotas(ns)
            except (KubernetesApiError, KubernetesUnavailableError) as e:
                raise ObserveError(f"cannot list ResourceQuotas in {ns}: {e}") from e
            if not quotas:
                continue
            for a in mine:
                try:  # what a standby adds: its own generation's objects (the root and RBAC are shared)
                    objs = of_generation(self.render(a, generation="0" * 8), "0" * 8)
                except RenderError:
                    continue
                if short := quota_shortfall(quotas, quota_need(objs)):
                    out[a.name] = f"the namespace quota does not fit a second cluster beside the running one ({short})"
        return out

    def promote_standby(self, app: str, *, generation: str, deadline: float) -> None:
        """Standby `generation` becomes the live cluster, the live one is retired (kept for a rollback): one
        write of the root's pointers. A retired cluster older than that goes first (never three clusters)."""
        start = self.clock.monotonic()
        ns, view = self._view_of(app)
        if view is None or view.root is None:
            raise PermanentStepError(f"{app}: no cluster; nothing to promote")
        ptr = Pointers.of(view.root)
        if ptr.live == generation:
            return
        if ptr.standby != generation and generation not in view.others:
            raise PermanentStepError(f"{app}: standby cluster {generation} is gone; nothing to promote")
        if ptr.retired is not None and ptr.retired != ptr.live:
            self._delete_generation(app, ns, ptr.retired, deadline=deadline, start=start)
        self._set_pointers(app, view.root, Pointers(live=generation, standby=None, retired=ptr.live))
        self._live_gen[app] = generation

    def discard_standby(self, app: str, *, generation: str, deadline: float) -> None:
        """Undo a warm standby: when `generation` is live, the retired cluster is live again; then cluster
        `generation` is deleted (its pods gone, its HA ConfigMaps too). No such cluster: nothing to do."""
        start = self.clock.monotonic()
        ns, view = self._view_of(app)
        if view is None or view.root is None:
            return
        ptr = Pointers.of(view.root)
        if ptr.live == generation:
            if ptr.retired is None:
                raise PermanentStepError(f"{app}: cluster {generation} is live and the old cluster is gone: "
                                         "nothing to go back to")
            ptr = Pointers(live=ptr.retired, standby=generation, retired=None)
            self._set_pointers(app, view.root, ptr)  # still findable while the old one is live again
            self._live_gen[app] = ptr.live
            view.root = self.kube.get("ConfigMap", ns, r.object_names(app)["root"]) or view.root
        self._delete_generation(app, ns, generation, deadline=deadline, start=start)
        if ptr.standby == generation:
            self._set_pointers(app, view.root, dataclasses.replace(ptr, standby=None))

    def delete_retired(self, app: str, *, deadline: float) -> None:
        """Delete the retired cluster, if there is one, then forget it."""
        start = self.clock.monotonic()
        ns, view = self._view_of(app)
        if view is None or view.root is None:
            return
        ptr = Pointers.of(view.root)
        if ptr.retired is None:
            return
        if ptr.retired != ptr.live:
            self._delete_generation(app, ns, ptr.retired, deadline=deadline, start=start)
        self._set_pointers(app, view.root, dataclasses.replace(ptr, retired=None))

    def _view_of(self, app: str) -> tuple[str, AppView | None]:
        ns = self._namespace(app)
        views = self._views((ns,) if ns else self.namespaces, r.app_selector(app))
        v = views.get(app)
        return (v.namespace if v else ns or self.namespaces[0]), v

    def _set_pointers(self, app: str, root: Obj, ptr: Pointers) -> None:
        """One server-side apply of the root's three pointer annotations, by their own field manager (the root's
        other fields stay ours under the main manager, which never sets these). The uid precondition keeps a
        write from recreating a root deleted meanwhile."""
        meta = root["metadata"]
        body: Obj = {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                                  "annotations": ptr.annotations()}}
        self.kube.apply(body, force=True, manager=r.GENERATION_FIELD_MANAGER)
        log.info("%s: clusters: live %s, standby %s, retired %s", app, ptr.live or r.BASE, ptr.standby or "-",
                 "-" if ptr.retired is None else ptr.retired or r.BASE)

    def _delete_generation(self, app: str, ns: str, generation: str, *, deadline: float, start: float) -> None:
        """Delete the cluster `generation` of `app` ("": the first one, by its names) and wait until its pods are
        gone; then Flink's HA ConfigMaps of its identities. The root, the RBAC and other generations stay."""
        if generation:
            selector = f"{r.app_selector(app)},{r.LABEL_GENERATION}={generation}"
            for kind in ("Deployment", "StatefulSet", "Service", "ConfigMap"):
                for o in self.kube.list(kind, ns, selector):
                    self.kube.delete(kind, ns, o["metadata"]["name"])
        else:
            selector = f"{r.app_selector(app)},!{r.LABEL_GENERATION}"
            names = r.object_names(app)
            for kind, key in (("Deployment", "jobmanager"), ("Deployment", "taskmanager"),
                              ("StatefulSet", "taskmanager"), ("Service", "jobmanager"), ("Service", "rest"),
                              ("Service", "taskmanager"), ("ConfigMap", "config")):
                self.kube.delete(kind, ns, names[key])
        pod_selector = f"{selector},{r.LABEL_COMPONENT}"  # pods of workloads, not the root or config
        while pods := [p["metadata"]["name"] for p in self.kube.list("Pod", ns, pod_selector)]:
            now = self.clock.monotonic()
            if now >= deadline:
                raise DeadlineExceededError(f"{app}: cluster {generation or r.BASE} not deleted after "
                                            f"{now - start:.0f}s; still present: {', '.join(sorted(pods))}")
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - now)))
        if generation:
            cid = r.ha_cluster_id(app, None, generation)
            self._delete_ha_configmaps(app, ns, which=lambda c: c == cid)
        else:
            self._delete_ha_configmaps(app, ns, which=lambda c: not is_session_suffix(c.rpartition(".")[2]))

    def _ensure_session(self, app: FlinkApp, generation: str, *, deadline: float,
                        start: float | None = None, keep_running: bool = False) -> ClusterInfo:
        """Apply session cluster `generation` as `app` says (a changed config rolls its pods, unless `keep_running`:
        then only the TaskManagers' number changes, `status.keep_running_pods`) and wait until it is ready. The
        root is applied too: it records the spec the live cluster runs."""
        objs = self._render_or_fail(app, generation=generation)
        kept: tuple[tuple[str, str], ...] = ()
        if keep_running:
            view = self._views((app.metadata.namespace,), r.app_selector(app.name)).get(app.name)
            c = (ClusterView() if view is None else ClusterView(view.jobmanager, view.taskmanager, view.pods)
                 if view.live_generation == generation else view.others.get(generation, ClusterView()))
            objs, kept = keep_running_pods(objs, [w for w in (c.jobmanager, c.taskmanager) if w is not None])
        self.apply(objs)
        self._ns_of[app.name] = app.metadata.namespace
        self.prune(app, objs, spare=kept, generation=generation)
        return self._wait_session(app, generation, deadline=deadline, start=start)

    def _wait_session(self, app: FlinkApp, generation: str, *, deadline: float,
                      start: float | None = None) -> ClusterInfo:
        """Until session cluster `generation` is ready: its JobManager and TaskManagers available, and every
        TaskManager's slots registered with the JobManager (so a job submitted now is deployed at once). A pod
        of it whose container ended with an error fails at once, with Kubernetes' account of it."""
        start = self.clock.monotonic() if start is None else start
        ns = app.metadata.namespace
        want_tms, slots = app.spec.task_manager.replicas, app.spec.task_manager.slots
        why = "not started"
        while True:
            view = self._views((ns,), r.app_selector(app.name)).get(app.name) or AppView(namespace=ns)
            c = ClusterView(view.jobmanager, view.taskmanager, view.pods) if view.live_generation == generation \
                else view.others.get(generation, ClusterView())
            for pod in c.pods:
                fail = generation_failure(pod)
                if fail is None and (prob := pod_problem(pod)) and prob[1].startswith(NEVER_HEALS):
                    fail = prob[1]  # e.g. Flink's memory check refused the config, or stage-jar found no jar
                if fail is not None and not pod["metadata"].get("deletionTimestamp"):
                    comp = "JobManager" if "jobmanager" in (label(pod, r.LABEL_COMPONENT) or "") else "TaskManager"
                    raise PermanentStepError(
                        f"{app.name}: the {comp} of cluster {generation} failed to start after "
                        f"{self.clock.monotonic() - start:.0f}s: pod {pod['metadata'].get('name')}: {fail}")
            ready = [(w, workload_ready(w)) for w in (c.jobmanager, c.taskmanager) if w is not None]
            if len(ready) < 2:
                why = "workloads not created yet"
            elif not all(ok for _, (ok, _) in ready):
                why = "; ".join(f"{w['metadata']['name']}: {m or 'not available'}" for w, (ok, m) in ready if not ok)
            else:
                base = self._rest_url(app.name, ns, generation)
                client = self._rest_client(base)
                try:
                    ov = client.overview()
                    if ov.taskmanagers >= want_tms and ov.slots_total >= want_tms * slots:
                        return ClusterInfo(app=app.name, phase=ClusterPhase.READY, rest_url=base)
                    why = f"{ov.taskmanagers} of {want_tms} TaskManagers registered"
                except (TransientStepError, ObserveError) as e:
                    why = f"REST API not answering: {e}"
            now = self.clock.monotonic()
            if now >= deadline:
                raise DeadlineExceededError(
                    f"{app.name}: cluster {generation} not ready after {now - start:.0f}s: {why}")
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - now)))

    def _submit(self, app: FlinkApp, *, job_id: str, restore_path: str | None, allow_non_restored_state: bool,
                deadline: float, start: float) -> str:
        """Submit the job to the live session cluster over REST (or find it submitted: the id is deterministic,
        and run_jar reads Flink's duplicate-job error)."""
        api = self.flink(app.name)
        job = app.spec.job
        last: Exception | None = None
        while True:
            try:
                try:
                    api.job(job_id)
                    return job_id
                except JobNotFoundError:
                    pass
                return api.run_jar(r.STAGED_JAR, job_id=job_id, entry_class=job.entry_class, args=job.args,
                                   parallelism=job.parallelism, savepoint_path=restore_path,
                                   allow_non_restored_state=allow_non_restored_state)
            except (TransientStepError, ObserveError) as e:
                last = e
            if self.clock.monotonic() >= deadline:
                raise DeadlineExceededError(f"job {job_id} of {app.name} not submitted after "
                                            f"{self.clock.monotonic() - start:.0f}s: {last}")
            self.clock.sleep(min(self.poll_interval, max(0.0, deadline - self.clock.monotonic())))
