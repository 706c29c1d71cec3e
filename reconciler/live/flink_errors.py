"""What Flink's REST answers mean: the `FlinkRestError` tree and the reading of an error response.

A failed call becomes a `FlinkTransientError` (a `TransientStepError`: retry) or a `FlinkPermanentError` (a
`PermanentStepError`: do not), decided here from the status and Flink's own `errors` text; `summarize_*`
turn a Java stack trace into the one line a user needs on the commit status. Pure: `flink.py` is the client
that makes the calls.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from reconciler.errors import (
    JobNotFoundError,
    PermanentStepError,
    StepError,
    TransientStepError,
    TriggerNotFoundError,
)

if TYPE_CHECKING:
    import httpx

# Flink answers these while a job is still being deployed, restarting or busy checkpointing; asking again a moment
# later succeeds (matched case-insensitively). They are the messages of Flink's CheckpointFailureReason values that
# Flink itself does not count against a job's tolerable checkpoint failures
# (`CheckpointFailureReason.isCountedAgainstFailureThreshold`, Flink 2.x): not the checkpoint's fault. Left out:
# BLOCKING_OUTPUT_EXIST (a batch job: never), and TRIGGER_CHECKPOINT_FAILURE's bare "Trigger checkpoint failure."
# (only the causes below under it). A job that ended meanwhile (the reasons of a finishing or failed job) is not
# retried either way: the stop's next try reads the job's state first and gives up ("no savepoint can be taken").
# Every one of these was met on real Flink by the chaos soak or the e2e tests, or is its sibling in that list.
_TRANSIENT_MARKERS = (
    "not all required tasks are currently running",
    "checkpoint was declined (tasks not ready)",
    "the maximum number of queued checkpoint requests exceeded",
    "the minimum time between checkpoints is still pending",
    "failoverregion is restarting",
    "checkpoint expired before completing",  # counted by Flink, but a savepoint timing out under load is worth a retry
    "periodic checkpoint scheduler is shut down",
    "checkpoint has been subsumed",
    "checkpoint coordinator is suspending",  # the job is restarting (a TaskManager died)
    "checkpointcoordinator shutdown",
    "the checkpoint was aborted due to exception of other subtasks sharing the channelstate file",
    "checkpoint was declined (task is closing)",
    "checkpoint was canceled because a barrier from newer checkpoint was received",
    "task received cancellation from one of its inputs",
    "checkpoint was declined because one input stream is finished",
    # A task of the job failed under the savepoint (a TaskManager killed: chaos soak run 12); Flink restarts it.
    "task has failed.",
    "task local checkpoint failure",
    "unknown task for the checkpoint to notify",
    # A TaskManager of the job died (kill -9, OOM) and Flink has not noticed yet: the trigger cannot reach it. Flink
    # restarts the tasks; the savepoint succeeds once they run. Found by the chaos soak: read as the spec's failure.
    "recipientunreachableexception",
    # The trigger found no task left to acknowledge it: the tasks are being restarted (a TaskManager died under the
    # stop; found by the chaos soak) or have all finished. A job whose tasks all FINISHED ends FINISHED, and the
    # stop's next try reads the job's state first and gives up then ("no savepoint can be taken").
    "checkpoint needs at least one vertex that commits the checkpoint",
)
# The reasons Flink counts as the checkpoint's own failure: whatever else the text says (a task failed *because*
# the savepoint could not be written), they fail the same way again.
_NEVER_TRANSIENT = (
    "io-problem detected",  # IO_EXCEPTION: the savepoint directory cannot be written
    "asynchronous task checkpoint failed",  # CHECKPOINT_ASYNC_EXCEPTION
    "failure to finalize checkpoint",  # FINALIZE_CHECKPOINT_FAILURE
)
# A 5xx containing one of these fails the same way every time: the user's jar or arguments are wrong.
_PERMANENT_MARKERS = (
    "ClassNotFoundException",
    "NoClassDefFoundError",
    "ProgramInvocationException",
    "ProgramMissingJobException",
    "NoSuchMethodException",
    "FileNotFoundException",
    "IllegalArgumentException",
    "Could not find the main class",
    "does not exist",
)

_CAUSED_BY = re.compile(r"^\s*Caused by:\s*(.+?)\s*$", re.MULTILINE)


class FlinkRestError(StepError):
    """A Flink REST call failed. Base of the transient/permanent pair; catch the pair's parents."""

    def __init__(
        self,
        message: str,
        *,
        method: str,
        url: str,
        status: int | None = None,
        errors: tuple[str, ...] = (),
    ) -> None:
        self.method = method
        self.url = url
        self.status = status
        self.errors = errors
        self.cause = summarize_errors(errors) if errors else message
        where = f"{method} {url}" + (f" -> {status}" if status is not None else "")
        text = f"{message} ({where})"
        if errors and self.cause != message:
            text += f": {self.cause}"
        super().__init__(text)


