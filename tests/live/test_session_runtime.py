"""SessionRuntime's rules for a shared cluster, against a host whose clusters are plain values: each app sees only
its own jobs; a move starts the new cluster once, retires the old one once, deletes it only when every job left
it; a job rolled back onto the old cluster keeps it; a cluster running other apps' jobs is never restarted."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reconciler.clock import FakeClock
from reconciler.core.observed import Checkpoint, ClusterPhase
from reconciler.core.plan import deterministic_job_id
from reconciler.errors import PermanentStepError
from reconciler.live.ports import CheckpointStats, ClusterInfo, JobSummary, SessionGeneration
from reconciler.live.session import SETTLE_S, SessionRuntime
from reconciler.spec.model import FlinkApp
from tests.core.builders import app as make_app


def job_of(app: str, n: int = 1) -> str:
    return deterministic_job_id(app, "r" * 40, n)


@dataclass
class Client:
    """A JobManager's REST API as far as the runtime asks it."""

    jobs_: dict[str, str] = field(default_factory=dict)  # job id -> state
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def jobs(self) -> list[JobSummary]:
        return [JobSummary(job_id=j, name="counter", state=s, tasks_running=1, tasks_total=1, start_time_ms=0)
                for j, s in self.jobs_.items()]

    def stop_with_savepoint(self, job_id: str, *, drain: bool = False, trigger_id: str | None = None,
                            target_directory: str | None = None) -> str:
        self.calls.append(("stop", (job_id, target_directory)))
        return "t"

    def cancel(self, job_id: str) -> None:
        self.calls.append(("cancel", job_id))
        self.jobs_[job_id] = "CANCELED"

    jars_: list[str] = field(default_factory=list)

    def jars(self) -> dict[str, str]:
        return {j: f"{j}.jar" for j in self.jars_}

    def delete_jar(self, jar_id: str) -> None:
        self.calls.append(("delete_jar", jar_id))
        self.jars_.remove(jar_id)

    def run_jar(self, jar_id: str, **kw: Any) -> str:
        self.jobs_[kw["job_id"]] = "RUNNING"
        self.calls.append(("run", kw))
        return str(kw["job_id"])

    def plan_jar(self, jar_id: str, **kw: Any) -> None:
        self.calls.append(("plan", (jar_id, kw["args"])))

    checkpointed: set[str] = field(default_factory=set)  # jobs that completed a checkpoint

    def checkpoints(self, job_id: str) -> CheckpointStats:
        n = int(job_id in self.checkpointed)
        return CheckpointStats(completed_count=n, latest_completed_id=n or None, latest_completed_path=None,
                               latest_completed_at=None, restored_path=None, restored_is_savepoint=None)


@dataclass
class Host:
    """Session cluster `shared` as slots -> (generation, config key, client)."""

    slots: dict[str, tuple[str, str, Client]] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    name: str = "local"
    restarts_processes: bool = False

    def session_generations(self, cluster: str) -> list[SessionGeneration]:
        return [SessionGeneration(slot=s, generation=g, config_key=k, cluster_id=f"{s}-{g}", client=c)  # type: ignore[arg-type]
                for s, (g, k, c) in self.slots.items()]

    def config_key(self, app: FlinkApp) -> str:
        return app.spec.task_manager.resources.memory

    ours: dict[str, str] = field(default_factory=dict)  # jar id -> digest
    used: dict[str, str] = field(default_factory=dict)  # job id -> jar id

    def jar_id(self, cluster: str, slot: str, jar: Path, *, deadline: float, again: bool = False,
               job_id: str | None = None) -> str:
        if job_id is not None:
            self.used[job_id] = f"jar-{slot}"
        return f"jar-{slot}"

    def jar_uses(self, cluster: str, slot: str) -> tuple[dict[str, str], dict[str, str]]:
        return dict(self.ours), dict(self.used)

    def forget_jars(self, cluster: str, slot: str, jar_ids: Any, gone_jobs: Any, *, deadline: float) -> None:
        self.calls.append(("forget_jars", (sorted(jar_ids), sorted(gone_jobs))))

    def job_storage(self, app: str) -> dict[str, str]:
        return {"execution.checkpointing.savepoint-dir": f"file:///sp/{app}"}

    def list_clusters(self) -> dict[str, ClusterInfo]:
        return {"shared": ClusterInfo(app="shared", phase=ClusterPhase.READY, session=True),
                "solo": ClusterInfo(app="solo", phase=ClusterPhase.READY)} if self.slots else {}

    def observe(self, app: str) -> ClusterInfo:
        return self.list_clusters().get(app) or ClusterInfo(app=app, phase=ClusterPhase.ABSENT)

    def ensure_cluster(self, app: FlinkApp, *, deadline: float, keep_running: bool = False) -> ClusterInfo:
        self.calls.append(("ensure", app.name))
        return ClusterInfo(app=app.name, phase=ClusterPhase.READY)

    def start_standby(self, app: FlinkApp, *, generation: str, deadline: float, jar: Path | None = None
                      ) -> ClusterInfo:
        self.calls.append(("start_standby", (generation, jar is not None)))
        if not any(g == generation for g, _, _ in self.slots.values()):
            self.slots["standby"] = (generation, self.config_key(app), Client())
        return ClusterInfo(app=app.name, phase=ClusterPhase.READY)

    def promote_standby(self, app: str, *, generation: str, deadline: float) -> None:
        self.calls.append(("promote", generation))
        self.slots["retired"] = self.slots["cluster"]
        self.slots["cluster"] = self.slots.pop("standby")

    def discard_standby(self, app: str, *, generation: str, deadline: float) -> None:
        self.calls.append(("discard", generation))

    def delete_retired(self, app: str, *, deadline: float) -> None:
        self.calls.append(("delete_retired", app))
        self.slots.pop("retired", None)

    def delete_cluster(self, app: str, *, deadline: float) -> None:
        self.calls.append(("delete", app))

    def stored_snapshots(self, app: str) -> list[Checkpoint]:
        return []

    def flink(self, app: str) -> Any:
        raise AssertionError("a session app's REST client comes from its cluster's generations")

    def start_job(self, *a: Any, **kw: Any) -> str:
        raise AssertionError("a session app's job is submitted by the session runtime")


