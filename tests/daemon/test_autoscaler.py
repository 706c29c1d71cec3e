"""The autoscaler of a real Reconciler (service/autoscale.py) against a JobManager's REST API on loopback.

No JVM: tests/fixtures/flink_metrics.py answers Flink's REST endpoints in Flink's shapes, its counters growing
with the injected clock, so minutes of windows and delays pass in milliseconds. The Reconciler, its journal (a
real file record store), Git (a bare origin) and the REST client are the real ones; the runtime is the local one
with only its address lookup pointed at the loopback server. Records are written as the executor writes them
(tests/ui/records.py: the real planner's plan, walked through the journal).

- a human's edit of job.parallelism wins: no autoscale commit while it is not applied, nor within stabilisation,
  window and scaleDownDelay after it is;
- the REST requests the autoscaler counts (and exports) are the requests that reached the server;
- the sample window survives a restart of the daemon (a new Reconciler on the same records), within the
  record's write budget;
- a push origin refuses (a pre-receive hook protecting main) backs off exponentially, recommends meanwhile, is
  shown once, and commits once origin accepts again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.autoscale import SAVE_EVERY, Verdict
from reconciler.daemon.metrics import Metrics
from reconciler.live.flink import FlinkRestClient
from reconciler.live.local.runtime import LocalRuntime
from reconciler.live.records import FileRecordStore
from reconciler.report.gitnotes import GitNotesSink
from reconciler.report.reporter import Reporter
from reconciler.report.status import CommitStatus
from reconciler.service.autoscale import Autoscaler, source_metrics
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.load import load_files
from tests.fixtures.flink_metrics import FlinkMetricsStub, StubVertex
from tests.gitutil import Repo, git
from tests.ui.records import execute, plans

APP = "auto"
TICK = 5.0  # seconds between the daemon's passes


def app_yaml(parallelism: int) -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager: {{replicas: 1, slots: 4}}
  flinkConfiguration: {{jobmanager.scheduler: adaptive}}
  upgrade: {{inPlaceRescale: true}}
  autoscale:
    mode: commit
    targetUtilisation: 0.8
    max: 4
    stabilisation: 60s
    window: 30s
    scaleDownDelay: 120s
  job:
    jarURI: jobs/counter.jar
    parallelism: {parallelism}
"""


class CountingStore(FileRecordStore):
    """The real file store, counting its writes."""

    writes = 0

    def put(self, app: str, doc: dict[str, Any], *, expected: str | None) -> str:
        self.writes += 1
        return super().put(app, doc, expected=expected)


class StubAddressRuntime(LocalRuntime):
    """The local runtime with its address lookup pointed at the loopback JobManager (no JVM is started)."""

    def __init__(self, state_dir: Path, *, clock: FakeClock, url: str) -> None:
        super().__init__(state_dir, clock=clock)
        self.url = url

    def flink(self, app: str) -> FlinkRestClient:
        return self._client(self.url)


