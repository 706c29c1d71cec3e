"""Autoscaling with Git the truth: sample Flink's metrics, decide (`core.autoscale`), then recommend or commit.

Runs inside the daemon's pass (`Reconciler.sync` calls `Autoscaler.tick` after reconciling), for the apps whose
spec says `autoscale.mode: recommend | commit`. Per app and tick, at most every window/10 (`sample_due`), it asks
the JobManager for its jobs (one request), the job's graph (one) and per vertex the counters and gauges the
decision needs, aggregated over the subtasks by Flink (one request per vertex; a source's metric names once per
job, to find `pendingRecords`).

- recommend: the advice goes on the applied commit as its own status (`flink-reconciler/<app>/autoscale`),
  to `status` / `scale-advice`, and to /metrics. Nothing changes.
- commit: a scale decision rewrites `spec.job.parallelism` in the app's file and commits it fast-forward only
  on top of the tip it read (the path `rollback --write-commit` takes), with the evidence in the message; the
  daemon then applies it like any push (an in-place rescale with `upgrade.inPlaceRescale`). With
  `commit.branch` the commit goes to that branch instead, for a pull request.

The samples and a pending scale-down are kept in the app's record too (at most one write a minute per app,
a thinned window: `core.autoscale.to_store`), so a restarted daemon goes on from the stored window instead of
collecting a fresh one and waiting a full scaleDownDelay again.

A commit origin refuses (a protected branch, a pre-receive hook; not a branch that merely moved) is not retried
every pass: the app backs off exponentially (REFUSED_BACKOFF doubling up to REFUSED_BACKOFF_MAX), recommends
meanwhile, says so once as its autoscale status and in `flink_reconciler_autoscale_push_refused`, and commits
again once a push is accepted. Capacity: with `autoscale.maxTaskManagers` the same commit raises
`taskManager.replicas` when the slots would not hold the new parallelism (`ScalingExecutor`'s resource check,
turned into a spec change); a session app is bounded by the slots its cluster's other apps leave (its cluster
grows its TaskManagers itself with `capacity.addTaskManagers`), whatever file holds the cluster.
"""

from __future__ import annotations

import io
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from reconciler.core.autoscale import (
    Advice,
    Inputs,
    Sample,
    ScaleDown,
    Verdict,
    VertexMetrics,
    decide,
    sample_due,
    save_due,
    to_store,
    window_doc,
    window_from_doc,
)
from reconciler.core.observed import JobPhase, Outcome, job_phase
from reconciler.errors import JobNotFoundError, PermanentStepError, ReconcilerError, SourceMovedError, StepError
from reconciler.live.ports import Runtime
from reconciler.report.status import CONTEXT_PREFIX, CommitStatus
from reconciler.service.ports import AutoscaleMetrics
from reconciler.spec.load import LoadedApp, LoadResult, load_files
from reconciler.spec.model import AutoscaleMode, FlinkApp, JobState
from reconciler.spec.policy import SpecPolicy
from reconciler.spec.session import CLUSTER_FIELDS, alias

if TYPE_CHECKING:  # reconcile.py builds the Autoscaler: no import at run time
    from reconciler.service.reconcile import Reconciler

log = logging.getLogger(__name__)

COUNTERS = ("accumulateBusyTimeMs", "accumulateBackPressuredTimeMs", "accumulateIdleTimeMs", "numRecordsIn",
            "numRecordsOut")
GAUGES = ("busyTimeMsPerSecond", "backPressuredTimeMsPerSecond", "idleTimeMsPerSecond", "numRecordsInPerSecond",
          "numRecordsOutPerSecond")
PENDING_SUFFIX = ".pendingRecords"
RECORDS_OUT_SUFFIX = ".numRecordsOut"  # an operator's; a source operator's counts the records it read
# A commit origin refused: no new try before this, doubling per refusal up to REFUSED_BACKOFF_MAX.
REFUSED_BACKOFF = timedelta(minutes=1)
REFUSED_BACKOFF_MAX = timedelta(minutes=30)
STATUS_SUFFIX = "/autoscale"
COMMIT_TRAILER = "Autoscaled-by: flink-reconciler"
# Flink's REST API answers metrics from a store it refreshes from the TaskManagers at most every
# metrics.fetcher.update-interval (10 s by default), fetching after a request: a sample may repeat the last one.
FETCH_SLACK_S = 30.0


