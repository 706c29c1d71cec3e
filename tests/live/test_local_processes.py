"""Process handling of LocalRuntime without Flink: stand-in processes that carry a cluster's marker."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from reconciler.clock import SystemClock
from reconciler.core.observed import ClusterPhase
from reconciler.live.local.config import ClusterRecord, ProcRecord
from reconciler.live.local.runtime import LocalRuntime

STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(300)"
)


def spawn(marker: str, code: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", code, marker], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "up"  # handler installed
    return p


def write_record(rt: LocalRuntime, app: str, cluster_id: str, jm: int, tms: list[int]) -> ClusterRecord:
    now = datetime.now(UTC)
    rec = ClusterRecord(
        app=app, cluster_id=cluster_id, config_hash="x", rest_port=1, rpc_port=2, started_at=now, replicas=len(tms),
        slots=1, jobmanager=ProcRecord(role="jobmanager", index=0, pid=jm, started_at=now),
        taskmanagers=tuple(ProcRecord(role="taskmanager", index=i, pid=p, started_at=now) for i, p in enumerate(tms)),
    )
    rt.paths(app).root.mkdir(parents=True, exist_ok=True)
    rt.paths(app).record.write_text(rec.model_dump_json())
    return rec


def test_sigterm_then_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path, clock=SystemClock(), stop_grace_s=1.0)
    marker = "-Dflink-reconciler.cluster=stub-1"
    polite = spawn(marker, "import time; print('up', flush=True); time.sleep(300)")
    stubborn = spawn(marker, STUBBORN)
    try:
        write_record(rt, "stub", "stub-1", stubborn.pid, [polite.pid])
        # JobManager dead-or-alive is judged by the marker: both stand-ins count as ours.
        assert rt.observe("stub").phase is ClusterPhase.STARTING  # alive, REST not answering
        t0 = time.monotonic()
        rt.delete_cluster("stub", deadline=rt.clock.monotonic() + 30)
        took = time.monotonic() - t0
        assert polite.wait(timeout=5) == -15  # SIGTERM was enough
        assert stubborn.wait(timeout=5) == -9  # ignored SIGTERM, got SIGKILL after the grace period
        assert 0.9 < took < 10
        assert rt.observe("stub").phase is ClusterPhase.ABSENT
    finally:
        for p in (polite, stubborn):
            p.kill()
            p.wait()


def test_dead_jobmanager_observes_as_failed(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path, clock=SystemClock())
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_record(rt, "dead", "dead-1", gone.pid, [])
    (rt.paths("dead").root / "log").mkdir()
    (rt.paths("dead").root / "log" / "jobmanager.log").write_text(
        "2026-01-01 00:00:00,000 ERROR org.apache.flink.runtime.entrypoint.ClusterEntrypoint - Fatal error occurred "
        "in the cluster entrypoint.\nCaused by: java.net.BindException: Address already in use\n"
    )
    info = rt.observe("dead")
    assert info.phase is ClusterPhase.FAILED
    assert info.message and "BindException: Address already in use" in info.message
