"""The autoscaling decision (core/autoscale.py): rates, bounds and hysteresis, table by table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest

from reconciler.core.autoscale import Inputs, Sample, ScaleDown, Verdict, VertexMetrics, _align, decide
from reconciler.spec.model import AutoscaleSpec

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SPEC = AutoscaleSpec.model_validate({"mode": "commit", "targetUtilisation": 0.8, "min": 1, "max": 8,
                                     "stabilisation": "60s", "scaleDownDelay": "120s", "window": "30s"})


def job(p: int, *, rate: float, busy: float, src_bp: float = 0.0, lag: float | None = None, maxp: int = 128,
        missing: tuple[str, ...] = (), at: datetime = T0, jid: str = "j1", count_p: int | None = None,
        since: datetime = T0 - timedelta(seconds=100)) -> Sample:
    """source -> count, running steadily since `since`: `rate` records/s flow; the count vertex is `busy` ms/s
    busy per subtask, the source `src_bp` ms/s backpressured. The counters are what that adds up to at `at`."""
    t = (at - since).total_seconds()
    cp = count_p or p
    src = VertexMetrics(vertex_id="src", name="Source: generator", parallelism=p, max_parallelism=maxp, inputs=(),
                        busy_total_ms=20.0 * p * t, backpressured_total_ms=src_bp * p * t,
                        idle_total_ms=(980.0 - src_bp) * p * t, records_in_total=0.0, records_out_total=rate * t,
                        pending=lag)
    cnt = VertexMetrics(vertex_id="cnt", name="count-per-key", parallelism=cp, max_parallelism=maxp,
                        inputs=("src",), busy_total_ms=busy * cp * t, backpressured_total_ms=0.0,
                        idle_total_ms=(1000.0 - busy) * cp * t, records_in_total=rate * t, records_out_total=rate * t)
    return Sample(at=at, job_id=jid, vertices=(src, cnt), missing=missing)


def series(p: int, seconds: int = 40, step: int = 5, **kw: Any) -> list[Sample]:
    return [job(p, at=T0 + timedelta(seconds=t), **kw) for t in range(0, seconds + 1, step)]


def inputs(p: int, *, now_s: int = 40, slots: int = 8, **kw: Any) -> Inputs:
    base: dict[str, Any] = {"app": "a", "current": p, "slots": slots, "now": T0 + timedelta(seconds=now_s),
                            "job_running": True}
    return Inputs(**(base | kw))


# current p, records/s, busy ms/s of the bottleneck, -> verdict, proposed
RATES = [
    # overloaded at 1: fully busy at 100 rec/s -> 100 rec/s per subtask; target 100 / (100 x 0.8) -> 2
    (1, 100.0, 1000.0, Verdict.SCALE_UP, 2),
    # at 2, busy 75% at 150 rec/s: 100 rec/s per subtask; 150 / 80 -> 2: fits
    (2, 150.0, 750.0, Verdict.KEEP, 2),
    # at 2, busy 95% at 300 rec/s: 157.9 per subtask; 300 / 126.3 -> 3 (43/43/42 key groups: even enough)
    (2, 300.0, 950.0, Verdict.SCALE_UP, 3),
    # a tenth as busy as at 1: 1000 rec/s per subtask, 100 / 800 -> 1
    (2, 100.0, 50.0, Verdict.WAIT, 2),
]


@pytest.mark.parametrize(("p", "rate", "busy", "verdict", "proposed"), RATES)
def test_rates_give_the_parallelism(p: int, rate: float, busy: float, verdict: Verdict, proposed: int) -> None:
    advice = decide(SPEC, inputs(p), series(p, rate=rate, busy=busy))
    assert (advice.verdict, advice.proposed) == (verdict, proposed), advice.reason
    cnt = next(v for v in advice.vertices if v.name == "count-per-key")
    assert cnt.true_rate == pytest.approx(rate / p / (busy / 1000))


def test_lag_is_worked_off_within_catch_up_and_bounds_apply() -> None:
    at = [s.at for s in series(1, rate=100.0, busy=1000.0)]
    # 100 rec/s per subtask when busy; lag 60000 worked off in 15m adds 66.7 rec/s: 166.7 / 80 -> 3
    heavy = [job(1, at=t, rate=100.0, busy=1000.0, lag=60_000.0) for t in at]
    a = decide(SPEC, inputs(1), heavy)
    assert a.proposed == 3 and a.vertices[0].lag == 60_000.0
    # lag 810000: 1000 rec/s -> 13 wanted; capped by slots, autoscale.max, the vertex's max parallelism
    huge = [job(1, at=t, rate=100.0, busy=1000.0, lag=810_000.0) for t in at]
    a = decide(SPEC, inputs(1, slots=4), huge)
    assert (a.proposed, a.limit) == (4, "capped at 4 by task slots (taskManager.replicas x slots) (wanted 13)")
    assert decide(SPEC, inputs(1), huge).proposed == 8  # autoscale.max
    a = decide(SPEC, inputs(1), [job(1, at=t, rate=100.0, busy=1000.0, lag=810_000.0, maxp=5) for t in at])
    assert a.proposed == 5 and "max parallelism" in (a.limit or "")
    raised = decide(SPEC.model_copy(update={"min": 3}), inputs(3), series(3, rate=100.0, busy=1000.0))
    assert raised.proposed == 4  # at 3 busy: 100/s per subtask, 300 / 80 -> 4


def test_key_group_alignment_only_when_close() -> None:
    assert _align(3, 128, 32) == 3  # 43/43/42 key groups: 0.8% skew
    assert _align(6, 120, 32) == 6  # already a divisor
    assert _align(7, 10, 32) == 10  # 2/2/2/1/1/1/1 key groups: 40% skew -> 10
    assert _align(3, 10, 32) == 5  # 4/3/3 -> 2/2/2/2/2
    assert _align(3, 10, 4) == 3  # never above the cap
    assert _align(12, 10, 32) == 12  # beyond the key groups: bounded elsewhere


WAITS = [
    ({"job_running": False, "why_not_running": "RESTARTING"}, "not running (RESTARTING)"),
    ({"pending_change": True}, "not applied yet"),
    ({"pending_change": True, "job_running": False, "why_not_running": "no job on record"}, "not applied yet"),
    ({"last_change_at": T0 + timedelta(seconds=10)}, "stabilising"),  # human edit at +10s: 60s stabilisation
]


@pytest.mark.parametrize(("kw", "why"), WAITS)
def test_no_decision_while(kw: dict[str, Any], why: str) -> None:
    advice = decide(SPEC, inputs(1, **kw), series(1, rate=100.0, busy=1000.0))
    assert advice.verdict is Verdict.WAIT and why in advice.reason
    assert advice.proposed == 1


def test_no_decision_on_incomplete_metrics_or_mid_rescale_or_short_window() -> None:
    s = series(1, rate=100.0, busy=1000.0)
    gappy = [*s[:-1], job(1, at=s[-1].at, rate=100.0, busy=1000.0, missing=("count-per-key: busyTimeMsPerSecond",))]
    assert "incomplete metrics" in decide(SPEC, inputs(1), gappy).reason
    mid = [*s[:-1], job(2, at=s[-1].at, rate=100.0, busy=1000.0)]  # no vertex at job.parallelism 1 yet
    assert "rescale is in progress" in decide(SPEC, inputs(1), mid).reason
    short = series(1, seconds=20, rate=100.0, busy=1000.0)  # 20s of a 30s window at now=+20s
    a = decide(SPEC, inputs(1, now_s=20), short)
    assert a.verdict is Verdict.WAIT and "20s of the 30s window" in a.reason
    assert decide(SPEC, inputs(1), []).reason == "no metrics sampled yet"


def test_window_counts_only_samples_after_stabilisation_and_of_this_job() -> None:
    # changed at +0, stabilised at +60; samples until +80: only 20s of the window after it
    s = series(1, seconds=80, rate=100.0, busy=1000.0)
    a = decide(SPEC, inputs(1, now_s=80, last_change_at=T0), s)
    assert a.verdict is Verdict.WAIT and "collecting metrics: 20s" in a.reason
    # a new job (restarted): the old job's samples do not count
    mixed = [*series(1, seconds=30, rate=100.0, busy=1000.0, jid="old"), job(1, at=T0 + timedelta(seconds=40),
                                                                          rate=100.0, busy=1000.0)]
    assert "collecting metrics: 0s" in decide(SPEC, inputs(1), mixed).reason


def test_min_change_suppresses_small_moves() -> None:
    spec = SPEC.model_copy(update={"min_change": 2})
    a = decide(spec, inputs(1), series(1, rate=100.0, busy=1000.0))
    assert a.verdict is Verdict.KEEP and a.wanted == 2 and "below minChange" in a.reason


def test_scale_down_waits_its_delay_and_takes_the_highest_called_for() -> None:
    # at 4, 40 rec/s, 20% busy: 50 rec/s per subtask -> 40 / 40 -> 1
    low = series(4, rate=40.0, busy=200.0)
    first = decide(SPEC.model_copy(update={"scale_down_max_factor": 1.0}), inputs(4), low)
    assert first.verdict is Verdict.WAIT and first.wanted == 1 and "waiting out scaleDownDelay" in first.reason
    # scaleDownMaxFactor 0.6 (the default): at most 60 % fewer in one step: 4 -> 2
    capped = decide(SPEC, inputs(4), low)
    assert capped.wanted == 2 and capped.limit == "held at 2 by scaleDownMaxFactor 0.6 (wanted 1)"
    assert first.scale_down == ScaleDown(since=T0 + timedelta(seconds=40), peak=1)
    # meanwhile one window called for 2: the peak is kept
    carried = ScaleDown(since=T0 + timedelta(seconds=40), peak=2)
    later = [job(4, at=T0 + timedelta(seconds=t), rate=40.0, busy=200.0) for t in range(130, 171, 5)]
    done = decide(SPEC, inputs(4, now_s=170, scale_down=carried), later)
    assert (done.verdict, done.proposed) == (Verdict.SCALE_DOWN, 2)
    # the reason says why 3 when the window now calls for less (scaleDownMaxFactor 1: it calls for 1)
    peak3 = decide(SPEC.model_copy(update={"scale_down_max_factor": 1.0}),
                   inputs(4, now_s=170, scale_down=ScaleDown(since=T0 + timedelta(seconds=40), peak=3)), later)
    assert (peak3.verdict, peak3.proposed, peak3.wanted) == (Verdict.SCALE_DOWN, 3, 1), peak3
    assert peak3.reason.startswith("scale down 4 -> 3 (called for since 12:00:40): count-per-key needs 1"), peak3.reason
    assert "utilisation; 3, the most called for since 12:00:40" in peak3.reason, peak3.reason
    assert "the most called for" not in done.reason
    # load came back before the delay ran out: the scale-down is forgotten
    back = decide(SPEC, inputs(4, now_s=170, scale_down=carried),
                  [job(4, at=T0 + timedelta(seconds=t), rate=300.0, busy=800.0) for t in range(130, 171, 5)])
    assert back.verdict is Verdict.KEEP and back.scale_down is None


def test_scale_up_is_not_delayed_and_clears_a_pending_scale_down() -> None:
    a = decide(SPEC, inputs(1, scale_down=ScaleDown(since=T0, peak=1)), series(1, rate=100.0, busy=1000.0))
    assert a.verdict is Verdict.SCALE_UP and a.scale_down is None


def test_idle_job_keeps_its_parallelism() -> None:
    a = decide(SPEC, inputs(3), series(3, rate=0.0, busy=0.0))
    assert a.verdict is Verdict.KEEP and a.proposed == 3
    assert all(v.true_rate is None for v in a.vertices)


def test_advice_json_carries_the_numbers() -> None:
    doc = decide(SPEC, inputs(1), series(1, rate=100.0, busy=1000.0, src_bp=700.0)).to_json()
    assert doc["verdict"] == "scale-up" and doc["current"] == 1 and doc["proposed"] == 2
    vs = {v["name"]: v for v in doc["vertices"]}  # type: ignore[attr-defined]
    assert vs["Source: generator"]["backpressuredPct"] == 70.0
    assert vs["count-per-key"]["busyPct"] == 100.0 and vs["count-per-key"]["trueRatePerSubtask"] == 100.0


SPEC_DOC = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: a
spec:
  job:
    jarURI: jobs/counter.jar
  autoscale:
"""


