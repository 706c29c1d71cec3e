"""An in-memory Flink for executor tests: a faithful double of our own ports (`Runtime`, `FlinkApi`).

Time-driven by the injected FakeClock, it follows Flink's REST API as documented and as Flink 2.3 behaves:
a submitted job reports RUNNING before its tasks run; a stop-with-savepoint returns
a trigger id at once, its status is IN_PROGRESS and then COMPLETED with a location or a failure
cause; a savepoint asked for before every task runs fails with "Not all required tasks are currently
running"; stopping an unknown job is accepted and fails inside the operation; submitting a job id
that exists is refused and creates nothing; a bogus savepoint path is refused and leaves a FAILED
job behind; cancel of a terminal job is not an error (the REST client accepts the 409); retained
checkpoints survive a cancel.

Faults are scripted per call: `Fault("stop_with_savepoint", nth=1, error=Crash(), when="after")`
raises after the call took effect (the process "died" before it saw the answer).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Any, Literal, TypeVar

from reconciler.clock import FakeClock
from reconciler.core.observed import Checkpoint, ClusterPhase
from reconciler.core.plan import spec_hash
from reconciler.errors import (
    DeadlineExceededError,
    JobNotFoundError,
    ObserveError,
    PermanentStepError,
    RuntimeProvisionError,
    TriggerNotFoundError,
)
from reconciler.live.ports import CheckpointStats, ClusterInfo, ClusterOverview, JobSummary, SavepointStatus
from reconciler.spec.model import FlinkApp

T = TypeVar("T")
TERMINAL = frozenset({"FINISHED", "CANCELED", "FAILED"})


class Crash(BaseException):
    """The process died here. Not an Exception: nothing in the executor may catch it."""


class Behaviour(Enum):
    HEALTHY = "healthy"
    FAILS_AFTER_START = "fails-after-start"  # tasks deploy, then the job FAILS (bad code)
    RESTART_LOOP = "restart-loop"  # RESTARTING forever (never all tasks running)
    NO_CHECKPOINTS = "no-checkpoints"  # runs, but no checkpoint ever completes
    BAD_ENTRY_CLASS = "bad-entry-class"  # POST /jars/run answers 500 ClassNotFoundException


@dataclass
class Fault:
    method: str
    error: BaseException
    nth: int = 1  # the nth call of `method` (1-based, counted over the whole runtime)
    when: Literal["before", "after"] = "before"


@dataclass
class FakeJob:
    job_id: str
    app: str
    parallelism: int
    behaviour: Behaviour
    submitted_at: float
    restored_from: str | None
    checkpoint_interval: float | None
    state: str = "RUNNING"
    tasks_running: int = 0
    running_since: float | None = None
    cancel_at: float | None = None
    ended_at: float | None = None
    exceptions: list[str] = field(default_factory=list)
    checkpoints: list[tuple[int, str, float]] = field(default_factory=list)  # (id, path, completed at)


@dataclass
class SavepointOp:
    job_id: str
    stop: bool
    done_at: float
    failure: str | None = None
    location: str | None = None
    resolved: bool = False


class FakeFlink:
    """One JobManager's REST API (`FlinkApi`)."""

    def __init__(self, runtime: FakeRuntime, app: str) -> None:
        self.rt = runtime
        self.app = app
        self.jobs_by_id: dict[str, FakeJob] = {}
        self.ops: dict[str, SavepointOp] = {}
        self.jars: dict[str, str] = {}

    # -- time ----------------------------------------------------------------------------------------

    def _tick(self) -> None:
        now = self.rt.clock.monotonic()
        for job in self.jobs_by_id.values():
            self._advance(job, now)
        for op in self.ops.values():
            if not op.resolved and now >= op.done_at:
                self._resolve(op, now)

    def _advance(self, job: FakeJob, now: float) -> None:
        rt = self.rt
        if job.state in TERMINAL:
            return
        if job.cancel_at is not None:
            job.state = "CANCELLING"
            if now >= job.cancel_at + rt.cancel_s:
                self._checkpoints_until(job, job.cancel_at)
                job.state, job.tasks_running, job.ended_at = "CANCELED", 0, now
            return
        deployed = job.submitted_at + rt.task_deploy_s
        if now < deployed:
            return
        match job.behaviour:
            case Behaviour.HEALTHY | Behaviour.NO_CHECKPOINTS:
                job.tasks_running = job.parallelism
                job.running_since = deployed
                self._checkpoints_until(job, now)
            case Behaviour.FAILS_AFTER_START:
                job.state, job.tasks_running, job.ended_at = "FAILED", 0, now
                if not job.exceptions:
                    job.exceptions.append("java.lang.IllegalStateException: counter state is corrupt (task Counter)")
            case Behaviour.RESTART_LOOP:
                job.state, job.tasks_running = "RESTARTING", 0
                if not job.exceptions:
                    job.exceptions.append("java.lang.NullPointerException: boom (task Source)")
            case Behaviour.BAD_ENTRY_CLASS:  # never created
                raise AssertionError("a rejected submit has no job")

    def _checkpoints_until(self, job: FakeJob, now: float) -> None:
        if job.checkpoint_interval is None or job.running_since is None or job.behaviour is Behaviour.NO_CHECKPOINTS:
            return
        k = len(job.checkpoints) + 1
        while job.running_since + k * job.checkpoint_interval <= now:
            at = job.running_since + k * job.checkpoint_interval
            job.checkpoints.append((k, f"file:{self.rt.checkpoint_dir}/{job.job_id}/chk-{k}", at))
            k += 1

    def _resolve(self, op: SavepointOp, now: float) -> None:
        op.resolved = True
        job = self.jobs_by_id.get(op.job_id)
        if job is None:
            op.failure = ("org.apache.flink.runtime.messages.FlinkJobNotFoundException: "
                          f"Could not find Flink job ({op.job_id})")
            return
        if job.state in TERMINAL or job.state == "CANCELLING":
            op.failure = f"java.lang.IllegalStateException: Job {op.job_id} is not running ({job.state})"
            return
        if self.rt.savepoint_failures:
            op.failure, after = self.rt.savepoint_failures.pop(0)
            if after is not None:
                job.state, job.tasks_running, job.ended_at = after, 0, now
            return
        if self.rt.savepoint_failure is not None:
            op.failure = self.rt.savepoint_failure
            return
        op.location = f"file:{self.rt.savepoint_dir}/savepoint-{op.job_id[:6]}-{next(self.rt.ids):012x}"
        if self.rt.create_savepoint_dirs:
            Path(op.location.removeprefix("file:")).mkdir(parents=True)
        self.rt.savepoints_taken.append(op.location)
        if op.stop:
            self._checkpoints_until(job, now)
            job.state, job.tasks_running, job.ended_at = "FINISHED", 0, now

    def _job(self, job_id: str) -> FakeJob:
        job = self.jobs_by_id.get(job_id)
        if job is None:
            raise JobNotFoundError(f"Flink does not know job {job_id} (404)")
        return job

    def _summary(self, job: FakeJob) -> JobSummary:
        started_ms = int(self.rt.wall(job.submitted_at).timestamp() * 1000)
        return JobSummary(job_id=job.job_id, name=job.app, state=job.state, tasks_running=job.tasks_running,
                          tasks_total=job.parallelism, start_time_ms=started_ms)

    # -- FlinkApi ------------------------------------------------------------------------------------

    def overview(self) -> ClusterOverview:
        return self.rt.call("overview", lambda: ClusterOverview(1, 4, 4, "2.3.0"))

    def jobs(self) -> list[JobSummary]:
        def go() -> list[JobSummary]:
            self._tick()
            return [self._summary(j) for j in self.jobs_by_id.values()]
        return self.rt.call("jobs", go)

    def job(self, job_id: str) -> JobSummary:
        def go() -> JobSummary:
            self._tick()
            return self._summary(self._job(job_id))
        return self.rt.call("job", go)

    def trigger_savepoint(self, job_id: str, *, cancel_job: bool = False, trigger_id: str | None = None) -> str:
        return self.rt.call("trigger_savepoint", lambda: self._trigger(job_id, stop=cancel_job, trigger_id=trigger_id))

    def stop_with_savepoint(self, job_id: str, *, drain: bool = False, trigger_id: str | None = None) -> str:
        return self.rt.call("stop_with_savepoint", lambda: self._trigger(job_id, stop=True, trigger_id=trigger_id))

    def _trigger(self, job_id: str, *, stop: bool, trigger_id: str | None = None) -> str:
        self._tick()
        now = self.rt.clock.monotonic()
        if trigger_id is not None and trigger_id in self.ops:
            return trigger_id  # Flink deduplicates a caller-chosen trigger id (FLINK-24208)
        trigger = trigger_id or f"trigger-{next(self.rt.ids)}"
        self.rt.stop_triggers.append((job_id, trigger))
        op = SavepointOp(job_id=job_id, stop=stop, done_at=now + self.rt.savepoint_s)
        job = self.jobs_by_id.get(job_id)
        if job is not None and job.state == "RUNNING" and job.tasks_running < job.parallelism:
            op.resolved = True
            op.failure = ("org.apache.flink.runtime.checkpoint.CheckpointException: Not all required tasks are "
                          "currently running.")
        self.ops[trigger] = op
        return trigger

    def savepoint_status(self, job_id: str, trigger_id: str) -> SavepointStatus:
        def go() -> SavepointStatus:
            self._tick()
            op = self.ops.get(trigger_id)
            if op is None or op.job_id != job_id:
                raise TriggerNotFoundError(f"There is no savepoint operation with triggerId={trigger_id} (404)")
            if not op.resolved:
                return SavepointStatus(done=False)
            return SavepointStatus(done=True, location=op.location, failure=op.failure)
        return self.rt.call("savepoint_status", go)

    def cancel(self, job_id: str) -> None:
        def go() -> None:
            self._tick()
            job = self._job(job_id)
            if job.state in TERMINAL or job.cancel_at is not None:
                return  # 409 on a terminal job: the REST client treats it as done
            job.cancel_at = self.rt.clock.monotonic()
            job.state = "CANCELLING"
            self.rt.cancels.append(job_id)
        self.rt.call("cancel", go)

    def checkpoints(self, job_id: str) -> CheckpointStats:
        def go() -> CheckpointStats:
            self._tick()
            job = self._job(job_id)
            last = job.checkpoints[-1] if job.checkpoints else None
            return CheckpointStats(
                completed_count=len(job.checkpoints),
                latest_completed_id=last[0] if last else None,
                latest_completed_path=last[1] if last else None,
                latest_completed_at=self.rt.wall(last[2]) if last else None,
                restored_path=job.restored_from,
                restored_is_savepoint=None if job.restored_from is None else "savepoint-" in job.restored_from,
            )
        return self.rt.call("checkpoints", go)

    def upload_jar(self, path: Path) -> str:
        def go() -> str:
            jar_id = f"{next(self.rt.ids):08x}_{path.name}"
            self.jars[jar_id] = str(path)
            return jar_id
        return self.rt.call("upload_jar", go)

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
        def go() -> str:
            self._tick()
            rt = self.rt
            if jar_id not in self.jars:
                raise PermanentStepError(f"Jar file {jar_id} does not exist (400)")
            if job_id in self.jobs_by_id:
                raise PermanentStepError(f"DuplicateJobSubmissionException: Job has already been submitted: {job_id}")
            behaviour = rt.behaviours.get(entry_class or "", Behaviour.HEALTHY)
            if behaviour is Behaviour.BAD_ENTRY_CLASS:
                raise PermanentStepError(f"ClassNotFoundException: {entry_class} (500)")
            job = FakeJob(
                job_id=job_id, app=self.app, parallelism=parallelism or 1, behaviour=behaviour,
                submitted_at=rt.clock.monotonic(), restored_from=savepoint_path,
                checkpoint_interval=rt.interval_of.get(self.app),
            )
            if savepoint_path is not None and savepoint_path not in rt.known_paths():
                job.state, job.ended_at = "FAILED", rt.clock.monotonic()
                job.exceptions.append(f"java.io.FileNotFoundException: Cannot find checkpoint or savepoint "
                                      f"file/directory '{savepoint_path}'")
                self.jobs_by_id[job_id] = job
                raise PermanentStepError(f"FileNotFoundException: {savepoint_path} (400)")
            self.jobs_by_id[job_id] = job
            rt.submits.append(job_id)
            return job_id
        return self.rt.call("run_jar", go)

    def exceptions(self, job_id: str) -> list[str]:
        def go() -> list[str]:
            self._tick()
            return list(self._job(job_id).exceptions)
        return self.rt.call("exceptions", go)


