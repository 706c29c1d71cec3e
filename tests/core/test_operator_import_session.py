"""Session mode of the operator import (pure): a FlinkDeployment without spec.job -> FlinkSessionCluster, a
FlinkSessionJob -> a FlinkApp on it, the two read together."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.operator_migration.application import Imported
from reconciler.operator_migration.documents import import_documents, import_groups
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import FlinkSessionCluster

API = "flink.apache.org/v1beta1"


def session(name: str = "shared", ns: str | None = "team", **spec: Any) -> dict[str, Any]:
    """A minimal session-mode FlinkDeployment, fields overridden by `spec`."""
    base: dict[str, Any] = {
        "image": "flink:2.2", "flinkVersion": "v2_2", "serviceAccount": "flink",
        "jobManager": {"resources": {"requests": {"memory": "2048m", "cpu": "1"}}},
        "taskManager": {"resources": {"requests": {"memory": "2048m", "cpu": "1"}}},
    }
    base.update(spec)
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {"apiVersion": API, "kind": "FlinkDeployment", "metadata": meta, "spec": base}


def sjob(name: str, target: str | None = "shared", ns: str | None = "team", **job: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"job": {"jarURI": "https://repo.example/job.jar", "parallelism": 2,
                                    "upgradeMode": "stateless", **job}}
    if target is not None:
        spec["deploymentName"] = target
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {"apiVersion": API, "kind": "FlinkSessionJob", "metadata": meta, "spec": spec}


def by_name(out: list[Imported]) -> dict[str, Imported]:
    return {str(o.name): o for o in out}


def fields(imp: Imported, *, changing: bool | None = None) -> set[str]:
    return {f.field for f in imp.findings if changing is None or f.changes_behaviour is changing}


def cluster(imp: Imported) -> FlinkSessionCluster:
    assert imp.app is not None, imp.findings
    return FlinkSessionCluster.model_validate(imp.app)


def app(imp: Imported) -> FlinkApp:
    assert imp.app is not None, imp.findings
    return FlinkApp.model_validate(imp.app)


# --- session clusters ----------------------------------------------------------------------------------------


def test_native_session_cluster_starts_taskmanagers_on_demand_up_to_its_jobs_need() -> None:
    out = by_name(import_documents([
        session(flinkConfiguration={"taskmanager.numberOfTaskSlots": 2}),
        sjob("a", parallelism=3), sjob("b", parallelism=2), sjob("c", parallelism=8, state="suspended")]))
    c = cluster(out["shared"])
    assert (c.name, c.metadata.namespace, c.spec.flink_version, c.spec.image) == ("shared", "team", "2.2", "flink:2.2")
    assert c.spec.runtime.service_account == "flink"
    assert (c.spec.task_manager.replicas, c.spec.task_manager.slots) == (0, 2)
    assert c.spec.capacity.add_task_managers and c.spec.capacity.max_task_managers == 3  # 5 running slots / 2
    assert c.spec.job_manager.resources.memory == "2g" and c.spec.task_manager.resources.cpu == 1.0
    assert not out["shared"].changes_behaviour, out["shared"].findings
    assert out["shared"].origins[("spec", "capacity", "maxTaskManagers")] == \
        "the running session jobs imported with it: 5 slots / 2 per TaskManager"


def test_a_session_cluster_alone_gets_a_ceiling_of_one_with_a_note() -> None:
    (imp,) = import_documents([session()])
    assert cluster(imp).spec.capacity.max_task_managers == 1
    assert "spec.taskManager" in fields(imp, changing=False) and not imp.changes_behaviour


def test_the_slot_limit_of_flink_is_the_ceiling() -> None:
    (imp,) = import_documents([session(flinkConfiguration={"taskmanager.numberOfTaskSlots": "4",
                                                           "slotmanager.number-of-slots.max": "10"})])
    c = cluster(imp)
    assert c.spec.capacity.max_task_managers == 2  # 10 slots / 4, rounded down
    assert c.spec.flink_configuration["slotmanager.number-of-slots.max"] == "10"  # Flink still enforces it


def test_native_replicas_are_ignored_as_by_the_operator() -> None:
    (imp,) = import_documents([session(taskManager={"replicas": 3, "resource": {"memory": "1g"}})])
    assert cluster(imp).spec.task_manager.replicas == 0
    assert "spec.taskManager.replicas" in fields(imp, changing=False)


@pytest.mark.parametrize(("replicas", "expected"), [(3, 3), (None, 1)])
def test_standalone_session_cluster_has_a_fixed_count(replicas: int | None, expected: int) -> None:
    tm: dict[str, Any] = {"resource": {"memory": "1g"}, **({"replicas": replicas} if replicas else {})}
    (imp,) = import_documents([session(mode="standalone", taskManager=tm)])
    c = cluster(imp)
    assert c.spec.task_manager.replicas == expected and not c.spec.capacity.add_task_managers


def test_configuration_nested_renamed_ha_and_pod_template_as_in_application_mode() -> None:
    (imp,) = import_documents([session(
        flinkConfiguration={"state": {"savepoints.dir": "s3://b/sp", "backend": "rocksdb"},
                            "high-availability": {"type": "kubernetes", "storageDir": "s3://b/ha"},
                            "parallelism.default": 3},
        podTemplate={"spec": {"containers": [{"name": "flink-main-container", "env": [{"name": "A", "value": "1"}]}]}},
        jobManager={"replicas": 2, "resource": {"memory": "1g", "cpu": 0.5}})])
    c = cluster(imp)
    assert c.spec.flink_configuration == {"execution.checkpointing.savepoint-dir": "s3://b/sp",
                                          "state.backend.type": "rocksdb"}
    assert c.spec.high_availability.enabled and c.spec.high_availability.storage_dir == "s3://b/ha"
    assert c.spec.job_manager.replicas == 2 and c.spec.job_manager.resources.cpu == 0.5
    assert c.spec.pod_template is not None and c.spec.pod_template["spec"]["containers"][0]["env"]
    assert {"spec.flinkConfiguration.state.savepoints.dir", "spec.flinkConfiguration.parallelism.default"} <= \
        fields(imp, changing=False)
    assert "pipeline.name" not in c.spec.flink_configuration  # a session cluster has no job to name


def test_session_cluster_reports_what_it_cannot_carry() -> None:
    (imp,) = import_documents([session(
        ingress={"template": "x"}, taskManager={"podTemplate": {"spec": {}}, "resource": {"memory": "1g"}},
        flinkConfiguration={"high-availability.type": "zookeeper", "kubernetes.hostnetwork.enabled": "true"})])
    assert imp.app is not None
    assert fields(imp, changing=True) == {"spec.ingress", "spec.taskManager.podTemplate",
                                          "spec.flinkConfiguration.high-availability.type",
                                          "spec.flinkConfiguration.kubernetes.hostnetwork.enabled"}


# --- session jobs --------------------------------------------------------------------------------------------


def test_session_job_fields() -> None:
    out = by_name(import_documents([session(), sjob(
        "j", entryClass="com.example.Main", args=["--n", 3], parallelism=2, upgradeMode="savepoint",
        state="suspended", allowNonRestoredState=True, initialSavepointPath="s3://b/sp/savepoint-1",
        savepointRedeployNonce=4, savepointTriggerNonce=7)]))
    a = app(out["j"])
    assert a.spec.session_cluster == "shared" and a.metadata.namespace == "team"
    job = a.spec.job
    assert (job.jar_uri, job.entry_class, job.args, job.parallelism) == (
        "https://repo.example/job.jar", "com.example.Main", ("--n", "3"), 2)
    assert (job.upgrade_mode.value, job.state.value, job.allow_non_restored_state) == ("savepoint", "suspended", True)
    assert (job.initial_savepoint_path, job.savepoint_redeploy_nonce) == ("s3://b/sp/savepoint-1", 4)
    assert not out["j"].changes_behaviour, out["j"].findings
    assert {"spec.job.savepointTriggerNonce", "spec.job.initialSavepointPath"} <= fields(out["j"], changing=False)


def test_restart_nonce_and_defaults() -> None:
    doc = sjob("j")
    doc["spec"]["restartNonce"] = 5
    del doc["spec"]["job"]["parallelism"], doc["spec"]["job"]["upgradeMode"]
    out = by_name(import_documents([session(), doc]))
    job = app(out["j"]).spec.job
    assert (job.restart_nonce, job.parallelism, job.upgrade_mode.value) == (5, 1, "stateless")


def test_a_stateful_session_job_without_a_savepoint_path_is_flagged() -> None:
    out = by_name(import_documents([session(), sjob("j", upgradeMode="last-state")]))
    assert fields(out["j"], changing=True) == {"spec.job.upgradeMode"}
    assert "initialSavepointPath" in next(f.message for f in out["j"].findings)


def test_cluster_operator_options_and_default_parallelism_carry_to_its_jobs() -> None:
    shared = session(flinkConfiguration={"kubernetes.operator.savepoint.history.max.count": "4",
                                         "kubernetes.operator.deployment.readiness.timeout": "10 min",
                                         "parallelism.default": "3"})
    mine = sjob("mine")
    mine["spec"]["flinkConfiguration"] = {"kubernetes.operator": {"savepoint.history.max.count": 2}}
    del mine["spec"]["job"]["parallelism"]
    out = by_name(import_documents([shared, sjob("theirs"), mine]))
    theirs, own = app(out["theirs"]), app(out["mine"])
    assert theirs.spec.savepoints.retain == 4 and own.spec.savepoints.retain == 2  # the job's own wins
    assert theirs.spec.deadlines.start.total_seconds() == 600
    assert own.spec.job.parallelism == 3 and theirs.spec.job.parallelism == 2
    assert out["theirs"].origins[("spec", "savepoints", "retain")] == \
        "FlinkDeployment shared spec.flinkConfiguration.kubernetes.operator.savepoint.history.max.count"
    assert {"spec.flinkConfiguration.kubernetes.operator.savepoint.history.max.count"} <= \
        fields(out["shared"], changing=False)


def test_a_session_jobs_own_flink_keys_and_foreign_jars_are_reported() -> None:
    doc = sjob("j", jarURI="s3://bucket/job.jar")
    doc["spec"]["flinkConfiguration"] = {"pipeline.max-parallelism": 128,
                                         "kubernetes.operator.periodic.savepoint.interval": "1h"}
    out = by_name(import_documents([session(), doc]))
    assert out["j"].app is not None
    assert fields(out["j"], changing=True) == {
        "spec.job.jarURI", "spec.flinkConfiguration.pipeline.max-parallelism",
        "spec.flinkConfiguration.kubernetes.operator.periodic.savepoint.interval"}


def test_a_session_job_whose_cluster_is_missing_or_not_imported_says_so() -> None:
    broken = session("broken", flinkVersion="latest")
    out = by_name(import_documents([sjob("lost", "nowhere"), broken, sjob("orphan", "broken"),
                                    sjob("elsewhere", ns="other"), session()]))
    assert out["broken"].app is None
    for name, text in (("lost", "not among the imported documents"), ("orphan", "was not imported"),
                       ("elsewhere", "other/shared is not among")):
        assert fields(out[name], changing=True) == {"spec.deploymentName"}, name
        assert text in out[name].findings[-1].message
    assert cluster(out["shared"]).spec.capacity.max_task_managers == 1  # the job in `other` is not its


def test_documents_without_a_namespace_meet_in_default() -> None:
    out = by_name(import_documents([session(ns=None), sjob("j", ns=None, parallelism=4)]))
    assert cluster(out["shared"]).spec.capacity.max_task_managers == 4
    # written as default, and flagged: the file does not say where they run
    assert app(out["j"]).metadata.namespace == "default"
    assert [f.field for f in out["j"].findings if f.changes_behaviour] == ["metadata.namespace"]
    named = by_name(import_documents([session(ns=None), sjob("j", ns=None, parallelism=4)], namespace="prod"))
    assert cluster(named["shared"]).spec.capacity.max_task_managers == 4
    assert app(named["j"]).metadata.namespace == "prod" and not named["j"].changes_behaviour


def test_groups_are_linked_across_and_numbered_each() -> None:
    first, second = import_groups([[sjob("j", parallelism=3), "text"], ["more text", session()]])
    assert [o.index for o in first] == [0, 1] and [o.index for o in second] == [0, 1]
    assert not first[0].changes_behaviour and cluster(second[1]).spec.capacity.max_task_managers == 3
    assert first[1].findings[0].message.startswith("document 2 ") and second[0].findings[0].message.startswith(
        "document 1 ")


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["spec"].pop("deploymentName"), "spec.deploymentName"),
    (lambda d: d["spec"].__setitem__("deploymentName", {"a": 1}), "spec.deploymentName"),
    (lambda d: d["spec"].__setitem__("deploymentName", "Not_A_Name"), "spec.deploymentName"),
    (lambda d: d["spec"].pop("job"), "spec.job"),
    (lambda d: d["spec"].__setitem__("job", ["x"]), "spec.job"),
    (lambda d: d["spec"]["job"].pop("jarURI"), "spec.job.jarURI"),
    (lambda d: d["spec"]["job"].__setitem__("parallelism", 0), "spec.job.parallelism"),
    (lambda d: d["spec"]["job"].__setitem__("state", "paused"), "spec.job.state"),
    (lambda d: d["spec"].__setitem__("flinkConfiguration", "x=1"), "spec.flinkConfiguration"),
    (lambda d: d.__setitem__("spec", None), "spec"),
    (lambda d: d["metadata"].pop("name"), "metadata.name"),
])
def test_hostile_session_jobs_give_one_clear_finding(mutate: Any, field: str) -> None:
    doc = sjob("j")
    mutate(doc)
    out = import_documents([session(), doc])
    assert out[1].app is None and out[1].kind == "FlinkSessionJob"
    assert [f.field for f in out[1].findings] == [field]
    assert out[1].findings[0].changes_behaviour