def test_the_spec_defaults_to_off_and_reads_yaml_off() -> None:
    from reconciler.spec.load import load_files

    plain = load_files({"a.yaml": SPEC_DOC.replace("  autoscale:\n", "").encode()}).apps["a"].app
    assert plain.spec.autoscale.mode.value == "off"
    loaded = load_files({"a.yaml": (SPEC_DOC + "    mode: off\n    window: 2m\n").encode()}).apps["a"].app
    assert loaded.spec.autoscale.mode.value == "off" and loaded.spec.autoscale.window == timedelta(minutes=2)


@pytest.mark.parametrize(("body", "field", "words"), [
    ("    mode: sometimes\n", "spec.autoscale.mode", "'off', 'recommend' or 'commit'"),
    ("    targetUtilisation: 1.5\n", "spec.autoscale.targetUtilisation", "less than or equal to 1"),
    ("    min: 4\n    max: 2\n", "spec.autoscale", "min (4) is above max (2)"),
    ("    commit: {branch: 'a..b'}\n", "spec.autoscale.commit.branch", "not a usable branch name"),
    ("    window: forever\n", "spec.autoscale.window", "expected a duration"),
])
def test_bad_autoscale_values_name_their_field(body: str, field: str, words: str) -> None:
    from reconciler.spec.load import load_files

    result = load_files({"a.yaml": (SPEC_DOC + body).encode()})
    (err,) = result.errors
    assert err.field == field and err.file == "a.yaml" and err.line is not None and err.line >= 8
    assert words in err.message


