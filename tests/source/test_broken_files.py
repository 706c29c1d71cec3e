"""Issue 13: a spec file that breaks (emptied, a symlink, a directory, unreadable) never plans a delete.

Each case starts from a real repository with three valid apps (victim, keep1, keep2) tagged A, breaks
apps/victim.yaml in one commit, and plans with pruning on three ways: the offline `plan` command, the
daemon's full load, and the daemon's incremental load (`LoadResult.update` from the revision it ran).
The victim must be an `error` naming its file; the other apps must not move.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.clock import FakeClock
from reconciler.core.plan import Action, Plan
from reconciler.service.factories import make_reconciler
from reconciler.settings import load_settings
from reconciler.spec.load import Unreadable
from tests.gitutil import Repo, git

APP = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata: {{name: {name}}}
spec: {{job: {{jarURI: "local:///x.jar"}}}}
"""
NAMES = ("victim", "keep1", "keep2")


def _write(path: Path, data: str | bytes) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def _symlink(path: Path) -> None:
    (path.parent / "v.txt").write_text(APP.format(name="victim"))
    path.unlink()
    os.symlink("v.txt", path)


def _outside_symlink(path: Path) -> None:
    path.unlink()
    os.symlink("/etc/hostname", path)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "README").write_text("now a directory\n")


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "empty": lambda p: _write(p, b""),
    "comments": lambda p: _write(p, "# nothing here any more\n"),
    "null": lambda p: _write(p, "~\n"),
    "separators": lambda p: _write(p, "---\n---\n"),
    "binary": lambda p: _write(p, bytes(range(256))),
    "broken-yaml": lambda p: _write(p, "metadata: {name: victim\n"),
    "name-with-newline": lambda p: _write(p, APP.format(name='"victim\\n"')),
    "symlink": _symlink,
    "symlink-outside": _outside_symlink,
    "directory": _directory,
}


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    (tmp_path / "repo").mkdir()
    r = Repo(tmp_path / "repo")
    for name in NAMES:
        r.write(f"apps/{name}.yaml", APP.format(name=name))
    r.commit("three apps")
    git(r.work, "tag", "A")
    git(r.work, "push", "-q", "origin", "A")
    return r


