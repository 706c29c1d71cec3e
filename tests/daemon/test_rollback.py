"""`rollback APP --to REV` through the real pass: real Git (a bare origin, commits written and pushed by
`--write-commit`), the real journal and executor, and the in-memory Flink double of tests/apply/fakes.py
(savepoints land as real directories under tmp_path, so "gone" is a real missing directory).

The story of every test: create at A, upgrade at B and C (each upgrade a stop-with-savepoint), then go
back to A."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action, RestoreKind, StartJob, StopWithSavepoint
from reconciler.core.rollback import Refusal
from reconciler.errors import PermanentStepError
from reconciler.service import rollback
from reconciler.service.reconcile import Reconciler
from reconciler.service.rollback import Prepared
from reconciler.source.git import GitSource
from tests.apply.fakes import FakeRuntime
from tests.gitutil import Repo, git

APP = "orders"


def spec_yaml(parallelism: int, *, comment: str = "") -> str:
    return f"""\
# the orders pipeline{comment}
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager:
    slots: 4
  flinkConfiguration:
    execution.checkpointing.interval: 1s
  job:
    jarURI: jobs/counter.jar
    parallelism: {parallelism}  # raised with the traffic
---
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: other
spec:
  job:
    jarURI: jobs/counter.jar
    parallelism: {parallelism}
    state: suspended
