"""Loading specs: every error names file:line:column and the field, and affects only its own app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from reconciler.errors import SpecLimitError
from reconciler.spec.load import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, Unreadable, load_dir, load_files
from reconciler.spec.model import repo_jar_path
from reconciler.spec.policy import SpecPolicy

GOOD = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
spec:
  job:
    jarURI: jobs/counter.jar
"""


def test_examples_repo_is_valid() -> None:
    result = load_dir(Path(__file__).parents[2] / "examples-repo")
    assert result.errors == ()
    # counter is the Kubernetes example (examples-repo/k8s/), tallies and metering share a session cluster
    assert set(result.apps) == {"orders", "clicks", "sampler", "archive", "counter", "tallies", "metering"}
    assert set(result.clusters) == {"shared"}  # examples-repo/sessions/
    modes = {a.app.spec.job.upgrade_mode.value for a in result.apps.values()}
    assert modes == {"savepoint", "last-state", "stateless"}


def test_unknown_field_names_line_column_and_suggests() -> None:
    text = GOOD.format(name="orders") + "    paralelism: 2\n"
    result = load_files({"apps/orders.yaml": text.encode()})
    (err,) = result.errors
    assert (err.file, err.line, err.column, err.field, err.app) == (
        "apps/orders.yaml", 8, 5, "spec.job.paralelism", "orders")
    assert "did you mean 'parallelism'" in str(err)
    assert str(err).startswith("apps/orders.yaml:8:5 spec.job.paralelism:")
    assert result.apps == {}


def test_bad_value_points_at_its_key() -> None:
    text = GOOD.format(name="orders") + "    upgradeMode: savepoints\n"
    (err,) = load_files({"a.yaml": text.encode()}).errors
    assert (err.line, err.field) == (8, "spec.job.upgradeMode")
    assert "'savepoint', 'last-state' or 'stateless'" in err.message


# A relative jarURI is a path inside the repository (read from Git at the applied revision): one that leaves
# it can never be applied, so it is a spec error, found by `validate` and `plan`, under any spec policy.
JAR_PATHS: dict[str, str | None] = {
    # jarURI -> the repository path it names (None: refused)
    "jobs/x.jar": "jobs/x.jar",
    "jobs/./x.jar": "jobs/x.jar",
    "jobs/sub/../x.jar": "jobs/x.jar",
    "./jobs//x.jar": "jobs/x.jar",
    "a/b/../../x.jar": "x.jar",
    "x..jar": "x..jar",
    "..x.jar": "..x.jar",
    "../x.jar": None,
    "../../../../etc/passwd": None,
    "jobs/../../../x.jar": None,
    "jobs/../../jobs/x.jar": None,  # comes back in, but only by way of the directory above the root
    "a/b/../../../x.jar": None,
    "./..": None,
    ".": None,
    "jobs/..": None,
}


@pytest.mark.parametrize("uri", sorted(JAR_PATHS))
def test_a_relative_jar_uri_is_a_path_inside_the_repository(uri: str) -> None:
    expected = JAR_PATHS[uri]
    if expected is not None:
        assert repo_jar_path(uri) == expected
    else:
        with pytest.raises(ValueError, match=r"leaves the repository|names the repository root"):
            repo_jar_path(uri)
    text = GOOD.format(name="x").replace("jarURI: jobs/counter.jar", f"jarURI: '{uri}'\n    parallelism: 1")
    files = {"apps/x.yaml": text.encode(), "apps/y.yaml": GOOD.format(name="y").encode()}
    for policy in SpecPolicy:
        result = load_files(files, policy=policy)
        if expected is not None:
            assert result.errors == () and result.apps["x"].app.spec.job.jar_uri == expected
            continue
        assert set(result.apps) == {"y"}
        (err,) = result.errors
        assert (err.file, err.line, err.field, err.app) == ("apps/x.yaml", 7, "spec.job.jarURI", "x")
        assert err.message.startswith(f"{uri!r} ") and "repository" in err.message, err.message


@pytest.mark.parametrize("uri", ["https://example.com/../x.jar", "local:///opt/../x.jar", "/srv/jars/x.jar",
                                 "file:///srv/jars/x.jar"])
def test_jar_uris_that_are_not_repository_paths_are_not_read_as_one(uri: str) -> None:
    assert repo_jar_path(uri) is None
    text = GOOD.format(name="x").replace("jarURI: jobs/counter.jar", f"jarURI: '{uri}'")
    assert load_files({"x.yaml": text.encode()}, policy=SpecPolicy.PERMISSIVE).errors == ()