def test_counters_that_went_back_mean_restarted_tasks_and_start_the_window_again() -> None:
    before = [job(1, at=T0 + timedelta(seconds=t), rate=100.0, busy=1000.0) for t in range(0, 21, 5)]
    restarted = T0 + timedelta(seconds=25)  # the same job id (an in-place rescale restarts its tasks)
    after = [job(1, at=T0 + timedelta(seconds=t), rate=100.0, busy=1000.0, since=restarted) for t in (30, 35, 40)]
    a = decide(SPEC, inputs(1), [*before, *after])
    assert a.verdict is Verdict.WAIT and "collecting metrics: 10s" in a.reason


def test_a_sample_repeating_the_last_ones_numbers_is_not_fresh() -> None:
    from reconciler.service.autoscale import same_values

    a = job(1, at=T0, rate=100.0, busy=1000.0)
    stale = Sample(at=T0 + timedelta(seconds=2), job_id=a.job_id, vertices=a.vertices)
    fresh = job(1, at=T0 + timedelta(seconds=2), rate=100.0, busy=1000.0)
    assert same_values(a, stale) and not same_values(a, fresh)
    assert not same_values(a, Sample(at=stale.at, job_id="other", vertices=a.vertices))


def test_a_nearly_idle_vertex_never_vetoes_a_scale_down() -> None:
    """A source busy 0.2% of the time (rounding noise in Flink's busy time) has plenty of capacity: it asks for
    the minimum, so the bottleneck decides."""
    def quiet(t: int) -> Sample:
        s = job(2, at=T0 + timedelta(seconds=t), rate=40.0, busy=250.0)
        src = s.vertices[0]
        since = (s.at - (T0 - timedelta(seconds=100))).total_seconds()
        from dataclasses import replace as dc_replace
        return Sample(at=s.at, job_id=s.job_id, vertices=(dc_replace(src, busy_total_ms=2.0 * 2 * since),
                                                           s.vertices[1]))
    a = decide(SPEC, inputs(2), [quiet(t) for t in range(0, 41, 5)])
    src = a.vertices[0]
    assert src.proposed == 1 and src.true_rate == pytest.approx(40.0 / 2 / 0.01)
    assert a.wanted == 1 and a.verdict is Verdict.WAIT and "scale down 2 -> 1" in a.reason


