"""Progress lines of `apply`: plain lines off a terminal, a live spinner line on one."""

from __future__ import annotations

import io
import time

from reconciler.apply.executor import EventPhase, StepEvent
from reconciler.cli import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def ev(phase: EventPhase, elapsed: float = 0.0) -> StepEvent:
    return StepEvent(app="orders", index=0, count=2, description="stop job x with a savepoint", phase=phase,
                     elapsed=elapsed)


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    p = Progress(out)
    p.event(ev(EventPhase.STARTED))
    p.event(ev(EventPhase.DONE, 0.42))
    assert out.getvalue() == ("[orders] 1/2 stop job x with a savepoint ... started\n"
                              "[orders] 1/2 stop job x with a savepoint ... done (0.4s)\n")


def test_a_spinner_line_ticks_while_a_step_runs_on_a_terminal() -> None:
    out = Terminal()
    p = Progress(out)
    p.event(ev(EventPhase.STARTED))
    deadline = time.monotonic() + 5
    while "... 0s" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    p.event(ev(EventPhase.DONE, 1.0))
    text = out.getvalue()
    assert "[orders] 1/2 stop job x with a savepoint ... 0s" in text  # the live line
    assert text.endswith("\r\x1b[K[orders] 1/2 stop job x with a savepoint ... done (1.0s)\n")
    assert "... started" not in text