@dataclass
class FakeCluster:
    app: str
    ready_at: float
    spec_hash: str
    flink: FakeFlink
    generation: str = ""


class FakeRuntime:
    """`Runtime` over FakeFlink clusters, one per app, all timed by one FakeClock."""

    name = "fake"
    restarts_processes = False

    def __init__(
        self,
        clock: FakeClock,
        *,
        cluster_start_s: float = 3.0,
        task_deploy_s: float = 1.0,
        savepoint_s: float = 0.5,
        cancel_s: float = 0.3,
        savepoint_dir: str = "/fake/savepoints",
        checkpoint_dir: str = "/fake/checkpoints",
        create_savepoint_dirs: bool = False,
    ) -> None:
        self.clock = clock
        self.cluster_start_s = cluster_start_s
        self.task_deploy_s = task_deploy_s
        self.savepoint_s = savepoint_s
        self.cancel_s = cancel_s
        self.savepoint_dir = savepoint_dir
        self.checkpoint_dir = checkpoint_dir
        self.create_savepoint_dirs = create_savepoint_dirs
        self.clusters: dict[str, FakeCluster] = {}
        self.behaviours: dict[str, Behaviour] = {}  # entry class -> behaviour
        self.interval_of: dict[str, float | None] = {}  # app -> checkpoint interval (s) of its running spec
        self.savepoint_failure: str | None = None  # every savepoint fails with this cause
        # The next savepoints fail with these causes, one each; the job then ends in the given state (None: runs on).
        self.savepoint_failures: list[tuple[str, str | None]] = []
        self.provision_error: str | None = None
        self.extra_paths: set[str] = set()  # restore paths that exist besides those taken here
        self.faults: list[Fault] = []
        self.calls: list[str] = []
        self.counts: dict[str, int] = {}
        self.ids = itertools.count(1)
        self.stop_triggers: list[tuple[str, str]] = []
        self.submits: list[str] = []
        self.cancels: list[str] = []
        self.savepoints_taken: list[str] = []
        self.ensure_calls: list[tuple[str, str]] = []
        self.deletes: list[str] = []
        self._t0 = clock.now() - timedelta(seconds=clock.monotonic())

    # -- plumbing ------------------------------------------------------------------------------------

    def wall(self, monotonic: float) -> datetime:
        return self._t0 + timedelta(seconds=monotonic)

    def call(self, method: str, fn: Callable[[], T]) -> T:
        n = self.counts[method] = self.counts.get(method, 0) + 1
        self.calls.append(method)
        self._fault(method, n, "before")
        result = fn()
        self._fault(method, n, "after")
        return result

    def _fault(self, method: str, n: int, when: str) -> None:
        for f in self.faults:
            if f.method == method and f.nth == n and f.when == when:
                self.faults.remove(f)
                raise f.error

    def known_paths(self) -> set[str]:
        paths = set(self.savepoints_taken) | self.extra_paths
        for c in self.all_clusters():
            for j in c.flink.jobs_by_id.values():
                paths.update(p for _, p, _ in j.checkpoints)
        return paths

    def all_clusters(self) -> list[FakeCluster]:
        return list(self.clusters.values())

    def running_jobs(self, app: str) -> list[str]:
        cluster = self.clusters.get(app)
        if cluster is None:
            return []
        cluster.flink._tick()
        return [j.job_id for j in cluster.flink.jobs_by_id.values() if j.state not in TERMINAL]

    def seed_job(self, app: FlinkApp, job_id: str, *, entry_class_behaviour: Behaviour = Behaviour.HEALTHY) -> None:
        """A cluster with a job already running (the state before an upgrade), all tasks up."""
        now = self.clock.monotonic()
        flink = FakeFlink(self, app.name)
        self.clusters[app.name] = FakeCluster(app.name, now, spec_hash(app.canonical()), flink)
        self.interval_of[app.name] = _interval(app)
        flink.jobs_by_id[job_id] = FakeJob(
            job_id=job_id, app=app.name, parallelism=app.spec.job.parallelism, behaviour=entry_class_behaviour,
            submitted_at=now - self.task_deploy_s, restored_from=None, checkpoint_interval=_interval(app),
        )
        flink._tick()

    # -- Runtime -------------------------------------------------------------------------------------

    def list_clusters(self) -> dict[str, ClusterInfo]:
        return {a: self.observe(a) for a in self.clusters}

    def stored_snapshots(self, app: str) -> list[Checkpoint]:
        return []  # the fake keeps no storage apart from its jobs

    def observe(self, app: str) -> ClusterInfo:
        c = self.clusters.get(app)
        if c is None:
            return ClusterInfo(app=app, phase=ClusterPhase.ABSENT)
        phase = ClusterPhase.READY if self.clock.monotonic() >= c.ready_at else ClusterPhase.STARTING
        return ClusterInfo(app=app, phase=phase, rest_url=f"fake://{app}", spec_hash=c.spec_hash)

    def ensure_cluster(self, app: FlinkApp, *, deadline: float, keep_running: bool = False) -> ClusterInfo:
        def go() -> ClusterInfo:
            if self.provision_error:
                raise RuntimeProvisionError(self.provision_error)
            now = self.clock.monotonic()
            self.ensure_calls.append((app.name, spec_hash(app.canonical())))
            c = self.clusters.get(app.name)
            if c is None:
                c = self.clusters[app.name] = FakeCluster(app.name, now + self.cluster_start_s,
                                                          spec_hash(app.canonical()), FakeFlink(self, app.name))
            c.spec_hash = spec_hash(app.canonical())
            self.interval_of[app.name] = _interval(app)
            if c.ready_at > deadline:
                self.clock.sleep(max(0.0, deadline - now))
                raise DeadlineExceededError(f"cluster {app.name} not ready by its deadline (no TaskManager)")
            self.clock.sleep(max(0.0, c.ready_at - now))
            return self.observe(app.name)
        return self.call("ensure_cluster", go)

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
        def go() -> str:
            c = self.clusters.get(app.name)
            if c is None or self.clock.monotonic() < c.ready_at:
                raise RuntimeProvisionError(f"no ready cluster for {app.name}")
            if any(j.job_id == job_id for j in c.flink.jobs()):
                return job_id  # idempotent on the job id, like every runtime
            self.interval_of[app.name] = _interval(app)
            jar_id = c.flink.upload_jar(jar or Path("image.jar"))
            job = app.spec.job
            return c.flink.run_jar(jar_id, job_id=job_id, entry_class=job.entry_class, args=job.args,
                                   parallelism=job.parallelism, savepoint_path=restore_path,
                                   allow_non_restored_state=allow_non_restored_state)
        return self.call("start_job", go)

    def delete_cluster(self, app: str, *, deadline: float) -> None:
        def go() -> None:
            self.deletes.append(app)
            self.clusters.pop(app, None)
        self.call("delete_cluster", go)

    def flink(self, app: str) -> FakeFlink:
        c = self.clusters.get(app)
        if c is None:
            raise ObserveError(f"app {app} has no cluster")
        return c.flink