# ---------------------------------------------------------------------------------------------- the stored window

@pytest.mark.parametrize(("last_s", "now_s", "window_s", "due"), [
    (None, 0, 30, True),  # never sampled
    (0, 2, 30, False),  # a pass 2 s later: a tenth of the window is 3 s
    (0, 3, 30, True),
    (0, 1, 8, True),  # a short window: every pass a second
    (0, 29, 300, False),  # the defaults: one sample every 30 s
])
def test_flink_is_asked_about_ten_times_a_window(last_s: int | None, now_s: int, window_s: int, due: bool) -> None:
    from reconciler.core.autoscale import sample_due

    last = None if last_s is None else T0 + timedelta(seconds=last_s)
    assert sample_due(last, T0 + timedelta(seconds=now_s), timedelta(seconds=window_s)) is due


@pytest.mark.parametrize(("saved_s", "now_s", "due"), [
    (None, 0, True),  # never saved
    (0, 30, False),  # within the minute: the record is not written
    (0, 59, False),
    (0, 60, True),
])
def test_the_window_is_saved_at_most_once_a_minute(saved_s: int | None, now_s: int, due: bool) -> None:
    from reconciler.core.autoscale import save_due

    saved = None if saved_s is None else T0 + timedelta(seconds=saved_s)
    assert save_due(saved, T0 + timedelta(seconds=now_s)) is due