"""


@dataclass
class Env:
    repo: Repo
    rec: Reconciler
    runtime: FakeRuntime
    revs: dict[str, str]

    def commit(self, name: str, parallelism: int) -> str:
        self.repo.write("apps/orders.yaml", spec_yaml(parallelism))
        self.revs[name] = self.repo.commit(f"orders at parallelism {parallelism}")
        return self.revs[name]

    def apply(self, rev: str | None = None) -> None:
        self.rec.source.fetch()
        result = self.rec.apply(rev or self.rec.source.head())
        assert result.ok, {n: r.message for n, r in result.results.items()}

    def prepare(self, to: str) -> Prepared:
        prepared = rollback.prepare(self.rec, APP, to)
        assert isinstance(prepared, Prepared), prepared
        return prepared

    def job_of(self, rev: str) -> str:
        """The job the execution at `rev` left running (from the lineage)."""
        return next(e.job_id for e in reversed(self.rec.journal.lineage(APP)) if e.revision == rev and e.job_id)

    def restored_from(self, job_id: str) -> str | None:
        return self.runtime.clusters[APP].flink.jobs_by_id[job_id].restored_from


@pytest.fixture
def env(tmp_path: Path) -> Env:
    repo = Repo(tmp_path)
    repo.write("jobs/counter.jar", b"not really a jar")
    clock = FakeClock()
    runtime = FakeRuntime(clock, savepoint_dir=str(tmp_path / "savepoints"), create_savepoint_dirs=True)
    state = tmp_path / "state"
    rec = Reconciler(source=GitSource(str(repo.origin), state / "git"), runtime=runtime,
                     journal=Journal(state / "journal", clock), clock=clock,
                     runtime_name="local")  # its savepoints are directories on this host, as the local runtime's
    e = Env(repo, rec, runtime, {})
    for name, parallelism in (("A", 1), ("B", 2), ("C", 3)):
        e.commit(name, parallelism)
        e.apply()
    return e


def test_apply_runs_the_old_spec_from_the_savepoint_taken_when_leaving_it(env: Env) -> None:
    a, b, c = env.revs["A"], env.revs["B"], env.revs["C"]
    left_a = [s for s in env.rec.journal.record(APP).savepoints if s.job_id == env.job_of(a)]  # type: ignore[union-attr]
    assert [s.revision for s in left_a] == [b]  # recorded under the upgrade that took it
    job_c = env.job_of(c)
    prepared = env.prepare(a[:7])
    ap = prepared.plan.app(APP)
    assert prepared.revision == a and ap.action is Action.UPGRADE
    assert isinstance(ap.steps[0], StopWithSavepoint) and ap.steps[0].job_id == job_c
    start = next(s for s in ap.steps if isinstance(s, StartJob))
    assert start.restore.kind is RestoreKind.PATH and start.restore.path == left_a[0].path
    assert ap.risks and ap.risks[0].startswith("DISCARDS CURRENT STATE") and c[:12] in ap.risks[0]
    assert "the branch tip" in ap.reason  # --apply alone leaves Git at C: the plan says so

    assert ap.purpose == "rollback"
    result = rollback.execute(env.rec, prepared)
    assert result.outcome is Outcome.SUCCESS, result.message
    assert result.message == f"rollback applied at {a[:12]}; job {start.job_id} running"
    actions = [t.action for t in env.rec.journal.history(APP) if t.revision == a]
    assert actions[-3:] == ["rollback", "savepoint", "finish"]
    assert env.runtime.running_jobs(APP) == [start.job_id]
    assert env.restored_from(start.job_id) == left_a[0].path
    record = env.rec.journal.record(APP)
    assert record is not None and record.last_applied_revision == a and record.job_id == start.job_id
    assert record.last_applied_spec is not None and record.last_applied_spec["spec"]["job"]["parallelism"] == 1
    last = env.rec.journal.lineage(APP)[-1]
    assert (last.revision, last.action, last.restored_from, last.job_id) == (
        a, "rollback", left_a[0].path, start.job_id)
    # C's state is not lost: step 1 stopped its job with a savepoint, recorded (under A, this execution).
    assert len(last.savepoints) == 1 and Path(last.savepoints[0].removeprefix("file:")).is_dir()
    # Going back to C later restores exactly that.
    back = env.prepare(c)
    assert next(s for s in back.plan.app(APP).steps if isinstance(s, StartJob)).restore.path == last.savepoints[0]


def test_write_commit_puts_the_old_spec_on_the_branch_and_the_normal_pass_applies_it(env: Env) -> None:
    a = env.revs["A"]
    prepared = env.prepare(a)
    point = prepared.point.savepoint.path
    sha = rollback.write_commit(env.rec, prepared)
    git(env.repo.work, "pull", "-q", "--ff-only", "origin", "main")
    assert git(env.repo.work, "rev-parse", "HEAD") == sha
    assert git(env.repo.work, "rev-parse", "HEAD~1") == env.revs["C"]
    assert git(env.repo.work, "diff", "--name-only", "HEAD~1", "HEAD") == "apps/orders.yaml"
    text = (env.repo.work / "apps/orders.yaml").read_text()
    # A's document, comments kept, with the restore point and a new nonce; the other app's document untouched.
    assert text == spec_yaml(1).replace("parallelism: 1  # raised with the traffic",
                                        f"parallelism: 1  # raised with the traffic\n    initialSavepointPath: {point}"
                                        "\n    savepointRedeployNonce: 1").replace(
        "parallelism: 1\n    state: suspended", "parallelism: 3\n    state: suspended")
    assert "rollback(orders)" in git(env.repo.work, "log", "-1", "--format=%s")

    env.rec.sync(full=False, reason="poll")  # the daemon's next poll: an incremental pass over the changed file
    record = env.rec.journal.record(APP)
    assert record is not None and record.last_applied_revision == sha and record.last_outcome is Outcome.SUCCESS
    (began,) = [t for t in env.rec.journal.history(APP) if t.revision == sha and t.outcome is Outcome.PENDING]
    assert (began.action, began.message) == ("upgrade", f"savepointRedeployNonce changed: redeploy from {point}")
    job = env.job_of(sha)
    assert env.runtime.running_jobs(APP) == [job] and env.restored_from(job) == point
    # Applied again at the same commit: nothing to do (the nonce is the applied one now).
    assert env.rec.plan(sha).app(APP).action is Action.NOOP


def test_a_branch_that_moved_is_never_overwritten(env: Env) -> None:
    prepared = env.prepare(env.revs["A"])
    env.commit("D", 4)
    with pytest.raises(Exception, match="moved while the commit was written"):
        rollback.write_commit(env.rec, prepared)
    env.rec.source.fetch()
    assert env.rec.source.head() == env.revs["D"]


def test_refused_when_the_revision_never_ran_or_its_savepoint_is_gone(env: Env) -> None:
    env.repo.write("README.md", "docs only\n")
    docs = env.repo.commit("docs")
    env.apply()
    refused = rollback.prepare(env.rec, APP, docs)
    assert isinstance(refused, Refusal) and "never ran this app" in refused.reason
    refused = rollback.prepare(env.rec, APP, env.revs["C"])
    assert isinstance(refused, Refusal) and "is what the app runs now" in refused.reason
    point = env.prepare(env.revs["A"]).point.savepoint.path
    Path(point.removeprefix("file:")).rmdir()
    refused = rollback.prepare(env.rec, APP, env.revs["A"])
    assert isinstance(refused, Refusal)
    assert refused.reason == (f"the state to restore revision {env.revs['A'][:12]} from is gone: {point} does not "
                              "exist any more (disposed of by retention, or deleted by hand)")
    with pytest.raises(Exception, match="unknown revision"):
        rollback.prepare(env.rec, APP, "no-such-rev")


def test_a_manual_savepoint_is_recorded_and_becomes_the_revisions_rollback_point(env: Env) -> None:
    c = env.revs["C"]
    taken = rollback.take_savepoint(env.rec, APP, poll_s=0.1)
    assert taken.revision == c and taken.record.kind == "manual" and taken.record.job_id == env.job_of(c)
    assert Path(taken.record.path.removeprefix("file:")).is_dir()
    assert env.runtime.running_jobs(APP) == [env.job_of(c)]  # the job keeps running
    assert env.rec.journal.history(APP)[-1].action == "manual"
    env.commit("D", 4)
    env.apply()
    # C was left with a stop-with-savepoint, newer than the manual one: that is C's rollback point.
    point = env.prepare(c).point
    assert point.savepoint.kind == "savepoint" and [s.path for s in point.older] == [taken.record.path]


def test_no_savepoint_without_a_running_job(env: Env) -> None:
    with pytest.raises(PermanentStepError, match="has no running job"):
        rollback.take_savepoint(env.rec, "other")
