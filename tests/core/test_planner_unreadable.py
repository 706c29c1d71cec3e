"""The decision table for apps whose record, or whose runtime's own account, cannot be read.

Such an app waits, BLOCKED with what is wrong and what to do; it is never planned as if it had no record (a
first sight: a create from empty state, an orphan to delete). Every other app is planned as usual."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from reconciler.core.observed import ClusterPhase, LiveApp, Records
from reconciler.core.plan import Action
from reconciler.core.planner import Desired, PlanInput, Policy, plan
from reconciler.errors import SpecError
from tests.core.builders import absent, app, inp, record, running

BROKEN = ("/state/records/orders.json: not a readable flink-reconciler record (Unterminated string). Nothing "
          "is done to the app until it is repaired: run `flink-reconciler record rebuild orders`")
NEWER = "record of app 'orders': written by a newer flink-reconciler (record version 99, ...); upgrade flink-reconciler"
CLUSTER = "cannot read /state/clusters/orders/cluster.json: ... move the file aside"
P1, P2, OTHER = app(), app(job={"parallelism": 2}), app("other")
PRUNE = Policy(prune=True)


def broken_record(i: PlanInput, why: str = BROKEN, name: str = "orders") -> PlanInput:
    return dataclasses.replace(i, records=i.records.model_copy(update={"broken": {**i.records.broken, name: why}}))


def unreadable(name: str = "orders", phase: ClusterPhase = ClusterPhase.UNKNOWN) -> LiveApp:
    return LiveApp(name=name, cluster=phase, cluster_message=CLUSTER, unreadable=CLUSTER)


@dataclass(frozen=True)
class Row:
    id: str
    input: PlanInput
    reason: str


ROWS = [
    # the record is unreadable
    Row("running app, spec unchanged", broken_record(inp([P1, OTHER], [], [running()])), BROKEN),
    Row("running app, spec changed (would upgrade)", broken_record(inp([P2, OTHER], [], [running()])), BROKEN),
    Row("nothing live (would be a create from empty state)", broken_record(inp([P1, OTHER], [], [absent()])),
        BROKEN),
    Row("spec removed, pruning on (would be an orphan deleted)",
        broken_record(inp([OTHER], [], [running()], policy=PRUNE)), BROKEN),
    Row("spec removed, nothing live: still a row", broken_record(inp([OTHER])), BROKEN),
    Row("a record from a newer version", broken_record(inp([P2, OTHER], [], [running()])), BROKEN),
    Row("newer version, nothing live", broken_record(inp([P1, OTHER]), NEWER), NEWER),
    Row("the spec is invalid too", broken_record(inp([OTHER], [], [running()], desired_obj=Desired(
        apps={"other": OTHER}, errors=(SpecError("bad", file="apps/orders.yaml", line=1, app="orders"),)))), BROKEN),
    # the runtime's own account of the app is unreadable (a corrupt cluster.json, a hand-edited root pointer)
    Row("cluster file unreadable, app on record", inp([P1, OTHER], [P1], [unreadable()]), CLUSTER),
    Row("cluster file unreadable, spec changed", inp([P2, OTHER], [P1], [unreadable()]), CLUSTER),
    Row("cluster file unreadable, no record (would be adopted or created)", inp([P1, OTHER], [], [unreadable()]),
        CLUSTER),
    Row("cluster file unreadable, no spec, no record, pruning on",
        inp([OTHER], [], [unreadable()], policy=PRUNE), CLUSTER),
    Row("standby file unreadable beside a ready live cluster",
        inp([P2, OTHER], [P1], [unreadable(phase=ClusterPhase.READY)]), CLUSTER),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_an_unreadable_app_is_blocked_and_the_others_are_planned(row: Row) -> None:
    result = plan(row.input)
    ap = result.app("orders")
    assert ap.action is Action.BLOCKED and not ap.steps and not ap.rollback
    assert row.reason in ap.reason
    other = result.app("other")
    assert other.action is Action.CREATE  # every other app is planned as usual
    # the same input without the problem plans something else for orders: the block is what this row adds
    healthy = dataclasses.replace(row.input, records=Records(apps=row.input.records.apps),
                                  live=row.input.live.model_copy(update={"apps": {
                                      n: a.model_copy(update={"unreadable": None})
                                      for n, a in row.input.live.apps.items()}}))
    assert all(a.reason != ap.reason for a in plan(healthy).apps)


def test_broken_apps_do_not_count_as_deletions_for_the_mass_deletion_guard() -> None:
    live = [running("a"), running("b"), running("c"), running("d")]
    i = inp([app("a")], [app("a")], live, policy=PRUNE)
    for name in ("b", "c", "d"):
        i = broken_record(i, f"record of {name} unreadable", name)
    result = plan(i)
    assert result.guard is None
    assert {a.app: a.action for a in result.apps} == {"a": Action.NOOP, "b": Action.BLOCKED, "c": Action.BLOCKED,
                                                       "d": Action.BLOCKED}


def test_a_record_for_a_broken_app_is_not_used_even_if_one_is_known() -> None:
    """A shell that still has a stale good copy must not plan from it while the store says the record is broken."""
    i = broken_record(inp([P2], [P1], [running()], records=[record(last_applied_revision="a" * 40)]))
    assert plan(i).app("orders").action is Action.BLOCKED
