"""Shared fixtures: a recording fake of the ReconcileService port and settings for loopback daemons."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.settings import ENV_PREFIX, Settings, load_settings
from tests.daemon.forges import GITEA_SECRET, GITHUB_SECRET, GITLAB_TOKEN


@dataclass(frozen=True)
class SyncCall:
    full: bool
    reason: str
    started: float
    ended: float


class FakeService:
    """Records every sync, tracks how many run at once, and can block or fail on demand."""

    def __init__(self) -> None:
        self.calls: list[SyncCall] = []
        self.active = 0
        self.max_active = 0
        self.ready: tuple[bool, str] = (True, "git reachable; runtime usable")
        self.readiness_error: Exception | None = None
        self.shutdowns: list[float] = []
        self.on_shutdown: Callable[[], None] | None = None
        self.failures: list[BaseException] = []  # raised by the next syncs, in order
        self.gate = threading.Event()  # a sync waits on it while `blocking`
        self.gate.set()
        self.in_sync = threading.Event()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def block(self) -> None:
        self.gate.clear()

    def unblock(self) -> None:
        self.gate.set()

    def sync(self, *, full: bool, reason: str) -> None:
        t0 = time.monotonic()
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.in_sync.set()
        try:
            self.gate.wait(timeout=30)
            time.sleep(0.01)  # a pass takes some time: lets overlapping triggers actually overlap
            with self._lock:
                failure = self.failures.pop(0) if self.failures else None
            if failure is not None:
                raise failure
        finally:
            with self._changed:
                self.active -= 1
                self.in_sync.clear()
                self.calls.append(SyncCall(full, reason, t0, time.monotonic()))
                self._changed.notify_all()

    def readiness(self) -> tuple[bool, str]:
        if self.readiness_error is not None:
            raise self.readiness_error
        return self.ready

    def shutdown(self, *, deadline_s: float) -> None:
        self.shutdowns.append(deadline_s)
        if self.on_shutdown is not None:
            self.on_shutdown()
        self.unblock()  # park: a blocked sync returns

    def wait_calls(self, n: int, timeout: float = 10.0) -> list[SyncCall]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.calls) >= n, timeout):
                raise AssertionError(f"expected {n} syncs within {timeout}s, got {self.calls}")
            return list(self.calls)


@pytest.fixture
def fake_service() -> FakeService:
    return FakeService()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read the process environment; start every test without our variables."""
    import os

    for key in list(os.environ):
        if key.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(key)


@pytest.fixture
def make_settings(tmp_path: Path) -> Iterator[Callable[..., Settings]]:
    def make(**overrides: Any) -> Settings:
        base: dict[str, Any] = {
            "repo_url": "https://git.example.com/acme/flink-apps.git",
            "state_dir": tmp_path / "state",
            "listen_port": 0,
            "probe_port": 0,
            "poll_interval": 3600,
            "drift_interval": 3600,
            "shutdown_deadline": 5,
            "github_webhook_secret": GITHUB_SECRET,
            "gitlab_webhook_token": GITLAB_TOKEN,
            "gitea_webhook_secret": GITEA_SECRET,
        }
        return load_settings(base | overrides)

    yield make
