"""FlinkSessionClusters on the kubernetes runtime without Flink: the cluster's objects (pure), what makes two of its
clusters interchangeable, the image jars its JobManager stages (the real shell script against Python's ids), the
refusals of session apps (file:line:field), and `render`/`validate` of a repository with a session cluster. The
real-Flink path is test_session_k8s_e2e.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.apply.journal import Journal
from reconciler.cli import main
from reconciler.core.observed import ClusterPhase, Records
from reconciler.core.plan import Action, deterministic_job_id
from reconciler.core.planner import Desired, PlanInput, Policy
from reconciler.core.session_planner import plan_with_sessions
from reconciler.live.kubernetes import render as r
from reconciler.live.kubernetes.generations import Pointers
from reconciler.live.kubernetes.runtime import KubernetesRuntime
from reconciler.live.observe import observe
from reconciler.live.session import SessionRuntime
from reconciler.service import sessions
from reconciler.service.reconcile import Reconciler
from reconciler.source.git import GitSource
from reconciler.spec.load import load_files
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import SESSION_LABEL, FlinkSessionCluster, cluster_app, effective_app, session_generation
from tests.gitutil import Repo
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.flink_backend import FlinkBackend
from tests.kubernetes.standin import Standin

pytestmark = pytest.mark.kubernetes

Obj = dict[str, Any]
DURABLE = {"execution.checkpointing.dir": "s3://b/checkpoints", "execution.checkpointing.savepoint-dir": "s3://b/sp"}


def session_cluster(namespace: str = "flink", **spec: Any) -> FlinkSessionCluster:
    return FlinkSessionCluster.model_validate({
        "apiVersion": "flink-reconciler.io/v1alpha1", "kind": "FlinkSessionCluster",
        "metadata": {"name": "shared", "namespace": namespace},
        "spec": {"image": "flink:2.3", "taskManager": {"replicas": 1, "slots": 4}, "flinkConfiguration": DURABLE,
                 "highAvailability": {"enabled": True, "storageDir": "s3://b/ha"}, **spec}})


def member(name: str, c: FlinkSessionCluster, **job: Any) -> FlinkApp:
    a = FlinkApp.model_validate({
        "apiVersion": "flink-reconciler.io/v1alpha1", "kind": "FlinkApp",
        "metadata": {"name": name, "namespace": c.metadata.namespace},
        "spec": {"sessionCluster": c.name, "job": {"jarURI": f"local:///opt/flink/usrlib/{name}.jar",
                                                   "parallelism": 1, **job}}})
    return effective_app(a, c)


def objects(app: FlinkApp, generation: str = "") -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): o
            for o in r.render_app(app, revision="rev", job_id=None, restore_path=None, generation=generation)}


def test_a_session_cluster_is_one_session_mode_cluster_of_its_own_generation_under_its_name() -> None:
    c = session_cluster()
    objs = objects(r.session_cluster_app(c))
    gen = session_generation(effective_app(member("a", c), c))
    p = f"shared-g{gen}"
    assert set(objs) == {("ConfigMap", "shared-root"), ("ServiceAccount", "shared-flink"), ("Role", "shared-flink"),
                         ("RoleBinding", "shared-flink"), ("ConfigMap", f"{p}-config"), ("Service", f"{p}-jm"),
                         ("Service", f"{p}-rest"), ("Deployment", f"{p}-tm"), ("Deployment", f"{p}-jm")}
    for o in objs.values():  # labelled so prune, status and the session runtime find it (and tell it from apps)
        assert o["metadata"]["labels"][SESSION_LABEL] == "true" and o["metadata"]["namespace"] == "flink"
    jm = objs[("Deployment", f"{p}-jm")]
    args = jm["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "jobmanager" and "--job-id" not in args
    assert f"kubernetes.cluster-id=shared.g{gen}" in args
    assert [i["name"] for i in jm["spec"]["template"]["spec"]["initContainers"]] == ["stage-image-jars"]
    assert jm["metadata"]["annotations"][r.ANNOTATION_SESSION_KEY] == r.session_key(r.session_cluster_app(c))
    job = json.loads(objs[("ConfigMap", "shared-root")]["data"]["flinkapp.json"])["spec"]["job"]
    assert job["upgradeMode"] == "stateless" and job["args"] == []  # nobody's job: the cluster's spec alone


def test_every_app_on_the_cluster_renders_the_same_objects() -> None:
    """A job-only change of one app must never touch the pods the others run on: nothing of a job is in them."""
    c = session_cluster()
    a, b = member("a", c, args=["--rate", "1"]), member("b", c, jarURI="https://example.com/b.jar", parallelism=3)
    as_a, as_b = objects(cluster_app("shared", a)), objects(cluster_app("shared", b))
    assert as_a == as_b == objects(r.session_cluster_app(c))


def test_the_session_key_follows_the_pods_not_the_replicas() -> None:
    c = session_cluster()
    key = r.session_key(r.session_cluster_app(c))
    scaled = session_cluster(taskManager={"replicas": 3, "slots": 4})
    assert r.session_key(r.session_cluster_app(scaled)) == key  # scaled in place, the jobs stay
    for changed in (session_cluster(image="flink:2.3.1"), session_cluster(taskManager={"replicas": 1, "slots": 4,
                                                                       "resources": {"memory": "2g"}}),
                    session_cluster(flinkConfiguration={**DURABLE, "state.backend.type": "rocksdb"})):
        assert r.session_key(r.session_cluster_app(changed)) != key  # a new cluster: the jobs move


def test_the_staging_script_names_each_image_jar_as_image_jar_id_says(tmp_path: Path) -> None:
    """The init container's shell (run here with sh, coreutils) and Python agree on every id, also in subdirectories,
    and each id has the `_` Flink's jar list needs (a file without one is not listed)."""
    c = session_cluster()
    jm = objects(r.session_cluster_app(c))[("Deployment", f"shared-g{session_generation(member('a', c))}-jm")]
    init = jm["spec"]["template"]["spec"]["initContainers"][0]
    image = tmp_path / "usrlib"
    for rel in ("counter.jar", "team/a b.jar", "team/deep/x.jar", "notes.txt"):
        (image / rel).parent.mkdir(parents=True, exist_ok=True)
        (image / rel).write_bytes(rel.encode())
    env = {**os.environ, **{e["name"]: e["value"] for e in init["env"]},
           "IMAGE_JARS": str(image), "JAR_DIR": str(tmp_path / "upload" / "flink-web-upload")}
    subprocess.run(init["command"], env=env, check=True, timeout=30)
    staged = {p.name: p.read_bytes() for p in (tmp_path / "upload" / "flink-web-upload").iterdir()}
    want = {r.image_jar_id(f"local://{r.IMAGE_JARS}/{rel}"): rel.encode()
            for rel in ("counter.jar", "team/a b.jar", "team/deep/x.jar")}
    assert staged == want
    assert all("_" in n and n.startswith(r.IMAGE_JAR_PREFIX) for n in staged)


