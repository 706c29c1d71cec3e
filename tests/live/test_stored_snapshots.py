"""The local runtime's storage as evidence of an app's past: complete savepoints and retained
checkpoints, newest first, in the layout Flink writes under the state directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.clock import SystemClock
from reconciler.errors import ObserveError
from reconciler.live.local.runtime import LocalRuntime
from reconciler.live.observe import observe


def _snapshot(d: Path, mtime: float, *, complete: bool = True) -> Path:
    d.mkdir(parents=True)
    (d / "part-0").write_bytes(b"state")
    if complete:
        (d / "_metadata").write_bytes(b"meta")
        os.utime(d / "_metadata", (mtime, mtime))
    return d


def test_stored_snapshots_newest_first_and_only_complete_ones(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path, clock=SystemClock())
    sp = tmp_path / "savepoints" / "orders"
    ck = tmp_path / "checkpoints" / "orders"
    old = _snapshot(sp / "savepoint-aaaaaa-111111", 1_000_000)
    new = _snapshot(sp / "savepoint-bbbbbb-222222", 3_000_000)
    _snapshot(sp / "savepoint-cccccc-333333", 9_000_000, complete=False)  # interrupted: no _metadata
    chk = _snapshot(ck / ("f" * 32) / "chk-12", 2_000_000)
    _snapshot(tmp_path / "savepoints" / "other" / "savepoint-dddddd-4", 8_000_000)  # another app's

    found = rt.stored_snapshots("orders")
    assert [(c.path, c.is_savepoint) for c in found] == [
        (f"file:{new.resolve()}", True), (f"file:{chk.resolve()}", False), (f"file:{old.resolve()}", True)]
    assert found[0].completed_at.timestamp() == 3_000_000
    assert rt.stored_snapshots("nothing-here") == []


def test_observe_reports_stored_evidence_for_an_app_without_a_cluster(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path, clock=SystemClock())
    sp = _snapshot(tmp_path / "savepoints" / "orders" / "savepoint-aaaaaa-1", 1_000_000)
    live = observe(rt, ["orders", "fresh"])
    orders = live.get("orders")
    assert orders.stored_savepoint is not None and orders.stored_savepoint.path == f"file:{sp.resolve()}"
    assert orders.stored_checkpoint is None and orders.evidence_error is None
    assert "fresh" not in live.apps  # no cluster and no evidence: not listed, reads as ABSENT
    assert live.fingerprint() == observe(rt, []).fingerprint()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_storage_is_an_error_not_no_evidence(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path, clock=SystemClock())
    sp = tmp_path / "savepoints" / "orders"
    _snapshot(sp / "savepoint-aaaaaa-1", 1_000_000)
    sp.chmod(0)
    try:
        with pytest.raises(ObserveError):
            rt.stored_snapshots("orders")
        assert observe(rt, ["orders"]).get("orders").evidence_error
    finally:
        sp.chmod(0o755)
