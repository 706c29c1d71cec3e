"""Session clusters on a runtime: the jobs of many apps on one shared Flink cluster (docs/session-clusters.md).

`SessionRuntime` wraps a runtime that can host session clusters (`ports.SessionHost`) and is itself a runtime,
so the executor, the observer and the status commands need not know: for an app on a session cluster,

- its "cluster" is the session cluster, seen only through that app's own jobs (every job id we submit ends in
  its app's tag, `core.plan.is_job_of`), and ABSENT while none of its jobs is there;
- `ensure_cluster` starts the shared cluster or restarts its dead processes, and never changes one that runs
  other apps' jobs (a cluster change moves the jobs by warm standby instead);
- `start_job` submits through REST to the cluster of the app's spec (the new one during a move, the old one for a
  rollback), with its jar uploaded once per content per cluster (or, on a host with `ports.ImageJars`, one of the
  jars its JobManager staged from the image) and its checkpoints in the app's own storage where the host has one;
- the warm-standby steps of a move act on the shared cluster's generations, and only when no other job is in
  the way: the new cluster starts once (every app's move names the same generation), the old one is retired by
  the first move, and deleted by the last one (while a job rolled back onto it runs there, it stays);
- `delete_cluster` of an app leaves the cluster (only jars no job uses any more go); of the cluster itself
  (a ClusterPlan, after its apps), deletes it.

Which apps are on which session cluster comes from their specs (desired and as applied), told each pass by
`set_sessions`; a session cluster no spec names any more is known by its runtime record (`ClusterInfo.session`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from reconciler.clock import Clock, SystemClock
from reconciler.core.observed import Checkpoint, ClusterPhase
from reconciler.core.plan import is_job_of
from reconciler.errors import ObserveError, PermanentStepError, ReconcilerError
from reconciler.live.flink import FlinkRestError
from reconciler.live.ports import (
    CheckpointStats,
    ClusterInfo,
    ClusterOverview,
    FlinkApi,
    ImageJars,
    JarApi,
    JobSummary,
    SavepointStatus,
    SessionGeneration,
    SessionHost,
)
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import cluster_app

log = logging.getLogger(__name__)

TERMINAL = frozenset({"CANCELED", "FINISHED", "FAILED", "SUSPENDED"})
SAVEPOINT_DIR_KEY = "execution.checkpointing.savepoint-dir"
SETTLE_S = 3.0  # a moved job's first seconds on its new cluster, before the next job of the move stops (_await_turn)


def _live_jobs(client: FlinkApi) -> list[JobSummary]:
    return [j for j in client.jobs() if j.state.upper() not in TERMINAL]


class SessionJobs:
    """One app's view of its session cluster's REST APIs: its own jobs only, wherever they run (during a move,
    on the old or the new cluster). Submits go to the live cluster."""

    def __init__(self, app: str, generations: list[SessionGeneration], savepoint_dir: str | None = None) -> None:
        self.app = app
        self._gens = generations
        self._savepoints = savepoint_dir  # the app's own: the cluster's default is shared by every app

    def _mine(self) -> list[tuple[SessionGeneration, JobSummary]]:
        return [(g, j) for g in self._gens for j in g.client.jobs() if is_job_of(j.job_id, self.app)]

    def _at(self, job_id: str) -> JarApi:
        for g in self._gens:
            if any(j.job_id == job_id for j in g.client.jobs()):
                return g.client
        return self._gens[0].client  # Flink answers for an unknown job (JobNotFoundError)

    def overview(self) -> ClusterOverview:
        return self._gens[0].client.overview()

    def jobs(self) -> list[JobSummary]:
        return [j for _, j in self._mine()]

    def job(self, job_id: str) -> JobSummary:
        return self._at(job_id).job(job_id)

    def trigger_savepoint(self, job_id: str, *, cancel_job: bool = False, trigger_id: str | None = None) -> str:
        return self._at(job_id).trigger_savepoint(job_id, cancel_job=cancel_job, trigger_id=trigger_id,
                                                  target_directory=self._savepoints)

    def stop_with_savepoint(self, job_id: str, *, drain: bool = False, trigger_id: str | None = None) -> str:
        return self._at(job_id).stop_with_savepoint(job_id, drain=drain, trigger_id=trigger_id,
                                                    target_directory=self._savepoints)

    def savepoint_status(self, job_id: str, trigger_id: str) -> SavepointStatus:
        return self._at(job_id).savepoint_status(job_id, trigger_id)

    def cancel(self, job_id: str) -> None:
        self._at(job_id).cancel(job_id)

    def checkpoints(self, job_id: str) -> CheckpointStats:
        return self._at(job_id).checkpoints(job_id)

    def exceptions(self, job_id: str) -> list[str]:
        return self._at(job_id).exceptions(job_id)

    def upload_jar(self, path: Path) -> str:
        return self._gens[0].client.upload_jar(path)

    def run_jar(
        self,
        jar_id: str,
        *,
        job_id: str,
        entry_class: str | None = None,
        args: tuple[str, ...] = (),
        parallelism: int | None = None,
        savepoint_path: str | None = None,
        allow_non_restored_state: bool = False,
        flink_configuration: dict[str, str] | None = None,
    ) -> str:
        return self._gens[0].client.run_jar(
            jar_id, job_id=job_id, entry_class=entry_class, args=args, parallelism=parallelism,
            savepoint_path=savepoint_path, allow_non_restored_state=allow_non_restored_state,
            flink_configuration=flink_configuration)

    def __getattr__(self, name: str) -> Any:  # anything else (savepoint disposal, rescale): the live cluster's
        return getattr(self._gens[0].client, name)


class SessionRuntime:
    """A runtime (`ports.StandbyRuntime`) that runs the jobs of session apps on their shared clusters; every other
    app goes to the wrapped runtime unchanged. See the module docstring."""

    def __init__(self, host: SessionHost, clock: Clock | None = None) -> None:
        self.host = host
        self.clock: Clock = clock or SystemClock()
        self.name = host.name
        self.restarts_processes = host.restarts_processes
        self._lock = threading.Lock()
        self._members: dict[str, str] = {}  # app -> session cluster
        self._clusters: set[str] = set()  # session clusters named in Git or by an applied spec
        self._suspended: frozenset[str] = frozenset()
        self._standby_locks: dict[str, threading.Lock] = {}
        self._start_locks: dict[str, threading.Lock] = {}
        # (cluster, generation) -> apps of this process whose move there began (start_standby) and has not been
        # undone (discard_standby): a job still to stop and start there keeps the new cluster from another's undo
        self._movers: dict[tuple[str, str], set[str]] = {}
        self._move_order: dict[tuple[str, str], list[str]] = {}  # the same moves, in the order they began
        self._priming: dict[tuple[str, str], set[str]] = {}  # the same moves, their jar not yet on the new cluster

    def _standby_lock(self, cluster: str) -> threading.Lock:
        """Held briefly: who moves where (`_movers`, `_move_order`, `_priming`), and a discard."""
        with self._lock:
            return self._standby_locks.setdefault(cluster, threading.Lock())

    def _start_lock(self, cluster: str) -> threading.Lock:
        """Held while a new cluster starts: the other apps of the move register meanwhile, then find it."""
        with self._lock:
            return self._start_locks.setdefault(cluster, threading.Lock())

    def set_sessions(self, members: Mapping[str, str], clusters: Collection[str] = (),
                     suspended: Collection[str] = ()) -> None:
        """Which app runs on which session cluster (desired and applied specs), the clusters in Git, and the apps
        on them that Git says are suspended (no job of theirs is waited for)."""
        with self._lock:
            self._members = dict(members)
            self._clusters = set(clusters) | set(members.values())
            self._suspended = frozenset(suspended)

    def session_of(self, app: str) -> str | None:
        with self._lock:
            return self._members.get(app)

    def members(self, cluster: str) -> list[str]:
        with self._lock:
            return sorted(a for a, c in self._members.items() if c == cluster)

    def is_session_cluster(self, name: str, info: ClusterInfo | None = None) -> bool:
        with self._lock:
            known = name in self._clusters
        return known or (info is not None and info.session)

    def __getattr__(self, name: str) -> Any:  # what only the wrapped runtime has (paths, records, close)
        return getattr(self.host, name)

    @property
    def revision(self) -> str:
        """The revision a runtime that stamps its objects with it (Kubernetes) is told by the executor: the wrapped
        runtime's (an AttributeError, so `hasattr` is False, for one without)."""
        value: str = self.host.revision  # type: ignore[attr-defined]
        return value

    @revision.setter
    def revision(self, value: str) -> None:
        self.host.revision = value  # type: ignore[attr-defined]

    # -- Runtime -------------------------------------------------------------------------------------

    def list_clusters(self) -> dict[str, ClusterInfo]:
        base = self.host.list_clusters()
        out = {n: i for n, i in base.items() if not self.is_session_cluster(n, i)}
        with self._lock:
            members = dict(self._members)
        for app, cluster in members.items():
            info = base.get(cluster)
            if info is not None and info.phase is not ClusterPhase.ABSENT:
                out[app] = self._app_info(app, cluster, info)
        return out

    def session_clusters(self) -> dict[str, ClusterInfo]:
        """The session clusters that run (by their runtime's account), with their live jobs per app."""
        return {n: i for n, i in self.host.list_clusters().items() if self.is_session_cluster(n, i)}

    def cluster_jobs(self, cluster: str) -> dict[str, str]:
        """app -> state of its live job on any cluster of `cluster` (apps known to this runtime only)."""
        out: dict[str, str] = {}
        known = list(self._members)
        for g in self.host.session_generations(cluster):
            for j in _live_jobs(g.client):
                for app in known:
                    if is_job_of(j.job_id, app):
                        out[app] = j.state
                if not any(is_job_of(j.job_id, a) for a in known):
                    out[f"job {j.job_id}"] = j.state
        return out

    def observe(self, app: str) -> ClusterInfo:
        cluster = self.session_of(app)
        if cluster is None:
            return self.host.observe(app)
        info = self.host.observe(cluster)
        if info.phase is ClusterPhase.ABSENT:
            return ClusterInfo(app=app, phase=ClusterPhase.ABSENT)
        return self._app_info(app, cluster, info)

    def _app_info(self, app: str, cluster: str, info: ClusterInfo) -> ClusterInfo:
        """The session cluster as app `app` sees it: ABSENT while none of its jobs is there (its job starts on it
        then), never a standby or retired cluster of its own (those are the cluster's, see the move steps)."""
        if info.phase is ClusterPhase.UNKNOWN:
            return ClusterInfo(app=app, phase=info.phase, message=info.message, unreadable=info.unreadable)
        try:
            gens = self.host.session_generations(cluster)
            mine = SessionJobs(app, gens).jobs() if gens else []
        except ReconcilerError as e:
            if info.phase is ClusterPhase.READY:
                return ClusterInfo(app=app, phase=ClusterPhase.UNKNOWN, message=f"session cluster {cluster}: {e}")
            mine = []
        if not mine:
            return ClusterInfo(app=app, phase=ClusterPhase.ABSENT)
        return ClusterInfo(app=app, phase=info.phase, rest_url=info.rest_url, message=info.message,
                           missing=info.missing)

    def ensure_cluster(self, app: FlinkApp, *, deadline: float, keep_running: bool = False) -> ClusterInfo:
        cluster = self.session_of(app.name) or app.spec.session_cluster
        if cluster is None:
            return self.host.ensure_cluster(app, deadline=deadline, keep_running=keep_running)
        stand_in = cluster_app(cluster, app)
        want = self.host.config_key(stand_in)
        gens = self.host.session_generations(cluster)
        match = next((g for g in gens if g.config_key == want), None)
        if match is not None and match.slot != "cluster":
            return ClusterInfo(app=app.name, phase=ClusterPhase.READY)  # the old cluster, for a rollback
        live = next((g for g in gens if g.slot == "cluster"), None)
        if match is None and live is not None:
            others = sorted({a for j in _live_jobs(live.client) for a in self.members(cluster)
                             if a != app.name and is_job_of(j.job_id, a)})
            if others:
                raise PermanentStepError(
                    f"session cluster {cluster} runs at another spec with the jobs of {', '.join(others)}: it changes "
                    "only by warm standby (every job moves), never by a restart under them")
        info = self.host.ensure_cluster(stand_in, deadline=deadline, keep_running=keep_running)
        return ClusterInfo(app=app.name, phase=info.phase, rest_url=info.rest_url, message=info.message)

    def start_job(self, app: FlinkApp, *, job_id: str, jar: Path | None, restore_path: str | None,
                  allow_non_restored_state: bool, deadline: float) -> str:
        cluster = self.session_of(app.name) or app.spec.session_cluster
        if cluster is None:
            return self.host.start_job(app, job_id=job_id, jar=jar, restore_path=restore_path,
                                       allow_non_restored_state=allow_non_restored_state, deadline=deadline)
        image = jar is None and isinstance(self.host, ImageJars)  # a local:// jar its JobManager staged
        if not image and (jar is None or not jar.is_file()):
            raise PermanentStepError(f"app {app.name}: job jar {jar or app.spec.job.jar_uri} is not a file here; a "
                                     "job on a session cluster is submitted through REST from a jar the reconciler "
                                     "can read")
        want = self.host.config_key(cluster_app(cluster, app))
        target = next((g for g in self.host.session_generations(cluster) if g.config_key == want), None)
        if target is None:
            raise PermanentStepError(f"app {app.name}: no cluster of session cluster {cluster} runs at this app's "
                                     "spec (it was not started, or was deleted)")
        client = target.client
        job = app.spec.job
        run: dict[str, Any] = dict(
            job_id=job_id, entry_class=job.entry_class, args=job.args, parallelism=job.parallelism,
            savepoint_path=restore_path, allow_non_restored_state=allow_non_restored_state,
            flink_configuration=self.host.job_storage(app.name),
        )
        if image:
            assert isinstance(self.host, ImageJars)
            return client.run_jar(self.host.image_jar_id(cluster, target.slot, app), **run)
        assert jar is not None
        jar_id = self.host.jar_id(cluster, target.slot, jar, deadline=deadline, job_id=job_id)
        try:
            try:
                return client.run_jar(jar_id, **run)
            except FlinkRestError as e:  # the uploaded jar is gone (web.tmpdir cleaned, a pruned jar): upload again
                if not any("jar" in t.lower() and ("not exist" in t or "not found" in t) for t in e.errors):
                    raise
                if jar_id in client.jars():
                    raise  # the jar is there: the job's own error (a class not found in it), never a second copy
            return client.run_jar(self.host.jar_id(cluster, target.slot, jar, deadline=deadline, again=True,
                                                   job_id=job_id), **run)
        except ReconcilerError:  # not submitted: the job no longer holds its jar (`prune_jars`)
            if not any(j.job_id == job_id for j in client.jobs()):
                self.host.forget_jars(cluster, target.slot, (), (job_id,), deadline=deadline)
            raise

    def delete_cluster(self, app: str, *, deadline: float) -> None:
        cluster = self.session_of(app)
        if cluster is None:
            self.host.delete_cluster(app, deadline=deadline)  # an app's own cluster, or a session cluster itself
            return
        gens = self.host.session_generations(cluster)
        for g in gens:
            for j in _live_jobs(g.client):
                if is_job_of(j.job_id, app):  # the plan stopped it; one started meanwhile is cancelled
                    g.client.cancel(j.job_id)
        self.prune_jars(cluster)

    def prune_jars(self, cluster: str, *, deadline: float | None = None) -> list[str]:
        """Delete (`DELETE /jars/:id`) the jars we uploaded to a cluster of `cluster` that no job of it needs any
        more: kept are the jars of its live jobs and of jobs recorded but not yet submitted (a start under way).
        A cluster running a job we did not submit, or one of ours whose jar is not on record, keeps every jar.
        Best effort: a later submit uploads a missing jar again (`start_job`)."""
        end = deadline if deadline is not None else self.clock.monotonic() + 30.0
        removed: list[str] = []
        for g in self.host.session_generations(cluster):
            try:
                ours, used = self.host.jar_uses(cluster, g.slot)
                jobs = {j.job_id: j.state.upper() for j in g.client.jobs()}
                live = [j for j, state in jobs.items() if state not in TERMINAL]
                if any(j not in used for j in live):
                    continue  # a live job whose jar we do not know: keep them all
                keep = {i for j, i in used.items() if j not in jobs or jobs[j] not in TERMINAL}
                gone = [i for i in g.client.jars() if i in ours and i not in keep
                        and not (isinstance(self.host, ImageJars) and self.host.is_image_jar(i))]
                for jar_id in gone:
                    g.client.delete_jar(jar_id)
                removed.extend(gone)
                self.host.forget_jars(cluster, g.slot, gone, [j for j, s in jobs.items() if s in TERMINAL],
                                      deadline=end)
            except ReconcilerError as e:
                log.info("session cluster %s: jars not pruned: %s", cluster, e)
        if removed:
            log.info("session cluster %s: deleted %d jar(s) no job uses any more", cluster, len(removed))
        return removed

    def flink(self, app: str) -> FlinkApi:
        cluster = self.session_of(app)
        if cluster is None:
            return self.host.flink(app)
        gens = self.host.session_generations(cluster)
        if not gens:
            raise ObserveError(f"app {app}: session cluster {cluster} does not run")
        return SessionJobs(app, gens, self.host.job_storage(app).get(SAVEPOINT_DIR_KEY))

    def stored_snapshots(self, app: str) -> list[Checkpoint]:
        return self.host.stored_snapshots(app)

    # -- warm standby: a session cluster's move ------------------------------------------------------

    def start_standby(self, app: FlinkApp, *, generation: str, deadline: float, jar: Path | None = None
                      ) -> ClusterInfo:
        cluster = self.session_of(app.name) or app.spec.session_cluster
        if cluster is None:
            return self.host.start_standby(app, generation=generation, deadline=deadline, jar=jar)
        # The first app's move starts it, warms it up (the warm-up job) with its jar uploaded and its job graph
        # compiled; every other app's jar and graph follow, and no job stops before all of that is done (out of
        # the downtime; see _await_turn). The others do not hold the cluster's lock for a warm-up.
        key = (cluster, generation)
        with self._standby_lock(cluster):
            self._movers.setdefault(key, set()).add(app.name)
            order = self._move_order.setdefault(key, [])
            if app.name not in order:
                order.append(app.name)
            self._priming.setdefault(key, set()).add(app.name)
        try:
            with self._start_lock(cluster):  # the apps of one move run on threads: one starts it, the others find it
                started = any(g.generation == generation for g in self.host.session_generations(cluster))
                info = self.host.start_standby(cluster_app(cluster, app), generation=generation, deadline=deadline,
                                               jar=None if started else jar)
            if started and jar is not None and jar.is_file():
                self._prime(cluster, generation, app, jar, deadline)
        finally:
            with self._standby_lock(cluster):
                self._priming.get(key, set()).discard(app.name)
        self._await_turn(cluster, generation, app.name, deadline)
        return ClusterInfo(app=app.name, phase=info.phase, rest_url=info.rest_url, message=info.message)

    def _prime(self, cluster: str, generation: str, app: FlinkApp, jar: Path, deadline: float) -> None:
        """The app's jar on the new cluster (once per content) and its job graph compiled there with its own
        arguments, before any job of the move stops: the submit after its stop then does neither."""
        target = next((g for g in self.host.session_generations(cluster) if g.generation == generation), None)
        if target is None:
            return  # the submit uploads it
        job = app.spec.job
        try:
            jar_id = self.host.jar_id(cluster, target.slot, jar, deadline=deadline)
            target.client.plan_jar(jar_id, entry_class=job.entry_class, args=job.args, parallelism=job.parallelism)
        except ReconcilerError as e:  # only a warm-up: the submit says what is wrong
            log.info("app %s: its job graph was not compiled on the new cluster %s: %s", app.name, generation, e)

    def _await_turn(self, cluster: str, generation: str, app: str, deadline: float) -> None:
        """One job at a time through the downtime of a move, on a new cluster that nothing else keeps busy: this
        app's job (still running on the old cluster) is stopped only once no other app's jar is still being put
        on the new cluster, and every job whose move began before it runs all its tasks there and has completed a
        checkpoint there (or has run SETTLE_S without one: checkpoints may be rare or off), or that move was
        undone. Two jobs stopped, submitted and deployed at once onto a new JobManager and TaskManager took twice
        a job-only upgrade's downtime each; a stop during the previous job's first seconds on the new cluster
        (its deployment, its first checkpoint) was slowed down by them (bench/session_bench.py). The wait is
        before the stop (the job runs on meanwhile), bounded, and in-memory: a move resumed after a crash does
        not wait."""
        key = (cluster, generation)
        end = min(deadline - 30.0, self.clock.monotonic() + 120.0)
        running_since: dict[str, float] = {}
        while self.clock.monotonic() < end:
            with self._standby_lock(cluster):
                order = self._move_order.get(key, [])
                movers = self._movers.get(key, set())
                ahead = [m for m in order[:order.index(app)] if m in movers] if app in order else []
                priming = self._priming.get(key, set()) - {app}
            if not ahead and not priming:
                return
            try:
                settled = priming == set() and all(self._settled(cluster, generation, m, running_since)
                                                   for m in ahead)
            except ReconcilerError:
                return  # cannot tell: go on (the wait only shortens downtime, it keeps nothing safe)
            if settled:
                return
            self.clock.sleep(0.05)
        log.info("session cluster %s: %s stops its job without waiting further for the moves before it", cluster, app)

    def _settled(self, cluster: str, generation: str, app: str, running_since: dict[str, float]) -> bool:
        """App `app`'s job runs every task on cluster `generation` and has completed a checkpoint there, or has
        run every task for SETTLE_S (first seen by this caller, `running_since`)."""
        for g in self.host.session_generations(cluster):
            if g.generation != generation:
                continue
            for j in g.client.jobs():
                if not (is_job_of(j.job_id, app) and j.state.upper() == "RUNNING" and j.tasks_total
                        and j.tasks_running == j.tasks_total):
                    continue
                since = running_since.setdefault(app, self.clock.monotonic())
                if self.clock.monotonic() - since >= SETTLE_S:
                    return True
                stats = g.client.checkpoints(j.job_id)
                return stats.completed_count > 0 and (stats.latest_completed_at is None or j.start_time_ms <= 0 or
                                                      stats.latest_completed_at.timestamp() * 1000 >= j.start_time_ms)
        return False

    def promote_standby(self, app: str, *, generation: str, deadline: float) -> None:
        cluster = self.session_of(app)
        if cluster is None:
            self.host.promote_standby(app, generation=generation, deadline=deadline)
            return
        gens = self.host.session_generations(cluster)
        live = next((g for g in gens if g.slot == "cluster"), None)
        if live is not None and live.generation == generation:
            return  # another app's move promoted it already
        retired = next((g for g in gens if g.slot == "retired"), None)
        if retired is not None and _live_jobs(retired.client):
            raise PermanentStepError(f"session cluster {cluster}: an older cluster still runs jobs (rolled back "
                                     "there): no third cluster is made while they do")
        self.host.promote_standby(cluster, generation=generation, deadline=deadline)

    def discard_standby(self, app: str, *, generation: str, deadline: float) -> None:
        cluster = self.session_of(app)
        if cluster is None:
            self.host.discard_standby(app, generation=generation, deadline=deadline)
            return
        with self._standby_lock(cluster):
            movers = self._movers.get((cluster, generation), set())
            movers.discard(app)
            waiting = self._bound_for(cluster, generation, app, movers)
            if waiting:
                log.info("session cluster %s: %s goes back to the old cluster; the new one (%s) stays for %s",
                         cluster, app, generation, ", ".join(waiting))
                return
            self._movers.pop((cluster, generation), None)
            self.host.discard_standby(cluster, generation=generation, deadline=deadline)

    def _bound_for(self, cluster: str, generation: str, app: str, movers: Collection[str]) -> list[str]:
        """Who still needs cluster `generation` when `app`'s move to it is undone: the jobs that run on it, and the
        other apps still to get there, a job stopped on the old cluster and not started again (its start, or its
        rollback, may need either cluster; this also finds a move resumed after a crash) and a move this process
        began that has neither arrived nor been undone. Empty: nobody, and the old cluster may be live again."""
        gens = self.host.session_generations(cluster)
        members = self.members(cluster)
        there = [next((m for m in members if is_job_of(j.job_id, m)), f"job {j.job_id}")
                 for g in gens if g.generation == generation for j in _live_jobs(g.client)]
        if there:
            return sorted(there)
        seen = [(g, j) for g in gens for j in g.client.jobs()]
        live = {m for _, j in seen if j.state.upper() not in TERMINAL for m in members if is_job_of(j.job_id, m)}
        stopped = {m for g, j in seen if g.generation != generation and j.state.upper() == "FINISHED"
                   for m in members if is_job_of(j.job_id, m)}
        others = set(members) - {app} - self._suspended
        return sorted(((stopped - live) | set(movers)) & others)

    def delete_retired(self, app: str, *, deadline: float) -> None:
        cluster = self.session_of(app)
        if cluster is None:
            self.host.delete_retired(app, deadline=deadline)
            return
        gens = self.host.session_generations(cluster)
        live = next((g for g in gens if g.slot == "cluster"), None)
        retired = next((g for g in gens if g.slot == "retired"), None)
        if live is not None:
            with self._standby_lock(cluster):  # this app's move arrived: it no longer holds the new cluster
                self._movers.get((cluster, live.generation), set()).discard(app)
        if retired is None:
            return
        if _live_jobs(retired.client):
            return  # a job still to move, or rolled back onto it: kept
        on_live = {a for j in _live_jobs(live.client) for a in self.members(cluster) if is_job_of(j.job_id, a)
                   } if live else set()
        if set(self.members(cluster)) - on_live - self._suspended:
            return  # a job between its stop and its start: its rollback may need the old cluster
        self.host.delete_retired(cluster, deadline=deadline)