def same_values(a: Sample, b: Sample) -> bool:
    """Whether `b` repeats `a`'s numbers: Flink's metric store was not refreshed in between. Such a sample is
    dropped, so every kept sample is a first sighting of fresh numbers and its time is close to theirs."""
    if a.job_id != b.job_id or len(a.vertices) != len(b.vertices) or b.missing:
        return False
    return all((u.vertex_id, u.parallelism, u.busy_total_ms, u.idle_total_ms, u.records_in_total,
                u.records_out_total) == (v.vertex_id, v.parallelism, v.busy_total_ms, v.idle_total_ms,
                                         v.records_in_total, v.records_out_total)
               for u, v in zip(a.vertices, b.vertices, strict=True))


@dataclass(frozen=True)
class Committed:
    app: str
    sha: str
    branch: str
    advice: Advice


@dataclass
class _AppState:
    samples: deque[Sample]
    scale_down: ScaleDown | None = None
    posted: tuple[str, str, int, int | None] | None = None  # (revision, verdict, proposed, wanted) last reported
    proposed_on_branch: tuple[str, int] | None = None  # (tip, parallelism) last pushed to commit.branch
    # job id + vertex id of a source -> (its pendingRecords metric, its source operator's numRecordsOut metric)
    source_names: dict[str, tuple[str | None, str | None]] | None = None
    refusals: int = 0  # pushes origin refused in a row
    refused_until: datetime | None = None  # no commit before this (recommending meanwhile)
    saved_at: datetime | None = None  # when the window was last written to the app's record
    sampled_at: datetime | None = None  # when Flink was last asked (the job and its metrics)
    sampled_job: str | None = None
    running: tuple[bool, str] = (False, "")  # what Flink said then: running, and if not why


def source_metrics(names: list[str]) -> tuple[str | None, str | None]:
    """(pendingRecords, the source operator's numRecordsOut) among a source vertex's metric ids. Flink names an
    operator's metrics `<operator>.<metric>`, the operator's name with spaces and colons as `_` (`Source__x`)."""
    pending = next((n for n in names if n.endswith(PENDING_SUFFIX)), None)
    outs = [n for n in names if n.endswith(RECORDS_OUT_SUFFIX) and n != RECORDS_OUT_SUFFIX[1:]]
    prefix = pending[: -len(PENDING_SUFFIX)] if pending else None
    read = next((n for n in outs if prefix and n == prefix + RECORDS_OUT_SUFFIX), None)
    read = read or next((n for n in outs if n.startswith("Source_")), None)
    return pending, read


def sample(flink: Any, job_id: str, *, at: datetime, source_names: dict[str, tuple[str | None, str | None]],
           count: Callable[[int], None]) -> Sample:
    """One sample of a running job; `count(1)` before each request (also one that then fails)."""
    count(1)
    graph = flink.job_graph(job_id)
    vertices: list[VertexMetrics] = []
    missing: list[str] = []
    for v in graph:
        names = [*COUNTERS, *GAUGES]
        pending_name = read_name = None
        if not v.inputs:
            key = f"{job_id}/{v.vertex_id}"
            if key not in source_names:
                count(1)
                source_names[key] = source_metrics(list(flink.vertex_metric_names(job_id, v.vertex_id)))
            pending_name, read_name = source_names[key]
            names += [n for n in (pending_name, read_name) if n]
        count(1)
        got = flink.vertex_metrics(job_id, v.vertex_id, names)
        missing += [f"{v.name}: {n}" for n in COUNTERS if "sum" not in got.get(n, {})]

        sums = {n: float(a["sum"]) for n, a in got.items() if "sum" in a}

        def total(name: str, sums: dict[str, float] = sums) -> float:
            return sums.get(name, 0.0)

        pending = sums.get(pending_name) if pending_name else None
        busy_max = got.get("accumulateBusyTimeMs", {}).get("max")
        vertices.append(VertexMetrics(
            vertex_id=v.vertex_id, name=v.name, parallelism=v.parallelism, max_parallelism=v.max_parallelism,
            inputs=v.inputs, busy_total_ms=total("accumulateBusyTimeMs"),
            backpressured_total_ms=total("accumulateBackPressuredTimeMs"), idle_total_ms=total("accumulateIdleTimeMs"),
            records_in_total=total("numRecordsIn"), records_out_total=total("numRecordsOut"), pending=pending,
            busy_ms_per_s=got.get("busyTimeMsPerSecond", {}).get("avg"),
            backpressured_ms_per_s=got.get("backPressuredTimeMsPerSecond", {}).get("avg"),
            busy_max_total_ms=None if busy_max is None else float(busy_max),
            source_read_total=sums.get(read_name) if read_name else None, finished=v.status == "FINISHED"))
    return Sample(at=at, job_id=job_id, vertices=tuple(vertices), missing=tuple(missing))


