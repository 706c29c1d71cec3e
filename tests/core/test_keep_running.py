"""Which plans reconfigure a cluster under its running job (`EnsureCluster.keep_running`): a change that does not
restart the job must not replace the processes that run it, whatever else a newer reconciler would render for them
(docs/kubernetes.md, "Upgrading the reconciler"). Plans that start a new job reconfigure freely."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.core.plan import Action, EnsureCluster, describe_step
from reconciler.core.planner import PlanInput, plan
from tests.core.builders import app, inp, record, running

CKPT: dict[str, Any] = {"flinkConfiguration": {"execution.checkpointing.interval": "5s"}}
RESCALE: dict[str, Any] = {**CKPT, "upgrade": {"inPlaceRescale": True},
           "flinkConfiguration": {**CKPT["flinkConfiguration"], "jobmanager.scheduler": "adaptive"}}


@pytest.mark.parametrize(("case", "given", "action", "keep"), [
    ("taskManager.replicas", inp([app(taskManager={"replicas": 3})], previous=[app()], live=[running()],
                                 records=[record()]), Action.SCALE, [True]),
    ("parallelism in place, TaskManagers first", inp(
        [app(**RESCALE, taskManager={"replicas": 2}, job={"parallelism": 8})], previous=[app(**RESCALE)],
        live=[running()], records=[record()]), Action.SCALE, [True, False]),
    ("a deleted TaskManager workload", inp([app()], previous=[app()], live=[running().model_copy(
        update={"missing_processes": ("taskmanager",)})], records=[record()]), Action.REPAIR, [True]),
    ("an upgrade: a new job", inp([app(image="flink:2.3-b")], previous=[app()], live=[running()],
                                  records=[record()]), Action.UPGRADE, [False]),
])
def test_keep_running(case: str, given: PlanInput, action: Action, keep: list[bool]) -> None:
    ap = plan(given).app("orders")
    assert ap.action is action, ap.reason
    ensures = [s for s in ap.steps if isinstance(s, EnsureCluster)]
    assert [s.keep_running for s in ensures] == keep, case
    assert all(not s.keep_running for s in ap.rollback if isinstance(s, EnsureCluster))
    if keep[0]:
        assert describe_step(ensures[0]).endswith("; the running job's processes are kept)")
