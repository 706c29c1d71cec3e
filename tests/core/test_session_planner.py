"""The session-cluster decision table: one app's job change touches that app alone; a cluster change moves every
job by warm standby, each its own transition; refusals name the apps and the numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.core.observed import ClusterPhase, LiveApp, LiveState, Records
from reconciler.core.plan import (
    Action,
    AwaitHealthy,
    AwaitRunning,
    ClusterStrategy,
    DeleteCluster,
    DeleteRetiredCluster,
    DiscardStandby,
    EnsureCluster,
    Plan,
    PromoteStandby,
    SpecRef,
    StartJob,
    StartStandbyCluster,
    StopWithSavepoint,
    is_job_of,
)
from reconciler.core.planner import PlanInput, Policy, desired_from
from reconciler.core.render import to_text
from reconciler.core.session_planner import SessionLive, plan_with_sessions, sessions_from
from reconciler.spec.load import LoadResult, load_files
from reconciler.spec.session import session_generation
from tests.core.builders import NOW, REV, running

CLUSTER = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkSessionCluster
metadata:
  name: shared
spec:
  taskManager:
    replicas: 2
    slots: 2
    resources:
      memory: {memory}
  flinkConfiguration:
    execution.checkpointing.interval: 2s
"""

APP = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
spec:
  sessionCluster: {cluster}
  job:
    jarURI: jobs/counter.jar
    args: [{args}]
