"""Property-based: one careless or hostile edit of one spec file never plans a delete, never starts an
app without state, never raises anything but our errors, and every error names the file (issue 13).

A valid repository of four files (five apps) is mutated in one file: truncated, emptied, binary, made a
symlink or a directory, nested thousands deep, given huge, non-finite or oddly typed values, odd Unicode,
newlines in keys and names. Then it goes through everything that reads specs: the loader (full and
incremental), the planner (offline preview with pruning on, whole and incremental), the plan renderers
and the JSON round trip, the Kubernetes renderer and the local runtime's configuration. Bounded to a few
seconds so it runs in CI.
"""

from __future__ import annotations

import contextlib
import copy
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reconciler.core import render
from reconciler.core.plan import Action, Plan, RestoreKind, StartJob, deterministic_job_id
from reconciler.core.planner import Policy, offline_input, plan
from reconciler.errors import ReconcilerError
from reconciler.live.kubernetes.render import render_app, to_yaml
from reconciler.live.local.config import ClusterPaths, cluster_config_hash, render_config, render_yaml
from reconciler.service.sharding import Shard
from reconciler.spec.load import LoadResult, Unreadable, file_key, load_files
from reconciler.spec.model import FlinkApp, valid_name

BASE_REV, HEAD_REV = "a" * 40, "b" * 40
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _app(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"job": {"jarURI": "local:///opt/flink/usrlib/job.jar", "parallelism": 2},
                            "taskManager": {"replicas": 2, "slots": 1}}
    body.update(spec)
    return {"apiVersion": "flink-reconciler.io/v1alpha1", "kind": "FlinkApp",
            "metadata": {"name": name, "namespace": "flink", "labels": {"team": "data"}}, "spec": body}


DOCS: dict[str, list[dict[str, Any]]] = {
    "apps/victim.yaml": [_app(
        "victim",
        flinkConfiguration={"execution.checkpointing.interval": "10s", "state.backend.type": "rocksdb"},
        jobManager={"resources": {"cpu": 0.5, "memory": "1024m"}},
        podTemplate={"spec": {"containers": [{"name": "flink-main-container", "env": [{"name": "A", "value": "1"}]}]}},
        deadlines={"start": "5m", "savepoint": "90s"},
    )],
    "apps/keep1.yaml": [_app("keep1")],
    "apps/keep2.yml": [_app("keep2", job={"jarURI": "local:///j.jar", "upgradeMode": "stateless"})],
    "apps/team/pair.yaml": [_app("pair-a"),
                            _app("pair-b", job={"jarURI": "local:///j.jar", "upgradeMode": "last-state"})],
}


def _dump(docs: list[Any]) -> bytes:
    return yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True).encode()


BASE_FILES: dict[str, bytes | Unreadable] = {path: _dump(docs) for path, docs in DOCS.items()}
BASE = load_files(BASE_FILES)
assert BASE.ok and len(BASE.apps) == 5

# -- mutations ------------------------------------------------------------------------------------------

_ODD_PIECES = st.sampled_from(["\n", "\r", "\t", "\x00", "\u202e", "\u200b", "\ufeff", "\u0661", "\uff11", ":", "#",
                               "{", "[", "&a", "*a", "!!python/object", "---", "...", "%", "@", "`", "'", '"', "\\"])
ODD_TEXT = st.lists(st.one_of(st.characters(codec="utf-8", exclude_categories=["Cs"]), _ODD_PIECES),
                    max_size=20).map("".join)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([10**300, -1, 0, 2**63, 2**64, 1e308, -0.0]),
)
SCALARS = st.one_of(NUMBERS, ODD_TEXT, st.booleans(), st.none())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(ODD_TEXT, inner, max_size=3)), max_leaves=8)
FIELDS = [
    ("metadata", "name"), ("metadata", "namespace"), ("metadata", "labels"), ("spec", "job", "parallelism"),
    ("spec", "job", "jarURI"), ("spec", "job", "args"), ("spec", "job", "restartNonce"),
    ("spec", "job", "upgradeMode"), ("spec", "job", "state"), ("spec", "job", "maxCheckpointAge"),
    ("spec", "deadlines", "start"), ("spec", "deadlines", "delete"), ("spec", "jobManager", "resources", "cpu"),
    ("spec", "jobManager", "resources", "memory"), ("spec", "taskManager", "replicas"), ("spec", "taskManager"),
    ("spec", "flinkConfiguration"), ("spec", "podTemplate"), ("spec", "runtime", "serviceAccount"),
    ("spec", "image"), ("spec",), ("apiVersion",), ("kind",),
]
MAPS_WITH_FREE_KEYS = [("metadata", "labels"), ("metadata", "annotations"), ("spec", "flinkConfiguration"),
                       ("spec", "podTemplate")]


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = doc
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


