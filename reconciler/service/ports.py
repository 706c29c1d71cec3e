"""What the application layer reports through, without knowing who listens (the daemon's Prometheus metrics).

`reconciler.daemon.metrics.Metrics` implements `PassMetrics`; a one-off command passes none.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from reconciler.core.observed import Outcome

APP_STATES = ("ok", "blocked", "error", "failure")  # flink_reconciler_apps{state=...}


class PassMetrics(Protocol):
    def observe_git_fetch(self, seconds: float, *, error: str | None = None) -> None: ...
    def set_app_states(self, counts: dict[str, int], *, owner: str = "") -> None: ...
    def set_applied_revision(self, app: str, revision: str) -> None: ...
    def count_repair(self, kind: str, outcome: Outcome | str) -> None: ...
    def observe_step(self, step: str, seconds: float) -> None: ...
    def observe_reconcile(self, app: str, seconds: float, outcome: Outcome | str) -> None: ...
    def set_inflight_steps(self, count: int) -> None: ...


@runtime_checkable
class AutoscaleMetrics(Protocol):
    """What the autoscaler exports (service/autoscale.py)."""

    def set_autoscale(self, app: str, *, current: int, wanted: int | None, verdict: str) -> None: ...
    def count_autoscale_requests(self, app: str, n: int) -> None: ...
    def count_autoscale_commit(self, app: str, direction: str) -> None: ...
    def set_autoscale_push_refused(self, app: str, refused: bool) -> None: ...


class AutoscaleHook(Protocol):
    """The autoscaler as the reconcile pass sees it (service/autoscale.py)."""

    def tick(self, head: str) -> str | None:
        """Sample, decide, act; a commit it put on the tracked branch -> why to reconcile again at once."""
        ...
