"""What a commit status is, and the one interface every sink implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from reconciler.core.observed import Outcome

CONTEXT_PREFIX = "flink-reconciler/"


@dataclass(frozen=True)
class CommitStatus:
    """The outcome of one app at one commit, as a forge shows it next to the commit."""

    revision: str  # full commit sha
    app: str
    state: Outcome
    description: str
    target_url: str | None = None

    @property
    def context(self) -> str:
        return CONTEXT_PREFIX + self.app

    def one_line_description(self) -> str:
        return one_line(self.description)


@runtime_checkable
class StatusSink(Protocol):
    """Posts statuses somewhere. Raises ReportError; TransientReportError when retrying may help."""

    name: str

    def post(self, status: CommitStatus) -> None: ...


@runtime_checkable
class BatchStatusSink(StatusSink, Protocol):
    """A sink that is cheaper per batch than per status (git notes: one push for many lines)."""

    def post_batch(self, statuses: Sequence[CommitStatus]) -> None: ...


def one_line(text: str) -> str:
    return " ".join(text.split())


def shorten(text: str, limit: int) -> str:
    """`text` on one line and at most `limit` characters, an ellipsis marking a cut."""
    flat = one_line(text)
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"