def slot_inputs(la: LoadedApp, loaded: LoadResult | None) -> dict[str, Any]:
    """The task slots an app may use, as `Inputs` fields. An app with a cluster of its own: its
    taskManager.replicas x slots, and with `autoscale.maxTaskManagers` it may raise the replicas. A session app:
    the slots its cluster can have (up to capacity.maxTaskManagers with addTaskManagers, which then grows the
    cluster by itself) less the running parallelism of the other apps on it that this reconciler loads."""
    app = la.app
    tm = app.spec.task_manager
    cluster_name = app.spec.session_cluster
    lc = loaded.clusters.get(cluster_name) if loaded is not None and cluster_name else None
    if cluster_name is None or lc is None or loaded is None:
        out: dict[str, Any] = {"slots": tm.replicas * tm.slots}
        if cluster_name is None and app.spec.autoscale.max_task_managers:
            out |= {"slots_per_task_manager": tm.slots, "task_managers": tm.replicas,
                    "max_task_managers": max(tm.replicas, app.spec.autoscale.max_task_managers)}
        return out
    ctm, cap = lc.cluster.spec.task_manager, lc.cluster.spec.capacity
    most = cap.max_task_managers if cap.add_task_managers and cap.max_task_managers else ctm.replicas
    total = max(most, tm.replicas) * ctm.slots
    others = [o.app for n in loaded.session_names.get(cluster_name, ()) if n != app.name
              and (o := loaded.apps.get(n)) is not None and o.app.spec.job.state is JobState.RUNNING]
    used = sum(o.spec.job.parallelism for o in others)
    return {"slots": max(0, total - used),
            "slots_note": f"the task slots session cluster {cluster_name!r} leaves this app ({total} - {used} of "
                          f"{len(others)} other app{'s' if len(others) != 1 else ''})"}


def session_files(la: LoadedApp, loaded: LoadResult) -> list[str]:
    """The files of a session app's cluster and of the cluster's other apps (none for an app of its own)."""
    name = la.app.spec.session_cluster
    lc = loaded.clusters.get(name) if name else None
    if name is None or lc is None:
        return []
    others = (loaded.apps[n].file for n in loaded.session_names.get(name, ()) if n in loaded.apps)
    return sorted({lc.file, *others} - {la.file})