def test_bad_file_invalidates_only_its_own_apps() -> None:
    files = {
        "apps/good.yaml": GOOD.format(name="good").encode(),
        "apps/multi.yaml": (GOOD.format(name="fine") + "---\n" + GOOD.format(name="Not_Dns")).encode(),
        "apps/syntax.yaml": b"apiVersion: [unclosed\n",
    }
    result = load_files(files)
    assert set(result.apps) == {"good", "fine"}
    assert result.broken_files == {"apps/multi.yaml", "apps/syntax.yaml"}
    by_file = {e.file: e for e in result.errors}
    assert by_file["apps/multi.yaml"].line == 12 and by_file["apps/multi.yaml"].field == "metadata.name"
    assert by_file["apps/syntax.yaml"].line == 2 and "invalid YAML" in by_file["apps/syntax.yaml"].message


def test_duplicate_app_names_are_an_error_for_both_files() -> None:
    result = load_files({"a.yaml": GOOD.format(name="x").encode(), "b.yaml": GOOD.format(name="x").encode()})
    assert result.apps == {}
    assert {e.file for e in result.errors} == {"a.yaml", "b.yaml"}
    assert all("duplicate app name 'x'" in e.message and e.line == 1 for e in result.errors)


def test_duplicate_keys_are_an_error_not_last_wins() -> None:
    text = GOOD.format(name="x") + "    jarURI: other.jar\n"
    (err,) = load_files({"a.yaml": text.encode()}).errors
    assert "duplicate key 'jarURI'" in err.message and err.line == 8


def test_yaml_12_scalars_norway_stays_a_string() -> None:
    text = GOOD.format(name="x") + "    args: [no, on, yes, '007']\n  flinkConfiguration: {x: off}\n"
    app = load_files({"a.yaml": text.encode()}).apps["x"].app
    assert app.spec.job.args == ("no", "on", "yes", "007")
    assert app.spec.flink_configuration == {"x": "off"}


def test_alias_bomb_fails_fast_and_clearly() -> None:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1}]"
              for i in range(1, 10)]
    bomb = "\n".join(lines) + "\napiVersion: flink-reconciler.io/v1alpha1\nkind: FlinkApp\n"
    (err,) = load_files({"bomb.yaml": bomb.encode()}).errors
    assert isinstance(err, SpecLimitError) and "alias bomb" in err.message and err.file == "bomb.yaml"


def test_a_document_of_too_many_plain_nodes_is_a_limit_too() -> None:
    """No alias: just more values than MAX_NODES (the loader builds such a document itself until then)."""
    many = GOOD.format(name="x") + "  podTemplate: {items: [" + ", ".join(["1"] * (MAX_NODES + 10)) + "]}\n"
    assert len(many) < MAX_FILE_BYTES
    (err,) = load_files({"many.yaml": many.encode()}).errors
    assert isinstance(err, SpecLimitError) and "more than 50000 nodes" in err.message and err.app == "x"
    fits = GOOD.format(name="x") + "  podTemplate: {items: [" + ", ".join(["1"] * (MAX_NODES - 100)) + "]}\n"
    assert not any(isinstance(e, SpecLimitError) for e in load_files({"fits.yaml": fits.encode()}).errors)


def test_huge_file_is_refused_before_parsing() -> None:
    (err,) = load_files({"big.yaml": b"#" * (MAX_FILE_BYTES + 1)}).errors
    assert isinstance(err, SpecLimitError) and "limited to" in err.message


def test_not_a_flinkapp_gets_one_clear_error() -> None:
    (err,) = load_files({"cm.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"}).errors
    assert err.message == "apiVersion must be 'flink-reconciler.io/v1alpha1' (got 'v1')" and err.line == 1


def test_empty_documents_and_missing_required_fields() -> None:
    text = "---\n---\napiVersion: flink-reconciler.io/v1alpha1\nkind: FlinkApp\nmetadata: {name: x}\nspec: {}\n"
    (err,) = load_files({"a.yaml": text.encode()}).errors
    assert err.message == "required field 'job' is missing" and err.field == "spec.job" and err.line == 6


def test_parallelism_beyond_slots_is_rejected() -> None:
    text = GOOD.format(name="x") + "    parallelism: 3\n"
    (err,) = load_files({"a.yaml": text.encode()}).errors
    assert "exceeds the task slots" in err.message and err.field == "spec"


