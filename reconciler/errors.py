"""The one exception tree of flink-reconciler.

Callers decide by class, never by message text::

    ReconcilerError
    ├── ConfigError                 bad settings / CLI usage
    ├── SpecError                   bad input in Git: file:line:col + field path (one app only)
    │   └── SpecLimitError          alias bomb, huge file, too many documents
    ├── SourceError                 Git: clone/fetch/read failed, unknown revision
    │   └── SourceMovedError        a fast-forward push lost the race: the branch moved meanwhile (decide again)
    ├── ObserveError                live state could not be read (cluster or REST unreachable)
    ├── PlanError                   the planner cannot produce a plan
    │   └── PlanStaleError          `apply --plan` refused: live state moved since planning
    ├── StepError                   one executor step failed
    │   ├── TransientStepError      retry with backoff (connection refused, 5xx, tasks not running yet)
    │   └── PermanentStepError      do not retry; follow the plan's failure path
    │       └── DeadlineExceededError    a step ran past its deadline
    ├── RuntimeProvisionError       a runtime could not start/stop a cluster
    ├── JournalError                durable state unreadable or locked
    │   ├── RecordConflictError     a record changed under us (compare-and-set lost): re-read, never overwrite
    │   └── FencedError             this replica does not hold the leader Lease: it must not write or act
    └── ReportError                 a commit-status sink failed (never blocks reconciling)

Outside the tree, on purpose a `BaseException` (like KeyboardInterrupt): `ShutdownRequested`, raised by the
clock's sleep once the process is stopping. It is not a failure: no `except Exception` turns it into a failed
step; it unwinds a waiting step where it is, journaled and in flight, resumed at the next start.

`FlinkRestError` (in `reconciler.live.flink`) subclasses the step errors so REST failures carry Flink's
own error text and are retried or not by class.
"""

from __future__ import annotations


class ShutdownRequested(BaseException):
    """The process is shutting down (the clock was stopped): stop waiting, leave the step in flight."""


class ReconcilerError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(ReconcilerError):
    """Invalid settings or command-line usage."""


class SpecError(ReconcilerError):
    """A spec document is invalid. Carries where, so a user can jump to it."""

    def __init__(
        self,
        message: str,
        *,
        file: str,
        line: int | None = None,
        column: int | None = None,
        field: str | None = None,
        app: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.field = field
        self.app = app
        super().__init__(self.location() + ": " + message)

    def location(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        if self.field:
            where += f" {self.field}"
        return where


class SpecLimitError(SpecError):
    """A file is too big or too expensive to parse (alias bomb); refused before any work."""


class SourceError(ReconcilerError):
    """Git could not be read: clone, fetch, unknown revision, broken tree."""


class ObserveError(ReconcilerError):
    """Live state could not be observed; the planner must not treat this as 'absent'."""


class PlanError(ReconcilerError):
    """No plan could be produced."""


class PlanStaleError(PlanError):
    """The live state differs from the one a saved plan was computed against."""


class StepError(ReconcilerError):
    """A step failed. `cause` is the short human reason reported on the commit."""

    retryable: bool = False


class TransientStepError(StepError):
    """Worth retrying with backoff until the step's deadline."""

    retryable = True


class PermanentStepError(StepError):
    """Retrying will not help; the executor follows the plan's failure path."""


class JobManagerGoneError(PermanentStepError):
    """The app's JobManager is dead (no HA, nothing restarts it): its jobs are gone with it; no savepoint will come."""


class DeadlineExceededError(PermanentStepError):
    """A step did not finish before its deadline."""


class RuntimeProvisionError(ReconcilerError):
    """A runtime could not provision or tear down a cluster."""


class JournalError(ReconcilerError):
    """The journal could not be read or written."""


class RecordConflictError(JournalError):
    """An app's record changed since we read it (another writer won the compare-and-set)."""


class FencedError(JournalError):
    """This replica lost (or never held) the leader Lease, or a newer leader already wrote the record:
    it must stop acting on the app. Never retried by the executor."""


class ReportError(ReconcilerError):
    """A commit-status sink failed. Reported and retried; never blocks reconciling."""


class JobNotFoundError(ObserveError):
    """The JobManager does not know this job (e.g. a restarted JobManager forgot it)."""


class SourceMovedError(SourceError):
    """A fast-forward-only push lost the race: the branch moved on origin while the commit was written. Nothing
    was pushed; not a refusal (run again on the new tip)."""


class SourceAuthError(SourceError):
    """Git origin refused our credentials (or asked for some we do not have)."""


class SourceUnreachableError(SourceError):
    """Git origin could not be reached: DNS, connection refused, timeout, no repository at that URL."""


class TransientReportError(ReportError):
    """A sink failure worth retrying (5xx, rate limit, network); `retry_after` is the forge's hint."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class WebhookRejectedError(ReconcilerError):
    """A webhook request was refused: missing/wrong signature or a malformed payload.

    `reason` is safe to log (it never contains a secret); `status` is the HTTP answer (401 or 400).
    """

    def __init__(self, reason: str, *, status: int = 401) -> None:
        self.reason = reason
        self.status = status
        super().__init__(reason)


class RenderError(SpecError):
    """An app cannot be rendered into Kubernetes objects (unsupported jar scheme, a reserved Flink key).

    A SpecError: bad input in Git that affects only this app; `file` is where the app came from when known.
    """

    def __init__(self, message: str, *, app: str, field: str | None = None, file: str | None = None) -> None:
        super().__init__(message, file=file or f"app {app}", field=field, app=app)


class TriggerNotFoundError(PermanentStepError):
    """The JobManager does not know a savepoint trigger id: it never got the request (a crash or a lost
    request right after the id was journaled), or it restarted and forgot the operation."""
