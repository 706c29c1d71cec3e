"""`status`, `record show` and `record rebuild` with one broken record and one corrupt cluster file among
healthy apps: real record files, a real Git repository, the local runtime with files written by hand (no JVM)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from reconciler.apply.journal import Journal
from reconciler.cli import main
from reconciler.clock import SystemClock
from reconciler.spec.load import load_files
from tests.gitutil import Repo, spec


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def world(tmp_path: Path) -> tuple[Repo, Path]:
    """Apps a, b and victim, all applied. victim's record is truncated; b's cluster.json is corrupt; victim has a
    savepoint in its directory (as a stop-with-savepoint leaves it)."""
    repo = Repo(tmp_path)
    for name in ("a", "b", "victim"):
        repo.write(f"apps/{name}.yaml", spec(name))
    rev = repo.commit("three apps")
    state = tmp_path / "state"
    journal = Journal(state / "journal", SystemClock())
    for name in ("a", "b", "victim"):
        applied = load_files({f"apps/{name}.yaml": spec(name).encode()}).apps[name].app.canonical()
        journal.record_adopted(name, rev, applied, source_file=f"apps/{name}.yaml")
    victim = state / "records" / "victim.json"
    victim.write_bytes(victim.read_bytes()[:100])
    (state / "clusters" / "b").mkdir(parents=True)
    (state / "clusters" / "b" / "cluster.json").write_text('{"app": "b", "cluster_id": "b-0123456789ab", "rest_po')
    sp = state / "savepoints" / "victim" / "savepoint-abcdef-0123456789ab"
    sp.mkdir(parents=True)
    (sp / "_metadata").write_bytes(b"metadata")
    return repo, state


def test_status_lists_every_app_with_the_broken_ones_blocked(world: tuple[Repo, Path]) -> None:
    _, state = world
    code, out, err = _run("status", "--state-dir", str(state), "--runtime", "local")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["APP", "APPLIED", "JOB", "STATE", "LAST", "SAVEPOINT", "OUTCOME"]
    rows = {line.split()[0]: line.split() for line in lines[1:4]}
    assert set(rows) == {"a", "b", "victim"}
    assert rows["victim"][-1] == "blocked" and rows["b"][-1] == "blocked" and rows["a"][-1] == "success"
    assert "victim: " in out and "`flink-reconciler record rebuild victim`" in out
    assert "b: cannot read" in out and "clusters/b/cluster.json" in out and "pgrep -af" in out
    code, out, _ = _run("status", "--state-dir", str(state), "--runtime", "local", "--output", "json")
    by_app = {r["app"]: r for r in json.loads(out)}
    assert by_app["victim"]["outcome"] == "blocked" and "not a readable flink-reconciler record" in by_app[
        "victim"]["message"]
    assert by_app["b"]["state"] == "unknown" and by_app["a"]["outcome"] == "success"


def test_record_show_prints_a_record_or_exactly_what_is_wrong(world: tuple[Repo, Path]) -> None:
    _, state = world
    code, out, err = _run("record", "show", "a", "--state-dir", str(state))
    assert code == 0 and json.loads(out)["app"] == "a" and json.loads(out)["kind"] == "FlinkReconcilerRecord"
    code, out, err = _run("record", "show", "victim", "--state-dir", str(state))
    assert code == 1 and out == ""
    assert err.startswith(f"error: {state / 'records' / 'victim.json'}: not a readable flink-reconciler record (")
    assert "`flink-reconciler record rebuild victim`" in err
    code, _, err = _run("record", "show", "nobody", "--state-dir", str(state))
    assert code == 1 and "there is no record of app 'nobody'" in err


def test_record_show_of_a_newer_version_prints_it_and_says_to_upgrade(world: tuple[Repo, Path]) -> None:
    _, state = world
    path = state / "records" / "a.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 99}))
    before = path.read_bytes()
    code, out, err = _run("record", "show", "a", "--state-dir", str(state))
    assert code == 1 and json.loads(out)["version"] == 99
    assert "written by a newer flink-reconciler (record version 99" in err
    code, _, err = _run("record", "rebuild", "a", "--state-dir", str(state))
    assert code == 1 and "upgrade this flink-reconciler instead" in err
    assert path.read_bytes() == before


def test_record_rebuild_moves_the_broken_record_aside_and_the_app_is_adopted_from_its_savepoint(
        world: tuple[Repo, Path]) -> None:
    repo, state = world
    victim = state / "records" / "victim.json"
    broken = victim.read_bytes()
    code, _, err = _run("record", "rebuild", "a", "--state-dir", str(state))
    assert code == 1 and "is readable" in err and "--force" in err  # a healthy record is not rebuilt
    assert (state / "records" / "a.json").exists()

    code, out, err = _run("record", "rebuild", "victim", "--state-dir", str(state), "--runtime", "local",
                          "--repo", str(repo.origin), "--path", "apps")
    assert code == 0, err
    aside = [p for p in victim.parent.iterdir() if p.name.startswith("victim.json.broken-")]
    assert len(aside) == 1 and aside[0].read_bytes() == broken and not victim.exists()  # moved, never lost
    assert f"moved the record of app victim aside, to {aside[0]}" in out
    assert "next pass: create: " in out and "savepoint-abcdef-0123456789ab" in out, out
    assert "empty state" not in out.split("next pass:")[1]
    code, out, _ = _run("status", "--state-dir", str(state), "--runtime", "local")
    assert code == 0 and "record rebuild victim" not in out  # no longer blocked for its record
