"""`flink-reconciler import`: files, directories, stdin, comments, the report, exit codes, hostile YAML."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli import main

EXAMPLES = Path(__file__).parents[1] / "core" / "operator_examples"
ROOT = Path(__file__).parents[2]

DURABLE = """\
apiVersion: flink.apache.org/v1beta1
kind: FlinkDeployment
metadata:
  name: orders
  namespace: shop
spec:
  image: registry.example/orders:7
  flinkVersion: v2_2
  serviceAccount: flink
  flinkConfiguration:
    taskmanager.numberOfTaskSlots: "2"
    state.savepoints.dir: s3://flink/savepoints/orders
    state.checkpoints.dir: s3://flink/checkpoints/orders
    high-availability:
      type: kubernetes
      storageDir: s3://flink/ha/orders
    kubernetes.operator.savepoint.history.max.count: "3"
  jobManager:
    resource: {memory: 2048m, cpu: 1}
  taskManager:
    resources:
      requests: {memory: 4Gi, cpu: "2"}
  job:
    jarURI: local:///opt/flink/usrlib/orders.jar
    entryClass: com.example.Orders
    args: ["--window", "5m"]
    parallelism: 4
    upgradeMode: savepoint
"""


def run(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    old = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), io.StringIO(), io.StringIO()
    try:
        code = main(list(argv))
        return code, sys.stdout.getvalue(), sys.stderr.getvalue()
    finally:
        sys.stdin, sys.stdout, sys.stderr = old


def test_a_durable_deployment_imports_validates_and_is_commented(tmp_path: Path) -> None:
    src = tmp_path / "orders.yaml"
    src.write_text(DURABLE)
    code, out, err = run("import", str(src), "--out", str(tmp_path / "apps"))
    assert code == 0, out + err
    assert "FlinkDeployment orders: imported, runs the same" in out
    written = (tmp_path / "apps" / "orders.yaml").read_text()
    assert "from spec.flinkConfiguration.state.savepoints.dir (the Flink 1.x name of " \
           "execution.checkpointing.savepoint-dir)" in written
    assert "retain: 3  # from spec.flinkConfiguration.kubernetes.operator.savepoint.history.max.count" in written
    assert "memory: 4g # from spec.taskManager.resources.requests.memory" in written.replace("  #", " #")
    code, out, err = run("validate", "--runtime", "kubernetes", str(tmp_path / "apps"))
    assert code == 0, out + err


def test_examples_directory_report_and_exit_code(tmp_path: Path) -> None:
    code, out, _ = run("import", "--namespace", "flink", str(EXAMPLES), "--out", str(tmp_path / "apps"),
                       "--output", "json")
    assert code == 1
    report = json.loads(out)
    by_name = {d["name"]: d for d in report["documents"]}
    assert by_name["basic-example"]["runsTheSame"] is True
    # hostPath volumes are not durable storage: the stateful examples import, with the fields to fix
    ha = by_name["basic-checkpoint-ha-example"]
    assert ha["imported"] and not ha["runsTheSame"]
    assert {f["field"] for f in ha["findings"] if f["changesBehaviour"]} == {
        "spec.flinkConfiguration.execution.checkpointing.savepoint-dir",
        "spec.flinkConfiguration.execution.checkpointing.dir", "spec.highAvailability.storageDir"}
    # the session examples of both files are read together: the job-only file's cluster is in the other one
    assert by_name["basic-session-job-only-example"]["runsTheSame"] is True
    assert by_name["example-savepoint"]["imported"] is False  # a FlinkStateSnapshot
    written = sorted(p.name for p in (tmp_path / "apps").iterdir())
    assert "basic-example.yaml" in written and "basic-session-job-example.yaml" in written
    # what runs the same also validates for Kubernetes, as one repository
    same = [Path(d["written"]) for d in report["documents"] if d["runsTheSame"]]
    assert len(same) == 6  # basic.yaml and the five session documents
    (tmp_path / "repo").mkdir()
    for p in same:
        shutil.copy(p, tmp_path / "repo" / p.name)
    code, out, err = run("validate", "--runtime", "kubernetes", str(tmp_path / "repo"))
    assert code == 0, out + err
    assert "ok: 4 valid app(s) and 2 session cluster(s) in 6 file(s)" in out


def test_stdin_to_stdout_with_a_list(tmp_path: Path) -> None:
    body = "apiVersion: v1\nkind: List\nitems:\n" + "".join(
        "- " + line + "\n" if i == 0 else "  " + line + "\n" for i, line in enumerate(DURABLE.splitlines()))
    code, out, err = run("import", "-", stdin=body)
    assert code == 0, err
    assert out.startswith("---\n# Imported by `flink-reconciler import` from FlinkDeployment shop/orders (-).")
    assert "1 of 1 document(s) imported to run the same" in err


def test_existing_files_are_not_overwritten_without_force(tmp_path: Path) -> None:
    (tmp_path / "src.yaml").write_text(DURABLE)
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "orders.yaml").write_text("mine\n")
    code, out, _ = run("import", str(tmp_path / "src.yaml"), "--out", str(tmp_path / "apps"))
    assert code == 1 and "exists: not overwritten" in out
    assert (tmp_path / "apps" / "orders.yaml").read_text() == "mine\n"
    code, _, _ = run("import", str(tmp_path / "src.yaml"), "--out", str(tmp_path / "apps"), "--force")
    assert code == 0 and "kind: FlinkApp" in (tmp_path / "apps" / "orders.yaml").read_text()


def test_duplicate_names_are_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(DURABLE + "---\n" + DURABLE.replace("namespace: shop", "namespace: other"))
    code, out, _ = run("import", str(tmp_path / "a.yaml"), "--out", str(tmp_path / "apps"))
    assert code == 1 and "was imported already" in out


def test_benign_anchors_are_resolved(tmp_path: Path) -> None:
    text = DURABLE.replace("resource: {memory: 2048m, cpu: 1}", "resource: &res {memory: 2048m, cpu: 1}") \
        .replace("  taskManager:\n    resources:\n      requests: {memory: 4Gi, cpu: \"2\"}",
                 "  taskManager:\n    resource: *res")
    (tmp_path / "a.yaml").write_text(text)
    code, out, err = run("import", str(tmp_path / "a.yaml"))
    assert code == 0, err
    assert out.count("memory: 2g") == 2


@pytest.mark.parametrize(("text", "expected"), [
    ("a: &a [&b [x, x, x, x, x, x, x, x, x]]\n"
     + "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "*a"] * 10) + "]\n" for i in range(7)),
     "alias bomb"),
    ("a: &a\n  b: *a\n", "contains itself"),
    ("kind: FlinkDeployment\nspec: [unclosed\n", ":3:1: not valid YAML"),
    ("kind: FlinkDeployment\n\tspec: {}\n", "not valid YAML"),
])
def test_hostile_yaml_gives_a_clear_error(tmp_path: Path, text: str, expected: str) -> None:
    src = tmp_path / "bad.yaml"
    src.write_text(text)
    code, _, err = run("import", str(src))
    assert code == 1
    assert expected in err and "Traceback" not in err
    assert str(src) in err


def test_missing_source() -> None:
    code, _, err = run("import", "/nonexistent/x.yaml")
    assert code == 1 and "no such file or directory" in err


HOSTILE_SESSION_JOBS = """\
apiVersion: flink.apache.org/v1beta1
kind: FlinkSessionJob
metadata: {name: no-target}
spec:
  job: {jarURI: "https://repo.example/a.jar"}
