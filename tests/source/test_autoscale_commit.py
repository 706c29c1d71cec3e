"""The autoscaler's Git writes (service/autoscale.py): only job.parallelism changes, fast-forward only on the
tracked branch, a proposal branch is the autoscaler's own. Real repositories, no Flink."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.autoscale import Advice, Verdict, VertexAdvice
from reconciler.errors import PermanentStepError, SourceError
from reconciler.service.autoscale import commit_message, session_files, slot_inputs, write_commit
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from tests.gitutil import Repo, git

SPEC = """\
# the counter, autoscaled
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: auto
spec:
  taskManager: {replicas: 1, slots: 4}
  autoscale:
    mode: commit   # the daemon commits
  job:
    jarURI: jobs/counter.jar
    parallelism: 1   # the autoscaler's field
---
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: other
spec:
  job:
    jarURI: jobs/counter.jar
    parallelism: 1
"""
T = datetime(2026, 1, 1, 12, tzinfo=UTC)
ADVICE = Advice(app="auto", verdict=Verdict.SCALE_UP, current=1, proposed=2, reason="scale up 1 -> 2: busy",
                vertices=(VertexAdvice(vertex_id="v", name="count", current=1, proposed=2, busy_pct=100.0,
                                       backpressured_pct=0.0, records_in=87.0, records_out=0.0, true_rate=87.0,
                                       target_rate=87.0, lag=None),),
                samples=9, window_start=T, window_end=T + timedelta(seconds=8), wanted=2)


@pytest.fixture
def world(tmp_path: Path) -> tuple[Repo, Reconciler]:
    repo = Repo(tmp_path)
    repo.write("apps/auto.yaml", SPEC)
    repo.commit("two apps")
    rec = Reconciler(source=GitSource(str(repo.origin), tmp_path / "git"), runtime=None,
                     journal=Journal(tmp_path / "state" / "journal", SystemClock()), clock=SystemClock())
    rec.source.fetch()
    return repo, rec


def test_the_commit_changes_only_the_parallelism_of_that_app_and_carries_the_evidence(
        world: tuple[Repo, Reconciler]) -> None:
    repo, rec = world
    head = rec.source.head()
    la = rec.load(head).apps["auto"]
    sha = write_commit(rec, head, la, ADVICE, branch="main")
    assert git(repo.origin, "rev-parse", "main") == sha
    assert git(repo.origin, "rev-parse", f"{sha}^") == head  # fast-forward on top of what was read
    diff = git(repo.origin, "diff", head, sha)
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-    parallelism: 1   # the autoscaler's field",
                       "+    parallelism: 2   # the autoscaler's field"]
    message = git(repo.origin, "log", "-1", "--format=%B", sha)
    assert message.startswith("autoscale(auto): parallelism 1 -> 2\n\nscale up 1 -> 2: busy\n")
    assert "count   1    2         100%" in message and "Autoscaled-by: flink-reconciler" in message
    assert message.strip() == commit_message("auto", ADVICE, 0.7).strip()


def test_a_branch_that_moved_is_never_overwritten(world: tuple[Repo, Reconciler]) -> None:
    repo, rec = world
    head = rec.source.head()
    la = rec.load(head).apps["auto"]
    repo.write("README.md", "a human commit meanwhile\n")
    moved = repo.commit("meanwhile")
    with pytest.raises(SourceError, match="moved while the commit was written"):
        write_commit(rec, head, la, ADVICE, branch="main")
    assert git(repo.origin, "rev-parse", "main") == moved


def test_a_proposal_goes_to_its_own_branch_and_a_newer_one_replaces_it(world: tuple[Repo, Reconciler]) -> None:
    repo, rec = world
    head = rec.source.head()
    la = rec.load(head).apps["auto"]
    first = write_commit(rec, head, la, ADVICE, branch="autoscale/auto")
    assert git(repo.origin, "rev-parse", "main") == head  # main untouched
    assert git(repo.origin, "rev-parse", "autoscale/auto") == first
    three = Advice(**{**ADVICE.__dict__, "proposed": 3, "reason": "scale up 1 -> 3"})
    second = write_commit(rec, head, la, three, branch="autoscale/auto")
    assert git(repo.origin, "rev-parse", "autoscale/auto") == second != first
    with pytest.raises(SourceError, match="cannot be the tracked branch"):
        rec.source.push_proposal(second, "main")


CLUSTER = (Path(__file__).parents[2] / "examples-repo" / "sessions" / "shared.yaml").read_text().replace(
    "replicas: 1", "replicas: 2")  # 4 slots
TALLIES = (Path(__file__).parents[2] / "examples-repo" / "sessions" / "tallies.yaml").read_text()
METERING = (Path(__file__).parents[2] / "examples-repo" / "sessions" / "metering.yaml").read_text()
SESSION_APP = TALLIES.replace("  job:\n", "  autoscale: {mode: commit}\n  job:\n")


def test_a_session_app_commits_with_its_cluster_in_another_file(tmp_path: Path) -> None:
    """As in examples-repo: the cluster in sessions/shared.yaml, each app in a file of its own. The rewritten file
    is checked with its cluster's and the other app's files; the session's slots are those the other app leaves."""
    repo = Repo(tmp_path)
    repo.write("sessions/shared.yaml", CLUSTER)
    repo.write("sessions/tallies.yaml", SESSION_APP)
    repo.write("sessions/metering.yaml", METERING)
    head = repo.commit("a session cluster and two apps, in three files")
    rec = Reconciler(source=GitSource(str(repo.origin), tmp_path / "git"), runtime=None,
                     journal=Journal(tmp_path / "state" / "journal", SystemClock()), clock=SystemClock())
    rec.source.fetch()
    loaded = rec.load(head)
    la = loaded.apps["tallies"]
    assert slot_inputs(la, loaded) == {
        "slots": 3, "slots_note": "the task slots session cluster 'shared' leaves this app (4 - 1 of 1 other app)"}
    files = session_files(la, loaded)
    assert files == ["sessions/metering.yaml", "sessions/shared.yaml"]
    # beyond the slots the other app leaves: refused by the check, nothing committed
    four = Advice(**{**ADVICE.__dict__, "app": "tallies", "proposed": 4})
    with pytest.raises(PermanentStepError, match=r"would not load: .*its running jobs need 5"):
        write_commit(rec, head, la, four, branch="main", session_files=files)
    assert git(repo.origin, "rev-parse", "main") == head
    one = Advice(**{**ADVICE.__dict__, "app": "tallies", "task_managers": 5})  # a session app never sets them
    sha = write_commit(rec, head, la, one, branch="main", session_files=files)
    assert git(repo.origin, "diff", "--name-only", head, sha) == "sessions/tallies.yaml"
    after = rec.load(sha)
    assert after.apps["tallies"].app.spec.job.parallelism == 2 and not after.errors
    assert git(repo.origin, "log", "-1", "--format=%s", sha) == "autoscale(tallies): parallelism 1 -> 2"