HOSTILE = {
    # one bad value: an error of its app, never an exception out of the loader (issue 13 item 4)
    "deadline overflow": ("spec:\n  deadlines: {start: 99999999999d}\n", "spec.deadlines.start", "365 days"),
    "deadline inf": ("spec:\n  deadlines: {start: .inf}\n", "spec.deadlines.start", "finite"),
    "deadline huge int": ("spec:\n  deadlines: {delete: 99999999999999999999999}\n", "spec.deadlines.delete",
                          "finite"),
    "cpu inf": ("spec:\n  jobManager: {resources: {cpu: .inf}}\n", "spec.jobManager.resources.cpu", "finite"),
    "cpu nan": ("spec:\n  taskManager: {resources: {cpu: .nan}}\n", "spec.taskManager.resources.cpu", "finite"),
    "nonce overflow": ("spec:\n  job: {restartNonce: 99999999999999999999999}\n", "spec.job.restartNonce",
                       "less than or equal"),
    # validation bypasses (item 8): `$` before a trailing newline, Unicode digits
    "memory unicode digits": ('spec:\n  jobManager: {resources: {memory: "\u0661\u0660\u0662\u0664m"}}\n',
                              "spec.jobManager.resources.memory", "memory size"),
    "memory trailing newline": ('spec:\n  jobManager: {resources: {memory: "1024m\\n"}}\n',
                                "spec.jobManager.resources.memory", "memory size"),
    "duration unicode digits": ('spec:\n  deadlines: {start: "\u0661\u0660s"}\n', "spec.deadlines.start", "duration"),
    "namespace trailing newline": ('metadata:\n  namespace: "prod\\n"\n', "metadata.namespace", "DNS-1123"),
    # config injection (item 7): a key that would write other keys into config.yaml
    "flink key with newline": ('spec:\n  flinkConfiguration: {"zz: \\"1\\"\\nkubernetes.cluster-id": other}\n',
                               "spec.flinkConfiguration", "not a Flink option key"),
    "flink key with colon": ('spec:\n  flinkConfiguration: {"a: b": c}\n', "spec.flinkConfiguration",
                             "not a Flink option key"),
    "service account of another namespace": ("spec:\n  runtime: {serviceAccount: 'kube-system:admin'}\n",
                                             "spec.runtime.serviceAccount", "ServiceAccount name"),
}


def _merge_yaml(extra: str) -> str:
    """GOOD for app 'x' with `extra`'s top-level blocks merged in (spec.job stays)."""
    base = {"metadata": "metadata:\n  name: x\n", "spec": "spec:\n  job:\n    jarURI: jobs/counter.jar\n"}
    for block in ("metadata", "spec"):
        if extra.startswith(block + ":"):
            body = extra.split("\n", 1)[1]
            if "job: {" in body:  # a flow-style job replaces the block one
                base[block] = f"{block}:\n" + body.replace("job: {", "job: {jarURI: jobs/counter.jar, ")
            else:
                base[block] += body
    return "apiVersion: flink-reconciler.io/v1alpha1\nkind: FlinkApp\n" + base["metadata"] + base["spec"]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_values_are_errors_of_their_app(case: str) -> None:
    extra, field, words = HOSTILE[case]
    result = load_files({"apps/x.yaml": _merge_yaml(extra).encode(),
                         "apps/y.yaml": GOOD.format(name="y").encode()})
    assert set(result.apps) == {"y"}, "the other app still loads"
    (err,) = result.errors
    assert (err.file, err.field, err.app) == ("apps/x.yaml", field, "x")
    assert words in err.message
    assert result.broken_files == {"apps/x.yaml"}


def test_a_name_with_a_trailing_newline_is_not_a_second_app() -> None:
    result = load_files({"a.yaml": GOOD.format(name="victim").encode(),
                         "b.yaml": GOOD.format(name='"victim\\n"').encode()})
    assert set(result.apps) == {"victim"}
    (err,) = result.errors
    assert err.field == "metadata.name" and err.app == "b.yaml"  # no valid name: the file stands for it