---
apiVersion: flink.apache.org/v1beta1
kind: FlinkSessionJob
metadata: {name: no-job}
spec: {deploymentName: shared}
"""


def test_no_traceback_from_the_real_command(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(HOSTILE_SESSION_JOBS)
    p = subprocess.run([sys.executable, "-m", "reconciler.cli", "import", str(tmp_path / "s.yaml")],
                       check=False, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr and p.stdout == ""
    assert f"{tmp_path / 's.yaml'}: FlinkSessionJob no-target: NOT IMPORTED\n  ! spec.deploymentName: missing: a " \
           "FlinkSessionJob names the session FlinkDeployment it runs on\n" in p.stderr
    assert f"{tmp_path / 's.yaml'}: FlinkSessionJob no-job: NOT IMPORTED\n  ! spec.job: missing: a FlinkSessionJob " \
           "without a job has nothing to run\n" in p.stderr
    assert "0 of 2 document(s) imported to run the same" in p.stderr


def git_repo(path: Path) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=30)
    return path


def commit(repo: Path) -> None:
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, timeout=30)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q",
                    "-m", "import"], check=True, timeout=30)


def test_session_cluster_and_jobs_import_into_a_repository_that_validates(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    src = tmp_path / "basic-session-deployment-and-job.yaml"
    shutil.copy(EXAMPLES / src.name, src)
    code, out, err = run("import", "--namespace", "flink", str(src), "--out", str(repo / "apps"))
    assert code == 0, out + err
    assert f"{src}: FlinkDeployment basic-session-deployment-example: imported, runs the same -> " \
           f"{repo / 'apps' / 'basic-session-deployment-example.yaml'}" in out
    assert "3 of 3 document(s) imported to run the same" in out
    written = (repo / "apps" / "basic-session-deployment-example.yaml").read_text()
    assert written.startswith("# Imported by `flink-reconciler import` from FlinkDeployment "
                              "flink/basic-session-deployment-example (")
    assert "kind: FlinkSessionCluster" in written and "maxTaskManagers: 6 # from the running session jobs" in written
    job = (repo / "apps" / "basic-session-job-example2.yaml").read_text()
    assert "sessionCluster: basic-session-deployment-example  # from spec.deploymentName" in job
    assert "# Comments name the FlinkSessionJob field each value came from." in job
    commit(repo)
    code, out, err = run("validate", "--runtime", "kubernetes", str(repo / "apps"))
    assert code == 0, out + err
    assert "ok: 2 valid app(s) and 1 session cluster(s) in 3 file(s)" in out


def test_session_job_only_with_and_without_its_cluster(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("basic-session-deployment-only.yaml", "basic-session-job-only.yaml"):
        shutil.copy(EXAMPLES / name, src / name)
    repo = git_repo(tmp_path / "repo")
    # a directory: both files together
    code, out, err = run("import", "--namespace", "flink", str(src), "--out", str(repo / "apps"))
    assert code == 0, out + err
    commit(repo)
    code, out, err = run("validate", "--runtime", "kubernetes", str(repo / "apps"))
    assert code == 0 and "ok: 1 valid app(s) and 1 session cluster(s) in 2 file(s)" in out, out + err
    # alone, the job names a cluster the run does not have: imported, reported, and validate agrees
    alone = git_repo(tmp_path / "alone")
    code, out, err = run("import", "--namespace", "flink", str(src / "basic-session-job-only.yaml"), "--out",
                         str(alone / "apps"))
    assert code == 1
    assert "IMPORTED, RUNS DIFFERENTLY" in out
    assert "! spec.deploymentName: the session FlinkDeployment flink/basic-session-deployment-only-example is " \
           "not among the imported documents" in out
    code, out, err = run("validate", "--runtime", "kubernetes", str(alone / "apps"))
    assert code == 1 and "which no FlinkSessionCluster in the repository defines" in err


def test_session_apps_are_checked_on_their_cluster(tmp_path: Path) -> None:
    """What `validate --runtime kubernetes` refuses of a session app on its cluster, the import reports."""
    text = (EXAMPLES / "basic-session-deployment-and-job.yaml").read_text() \
        .replace("jarURI: https://repo1.maven.org/maven2/org/apache/flink/flink-examples-streaming/2.2.0/"
                 "flink-examples-streaming-2.2.0.jar", "jarURI: local:///opt/flink/lib/mine.jar")
    (tmp_path / "s.yaml").write_text(text)
    code, out, err = run("import", "--namespace", "flink", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "apps"),
                         "--output", "json")
    assert code == 1, out + err
    docs = {d["name"]: d for d in json.loads(out)["documents"]}
    bad = docs["basic-session-job-example2"]
    assert not bad["runsTheSame"] and bad["written"]
    assert [f["field"] for f in bad["findings"] if f["changesBehaviour"]] == ["spec.job.jarURI"]
    assert docs["basic-session-job-example"]["runsTheSame"]
    code, out, err = run("validate", "--runtime", "kubernetes", str(tmp_path / "apps"))
    assert code == 1 and "spec.job.jarURI" in err


def test_out_naming_a_file_is_an_error_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "orders.yaml").write_text(DURABLE)
    (tmp_path / "taken").write_text("mine")
    code, _, err = run("import", str(tmp_path / "orders.yaml"), "--out", str(tmp_path / "taken"))
    assert code == 1 and "error: --out" in err and "is not a directory" in err and "Traceback" not in err
    assert (tmp_path / "taken").read_text() == "mine"


def test_a_document_with_zero_slots_is_reported_and_the_others_are_imported(tmp_path: Path) -> None:
    bad = DURABLE.replace("name: orders", "name: broken").replace('numberOfTaskSlots: "2"', 'numberOfTaskSlots: "0"')
    assert "numberOfTaskSlots: \"0\"" in bad
    (tmp_path / "two.yaml").write_text(bad + "---\n" + DURABLE)
    code, out, err = run("import", str(tmp_path / "two.yaml"), "--out", str(tmp_path / "apps"))
    assert code == 1, out + err
    assert "FlinkDeployment broken: NOT IMPORTED" in out and "0 task slots" in out
    assert "FlinkDeployment orders: imported, runs the same" in out
    assert sorted(p.name for p in (tmp_path / "apps").iterdir()) == ["orders.yaml"]


def test_a_missing_namespace_is_flagged_unless_given(tmp_path: Path) -> None:
    src = tmp_path / "orders.yaml"
    src.write_text(DURABLE.replace("  namespace: shop\n", ""))
    assert "namespace" not in src.read_text().split("spec:")[0]
    code, out, err = run("import", str(src))
    assert code == 1 and "! metadata.namespace: not set" in err, err
    code, out, err = run("import", "--namespace", "shop", str(src))
    assert code == 0, err
    assert "namespace: shop # from --namespace (the source names none)" in out.replace("  #", " #")
    assert "from: FlinkDeployment/orders" in out