def session_app(name: str, memory: str = "1280m") -> FlinkApp:
    return make_app(name, sessionCluster="shared", taskManager={"resources": {"memory": memory}})


@pytest.fixture
def host() -> Host:
    live = Client({job_of("a"): "RUNNING", job_of("b"): "RUNNING", "f" * 32: "RUNNING"})
    return Host(slots={"cluster": ("", "1280m", live)})


@pytest.fixture
def rt(host: Host) -> SessionRuntime:
    r = SessionRuntime(host)
    r.set_sessions({"a": "shared", "b": "shared", "c": "shared"}, clusters=["shared"])
    return r


def test_each_app_sees_only_its_own_jobs_and_its_savepoints_go_to_its_own_directory(rt: SessionRuntime,
                                                                                       host: Host) -> None:
    assert [j.job_id for j in rt.flink("a").jobs()] == [job_of("a")]
    rt.flink("a").stop_with_savepoint(job_of("a"))
    assert host.slots["cluster"][2].calls == [("stop", (job_of("a"), "file:///sp/a"))]
    clusters = rt.list_clusters()
    assert "shared" not in clusters and clusters["solo"].phase is ClusterPhase.READY  # the cluster is no app
    assert clusters["a"].phase is ClusterPhase.READY and clusters["c"].phase is ClusterPhase.ABSENT  # no job of c


def test_a_cluster_running_other_jobs_is_never_restarted_at_another_spec(rt: SessionRuntime, host: Host) -> None:
    with pytest.raises(PermanentStepError, match="runs at another spec with the jobs of a, b: it changes only by "
                                                 "warm standby"):
        rt.ensure_cluster(session_app("c", memory="2g"), deadline=10)
    assert rt.ensure_cluster(session_app("c"), deadline=10).phase is ClusterPhase.READY
    assert host.calls == [("ensure", "shared")]


def test_a_move_starts_the_new_cluster_once_and_retires_the_old_once(rt: SessionRuntime, host: Host,
                                                                     tmp_path: Path) -> None:
    jar = tmp_path / "job.jar"
    jar.write_bytes(b"jar")
    for name in ("a", "b"):
        rt.start_standby(session_app(name, "2g"), generation="g2", deadline=10, jar=jar)
    # the first one starts it with the jar (warm-up), the second finds it
    assert host.calls == [("start_standby", ("g2", True)), ("start_standby", ("g2", False))]
    old = host.slots["cluster"][2]
    old.jobs_[job_of("a")] = "FINISHED"  # a stopped
    rt.promote_standby("a", generation="g2", deadline=10)
    rt.promote_standby("b", generation="g2", deadline=10)  # done already
    assert [c for c in host.calls if c[0] == "promote"] == [("promote", "g2")]
    rt.start_job(session_app("a", "2g"), job_id=job_of("a", 2), jar=jar, restore_path="file:///sp/a/1",
                 allow_non_restored_state=False, deadline=10)
    new = host.slots["cluster"][2]
    (run,) = [kw for what, kw in new.calls if what == "run"]
    assert run["savepoint_path"] == "file:///sp/a/1" and run["flink_configuration"] == host.job_storage("a")
    rt.delete_retired("a", deadline=10)  # b (and the unknown job) still run on the old cluster: kept
    assert "retired" in host.slots
    old.jobs_.update({job_of("b"): "FINISHED", "f" * 32: "CANCELED"})  # b stopped, not yet started anew
    rt.delete_retired("a", deadline=10)
    assert "retired" in host.slots, "b's rollback may still need the old cluster"
    new.jobs_[job_of("b", 2)] = "RUNNING"
    rt.set_sessions({"a": "shared", "b": "shared", "c": "shared"}, clusters=["shared"], suspended=["c"])
    rt.delete_retired("b", deadline=10)
    assert "retired" not in host.slots