@st.composite
def value_edit(draw: st.DrawFn, docs: list[dict[str, Any]]) -> bytes:
    docs = copy.deepcopy(docs)
    doc = docs[draw(st.integers(0, len(docs) - 1))]
    _set(doc, draw(st.sampled_from(FIELDS)), draw(VALUES))
    return _dump(docs)


@st.composite
def key_edit(draw: st.DrawFn, docs: list[dict[str, Any]]) -> bytes:
    docs = copy.deepcopy(docs)
    doc = docs[draw(st.integers(0, len(docs) - 1))]
    where = draw(st.sampled_from(MAPS_WITH_FREE_KEYS))
    _set(doc, (*where, draw(ODD_TEXT)), draw(st.one_of(ODD_TEXT, NUMBERS)))
    return _dump(docs)


@st.composite
def deep_nesting(draw: st.DrawFn, path: str) -> bytes:
    depth = draw(st.integers(30, 3000))
    if draw(st.booleans()):
        return _nested(path, depth)
    nest = ("{a: " * depth + "1" + "}" * depth) if draw(st.booleans()) else ("[" * depth + "]" * depth)
    return _dump(DOCS[path]) + f"---\n{nest}\n".encode()  # a document of its own


@st.composite
def text_edit(draw: st.DrawFn, data: bytes) -> bytes:
    at = draw(st.integers(0, len(data)))
    return data[:at] + draw(ODD_TEXT).encode("utf-8", "surrogatepass") + data[at + draw(st.integers(0, 20)):]


def _edit(path: str, field: tuple[str, ...], value: Any) -> bytes:
    docs = copy.deepcopy(DOCS[path])
    _set(docs[0], field, value)
    return _dump(docs)


def _nested(path: str, depth: int) -> bytes:
    """podTemplate nested `depth` deep (as text: the YAML dumper itself would recurse too deep)."""
    nest = "{a: " * depth + "1" + "}" * depth
    return _edit(path, ("spec", "podTemplate"), "DEEP").replace(b"podTemplate: DEEP", f"podTemplate: {nest}".encode())


def mutation(path: str) -> st.SearchStrategy[bytes | Unreadable]:
    data = BASE_FILES[path]
    assert isinstance(data, bytes)
    docs = DOCS[path]
    return st.one_of(
        st.integers(0, len(data)).map(lambda n: data[:n]),  # truncated
        st.sampled_from([b"", b"# gone\n", b"~\n", b"---\n---\n", b"null\n", b"[]\n", b"{}\n", b"\xef\xbb\xbf",
                         data.replace(b"parallelism: 2", b"parallelism: " + b"9" * 5000),  # beyond int()
                         data.replace(b"parallelism: 2", b"parallelism: .inf")]),
        st.binary(max_size=300),
        st.sampled_from([Unreadable("is a symbolic link; symlinks are not followed, a spec must be a regular file"),
                         Unreadable("is a directory, not a file"), Unreadable("cannot be read: Permission denied")]),
        deep_nesting(path),
        value_edit(docs),
        key_edit(docs),
        text_edit(data),
    )


EDITS = st.sampled_from(sorted(DOCS)).flatmap(lambda p: st.tuples(st.just(p), mutation(p)))

# -- the pipeline under test ----------------------------------------------------------------------------


def _everything(head: LoadResult, tmp: Path) -> Plan:
    """Plan (whole and incremental), render the plan every way, render every app for both runtimes."""
    inp = offline_input(BASE, head, base_revision=BASE_REV, revision=HEAD_REV, now=NOW, policy=Policy(prune=True))
    result = plan(inp)
    for name in {a.app for a in result.apps}:
        assert plan(inp, only={name}).app(name) == result.app(name), "incremental planning agrees"
    render.to_text(result)
    render.to_markdown(result)
    assert Plan.from_json(render.to_json(result)) == result
    for name, la in head.apps.items():
        with contextlib.suppress(ReconcilerError):  # e.g. a jar scheme Kubernetes cannot run: this app's error
            to_yaml(render_app(la.app, revision=HEAD_REV, job_id=deterministic_job_id(name, HEAD_REV, 1),
                               restore_path=None))
        paths = ClusterPaths(root=tmp / name, checkpoints=tmp / name / "c", savepoints=tmp / name / "s")
        render_yaml(render_config(la.app, paths, rest_port=8081, rpc_port=6123))
        cluster_config_hash(la.app, "2.3")
        FlinkApp.model_validate(la.app.canonical())  # what the journal stores reads back
    return result