def _check(plan: Plan, baseline: Plan | None = None) -> None:
    """victim is an error without steps; keep1 and keep2 are planned as they are without the break."""
    actions = {a.app: a.action for a in plan.apps}
    assert Action.DELETE not in actions.values(), actions
    assert actions["victim"] is Action.ERROR and not plan.app("victim").steps
    assert "apps/victim.yaml" in plan.app("victim").reason
    for keep in ("keep1", "keep2"):
        want = baseline.app(keep) if baseline else None
        assert actions.get(keep, Action.NOOP) is (want.action if want else Action.NOOP)
        assert plan.app(keep).steps == (want.steps if want else ())


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_broken_file_is_an_error_never_a_delete(mutation: str, repo: Repo, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    MUTATIONS[mutation](repo.work / "apps/victim.yaml")
    head = repo.commit(f"break victim: {mutation}")

    # The offline preview (`plan --base A --head HEAD --prune`): exit 1, an error, no delete.
    code = main(["plan", "--repo", str(repo.origin), "--base", "A", "--head", "HEAD", "--prune", "--format",
                 "json", "--detailed-exitcode", "--cache-dir", str(tmp_path / "cache")])
    out, _ = capsys.readouterr()
    assert code == 1
    _check(Plan.from_json(out))

    # The daemon (dry run, prune on) that applied A: full load and incremental load agree.
    settings = load_settings({"repo_url": str(repo.origin), "state_dir": tmp_path / "state", "dry_run": True,
                              "prune": True, "status_sink": "none"})
    for incremental in (False, True):
        rec = make_reconciler(settings, FakeClock(), report=False)
        rec.source.fetch()
        a = rec.source.resolve("A")
        base = rec.load(a)
        for name, la in base.apps.items():  # A is what runs: its records say so
            rec.journal.record_adopted(name, a, la.app.canonical(), source_file=la.file)
        baseline = rec.plan(a)  # a dry run observes no clusters: the same "repair" with or without the break
        if not incremental:
            rec = make_reconciler(settings, FakeClock(), report=False)
            rec.source.fetch()
        _check(rec.plan(head), baseline)
        shutil.rmtree(tmp_path / "state")


def test_validate_refuses_symlinks_and_empty_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    apps = tmp_path / "apps"
    apps.mkdir()
    (tmp_path / "v.txt").write_text(APP.format(name="victim"))
    (apps / "victim.yaml").symlink_to(tmp_path / "v.txt")
    (apps / "keep.yaml").write_text(APP.format(name="keep"))
    (apps / "empty.yml").write_text("# only a comment\n")
    (apps / "sub").symlink_to(tmp_path, target_is_directory=True)  # never followed: it may hide specs
    (apps / "notes.md").symlink_to(tmp_path / "v.txt")  # not a spec, not a folder: ignored
    assert main(["validate", str(apps)]) == 1
    out, err = capsys.readouterr()
    assert "victim.yaml: is a symbolic link" in err and "empty.yml: holds no FlinkApp" in err
    assert "sub: is a symbolic link" in err and "notes.md" not in err
    assert "3 errors: 1 valid app(s) in 4 file(s)" in out
    assert main(["validate", str(apps / "victim.yaml")]) == 1
    assert "is a symbolic link" in capsys.readouterr().err


def test_a_new_file_with_broken_yaml_is_an_error_in_the_plan(repo: Repo, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    repo.write("apps/new.yaml", "metadata: {name: x\n")
    repo.write("apps/new\nline.yaml", APP.format(name="newline"))
    repo.commit("a broken new file and a path with a newline")
    code = main(["plan", "--repo", str(repo.origin), "--base", "A", "--head", "HEAD", "--detailed-exitcode",
                 "--cache-dir", str(tmp_path / "cache")])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "x apps/new.yaml: error" in out and "invalid YAML" in out
    assert "x apps/new\\nline.yaml: error" in out and "newline" in out
    assert "3 unchanged" in out

    # The daemon's incremental pass reads the newline path as an error of that file only.
    settings = load_settings({"repo_url": str(repo.origin), "state_dir": tmp_path / "state", "dry_run": True,
                              "prune": True, "status_sink": "none"})
    rec = make_reconciler(settings, FakeClock(), report=False)
    rec.source.fetch()
    rec.load(rec.source.resolve("A"))
    plan = rec.plan(rec.source.head())
    errors = {a.app: a.reason for a in plan.apps if a.action is Action.ERROR}
    assert set(errors) == {"apps/new.yaml", "apps/new\\nline.yaml"}
    assert "control character" in errors["apps/new\\nline.yaml"]
    assert {a.app for a in plan.apps if a.action is not Action.ERROR} == set(NAMES)


def test_validate_and_plan_follow_the_spec_policy(repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    repo.write("apps/host.yaml", APP.format(name="host").replace(
        "spec: {job:", "spec: {podTemplate: {spec: {hostNetwork: true}}, job:"))
    repo.commit("an app on the host network")
    args = ["plan", "--repo", str(repo.origin), "--base", "A", "--cache-dir", str(tmp_path / "cache")]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "x host: error" in out and "spec.podTemplate.spec.hostNetwork" in out and "restricted" in out
    assert main(["validate", str(repo.work / "apps")]) == 1
    assert "hostNetwork shares the node's namespace" in capsys.readouterr().err
    monkeypatch.setenv("FLINK_RECONCILER_SPEC_POLICY", "permissive")
    assert main(args) == 0 and "+ host: create" in capsys.readouterr().out
    assert main(["validate", str(repo.work / "apps")]) == 0
    monkeypatch.setenv("FLINK_RECONCILER_SPEC_POLICY", "lax")
    assert main(["validate", str(repo.work / "apps")]) == 1
    assert "must be restricted or permissive" in capsys.readouterr().err


def test_a_folder_of_specs_replaced_by_a_symlink_is_not_a_deletion(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    r = Repo(tmp_path / "repo")
    r.write("apps/keep.yaml", APP.format(name="keep"))
    r.write("apps/team/one.yaml", APP.format(name="one"))
    r.write("apps/team/two.yaml", APP.format(name="two"))
    r.write("shared/other.yaml", APP.format(name="other"))
    a = r.commit("apps")
    git(r.work, "rm", "-r", "-q", "apps/team")
    os.symlink("../shared", r.work / "apps/team")
    r.commit("team is now a link")
    settings = load_settings({"repo_url": str(r.origin), "state_dir": tmp_path / "state", "dry_run": True,
                              "prune": True, "status_sink": "none", "path": "apps"})
    rec = make_reconciler(settings, FakeClock(), report=False)
    rec.source.fetch()
    full = rec.source.read_tree("HEAD", "apps")
    assert full["apps/team"] == Unreadable(
        "is a symbolic link; symlinks are not followed, a spec must be a regular file")
    base = rec.load(a)
    changed = rec.source.changed_paths(a, "HEAD", "apps")
    update = rec.source.read_paths("HEAD", sorted(changed))
    assert update["apps/team/one.yaml"] == Unreadable(
        "is under 'apps/team', which is a symbolic link; symlinks are not followed")
    incremental = base.update(update)
    assert {"apps/team/one.yaml", "apps/team/two.yaml"} <= incremental.broken_files
    assert "one" not in incremental.apps and "keep" in incremental.apps


def test_hidden_files_and_folders_are_never_specs() -> None:
    from reconciler.source.specs import spec_paths

    paths = ["a.yaml", ".gitlab-ci.yml", ".github/workflows/ci.yaml", "apps/.hidden/x.yaml", "apps/.x.yaml",
             "apps/x.y/z.yaml", "apps/x./z.yaml", "apps/..yaml", "app.s/ok.yaml", "apps/not.hidden.yaml"]
    assert list(spec_paths(dict.fromkeys(paths, b""))) == ["a.yaml", "apps/x.y/z.yaml", "apps/x./z.yaml",
                                                           "app.s/ok.yaml", "apps/not.hidden.yaml"]
