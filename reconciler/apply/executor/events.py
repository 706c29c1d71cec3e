"""What an execution tells its callers: a `StepEvent` per step start, end and retry (the CLI's progress lines,
the daemon's log) and an `AppResult` per app. Plain values, apart from the executor, so a caller that only
reads them (`cli.progress`, `service`) names no executor part.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from reconciler.core.observed import Outcome
from reconciler.core.plan import Action


class EventPhase(StrEnum):
    STARTED = "started"
    DONE = "done"
    RETRY = "retry"
    FAILED = "failed"


@dataclass(frozen=True)
class StepEvent:
    """A progress line for the CLI: one per step start/end and per retry."""

    app: str
    index: int  # 0-based within its stage
    count: int  # steps in the stage
    description: str
    phase: EventPhase
    elapsed: float  # seconds since the step started (injected clock)
    rollback: bool = False
    message: str | None = None


@dataclass(frozen=True)
class AppResult:
    app: str
    action: Action
    outcome: Outcome
    failed_step: str | None
    message: str
    rolled_back: bool = False
    savepoint: str | None = None  # the restore point this execution captured, if any
    job_id: str | None = None  # the job this execution left running (submitted by it), if any
    restored_from: str | None = None  # what its last started job restored ("": empty state; None: no start)
    savepoints: tuple[str, ...] = ()  # every savepoint/checkpoint this execution captured
    step_timings: tuple[tuple[str, float], ...] = ()  # (step type, seconds); rollback steps "rollback:<type>"
