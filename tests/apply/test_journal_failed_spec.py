"""Issue 35: the record remembers the spec whose own execution failed apart from the last attempt, which a repair
rewrites to the spec it runs; a repair of the last applied spec stays applied at that spec's own revision."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action, AppPlan, spec_hash
from tests.apply.fakes import make_app

A, B = make_app(), make_app(parallelism=2)
REV_A, REV_B = "a" * 40, "b" * 40


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with Journal(tmp_path / "journal", FakeClock()) as j:
        yield j


def _run(j: Journal, revision: str, plan: AppPlan, outcome: Outcome, message: str, **kw: object) -> None:
    j.begin("orders", revision, plan)
    j.finish("orders", outcome, message, applied_spec=plan.desired if outcome is Outcome.SUCCESS else None,
             **kw)  # type: ignore[arg-type]


def _applied_a_failed_b(j: Journal) -> None:
    _run(j, REV_A, AppPlan(app="orders", action=Action.CREATE, reason="new", desired=A.canonical()),
         Outcome.SUCCESS, "created", job_id="1" * 32)
    _run(j, REV_B, AppPlan(app="orders", action=Action.UPGRADE, reason="up", desired=B.canonical(),
                           previous=A.canonical()), Outcome.FAILURE, "stop failed: disk full")


def test_a_failed_upgrade_is_remembered_and_a_repair_of_the_last_applied_spec_keeps_it(journal: Journal) -> None:
    _applied_a_failed_b(journal)
    rec = journal.record("orders")
    assert rec is not None and (rec.failed_spec_hash, rec.failed_revision, rec.failed_message) == (
        spec_hash(B.canonical()), REV_B, "stop failed: disk full")
    heal = AppPlan(app="orders", action=Action.REPAIR, reason="heal", desired=A.canonical(), previous=A.canonical(),
                   failed="this spec already failed at revision bbbbbbbbbbbb: stop failed: disk full",
                   desired_revision=REV_A)
    _run(journal, REV_B, heal, Outcome.SUCCESS, "repaired", job_id="2" * 32)
    rec = journal.record("orders")
    assert rec is not None and rec.last_attempted_spec_hash == spec_hash(A.canonical())
    assert rec.failed_spec_hash == spec_hash(B.canonical()), "kept through the repair"
    assert rec.last_applied_spec == A.canonical() and rec.last_applied_revision == REV_A, "applied at its revision"
    assert journal.lineage("orders")[-1].revision == REV_A and journal.lineage("orders")[-1].job_id == "2" * 32


def test_an_interrupted_or_a_repairs_failure_is_not_the_specs(journal: Journal) -> None:
    _run(journal, REV_A, AppPlan(app="orders", action=Action.CREATE, reason="new", desired=A.canonical()),
         Outcome.SUCCESS, "created")
    _run(journal, REV_B, AppPlan(app="orders", action=Action.UPGRADE, reason="up", desired=B.canonical()),
         Outcome.FAILURE, "interrupted: the JobManager died", interrupted=True)
    _run(journal, REV_B, AppPlan(app="orders", action=Action.REPAIR, reason="fix", desired=A.canonical()),
         Outcome.FAILURE, "repair failed")
    rec = journal.record("orders")
    assert rec is not None and rec.failed_spec_hash is None


def test_a_spec_applied_since_forgets_the_failure(journal: Journal) -> None:
    _applied_a_failed_b(journal)
    c = make_app(parallelism=3)
    _run(journal, "c" * 40, AppPlan(app="orders", action=Action.UPGRADE, reason="up", desired=c.canonical()),
         Outcome.SUCCESS, "upgraded")
    rec = journal.record("orders")
    assert rec is not None and rec.failed_spec_hash is None and rec.failed_revision is None
