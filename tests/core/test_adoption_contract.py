"""Adoption and orphans, planner + executor + journal together: the real planner's plans, observed
with the real `observe()`, run on the in-memory Flink of tests/apply/fakes.py.

An app deleted from Git while the journal was lost (a new journal file) is pruned only after a final
savepoint, and re-adding its spec restores from that savepoint. (The stopped job's savepoint as
evidence is checked on real Flink: tests/e2e/test_adoption_e2e.py.)"""

from __future__ import annotations

from pathlib import Path

from reconciler.apply.executor import Executor
from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action, Plan, RestoreKind, StartJob
from reconciler.core.planner import Desired, PlanInput, Policy, plan
from reconciler.live.observe import observe
from reconciler.spec.model import FlinkApp
from tests.apply.fakes import TERMINAL, FakeRuntime, make_app

REV1, REV2, REV3 = "1" * 40, "2" * 40, "3" * 40


def planned(rt: FakeRuntime, journal: Journal, clock: FakeClock, revision: str, desired: list[FlinkApp],
            *, prune: bool = False) -> Plan:
    records = journal.records()
    previous = {n: FlinkApp.model_validate(r.last_applied_spec) for n, r in records.apps.items()
                if r.last_applied_spec}
    names = {a.name for a in desired} | set(previous)
    return plan(PlanInput(
        revision=revision,
        desired=Desired(apps={a.name: a for a in desired}, sources={a.name: f"apps/{a.name}.yaml" for a in desired}),
        previous=previous,
        previous_sources={n: r.source_file for n, r in records.apps.items() if r.source_file},
        live=observe(rt, names),
        records=records,
        now=clock.now(),
        policy=Policy(prune=prune),
    ))


def live_jobs(rt: FakeRuntime, app: str) -> list[str]:
    return [j.job_id for j in rt.clusters[app].flink.jobs() if j.state not in TERMINAL]


def test_orphan_is_pruned_after_a_final_savepoint_and_a_readded_spec_restores_it(tmp_path: Path) -> None:
    clock = FakeClock()
    rt = FakeRuntime(clock)
    orders, ghost = make_app("orders"), make_app("ghost")
    with Journal(tmp_path / "old.sqlite", clock) as old:
        ex = Executor(rt, old, clock, resolve_jar=lambda app: Path("/jars/counter.jar"))
        for app_plan in planned(rt, old, clock, REV1, [orders, ghost]).apps:
            assert ex.run_app(REV1, app_plan).outcome is Outcome.SUCCESS
    clock.advance(30)

    # The journal is lost, and ghost's spec is deleted from Git meanwhile.
    with Journal(tmp_path / "new.sqlite", clock) as journal:
        ex = Executor(rt, journal, clock, resolve_jar=lambda app: Path("/jars/counter.jar"))
        kept = planned(rt, journal, clock, REV2, [orders]).app("ghost")
        assert kept.action is Action.NOOP and "pruning is disabled" in kept.reason and not kept.steps

        the_plan = planned(rt, journal, clock, REV2, [orders], prune=True)
        assert the_plan.guard is None
        adopted = the_plan.app("orders")
        assert adopted.action is Action.NOOP, adopted.reason  # its running job is adopted as it is
        pruned = the_plan.app("ghost")
        assert pruned.action is Action.DELETE, pruned.reason
        assert [s.type for s in pruned.steps] == ["StopWithSavepoint", "DeleteCluster"]
        job = live_jobs(rt, "ghost")[0]
        result = ex.run_app(REV2, pruned)
        assert result.outcome is Outcome.SUCCESS, result.message
        journal.mark_deleted("ghost")
        assert "ghost" not in rt.clusters
        final = journal.records().get("ghost")
        assert final is not None and final.latest_savepoint is not None
        assert final.latest_savepoint.job_id == job

        # The spec comes back: the app restores from that final savepoint, never from empty state.
        clock.advance(30)
        again = planned(rt, journal, clock, REV3, [orders, ghost]).app("ghost")
        assert again.action is Action.CREATE and "last savepoint on record" in again.reason, again.reason
        start = next(s for s in again.steps if isinstance(s, StartJob))
        assert start.restore.kind is RestoreKind.PATH and start.restore.path == final.latest_savepoint.path
        assert ex.run_app(REV3, again).outcome is Outcome.SUCCESS
        assert rt.clusters["ghost"].flink.jobs_by_id[start.job_id].restored_from == final.latest_savepoint.path

