"""Savepoint upgrades on real Flink through a fault-injecting proxy (tests/faults/proxy.py).

The real executor and the real REST client talk HTTP to the proxy, which forwards to a real JobManager
of the local runtime. The seam is `ProxiedRuntime`, a test double of the runtime's address lookup only:
every REST client it hands out (job control, submit, readiness probes) points at the proxy instead of
the JobManager. Nothing of ours is monkeypatched.

One Flink cluster for the module (started by the fixture), three upgrades of the counter job:

1. transient 5xx and connection resets, before and after Flink acted (a lost answer to the submit);
2. a stall longer than the client's timeout and truncated JSON (also on the stop's answer);
3. a fault that outlasts the step's deadline: the upgrade fails safely and says why.

After each: exactly one job runs; on success it was restored from the savepoint this upgrade took (its
checkpoint stats say so) and was submitted once (the JobManager's log); the journal has nothing in
flight; every injected fault was actually hit, and the retries named it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.apply.executor import AppResult, EventPhase, StepEvent
from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import StartJob, StopWithSavepoint
from reconciler.live.flink import FlinkRestClient
from reconciler.live.local.runtime import LocalRuntime
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.faults.proxy import FaultProxy, Rule
from tests.fixtures.flink import COUNTER_MAIN, teardown_runtime, wait_until
from tests.gitutil import Repo

pytestmark = [pytest.mark.flink, pytest.mark.slow]

APP = "faulty-counter"
JAR_PATH = "jobs/counter/counter.jar"
SPEC_FILE = "apps/counter.yaml"
HEX = "[0-9a-f]+"


def app_yaml(rate: int, *, savepoint_deadline: str = "60s") -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager:
    replicas: 1
    slots: 2
  flinkConfiguration:
    execution.checkpointing.interval: 1 s
  job:
    jarURI: {JAR_PATH}
    entryClass: {COUNTER_MAIN}
    args: ["--output-dir", "out", "--keys", "4", "--rate", "{rate}"]
    parallelism: 1
    upgradeMode: savepoint
  deadlines:
    savepoint: {savepoint_deadline}
    start: 90s
    healthy: 60s
"""


