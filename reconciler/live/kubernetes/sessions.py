"""FlinkSessionClusters on Kubernetes: the `ports.SessionHost` half of `KubernetesRuntime` (live/session.py puts the
apps' jobs on them; docs/session-clusters.md).

A FlinkSessionCluster is provisioned as a FlinkApp of its own name (`spec.session.cluster_app`, labelled
`flink-reconciler.io/session-cluster: "true"`) whose clusters are all session clusters of a generation, the ones a
warm standby renders (render `session_shape`: from the cluster's fields alone, so every app on it renders the
same objects): `<cluster>-root` with the generation pointers, and per generation `<cluster>-g<generation>-config`,
`-jm`, `-rest`, `-tm`. Its first generation is the one its spec gives (`session_generation`), the generation every
app's move names when the cluster's spec changes; the move itself is the warm standby's start, promote, discard
and retire (standby), addressed to the cluster's name.

Jobs go over the JobManager's REST API: a jar the reconciler can read is uploaded once per content per cluster,
under the name `<sha256>.jar` (so Flink's own jar list is the record: a restarted reconciler finds it), and a
`local://` jar under /opt/flink/usrlib of the image was staged by the JobManager's init container when it started.

Mixed into `KubernetesRuntime` like `WarmStandby`, whose helpers it uses (declared below for the type checker).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.clock import Clock
from reconciler.errors import PermanentStepError
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.api import Kube, Obj
from reconciler.live.kubernetes.generations import AppView, ClusterView, Pointers
from reconciler.live.kubernetes.status import workload_ready
from reconciler.live.ports import ClusterInfo, SessionGeneration
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import SESSION_LABEL, session_generation

_UPLOADED = re.compile(r"[0-9a-f]{32}\.jar")  # the name `jar_id` uploads a jar under: its content's digest

if TYPE_CHECKING:
    from reconciler.live.flink import FlinkRestClient

SLOTS = ("cluster", "standby", "retired")


class SessionClusters:
    """The FlinkSessionCluster half of `KubernetesRuntime`: `ports.SessionHost` and `ports.ImageJars`."""

    if TYPE_CHECKING:  # KubernetesRuntime's and WarmStandby's, which this is mixed with
        kube: Kube
        clock: Clock
        _ns_of: dict[str, str]
        _live_gen: dict[str, str]

        def _views(self, namespaces: tuple[str, ...], selector: str) -> dict[str, AppView]: ...
        def _view_of(self, app: str) -> tuple[str, AppView | None]: ...
        def _render_or_fail(self, app: FlinkApp, **kw: object) -> list[Obj]: ...
        def _rest_url(self, app: str, ns: str, generation: str | None = None) -> str: ...
        def _rest_client(self, base: str) -> FlinkRestClient: ...
        def _set_pointers(self, app: str, root: Obj, ptr: Pointers) -> None: ...
        def _ensure_session(self, app: FlinkApp, generation: str, *, deadline: float,
                            start: float | None = None, keep_running: bool = False) -> ClusterInfo: ...
        def apply(self, objs: list[Obj]) -> list[Obj]: ...

    def _ensure_session_cluster(self, app: FlinkApp, *, deadline: float, keep_running: bool = False) -> ClusterInfo:
        """`ensure_cluster` of a FlinkSessionCluster: its live cluster applied as the spec says (replicas change in
        place; live/session.py never asks for another spec while other apps' jobs run on it) and ready; or, when
        it has none, its first cluster started at the generation its spec gives. The pointer is written before
        the workloads, so a crash leaves a cluster that observe finds as the live one."""
        start = self.clock.monotonic()
        ns = app.metadata.namespace
        view = self._views((ns,), r.app_selector(app.name)).get(app.name)
        live = Pointers.of(view.root).live if view is not None and view.root is not None else ""
        if live:
            assert view is not None
            # The spec of its pods unchanged (only replicas, or nothing): whatever else this reconciler would render
            # for them (a newer version's rendering) does not replace the pods every app's job runs on.
            same = view.jobmanager is not None and session_key_of(view.jobmanager, view.root) == r.session_key(app)
            return self._ensure_session(app, live, deadline=deadline, start=start, keep_running=keep_running or same)
        gen = session_generation(app)
        objs = self._render_or_fail(app, generation=gen)
        root = self.apply(objs[:1])[0]
        self._set_pointers(app.name, root, Pointers(live=gen))
        self._live_gen[app.name] = gen
        self._ns_of[app.name] = ns
        return self._ensure_session(app, gen, deadline=deadline, start=start)

    # -- ports.SessionHost -------------------------------------------------------------------------------

    def session_generations(self, cluster: str) -> list[SessionGeneration]:
        """The clusters of FlinkSessionCluster `cluster` whose JobManager is available, the live one first."""
        ns, view = self._view_of(cluster)
        if view is None or view.root is None:
            return []
        ptr = Pointers.of(view.root)
        found = {view.live_generation: ClusterView(view.jobmanager, view.taskmanager, view.pods), **view.others}
        out: list[SessionGeneration] = []
        for gen, c in found.items():
            jm = c.jobmanager
            if not gen or jm is None or jm["metadata"].get("deletionTimestamp") or not workload_ready(jm)[0]:
                continue
            slot = "cluster" if gen == ptr.live else "retired" if gen == ptr.retired else "standby"
            key = session_key_of(jm, view.root)
            out.append(SessionGeneration(slot=slot, generation=gen, config_key=key,
                                         cluster_id=r.ha_cluster_id(cluster, None, gen),
                                         client=self._rest_client(self._rest_url(cluster, ns, gen))))
        return sorted(out, key=lambda g: SLOTS.index(g.slot))

    def config_key(self, app: FlinkApp) -> str:
        """The pods a FlinkSessionCluster's cluster runs with (render `session_key`), as its JobManager says."""
        return r.session_key(app)

    def jar_id(self, cluster: str, slot: str, jar: Path, *, deadline: float, again: bool = False,
               job_id: str | None = None) -> str:
        """The id of `jar` on the cluster in `slot`: found by its content's name in Flink's jar list, else uploaded
        under that name (`again`: upload anew, the listed one is gone). Which job came from which jar is not
        kept here (`jar_uses`)."""
        del deadline, job_id
        client = self._generation(cluster, slot).client
        digest = hashlib.sha256(jar.read_bytes()).hexdigest()
        name = f"{digest[:32]}.jar"
        if not again:
            for jar_id, listed in client.jars().items():
                if listed == name:
                    return jar_id
        with tempfile.TemporaryDirectory(prefix="flink-reconciler-jar-") as tmp:
            named = Path(tmp) / name
            shutil.copyfile(jar, named)
            return client.upload_jar(named)

    def jar_uses(self, cluster: str, slot: str) -> tuple[dict[str, str], dict[str, str]]:
        """The jars we uploaded (content-named, from Flink's own list) and no job -> jar map: while any job of the
        cluster runs, `prune_jars` keeps every jar; once none runs, ours are deleted (the image's never are)."""
        listed = self._generation(cluster, slot).client.jars()
        return {i: n.removesuffix(".jar") for i, n in listed.items() if _UPLOADED.fullmatch(n)}, {}

    def forget_jars(self, cluster: str, slot: str, jar_ids: Collection[str], gone_jobs: Collection[str], *,
                    deadline: float) -> None:
        """Nothing to forget: Flink's jar list is the record."""
        del cluster, slot, jar_ids, gone_jobs, deadline

    def job_storage(self, app: str) -> dict[str, str]:
        """Nothing per app: every job's checkpoints and savepoints go to the cluster's durable directories, where
        Flink names them by job id (the reconciler does not list stored snapshots on Kubernetes)."""
        del app
        return {}

    # -- ports.ImageJars ---------------------------------------------------------------------------------

    def image_jar_id(self, cluster: str, slot: str, app: FlinkApp) -> str:
        """The id of `app`'s `local://` jar on the cluster in `slot`, as its JobManager staged it from the image."""
        uri = app.spec.job.jar_uri
        jar_id = r.image_jar_id(uri)
        if jar_id is None:
            raise PermanentStepError(f"app {app.name}: {r.session_job_problems(app)[0].message}")
        listed = self._generation(cluster, slot).client.jars()
        if jar_id not in listed:
            staged = ", ".join(sorted(n for n in listed if self.is_image_jar(n))) or "none"
            raise PermanentStepError(
                f"app {app.name}: jarURI {uri!r} is not in the image of session cluster {cluster} (its JobManager "
                f"staged from {r.IMAGE_JARS}: {staged}): put the jar into the cluster's image, or use an http(s):// "
                "or repository jar")
        return jar_id

    def is_image_jar(self, jar_id: str) -> bool:
        return jar_id.startswith(r.IMAGE_JAR_PREFIX)

    def _generation(self, cluster: str, slot: str) -> SessionGeneration:
        found = next((g for g in self.session_generations(cluster) if g.slot == slot), None)
        if found is None:
            raise PermanentStepError(f"session cluster {cluster} has no {slot} cluster with an available JobManager")
        return found


def session_key_of(jobmanager: Obj, root: Obj | None) -> str:
    """The `render.session_key` of the cluster whose JobManager Deployment this is, as its annotation says. A cluster
    started by a version that keyed the rendered pods instead has only that legacy key, which no spec matches any
    more: its key is then the one of the spec its root records, when the root was last applied together with this
    JobManager (the same spec hash on both); else the legacy key stands, and the cluster counts as another spec."""
    annotations = jobmanager["metadata"].get("annotations") or {}
    key = annotations.get(r.ANNOTATION_SESSION_KEY)
    if key:
        return str(key)
    root_meta = (root or {}).get("metadata") or {}
    spec_hash = annotations.get(r.ANNOTATION_SPEC_HASH)
    if spec_hash and (root_meta.get("annotations") or {}).get(r.ANNOTATION_SPEC_HASH) == spec_hash:
        try:
            return r.session_key(FlinkApp.model_validate(json.loads(((root or {}).get("data") or {})["flinkapp.json"])))
        except (KeyError, TypeError, ValueError):
            pass
    return str(annotations.get(r.LEGACY_ANNOTATION_SESSION_KEY, ""))


def session_info(info: ClusterInfo, root: Obj | None) -> ClusterInfo:
    """`info` marked as a FlinkSessionCluster's when its root says so (`ClusterInfo.session`)."""
    labels = ((root or {}).get("metadata") or {}).get("labels") or {}
    return dataclasses.replace(info, session=True) if labels.get(SESSION_LABEL) == "true" else info
