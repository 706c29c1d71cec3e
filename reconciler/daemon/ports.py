"""The one port the daemon drives. `reconciler.service.reconcile.Reconciler` implements it.

The daemon only schedules, serialises and reports; everything that touches Git, Flink or the journal
sits behind this Protocol, so the daemon is tested with a recording fake.
"""

from __future__ import annotations

from collections.abc import Callable
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


@runtime_checkable
class AsksForPasses(Protocol):
    """Optional: a service that knows when a pass is due before the next poll (a shard it just took) is
    given, once the daemon runs, a way to ask for one (`request(reason)`: an incremental pass, queued like a
    webhook's, never run twice at once)."""

    def ask_for_passes_with(self, request: Callable[[str], None]) -> None: ...
