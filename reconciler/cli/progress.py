"""Step progress on the terminal, for the commands that execute a plan (apply, rollback)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, TextIO

from reconciler.cli.console import write_styled

if TYPE_CHECKING:
    from reconciler.apply.executor import StepEvent


class Progress:
    """Step progress: one line per step start/end; on a terminal, a spinner line for the running ones."""

    FRAMES = "|/-\\"

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self._running: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None

    def event(self, ev: StepEvent) -> None:
        stage = "rollback " if ev.rollback else ""
        extra = f": {ev.message}" if ev.message else ""
        head = f"[{ev.app}] {stage}{ev.index + 1}/{ev.count} {ev.description}"
        with self._lock:
            if ev.phase.value == "started":
                self._running[ev.app] = (head, time.monotonic())
                if not self.tty:
                    print(f"{head} ... started", file=self.out, flush=True)
                elif self._ticker is None:
                    self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
                    self._ticker.start()
                return
            if ev.phase.value in ("done", "failed"):
                self._running.pop(ev.app, None)
            self._clear()
            print(f"{head} ... {ev.phase.value} ({ev.elapsed:.1f}s){extra}", file=self.out, flush=True)

    def _clear(self) -> None:
        if self.tty:
            write_styled(self.out, "\r\x1b[K")  # our own erase; the step lines pass the console's escaping

    def _tick(self) -> None:
        n = 0
        while True:
            time.sleep(0.2)
            with self._lock:
                if not self._running:
                    continue
                head, t0 = list(self._running.values())[-1]
                more = f" (+{len(self._running) - 1} more)" if len(self._running) > 1 else ""
                self._clear()
                self.out.write(f"{self.FRAMES[n % 4]} {head} ... {time.monotonic() - t0:.0f}s{more}")
                self.out.flush()
            n += 1

