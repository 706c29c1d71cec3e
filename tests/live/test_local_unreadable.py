"""A local cluster file that cannot be read (cluster.json, standby.json, retired.json, written here by hand: no JVM)
blocks its own app, with what to do; every other app is observed and planned as usual."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.observed import ClusterPhase
from reconciler.core.plan import Action
from reconciler.live.local.config import ClusterRecord, ProcRecord
from reconciler.live.local.runtime import LocalRuntime
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.load import load_files
from tests.gitutil import Repo, spec


def _cluster(app: str, cluster_id: str) -> str:
    now = datetime(2026, 6, 1, tzinfo=UTC)
    return ClusterRecord(app=app, cluster_id=cluster_id, config_hash="h", rest_port=1, rpc_port=2, started_at=now,
                         replicas=1, slots=1, jobmanager=ProcRecord(role="jobmanager", index=0, pid=0, started_at=now),
                         ).model_dump_json()


@pytest.mark.parametrize("slot", ["cluster", "standby", "retired"])
def test_an_unreadable_cluster_file_blocks_its_app_only(tmp_path: Path, slot: str) -> None:
    repo = Repo(tmp_path)
    for name in ("a", "b", "c"):
        repo.write(f"apps/{name}.yaml", spec(name))
    rev = repo.commit("three apps")
    state = tmp_path / "state"
    clock = SystemClock()
    journal = Journal(state / "journal", clock)
    for name in ("b", "c"):
        applied = load_files({f"apps/{name}.yaml": spec(name).encode()}).apps[name].app.canonical()
        journal.record_adopted(name, rev, applied, source_file=f"apps/{name}.yaml")
    runtime = LocalRuntime(state, clock=clock)
    for name in ("b", "c"):  # c's files are fine (its JobManager is gone: FAILED, a repair)
        runtime.paths(name).root.mkdir(parents=True)
        runtime.paths(name).record.write_text(_cluster(name, f"{name}-0123456789ab"))
    broken = runtime.paths("b").slot(slot)
    broken.write_text('{"app": "b", "cluster_id": "b-0123456789ab", "rest_po')  # cut short

    clusters = runtime.list_clusters()  # never raises for one app
    assert set(clusters) == {"b", "c"} and clusters["c"].phase is ClusterPhase.FAILED and not clusters["c"].unreadable
    why = clusters["b"].unreadable
    assert why is not None and str(broken) in why and f"mv {broken} {broken}.broken" in why
    assert "pgrep -af 'flink-reconciler.cluster=b-[0-9a-f]{12}'" in why

    rec = Reconciler(source=GitSource(str(repo.origin), state / "git"), runtime=runtime, journal=journal,
                     clock=clock, subdir="apps")
    rec.source.fetch()
    result = rec.plan(rec.source.head())
    actions = {a.app: a.action for a in result.apps}
    assert actions["a"] is Action.CREATE and actions["b"] is Action.BLOCKED
    assert "cannot read" not in result.app("c").reason  # planned from its own, readable files
    assert result.app("b").reason == why and not result.app("b").steps
    assert broken.read_text() == '{"app": "b", "cluster_id": "b-0123456789ab", "rest_po'  # left for the human
