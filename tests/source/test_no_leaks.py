"""Secrets of the reconciler stay in the reconciler: Flink JVMs (which run job code) never inherit them,
and a spec cannot write keys of its own into a generated config.yaml (issue 13 items 2 and 7)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError
from ruamel.yaml import YAML

from reconciler.clock import FakeClock
from reconciler.errors import ReconcilerError
from reconciler.live.kubernetes.render import config_yaml
from reconciler.live.local.config import flink_environment, render_yaml
from reconciler.live.local.runtime import LocalRuntime
from reconciler.service.factories import make_reconciler
from reconciler.settings import load_settings
from tests.fixtures.flink import counter_app

SECRETS = {
    "FLINK_RECONCILER_GIT_TOKEN": "ghp_git-T0KEN",
    "FLINK_RECONCILER_GITHUB_WEBHOOK_SECRET": "hook-s3cret",
    "FLINK_RECONCILER_FORGE_TOKEN": "forge-T0KEN",
    "AWS_SECRET_ACCESS_KEY": "aws-s3cret",
    "GITHUB_TOKEN": "gh-T0KEN",
}


def test_flink_environment_keeps_what_java_needs_and_drops_the_rest() -> None:
    environ = {**SECRETS, "PATH": "/usr/bin", "HOME": "/home/r", "LANG": "C.UTF-8", "LC_ALL": "C",
               "JAVA_HOME": "/opt/java", "TZ": "UTC", "HADOOP_CONF_DIR": "/etc/hadoop"}
    kept = flink_environment(environ)
    assert kept == {k: v for k, v in environ.items() if k not in SECRETS}


@pytest.mark.parametrize("write", [config_yaml, render_yaml])
def test_generated_config_yaml_cannot_be_injected(write: Callable[[dict[str, str]], str]) -> None:
    # Keys are Flink option keys (the loader refuses others: tests/core/test_load.py); values are quoted.
    conf = {"a.b-c_D": 'x"\nrest.port: 1', "b": "line\nbreak", "c": "on", "d": "{x: 1}", "e": "# no"}
    assert YAML(typ="safe").load(write(conf)) == conf
    with pytest.raises(ValidationError, match="not a Flink option key"):
        counter_app("x", flink_configuration={'zz: "1"\nkubernetes.cluster-id': "other-app"})


def test_the_local_config_quotes_keys_too() -> None:
    conf = {'zz: "1"\nkubernetes.cluster-id': "other-app"}
    assert YAML(typ="safe").load(render_yaml(conf)) == conf


@pytest.mark.flink
def test_local_jvms_do_not_inherit_the_reconcilers_secrets(
        local_runtime_factory: Callable[[Path], LocalRuntime], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    rt = local_runtime_factory(tmp_path / "state")
    rt.ensure_cluster(counter_app("envcheck"), deadline=time.monotonic() + 120)
    rec = rt.read_record("envcheck")
    assert rec is not None
    for proc in (rec.jobmanager, *rec.taskmanagers):
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        names = {e.partition(b"=")[0].decode() for e in environ if e}
        assert "FLINK_CONF_DIR" in names and "PATH" in names
        assert not names & set(SECRETS), proc.name
    rt.delete_cluster("envcheck", deadline=time.monotonic() + 60)


def test_a_token_in_the_repo_url_never_reaches_readiness_logs_or_git_config(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token = "ghp_d4emon-T0KEN"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed: every fetch fails
    settings = load_settings({"repo_url": f"https://{token}@127.0.0.1:{port}/repo.git", "dry_run": True,
                              "state_dir": tmp_path / "state", "status_sink": "none"})
    rec = make_reconciler(settings, FakeClock(), report=False)
    with pytest.raises(ReconcilerError) as failed:
        rec.sync(full=True, reason="test")
    ready, why = rec.readiness()
    assert not ready and f"127.0.0.1:{port}/repo.git" in why
    config = (tmp_path / "state" / "git" / "repo.git" / "config").read_text()
    for text in (str(failed.value), why, caplog.text, config, repr(settings), str(settings.redacted())):
        assert token not in text