@dataclass
class World:
    repo: Repo
    clock: FakeClock
    stub: FlinkMetricsStub
    root: Path
    store: CountingStore
    applied: str = ""

    def reconciler(self) -> Reconciler:
        """What a (re)started daemon builds: its own journal over the records, its own clone, its own runtime."""
        n = len(list(self.root.glob("git-*")))
        rec = Reconciler(source=GitSource(str(self.repo.origin), self.root / f"git-{n}"),
                         runtime=StubAddressRuntime(self.root / "state", clock=self.clock, url=self.stub.url),
                         journal=Journal(self.root / "state" / "journal", self.clock, store=self.store),
                         clock=self.clock)
        rec.source.fetch()
        return rec

    def push(self, parallelism: int, message: str) -> str:
        if self.applied:
            git(self.repo.work, "pull", "-q", "--rebase", "origin", "main")
        self.repo.write(f"apps/{APP}.yaml", app_yaml(parallelism))
        return self.repo.commit(message)

    def apply(self, rec: Reconciler, revision: str) -> None:
        """What the daemon's pass writes when it applies `revision`, and the job then running at its parallelism."""
        def specs(rev: str) -> Any:
            return load_files({f"apps/{APP}.yaml": git(self.repo.origin, "show", f"{rev}:apps/{APP}.yaml").encode()}
                              if rev else {})
        (ap,) = plans(specs(self.applied), specs(revision), base_revision=self.applied or "0" * 40,
                      revision=revision, now=self.clock.now())
        execute(rec.journal, revision, ap)
        self.applied = revision
        record = rec.journal.record(APP)
        assert record is not None and record.job_id
        self.stub.rescale(record.job_id, int(ap.desired["spec"]["job"]["parallelism"]))  # type: ignore[index]

    def tick(self, scaler: Autoscaler, rec: Reconciler, seconds: float = TICK) -> Any:
        """One pass's autoscaling at origin's tip, `seconds` after the last."""
        self.clock.advance(seconds)
        rec.source.fetch()
        scaler.tick(rec.source.head())
        return scaler.advice[APP]

    def autoscale_commits(self) -> list[str]:
        return [s for s in git(self.repo.origin, "log", "--format=%s", "main").splitlines()
                if s.startswith(f"autoscale({APP})")]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    clock = FakeClock()
    # source -> count: the count vertex takes 100 records/s; 1000 ms/s busy means overloaded at parallelism 1
    stub = FlinkMetricsStub(clock, "0" * 32, [
        StubVertex("a" * 32, "Source: generator", 1, rate=100.0, busy_ms=20.0),
        StubVertex("b" * 32, "count-per-key", 1, rate=100.0, busy_ms=1000.0, inputs=("a" * 32,)),
    ])
    (tmp_path / "repo").mkdir()
    repo = Repo(tmp_path / "repo")
    w = World(repo, clock, stub, tmp_path, CountingStore(tmp_path / "state" / "records"))
    try:
        yield w
    finally:
        stub.close()


def test_a_humans_parallelism_wins_within_the_autoscalers_windows(world: World) -> None:
    first = world.push(1, "the app at parallelism 1")
    rec = world.reconciler()
    world.apply(rec, first)
    # light load: 40 records/s, each subtask of the count vertex 40% busy: 50 records/s per subtask when busy;
    # at 1 that is a keep, at 2 one subtask would do (40 / (50 x 0.8))
    world.stub.load(**{"a" * 32: (40.0, 10.0), "b" * 32: (40.0, 400.0)})
    scaler = Autoscaler(rec)

    human = world.push(2, "a human sets parallelism 2")
    for _ in range(3):  # pushed, not applied yet: no decision at all
        advice = world.tick(scaler, rec)
        assert advice.verdict is Verdict.WAIT and "not applied yet" in advice.reason, advice.reason
    applied_at = world.clock.now()
    world.apply(rec, human)  # now it runs at 2, where one subtask would do
    reasons = []
    while not world.autoscale_commits():
        advice = world.tick(scaler, rec)
        reasons.append((world.clock.now() - applied_at, advice.reason))
        assert world.clock.now() - applied_at < timedelta(minutes=5), reasons[-1]
    committed = world.clock.now() - applied_at
    # never within stabilisation (60 s) + window (30 s) + scaleDownDelay (120 s) of the human's change
    assert committed >= timedelta(seconds=210), reasons
    assert all("stabilising after the change applied at" in r for t, r in reasons if t < timedelta(seconds=60))
    assert world.autoscale_commits() == [f"autoscale({APP}): parallelism 2 -> 1"]


def test_the_requests_it_counts_are_the_requests_flink_answered(world: World) -> None:
    first = world.push(1, "the app at parallelism 1")
    rec = world.reconciler()
    world.apply(rec, first)
    metrics = Metrics()
    scaler = Autoscaler(rec, metrics=metrics)
    world.stub.requests.clear()
    ticks = 12  # a minute at one pass every 5 s
    for _ in range(ticks):
        world.tick(scaler, rec)
    seen = dict(world.stub.requests)
    assert scaler.requests[APP] == world.stub.total == sum(seen.values())
    assert metrics.registry.get_sample_value("flink_reconciler_autoscale_rest_requests_total",
                                             {"app": APP}) == world.stub.total
    job = world.stub.job_id
    # per pass: the job (overview), its graph, one aggregated metrics request per vertex; a source's metric names
    # once per job (no per-subtask requests)
    assert seen == {"GET /jobs/overview": ticks, f"GET /jobs/{job}": ticks,
                    f"GET /jobs/{job}/vertices/{'a' * 32}/subtasks/metrics": ticks + 1,
                    f"GET /jobs/{job}/vertices/{'b' * 32}/subtasks/metrics": ticks}, seen


