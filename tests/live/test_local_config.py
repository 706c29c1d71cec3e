"""The pure parts of the local runtime and the REST client: config rendering, hashing, error text."""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from reconciler.errors import PermanentStepError
from reconciler.live.flink import is_transient_text, summarize_errors, summarize_stack
from reconciler.live.local.config import (
    ClusterPaths,
    cluster_config_hash,
    extract_log_reason,
    fast_start_flags,
    flink_memory,
    render_config,
    render_yaml,
)
from tests.fixtures.flink import counter_app

PATHS = ClusterPaths(root=Path("/s/clusters/a"), checkpoints=Path("/s/checkpoints/a"), savepoints=Path("/s/sp/a"))


@pytest.mark.parametrize(
    ("given", "flink"),
    [("1024m", "1024m"), ("2g", "2g"), ("1280mb", "1280mb"), ("2Gi", f"{2 << 30}b"), ("512Mi", f"{512 << 20}b"),
     ("1G", "1000000000b"), ("1073741824", "1073741824b")],
)
def test_flink_memory(given: str, flink: str) -> None:
    assert flink_memory(given) == flink


def test_flink_memory_rejects_garbage() -> None:
    with pytest.raises(PermanentStepError):
        flink_memory("lots")


def test_cluster_hash_ignores_what_changes_without_a_cluster_restart() -> None:
    base = counter_app("a")
    h = cluster_config_hash(base, "2.3.0")
    assert cluster_config_hash(counter_app("a", replicas=5), "2.3.0") == h
    assert cluster_config_hash(counter_app("a", replicas=3, parallelism=3, rate=7, keys=9), "2.3.0") == h
    assert cluster_config_hash(counter_app("a", slots=2), "2.3.0") != h
    assert cluster_config_hash(counter_app("a", flink_configuration={"x.y": "1"}), "2.3.0") != h
    assert cluster_config_hash(counter_app("a", taskManager={"resources": {"memory": "2g"}}), "2.3.0") != h
    assert cluster_config_hash(base, "2.3.1") != h


def test_render_config_runtime_owns_ports_and_dirs() -> None:
    app = counter_app("a", slots=3, flink_configuration={
        "rest.port": "8081", "io.tmp.dirs": "/tmp", "state.backend.type": "rocksdb",
        "execution.checkpointing.dir": "file:///elsewhere",
    })
    conf = render_config(app, PATHS, rest_port=1234, rpc_port=5678)
    assert conf["rest.port"] == "1234" and conf["jobmanager.rpc.port"] == "5678"
    assert conf["io.tmp.dirs"] == conf["web.tmpdir"] == "/s/clusters/a/tmp"
    assert conf["taskmanager.numberOfTaskSlots"] == "3"
    assert conf["state.backend.type"] == "rocksdb"
    assert conf["execution.checkpointing.dir"] == "file:///elsewhere"  # users may move state elsewhere
    assert conf["execution.checkpointing.savepoint-dir"] == "file:///s/sp/a"
    assert conf["execution.checkpointing.externalized-checkpoint-retention"] == "RETAIN_ON_CANCELLATION"
    assert conf["cluster.registration.error-delay"] == "500 ms"
    # The YAML round-trips every value as the same string.
    assert YAML(typ="safe").load(render_yaml(conf)) == conf


def test_extract_log_reason_prefers_errors_and_deepest_cause() -> None:
    log = "\n".join([
        "2026-01-01 00:00:00,000 INFO  org.apache.flink.Foo - starting",
        "2026-01-01 00:00:01,000 ERROR org.apache.flink.runtime.entrypoint.ClusterEntrypoint - Could not start cluster",
        "org.apache.flink.util.FlinkException: Failed",
        "\tat x.y(Z.java:1)",
        "Caused by: java.net.BindException: Address already in use",
    ])
    reason = extract_log_reason([log])
    assert reason == "Could not start cluster | Caused by: java.net.BindException: Address already in use"
    assert extract_log_reason(["INFO all good"]) is None


FLINK_400 = (
    "org.apache.flink.runtime.rest.handler.RestHandlerException: Could not execute application.\n"
    "\tat org.apache.flink.runtime.webmonitor.handlers.JarRunHandler.lambda$handleRequest$1(JarRunHandler.java:114)\n"
    "Caused by: org.apache.flink.util.FlinkRuntimeException: Could not execute application.\n"
    "\t... 1 more\n"
    "Caused by: java.io.FileNotFoundException: Cannot find checkpoint or savepoint file/directory 'file:/x'.\n"
    "\tat org.apache.flink.runtime.state.filesystem.AbstractFsCheckpointStorageAccess.resolveCheckpointPointer\n"
)


def test_summaries_keep_the_deepest_cause() -> None:
    assert summarize_stack(FLINK_400).startswith("java.io.FileNotFoundException: Cannot find checkpoint")
    assert summarize_errors(["Internal server error.", "<Exception on server side:\n" + FLINK_400 + ">"]) \
        == summarize_stack(FLINK_400)
    assert summarize_errors(["Job could not be found."]) == "Job could not be found."
    assert summarize_errors([]) == "no error text"


