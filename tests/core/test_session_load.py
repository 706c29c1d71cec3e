"""Loading FlinkSessionClusters and the apps on them: the cluster half is the cluster's, every refusal names
file:line and field and affects only the apps it is about."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.spec.load import load_files
from reconciler.spec.session import session_generation

CLUSTER = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkSessionCluster
metadata:
  name: {name}
spec:
  taskManager:
    replicas: {replicas}
    slots: 2
    resources:
      memory: 1536m
  flinkConfiguration:
    execution.checkpointing.interval: 2s
"""

APP = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
spec:
  sessionCluster: {cluster}
  job:
    jarURI: jobs/counter.jar
    parallelism: {p}
"""


def files(*docs: tuple[str, str]) -> dict[str, bytes]:
    return {path: text.encode() for path, text in docs}


def test_a_session_app_runs_with_its_clusters_fields() -> None:
    r = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=1)),
                         ("a.yaml", APP.format(name="a", cluster="shared", p=1)),
                         ("b.yaml", APP.format(name="b", cluster="shared", p=1))))
    assert r.errors == () and set(r.apps) == {"a", "b"} and set(r.clusters) == {"shared"}
    a = r.apps["a"].app
    assert a.spec.session_cluster == "shared"
    assert a.spec.task_manager.resources.memory == "1536m" and a.spec.task_manager.slots == 2
    assert a.spec.flink_configuration == {"execution.checkpointing.interval": "2s"}
    # both apps name the same cluster generation; a job change does not move it, a cluster change does
    assert session_generation(a) == session_generation(r.apps["b"].app)
    moved = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=1).replace("1536m", "2g")),
                             ("a.yaml", APP.format(name="a", cluster="shared", p=2))))
    assert session_generation(moved.apps["a"].app) != session_generation(a)
    job_only = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=1)),
                                ("a.yaml", APP.format(name="a", cluster="shared", p=2))))
    assert session_generation(job_only.apps["a"].app) == session_generation(a)


@pytest.mark.parametrize(("extra", "field", "line"), [
    ("  taskManager:\n    slots: 4\n", "spec.taskManager", 10),
    ("  flinkConfiguration:\n    a.b: c\n", "spec.flinkConfiguration", 10),
    ("  image: flink:2.3\n", "spec.image", 10),
    ("  highAvailability:\n    enabled: false\n", "spec.highAvailability", 10),
])
def test_cluster_fields_of_a_session_app_are_refused_with_file_line_field(extra: str, field: str, line: int) -> None:
    app = APP.format(name="a", cluster="shared", p=1) + extra
    r = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=1)), ("apps/a.yaml", app),
                         ("b.yaml", APP.format(name="b", cluster="shared", p=1))))
    (err,) = r.errors
    assert (err.file, err.line, err.field, err.app) == ("apps/a.yaml", line, field, "a")
    assert f"{field.split('.')[1]} belongs to the session cluster" in err.message
    assert "a" not in r.apps and "b" in r.apps  # only the app it is about


def test_an_unknown_session_cluster_is_an_error_of_the_app_at_its_line() -> None:
    r = load_files(files(("a.yaml", APP.format(name="a", cluster="nope", p=1))))
    (err,) = r.errors
    assert (err.line, err.field, err.app) == (6, "spec.sessionCluster", "a")
    assert "names session cluster 'nope', which no FlinkSessionCluster in the repository defines" in err.message
    assert not r.apps


def test_capacity_refused_with_the_numbers_for_the_cluster_and_each_app() -> None:
    r = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=1)),
                         ("a.yaml", APP.format(name="a", cluster="shared", p=1)),
                         ("b.yaml", APP.format(name="b", cluster="shared", p=2))))
    assert {e.app for e in r.errors} == {"shared", "a", "b"} and not r.apps
    msg = ("session cluster 'shared' has 2 task slots (taskManager.replicas 1 x slots 2) but its running jobs need 3 "
           "(a 1, b 2): raise the cluster's taskManager.replicas or slots, set capacity.addTaskManagers (with "
           "maxTaskManagers), or lower a job's parallelism")
    assert {e.message for e in r.errors} == {msg}
    ok = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=2)),
                          ("a.yaml", APP.format(name="a", cluster="shared", p=1)),
                          ("b.yaml", APP.format(name="b", cluster="shared", p=2))))
    assert ok.errors == ()
    suspended = APP.format(name="b", cluster="shared", p=2) + "    state: suspended\n"
    fits = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=1)),
                            ("a.yaml", APP.format(name="a", cluster="shared", p=1)), ("b.yaml", suspended)))
    assert fits.errors == ()  # a suspended job takes no slots


AUTO = "  capacity:\n    addTaskManagers: true\n    maxTaskManagers: {most}\n"


@pytest.mark.parametrize(("replicas", "most", "parallelism", "want"), [
    (1, 3, (1, 1), 1),  # fits the spec's TaskManagers: nothing added
    (1, 3, (1, 2), 2),  # 3 slots needed, 2 per TaskManager: one more
    (1, 3, (3, 3), 3),  # 6 slots: up to the ceiling
    (2, 3, (1, 0), 2),  # taskManager.replicas stays the least count (b suspended takes no slot)
    (0, 2, (1, 0), 1),  # none in the spec, one for the one job
])
def test_add_task_managers_runs_as_many_as_the_running_jobs_need(replicas: int, most: int,
                                                                 parallelism: tuple[int, int], want: int) -> None:
    b = APP.format(name="b", cluster="shared", p=max(parallelism[1], 1))
    if parallelism[1] == 0:
        b += "    state: suspended\n"
    r = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=replicas) + AUTO.format(most=most)),
                         ("a.yaml", APP.format(name="a", cluster="shared", p=parallelism[0])), ("b.yaml", b)))
    assert r.errors == ()
    assert {la.app.spec.task_manager.replicas for la in r.apps.values()} == {want}
    assert r.clusters["shared"].cluster.spec.task_manager.replicas == replicas  # the spec as written


def test_add_task_managers_refuses_beyond_its_ceiling_with_the_numbers() -> None:
    r = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=1) + AUTO.format(most=2)),
                         ("a.yaml", APP.format(name="a", cluster="shared", p=3)),
                         ("b.yaml", APP.format(name="b", cluster="shared", p=2))))
    msg = ("session cluster 'shared' may run at most 2 TaskManagers (capacity.maxTaskManagers) x 2 slots = 4 task "
           "slots, but its running jobs need 5 (a 3, b 2): raise capacity.maxTaskManagers or taskManager.slots, or "
           "lower a job's parallelism")
    assert {e.message for e in r.errors} == {msg} and {e.app for e in r.errors} == {"shared", "a", "b"}
    assert not r.apps


@pytest.mark.parametrize(("capacity", "error"), [
    ("  capacity:\n    addTaskManagers: true\n", "capacity.addTaskManagers needs capacity.maxTaskManagers"),
    ("  capacity:\n    addTaskManagers: true\n    maxTaskManagers: 1\n",
     "capacity.maxTaskManagers (1) is below taskManager.replicas (2)"),
])
def test_capacity_settings_are_checked(capacity: str, error: str) -> None:
    r = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=2) + capacity)))
    assert any(error in e.message and e.app == "shared" for e in r.errors), r.errors


def test_an_app_and_a_cluster_may_not_share_a_name() -> None:
    r = load_files(files(("c.yaml", CLUSTER.format(name="orders", replicas=1)),
                         ("a.yaml", APP.format(name="orders", cluster="orders", p=1))))
    assert {(e.file, e.field) for e in r.errors} >= {("c.yaml", "metadata.name"), ("a.yaml", "metadata.name")}
    assert not r.apps and not r.clusters


def test_a_cluster_spec_error_names_its_line_and_leaves_its_apps_as_they_are() -> None:
    bad = CLUSTER.format(name="shared", replicas=1).replace("    slots: 2\n", "    slots: 2\n    slotz: 3\n")
    r = load_files(files(("c.yaml", bad), ("a.yaml", APP.format(name="a", cluster="shared", p=1))))
    by_app = {e.app: e for e in r.errors}
    assert by_app["shared"].line == 9 and by_app["shared"].field == "spec.taskManager.slotz"
    assert "did you mean 'slots'" in by_app["shared"].message
    assert by_app["a"].field == "spec.sessionCluster" and not r.apps


def test_namespaces_must_match() -> None:
    app = APP.format(name="a", cluster="shared", p=1).replace("  name: a\n", "  name: a\n  namespace: other\n")
    r = load_files(files(("c.yaml", CLUSTER.format(name="shared", replicas=1)), ("a.yaml", app)))
    (err,) = r.errors
    assert "of namespace 'default' but is in namespace 'other'" in err.message


def test_session_cluster_schema_in_repo_is_in_sync(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--kind", "FlinkSessionCluster"]) == 0
    out = capsys.readouterr().out
    checked_in = (Path(__file__).parents[2] / "schemas" / "flinksessioncluster.schema.json").read_text()
    assert out == checked_in, ("schemas/flinksessioncluster.schema.json is stale: run `flink-reconciler schema "
                               "--kind FlinkSessionCluster --out schemas/flinksessioncluster.schema.json`")
    schema = json.loads(out)
    assert schema["properties"]["kind"]["const"] == "FlinkSessionCluster"
    assert "job" not in schema["$defs"]["SessionClusterSpec"]["properties"]
    assert schema["$defs"]["TaskManagerSpec"]["properties"]["slots"]["x-change-class"] == "upgrade"


def test_validate_counts_session_clusters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.yaml").write_text(CLUSTER.format(name="shared", replicas=1))
    (tmp_path / "a.yaml").write_text(APP.format(name="a", cluster="shared", p=1) + "  image: x\n")
    assert main(["validate", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "1 error: 0 valid app(s) and 1 session cluster(s) in 2 file(s)\n"
    assert err.startswith(f"{tmp_path}/a.yaml:10:3 spec.image: image belongs to the session cluster")