# FUZZ_EXAMPLES=5000 for a deeper run by hand; CI keeps the default (a few seconds).
@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "80")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(edit=EDITS)
@example(edit=("apps/victim.yaml", b""))  # the repros run every time
@example(edit=("apps/victim.yaml", b"# only comments\n"))
@example(edit=("apps/victim.yaml", b"~\n"))
@example(edit=("apps/victim.yaml", Unreadable("is a symbolic link")))
@example(edit=("apps/victim.yaml", Unreadable("is a directory, not a file")))
@example(edit=("apps/victim.yaml", _edit("apps/victim.yaml", ("spec", "deadlines", "start"), "99999999999d")))
@example(edit=("apps/victim.yaml", _edit("apps/victim.yaml", ("spec", "deadlines", "start"), float("inf"))))
@example(edit=("apps/victim.yaml", _edit("apps/victim.yaml", ("spec", "jobManager", "resources", "cpu"),
                                         float("inf"))))
@example(edit=("apps/victim.yaml", _nested("apps/victim.yaml", 900)))
@example(edit=("apps/victim.yaml", _edit("apps/victim.yaml", ("metadata", "name"), "victim\n")))
@example(edit=("apps/keep1.yaml", _edit("apps/keep1.yaml", ("metadata", "name"), "victim")))  # a duplicate
@example(edit=("apps/victim.yaml", _edit("apps/victim.yaml", ("spec", "jobManager", "resources", "memory"),
                                         "\u0661\u0660\u0662\u0664m")))
@example(edit=("apps/victim.yaml", _edit("apps/victim.yaml", ("spec", "flinkConfiguration"),
                                         {'zz: "1"\nkubernetes.cluster-id': "other-app"})))
def test_one_bad_file_never_deletes_restarts_empty_or_crashes(edit: tuple[str, bytes | Unreadable],
                                                              tmp_path_factory: Any) -> None:
    target, data = edit
    files = {**BASE_FILES, target: data}
    try:
        head = load_files(files)
        incremental = BASE.update({target: data})
        result = _everything(head, tmp_path_factory.getbasetemp())
    except ReconcilerError:
        return  # one of ours: reported, never a traceback
    assert sorted(incremental.apps) == sorted(head.apps)
    assert [str(e) for e in incremental.errors] == [str(e) for e in head.errors]
    for i in range(2):  # sharded loads (another shard's files skipped by their lines, spec/prescan.py) agree
        owns = Shard(i, 2).owns
        mine = {la.file for n, la in BASE.apps.items() if owns(n)}
        sharded = load_files(files, keep=owns, parse=mine)
        assert sharded.apps == {n: la for n, la in head.apps.items() if owns(n)}, i
        if target in mine:  # the shard of the file's apps parses it whatever its lines say: it sees every error
            assert {str(e) for e in head.errors if not valid_name(e.app or "") or owns(e.app or "")} <= {
                str(e) for e in sharded.errors}, i

    broken = target in head.broken_files
    actions = {a.app: a for a in result.apps}
    in_target = {n for n, la in BASE.apps.items() if la.file == target}
    duplicate = any("duplicate app name" in e.message for e in head.errors)
    for name in BASE.apps:
        ap = actions[name]
        if name not in in_target:  # another file's app: untouched (a duplicate name makes it an error)
            assert ap.action is Action.NOOP or (duplicate and ap.action is Action.ERROR), (name, ap)
            assert not ap.steps
        elif broken and name not in head.apps:  # its file broke: an error, never a delete or a restart
            assert ap.action is Action.ERROR and not ap.steps, (name, ap)
        elif ap.action is Action.DELETE:  # only a valid file that holds other apps now (a rename)
            assert not broken and name not in head.apps, (name, ap)
            assert any(other.file == target for other in head.apps.values()), (name, ap)
        for step in ap.steps:  # an existing app never starts empty without the spec's consent
            if isinstance(step, StartJob) and step.restore.kind is RestoreKind.NONE:
                assert head.apps[name].app.spec.job.upgrade_mode.value == "stateless", (name, ap)
                assert any("WITHOUT STATE" in r for r in ap.risks)

    for e in head.errors:  # every error names the mutated file (or, for a duplicate, both files)
        assert e.file == target or (duplicate and "duplicate app name" in e.message), e
    if head.errors:
        text = render.to_text(result)
        assert file_key(target) in text or target in text
        assert result.has_errors
    for ap in result.apps:
        if ap.action is Action.ERROR:
            assert file_key(target) in ap.reason or target in ap.reason or (ap.source_file or "") in ap.reason
