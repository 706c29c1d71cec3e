"""FlinkSessionClusters on the kubernetes runtime without Flink: the cluster's objects (pure), what makes two of its
clusters interchangeable, the image jars its JobManager stages (the real shell script against Python's ids), the
refusals of session apps (file:line:field), and `render`/`validate` of a repository with a session cluster. The
real-Flink path is test_session_k8s_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.cli import main
from reconciler.live import k8s_render as r
from reconciler.spec.model import FlinkApp
from reconciler.spec.session import SESSION_LABEL, FlinkSessionCluster, cluster_app, effective_app, session_generation

pytestmark = pytest.mark.kubernetes

Obj = dict[str, Any]
DURABLE = {"execution.checkpointing.dir": "s3://b/checkpoints", "execution.checkpointing.savepoint-dir": "s3://b/sp"}


def cluster(**spec: Any) -> FlinkSessionCluster:
    return FlinkSessionCluster.model_validate({
        "apiVersion": "flink-reconciler.io/v1alpha1", "kind": "FlinkSessionCluster",
        "metadata": {"name": "shared", "namespace": "flink"},
        "spec": {"image": "flink:2.3", "taskManager": {"replicas": 1, "slots": 4}, "flinkConfiguration": DURABLE,
                 "highAvailability": {"enabled": True, "storageDir": "s3://b/ha"}, **spec}})


def member(name: str, c: FlinkSessionCluster, **job: Any) -> FlinkApp:
    a = FlinkApp.model_validate({
        "apiVersion": "flink-reconciler.io/v1alpha1", "kind": "FlinkApp",
        "metadata": {"name": name, "namespace": "flink"},
        "spec": {"sessionCluster": c.name, "job": {"jarURI": f"local:///opt/flink/usrlib/{name}.jar",
                                                   "parallelism": 1, **job}}})
    return effective_app(a, c)


def objects(app: FlinkApp, generation: str = "") -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): o
            for o in r.render_app(app, revision="rev", job_id=None, restore_path=None, generation=generation)}


def test_a_session_cluster_is_one_session_mode_cluster_of_its_own_generation_under_its_name() -> None:
    c = cluster()
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
    c = cluster()
    a, b = member("a", c, args=["--rate", "1"]), member("b", c, jarURI="https://example.com/b.jar", parallelism=3)
    as_a, as_b = objects(cluster_app("shared", a)), objects(cluster_app("shared", b))
    assert as_a == as_b == objects(r.session_cluster_app(c))


def test_the_session_key_follows_the_pods_not_the_replicas() -> None:
    c = cluster()
    key = r.session_key(r.session_cluster_app(c))
    scaled = cluster(taskManager={"replicas": 3, "slots": 4})
    assert r.session_key(r.session_cluster_app(scaled)) == key  # scaled in place, the jobs stay
    for changed in (cluster(image="flink:2.3.1"), cluster(taskManager={"replicas": 1, "slots": 4,
                                                                       "resources": {"memory": "2g"}}),
                    cluster(flinkConfiguration={**DURABLE, "state.backend.type": "rocksdb"})):
        assert r.session_key(r.session_cluster_app(changed)) != key  # a new cluster: the jobs move


def test_the_staging_script_names_each_image_jar_as_image_jar_id_says(tmp_path: Path) -> None:
    """The init container's shell (run here with sh, coreutils) and Python agree on every id, also in subdirectories,
    and each id has the `_` Flink's jar list needs (a file without one is not listed)."""
    c = cluster()
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
    c = cluster()
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
