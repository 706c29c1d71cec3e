"""Golden tests of the rendered manifests, plus OpenAPI schema validation of every object.

Regenerate the golden files after a deliberate change: UPDATE_GOLDEN=1 pytest tests/kubernetes/test_render.py
(then read the diff: it is the review).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from ruamel.yaml import YAML

from reconciler.core.plan import deterministic_job_id
from reconciler.errors import RenderError, SpecError
from reconciler.live.kubernetes import render as r
from tests.kubernetes.apps import EXAMPLES, app

GOLDEN = Path(__file__).parent / "golden"
# The oldest and newest Kubernetes versions we claim to support.
K8S_VERSIONS = ("1.30.0", "1.37.0")
ROOT_UID = "3b1f0c6e-0000-4000-8000-000000000001"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _cases() -> dict[str, list[dict[str, Any]]]:
    out = {}
    for case, a in EXAMPLES.items():
        out[case] = r.render_app(a, revision=REVISION, job_id=deterministic_job_id(a.name, REVISION, 0),
                                 restore_path=None, root_uid=ROOT_UID)
    a = EXAMPLES["plain"]
    out["restore"] = r.render_app(a, revision=REVISION, job_id=deterministic_job_id(a.name, REVISION, 1),
                                  restore_path="s3://bucket/savepoints/counter/savepoint-abc",
                                  allow_non_restored_state=True, root_uid=ROOT_UID)
    # A warm standby's session cluster (HA, an http jar fetched and staged, TaskManagers as a StatefulSet).
    out["standby"] = r.render_app(EXAMPLES["statefulset"], revision=REVISION, job_id=None, restore_path=None,
                                  root_uid=ROOT_UID, generation="3538ba14")
    return out


CASES = _cases()


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    text = r.to_yaml(CASES[case])
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{case} render changed; review and run with UPDATE_GOLDEN=1"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_openapi(case: str, version: str) -> None:
    for obj in CASES[case]:
        kubernetes_validate.validate(obj, version, strict=True)


def test_schema_validation_catches_a_bad_object() -> None:
    """The validator is not a no-op: a misspelt field fails strict validation."""
    obj = dict(CASES["plain"][-1])
    obj["spec"] = {**obj["spec"], "replica": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)


def test_yaml_round_trips() -> None:
    docs = list(YAML(typ="safe").load_all(r.to_yaml(CASES["statefulset"])))
    assert docs == CASES["statefulset"]


def _by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_every_object_but_the_root_is_owned_by_the_root_and_labelled() -> None:
    for case, objs in CASES.items():
        ns = objs[0]["metadata"]["namespace"]
        assert objs[0]["kind"] == "ConfigMap" and objs[0]["metadata"]["name"].endswith("-root")
        assert "ownerReferences" not in objs[0]["metadata"]
        for o in objs:
            meta = o["metadata"]
            assert meta["namespace"] == ns, case
            assert meta["labels"][r.LABEL_MANAGED_BY] == "flink-reconciler"
            assert meta["labels"][r.LABEL_NAME] == "flink"
            assert meta["labels"][r.LABEL_VERSION] == "2.3"
            assert set(meta["annotations"]) >= {r.ANNOTATION_SPEC_HASH, r.ANNOTATION_REVISION}
            assert "finalizers" not in meta
            if o is not objs[0]:
                assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "ConfigMap",
                                                    "name": objs[0]["metadata"]["name"], "uid": ROOT_UID,
                                                    "blockOwnerDeletion": False, "controller": False}]


def test_without_root_uid_there_are_no_owner_references() -> None:
    objs = r.render_app(EXAMPLES["plain"], revision="r", job_id=None, restore_path=None)
    assert all("ownerReferences" not in o["metadata"] for o in objs)


def test_jobmanager_args_application_mode_and_restore() -> None:
    jm = _by(CASES["restore"], "Deployment", "counter-jobmanager")
    c = jm["spec"]["template"]["spec"]["containers"][0]
    job_id = deterministic_job_id("counter", REVISION, 1)
    assert c["args"] == ["standalone-job", "-D", "jobmanager.rpc.address=$(POD_IP)",
                         "-D", f"kubernetes.cluster-id=counter.{job_id[:12]}",
                         "-D", f"high-availability.cluster-id=counter.{job_id[:12]}",
                         "--job-classname", "com.example.Counter",
                         "--job-id", job_id,
                         "--fromSavepoint", "s3://bucket/savepoints/counter/savepoint-abc",
                         "--allowNonRestoredState", "--rate", "100"]
    plain = _by(CASES["plain"], "Deployment", "counter-jobmanager")["spec"]["template"]["spec"]["containers"][0]
    assert "--fromSavepoint" not in plain["args"] and plain["args"][-2:] == ["--rate", "100"]
    assert jm["spec"]["strategy"] == {"type": "Recreate"}
    assert c["readinessProbe"]["httpGet"]["port"] == r.REST_PORT


def test_config_yaml_contents() -> None:
    cm = _by(CASES["plain"], "ConfigMap", "counter-config")
    conf = YAML(typ="safe").load(cm["data"]["config.yaml"])
    assert conf["jobmanager.rpc.address"] == "counter-jobmanager"
    assert conf["taskmanager.numberOfTaskSlots"] == "2"
    assert conf["taskmanager.memory.process.size"] == "2048m"
    assert conf["jobmanager.memory.process.size"] == "1024m"
    assert conf["execution.checkpointing.externalized-checkpoint-retention"] == "RETAIN_ON_CANCELLATION"
    assert conf["execution.checkpointing.savepoint-dir"] == "s3://bucket/savepoints/counter"
    assert conf["parallelism.default"] == "2"
    assert "log4j-console.properties" in cm["data"]


def test_container_memory_is_above_the_jvm_process_size() -> None:
    tm = _by(CASES["plain"], "Deployment", "counter-taskmanager")["spec"]["template"]["spec"]["containers"][0]
    assert tm["resources"]["limits"] == {"cpu": "500m", "memory": f"{2048 + 205}Mi"}
    assert tm["resources"]["requests"] == tm["resources"]["limits"]
    assert r.container_memory_mib(1024) == 1024 + 128  # the minimum headroom
    assert r.cpu_quantity(1.0) == "1" and r.cpu_quantity(0.25) == "250m"


def test_pod_template_merge() -> None:
    tm = _by(CASES["plain"], "Deployment", "counter-taskmanager")["spec"]["template"]
    containers = tm["spec"]["containers"]
    assert [c["name"] for c in containers] == ["flink-main-container", "sidecar"]
    assert containers[0]["env"] == [{"name": "TZ", "value": "UTC"}]
    assert containers[0]["image"] == "flink:2.3"  # ours wins on scalars
    assert tm["spec"]["tolerations"] == [{"key": "flink", "operator": "Exists"}]
    assert tm["metadata"]["labels"]["cost-center"] == "42"
    assert tm["metadata"]["labels"][r.LABEL_COMPONENT] == "taskmanager"
    anti = tm["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"][r.LABEL_COMPONENT] == "taskmanager"


def test_statefulset_with_claims_and_http_jar() -> None:
    objs = CASES["statefulset"]
    assert not [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-taskmanager")]
    sts = _by(objs, "StatefulSet", "stateful-taskmanager")
    assert sts["spec"]["serviceName"] == "stateful-taskmanager"
    assert _by(objs, "Service", "stateful-taskmanager")["spec"]["clusterIP"] == "None"
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    mounts = sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "local-state", "mountPath": "/flink-local"} in mounts
    jm = _by(objs, "Deployment", "stateful-jobmanager")["spec"]["template"]["spec"]
    init = jm["initContainers"][0]
    assert {"name": "JAR_URL", "value": "https://artifacts.example.com/jobs/counter-1.2.jar"} in init["env"]
    assert "sha256sum -c" in init["command"][-1]


def test_ha_objects() -> None:
    objs = CASES["ha"]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert {("ServiceAccount", "ha-app-flink"), ("Role", "ha-app-flink"), ("RoleBinding", "ha-app-flink")} <= kinds
    conf = YAML(typ="safe").load(_by(objs, "ConfigMap", "ha-app-config")["data"]["config.yaml"])
    assert conf["high-availability.type"] == "kubernetes"
    assert conf["kubernetes.cluster-id"] == "ha-app"
    assert conf["high-availability.storageDir"] == "s3://bucket/ha/ha-app"
    jm = _by(objs, "Deployment", "ha-app-jobmanager")
    assert jm["spec"]["replicas"] == 2
    pod = jm["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ha-app-flink"
    assert pod["containers"][0]["args"][:3] == ["standalone-job", "-D", "jobmanager.rpc.address=$(POD_IP)"]


def test_suspended_keeps_only_config() -> None:
    assert [(o["kind"], o["metadata"]["name"]) for o in CASES["suspended"]] == [
        ("ConfigMap", "paused-root"), ("ConfigMap", "paused-config")]


def test_config_change_rolls_pods_but_revision_does_not() -> None:
    a = EXAMPLES["plain"]
    one = r.render_app(a, revision="r1", job_id="j", restore_path=None)
    two = r.render_app(a, revision="r2", job_id="j", restore_path=None)

    def tmpl(objs: list[dict[str, Any]]) -> Any:
        return _by(objs, "Deployment", "counter-taskmanager")["spec"]["template"]

    assert tmpl(one) == tmpl(two)  # a metadata-only commit never restarts pods
    changed = app(taskManager={"slots": 4})
    assert tmpl(r.render_app(changed, revision="r1", job_id="j", restore_path=None)) != tmpl(one)


@pytest.mark.parametrize("generation", ["", "3538ba14"])
def test_a_parallelism_change_keeps_the_pods(generation: str) -> None:
    """The job's parallelism is in config.yaml (`parallelism.default`) but not in the pods' config hash: a session
    cluster's job-only upgrade, or the EnsureCluster after an in-place rescale, must not roll the pods."""
    job = None if generation else "j"
    one = r.render_app(app(job={"parallelism": 1}), revision="r", job_id=job, restore_path=None,
                       generation=generation)
    two = r.render_app(app(job={"parallelism": 2}), revision="r", job_id=job, restore_path=None,
                       generation=generation)
    workloads = [(o["kind"], o["metadata"]["name"]) for o in one if o["kind"] in ("Deployment", "StatefulSet")]
    assert len(workloads) == 2
    for kind, name in workloads:
        assert _by(one, kind, name)["spec"]["template"] == _by(two, kind, name)["spec"]["template"], name
    config = r.object_names("counter", generation)["config"]
    assert "parallelism.default: \"1\"" in _by(one, "ConfigMap", config)["data"]["config.yaml"]
    assert "parallelism.default: \"2\"" in _by(two, "ConfigMap", config)["data"]["config.yaml"]


