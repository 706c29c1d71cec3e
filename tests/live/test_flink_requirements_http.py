"""FlinkRestClient's resource requirements calls against a small HTTP server on loopback: the shapes
Flink 2.3 answers with, and what an older Flink without the endpoint answers (404/405)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from reconciler.live.flink import FlinkRestClient, FlinkUnsupportedError

JOB = "a" * 32
PATH = f"/jobs/{JOB}/resource-requirements"


class _Server:
    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, Any]] = {}
        self.bodies: list[Any] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    server.bodies.append(json.loads(self.rfile.read(length)))
                status, body = server.answers.get((method, self.path), (404, {"errors": [f"Not found: {self.path}"]}))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_PUT(self) -> None:
                self._answer("PUT")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    t = threading.Thread(target=s.httpd.serve_forever, daemon=True)
    t.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def test_requirements_round_trip(server: _Server) -> None:
    server.answers[("GET", PATH)] = (200, {"v1": {"parallelism": {"lowerBound": 1, "upperBound": 2}},
                                           "v2": {"parallelism": {"lowerBound": 2, "upperBound": 2}}})
    server.answers[("PUT", PATH)] = (200, {})
    with FlinkRestClient(server.url) as c:
        assert c.resource_requirements(JOB) == {"v1": (1, 2), "v2": (2, 2)}
        c.set_resource_requirements(JOB, {"v1": (3, 3), "v2": (3, 3)})
    assert server.bodies == [{"v1": {"parallelism": {"lowerBound": 3, "upperBound": 3}},
                              "v2": {"parallelism": {"lowerBound": 3, "upperBound": 3}}}]


@pytest.mark.parametrize("status", [404, 405])
def test_a_flink_without_the_endpoint_is_unsupported_not_an_unknown_job(server: _Server, status: int) -> None:
    server.answers[("GET", PATH)] = (status, {"errors": [f"Not found: {PATH}"]})
    server.answers[("PUT", PATH)] = (status, {"errors": ["Method not allowed"]})
    with FlinkRestClient(server.url) as c:
        with pytest.raises(FlinkUnsupportedError, match="no resource requirements endpoint") as e:
            c.resource_requirements(JOB)
        assert e.value.status == status
        with pytest.raises(FlinkUnsupportedError):
            c.set_resource_requirements(JOB, {"v1": (2, 2)})