def test_deep_nesting_and_huge_integers_are_limits_not_crashes() -> None:
    deep = GOOD.format(name="x") + "  podTemplate: " + "{a: " * 900 + "1" + "}" * 900 + "\n"
    (err,) = load_files({"deep.yaml": deep.encode()}).errors
    assert isinstance(err, SpecLimitError) and "nested more than" in err.message and err.app == "x"
    deeper = GOOD.format(name="x") + "  podTemplate: " + "[" * 20000 + "]" * 20000 + "\n"
    (err,) = load_files({"deeper.yaml": deeper.encode()}).errors
    assert err.file == "deeper.yaml"
    digits = GOOD.format(name="x").replace("jarURI: jobs/counter.jar", "jarURI: j\n    restartNonce: " + "9" * 5000)
    (err,) = load_files({"digits.yaml": digits.encode()}).errors
    assert err.file == "digits.yaml" and "invalid YAML" in err.message


@pytest.mark.parametrize("text", ["", "# only comments\n", "~\n", "---\n...\n", "null\n"])
def test_a_file_without_an_app_is_broken(text: str) -> None:
    result = load_files({"apps/v.yaml": text.encode()})
    (err,) = result.errors
    assert "holds no FlinkApp" in err.message and err.app == "apps/v.yaml"
    assert result.broken_files == {"apps/v.yaml"}
    assert result.update({"apps/v.yaml": GOOD.format(name="v").encode()}).broken_files == frozenset()
    assert result.update({"apps/v.yaml": Unreadable("is a directory, not a file")}).broken_files == {"apps/v.yaml"}


def test_valid_flink_keys_still_load() -> None:
    text = GOOD.format(name="x") + ("  flinkConfiguration:\n    state.backend.type: rocksdb\n"
                                    "    containerized.master.env.JAVA_HOME: /opt/java\n    s3.access-key: k\n")
    assert load_files({"x.yaml": text.encode()}).errors == ()


POLICY_REFUSED = {
    "hostNetwork": ("podTemplate: {spec: {hostNetwork: true}}", "spec.podTemplate.spec.hostNetwork"),
    "privileged": ("podTemplate: {spec: {containers: [{name: c, securityContext: {privileged: true}}]}}",
                   "spec.podTemplate.spec.containers[0].securityContext.privileged"),
    "capabilities": ("podTemplate: {spec: {initContainers: [{name: i, securityContext: {capabilities: "
                     "{add: [SYS_ADMIN]}}}]}}",
                     "spec.podTemplate.spec.initContainers[0].securityContext.capabilities.add"),
    "hostPath": ("podTemplate: {spec: {volumes: [{name: v, hostPath: {path: /}}]}}",
                 "spec.podTemplate.spec.volumes[0].hostPath"),
    "hostPort": ("podTemplate: {spec: {containers: [{name: c, ports: [{containerPort: 1, hostPort: 80}]}]}}",
                 "spec.podTemplate.spec.containers[0].ports[0].hostPort"),
    "other namespace": ("podTemplate: {metadata: {namespace: kube-system}}", "spec.podTemplate.metadata.namespace"),
    "service account form": ("podTemplate: {spec: {serviceAccountName: 'system:serviceaccount:kube-system:admin'}}",
                             "spec.podTemplate.spec.serviceAccountName"),
    "metadata jar": ("job: {jarURI: 'http://169.254.169.254/latest/meta-data/iam/x.jar'}", "spec.job.jarURI"),
    "metadata jar by name": ("job: {jarURI: 'http://metadata.google.internal/x.jar'}", "spec.job.jarURI"),
    "loopback jar as a number": ("job: {jarURI: 'http://2130706433:8080/x.jar'}", "spec.job.jarURI"),
    "system file jar": ("job: {jarURI: 'file:///etc/shadow'}", "spec.job.jarURI"),
    "system path jar": ("job: {jarURI: '//proc/self/environ'}", "spec.job.jarURI"),
}


@pytest.mark.parametrize("case", sorted(POLICY_REFUSED))
def test_the_restricted_policy_refuses_what_steps_out_of_the_app(case: str) -> None:
    extra, field = POLICY_REFUSED[case]
    text = GOOD.format(name="x")
    if extra.startswith("job:"):
        text = text.replace("  job:\n    jarURI: jobs/counter.jar\n", f"  {extra}\n")
    else:
        text += f"  {extra}\n"
    files = {"apps/x.yaml": text.encode(), "apps/y.yaml": GOOD.format(name="y").encode()}
    result = load_files(files)
    assert set(result.apps) == {"y"}
    (err,) = result.errors
    assert (err.file, err.field, err.app) == ("apps/x.yaml", field, "x")
    assert "spec policy is restricted" in err.message
    assert result.update({"apps/y.yaml": GOOD.format(name="y").encode()}).errors == result.errors  # kept
    permissive = load_files(files, policy=SpecPolicy.PERMISSIVE)
    assert permissive.errors == () and set(permissive.apps) == {"x", "y"}
    assert permissive.update({"apps/x.yaml": text.encode()}).errors == ()


