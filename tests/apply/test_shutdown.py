"""Issue 35: a shutdown wakes every waiting step at once, through the injected clock, and the steps stay resumable:
in flight in the journal, neither failed nor rolled back. No test sleeps: the clock is a FakeClock, and a shutdown
is the clock's `stop()` coming while steps wait (a savepoint poll, a retry's backoff)."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path

import pytest

from reconciler.apply.executor import Executor
from reconciler.apply.journal import Journal, StepPhase
from reconciler.apply.retry import Backoff
from reconciler.clock import FakeClock, SystemClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Plan
from reconciler.errors import ShutdownRequested, TransientStepError
from tests.apply.fakes import FakeRuntime, Fault, make_app
from tests.apply.test_executor import JAR, NEW, OLD, REV, upgrade


class ProcessClock:
    """One process's view of the shared fake time: its own stop, as a real process has its own SystemClock. Stops
    itself at its `stop_at`-th sleep (the shutdown arriving while steps wait) and counts the sleeps that came after."""

    def __init__(self, base: FakeClock, *, stop_at: int | None = None) -> None:
        self.base, self.stop_at = base, stop_at
        self.sleeps = self.after_stop = 0
        self._stopped = False
        self._lock = threading.Lock()

    def now(self) -> datetime:
        return self.base.now()

    def monotonic(self) -> float:
        return self.base.monotonic()

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps += 1
            if self.stop_at is not None and self.sleeps >= self.stop_at:
                self._stopped = True
            if self._stopped:
                self.after_stop += 1
                raise ShutdownRequested("shutting down")
        self.base.sleep(seconds)

    def stop(self) -> None:
        self._stopped = True


def _world(tmp_path: Path, *, savepoint_s: float) -> tuple[FakeClock, FakeRuntime, Journal, Plan]:
    clock = FakeClock()
    rt = FakeRuntime(clock, savepoint_dir=str(tmp_path / "sp"), create_savepoint_dirs=True, savepoint_s=savepoint_s)
    journal = Journal(tmp_path / "journal", clock)
    apps = []
    for name in ("orders", "billing"):
        old = make_app(name=name)
        rt.seed_job(old, OLD)
        apps.append(upgrade(old, make_app(name=name, parallelism=2)))
    clock.advance(10)  # the old jobs run and checkpoint
    return clock, rt, journal, Plan(revision=REV, mode="live", live_fingerprint="x", apps=tuple(apps))


def _executor(rt: FakeRuntime, journal: Journal, clock: ProcessClock) -> Executor:
    return Executor(rt, journal, clock, resolve_jar=lambda _: JAR, poll_interval=0.2, backoff=Backoff(0.5, 2.0, 4.0))


@pytest.mark.parametrize("waiting", ["poll", "retry"])
def test_a_shutdown_wakes_every_waiting_step_and_leaves_them_in_flight_to_resume(tmp_path: Path, waiting: str) -> None:
    """Two upgrades wait in their stop-with-savepoint: for a slow savepoint (a poll), or through transient errors (a
    retry's backoff). The shutdown ends both waits at once; nothing is failed, rolled back or started; a new process
    resumes both from the journal, polling the same savepoint triggers (never a second stop)."""
    clock, rt, journal, the_plan = _world(tmp_path, savepoint_s=30.0 if waiting == "poll" else 0.5)
    if waiting == "retry":
        rt.faults = [Fault("savepoint_status", TransientStepError("Flink REST unreachable"), nth=n)
                     for n in range(1, 40)]
    first = ProcessClock(clock, stop_at=6)
    with pytest.raises(ShutdownRequested):
        _executor(rt, journal, first).run(the_plan)
    assert first.after_stop <= 2, "each waiting step woke once and stopped: no step waited on"
    for ap in the_plan.apps:
        inf = journal.inflight(ap.app)
        assert inf is not None and inf.step_index == 0 and inf.phase is StepPhase.STARTED, ap.app
        assert inf.trigger_id is not None, "the savepoint trigger stays journaled: the resume polls it"
        assert journal.history(ap.app)[-1].action == "parked", "said in its history"
        record = journal.record(ap.app)
        assert record is not None and record.last_outcome is Outcome.PENDING, record
        assert rt.running_jobs(ap.app) == [OLD] or waiting == "retry", "the old job was never touched again"
    assert not [j for j in rt.submits if j == NEW], "nothing was started"
    triggers = len(rt.stop_triggers)

    rt.faults = []
    resumed = _executor(rt, journal, ProcessClock(clock)).resume_all()
    assert {a: r.outcome for a, r in resumed.items()} == {"orders": Outcome.SUCCESS, "billing": Outcome.SUCCESS}, [
        r.message for r in resumed.values()]
    assert len(rt.stop_triggers) == triggers == 2, "polled, not triggered again"
    for ap in the_plan.apps:
        assert rt.running_jobs(ap.app) == [NEW] and journal.inflight(ap.app) is None


def test_the_system_clock_wakes_every_sleeper_at_once_and_later_sleeps_raise() -> None:
    clock = SystemClock()
    woke: list[str] = []
    started = threading.Barrier(4)

    def sleeper(name: str) -> None:
        started.wait()
        try:
            clock.sleep(3600)
        except ShutdownRequested:
            woke.append(name)

    threads = [threading.Thread(target=sleeper, args=(f"step-{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    started.wait()
    clock.stop()
    for t in threads:
        t.join(timeout=5)
    assert sorted(woke) == ["step-0", "step-1", "step-2"] and not any(t.is_alive() for t in threads)
    with pytest.raises(ShutdownRequested):
        clock.sleep(0)


def test_a_fake_clock_stopped_raises_instead_of_advancing() -> None:
    clock = FakeClock()
    clock.sleep(5)
    clock.stop()
    with pytest.raises(ShutdownRequested):
        clock.sleep(1)
    assert clock.monotonic() == 5
