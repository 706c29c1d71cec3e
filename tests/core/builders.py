"""Small builders for table tests of the pure core."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from reconciler.core.observed import (
    AppRecord,
    Checkpoint,
    ClusterPhase,
    JobPhase,
    LiveApp,
    LiveState,
    Outcome,
    Records,
    SavepointRecord,
)
from reconciler.core.planner import Desired, PlanInput, Policy
from reconciler.spec.model import FlinkApp

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
REV = "b" * 40
BASE = "a" * 40


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def app(name: str = "orders", **spec: Any) -> FlinkApp:
    doc = {
        "apiVersion": "flink-reconciler.io/v1alpha1",
        "kind": "FlinkApp",
        "metadata": {"name": name},
        "spec": merge({"taskManager": {"slots": 4}, "job": {"jarURI": "jobs/counter.jar", "parallelism": 1}}, spec),
    }
    return FlinkApp.model_validate(doc)


def with_meta(a: FlinkApp, **meta: Any) -> FlinkApp:
    doc = copy.deepcopy(a.canonical())
    doc["metadata"] = merge(doc["metadata"], meta)
    return FlinkApp.model_validate(doc)


def running(name: str = "orders", job_id: str = "j" * 32, *, ckpt_age: timedelta | None = None,
            state: str = "RUNNING", phase: JobPhase = JobPhase.RUNNING) -> LiveApp:
    ckpt = None
    if ckpt_age is not None:
        ckpt = Checkpoint(path=f"file:///ckpt/{name}/chk-7", completed_at=NOW - ckpt_age)
    return LiveApp(name=name, cluster=ClusterPhase.READY, job_id=job_id, flink_state=state, job=phase,
                   latest_checkpoint=ckpt)


def failed(name: str = "orders", **kw: Any) -> LiveApp:
    return running(name, state="FAILED", phase=JobPhase.FAILING, **kw)


def absent(name: str = "orders") -> LiveApp:
    return LiveApp(name=name, cluster=ClusterPhase.ABSENT)


def record(name: str = "orders", *, savepoint_age: timedelta | None = None, **kw: Any) -> AppRecord:
    sps: tuple[SavepointRecord, ...] = ()
    if savepoint_age is not None:
        sps = (SavepointRecord(path=f"file:///sp/{name}/savepoint-1", taken_at=NOW - savepoint_age),)
    return AppRecord(name=name, savepoints=sps, **kw)


def inp(
    desired: list[FlinkApp],
    previous: list[FlinkApp] | None = None,
    live: list[LiveApp] | None = None,
    records: list[AppRecord] | None = None,
    policy: Policy | None = None,
    desired_obj: Desired | None = None,
) -> PlanInput:
    prev = previous or []
    return PlanInput(
        revision=REV,
        base_revision=BASE,
        desired=desired_obj or Desired(apps={a.name: a for a in desired},
                                       sources={a.name: f"apps/{a.name}.yaml" for a in desired}),
        previous={a.name: a for a in prev},
        previous_sources={a.name: f"apps/{a.name}.yaml" for a in prev},
        live=LiveState(apps={la.name: la for la in (live or [])}),
        records=Records(apps={r.name: r for r in (records or [])}),
        now=NOW,
        policy=policy or Policy(),
    )


FAILURE = Outcome.FAILURE
