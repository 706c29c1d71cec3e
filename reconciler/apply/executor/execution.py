"""What every part of the executor shares: its wiring (runtime, journal, clock, poll interval, backoff), one
execution's in-process bookkeeping (`Run`; the durable part is the journal), and what every part looks up or
does: the plan's specs and the job jar (fetched once per execution), the journaled execution, a job's state and
Flink's root cause, and the one poll-wait of every waiting step (`_wait`: sleep a poll interval, or fail with
DeadlineExceededError once the step's deadline has come).

The layers above (`jobmanager`, `steps`, `stages`, `entry`: see the package's docstring) each extend the
class here, so a step handler and the stage that runs it share the same wiring without passing it along.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from reconciler.apply.executor.events import StepEvent
from reconciler.apply.journal import InFlight, Journal
from reconciler.apply.retry import Backoff
from reconciler.clock import Clock
from reconciler.core.plan import AppPlan, SpecRef, Step
from reconciler.errors import DeadlineExceededError, JobNotFoundError, JournalError, PermanentStepError, ReconcilerError
from reconciler.live.ports import FlinkApi, Runtime
from reconciler.spec.model import FlinkApp

# Flink states a job never leaves (SUSPENDED is left out: with HA the job comes back).
TERMINAL_STATES: Final = frozenset({"FINISHED", "CANCELED", "FAILED"})
_MAX_CAUSE = 2000


@dataclass
class Run:
    """Mutable bookkeeping of one execution in this process (the durable part is the journal)."""

    app: str
    plan: AppPlan
    revision: str
    timings: list[tuple[str, float]] = field(default_factory=list)
    specs: dict[SpecRef, FlinkApp] = field(default_factory=dict)
    jars: dict[SpecRef, Path | None] = field(default_factory=dict)


class StageFailedError(Exception):
    """A stage stopped at a step (internal control flow)."""

    def __init__(self, index: int, step: Step, cause: str) -> None:
        super().__init__(cause)
        self.index = index
        self.step = step
        self.cause = cause


class ExecutorBase:
    """The wiring every layer shares, and the look-ups and the poll-wait they all make."""

    def __init__(
        self,
        runtime: Runtime,
        journal: Journal,
        clock: Clock,
        *,
        resolve_jar: Callable[[FlinkApp], Path | None],
        poll_interval: float = 0.2,
        max_parallel: int = 4,
        on_event: Callable[[StepEvent], None] | None = None,
        backoff: Backoff | None = None,
        cleanup_deadline_s: float = 60.0,
    ) -> None:
        if poll_interval <= 0 or max_parallel < 1 or cleanup_deadline_s <= 0:
            raise ValueError("poll_interval and cleanup_deadline_s must be > 0, max_parallel >= 1")
        self.runtime = runtime
        self.journal = journal
        self.clock = clock
        self.resolve_jar = resolve_jar
        self.poll_interval = poll_interval
        self.max_parallel = max_parallel
        self.on_event = on_event
        self.backoff = backoff or Backoff()
        self.cleanup_deadline_s = cleanup_deadline_s

    def _spec(self, run: Run, ref: SpecRef) -> FlinkApp:
        if ref not in run.specs:
            raw = run.plan.desired if ref is SpecRef.DESIRED else run.plan.previous
            if raw is None:
                raise PermanentStepError(f"the plan carries no {ref.value} spec for {run.app}")
            try:
                run.specs[ref] = FlinkApp.model_validate(raw)
            except ValidationError as e:
                raise PermanentStepError(f"the plan's {ref.value} spec is invalid: {e}") from e
        return run.specs[ref]

    def _jar(self, run: Run, ref: SpecRef) -> Path | None:
        if ref not in run.jars:
            run.jars[ref] = self.resolve_jar(self._spec(run, ref))
        return run.jars[ref]

    def _inflight(self, app: str) -> InFlight:
        inf = self.journal.inflight(app)
        if inf is None:
            raise JournalError(f"{self.journal.path}: app {app!r} has no execution in flight")
        return inf

    def _job_state(self, flink: FlinkApi, job_id: str) -> str | None:
        try:
            return flink.job(job_id).state.upper()
        except JobNotFoundError:
            return None

    def _root_cause(self, flink: FlinkApi, job_id: str) -> str | None:
        try:
            causes = flink.exceptions(job_id)
        except ReconcilerError:
            return None
        return clip(causes[0]) if causes else None

    def _wait(self, deadline: float, what: str, *, flink: FlinkApi | None = None, job_id: str | None = None,
              interval: float | None = None) -> None:
        """Sleep one poll interval, or raise DeadlineExceededError when the deadline has come."""
        now = self.clock.monotonic()
        if now >= deadline:
            cause = self._root_cause(flink, job_id) if flink is not None and job_id is not None else None
            raise DeadlineExceededError(f"deadline passed waiting for {what}{suffix(cause)}")
        self.clock.sleep(min(interval or self.poll_interval, deadline - now))


def clip(text: str, limit: int = _MAX_CAUSE) -> str:
    """A cause (Flink's, an exception's) cut to `limit` characters for a message or the journal."""
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def suffix(cause: str | None) -> str:
    """The ": <cause>" that ends a message, or "" when there is no cause."""
    return f": {cause}" if cause else ""
