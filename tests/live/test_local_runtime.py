"""LocalRuntime with real Flink JVMs: start in another process, rediscover, scale, restart, delete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.core.observed import ClusterPhase, JobPhase, job_phase
from reconciler.errors import DeadlineExceededError, JobManagerGoneError, PermanentStepError, RuntimeProvisionError
from reconciler.live.local.config import JM_ENTRY, TM_ENTRY, ClusterRecord, ProcRecord, cluster_config_hash
from reconciler.live.local.runtime import LocalRuntime
from reconciler.spec.model import FlinkApp
from tests.fixtures.flink import REPO_ROOT, counter_app, counter_output_dir, read_counts, teardown_runtime, wait_until

pytestmark = pytest.mark.flink

APP = "lr"
JOB = "1" * 32


def java_pids(marker: str) -> set[int]:
    """Every process on the machine whose command line carries this cluster's marker."""
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes().split(b"\0"):
                    found.add(int(d.name))
            except OSError:
                continue
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def await_running(rt: LocalRuntime, app: str, job_id: str) -> None:
    def probe() -> bool:
        j = rt.flink(app).job(job_id)
        return job_phase(j.state, j.tasks_running, j.tasks_total) is JobPhase.RUNNING

    wait_until(probe, timeout=60, what=f"{job_id} RUNNING")


class Env:
    def __init__(self, rt: LocalRuntime, app: FlinkApp, jar: Path) -> None:
        self.rt = rt
        self.app = app
        self.jar = jar

    def deadline(self, s: float = 120) -> float:
        return self.rt.clock.monotonic() + s

    def record(self) -> ClusterRecord:
        rec = self.rt.read_record(APP)
        assert rec is not None
        return rec


