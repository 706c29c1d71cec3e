"""The autoscaling decision: which parallelism Flink's own metrics call for, and whether to act on it now.

Pure: the shell (`service.autoscale`) samples the metrics and keeps the samples and the little state a
decision carries (since when a scale-down is called for); this module only computes. The method is the one
of the Flink Kubernetes Operator's autoscaler (flink-autoscaler 1.10+, FLIP-271, after Kalavri et al., "Three
steps is all you need"), class by class:

- `ScalingMetricEvaluator`: a vertex's *true processing rate* per subtask is the records it took in per second
  divided by the share of the time its *busiest* subtask was busy (FLINK-30652: with skewed keys the average
  hides the saturated subtask); a source's records are counted in source units (what its source operator
  read), the units its lag (`pendingRecords`) is in;
- the *target rate* starts at the sources (what they read, plus the lag's growth rate, plus the lag worked off
  within `catchUpDuration`) and flows down the graph with each vertex's out/in ratio;
- `JobVertexScaler`: a vertex needs ceil(target / (true rate x target utilisation)); the step is capped by
  `scaleUpMaxFactor` / `scaleDownMaxFactor`; nothing changes while every vertex is inside the utilisation band
  (`utilisationMin` .. `utilisationMax`); a keyed parallelism is moved up to a divisor of the key groups when
  the keys would split unevenly; idle and finished vertices never call for capacity.

The app has one `job.parallelism`, which sets every vertex but those that set their own (`setParallelism`):
those, idle and finished vertices are left out of the decision (and named); the proposal is what the busiest
deciding vertex needs, bounded by the smallest max parallelism among the vertices it sets, `min`/`max` and the
slots. `ScalingExecutor`'s part: scale when a vertex is outside the band. Hysteresis: nothing while the job is
not running or its metrics are incomplete, nothing within `stabilisation` of the last applied change (which is
how a human's edit of parallelism in Git wins), nothing before a full `window` of samples, a change smaller
than `minChange` is none, and a lower parallelism must be called for continuously for `scaleDownDelay` before it
is proposed (a sample missing meanwhile does not restart that delay). A parallelism outside `[min, max]` is a
human's choice and is never changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from itertools import pairwise

from reconciler.spec.model import AutoscaleSpec

# A vertex busy less than this share of the time is taken as busy this much (a lower bound of its capacity).
MIN_BUSY = 0.01
# Key-group alignment: a parallelism whose busiest subtask gets more than this share above the average number of
# key groups is moved up to a divisor of the max parallelism.
MAX_SKEW = 0.1


@dataclass(frozen=True)
class VertexMetrics:
    """One job vertex at one moment, summed over its subtasks by Flink (`subtasks/metrics?agg=sum,avg,max`).

    The counters (`accumulate*TimeMs`, `numRecordsIn/Out`) are what a decision uses: the difference between
    two samples is the exact average over the time between them, whatever the window. Flink's own per-second
    gauges (busyTimeMsPerSecond, numRecordsInPerSecond, ...) are moving averages over a fixed minute that lag
    a change; they are kept for showing the moment."""

    vertex_id: str
    name: str
    parallelism: int
    max_parallelism: int
    inputs: tuple[str, ...]  # upstream vertex ids; none: a source
    busy_total_ms: float  # accumulateBusyTimeMs, summed over the subtasks
    backpressured_total_ms: float  # accumulateBackPressuredTimeMs
    idle_total_ms: float  # accumulateIdleTimeMs
    records_in_total: float  # numRecordsIn
    records_out_total: float  # numRecordsOut (a chained vertex: what its last operator emits)
    pending: float | None = None  # pendingRecords (sources whose connector reports lag), in source records
    busy_ms_per_s: float | None = None  # busyTimeMsPerSecond, average over subtasks (the moment)
    backpressured_ms_per_s: float | None = None  # backPressuredTimeMsPerSecond, average
    busy_max_total_ms: float | None = None  # accumulateBusyTimeMs of the busiest subtask (max over subtasks)
    source_read_total: float | None = None  # a source: its source operator's numRecordsOut (records read)
    finished: bool = False  # every subtask FINISHED (a bounded source that is done)

    @property
    def is_source(self) -> bool:
        return not self.inputs

    def went_back_from(self, earlier: VertexMetrics) -> bool:
        """A record counter lower than before: the tasks restarted (a rescale, a failover) and counted from zero.
        (Not the time accumulators: a source's accumulateBusyTimeMs is derived, and wobbles down by itself.)"""
        return self.records_in_total < earlier.records_in_total or self.records_out_total < earlier.records_out_total


@dataclass(frozen=True)
class Sample:
    at: datetime
    job_id: str
    vertices: tuple[VertexMetrics, ...]
    missing: tuple[str, ...] = ()  # "vertex: metric" that Flink did not report (NaN or absent)


class Verdict(StrEnum):
    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"
    KEEP = "keep"  # the metrics call for the current parallelism (or a change below minChange)
    WAIT = "wait"  # no decision yet: why is in `reason`


@dataclass(frozen=True)
class VertexAdvice:
    vertex_id: str
    name: str
    current: int
    proposed: int
    busy_pct: float  # the busiest subtask's
    backpressured_pct: float
    records_in: float  # per second, all subtasks (a source: records read, in source units)
    records_out: float
    true_rate: float | None  # records/s one subtask could process when busy all the time
    target_rate: float  # records/s this vertex must take in
    lag: float | None
    limit: str | None = None  # what bounded the proposal, or why the vertex does not decide
    utilisation: float | None = None  # target / (true rate x current): how busy it is for what it must do
    excluded: str | None = None  # why the vertex does not take part in the decision (own parallelism, idle, ...)
    lag_growth: float | None = None  # records/s the lag grew by over the window (a source)
    max_parallelism: int = 0  # the vertex's max parallelism (its key groups), 0: unknown
    own_parallelism: bool = False  # set by the job itself (`setParallelism`), not by job.parallelism


@dataclass(frozen=True)
class ScaleDown:
    """A lower parallelism called for since `since`; `peak` is the highest one called for since then."""

    since: datetime
    peak: int


@dataclass(frozen=True)
class Advice:
    app: str
    verdict: Verdict
    current: int
    proposed: int  # == current unless the verdict is a scale
    reason: str
    vertices: tuple[VertexAdvice, ...] = ()
    samples: int = 0
    window_start: datetime | None = None
    window_end: datetime | None = None
    scale_down: ScaleDown | None = None  # the state to carry into the next decision
    wanted: int | None = None  # what the metrics call for (also while waiting)
    task_managers: int | None = None  # taskManager.replicas the proposal needs, when more than the spec's
    limit: str | None = None  # what bounded the job-wide proposal

    @property
    def changes(self) -> bool:
        return self.verdict in (Verdict.SCALE_UP, Verdict.SCALE_DOWN)

    @property
    def excluded(self) -> tuple[VertexAdvice, ...]:
        return tuple(v for v in self.vertices if v.excluded)

    def to_json(self) -> dict[str, object]:
        return {
            "app": self.app, "verdict": self.verdict.value, "current": self.current, "proposed": self.proposed,
            "wanted": self.wanted, "reason": self.reason, "samples": self.samples,
            "window": [t.isoformat() if t else None for t in (self.window_start, self.window_end)],
            "scaleDownSince": self.scale_down.since.isoformat() if self.scale_down else None,
            "taskManagers": self.task_managers, "limit": self.limit,
            "vertices": [
                {"id": v.vertex_id, "name": v.name, "current": v.current, "proposed": v.proposed,
                 "busyPct": round(v.busy_pct, 1), "backpressuredPct": round(v.backpressured_pct, 1),
                 "recordsInPerSecond": round(v.records_in, 2), "recordsOutPerSecond": round(v.records_out, 2),
                 "trueRatePerSubtask": None if v.true_rate is None else round(v.true_rate, 2),
                 "targetRate": round(v.target_rate, 2), "lag": v.lag,
                 "lagGrowthPerSecond": None if v.lag_growth is None else round(v.lag_growth, 2),
                 "utilisationPct": None if v.utilisation is None else round(v.utilisation * 100, 1),
                 "excluded": v.excluded, "limit": v.limit}
                for v in self.vertices],
        }


@dataclass(frozen=True)
class Inputs:
    """Everything one decision needs besides the spec and the samples."""

    app: str
    current: int  # job.parallelism in Git (what the app is meant to run at)
    slots: int  # task slots the app may use now (its cluster's; a session app: those the other apps leave)
    now: datetime
    job_running: bool
    why_not_running: str = ""
    last_change_at: datetime | None = None  # the last applied change of the app (any: rescale, upgrade, edit)
    pending_change: bool = False  # Git has a change of the app not applied yet
    scale_down: ScaleDown | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    slots_per_task_manager: int = 0  # > 0 with `task_managers`: the app may raise its taskManager.replicas
    task_managers: int = 0  # taskManager.replicas in the spec
    max_task_managers: int | None = None  # spec.autoscale.maxTaskManagers (None: the slots are the cap)
    slots_note: str = "task slots (taskManager.replicas x slots)"  # what `slots` is, for the evidence


# Waits that keep a pending scale-down: a gap in the metrics is not a change of the job.
_KEEPS_SCALE_DOWN = ("collecting metrics", "no decision on incomplete metrics", "no metrics sampled yet")


def decide(spec: AutoscaleSpec, inp: Inputs, samples: Sequence[Sample]) -> Advice:
    """The advice for one app from its samples (oldest first)."""
    wait = _why_wait(spec, inp, samples)
    if isinstance(wait, str):
        keep = inp.scale_down if wait.startswith(_KEEPS_SCALE_DOWN) else None
        return Advice(app=inp.app, verdict=Verdict.WAIT, current=inp.current, proposed=inp.current, reason=wait,
                      samples=len(samples), scale_down=keep)
    usable = wait
    vertices = _advise(spec, inp, usable)
    deciding = [v for v in vertices if not v.excluded]
    base = Advice(app=inp.app, verdict=Verdict.KEEP, current=inp.current, proposed=inp.current, reason="",
                  vertices=vertices, samples=len(usable), window_start=usable[0].at, window_end=usable[-1].at,
                  wanted=inp.current)
    left_out = _left_out(vertices)
    if not deciding:
        return replace(base, reason=f"parallelism {inp.current} kept: no vertex running at it has load to measure"
                                    f"{left_out}")
    wanted, limit, need = _job_wide(spec, inp, vertices)
    replicas = _task_managers(inp, vertices, wanted)
    base = replace(base, wanted=wanted, limit=limit, task_managers=replicas if replicas else None)
    why = need + left_out
    if not spec.min <= inp.current <= spec.max:
        return replace(base, reason=f"parallelism {inp.current} is outside autoscale.min..max ({spec.min}..{spec.max})"
                                    f": a human's choice, left as it is (the metrics call for {wanted}): {why}")
    if wanted == inp.current or abs(wanted - inp.current) < spec.min_change:
        small = "" if wanted == inp.current else f" (a change of {abs(wanted - inp.current)} is below minChange)"
        return replace(base, reason=f"parallelism {inp.current} fits{small}: {why}")
    if wanted > inp.current:
        return replace(base, verdict=Verdict.SCALE_UP, proposed=wanted,
                       reason=f"scale up {inp.current} -> {wanted}: {why}")
    down = inp.scale_down
    down = ScaleDown(since=inp.now, peak=wanted) if down is None else ScaleDown(down.since, max(down.peak, wanted))
    if down.peak >= inp.current:
        return replace(base, reason=f"parallelism {inp.current} fits: {why}")
    if down.peak > wanted:  # Flink's autoscaler too: the highest parallelism called for during the delay
        why = f"{need}; {down.peak}, the most called for since {down.since:%H:%M:%S}{left_out}"
    ready_at = down.since + spec.scale_down_delay
    if inp.now < ready_at:
        return replace(base, verdict=Verdict.WAIT, scale_down=down,
                       reason=f"scale down {inp.current} -> {down.peak} called for since {down.since:%H:%M:%S}; "
                              f"waiting out scaleDownDelay until {ready_at:%H:%M:%S}: {why}")
    return replace(base, verdict=Verdict.SCALE_DOWN, proposed=down.peak, scale_down=down, task_managers=None,
                   reason=f"scale down {inp.current} -> {down.peak} (called for since {down.since:%H:%M:%S}): {why}")


def _left_out(vertices: Sequence[VertexAdvice]) -> str:
    out = [f"{v.name} ({v.excluded})" for v in vertices if v.excluded]
    return f"; not deciding: {'; '.join(out)}" if out else ""


def _job_wide(spec: AutoscaleSpec, inp: Inputs, vertices: Sequence[VertexAdvice]) -> tuple[int, str | None, str]:
    """(the parallelism the job needs, what bounded it, why) from its deciding vertices.

    `ScalingExecutor`'s rule: no change while every deciding vertex is inside the utilisation band; otherwise
    each vertex's need (`JobVertexScaler`), the largest of them for the one `job.parallelism`, step-capped, key-group
    aligned (to the busiest vertex's max parallelism), and bounded."""
    lo, hi = spec.band
    deciding = [v for v in vertices if not v.excluded]
    bottleneck = max(deciding, key=lambda v: (v.proposed, v.utilisation or 0.0))
    hot = max(deciding, key=lambda v: v.utilisation or 0.0)
    above = [v for v in deciding if (v.utilisation or 0.0) > hi]
    below = all((v.utilisation or 0.0) < lo for v in deciding)
    describe = (f"{bottleneck.name} needs {bottleneck.proposed}: target {bottleneck.target_rate:.1f} rec/s, "
                + (f"{bottleneck.true_rate:.1f} rec/s per subtask when busy" if bottleneck.true_rate else "no rate")
                + f" at {spec.target_utilisation:.0%} utilisation")
    if not above and not below:
        return inp.current, None, (f"every vertex inside the utilisation band {lo:.0%}..{hi:.0%} (busiest: {hot.name} "
                                   f"at {(hot.utilisation or 0.0):.0%}); {describe}")
    want = max(v.proposed for v in deciding)
    limit: str | None = None
    up_cap = max(inp.current + 1, math.floor(inp.current * (1 + spec.scale_up_max_factor) + 1e-9))
    down_floor = max(1, math.ceil(inp.current * (1 - spec.scale_down_max_factor) - 1e-9))
    if want > up_cap:
        want, limit = up_cap, f"capped at {up_cap} by scaleUpMaxFactor {spec.scale_up_max_factor:g} (wanted {want})"
    elif want < down_floor:
        want, limit = down_floor, (f"held at {down_floor} by scaleDownMaxFactor {spec.scale_down_max_factor:g} "
                                   f"(wanted {want})")
    set_by_job = [v for v in vertices if v.max_parallelism > 0 and not v.own_parallelism]
    caps: list[tuple[int, str]] = [(spec.max, "autoscale.max")]
    if set_by_job:
        holder = min(set_by_job, key=lambda v: v.max_parallelism)
        caps.append((holder.max_parallelism, f"the max parallelism of {holder.name}"))
    cap_slots = _slot_cap(inp)
    caps.append((cap_slots, inp.slots_note if cap_slots == inp.slots else
                 f"autoscale.maxTaskManagers {inp.max_task_managers} x {inp.slots_per_task_manager} slots"))
    bound = max(1, min(c for c, _ in caps))
    if want > inp.current:
        aligned = _align(want, bottleneck.max_parallelism, bound)
        if aligned != want:
            limit = (limit + "; " if limit else "") + f"{want} -> {aligned} for even key groups"
            want = aligned
    if want < spec.min:
        want, limit = spec.min, f"raised to autoscale.min {spec.min} (wanted {want})"
    for cap, name in sorted(caps):  # after min: what the job and its slots can hold always wins
        if want > cap:
            limit = f"capped at {max(cap, 1)} by {name} (wanted {want})"
            want = max(cap, 1)
            break
    return want, limit, describe + (f" ({limit})" if limit else "")


def _slot_cap(inp: Inputs) -> int:
    if inp.max_task_managers and inp.slots_per_task_manager > 0:
        return max(inp.slots, inp.max_task_managers * inp.slots_per_task_manager)
    return inp.slots


def _task_managers(inp: Inputs, vertices: Sequence[VertexAdvice], wanted: int) -> int:
    """taskManager.replicas the proposal needs when the slots would not hold it (0: they would, or the app may
    not raise them). Slot sharing: a job needs as many slots as its most parallel vertex."""
    if not inp.max_task_managers or inp.slots_per_task_manager <= 0:
        return 0
    need = max([wanted, *(v.current for v in vertices if v.own_parallelism)])
    if need <= inp.slots:
        return 0
    return min(inp.max_task_managers, -(-need // inp.slots_per_task_manager))


def _why_wait(spec: AutoscaleSpec, inp: Inputs, samples: Sequence[Sample]) -> str | list[Sample]:
    if inp.pending_change:  # first: the shell does not look at the job of a spec that is about to change
        return "no decision while a change of the app in Git is not applied yet"
    if not inp.job_running:
        return f"no decision while the job is not running ({inp.why_not_running or 'not running'})"
    if inp.last_change_at is not None and inp.now < inp.last_change_at + spec.stabilisation:
        until = inp.last_change_at + spec.stabilisation
        return (f"stabilising after the change applied at {inp.last_change_at:%H:%M:%S} until {until:%H:%M:%S} "
                "(spec.autoscale.stabilisation)")
    if not samples:
        return "no metrics sampled yet"
    last = samples[-1]
    if last.missing:
        return "no decision on incomplete metrics: Flink did not report " + ", ".join(last.missing[:5])
    if last.vertices and not any(v.parallelism == inp.current for v in last.vertices):
        # Some vertex always runs at job.parallelism (those that set their own are the others): none does while the
        # adaptive scheduler has not adopted a new one yet.
        return (f"no decision while no vertex runs at job.parallelism {inp.current} "
                f"({', '.join(f'{v.name} at {v.parallelism}' for v in last.vertices[:3])}): a rescale is in progress")
    since = inp.last_change_at + spec.stabilisation if inp.last_change_at else None
    after = [s for s in samples if s.job_id == last.job_id and (since is None or s.at >= since) and not s.missing]
    # Only samples since the tasks last (re)started: their counters count from there.
    for i in range(len(after) - 1, 0, -1):
        if _restarted(after[i - 1], after[i]):
            after = after[i:]
            break
    if len(after) < 2 or inp.now - after[0].at < spec.window:
        have = inp.now - after[0].at if after else timedelta(0)
        return (f"collecting metrics: {have.total_seconds():.0f}s of the {spec.window.total_seconds():.0f}s window "
                "(spec.autoscale.window)")
    start = max((s for s in after if s.at <= inp.now - spec.window), key=lambda s: s.at, default=after[0])
    return [s for s in after if s.at >= start.at]


def _restarted(a: Sample, b: Sample) -> bool:
    before = {v.vertex_id: v for v in a.vertices}
    return any(v.vertex_id in before and (v.went_back_from(before[v.vertex_id])
                                          or v.parallelism != before[v.vertex_id].parallelism)
               for v in b.vertices)


def _advise(spec: AutoscaleSpec, inp: Inputs, samples: Sequence[Sample]) -> tuple[VertexAdvice, ...]:
    first = {v.vertex_id: v for v in samples[0].vertices}
    latest = samples[-1].vertices
    by_id = {v.vertex_id: v for v in latest}
    seconds = max((samples[-1].at - samples[0].at).total_seconds(), 1e-9)

    def rate(v: VertexMetrics, attr: str) -> float | None:
        before = first.get(v.vertex_id)
        a, b = (None, None) if before is None else (getattr(before, attr), getattr(v, attr))
        return None if a is None or b is None else max(0.0, float(b) - float(a)) / seconds

    def read_rate(v: VertexMetrics) -> float:
        """What a vertex takes in per second; a source: what its source operator read (source units, the units
        of its lag), else what the vertex emitted."""
        if not v.is_source:
            return rate(v, "records_in_total") or 0.0
        read = rate(v, "source_read_total")
        return read if read is not None else rate(v, "records_out_total") or 0.0

    targets: dict[str, float] = {}  # records/s a vertex must take in
    outputs: dict[str, float] = {}  # records/s it then emits
    growth: dict[str, float | None] = {}

    def target_out(vid: str, seen: frozenset[str]) -> float:
        if vid in outputs:
            return outputs[vid]
        v = by_id[vid]
        rin, rout = read_rate(v), rate(v, "records_out_total") or 0.0
        if v.is_source:
            # ScalingMetricEvaluator: what the source read + how fast its lag grew (in source records) + the lag
            # worked off within catchUpDuration (0: off).
            grew = rate_signed(v, "pending")
            growth[vid] = grew
            catch_up = spec.catch_up_duration.total_seconds()
            tin = max(0.0, rin + (grew or 0.0)) + (v.pending / catch_up if v.pending and catch_up > 0 else 0.0)
        else:
            tin = sum(target_out(u, seen | {vid}) for u in v.inputs if u in by_id and u not in seen)
        targets[vid] = tin
        outputs[vid] = tin * (rout / rin) if rin > 0 else 0.0
        return outputs[vid]

    def rate_signed(v: VertexMetrics, attr: str) -> float | None:
        before = first.get(v.vertex_id)
        a, b = (None, None) if before is None else (getattr(before, attr), getattr(v, attr))
        return None if a is None or b is None else (float(b) - float(a)) / seconds

    out: list[VertexAdvice] = []
    for v in latest:
        target_out(v.vertex_id, frozenset())
        processed = read_rate(v)
        p = max(v.parallelism, 1)
        avg_busy = (rate(v, "busy_total_ms") or 0.0) / 1000.0 / p
        max_busy = rate(v, "busy_max_total_ms")
        busy = max(avg_busy, max_busy / 1000.0) if max_busy is not None else avg_busy  # FLINK-30652
        target = targets[v.vertex_id]
        excluded: str | None = None
        if v.parallelism != inp.current:
            excluded = f"own parallelism {v.parallelism}: set by the job, not by job.parallelism"
        elif v.finished:
            excluded = "finished"
        elif processed <= 0:
            excluded = "idle: no records in the window"
        true_rate = processed / p / max(busy, MIN_BUSY) if processed > 0 else None
        utilisation: float | None = None
        proposed = v.parallelism
        if excluded is None and true_rate is not None:
            utilisation = target / (true_rate * p)
            proposed = max(1, math.ceil(target / (true_rate * spec.target_utilisation) - 1e-9))
        out.append(VertexAdvice(
            vertex_id=v.vertex_id, name=v.name, current=v.parallelism, proposed=proposed, busy_pct=busy * 100,
            backpressured_pct=(rate(v, "backpressured_total_ms") or 0.0) / 10.0 / p, records_in=processed,
            records_out=rate(v, "records_out_total") or 0.0, true_rate=true_rate, target_rate=target, lag=v.pending,
            utilisation=utilisation, excluded=excluded, lag_growth=growth.get(v.vertex_id),
            max_parallelism=v.max_parallelism, own_parallelism=v.parallelism != inp.current))
    return tuple(out)


def _align(p: int, max_parallelism: int, cap: int) -> int:
    """Up to the next divisor of the key groups (at most `cap`) when p would leave the busiest subtask more
    than MAX_SKEW above the average (keyed state is split by key group); else p. (`JobVertexScaler` always
    moves to a divisor up to maxParallelism/2; small parallelisms are left alone here.)"""
    if max_parallelism <= 0 or p >= max_parallelism:
        return p
    if math.ceil(max_parallelism / p) * p / max_parallelism <= 1 + MAX_SKEW:
        return p
    for q in range(p + 1, min(cap, max_parallelism) + 1):
        if max_parallelism % q == 0:
            return q
    return p


# ---------------------------------------------------------------------------------------------- sampling

SAMPLES_PER_WINDOW = 10


def sample_due(last: datetime | None, now: datetime, window: timedelta) -> bool:
    """Whether to ask Flink again. A decision uses the first and the last sample of its window, so about
    SAMPLES_PER_WINDOW a window are plenty; passes that come more often (a short poll interval, webhooks, drift
    passes) decide on the samples already taken instead of adding requests."""
    return last is None or now - last >= window / SAMPLES_PER_WINDOW


# ---------------------------------------------------------------------------------------------- the stored window
# The sample window and a pending scale-down are kept in the app's record, so a restarted daemon (a new pod) goes
# on deciding where the old one left off instead of collecting a fresh window and waiting a full scaleDownDelay
# again. Writes are budgeted: at most one every SAVE_EVERY per app (a quiet app's record is otherwise untouched),
# at most MAX_STORED samples (the decision needs the window's first and last samples; a thinned window is at most
# window/MAX_STORED longer than asked), only those of the latest job since its tasks last started.

SAVE_EVERY = timedelta(minutes=1)
MAX_STORED = 24
STORED_VERSION = 2  # 2 added the busiest subtask, the source reads and finished; 1 is still read


def save_due(saved_at: datetime | None, now: datetime) -> bool:
    """Whether the window is due to be written to the record (never more often than SAVE_EVERY)."""
    return saved_at is None or now - saved_at >= SAVE_EVERY


def to_store(samples: Sequence[Sample], keep: int = MAX_STORED) -> list[Sample]:
    """The samples worth keeping: the latest job's complete ones since its tasks last (re)started, thinned evenly
    to at most `keep` (the oldest and the newest always kept)."""
    if not samples:
        return []
    job = samples[-1].job_id
    mine = [s for s in samples if s.job_id == job and not s.missing]
    for i in range(len(mine) - 1, 0, -1):
        if _restarted(mine[i - 1], mine[i]):
            mine = mine[i:]
            break
    if len(mine) <= keep:
        return mine
    # evenly by position (samples come one a tick): always `keep` of them, the oldest and the newest included
    return [mine[round(i * (len(mine) - 1) / (keep - 1))] for i in range(keep)]


def window_doc(samples: Sequence[Sample], scale_down: ScaleDown | None, saved_at: datetime) -> dict[str, object]:
    """The stored form (JSON): each vertex's graph once, then per sample only what changes, without the gauges
    (a decision uses the counters)."""
    graph: dict[str, list[object]] = {}
    rows: list[list[object]] = []
    for s in samples:
        vs: list[list[object]] = []
        for v in s.vertices:
            graph.setdefault(v.vertex_id, [v.name, v.max_parallelism, list(v.inputs)])
            vs.append([v.vertex_id, v.parallelism, v.busy_total_ms, v.backpressured_total_ms, v.idle_total_ms,
                       v.records_in_total, v.records_out_total, v.pending, v.busy_max_total_ms,
                       v.source_read_total, v.finished])
        rows.append([s.at.isoformat(), vs])
    return {"version": STORED_VERSION, "saved_at": saved_at.isoformat(),
            "job_id": samples[-1].job_id if samples else None, "vertices": graph, "samples": rows,
            "scale_down": ({"since": scale_down.since.isoformat(), "peak": scale_down.peak} if scale_down else None)}


@dataclass(frozen=True)
class StoredWindow:
    samples: tuple[Sample, ...] = ()
    scale_down: ScaleDown | None = None
    saved_at: datetime | None = None
    problem: str | None = None  # why the stored window could not be read (it is then ignored, never fatal)


def window_from_doc(doc: object) -> StoredWindow:
    """The stored window back; anything unreadable gives an empty window and says why (a fresh window is
    collected: slower, never wrong)."""
    if doc is None:
        return StoredWindow()
    try:
        if not isinstance(doc, dict) or doc.get("version") not in (1, STORED_VERSION):
            raise ValueError(f"unknown form (version {doc.get('version') if isinstance(doc, dict) else '?'})")
        graph = doc["vertices"]
        job = str(doc["job_id"]) if doc.get("job_id") else ""
        samples = []
        for at, vs in doc["samples"]:
            vertices = []
            for row in vs:
                vid, p, busy, bp, idle, rin, rout, pending = row[:8]
                busy_max, read, finished = row[8:11] if len(row) > 8 else (None, None, False)  # version 1
                name, maxp, inputs = graph[vid]
                vertices.append(VertexMetrics(
                    vertex_id=str(vid), name=str(name), parallelism=int(p), max_parallelism=int(maxp),
                    inputs=tuple(str(i) for i in inputs), busy_total_ms=float(busy), backpressured_total_ms=float(bp),
                    idle_total_ms=float(idle), records_in_total=float(rin), records_out_total=float(rout),
                    pending=None if pending is None else float(pending),
                    busy_max_total_ms=None if busy_max is None else float(busy_max),
                    source_read_total=None if read is None else float(read), finished=bool(finished)))
            samples.append(Sample(at=datetime.fromisoformat(at), job_id=job, vertices=tuple(vertices)))
        down = doc.get("scale_down")
        scale_down = (ScaleDown(since=datetime.fromisoformat(down["since"]), peak=int(down["peak"]))
                      if down else None)
        saved = datetime.fromisoformat(doc["saved_at"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return StoredWindow(problem=f"the stored autoscale window is unreadable ({type(e).__name__}: {e})")
    if any(b.at <= a.at for a, b in pairwise(samples)):
        return StoredWindow(problem="the stored autoscale window's samples are out of order")
    return StoredWindow(samples=tuple(samples), scale_down=scale_down, saved_at=saved)