def test_more_task_managers_go_in_the_same_commit(world: tuple[Repo, Reconciler]) -> None:
    repo, rec = world
    head = rec.source.head()
    la = rec.load(head).apps["auto"]
    five = Advice(**{**ADVICE.__dict__, "proposed": 6, "task_managers": 2, "reason": "scale up 1 -> 6"})
    sha = write_commit(rec, head, la, five, branch="main")
    changed = [line for line in git(repo.origin, "diff", head, sha).splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-  taskManager: {replicas: 1, slots: 4}", "+  taskManager: {replicas: 2, slots: 4}",
                       "-    parallelism: 1   # the autoscaler's field",
                       "+    parallelism: 6   # the autoscaler's field"]
    assert git(repo.origin, "log", "-1", "--format=%s", sha) == ("autoscale(auto): parallelism 1 -> 6, "
                                                                "taskManager.replicas 1 -> 2")
    assert slot_inputs(rec.load(sha).apps["auto"], None) == {"slots": 8}  # no maxTaskManagers: the slots cap


def test_with_max_task_managers_the_app_may_raise_them(world: tuple[Repo, Reconciler]) -> None:
    repo, rec = world
    repo.write("apps/auto.yaml", SPEC.replace("    mode: commit   # the daemon commits",
                                              "    mode: commit\n    maxTaskManagers: 3"))
    head = repo.commit("up to 3 TaskManagers")
    rec.source.fetch()
    loaded = rec.load(head)
    assert slot_inputs(loaded.apps["auto"], loaded) == {"slots": 4, "slots_per_task_manager": 4, "task_managers": 1,
                                                        "max_task_managers": 3}
