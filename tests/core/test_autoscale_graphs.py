"""The autoscaling decision on ordinary job graphs, from metric snapshots shaped like Flink's.

Each case is a job graph running steadily: per vertex its parallelism, max parallelism, inputs, the records it
takes in and emits per second, each subtask's busy time (ms/s) and, for a source, its lag. The counters Flink
reports (summed, and the busiest subtask's busy time) are what that adds up to at each sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reconciler.core.autoscale import Inputs, Sample, ScaleDown, Verdict, VertexMetrics, decide
from reconciler.spec.load import load_files
from reconciler.spec.model import AutoscaleSpec

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SPEC = AutoscaleSpec.model_validate({"mode": "commit", "targetUtilisation": 0.7, "max": 16, "stabilisation": "60s",
                                     "scaleDownDelay": "120s", "window": "30s", "catchUpDuration": "60s"})


@dataclass(frozen=True)
class V:
    """A vertex at a steady load."""

    vid: str
    p: int
    rin: float  # records/s in (a source: read, in source records)
    rout: float
    busy: tuple[float, ...]  # ms/s of each subtask
    inputs: tuple[str, ...] = ()
    maxp: int = 128
    lag: float | None = None  # pendingRecords at T0
    lag_growth: float = 0.0  # per second
    finished: bool = False


def snapshot(vs: list[V], t: float, *, since: float = 100.0) -> Sample:
    run = t + since
    out = []
    for v in vs:
        out.append(VertexMetrics(
            vertex_id=v.vid, name=v.vid, parallelism=v.p, max_parallelism=v.maxp, inputs=v.inputs,
            busy_total_ms=sum(v.busy) * run, backpressured_total_ms=0.0, idle_total_ms=(1000 * v.p - sum(v.busy)) * run,
            records_in_total=0.0 if not v.inputs else v.rin * run, records_out_total=v.rout * run,
            pending=None if v.lag is None else v.lag + v.lag_growth * t, busy_max_total_ms=max(v.busy) * run,
            source_read_total=v.rin * run if not v.inputs else None, finished=v.finished))
    return Sample(at=T0 + timedelta(seconds=t), job_id="j", vertices=tuple(out))


def window(vs: list[V], seconds: int = 40, step: int = 5) -> list[Sample]:
    return [snapshot(vs, t) for t in range(0, seconds + 1, step)]


def inp(current: int, *, now_s: int = 40, slots: int = 16, **kw: Any) -> Inputs:
    base: dict[str, Any] = {"app": "a", "current": current, "slots": slots, "now": T0 + timedelta(seconds=now_s),
                            "job_running": True}
    return Inputs(**(base | kw))


def by_name(advice: Any, name: str) -> Any:
    return next(v for v in advice.vertices if v.name == name)


def test_skewed_keys_the_busiest_subtask_decides_not_the_average() -> None:
    """One hot key: the subtask that owns it is saturated, three are at 10 %. The average (32.5 %) called for
    4 -> 2; the busiest subtask (FLINK-30652) says the vertex is at its limit: up."""
    g = [V("src", 4, 200, 200, (50,) * 4), V("count", 4, 200, 200, (1000, 100, 100, 100), ("src",))]
    a = decide(SPEC, inp(4), window(g))
    count = by_name(a, "count")
    assert count.busy_pct == pytest.approx(100.0) and count.true_rate == pytest.approx(50.0)
    assert (a.verdict, a.proposed) == (Verdict.SCALE_UP, 6), a.reason  # 200 / (50 x 0.7) -> 6 (128/6: even enough)


def test_a_sink_with_its_own_parallelism_1_is_left_out_and_named() -> None:
    g = [V("src", 2, 150, 150, (30, 30)), V("count", 2, 150, 150, (1000, 1000), ("src",)),
         V("sink", 1, 150, 0, (200,), ("count",))]
    a = decide(SPEC, inp(2), window(g))
    assert (a.verdict, a.proposed) == (Verdict.SCALE_UP, 3), a.reason  # 150 / (75 x 0.7) -> 3
    assert by_name(a, "sink").excluded.startswith("own parallelism 1") and "sink (own parallelism 1" in a.reason


def test_an_idle_side_output_does_not_veto_a_scale_down() -> None:
    g = [V("src", 4, 40, 40, (5,) * 4), V("count", 4, 40, 40, (100,) * 4, ("src",)),
         V("late-events", 4, 0, 0, (0,) * 4, ("count",))]
    spec = SPEC.model_copy(update={"scale_down_max_factor": 1.0})
    a = decide(spec, inp(4), window(g))
    # count: 10 rec/s per subtask at 10 % busy -> 100/s; 40 / 70 -> 1
    assert a.wanted == 1 and a.verdict is Verdict.WAIT and "scale down 4 -> 1" in a.reason, a.reason
    assert by_name(a, "late-events").excluded == "idle: no records in the window"
    assert "late-events (idle: no records in the window)" in a.reason


def test_a_finished_source_is_left_out() -> None:
    g = [V("bounded", 2, 0, 0, (0, 0), finished=True), V("src", 2, 100, 100, (50, 50)),
         V("count", 2, 100, 100, (900, 900), ("src", "bounded"))]
    a = decide(SPEC, inp(2), window(g))
    assert by_name(a, "bounded").excluded == "finished" and a.verdict is Verdict.SCALE_UP


def test_the_proposal_stays_within_the_smallest_max_parallelism_it_sets() -> None:
    """A source with max parallelism 4 (e.g. 4 Kafka partitions) feeds a keyed vertex that needs 6: the job's one
    parallelism sets both, so 4."""
    g = [V("src", 2, 300, 300, (100, 100), maxp=4, lag=12000.0), V("count", 2, 300, 300, (1000, 1000), ("src",))]
    a = decide(SPEC, inp(2), window(g))  # 300 + 12000/60 = 500 / (150 x 0.7) -> 5
    assert a.proposed == 4 and a.limit == "capped at 4 by the max parallelism of src (wanted 5)", a.limit
    # a vertex with its own parallelism does not bound it
    g2 = [V("src", 2, 300, 300, (100, 100), lag=12000.0), V("count", 2, 300, 300, (1000, 1000), ("src",)),
          V("sink", 1, 300, 0, (100,), ("count",), maxp=1)]
    assert decide(SPEC, inp(2), window(g2)).proposed == 5


def test_key_group_alignment_of_the_job_wide_proposal() -> None:
    # count needs 7 of 10 key groups: 2/2/2/1/1/1/1 is uneven -> 10
    g = [V("src", 4, 300, 300, (50,) * 4), V("count", 4, 300, 300, (1000,) * 4, ("src",), maxp=10)]
    a = decide(SPEC.model_copy(update={"max": 10}), inp(4), window(g))
    # 300 / (75 x 0.7) = 5.7 -> 6: 2/2/2/2/1/1 of 10 key groups is uneven -> 10
    assert a.proposed == 10 and "6 -> 10 for even key groups" in (a.limit or ""), a.limit


@pytest.mark.parametrize(("busy", "verdict"), [
    (750.0, Verdict.KEEP),  # 75 % with a 70 % target: inside the band 60..80 %
    (800.0, Verdict.KEEP),  # the edge itself
    (810.0, Verdict.SCALE_UP),  # just above it
    (600.0, Verdict.KEEP),  # the lower edge
    (590.0, Verdict.KEEP),  # just below, but 4 x 0.59 / 0.7 still needs 4
    (500.0, Verdict.WAIT),  # 4 x 0.5 / 0.7 -> 3: a scale-down, after its delay
])
def test_the_utilisation_band(busy: float, verdict: Verdict) -> None:
    g = [V("src", 4, 400, 400, (50,) * 4), V("count", 4, 400, 400, (busy,) * 4, ("src",))]
    a = decide(SPEC, inp(4), window(g))
    assert a.verdict is verdict, a.reason
    assert ("inside the utilisation band 60%..80%" in a.reason) is (600 <= busy <= 800)


def test_scale_up_max_factor_caps_the_step() -> None:
    g = [V("src", 2, 1000, 1000, (50, 50), lag=60000.0), V("count", 2, 1000, 1000, (1000, 1000), ("src",))]
    a = decide(SPEC.model_copy(update={"scale_up_max_factor": 1.0}), inp(2), window(g))
    # 1000 + 60000/60 = 2000 / (500 x 0.7) -> 6, at most 2 x (1 + 1)
    assert a.proposed == 4 and a.limit == "capped at 4 by scaleUpMaxFactor 1 (wanted 6)", a.limit


def test_lag_growth_and_catch_up_count_in_source_records() -> None:
    """The source reads 200 records/s and its chain (a filter) emits half; the lag (source records) grows by
    50/s and stands at 8000 at the end of the window: the source must read 200 + 50 + 8000/60 = 383.3/s, and what
    it emits is half of that."""
    g = [V("src", 2, 200, 100, (100, 100), lag=6000.0, lag_growth=50.0),
         V("count", 2, 100, 100, (500, 500), ("src",))]
    a = decide(SPEC, inp(2), window(g))
    src, count = by_name(a, "src"), by_name(a, "count")
    assert src.lag_growth == pytest.approx(50.0) and src.records_in == pytest.approx(200.0)
    assert src.target_rate == pytest.approx(250 + 8000 / 60) and count.target_rate == pytest.approx(src.target_rate / 2)
    # count: 50/s per subtask at 50 % busy -> 100/s; 191.7 / 70 -> 3
    assert count.proposed == 3 and a.proposed == 3


def test_one_missing_sample_does_not_restart_a_pending_scale_down() -> None:
    g = [V("src", 4, 40, 40, (5,) * 4), V("count", 4, 40, 40, (100,) * 4, ("src",))]
    spec = SPEC.model_copy(update={"scale_down_max_factor": 1.0})
    first = decide(spec, inp(4), window(g))
    assert first.scale_down == ScaleDown(since=T0 + timedelta(seconds=40), peak=1)
    gap = [*window(g, 45), Sample(at=T0 + timedelta(seconds=50), job_id="j", vertices=snapshot(g, 50).vertices,
                                  missing=("count: accumulateBusyTimeMs",))]
    waiting = decide(spec, inp(4, now_s=50, scale_down=first.scale_down), gap)
    assert "incomplete metrics" in waiting.reason and waiting.scale_down == first.scale_down
    done = decide(spec, inp(4, now_s=165, scale_down=waiting.scale_down),
                  [snapshot(g, t) for t in range(125, 166, 5)])
    assert (done.verdict, done.proposed) == (Verdict.SCALE_DOWN, 1), done.reason
    # a change applied meanwhile does restart it
    changed = decide(spec, inp(4, now_s=50, scale_down=first.scale_down, pending_change=True), gap)
    assert changed.scale_down is None


@pytest.mark.parametrize(("current", "where"), [(10, "outside autoscale.min..max (2..8)"),
                                                 (1, "outside autoscale.min..max (2..8)")])
def test_a_humans_parallelism_outside_min_max_is_never_changed(current: int, where: str) -> None:
    g = [V("src", current, 50, 50, (10,) * current), V("count", current, 50, 50, (950,) * current, ("src",))]
    spec = SPEC.model_copy(update={"min": 2, "max": 8})
    a = decide(spec, inp(current), window(g))
    assert a.verdict is Verdict.KEEP and a.proposed == current and where in a.reason and "a human's choice" in a.reason


def test_inside_min_max_the_rules_stand() -> None:
    g = [V("src", 3, 50, 50, (10,) * 3), V("count", 3, 50, 50, (100,) * 3, ("src",))]
    spec = SPEC.model_copy(update={"min": 2, "max": 8, "scale_down_max_factor": 1.0})
    a = decide(spec, inp(3), window(g))
    assert a.wanted == 2 and a.limit == "raised to autoscale.min 2 (wanted 1)"


def test_capacity_raises_task_managers_up_to_the_setting() -> None:
    g = [V("src", 2, 300, 300, (50, 50), lag=30000.0), V("count", 2, 300, 300, (1000, 1000), ("src",))]
    tm = {"slots_per_task_manager": 2, "task_managers": 1}
    # 2 slots now; up to 2 TaskManagers of 2 slots: 8 wanted (300 + 30000/60 = 800 / 105), 4 fit
    a = decide(SPEC, inp(2, slots=2, max_task_managers=2, **tm), window(g))
    assert (a.proposed, a.task_managers) == (4, 2) and "autoscale.maxTaskManagers 2 x 2 slots" in (a.limit or "")
    # without the setting the slots cap it
    b = decide(SPEC, inp(2, slots=2, **tm), window(g))
    assert (b.verdict, b.task_managers) == (Verdict.KEEP, None) and "task slots" in (b.limit or "")
    # a sink with its own parallelism 5 needs 5 slots whatever the job's parallelism (3 here)
    g3 = [V("src", 2, 300, 300, (50, 50)), V("count", 2, 300, 300, (1000, 1000), ("src",)),
          V("sink", 5, 300, 0, (10,) * 5, ("count",))]
    c = decide(SPEC, inp(2, slots=6, max_task_managers=4, **tm), window(g3))
    assert (c.proposed, c.task_managers) == (3, None)  # 6 slots hold 5
    d = decide(SPEC, inp(2, slots=4, max_task_managers=4, **tm), window(g3))
    assert (d.proposed, d.task_managers) == (3, 3)


def test_a_session_app_counts_only_the_slots_the_other_apps_leave() -> None:
    g = [V("src", 1, 300, 300, (50,)), V("count", 1, 300, 300, (1000,), ("src",))]
    a = decide(SPEC, inp(1, slots=1, slots_note="the session cluster's free task slots (4 - 3 of other apps)"),
               window(g))
    assert a.verdict is Verdict.KEEP and "free task slots" in (a.limit or "")


SPEC_DOC = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: a
spec:
  job:
    jarURI: jobs/counter.jar
  autoscale:
    mode: commit
"""


@pytest.mark.parametrize(("body", "field", "words"), [
    ("    window: 0s\n", "spec.autoscale.window", "at least 1s"),
    ("    window: 0\n", "spec.autoscale.window", "at least 1s"),
    ("    scaleDownMaxFactor: 0\n", "spec.autoscale.scaleDownMaxFactor", "greater than 0"),
    ("    utilisationMax: 0.5\n", "spec.autoscale", "outside its band"),
    ("    maxTaskManagers: 0\n", "spec.autoscale.maxTaskManagers", "greater than or equal to 1"),
])
def test_invalid_windows_and_bands_are_refused_naming_file_line_and_field(body: str, field: str, words: str) -> None:
    (err,) = load_files({"apps/a.yaml": (SPEC_DOC + body).encode()}).errors
    assert (err.file, err.field) == ("apps/a.yaml", field) and err.line is not None and err.line >= 8, err
    assert words in err.message, err.message