@pytest.fixture(scope="module")
def env(
    local_runtime_factory: Callable[[Path], LocalRuntime], counter_jar: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Env]:
    state = tmp_path_factory.mktemp("local-state")
    app = counter_app(APP, jar_uri=str(counter_jar), rate=40)
    # Start the cluster and the job from another Python process that then exits, as `apply` does.
    spec = state.parent / "lr-app.json"
    spec.write_text(app.model_dump_json(by_alias=True))
    script = textwrap.dedent(f"""
        from pathlib import Path
        from reconciler.clock import SystemClock
        from reconciler.live.local.runtime import LocalRuntime
        from reconciler.spec.model import FlinkApp
        app = FlinkApp.model_validate_json(Path({str(spec)!r}).read_text())
        rt = LocalRuntime(Path({str(state)!r}), clock=SystemClock())
        rt.start_job(app, job_id={JOB!r}, jar=Path({str(counter_jar)!r}), restore_path=None,
                     allow_non_restored_state=False, deadline=rt.clock.monotonic() + 120)
        print("started")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=180, check=False)
    rt = local_runtime_factory(state)
    try:
        assert proc.returncode == 0 and "started" in proc.stdout, proc.stderr[-3000:]
        yield Env(rt, app, counter_jar)
    finally:
        teardown_runtime(rt)


def test_cluster_outlives_its_starter_and_is_rediscovered(env: Env) -> None:
    rec = env.record()
    assert java_pids(rec.marker) == {rec.jobmanager.pid, *(t.pid for t in rec.taskmanagers)}
    clusters = env.rt.list_clusters()
    assert set(clusters) == {APP}
    assert clusters[APP].phase is ClusterPhase.READY and clusters[APP].rest_url == rec.rest_url
    await_running(env.rt, APP, JOB)
    # ensure_cluster on the rediscovered cluster reuses it: no new JVM, same ports.
    info = env.rt.ensure_cluster(env.app, deadline=env.deadline())
    assert info.phase is ClusterPhase.READY and info.rest_url == rec.rest_url
    assert env.record().jobmanager == rec.jobmanager and env.record().taskmanagers == rec.taskmanagers
    assert java_pids(rec.marker) == {rec.jobmanager.pid, *(t.pid for t in rec.taskmanagers)}
    # The relative --output-dir lands in the cluster's work dir.
    out = counter_output_dir(env.rt, APP)
    wait_until(lambda: len(read_counts(out)) == 4, timeout=30, what="counter output")


def entry_point_flags(pid: int, main_class: str) -> dict[str, str]:
    """The `-D key=value` arguments a running JVM's entry point got (after its main class, not the JVM's own)."""
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    args = argv[argv.index(main_class) + 1:]
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-D")


# TaskManager memory keys (as BashJavaUtils passes them) and the figure GET /taskmanagers/<id> reports for each.
TM_MEMORY = {"taskmanager.memory.framework.heap.size": "frameworkHeap", "taskmanager.memory.task.heap.size": "taskHeap",
             "taskmanager.memory.framework.off-heap.size": "frameworkOffHeap",
             "taskmanager.memory.task.off-heap.size": "taskOffHeap", "taskmanager.memory.managed.size": "managedMemory",
             "taskmanager.memory.network.max": "networkMemory", "taskmanager.memory.jvm-metaspace.size": "jvmMetaspace"}


def test_the_dynamic_properties_on_the_command_line_reach_the_running_processes(env: Env) -> None:
    """Each JVM gets its memory sizes from BashJavaUtils as -D flags that config.yaml does not hold (it has only
    the process sizes). Flink's entry point parser stops at the first argument it does not know and drops every
    -D after it: each flag must take effect in the running process, as its REST API reports it."""
    rec = env.record()
    written = (env.rt.paths(APP).conf / "config.yaml").read_text()
    jm = entry_point_flags(rec.jobmanager.pid, JM_ENTRY)
    assert "jobmanager.memory.heap.size" in jm and not [k for k in jm if k in written], (jm, written)
    effective = {e["key"]: e["value"] for e in httpx.get(rec.rest_url + "/jobmanager/config", timeout=10).json()}
    assert {k: effective.get(k) for k in jm} == jm
    for t in rec.taskmanagers:
        tm = entry_point_flags(t.pid, TM_ENTRY)
        assert set(TM_MEMORY) <= set(tm) and not [k for k in TM_MEMORY if k in written], (tm, written)
        # The last flag (the resource id) names the TaskManager; its memory figures are the flags' sizes.
        got = httpx.get(f"{rec.rest_url}/taskmanagers/{tm['taskmanager.resource-id']}", timeout=10).json()
        figures = got["memoryConfiguration"]
        assert {k: figures[v] for k, v in TM_MEMORY.items()} == {k: int(tm[k].removesuffix("b")) for k in TM_MEMORY}


def test_start_job_again_returns_the_same_job(env: Env) -> None:
    jid = env.rt.start_job(env.app, job_id=JOB, jar=env.jar, restore_path=None, allow_non_restored_state=False,
                           deadline=env.deadline())
    assert jid == JOB
    assert [j.job_id for j in env.rt.flink(APP).jobs()] == [JOB]


def test_scale_taskmanagers_up_and_down_without_touching_the_job(env: Env) -> None:
    flink = env.rt.flink(APP)
    await_running(env.rt, APP, JOB)
    before = flink.job(JOB)
    jm = env.record().jobmanager

    up = counter_app(APP, jar_uri=str(env.jar), rate=40, replicas=3)
    assert env.rt.ensure_cluster(up, deadline=env.deadline()).phase is ClusterPhase.READY
    rec = env.record()
    assert rec.jobmanager == jm and len(rec.taskmanagers) == 3 and rec.replicas == 3
    assert flink.overview().taskmanagers == 3
    assert java_pids(rec.marker) == {jm.pid, *(t.pid for t in rec.taskmanagers)}

    down = counter_app(APP, jar_uri=str(env.jar), rate=40, replicas=1)
    env.rt.ensure_cluster(down, deadline=env.deadline())
    rec2 = env.record()
    assert rec2.jobmanager == jm and len(rec2.taskmanagers) == 1
    stopped = {t.pid for t in rec.taskmanagers} - {t.pid for t in rec2.taskmanagers}
    assert len(stopped) == 2 and not any(alive(p) for p in stopped)
    wait_until(lambda: flink.overview().taskmanagers == 1, timeout=30, what="1 TaskManager registered")

    # The job never restarted: same start time, still RUNNING with all tasks, no failover recorded.
    after = flink.job(JOB)
    assert after.start_time_ms == before.start_time_ms
    assert job_phase(after.state, after.tasks_running, after.tasks_total) is JobPhase.RUNNING
    assert flink.exceptions(JOB) == []
    assert env.rt.observe(APP).phase is ClusterPhase.READY


def test_dead_taskmanager_is_reported_and_replaced(env: Env) -> None:
    # Add an idle TaskManager, kill it behind the runtime's back: observe says why, ensure replaces it.
    two = counter_app(APP, jar_uri=str(env.jar), rate=40, replicas=2)
    env.rt.ensure_cluster(two, deadline=env.deadline())
    idle = max(env.record().taskmanagers, key=lambda t: t.index)
    os.kill(idle.pid, 9)
    wait_until(lambda: not alive(idle.pid), timeout=10, what="killed TM gone")
    info = env.rt.observe(APP)
    assert info.phase is ClusterPhase.STARTING and info.message and f"taskmanager-{idle.index}" in info.message
    env.rt.ensure_cluster(two, deadline=env.deadline())
    pids = {t.pid for t in env.record().taskmanagers}
    assert idle.pid not in pids and len(pids) == 2 and all(alive(p) for p in pids)


def test_config_change_restarts_the_cluster(env: Env) -> None:
    flink = env.rt.flink(APP)
    flink.cancel(JOB)  # the executor stops the job before a cluster-shaping change
    wait_until(lambda: flink.job(JOB).state == "CANCELED", timeout=30, what="cancel")
    old = env.record()
    changed = counter_app(APP, jar_uri=str(env.jar), rate=40,
                          flink_configuration={"execution.checkpointing.interval": "2 s"})
    info = env.rt.ensure_cluster(changed, deadline=env.deadline())
    new = env.record()
    assert info.phase is ClusterPhase.READY
    assert new.config_hash != old.config_hash and new.cluster_id != old.cluster_id
    assert java_pids(old.marker) == set()
    assert java_pids(new.marker) == {new.jobmanager.pid, *(t.pid for t in new.taskmanagers)}
    assert '"execution.checkpointing.interval": "2 s"' in (env.rt.paths(APP).conf / "config.yaml").read_text()
    # The job id is free again on the new cluster: start it and leave it running for the delete test.
    env.rt.start_job(changed, job_id=JOB, jar=env.jar, restore_path=None, allow_non_restored_state=False,
                     deadline=env.deadline())
    await_running(env.rt, APP, JOB)


def test_a_cold_start_beside_a_retired_cluster_in_the_same_directories_removes_that_one_first(env: Env) -> None:
    """A warm upgrade interrupted after its promotion leaves the old cold cluster retired, in clusters/<app>/; a
    repair that starts the live cluster cold again uses the same directories. Found by the chaos soak: the retired
    cluster's later removal deleted the new cluster's conf/, and no TaskManager could be restarted after that."""
    flink = env.rt.flink(APP)
    flink.cancel(JOB)
    wait_until(lambda: flink.job(JOB).state == "CANCELED", timeout=30, what="cancel")
    app = counter_app(APP, jar_uri=str(env.jar), rate=40,
                      flink_configuration={"execution.checkpointing.interval": "2 s"})
    env.rt.start_standby(app, generation="g1", deadline=env.deadline())
    env.rt.promote_standby(APP, generation="g1", deadline=env.deadline())
    retired = env.rt.read_record(APP, "retired")
    assert retired is not None and retired.generation == "" and env.record().generation == "g1"
    cold = counter_app(APP, jar_uri=str(env.jar), rate=40,
                       flink_configuration={"execution.checkpointing.interval": "3 s"})
    env.rt.ensure_cluster(cold, deadline=env.deadline())  # the live g1 is stopped; a new cluster starts in clusters/lr/
    live = env.record()
    assert live.generation == "" and env.rt.read_record(APP, "retired") is None
    assert java_pids(retired.marker) == set()
    env.rt.delete_retired(APP, deadline=env.deadline())  # what the leftover cleanup runs: nothing to delete now
    assert (env.rt.paths(APP).conf / "config.yaml").is_file()
    (tm,) = live.taskmanagers
    os.kill(tm.pid, 9)
    wait_until(lambda: not alive(tm.pid), timeout=10, what="killed TM gone")
    env.rt.ensure_cluster(cold, deadline=env.deadline())  # a TaskManager restarts from that configuration
    assert all(alive(t.pid) for t in env.record().taskmanagers) and env.record().cluster_id == live.cluster_id
    env.rt.start_job(cold, job_id=JOB, jar=env.jar, restore_path=None, allow_non_restored_state=False,
                     deadline=env.deadline())
    await_running(env.rt, APP, JOB)


def test_a_process_of_the_running_cluster_killed_while_ensure_scales_it_is_a_fault_not_the_specs_failure(
        env: Env) -> None:
    """ensure_cluster on a running cluster only matches its TaskManager count; a kill -9 meanwhile is not this spec's
    doing. Found by the chaos soak: the JobManager killed as an upgrade's EnsureCluster waited for a new
    TaskManager failed the step like a bad config, and the upgrade was rolled back, then never tried again."""
    cold = counter_app(APP, jar_uri=str(env.jar), rate=40,
                       flink_configuration={"execution.checkpointing.interval": "3 s"})
    env.rt.ensure_cluster(cold, deadline=env.deadline())  # this configuration, whatever ran before
    base = env.record()
    replicas = len(base.taskmanagers)
    more = counter_app(APP, jar_uri=str(env.jar), rate=40, replicas=replicas + 1,
                       flink_configuration={"execution.checkpointing.interval": "3 s"})
    assert cluster_config_hash(more, env.rt.dist.version) == base.config_hash, "only the TaskManager count differs"
    killer = threading.Timer(1.0, lambda: os.kill(base.jobmanager.pid, 9))
    killer.start()
    try:
        with pytest.raises(JobManagerGoneError, match="JobManager of the running cluster"):
            env.rt.ensure_cluster(more, deadline=env.deadline())
    finally:
        killer.cancel()
    assert env.rt.observe(APP).phase is ClusterPhase.FAILED
    env.rt.ensure_cluster(cold, deadline=env.deadline())  # a repair starts it again
    env.rt.start_job(cold, job_id=JOB, jar=env.jar, restore_path=None, allow_non_restored_state=False,
                     deadline=env.deadline())
    await_running(env.rt, APP, JOB)


def test_delete_kills_only_our_own_pids(env: Env) -> None:
    rec = env.record()
    ours = {rec.jobmanager.pid, *(t.pid for t in rec.taskmanagers)}
    # A PID recorded as ours but now belonging to someone else (PID reuse) must survive.
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        fake = ProcRecord(role="taskmanager", index=9, pid=stranger.pid, started_at=rec.started_at)
        env.rt.paths(APP).record.write_text(
            rec.model_copy(update={"taskmanagers": (*rec.taskmanagers, fake)}).model_dump_json()
        )
        env.rt.delete_cluster(APP, deadline=env.deadline(60))
        assert not any(alive(p) for p in ours)
        assert stranger.poll() is None, "a process that is not ours was signalled"
    finally:
        stranger.kill()
        stranger.wait()
    assert env.rt.observe(APP).phase is ClusterPhase.ABSENT
    assert env.rt.list_clusters() == {}
    assert any(env.rt.paths(APP).checkpoints.iterdir()), "checkpoints outlive the cluster"
    env.rt.delete_cluster(APP, deadline=env.deadline(10))  # idempotent


def test_deadline_error_carries_a_reason(env: Env) -> None:
    slow = counter_app("slow", jar_uri=str(env.jar))
    try:
        with pytest.raises(DeadlineExceededError, match=r"app slow: cluster not ready by the deadline: \S+"):
            env.rt.ensure_cluster(slow, deadline=env.deadline(1.0))
        assert env.rt.observe("slow").phase in (ClusterPhase.STARTING, ClusterPhase.READY)
    finally:
        env.rt.delete_cluster("slow", deadline=env.deadline(60))


def test_jvm_that_exits_is_reported_with_its_reason(env: Env) -> None:
    broken = counter_app("broken", jar_uri=str(env.jar),
                         flink_configuration={"env.java.opts.jobmanager": "-XX:+NoSuchFlagForTesting"})
    try:
        with pytest.raises(RuntimeProvisionError, match="NoSuchFlagForTesting"):
            env.rt.ensure_cluster(broken, deadline=env.deadline(60))
        info = env.rt.observe("broken")
        assert info.phase is ClusterPhase.FAILED
        assert info.message and "Unrecognized VM option" in info.message
    finally:
        env.rt.delete_cluster("broken", deadline=env.deadline(60))


def test_memory_flinks_rejects_is_a_provision_error(env: Env) -> None:
    tiny = counter_app("tiny", jar_uri=str(env.jar), jobManager={"resources": {"memory": "64m"}})
    pattern = r"JobManager memory configuration.*exceed configured Total Process Memory \(64"
    with pytest.raises(RuntimeProvisionError, match=pattern):
        env.rt.ensure_cluster(tiny, deadline=env.deadline(60))
    assert env.rt.observe("tiny").phase is ClusterPhase.ABSENT


def test_image_jar_is_rejected_by_the_local_runtime(env: Env) -> None:
    img = counter_app("img", jar_uri="local:///opt/flink/usrlib/counter.jar")
    with pytest.raises(PermanentStepError, match="local runtime needs"):
        env.rt.start_job(img, job_id="2" * 32, jar=None, restore_path=None, allow_non_restored_state=False,
                         deadline=env.deadline(10))
    assert env.rt.observe("img").phase is ClusterPhase.ABSENT


def test_cluster_json_is_plain_json(env: Env) -> None:
    # Other tools (status, humans) read it: keep it a stable, documented shape.
    path = env.rt.paths(APP).record
    if path.exists():
        doc = json.loads(path.read_text())
        assert {"rest_port", "jobmanager", "taskmanagers", "config_hash", "started_at"} <= set(doc)