def _interval(app: FlinkApp) -> float | None:
    raw = app.spec.flink_configuration.get("execution.checkpointing.interval")
    if raw is None:
        return None
    raw = raw.strip()
    return float(raw[:-1]) if raw.endswith("s") else float(raw) / 1000.0


def make_app(
    name: str = "orders",
    *,
    entry_class: str | None = None,
    parallelism: int = 1,
    checkpointing: str | None = "1s",
    retain: int = 5,
    upgrade_mode: str = "savepoint",
) -> FlinkApp:
    conf = {"execution.checkpointing.interval": checkpointing} if checkpointing else {}
    job: dict[str, object] = {"jarURI": "jobs/counter.jar", "parallelism": parallelism, "upgradeMode": upgrade_mode}
    if entry_class:
        job["entryClass"] = entry_class
    return FlinkApp.model_validate({
        "apiVersion": "flink-reconciler.io/v1alpha1",
        "kind": "FlinkApp",
        "metadata": {"name": name},
        "spec": {"flinkConfiguration": conf, "job": job, "savepoints": {"retain": retain},
                 "taskManager": {"slots": 4}},
    })


class FakeStandbyRuntime(FakeRuntime):
    """A FakeRuntime that is also a `StandbyRuntime`: a second cluster per app (warm standby) beside the
    live one, promoted and discarded like the local runtime's (the old cluster kept, retired, until it is
    deleted). `standby_error` makes every standby fail to start (a config Flink rejects)."""

    def __init__(self, clock: FakeClock, **kw: Any) -> None:
        super().__init__(clock, **kw)
        self.standbys: dict[str, FakeCluster] = {}
        self.retired: dict[str, FakeCluster] = {}
        self.standby_error: str | None = None
        self.standby_starts: list[str] = []  # generations whose cluster was started (not found)

    def all_clusters(self) -> list[FakeCluster]:
        return [*self.clusters.values(), *self.standbys.values(), *self.retired.values()]

    def observe(self, app: str) -> ClusterInfo:
        info = super().observe(app)
        if info.phase is ClusterPhase.ABSENT:
            return info
        sb = self.standbys.get(app)
        return dataclasses.replace(info, standby_generation=sb.generation if sb else None,
                                   retired_cluster=app in self.retired)

    def clusters_of(self, app: str) -> list[FakeCluster]:
        """Every cluster of the app that exists (its JVMs), whatever slot it is in."""
        return [c for slot in (self.clusters, self.standbys, self.retired) if (c := slot.get(app)) is not None]

    def start_standby(self, app: FlinkApp, *, generation: str, deadline: float, jar: Path | None = None
                      ) -> ClusterInfo:
        def go() -> ClusterInfo:
            now = self.clock.monotonic()
            live = self.clusters.get(app.name)
            if live is not None and live.generation == generation:
                return self.observe(app.name)
            sb = self.standbys.get(app.name)
            if sb is not None and sb.generation != generation:
                self.deletes.append(f"{app.name}@{sb.generation}")
                del self.standbys[app.name]
                sb = None
            if sb is None:
                if self.standby_error:
                    raise RuntimeProvisionError(self.standby_error)
                sb = self.standbys[app.name] = FakeCluster(app.name, now + self.cluster_start_s,
                                                           spec_hash(app.canonical()), FakeFlink(self, app.name),
                                                           generation)
                self.standby_starts.append(generation)
            if sb.ready_at > deadline:
                self.clock.sleep(max(0.0, deadline - now))
                raise DeadlineExceededError(f"standby {generation} of {app.name} not ready by its deadline")
            self.clock.sleep(max(0.0, sb.ready_at - now))
            return ClusterInfo(app=app.name, phase=ClusterPhase.READY, rest_url=f"fake://{app.name}@{generation}",
                               spec_hash=sb.spec_hash)
        return self.call("start_standby", go)

    def promote_standby(self, app: str, *, generation: str, deadline: float) -> None:
        def go() -> None:
            live = self.clusters.get(app)
            if live is not None and live.generation == generation:
                return
            sb = self.standbys.get(app)
            if sb is None or sb.generation != generation:
                raise PermanentStepError(f"standby {generation} of {app} is gone")
            if live is not None:
                self.retired[app] = live
            self.clusters[app] = self.standbys.pop(app)
        self.call("promote_standby", go)

    def discard_standby(self, app: str, *, generation: str, deadline: float) -> None:
        def go() -> None:
            live = self.clusters.get(app)
            if live is not None and live.generation == generation:
                if app not in self.retired:
                    raise PermanentStepError(f"{app}: {generation} is live and the old cluster is gone")
                self.standbys[app] = live
                self.clusters[app] = self.retired.pop(app)
            sb = self.standbys.get(app)
            if sb is not None and sb.generation == generation:
                self.deletes.append(f"{app}@{generation}")
                del self.standbys[app]
        self.call("discard_standby", go)

    def delete_retired(self, app: str, *, deadline: float) -> None:
        def go() -> None:
            if self.retired.pop(app, None) is not None:
                self.deletes.append(f"{app}@retired")
        self.call("delete_retired", go)

    def delete_cluster(self, app: str, *, deadline: float) -> None:
        self.standbys.pop(app, None)
        self.retired.pop(app, None)
        super().delete_cluster(app, deadline=deadline)
