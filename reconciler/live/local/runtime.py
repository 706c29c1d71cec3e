"""The local runtime: one Flink session cluster per app, as JVMs on this host.

Built from the jars of the PyPI package `apache-flink-libraries` (no shell scripts): we write the
config, ask BashJavaUtils for the memory flags, and start a JobManager and N TaskManagers with
`start_new_session=True`, so the JVMs outlive the `apply` process that started them. Everything lives
under the state directory::

    clusters/<app>/conf/        config.yaml, log4j.properties (generated)
    clusters/<app>/log/         jobmanager.log, taskmanager-<i>.log, *.out (appended, never truncated)
    clusters/<app>/work/        the JVMs' working directory (a job's relative paths land here)
    clusters/<app>/tmp/         io.tmp.dirs and web.tmpdir (uploaded jars, blobs)
    clusters/<app>/cluster.json ports, PIDs, the cluster-config hash, started_at
    checkpoints/<app>/, savepoints/<app>/   retained across cluster restarts

A restarted reconciler finds running clusters through cluster.json (alive PIDs whose command line
carries this cluster's marker, REST answering) and never starts a second one. Signals only ever go to
PIDs whose /proc/<pid>/cmdline carries the marker, so a reused PID is never killed.

The JVMs of a cluster (start, scale, stop, why one exited) are `processes.py` and the warm standby is
`standby.py`, both mixed into `LocalRuntime` here; the configuration rendering is `config.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Collection, Iterator
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from reconciler.clock import Clock
from reconciler.core.observed import Checkpoint, ClusterPhase
from reconciler.core.plan import spec_hash
from reconciler.errors import (
    DeadlineExceededError,
    JobManagerGoneError,
    ObserveError,
    PermanentStepError,
    ReconcilerError,
    RuntimeProvisionError,
    TransientStepError,
)
from reconciler.live.flink import FlinkRestClient, FlinkRestError
from reconciler.live.local.config import (
    MARKER_PROPERTY,
    SLOTS,
    ClusterPaths,
    ClusterRecord,
    FlinkDist,
    cluster_config_hash,
)
from reconciler.live.local.processes import JvmProcesses, cluster_ready, ready_gap
from reconciler.live.local.standby import LocalStandby
from reconciler.live.ports import ClusterInfo, SessionGeneration
from reconciler.spec.model import FlinkApp

# -- the runtime ---------------------------------------------------------------------------------------


class LocalRuntime(LocalStandby, JvmProcesses):
    """`reconciler.live.ports.Runtime` on this host. See the module docstring for the layout."""

    name = "local"
    restarts_processes = False

    def __init__(
        self,
        state_dir: Path,
        *,
        clock: Clock,
        flink_home: Path | None = None,
        java: str = "java",
        stop_grace_s: float = 20.0,
        poll_s: float = 0.1,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.clock = clock
        self._flink_home = flink_home
        self.java = java
        self.stop_grace_s = stop_grace_s
        self.poll_s = poll_s
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._clients: dict[str, FlinkRestClient] = {}
        self._clients_lock = threading.Lock()  # the executor runs apps on threads

    @cached_property
    def dist(self) -> FlinkDist:
        return FlinkDist.discover(self._flink_home)

    def paths(self, app: str, generation: str = "") -> ClusterPaths:
        return ClusterPaths(
            root=self.state_dir / "clusters" / app,
            checkpoints=self.state_dir / "checkpoints" / app,
            savepoints=self.state_dir / "savepoints" / app,
            generation=generation,
        )

    def _paths(self, rec: ClusterRecord) -> ClusterPaths:
        return self.paths(rec.app, rec.generation)

    def close(self) -> None:
        """Close REST clients. The JVMs keep running: they belong to the state dir, not this object."""
        with self._clients_lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    # -- Runtime protocol ------------------------------------------------------------------------------

    def list_clusters(self) -> dict[str, ClusterInfo]:
        root = self.state_dir / "clusters"
        if not root.is_dir():
            return {}
        out: dict[str, ClusterInfo] = {}
        for d in sorted(root.iterdir()):
            if (d / "cluster.json").is_file():
                try:
                    out[d.name] = self.observe(d.name)
                except (ReconcilerError, OSError, ValueError) as e:  # that app's problem, never the others'
                    out[d.name] = ClusterInfo(app=d.name, phase=ClusterPhase.UNKNOWN,
                                              message=f"cannot observe the local cluster of app {d.name}: {e}")
        return out

    def observe(self, app: str) -> ClusterInfo:
        try:
            rec = self.read_record(app)
        except ObserveError as e:  # never report an unreadable record as "absent"
            return ClusterInfo(app=app, phase=ClusterPhase.UNKNOWN, message=str(e),
                               unreadable=self._unreadable(app, "cluster", e))
        if rec is None:
            return ClusterInfo(app=app, phase=ClusterPhase.ABSENT)
        info = ClusterInfo(app=app, phase=ClusterPhase.STARTING, rest_url=rec.rest_url, spec_hash=rec.spec_hash,
                           session=rec.session,
                           **self._others(app, rec))
        # A process this runtime just spawned may not have exec'ed yet (no marker on its command line): starting.
        if not self._alive(rec.jobmanager.pid, rec.marker) and not self._execing(rec.jobmanager.pid):
            reason = self._exit_reason(rec, rec.jobmanager)
            return _with(info, phase=ClusterPhase.FAILED, message=f"JobManager is not running: {reason}")
        dead = [p for p in rec.taskmanagers if not self._alive(p.pid, rec.marker) and not self._execing(p.pid)]
        try:
            ov = self._client(rec.rest_url, timeout=3.0).overview()
        except FlinkRestError as e:
            return _with(info, message=f"JobManager REST not answering yet: {e.cause}",
                         missing=tuple(p.name for p in dead))
        if dead:
            names = ", ".join(f"{p.name} ({self._exit_reason(rec, p)})" for p in dead)
            return _with(info, message=f"TaskManager(s) not running: {names}", missing=tuple(p.name for p in dead))
        if not cluster_ready(ov, rec.replicas, rec.slots):
            return _with(info, message=ready_gap(ov, rec.replicas, rec.slots))
        return _with(info, phase=ClusterPhase.READY)

    def ensure_cluster(self, app: FlinkApp, *, deadline: float, keep_running: bool = False) -> ClusterInfo:
        with self._lock(app.name, deadline):
            rec = self._ensure(app, deadline, keep_running=keep_running)
            return ClusterInfo(app=app.name, phase=ClusterPhase.READY, rest_url=rec.rest_url,
                               spec_hash=rec.spec_hash)

    def start_job(
        self,
        app: FlinkApp,
        *,
        job_id: str,
        jar: Path | None,
        restore_path: str | None,
        allow_non_restored_state: bool,
        deadline: float,
    ) -> str:
        if jar is None:
            raise PermanentStepError(
                f"app {app.name}: jarURI {app.spec.job.jar_uri!r} points inside a container image; the local "
                "runtime needs a repository path, a file:// path or an http(s):// URL"
            )
        if not jar.is_file():
            raise PermanentStepError(f"app {app.name}: job jar {jar} does not exist")
        with self._lock(app.name, deadline):
            rec = self._ensure(app, deadline)
            client = self._client(rec.rest_url)
            # No jobs() check here: run_jar looks for the id first and reads Flink's duplicate error.
            rec, jar_id = self._upload(rec, "cluster", client, jar)
            job = app.spec.job
            run: dict[str, Any] = dict(
                job_id=job_id, entry_class=job.entry_class, args=job.args, parallelism=job.parallelism,
                savepoint_path=restore_path, allow_non_restored_state=allow_non_restored_state,
            )
            try:
                return client.run_jar(jar_id, **run)
            except FlinkRestError as e:
                # The uploaded jar is gone (web.tmpdir cleaned): upload again once.
                if not any("jar" in t.lower() and ("not exist" in t or "not found" in t) for t in e.errors):
                    raise
            rec, jar_id = self._upload(rec, "cluster", client, jar, again=True)
            return client.run_jar(jar_id, **run)

    def delete_cluster(self, app: str, *, deadline: float) -> None:
        """Every cluster of the app: the live one, and a standby or retired one an upgrade left."""
        with self._lock(app, deadline):
            for slot in ("standby", "retired", "cluster"):
                self._remove(app, slot, deadline)

    def _remove(self, app: str, slot: str, deadline: float) -> None:
        """Stop the cluster in `slot` and forget it (its logs stay). The live record goes last, so a crash
        meanwhile leaves it findable."""
        rec = self.read_record(app, slot)
        if rec is None:
            return
        others = [r for r in (self.read_record(app, s) for s in SLOTS if s != slot) if r is not None]
        if not any(r.cluster_id == rec.cluster_id for r in others):  # another slot names it: not a copy
            self._stop_procs(rec, [*rec.taskmanagers, rec.jobmanager], deadline)
            paths = self._paths(rec)
            for d in (paths.conf, paths.tmp):
                shutil.rmtree(d, ignore_errors=True)
            self._drop_client(rec.rest_url)
        self.paths(app).slot(slot).unlink(missing_ok=True)

    def _upload(self, rec: ClusterRecord, slot: str, client: FlinkRestClient, jar: Path,
                *, again: bool = False) -> tuple[ClusterRecord, str]:
        """The jar's id on this cluster, uploading it once per content (recorded by sha256)."""
        digest = hashlib.sha256(jar.read_bytes()).hexdigest()
        jar_id = None if again else rec.jars.get(digest)
        if jar_id is None:
            jar_id = client.upload_jar(jar)
            rec = rec.model_copy(update={"jars": {**rec.jars, digest: jar_id}})
            self._write_record(rec, slot)
        return rec, jar_id

    def _unreadable(self, app: str, slot: str, e: ObserveError) -> str:
        """What a human does about a cluster file that cannot be read: which JVMs it described is unknown, so the
        app waits (BLOCKED) rather than have a second cluster started beside them or its job taken for gone."""
        path = self.paths(app).slot(slot)
        find = f"pgrep -af '{MARKER_PROPERTY}={app}-[0-9a-f]{{12}}'"
        return (f"{e}: which JVMs this file describes is unknown, so app {app} is left as it is. Restore the file "
                f"from a copy, or stop the app's JVMs that are not described elsewhere (`{find}` lists them; its "
                f"live cluster is in {self.paths(app).slot('cluster').name} when that file is readable) and move "
                f"the file aside (`mv {path} {path}.broken`): the next pass then restarts the app from its "
                "savepoints and checkpoints")

    def cluster_records(self, app: str) -> dict[str, ClusterRecord]:
        """Every cluster of the app by slot (cluster, standby, retired): what runs, for status and tests."""
        return {slot: rec for slot in SLOTS if (rec := self.read_record(app, slot)) is not None}


    # -- session clusters (reconciler.live.session.SessionHost) ---------------------------------------

    def session_generations(self, cluster: str) -> list[SessionGeneration]:
        """Every cluster of session cluster `cluster` (live, standby, retired) whose JobManager runs."""
        out: list[SessionGeneration] = []
        for slot, rec in self.cluster_records(cluster).items():
            if any(g.cluster_id == rec.cluster_id for g in out):
                continue  # a copy a crash between two renames left (see _tidy)
            if self._alive(rec.jobmanager.pid, rec.marker):
                out.append(SessionGeneration(slot=slot, generation=rec.generation, config_key=rec.config_hash,
                                             cluster_id=rec.cluster_id, client=self._client(rec.rest_url)))
        return sorted(out, key=lambda g: SLOTS.index(g.slot))

    def config_key(self, app: FlinkApp) -> str:
        """What tells the clusters of one session cluster apart: the config the JVMs were started with."""
        return cluster_config_hash(app, self.dist.version)

    def jar_id(self, cluster: str, slot: str, jar: Path, *, deadline: float, again: bool = False,
               job_id: str | None = None) -> str:
        """The jar's id on the cluster in `slot` of session cluster `cluster`: uploaded once per content (the same
        record a standby's warm-up uploads it into, so the job graph it compiled is the submit's). `job_id`: the
        job about to be submitted from it, recorded so the jar is kept while that job runs (`prune_jars`)."""
        with self._lock(cluster, deadline):
            rec = self.read_record(cluster, slot)
            if rec is None:
                raise PermanentStepError(f"session cluster {cluster} has no {slot} cluster")
            rec, jar_id = self._upload(rec, slot, self._client(rec.rest_url), jar, again=again)
            if job_id is not None:
                digest = next(d for d, i in rec.jars.items() if i == jar_id)
                if rec.job_jars.get(job_id) != digest:
                    self._write_record(rec.model_copy(update={"job_jars": {**rec.job_jars, job_id: digest}}), slot)
            return jar_id

    def jar_uses(self, cluster: str, slot: str) -> tuple[dict[str, str], dict[str, str]]:
        """The jars we uploaded to the cluster in `slot` (id -> sha256) and the jobs submitted from them (job id
        -> jar id)."""
        rec = self.read_record(cluster, slot)
        if rec is None:
            return {}, {}
        return ({i: d for d, i in rec.jars.items()},
                {j: rec.jars[d] for j, d in rec.job_jars.items() if d in rec.jars})

    def forget_jars(self, cluster: str, slot: str, jar_ids: Collection[str], gone_jobs: Collection[str], *,
                    deadline: float) -> None:
        """Drop deleted jars and ended jobs from the record of the cluster in `slot`."""
        with self._lock(cluster, deadline):
            rec = self.read_record(cluster, slot)
            if rec is None:
                return
            jars = {d: i for d, i in rec.jars.items() if i not in jar_ids}
            jobs = {j: d for j, d in rec.job_jars.items() if j not in gone_jobs and d in jars}
            if jars != rec.jars or jobs != rec.job_jars:
                self._write_record(rec.model_copy(update={"jars": jars, "job_jars": jobs}), slot)

    def job_storage(self, app: str) -> dict[str, str]:
        """Job configuration of an app's job on a session cluster: its checkpoints and savepoints in the app's
        own directories (where `stored_snapshots` looks), not the cluster's."""
        p = self.paths(app)
        for d in (p.checkpoints, p.savepoints):
            d.mkdir(parents=True, exist_ok=True)
        return {"execution.checkpointing.dir": p.checkpoints.resolve().as_uri(),
                "execution.checkpointing.savepoint-dir": p.savepoints.resolve().as_uri()}

    def flink(self, app: str) -> FlinkRestClient:
        rec = self.read_record(app)
        if rec is None:
            raise ObserveError(f"app {app} has no local cluster under {self.paths(app).root}")
        return self._client(rec.rest_url)

    def stored_snapshots(self, app: str) -> list[Checkpoint]:
        """savepoints/<app>/savepoint-*/ and checkpoints/<app>/<job>/chk-*/ holding a `_metadata` file
        (an interrupted one has none), newest first by the time `_metadata` was written."""
        paths = self.paths(app)
        found: list[Checkpoint] = []
        try:
            for pattern, root, is_sp in (("savepoint-*/_metadata", paths.savepoints, True),
                                         ("*/chk-*/_metadata", paths.checkpoints, False)):
                if not root.is_dir():
                    continue
                for meta in root.glob(pattern):
                    try:
                        at = datetime.fromtimestamp(meta.stat().st_mtime, UTC)
                    except FileNotFoundError:
                        continue  # disposed of while we looked (savepoint retention)
                    found.append(Checkpoint(path=f"file:{meta.parent.resolve()}", completed_at=at, is_savepoint=is_sp))
        except OSError as e:
            raise ObserveError(f"cannot list the stored savepoints/checkpoints of app {app}: {e}") from e
        return sorted(found, key=lambda c: c.completed_at, reverse=True)

    # -- records ---------------------------------------------------------------------------------------

    def read_record(self, app: str, slot: str = "cluster") -> ClusterRecord | None:
        """The record of the app's live cluster, or of its standby or retired one (`slot`)."""
        path = self.paths(app).slot(slot)
        try:
            return ClusterRecord.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ObserveError(f"cannot read {path}: {e}") from e

    def _write_record(self, rec: ClusterRecord, slot: str = "cluster") -> None:
        path = self.paths(rec.app).slot(slot)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(rec.model_dump_json(indent=2))
        os.replace(tmp, path)

    # -- ensure ----------------------------------------------------------------------------------------

    def _ensure(self, app: FlinkApp, deadline: float, *, keep_running: bool = False) -> ClusterRecord:
        """`keep_running`: a job runs on the cluster (a scale, a repair): a live JobManager is kept whatever its
        config hash says, since the spec changed nothing that needs a restart, so a difference is this reconciler's
        own (a newer version writes the config differently); it comes with the next new cluster."""
        want = cluster_config_hash(app, self.dist.version)
        rec = self.read_record(app.name)
        if rec is not None:
            if (rec.config_hash == want or keep_running) and self._alive(rec.jobmanager.pid, rec.marker):
                rec = self._scale(rec, app, deadline)
            else:
                # Config changed (the executor stopped the job first) or the JobManager died.
                self._stop_procs(rec, [*rec.taskmanagers, rec.jobmanager], deadline)
                self._drop_client(rec.rest_url)
                rec = None
        started = rec is None
        if rec is None:
            rec = self._start(app, want, deadline)
        try:
            self._await_ready(rec, deadline)
        except RuntimeProvisionError as e:
            if started:  # JVMs this call started with this spec's configuration: the spec's failure
                raise
            # The running cluster, only matched to a TaskManager count, lost a process meanwhile: a kill, not this
            # spec's doing. A TaskManager comes back on the next attempt; a JobManager takes its jobs with it.
            if not self._alive(rec.jobmanager.pid, rec.marker):
                raise JobManagerGoneError(f"{e}; it was the JobManager of the running cluster, which nothing "
                                          "restarts: its jobs are gone with it") from e
            raise TransientStepError(f"{e} (a process of the running cluster; restarted on the next attempt)") from e
        new_hash = spec_hash(app.canonical())
        if rec.spec_hash != new_hash:
            rec = rec.model_copy(update={"spec_hash": new_hash})
            self._write_record(rec)
        return rec

    # -- plumbing ------------------------------------------------------------------------------------

    def _client(self, url: str, *, timeout: float = 10.0) -> FlinkRestClient:
        key = f"{url}#{timeout}"
        with self._clients_lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = FlinkRestClient(url, timeout=timeout)
            return client

    def _drop_client(self, url: str) -> None:
        with self._clients_lock:
            for key in [k for k in self._clients if k.startswith(url + "#")]:
                self._clients.pop(key).close()

    @contextlib.contextmanager
    def _lock(self, app: str, deadline: float) -> Iterator[None]:
        """One operation per app at a time, across processes (a daemon and an `apply` CLI)."""
        path = self.state_dir / "locks" / f"{app}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+") as fh:
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self.clock.monotonic() >= deadline:
                        raise DeadlineExceededError(
                            f"app {app}: another process holds {path} (an apply or the daemon is working on it)"
                        ) from None
                    self.clock.sleep(self.poll_s)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _with(info: ClusterInfo, **kw: Any) -> ClusterInfo:
    return dataclasses.replace(info, **kw)


