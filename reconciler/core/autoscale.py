"""The autoscaling decision: which parallelism Flink's own metrics call for, and whether to act on it now.

Pure: the shell (`service.autoscale`) samples the metrics and keeps the samples and the little state a
decision carries (since when a scale-down is called for); this module only computes. The method is the one
of the Flink Kubernetes Operator's autoscaler (FLIP-271, after Kalavri et al., "Three steps is all you need"):

- a vertex's *true processing rate* per subtask is the records it took in per second divided by the share of
  the time it was busy (a vertex busy half the time could do twice what it did);
- the *target rate* starts at the sources (what they read, plus their lag worked off within
  `catchUpDuration` when they report it) and flows down the graph with each vertex's out/in ratio;
- a vertex needs ceil(target / (true rate x target utilisation)) subtasks, bounded by min/max, the task
  slots and its max parallelism, moved up to a divisor of its key groups when the keys would split unevenly.

The app has one `job.parallelism`, so the proposal is the largest any vertex needs. Hysteresis: nothing while
the job is not running or its metrics are incomplete, nothing within `stabilisation` of the last applied
change (which is how a human's edit of parallelism in Git wins), nothing before a full `window` of samples,
a change smaller than `minChange` is none, and a lower parallelism must be called for continuously for
`scaleDownDelay` before it is proposed.
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
    """One job vertex at one moment, summed over its subtasks by Flink (`subtasks/metrics?agg=sum`).

    The counters (`accumulate*TimeMs`, `numRecordsIn/Out`) are what a decision uses: the difference between
    two samples is the exact average over the time between them, whatever the window. Flink's own per-second
    gauges (busyTimeMsPerSecond, numRecordsInPerSecond, ...) are moving averages over a fixed minute that lag
    a change; they are kept for showing the moment."""

    vertex_id: str
    name: str
    parallelism: int
    max_parallelism: int
    inputs: tuple[str, ...]  # upstream vertex ids; none: a source
    busy_total_ms: float  # accumulateBusyTimeMs
    backpressured_total_ms: float  # accumulateBackPressuredTimeMs
    idle_total_ms: float  # accumulateIdleTimeMs
    records_in_total: float  # numRecordsIn
    records_out_total: float  # numRecordsOut
    pending: float | None = None  # pendingRecords (sources whose connector reports lag)
    busy_ms_per_s: float | None = None  # busyTimeMsPerSecond, average over subtasks (the moment)
    backpressured_ms_per_s: float | None = None  # backPressuredTimeMsPerSecond, average

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
    busy_pct: float
    backpressured_pct: float
    records_in: float  # per second, all subtasks
    records_out: float
    true_rate: float | None  # records/s one subtask could process when busy all the time
    target_rate: float  # records/s this vertex must take in
    lag: float | None
    limit: str | None = None  # what bounded the proposal (max, slots, max parallelism, min)


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

    @property
    def changes(self) -> bool:
        return self.verdict in (Verdict.SCALE_UP, Verdict.SCALE_DOWN)

    def to_json(self) -> dict[str, object]:
        return {
            "app": self.app, "verdict": self.verdict.value, "current": self.current, "proposed": self.proposed,
            "wanted": self.wanted, "reason": self.reason, "samples": self.samples,
            "window": [t.isoformat() if t else None for t in (self.window_start, self.window_end)],
            "scaleDownSince": self.scale_down.since.isoformat() if self.scale_down else None,
            "vertices": [
                {"id": v.vertex_id, "name": v.name, "current": v.current, "proposed": v.proposed,
                 "busyPct": round(v.busy_pct, 1), "backpressuredPct": round(v.backpressured_pct, 1),
                 "recordsInPerSecond": round(v.records_in, 2), "recordsOutPerSecond": round(v.records_out, 2),
                 "trueRatePerSubtask": None if v.true_rate is None else round(v.true_rate, 2),
                 "targetRate": round(v.target_rate, 2), "lag": v.lag, "limit": v.limit}
                for v in self.vertices],
        }


@dataclass(frozen=True)
class Inputs:
    """Everything one decision needs besides the spec and the samples."""

    app: str
    current: int  # job.parallelism in Git (what the app is meant to run at)
    slots: int  # task slots of the cluster (a spec above them would not validate)
    now: datetime
    job_running: bool
    why_not_running: str = ""
    last_change_at: datetime | None = None  # the last applied change of the app (any: rescale, upgrade, edit)
    pending_change: bool = False  # Git has a change of the app not applied yet
    scale_down: ScaleDown | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def decide(spec: AutoscaleSpec, inp: Inputs, samples: Sequence[Sample]) -> Advice:
    """The advice for one app from its samples (oldest first)."""
    wait = _why_wait(spec, inp, samples)
    if isinstance(wait, str):
        return Advice(app=inp.app, verdict=Verdict.WAIT, current=inp.current, proposed=inp.current, reason=wait,
                      samples=len(samples))
    usable = wait
    vertices = _advise(spec, inp, usable)
    wanted = max((v.proposed for v in vertices), default=inp.current)
    base = Advice(app=inp.app, verdict=Verdict.KEEP, current=inp.current, proposed=inp.current, reason="",
                  vertices=vertices, samples=len(usable), window_start=usable[0].at, window_end=usable[-1].at,
                  wanted=wanted)
    bottleneck = max(vertices, key=lambda v: v.proposed)
    why = (f"{bottleneck.name} needs {bottleneck.proposed}: target {bottleneck.target_rate:.1f} rec/s, "
           + (f"{bottleneck.true_rate:.1f} rec/s per subtask when busy" if bottleneck.true_rate else "no rate")
           + f" at {spec.target_utilisation:.0%} utilisation")
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
    ready_at = down.since + spec.scale_down_delay
    if inp.now < ready_at:
        return replace(base, verdict=Verdict.WAIT, scale_down=down,
                     reason=f"scale down {inp.current} -> {down.peak} called for since {down.since:%H:%M:%S}; "
                            f"waiting out scaleDownDelay until {ready_at:%H:%M:%S}: {why}")
    return replace(base, verdict=Verdict.SCALE_DOWN, proposed=down.peak, scale_down=down,
                 reason=f"scale down {inp.current} -> {down.peak} (called for since {down.since:%H:%M:%S}): {why}")


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
    off = [v.name for v in last.vertices if v.parallelism != inp.current]
    if off:
        return (f"no decision while vertices run at another parallelism than job.parallelism {inp.current} "
                f"({', '.join(off[:3])}): a rescale is in progress")
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
    return any(v.vertex_id in before and v.went_back_from(before[v.vertex_id]) for v in b.vertices)


def _advise(spec: AutoscaleSpec, inp: Inputs, samples: Sequence[Sample]) -> tuple[VertexAdvice, ...]:
    first = {v.vertex_id: v for v in samples[0].vertices}
    latest = samples[-1].vertices
    by_id = {v.vertex_id: v for v in latest}
    seconds = max((samples[-1].at - samples[0].at).total_seconds(), 1e-9)

    def rate(v: VertexMetrics, attr: str) -> float:
        before = first.get(v.vertex_id)
        return max(0.0, float(getattr(v, attr)) - float(getattr(before, attr))) / seconds if before else 0.0

    targets: dict[str, float] = {}  # records/s a vertex must take in
    outputs: dict[str, float] = {}  # records/s it then emits

    def target_out(vid: str, seen: frozenset[str]) -> float:
        if vid in outputs:
            return outputs[vid]
        v = by_id[vid]
        rin, rout = rate(v, "records_in_total"), rate(v, "records_out_total")
        if v.is_source:
            catch_up = spec.catch_up_duration.total_seconds()
            tin = rout + (v.pending / catch_up if v.pending and catch_up > 0 else 0.0)
            targets[vid] = outputs[vid] = tin
            return tin
        tin = sum(target_out(u, seen | {vid}) for u in v.inputs if u in by_id and u not in seen)
        targets[vid] = tin
        outputs[vid] = tin * (rout / rin) if rin > 0 else 0.0
        return outputs[vid]

    out: list[VertexAdvice] = []
    for v in latest:
        target_out(v.vertex_id, frozenset())
        rin, rout = rate(v, "records_in_total"), rate(v, "records_out_total")
        busy = rate(v, "busy_total_ms") / 1000.0 / max(v.parallelism, 1)
        processed = rout if v.is_source else rin
        # Busy below MIN_BUSY is noise, not a measurement: such a vertex could do at least processed/MIN_BUSY (it
        # never vetoes a scale-down). No records at all: nothing is known of its rate.
        true_rate = processed / v.parallelism / max(busy, MIN_BUSY) if processed > 0 else None
        target = targets[v.vertex_id]
        limit: str | None = None
        if true_rate is None:
            proposed, limit = inp.current, "no load measured: keeps the current parallelism"
        else:
            proposed = max(1, math.ceil(target / (true_rate * spec.target_utilisation) - 1e-9))
            proposed = _align(proposed, v.max_parallelism, min(spec.max, inp.slots))
            proposed, limit = _bound(proposed, spec, inp.slots, v.max_parallelism)
        out.append(VertexAdvice(
            vertex_id=v.vertex_id, name=v.name, current=v.parallelism, proposed=proposed, busy_pct=busy * 100,
            backpressured_pct=rate(v, "backpressured_total_ms") / 10.0 / max(v.parallelism, 1), records_in=rin,
            records_out=rout, true_rate=true_rate, target_rate=target, lag=v.pending, limit=limit))
    return tuple(out)


def _align(p: int, max_parallelism: int, cap: int) -> int:
    """Up to the next divisor of the key groups (at most `cap`) when p would leave the busiest subtask more
    than MAX_SKEW above the average (keyed state is split by key group); else p."""
    if max_parallelism <= 0 or p >= max_parallelism:
        return p
    if math.ceil(max_parallelism / p) * p / max_parallelism <= 1 + MAX_SKEW:
        return p
    for q in range(p + 1, min(cap, max_parallelism) + 1):
        if max_parallelism % q == 0:
            return q
    return p


def _bound(p: int, spec: AutoscaleSpec, slots: int, max_parallelism: int) -> tuple[int, str | None]:
    limits = [(spec.max, "autoscale.max"), (slots, "task slots (taskManager.replicas x slots)")]
    if max_parallelism > 0:
        limits.append((max_parallelism, "the vertex's max parallelism"))
    for cap, name in sorted(limits):
        if p > cap:
            return max(cap, 1), f"capped at {cap} by {name} (wanted {p})"
    if p < spec.min:
        return spec.min, f"raised to autoscale.min {spec.min} (wanted {p})"
    return p, None


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
STORED_VERSION = 1


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
                       v.records_in_total, v.records_out_total, v.pending])
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
        if not isinstance(doc, dict) or doc.get("version") != STORED_VERSION:
            raise ValueError(f"unknown form (version {doc.get('version') if isinstance(doc, dict) else '?'})")
        graph = doc["vertices"]
        job = str(doc["job_id"]) if doc.get("job_id") else ""
        samples = []
        for at, vs in doc["samples"]:
            vertices = []
            for vid, p, busy, bp, idle, rin, rout, pending in vs:
                name, maxp, inputs = graph[vid]
                vertices.append(VertexMetrics(
                    vertex_id=str(vid), name=str(name), parallelism=int(p), max_parallelism=int(maxp),
                    inputs=tuple(str(i) for i in inputs), busy_total_ms=float(busy), backpressured_total_ms=float(bp),
                    idle_total_ms=float(idle), records_in_total=float(rin), records_out_total=float(rout),
                    pending=None if pending is None else float(pending)))
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
