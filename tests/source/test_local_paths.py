"""Where the Git cache and the state live: relative dirs, dirs that are files, one cache per repository.

Issue 13 items 3 and 9, issue 12 item 1; everything through the real command line on real repositories.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.source.git import cache_key
from tests.gitutil import Repo

APP = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata: {{name: {name}}}
spec: {{job: {{jarURI: "local:///x.jar"}}}}
"""


def _repo(root: Path, name: str) -> Repo:
    root.mkdir(parents=True)
    r = Repo(root)
    r.write(f"apps/{name}.yaml", APP.format(name=name))
    r.commit(f"add {name}")
    return r


def test_default_and_relative_state_dirs_work_from_another_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    r = _repo(tmp_path / "repo", "a")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("FLINK_RECONCILER_STATE_DIR", raising=False)
    assert main(["apply", "--repo", str(r.work), "--path", "apps", "--dry-run"]) == 0
    assert (elsewhere / ".state" / "git" / "repo.git" / "HEAD").exists()
    assert main(["apply", "--repo", str(r.work), "--path", "apps", "--dry-run", "--state-dir", "rel/state"]) == 0
    assert (elsewhere / "rel" / "state" / "git" / "repo.git" / "HEAD").exists()
    assert main(["plan", "--repo", str(r.work), "--path", "apps", "--cache-dir", "rel/cache"]) == 0
    assert "1 app: 1 create" in capsys.readouterr().out


def test_a_state_dir_that_is_a_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = _repo(tmp_path / "repo", "a")
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    for state in (afile, afile / "below"):
        assert main(["apply", "--repo", str(r.work), "--dry-run", "--state-dir", str(state)]) == 1
        err = capsys.readouterr().err
        assert f"{afile} is not a directory" in err and "Traceback" not in err
    assert main(["plan", "--repo", str(r.work), "--cache-dir", str(afile / "cache")]) == 1
    assert "cannot create the git cache" in capsys.readouterr().err


def test_two_checkouts_planned_as_dot_do_not_share_a_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    one, two = _repo(tmp_path / "one", "first"), _repo(tmp_path / "two", "second")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    caplog.set_level(logging.WARNING)
    monkeypatch.chdir(one.work)
    assert main(["plan", "--repo", "."]) == 0
    assert "+ first: create" in capsys.readouterr().out
    monkeypatch.chdir(two.work)
    assert main(["plan", "--repo", "."]) == 0
    out = capsys.readouterr().out
    assert "+ second: create" in out and "first" not in out
    assert "rewritten" not in caplog.text
    assert len(list((tmp_path / "xdg" / "flink-reconciler" / "git").iterdir())) == 2


def test_cache_key_names_the_repository_not_the_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "r")
    monkeypatch.chdir(tmp_path / "r")
    same = {cache_key("."), cache_key(str(tmp_path / "r")), cache_key(str(tmp_path / "link")),
            cache_key(f"file://{tmp_path}/r"), cache_key("../r/")}
    assert len(same) == 1
    monkeypatch.chdir(tmp_path)
    assert cache_key(".") not in same
    remote = {cache_key("https://GitHub.com/o/r.git"), cache_key("https://ghp_T0KEN@github.com/o/r"),
              cache_key("https://user:pw@github.com/o/r/")}
    assert len(remote) == 1
    assert cache_key("https://github.com/o/other") not in remote
    assert cache_key("git@github.com:o/r.git") == cache_key("git@GitHub.com:o/r")
