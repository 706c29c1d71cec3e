"""Sharding: each daemon of `shards: N` loads, sees, plans and prunes only its own apps.

The records are shared here (one state dir for every shard), as ConfigMaps are on Kubernetes: a shard
must not take another shard's records for apps deleted from Git."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, cast

import pytest

from reconciler.clock import FakeClock
from reconciler.core.observed import Checkpoint, ClusterPhase
from reconciler.core.plan import Action, Plan
from reconciler.errors import ConfigError
from reconciler.live.observe import observe
from reconciler.live.ports import ClusterInfo, Runtime
from reconciler.service.factories import make_reconciler
from reconciler.service.reconcile import Reconciler
from reconciler.service.sharding import Shard, shard_of, shard_view
from reconciler.settings import load_settings
from tests.gitutil import Repo, git, spec

NAMES = [f"app-{i:02d}" for i in range(12)]


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    (tmp_path / "repo").mkdir()
    r = Repo(tmp_path / "repo")
    for name in NAMES:
        r.write(f"apps/{name}.yaml", spec(name))
    r.commit("twelve apps")
    return r


def reconciler(repo: Repo, tmp_path: Path, **settings: Any) -> Reconciler:
    s = load_settings({"repo_url": str(repo.origin), "state_dir": tmp_path / "state", "dry_run": True,
                       "status_sink": "none", **settings})
    rec = make_reconciler(s, FakeClock(), report=s.status_sink != "none")
    rec.source.fetch()
    return rec


def seed_records(repo: Repo, tmp_path: Path) -> None:
    """Every app applied at the current head, by an unsharded daemon (records shared by all shards)."""
    rec = reconciler(repo, tmp_path)
    head = rec.source.head()
    for name, la in rec.load(head).apps.items():
        rec.journal.record_adopted(name, head, la.app.canonical(), source_file=la.file)


def actions(plan: Plan) -> dict[str, Action]:
    return {a.app: a.action for a in plan.apps}


def test_the_shard_of_an_app_is_stable_and_balanced() -> None:
    # Pinned: a different hash would move apps between the shards of a running fleet.
    assert (shard_of("orders", 5), shard_of("billing", 5), shard_of("app-00", 5)) == PINNED
    counts = collections.Counter(shard_of(f"job-{i}", 5) for i in range(10_000))
    assert set(counts) == set(range(5)) and all(1700 < c < 2300 for c in counts.values()), counts
    assert Shard(3, 5).owns("x") is (shard_of("x", 5) == 3) and Shard(0, 1).owns("anything")


PINNED = (3, 4, 3)  # sha256 of the name, first 8 bytes big-endian, mod 5


def test_every_app_is_planned_by_exactly_one_shard(repo: Repo, tmp_path: Path) -> None:
    head = reconciler(repo, tmp_path).source.head()
    seen: dict[str, int] = {}
    for i in range(3):
        plan = reconciler(repo, tmp_path, shards=3, shard=i).plan(head)
        for app in actions(plan):
            assert app not in seen, f"{app} planned by shards {seen[app]} and {i}"
            assert shard_of(app, 3) == i
            seen[app] = i
    assert sorted(seen) == NAMES


def test_a_shard_holds_only_its_own_specs_also_after_an_incremental_load(repo: Repo, tmp_path: Path) -> None:
    rec = reconciler(repo, tmp_path, shards=2, shard=0)
    first = rec.load(rec.source.head())
    assert set(first.apps) == {n for n in NAMES if shard_of(n, 2) == 0} and len(first.files) == len(NAMES)
    new = [f"new-{i}" for i in range(6)]
    for name in new:
        repo.write(f"apps/{name}.yaml", spec(name))
    repo.commit("six new apps")
    rec.source.fetch()
    again = rec.load(rec.source.head())  # incremental: only the changed files are parsed
    assert set(again.apps) == {n for n in [*NAMES, *new] if shard_of(n, 2) == 0}


def test_another_shards_records_are_not_deletions(repo: Repo, tmp_path: Path) -> None:
    seed_records(repo, tmp_path)
    for i in range(2):
        rec = reconciler(repo, tmp_path, shards=2, shard=i, prune=True)
        plan = rec.plan(rec.source.head())
        assert Action.DELETE not in actions(plan).values()
        assert set(actions(plan)) == {n for n in NAMES if shard_of(n, 2) == i}
        assert set(rec.journal.records().apps) == {n for n in NAMES if shard_of(n, 2) == i}


def test_prune_and_the_mass_deletion_guard_count_the_shards_own_apps(repo: Repo, tmp_path: Path) -> None:
    seed_records(repo, tmp_path)
    mine = [n for n in NAMES if shard_of(n, 2) == 0]
    assert len(mine) >= 4, "the fixture needs at least 4 apps in shard 0"
    gone = mine[: len(mine) // 2 + 1]  # more than half of shard 0, at most half of the repository
    for name in gone:
        repo.remove(f"apps/{name}.yaml")
    repo.commit("remove some of shard 0")

    whole = reconciler(repo, tmp_path, prune=True)
    plan = whole.plan(whole.source.head())
    assert plan.guard is None and {a for a, x in actions(plan).items() if x is Action.DELETE} == set(gone)

    shard0 = reconciler(repo, tmp_path, prune=True, shards=2, shard=0)
    plan0 = shard0.plan(shard0.source.head())
    assert plan0.guard is not None and "mass-deletion guard" in plan0.guard
    assert f"{len(gone)} of {len(mine)} apps" in plan0.guard
    assert Action.DELETE not in actions(plan0).values()

    shard1 = reconciler(repo, tmp_path, prune=True, shards=2, shard=1)
    plan1 = shard1.plan(shard1.source.head())
    assert plan1.guard is None and Action.DELETE not in actions(plan1).values()


def test_an_unreadable_file_blocks_deletions_in_every_shard(repo: Repo, tmp_path: Path) -> None:
    seed_records(repo, tmp_path)
    victims = {i: next(n for n in NAMES if shard_of(n, 2) == i) for i in range(2)}
    for name in victims.values():
        repo.remove(f"apps/{name}.yaml")
    repo.write("apps/moved.yaml", bytes(range(256)))  # the apps may have moved here
    repo.commit("remove one app of each shard, add an unreadable file")
    for i in range(2):
        rec = reconciler(repo, tmp_path, prune=True, shards=2, shard=i)
        plan = rec.plan(rec.source.head())
        assert actions(plan)["apps/moved.yaml"] is Action.ERROR
        assert plan.guard is not None and "cannot be read" in plan.guard
        assert actions(plan)[victims[i]] is not Action.DELETE and victims[1 - i] not in actions(plan)


def test_shard_settings() -> None:
    s = load_settings({"shards": 5, "shard": 4, "lease_name": "flink"})
    assert s.shard_lease_name == "flink-shard-4"
    assert load_settings({}).shard_lease_name == "flink-reconciler"
    with pytest.raises(ConfigError, match="shard 5 does not exist"):
        load_settings({"shards": 5, "shard": 5})


class _Clusters:
    """A runtime that lists a failed cluster for every app (no REST to call) and stores no snapshots."""

    name = "stub"

    def __init__(self) -> None:
        self.evidence_asked: list[str] = []

    def list_clusters(self) -> dict[str, ClusterInfo]:
        return {n: ClusterInfo(app=n, phase=ClusterPhase.FAILED, message="crash loop") for n in NAMES}

    def stored_snapshots(self, app: str) -> list[Checkpoint]:
        self.evidence_asked.append(app)
        return []


def test_a_shard_observes_only_its_own_clusters() -> None:
    runtime = _Clusters()
    seen = observe(shard_view(cast(Runtime, runtime), Shard(1, 2)), [])
    mine = {n for n in NAMES if shard_of(n, 2) == 1}
    assert set(seen.apps) == mine  # another shard's cluster is no orphan of this one
    assert set(runtime.evidence_asked) == mine  # and its storage is never read
    assert shard_view(cast(Runtime, runtime), None) is cast(Runtime, runtime)


def test_a_shard_validates_only_its_own_documents_and_loads_what_filtering_afterwards_would() -> None:
    """Another shard's documents are parsed (their names must be read) but not validated: the result must
    be exactly the whole load filtered to the shard, errors no app can be named for included."""
    from reconciler.spec.load import load_file, load_files
    from reconciler.spec.model import valid_name

    broken = spec("{name}").replace("parallelism: 1", "parallelism: -3\n    nonsense: 1")
    files: dict[str, bytes] = {}
    for k in range(16):
        files[f"apps/ok-{k}.yaml"] = spec(f"ok-{k}").encode()
        files[f"apps/bad-{k}.yaml"] = broken.replace("{name}", f"bad-{k}").encode()
        files[f"apps/dup-{k}.yaml"] = (spec(f"dup-{k}") + "---\n" + spec(f"dup-{k}")).encode()
    files["apps/no-name.yaml"] = spec("x").replace("  name: x\n", "  name: 1234\n").encode()
    files["apps/bad-name.yaml"] = spec("x").replace("  name: x\n", "  name: Not_A_Name\n").encode()
    files["apps/not-yaml.yaml"] = b"a: [\n"
    files["apps/kind.yaml"] = spec("kind-x").replace("kind: FlinkApp", "kind: Other").encode()
    whole = load_files(files)
    for i in range(2):
        keep = Shard(i, 2).owns
        mine = load_files(files, keep=keep)
        assert mine.apps == {n: a for n, a in whole.apps.items() if keep(n)}
        assert [(str(e), e.app) for e in mine.errors] == [
            (str(e), e.app) for e in whole.errors if e.app is None or not valid_name(e.app) or keep(e.app)]
        assert {e.file for e in mine.errors} >= {"apps/no-name.yaml", "apps/bad-name.yaml", "apps/not-yaml.yaml"}
    other = next(k for k in range(16) if not Shard(0, 2).owns(f"bad-{k}"))
    assert load_file("b.yaml", files[f"apps/bad-{other}.yaml"], keep=Shard(0, 2).owns) == ([], [])
    assert len(whole.errors) > 16 and len(whole.apps) == 16
    assert load_file("b.yaml", files[f"apps/bad-{other}.yaml"])[1]  # validated, it has errors


def test_another_shards_file_is_skipped_unparsed_unless_one_of_ours_came_from_it() -> None:
    """A file whose lines name another shard's app is not parsed (a shard's start would otherwise parse
    every file of the repository): its YAML error is that shard's. Unless `parse` names it: the file one
    of our apps came from is always parsed, so its error reaches us."""
    from reconciler.spec.load import load_files

    theirs = next(f"their-{k}" for k in range(50) if not Shard(0, 2).owns(f"their-{k}"))
    files = {"apps/theirs.yaml": (spec(theirs) + "  broken: [\n").encode()}
    whole = load_files(files)
    assert [e.app for e in whole.errors] == ["apps/theirs.yaml"]  # no app can be named: every shard's
    assert load_files(files, keep=Shard(0, 2).owns).errors == ()
    assert [e.app for e in load_files(files, keep=Shard(0, 2).owns, parse={"apps/theirs.yaml"}).errors] == [
        "apps/theirs.yaml"]
    assert [e.app for e in load_files(files, keep=Shard(1, 2).owns).errors] == ["apps/theirs.yaml"]


def test_an_app_whose_file_now_names_another_shards_app_and_broke_is_not_deleted(
        repo: Repo, tmp_path: Path) -> None:
    """app-xx (shard 0) had apps/app-xx.yaml; an edit renames it to an app of shard 1 and breaks the YAML.
    Shard 0 must still parse that file (its app came from it): the broken file protects app-xx."""
    seed_records(repo, tmp_path)
    mine = next(n for n in NAMES if shard_of(n, 2) == 0)
    theirs = next(f"their-{k}" for k in range(50) if shard_of(f"their-{k}", 2) == 1)
    repo.write(f"apps/{mine}.yaml", spec(theirs) + "  broken: [\n")
    repo.commit("rename and break")
    shard0 = reconciler(repo, tmp_path, prune=True, shards=2, shard=0)
    plan = shard0.plan(shard0.source.head())
    assert actions(plan)[mine] is not Action.DELETE
    assert actions(plan)[f"apps/{mine}.yaml"] is Action.ERROR


def test_each_shard_reports_under_its_own_notes_ref(repo: Repo, tmp_path: Path) -> None:
    """Shards report their passes at the same moment; on one notes ref they would race and re-merge each
    other's lines. Each writes its apps' lines under `refs/notes/flink-reconciler-shard-<i>`; together
    they hold one line per app, and the unsharded ref stays empty."""
    head = reconciler(repo, tmp_path).source.head()
    for i in range(3):
        rec = reconciler(repo, tmp_path / f"shard-{i}", shards=3, shard=i, status_sink="notes")
        rec.sync(full=True, reason="startup")
        rec.shutdown(deadline_s=30)
    seen: dict[str, int] = {}
    for i in range(3):
        ref = f"refs/notes/flink-reconciler-shard-{i}"
        if not any(shard_of(name, 3) == i for name in NAMES):  # no app of its own: nothing to report
            assert git(repo.origin, "for-each-ref", ref) == ""
            continue
        for line in git(repo.origin, "notes", f"--ref={ref}", "show", head).splitlines():
            app = line.split(":")[0].removeprefix("flink-reconciler/")
            assert shard_of(app, 3) == i and app not in seen, line
            seen[app] = i
    assert sorted(seen) == NAMES
    assert git(repo.origin, "for-each-ref", "refs/notes/flink-reconciler") == ""
