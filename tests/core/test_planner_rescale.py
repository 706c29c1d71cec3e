"""Issue 11 item 2: in-place rescale (opt-in, Flink's adaptive scheduler), the spec and the planner's rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from reconciler.core.observed import JobPhase, LiveApp
from reconciler.core.plan import Action, Plan, RescaleInPlace, describe_step
from reconciler.core.planner import OFFLINE_JOB_ID, offline_input, plan
from reconciler.core.render import to_text
from reconciler.spec.load import LoadedApp, LoadResult, load_files
from reconciler.spec.model import FlinkApp
from tests.core.builders import BASE, NOW, REV, app, inp, merge, running

SPEC = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: a
spec:
  taskManager: {{replicas: 1, slots: 4}}
  flinkConfiguration:
    execution.checkpointing.interval: 1 s
{scheduler}  upgrade:
    inPlaceRescale: true
  job:
    jarURI: jobs/counter.jar
"""


def test_in_place_rescale_without_the_adaptive_scheduler_is_an_error_at_its_line() -> None:
    text = SPEC.format(scheduler="")
    (err,) = load_files({"apps/a.yaml": text.encode()}).errors
    assert (err.file, err.line, err.field, err.app) == ("apps/a.yaml", 9, "spec.upgrade", "a")
    assert "inPlaceRescale needs Flink's adaptive scheduler" in err.message
    assert "jobmanager.scheduler: adaptive" in err.message


def test_in_place_rescale_with_the_adaptive_scheduler_loads() -> None:
    text = SPEC.format(scheduler="    jobmanager.scheduler: Adaptive\n")
    result = load_files({"apps/a.yaml": text.encode()})
    assert not result.errors
    assert result.apps["a"].app.spec.upgrade.in_place_rescale


# ---- the planner's rows ---------------------------------------------------------------------------

ADAPTIVE: dict[str, Any] = {"flinkConfiguration": {"execution.checkpointing.interval": "5s",
                                                    "jobmanager.scheduler": "adaptive"},
                            "upgrade": {"inPlaceRescale": True}}
JOB = "j" * 32
GRACE0 = {"gracePeriod": "0s"}
RUNNING = running(job_id=JOB)
RESCALE_STEPS = ("RescaleInPlace", "StopWithSavepoint", "EnsureCluster", "StartJob", "AwaitRunning", "AwaitHealthy")
UPGRADE_STEPS = RESCALE_STEPS[1:]


def spec(parallelism: int, **over: Any) -> FlinkApp:
    return app(**merge(merge(ADAPTIVE, {"job": {"parallelism": parallelism}}), over))


def _no_ckpt(parallelism: int) -> FlinkApp:
    return app(flinkConfiguration={"jobmanager.scheduler": "adaptive"}, upgrade={"inPlaceRescale": True},
               job={"parallelism": parallelism})


def _loaded(a: FlinkApp) -> LoadResult:
    return LoadResult(apps={a.name: LoadedApp(app=a, file=f"apps/{a.name}.yaml", doc_index=0)})


@dataclass(frozen=True)
class Row:
    id: str
    previous: FlinkApp
    desired: FlinkApp
    action: Action
    steps: tuple[str, ...]
    reason: str
    live: LiveApp = RUNNING