class ProxiedRuntime(LocalRuntime):
    """LocalRuntime whose REST clients reach each JobManager through a FaultProxy (one per address)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.proxies: dict[str, FaultProxy] = {}
        self._proxies_lock = threading.Lock()

    def proxy_of(self, url: str) -> FaultProxy:
        with self._proxies_lock:
            if url not in self.proxies:
                self.proxies[url] = FaultProxy(url).start()
            return self.proxies[url]

    def _client(self, url: str, *, timeout: float = 10.0) -> FlinkRestClient:
        return super()._client(self.proxy_of(url).url, timeout=timeout)

    def close(self) -> None:
        super().close()
        for p in self.proxies.values():
            p.stop()


@dataclass
class Env:
    repo: Repo
    rt: ProxiedRuntime
    rec: Reconciler
    journal: Journal
    events: list[StepEvent] = field(default_factory=list)
    rate: int = 100

    @property
    def rest_url(self) -> str:
        rec = self.rt.read_record(APP)
        assert rec is not None
        return rec.rest_url

    @property
    def proxy(self) -> FaultProxy:
        return self.rt.proxy_of(self.rest_url)

    def direct(self) -> FlinkRestClient:
        """A client straight to the JobManager, to observe without faults."""
        return FlinkRestClient(self.rest_url)

    def live_jobs(self) -> list[tuple[str, str]]:
        with self.direct() as c:
            return [(j.job_id, j.state) for j in c.jobs() if j.state not in ("FINISHED", "CANCELED", "FAILED")]

    def only_running_job(self) -> str:
        def probe() -> str | None:
            live = self.live_jobs()
            return live[0][0] if len(live) == 1 and live[0][1] == "RUNNING" else None

        return wait_until(probe, timeout=30, interval=0.2, what="exactly one RUNNING job")

    def submissions(self, job_id: str) -> int:
        log = self.rt.paths(APP).log / "jobmanager.log"
        return log.read_text(errors="replace").count(f"Submitting Job with JobId={job_id}")

    def commit_upgrade(self, **kw: str) -> tuple[str, str, str]:
        """Commit the next --rate (an upgrade); returns (revision, old job, planned new job)."""
        self.rate += 1
        self.repo.write(SPEC_FILE, app_yaml(self.rate, **kw))
        rev = self.repo.commit(f"rate {self.rate}")
        self.rec.source.fetch()
        plan = self.rec.plan(rev).app(APP)  # no faults yet: see which jobs the upgrade will touch
        stop = next(s for s in plan.steps if isinstance(s, StopWithSavepoint))
        start = next(s for s in plan.steps if isinstance(s, StartJob))
        return rev, stop.job_id, start.job_id

    def apply(self, rev: str) -> AppResult:
        self.events.clear()
        result = self.rec.apply(rev)
        return {**result.resumed, **result.results}[APP]  # a transition left in flight is resumed first

    def retries(self) -> list[str]:
        return [e.message or "" for e in self.events if e.phase is EventPhase.RETRY]


@pytest.fixture(scope="module")
def env(counter_jar: Path, flink_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("faults")
    repo = Repo(root)
    state = root / "state"
    clock = SystemClock()
    rt = ProxiedRuntime(state, clock=clock, flink_home=flink_home)
    journal = Journal(state / "journal.sqlite", clock)
    events: list[StepEvent] = []
    rec = Reconciler(source=GitSource(str(repo.origin), state / "git"), runtime=rt, journal=journal, clock=clock,
                     on_event=events.append)
    e = Env(repo=repo, rt=rt, rec=rec, journal=journal, events=events)
    repo.write(JAR_PATH, counter_jar.read_bytes())
    repo.write(SPEC_FILE, app_yaml(e.rate))
    rev = repo.commit("counter app")
    try:
        rec.source.fetch()
        created = e.apply(rev)
        assert created.outcome is Outcome.SUCCESS, created.message
        e.only_running_job()
        yield e
    finally:
        teardown_runtime(rt)


def assert_upgraded_once(env: Env, res: AppResult, old: str, new: str) -> None:
    assert res.outcome is Outcome.SUCCESS, res.message
    assert res.job_id == new
    assert env.only_running_job() == new and env.live_jobs() == [(new, "RUNNING")]
    assert old != new
    with env.direct() as c:
        stats = c.checkpoints(new)
    assert res.savepoint is not None
    assert (stats.restored_path, stats.restored_is_savepoint) == (res.savepoint, True)
    assert env.submissions(new) == 1, "the new job was submitted more than once"
    assert env.journal.inflight(APP) is None
    record = env.journal.record(APP)
    assert record is not None and any(s.path == res.savepoint and s.job_id == old for s in record.savepoints)


def test_transient_5xx_and_resets_are_retried_and_a_lost_submit_answer_submits_nothing_twice(env: Env) -> None:
    rev, old, new = env.commit_upgrade()
    rules = [
        Rule("POST", f"/jobs/{old}/stop", "status", status=503, times=2),  # Flink never sees these two
        Rule("GET", f"/jobs/{old}/savepoints/{HEX}", "reset"),  # the first status poll
        Rule("POST", f"/jars/{'[^/]+'}/run", "reset_after"),  # Flink starts the job; its answer is lost
        Rule("GET", f"/jobs/{new}/checkpoints", "status", status=500),  # AwaitHealthy's first look
    ]
    env.proxy.clear()
    env.proxy.add(*rules)
    res = env.apply(rev)
    assert env.proxy.spent() == rules, [(r.kind, r.path, r.hits) for r in rules]
    assert_upgraded_once(env, res, old, new)
    assert env.proxy.count("POST", "/jars/[^/]+/run") == 1  # the retry saw the job and did not submit again
    assert env.proxy.count("POST", f"/jobs/{old}/stop") == 1  # one stop reached Flink
    text = "\n".join(env.retries())
    assert "-> 503" in text and "injected by the test proxy" in text
    assert "-> 500" in text
    assert "Flink REST unreachable" in text  # the resets


def test_a_stall_past_the_client_timeout_and_truncated_json_are_retried(env: Env) -> None:
    rev, old, new = env.commit_upgrade()
    rules = [
        Rule("POST", f"/jobs/{old}/stop", "truncate"),  # Flink took the stop; its answer is cut in half
        Rule("GET", f"/jobs/{old}/savepoints/{HEX}", "truncate"),
        Rule("GET", f"/jobs/{new}/checkpoints", "stall", stall_s=11.0),  # the client gives up at 10 s
    ]
    env.proxy.clear()
    env.proxy.add(*rules)
    res = env.apply(rev)
    assert env.proxy.spent() == rules, [(r.kind, r.path, r.hits) for r in rules]
    assert_upgraded_once(env, res, old, new)
    assert env.proxy.count("POST", f"/jobs/{old}/stop") == 1  # the journaled trigger was polled, not re-sent
    text = "\n".join(env.retries())
    assert "Flink answered with non-JSON" in text
    assert "Flink REST timed out" in text


def test_a_fault_outlasting_the_deadline_fails_the_upgrade_safely_and_names_the_fault(env: Env) -> None:
    rev, old, _ = env.commit_upgrade(savepoint_deadline="5s")
    env.proxy.clear()
    env.proxy.add(Rule("POST", f"/jobs/{old}/stop", "status", status=503, times=1_000))
    res = env.apply(rev)
    assert res.outcome is Outcome.FAILURE
    assert res.failed_step is not None and "savepoint" in res.failed_step.lower()
    assert re.search(r"did not succeed within its 5s deadline; last error: Flink server error \(POST \S+/stop -> 503\)",
                     res.message), res.message
    assert "injected by the test proxy" in res.message
    # Safety rule 2: the savepoint failed, so the old job still runs, alone; nothing else was started.
    assert env.only_running_job() == old and env.live_jobs() == [(old, "RUNNING")]
    assert env.proxy.count("POST", f"/jobs/{old}/stop") == 0  # Flink never saw a stop
    assert env.proxy.count("POST", "/jars/[^/]+/run") == 0
    assert env.journal.inflight(APP) is None
    record = env.journal.record(APP)
    assert record is not None and record.last_outcome is Outcome.FAILURE
    assert record.last_attempted_revision == rev


def test_a_stop_that_took_effect_while_its_status_was_unreadable_does_not_leave_the_app_down(env: Env) -> None:
    rev, old, _ = env.commit_upgrade(savepoint_deadline="6s")
    env.proxy.clear()
    env.proxy.add(Rule("GET", f"/jobs/{old}/savepoints/{HEX}", "status", status=503, times=1_000))
    first = env.apply(rev)
    assert first.outcome is Outcome.FAILURE and "-> 503" in first.message
    assert env.proxy.count("POST", f"/jobs/{old}/stop") == 1  # Flink took the stop: the old job ends
    assert "stays in flight" in first.message, first.message  # not "failed": the stop may have taken effect
    env.proxy.clear()  # the REST API is healthy again; the next pass must bring the app back
    second = env.apply(rev)
    assert second.outcome is Outcome.SUCCESS, second.message
    live = env.live_jobs()
    assert len(live) == 1 and live[0][1] == "RUNNING", live
    with env.direct() as c:
        stats = c.checkpoints(live[0][0])
    assert stats.restored_is_savepoint is True