def test_the_restricted_policy_lets_ordinary_specs_through() -> None:
    text = GOOD.format(name="x") + (
        "  runtime: {serviceAccount: flink}\n"
        "  podTemplate:\n    metadata: {namespace: default, labels: {a: b}}\n"
        "    spec:\n      serviceAccountName: flink\n      securityContext: {runAsUser: 9999, fsGroup: 9999}\n"
        "      containers: [{name: flink-main-container, securityContext: {allowPrivilegeEscalation: false,"
        " capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}, ports: [{containerPort: 9249}]}]\n"
        "      volumes: [{name: scratch, emptyDir: {}}]\n")
    for uri in ("https://artifacts.example.com/x.jar", "http://10.0.0.7/x.jar", "local:///opt/flink/x.jar",
                "/tmp/build/x.jar", "file:///srv/jars/x.jar", "jobs/x.jar"):
        doc = text.replace("jarURI: jobs/counter.jar", f"jarURI: {uri}")
        assert load_files({"x.yaml": doc.encode()}).errors == (), uri


@pytest.mark.parametrize(("name", "ok"), [("orders-g0123abcd", False), ("orders-g0123abcd9", True),
                                          ("orders-gabcdefgh", True), ("g0123abcd", True)])
def test_an_app_name_shaped_like_a_standby_generation_is_refused(name: str, ok: bool) -> None:
    """`orders-g0123abcd-config` would be both that app's ConfigMap and the standby's of app `orders`."""
    result = load_files({"a.yaml": GOOD.format(name=name).encode()})
    if ok:
        assert set(result.apps) == {name}
        return
    (err,) = result.errors
    assert err.field == "metadata.name" and err.file == "a.yaml" and err.line is not None
    assert "warm standby's cluster generation" in err.message and "'orders'" in err.message


def test_loaded_apps_share_their_models_field_name_sets() -> None:
    """Every model of a loaded app, nested ones too, holds a shared set of its given field names (memory:
    a dozen sets per app otherwise): two apps written alike share each one."""
    spec = GOOD + "  taskManager: {{replicas: 2, resources: {{cpu: 1}}}}\n  deadlines: {{start: 5m}}\n"
    result = load_files({"a.yaml": spec.format(name="a").encode(), "b.yaml": spec.format(name="b").encode()})

    def models(m: Any) -> list[Any]:
        out = [m]
        for v in m.__dict__.values():
            for x in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(x, BaseModel):
                    out += models(x)
        return out

    a, b = (models(result.apps[n].app) for n in ("a", "b"))
    assert len(a) == len(b) > 5
    for x, y in zip(a, b, strict=True):
        assert x.__pydantic_fields_set__ is y.__pydantic_fields_set__, type(x).__name__


def limited_as_pyyaml_would_be(text: str) -> bool:
    """Whether load_files reports a limit for `text` exactly when `_check_nodes` does on PyYAML's document."""
    from reconciler.spec.load import _check_nodes, _Loader

    try:
        _check_nodes(yaml.load(text, Loader=_Loader))
        over = False
    except SpecLimitError:
        over = True
    limited = [e for e in load_files({"a.yaml": text.encode()}).errors if isinstance(e, SpecLimitError)]
    return bool(limited) == over


@pytest.mark.parametrize("depth", range(MAX_DEPTH - 2, MAX_DEPTH + 3))
def test_the_nesting_limit_is_exact_whichever_way_a_document_is_built(depth: int) -> None:
    """The loader builds plain documents itself and proves the limits as it goes; the verdict at the
    boundary is the one `_check_nodes` gives on PyYAML's document."""
    nest = "".join(f"\n{'  ' * (i + 2)}k{i}:" for i in range(depth - 3)) + " leaf\n"
    assert limited_as_pyyaml_would_be(GOOD.format(name="x") + "  podTemplate:" + nest)


@pytest.mark.parametrize("extra", [-1, 0])  # the last count within the limit, the first over it
def test_the_node_limit_is_exact_whichever_way_a_document_is_built(extra: int) -> None:
    n = MAX_NODES - 8 + extra  # around the limit, counting the spec's own nodes
    pod = "  podTemplate: {" + ", ".join(f"k{i}: v" for i in range(n)) + "}\n"
    assert limited_as_pyyaml_would_be(GOOD.format(name="x") + pod)