def test_what_is_stored_is_the_latest_jobs_samples_since_its_restart_thinned() -> None:
    from reconciler.core.autoscale import to_store

    old = series(1, seconds=20, rate=100.0, busy=1000.0, jid="old")
    before = [job(1, at=T0 + timedelta(seconds=t), rate=100.0, busy=1000.0) for t in range(30, 51, 5)]
    restarted = T0 + timedelta(seconds=55)
    after = [job(1, at=T0 + timedelta(seconds=t), rate=100.0, busy=1000.0, since=restarted) for t in range(60, 300)]
    gappy = job(1, at=T0 + timedelta(seconds=300), rate=100.0, busy=1000.0, since=restarted, missing=("x: y",))
    kept = to_store([*old, *before, *after, gappy], keep=10)
    assert len(kept) == 10 and kept[0] is after[0] and kept[-1] is after[-1]
    gaps = [(b.at - a.at).total_seconds() for a, b in pairwise(kept)]
    assert all(g >= 26 for g in gaps), gaps  # evenly over 239 samples a second apart: 26 or 27 s
    assert to_store(after[:5], keep=10) == after[:5]
    assert to_store([]) == []


def test_the_stored_window_round_trips_and_decides_alike() -> None:
    from reconciler.core.autoscale import to_store, window_doc, window_from_doc

    s = series(1, seconds=60, step=1, rate=100.0, busy=1000.0, lag=5.0)
    down = ScaleDown(since=T0 + timedelta(seconds=3), peak=1)
    doc = window_doc(to_store(s), down, T0 + timedelta(seconds=60))
    import json
    back = window_from_doc(json.loads(json.dumps(doc)))  # what a record store keeps: JSON
    assert back.problem is None and back.scale_down == down and back.saved_at == T0 + timedelta(seconds=60)
    assert len(back.samples) == 24 and back.samples[-1] == s[-1] and back.samples[0] == s[0]
    assert back.samples[0].vertices[0].pending == 5.0
    now = inputs(1, now_s=60)
    restored, full = decide(SPEC, now, back.samples).to_json(), decide(SPEC, now, s).to_json()
    # the thinned window starts at most a gap earlier (here 29 s instead of 30 s): the same decision and numbers
    assert restored["window"] == ["2026-01-01T12:00:29+00:00", "2026-01-01T12:01:00+00:00"]
    assert {k: v for k, v in restored.items() if k not in ("samples", "window")} == \
        {k: v for k, v in full.items() if k not in ("samples", "window")}


@pytest.mark.parametrize(("doc", "problem"), [
    (None, None),  # nothing stored yet
    ({"version": 99}, "unknown form (version 99)"),
    ("a string", "unknown form"),
    ({"version": 1, "saved_at": "2026-01-01T00:00:00+00:00", "job_id": "j", "vertices": {},
      "samples": [["2026-01-01T00:00:00+00:00", [["v", 1, 0, 0, 0, 0, 0, None]]]]}, "KeyError"),
    ({"version": 1, "saved_at": "yesterday", "job_id": "j", "vertices": {}, "samples": []}, "ValueError"),
    ({"version": 1, "saved_at": "2026-01-01T00:00:00+00:00", "job_id": "j", "vertices": {"v": ["v", 128, []]},
      "samples": [["2026-01-01T00:00:05+00:00", [["v", 1, 0, 0, 0, 0, 0, None]]],
                  ["2026-01-01T00:00:01+00:00", [["v", 1, 0, 0, 0, 0, 0, None]]]]}, "out of order"),
])
def test_an_unreadable_stored_window_is_ignored_and_says_why(doc: object, problem: str | None) -> None:
    from reconciler.core.autoscale import window_from_doc

    got = window_from_doc(doc)
    assert got.samples == () and got.scale_down is None
    assert (got.problem is None) if problem is None else (problem in (got.problem or "")), got.problem