@pytest.mark.parametrize("uri", ["file:///tmp/job.jar", "jars/job.jar", "s3://bucket/job.jar", "local://rel.jar"])
def test_unsupported_jar_is_refused(uri: str) -> None:
    a = app(job={"jarURI": uri})
    with pytest.raises(RenderError, match=r"jarURI|absolute") as e:
        r.render_app(a, revision="r", job_id=None, restore_path=None)
    assert isinstance(e.value, SpecError) and e.value.field == "spec.job.jarURI"


def test_reserved_flink_key_is_refused() -> None:
    a = app(flinkConfiguration={"taskmanager.numberOfTaskSlots": "8"})
    with pytest.raises(RenderError, match=r"spec\.taskManager\.slots"):
        r.render_app(a, revision="r", job_id=None, restore_path=None)
    same = app(flinkConfiguration={"rest.port": "8081"})  # the same value is fine
    r.render_app(same, revision="r", job_id=None, restore_path=None)


def test_memory_units_are_flink_units() -> None:
    assert r.memory_mib("1024m", app="a", field="f") == 1024
    assert r.memory_mib("2g", app="a", field="f") == 2048
    assert r.memory_mib("1.5Gi", app="a", field="f") == 1536
    with pytest.raises(RenderError):
        r.memory_mib("64m", app="a", field="f")


def test_render_is_deterministic() -> None:
    a = EXAMPLES["ha"]
    assert r.to_yaml(r.render_app(a, revision="x", job_id="y", restore_path=None)) == r.to_yaml(
        r.render_app(a, revision="x", job_id="y", restore_path=None))