def test_a_session_app_is_not_refused_but_a_jar_its_cluster_cannot_have_is() -> None:
    c = session_cluster()
    assert r.kubernetes_problems(member("a", c)) == []
    assert r.kubernetes_problems(member("b", c, jarURI="https://example.com/b.jar")) == []
    assert r.kubernetes_problems(member("c", c, jarURI="jobs/c.jar")) == []  # the reconciler uploads it
    problems = r.kubernetes_problems(member("d", c, jarURI="local:///opt/jobs/d.jar"))
    assert [p.field for p in problems] == ["spec.job.jarURI"], problems
    assert "under /opt/flink/usrlib/" in problems[0].message


REPO = {
    "shared.yaml": """apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkSessionCluster
metadata:
  name: shared
  namespace: flink
spec:
  image: flink:2.3
  taskManager:
    slots: 2
  flinkConfiguration:
    execution.checkpointing.dir: s3://b/checkpoints
    execution.checkpointing.savepoint-dir: s3://b/savepoints
  highAvailability:
    enabled: true
    storageDir: s3://b/ha
""",
    "a.yaml": """apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: a
  namespace: flink
spec:
  sessionCluster: shared
  job:
    jarURI: local:///opt/flink/usrlib/a.jar
""",
    "b.yaml": """apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: b
  namespace: flink
spec:
  sessionCluster: shared
  job:
    jarURI: local:///opt/jobs/b.jar
""",
}


