"""Issue 35: a failure message says what is true now. A stop-with-savepoint that failed leaves the old job running,
unless it died meanwhile: the message says what Flink reports of it, never "keeps running" when nothing does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from tests.apply.fakes import FakeRuntime, make_app
from tests.apply.test_executor import OLD, REV, World, create, job, live_jobs, upgrade


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    clock = FakeClock()
    w = World(clock, FakeRuntime(clock, savepoint_dir=str(tmp_path / "sp"), create_savepoint_dirs=True),
              Journal(tmp_path / "journal", clock))
    yield w
    w.journal.close()


def test_a_failed_stop_says_the_old_job_keeps_running_when_flink_says_so(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.savepoint_failure = "java.io.IOException: /savepoints is not writable"
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.FAILURE and live_jobs(world) == [OLD]
    assert result.message.endswith(f"; the old job keeps running (Flink says job {OLD} is RUNNING)"), result.message


def test_a_failed_stop_whose_old_job_died_meanwhile_says_nothing_runs(world: World) -> None:
    old, new = make_app(), make_app(parallelism=2)
    world.rt.seed_job(old, OLD)
    world.rt.savepoint_failure = "java.io.IOException: /savepoints is not writable"
    flink = world.rt.clusters["orders"].flink
    status = flink.savepoint_status

    def failed_then_the_job_fails(job_id: str, trigger_id: str) -> Any:
        answer = status(job_id, trigger_id)
        if answer.done:  # the savepoint failed, and the job with it (a TaskManager lost at that moment)
            j = job(world, OLD)
            j.state, j.ended_at = "FAILED", world.clock.monotonic()
        return answer

    flink.savepoint_status = failed_then_the_job_fails  # type: ignore[method-assign]
    result = world.ex.run_app(REV, upgrade(old, new))
    assert result.outcome is Outcome.FAILURE and live_jobs(world) == []
    assert "keeps running" not in result.message, result.message
    assert result.message.endswith(f"; the old job {OLD} is FAILED: nothing runs, and the next pass starts the last "
                                   "applied spec again from its newest state"), result.message


def test_a_create_that_fails_says_nothing_of_an_old_job(world: World) -> None:
    world.rt.provision_error = "no room for the cluster"
    result = world.ex.run_app(REV, create(make_app()))
    assert result.outcome is Outcome.FAILURE and "old job" not in result.message, result.message
