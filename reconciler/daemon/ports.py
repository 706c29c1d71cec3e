"""The one port the daemon drives. The lead's `reconciler.daemon.service` implements it.

The daemon only schedules, serialises and reports; everything that touches Git, Flink or the journal
sits behind this Protocol, so the daemon is tested with a recording fake.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class ReconcileService(Protocol):
    def sync(self, *, full: bool, reason: str) -> None:
        """Fetch Git and reconcile: apps whose spec changed (full=False) or every app (full=True,
        the drift pass). Must not raise for per-app problems; raises ReconcilerError only when the
        whole pass could not run (e.g. Git unreachable)."""
        ...

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason): Git reachable and runtime usable."""
        ...

    def shutdown(self, *, deadline_s: float) -> None:
        """Finish or park the current steps (journaled) and return."""
        ...


@runtime_checkable
class StatusSource(Protocol):
    """Optional: a service that also implements this adds its per-app lines to the status page (`/`)."""

    def status_text(self) -> str: ...
