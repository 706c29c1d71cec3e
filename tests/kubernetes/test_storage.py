"""Durable state on Kubernetes: stateful apps need durable savepoint/checkpoint dirs and HA (kubernetes.storage),
the renderer refuses them otherwise, and `validate --runtime kubernetes` lists every problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main
from reconciler.errors import RenderError
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.storage import (
    CHECKPOINT_DIR,
    MAIN_CONTAINER,
    SAVEPOINT_DIR,
    SpecProblem,
    kubernetes_spec_problems,
    runs_on_kubernetes,
)
from tests.kubernetes.apps import EXAMPLES, app

SP_FIELD = f"spec.flinkConfiguration.{SAVEPOINT_DIR}"
CP_FIELD = f"spec.flinkConfiguration.{CHECKPOINT_DIR}"
HA_FIELD = "spec.highAvailability.enabled"
HA_DIR_FIELD = "spec.highAvailability.storageDir"


def _conf(**overrides: str | None) -> dict[str, Any]:
    """flinkConfiguration of the test app with keys replaced (None: removed)."""
    conf: dict[str, Any] = {CHECKPOINT_DIR: "s3://bucket/checkpoints/counter",
                            SAVEPOINT_DIR: "s3://bucket/savepoints/counter",
                            "execution.checkpointing.interval": "10s"}
    for k, v in overrides.items():
        conf.pop(k, None) if v is None else conf.__setitem__(k, v)
    return conf


def _with_conf(conf: dict[str, Any], **spec: Any) -> Any:
    a = app(**spec)
    return a.model_copy(update={"spec": a.spec.model_copy(update={"flink_configuration": conf})})


def _fields(problems: list[SpecProblem]) -> list[str]:
    return [p.field for p in problems]


def _pvc_template(mount: str = "/flink-data", source: dict[str, Any] | None = None,
                  read_only: bool = False, container: str = MAIN_CONTAINER) -> dict[str, Any]:
    vm: dict[str, Any] = {"name": "data", "mountPath": mount}
    if read_only:
        vm["readOnly"] = True
    return {"spec": {
        "volumes": [{"name": "data", **(source or {"persistentVolumeClaim": {"claimName": "flink-data"}})}],
        "containers": [{"name": container, "volumeMounts": [vm]}]}}


def test_the_examples_have_durable_state() -> None:
    for case, a in EXAMPLES.items():
        assert kubernetes_spec_problems(a) == [], case
        assert r.kubernetes_problems(a) == [], case


def test_the_renderer_names_the_container_the_check_reads() -> None:
    assert r.MAIN_CONTAINER == MAIN_CONTAINER == "flink-main-container"


@pytest.mark.parametrize(("key", "field"), [(SAVEPOINT_DIR, SP_FIELD), (CHECKPOINT_DIR, CP_FIELD)])
@pytest.mark.parametrize("mode", ["savepoint", "last-state"])
def test_a_stateful_app_without_a_state_dir_is_refused_naming_the_key(key: str, field: str, mode: str) -> None:
    a = _with_conf(_conf(**{key: None}), job={"upgradeMode": mode})
    problems = kubernetes_spec_problems(a)
    assert _fields(problems) == [field]
    assert problems[0].loc == ("spec", "flinkConfiguration", key)  # the Flink key stays whole
    assert f"set {field} to durable storage" in problems[0].message and mode in problems[0].message
    with pytest.raises(RenderError) as e:
        r.render_app(a, revision="r", job_id=None, restore_path=None)
    assert e.value.field == field and e.value.app == "counter"


def test_the_deprecated_state_dir_keys_count() -> None:
    conf = _conf(**{SAVEPOINT_DIR: None, CHECKPOINT_DIR: None})
    conf |= {"state.savepoints.dir": "s3://b/sp", "state.checkpoints.dir": "gs://b/cp"}
    assert kubernetes_spec_problems(_with_conf(conf)) == []
    conf["state.checkpoints.dir"] = "file:///tmp/cp"
    assert _fields(kubernetes_spec_problems(_with_conf(conf))) == [CP_FIELD]


@pytest.mark.parametrize("value", ["s3://bucket/sp", "s3a://b/sp", "gs://b/sp", "hdfs://nn:8020/sp", "abfss://c@acct/sp",
                                   "oss://b/sp", "wasbs://c@acct/sp", "viewfs://cluster/sp", " s3://b/sp "])
def test_object_stores_and_distributed_filesystems_are_durable(value: str) -> None:
    assert kubernetes_spec_problems(_with_conf(_conf(**{SAVEPOINT_DIR: value}))) == []


@pytest.mark.parametrize(("value", "why"), [
    ("file:///tmp/savepoints", "container's own disk"),
    ("/tmp/savepoints", "container's own disk"),
    ("savepoints", "relative path"),
    ("file://tmp/savepoints", "three slashes"),
    ("s3://", "names no bucket"),
    ("ftp://host/savepoints", "unknown filesystem scheme ftp://"),
    ("memory://x", "unknown filesystem scheme"),
])
def test_pod_local_and_unknown_storage_is_refused(value: str, why: str) -> None:
    problems = kubernetes_spec_problems(_with_conf(_conf(**{SAVEPOINT_DIR: value})))
    assert _fields(problems) == [SP_FIELD]
    assert why in problems[0].message and repr(value.strip()) in problems[0].message


@pytest.mark.parametrize("value", ["file:///flink-data/savepoints", "/flink-data/savepoints", "file:///flink-data",
                                   "/flink-data/a/../savepoints"])
def test_a_path_on_a_pvc_the_pod_template_mounts_is_durable(value: str) -> None:
    a = _with_conf(_conf(**{SAVEPOINT_DIR: value}), podTemplate=_pvc_template())
    assert kubernetes_spec_problems(a) == []


@pytest.mark.parametrize("source", [{"nfs": {"server": "nfs.example.com", "path": "/exports/flink"}},
                                    {"cephfs": {"monitors": ["10.0.0.1:6789"]}}])
def test_other_shared_volumes_are_durable(source: dict[str, Any]) -> None:
    a = _with_conf(_conf(**{CHECKPOINT_DIR: "file:///flink-data/cp"}), podTemplate=_pvc_template(source=source))
    assert kubernetes_spec_problems(a) == []


@pytest.mark.parametrize(("template", "value", "why"), [
    (_pvc_template(source={"emptyDir": {}}), "file:///flink-data/sp", "volume 'data' (emptyDir)"),
    (_pvc_template(source={"hostPath": {"path": "/var/flink"}}), "/flink-data/sp", "(hostPath)"),
    (_pvc_template(read_only=True), "/flink-data/sp", "read-only"),
    (_pvc_template(container="sidecar"), "/flink-data/sp", "container's own disk"),  # not Flink's container
    (_pvc_template(), "/flink-data2/sp", "container's own disk"),  # a sibling, not under the mount
    (_pvc_template(), "/flink-data/../tmp/sp", "container's own disk"),  # .. leaves the mount
    ({"spec": {"containers": [{"name": MAIN_CONTAINER, "volumeMounts": [{"name": "ghost", "mountPath": "/x"}]}]}},
     "/x/sp", "does not define"),
])
def test_a_path_on_a_volume_that_dies_with_the_pod_or_is_not_flinks_is_refused(
        template: dict[str, Any], value: str, why: str) -> None:
    problems = kubernetes_spec_problems(_with_conf(_conf(**{SAVEPOINT_DIR: value}), podTemplate=template))
    assert _fields(problems) == [SP_FIELD]
    assert why in problems[0].message
    assert "PersistentVolumeClaim" in problems[0].message or "drop readOnly" in problems[0].message


def test_a_taskmanager_volume_claim_template_is_not_shared_storage() -> None:
    a = _with_conf(_conf(**{CHECKPOINT_DIR: "file:///flink-local/checkpoints"}), taskManager={
        "volumeClaimTemplates": [{"name": "local-state", "mountPath": "/flink-local", "storage": "1Gi"}]})
    problems = kubernetes_spec_problems(a)
    assert _fields(problems) == [CP_FIELD]
    assert "volumeClaimTemplate 'local-state'" in problems[0].message
    assert "not mounted on the JobManager" in problems[0].message


def test_a_malformed_pod_template_is_read_without_crashing() -> None:
    for template in ({"spec": "x"}, {"spec": {"volumes": "x", "containers": 3}},
                     {"spec": {"containers": [{"name": MAIN_CONTAINER, "volumeMounts": [{"mountPath": 1}, "x"]}],
                               "volumes": [{"name": "data"}, 5]}}):
        problems = kubernetes_spec_problems(_with_conf(_conf(**{SAVEPOINT_DIR: "/data/sp"}), podTemplate=template))
        assert _fields(problems) == [SP_FIELD]


@pytest.mark.parametrize("mode", ["savepoint", "last-state"])
def test_a_stateful_app_without_ha_is_refused(mode: str) -> None:
    a = app(job={"upgradeMode": mode}, highAvailability={"enabled": False, "storageDir": None})
    problems = kubernetes_spec_problems(a)
    assert _fields(problems) == [HA_FIELD]
    msg = problems[0].message
    assert "silently rewinds" in msg and "spec.highAvailability.enabled: true" in msg and "stateless" in msg
    with pytest.raises(RenderError, match="highAvailability") as e:
        r.render_app(a, revision="r", job_id=None, restore_path=None)
    assert e.value.field == HA_FIELD


def test_a_stateless_app_needs_no_state_storage_and_no_ha() -> None:
    a = _with_conf({}, job={"upgradeMode": "stateless"}, highAvailability={"enabled": False, "storageDir": None})
    assert kubernetes_spec_problems(a) == []
    r.render_app(a, revision="r", job_id=None, restore_path=None)


@pytest.mark.parametrize("mode", ["savepoint", "stateless"])
def test_a_non_durable_ha_storage_dir_is_refused_in_every_mode(mode: str) -> None:
    a = app(job={"upgradeMode": mode}, highAvailability={"enabled": True, "storageDir": "file:///tmp/ha"})
    problems = kubernetes_spec_problems(a)
    assert _fields(problems) == [HA_DIR_FIELD]
    assert "'file:///tmp/ha' is not durable storage" in problems[0].message
    ok = app(job={"upgradeMode": mode}, highAvailability={"enabled": True, "storageDir": "/ha/x"},
             podTemplate=_pvc_template("/ha"))
    assert kubernetes_spec_problems(ok) == []


def test_render_raises_the_first_problem_and_counts_the_rest() -> None:
    a = _with_conf({}, highAvailability={"enabled": False, "storageDir": None})
    assert _fields(kubernetes_spec_problems(a)) == [SP_FIELD, CP_FIELD, HA_FIELD]
    with pytest.raises(RenderError, match=r"and 2 more: `flink-reconciler validate --runtime kubernetes`") as e:
        r.render_app(a, revision="r", job_id=None, restore_path=None)
    assert e.value.field == SP_FIELD


def test_kubernetes_problems_adds_what_else_the_renderer_refuses() -> None:
    a = _with_conf(_conf(**{SAVEPOINT_DIR: None, "rest.port": "9999"}), job={"jarURI": "jars/job.jar"})
    problems = r.kubernetes_problems(a)
    assert _fields(problems) == [SP_FIELD, "spec.job.jarURI"]
    b = _with_conf(_conf(**{"rest.port": "9999"}))
    assert [p.loc for p in r.kubernetes_problems(b)] == [("spec", "flinkConfiguration", "rest.port")]


def test_the_app_runtime_type_overrides_the_default() -> None:
    assert runs_on_kubernetes(app(), "kubernetes") and not runs_on_kubernetes(app(), "local")
    assert runs_on_kubernetes(app(runtime={"type": "kubernetes"}), "local")
    assert not runs_on_kubernetes(app(runtime={"type": "local"}), "kubernetes")


# ---- validate --runtime kubernetes ----------------------------------------------------------------

GOOD = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: good
spec:
  flinkConfiguration:
    execution.checkpointing.dir: s3://b/checkpoints/good
    execution.checkpointing.savepoint-dir: s3://b/savepoints/good
  highAvailability:
    enabled: true
    storageDir: s3://b/ha/good
  job:
    jarURI: local:///opt/flink/usrlib/job.jar
"""
BAD = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: bad
spec:
  flinkConfiguration:
    execution.checkpointing.savepoint-dir: file:///tmp/savepoints
  job:
    jarURI: local:///opt/flink/usrlib/job.jar