class FlinkTransientError(FlinkRestError, TransientStepError):
    """Worth retrying: 5xx, tasks not running yet, operation not ready."""


class FlinkUnavailableError(FlinkTransientError):
    """The JobManager could not be reached: connection refused, reset or timed out."""


class FlinkPermanentError(FlinkRestError, PermanentStepError):
    """Retrying will not help: a bad savepoint path, a bad entry class, a rejected request."""


class FlinkTriggerNotFoundError(FlinkPermanentError, TriggerNotFoundError):
    """GET /jobs/{id}/savepoints/{trigger} answered 404."""


class FlinkUnsupportedError(FlinkPermanentError):
    """This Flink cannot do it here: the endpoint does not exist (404/405), or the job's scheduler refuses it
    (the default scheduler and a job's resource requirements: only the adaptive scheduler changes them)."""


def summarize_stack(text: str) -> str:
    """A stack trace -> its deepest 'Caused by:' line (or its first line): what actually went wrong."""
    causes = _CAUSED_BY.findall(text)
    if causes:
        return str(causes[-1])[:1000]
    for raw in text.splitlines():
        line = raw.strip().removeprefix("<Exception on server side:").strip()
        if line and not line.startswith("at "):
            return line[:1000]
    return text.strip()[:1000]


def summarize_errors(errors: tuple[str, ...] | list[str]) -> str:
    """Flink's `errors` list -> one readable line. The first entry is often just 'Internal server error.'."""
    useful = [e for e in errors if e.strip() and e.strip() != "Internal server error."]
    deepest = [summarize_stack(e) for e in useful]
    if not deepest:
        return "; ".join(e.strip() for e in errors) or "no error text"
    # The entry with a Caused-by chain is the most specific; fall back to the last one.
    for e, short in zip(useful, deepest, strict=True):
        if _CAUSED_BY.search(e):
            return short
    return deepest[-1]


def is_transient_text(text: str) -> bool:
    """True when Flink's error text says 'not yet' rather than 'never' (also for savepoint failures)."""
    low = text.lower()
    return any(m in low for m in _TRANSIENT_MARKERS) and not any(m in low for m in _NEVER_TRANSIENT)


def errors_of(resp: httpx.Response) -> tuple[str, ...]:
    try:
        body = resp.json()
    except ValueError:
        return (resp.text.strip()[:2000],) if resp.text.strip() else ()
    if isinstance(body, dict):
        errs = body.get("errors")
        if isinstance(errs, list):
            return tuple(str(e) for e in errs)
        if "message" in body:  # the Kubernetes API server's Status, when proxied
            return (str(body["message"]),)
    return (str(body)[:2000],)


def error_for(resp: httpx.Response, *, method: str, url: str, job_id: str | None) -> Exception:
    status = resp.status_code
    errors = errors_of(resp)
    text = "\n".join(errors)
    if status == 404 and job_id is not None and "savepoint" not in url.rsplit(job_id, 1)[-1]:
        return JobNotFoundError(
            f"Flink does not know job {job_id} ({method} {url} -> 404): {summarize_errors(errors)}"
        )
    if status == 404 and "/savepoints/" in url:
        return FlinkTriggerNotFoundError("Flink does not know this savepoint trigger", method=method, url=url,
                                         status=status, errors=errors)
    if is_transient_text(text):
        return FlinkTransientError("Flink is not ready for this yet", method=method, url=url, status=status,
                                   errors=errors)
    if status >= 500 and not any(m in text for m in _PERMANENT_MARKERS):
        return FlinkTransientError("Flink server error", method=method, url=url, status=status, errors=errors)
    if status in (408, 429, 502, 503, 504):
        return FlinkTransientError("Flink is busy", method=method, url=url, status=status, errors=errors)
    return FlinkPermanentError("Flink rejected the request", method=method, url=url, status=status, errors=errors)