def test_passes_more_often_than_a_tenth_of_the_window_do_not_ask_flink_more(world: World) -> None:
    """One pass a second (a short poll interval, webhooks): about ten samples a 30 s window, decided on each pass."""
    first = world.push(1, "the app at parallelism 1")
    rec = world.reconciler()
    world.apply(rec, first)
    scaler = Autoscaler(rec)
    world.stub.requests.clear()
    verdicts = [world.tick(scaler, rec, seconds=1.0).verdict for _ in range(100)]
    # it still decides on time: stabilisation (60 s), a full window (30 s), then 1 -> 2 committed
    assert Verdict.SCALE_UP in verdicts[88:96] and world.autoscale_commits(), verdicts
    samples = world.stub.requests["GET /jobs/overview"]
    assert 28 <= samples <= 34, world.stub.requests  # one every 3 s (not every second) until the commit
    assert scaler.requests[APP] == world.stub.total <= samples * 4 + 1


def test_the_window_survives_a_restart_of_the_daemon_within_the_write_budget(world: World) -> None:
    first = world.push(2, "the app at parallelism 2")
    rec = world.reconciler()
    world.apply(rec, first)
    world.stub.load(**{"a" * 32: (40.0, 10.0), "b" * 32: (40.0, 200.0)})  # 40 records/s at 2, 20% busy: 1 would do
    scaler = Autoscaler(rec)
    writes = world.store.writes
    advice = None
    for _ in range(int(150 / TICK)):  # stabilisation (60 s), window (30 s), and a minute into the scale-down delay
        advice = world.tick(scaler, rec)
    assert advice is not None and advice.verdict is Verdict.WAIT and advice.scale_down is not None, advice
    since = advice.scale_down.since
    assert world.clock.now() - since >= timedelta(seconds=55)
    assert world.store.writes - writes <= 150 / SAVE_EVERY.total_seconds() + 1, "at most one write a minute"

    # the daemon restarts (a new process: new clone, new journal, nothing in memory); its first pass
    world.clock.advance(20)
    again = world.reconciler()
    restarted = Autoscaler(again)
    first = world.tick(restarted, again)
    # it goes on: a full window at once and the scale-down called for since before the restart
    assert first.verdict is Verdict.WAIT and first.scale_down is not None, first.reason
    assert first.scale_down.since == since and "waiting out scaleDownDelay" in first.reason
    # a daemon that forgot (what a one-off look does) starts over: it collects a window first
    fresh = Autoscaler(again, stored=False)
    assert "collecting metrics" in world.tick(fresh, again).reason
    while not world.autoscale_commits():
        world.tick(restarted, again)
    assert world.clock.now() - since < timedelta(seconds=120 + 2 * TICK), "the delay counted from before the restart"
    assert world.autoscale_commits() == [f"autoscale({APP}): parallelism 2 -> 1"]


PROTECT = """\
#!/bin/sh
# main is protected: every update of it is refused (and noted, so the test counts the pushes that reached origin)
while read old new ref; do
  if [ "$ref" = refs/heads/main ]; then
    date +%s >> "$GIT_DIR/refused.log"
    echo "refs/heads/main is protected: open a pull request" >&2
    exit 1
  fi
done
"""


class AutoscaleNotes(GitNotesSink):
    """The real git-notes sink, keeping the autoscale statuses it posted."""

    def __init__(self, source: GitSource) -> None:
        super().__init__(source)
        self.autoscale: list[CommitStatus] = []

    def post_batch(self, statuses: Sequence[CommitStatus]) -> None:
        self.autoscale += [s for s in statuses if s.context.endswith("/autoscale")]
        super().post_batch(statuses)


