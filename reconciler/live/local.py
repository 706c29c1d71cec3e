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

Over 600 lines for one concern, the lifecycle of a cluster of JVMs (start, scale, stop, warm standby, the
records that find its processes again after a crash); its configuration rendering is `local_config.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import uuid
import zipfile
from collections.abc import Collection, Iterator
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import IO, Any

from reconciler.clock import Clock
from reconciler.core.observed import Checkpoint, ClusterPhase
from reconciler.core.plan import spec_hash
from reconciler.errors import (
    DeadlineExceededError,
    JobNotFoundError,
    ObserveError,
    PermanentStepError,
    ReconcilerError,
    RuntimeProvisionError,
)
from reconciler.live.flink import FlinkRestClient, FlinkRestError
from reconciler.live.local_config import (
    BASH_UTILS,
    FAST_START_FLAGS,
    JM_ENTRY,
    LOG4J_PROPERTIES,
    LOOPBACK,
    MARKER_PROPERTY,
    SLOTS,
    TM_ENTRY,
    WARMUP_JAVA,
    WARMUP_MAIN,
    ClusterPaths,
    ClusterRecord,
    FlinkDist,
    MemoryFlags,
    ProcRecord,
    cluster_config_hash,
    extract_log_reason,
    fast_start_flags,
    flink_environment,
    render_config,
    render_yaml,
    warmup_jar_name,
)
from reconciler.live.ports import ClusterInfo, ClusterOverview, SessionGeneration
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import SESSION_LABEL

log = logging.getLogger(__name__)

TERMINAL_STATES = frozenset({"FINISHED", "FAILED", "CANCELED"})
SAVEPOINT_DIR = "execution.checkpointing.savepoint-dir"

# -- the runtime ---------------------------------------------------------------------------------------


class LocalRuntime:
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
        if not _is_ready(ov, rec.replicas, rec.slots):
            return _with(info, message=_ready_gap(ov, rec.replicas, rec.slots))
        return _with(info, phase=ClusterPhase.READY)

    def ensure_cluster(self, app: FlinkApp, *, deadline: float) -> ClusterInfo:
        with self._lock(app.name, deadline):
            rec = self._ensure(app, deadline)
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

    # -- warm standby (reconciler.live.ports.StandbyRuntime) ---------------------------------------------

    def start_standby(self, app: FlinkApp, *, generation: str, deadline: float, jar: Path | None = None
                      ) -> ClusterInfo:
        """A second cluster of the app (generation-suffixed directories, its own ports), without a job, beside
        the live one; READY when every TaskManager's slots registered. A standby of another generation (left by
        an earlier attempt) is deleted first; one of this generation is reused when its JVMs still run.

        With `jar`, the job's jar is uploaded to it and its job graph compiled once (Flink's jar plan), so the
        submit after the old job's stop neither uploads nor meets a JobManager that never saw the program: that
        took 0.4-0.6 s of downtime on a fresh JobManager here."""
        with self._lock(app.name, deadline):
            self._tidy(app.name)
            want = cluster_config_hash(app, self.dist.version)
            live = self.read_record(app.name)
            slot = "standby"
            found: ClusterRecord | None
            if live is not None and live.generation == generation:  # promoted already (a resumed step)
                found, slot = live, "cluster"
            else:
                found = self.read_record(app.name, "standby")
                if found is not None and (found.generation != generation or found.config_hash != want
                                          or not self._alive(found.jobmanager.pid, found.marker)):
                    self._remove(app.name, "standby", deadline)
                    found = None
            rec = found or self._start(app, want, deadline, generation=generation, slot="standby")
            self._await_ready(rec, deadline)
            new_hash = spec_hash(app.canonical())
            if rec.spec_hash != new_hash:
                rec = rec.model_copy(update={"spec_hash": new_hash})
                self._write_record(rec, slot)
            if jar is not None and jar.is_file():
                rec = self._warm_up(rec, slot, app, jar, deadline)
            return ClusterInfo(app=app.name, phase=ClusterPhase.READY, rest_url=rec.rest_url,
                               spec_hash=rec.spec_hash)

    def _warm_up(self, rec: ClusterRecord, slot: str, app: FlinkApp, jar: Path, deadline: float) -> ClusterRecord:
        """Before the old job stops: the job's jar uploaded and its graph compiled once, then the warm-up job
        run, so the submit after the stop meets JVMs that have run a job (see WARMUP_JAVA). A session cluster's
        warm-up also goes through a savepoint and a restore (`_run_restore_warmup`)."""
        client = self._client(rec.rest_url)
        rec = self._prime_jar(rec, slot, app, jar)
        warmup = self._warmup_jar(deadline)
        if warmup is not None:
            rec, warmup_id = self._upload(rec, slot, client, warmup)
            if rec.session:
                self._run_restore_warmup(client, warmup_id, app, self._paths(rec).tmp / "warm-up", deadline)
            else:
                self._run_warmup(client, warmup_id, app, deadline)
        return rec

    def _prime_jar(self, rec: ClusterRecord, slot: str, app: FlinkApp, jar: Path) -> ClusterRecord:
        """The app's jar on cluster `rec` (uploaded once per content) and its job graph compiled once (Flink's jar
        plan) with the app's own arguments: what its submit after the stop would otherwise do first."""
        client = self._client(rec.rest_url)
        rec, jar_id = self._upload(rec, slot, client, jar)
        job = app.spec.job
        try:
            client.plan_jar(jar_id, entry_class=job.entry_class, args=job.args, parallelism=job.parallelism)
        except FlinkRestError as e:  # only a warm-up: the submit says what is wrong, with the job's own error
            log.info("app %s: compiling the job graph on cluster %s failed (the submit will tell): %s",
                     app.name, rec.generation, e.cause)
        return rec

    def _run_warmup(self, client: FlinkRestClient, jar_id: str, app: FlinkApp, deadline: float) -> None:
        """Run the warm-up job to its end (at most 30 s, best effort: a warm-up that fails changes nothing)."""
        job_id = uuid.uuid4().hex
        end = min(deadline, self.clock.monotonic() + 30.0)
        try:
            client.run_jar(jar_id, job_id=job_id, entry_class=WARMUP_MAIN, args=("2000",),
                           parallelism=app.spec.job.parallelism)
            cancelled = False
            while (state := client.job(job_id).state.upper()) not in TERMINAL_STATES:
                if self.clock.monotonic() >= end:
                    if cancelled:
                        break
                    client.cancel(job_id)  # it must not hold the slots the real job needs
                    cancelled, end = True, min(deadline, self.clock.monotonic() + 10.0)
                self.clock.sleep(self.poll_s)
            if state != "FINISHED":
                log.info("app %s: the warm-up job on the standby ended %s", app.name, state)
        except ReconcilerError as e:
            log.info("app %s: the warm-up job on the standby failed (no harm done): %s", app.name, e)

    def _run_restore_warmup(self, client: FlinkRestClient, jar_id: str, app: FlinkApp, scratch: Path,
                            deadline: float) -> None:
        """A session cluster's warm-up: the warm-up job taken through what a moved job meets on the new cluster,
        at most ~40 s, best effort (a warm-up that fails changes nothing). It runs with checkpoints, is stopped
        with a savepoint, a second run restores from that savepoint and checkpoints, and is cancelled. With the
        bounded run alone the savepoint, restore and checkpoint code was cold on the new JVMs, and the moved
        jobs' submits and deployments paid for it beside a job-only upgrade on a session cluster's warm JVMs
        (bench/session_bench.py). Its files are in `scratch`, deleted after."""
        end = min(deadline, self.clock.monotonic() + 40.0)
        conf = {"execution.checkpointing.interval": "200 ms",
                "execution.checkpointing.dir": (scratch / "checkpoints").resolve().as_uri(),
                SAVEPOINT_DIR: (scratch / "savepoints").resolve().as_uri()}
        first, second = uuid.uuid4().hex, uuid.uuid4().hex

        def run(job_id: str, savepoint: str | None = None) -> None:
            client.run_jar(jar_id, job_id=job_id, entry_class=WARMUP_MAIN, args=(str(2**62), "200"),
                           parallelism=app.spec.job.parallelism, savepoint_path=savepoint, flink_configuration=conf)

        try:
            run(first)
            if self._warmup_checkpointed(client, first, end):
                trigger = client.stop_with_savepoint(first, target_directory=conf[SAVEPOINT_DIR])
                location = None
                while self.clock.monotonic() < end:
                    status = client.savepoint_status(first, trigger)
                    if status.done:
                        location = status.location
                        break
                    self.clock.sleep(self.poll_s)
                if location is not None:
                    run(second, location)
                    self._warmup_checkpointed(client, second, end)
        except ReconcilerError as e:
            log.info("app %s: the warm-up job on the standby failed (no harm done): %s", app.name, e)
        finally:
            self._end_warmup(client, (first, second), app, deadline)
            shutil.rmtree(scratch, ignore_errors=True)

    def _warmup_checkpointed(self, client: FlinkRestClient, job_id: str, end: float) -> bool:
        """Wait until the warm-up job runs every task and completed a checkpoint of its own run."""
        while self.clock.monotonic() < end:
            job = client.job(job_id)
            if job.state.upper() in TERMINAL_STATES:
                return False
            if job.tasks_total and job.tasks_running == job.tasks_total:
                stats = client.checkpoints(job_id)
                if stats.completed_count > 0 and stats.latest_completed_at is not None and (
                        stats.latest_completed_at.timestamp() * 1000 >= job.start_time_ms):
                    return True
            self.clock.sleep(self.poll_s)
        return False

    def _end_warmup(self, client: FlinkRestClient, job_ids: tuple[str, ...], app: FlinkApp, deadline: float
                    ) -> None:
        """Cancel what is left of the warm-up jobs and wait for their end: they must not hold the slots the real
        jobs need."""
        end = min(deadline, self.clock.monotonic() + 15.0)
        for job_id in job_ids:
            try:
                while (state := client.job(job_id).state.upper()) not in TERMINAL_STATES:
                    if state not in ("CANCELLING", "FINISHED"):
                        client.cancel(job_id)
                    if self.clock.monotonic() >= end:
                        log.info("app %s: the warm-up job %s on the standby did not end (%s)", app.name, job_id,
                                 state)
                        break
                    self.clock.sleep(self.poll_s)
            except JobNotFoundError:
                continue  # never submitted
            except ReconcilerError as e:
                log.info("app %s: the warm-up job on the standby: %s", app.name, e)

    def _warmup_jar(self, deadline: float) -> Path | None:
        """The warm-up job's jar, compiled with javac once per Flink version (None: no javac here)."""
        path = self.state_dir / "cache" / warmup_jar_name(self.dist.version)
        if path.is_file():
            return path
        javac = self._javac()
        if javac is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            src = Path(tmp) / "src" / (WARMUP_MAIN.replace(".", "/") + ".java")
            src.parent.mkdir(parents=True)
            src.write_text(WARMUP_JAVA)
            classes = Path(tmp) / "classes"
            cmd = [javac, "--release", "17", "-nowarn", "-cp", str(self.dist.dist_jar), "-d", str(classes), str(src)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                      timeout=max(10.0, deadline - self.clock.monotonic()))
            except (OSError, subprocess.TimeoutExpired) as e:
                log.warning("cannot compile the warm-up job (%s): warm standbys start without it", e)
                return None
            if proc.returncode != 0:
                log.warning("cannot compile the warm-up job: %s", (proc.stdout + proc.stderr)[-800:])
                return None
            jar = Path(tmp) / "warmup.jar"
            with zipfile.ZipFile(jar, "w") as z:
                z.writestr("META-INF/MANIFEST.MF", f"Manifest-Version: 1.0\nMain-Class: {WARMUP_MAIN}\n")
                for f in sorted(classes.rglob("*.class")):
                    z.write(f, f.relative_to(classes).as_posix())
            os.replace(jar, path)
        return path

    def _javac(self) -> str | None:
        """javac beside the java we run (a JDK), else on PATH."""
        java = shutil.which(self.java)
        if java is not None:
            sibling = Path(java).resolve().parent / "javac"
            if sibling.is_file():
                return str(sibling)
        return shutil.which("javac")

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

    def promote_standby(self, app: str, *, generation: str, deadline: float) -> None:
        """The standby becomes the live cluster and the live one is retired (kept until `delete_retired`).
        Two renames, each atomic; between them both records name the old cluster, which `_tidy` settles."""
        with self._lock(app, deadline):
            self._tidy(app)
            live = self.read_record(app)
            if live is not None and live.generation == generation:
                return  # done before
            standby = self.read_record(app, "standby")
            if standby is None or standby.generation != generation:
                raise PermanentStepError(f"app {app}: standby cluster {generation} is gone; nothing to promote")
            if live is not None:
                self._remove(app, "retired", deadline)  # a third cluster never stays: an older retired one goes
                self._write_record(live, "retired")
            self._write_record(standby, "cluster")
            self.paths(app).slot("standby").unlink(missing_ok=True)

    def discard_standby(self, app: str, *, generation: str, deadline: float) -> None:
        """Undo a warm standby: when `generation` is live, the retired cluster is live again; then cluster
        `generation` is deleted. Nothing of that generation left: nothing to do."""
        with self._lock(app, deadline):
            self._tidy(app)
            live = self.read_record(app)
            if live is not None and live.generation == generation:
                retired = self.read_record(app, "retired")
                if retired is None:
                    raise PermanentStepError(f"app {app}: cluster {generation} is live and the old cluster is gone: "
                                             "there is nothing to go back to")
                self._write_record(live, "standby")  # still findable while the old one becomes live again
                self._write_record(retired, "cluster")
                self.paths(app).slot("retired").unlink(missing_ok=True)
            standby = self.read_record(app, "standby")
            if standby is not None and standby.generation == generation:
                self._remove(app, "standby", deadline)
            elif generation and not any(r.generation == generation for r in self.cluster_records(app).values()):
                # a standby that failed before it had a record (Flink rejected its memory configuration)
                paths = self.paths(app, generation)
                for d in (paths.conf, paths.tmp):
                    shutil.rmtree(d, ignore_errors=True)

    def delete_retired(self, app: str, *, deadline: float) -> None:
        with self._lock(app, deadline):
            self._tidy(app)
            self._remove(app, "retired", deadline)

    def _others(self, app: str, live: ClusterRecord) -> dict[str, Any]:
        """The standby and retired clusters beside `live` (a copy of `live` left by a crash does not count)."""
        try:
            standby = self.read_record(app, "standby")
        except ObserveError as e:
            return {"unreadable": self._unreadable(app, "standby", e)}
        try:
            retired = self.read_record(app, "retired")
        except ObserveError as e:
            return {"unreadable": self._unreadable(app, "retired", e)}
        return {"standby_generation": standby.generation if standby and standby.cluster_id != live.cluster_id
                else None, "retired_cluster": bool(retired and retired.cluster_id != live.cluster_id)}

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

    def _tidy(self, app: str) -> None:
        """A crash between the two renames of a promotion or a discard leaves one cluster in two slots: the
        live record wins and the copy is dropped (never the JVMs)."""
        live = self.read_record(app)
        if live is None:
            return
        for slot in ("standby", "retired"):
            other = self.read_record(app, slot)
            if other is not None and other.cluster_id == live.cluster_id:
                self.paths(app).slot(slot).unlink(missing_ok=True)

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

    def _ensure(self, app: FlinkApp, deadline: float) -> ClusterRecord:
        want = cluster_config_hash(app, self.dist.version)
        rec = self.read_record(app.name)
        if rec is not None:
            if rec.config_hash == want and self._alive(rec.jobmanager.pid, rec.marker):
                rec = self._scale(rec, app, deadline)
            else:
                # Config changed (the executor stopped the job first) or the JobManager died.
                self._stop_procs(rec, [*rec.taskmanagers, rec.jobmanager], deadline)
                self._drop_client(rec.rest_url)
                rec = None
        if rec is None:
            rec = self._start(app, want, deadline)
        self._await_ready(rec, deadline)
        new_hash = spec_hash(app.canonical())
        if rec.spec_hash != new_hash:
            rec = rec.model_copy(update={"spec_hash": new_hash})
            self._write_record(rec)
        return rec

    def _start(self, app: FlinkApp, config_hash: str, deadline: float, *, generation: str = "",
               slot: str = "cluster") -> ClusterRecord:
        p = self.paths(app.name, generation)
        shutil.rmtree(p.tmp, ignore_errors=True)
        for d in (p.conf, p.log, p.work, p.tmp, p.checkpoints, p.savepoints):
            d.mkdir(parents=True, exist_ok=True)
        rest_port, rpc_port = _free_ports(2)
        conf = render_config(app, p, rest_port=rest_port, rpc_port=rpc_port)
        (p.conf / "config.yaml").write_text(render_yaml(conf))
        (p.conf / "log4j.properties").write_text(LOG4J_PROPERTIES)
        jm_mem, tm_mem = self._memory_flags(p.conf, config_hash, deadline)
        rec = ClusterRecord(
            app=app.name,
            cluster_id=f"{app.name}-{uuid.uuid4().hex[:12]}",
            config_hash=config_hash,
            generation=generation,
            rest_port=rest_port,
            rpc_port=rpc_port,
            started_at=self.clock.now(),
            replicas=app.spec.task_manager.replicas,
            slots=app.spec.task_manager.slots,
            jobmanager=ProcRecord(role="jobmanager", index=0, pid=0, started_at=self.clock.now()),
            session=app.metadata.labels.get(SESSION_LABEL) == "true",
        )
        user = app.spec.flink_configuration
        jm = self._spawn(rec, "jobmanager", 0, jm_mem, user)
        rec = rec.model_copy(update={"jobmanager": jm})
        self._write_record(rec, slot)  # from here on, a crash leaves a record that finds and stops these JVMs
        tms = tuple(self._spawn(rec, "taskmanager", i, tm_mem, user) for i in range(rec.replicas))
        rec = rec.model_copy(update={"taskmanagers": tms})
        self._write_record(rec, slot)
        return rec

    def _scale(self, rec: ClusterRecord, app: FlinkApp, deadline: float) -> ClusterRecord:
        """Match the TaskManager count without touching the JobManager or the job."""
        want = app.spec.task_manager.replicas
        alive = [t for t in rec.taskmanagers if self._alive(t.pid, rec.marker)]
        if len(alive) < want:
            p = self._paths(rec)
            _, tm_mem = self._memory_flags(p.conf, rec.config_hash, deadline)
            used = {t.index for t in alive}
            free = (i for i in range(want + len(used) + 1) if i not in used)
            alive += [self._spawn(rec, "taskmanager", next(free), tm_mem, app.spec.flink_configuration)
                      for _ in range(want - len(alive))]
        elif len(alive) > want:
            victims = self._pick_idle(rec, alive, len(alive) - want, idle_only=rec.session)
            self._stop_procs(rec, victims, deadline)
            alive = [t for t in alive if t not in victims]
        new = rec.model_copy(update={"taskmanagers": tuple(sorted(alive, key=lambda t: t.index)), "replicas": want})
        if new != rec:  # an upgrade that keeps the cluster writes nothing here (it runs in the downtime window)
            self._write_record(new)
        return new

    def _pick_idle(self, rec: ClusterRecord, alive: list[ProcRecord], n: int, *, idle_only: bool = False
                   ) -> list[ProcRecord]:
        """TaskManagers to stop: idle ones first (no slot in use), so a running job keeps its tasks. `idle_only`
        (a session cluster, whose other jobs are not this change's to restart): never a busy one, nor any when
        Flink does not answer."""
        busy: set[str] = set()
        try:
            for tm in self._client(rec.rest_url).taskmanagers():
                if int(tm.get("freeSlots", 0)) < int(tm.get("slotsNumber", 0)):
                    busy.add(str(tm.get("id")))
        except FlinkRestError:
            if idle_only:
                return []
            # no answer: fall back to the highest indexes
        order = sorted(alive, key=lambda t: (_resource_id(rec, t.index) in busy, -t.index))
        if idle_only:
            order = [t for t in order if _resource_id(rec, t.index) not in busy]
        return order[:n]

    def _await_ready(self, rec: ClusterRecord, deadline: float) -> None:
        client = self._client(rec.rest_url, timeout=3.0)
        last = "JobManager REST not answering yet"
        while True:
            if not self._alive(rec.jobmanager.pid, rec.marker):
                raise RuntimeProvisionError(
                    f"app {rec.app}: JobManager exited while starting: {self._exit_reason(rec, rec.jobmanager)}"
                )
            for t in rec.taskmanagers:
                if not self._alive(t.pid, rec.marker) and not self._execing(t.pid):
                    raise RuntimeProvisionError(
                        f"app {rec.app}: {t.name} exited while starting: {self._exit_reason(rec, t)}"
                    )
            try:
                ov = client.overview()
            except FlinkRestError as e:
                last = f"JobManager REST not answering yet ({e.cause})"
            else:
                if _is_ready(ov, rec.replicas, rec.slots):
                    return
                last = _ready_gap(ov, rec.replicas, rec.slots)
            if self.clock.monotonic() >= deadline:
                logs = self._log_reason(rec, [rec.jobmanager, *rec.taskmanagers])
                raise DeadlineExceededError(
                    f"app {rec.app}: cluster not ready by the deadline: {last}"
                    + (f"; logs: {logs}" if logs else "")
                )
            self.clock.sleep(self.poll_s)

    # -- JVMs --------------------------------------------------------------------------------------------

    def _memory_flags(self, conf_dir: Path, config_hash: str, deadline: float) -> tuple[MemoryFlags, MemoryFlags]:
        """BashJavaUtils' answer for this config, cached by config hash (a JVM start each saved)."""
        cache = self.state_dir / "cache" / f"memory-{config_hash}.json"
        try:
            doc = json.loads(cache.read_text())
            return (MemoryFlags(tuple(doc["jm"]["jvm"]), tuple(doc["jm"]["dynamic"])),
                    MemoryFlags(tuple(doc["tm"]["jvm"]), tuple(doc["tm"]["dynamic"])))
        except (OSError, ValueError, KeyError):
            pass
        base = [self.java, *FAST_START_FLAGS, "-Xmx128m", "-cp",
                os.pathsep.join([str(self.dist.utils_jar), self.dist.dist_jar.as_posix()]), BASH_UTILS]
        procs = {
            role: subprocess.Popen(
                [*base, cmd, "--configDir", str(conf_dir)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
            for role, cmd in (("jm", "GET_JM_RESOURCE_PARAMS"), ("tm", "GET_TM_RESOURCE_PARAMS"))
        }
        result: dict[str, MemoryFlags] = {}
        for role, proc in procs.items():
            timeout = max(5.0, deadline - self.clock.monotonic())
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for p in procs.values():
                    p.kill()
                    p.wait()
                raise DeadlineExceededError(f"BashJavaUtils did not answer within {timeout:.0f} s") from None
            text = out.decode(errors="replace")
            lines = [ln.removeprefix("BASH_JAVA_UTILS_EXEC_RESULT:") for ln in text.splitlines()
                     if ln.startswith("BASH_JAVA_UTILS_EXEC_RESULT:")]
            if proc.returncode != 0 or len(lines) < 2:
                reason = extract_log_reason([text]) or text.strip()[-800:]
                raise RuntimeProvisionError(
                    f"Flink rejected the {'JobManager' if role == 'jm' else 'TaskManager'} memory "
                    f"configuration in {conf_dir / 'config.yaml'}: {reason}"
                )
            result[role] = MemoryFlags(tuple(lines[-2].split()), tuple(lines[-1].split()))
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({k: {"jvm": v.jvm, "dynamic": v.dynamic} for k, v in result.items()}))
        return result["jm"], result["tm"]

    def _spawn(
        self, rec: ClusterRecord, role: str, index: int, mem: MemoryFlags, user_conf: dict[str, str]
    ) -> ProcRecord:
        p = self._paths(rec)
        proc = ProcRecord(role=role, index=index, pid=0, started_at=self.clock.now())
        extra = shlex.split(user_conf.get("env.java.opts.all", ""))
        extra += shlex.split(user_conf.get(f"env.java.opts.{role}", ""))
        cmd = [
            self.java, *mem.jvm, *self.dist.java_opts_all, *fast_start_flags(extra), *extra, rec.marker,
            f"-Dlog.file={p.log / (proc.name + '.log')}",
            f"-Dlog4j.configurationFile=file:{p.conf / 'log4j.properties'}",
            "-Dlog4j2.formatMsgNoLookups=true",
            "-classpath", self.dist.classpath,
        ]
        if role == "jobmanager":
            cmd += [JM_ENTRY, "--configDir", str(p.conf), "--executionMode", "cluster", *mem.dynamic]
        else:
            cmd += [TM_ENTRY, "--configDir", str(p.conf), *mem.dynamic,
                    "-D", f"taskmanager.resource-id={_resource_id(rec, index)}"]
        env = {**flink_environment(os.environ), "FLINK_HOME": str(self.dist.home), "FLINK_CONF_DIR": str(p.conf),
               "FLINK_LIB_DIR": str(self.dist.home / "lib"), "FLINK_PLUGINS_DIR": str(self.dist.home / "plugins"),
               "FLINK_OPT_DIR": str(self.dist.home / "opt"), "FLINK_LOG_DIR": str(p.log)}
        out: IO[bytes]
        with open(p.log / f"{proc.name}.out", "ab") as out:
            try:
                child = subprocess.Popen(
                    cmd, cwd=p.work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,  # the JVMs outlive `apply` and ignore its Ctrl-C
                )
            except OSError as e:
                raise RuntimeProvisionError(f"cannot start {self.java} for app {rec.app}: {e}") from e
        self._children[child.pid] = child
        return proc.model_copy(update={"pid": child.pid})

    def _alive(self, pid: int, marker: str) -> bool:
        """Alive and ours: the PID's command line carries this cluster's marker (PIDs get reused)."""
        if pid <= 0:
            return False
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            return False
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return marker.encode() in args  # a zombie's cmdline is empty

    def _execing(self, pid: int) -> bool:
        """A child we just spawned that has not exec'ed yet: its command line carries the cluster's marker only
        after exec, which on a loaded machine is a while after the fork (a restarted TaskManager looked "gone while
        starting" in a soak). It is ours and has not exited."""
        child = self._children.get(pid)
        if child is None or child.poll() is not None:
            return False
        try:
            first = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            return False
        return bool(first) and self.java.encode() not in first  # empty: a zombie (killed, not reaped yet)

    def _stop_procs(self, rec: ClusterRecord, procs: list[ProcRecord], deadline: float) -> None:
        """SIGTERM, then SIGKILL after the grace period (or at the deadline). Only our own PIDs."""
        live = [p for p in procs if self._alive(p.pid, rec.marker)]
        # TaskManagers first would make the JobManager log lost-TM noise; all at once is faster and fine.
        for p in live:
            _signal(p.pid, signal.SIGTERM)
        grace_end = min(self.clock.monotonic() + self.stop_grace_s, deadline)
        while live and self.clock.monotonic() < grace_end:
            self.clock.sleep(self.poll_s)
            live = [p for p in live if self._alive(p.pid, rec.marker)]
        for p in live:
            if self._alive(p.pid, rec.marker):
                _signal(p.pid, signal.SIGKILL)
        kill_end = self.clock.monotonic() + 10.0
        while live and self.clock.monotonic() < kill_end:
            live = [p for p in live if self._alive(p.pid, rec.marker)]
            if live:
                self.clock.sleep(self.poll_s)
        for p in procs:
            child = self._children.pop(p.pid, None)
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=1.0)
        if live:
            raise RuntimeProvisionError(
                f"app {rec.app}: {', '.join(p.name for p in live)} still running after SIGKILL"
            )
        if self.clock.monotonic() > deadline and procs:
            raise DeadlineExceededError(f"app {rec.app}: stopping {len(procs)} JVM(s) ran past the deadline")

    # -- reasons ---------------------------------------------------------------------------------------

    def _exit_reason(self, rec: ClusterRecord, proc: ProcRecord) -> str:
        child = self._children.get(proc.pid)
        code = child.poll() if child is not None else None
        head = f"pid {proc.pid} exited with code {code}" if code is not None else f"pid {proc.pid} is gone"
        log = self._paths(rec).log
        # A JVM that dies before log4j starts (bad flag, no memory) only speaks on stdout/stderr.
        out_tail = [ln.strip() for ln in _tail(log / f"{proc.name}.out", 4096).splitlines() if ln.strip()][-3:]
        logs = " | ".join(filter(None, [self._log_reason(rec, [proc], outs=False), *out_tail]))
        return head + (f": {logs}" if logs else f" (see {log / (proc.name + '.log')})")

    def _log_reason(self, rec: ClusterRecord, procs: list[ProcRecord], *, outs: bool = True) -> str | None:
        log = self._paths(rec).log
        exts = (".out", ".log") if outs else (".log",)
        texts = [_tail(log / f"{p.name}{ext}") for p in procs for ext in exts]
        return extract_log_reason([t for t in texts if t])

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


def _is_ready(ov: ClusterOverview, replicas: int, slots: int) -> bool:
    # Slots register after the TaskManager itself; a running job may hold every slot, so count totals.
    return ov.taskmanagers >= replicas and ov.slots_total >= replicas * slots


def _ready_gap(ov: ClusterOverview, replicas: int, slots: int) -> str:
    return (f"{ov.taskmanagers}/{replicas} TaskManagers registered, "
            f"{ov.slots_total}/{replicas * slots} slots")


def _resource_id(rec: ClusterRecord, index: int) -> str:
    return f"{rec.app}-taskmanager-{index}"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((LOOPBACK, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _tail(path: Path, size: int = 64 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
