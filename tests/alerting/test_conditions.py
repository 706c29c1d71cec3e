"""The pure part of alerting: an app's phase from its plan, its conditions from facts and the time, and the
firing / resend / resolved machine. Table tests; the planner itself makes the crash-loop plans judged here."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from reconciler.alerting.conditions import (
    ALERTS,
    Thresholds,
    Trigger,
    app_conditions,
    daemon_conditions,
)
from reconciler.alerting.facts import AppFacts, Phase, facts_of, flink_duration_s, phase_of
from reconciler.alerting.state import Key, Status, Timing, Tracked, advance, firing
from reconciler.core.context import FAILED_BEFORE
from reconciler.core.observed import ClusterPhase, JobPhase, LiveApp, Outcome
from reconciler.core.plan import Action, AppPlan
from reconciler.core.planner import Policy, plan
from tests.core.builders import NOW, app, failed, inp, record, running

T = Thresholds()


def ap(action: Action, reason: str = "why", repair: str | None = None) -> AppPlan:
    return AppPlan(app="orders", action=action, reason=reason, repair=repair)


def healing_after_failure(action: Action, repair: str) -> AppPlan:
    return ap(action, "this spec already failed at revision abc: ...; Meanwhile ...", repair=repair).model_copy(
        update={"failed": "stop job 0000 failed: disk full"})


@pytest.mark.parametrize(("plan_", "outcome", "phase"), [
    (ap(Action.NOOP, "in sync"), None, Phase.IN_SYNC),
    (ap(Action.NOOP, "recovering since ...", repair="recovering"), None, Phase.HEALING),
    (ap(Action.NOOP, "job needs a repair; attempt 3 waits", repair="job"), None, Phase.CRASH_LOOP),
    (ap(Action.BLOCKED, "crash loop: 5 automatic repairs ...", repair="job"), None, Phase.CRASH_LOOP),
    (ap(Action.BLOCKED, "no savepoint and no checkpoint to restore from"), None, Phase.BLOCKED),
    (ap(Action.BLOCKED, FAILED_BEFORE + " at revision abc: ..."), None, Phase.FAILED),
    (ap(Action.ERROR, "apps/x.yaml:3 spec.job: ..."), None, Phase.INVALID),
    (ap(Action.UPGRADE), None, Phase.CHANGING),
    (ap(Action.UPGRADE), Outcome.PENDING, Phase.CHANGING),
    (ap(Action.UPGRADE), Outcome.SUCCESS, Phase.IN_SYNC),
    (ap(Action.UPGRADE), Outcome.FAILURE, Phase.FAILED),
    (ap(Action.REPAIR, repair="job"), None, Phase.HEALING),
    (ap(Action.REPAIR, repair="job"), Outcome.FAILURE, Phase.HEALING),
    (ap(Action.REPAIR, repair="job"), Outcome.SUCCESS, Phase.IN_SYNC),
    (ap(Action.CREATE), Outcome.ERROR, Phase.INVALID),
    # Git's spec failed, the last applied spec is healed meanwhile (AppPlan.failed): failed, unless the heal itself
    # crash-loops (its own alert says more).
    (healing_after_failure(Action.NOOP, "recovering"), None, Phase.FAILED),
    (healing_after_failure(Action.REPAIR, "taskmanager"), Outcome.SUCCESS, Phase.FAILED),
    (healing_after_failure(Action.REPAIR, "job"), Outcome.FAILURE, Phase.FAILED),
    (healing_after_failure(Action.NOOP, "job"), None, Phase.CRASH_LOOP),
])
def test_phase_of_a_plan_and_its_outcome(plan_: AppPlan, outcome: Outcome | None, phase: Phase) -> None:
    assert phase_of(plan_, outcome) is phase


def test_the_planners_crash_loop_plans_are_the_crash_loop_phase() -> None:
    spec = app(recovery={"gracePeriod": "10s"})
    policy = Policy(repair_max_attempts=3, repair_backoff=timedelta(seconds=60))

    def phase(repairs: tuple[timedelta, ...]) -> tuple[Phase, AppPlan]:
        rec = record(savepoint_age=timedelta(minutes=5), last_applied_spec=spec.canonical(),
                     repairs_spec_hash=spec.spec_hash, unhealthy_since=NOW - timedelta(minutes=1),
                     repairs=tuple(NOW - d for d in repairs))
        the = plan(inp([spec], [spec], [failed()], [rec], policy)).app("orders")
        return phase_of(the, None), the

    assert phase(())[0] is Phase.HEALING  # a first repair is planned
    got, the = phase((timedelta(seconds=5),))  # one repair 5s ago: the next one waits out the backoff
    assert got is Phase.CRASH_LOOP and the.action is Action.NOOP, the.reason
    got, the = phase((timedelta(seconds=300), timedelta(seconds=200), timedelta(seconds=100)))  # given up
    assert got is Phase.CRASH_LOOP and the.action is Action.BLOCKED, the.reason


def test_a_pass_that_cannot_observe_the_app_keeps_its_failed_change() -> None:
    # Chaos soak run 13: right after a failed upgrade its JobManager was killed, and the next pass could not observe
    # the app ("nothing is changed until it can be observed": a NOOP). The record still remembers Git's spec as
    # failed: the alert holds (it resolved, and fired again 9 s later).
    p1, p2 = app(), app(job={"args": ["v2"]})
    rec = record(last_applied_spec=p1.canonical(), failed_spec_hash=p2.spec_hash, failed_revision="c" * 40,
                 failed_message="stop failed", last_outcome=Outcome.FAILURE, last_attempted_spec_hash=p2.spec_hash)
    unknown = LiveApp(name="orders", cluster=ClusterPhase.UNKNOWN, cluster_message="connection refused")
    the = plan(inp([p2], [p1], [unknown], [rec])).app("orders")
    assert the.action is Action.NOOP, the.reason
    f = facts_of(the, outcome=None, message=None, live=unknown, record=rec, spec=p2)
    assert f.change_failed and Trigger.CHANGE_FAILED in {c.trigger for c in app_conditions(f, NOW, T)}
    fixed = app(job={"args": ["v3"]})  # a new spec in Git: not the failed one
    assert not facts_of(the, outcome=None, message=None, live=unknown, record=rec, spec=fixed).change_failed


def test_a_change_cut_off_by_a_fault_is_healing_not_a_failed_change() -> None:
    # A JobManager killed mid-upgrade (no HA): the execution ends "interrupted", the spec is not to blame and the
    # next pass heals the app and applies it. No change-failed alert for that (the chaos soak paged it, then
    # resolved it 8 s later).
    spec, live = app(), LiveApp(name="orders", cluster=ClusterPhase.UNKNOWN)
    cut = record(last_action="interrupted", last_outcome=Outcome.FAILURE)
    f = facts_of(ap(Action.UPGRADE), outcome=Outcome.FAILURE, message="interrupted: start job ...: the JobManager "
                 "is not running", live=live, record=cut, spec=spec)
    assert f.phase is Phase.HEALING and Trigger.CHANGE_FAILED not in {c.trigger for c in app_conditions(f, NOW, T)}
    refused = record(last_action="upgrade", last_outcome=Outcome.FAILURE)
    f = facts_of(ap(Action.UPGRADE), outcome=Outcome.FAILURE, message="stop job ... failed: disk full", live=live,
                 record=refused, spec=spec)
    assert f.phase is Phase.FAILED


def test_a_repair_after_an_earlier_one_within_the_window_is_part_of_the_crash_loop() -> None:
    spec = app()
    window = timedelta(minutes=10)
    live = failed()

    def phase(*ago: timedelta) -> Phase:
        rec = record(repairs=tuple(NOW - d for d in ago))
        return facts_of(ap(Action.REPAIR, repair="job"), outcome=Outcome.FAILURE, message="job failed", live=live,
                        record=rec, spec=spec, now=NOW, repair_window=window).phase

    assert phase(timedelta(0)) is Phase.HEALING  # the first repair (the record has this one only)
    assert phase(timedelta(0), timedelta(minutes=1)) is Phase.CRASH_LOOP
    assert phase(timedelta(0), timedelta(minutes=11)) is Phase.HEALING  # the earlier one is out of the window


@pytest.mark.parametrize(("text", "seconds"), [
    ("10 s", 10.0), ("1s", 1.0), ("500 ms", 0.5), ("200ms", 0.2), ("3 min", 180.0), ("1m", 60.0), ("2 h", 7200.0),
    ("1000", 1.0), ("PT30S", 30.0), ("PT1M", 60.0), ("1 d", 86400.0), (None, None), ("soon", None), ("", None),
])
def test_flink_durations(text: str | None, seconds: float | None) -> None:
    assert flink_duration_s(text) == seconds


def facts(**kw: object) -> AppFacts:
    base: dict[str, object] = dict(app="orders", namespace="payments", phase=Phase.IN_SYNC, reason="ok",
                                   want_running=True, job_state="RUNNING", job_running=True,
                                   checkpoint_at=NOW - timedelta(seconds=5), checkpoint_interval_s=10.0)
    base.update(kw)
    return AppFacts(**base)  # type: ignore[arg-type]


def triggers(f: AppFacts, t: Thresholds = T) -> set[Trigger]:
    return {c.trigger for c in app_conditions(f, NOW, t)}


@pytest.mark.parametrize(("f", "expected"), [
    (facts(), set()),
    (facts(phase=Phase.BLOCKED), {Trigger.APP_BLOCKED}),
    (facts(phase=Phase.FAILED, change_failed=True), {Trigger.CHANGE_FAILED}),
    (facts(phase=Phase.CRASH_LOOP, change_failed=True, job_running=False, job_state="FAILED"),
     {Trigger.CHANGE_FAILED, Trigger.CRASH_LOOP}),  # Git's spec failed and the last applied one crash-loops
    (facts(phase=Phase.CRASH_LOOP, job_running=False, job_state="FAILED"), {Trigger.CRASH_LOOP}),
    (facts(phase=Phase.BLOCKED, record_unreadable="not JSON"), {Trigger.RECORDS_UNREADABLE, Trigger.APP_BLOCKED}),
    # checkpoint age: over max(3 x interval, 2 min)
    (facts(checkpoint_at=NOW - timedelta(seconds=119)), set()),
    (facts(checkpoint_at=NOW - timedelta(seconds=121)), {Trigger.CHECKPOINT_AGE}),
    (facts(checkpoint_at=NOW - timedelta(seconds=121), checkpoint_interval_s=60.0), set()),
    (facts(checkpoint_at=NOW - timedelta(seconds=181), checkpoint_interval_s=60.0), {Trigger.CHECKPOINT_AGE}),
    (facts(checkpoint_at=NOW - timedelta(hours=1), checkpoint_interval_s=None), set()),  # checkpointing off
    (facts(checkpoint_at=NOW - timedelta(hours=1), observed=False), set()),  # not looked at: nothing said
    # job not running while Git wants it: only outside a change, and after job_down_for
    (facts(job_running=False, job_state="RESTARTING", unhealthy_since=NOW - timedelta(minutes=6), phase=Phase.HEALING),
     {Trigger.JOB_NOT_RUNNING}),
    (facts(job_running=False, job_state="RESTARTING", unhealthy_since=NOW - timedelta(minutes=1), phase=Phase.HEALING),
     set()),
    (facts(job_running=False, job_state=None, phase=Phase.CHANGING), set()),
    (facts(job_running=False, job_state=None, want_running=False), set()),  # suspended in Git
    (facts(job_running=False, job_state=None, observed=False), set()),
])
def test_app_conditions(f: AppFacts, expected: set[Trigger]) -> None:
    assert triggers(f) == expected


def test_a_checkpoint_age_condition_says_how_old_and_how_many_failed() -> None:
    (c,) = app_conditions(facts(checkpoint_at=NOW - timedelta(minutes=30), checkpoints_failed=7), NOW, T)
    assert "30m ago" in c.summary and "7 failed checkpoints" in c.summary and c.namespace == "payments"


def test_facts_of_an_app_its_pass_observed() -> None:
    spec = app(flinkConfiguration={"execution.checkpointing.interval": "30 s"})
    live = running(ckpt_age=timedelta(seconds=40)).model_copy(update={"restarts": 4, "checkpoints_failed": 2})
    f = facts_of(ap(Action.NOOP, "in sync"), outcome=None, message=None, live=live, record=None, spec=spec)
    assert (f.phase, f.want_running, f.job_running, f.restarts, f.checkpoints_failed, f.checkpoint_interval_s) == (
        Phase.IN_SYNC, True, True, 4, 2, 30.0)
    unknown = LiveApp(name="orders", cluster=ClusterPhase.UNKNOWN, job_id="x", job=JobPhase.RUNNING)
    f = facts_of(ap(Action.NOOP), outcome=None, message=None, live=unknown, record=None, spec=spec)
    assert not f.observed and f.job_state is None and not f.job_running
    f = facts_of(ap(Action.UPGRADE), outcome=Outcome.FAILURE, message="savepoint failed: disk full", live=unknown,
                 record=None, spec=spec)
    assert f.phase is Phase.FAILED and f.reason == "savepoint failed: disk full"


def test_daemon_conditions() -> None:
    started = NOW - timedelta(hours=1)
    quiet = daemon_conditions(now=NOW, started_at=started, last_ok_pass=NOW - timedelta(minutes=9),
                              fetch_failures=2, last_fetch_error="SourceUnreachableError", t=T)
    assert quiet == []
    loud = daemon_conditions(now=NOW, started_at=started, last_ok_pass=NOW - timedelta(minutes=11),
                             fetch_failures=3, last_fetch_error="SourceAuthError", t=T)
    assert {c.trigger for c in loud} == {Trigger.NOT_SYNCING, Trigger.GIT_FETCH_FAILING}
    never = daemon_conditions(now=NOW, started_at=started, last_ok_pass=None, fetch_failures=0,
                              last_fetch_error=None, t=T)
    assert [c.trigger for c in never] == [Trigger.NOT_SYNCING] and "since it started 60m ago" in never[0].summary


def test_every_trigger_has_an_alert_name_and_a_severity() -> None:
    assert set(ALERTS) == set(Trigger)
    assert len({name for name, _ in ALERTS.values()}) == len(Trigger)
    assert {sev for _, sev in ALERTS.values()} <= {"warning", "critical"}


# --- firing, resend, resolved ---------------------------------------------------------------------------

def cond(app_: str = "orders", trigger: Trigger = Trigger.CRASH_LOOP):  # type: ignore[no-untyped-def]
    (c,) = [c for c in app_conditions(facts(app=app_, phase=Phase.CRASH_LOOP, job_running=False), NOW, T)
            if c.trigger is trigger]
    return c


def test_a_condition_fires_once_then_is_resent_after_the_interval_then_resolves_once() -> None:
    timing = Timing(resend_interval=timedelta(hours=1))
    state, ev = advance({}, [cond()], NOW, timing)
    assert [(e.status, e.repeat) for e in ev] == [(Status.FIRING, False)]
    for minutes in (1, 30, 59):  # every pass in between: nothing new (oncePer)
        state, ev = advance(state, [cond()], NOW + timedelta(minutes=minutes), timing)
        assert ev == []
    state, ev = advance(state, [cond()], NOW + timedelta(minutes=60), timing)
    assert [(e.status, e.repeat) for e in ev] == [(Status.FIRING, True)] and ev[0].since == NOW
    state, ev = advance(state, [], NOW + timedelta(minutes=61), timing)
    assert [e.status for e in ev] == [Status.RESOLVED] and state == {}
    state, ev = advance(state, [], NOW + timedelta(minutes=62), timing)
    assert ev == []


def test_resolved_is_not_sent_when_switched_off_and_for_delays_firing() -> None:
    timing = Timing(send_resolved=False, for_={Trigger.CRASH_LOOP: timedelta(minutes=5)})
    state, ev = advance({}, [cond()], NOW, timing)
    assert ev == [] and firing(state) == []  # pending
    state, ev = advance(state, [], NOW + timedelta(minutes=1), timing)
    assert ev == [] and state == {}  # cleared while pending: never fired, nothing to resolve
    state, _ = advance({}, [cond()], NOW, timing)
    state, ev = advance(state, [cond()], NOW + timedelta(minutes=5), timing)
    assert [e.status for e in ev] == [Status.FIRING]
    state, ev = advance(state, [], NOW + timedelta(minutes=6), timing)
    assert ev == [] and state == {}


def test_an_incremental_pass_judges_only_the_apps_it_looked_at() -> None:
    timing = Timing()
    state, _ = advance({}, [cond("a"), cond("b")], NOW, timing)
    state, ev = advance(state, [], NOW, timing, in_scope=lambda k: k[1] == "a")
    assert [(e.status, e.condition.app) for e in ev] == [(Status.RESOLVED, "a")]
    assert [t.condition.app for t in firing(state)] == ["b"]


def test_a_changed_summary_is_kept_without_a_new_message() -> None:
    timing = Timing()
    state, _ = advance({}, [cond()], NOW, timing)
    changed = dataclasses.replace(cond(), summary="other words")
    state, ev = advance(state, [changed], NOW + timedelta(minutes=1), timing)
    assert ev == [] and firing(state)[0].condition.summary == "other words"


def test_a_failed_spec_stays_failed_while_the_last_applied_one_is_healed_meanwhile() -> None:
    """Chaos soak, round 87: Git's spec failed (the stop was refused), the old job runs on and its TaskManager is
    killed. The passes alternate between "this spec already failed" (the job runs) and a heal of the last applied
    spec (it does not). The change-failed alert fires once and does not resolve until the failure is gone."""
    p1, p2 = app(), app(job={"args": ["v2"]})
    rec = record(last_applied_revision="a" * 40, last_applied_spec=p1.canonical(), last_attempted_revision="c" * 40,
                 last_attempted_spec_hash=p2.spec_hash, last_outcome=Outcome.FAILURE, last_action="upgrade",
                 job_id="j" * 32, last_message="stop job jjjj failed: stop-with-savepoint failed: disk full",
                 failed_spec_hash=p2.spec_hash, failed_revision="c" * 40,
                 failed_message="stop job jjjj failed: stop-with-savepoint failed: disk full")
    unhealthy = rec.model_copy(update={"unhealthy_since": NOW - timedelta(seconds=5)})
    tm_gone = running().model_copy(update={"missing_processes": ("taskmanager",)})
    restarting = running(state="RESTARTING", phase=JobPhase.STARTING)
    passes = [
        (running(), rec, None),  # blocked: this spec already failed
        (tm_gone, unhealthy, Outcome.SUCCESS),  # the heal restarts the TaskManager of the last applied spec
        (restarting, unhealthy, None),  # Flink recovers the job within the grace period
        (running(), rec, None),
        (tm_gone, unhealthy, Outcome.FAILURE),  # a heal that failed once: healing, not yet a crash loop
        (running(), rec, None),
    ]
    state: dict[Key, Tracked] = {}
    sent: list[tuple[Status, Trigger]] = []
    for i, (live, r, outcome) in enumerate(passes):
        the = plan(inp([p2], [p1], [live], [r])).app("orders")
        f = facts_of(the, outcome=outcome, message=None, live=live, record=r, spec=p2, now=NOW,
                     repair_window=timedelta(minutes=10))
        assert f.phase is Phase.FAILED, (i, the.action, the.reason)
        state, ev = advance(state, app_conditions(f, NOW, T), NOW + timedelta(seconds=i), Timing())
        sent += [(e.status, e.condition.trigger) for e in ev]
    assert sent == [(Status.FIRING, Trigger.CHANGE_FAILED)]
    # Soak run 11: the TaskManager of the healed spec killed again and again; its repairs back off (a crash loop of
    # the last applied spec). That alert comes and goes with the crash loop; the change-failed one stays as it is.
    backing_off = unhealthy.model_copy(update={"repairs": (NOW - timedelta(seconds=5),),
                                               "repairs_spec_hash": p1.spec_hash})
    phases = []
    for i, (live, r) in enumerate([(tm_gone, backing_off), (running(), rec), (tm_gone, backing_off),
                                   (running(), rec)], start=len(passes)):
        the = plan(inp([p2], [p1], [live], [r])).app("orders")
        f = facts_of(the, outcome=None, message=None, live=live, record=r, spec=p2, now=NOW,
                     repair_window=timedelta(minutes=10))
        phases.append(f.phase)
        state, ev = advance(state, app_conditions(f, NOW, T), NOW + timedelta(seconds=i), Timing())
        sent += [(e.status, e.condition.trigger) for e in ev]
    assert phases == [Phase.CRASH_LOOP, Phase.FAILED, Phase.CRASH_LOOP, Phase.FAILED]
    assert sent == [(Status.FIRING, Trigger.CHANGE_FAILED),
                    (Status.FIRING, Trigger.CRASH_LOOP), (Status.RESOLVED, Trigger.CRASH_LOOP),
                    (Status.FIRING, Trigger.CRASH_LOOP), (Status.RESOLVED, Trigger.CRASH_LOOP)]
    # A fix pushed to Git: an upgrade of the new spec that succeeds resolves it.
    p3 = app(job={"args": ["v3"]})
    the = plan(inp([p3], [p1], [running()], [rec])).app("orders")
    f = facts_of(the, outcome=Outcome.SUCCESS, message=None, live=running(), record=rec, spec=p3)
    state, ev = advance(state, app_conditions(f, NOW, T), NOW + timedelta(minutes=1), Timing())
    assert f.phase is Phase.IN_SYNC and [(e.status, e.condition.trigger) for e in ev] == [
        (Status.RESOLVED, Trigger.CHANGE_FAILED)]
