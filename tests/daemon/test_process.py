"""Real daemon processes: SIGTERM / SIGINT parks the running sync and exits 0; the state-dir lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.daemon.lock import DaemonLock
from reconciler.errors import ConfigError
from tests.daemon import forges

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class DaemonProcess:
    proc: subprocess.Popen[bytes]
    stderr: Path
    record: Path

    def log(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stderr.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line})
        return out

    def wait_for(self, predicate: Any, what: str, timeout: float = 20.0) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            result = predicate()
            if result:
                return result
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"daemon exited ({self.proc.returncode}) waiting for {what}: {self.stderr.read_text()}"
                )
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: {self.stderr.read_text()}")

    def url(self, *, probes: bool = False) -> str:
        """The public port's URL, or with `probes` the probe port's (/healthz, /readyz, /metrics)."""
        line = "probes and metrics on" if probes else "listening on"

        def find() -> str | None:
            for rec in self.log():
                if rec.get("msg", "").startswith(line):
                    return f"http://{rec['host']}:{rec['port']}"
            return None

        return str(self.wait_for(find, f"the {line!r} line"))

    def records(self) -> list[str]:
        return self.record.read_text(encoding="utf-8").splitlines() if self.record.exists() else []


def start_daemon(tmp_path: Path, state_dir: Path, name: str = "d", *mode: str) -> DaemonProcess:
    stderr = tmp_path / f"{name}.stderr"
    record = tmp_path / f"{name}.record"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.daemon.daemon_script", str(state_dir), str(record), *mode],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=stderr.open("wb"),
        env={k: v for k, v in os.environ.items() if not k.startswith("FLINK_RECONCILER_")},
    )
    return DaemonProcess(proc, stderr, record)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = start_daemon(tmp_path, tmp_path / "state")
    try:
        yield d
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_parks_the_running_sync_and_exits_0(daemon: DaemonProcess, signum: signal.Signals) -> None:
    url = daemon.url()
    probes = daemon.url(probes=True)
    daemon.wait_for(lambda: "synced" in daemon.records(), "the startup sync")
    headers, body = forges.github(forges.github_push_payload())
    assert httpx.post(url + "/webhook", content=body, headers=headers, timeout=10).status_code == 202
    daemon.wait_for(lambda: any("reason=webhook" in r for r in daemon.records()), "the webhook sync to start")

    daemon.proc.send_signal(signum)
    assert daemon.proc.wait(timeout=20) == 0
    records = daemon.records()
    assert records[0] == "sync full=True reason=startup"
    assert records[1] == "synced"
    assert records[2].startswith("sync full=False reason=webhook: github push refs/heads/main bffeb7422404")
    assert records[3].startswith("shutdown deadline_s=")
    assert 0 < float(records[3].split("=")[1]) <= 10
    assert records[4] == "parked"
    messages = [rec.get("msg") for rec in daemon.log()]
    assert f"{signum.name} received" in messages
    stopped = [rec for rec in daemon.log() if rec.get("msg") == "daemon stopped"]
    assert stopped
    assert stopped[0]["clean"] is True
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/status.txt", timeout=2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(probes + "/healthz", timeout=2)


def test_a_pass_that_does_not_park_in_time_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """Its worker thread still runs at the shutdown deadline (10 s here): the process exits anyway, 1, and says
    the step resumes from the journal (before: the interpreter waited for the thread, SIGTERM looked ignored)."""
    d = start_daemon(tmp_path, tmp_path / "state", "stuck", "stuck")
    try:
        url = d.url()
        d.wait_for(lambda: "synced" in d.records(), "the startup sync")
        headers, body = forges.github(forges.github_push_payload())
        assert httpx.post(url + "/webhook", content=body, headers=headers, timeout=10).status_code == 202
        d.wait_for(lambda: any("reason=webhook" in r for r in d.records()), "the webhook sync to start")
        sent = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=30) == 1
        assert time.monotonic() - sent < 25
        assert "step done" not in d.records()
        messages = [rec.get("msg") for rec in d.log()]
        assert "the running sync did not end within the 10.0s shutdown deadline" in messages
        assert any("resumes from the journal on the next start" in (m or "") for m in messages), messages
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def test_sigterm_wakes_every_waiting_step_at_once_and_exits_clean(tmp_path: Path) -> None:
    """Issue 35: steps waiting on the clock (an hour each here) are woken by the shutdown at once: the process exits
    0 well before its 10 s shutdown deadline (before: at the deadline, 1, the steps still waiting)."""
    d = start_daemon(tmp_path, tmp_path / "state", "waiting", "waiting")
    try:
        url = d.url()
        d.wait_for(lambda: "synced" in d.records(), "the startup sync")
        headers, body = forges.github(forges.github_push_payload())
        assert httpx.post(url + "/webhook", content=body, headers=headers, timeout=10).status_code == 202
        d.wait_for(lambda: {"waiting poll", "waiting retry"} <= set(d.records()), "both steps to wait")
        sent = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=30) == 0
        assert time.monotonic() - sent < 5, "exited at once, not at the shutdown deadline"
        records = d.records()
        assert {"woken poll", "woken retry"} <= set(records) and "step done" not in records, records
        messages = [rec.get("msg") for rec in d.log()]
        assert any((m or "").startswith("sync stopped for shutdown") for m in messages), messages
        assert "the running sync did not end within the 10.0s shutdown deadline" not in messages
        assert next(rec for rec in d.log() if rec.get("msg") == "daemon stopped")["clean"] is True
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def test_idle_daemon_exits_promptly_on_sigterm(daemon: DaemonProcess) -> None:
    url = daemon.url(probes=True)
    daemon.wait_for(lambda: "synced" in daemon.records(), "the startup sync")
    assert httpx.get(url + "/healthz", timeout=5).text == "ok\n"
    # Ready once the runner has counted the startup pass (a moment after the service wrote "synced").
    ready = daemon.wait_for(lambda: (r := httpx.get(url + "/readyz", timeout=5)).status_code == 200 and r,
                            "/readyz 200")
    assert ready.text == "fake: always ready\n"
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=20) == 0
    assert daemon.records()[-1].startswith("shutdown deadline_s=")


def test_second_daemon_on_the_same_state_dir_is_refused(daemon: DaemonProcess, tmp_path: Path) -> None:
    daemon.url()
    second = start_daemon(tmp_path, tmp_path / "state", name="second")
    assert second.proc.wait(timeout=20) == 2
    err = second.stderr.read_text()
    assert f"PID {daemon.proc.pid} holds" in err
    assert str(tmp_path / "state" / "daemon.lock") in err
    assert not second.records()  # it never built a service, never synced
    assert daemon.proc.poll() is None

    # A different state dir is fine.
    third = start_daemon(tmp_path, tmp_path / "state-2", name="third")
    try:
        third.url()
        third.proc.send_signal(signal.SIGTERM)
        assert third.proc.wait(timeout=20) == 0
    finally:
        if third.proc.poll() is None:
            third.proc.kill()


def test_lock_is_released_when_the_holder_dies(daemon: DaemonProcess, tmp_path: Path) -> None:
    daemon.url()
    with pytest.raises(ConfigError, match=f"PID {daemon.proc.pid}"):
        DaemonLock(tmp_path / "state").acquire()
    daemon.proc.kill()  # no clean-up code runs: the kernel drops the flock
    daemon.proc.wait()
    with DaemonLock(tmp_path / "state") as lock:
        assert lock.path.read_text().strip() == str(os.getpid())


def test_lock_in_process(tmp_path: Path) -> None:
    first = DaemonLock(tmp_path / "s")
    first.acquire()
    assert (tmp_path / "s" / "daemon.lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(ConfigError, match=f"PID {os.getpid()} holds .*different --state-dir"):
        DaemonLock(tmp_path / "s").acquire()
    first.release()
    assert not first.held
    with DaemonLock(tmp_path / "s") as again:
        assert again.held
    assert (tmp_path / "s" / "daemon.lock").exists()


def test_lock_on_unusable_state_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot create lock file"):
        DaemonLock(blocker / "state").acquire()
