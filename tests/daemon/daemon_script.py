"""A real daemon process for the signal and lock tests: `run()` around a file-recording fake service.

usage: python -m tests.daemon.daemon_script <state_dir> <record_file> [stuck|waiting]

The fake service appends one line per event to <record_file>. A sync whose reason mentions a webhook
blocks, as a long upgrade would, until shutdown() parks it; with `stuck`, it runs on a worker thread that
does not notice shutdown (a JVM slow to stop); with `waiting`, on worker threads that wait on the daemon's clock,
as the executor's steps do between polls and retries (the clock's stop wakes them).
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reconciler.clock import Clock
from reconciler.daemon.main import run
from reconciler.daemon.metrics import Metrics
from reconciler.errors import ConfigError, ShutdownRequested
from reconciler.logs import setup_logging
from reconciler.settings import Settings, load_settings
from tests.daemon.forges import GITHUB_SECRET


class RecordingService:
    def __init__(self, record: Path, *, stuck: bool = False, clock: Clock | None = None) -> None:
        self._record = record
        self._stuck = stuck
        self._clock = clock  # `waiting`: steps wait on it
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="apply")
        self._parked = threading.Event()
        self._lock = threading.Lock()

    def _write(self, line: str) -> None:
        with self._lock, self._record.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()

    def sync(self, *, full: bool, reason: str) -> None:
        self._write(f"sync full={full} reason={reason}")
        if "webhook" in reason and self._clock is not None:
            steps = [self._pool.submit(self._step, name) for name in ("poll", "retry")]
            for step in steps:
                step.result()  # re-raises ShutdownRequested: the pass ends there, as the executor's does
            self._write("step done")
            return
        if "webhook" in reason and self._stuck:
            self._pool.submit(time.sleep, 60).result()
            self._write("step done")
            return
        if "webhook" in reason and self._parked.wait(timeout=60):
            self._write("parked")
            return
        self._write("synced")

    def _step(self, name: str) -> None:
        assert self._clock is not None
        self._write(f"waiting {name}")
        try:
            self._clock.sleep(3600)  # a savepoint poll, a retry's backoff: far past the shutdown deadline
        except ShutdownRequested:
            self._write(f"woken {name}")
            raise

    def readiness(self) -> tuple[bool, str]:
        return True, "fake: always ready"

    def shutdown(self, *, deadline_s: float) -> None:
        self._write(f"shutdown deadline_s={deadline_s:.1f}")
        self._parked.set()


def main() -> int:
    state_dir, record = Path(sys.argv[1]), Path(sys.argv[2])
    stuck = sys.argv[3:] == ["stuck"]
    waiting = sys.argv[3:] == ["waiting"]
    setup_logging("json", "INFO")
    settings = load_settings(
        {
            "repo_url": "https://git.example.com/acme/flink-apps.git",
            "state_dir": state_dir,
            "listen_port": 0,
            "probe_port": 0,
            "poll_interval": 3600,
            "drift_interval": 3600,
            "shutdown_deadline": 10,
            "github_webhook_secret": GITHUB_SECRET,
        }
    )

    def make(s: Settings, m: Metrics, c: Clock) -> RecordingService:
        return RecordingService(record, stuck=stuck, clock=c if waiting else None)

    try:
        return run(settings, make)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
