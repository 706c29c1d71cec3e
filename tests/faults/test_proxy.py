"""The fault proxy in front of a small Flink-shaped server: what the real REST client makes of each fault.

This is the contract the Flink tests (test_rest_faults.py) rely on: every fault class becomes a
*transient* FlinkRestError (the executor retries it), with text that names the fault.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reconciler.live.flink import FlinkRestClient, FlinkTransientError, FlinkUnavailableError
from tests.faults.proxy import FaultProxy, Rule

JOB = "a" * 32


class _Upstream(BaseHTTPRequestHandler):
    calls: list[str] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _json(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.calls.append(f"GET {self.path}")
        self._json({"jobs": [{"jid": JOB, "name": "counter", "state": "RUNNING", "start-time": 1,
                              "tasks": {"running": 2, "total": 2}}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.calls.append(f"POST {self.path}")
        self._json({"request-id": "trigger-1"})


@pytest.fixture
def proxied() -> Iterator[tuple[FaultProxy, FlinkRestClient]]:
    _Upstream.calls = []
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    proxy = FaultProxy(f"http://127.0.0.1:{upstream.server_address[1]}").start()
    client = FlinkRestClient(proxy.url, timeout=0.5)
    try:
        yield proxy, client
    finally:
        client.close()
        proxy.stop()
        upstream.shutdown()
        upstream.server_close()


def test_no_rule_passes_through(proxied: tuple[FaultProxy, FlinkRestClient]) -> None:
    proxy, client = proxied
    assert [j.job_id for j in client.jobs()] == [JOB]
    assert proxy.count("GET", "/jobs/overview") == 1


@pytest.mark.parametrize(
    ("rule", "error", "text", "reached_upstream"),
    [
        (Rule("GET", "/jobs/overview", "status", status=503), FlinkTransientError, "-> 503", False),
        (Rule("GET", "/jobs/overview", "reset"), FlinkUnavailableError, "Flink REST unreachable", False),
        (Rule("GET", "/jobs/overview", "reset_after"), FlinkUnavailableError, "Flink REST unreachable", True),
        (Rule("GET", "/jobs/overview", "stall", stall_s=1.0), FlinkUnavailableError, "Flink REST timed out", True),
        (Rule("GET", "/jobs/overview", "truncate"), FlinkTransientError, "Flink answered with non-JSON", True),
    ],
    ids=["5xx", "reset", "reset-after-forwarding", "stall", "truncated-json"],
)
def test_each_fault_is_a_transient_error_that_names_it(
    proxied: tuple[FaultProxy, FlinkRestClient], rule: Rule, error: type[Exception], text: str,
    reached_upstream: bool,
) -> None:
    proxy, client = proxied
    proxy.add(rule)
    with pytest.raises(error, match=re.escape(text)):
        client.jobs()
    assert proxy.spent() == [rule]
    if rule.kind == "stall":  # the stalled request reaches the upstream after the client gave up
        time.sleep(rule.stall_s + 0.5)
    assert ("GET /jobs/overview" in _Upstream.calls) is reached_upstream
    assert [j.job_id for j in client.jobs()] == [JOB]  # the rule is spent: the next call goes through


def test_a_lost_answer_to_a_post_still_reached_flink(proxied: tuple[FaultProxy, FlinkRestClient]) -> None:
    proxy, client = proxied
    proxy.add(Rule("POST", f"/jobs/{JOB}/stop", "reset_after"))
    with pytest.raises(FlinkUnavailableError):
        client.stop_with_savepoint(JOB, trigger_id="t1")
    assert _Upstream.calls == [f"POST /jobs/{JOB}/stop"]
    assert proxy.count("POST", f"/jobs/{JOB}/stop") == 1
