"""`shard: auto`: replicas share the shards through one Lease per shard (stand-in by default, real cluster
opt-in with FLINK_RECONCILER_TEST_KUBECONFIG; the tests that wait for an expiry need the stand-in's FakeClock).

Replicas here are `ShardLeases` (and `ShardedService`s) in one process, ticked by hand the way their
election thread does every 2 s, so every interleaving is deterministic.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from pathlib import Path
from typing import cast

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.daemon.dashboard import dashboard_for
from reconciler.daemon.ports import AsksForPasses
from reconciler.daemon.shards import ShardedService, ShardLeases, member_lease_name, quota
from reconciler.errors import ConfigError, FencedError
from reconciler.live.kubernetes.records import ConfigMapRecordStore, lease_fence
from reconciler.live.records import FileRecordStore
from reconciler.report.reporter import Reporter
from reconciler.report.status import CommitStatus
from reconciler.service.reconcile import Reconciler
from reconciler.service.sharding import Shard, ShardRecordStore, shard_of
from reconciler.settings import load_settings
from reconciler.source.git import GitSource
from tests.apply.fakes import FakeRuntime, make_app
from tests.gitutil import Repo, spec
from tests.kubernetes.conftest import Cluster

pytestmark = pytest.mark.kubernetes

SHARDS = 5
LEASE = "fr"
DURATION = 15.0
TICK = 2.0  # the election thread's retry period


def replica(c: Cluster, name: str, shards: int = SHARDS) -> ShardLeases:
    return ShardLeases(c.api_client, clock=c.clock, namespace=c.namespace, lease_name=LEASE, shards=shards,
                       identity=name, lease_duration=DURATION, renew_deadline=10, retry_period=TICK)


@pytest.fixture
def fake(cluster: Cluster) -> FakeClock:
    if not isinstance(cluster.clock, FakeClock):
        pytest.skip("expiry is tested with a FakeClock (a real cluster would need 15 s of real waiting)")
    return cluster.clock


def advance(c: Cluster, seconds: float) -> None:
    if isinstance(c.clock, FakeClock):
        c.clock.advance(seconds)


def check_exclusive(replicas: list[ShardLeases]) -> dict[int, str]:
    """No shard is held by two replicas, on their own view and on the Lease itself; returns shard -> holder."""
    owners: dict[int, str] = {}
    for r in replicas:
        for i in r.held():
            assert i not in owners, f"shard {i} held by {owners[i]} and {r.identity}"
            owners[i] = r.identity
            lease = r.kube.get("Lease", r.namespace, f"{LEASE}-shard-{i}")
            assert lease is not None and lease["spec"]["holderIdentity"] == r.identity
    return owners


def rounds(c: Cluster, replicas: list[ShardLeases], n: int) -> dict[int, str]:
    owners: dict[int, str] = {}
    for _ in range(n):
        for r in replicas:
            r.tick()
            owners = check_exclusive(replicas)  # after every single tick, not only at the end
        advance(c, TICK)
    return owners


def test_quota_and_names() -> None:
    assert [quota(5, r) for r in (0, 1, 2, 3, 4, 5, 6)] == [5, 5, 3, 2, 2, 1, 1]
    assert member_lease_name("flink-reconciler", "Pod_A.1") == "flink-reconciler-member-pod-a.1"
    s = load_settings({"shards": 5, "shard": "auto"})
    assert s.shard == "auto"
    with pytest.raises(ConfigError, match="only the daemon"):
        _ = s.shard_lease_name  # a one-off command never elects itself leader of every shard
    assert load_settings({"shards": 5, "shard": "3"}).shard == 3


def test_a_lone_replica_takes_one_shard_per_round_from_its_second_round(cluster: Cluster) -> None:
    a = replica(cluster, "pod-a")
    taken: list[int] = []
    a.on_taken = taken.append  # the sharded service asks the daemon for a pass of each shard taken
    a.tick()
    assert a.held() == frozenset()  # announced only: replicas started together see each other first
    member = cluster.kube.get("Lease", cluster.namespace, member_lease_name(LEASE, "pod-a"))
    assert member is not None and member["spec"]["holderIdentity"] == "pod-a"
    for n in range(1, SHARDS + 1):  # one shard per round: replicas starting together do not grab everything
        advance(cluster, TICK)
        a.tick()
        assert len(a.held()) == n
        assert len(taken) == n and set(taken) == a.held()  # told of each take, in its round
    assert a.held() == frozenset(range(SHARDS))
    assert "holds shard(s) 0, 1, 2, 3, 4 of 5; 1 live replica(s)" in a.describe()


@pytest.mark.parametrize("count", [2, 3])
def test_replicas_split_the_shards_and_never_share_one(cluster: Cluster, count: int) -> None:
    first = replica(cluster, "pod-0")
    owners = rounds(cluster, [first], SHARDS + 1)
    assert set(owners) == set(range(SHARDS))  # alone: everything
    replicas = [first, *(replica(cluster, f"pod-{k}") for k in range(1, count))]
    owners = rounds(cluster, replicas, 5)  # the newcomers announce, the first gives its surplus up, they take it
    assert set(owners) == set(range(SHARDS))
    held = sorted(collections.Counter(owners.values()).values())
    assert held == {2: [2, 3], 3: [1, 2, 2]}[count], owners
    assert all(len(r.held()) <= quota(SHARDS, count) for r in replicas)
    assert rounds(cluster, replicas, 3) == owners  # and then it stays put


def test_a_killed_replicas_shards_are_taken_over_after_its_lease_expired(cluster: Cluster, fake: FakeClock) -> None:
    replicas = [replica(cluster, f"pod-{k}") for k in range(3)]
    owners = rounds(cluster, replicas, 5)
    dead = replicas[2]
    lost = {i for i, who in owners.items() if who == dead.identity}
    assert lost
    survivors = replicas[:2]
    killed_at = fake.monotonic()  # pod-2 stops ticking: no renewal, no release
    taken_at: float | None = None
    while taken_at is None:
        for r in survivors:
            r.tick()
            now_owned = check_exclusive(survivors)
            if lost & set(now_owned):
                # never before the dead holder's Lease expired on the taker's clock (the holder may only be paused)
                assert fake.monotonic() - killed_at >= DURATION - TICK
            if set(now_owned) == set(range(SHARDS)):
                taken_at = fake.monotonic()
        fake.advance(TICK)
        assert fake.monotonic() - killed_at < 60, "the lost shards were never taken over"
    # within the Lease duration and a few election rounds (its membership must expire first, on the same clock)
    assert taken_at - killed_at <= DURATION + 3 * TICK, taken_at - killed_at
    assert sorted(len(r.held()) for r in survivors) == [2, 3]
    assert not dead.held()  # its own view: the renew deadline has passed, it no longer acts


def test_a_replica_shut_down_cleanly_hands_its_shards_over_at_once(cluster: Cluster) -> None:
    replicas = [replica(cluster, f"pod-{k}") for k in range(2)]
    owners = rounds(cluster, replicas, 5)
    leaving = replicas[1]
    assert any(who == leaving.identity for who in owners.values())
    leaving.release_all()
    assert not leaving.held()
    assert cluster.kube.get("Lease", cluster.namespace, member_lease_name(LEASE, leaving.identity)) is None
    stay = replicas[0]
    for _ in range(len(leaving_held := {i for i, w in owners.items() if w == leaving.identity})):
        stay.tick()  # one shard per round, no expiry to wait for: the member left and its shards were released
        advance(cluster, TICK)
    assert stay.held() == frozenset(range(SHARDS)) and leaving_held
    leaving.tick()
    assert not leaving.held()  # a stopped replica takes nothing back


def test_shutdown_does_not_wait_past_its_deadline_for_a_running_pass_nor_release_that_shard(
        cluster: Cluster) -> None:
    """A pass still running at the shutdown deadline keeps its shard's Lease (released, another replica
    would act on the shard while this one still does); the other shards are handed over at once."""
    leaving = replica(cluster, "pod-a")
    rounds(cluster, [leaving], SHARDS + 1)
    assert leaving.held() == frozenset(range(SHARDS))
    busy, done = threading.Event(), threading.Event()

    def a_pass() -> None:
        with leaving.reconciling(2):
            busy.set()
            done.wait(30)

    t = threading.Thread(target=a_pass)
    t.start()
    try:
        assert busy.wait(5)
        started = time.monotonic()
        leaving.release_all(timeout=0.3)
        assert time.monotonic() - started < 3, "shutdown waited for the pass"
        holders = {i: (cluster.kube.get("Lease", cluster.namespace, f"{LEASE}-shard-{i}") or {}).get(
            "spec", {}).get("holderIdentity") for i in range(SHARDS)}
        assert holders[2] == "pod-a" and not any(holders[i] for i in range(SHARDS) if i != 2), holders
    finally:
        done.set()
        t.join(10)


def test_a_deposed_shard_holder_cannot_write_a_record_of_that_shard(cluster: Cluster, fake: FakeClock) -> None:
    a, b = replica(cluster, "pod-a", shards=2), replica(cluster, "pod-b", shards=2)
    rounds(cluster, [a, b], 4)
    i = next(iter(a.held()))
    app = next(f"app-{k}" for k in itertools.count() if shard_of(f"app-{k}", 2) == i)
    mine = ConfigMapRecordStore(cluster.kube, [cluster.namespace], fence=lease_fence(a.electors[i]))
    doc = {"kind": "FlinkReconcilerRecord", "version": 1, "app": app, "namespace": cluster.namespace}
    v1 = mine.put(app, doc, expected=None)
    theirs = ConfigMapRecordStore(cluster.kube, [cluster.namespace], fence=lease_fence(b.electors[i]))
    with pytest.raises(FencedError):  # b does not hold the shard: it may not write the app's record
        theirs.put(app, {**doc, "n": 1}, expected=v1)

    for _ in range(12):  # a is paused (a long GC, a partition): b alone, for longer than the Lease duration
        b.tick()
        fake.advance(TICK)
    assert b.held() == frozenset({0, 1})
    v2 = theirs.put(app, {**doc, "n": 2}, expected=theirs.list()[app].version)
    # a wakes up believing it still holds the shard: the Lease on the server says no.
    a.electors[i]._leader, a.electors[i]._renewed_at = True, fake.monotonic()
    with pytest.raises(FencedError, match="held by pod-b"):
        mine.put(app, {**doc, "n": 3}, expected=v2)
    assert theirs.get(app) is not None and theirs.get(app).doc["n"] == 2  # type: ignore[union-attr]


# ---- the service: every app reconciled by exactly one replica, also across a takeover ---------------------

APPS = [f"app-{k:02d}" for k in range(30)]


class Posted:
    """A reporter that remembers which replica posted a status for which app (a sink, not our client)."""

    def __init__(self, log: list[tuple[str, str, str]], who: str) -> None:
        self.log, self.who = log, who

    def report(self, status: CommitStatus) -> None:
        self.log.append((self.who, status.app, status.revision))

    def report_many(self, statuses: list[CommitStatus]) -> None:
        for status in statuses:
            self.report(status)

    def close(self, timeout: float = 5.0) -> None:
        pass


def service(c: Cluster, repo: Repo, tmp: Path, name: str, posted: list[tuple[str, str, str]]) -> ShardedService:
    leases = replica(c, name)
    state = tmp / f"state-{name}"
    source = GitSource(str(repo.origin), state / "git", branch="main")
    records = FileRecordStore(tmp / "records")  # dry run: records shared as ConfigMaps would be

    def make(shard: Shard, src: GitSource) -> Reconciler:
        journal = Journal(state / "journal", c.clock, store=ShardRecordStore(records, shard))
        return Reconciler(source=src, runtime=None, journal=journal, clock=c.clock, subdir="apps", shard=shard,
                          leader=lambda: leases.holds(shard.index), reporter=cast(Reporter, Posted(posted, name)))

    return ShardedService(leases, source, make)


def test_every_app_is_reconciled_by_one_replica_and_a_lost_replicas_apps_by_another(
        cluster: Cluster, fake: FakeClock, tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    repo = Repo(tmp_path / "repo")
    for app in APPS:
        repo.write(f"apps/{app}.yaml", spec(app))
    head = repo.commit("thirty apps")
    posted: list[tuple[str, str, str]] = []
    services = [service(cluster, repo, tmp_path, f"pod-{k}", posted) for k in range(3)]

    def round_() -> None:
        for s in services:
            s.leases.tick()
        for s in services:
            s.sync(full=False, reason="poll")
        fake.advance(TICK)

    for _ in range(6):
        round_()
    by_app: dict[str, set[str]] = collections.defaultdict(set)
    for who, app, _ in posted:
        by_app[app].add(who)
    assert sorted(by_app) == APPS  # every app has its status ...
    assert all(len(w) == 1 for w in by_app.values()), by_app  # ... from exactly one replica
    owners = check_exclusive([s.leases for s in services])
    for app, posters in by_app.items():
        assert posters == {owners[shard_of(app, SHARDS)]}

    # Kill pod-2 (no more ticks or passes); push a change to every app; the others take its shards over.
    dead = services.pop()
    lost = {a for a, w in by_app.items() if w == {dead.leases.identity}}
    for app in APPS:
        repo.write(f"apps/{app}.yaml", spec(app, parallelism=2))
    head = repo.commit("every app to parallelism 2")
    killed_at = fake.monotonic()
    done_at: float | None = None
    while done_at is None:
        round_()
        seen = {app for who, app, rev in posted if rev == head}
        if seen >= set(APPS):
            done_at = fake.monotonic()
        assert fake.monotonic() - killed_at < 60, f"not taken over: {set(APPS) - seen}"
    assert done_at - killed_at <= DURATION + 4 * TICK, done_at - killed_at  # Lease duration + a few rounds
    after: dict[str, set[str]] = collections.defaultdict(set)
    for who, app, rev in posted:
        if rev == head:
            after[app].add(who)
    assert all(len(w) == 1 and dead.leases.identity not in w for w in after.values()), after
    assert {a for a, w in after.items() if w & {s.leases.identity for s in services}} >= lost
    ok, why = services[0].readiness()
    assert ok and "2 live replica(s)" in why, why


def test_a_standby_replica_is_ready_and_reconciles_nothing(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    repo = Repo(tmp_path / "repo")
    repo.write("apps/a.yaml", spec("a"))
    repo.commit("one app")
    posted: list[tuple[str, str, str]] = []
    services = [service(cluster, repo, tmp_path, f"pod-{k}", posted) for k in range(6)]  # one more than shards
    for _ in range(4):
        for s in services:
            s.leases.tick()
        advance(cluster, TICK)
    idle = [s for s in services if not s.leases.held()]
    assert len(idle) == 1 and all(len(s.leases.held()) == 1 for s in services if s not in idle)
    idle[0].sync(full=True, reason="drift")
    assert not idle[0].reconcilers() and not any(who == idle[0].leases.identity for who, _, _ in posted)
    ok, why = idle[0].readiness()
    assert ok and "holds shard(s) none of 5" in why


# ---- the daemon's wiring (`run` with shard: auto), real clock ---------------------------------------------


def test_the_daemon_service_of_shard_auto_splits_fences_by_shard_and_hands_over_on_shutdown(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from reconciler.clock import SystemClock
    from reconciler.daemon.main import make_auto_sharded, make_service
    from reconciler.daemon.metrics import Metrics
    from tests.kubernetes.test_service_k8s import _kubeconfig

    (tmp_path / "repo").mkdir()
    repo = Repo(tmp_path / "repo")
    repo.write("README.md", "no apps yet\n")
    repo.commit("empty")
    base = {"repo_url": str(repo.origin), "runtime": "kubernetes", "kubeconfig": str(_kubeconfig(cluster, tmp_path)),
            "namespaces": cluster.namespace, "path": "apps", "status_sink": "none", "shards": 3, "shard": "auto",
            "lease_namespace": cluster.namespace, "lease_name": "fr-auto"}
    with pytest.raises(ConfigError, match="needs runtime: kubernetes"):
        make_service(load_settings({**base, "runtime": "local", "state_dir": str(tmp_path / "s0")}), Metrics(),
                     SystemClock())
    services = []
    for k in range(2):
        monkeypatch.setenv("POD_NAME", f"replica-{k}")
        services.append(make_auto_sharded(load_settings({**base, "state_dir": str(tmp_path / f"s{k}")}), None,
                                          SystemClock()))
    asked: list[list[str]] = [[], []]
    for s, got in zip(services, asked, strict=True):
        assert isinstance(s, AsksForPasses)
        s.ask_for_passes_with(got.append)  # what the daemon does when it starts
    try:
        def split() -> bool:
            held = [s.leases.held() for s in services]
            return all(held) and not (held[0] & held[1]) and len(held[0] | held[1]) == 3

        end = time.monotonic() + 30
        while not split() and time.monotonic() < end:
            time.sleep(0.2)
        assert split(), [s.leases.describe() for s in services]
        for s, got in zip(services, asked, strict=True):  # each shard taken asked for its pass at once
            assert sorted(got) == [f"shard {i} taken" for i in sorted(s.leases.held())]
        for s in services:
            s.sync(full=True, reason="startup")
            assert set(s.reconcilers()) == s.leases.held()
        first, second = services
        i = min(first.leases.held())
        app = next(f"app-{k}" for k in itertools.count() if shard_of(f"app-{k}", 3) == i)
        journal = first.reconcilers()[i].journal
        journal.note(app, "test", "written by the holder of its shard")  # a record write
        # A shard being given up (more replicas came) gets no new pass, but the pass it may be finishing still
        # executes and reports: its Reconciler's leader check is the shard's Lease, not `holds`.
        rec = first.reconcilers()[i]
        first.leases._surrender.add(i)
        assert not first.leases.holds(i) and rec.leader is not None and rec.leader()
        first.leases._surrender.discard(i)
        assert cluster.kube.get("ConfigMap", cluster.namespace, f"{app}-flink-reconciler-record") is not None
        first.shutdown(deadline_s=5)  # clean: the pass is over, every shard released at once
        assert not first.leases.held()
        with pytest.raises(FencedError):  # the shard's Lease is not ours any more: no record write
            journal.note(app, "test", "written after the shard was released")
        end = time.monotonic() + 15  # no expiry to wait for: the next election round (2 s) takes them
        while second.leases.held() != frozenset(range(3)) and time.monotonic() < end:
            time.sleep(0.2)
        assert second.leases.held() == frozenset(range(3)), second.leases.describe()
        second.sync(full=False, reason="poll")
        assert set(second.reconcilers()) == {0, 1, 2}
        ok, why = second.readiness()
        assert ok and "holds shard(s) 0, 1, 2 of 3" in why, why
    finally:
        for s in services:
            s.shutdown(deadline_s=1)


def test_the_sharded_deployments_lease_role_grants_exactly_what_shard_auto_calls(
        cluster: Cluster, fake: FakeClock, standin_only: object) -> None:
    from ruamel.yaml import YAML

    from tests.kubernetes.standin import Standin

    assert isinstance(standin_only, Standin)
    deploy = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes-sharded"
    role = YAML(typ="safe").load((deploy / "rbac-shards.yaml").read_text())
    granted = {(g, res, v) for rule in role["rules"] for g in rule["apiGroups"] for res in rule["resources"]
               for v in rule["verbs"]}
    standin_only.api.reset_log()
    a, b = replica(cluster, "pod-a"), replica(cluster, "pod-b")
    rounds(cluster, [a, b], 4)  # announce, take, give the surplus up, renew
    b.release_all()  # shutdown: release, leave
    c = replica(cluster, "pod-c")
    rounds(cluster, [a, c], 2)
    for _ in range(int(10 * DURATION / TICK) + 2):  # c dies; a deletes its membership after ten durations
        a.tick()
        fake.advance(TICK)
    assert cluster.kube.get("Lease", cluster.namespace, member_lease_name(LEASE, "pod-c")) is None
    used = {(call.group, call.resource, call.verb) for call in standin_only.api.calls()}
    assert used == granted


def test_the_sharded_kustomization_builds_5_auto_replicas_and_validates() -> None:
    import shutil
    import subprocess

    import kubernetes_validate
    from ruamel.yaml import YAML

    if shutil.which("kubectl") is None:
        pytest.skip("needs kubectl (kustomize)")
    deploy = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes-sharded"
    out = subprocess.run(["kubectl", "kustomize", str(deploy)], capture_output=True, text=True, check=True).stdout
    docs = [d for d in YAML(typ="safe").load_all(out) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert dep["spec"]["replicas"] == 5
    assert (env["FLINK_RECONCILER_SHARDS"], env["FLINK_RECONCILER_SHARD"]) == ("5", "auto")
    settings = load_settings({"shards": env["FLINK_RECONCILER_SHARDS"], "shard": env["FLINK_RECONCILER_SHARD"]})
    assert (settings.shards, settings.shard) == (5, "auto")
    assert "POD_NAME" in env and "POD_NAMESPACE" in env  # identity and Lease namespace


def test_a_shard_lost_and_taken_again_between_two_passes_is_rebuilt_from_the_cluster(
        cluster: Cluster, tmp_path: Path) -> None:
    """What a replica knew of a shard before it lost it (records another holder may have changed since,
    a transition it may have finished) is never reused: taking the shard again builds it anew."""
    (tmp_path / "repo").mkdir()
    repo = Repo(tmp_path / "repo")
    repo.write("apps/a.yaml", spec("a"))
    repo.commit("one app")
    svc = service(cluster, repo, tmp_path, "pod-a", [])
    rounds(cluster, [svc.leases], SHARDS + 1)
    svc.sync(full=True, reason="startup")
    before = svc.reconcilers()
    assert set(before) == set(range(SHARDS))
    i = shard_of("a", SHARDS)
    svc.leases.electors[i].release()  # lost (here: released; an expiry or a lost renewal alike)...
    svc.leases.tick()  # ...and taken again before the next pass
    assert i in svc.leases.held()
    svc.sync(full=False, reason="poll")
    after = svc.reconcilers()
    assert after[i] is not before[i]
    assert all(after[k] is before[k] for k in range(SHARDS) if k != i)


def test_the_dashboard_of_a_sharded_replica_shows_the_live_job_of_every_app_its_shards_own(
        cluster: Cluster, fake: FakeClock, tmp_path: Path) -> None:
    """Each app's job is asked of its own shard's runtime: the pages of a `shard: auto` replica show live jobs."""
    (tmp_path / "repo").mkdir()
    repo = Repo(tmp_path / "repo")
    apps = APPS[:8]
    for app in apps:
        repo.write(f"apps/{app}.yaml", spec(app))
    repo.commit("eight apps")
    runtime = FakeRuntime(fake)
    jobs = {app: f"{k:032x}" for k, app in enumerate(apps)}
    for app, job in jobs.items():
        runtime.seed_job(make_app(app), job)
    leases = replica(cluster, "pod-0")
    state = tmp_path / "state"
    records = FileRecordStore(tmp_path / "records")

    def make(shard: Shard, src: GitSource) -> Reconciler:
        journal = Journal(state / "journal", cluster.clock, store=ShardRecordStore(records, shard))
        return Reconciler(source=src, runtime=runtime, journal=journal, clock=cluster.clock,
                          subdir="apps", shard=shard, leader=lambda: leases.holds(shard.index))

    svc = ShardedService(leases, GitSource(str(repo.origin), state / "git", branch="main"), make)
    for _ in range(SHARDS + 2):  # a lone replica takes one more shard each round
        leases.tick()
        svc.sync(full=True, reason="poll")
        fake.advance(TICK)
    assert len(svc.reconcilers()) == SHARDS
    jobs = {app: runtime.running_jobs(app)[0] for app in apps}  # as seeded, or as the passes left them
    dash = dashboard_for(svc, load_settings({"repo_url": str(repo.origin), "runtime": "local"}), cluster.clock)
    assert dash is not None
    live = dash.read.live(apps)
    assert {app: info.job_id for app, info in live.items()} == jobs
    assert {info.state for info in live.values()} == {"RUNNING"}
