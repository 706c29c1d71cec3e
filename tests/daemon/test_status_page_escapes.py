"""/status.txt never drives the terminal of whoever curls it: an app blocked by a failure whose Flink message holds
an escape sequence, a carriage return, a bell and a C1 control shows them as escapes, on one line (a real Git
repository, a real record, the real reconciler behind the real daemon and HTTP server)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

from reconciler.clock import SystemClock
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.scheduler import Daemon
from reconciler.service.reconcile import Reconciler
from reconciler.settings import Settings
from reconciler.source.git import GitSource
from reconciler.terminal import CONTROL
from tests.ui.records import failed_create

EVIL = "\x1b[2J\rowned\x07\u009b"


def test_status_txt_shows_control_characters_of_a_flink_message_as_escapes_on_one_line(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    f = failed_create(tmp_path, f"job failed: java.lang.RuntimeException: {EVIL}\n\tat Counter.map(Counter.java:12)")
    r, state, journal, clock = f.repo, f.state, f.journal, SystemClock()
    source = GitSource(str(r.origin), state / "git")
    service = Reconciler(source=source, runtime=None, journal=journal, clock=clock, subdir="apps")
    d = Daemon(service, make_settings(repo_url=str(r.origin), path="apps", dry_run=True), Metrics(), clock)
    d.start()
    try:
        assert d.runner.wait_idle(30)
        page = httpx.get(d.http.url + "/status.txt", timeout=10).text
    finally:
        d.stop(deadline_s=5)
    assert not CONTROL.search(page), page
    [line] = [ln for ln in page.splitlines() if ln.startswith("  blocked  orders: ")]
    assert "RuntimeException: \\u001b[2J\\rowned\\u0007\\u009b\\n\tat Counter.map" in line, page