def write(tmp_path: Path) -> Path:
    for name, text in REPO.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_validate_refuses_only_the_app_whose_jar_the_cluster_cannot_have_naming_file_line_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = write(tmp_path)
    code = main(["validate", "--runtime", "kubernetes", str(root)])
    out, err = capsys.readouterr()
    lines = [ln for ln in (out + err).splitlines() if "spec." in ln]
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith(f"{root / 'b.yaml'}:1 spec.job.jarURI: jarURI "), lines


def test_render_shows_the_session_cluster_and_no_objects_for_its_apps(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    root = write(tmp_path)
    (root / "b.yaml").unlink()
    code = main(["render", str(root)])
    out, err = capsys.readouterr()
    assert code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert {d["metadata"]["labels"]["app.kubernetes.io/instance"] for d in docs} == {"shared"}
    assert f"# session cluster shared ({root / 'shared.yaml'})" in out
    assert "# app a" in out and "its job runs on session cluster shared" in out


# ---- the runtime against the stand-in (a Flink REST contract server behind the cluster's REST Service) ----

def test_the_runtime_runs_two_apps_jobs_on_one_session_cluster_and_deletes_it(
        cluster: Cluster, standin_only: Standin, tmp_path: Path) -> None:
    c = cluster
    sc = session_cluster(c.namespace, taskManager={"replicas": 1, "slots": 2})
    a, b = member("a", sc), member("b", sc, jarURI="jobs/b.jar")
    gen = session_generation(a)
    backend = FlinkBackend(c.clock, parallelism=2)
    backend.start_session()
    staged = r.image_jar_id(a.spec.job.jar_uri)
    assert staged is not None
    backend.jar_files[staged] = "a.jar"  # what the stage-image-jars init container put there
    k8s = KubernetesRuntime(c.api_client, clock=c.clock, namespaces=[c.namespace], rest_via="proxy",
                            poll_interval=c.poll, revision="rev-1")
    rt = SessionRuntime(k8s)
    rt.set_sessions({"a": "shared", "b": "shared"}, clusters=["shared"])
    deadline = c.clock.monotonic() + 120
    with backend.serve() as url:
        standin_only.add_proxy_backend(c.namespace, f"shared-g{gen}-rest", str(r.REST_PORT), url)
        assert rt.ensure_cluster(a, deadline=deadline).phase is ClusterPhase.READY
        assert rt.ensure_cluster(b, deadline=deadline).phase is ClusterPhase.READY  # the same cluster
        root = c.kube.get("ConfigMap", c.namespace, "shared-root")
        assert Pointers.of(root) == Pointers(live=gen)
        names = {f"{o['kind']}/{o['metadata']['name']}" for kind in ("Deployment", "StatefulSet")
                 for o in c.kube.list(kind, c.namespace, r.app_selector("shared"))}
        assert names == {f"Deployment/shared-g{gen}-jm", f"Deployment/shared-g{gen}-tm"}
        [live] = k8s.session_generations("shared")
        want = k8s.config_key(cluster_app("shared", b))
        assert (live.slot, live.generation, live.config_key) == ("cluster", gen, want)

        jar = tmp_path / "b.jar"
        jar.write_bytes(b"PK\x03\x04\xff\xfe not really a jar")  # binary: the proxy passes its bytes through
        ja, jb = deterministic_job_id("a", "1" * 40, 1), deterministic_job_id("b", "1" * 40, 1)
        def start(app: FlinkApp, job_id: str, jar_path: Path | None) -> str:
            return rt.start_job(app, job_id=job_id, jar=jar_path, restore_path=None, allow_non_restored_state=False,
                                deadline=deadline)

        assert start(a, ja, None) == ja  # the image's jar: no upload
        assert start(b, jb, jar) == jb
        assert start(b, jb, jar) == jb  # a resumed step: found, not uploaded again
        uploads = [t for m, t in backend.requests if m == "POST" and t.endswith("/jars/upload")]
        assert len(uploads) == 1
        assert [n for n in backend.jar_files.values() if n != "a.jar"] == [
            f"{hashlib.sha256(jar.read_bytes()).hexdigest()[:32]}.jar"]
        assert {j for j, _ in backend.starts} == {ja, jb}

        assert k8s.list_clusters()["shared"].session  # never taken for an orphaned app
        assert set(rt.list_clusters()) == {"a", "b"}
        assert rt.cluster_jobs("shared") == {"a": "RUNNING", "b": "RUNNING"}

        # The cluster removed from Git while its apps still name it: the plan keeps it, naming them.
        gone = load_files({f"apps/{n}": t.replace("namespace: flink", f"namespace: {c.namespace}").encode()
                           for n, t in REPO.items() if n != "shared.yaml"})
        seen = sessions.observe(rt, gone)
        assert seen.live["shared"].phase is ClusterPhase.READY and dict(seen.live["shared"].jobs) == {
            "a": "RUNNING", "b": "RUNNING"}
        inp = PlanInput(revision="2" * 40, desired=Desired(errors=gone.errors), previous={"a": a, "b": b},
                        previous_sources={}, live=observe(rt, ["a", "b"]), records=Records(), now=c.clock.now(),
                        policy=Policy(prune=True))
        [entry] = plan_with_sessions(inp, seen).clusters
        assert (entry.action, entry.apps, entry.steps) == (Action.BLOCKED, ("a", "b"), ()), entry
        assert "still name it" in entry.reason

        rt.flink("a").cancel(ja)  # a's job stopped (its final savepoint), then both apps leave the cluster
        rt.delete_cluster("a", deadline=deadline)
        rt.delete_cluster("b", deadline=deadline)
        assert rt.cluster_jobs("shared") == {}
        assert list(backend.jar_files) == [staged]  # the uploaded jar is pruned, the image's kept
        assert c.kube.get("Deployment", c.namespace, f"shared-g{gen}-jm") is not None  # an app leaves it running

        rt.set_sessions({}, clusters=[])  # removed from Git: known by its labels
        rt.delete_cluster("shared", deadline=deadline)
        left = [o["metadata"]["name"] for kind in ("ConfigMap", "Deployment", "Service", "Pod")
                for o in c.kube.list(kind, c.namespace, r.app_selector("shared"))]
        assert left == []


def test_a_reconcile_pass_plans_session_apps_refuses_a_bad_jar_and_a_cluster_apps_still_name(
        cluster: Cluster, tmp_path: Path) -> None:
    """Against the API (the stand-in, or a real cluster when FLINK_RECONCILER_TEST_KUBECONFIG names one): nothing
    runs yet, so the plan is all Git and the runtime's refusals."""
    c = cluster
    (tmp_path / "repo").mkdir()
    repo = Repo(tmp_path / "repo")
    for name, text in REPO.items():
        repo.write(f"apps/{name}", text.replace("namespace: flink", f"namespace: {c.namespace}"))
    first = repo.commit("a session cluster and two apps")
    clock = c.clock
    runtime = SessionRuntime(KubernetesRuntime(c.api_client, clock=clock, namespaces=[c.namespace],
                                               rest_via="proxy", poll_interval=c.poll))
    rec = Reconciler(source=GitSource(str(repo.origin), tmp_path / "state" / "git"), runtime=runtime,
                     journal=Journal(tmp_path / "state" / "journal", clock), clock=clock, runtime_name="kubernetes",
                     subdir="apps")
    rec.source.fetch()
    p = rec.plan(first)
    assert p.app("a").action is Action.CREATE, p.app("a").reason
    bad = p.app("b")
    assert bad.action is Action.ERROR
    assert bad.reason.startswith("apps/b.yaml:1 spec.job.jarURI: jarURI 'local:///opt/jobs/b.jar'"), bad.reason
    assert [(cp.cluster, cp.action, cp.apps) for cp in p.clusters] == [("shared", Action.CREATE, ("a", "b"))]

    repo.remove("apps/shared.yaml")
    second = repo.commit("the cluster removed, its apps not")
    rec.source.fetch()
    p = rec.plan(second)
    for name in ("a", "b"):  # refused, each naming its file, line and field: nothing of theirs is touched
        ap = p.app(name)
        assert ap.action is Action.ERROR and not ap.steps
        assert ap.reason.startswith(f"apps/{name}.yaml:7 spec.sessionCluster: names session cluster 'shared'"), \
            ap.reason
    assert p.clusters == ()  # nothing of it runs yet: nothing to delete or keep