class Autoscaler:
    """The autoscaler of one Reconciler (its shard's apps). Called from the pass's worker thread only."""

    def __init__(self, rec: Reconciler, *, metrics: AutoscaleMetrics | None = None,
                 on_commit: Callable[[Committed], None] | None = None, stored: bool = True) -> None:
        """`stored`: go on from the window kept in each app's record and keep it there (the daemon); a one-off
        look (`scale-advice`) neither reads nor writes it."""
        self.rec = rec
        self.stored = stored
        self.metrics = metrics
        self.on_commit = on_commit
        self._apps: dict[str, _AppState] = {}
        self.advice: dict[str, Advice] = {}
        self.requests: dict[str, int] = {}  # app -> REST requests made for autoscaling since start

    # ------------------------------------------------------------------ the tick

    def tick(self, head: str) -> str | None:
        """Sample, decide and act for every autoscaled app at `head`; when it committed to the tracked branch, why
        the caller should reconcile again at once, else None. Never raises for one app's trouble."""
        loaded = self.rec.load(head)
        runtime = self.rec.runtime
        if runtime is None:
            return None
        scaled = {n: la for n, la in loaded.apps.items() if la.app.spec.autoscale.mode is not AutoscaleMode.OFF}
        for gone in set(self._apps) - set(scaled):
            self._apps.pop(gone, None)
            self.advice.pop(gone, None)
        made: Committed | None = None
        for name, la in sorted(scaled.items()):
            try:
                advice = self.evaluate(la, runtime, loaded=loaded)
                done = self._act(head, la, advice, session_files=session_files(la, loaded))
                made = made or (done if done is not None and done.branch == self.rec.source.branch else None)
            except ReconcilerError as e:
                log.warning("%s: autoscaling skipped this tick: %s", name, e)
        return f"autoscale commit {made.sha[:12]} of app {made.app}" if made is not None else None

    def evaluate(self, la: LoadedApp, runtime: Runtime, *, window: timedelta | None = None,
                 loaded: LoadResult | None = None) -> Advice:
        """Take a sample of the app's job and decide; remembers both. `window` overrides the spec's; `loaded` (the
        tree at the head) gives a session app the other apps on its cluster."""
        app = la.app
        spec = app.spec.autoscale if window is None else app.spec.autoscale.model_copy(update={"window": window})
        name = app.name
        state = self._apps.get(name)
        if state is None:
            state = self._apps[name] = self._restore(name)
        now = self.rec.clock.now()
        record = self.rec.journal.record(name)
        current = app.spec.job.parallelism
        capacity = slot_inputs(la, loaded)
        applied = FlinkApp.model_validate(record.last_applied_spec) if record and record.last_applied_spec else None
        pending = applied is None or applied.spec_hash != app.spec_hash or self.rec.journal.inflight(name) is not None
        lineage = self.rec.journal.lineage(name)
        last_change = max((e.at for e in lineage), default=None)
        running, why = False, "no job on record"
        job_id = record.job_id if record else None
        if job_id and not pending and state.sampled_job == job_id and not sample_due(state.sampled_at, now,
                                                                                     spec.window):
            running, why = state.running  # decided on the samples taken: Flink is not asked more than needed
        elif job_id and not pending:
            flink = runtime.flink(name)
            try:
                self._count(name, 1)
                summary = next((j for j in flink.jobs() if j.job_id == job_id), None)
                if summary is None:
                    running, why = False, f"job {job_id} is not on the JobManager"
                else:
                    phase = job_phase(summary.state, summary.tasks_running, summary.tasks_total,
                                      summary.tasks_finished)
                    running, why = phase is JobPhase.RUNNING, (f"{summary.state}, {summary.tasks_running}/"
                                                               f"{summary.tasks_total} tasks running")
                if running:
                    names = state.source_names if state.source_names is not None else {}
                    state.source_names = names
                    smp = sample(flink, job_id, at=now, source_names=names, count=partial(self._count, name))
                    last = state.samples[-1] if state.samples else None
                    if last is None or not same_values(last, smp):
                        state.samples.append(smp)
            except (StepError, JobNotFoundError) as e:
                running, why = False, f"its metrics cannot be read: {e}"
            state.sampled_at, state.sampled_job, state.running = now, job_id, (running, why)
        keep = spec.window + spec.stabilisation + timedelta(minutes=1)
        while state.samples and state.samples[0].at < now - keep:
            state.samples.popleft()
        advice = decide(spec, Inputs(app=name, current=current, now=now, job_running=running,
                                     why_not_running=why, last_change_at=last_change, pending_change=pending,
                                     scale_down=state.scale_down, **capacity), list(state.samples))
        state.scale_down = advice.scale_down
        self._save(name, state, now)
        old = self.advice.get(name)
        if old is None or (old.verdict, old.reason.split(":")[0]) != (advice.verdict, advice.reason.split(":")[0]):
            log.info("%s: autoscale %s: %s", name, advice.verdict.value, advice.reason)
        self.advice[name] = advice
        if self.metrics is not None:
            self.metrics.set_autoscale(name, current=current, wanted=advice.wanted, verdict=advice.verdict.value)
        return advice

    def _restore(self, app: str) -> _AppState:
        """A new app state, from the window stored in the app's record when there is one (a restarted daemon)."""
        state = _AppState(samples=deque(maxlen=2000))
        if not self.stored:
            return state
        stored = window_from_doc(self.rec.journal.autoscale_window(app))
        if stored.problem:
            log.warning("%s: %s: collecting a fresh window", app, stored.problem)
        elif stored.samples or stored.scale_down:
            state.samples.extend(stored.samples)
            state.scale_down, state.saved_at = stored.scale_down, stored.saved_at
            log.info("%s: autoscale goes on from %d samples stored in its record (saved %s)", app,
                     len(stored.samples), stored.saved_at.isoformat() if stored.saved_at else "-")
        return state

    def _save(self, app: str, state: _AppState, now: datetime, *, empty: bool = False) -> None:
        """Keep the window in the app's record, at most once every SAVE_EVERY (the record's write budget; `empty`:
        after its own commit, once per commit)."""
        if not self.stored or not save_due(state.saved_at, now) or not (state.samples or state.scale_down or empty):
            return
        state.saved_at = now  # also on failure: the budget holds, the next try is a minute later
        try:
            self.rec.journal.save_autoscale_window(app, window_doc(to_store(state.samples), state.scale_down, now))
        except ReconcilerError as e:
            log.warning("%s: cannot keep the autoscale window in the record (tried again in a minute): %s", app, e)

    def _count(self, app: str, n: int) -> None:
        self.requests[app] = self.requests.get(app, 0) + n
        if self.metrics is not None:
            self.metrics.count_autoscale_requests(app, n)

    # ------------------------------------------------------------------ acting on it

    def _act(self, head: str, la: LoadedApp, advice: Advice, *, session_files: Sequence[str] = ()
             ) -> Committed | None:
        app = la.app
        state = self._apps[app.name]
        self._post(app.name, advice)
        if app.spec.autoscale.mode is not AutoscaleMode.COMMIT or not advice.changes:
            return None
        now = self.rec.clock.now()
        if state.refused_until is not None and now < state.refused_until:
            return None  # origin refused the last push: recommending until the next try
        branch = app.spec.autoscale.commit.branch or self.rec.source.branch
        if branch != self.rec.source.branch and state.proposed_on_branch == (head, advice.proposed):
            return None  # already proposed on that branch from this tip
        try:
            sha = write_commit(self.rec, head, la, advice, branch=branch, session_files=session_files)
        except SourceMovedError:
            raise  # the branch moved: the next tick decides again on the new tip
        except ReconcilerError as e:
            self._refused(app.name, state, advice, branch=branch, e=e, now=now)
            return None
        if state.refusals:
            log.info("%s: origin accepted the autoscale push again after %d refusal(s): committing again",
                     app.name, state.refusals)
            state.refusals, state.refused_until = 0, None
            if self.metrics is not None:
                self.metrics.set_autoscale_push_refused(app.name, False)
        log.info("%s: autoscale commit %s on %s: parallelism %d -> %d", app.name, sha[:12], branch, advice.current,
                 advice.proposed)
        if self.metrics is not None:
            self.metrics.count_autoscale_commit(app.name, "up" if advice.proposed > advice.current else "down")
        state.scale_down = None
        if branch == self.rec.source.branch:
            state.samples.clear()
            state.saved_at = None  # the stored window is of the old parallelism: emptied at once
            self._save(app.name, state, self.rec.clock.now(), empty=True)
        else:
            state.proposed_on_branch = (head, advice.proposed)
        done = Committed(app=app.name, sha=sha, branch=branch, advice=advice)
        if self.on_commit is not None:
            self.on_commit(done)
        return done

    def _refused(self, app: str, state: _AppState, advice: Advice, *, branch: str, e: ReconcilerError,
                 now: datetime) -> None:
        """Origin (or the rewrite) refused the commit: back off exponentially, recommend meanwhile; the first
        refusal of a run is posted as the app's autoscale status, each one logged, the gauge set while it lasts."""
        state.refusals += 1
        delay = min(REFUSED_BACKOFF * 2 ** (state.refusals - 1), REFUSED_BACKOFF_MAX)
        state.refused_until = now + delay
        what = f"parallelism {advice.current} -> {advice.proposed}"
        log.warning("%s: the autoscale commit (%s) to %s was refused (%d in a row): %s; recommending only, next try "
                    "in %ds", app, what, branch, state.refusals, e, delay.total_seconds())
        if self.metrics is not None:
            self.metrics.set_autoscale_push_refused(app, True)
        if state.refusals > 1:
            return
        reporter = self.rec.reporter
        record = self.rec.journal.record(app)
        revision = record.last_applied_revision if record else None
        if reporter is None or revision is None:
            return
        text = (f"autoscale: recommending only: the commit of {what} to {branch} was refused ({e}); tried again with "
                f"backoff, first at {state.refused_until:%H:%M:%S}")
        state.posted = (revision, "refused", advice.proposed, advice.wanted)
        try:
            reporter.report(CommitStatus(revision=revision, app=app, state=Outcome.ERROR,
                                         target_url=self.rec.target_url, description=text[:1000],
                                         context_suffix=STATUS_SUFFIX))
        except ReconcilerError as err:
            log.warning("%s: cannot post the refused autoscale commit's status: %s", app, err)

    def _post(self, app: str, advice: Advice) -> None:
        """The advice as its own status on the applied commit, when it says something new."""
        reporter = self.rec.reporter
        record = self.rec.journal.record(app)
        revision = record.last_applied_revision if record else None
        if reporter is None or revision is None:
            return
        state = self._apps[app]
        refused = state.refusals > 0  # until a push is accepted again: one status for the whole run of refusals
        key = (revision, "refused" if refused and advice.changes else advice.verdict.value, advice.proposed,
               advice.wanted)
        if advice.verdict is Verdict.WAIT and advice.wanted is None:
            return  # nothing measured yet: no news
        if state.posted == key:
            return  # (also: the refusal posted once stands while the advice it was about does)
        state.posted = key
        lead = "autoscale: "
        if refused and state.refused_until is not None:
            lead += (f"recommending only (origin refused the last autoscale commit; next try at "
                     f"{state.refused_until:%H:%M:%S}): ")
        reporter.report(CommitStatus(revision=revision, app=app, state=Outcome.SUCCESS, target_url=self.rec.target_url,
                                     description=lead + advice.reason, context_suffix=STATUS_SUFFIX))


