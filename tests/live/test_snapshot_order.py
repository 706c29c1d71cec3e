"""Issue 35: every runtime's `stored_snapshots` lists newest first (tests/live/snapshot_contract.py), and what
`observe` takes from it is the newest savepoint and the newest checkpoint. The local runtime and a session cluster
over it here, the fakes other tests stand on too; Kubernetes in tests/kubernetes/test_snapshot_order_k8s.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from reconciler.clock import FakeClock, SystemClock
from reconciler.core.observed import Checkpoint, ClusterPhase, LiveApp
from reconciler.live.local.runtime import LocalRuntime
from reconciler.live.observe import observe, with_stored_evidence
from reconciler.live.session import SessionRuntime
from tests.apply.fakes import FakeRuntime
from tests.daemon.test_jobmanager_dies_mid_upgrade import DyingJobManager
from tests.live.snapshot_contract import CREATED, assert_newest_first, write_all


def test_the_local_runtime_lists_newest_first_by_completion_time(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path, clock=SystemClock())
    created = write_all(tmp_path / "savepoints" / "orders", tmp_path / "checkpoints" / "orders")
    assert_newest_first(rt.stored_snapshots("orders"), created)
    live = observe(rt, ["orders"]).get("orders")
    assert live.stored_savepoint is not None and live.stored_savepoint.path.endswith("savepoint-cccccc-000003")
    assert live.stored_checkpoint is not None and live.stored_checkpoint.path.endswith(f"{'b' * 32}/chk-3")


def test_an_app_on_a_session_cluster_lists_what_its_host_lists(tmp_path: Path) -> None:
    host = LocalRuntime(tmp_path, clock=SystemClock())
    created = write_all(tmp_path / "savepoints" / "orders", tmp_path / "checkpoints" / "orders")
    assert_newest_first(SessionRuntime(host).stored_snapshots("orders"), created)


def test_the_fake_runtimes_keep_the_contract_too(tmp_path: Path) -> None:
    """Other tests stand on them: a fake out of order would hide a rewind."""
    clock = FakeClock()
    dying = DyingJobManager(clock, savepoint_dir=str(tmp_path))
    dying.clusters["orders"] = None  # type: ignore[assignment]  # listed only for an app it knows
    dying.retained = [Checkpoint(path=f"file:///ck/{rel}", completed_at=datetime.fromtimestamp(at, UTC))
                      for rel, at in CREATED]
    assert_newest_first(dying.stored_snapshots("orders"), None)
    assert len(dying.stored_snapshots("orders")) == len(CREATED)
    assert FakeRuntime(clock).stored_snapshots("orders") == []


class _Unordered(FakeRuntime):
    """A runtime that breaks the contract (oldest first)."""

    def __init__(self, clock: FakeClock, snapshots: list[Checkpoint]) -> None:
        super().__init__(clock)
        self.snapshots = snapshots

    def stored_snapshots(self, app: str) -> list[Checkpoint]:
        return self.snapshots


def test_observe_takes_the_newest_of_each_kind_even_from_a_list_out_of_order() -> None:
    """Defence in depth: the evidence is the newest by time, not the first listed."""
    clock = FakeClock()
    snaps = [Checkpoint(path=f"file:///s/{rel}", completed_at=datetime.fromtimestamp(at, UTC),
                        is_savepoint=rel.startswith("savepoint-")) for rel, at in CREATED]
    rt = _Unordered(clock, sorted(snaps, key=lambda c: c.completed_at))
    live = with_stored_evidence(rt, LiveApp(name="orders", cluster=ClusterPhase.ABSENT))
    assert live.stored_savepoint is not None and live.stored_savepoint.path.endswith("savepoint-cccccc-000003")
    assert live.stored_checkpoint is not None and live.stored_checkpoint.path.endswith(f"{'b' * 32}/chk-3")