def test_a_job_rolled_back_keeps_the_old_cluster_and_the_new_one_stays_for_the_others(rt: SessionRuntime,
                                                                                       host: Host) -> None:
    rt.start_standby(session_app("a", "2g"), generation="g2", deadline=10)
    host.slots["cluster"][2].jobs_[job_of("a")] = "FINISHED"
    rt.promote_standby("a", generation="g2", deadline=10)
    host.slots["cluster"][2].jobs_[job_of("a", 2)] = "RUNNING"  # a moved
    # b fails on the new cluster: its rollback discards nothing (a runs there) and starts b on the old one
    host.slots["retired"][2].jobs_[job_of("b")] = "FINISHED"
    rt.discard_standby("b", generation="g2", deadline=10)
    assert not [c for c in host.calls if c[0] == "discard"]
    assert rt.ensure_cluster(session_app("b"), deadline=10).phase is ClusterPhase.READY  # the old one, untouched
    rt.start_job(session_app("b"), job_id=job_of("b", 3), jar=Path(__file__), restore_path="file:///sp/b/1",
                 allow_non_restored_state=False, deadline=10)
    assert any(what == "run" for what, _ in host.slots["retired"][2].calls)  # on the old cluster
    rt.delete_retired("a", deadline=10)
    assert "retired" in host.slots  # b runs there
    # a third cluster is not made while b runs on the old one
    host.slots["standby"] = ("g3", "4g", Client())
    with pytest.raises(PermanentStepError, match="an older cluster still runs jobs"):
        rt.promote_standby("a", generation="g3", deadline=10)


def test_a_move_nobody_made_yet_is_discarded_on_the_host(rt: SessionRuntime, host: Host) -> None:
    rt.start_standby(session_app("a", "2g"), generation="g2", deadline=10)
    rt.discard_standby("a", generation="g2", deadline=10)
    assert host.calls[-1] == ("discard", "g2")


def test_removing_an_app_leaves_the_cluster(rt: SessionRuntime, host: Host) -> None:
    rt.delete_cluster("a", deadline=10)
    assert host.slots["cluster"][2].calls == [("cancel", job_of("a"))] and not host.calls
    rt.delete_cluster("shared", deadline=10)  # the session cluster itself (its plan entry, after its apps)
    assert host.calls == [("delete", "shared")]


def test_an_undone_move_keeps_the_new_cluster_while_another_job_is_on_its_way(rt: SessionRuntime, host: Host) -> None:
    """a's job fails on the new cluster while b is stopped on the old one and not started yet (the apps of a move
    run side by side): a goes back alone, and the new cluster stays for b's start."""
    for name in ("a", "b"):
        rt.start_standby(session_app(name, "2g"), generation="g2", deadline=10)
    old = host.slots["cluster"][2]
    old.jobs_.update({job_of("a"): "FINISHED", job_of("b"): "FINISHED"})
    rt.promote_standby("a", generation="g2", deadline=10)
    rt.discard_standby("a", generation="g2", deadline=10)
    assert not [c for c in host.calls if c[0] == "discard"]
    rt.start_job(session_app("b", "2g"), job_id=job_of("b", 2), jar=Path(__file__), restore_path="file:///sp/b/1",
                 allow_non_restored_state=False, deadline=10)
    assert job_of("b", 2) in host.slots["cluster"][2].jobs_  # b arrived on the new cluster


