"""The planner and the executor agree through the journal: the real planner's plans run on the
in-memory Flink, and a revision that failed is not retried in a loop (DESIGN.md safety rule 3)."""

from __future__ import annotations

from pathlib import Path

from reconciler.apply.executor import Executor
from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import ClusterPhase, LiveApp, LiveState, Outcome, job_phase
from reconciler.core.plan import Action, AppPlan
from reconciler.core.planner import Desired, PlanInput, plan
from reconciler.spec.model import FlinkApp
from tests.apply.fakes import TERMINAL, Behaviour, FakeRuntime, make_app

REV1, REV2, REV3 = "1" * 40, "2" * 40, "3" * 40


def observe(rt: FakeRuntime, name: str) -> LiveState:
    cluster = rt.clusters.get(name)
    if cluster is None:
        return LiveState(apps={name: LiveApp(name=name, cluster=ClusterPhase.ABSENT)})
    live = [j for j in cluster.flink.jobs() if j.state not in TERMINAL]
    j = live[-1] if live else None
    return LiveState(apps={name: LiveApp(
        name=name, cluster=ClusterPhase.READY, job_id=j.job_id if j else None, flink_state=j.state if j else None,
        job=job_phase(j.state if j else None, j.tasks_running if j else 0, j.tasks_total if j else 0),
    )})


def planned(rt: FakeRuntime, journal: Journal, clock: FakeClock, revision: str, desired: FlinkApp,
            previous: FlinkApp | None) -> AppPlan:
    name = desired.name
    return plan(PlanInput(
        revision=revision,
        desired=Desired(apps={name: desired}, sources={name: f"apps/{name}.yaml"}),
        previous={name: previous} if previous else {},
        previous_sources={name: f"apps/{name}.yaml"} if previous else {},
        live=observe(rt, name),
        records=journal.records(),
        now=clock.now(),
    )).app(name)


def test_planned_create_upgrade_rollback_and_no_retry_loop(tmp_path: Path) -> None:
    clock = FakeClock()
    rt = FakeRuntime(clock)
    rt.behaviours["com.example.Typo"] = Behaviour.BAD_ENTRY_CLASS
    with Journal(tmp_path / "journal", clock) as journal:
        ex = Executor(rt, journal, clock, resolve_jar=lambda app: Path("/jars/counter.jar"))
        v1 = make_app()
        create = planned(rt, journal, clock, REV1, v1, None)
        assert create.action is Action.CREATE
        assert ex.run_app(REV1, create).outcome is Outcome.SUCCESS
        first_job = observe(rt, "orders").apps["orders"].job_id

        clock.advance(10)
        bad = make_app(entry_class="com.example.Typo")
        up = planned(rt, journal, clock, REV2, bad, v1)
        assert up.action is Action.UPGRADE
        result = ex.run_app(REV2, up)
        assert result.outcome is Outcome.FAILURE and result.rolled_back, result.message
        live = observe(rt, "orders").apps["orders"]
        assert live.job_id not in (None, first_job) and live.job.value == "running"

        # The same spec again (the next tick, or an unrelated commit): blocked, never re-run.
        submits = len(rt.submits)
        for revision in (REV2, REV3, REV3):
            again = planned(rt, journal, clock, revision, bad, v1)
            assert again.action is Action.BLOCKED, again.reason
            assert ex.run_app(revision, again).outcome is Outcome.FAILURE
        assert len(rt.submits) == submits

        # A fix is a new spec: it runs, from the rolled-back job's savepoint, with a fresh job id.
        fixed = make_app(parallelism=2)
        retry = planned(rt, journal, clock, REV3, fixed, v1)
        assert retry.action is Action.UPGRADE, retry.reason
        result = ex.run_app(REV3, retry)
        assert result.outcome is Outcome.SUCCESS, result.message
        assert len(set(rt.submits)) == len(rt.submits)
        rec = journal.record("orders")
        assert rec is not None and rec.last_applied_revision == REV3 and rec.last_applied_spec == fixed.canonical()