ROWS = [
    Row("parallelism only: in place, the upgrade as fallback", spec(1), spec(2), Action.SCALE, RESCALE_STEPS,
        "spec.job.parallelism 1 -> 2: rescaled in place by the adaptive scheduler (the same job keeps running, "
        "restarted from its own latest checkpoint); if that fails: spec.job.parallelism changed (upgrade): "
        "savepoint upgrade via savepoint"),
    Row("scale down in place", spec(4), spec(2), Action.SCALE, RESCALE_STEPS, "parallelism 4 -> 2: rescaled in place"),
    Row("opted out: the regular upgrade, no word of rescaling", spec(1, upgrade={"inPlaceRescale": False}),
        spec(2, upgrade={"inPlaceRescale": False}), Action.UPGRADE, UPGRADE_STEPS,
        "spec.job.parallelism changed (upgrade): savepoint upgrade via savepoint"),
    Row("args too: not parallelism-only", spec(1), spec(2, job={"args": ["--rate", "7"]}), Action.UPGRADE,
        UPGRADE_STEPS, "(not rescaled in place: spec.job.args changed too (upgrade), not only the parallelism)"),
    Row("more TaskManagers for the new parallelism: started first, then in place",
        spec(2, taskManager={"replicas": 1, "slots": 2}), spec(4, taskManager={"replicas": 2, "slots": 2}),
        Action.SCALE, ("EnsureCluster", *RESCALE_STEPS), "parallelism 2 -> 4 on taskManager.replicas 1 -> 2 "
        "(started first, the job untouched): rescaled in place"),
    Row("fewer TaskManagers with the parallelism: not in place", spec(4, taskManager={"replicas": 2, "slots": 2}),
        spec(2, taskManager={"replicas": 1, "slots": 2}), Action.UPGRADE, UPGRADE_STEPS,
        "(not rescaled in place: spec.taskManager.replicas changed too (upgrade)"),
    Row("more slots per TaskManager: not in place", spec(1, taskManager={"replicas": 1, "slots": 2}),
        spec(2, taskManager={"replicas": 2, "slots": 4}), Action.UPGRADE, UPGRADE_STEPS,
        "changed too (upgrade), not only the parallelism"),
    Row("checkpointing off: a rescale would restart from empty state", _no_ckpt(1), _no_ckpt(2), Action.UPGRADE,
        UPGRADE_STEPS[:-1],
        "(not rescaled in place: checkpointing is off"),
    # past the recovery grace period (0s here): a job still starting then is a job to replace, not to wait for
    Row("job still starting, savepoint mode: the upgrade's answer stands", spec(1, recovery=GRACE0),
        spec(2, recovery=GRACE0), Action.BLOCKED, (),
        f"job {JOB} is RUNNING and upgradeMode is savepoint", live=running(job_id=JOB, phase=JobPhase.STARTING)),
    Row("job still starting, stateless", spec(1, job={"upgradeMode": "stateless"}, recovery=GRACE0),
        spec(2, job={"upgradeMode": "stateless"}, recovery=GRACE0), Action.UPGRADE, ("CancelJob", *UPGRADE_STEPS[1:]),
        "while the job is down: stateless upgrade via cancel", live=running(job_id=JOB, phase=JobPhase.STARTING)),
    Row("last-state: the fallback cancels keeping the checkpoint", spec(1, job={"upgradeMode": "last-state"}),
        spec(2, job={"upgradeMode": "last-state"}), Action.SCALE,
        ("RescaleInPlace", "CancelJob", *UPGRADE_STEPS[1:]), "if that fails: spec.job.parallelism changed (upgrade): "
        "last-state upgrade via cancel"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_in_place_rescale_table(row: Row) -> None:
    p = plan(inp([row.desired], [row.previous], [row.live])).app("orders")
    assert p.action is row.action, p.reason
    assert tuple(s.type for s in p.steps) == row.steps, p.steps
    assert row.reason in p.reason, p.reason
    stateless = row.desired.spec.job.upgrade_mode.value == "stateless"
    assert bool(p.risks) is stateless, "the rescale adds no risk; the fallback's own risks stay listed"
    if row.action is Action.BLOCKED:
        return
    if row.action is Action.SCALE:
        tms = 1 if p.steps[0].type == "EnsureCluster" else 0
        first = p.steps[tms]
        assert isinstance(first, RescaleInPlace)
        assert (first.job_id, first.parallelism, first.previous_parallelism) == (
            JOB, row.desired.spec.job.parallelism, row.previous.spec.job.parallelism)
        assert first.deadline_s == row.desired.spec.deadlines.rescale.total_seconds() == 120
        assert p.rollback_after == 1 + tms, "a failure after the fallback's stop rolls back, as in the upgrade"
        assert tuple(s.type for s in p.rollback) == ("EnsureCluster", "StartJob", "AwaitRunning")
        assert "the steps below run instead" in describe_step(first)
    else:
        assert p.rollback_after == 0


def test_the_plan_round_trips_and_renders_the_fallback() -> None:
    result = plan(inp([spec(3)], [spec(1)], [running(job_id=JOB)]))
    assert Plan.from_json(result.to_json()) == result
    text = to_text(result)
    assert f"rescale job {JOB} in place from parallelism 1 to 3" in text
    assert f"stop job {JOB} with a savepoint" in text  # the fallback is in the plan, for the reviewer


def test_an_offline_preview_shows_the_rescale_of_the_running_job() -> None:
    result = plan(offline_input(_loaded(spec(1)), _loaded(spec(2)), base_revision=BASE, revision=REV, now=NOW))
    first = result.app("orders").steps[0]
    assert isinstance(first, RescaleInPlace) and first.job_id == OFFLINE_JOB_ID
