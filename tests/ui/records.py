"""Records as the executor writes them, without Flink: plan a revision with the real planner, then walk
each app's steps through the journal (begin, step started/done, savepoints, finish). For the dashboard's
tests and bench/ui_bench.py, which need many apps' records and no JVM."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action, AppPlan, deterministic_job_id
from reconciler.core.planner import Policy, offline_input, plan
from reconciler.spec.load import LoadResult, load_dir
from tests.gitutil import Repo, spec


def plans(base: LoadResult, head: LoadResult, *, base_revision: str, revision: str, now: datetime) -> list[AppPlan]:
    return list(plan(offline_input(base, head, base_revision=base_revision, revision=revision, now=now,
                                   policy=Policy())).apps)


def execute(journal: Journal, revision: str, ap: AppPlan, *, outcome: Outcome = Outcome.SUCCESS,
            stop_at: int | None = None, message: str = "applied",
            savepoint_dir: str = "file:///tmp/savepoints") -> None:
    """Write what a run of `ap` writes. `stop_at`: leave it in flight with that step started."""
    if ap.action in (Action.NOOP, Action.ERROR, Action.BLOCKED):
        return
    journal.begin(ap.app, revision, ap)
    for i, _step in enumerate(ap.steps):
        journal.step_started(ap.app, i)
        if stop_at is not None and i == stop_at:
            return
        journal.step_done(ap.app, i)
    job = deterministic_job_id(ap.app, revision, 1)
    if ap.action is not Action.CREATE:
        journal.add_savepoint(ap.app, f"{savepoint_dir}/{ap.app}/savepoint-{revision[:6]}", job_id=job,
                              revision=revision)
    journal.finish(ap.app, outcome, message, applied_spec=ap.desired if outcome is Outcome.SUCCESS else None,
                   job_id=job)


@dataclass(frozen=True)
class FailedApp:
    repo: Repo
    state: Path  # the state directory: the journal is state/"journal"
    journal: Journal
    revision: str


def failed_create(tmp_path: Path, message: str, *, app: str = "orders") -> FailedApp:
    """A real Git repository with one app whose create failed with `message` (what `status`, `history` and the
    daemon's pages show of a failure)."""
    r = Repo(tmp_path)
    r.write(f"apps/{app}.yaml", spec(app))
    rev = r.commit(app)
    state = tmp_path / "state"
    clock = SystemClock()
    journal = Journal(state / "journal", clock)
    [ap] = plans(LoadResult(), load_dir(r.work / "apps"), base_revision="0" * 40, revision=rev, now=clock.now())
    execute(journal, rev, ap, outcome=Outcome.FAILURE, message=message)
    return FailedApp(r, state, journal, rev)
