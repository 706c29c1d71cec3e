"""How the client reads a finished stop-with-savepoint, against a loopback HTTP server answering as Flink 2.3 does.

The answer for a job that failed while stopping *after* its savepoint completed (a TaskManager killed during the
stop; seen in the chaos soak, text as Flink wrote it) names a consistent savepoint: the stop took, and an upgrade
goes on from it instead of failing with its job gone."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from reconciler.live.flink import FlinkRestClient

JOB = "bb1bc8b925ab2e66e425c25ed83a93a3"
SAVEPOINT = "file:/tmp/state/savepoints/soak-1/savepoint-bb1bc8-00d880e6ed4e"
STOPPING = (
    "org.apache.flink.runtime.scheduler.stopwithsavepoint.StopWithSavepointStoppingException: A savepoint has been "
    f"created at: {SAVEPOINT}, but the corresponding job {JOB} failed during stopping. The savepoint is consistent, "
    "but might have uncommitted transactions. If you want to commit the transaction please restart a job from this "
    "savepoint."
)
ANSWERS: dict[str, dict[str, Any]] = {
    "stopping": {"status": {"id": "COMPLETED"}, "operation": {"failure-cause": {
        "class": "java.util.concurrent.CompletionException",
        "stack-trace": f"java.util.concurrent.CompletionException: {STOPPING}\n\tat org.apache.flink.runtime."
                       f"scheduler.stopwithsavepoint.StopWithSavepointTerminationHandlerImpl.x(Impl.java:1)\n"
                       f"Caused by: {STOPPING}\n\tat x.y(Z.java:2)\n"}}},
    "declined": {"status": {"id": "COMPLETED"}, "operation": {"failure-cause": {
        "class": "java.util.concurrent.CompletionException",
        "stack-trace": "java.util.concurrent.CompletionException: org.apache.flink.runtime.checkpoint."
                       "CheckpointException: Checkpoint was declined (task is closing)\n\tat x.y(Z.java:1)\n"}}},
    "done": {"status": {"id": "COMPLETED"}, "operation": {"location": SAVEPOINT}},
}


@pytest.fixture(scope="module")
def flink() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # /jobs/<job>/savepoints/<trigger>: the trigger names the canned answer
            body = json.dumps(ANSWERS[self.path.rsplit("/", 1)[-1]]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_job_that_failed_while_stopping_after_its_savepoint_completed_gives_that_savepoint(flink: str) -> None:
    status = FlinkRestClient(flink, timeout=5).savepoint_status(JOB, "stopping")
    assert status.done and status.failure is None and status.location == SAVEPOINT


def test_a_savepoint_that_failed_is_still_a_failure(flink: str) -> None:
    status = FlinkRestClient(flink, timeout=5).savepoint_status(JOB, "declined")
    assert status.done and status.location is None and status.failure and "declined" in status.failure


def test_a_completed_savepoint_gives_its_location(flink: str) -> None:
    status = FlinkRestClient(flink, timeout=5).savepoint_status(JOB, "done")
    assert status == type(status)(done=True, location=SAVEPOINT)
