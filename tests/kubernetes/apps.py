"""Example FlinkApps shared by the render, runtime and benchmark tests."""

from __future__ import annotations

from typing import Any

from reconciler.spec.model import FlinkApp


def app(name: str = "counter", namespace: str = "flink", **spec: Any) -> FlinkApp:
    body: dict[str, Any] = {
        "image": "flink:2.3",
        "taskManager": {"slots": 2},
        "job": {"jarURI": "local:///opt/flink/usrlib/counter.jar", "entryClass": "com.example.Counter",
                "args": ["--rate", "100"], "parallelism": 2},
        "flinkConfiguration": {
            "execution.checkpointing.dir": "s3://bucket/checkpoints/" + name,
            "execution.checkpointing.savepoint-dir": "s3://bucket/savepoints/" + name,
            "execution.checkpointing.interval": "10s",
        },
        # Stateful (the default upgradeMode savepoint) on Kubernetes needs HA: see kubernetes.storage.
        "highAvailability": {"enabled": True, "storageDir": "s3://bucket/ha/" + name},
    }
    for k, v in spec.items():
        if isinstance(v, dict) and isinstance(body.get(k), dict):
            body[k] = {**body[k], **v}
        else:
            body[k] = v
    return FlinkApp.model_validate({
        "apiVersion": "flink-reconciler.io/v1alpha1", "kind": "FlinkApp",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "data"}},
        "spec": body,
    })


EXAMPLES: dict[str, FlinkApp] = {
    "plain": app(
        taskManager={"replicas": 2, "slots": 2, "resources": {"cpu": 0.5, "memory": "2g"}},
        podTemplate={"metadata": {"labels": {"cost-center": "42"}},
                     "spec": {"tolerations": [{"key": "flink", "operator": "Exists"}],
                              "containers": [{"name": "flink-main-container",
                                              "env": [{"name": "TZ", "value": "UTC"}]},
                                             {"name": "sidecar", "image": "busybox:1.36",
                                              "args": ["sleep", "infinity"]}]}},
    ),
    "statefulset": app(
        "stateful",
        job={"jarURI": "https://artifacts.example.com/jobs/counter-1.2.jar",
             "jarSha256": "0" * 64, "entryClass": "com.example.Counter"},
        taskManager={"replicas": 3, "volumeClaimTemplates": [
            {"name": "local-state", "mountPath": "/flink-local", "storage": "20Gi",
             "storageClassName": "fast-ssd"}]},
        flinkConfiguration={"state.backend.type": "rocksdb", "process.taskmanager.working-dir": "/flink-local"},
    ),
    "ha": app(
        "ha-app",
        jobManager={"replicas": 2, "resources": {"cpu": 1, "memory": "1536m"}},
    ),
    # Stateless needs neither durable storage nor HA: the one render without HA objects.
    "stateless": app("sampler", job={"jarURI": "local:///opt/flink/usrlib/counter.jar", "upgradeMode": "stateless"},
                     highAvailability={"enabled": False, "storageDir": None}),
    "suspended": app("paused", job={"jarURI": "local:///opt/flink/usrlib/counter.jar", "state": "suspended"}),
}