# ---------------------------------------------------------------------------------------------- the commit


def rescaled_file(rec: Reconciler, head: str, la: LoadedApp, parallelism: int, *, task_managers: int | None = None,
                  session_files: Sequence[str] = ()) -> bytes:
    """The app's file at `head` with only `spec.job.parallelism` changed, and `spec.taskManager.replicas` when
    `task_managers` is given (other documents and comments kept). The result is loaded again, with the files of
    its session cluster and of the cluster's other apps when other files hold them (`session_files`: the cluster
    must still hold every job), and must be the same app but for those."""
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        docs = list(yaml.load_all(rec.source.read_file(head, la.file).decode()))
        spec = docs[la.doc_index]["spec"]
        spec["job"]["parallelism"] = parallelism
        if task_managers is not None:
            if "taskManager" not in spec:
                spec["taskManager"] = {}
            spec["taskManager"]["replicas"] = task_managers
        out = io.StringIO()
        yaml.dump_all(docs, out)
    except (YAMLError, KeyError, TypeError, IndexError, UnicodeDecodeError) as e:
        raise PermanentStepError(f"cannot rewrite the spec of app {la.app.name} in {la.file}: {e}") from e
    data = out.getvalue().encode()
    files: dict[str, bytes] = {la.file: data}
    for other in session_files:
        if other != la.file:
            files[other] = rec.source.read_file(head, other)
    result = load_files(files, policy=SpecPolicy.PERMISSIVE)
    check = result.apps.get(la.app.name)
    if check is None and result.errors:
        raise PermanentStepError(f"the rewritten {la.file} would not load: {result.errors[0]}: nothing was committed")
    expect, got = la.app.canonical(), check.app.canonical() if check is not None else None
    expect["spec"]["job"]["parallelism"] = parallelism
    if task_managers is not None:
        expect["spec"].setdefault("taskManager", {})["replicas"] = task_managers
    if got is not None and la.app.spec.session_cluster:
        for f in CLUSTER_FIELDS:  # the cluster's, fitted to all its apps: not this file's to compare
            expect["spec"].pop(alias(f), None)
            got["spec"].pop(alias(f), None)
    if got != expect:
        raise PermanentStepError(f"the rewritten {la.file} does not hold app {la.app.name} at parallelism "
                                 f"{parallelism} and nothing else changed (a bug): nothing was committed")
    return data


