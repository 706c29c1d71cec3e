"""The warm standby of the local runtime: a second cluster at the new spec, started before the old job stops.

A standby is a cluster of its own generation (generation-suffixed directories, its own ports) recorded in
the app's `standby` slot beside the live `cluster` one; a promotion or a discard is two atomic renames of
those records, and `_tidy` settles a crash between them. Before the old job stops, the standby runs a
warm-up job (WARMUP_JAVA in config.py), so the submit after the stop meets JVMs that have run one.

`LocalStandby` is a mixin of `LocalRuntime` (local.py), the one class it is meant for: together they
implement `reconciler.live.ports.StandbyRuntime`; it uses the runtime's records, lock and JVMs, declared
below for the type checker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import uuid
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.clock import Clock
from reconciler.core.observed import ClusterPhase
from reconciler.core.plan import spec_hash
from reconciler.errors import JobNotFoundError, ObserveError, PermanentStepError, ReconcilerError
from reconciler.live.flink import FlinkRestClient, FlinkRestError
from reconciler.live.local.config import (
    WARMUP_JAVA,
    WARMUP_MAIN,
    ClusterPaths,
    ClusterRecord,
    FlinkDist,
    cluster_config_hash,
    warmup_jar_name,
)
from reconciler.live.ports import ClusterInfo
from reconciler.spec.model import FlinkApp

log = logging.getLogger(__name__)

TERMINAL_STATES = frozenset({"FINISHED", "FAILED", "CANCELED"})
SAVEPOINT_DIR = "execution.checkpointing.savepoint-dir"


class LocalStandby:
    """The warm standby half of `LocalRuntime`'s `StandbyRuntime`: start (and warm up), promote, discard, retire."""

    if TYPE_CHECKING:  # LocalRuntime's (and JvmProcesses'), which this is mixed into
        state_dir: Path
        clock: Clock
        java: str
        poll_s: float

        @property
        def dist(self) -> FlinkDist: ...
        def paths(self, app: str, generation: str = "") -> ClusterPaths: ...
        def _paths(self, rec: ClusterRecord) -> ClusterPaths: ...
        def read_record(self, app: str, slot: str = "cluster") -> ClusterRecord | None: ...
        def _write_record(self, rec: ClusterRecord, slot: str = "cluster") -> None: ...
        def cluster_records(self, app: str) -> dict[str, ClusterRecord]: ...
        def _unreadable(self, app: str, slot: str, e: ObserveError) -> str: ...
        def _remove(self, app: str, slot: str, deadline: float) -> None: ...
        def _upload(self, rec: ClusterRecord, slot: str, client: FlinkRestClient, jar: Path,
                    *, again: bool = False) -> tuple[ClusterRecord, str]: ...
        def _client(self, url: str, *, timeout: float = 10.0) -> FlinkRestClient: ...
        def _lock(self, app: str, deadline: float) -> contextlib.AbstractContextManager[None]: ...
        def _start(self, app: FlinkApp, config_hash: str, deadline: float, *, generation: str = "",
                   slot: str = "cluster") -> ClusterRecord: ...
        def _await_ready(self, rec: ClusterRecord, deadline: float) -> None: ...
        def _alive(self, pid: int, marker: str) -> bool: ...

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