def test_an_undone_move_keeps_the_new_cluster_for_a_move_begun_and_the_last_undo_discards_it(
        rt: SessionRuntime, host: Host) -> None:
    """a's savepoint fails (its job runs on) after b's move began: the new cluster stays for b; when b's move is
    undone too, nobody needs it and it goes."""
    for name in ("a", "b"):
        rt.start_standby(session_app(name, "2g"), generation="g2", deadline=10)
    rt.discard_standby("a", generation="g2", deadline=10)
    assert not [c for c in host.calls if c[0] == "discard"]
    rt.discard_standby("b", generation="g2", deadline=10)
    assert [c for c in host.calls if c[0] == "discard"] == [("discard", "g2")]


def test_the_jobs_of_a_move_go_through_their_downtime_one_after_another(host: Host) -> None:
    """b's standby step returns (and b's job is stopped) only once a's job, whose move began first, runs all its
    tasks on the new cluster and completed a checkpoint there (or ran SETTLE_S without one); a move undone lets
    the next one go; the wait is bounded."""
    clock = FakeClock()
    rt = SessionRuntime(host, clock)
    rt.set_sessions({"a": "shared", "b": "shared", "c": "shared", "d": "shared"}, clusters=["shared"])
    rt.start_standby(session_app("a", "2g"), generation="g2", deadline=1000)
    assert clock.monotonic() == 0  # the first one does not wait
    new = host.slots["standby"][2]
    new.jobs_[job_of("a", 2)] = "RUNNING"  # a moved
    new.checkpointed.add(job_of("a", 2))
    rt.start_standby(session_app("b", "2g"), generation="g2", deadline=1000)
    assert clock.monotonic() == 0  # a runs there and checkpointed: b goes at once
    new.jobs_[job_of("b", 2)] = "RUNNING"  # b moved, no checkpoint yet
    rt.start_standby(session_app("c", "2g"), generation="g2", deadline=1000)
    assert clock.monotonic() == pytest.approx(SETTLE_S, abs=0.1)  # b's first seconds there, then c went
    start = clock.monotonic()
    rt.start_standby(session_app("d", "2g"), generation="g2", deadline=1000)
    assert clock.monotonic() - start == pytest.approx(120, abs=0.1)  # c never arrived: d waited its bound, then went
    rt.discard_standby("c", generation="g2", deadline=1000)
    new.checkpointed.add(job_of("b", 2))
    start = clock.monotonic()
    rt.start_standby(session_app("d", "2g"), generation="g2", deadline=1000)  # c's move undone: d's turn
    assert clock.monotonic() == start


def test_every_moving_app_s_jar_is_on_the_new_cluster_with_its_graph_compiled(rt: SessionRuntime, host: Host,
                                                                             tmp_path: Path) -> None:
    """The first app's move starts the new cluster with its jar (the host warms it up); each other app's jar is
    put there and its job graph compiled with its own arguments, in its standby step, before its stop."""
    jar = tmp_path / "job.jar"
    jar.write_bytes(b"jar")
    rt.start_standby(session_app("a", "2g"), generation="g2", deadline=10, jar=jar)
    new = host.slots["standby"][2]
    assert new.calls == []  # the host's own warm-up
    new.jobs_[job_of("a", 2)] = "RUNNING"
    new.checkpointed.add(job_of("a", 2))
    b = session_app("b", "2g")
    rt.start_standby(b, generation="g2", deadline=10, jar=jar)
    assert new.calls == [("plan", ("jar-standby", b.spec.job.args))]
    assert host.calls == [("start_standby", ("g2", True)), ("start_standby", ("g2", False))]


def test_a_jar_is_deleted_once_no_job_of_the_cluster_needs_it(rt: SessionRuntime, host: Host) -> None:
    live = host.slots["cluster"][2]
    live.jobs_.pop("f" * 32)  # only our jobs run
    live.jobs_[job_of("a", 0)] = "FINISHED"  # a's job before its upgrade
    live.jars_ = ["j-old", "j-a", "j-b", "j-warm", "j-theirs", "j-next"]
    host.ours = {"j-old": "1", "j-a": "2", "j-b": "3", "j-warm": "4", "j-next": "5"}
    host.used = {job_of("a", 0): "j-old", job_of("a"): "j-a", job_of("b"): "j-b", job_of("c"): "j-next"}
    assert rt.prune_jars("shared", deadline=10) == ["j-old", "j-warm"]  # c's start is under way: j-next stays
    assert live.jars_ == ["j-a", "j-b", "j-theirs", "j-next"]  # a jar we did not upload is never ours to delete
    assert ("forget_jars", (["j-old", "j-warm"], [job_of("a", 0)])) in host.calls
    # a live job whose jar is not on record (submitted by someone else): every jar stays
    live.jobs_["f" * 32] = "RUNNING"
    assert rt.prune_jars("shared", deadline=10) == [] and len(live.jars_) == 4