"""


def repo(memory: str = "1280m", apps: dict[str, str] | None = None, *, cluster: bool = True,
         extra: str = "") -> LoadResult:
    files = {f"apps/{n}.yaml": APP.format(name=n, cluster="shared", args=a).encode()
             for n, a in (apps if apps is not None else {"a": "1", "b": "1"}).items()}
    if cluster:
        files["apps/shared.yaml"] = (CLUSTER.format(memory=memory) + extra).encode()
    return load_files(files)


def job(name: str) -> str:
    return f"{name[0] * 24}{'0' * 8}"


def live_of(names: list[str], *, cluster: ClusterPhase = ClusterPhase.READY) -> tuple[LiveState, SessionLive]:
    apps = {n: running(n, job(n)) for n in names}
    return LiveState(apps=apps), SessionLive(phase=cluster, jobs=dict.fromkeys(names, "RUNNING"))


def plan_of(base: LoadResult, head: LoadResult, live: list[str] | None = None, *, prune: bool = False,
            warm: bool = True, generations: int = 1, mass: bool = False) -> Plan:
    names = list(base.apps) if live is None else live
    state, session = live_of(names)
    session = replace(session, generations=generations)
    inp = PlanInput(revision=REV, desired=desired_from(head), previous={n: la.app for n, la in base.apps.items()},
                    previous_sources={n: la.file for n, la in base.apps.items()}, live=state, records=Records(),
                    now=NOW, policy=Policy(prune=prune, warm_standby=warm, allow_mass_delete=mass))
    return plan_with_sessions(inp, sessions_from(head, {"shared": session} if names or generations > 1 else {}))


def test_a_job_change_is_a_job_only_upgrade_of_that_app_alone() -> None:
    p = plan_of(repo(), repo(apps={"a": "2", "b": "1"}))
    a, b = p.app("a"), p.app("b")
    assert a.action is Action.UPGRADE and a.cluster_strategy is ClusterStrategy.JOB_ONLY
    assert [type(s) for s in a.steps] == [StopWithSavepoint, EnsureCluster, StartJob, AwaitRunning, AwaitHealthy]
    assert b.action is Action.NOOP and not b.steps
    (c,) = p.clusters
    assert (c.cluster, c.action, c.apps) == ("shared", Action.NOOP, ("a", "b"))
    start = next(s for s in a.steps if isinstance(s, StartJob))
    assert is_job_of(start.job_id, "a") and not is_job_of(start.job_id, "b")


def test_a_cluster_change_moves_every_job_by_warm_standby_each_its_own_transition() -> None:
    head = repo(memory="1536m")
    p = plan_of(repo(), head)
    gen = session_generation(head.apps["a"].app)
    for name in ("a", "b"):
        ap = p.app(name)
        assert ap.action is Action.UPGRADE and ap.cluster_strategy is ClusterStrategy.WARM_STANDBY
        assert [type(s) for s in ap.steps] == [StartStandbyCluster, StopWithSavepoint, PromoteStandby, StartJob,
                                               AwaitRunning, AwaitHealthy, DeleteRetiredCluster]
        standby, stop, promote = ap.steps[:3]
        assert isinstance(standby, StartStandbyCluster) and isinstance(promote, PromoteStandby)
        assert standby.generation == promote.generation == gen
        assert isinstance(stop, StopWithSavepoint) and stop.job_id == job(name)
        # a job failing on the new cluster goes back onto the old one, from the savepoint just taken
        assert isinstance(ap.rollback[0], DiscardStandby) and ap.rollback_after == 1
        back = next(s for s in ap.rollback if isinstance(s, StartJob))
        assert back.spec is SpecRef.PREVIOUS and is_job_of(back.job_id, name)
    (c,) = p.clusters
    assert c.action is Action.UPGRADE and c.apps == ("a", "b")
    assert c.reason.startswith("cluster change (spec.taskManager.resources.memory): its 2 job(s) (a, b) move")
    assert "rolled back onto the old cluster, which is then kept while the others go on" in c.reason


@pytest.mark.parametrize(("extra", "warm", "why"), [
    ("", False, "this runtime cannot run a standby cluster"),
    ("  highAvailability:\n    enabled: true\n    storageDir: file:///ha\n", True, "a redeploy-class field changed"),
])
def test_a_cold_cluster_change_is_blocked_never_a_restart_under_the_other_jobs(extra: str, warm: bool,
                                                                                why: str) -> None:
    head = repo(memory="1280m" if extra else "1536m", extra=extra)
    p = plan_of(repo(), head, warm=warm)
    for name in ("a", "b"):
        ap = p.app(name)
        assert ap.action is Action.BLOCKED and not ap.steps and not ap.rollback
        assert "a cold change would restart the cluster under every job on it" in ap.reason and why in ap.reason


def test_a_job_that_does_not_move_keeps_the_old_cluster_and_the_plan_says_so() -> None:
    head = repo(memory="1536m")
    base = repo()
    state, session = live_of(["a", "b"])
    # b's job is failing: it does not move now (its own entry says why), a moves
    state = LiveState(apps={**state.apps, "b": running("b", job("b"), state="FAILED", phase=state.apps["b"].job)
                            .model_copy(update={"cluster": ClusterPhase.UNKNOWN, "cluster_message": "gone"})})
    inp = PlanInput(revision=REV, desired=desired_from(head), previous={n: la.app for n, la in base.apps.items()},
                    previous_sources={}, live=state, records=Records(), now=NOW, policy=Policy(warm_standby=True))
    p = plan_with_sessions(inp, sessions_from(head, {"shared": session}))
    assert p.app("a").cluster_strategy is ClusterStrategy.WARM_STANDBY and p.app("b").action is Action.NOOP
    (c,) = p.clusters
    assert c.action is Action.UPGRADE and "its 1 job(s) (a) move" in c.reason


def test_deleting_an_app_takes_its_final_savepoint_and_leaves_the_cluster() -> None:
    p = plan_of(repo(), repo(apps={"b": "1"}), prune=True)
    a = p.app("a")
    assert a.action is Action.DELETE
    assert a.steps == (StopWithSavepoint(job_id=job("a"), deadline_s=300),
                       DeleteCluster(session_cluster="shared", deadline_s=120))
    assert "final savepoint, then remove it from session cluster shared" in a.reason
    assert "keeps running its other jobs" in a.reason
    assert "remove the app from session cluster shared (the cluster keeps running its other jobs)" in to_text(p)
    assert p.app("b").action is Action.NOOP
    (c,) = p.clusters
    assert c.action is Action.NOOP and c.apps == ("b",)


def test_deleting_a_cluster_that_apps_still_name_is_refused_with_their_names() -> None:
    p = plan_of(repo(), repo(cluster=False), prune=True)
    assert {a.app: a.action for a in p.apps} == {"a": Action.ERROR, "b": Action.ERROR}
    (c,) = p.clusters
    assert c.action is Action.BLOCKED and not c.steps
    assert c.reason.startswith("session cluster shared is no longer in Git but app(s) a, b still name it")


def test_prune_deletes_jobs_first_then_the_cluster() -> None:
    p = plan_of(repo(), repo(apps={}, cluster=False), prune=True, mass=True)
    for name in ("a", "b"):
        assert p.app(name).action is Action.DELETE
        assert isinstance(p.app(name).steps[0], StopWithSavepoint)
    (c,) = p.clusters
    assert c.action is Action.DELETE and c.apps == ("a", "b")
    assert c.reason == ("session cluster removed from Git and no app names it: deleted, after the final savepoints "
                        "of a, b")
    assert c.steps == (DeleteCluster(deadline_s=120),)
    assert c.risks == ("DELETES SESSION CLUSTER shared: spec removed from Git",)
    kept = plan_of(repo(), repo(apps={}, cluster=False), prune=False, mass=True)
    assert kept.clusters[0].action is Action.NOOP and "pruning is disabled" in kept.clusters[0].reason


def test_a_removed_cluster_with_a_job_that_stays_is_not_deleted() -> None:
    base = repo()
    state, session = live_of(["a", "b"])
    head = repo(apps={}, cluster=False)
    inp = PlanInput(revision=REV, desired=desired_from(head), previous={"a": base.apps["a"].app},
                    previous_sources={}, live=LiveState(apps={"a": state.apps["a"]}), records=Records(), now=NOW,
                    policy=Policy(prune=True, allow_mass_delete=True))
    p = plan_with_sessions(inp, sessions_from(head, {"shared": session}))
    (c,) = p.clusters
    assert c.action is Action.BLOCKED and "job(s) of b still run on it" in c.reason


def test_moving_an_app_between_clusters_is_blocked_with_the_way_to_do_it() -> None:
    own = load_files({"apps/a.yaml": b"apiVersion: flink-reconciler.io/v1alpha1\nkind: FlinkApp\nmetadata:\n"
                                     b"  name: a\nspec:\n  job:\n    jarURI: jobs/counter.jar\n    args: ['1']\n"})
    p = plan_of(own, repo(apps={"a": "1"}))
    a = p.app("a")
    assert a.action is Action.BLOCKED
    assert a.reason.startswith("app moves from its own cluster to session cluster shared, which is not done in one "
                               "step: suspend it first")


def test_a_suspended_session_app_does_not_stop_the_shared_cluster() -> None:
    suspended = repo(apps={"a": "1"})
    doc = APP.format(name="a", cluster="shared", args="1") + "    state: suspended\n"
    head = load_files({"apps/a.yaml": doc.encode(), "apps/shared.yaml": CLUSTER.format(memory="1280m").encode()})
    inp = PlanInput(revision=REV, desired=desired_from(head), previous={"a": head.apps["a"].app}, previous_sources={},
                    live=LiveState(apps={"a": LiveApp(name="a", cluster=ClusterPhase.READY)}), records=Records(),
                    now=NOW, policy=Policy())
    p = plan_with_sessions(inp, sessions_from(head, {"shared": SessionLive(phase=ClusterPhase.READY)}))
    assert p.app("a").action is Action.NOOP and "runs on for its other jobs" in p.app("a").reason
    # and suspending a running one takes a savepoint, leaving the cluster
    p2 = plan_of(suspended, head)
    assert p2.app("a").action is Action.SUSPEND
    assert p2.app("a").steps[-1] == DeleteCluster(session_cluster="shared", deadline_s=120)


def test_a_new_cluster_is_created_with_its_first_job() -> None:
    p = plan_of(repo(apps={}), repo(), live=[])
    assert {a.app: a.action for a in p.apps} == {"a": Action.CREATE, "b": Action.CREATE}
    (c,) = p.clusters
    assert c.action is Action.CREATE and c.reason == "new session cluster, started with the first of its jobs (a, b)"
    text = to_text(p)
    assert "+ shared: create (session cluster)" in text


def test_two_clusters_for_one_after_a_rollback_are_said() -> None:
    p = plan_of(repo(), repo(), generations=2)
    (c,) = p.clusters
    assert c.action is Action.NOOP and c.reason.startswith("2 clusters run for it: the old one is kept")


AUTO = "  capacity:\n    addTaskManagers: true\n    maxTaskManagers: 3\n"


def test_a_job_that_needs_more_slots_adds_task_managers_first_without_touching_the_others() -> None:
    """2 TaskManagers x 2 slots, jobs a 1 and b 1; c (parallelism 3) comes: 5 slots, 3 TaskManagers. a and b only
    get their cluster scaled (no stop), c's cluster is scaled before its job starts, and the cluster says why."""
    base = repo(extra=AUTO)
    head = load_files({**{f"apps/{n}.yaml": APP.format(name=n, cluster="shared", args="1").encode() for n in "ab"},
                       "apps/c.yaml": (APP.format(name="c", cluster="shared", args="1")
                                       + "    parallelism: 3\n").encode(),
                       "apps/shared.yaml": (CLUSTER.format(memory="1280m") + AUTO).encode()})
    assert head.errors == ()
    p = plan_of(base, head, live=["a", "b"])
    for name in ("a", "b"):
        ap = p.app(name)
        assert ap.action is Action.SCALE and [type(s) for s in ap.steps] == [EnsureCluster], ap
    c = p.app("c")
    assert c.action is Action.CREATE and isinstance(c.steps[0], EnsureCluster)
    assert [type(s) for s in c.steps].index(EnsureCluster) < [type(s) for s in c.steps].index(StartJob)
    (cp,) = p.clusters
    assert ("TaskManagers 2 -> 3: its running jobs need 5 slots (a 1, b 1, c 3), 2 per TaskManager "
            "(capacity.addTaskManagers, at most 3)") in cp.reason, cp.reason
    assert cp.action is Action.SCALE and "TaskManagers 2 -> 3" in to_text(p)
