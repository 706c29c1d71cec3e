"""Backoff for transient step errors: exponential, capped, and deterministic (no jitter).

No jitter because each app is retried by its own thread against its own cluster: there is no herd to
spread, and a deterministic schedule keeps FakeClock tests exact.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    initial: float = 0.5
    factor: float = 2.0
    cap: float = 10.0

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.factor < 1 or self.cap < self.initial:
            raise ValueError(f"invalid backoff {self}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (0-based)."""
        return min(self.cap, self.initial * self.factor ** min(attempt, 64))
