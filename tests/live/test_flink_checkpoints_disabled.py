"""A job without checkpoint statistics: Flink answers `GET /jobs/<id>/checkpoints` with `404 {"errors":
["Checkpointing has not been enabled."]}` (CheckpointingStatisticsHandler: the job's execution graph has no
CheckpointStatsSnapshot). That is what a job that failed before it ran looks like, e.g. an application
cluster's job "(application driver)" FAILED at submission (found on a real Kubernetes node: the app was
then stuck as "live state unknown" while Flink listed the job FAILED). It means "no checkpoints", not "job
unknown" (the Flink operator's AbstractFlinkService reads it so too). A loopback HTTP server answers as
Flink 2.3 does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from reconciler.core.observed import ClusterPhase, JobPhase
from reconciler.errors import JobNotFoundError
from reconciler.live.flink import FlinkRestClient
from reconciler.live.observe import observe_app
from reconciler.live.ports import ClusterInfo

JOB = "a" * 32
FAILED_JOB = {"jid": JOB, "name": "counter (application driver)", "state": "FAILED", "start-time": 1,
              "end-time": 2, "duration": 1, "last-modification": 2,
              "tasks": {"running": 0, "total": 0, "finished": 0, "failed": 0, "canceled": 0}}
ROUTES: dict[str, tuple[int, Any]] = {
    "/jobs/overview": (200, {"jobs": [FAILED_JOB]}),
    f"/jobs/{JOB}": (200, {**FAILED_JOB, "vertices": []}),
    f"/jobs/{JOB}/checkpoints": (404, {"errors": ["Checkpointing has not been enabled."]}),
    f"/jobs/{JOB}/exceptions": (200, {"exceptionHistory": {"entries": [
        {"exceptionName": "java.lang.ClassNotFoundException", "stacktrace": "java.lang.ClassNotFoundException: Nope",
         "timestamp": 2}]}}),
}


class _Flink(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = ROUTES.get(self.path.split("?")[0], (404, {"errors": ["Not found: " + self.path]}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def flink_url() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Flink)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_checkpointing_not_enabled_reads_as_no_checkpoints(flink_url: str) -> None:
    stats = FlinkRestClient(flink_url).checkpoints(JOB)
    assert stats.completed_count == 0
    assert stats.latest_completed_path is None and stats.restored_path is None and stats.latest_savepoint_path is None


def test_an_unknown_job_is_still_unknown(flink_url: str) -> None:
    with pytest.raises(JobNotFoundError):
        FlinkRestClient(flink_url).checkpoints("b" * 32)


class _OneCluster:
    """The one Runtime method observe_app calls for a READY cluster (`flink`), pointed at the server."""

    def __init__(self, url: str) -> None:
        self.url = url

    def flink(self, app: str) -> FlinkRestClient:
        return FlinkRestClient(self.url)


def test_a_job_failed_at_submission_is_observed_failed_not_unknown(flink_url: str) -> None:
    info = ClusterInfo(app="counter", phase=ClusterPhase.READY, rest_url=flink_url)
    live = observe_app(_OneCluster(flink_url), info)  # type: ignore[arg-type]
    assert live.cluster is ClusterPhase.READY, live.cluster_message
    assert live.job_id == JOB and live.flink_state == "FAILED" and live.job is JobPhase.FAILING
    assert live.latest_checkpoint is None
    assert "ClassNotFoundException" in (live.job_exception or "")
