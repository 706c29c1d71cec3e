"""A deleted workload of an app in application mode (issue 20): what observe reports, and what EnsureCluster brings
back. The kubelet and the workload controllers replace pods, but nothing recreates a deleted Deployment or
StatefulSet: the runtime reports it as missing, so the planner repairs it at once instead of waiting for a cluster
"coming back". Flink's HA data outlives our objects: the job it belongs to is reported, so that a JobManager that is
gone is started again for the same job (Flink resumes it from its latest checkpoint), never from a stale savepoint.

Against the stand-in API server, or a real cluster with FLINK_RECONCILER_TEST_KUBECONFIG."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.core.observed import ClusterPhase
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.kubernetes.status import ha_job_of
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.test_runtime import deadline, mk, runtime

pytestmark = pytest.mark.kubernetes

JOB = "ab" * 16


def deployed(c: Cluster) -> KubernetesRuntime:
    """The app as start_job leaves it: JobManager and TaskManagers of job JOB."""
    rt = runtime(c)
    rt.apply(rt.render(mk(c), job_id=JOB, restore_path="s3://bucket/savepoints/counter/savepoint-ab-1"))
    return rt


def ha_configmap(c: Cluster, job: str, cid: str | None = None) -> dict[str, Any]:
    """Flink's HA ConfigMap of one job, as Flink 2.3 labels it (it is not owned by our root)."""
    cid = cid or r.ha_cluster_id("counter", job)
    return c.create({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": f"{cid}-{job}-config-map",
                                  "labels": {"app": cid, "type": "flink-native-kubernetes"}},
                     "data": {"checkpointID-0000000000000000007": "(a state handle)"}}, manager="flink")


@pytest.mark.usefixtures("pods_never_run")
def test_a_deleted_taskmanager_workload_is_missing_and_ensure_cluster_recreates_it_for_the_running_job(
        cluster: Cluster) -> None:
    rt = deployed(cluster)
    assert rt.observe("counter").missing == ()
    before = cluster.kube.get("Deployment", cluster.namespace, "counter-taskmanager")
    assert before is not None
    cluster.kube.delete("Deployment", cluster.namespace, "counter-taskmanager")
    info = rt.observe("counter")
    assert info.missing == ("taskmanager",) and info.phase is ClusterPhase.STARTING
    assert "the TaskManager workload counter-taskmanager is gone" in (info.message or "")
    assert info.rest_url is not None  # the JobManager is there: its job is asked for
    rt.ensure_cluster(mk(cluster), deadline=deadline(cluster, 120 if cluster.real else 10))
    after = cluster.kube.get("Deployment", cluster.namespace, "counter-taskmanager")
    assert after is not None and after["spec"]["template"] == before["spec"]["template"]  # the job's generation
    assert after["spec"]["template"]["metadata"]["annotations"][r.ANNOTATION_JOB_ID] == JOB
    assert cluster.kube.get("Deployment", cluster.namespace, "counter-jobmanager") is not None


def test_a_deleted_jobmanager_is_missing_and_the_job_of_its_ha_data_is_named(cluster: Cluster) -> None:
    rt = deployed(cluster)
    ha_configmap(cluster, JOB)
    ha_configmap(cluster, "cd" * 16, cid="other.cdcdcdcdcdcd")  # another app's: never this one's
    assert rt.observe("counter").ha_job_id is None  # its JobManager is there: nothing to recover
    cluster.kube.delete("Deployment", cluster.namespace, "counter-jobmanager")
    info = rt.observe("counter")
    assert info.missing == ("jobmanager",) and info.phase is ClusterPhase.STARTING
    assert info.rest_url is None  # a JobManager still terminating is no live JobManager
    assert info.ha_job_id == JOB
    assert rt.list_clusters()["counter"].ha_job_id == JOB


def test_a_deleted_cluster_is_absent_with_the_job_of_its_ha_data(cluster: Cluster) -> None:
    rt = deployed(cluster)
    ha_configmap(cluster, JOB)
    if cluster.real:
        pytest.skip("the stand-in cascades at once; a real garbage collector takes its time")
    cluster.kube.delete("ConfigMap", cluster.namespace, "counter-root", policy="Background")
    assert cluster.kube.list("Deployment", cluster.namespace, r.app_selector("counter")) == []
    info = rt.list_clusters()["counter"]
    assert info.phase is ClusterPhase.ABSENT and info.ha_job_id == JOB and info.missing == ()


@pytest.mark.parametrize(("cid", "job", "want"), [
    (f"counter.{JOB[:12]}", JOB, ("counter", JOB)),
    ("counter", JOB, None),  # an identity from before job generations: which job it is, is not said
    (f"counter.{'cd' * 6}", JOB, None),  # the identity of another job
    ("counter.gdeadbeef", JOB, None),  # a warm standby's session cluster recovers its jobs by itself
])
def test_ha_job_of(cid: str, job: str, want: tuple[str, str] | None) -> None:
    cm = {"metadata": {"name": f"{cid}-{job}-config-map", "labels": {"app": cid, "type": "flink-native-kubernetes"}}}
    assert ha_job_of(cm) == want
    assert ha_job_of({"metadata": {"name": f"{cid}-cluster-config-map", "labels": {"app": cid}}}) is None