def commit_message(app: str, advice: Advice, target_utilisation: float, task_managers: tuple[int, int] | None = None
                   ) -> str:
    tms = f", taskManager.replicas {task_managers[0]} -> {task_managers[1]}" if task_managers else ""
    lines = [f"autoscale({app}): parallelism {advice.current} -> {advice.proposed}{tms}", "", advice.reason, "",
             evidence_table(advice), "",
             f"Window: {_ts(advice.window_start)} .. {_ts(advice.window_end)} UTC, {advice.samples} samples; "
             f"target utilisation {target_utilisation:.0%}.",
             "Written by the flink-reconciler autoscaler (spec.autoscale.mode: commit); a human edit of",
             "spec.job.parallelism always wins (no autoscale change within spec.autoscale.stabilisation of it).",
             "", COMMIT_TRAILER, ""]
    return "\n".join(lines)


def evidence_table(advice: Advice) -> str:
    """One row per vertex: BUSY is its busiest subtask's, UTIL how busy it is for the rate it must take in at the
    current parallelism, NOTE why a vertex does not decide (its own parallelism, idle, finished)."""
    rows = [("VERTEX", "NOW", "PROPOSED", "BUSY", "BACKPRESSURED", "IN/S", "OUT/S", "RATE/SUBTASK", "TARGET/S",
             "UTIL", "LAG", "NOTE")]
    for v in advice.vertices:
        rows.append((v.name, str(v.current), str(v.proposed), f"{v.busy_pct:.0f}%", f"{v.backpressured_pct:.0f}%",
                     f"{v.records_in:.1f}", f"{v.records_out:.1f}",
                     "-" if v.true_rate is None else f"{v.true_rate:.1f}", f"{v.target_rate:.1f}",
                     "-" if v.utilisation is None else f"{v.utilisation:.0%}",
                     "-" if v.lag is None else f"{v.lag:.0f}", v.excluded or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def write_commit(rec: Reconciler, head: str, la: LoadedApp, advice: Advice, *, branch: str,
                 session_files: Sequence[str] = ()) -> str:
    """Commit the new parallelism (and TaskManagers, when it needs more) on top of `head` and push it:
    fast-forward only on the tracked branch (a tip that moved meanwhile is never overwritten: SourceMovedError,
    the next tick decides again on the new tip)."""
    tms = advice.task_managers if advice.verdict is Verdict.SCALE_UP and not la.app.spec.session_cluster else None
    old_tms = la.app.spec.task_manager.replicas
    tms = tms if tms is not None and tms > old_tms else None
    data = rescaled_file(rec, head, la, advice.proposed, task_managers=tms, session_files=session_files)
    sha = rec.source.commit_file(head, la.file, data, commit_message(
        la.app.name, advice, la.app.spec.autoscale.target_utilisation, (old_tms, tms) if tms else None))
    if branch == rec.source.branch:
        rec.source.push_commit(sha)
    else:
        rec.source.push_proposal(sha, branch)
    return sha


def _ts(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def advise_now(rec: Reconciler, app: str, *, seconds: float) -> Advice:
    """`flink-reconciler scale-advice APP`: the advice from two samples `seconds` apart, taken now (the window is
    those seconds; the rest of the app's spec.autoscale applies, including its stabilisation after a change).
    A scale-down shows as waiting its scaleDownDelay: a one-off look cannot know since when it is called for."""
    if rec.runtime is None:
        raise PermanentStepError("scale-advice needs a runtime to read the job's metrics (not a dry run)")
    rec.source.fetch()
    head = rec.source.head()
    loaded = rec.load(head)
    la = loaded.apps.get(app)
    if la is None:
        raise PermanentStepError(f"no valid spec of app {app!r} at {head[:12]}")
    scaler = Autoscaler(rec, stored=False)
    window = timedelta(seconds=seconds)
    end = rec.clock.monotonic() + seconds + FETCH_SLACK_S
    while True:
        advice = scaler.evaluate(la, rec.runtime, window=window, loaded=loaded)
        if not scaler._apps[app].samples and advice.verdict is Verdict.WAIT and "metrics" not in advice.reason:
            return advice  # not running, not applied, or stabilising: sampling longer says nothing more
        if advice.verdict is not Verdict.WAIT or "metrics" not in advice.reason or rec.clock.monotonic() >= end:
            return advice
        rec.clock.sleep(1.0)


def autoscale_notes(rec: Reconciler, apps: dict[str, str]) -> dict[str, str]:
    """app -> the autoscaler's last line on the app's applied revision (from git notes), for `status`."""
    if not apps:
        return {}
    try:
        notes = rec.source.read_notes()
    except ReconcilerError as e:
        log.warning("cannot read git notes for the autoscale advice: %s", e)
        return {}
    out: dict[str, str] = {}
    for app, revision in apps.items():
        key = f"{CONTEXT_PREFIX}{app}{STATUS_SUFFIX}: "
        for line in (notes.get(revision) or "").splitlines():
            if line.startswith(key):
                out[app] = line[len(key):].removeprefix("success - ")
    return out
