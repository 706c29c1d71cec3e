"""FlinkRestClient against a real Flink 2.3 session cluster (started once for this module)."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reconciler.core.observed import JobPhase, job_phase
from reconciler.errors import JobNotFoundError, PermanentStepError, TransientStepError, TriggerNotFoundError
from reconciler.live.flink import (
    FlinkPermanentError,
    FlinkRestClient,
    FlinkUnavailableError,
    FlinkUnsupportedError,
    is_transient_text,
)
from reconciler.live.local.runtime import LocalRuntime
from reconciler.live.ports import CheckpointStats, SavepointStatus
from tests.fixtures.flink import counter_app, read_counts, teardown_runtime, wait_until

pytestmark = pytest.mark.flink

APP = "rest"


class Cluster:
    def __init__(self, rt: LocalRuntime, client: FlinkRestClient, jar_id: str) -> None:
        self.rt = rt
        self.client = client
        self.jar_id = jar_id
        self.work = rt.paths(APP).work
        self.savepoints = rt.paths(APP).savepoints
        self._n = 0

    def job_id(self, tag: str) -> str:
        self._n += 1
        return hashlib.sha256(f"{tag}-{self._n}".encode()).hexdigest()[:32]

    def run(self, job_id: str, out: str, **kw: object) -> str:
        args = ("--output-dir", out, "--keys", "4", "--rate", "40")
        return self.client.run_jar(self.jar_id, job_id=job_id, args=args, parallelism=1, **kw)  # type: ignore[arg-type]

    def await_running(self, job_id: str, timeout: float = 60) -> None:
        def probe() -> bool:
            j = self.client.job(job_id)
            assert j.state not in ("FAILED", "CANCELED", "FINISHED"), j
            return job_phase(j.state, j.tasks_running, j.tasks_total) is JobPhase.RUNNING

        wait_until(probe, timeout=timeout, what=f"job {job_id} RUNNING with all tasks")

    def await_state(self, job_id: str, state: str, timeout: float = 60) -> None:
        wait_until(lambda: self.client.job(job_id).state == state, timeout=timeout, what=f"job {job_id} {state}")

    def await_savepoint(self, job_id: str, trigger: str, timeout: float = 60) -> SavepointStatus:
        def probe() -> SavepointStatus | None:
            st = self.client.savepoint_status(job_id, trigger)
            return st if st.done else None

        return wait_until(probe, timeout=timeout, what=f"savepoint {trigger}")

    def await_checkpoint(self, job_id: str, timeout: float = 30) -> CheckpointStats:
        def probe() -> CheckpointStats | None:
            cps = self.client.checkpoints(job_id)
            return cps if cps.completed_count > 0 and cps.latest_completed_path else None

        return wait_until(probe, timeout=timeout, what=f"a completed checkpoint of {job_id}")


@pytest.fixture(scope="module")
def cluster(
    local_runtime_factory: Callable[[Path], LocalRuntime], counter_jar: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    rt = local_runtime_factory(tmp_path_factory.mktemp("rest-state"))
    app = counter_app(APP, slots=4, flink_configuration={"execution.checkpointing.interval": "500 ms"})
    info = rt.ensure_cluster(app, deadline=rt.clock.monotonic() + 120)
    assert info.rest_url
    client = FlinkRestClient(info.rest_url)
    jar_id = client.upload_jar(counter_jar)
    yield Cluster(rt, client, jar_id)
    client.close()
    teardown_runtime(rt)


def test_overview(cluster: Cluster) -> None:
    ov = cluster.client.overview()
    assert ov.taskmanagers == 1
    assert ov.slots_total == 4
    assert ov.flink_version == "2.3.0"
    assert cluster.jar_id.endswith("_counter.jar")


def test_run_with_chosen_id_is_idempotent(cluster: Cluster) -> None:
    jid = cluster.job_id("idem")
    assert cluster.run(jid, "out-idem") == jid
    cluster.await_running(jid)
    # A retried submit (e.g. after a timeout) returns the existing job, never a second one.
    assert cluster.run(jid, "out-idem") == jid
    # Two racing submits of a new id: one wins, the other sees Flink's duplicate error or the job.
    race = cluster.job_id("race")
    results: list[object] = []
    barrier = threading.Barrier(2)

    def submit() -> None:
        barrier.wait()
        try:
            results.append(cluster.run(race, "out-race"))
        except Exception as e:  # pragma: no cover - reported by the assertion below
            results.append(e)

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [race, race]
    ids = [j.job_id for j in cluster.client.jobs()]
    assert ids.count(jid) == 1 and ids.count(race) == 1
    for j in (jid, race):
        cluster.client.cancel(j)


def test_stop_with_savepoint_then_restore_continues_counts(cluster: Cluster) -> None:
    out = cluster.work / "out-restore"
    first = cluster.job_id("first")
    cluster.run(first, "out-restore")
    cluster.await_running(first)
    wait_until(lambda: len(read_counts(out)) == 4 and min(read_counts(out).values()) >= 20, timeout=30,
               what="counts to reach 20")

    # Savepoint without stopping: trigger + poll.
    trig = cluster.client.trigger_savepoint(first)
    sp = cluster.await_savepoint(first, trig)
    assert sp.failure is None and sp.location, sp
    assert Path(sp.location.removeprefix("file:")).is_dir()
    assert Path(sp.location.removeprefix("file:")).parent == cluster.savepoints

    trig = cluster.client.stop_with_savepoint(first)
    stop = cluster.await_savepoint(first, trig)
    assert stop.failure is None and stop.location, stop
    cluster.await_state(first, "FINISHED")
    before = read_counts(out)
    assert len(before) == 4

    second = cluster.job_id("second")
    cluster.run(second, "out-restore", savepoint_path=stop.location)
    cluster.await_running(second)
    wait_until(lambda: all(read_counts(out)[k] > before[k] + 10 for k in before), timeout=30,
               what="restored counts to grow")
    after = read_counts(out)
    assert all(after[k] > before[k] for k in before), (before, after)
    cps = cluster.await_checkpoint(second)
    assert cps.restored_path == stop.location
    assert cps.restored_is_savepoint is True
    assert cps.latest_completed_path and cps.latest_completed_at is not None

    # The same job started without state restarts every count: the test above can tell the difference.
    cluster.client.cancel(second)
    cluster.await_state(second, "CANCELED")
    high = read_counts(out)
    fresh = cluster.job_id("fresh")
    cluster.run(fresh, "out-restore")
    cluster.await_running(fresh)
    wait_until(lambda: all(read_counts(out)[k] < high[k] for k in high), timeout=30, what="counts to reset")
    cluster.client.cancel(fresh)


def test_cancel_keeps_checkpoints_and_cancel_again_is_not_an_error(cluster: Cluster) -> None:
    jid = cluster.job_id("cancel")
    cluster.run(jid, "out-cancel")
    cluster.await_running(jid)
    cluster.await_checkpoint(jid)
    cluster.client.cancel(jid)
    cluster.await_state(jid, "CANCELED")
    cluster.client.cancel(jid)  # 409 from Flink: already terminal
    # The latest checkpoint as of the cancel (one read before it may be subsumed by a newer one meanwhile).
    cps = cluster.client.checkpoints(jid)
    assert cps.latest_completed_path
    assert Path(cps.latest_completed_path.removeprefix("file:")).is_dir(), "RETAIN_ON_CANCELLATION"


def test_savepoint_right_after_submit_is_transient_or_succeeds(cluster: Cluster) -> None:
    jid = cluster.job_id("early")
    cluster.run(jid, "out-early")
    try:
        trig = cluster.client.trigger_savepoint(jid)
    except TransientStepError as e:
        assert "Not all required tasks" in str(e)
    else:
        st = cluster.await_savepoint(jid, trig)
        if st.failure is not None:
            assert is_transient_text(st.failure), st.failure
    cluster.await_running(jid)
    cluster.client.cancel(jid)


def test_savepoint_of_unknown_job_completes_as_failure(cluster: Cluster) -> None:
    ghost = "0" * 31 + "1"
    trig = cluster.client.trigger_savepoint(ghost)  # Flink accepts (202) and fails inside the operation
    st = cluster.await_savepoint(ghost, trig)
    assert st.done and st.location is None
    assert st.failure and "FlinkJobNotFoundException" in st.failure


def test_bogus_savepoint_path_is_permanent_with_flinks_cause(cluster: Cluster) -> None:
    jid = cluster.job_id("bogus")
    with pytest.raises(FlinkPermanentError) as ei:
        cluster.run(jid, "out-bogus", savepoint_path="file:/nonexistent/savepoint-42")
    e = ei.value
    assert isinstance(e, PermanentStepError) and not e.retryable
    assert e.status == 400
    assert "FileNotFoundException" in e.cause and "/nonexistent/savepoint-42" in e.cause
    assert any("Caused by:" in t for t in e.errors)  # Flink's full text is kept
    # Flink leaves a FAILED job behind; its exception history names the same cause.
    assert cluster.client.job(jid).state == "FAILED"
    assert any("FileNotFoundException" in x for x in cluster.client.exceptions(jid))
    # Re-running the same id finds the failed job instead of submitting a second one.
    assert cluster.run(jid, "out-bogus") == jid
    assert [j.job_id for j in cluster.client.jobs()].count(jid) == 1


def test_bad_entry_class_is_permanent(cluster: Cluster) -> None:
    with pytest.raises(FlinkPermanentError) as ei:
        cluster.run(cluster.job_id("entry"), "out-x", entry_class="com.example.NoSuchJob")
    assert "ClassNotFoundException" in ei.value.cause and "com.example.NoSuchJob" in ei.value.cause


def test_bad_program_args_are_permanent(cluster: Cluster) -> None:
    with pytest.raises(FlinkPermanentError) as ei:
        cluster.client.run_jar(cluster.jar_id, job_id=cluster.job_id("args"), args=("--output-dir", "o", "--keys", "0"))
    assert "IllegalArgumentException: --keys must be >= 1, got 0" in ei.value.cause


def test_unknown_job_raises_job_not_found(cluster: Cluster) -> None:
    ghost = "f" * 32
    with pytest.raises(JobNotFoundError, match=ghost):
        cluster.client.job(ghost)
    with pytest.raises(JobNotFoundError):
        cluster.client.checkpoints(ghost)
    with pytest.raises(JobNotFoundError):
        cluster.client.cancel(ghost)


def test_unknown_savepoint_trigger_is_permanent(cluster: Cluster) -> None:
    jid = cluster.job_id("trig")
    cluster.run(jid, "out-trig")
    with pytest.raises(TriggerNotFoundError, match="no savepoint operation"):
        cluster.client.savepoint_status(jid, "0123456789abcdef0123456789abcdef")
    cluster.client.cancel(jid)


def test_our_trigger_id_makes_a_resent_stop_harmless(cluster: Cluster) -> None:
    """What crash-resume relies on: the same triggerId sent twice is one operation and one savepoint."""
    jid = cluster.job_id("dedupe")
    cluster.run(jid, "out-dedupe")
    cluster.await_running(jid)
    cluster.await_checkpoint(jid)
    trigger = hashlib.sha256(b"dedupe").hexdigest()[:32]
    before = set(cluster.savepoints.glob("savepoint-*")) if cluster.savepoints.exists() else set()
    assert cluster.client.stop_with_savepoint(jid, trigger_id=trigger) == trigger
    first = cluster.await_savepoint(jid, trigger)
    assert first.location and not first.failure
    assert cluster.client.stop_with_savepoint(jid, trigger_id=trigger) == trigger  # resent after completion
    again = cluster.await_savepoint(jid, trigger)
    assert again.location == first.location
    assert len(set(cluster.savepoints.glob("savepoint-*")) - before) == 1
    cluster.await_state(jid, "FINISHED")


def test_connection_refused_is_transient() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with FlinkRestClient(f"http://127.0.0.1:{port}", timeout=2) as client, \
            pytest.raises(FlinkUnavailableError, match="ConnectError") as ei:
        client.overview()
    assert isinstance(ei.value, TransientStepError) and ei.value.retryable


def test_timeout_is_transient() -> None:
    # A server that accepts and never answers: the client's timeout must fire.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    try:
        t0 = time.monotonic()
        with FlinkRestClient(f"http://127.0.0.1:{port}", timeout=0.5) as client, \
                pytest.raises(FlinkUnavailableError, match="timed out"):
            client.jobs()
        assert time.monotonic() - t0 < 5
    finally:
        srv.close()


def test_the_default_scheduler_refuses_resource_requirements_and_vertices_are_listed(cluster: Cluster) -> None:
    """Issue 11 item 2: only the adaptive scheduler changes a job's parallelism in place. This cluster runs
    the default one: Flink 2.3 answers GET .../resource-requirements with a 500 UnsupportedOperationException,
    which the client raises as FlinkUnsupportedError (permanent: the executor falls back at once)."""
    jid = cluster.job_id("rr")
    cluster.run(jid, "out-rr")
    cluster.await_running(jid)
    with pytest.raises(FlinkUnsupportedError) as e:
        cluster.client.resource_requirements(jid)
    assert isinstance(e.value, PermanentStepError) and "AdaptiveScheduler" in e.value.cause
    vertices = cluster.client.vertices(jid)
    assert [v.parallelism for v in vertices] == [1, 1] and len({v.vertex_id for v in vertices}) == 2
    assert any(v.name.startswith("Source: generator") for v in vertices)
    with pytest.raises(FlinkUnsupportedError):
        cluster.client.set_resource_requirements(jid, {v.vertex_id: (2, 2) for v in vertices})
    # A request Flink's dispatcher rejects (an unknown vertex) is a plain permanent error (400).
    with pytest.raises(FlinkPermanentError, match="was not found in the JobGraph"):
        cluster.client.set_resource_requirements(jid, {"f" * 32: (2, 2)})
    cluster.client.cancel(jid)
    # An unknown job is a 500 FlinkJobNotFoundException on this endpoint, not a 404: still JobNotFoundError.
    with pytest.raises(JobNotFoundError):
        cluster.client.resource_requirements("0" * 31 + "2")
