"""On Kubernetes: a record ConfigMap edited by hand into invalid JSON, or a root ConfigMap whose generation pointer
was, blocks that app only; `record rebuild` moves the record aside without losing a byte.

Against the stand-in API server or, with FLINK_RECONCILER_TEST_KUBECONFIG, a real one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.observed import ClusterPhase, Outcome
from reconciler.core.plan import Action
from reconciler.errors import JournalError
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.api import Kube
from reconciler.live.kubernetes.records import ConfigMapRecordStore, record_name
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.records import BrokenRecord, StoredRecord
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.load import load_files
from tests.gitutil import Repo, spec
from tests.kubernetes.conftest import Cluster

pytestmark = pytest.mark.kubernetes

BAD = '{"kind": "FlinkReconcilerRecord", "version": 1, "app": "victim", "record": {"last_'  # cut short by hand


def _break(c: Cluster, app: str, data: str = BAD) -> dict[str, Any]:
    """What `kubectl edit` leaves: the record ConfigMap's data replaced, everything else as it was."""
    cm = c.kube.get("ConfigMap", c.namespace, record_name(app))
    assert cm is not None
    cm["data"] = {"record.json": data}
    out: dict[str, Any] = c.kube.request("PUT", Kube.path("ConfigMap", c.namespace, record_name(app)), body=cm)
    return out


def _records(c: Cluster, tmp_path: Path, repo: Repo | None = None) -> tuple[Journal, str]:
    """Records of a, b and victim, applied at the first commit (a repo of their specs when `repo` is given)."""
    rev = "1" * 40
    if repo is not None:
        for name in ("a", "b", "victim"):
            repo.write(f"apps/{name}.yaml", spec(name))
        rev = repo.commit("three apps")
    journal = Journal(tmp_path / "state" / "journal", SystemClock(),
                      store=ConfigMapRecordStore(c.kube, [c.namespace]))
    for name in ("a", "b", "victim"):
        applied = load_files({f"apps/{name}.yaml": spec(name).encode()}).apps[name].app.canonical()
        applied["metadata"]["namespace"] = c.namespace
        journal.record_adopted(name, rev, applied, source_file=f"apps/{name}.yaml")
    return journal, rev


def test_a_record_configmap_with_invalid_json_blocks_its_app_only_and_is_never_written(cluster: Cluster,
                                                                                      tmp_path: Path) -> None:
    _records(cluster, tmp_path)
    edited = _break(cluster, "victim")
    store = ConfigMapRecordStore(cluster.kube, [cluster.namespace])
    listed = store.list()
    assert {a for a, x in listed.items() if isinstance(x, StoredRecord)} == {"a", "b"}
    broken = listed["victim"]
    assert isinstance(broken, BrokenRecord) and broken.raw == BAD.encode()
    assert broken.reason.startswith(f"ConfigMap {cluster.namespace}/victim-flink-reconciler-record: not a readable "
                                    "flink-reconciler record (")
    journal = Journal(tmp_path / "other" / "journal", SystemClock(), store=store)  # a new replica
    records = journal.records()
    assert set(records.apps) == {"a", "b"} and "`flink-reconciler record rebuild victim`" in records.broken["victim"]
    with pytest.raises(JournalError, match="not writing the record of app victim"):
        journal.record_attempt("victim", "2" * 40, Outcome.FAILURE, "blocked", action="blocked")
    journal.record_attempt("a", "2" * 40, Outcome.FAILURE, "blocked", action="blocked")  # the others: as usual
    after = cluster.kube.get("ConfigMap", cluster.namespace, record_name("victim"))
    assert after is not None and after["data"] == {"record.json": BAD}
    assert after["metadata"]["resourceVersion"] == edited["metadata"]["resourceVersion"]
    with pytest.raises(JournalError):  # even a writer that never saw it cannot create it over the broken one
        ConfigMapRecordStore(cluster.kube, [cluster.namespace]).put("victim", {"kind": "x"}, expected=None)


