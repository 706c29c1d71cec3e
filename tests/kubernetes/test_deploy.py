"""deploy/: the manifests validate, and the Role grants exactly what the runtime calls (least privilege).

The RBAC check drives every runtime operation against the stand-in, records each request as RBAC sees
it (verb, API group, resource) and compares that set with the rules in deploy/kubernetes/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from ruamel.yaml import YAML

from reconciler.live.kubernetes.generations import Pointers
from reconciler.live.kubernetes.lease import LeaseElector
from reconciler.live.kubernetes.records import ConfigMapRecordStore
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.settings import load_settings
from tests.kubernetes.apps import app
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.standin import Standin

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
Rule = tuple[str, str, str]  # (apiGroup, resource, verb)

# Granted but never called by the runtime: Kubernetes lets us create the HA Role of an app only if we
# hold every permission it grants (RBAC escalation prevention). See the comments in rbac-apps.yaml.
ESCALATION_ONLY: set[Rule] = {
    ("", "configmaps", "watch"),
    *{("coordination.k8s.io", "leases", v) for v in ("get", "list", "watch", "create", "update", "patch", "delete")},
}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in YAML(typ="safe").load_all(path.read_text()) if d]


def _rules(role: dict[str, Any]) -> set[Rule]:
    return {(g, res, v) for rule in role["rules"] for g in rule["apiGroups"] for res in rule["resources"]
            for v in rule["verbs"]}


def _role(name: str) -> dict[str, Any]:
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for d in _docs(path):
            if d.get("kind") == "Role" and d["metadata"]["name"] == name:
                return d
    raise AssertionError(f"no Role {name} in deploy/kubernetes")


@pytest.mark.parametrize("path", sorted((DEPLOY / "kubernetes").glob("*.yaml")), ids=lambda p: p.name)
def test_manifests_validate(path: Path) -> None:
    for doc in _docs(path):
        if doc["kind"] == "Kustomization":
            listed = {str(p) for p in doc["resources"]}
            present = {p.name for p in (DEPLOY / "kubernetes").glob("*.yaml")} - {"kustomization.yaml",
                                                                                     "secrets.example.yaml"}
            assert listed == present
            continue
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_deployment_runs_two_non_root_replicas_with_probes() -> None:
    dep = _docs(DEPLOY / "kubernetes" / "deployment.yaml")[0]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = pod["containers"][0]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080}, {"name": "probes", "containerPort": 8081}]
    # Two replicas must elect one leader: both reconciling would run two jobs of one app.
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FLINK_RECONCILER_LEADER_ELECTION"] == "true"
    # (the setting is off unless the manifest turns it on)
    assert load_settings({"repo_url": env["FLINK_RECONCILER_REPO_URL"]}).leader_election is False
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"flink-reconciler-git", "flink-reconciler-webhook", "flink-reconciler-ui"}
    text = (DEPLOY / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in text and "USER 10001" in text and "pip install --no-cache-dir ." in text
    assert "PYTHONMALLOC=malloc" in text and "MALLOC_ARENA_MAX=2" in text  # the idle memory figures assume it


def _exercise_runtime(c: Cluster) -> None:
    """Every runtime operation the daemon uses, in the in-cluster configuration (rest_via=service)."""
    rt = KubernetesRuntime(c.api_client, clock=c.clock, namespaces=[c.namespace], poll_interval=c.poll)
    plain, ha = app("plain", c.namespace), app("ha", c.namespace, jobManager={"replicas": 2})
    stateful = app("stateful", c.namespace, taskManager={"slots": 2, "volumeClaimTemplates": [
        {"name": "state", "mountPath": "/state", "storage": "1Gi"}]})
    for a in (plain, ha, stateful):
        rt.ensure_cluster(a, deadline=c.clock.monotonic() + 60)
    # What start_job applies (its REST wait needs a JobManager): the JobManager and the TaskManagers of the job.
    for a in (plain, stateful):
        rt.apply(rt.render(a, job_id="0" * 32))
    jm = ("Deployment", "ha-jobmanager")
    rt.apply([o for o in rt.render(ha, job_id="0" * 32) if (o["kind"], o["metadata"]["name"]) != jm])
    rt.list_clusters()  # an app without a JobManager is STARTING: events are listed too
    rt.observe("plain")
    rt.drift(rt.render(plain, job_id="0" * 32))
    # What start_job does first for an HA app whose JobManager runs another job (its REST wait needs Flink).
    rt._forget_other_jobs(plain, "1" * 32, deadline=c.clock.monotonic() + 60, start=c.clock.monotonic())
    rt.ensure_cluster(app("stateful", c.namespace), deadline=c.clock.monotonic() + 60)  # prunes the StatefulSet
    no_ha = app("ha", c.namespace, job={"jarURI": "local:///j.jar", "upgradeMode": "stateless"},
                highAvailability={"enabled": False, "storageDir": None})
    rt.ensure_cluster(no_ha, deadline=c.clock.monotonic() + 60)  # prunes the HA RBAC
    rt.ensure_cluster(app("plain", c.namespace, job={"jarURI": "local:///j.jar", "state": "suspended"}),
                      deadline=c.clock.monotonic() + 60)
    running = app("plain", c.namespace)
    # Warm standby (start_standby's readiness wait needs Flink): a session cluster beside the live one, the root's
    # pointers switched, the retired cluster and a discarded standby deleted with their HA ConfigMaps.
    rt._quota_shortfall(c.namespace, rt.render(running, generation="0a0a0a0a"))
    rt.apply(rt.render(running, generation="0a0a0a0a"))
    root = c.kube.get("ConfigMap", c.namespace, "plain-root")
    assert root is not None
    rt._set_pointers("plain", root, Pointers(standby="0a0a0a0a"))
    rt.promote_standby("plain", generation="0a0a0a0a", deadline=c.clock.monotonic() + 60)
    rt.discard_standby("plain", generation="0a0a0a0a", deadline=c.clock.monotonic() + 60)
    rt.apply(rt.render(running, generation="0b0b0b0b"))
    rt.promote_standby("plain", generation="0b0b0b0b", deadline=c.clock.monotonic() + 60)
    rt.delete_retired("plain", deadline=c.clock.monotonic() + 60)
    for name in ("plain", "ha", "stateful"):
        rt.delete_cluster(name, deadline=c.clock.monotonic() + 60)
    # A takeover from the Flink Kubernetes Operator: list its FlinkDeployments, read one while it suspends, ask
    # for the suspend (and give it back), delete it and wait for its pods and Services.
    rt.flink_deployments()
    if rt.flink_deployment(c.namespace, "legacy") is not None:  # created by the test (the stand-in serves the CRD)
        rt.suspend_flink_deployment(c.namespace, "legacy")
    rt.release_flink_deployment(c.namespace, "legacy", state="running", upgrade_mode=None)
    rt.delete_flink_deployment(c.namespace, "legacy", deadline=c.clock.monotonic() + 60)
    # The apps' records (one ConfigMap each): list per pass, create, compare-and-set update, re-read on a
    # conflict, delete when an app is forgotten.
    records = ConfigMapRecordStore(rt.kube, rt.namespaces)
    doc = {"kind": "FlinkReconcilerRecord", "version": 1, "app": "plain", "namespace": c.namespace}
    version = records.put("plain", doc, expected=None)
    version = records.put("plain", {**doc, "n": 1}, expected=version)
    records.list()
    records.get("plain")
    records.delete("plain", expected=version)


def test_role_grants_exactly_what_the_runtime_calls(cluster: Cluster, standin_only: Standin) -> None:
    cluster.create({"apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkDeployment",
                    "metadata": {"name": "legacy", "namespace": cluster.namespace},
                    "spec": {"job": {"state": "running"}}}, manager="kubectl")
    standin_only.api.reset_log()
    _exercise_runtime(cluster)
    used = {(call.group, call.resource, call.verb) for call in standin_only.api.calls()}
    allowed = _rules(_role("flink-reconciler"))
    assert used - allowed == set(), "the runtime calls something the Role does not grant"
    assert allowed - used == ESCALATION_ONLY, "the Role grants something nothing calls"


def test_leader_role_grants_exactly_what_the_election_calls(cluster: Cluster, standin_only: Standin) -> None:
    standin_only.api.reset_log()
    a = LeaseElector(cluster.api_client, clock=cluster.clock, namespace=cluster.namespace, name="flink-reconciler",
                     identity="a")
    b = LeaseElector(cluster.api_client, clock=cluster.clock, namespace=cluster.namespace, name="flink-reconciler",
                     identity="b")
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    a.try_acquire_or_renew()
    a.release()
    b.try_acquire_or_renew()
    used = {(call.group, call.resource, call.verb) for call in standin_only.api.calls()}
    assert used == _rules(_role("flink-reconciler-leader"))


@pytest.mark.parametrize("base", ["kubernetes", "kubernetes-sharded"])
def test_both_bases_render_with_the_probe_port_and_a_network_policy(base: str, tmp_path: Path) -> None:
    """`kubectl kustomize` of each base: every object validates; the probes and the Prometheus annotations use
    the probe port (not the Service's); a NetworkPolicy lets the public port and the probe port in from their
    sources only; the daemon these env variables configure (with its mounted Secrets) passes the exposure check
    on 0.0.0.0."""
    import shutil
    import subprocess

    from reconciler.daemon.http import exposure_problems

    if shutil.which("kubectl") is None:
        pytest.skip("needs kubectl (kustomize)")
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY / base)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    docs = [d for d in YAML(typ="safe").load_all(out) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    template = dep["spec"]["template"]
    c = template["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert ports == {"http": int(env["FLINK_RECONCILER_LISTEN_PORT"]),
                     "probes": int(env["FLINK_RECONCILER_PROBE_PORT"])}
    assert ports["http"] != ports["probes"]
    assert c["livenessProbe"]["httpGet"]["port"] == c["readinessProbe"]["httpGet"]["port"] == "probes"
    annotations = template["metadata"]["annotations"]
    assert (annotations["prometheus.io/port"], annotations["prometheus.io/path"]) == (str(ports["probes"]), "/metrics")
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"]  # the Service never exposes the probes
    # The policy selects the daemon's pods, isolates their ingress, and opens each port to one source.
    assert policy["metadata"]["namespace"] == dep["metadata"]["namespace"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    opened = {p["port"]: rule["from"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert set(opened) == {"http", "probes"}
    assert all(sources for sources in opened.values())  # never "from anywhere"
    # Safe by default: on 0.0.0.0 the dashboard's auth and the webhook's secret come from mounted Secrets.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    secret_volumes = {v["name"] for v in template["spec"]["volumes"] if "secret" in v}
    files = {name: value for name, value in env.items() if name.endswith("_FILE")}
    for name, path in files.items():
        assert any(path.startswith(mounts[v] + "/") for v in secret_volumes), f"{name}: {path} is not in a Secret"
    fake = {}
    for name in files:
        setting = name.removeprefix("FLINK_RECONCILER_").removesuffix("_FILE").lower()
        fake[setting] = "bearer:0123456789abcdef" if setting == "ui_auth" else "from-the-secret"
    settings = load_settings({"repo_url": env["FLINK_RECONCILER_REPO_URL"],
                              "listen_host": env["FLINK_RECONCILER_LISTEN_HOST"],
                              "allowed_hosts": env["FLINK_RECONCILER_ALLOWED_HOSTS"], **fake})
    assert settings.listen_host == "0.0.0.0" and "insecure_ui" not in {k.lower() for k in env}
    assert exposure_problems(settings, settings.listen_host, webhook=True) == []
    assert exposure_problems(settings.model_copy(update={"ui_auth": None}), "0.0.0.0", webhook=True) != []
    assert f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc" in settings.allowed_hosts
