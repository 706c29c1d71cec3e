"""Issue 11: how an upgrade reaches the cluster (job-only, warm standby, cold), as a table.

Each row: what changed, the spec's `upgrade.clusterStrategy`, whether the runtime can run a standby
cluster, the job's state, and exactly what the plan must say: strategy, steps, where the rollback
starts, the abort and rollback step lists, and the words of the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from reconciler.core.diff import diff
from reconciler.core.plan import (
    Action,
    AppPlan,
    ClusterStrategy,
    DiscardStandby,
    Plan,
    PromoteStandby,
    RestoreKind,
    StartJob,
    StartStandbyCluster,
    deterministic_job_id,
)
from reconciler.core.planner import Policy, cluster_changes, plan
from tests.core.builders import REV, app, failed, inp, record, running

CKPT: dict[str, Any] = {"flinkConfiguration": {"execution.checkpointing.interval": "5s"}}
BASE = app(**CKPT)
WARM = Policy(warm_standby=True)
COLD_RUNTIME = Policy(warm_standby=False)

WARM_STEPS = ("StartStandbyCluster", "StopWithSavepoint", "PromoteStandby", "StartJob", "AwaitRunning",
              "AwaitHealthy", "DeleteRetiredCluster")
COLD_STEPS = ("StopWithSavepoint", "EnsureCluster", "StartJob", "AwaitRunning", "AwaitHealthy")
WARM_ROLLBACK = ("DiscardStandby", "EnsureCluster", "StartJob", "AwaitRunning")
COLD_ROLLBACK = ("EnsureCluster", "StartJob", "AwaitRunning")


def changed(**spec: Any) -> Any:
    return app(**{**CKPT, **spec}) if "flinkConfiguration" not in spec else app(**spec)


TM_MEMORY = changed(taskManager={"resources": {"memory": "1536m"}})


@dataclass(frozen=True)
class Row:
    id: str
    desired: Any
    strategy: ClusterStrategy | None
    steps: tuple[str, ...]
    rollback: tuple[str, ...] = COLD_ROLLBACK
    reason: str | None = None
    policy: Policy = WARM
    live: Any = None
    rollback_after: int = 0


ROWS = [
    Row("job argument: job-only, the cluster is kept", changed(job={"args": ["--rate", "2"]}),
        ClusterStrategy.JOB_ONLY, COLD_STEPS),
    Row("parallelism: job-only", changed(job={"parallelism": 2}), ClusterStrategy.JOB_ONLY, COLD_STEPS),
    Row("restartNonce: job-only", changed(job={"restartNonce": 1}), ClusterStrategy.JOB_ONLY, COLD_STEPS),
    Row("TaskManager memory: warm standby", TM_MEMORY, ClusterStrategy.WARM_STANDBY, WARM_STEPS, WARM_ROLLBACK,
        reason="warm standby: a new cluster starts beside the running job", rollback_after=1),
    Row("TaskManager cpu: warm standby", changed(taskManager={"resources": {"cpu": 2}}),
        ClusterStrategy.WARM_STANDBY, WARM_STEPS, WARM_ROLLBACK, rollback_after=1),
    Row("slots: warm standby", changed(taskManager={"slots": 8}), ClusterStrategy.WARM_STANDBY, WARM_STEPS,
        WARM_ROLLBACK, rollback_after=1),
    Row("JobManager memory: warm standby", changed(jobManager={"resources": {"memory": "1536m"}}),
        ClusterStrategy.WARM_STANDBY, WARM_STEPS, WARM_ROLLBACK, rollback_after=1),
    Row("flink configuration: warm standby",
        app(flinkConfiguration={"execution.checkpointing.interval": "5s", "state.backend.type": "rocksdb"}),
        ClusterStrategy.WARM_STANDBY, WARM_STEPS, WARM_ROLLBACK, rollback_after=1),
    Row("image: warm standby", changed(image="flink:2.3.1"), ClusterStrategy.WARM_STANDBY, WARM_STEPS,
        WARM_ROLLBACK, rollback_after=1),
    Row("flink version: warm standby", changed(flinkVersion="2.4"), ClusterStrategy.WARM_STANDBY, WARM_STEPS,
        WARM_ROLLBACK, rollback_after=1),
    Row("TaskManager memory and a job argument: warm standby",
        changed(taskManager={"resources": {"memory": "1536m"}}, job={"args": ["x"]}),
        ClusterStrategy.WARM_STANDBY, WARM_STEPS, WARM_ROLLBACK, rollback_after=1),
    Row("the spec asks for cold", changed(taskManager={"resources": {"memory": "1536m"}},
                                          upgrade={"clusterStrategy": "cold"}),
        ClusterStrategy.COLD, COLD_STEPS, reason="cold (spec.upgrade.clusterStrategy: cold)"),
    Row("the runtime has no warm standby: cold, and the plan says so", TM_MEMORY, ClusterStrategy.COLD,
        COLD_STEPS, reason="cold: this runtime cannot run a standby cluster", policy=COLD_RUNTIME),
    Row("HA turned on (redeploy class): cold", changed(highAvailability={"enabled": True, "storageDir": "/ha"}),
        ClusterStrategy.COLD, COLD_STEPS, reason="cold: a redeploy-class field changed"),
]


def _plan(row: Row) -> AppPlan:
    live = row.live or running()
    result = plan(inp([row.desired], [BASE], [live], [record(savepoint_age=None)], policy=row.policy))
    return result.app("orders")


def _types(steps: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(s.type for s in steps)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_cluster_strategy_table(row: Row) -> None:
    p = _plan(row)
    assert p.action in (Action.UPGRADE, Action.RESTART), p.reason
    assert p.cluster_strategy is row.strategy, p.reason
    assert _types(p.steps) == row.steps, p.steps
    if row.strategy is not None:
        assert _types(p.rollback) == row.rollback
        assert p.rollback_after == row.rollback_after
    if row.reason:
        assert row.reason in p.reason, p.reason
    if row.strategy is ClusterStrategy.WARM_STANDBY:
        assert _types(p.abort) == ("DiscardStandby",)
    else:
        assert p.abort == (), "only a warm standby leaves something to undo before the stop"
    assert not p.risks


def test_a_failing_job_has_nothing_to_keep_up_so_no_strategy() -> None:
    old = app(**CKPT, job={"upgradeMode": "last-state"})
    new = app(**CKPT, job={"upgradeMode": "last-state"}, taskManager={"resources": {"memory": "1536m"}})
    p = plan(inp([new], [old], [failed(ckpt_age=timedelta(seconds=5))], [record()], policy=WARM)).app("orders")
    assert p.action is Action.UPGRADE, p.reason
    assert p.cluster_strategy is None and p.abort == ()
    assert _types(p.steps) == ("CancelJob", "EnsureCluster", "StartJob", "AwaitRunning", "AwaitHealthy")


def test_warm_standby_steps_name_one_generation_and_the_captured_savepoint() -> None:
    p = _plan(ROWS[3])
    start, stop, promote, submit = p.steps[:4]
    assert isinstance(start, StartStandbyCluster) and isinstance(promote, PromoteStandby)
    assert isinstance(submit, StartJob) and submit.restore.kind is RestoreKind.CAPTURED
    assert stop.type == "StopWithSavepoint" and stop.job_id == "j" * 32
    job = deterministic_job_id("orders", REV, 1)
    assert submit.job_id == job and start.generation == promote.generation == job[:8]
    discard = p.rollback[0]
    assert isinstance(discard, DiscardStandby) and discard.generation == start.generation
    assert p.abort == (discard,)
    back = next(s for s in p.rollback if isinstance(s, StartJob))
    assert back.spec.value == "previous" and back.restore.kind is RestoreKind.CAPTURED
    assert back.job_id == deterministic_job_id("orders", REV, 1, purpose="rollback")
    # deadlines come from the spec: the standby start is a start, discarding it a deletion
    assert start.deadline_s == 300 and discard.deadline_s == 120


def test_a_retry_gets_a_new_generation() -> None:
    """A failed revision retried (restartNonce bump or the same commit again) names a fresh standby."""
    first = _plan(ROWS[3])
    rec = record(last_attempted_revision=REV, attempts=1)
    again = plan(inp([TM_MEMORY], [BASE], [running()], [rec], policy=WARM)).app("orders")
    assert first.steps[0].generation != again.steps[0].generation  # type: ignore[union-attr]


@pytest.mark.parametrize("mode,stop", [("last-state", "CancelJob"), ("stateless", "CancelJob")])
def test_warm_standby_in_other_upgrade_modes(mode: str, stop: str) -> None:
    old = app(**CKPT, job={"upgradeMode": mode})
    new = app(**CKPT, job={"upgradeMode": mode}, taskManager={"resources": {"memory": "1536m"}})
    p = plan(inp([new], [old], [running()], [record()], policy=WARM)).app("orders")
    assert p.cluster_strategy is ClusterStrategy.WARM_STANDBY
    assert _types(p.steps)[:3] == ("StartStandbyCluster", stop, "PromoteStandby")
    if mode == "stateless":
        assert any("STARTS WITHOUT STATE" in r for r in p.risks)


def test_plan_json_round_trips_the_warm_standby_steps() -> None:
    result = plan(inp([TM_MEMORY], [BASE], [running()], [record()], policy=WARM))
    assert Plan.from_json(result.to_json()) == result


def test_cluster_changes_are_what_needs_new_jvms() -> None:
    fields = {c.path for c in cluster_changes(diff(BASE.canonical(), changed(
        taskManager={"resources": {"memory": "2g"}, "replicas": 2, "slots": 4},
        job={"args": ["a"], "parallelism": 2}, deadlines={"start": "1m"}).canonical()))}
    assert fields == {"/spec/taskManager/resources/memory"}


def test_offline_preview_shows_the_strategy_of_the_daemons_runtime() -> None:
    """Offline previews assume the base revision runs; the strategy follows the policy they are given."""
    for policy, strategy in ((WARM, ClusterStrategy.WARM_STANDBY), (COLD_RUNTIME, ClusterStrategy.COLD)):
        p = plan(inp([TM_MEMORY], [BASE], [running(job_id="<running job>")], policy=policy)).app("orders")
        assert p.cluster_strategy is strategy


@pytest.mark.parametrize("standby,retired,steps", [
    ("g1", False, ("DiscardStandby",)),
    (None, True, ("DeleteRetiredCluster",)),
    ("g1", True, ("DiscardStandby", "DeleteRetiredCluster")),
])
def test_a_leftover_standby_or_old_cluster_is_removed_when_nothing_else_is_to_do(
        standby: str | None, retired: bool, steps: tuple[str, ...]) -> None:
    live = running().model_copy(update={"standby_generation": standby, "retired_cluster": retired})
    p = plan(inp([BASE], [BASE], [live], [record()], policy=WARM)).app("orders")
    assert p.action is Action.REPAIR and _types(p.steps) == steps, p.reason
    assert "the job keeps running" in p.reason and not p.risks
    if standby:
        assert p.steps[0].generation == standby  # type: ignore[union-attr]


def test_no_leftover_means_up_to_date() -> None:
    p = plan(inp([BASE], [BASE], [running()], [record()], policy=WARM)).app("orders")
    assert p.action is Action.NOOP and p.reason == "up to date"


def test_text_and_markdown_show_the_strategy_the_rollback_and_the_undo() -> None:
    from reconciler.core.render import to_markdown, to_text

    result = plan(inp([TM_MEMORY], [BASE], [running()], [record()], policy=WARM))
    text = to_text(result)
    assert "warm standby: a new cluster starts beside the running job" in text
    assert "1. start standby cluster" in text and "7. delete the old cluster" in text
    assert "if a step after 2 fails, roll back:" in text and "r1. discard standby cluster" in text
    assert "if a step up to 2 fails, undo (the old job keeps running):" in text and "u1. discard standby" in text
    md = to_markdown(result)
    assert "If a step up to step 2 fails, undo (the old job keeps running):" in md
