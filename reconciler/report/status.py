"""What a commit status is, and the one interface every sink implements."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from reconciler.core.observed import Outcome

CONTEXT_PREFIX = "flink-reconciler/"
LINEAGE_PREFIX = "flink-reconciler-lineage/"


@dataclass(frozen=True)
class CommitStatus:
    """The outcome of one app at one commit, as a forge shows it next to the commit."""

    revision: str  # full commit sha
    app: str
    state: Outcome
    description: str
    target_url: str | None = None
    # Lineage of a finished execution: what its job restored ("" = empty state) and what it captured.
    restored_from: str | None = None
    savepoints: tuple[str, ...] = ()
    at: datetime | None = None
    context_suffix: str = ""  # a status of its own beside the app's (the autoscaler's: "/autoscale")

    @property
    def context(self) -> str:
        return CONTEXT_PREFIX + self.app + self.context_suffix

    @property
    def has_lineage(self) -> bool:
        return self.restored_from is not None or bool(self.savepoints)

    def one_line_description(self) -> str:
        return one_line(self.description)

    def lineage_text(self) -> str:
        """'restored from X; savepoint Y' for forge descriptions (empty without lineage)."""
        parts = []
        if self.restored_from is not None:
            parts.append(f"restored from {self.restored_from or 'empty state'}")
        if self.savepoints:
            parts.append("savepoint " + ", ".join(self.savepoints))
        return "; ".join(parts)

    def lineage_json(self) -> str:
        """The structured lineage of a git-notes line: one JSON object, one line."""
        return json.dumps({"restored_from": self.restored_from, "savepoints": list(self.savepoints),
                           "state": self.state.value, "at": self.at.isoformat() if self.at else None},
                          sort_keys=True)


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