def test_a_refused_push_backs_off_recommends_meanwhile_and_commits_once_origin_accepts(world: World) -> None:
    """Origin's pre-receive hook refuses every push to main (a protected branch). The autoscaler tries at its
    decision, then after 1, 2, 4 ... minutes, not every pass; says so once as the app's autoscale status and in
    flink_reconciler_autoscale_push_refused; keeps recommending; and commits at its next try once origin accepts."""
    first = world.push(1, "the app at parallelism 1")
    rec = world.reconciler()
    world.apply(rec, first)
    notes = AutoscaleNotes(rec.source)
    rec.reporter = Reporter([notes], world.clock)
    metrics = Metrics()
    scaler = Autoscaler(rec, metrics=metrics)
    hook = world.repo.origin / "hooks" / "pre-receive"
    hook.write_text(PROTECT)
    hook.chmod(0o755)
    refused_log = world.repo.origin / "refused.log"

    def pushes() -> int:
        return len(refused_log.read_text().splitlines()) if refused_log.exists() else 0

    def refused_gauge() -> float | None:
        return metrics.registry.get_sample_value("flink_reconciler_autoscale_push_refused", {"app": APP})

    tries: list[float] = []  # seconds since the first try
    t0 = None
    for _ in range(int(18 * 60 / 15)):  # 18 minutes of passes every 15 s
        advice = world.tick(scaler, rec, seconds=15)
        if pushes() > len(tries):
            t0 = t0 or world.clock.monotonic()
            tries.append(world.clock.monotonic() - t0)
            assert refused_gauge() == 1.0
        if tries:
            assert advice.verdict is Verdict.SCALE_UP, advice.reason  # still recommended meanwhile
    # at the decision, then 1, 2, 4, 8 minutes apart (each within one pass): 5 tries in 18 minutes, not 66
    gaps = [b - a for a, b in pairwise(tries)]
    assert len(tries) == 5 and [round(g / 60) for g in gaps] == [1, 2, 4, 8], tries
    assert world.autoscale_commits() == [] and pushes() == len(tries)
    assert rec.reporter.flush(10)
    posted = [s.description for s in notes.autoscale]
    refusals = [d for d in posted if "was refused" in d]
    assert len(refusals) == 1, posted  # shown once, not once a try
    assert "recommending only: the commit of parallelism 1 -> 2 to main was refused" in refusals[0]
    assert "refs/heads/main is protected" in refusals[0]
    line = next(x for x in git(world.repo.origin, "notes", "--ref", "flink-reconciler", "show", first).splitlines()
                if x.startswith(f"flink-reconciler/{APP}/autoscale: "))
    assert line.startswith(f"flink-reconciler/{APP}/autoscale: error - autoscale: recommending only"), line

    hook.unlink()  # origin accepts pushes again: the next try (at most 16 minutes on) commits
    for _ in range(int(17 * 60 / 15)):
        world.tick(scaler, rec, seconds=15)
        if world.autoscale_commits():
            break
    assert world.autoscale_commits() == [f"autoscale({APP}): parallelism 1 -> 2"]
    assert refused_gauge() == 0.0
    rec.reporter.close(timeout=5)


@pytest.mark.parametrize(("names", "found"), [
    # Flink 2.3's ids of the counter job's source vertex (a chain would list its other operators' too)
    (["numRecordsOut", "Source__generator.numRecordsOut", "Source__generator.numRecordsIn", "busyTimeMsPerSecond"],
     (None, "Source__generator.numRecordsOut")),
    # a connector reporting lag: the read counter of that same operator, not a chained map's
    (["Source__orders.pendingRecords", "Map.numRecordsOut", "Source__orders.numRecordsOut"],
     ("Source__orders.pendingRecords", "Source__orders.numRecordsOut")),
    (["numRecordsOut", "numRecordsIn"], (None, None)),  # none: the vertex's own numRecordsOut is used
])
def test_a_sources_lag_and_read_counters_are_found_by_name(names: list[str], found: tuple[str | None, ...]) -> None:
    assert source_metrics(names) == found


def test_the_source_is_measured_in_the_records_it_read(world: World) -> None:
    """A chained filter after the source drops half: the source reads 200/s and its vertex emits 100/s."""
    world.stub.vertices[0].read_factor = 2.0
    first = world.push(1, "the app at parallelism 1")
    rec = world.reconciler()
    world.apply(rec, first)
    scaler = Autoscaler(rec)
    advice = world.tick(scaler, rec)
    while not advice.vertices:  # stabilisation and a window: the first decision
        advice = world.tick(scaler, rec)
    src = next(v for v in advice.vertices if v.name == "Source: generator")
    assert (src.records_in, src.records_out) == (pytest.approx(200.0), pytest.approx(100.0)), src
    assert src.target_rate == pytest.approx(200.0) and not src.excluded  # in source records
