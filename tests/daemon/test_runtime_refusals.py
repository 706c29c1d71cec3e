"""A spec the runtime cannot run safely is an error of that app in the plan (never a failed step, never
destructive): on Kubernetes, state not on durable storage, no HA for a stateful app, a repository jar."""

from __future__ import annotations

from pathlib import Path

from reconciler.apply.journal import Journal
from reconciler.clock import FakeClock
from reconciler.core.plan import Action
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.policy import SpecPolicy
from tests.gitutil import Repo

GOOD = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata: {name: good, namespace: flink}
spec:
  highAvailability: {enabled: true, storageDir: "s3://bucket/ha/good"}
  job: {jarURI: "local:///opt/flink/usrlib/job.jar", upgradeMode: savepoint}
  flinkConfiguration:
    execution.checkpointing.dir: s3://bucket/checkpoints/good
    execution.checkpointing.savepoint-dir: s3://bucket/savepoints/good
"""
NO_HA = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata: {name: fragile, namespace: flink}
spec:
  job: {jarURI: "local:///opt/flink/usrlib/job.jar", upgradeMode: savepoint}
  flinkConfiguration:
    execution.checkpointing.dir: s3://bucket/checkpoints/fragile
    execution.checkpointing.savepoint-dir: s3://bucket/savepoints/fragile
"""


def _reconciler(repo: Repo, state: Path, runtime_name: str) -> Reconciler:
    clock = FakeClock()
    source = GitSource(str(repo.origin), state / "git")
    source.fetch()
    return Reconciler(source=source, runtime=None, journal=Journal(state / "journal", clock), clock=clock,
                      subdir="apps", runtime_name=runtime_name)


def test_kubernetes_refuses_a_stateful_app_without_ha_as_an_error_of_that_app_only(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("apps/good.yaml", GOOD)
    repo.write("apps/fragile.yaml", NO_HA)
    rev = repo.commit("two apps")
    plan = _reconciler(repo, tmp_path / "k8s", "kubernetes").plan(rev)
    assert plan.app("good").action is Action.CREATE, plan.app("good").reason
    fragile = plan.app("fragile")
    assert fragile.action is Action.ERROR and fragile.steps == ()
    assert fragile.reason.startswith("apps/fragile.yaml:1 spec.highAvailability.enabled: "), fragile.reason
    assert "silently rewinds its state" in fragile.reason


def test_the_local_runtime_does_not_apply_kubernetes_rules(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("apps/fragile.yaml", NO_HA)
    rev = repo.commit("one app")
    plan = _reconciler(repo, tmp_path / "local", "local").plan(rev)
    assert plan.app("fragile").action is Action.CREATE


HOST_NETWORK = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata: {name: nosy}
spec:
  job: {jarURI: "local:///opt/flink/usrlib/job.jar", upgradeMode: stateless}
  podTemplate:
    spec: {hostNetwork: true}
"""


def test_the_daemon_applies_its_spec_policy(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("apps/nosy.yaml", HOST_NETWORK)
    rev = repo.commit("an app on the host network")
    restricted = _reconciler(repo, tmp_path / "restricted", "local").plan(rev).app("nosy")
    assert restricted.action is Action.ERROR and "hostNetwork" in restricted.reason, restricted.reason
    permissive = _reconciler(repo, tmp_path / "permissive", "local")
    permissive.spec_policy = SpecPolicy.PERMISSIVE
    assert permissive.plan(rev).app("nosy").action is Action.CREATE
