"""`flink-reconciler render` from spec files (PATH, a file, stdin) as well as from a Git revision."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.cli import main
from tests.gitutil import Repo, spec

IMAGE_JAR = "jarURI: local:///opt/flink/usrlib/x.jar"


def k8s_spec(name: str, **kw: Any) -> str:
    """A stateful app Kubernetes can run: a jar in the image, state and HA on durable storage."""
    durable = f"""\
  flinkConfiguration:
    execution.checkpointing.savepoint-dir: s3://bucket/savepoints/{name}
    execution.checkpointing.dir: s3://bucket/checkpoints/{name}
  highAvailability:
    enabled: true
    storageDir: s3://bucket/ha/{name}
"""
    return spec(name, extra=durable, **kw).replace("jarURI: jobs/counter.jar", IMAGE_JAR)


def app_objects(app: str) -> list[tuple[str, str]]:
    return [("ConfigMap", f"{app}-root"), ("ServiceAccount", f"{app}-flink"), ("Role", f"{app}-flink"),
            ("RoleBinding", f"{app}-flink"), ("ConfigMap", f"{app}-config"), ("Service", f"{app}-jobmanager"),
            ("Service", f"{app}-rest"), ("Deployment", f"{app}-taskmanager"), ("Deployment", f"{app}-jobmanager")]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def objects(out: str) -> list[tuple[str, str]]:
    return [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out) if d]


def render_stdin(data: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler.cli", "render", "-", *args], input=data,
                          capture_output=True, text=True, check=False, timeout=60)


def test_render_a_directory_of_specs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "apps" / "team").mkdir(parents=True)
    (tmp_path / "apps" / "orders.yaml").write_text(k8s_spec("orders"))
    (tmp_path / "apps" / "team" / "clicks.yaml").write_text(k8s_spec("clicks", parallelism=2))
    (tmp_path / "apps" / "README.md").write_text("not a spec\n")
    code, out, err = run(capsys, "render", str(tmp_path / "apps"))
    assert (code, err) == (0, "")
    assert f"# app orders ({tmp_path}/apps/orders.yaml)\n" in out
    assert f"# app clicks ({tmp_path}/apps/team/clicks.yaml)\n" in out
    assert objects(out) == app_objects("clicks") + app_objects("orders")
    stamps = {d["metadata"]["annotations"]["flink-reconciler.io/revision"] for d in yaml.safe_load_all(out)}
    assert stamps == {"unversioned"}


def test_render_one_file_and_only_the_apps_asked_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "both.yaml"
    f.write_text(k8s_spec("a") + "---\n" + k8s_spec("b"))
    code, out, _ = run(capsys, "render", str(f), "--app", "b")
    assert code == 0
    assert objects(out) == app_objects("b")
    code, out, err = run(capsys, "render", str(f), "--app", "b", "--app", "nope")
    assert code == 1 and "error: no app or session cluster named 'nope'" in err
    assert "b-jobmanager" in out


def test_render_names_the_file_of_each_error_and_renders_the_rest(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ok.yaml").write_text(k8s_spec("ok"))
    (tmp_path / "typo.yaml").write_text(k8s_spec("typo").replace("parallelism:", "paralelism:"))
    (tmp_path / "repo-jar.yaml").write_text(k8s_spec("repo-jar").replace(IMAGE_JAR, "jarURI: jobs/counter.jar"))
    code, out, err = run(capsys, "render", str(tmp_path))
    assert code == 1
    assert f"{tmp_path}/typo.yaml:10:5 spec.job.paralelism: unknown field 'paralelism'" in err
    assert f"error: {tmp_path}/repo-jar.yaml: app repo-jar spec.job.jarURI: jarURI 'jobs/counter.jar' cannot be " \
           "used on Kubernetes" in err
    assert objects(out) == app_objects("ok")


def test_render_from_stdin(tmp_path: Path) -> None:
    res = render_stdin(k8s_spec("piped"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("# app piped (<stdin>)\n")
    assert ("Deployment", "piped-jobmanager") in objects(res.stdout)


def test_render_from_stdin_names_stdin_in_errors() -> None:
    res = render_stdin(k8s_spec("piped").replace("upgradeMode: savepoint", "upgradeMode: safe"))
    assert res.returncode == 1
    assert res.stderr.startswith("<stdin>:11:5 spec.job.upgradeMode: Input should be")
    assert res.stdout == ""
    res = render_stdin("apiVersion: [unclosed\n")
    assert res.returncode == 1 and res.stderr.startswith("<stdin>:2:1: invalid YAML")


@pytest.mark.parametrize(("args", "message"), [
    (("render",), "error: render needs PATH (a spec file, a directory of specs, or - for stdin) or --repo"),
    (("render", "apps", "--repo", "."), "error: render: give PATH or --repo"),
    (("render", "apps", "--rev", "HEAD~1"), "error: render: give PATH or --repo"),
    (("render", "nowhere"), "error: nowhere: no such file or directory"),
])
def test_render_usage_errors(args: tuple[str, ...], message: str, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "a.yaml").write_text(k8s_spec("a"))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *args)
    assert (code, out) == (1, "")
    assert err.startswith(message)


def test_render_an_empty_directory_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "render", str(tmp_path))
    assert code == 1 and f"error: {tmp_path}: no spec files (*.yaml, *.yml)" in err


def test_render_repo_at_a_revision_still_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = Repo(tmp_path)
    r.write("apps/a.yaml", k8s_spec("a"))
    first = r.commit("a")
    r.write("apps/b.yaml", k8s_spec("b"))
    r.commit("b")
    code, out, err = run(capsys, "render", "--repo", str(r.origin), "--rev", first, "--path", "apps",
                         "--cache-dir", str(tmp_path / "cache"))
    assert (code, err) == (0, "")
    assert out.startswith(f"# app a (apps/a.yaml) at {first[:12]}\n")
    assert "b-root" not in out
    stamps = {d["metadata"]["annotations"]["flink-reconciler.io/revision"] for d in yaml.safe_load_all(out)}
    assert stamps == {first}
