"""The daemon's wiring for Kubernetes: settings -> KubernetesRuntime from a kubeconfig, leader election.

Against the loopback stand-in (or a real cluster with FLINK_RECONCILER_TEST_KUBECONFIG)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.clock import SystemClock
from reconciler.core.plan import Action
from reconciler.live.kubernetes.records import ConfigMapRecordStore
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.ports import OperatorTakeover, StandbyCapacity, StandbyRuntime
from reconciler.live.session import SessionRuntime
from reconciler.service.factories import make_reconciler, make_record_store, make_runtime
from reconciler.settings import load_settings
from tests.gitutil import Repo, spec
from tests.kubernetes.conftest import KUBECONFIG, Cluster


def _kubeconfig(cluster: Cluster, tmp_path: Path) -> Path:
    if KUBECONFIG:
        return Path(KUBECONFIG)
    assert cluster.standin is not None
    path = tmp_path / "kubeconfig"
    path.write_text(f"""\
apiVersion: v1
kind: Config
clusters: [{{name: standin, cluster: {{server: "{cluster.standin.url}"}}}}]
users: [{{name: tester, user: {{token: stand-in-token}}}}]
contexts: [{{name: standin, context: {{cluster: standin, user: tester, namespace: {cluster.namespace}}}}}]
current-context: standin
""")
    return path


def _wait(probe: Callable[[], bool], timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if probe():
            return True
        time.sleep(0.1)
    return False


def test_a_kubernetes_runtime_keeps_its_records_in_configmaps(cluster: Cluster, tmp_path: Path) -> None:
    """make_record_store recognises a KubernetesRuntime by its module's name (so as not to import it for a local
    daemon): a renamed module must not quietly send the records to the pod's own disk."""
    settings = load_settings({"runtime": "kubernetes", "kubeconfig": str(_kubeconfig(cluster, tmp_path)),
                              "namespaces": cluster.namespace, "state_dir": str(tmp_path / "state")})
    runtime = make_runtime(settings, SystemClock())
    # wrapped for FlinkSessionClusters (live/session.py), every other app as before
    assert isinstance(runtime, SessionRuntime) and isinstance(runtime.host, KubernetesRuntime)
    assert isinstance(make_record_store(settings, runtime), ConfigMapRecordStore)
    for proto in (StandbyRuntime, StandbyCapacity, OperatorTakeover):  # found as Python 3.12+ looks them up: statically
        for name in (n for n in vars(proto) if not n.startswith("_")):
            inspect.getattr_static(runtime, name)


def test_settings_build_a_kubernetes_reconciler_and_one_leader(cluster: Cluster, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Repo(tmp_path)
    durable = ("  flinkConfiguration:\n    execution.checkpointing.dir: s3://b/checkpoints/a\n"
               "    execution.checkpointing.savepoint-dir: s3://b/savepoints/a\n"
               "  highAvailability:\n    enabled: true\n    storageDir: s3://b/ha/a\n")
    repo.write("apps/a.yaml", spec("a", extra=durable)
               .replace("jarURI: jobs/counter.jar", "jarURI: local:///opt/flink/usrlib/a.jar")
               .replace("  name: a\n", f"  name: a\n  namespace: {cluster.namespace}\n"))
    rev = repo.commit("one app")
    base = {"repo_url": str(repo.origin), "runtime": "kubernetes", "kubeconfig": str(_kubeconfig(cluster, tmp_path)),
            "namespaces": cluster.namespace, "path": "apps", "status_sink": "none", "leader_election": True,
            "lease_namespace": cluster.namespace, "lease_name": "fr-test"}
    monkeypatch.setenv("POD_NAME", "replica-1")
    first = make_reconciler(load_settings({**base, "state_dir": str(tmp_path / "s1")}), SystemClock())
    monkeypatch.setenv("POD_NAME", "replica-2")
    second = make_reconciler(load_settings({**base, "state_dir": str(tmp_path / "s2")}), SystemClock())
    try:
        assert all(isinstance(r, SessionRuntime) and isinstance(r.host, KubernetesRuntime)
                   for r in (first.runtime, second.runtime))
        is_first, is_second = first.leader, second.leader
        assert is_first is not None and is_second is not None
        assert _wait(lambda: is_first() or is_second()), "nobody became leader"
        leader, standby = (first, second) if is_first() else (second, first)
        assert standby.leader is not None and not standby.leader()
        assert standby.readiness()[1].startswith("ok (standby)")
        standby.sync(full=True, reason="test")  # a standby neither fetches nor reconciles
        assert not (standby.source.git_dir / "HEAD").exists()
        leader.source.fetch()
        planned = leader.plan(rev)
        assert planned.app("a").action is Action.CREATE  # observed through the API: nothing there yet
        leader.shutdown(deadline_s=5)  # releases the lease: the standby takes over without waiting for expiry
        assert _wait(lambda: standby.leader is not None and standby.leader(), timeout=20), "no takeover"
    finally:
        first.shutdown(deadline_s=1)
        second.shutdown(deadline_s=1)
