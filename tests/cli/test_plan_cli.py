"""`flink-reconciler plan` on a real Git repo: exactly the actions of the commit, in every format."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.core.plan import Plan
from tests.gitutil import Repo, spec


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Repo, str, str]:
    r = Repo(tmp_path)
    r.write("apps/orders.yaml", spec("orders"))
    r.write("apps/clicks.yaml", spec("clicks", mode="last-state"))
    r.write("apps/legacy.yaml", spec("legacy"))
    r.write("README.md", "not a spec\n")
    a = r.commit("initial apps")
    r.write("apps/orders.yaml", spec("orders", parallelism=2))
    r.write("apps/fraud.yaml", spec("fraud"))
    r.remove("apps/legacy.yaml")
    b = r.commit("orders p=2, add fraud, drop legacy")
    return r, a, b


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_lists_exactly_the_commits_actions(repo: tuple[Repo, str, str], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    r, a, b = repo
    code, out, _ = run(capsys, "plan", "--repo", str(r.origin), "--base", a, "--head", b, "--format", "json",
                       "--prune", "--detailed-exitcode", "--cache-dir", str(tmp_path / "cache"))
    assert code == 2
    plan = Plan.from_json(out)
    assert (plan.revision, plan.base_revision, plan.mode) == (b, a, "offline")
    actions = {p.app: p.action.value for p in plan.apps}
    assert actions == {"orders": "upgrade", "fraud": "create", "legacy": "delete", "clicks": "no-op"}
    steps = {p.app: [s.type for s in p.steps] for p in plan.apps}
    assert steps["orders"] == ["StopWithSavepoint", "EnsureCluster", "StartJob", "AwaitRunning"]
    assert steps["fraud"] == ["EnsureCluster", "StartJob", "AwaitRunning"]
    assert steps["legacy"] == ["StopWithSavepoint", "DeleteCluster"]
    orders = plan.app("orders")
    assert [(c.path, c.old, c.new) for c in orders.diff] == [("/spec/job/parallelism", 1, 2)]
    assert orders.source_file == "apps/orders.yaml"


def test_plan_markdown_is_a_pr_comment(repo: tuple[Repo, str, str], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    r, a, b = repo
    code, out, _ = run(capsys, "plan", "--repo", str(r.work), "--base", a, "--head", b, "--format", "markdown",
                       "--prune", "--cache-dir", str(tmp_path / "cache"))
    assert code == 0
    assert "**4 apps: 1 delete, 1 upgrade (savepoint), 1 create, 1 unchanged**" in out
    assert "> - **`legacy`: DELETES APP legacy: spec removed from Git**" in out
    assert out.count("<details>") == 3  # unchanged apps are listed, not expanded
    assert "```diff\n- /spec/job/parallelism: 1\n+ /spec/job/parallelism: 2  (upgrade)\n```" in out
    assert "1. stop the running job with a savepoint" in out
    assert "Unchanged: `clicks`" in out


def test_plan_without_prune_keeps_removed_apps(repo: tuple[Repo, str, str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    r, a, b = repo
    code, out, _ = run(capsys, "plan", "--repo", str(r.origin), "--base", a, "--head", b,
                       "--cache-dir", str(tmp_path / "cache"), "--color", "never")
    assert code == 0
    assert "= legacy: no-op" in out and "pruning is disabled" in out
    assert "\x1b[" not in out


def test_plan_with_a_broken_spec_exits_1_and_names_the_line(repo: tuple[Repo, str, str], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    r, _, b = repo
    r.write("apps/orders.yaml", spec("orders", parallelism=2).replace("parallelism:", "paralelism:"))
    c = r.commit("typo")
    code, out, _ = run(capsys, "plan", "--repo", str(r.origin), "--base", b, "--head", c, "--prune",
                       "--format", "json", "--cache-dir", str(tmp_path / "cache"))
    assert code == 1
    orders = Plan.from_json(out).app("orders")
    assert orders.action.value == "error" and orders.steps == ()
    assert "apps/orders.yaml:10:5 spec.job.paralelism: unknown field 'paralelism' (did you mean 'parallelism'?)" \
        in orders.reason


def test_plan_out_file_round_trips(repo: tuple[Repo, str, str], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    r, a, b = repo
    out_file = tmp_path / "plan.json"
    run(capsys, "plan", "--repo", str(r.origin), "--base", a, "--head", b, "--out", str(out_file),
        "--cache-dir", str(tmp_path / "cache"))
    saved = Plan.from_json(out_file.read_text())
    assert saved.to_json() == out_file.read_text()
    assert json.loads(out_file.read_text())["format_version"] == 1


def test_validate_examples_and_a_broken_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = Path(__file__).parents[2] / "examples-repo"
    code, out, _ = run(capsys, "validate", str(examples))
    assert code == 0 and out.strip() == "ok: 7 valid app(s) and 1 session cluster(s) in 8 file(s)"
    broken = tmp_path / "broken"
    (broken / "apps").mkdir(parents=True)
    text = (examples / "apps" / "orders.yaml").read_text().replace("upgradeMode: savepoint", "upgradeMode: safe")
    (broken / "apps" / "orders.yaml").write_text(text)
    (broken / "apps" / "clicks.yaml").write_text((examples / "apps" / "clicks.yaml").read_text())
    code, out, err = run(capsys, "validate", str(broken))
    assert code == 1
    assert f"{broken}/apps/orders.yaml:22:5 spec.job.upgradeMode: Input should be" in err
    assert out.strip() == "1 error: 1 valid app(s) in 2 file(s)"


def test_a_jar_path_that_leaves_the_repository_is_refused_by_validate_and_plan(
        repo: tuple[Repo, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r, _, b = repo
    r.write("apps/orders.yaml", spec("orders", parallelism=2).replace("jobs/counter.jar", "jobs/../../../x.jar"))
    r.write("apps/fraud.yaml", spec("fraud").replace("jobs/counter.jar", "../../../../etc/passwd"))
    r.write("apps/clicks.yaml", spec("clicks", mode="last-state").replace("jobs/counter.jar", "jobs/./counter.jar"))
    c = r.commit("jars out of the repository")
    code, out, err = run(capsys, "validate", str(r.work / "apps"))
    assert code == 1
    assert err.splitlines() == [
        f"{r.work}/apps/fraud.yaml:9:5 spec.job.jarURI: '../../../../etc/passwd' leaves the repository: a relative "
        "jarURI is a path inside the repository, and '..' here goes above its root",
        f"{r.work}/apps/orders.yaml:9:5 spec.job.jarURI: 'jobs/../../../x.jar' leaves the repository: a relative "
        "jarURI is a path inside the repository, and '..' here goes above its root"]
    assert out.strip() == "2 errors: 1 valid app(s) in 3 file(s)"
    code, out, _ = run(capsys, "plan", "--repo", str(r.origin), "--base", b, "--head", c, "--format", "json",
                       "--cache-dir", str(tmp_path / "cache"))
    plan = Plan.from_json(out)
    assert code == 1
    assert {p.app: p.action.value for p in plan.apps} == {"orders": "error", "fraud": "error", "clicks": "no-op"}
    assert "leaves the repository" in plan.app("orders").reason and not plan.app("orders").steps
    # `jobs/./counter.jar` is the jar it ran: a spelling, not a change


def test_schema_in_repo_is_in_sync(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schema")
    checked_in = (Path(__file__).parents[2] / "schemas" / "flinkapp.schema.json").read_text()
    assert code == 0
    assert out == checked_in, "schemas/flinkapp.schema.json is stale: run `flink-reconciler schema --out " \
                              "schemas/flinkapp.schema.json`"
    schema = json.loads(out)
    job = schema["$defs"]["JobSpec"]["properties"]
    assert job["parallelism"]["x-change-class"] == "upgrade" and "jarURI" in job


def test_spec_reference_in_docs_is_in_sync(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schema", "--reference")
    assert code == 0
    assert out == (Path(__file__).parents[2] / "docs" / "spec.md").read_text(), \
        "docs/spec.md is stale: run `flink-reconciler schema --reference --out docs/spec.md`"
    assert "| `spec.taskManager.replicas` | `1` | scale |" in out


def test_render_prints_manifests_and_names_apps_that_cannot_run_on_kubernetes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = Repo(tmp_path)
    # stateless: a stateful app would also need durable state storage and HA on Kubernetes (kubernetes.storage)
    r.write("apps/ok.yaml", spec("ok", mode="stateless").replace("jarURI: jobs/counter.jar",
                                                                 "jarURI: local:///opt/flink/usrlib/x.jar"))
    r.write("apps/repo-jar.yaml", spec("repo-jar", mode="stateless"))
    r.commit("two apps")
    code, out, err = run(capsys, "render", "--repo", str(r.origin), "--path", "apps",
                         "--cache-dir", str(tmp_path / "cache"))
    assert code == 1
    assert "error: apps/repo-jar.yaml: app repo-jar spec.job.jarURI" in err
    assert "name: ok-jobmanager" in out and "kind: Deployment" in out and "repo-jar" not in out


def test_apply_dry_run_names_the_apps_it_would_change(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`apply --dry-run` executes nothing: it says so and names each app its plan changes, as `plan` does."""
    for k in [k for k in os.environ if k.startswith("FLINK_RECONCILER_")]:
        monkeypatch.delenv(k)
    r = Repo(tmp_path)
    for name in ("orders", "clicks", "payments"):
        r.write(f"apps/{name}.yaml", spec(name))
    r.commit("three apps")
    code, out, _ = run(capsys, "apply", "--repo", str(r.origin), "--path", "apps", "--state-dir",
                       str(tmp_path / "state"), "--dry-run")
    assert code == 0
    assert "3 apps: 3 create\ndry run, nothing executed:\n" in out
    for name in ("clicks", "orders", "payments"):
        assert f"  + {name}: create  apps/{name}.yaml\n" in out
