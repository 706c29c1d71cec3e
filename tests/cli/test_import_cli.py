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
    code, out, _ = run("import", str(EXAMPLES), "--out", str(tmp_path / "apps"), "--output", "json")
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
    assert by_name["basic-session-job-example"]["imported"] is False
    written = sorted(p.name for p in (tmp_path / "apps").iterdir())
    assert "basic-example.yaml" in written and "basic-session-job-example.yaml" not in written
    # what runs the same also validates for Kubernetes
    same = [d["written"] for d in report["documents"] if d["runsTheSame"]]
    assert same
    code, out, err = run("validate", "--runtime", "kubernetes", *same)
    assert code == 0, out + err


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


def test_no_traceback_from_the_real_command(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "basic-session-deployment-and-job.yaml", tmp_path / "s.yaml")
    p = subprocess.run([sys.executable, "-m", "reconciler.cli", "import", str(tmp_path / "s.yaml")],
                       check=False, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "NOT IMPORTED" in p.stderr and "session cluster" in p.stderr
