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
  record's write budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
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
from reconciler.service.autoscale import Autoscaler
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
