"""Each planned app's health after a pass (docs/alerts.md#metrics), from what the pass already read: its plan,
the execution's outcome, the live state and records it planned from. No request of its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta

from reconciler.alerting.facts import AppFacts, facts_of
from reconciler.apply.executor import AppResult
from reconciler.core.observed import AppRecord, ClusterPhase, LiveApp
from reconciler.core.plan import Plan
from reconciler.core.planner import PlanInput
from reconciler.spec.model import FlinkApp


def pass_facts(the_plan: Plan, results: Mapping[str, AppResult], inp: PlanInput, *, specs: Mapping[str, FlinkApp],
               broken: Mapping[str, str], record: Callable[[str], AppRecord | None],
               repair_window: timedelta) -> list[AppFacts]:
    """`specs`: the apps' specs in Git at the pass's revision; `record`: an app's record now (after its execution).
    An app executed in this pass was observed before its change: its job facts wait for the next observation."""
    out = []
    for ap in the_plan.apps:
        res = results.get(ap.app)
        spec = specs.get(ap.app) or inp.previous.get(ap.app)
        live, rec = inp.live.get(ap.app), inp.records.get(ap.app)
        if res is not None:
            live = LiveApp(name=ap.app, cluster=ClusterPhase.UNKNOWN)
            rec = record(ap.app) or rec
        out.append(facts_of(ap, outcome=res.outcome if res else None, message=res.message if res else None,
                            live=live, record=rec, spec=spec, unreadable=broken.get(ap.app), now=inp.now,
                            repair_window=repair_window))
    return out
