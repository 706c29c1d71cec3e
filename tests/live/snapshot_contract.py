"""The contract every runtime's `stored_snapshots` keeps (live/ports.py): complete snapshots of the app only,
newest first by the time each was completed. `observe` reads the newest savepoint and the newest checkpoint out of
it, and the planner restores from them: a list out of order would restore an older state (a silent rewind).
Shared by the runtimes' contract tests (tests/live/test_snapshot_order.py, tests/kubernetes/test_snapshot_order_k8s.py).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from reconciler.core.observed import Checkpoint

# Completion times (epoch seconds), savepoints and checkpoints of several jobs interleaved and written out of order:
# a listing by name, by directory or by kind gets them wrong.
CREATED: tuple[tuple[str, float], ...] = (
    ("savepoint-aaaaaa-000001", 1_000_300),
    (f"{'a' * 32}/chk-7", 1_000_100),
    ("savepoint-bbbbbb-000002", 1_000_050),
    (f"{'b' * 32}/chk-3", 1_000_500),
    (f"{'a' * 32}/chk-12", 1_000_400),
    ("savepoint-cccccc-000003", 1_000_600),
    (f"{'b' * 32}/chk-1", 1_000_200),
)


def write_snapshot(root: Path, rel: str, at: float, *, complete: bool = True) -> Path:
    """A snapshot directory as Flink leaves it: data files, and `_metadata` last (an interrupted one has none)."""
    d = root / rel
    d.mkdir(parents=True)
    (d / "part-0").write_bytes(b"state")
    if complete:
        (d / "_metadata").write_bytes(b"meta")
        os.utime(d / "_metadata", (at, at))
    return d


def write_all(savepoints: Path, checkpoints: Path) -> dict[str, float]:
    """Every snapshot of CREATED under the app's two directories, plus an interrupted savepoint newer than all of
    them (never listed). Returns resolved path -> completion time."""
    out = {}
    for rel, at in CREATED:
        d = write_snapshot(savepoints if rel.startswith("savepoint-") else checkpoints, rel, at)
        out[f"file:{d.resolve()}"] = at
    write_snapshot(savepoints, "savepoint-dddddd-000004", 2_000_000, complete=False)
    return out


def assert_newest_first(found: list[Checkpoint], created: dict[str, float] | None) -> None:
    """Newest first, every time the completion time; with `created`, exactly those snapshots at their times."""
    times = [c.completed_at for c in found]
    assert times == sorted(times, reverse=True), [(c.path, c.completed_at.isoformat()) for c in found]
    if created is not None:
        assert {c.path: c.completed_at for c in found} == {
            p: datetime.fromtimestamp(at, UTC) for p, at in created.items()}
        assert [c.is_savepoint for c in found] == [
            "/savepoint-" in c.path for c in sorted(found, key=lambda c: created[c.path], reverse=True)]
