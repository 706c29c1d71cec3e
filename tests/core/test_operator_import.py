"""The FlinkDeployment -> FlinkApp mapping (pure): table tests, the operator's own examples, hostile input.
Session mode has its own: test_operator_import_session.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.operator_migration.application import Imported, memory_bytes
from reconciler.operator_migration.documents import import_document, import_documents
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import FlinkSessionCluster

EXAMPLES = Path(__file__).parent / "operator_examples"


def fd(**spec: Any) -> dict[str, Any]:
    """A minimal application-mode FlinkDeployment, fields overridden by `spec`."""
    base: dict[str, Any] = {
        "image": "flink:2.2", "flinkVersion": "v2_2",
        "jobManager": {"resource": {"memory": "2048m", "cpu": 1}},
        "taskManager": {"resource": {"memory": "2048m", "cpu": 1}},
        "job": {"jarURI": "local:///opt/flink/usrlib/job.jar", "parallelism": 2, "upgradeMode": "stateless"},
    }
    base.update(spec)
    return {"apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkDeployment",
            "metadata": {"name": "app", "namespace": "team"}, "spec": base}


def conv(doc: dict[str, Any]) -> Imported:
    return import_document(doc)


def fields(imp: Imported, *, changing: bool | None = None) -> set[str]:
    return {f.field for f in imp.findings if changing is None or f.changes_behaviour is changing}


def test_minimal_deployment_runs_the_same() -> None:
    imp = conv(fd())
    assert imp.app is not None and not imp.changes_behaviour, imp.findings
    app = FlinkApp.model_validate(imp.app)
    assert (app.name, app.metadata.namespace) == ("app", "team")
    assert app.spec.job.parallelism == 2 and app.spec.task_manager.replicas == 2  # 2 / 1 slot
    assert app.spec.job_manager.resources.memory == "2g"
    assert imp.origins[("spec", "jobManager", "resources", "memory")] == "spec.jobManager.resource.memory"
    assert app.spec.flink_configuration["pipeline.name"] == "app"


def test_nested_and_flat_configuration_are_the_same() -> None:
    flat = conv(fd(flinkConfiguration={"state.savepoints.dir": "s3://b/sp", "taskmanager.numberOfTaskSlots": 2,
                                       "execution.checkpointing.interval": "10s"}))
    nested = conv(fd(flinkConfiguration={"state": {"savepoints.dir": "s3://b/sp"},
                                         "taskmanager": {"numberOfTaskSlots": 2},
                                         "execution": {"checkpointing": {"interval": "10s"}}}))
    assert flat.app == nested.app
    assert flat.app is not None
    assert flat.app["spec"]["flinkConfiguration"]["execution.checkpointing.savepoint-dir"] == "s3://b/sp"
    assert "state.savepoints.dir" not in flat.app["spec"]["flinkConfiguration"]
    assert flat.app["spec"]["taskManager"]["slots"] == 2


@pytest.mark.parametrize(("old", "new"), [
    ("state.savepoints.dir", "execution.checkpointing.savepoint-dir"),
    ("state.checkpoints.dir", "execution.checkpointing.dir"),
    ("state.backend", "state.backend.type"),
    ("state.checkpoints.num-retained", "execution.checkpointing.num-retained"),
    ("restart-strategy", "restart-strategy.type"),
    ("execution.checkpointing.unaligned", "execution.checkpointing.unaligned.enabled"),
])
def test_flink_1_keys_get_their_2_x_names(old: str, new: str) -> None:
    imp = conv(fd(flinkConfiguration={old: "v"}))
    assert imp.app is not None
    assert imp.app["spec"]["flinkConfiguration"][new] == "v"
    assert old not in imp.app["spec"]["flinkConfiguration"]
    assert f"spec.flinkConfiguration.{old}" in fields(imp, changing=False)
    assert "Flink 1.x name" in imp.origins[("spec", "flinkConfiguration", new)]


def test_old_key_next_to_new_key_with_another_value_names_both() -> None:
    imp = conv(fd(flinkConfiguration={"state.savepoints.dir": "s3://a", "execution.checkpointing.savepoint-dir":
                                      "s3://b"}))
    assert imp.app is None
    (f,) = imp.findings
    assert "state.savepoints.dir" in f.message and "execution.checkpointing.savepoint-dir" in f.message
    assert "s3://a" in f.message and "s3://b" in f.message


def test_old_key_next_to_new_key_with_the_same_value_is_fine() -> None:
    imp = conv(fd(flinkConfiguration={"state.savepoints.dir": "s3://a", "execution.checkpointing.savepoint-dir":
                                      "s3://a"}))
    assert imp.app is not None and not imp.changes_behaviour


def test_nested_and_flat_spelling_of_one_key_with_different_values() -> None:
    imp = conv(fd(flinkConfiguration={"state": {"savepoints.dir": "s3://a"}, "state.savepoints.dir": "s3://b"}))
    assert imp.app is None and "given twice" in imp.findings[0].message


def test_flink_1_x_keeps_its_key_names() -> None:
    imp = conv(fd(flinkVersion="v1_20", flinkConfiguration={"state.savepoints.dir": "s3://a"}))
    assert imp.app is not None and imp.app["spec"]["flinkConfiguration"]["state.savepoints.dir"] == "s3://a"
    assert imp.app["spec"]["flinkVersion"] == "1.20" and not imp.changes_behaviour
    old = conv(fd(flinkVersion="v1_17"))
    assert "spec.flinkVersion" in fields(old, changing=True)


@pytest.mark.parametrize(("value", "expected"), [
    ("2048m", "2g"), ("2g", "2g"), ("2Gi", "2g"), ("1536Mi", "1536m"), ("1024mb", "1g"), ("3G", "3g"),
])
def test_memory_forms(value: str, expected: str) -> None:
    imp = conv(fd(taskManager={"resource": {"memory": value}}))
    assert imp.app is not None and imp.app["spec"]["taskManager"]["resources"]["memory"] == expected


def test_decimal_kubernetes_quantity_is_read_as_the_operator_does() -> None:
    assert memory_bytes("1.5G", "x") == 1_500_000_000  # Flink's MemorySize refuses '1.5G': a Kubernetes quantity
    imp = conv(fd(taskManager={"resource": {"memory": "1.5G"}}))
    assert "spec.taskManager.resource.memory" in fields(imp, changing=False)  # rounded down to MiB


def test_new_resources_form_wins_over_the_deprecated_one() -> None:
    imp = conv(fd(jobManager={"resource": {"memory": "1g", "cpu": 4},
                              "resources": {"requests": {"memory": "3g", "cpu": "500m"}}}))
    assert imp.app is not None
    assert imp.app["spec"]["jobManager"]["resources"] == {"memory": "3g", "cpu": 0.5}
    assert "spec.jobManager.resource" in fields(imp, changing=False)


def test_limits_above_requests_are_reported() -> None:
    imp = conv(fd(taskManager={"resources": {"requests": {"memory": "2g", "cpu": 1},
                                             "limits": {"memory": "2g", "cpu": 2}}}))
    assert "spec.taskManager.resources.limits.cpu" in fields(imp, changing=True)
    only_limits = conv(fd(taskManager={"resources": {"limits": {"memory": "4g", "cpu": 2}}}))
    assert only_limits.app is not None and not only_limits.changes_behaviour
    assert only_limits.app["spec"]["taskManager"]["resources"] == {"memory": "4g", "cpu": 2.0}


def test_taskmanager_replicas_override_parallelism_as_in_the_operator() -> None:
    imp = conv(fd(taskManager={"resource": {"memory": "2g"}, "replicas": 3},
                  flinkConfiguration={"taskmanager.numberOfTaskSlots": 2}))
    assert imp.app is not None
    assert imp.app["spec"]["job"]["parallelism"] == 6 and imp.app["spec"]["taskManager"]["replicas"] == 3
    assert "spec.job.parallelism" in fields(imp, changing=False)


def test_taskmanagers_from_parallelism_and_slots() -> None:
    imp = conv(fd(flinkConfiguration={"taskmanager.numberOfTaskSlots": 4}, job={
        "jarURI": "local:///x.jar", "parallelism": 9, "upgradeMode": "stateless"}))
    assert imp.app is not None and imp.app["spec"]["taskManager"]["replicas"] == 3


@pytest.mark.parametrize("ha_type", ["kubernetes", "org.apache.flink.kubernetes.highavailability."
                                                   "KubernetesHaServicesFactory"])
def test_kubernetes_ha(ha_type: str) -> None:
    imp = conv(fd(flinkConfiguration={"high-availability": {"type": ha_type, "storageDir": "s3://b/ha"}}))
    assert imp.app is not None
    assert imp.app["spec"]["highAvailability"] == {"enabled": True, "storageDir": "s3://b/ha"}
    assert "high-availability.type" not in imp.app["spec"].get("flinkConfiguration", {})


def test_flat_1_x_ha_key_and_zookeeper() -> None:
    imp = conv(fd(flinkConfiguration={"high-availability": "kubernetes", "high-availability.storageDir": "s3://h"}))
    assert imp.app is not None and imp.app["spec"]["highAvailability"]["enabled"] is True
    zk = conv(fd(flinkConfiguration={"high-availability.type": "zookeeper"}))
    assert "spec.flinkConfiguration.high-availability.type" in fields(zk, changing=True)


def test_last_state_without_ha_changes_behaviour_and_gets_the_operator_interval() -> None:
    imp = conv(fd(job={"jarURI": "local:///x.jar", "parallelism": 1, "upgradeMode": "last-state"}))
    assert "spec.job.upgradeMode" in fields(imp, changing=True)
    assert imp.app is not None
    assert imp.app["spec"]["flinkConfiguration"]["execution.checkpointing.interval"] == "5 min"


def test_job_fields() -> None:
    imp = conv(fd(restartNonce=3, job={
        "jarURI": "https://repo/x.jar", "entryClass": "a.B", "args": ["--n", 10, True], "parallelism": 1,
        "upgradeMode": "savepoint", "state": "suspended", "allowNonRestoredState": True,
        "initialSavepointPath": "s3://b/sp-1", "savepointRedeployNonce": 2, "savepointTriggerNonce": 7}))
    assert imp.app is not None
    job = imp.app["spec"]["job"]
    assert job == {"jarURI": "https://repo/x.jar", "entryClass": "a.B", "args": ["--n", "10", "true"],
                   "parallelism": 1, "upgradeMode": "savepoint", "state": "suspended",
                   "allowNonRestoredState": True, "initialSavepointPath": "s3://b/sp-1",
                   "savepointRedeployNonce": 2, "restartNonce": 3}
    assert "spec.job.savepointTriggerNonce" in fields(imp, changing=False)


def test_operator_options() -> None:
    imp = conv(fd(flinkConfiguration={"kubernetes.operator": {
        "savepoint.history.max.count": 7, "savepoint.history.max.age": "24 h",
        "job.upgrade.last-state.max.allowed.checkpoint.age": "10 min",
        "periodic.savepoint.interval": "1h", "deployment.rollback.enabled": True, "some.new.option": 1}}))
    assert imp.app is not None
    assert imp.app["spec"]["savepoints"] == {"retain": 7, "maxAge": "24h"}
    assert imp.app["spec"]["job"]["maxCheckpointAge"] == "10m"
    assert fields(imp, changing=True) == {"spec.flinkConfiguration.kubernetes.operator.periodic.savepoint.interval",
                                          "spec.flinkConfiguration.kubernetes.operator.some.new.option"}
    assert "spec.flinkConfiguration.kubernetes.operator.deployment.rollback.enabled" in fields(imp, changing=False)
    FlinkApp.model_validate(imp.app)


def test_reported_not_mapped() -> None:
    imp = conv(fd(ingress={"template": "{{name}}.example.com"}, logConfiguration={"log4j-console.properties": "x"},
                  jobManager={"resource": {"memory": "1g"}, "podTemplate": {"spec": {}}}, brandNew=1,
                  flinkConfiguration={"kubernetes.rest-service.exposed.type": "LoadBalancer", "rest.port": 9999,
                                      "job.autoscaler.enabled": True}))
    assert fields(imp, changing=True) >= {
        "spec.ingress", "spec.logConfiguration", "spec.jobManager.podTemplate", "spec.brandNew",
        "spec.flinkConfiguration.kubernetes.rest-service.exposed.type", "spec.flinkConfiguration.rest.port",
        "spec.flinkConfiguration.job.autoscaler.enabled"}


def test_image_pull_policy_goes_to_the_main_container() -> None:
    imp = conv(fd(imagePullPolicy="Always", podTemplate={"spec": {"containers": [{"name": "sidecar",
                                                                                  "image": "busybox"}]}}))
    assert imp.app is not None
    containers = imp.app["spec"]["podTemplate"]["spec"]["containers"]
    assert {"name": "flink-main-container", "imagePullPolicy": "Always"} in containers
    assert {"name": "sidecar", "image": "busybox"} in containers


def test_input_is_not_mutated() -> None:
    doc = fd(podTemplate={"spec": {"containers": [{"name": "flink-main-container"}]}}, imagePullPolicy="Always")
    before = copy.deepcopy(doc)
    conv(doc)
    assert doc == before


# --- kinds, lists and hostile input -------------------------------------------------------------------------


def test_lists_and_other_kinds_are_reported_never_dropped() -> None:
    docs = [{"apiVersion": "v1", "kind": "List", "items": [fd(), {
        "apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkSessionJob", "metadata": {"name": "sj"}}]},
        {"apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkStateSnapshot", "metadata": {"name": "s"}},
        {"apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkBlueGreenDeployment", "metadata": {"name": "b"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}, None, "just text"]
    out = import_documents(docs)
    assert [(o.kind, o.app is not None) for o in out] == [
        ("FlinkDeployment", True), ("FlinkSessionJob", False), ("FlinkStateSnapshot", False),
        ("FlinkBlueGreenDeployment", False), ("ConfigMap", False), ("?", False)]
    assert all(o.findings for o in out[1:])
    assert [(f.field, f.message) for f in out[1].findings] == [
        ("spec", "missing (or not a map): a FlinkSessionJob needs a spec")]


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["spec"].__setitem__("job", "run it"), "spec.job"),
    (lambda d: d["spec"].__setitem__("job", None), "spec.job"),
    (lambda d: d["spec"]["job"].pop("jarURI"), "spec.job.jarURI"),
    (lambda d: d["spec"].__setitem__("flinkConfiguration", ["a", "b"]), "spec.flinkConfiguration"),
    (lambda d: d["spec"].__setitem__("flinkConfiguration", {"a": [{"b": 1}]}), "spec.flinkConfiguration.a"),
    (lambda d: d["spec"].__setitem__("flinkConfiguration", {1.5: {True: 2}}), "spec.flinkConfiguration"),
    (lambda d: d["spec"]["jobManager"].__setitem__("resource", {"memory": "lots"}),
     "spec.jobManager.resource.memory"),
    (lambda d: d["spec"]["taskManager"].__setitem__("resource", {"cpu": 2}), "spec.taskManager.resources.requests."
                                                                            "memory"),
    (lambda d: d["spec"]["jobManager"].__setitem__("resources", "big"), "spec.jobManager.resources"),
    (lambda d: d["spec"]["job"].__setitem__("parallelism", "many"), "spec.job.parallelism"),
    (lambda d: d["spec"]["job"].__setitem__("upgradeMode", "magic"), "spec.job.upgradeMode"),
    (lambda d: d["spec"].__setitem__("flinkVersion", "latest"), "spec.flinkVersion"),
    (lambda d: d["metadata"].__setitem__("name", "Not_A_Name"), "metadata.name"),
    (lambda d: d.__setitem__("metadata", None), "metadata.name"),
    (lambda d: d.__setitem__("spec", [1]), "spec"),
])
def test_hostile_documents_give_one_clear_finding(mutate: Any, field: str) -> None:
    doc = fd()
    mutate(doc)
    imp = conv(doc)
    assert imp.app is None
    assert [f.field for f in imp.findings] == [field]
    assert imp.findings[0].changes_behaviour


def test_deeply_nested_configuration() -> None:
    conf: dict[str, Any] = {"v": 1}
    for _ in range(40):
        conf = {"a": conf}
    imp = conv(fd(flinkConfiguration=conf))
    assert imp.app is None and "nested" in imp.findings[0].message


# --- the operator's own examples ---------------------------------------------------------------------------

# file -> {document name: (imported, runs the same, FlinkDeployment fields that change behaviour)}
EXPECTED: dict[str, dict[str, tuple[bool, bool, set[str]]]] = {
    "basic.yaml": {"basic-example": (True, True, set())},
    "basic-checkpoint-ha.yaml": {"basic-checkpoint-ha-example": (True, True, set())},
    "basic-reactive.yaml": {"basic-reactive-example": (True, True, set())},
    "pod-template.yaml": {"pod-template-example": (True, False, {"spec.jobManager.podTemplate"})},
    "custom-logging.yaml": {"custom-logging-example": (True, False, {"spec.logConfiguration"})},
    "basic-ingress.yaml": {"basic-ingress": (True, False, {"spec.ingress"})},
    "autoscaling-autoscaling.yaml": {"autoscaling-example": (
        True, False, {"spec.flinkConfiguration.job.autoscaler.enabled"})},
    "basic-session-deployment-and-job.yaml": {
        "basic-session-deployment-example": (True, True, set()),
        "basic-session-job-example": (True, True, set()),
        "basic-session-job-example2": (True, True, set())},
    "basic-session-deployment-only.yaml": {"basic-session-deployment-only-example": (True, True, set())},
    # alone, its session cluster is missing (tests/cli/test_import_cli.py imports it with its cluster)
    "basic-session-job-only.yaml": {"basic-session-job-only-example": (True, False, {"spec.deploymentName"})},
    "snapshot-job-from-savepoint.yaml": {"example-savepoint": (False, False, {"kind"}),
                                         "example-deployment": (True, True, set())},
    "snapshot-savepoint-job-full-spec.yaml": {"example-savepoint": (False, False, {"kind"})},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_operator_examples(name: str) -> None:
    text = (EXAMPLES / name).read_text()
    assert "Licensed to the Apache Software Foundation" in text
    out = import_documents(yaml.safe_load_all(text), namespace="flink")  # they name none: import --namespace
    got = {o.name: (o.app is not None, not o.changes_behaviour, fields(o, changing=True)) for o in out}
    assert got == EXPECTED[name]
    # Without --namespace, each imported one is flagged: the file does not say where it runs.
    bare = import_documents(yaml.safe_load_all(text))
    assert all("metadata.namespace" in fields(o, changing=True) for o in bare if o.app is not None)
    for o in out:
        if o.app is not None:  # always a valid spec (runtime checks are the CLI's: test_import_cli)
            (FlinkSessionCluster if o.app["kind"] == "FlinkSessionCluster" else FlinkApp).model_validate(o.app)


def test_every_copied_example_is_covered() -> None:
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == set(EXPECTED)