def test_the_pass_plans_every_other_app_and_blocks_the_broken_one(cluster: Cluster, tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    journal, _ = _records(cluster, tmp_path, repo)
    repo.write("apps/victim.yaml", spec("victim", parallelism=2))
    repo.write("apps/c.yaml", spec("c"))
    head = repo.commit("victim: parallelism 2; a new app c")
    _break(cluster, "victim")
    rec = Reconciler(source=GitSource(str(repo.origin), tmp_path / "state" / "git"), runtime=None, journal=journal,
                     clock=SystemClock(), subdir="apps")
    rec.sync(full=True, reason="startup")
    assert rec.readiness()[0] is True
    result = rec.apply(head)
    assert result.plan.app("c").action is Action.CREATE and result.plan.app("victim").action is Action.BLOCKED
    assert "victim-flink-reconciler-record: not a readable" in result.plan.app("victim").reason
    assert {a.app for a in result.plan.apps} == {"a", "b", "c", "victim"}


def test_record_rebuild_copies_the_configmap_aside_then_deletes_it(cluster: Cluster, tmp_path: Path) -> None:
    _records(cluster, tmp_path)
    _break(cluster, "victim")
    store = ConfigMapRecordStore(cluster.kube, [cluster.namespace])
    assert isinstance(store.list()["victim"], BrokenRecord)
    where = store.set_aside("victim", "broken-20260601-120000")
    name = "victim-flink-reconciler-record-broken-20260601-120000"
    assert where == f"ConfigMap {cluster.namespace}/{name}"
    copy = cluster.kube.get("ConfigMap", cluster.namespace, name)
    assert copy is not None and copy["data"] == {"record.json": BAD}  # every byte kept
    assert cluster.kube.get("ConfigMap", cluster.namespace, record_name("victim")) is None
    assert set(store.list()) == {"a", "b"}  # the copy is not a record: the next pass adopts the app
    with pytest.raises(JournalError, match="no record of app victim"):
        store.set_aside("victim", "again")


def test_a_root_configmap_pointer_edited_by_hand_blocks_that_app_only(cluster: Cluster) -> None:
    def root(app: str, live: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{app}-root", "namespace": cluster.namespace,
                             "labels": {r.LABEL_MANAGED_BY: r.MANAGED_BY, r.LABEL_NAME: "flink", r.LABEL_INSTANCE: app,
                                        r.LABEL_COMPONENT: "root"},
                             "annotations": {r.ANNOTATION_LIVE: live}},
                "data": {"flinkapp.json": json.dumps({"spec": {}})}}

    for app, live in (("good", "base"), ("edited", "Base Gen/1")):
        cluster.kube.request("POST", Kube.path("ConfigMap", cluster.namespace), body=root(app, live))
    runtime = KubernetesRuntime(cluster.api_client, clock=SystemClock(), namespaces=[cluster.namespace])
    clusters = runtime.list_clusters()  # never raises for one app
    assert clusters["good"].phase is ClusterPhase.ABSENT and clusters["good"].unreadable is None
    bad = clusters["edited"]
    assert bad.phase is ClusterPhase.UNKNOWN and bad.unreadable is not None
    assert f"ConfigMap {cluster.namespace}/edited-root: unreadable cluster pointer(s) " in bad.unreadable
    assert "kubectl annotate --overwrite" in bad.unreadable


def test_get_of_a_broken_record_names_the_configmap(cluster: Cluster, tmp_path: Path) -> None:
    """What `record show` reads: the store's get, not the journal's cache."""
    _records(cluster, tmp_path)
    _break(cluster, "victim", "[1, 2]")
    got = ConfigMapRecordStore(cluster.kube, [cluster.namespace]).get("victim")
    assert isinstance(got, BrokenRecord) and got.raw == b"[1, 2]"
    assert got.reason == (f"ConfigMap {cluster.namespace}/victim-flink-reconciler-record: not a readable "
                          "flink-reconciler record (not a JSON object)")
