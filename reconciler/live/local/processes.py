"""The JVMs of a local cluster: start a JobManager and N TaskManagers, scale, wait for them, stop them.

`JvmProcesses` is a mixin of `LocalRuntime` (local.py), the one class it is meant for; it uses the runtime's
paths, records and REST clients, declared below for the type checker. Signals only ever go to PIDs whose
/proc/<pid>/cmdline carries the cluster's marker, so a reused PID is never killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING

from reconciler.clock import Clock
from reconciler.errors import DeadlineExceededError, ObserveError, RuntimeProvisionError
from reconciler.live.flink import FlinkRestClient, FlinkRestError
from reconciler.live.local.config import (
    BASH_UTILS,
    FAST_START_FLAGS,
    JM_ENTRY,
    LOG4J_PROPERTIES,
    LOOPBACK,
    SLOTS,
    TM_ENTRY,
    ClusterPaths,
    ClusterRecord,
    FlinkDist,
    MemoryFlags,
    ProcRecord,
    extract_log_reason,
    fast_start_flags,
    flink_environment,
    render_config,
    render_yaml,
)
from reconciler.live.ports import ClusterOverview
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import SESSION_LABEL


class JvmProcesses:
    """The processes half of `LocalRuntime`: start, scale, await, stop; why a JVM exited."""

    if TYPE_CHECKING:  # LocalRuntime's, which this is mixed into
        state_dir: Path
        clock: Clock
        java: str
        stop_grace_s: float
        poll_s: float
        _children: dict[int, subprocess.Popen[bytes]]

        @property
        def dist(self) -> FlinkDist: ...
        def paths(self, app: str, generation: str = "") -> ClusterPaths: ...
        def _paths(self, rec: ClusterRecord) -> ClusterPaths: ...
        def _write_record(self, rec: ClusterRecord, slot: str = "cluster") -> None: ...
        def _client(self, url: str, *, timeout: float = 10.0) -> FlinkRestClient: ...
        def read_record(self, app: str, slot: str = "cluster") -> ClusterRecord | None: ...
        def _remove(self, app: str, slot: str, deadline: float) -> None: ...

    def _start(self, app: FlinkApp, config_hash: str, deadline: float, *, generation: str = "",
               slot: str = "cluster") -> ClusterRecord:
        # A cluster of another slot in the same directories (the retired cold cluster of a warm upgrade that was
        # interrupted, when the live one is now started cold): it goes first, JVMs and files, or removing it later
        # would delete this cluster's configuration under its running JVMs.
        for other in SLOTS:
            with contextlib.suppress(ObserveError):  # unreadable: left alone, as everywhere
                old = self.read_record(app.name, other) if other != slot else None
                if old is not None and old.generation == generation:
                    self._remove(app.name, other, deadline)
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
                if cluster_ready(ov, rec.replicas, rec.slots):
                    return
                last = ready_gap(ov, rec.replicas, rec.slots)
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
        # Only options the entry point parses. Flink 2.3's parser (ClusterEntrypoint's and TaskManagerRunner's
        # CommandLineParser: commons-cli with stopAtNonOption, knowing only --configDir and -D) stops at the first
        # argument it does not know and ignores the rest: Flink 1.x's `--executionMode cluster` is no option any
        # more, and the JobManager's memory -D flags after it were dropped (found by the Flink image first).
        if role == "jobmanager":
            cmd += [JM_ENTRY, "--configDir", str(p.conf), *mem.dynamic]
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


def cluster_ready(ov: ClusterOverview, replicas: int, slots: int) -> bool:
    # Slots register after the TaskManager itself; a running job may hold every slot, so count totals.
    return ov.taskmanagers >= replicas and ov.slots_total >= replicas * slots


def ready_gap(ov: ClusterOverview, replicas: int, slots: int) -> str:
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