"""

BAD_LINE = GOOD.count("\n") + 1  # bad.yaml: GOOD (renamed), then '---' and BAD


def _repo(tmp_path: Path) -> Path:
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "good.yaml").write_text(GOOD)
    (tmp_path / "apps" / "bad.yaml").write_text(GOOD.replace("good", "other") + "---\n" + BAD)
    return tmp_path / "apps"


def test_validate_checks_durable_state_only_for_the_kubernetes_runtime(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLINK_RECONCILER_RUNTIME", raising=False)
    monkeypatch.delenv("FLINK_RECONCILER_CONFIG", raising=False)
    apps = _repo(tmp_path)
    assert main(["validate", str(apps)]) == 0  # local runtime: nothing of this applies
    capsys.readouterr()
    assert main(["validate", "--runtime", "kubernetes", str(apps)]) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    at = f"{apps / 'bad.yaml'}:{BAD_LINE}"  # where the bad app's document starts
    assert lines[0].startswith(f"{at} {SP_FIELD}: ") and "'file:///tmp/savepoints'" in lines[0]
    assert lines[1].startswith(f"{at} {CP_FIELD}: ")
    assert lines[2].startswith(f"{at} {HA_FIELD}: ")
    assert len(lines) == 3
    assert out.strip() == "3 errors: 2 valid app(s) in 2 file(s)"


def test_validate_takes_the_runtime_from_the_environment_and_reports_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLINK_RECONCILER_CONFIG", raising=False)
    monkeypatch.setenv("FLINK_RECONCILER_RUNTIME", "kubernetes")
    apps = _repo(tmp_path)
    assert main(["validate", "--output", "json", str(apps)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["apps"] == 2
    assert [(e["app"], e["field"], e["line"]) for e in report["errors"]] == [
        ("bad", SP_FIELD, BAD_LINE), ("bad", CP_FIELD, BAD_LINE), ("bad", HA_FIELD, BAD_LINE)]
    assert main(["validate", "--runtime", "local", str(apps)]) == 0  # the flag wins over the environment


def test_validate_checks_an_app_that_asks_for_kubernetes_itself(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLINK_RECONCILER_RUNTIME", raising=False)
    monkeypatch.delenv("FLINK_RECONCILER_CONFIG", raising=False)
    path = tmp_path / "bad.yaml"
    path.write_text(BAD.replace("  job:\n", "  runtime:\n    type: kubernetes\n  job:\n"))
    assert main(["validate", str(path)]) == 1
    assert f"{SP_FIELD}: " in capsys.readouterr().err