def test_transient_text() -> None:
    assert is_transient_text("CheckpointException: Not all required tasks are currently running.")
    assert not is_transient_text("java.lang.ClassNotFoundException: x.Y")
    # A savepoint refused because a TaskManager of the job just died (found by the chaos soak): Flink restarts the
    # tasks, and a new trigger succeeds once they run.
    assert is_transient_text(
        "java.util.concurrent.CompletionException: org.apache.flink.runtime.checkpoint.CheckpointException: Trigger "
        "checkpoint failure. (caused by: org.apache.flink.runtime.rpc.exceptions.RecipientUnreachableException: "
        "Could not send message [RemoteRpcInvocation(TaskExecutorGateway.triggerCheckpoint(...))]")
    # The stop refused while the tasks restart after a TaskManager was killed (chaos soak, round 87): no task is
    # left to commit the checkpoint. Not the spec's fault; an IllegalArgumentException in it must not make it permanent.
    soak = ("java.util.concurrent.CompletionException: org.apache.flink.runtime.checkpoint.CheckpointException: "
            "Trigger checkpoint failure. (caused by: java.lang.IllegalArgumentException: Checkpoint needs at least "
            "one vertex that commits the checkpoint)")
    assert is_transient_text(soak)
    assert not is_transient_text("java.lang.IllegalArgumentException: Checkpoint interval must be larger than 10")
    # Chaos soak run 12: a TaskManager killed just before the stop; the pending savepoint is aborted because a task
    # failed, and the job restarts.
    assert is_transient_text(
        "java.util.concurrent.CompletionException: org.apache.flink.runtime.checkpoint.CheckpointException: Task has "
        "failed. (caused by: org.apache.flink.runtime.checkpoint.CheckpointException: org.apache.flink.runtime."
        "checkpoint.CheckpointException: Task name with subtask : Source: generator (1/2)#1 Failure reason: Task has "
        "failed.)")
    # The savepoint directory cannot be written: the same every time, whatever task failed with it.
    assert not is_transient_text(
        "CheckpointException: An Exception occurred while triggering the checkpoint. IO-problem detected. (caused by: "
        "java.nio.file.FileAlreadyExistsException: /state/savepoints/soak-2)")
    assert not is_transient_text("CheckpointException: Task has failed. (caused by: Asynchronous task checkpoint "
                                 "failed. java.io.IOException: No space left on device)")


# Flink 2.x CheckpointFailureReason messages and whether a stop refused with one is tried again (transient): those
# Flink does not count against the failure threshold (isCountedAgainstFailureThreshold), but a batch job's.
FAILURE_REASONS = [
    ("Periodic checkpoint scheduler is shut down.", True),
    ("The maximum number of queued checkpoint requests exceeded", True),
    ("The minimum time between checkpoints is still pending. Checkpoint will be triggered after the minimum time.",
     True),
    ("Not all required tasks are currently running.", True),
    ("An Exception occurred while triggering the checkpoint. IO-problem detected.", False),
    ("Blocking output edge exists in running tasks.", False),
    ("Asynchronous task checkpoint failed.", False),
    ("The checkpoint was aborted due to exception of other subtasks sharing the ChannelState file.", True),
    ("Checkpoint expired before completing.", True),
    ("Checkpoint has been subsumed.", True),
    ("Checkpoint was declined.", False),
    ("Checkpoint was declined (tasks not ready)", True),
    ("Checkpoint was declined (task is closing)", True),
    ("Checkpoint was canceled because a barrier from newer checkpoint was received.", True),
    ("Task received cancellation from one of its inputs", True),
    ("Checkpoint was declined because one input stream is finished", True),
    ("CheckpointCoordinator shutdown.", True),
    ("Checkpoint Coordinator is suspending.", True),
    ("FailoverRegion is restarting.", True),
    ("Task has failed.", True),
    ("Task local checkpoint failure.", True),
    ("Unknown task for the checkpoint to notify.", True),
    ("Failure to finalize checkpoint.", False),
    ("Trigger checkpoint failure.", False),  # only with a cause known to pass (above)
]


@pytest.mark.parametrize(("reason", "transient"), FAILURE_REASONS)
def test_flinks_checkpoint_failure_reasons(reason: str, transient: bool) -> None:
    assert is_transient_text(f"org.apache.flink.runtime.checkpoint.CheckpointException: {reason}") is transient


def test_unreadable_record_is_unknown_not_absent(tmp_path: Path) -> None:
    from reconciler.clock import FakeClock
    from reconciler.core.observed import ClusterPhase
    from reconciler.live.local.runtime import LocalRuntime

    rt = LocalRuntime(tmp_path, clock=FakeClock())
    assert rt.observe("a").phase is ClusterPhase.ABSENT
    assert rt.list_clusters() == {}
    rt.paths("a").root.mkdir(parents=True)
    rt.paths("a").record.write_text("{not json")
    info = rt.list_clusters()["a"]
    assert info.phase is ClusterPhase.UNKNOWN and info.message and "cluster.json" in info.message


def test_users_collector_replaces_ours() -> None:
    assert "-XX:+UseSerialGC" in fast_start_flags([])
    assert "-XX:+UseSerialGC" in fast_start_flags(["-Dfoo=bar"])
    flags = fast_start_flags(["-XX:+UseG1GC"])
    assert "-XX:+UseSerialGC" not in flags and "-XX:TieredStopAtLevel=1" in flags
