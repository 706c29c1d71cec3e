"""Every field of the operator's spec classes, one row each: imported faithfully (the FlinkApp value the operator's
pods would get) or flagged with the reason; and every imported spec validates AND renders.

The classes and their fields as in apache/flink-kubernetes-operator main at 6e9caeb (1.16-SNAPSHOT),
flink-kubernetes-operator-api `spec/`: AbstractFlinkSpec (job, restartNonce, flinkConfiguration),
FlinkDeploymentSpec (image, imagePullPolicy, serviceAccount, flinkVersion, ingress, podTemplate, jobManager,
taskManager, logConfiguration, mode), JobSpec (jarURI, parallelism, entryClass, args, state,
savepointTriggerNonce, initialSavepointPath, checkpointTriggerNonce, upgradeMode, allowNonRestoredState,
savepointRedeployNonce, autoscalerResetNonce), JobManagerSpec (resource, resources, replicas, podTemplate),
TaskManagerSpec (resource, resources, replicas, podTemplate), Resource (cpu, memory, ephemeralStorage),
IngressSpec (template, className, annotations, labels, tls), FlinkSessionJobSpec (deploymentName, job,
restartNonce, flinkConfiguration). Defaults the operator applies: JobSpec.state RUNNING, upgradeMode STATELESS,
JobManagerSpec.replicas 1 (FlinkConfigBuilder), DefaultValidator's "Job parallelism must be larger than 0".
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from reconciler.errors import ReconcilerError
from reconciler.live.kubernetes.render import kubernetes_problems, render_app, session_cluster_app
from reconciler.operator_migration.application import Imported
from reconciler.operator_migration.documents import import_documents
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import FlinkSessionCluster, effective_app

Obj = dict[str, Any]
SESSION_API = "flink.apache.org/v1beta1"


def fd(**spec: Any) -> Obj:
    base: Obj = {
        "image": "flink:2.3", "flinkVersion": "v2_2",
        "flinkConfiguration": {"taskmanager.numberOfTaskSlots": "2"},
        "jobManager": {"resource": {"memory": "2048m", "cpu": 1}},
        "taskManager": {"resource": {"memory": "2048m", "cpu": 1}},
        "job": {"jarURI": "local:///opt/flink/usrlib/job.jar", "parallelism": 2, "upgradeMode": "stateless"},
    }
    for k, v in spec.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return {"apiVersion": SESSION_API, "kind": "FlinkDeployment", "metadata": {"name": "app", "namespace": "team"},
            "spec": base}


def job(**fields: Any) -> Obj:
    return fd(job={"jarURI": "local:///opt/flink/usrlib/job.jar", "parallelism": 2, "upgradeMode": "stateless",
                   **fields})


def drop(path: str) -> Callable[[Obj], Obj]:
    def f(doc: Obj) -> Obj:
        *head, last = path.split(".")
        node = doc
        for p in head:
            node = node[p]
        node.pop(last)
        return doc
    return f


@dataclass(frozen=True)
class Row:
    id: str
    doc: Obj
    faithful: dict[str, Any] | None = None  # FlinkApp dotted path -> value it must have
    flagged: str | None = None  # a finding on this field that changes behaviour (a `!` line)
    noted: str | None = None  # a finding on this field that does not


def at(app: Obj, path: str) -> Any:
    head, conf, key = path.partition("spec.flinkConfiguration.")  # Flink keys have dots of their own
    if conf:
        return app["spec"]["flinkConfiguration"][key]
    node: Any = app
    for p in head.split("."):
        node = node[p]
    return node


TM_RES = {"requests": {"memory": "4Gi", "cpu": "2"}}
ROWS = [
    # AbstractFlinkSpec
    Row("restartNonce", fd(restartNonce=7), {"spec.job.restartNonce": 7}),
    Row("flinkConfiguration (a user option)", fd(flinkConfiguration={"pipeline.max-parallelism": "128"}),
        {"spec.flinkConfiguration.pipeline.max-parallelism": "128"}),
    Row("flinkConfiguration execution.savepoint.path", fd(flinkConfiguration={
        "execution.savepoint.path": "s3://b/sp/savepoint-1"}),
        flagged="spec.flinkConfiguration.execution.savepoint.path"),
    Row("flinkConfiguration execution.state-recovery.path", fd(flinkConfiguration={
        "execution.state-recovery.path": "s3://b/sp/savepoint-1"}),
        flagged="spec.flinkConfiguration.execution.state-recovery.path"),
    Row("flinkConfiguration a Helm expression", fd(flinkConfiguration={
        "pipeline.name": "{{ .Values.name }}"}), flagged="spec.flinkConfiguration.pipeline.name"),
    Row("taskmanager.numberOfTaskSlots 0", fd(flinkConfiguration={"taskmanager.numberOfTaskSlots": "0"}),
        flagged="spec.flinkConfiguration.taskmanager.numberOfTaskSlots"),
    # FlinkDeploymentSpec
    Row("image", fd(image="registry/x:1"), {"spec.image": "registry/x:1"}),
    Row("image missing", drop("spec.image")(fd()), flagged="spec.image"),
    Row("imagePullPolicy", fd(imagePullPolicy="Always"),
        {"spec.podTemplate.spec.containers": [{"name": "flink-main-container", "imagePullPolicy": "Always"}]}),
    Row("serviceAccount", fd(serviceAccount="flink"), {"spec.runtime.serviceAccount": "flink"}),
    Row("flinkVersion", fd(flinkVersion="v2_0"), {"spec.flinkVersion": "2.0"}),
    Row("flinkVersion 1.18", fd(flinkVersion="v1_18"), flagged="spec.flinkVersion"),
    Row("ingress", fd(ingress={"template": "{{name}}.{{namespace}}.example.com"}), flagged="spec.ingress"),
    Row("podTemplate", fd(podTemplate={"spec": {"nodeSelector": {"pool": "flink"}}}),
        {"spec.podTemplate.spec.nodeSelector": {"pool": "flink"}}),
    Row("logConfiguration", fd(logConfiguration={"log4j-console.properties": "rootLogger.level = WARN"}),
        flagged="spec.logConfiguration"),
    Row("mode native", fd(mode="native"), noted="spec.mode"),
    Row("mode standalone", fd(mode="standalone"), {"spec.taskManager.replicas": 1}),
    Row("mode unknown", fd(mode="yarn"), flagged="spec.mode"),
    Row("an unknown spec field", fd(colour="blue"), flagged="spec.colour"),
    # JobSpec
    Row("job.jarURI", job(jarURI="local:///opt/flink/usrlib/other.jar"),
        {"spec.job.jarURI": "local:///opt/flink/usrlib/other.jar"}),
    Row("job.jarURI s3://", job(jarURI="s3://b/job.jar"), flagged="spec.job.jarURI"),
    Row("job.parallelism", job(parallelism=6), {"spec.job.parallelism": 6, "spec.taskManager.replicas": 3}),
    Row("job.parallelism missing", drop("spec.job.parallelism")(fd()), flagged="spec.job.parallelism"),
    Row("job.entryClass", job(entryClass="com.example.Main"), {"spec.job.entryClass": "com.example.Main"}),
    Row("job.args", job(args=["--in", 3]), {"spec.job.args": ["--in", "3"]}),
    Row("job.state suspended", job(state="suspended"), {"spec.job.state": "suspended"}),
    Row("job.savepointTriggerNonce", job(savepointTriggerNonce=3), noted="spec.job.savepointTriggerNonce"),
    Row("job.checkpointTriggerNonce", job(checkpointTriggerNonce=3), noted="spec.job.checkpointTriggerNonce"),
    Row("job.initialSavepointPath", job(initialSavepointPath="s3://b/sp/savepoint-1"),
        {"spec.job.initialSavepointPath": "s3://b/sp/savepoint-1"}),
    Row("job.upgradeMode missing (stateless)", drop("spec.job.upgradeMode")(fd()),
        {"spec.job.upgradeMode": "stateless"}),
    Row("job.allowNonRestoredState", job(allowNonRestoredState=True), {"spec.job.allowNonRestoredState": True}),
    Row("job.savepointRedeployNonce", job(savepointRedeployNonce=2), {"spec.job.savepointRedeployNonce": 2}),
    Row("job.autoscalerResetNonce", job(autoscalerResetNonce=2), noted="spec.job.autoscalerResetNonce"),
    Row("job: an unknown field", job(colour="blue"), flagged="spec.job.colour"),
    # JobManagerSpec
    Row("jobManager.resources", fd(jobManager={"resources": {"requests": {"memory": "3Gi", "cpu": "500m"}}}),
        {"spec.jobManager.resources.memory": "3g", "spec.jobManager.resources.cpu": 0.5}),
    Row("jobManager.replicas", fd(jobManager={"replicas": 1}), {"spec.jobManager.replicas": 1}),
    Row("kubernetes.jobmanager.replicas beside a jobManager block", fd(flinkConfiguration={
        "kubernetes.jobmanager.replicas": "2"}), {"spec.jobManager.replicas": 1},
        flagged="spec.flinkConfiguration.kubernetes.jobmanager.replicas"),
    Row("jobManager.podTemplate", fd(jobManager={"podTemplate": {"spec": {}}}), flagged="spec.jobManager.podTemplate"),
    # TaskManagerSpec
    Row("taskManager.resources", fd(taskManager={"resources": TM_RES}),
        {"spec.taskManager.resources.memory": "4g", "spec.taskManager.resources.cpu": 2.0}),
    Row("taskManager.replicas", fd(taskManager={"replicas": 3}), {"spec.taskManager.replicas": 3,
                                                                  "spec.job.parallelism": 6}),
    Row("taskManager.podTemplate", fd(taskManager={"podTemplate": {"spec": {}}}),
        flagged="spec.taskManager.podTemplate"),
    # Resource (the deprecated form)
    Row("resource.cpu", fd(taskManager={"resource": {"memory": "2048m", "cpu": 0.25}}),
        {"spec.taskManager.resources.cpu": 0.25}),
    Row("resource.memory", fd(taskManager={"resource": {"memory": "1.5Gi", "cpu": 1}}),
        {"spec.taskManager.resources.memory": "1536m"}),
    Row("resource.ephemeralStorage", fd(taskManager={"resource": {"memory": "2048m", "cpu": 1,
                                                                  "ephemeralStorage": "1Gi"}}),
        flagged="spec.taskManager.resource.ephemeralStorage"),
    # IngressSpec: no Ingress is created; every field of it flags the whole
    *(Row(f"ingress.{k}", fd(ingress={k: v}), flagged="spec.ingress") for k, v in (
        ("template", "{{name}}.example.com"), ("className", "nginx"), ("annotations", {"a": "b"}),
        ("labels", {"a": "b"}), ("tls", [{"hosts": ["x"]}]))),
    # metadata
    Row("metadata.namespace missing", drop("metadata.namespace")(fd()), {"metadata.namespace": "default"},
        flagged="metadata.namespace"),
    Row("takeover.from is written", fd(), {"spec.takeover.from": "FlinkDeployment/app"}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_each_field_is_imported_faithfully_or_flagged(row: Row) -> None:
    (imp,) = import_documents([copy.deepcopy(row.doc)])
    flagged = {f.field for f in imp.findings if f.changes_behaviour}
    noted = {f.field for f in imp.findings if not f.changes_behaviour}
    if row.flagged:
        assert row.flagged in flagged, imp.findings
    else:
        assert not flagged - {"spec.flinkVersion"}, imp.findings
    if row.noted:
        assert row.noted in noted, imp.findings
    for path, value in (row.faithful or {}).items():
        assert imp.app is not None, imp.findings
        assert at(imp.app, path) == value, (path, imp.app)
    if imp.app is not None:
        validates_and_renders(imp)


def validates_and_renders(imp: Imported, clusters: dict[str, FlinkSessionCluster] | None = None) -> None:
    """What `validate` accepts, `render` renders: the same models, then the Kubernetes objects."""
    assert imp.app is not None
    if imp.app["kind"] == "FlinkSessionCluster":
        cluster = FlinkSessionCluster.model_validate(imp.app)
        assert render_app(session_cluster_app(cluster), revision="r", job_id=None, restore_path=None)
        return
    app = FlinkApp.model_validate(imp.app)
    if app.spec.session_cluster is None:
        if kubernetes_problems(app):  # what `validate --runtime kubernetes` refuses, render refuses: said, not raised
            with pytest.raises(ReconcilerError):
                render_app(app, revision="r", job_id="0" * 32, restore_path=None)
            return
        assert render_app(app, revision="r", job_id="0" * 32, restore_path=None)
    elif clusters and app.spec.session_cluster in clusters:
        effective_app(app, clusters[app.spec.session_cluster])


SESSION = {"apiVersion": SESSION_API, "kind": "FlinkDeployment", "metadata": {"name": "shared", "namespace": "team"},
           "spec": {"image": "flink:2.3", "flinkVersion": "v2_2", "flinkConfiguration": {
               "taskmanager.numberOfTaskSlots": "2"},
               "jobManager": {"resource": {"memory": "2048m", "cpu": 1}},
               "taskManager": {"resource": {"memory": "2048m", "cpu": 1}}}}


def sjob(**spec: Any) -> Obj:
    base: Obj = {"deploymentName": "shared", "job": {"jarURI": "local:///opt/flink/usrlib/j.jar", "parallelism": 2,
                                                      "upgradeMode": "stateless"}}
    base.update(spec)
    return {"apiVersion": SESSION_API, "kind": "FlinkSessionJob", "metadata": {"name": "j", "namespace": "team"},
            "spec": base}


@pytest.mark.parametrize(("doc", "faithful", "flagged"), [
    (sjob(), {"spec.sessionCluster": "shared", "spec.job.parallelism": 2}, None),
    (sjob(deploymentName="elsewhere"), None, "spec.deploymentName"),
    (sjob(restartNonce=4), {"spec.job.restartNonce": 4}, None),
    (sjob(flinkConfiguration={"pipeline.name": "x"}), None, "spec.flinkConfiguration.pipeline.name"),
], ids=["deploymentName", "deploymentName elsewhere", "restartNonce", "flinkConfiguration"])
def test_each_session_job_field(doc: Obj, faithful: dict[str, Any] | None, flagged: str | None) -> None:
    """FlinkSessionJobSpec, read with its session cluster (native mode: taskManager.replicas 0, which validate
    accepts and render must render)."""
    cluster_imp, imp = import_documents([copy.deepcopy(SESSION), doc])
    assert cluster_imp.app is not None and cluster_imp.app["spec"]["taskManager"]["replicas"] == 0
    validates_and_renders(cluster_imp)
    changing = {f.field for f in imp.findings if f.changes_behaviour}
    assert (flagged in changing) if flagged else not changing, imp.findings
    for path, value in (faithful or {}).items():
        assert imp.app is not None and at(imp.app, path) == value
    if imp.app is not None:
        validates_and_renders(imp, {"shared": FlinkSessionCluster.model_validate(cluster_imp.app)})


GARBAGE = [
    "just text", "- a\n- list", "42", "~", "{}", "kind: FlinkDeployment", "apiVersion: flink.apache.org/v1beta1",
    "apiVersion: flink.apache.org/v1beta1\nkind: FlinkDeployment\nmetadata: []",
    "apiVersion: flink.apache.org/v1beta1\nkind: FlinkDeployment\nmetadata: {name: x}\nspec: 3",
    "apiVersion: flink.apache.org/v1beta1\nkind: FlinkDeployment\nmetadata: {name: x}\nspec: {job: 3}",
    "apiVersion: flink.apache.org/v1beta1\nkind: FlinkDeployment\nmetadata: {name: x}\n"
    "spec: {job: {}, flinkVersion: 7}",
    "apiVersion: flink.apache.org/v1beta1\nkind: FlinkDeployment\nmetadata: {name: x}\n"
    "spec: {flinkVersion: v2_2, job: {jarURI: local:///a.jar, parallelism: x}, jobManager: {resource: {memory: 1g}},"
    " taskManager: {resource: {memory: 1g}}}",
    "apiVersion: flink.apache.org/v1beta1\nkind: FlinkDeployment\nmetadata: {name: x}\n"
    "spec: {flinkVersion: v2_2, job: {jarURI: local:///a.jar, parallelism: 2}, jobManager: {resource: {memory: []}},"
    " taskManager: {resource: {memory: 1g}}}",
    "apiVersion: flink.apache.org/v1beta1\nkind: FlinkDeployment\nmetadata: {name: x}\n"
    "spec: {flinkVersion: v2_2, job: {jarURI: local:///a.jar, parallelism: 2, args: 5}, "
    "jobManager: {resource: {memory: 1g}}, taskManager: {resource: {memory: 1g}, replicas: -1},"
    " flinkConfiguration: {taskmanager.numberOfTaskSlots: -3}}",
    "apiVersion: flink.apache.org/v1beta1\nkind: FlinkSessionJob\nmetadata: {name: x}\nspec: {deploymentName: 5}",
    "apiVersion: v1\nkind: List\nitems: [3, {kind: FlinkDeployment}]",
]


@pytest.mark.parametrize("text", GARBAGE)
def test_garbage_is_reported_never_raised_and_what_is_imported_renders(text: str) -> None:
    good = copy.deepcopy(fd())
    out = import_documents([*yaml.safe_load_all(text), good])
    assert out[-1].app is not None and not out[-1].changes_behaviour  # the good document beside it is kept
    for imp in out[:-1]:
        assert imp.app is None or imp.findings, imp
        if imp.app is not None:
            validates_and_renders(imp)
