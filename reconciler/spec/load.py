"""YAML -> FlinkApp models, with errors that name file:line:column and the field path.

Two parsers, one meaning. The fast path parses with libyaml (PyYAML's C loader) configured to YAML 1.2
core-schema scalars (only true/false are booleans, no sexagesimal ints) and duplicate-key checks, so
10,000 specs load in about a second. Only when a document fails validation is the file re-parsed
with ruamel.yaml's round-trip loader, which knows where every key and value sits, to locate the
error. A bad file invalidates only its own apps. A shard (`keep`) does not parse a file whose lines
show it holds another shard's app (spec/prescan.py), unless told to (`parse`: the files its own apps
came from, so a file that broke or changed hands is always seen by the shard that had it).

A file is *broken* (listed in `LoadResult.broken_files`) when it has any error, including holding no
app at all (empty, comments only, a null document) or not being readable as a regular file (a
symlink, a directory, no permission: `Unreadable`). The planner never deletes or restarts an app
because its file broke. An error is attributed to an app (`SpecError.app`) by the app's name when the
document has a valid one, else to the file itself (`file_key`), so that every error reaches the plan
as an `error` entry even when no app can be named.

Over 600 lines for one concern: parsing specs fast (libyaml) yet with exact file:line:field errors and
the hostile-input limits, which must agree line for line.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from reconciler.errors import SpecError, SpecLimitError
from reconciler.spec.model import API_VERSION, KIND, FlinkApp, valid_name
from reconciler.spec.policy import SpecPolicy, violations
from reconciler.spec.prescan import declared_name
from reconciler.spec.session import (
    SESSION_KIND,
    FlinkSessionCluster,
    capacity_problem,
    cluster_fields_given,
    effective_app,
    fit_replicas,
)

MAX_FILE_BYTES = 1 << 20  # a spec is a few KiB; anything near this is a mistake or an attack
MAX_DOCUMENTS = 1000
MAX_NODES = 50_000  # after alias expansion: stops "billion laughs" before pydantic walks it
MAX_DEPTH = 64  # nesting of mappings/lists; a real spec is under 15 deep (podTemplate included)
SPEC_SUFFIXES = (".yaml", ".yml")


class _Loader(yaml.CSafeLoader):
    """libyaml with YAML 1.2 core-schema booleans/ints and duplicate-key detection."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        """PyYAML's `BaseResolver.resolve` for a scalar: the first of the implicit resolvers for its first
        character whose regex matches, else a string; here those regexes are tried as one (`_IMPLICIT`).
        libyaml calls this for every scalar of every spec: 10 us of a spec's 45 us of parsing, about 5 now."""
        if kind is yaml.ScalarNode:
            if implicit[0]:
                rx = _IMPLICIT.get(value[:1])
                if rx is not None and (m := rx.match(value)) is not None:
                    return _IMPLICIT_TAGS[m.lastgroup]
            return _STR
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]

    # No path resolvers are registered (asserted below): nothing to track per node (3 % of parsing).
    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        pass

    def ascend_resolver(self) -> None:
        pass


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int")]
    for k, v in yaml.CSafeLoader.yaml_implicit_resolvers.copy().items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)


def _combined(resolvers: list[tuple[str, re.Pattern[str]]], tags: dict[str | None, str]) -> re.Pattern[str]:
    """One regex trying `resolvers` in order (an alternation does: its first matching branch wins), each
    branch under its own flags, named by a group that `tags` maps to its tag."""
    branches = []
    for tag, rx in resolvers:
        assert not rx.flags & ~(re.X | re.I | re.M | re.S | re.U), rx  # the flags a branch can carry
        name = f"g{len(tags)}"
        tags[name] = tag
        flags = "".join(letter for flag, letter in ((re.X, "x"), (re.I, "i"), (re.M, "m"), (re.S, "s"))
                        if rx.flags & flag)
        branches.append(f"(?P<{name}>(?{flags}:{rx.pattern}))" if flags else f"(?P<{name}>{rx.pattern})")
    return re.compile("|".join(branches))


assert None not in _Loader.yaml_implicit_resolvers and not _Loader.yaml_path_resolvers  # what resolve() skips
_IMPLICIT_TAGS: dict[str | None, str] = {}
_IMPLICIT: dict[str, re.Pattern[str]] = {first: _combined(resolvers, _IMPLICIT_TAGS)
                                         for first, resolvers in _Loader.yaml_implicit_resolvers.items() if resolvers}


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
    # Duplicate keys are caught on the scalar nodes (cheap), then PyYAML's own lazy construction runs.
    seen: set[str] = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                )
            seen.add(key_node.value)
    data: dict[Any, Any] = {}
    yield data
    data.update(loader.construct_mapping(node))


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    return _int(str(loader.construct_scalar(node)))


def _int(text: str) -> int:
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 0) if text.startswith("0x") else int(text)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


@dataclass(frozen=True)
class Unreadable:
    """A spec path that exists but is not a readable regular file: a symlink (never followed), a
    directory, a submodule, a path with a control character, a permission error. Its apps are errors."""

    reason: str


def file_key(path: str) -> str:
    """The plan entry of an error no app can be named for: the file path, control characters escaped
    (it lands in plan lines, commit-status contexts and note keys). Never a valid app name: it has a dot."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)


@dataclass(frozen=True)
class LoadedApp:
    app: FlinkApp
    file: str
    doc_index: int
    line: int | None = None  # where the document starts
    session_line: int | None = None  # where spec.sessionCluster is (a session app)


@dataclass(frozen=True)
class LoadedCluster:
    """A FlinkSessionCluster document (spec/session.py)."""

    cluster: FlinkSessionCluster
    file: str
    doc_index: int
    line: int | None = None
    slots_line: int | None = None  # where spec.taskManager is (a capacity refusal points there)


@dataclass(frozen=True)
class FileResult:
    apps: tuple[LoadedApp, ...] = ()
    errors: tuple[SpecError, ...] = ()
    clusters: tuple[LoadedCluster, ...] = ()


@dataclass(frozen=True)
class LoadResult:
    apps: dict[str, LoadedApp] = field(default_factory=dict)
    errors: tuple[SpecError, ...] = ()
    files: frozenset[str] = frozenset()  # every spec file seen
    broken_files: frozenset[str] = frozenset()  # files with at least one error
    by_file: Mapping[str, FileResult] = field(default_factory=dict, repr=False)
    policy: SpecPolicy = SpecPolicy.RESTRICTED  # what a spec may ask of the cluster (spec/policy.py)
    # Which app names are kept (a shard's): the others are dropped as each file is parsed, so a shard never
    # holds the whole repository's specs at once. None: all.
    keep: Callable[[str], bool] | None = field(default=None, repr=False, compare=False)
    # FlinkSessionClusters by name. A session app in `apps` is already its effective app (spec/session.py).
    clusters: dict[str, LoadedCluster] = field(default_factory=dict)
    session_names: dict[str, tuple[str, ...]] = field(default_factory=dict)  # cluster -> apps naming it

    @property
    def ok(self) -> bool:
        return not self.errors

    def apps_in(self, file: str) -> list[str]:
        return [n for n, a in self.apps.items() if a.file == file]

    def update(self, changed: Mapping[str, bytes | Unreadable | None], *,
               parse: Collection[str] = ()) -> LoadResult:
        """Re-parse only `changed` files (None: deleted); the incremental path of the daemon. `parse`: as
        for `load_files`."""
        per_file = dict(self.by_file)
        for path, data in changed.items():
            if data is None:
                per_file.pop(path, None)
            else:
                per_file[path] = _only(_file_result(path, data, self.policy, self.keep, path in parse), self.keep)
        return _combine(per_file, self.policy, self.keep)


def load_files(files: Mapping[str, bytes | Unreadable], *, policy: SpecPolicy = SpecPolicy.RESTRICTED,
               keep: Callable[[str], bool] | None = None, parse: Collection[str] = ()) -> LoadResult:
    """Load every document of every file; collect errors instead of stopping at the first. `keep`: only
    the apps it accepts are kept. Errors no app can be named for (an unreadable file) are kept: that file
    may hold any app. Duplicates stay detected: both copies of a name are kept or dropped together.
    `parse`: files parsed even when their lines name an app `keep` refuses (see `load_file`)."""
    return _combine({path: _only(_file_result(path, data, policy, keep, path in parse), keep)
                     for path, data in files.items()}, policy, keep)


def _file_result(path: str, data: bytes | Unreadable, policy: SpecPolicy,
                 keep: Callable[[str], bool] | None = None, parse: bool = False) -> FileResult:
    loaded, clusters, errors = load_file_all(path, data, keep=keep, parse=parse)
    if not loaded and not errors and not clusters:
        return _NOTHING  # e.g. another shard's file: most files of a sharded repository
    apps = []
    for la in loaded:
        refused = violations(la.app, policy)
        if not refused:
            apps.append(la)
        for field_path, message in refused:
            errors.append(SpecError(message, file=path, line=la.line, field=field_path, app=la.app.name))
    return FileResult(tuple(apps), tuple(_attributed(e, path) for e in errors), tuple(clusters))


_NOTHING = FileResult()


def _only(fr: FileResult, keep: Callable[[str], bool] | None) -> FileResult:
    if keep is None or fr is _NOTHING:
        return fr
    apps = tuple(la for la in fr.apps if keep(la.app.name))
    errors = tuple(e for e in fr.errors if e.app is None or not valid_name(e.app) or keep(e.app))
    if len(apps) == len(fr.apps) and len(errors) == len(fr.errors):
        return fr
    # Session clusters are kept by every shard: the apps on them may belong to any shard.
    return FileResult(apps, errors, fr.clusters) if apps or errors or fr.clusters else _NOTHING


def _attributed(e: SpecError, path: str) -> SpecError:
    if e.app is not None:
        return e
    return type(e)(e.message, file=e.file or path, line=e.line, column=e.column, field=e.field, app=file_key(path))


def _combine(per_file: Mapping[str, FileResult], policy: SpecPolicy,
             keep: Callable[[str], bool] | None = None) -> LoadResult:
    errors: list[SpecError] = []
    seen: dict[str, list[LoadedApp]] = {}
    seen_clusters: dict[str, list[LoadedCluster]] = {}
    for path in sorted(per_file):
        fr = per_file[path]
        errors.extend(fr.errors)
        for la in fr.apps:
            seen.setdefault(la.app.name, []).append(la)
        for lc in fr.clusters:
            seen_clusters.setdefault(lc.cluster.name, []).append(lc)
    apps: dict[str, LoadedApp] = {}
    for name, places in seen.items():
        if len(places) == 1 and name not in seen_clusters:
            apps[name] = places[0]
            continue
        where = ", ".join(f"{p.file} (document {p.doc_index + 1})" for p in
                          [*places, *seen_clusters.get(name, ())])
        for p in places:
            errors.append(SpecError(f"duplicate app name {name!r}: defined in {where}", file=p.file,
                                    line=p.line, field="metadata.name", app=name))
    clusters, cluster_errors = _clusters(seen_clusters, seen)
    errors.extend(cluster_errors)
    session_names: dict[str, list[str]] = {}
    for name, la in sorted(apps.items()):
        if la.app.spec.session_cluster is not None:
            session_names.setdefault(la.app.spec.session_cluster, []).append(name)
    apps, session_errors = resolve_sessions(apps, clusters)
    errors.extend(session_errors)
    return LoadResult(
        apps=apps,
        clusters=clusters,
        session_names={c: tuple(n) for c, n in session_names.items()},
        errors=tuple(errors),
        files=frozenset(per_file),
        broken_files=frozenset(e.file for e in errors),
        by_file=per_file,
        policy=policy,
        keep=keep,
    )


def _clusters(seen: Mapping[str, list[LoadedCluster]], apps: Mapping[str, list[LoadedApp]]
              ) -> tuple[dict[str, LoadedCluster], list[SpecError]]:
    """Session clusters by name: a name defined twice (as two clusters, or as a cluster and an app) is an error
    of each copy; the apps are named by the app duplicate check."""
    out: dict[str, LoadedCluster] = {}
    errors: list[SpecError] = []
    for name, places in seen.items():
        if len(places) == 1 and name not in apps:
            out[name] = places[0]
            continue
        where = ", ".join(f"{p.file} (document {p.doc_index + 1})" for p in [*places, *apps.get(name, ())])
        for p in places:
            errors.append(SpecError(f"duplicate name {name!r}: apps and session clusters share one namespace of "
                                    f"names; defined in {where}", file=p.file, line=p.line, field="metadata.name",
                                    app=name))
    return out, errors


def resolve_sessions(apps: Mapping[str, LoadedApp], clusters: Mapping[str, LoadedCluster]
                     ) -> tuple[dict[str, LoadedApp], list[SpecError]]:
    """Each session app becomes its effective app (its job on its session cluster's fields), or an error of its
    own when the cluster is not in the repository, sits in another namespace, or has too few task slots for the
    running jobs of all its apps (an error never acts: every app on that cluster is left as it is)."""
    out: dict[str, LoadedApp] = {}
    errors: list[SpecError] = []
    members: dict[str, list[LoadedApp]] = {}
    for name, la in apps.items():
        wanted = la.app.spec.session_cluster
        if wanted is None:
            out[name] = la
            continue
        lc = clusters.get(wanted)
        if lc is None:
            errors.append(_session_error(la, f"names session cluster {wanted!r}, which no FlinkSessionCluster in "
                                             "the repository defines (or its spec is invalid)"))
        elif lc.cluster.metadata.namespace != la.app.metadata.namespace:
            errors.append(_session_error(la, f"runs on session cluster {wanted!r} of namespace "
                                             f"{lc.cluster.metadata.namespace!r} but is in namespace "
                                             f"{la.app.metadata.namespace!r}: an app's job runs in its cluster's "
                                             "namespace, set metadata.namespace to it"))
        else:
            members.setdefault(wanted, []).append(la)
    for cname, las in sorted(members.items()):
        lc = clusters[cname]
        problem = capacity_problem(lc.cluster, [la.app for la in las])
        if problem is not None:
            errors.append(SpecError(problem, file=lc.file, line=lc.slots_line or lc.line, field="spec.taskManager",
                                    app=cname))
            errors.extend(_session_error(la, problem) for la in las)
            continue
        replicas = fit_replicas(lc.cluster, [la.app for la in las])
        for la in las:
            out[la.app.name] = LoadedApp(effective_app(la.app, lc.cluster, replicas), la.file, la.doc_index,
                                         la.line, la.session_line)
    return out, errors


def _session_error(la: LoadedApp, message: str) -> SpecError:
    return SpecError(message, file=la.file, line=la.session_line or la.line, field="spec.sessionCluster",
                     app=la.app.name)


def load_dir(root: Path, subdir: str = "", *, policy: SpecPolicy = SpecPolicy.RESTRICTED) -> LoadResult:
    """Load the specs under a directory tree (hidden files and folders are skipped)."""
    return load_files(read_dir(root, subdir), policy=policy)


def read_dir(root: Path, subdir: str = "") -> dict[str, bytes | Unreadable]:
    """Spec files under root/subdir, keyed by their path relative to root. Symlinks are never followed:
    a symlink, a directory or any other non-regular file with a spec suffix is `Unreadable`."""
    base = root / subdir if subdir else root
    if not base.is_symlink() and not base.exists():
        return {}
    if base.is_symlink() or not base.is_dir():
        return {base.relative_to(root).as_posix() if subdir else base.name: _read_one(base)}
    out: dict[str, bytes | Unreadable] = {}

    def unreadable_dir(e: OSError) -> None:
        where = Path(e.filename) if e.filename else base
        out[where.relative_to(root).as_posix()] = Unreadable(f"directory cannot be read: {e.strerror}")

    for dirpath, dirnames, filenames in os.walk(base, onerror=unreadable_dir, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted([*dirnames, *filenames]):
            if name.startswith(".") or not (name.endswith(SPEC_SUFFIXES) or _linked_dir(here / name)):
                continue
            out[(here / name).relative_to(root).as_posix()] = _read_one(here / name)
    return dict(sorted(out.items()))


def _linked_dir(path: Path) -> bool:
    """A symlink named like a directory (no dot): reported, never followed (as the Git source does)."""
    return "." not in path.name and path.is_symlink()


def _read_one(path: Path) -> bytes | Unreadable:
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            return Unreadable(f"is a symbolic link (to {os.readlink(path)!r}); symlinks are not followed, "
                              "a spec must be a regular file")
        if stat.S_ISDIR(st.st_mode):
            return Unreadable("is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            return Unreadable("is not a regular file")
        with path.open("rb") as fh:
            return fh.read(MAX_FILE_BYTES + 1)  # enough to refuse an oversized file
    except OSError as e:
        return Unreadable(f"cannot be read: {e.strerror}")


def load_file(path: str, data: bytes | Unreadable, *, keep: Callable[[str], bool] | None = None,
              parse: bool = False) -> tuple[list[LoadedApp], list[SpecError]]:
    """The apps and errors of one file (see `load_file_all`)."""
    apps, _, errors = load_file_all(path, data, keep=keep, parse=parse)
    return apps, errors


def load_file_all(path: str, data: bytes | Unreadable, *, keep: Callable[[str], bool] | None = None,
                  parse: bool = False) -> tuple[list[LoadedApp], list[LoadedCluster], list[SpecError]]:
    """The apps, session clusters and errors of one file. `keep` (a shard's): a document whose metadata.name is a
    valid app name `keep` refuses is not validated at all (its app and its errors would be dropped anyway); a
    document without a readable name is validated, so its errors reach every shard. A file whose lines
    name such an app (spec/prescan.py: exact where it answers) is not even parsed, unless `parse`."""
    if isinstance(data, Unreadable):
        return [], [], [SpecError(f"{data.reason}; its apps are left as they are", file=path)]
    if len(data) > MAX_FILE_BYTES:
        return [], [], [SpecLimitError(f"file is {len(data)} bytes; specs are limited to {MAX_FILE_BYTES}",
                                   file=path)]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return [], [], [SpecError(f"not UTF-8 text ({e.reason} at byte {e.start})", file=path)]
    if keep is not None and not parse and (name := plain_name(text)) is not None and not keep(name):
        return [], [], []  # another shard's app
    try:
        docs = _parse_docs(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        return [], [], [SpecError(f"invalid YAML: {e.problem or e.context}", file=path,
                              line=mark.line + 1 if mark else None, column=mark.column + 1 if mark else None)]
    except yaml.YAMLError as e:
        return [], [], [SpecError(f"invalid YAML: {e}", file=path)]
    except SpecLimitError as e:
        return [], [], [SpecLimitError(e.message, file=path)]
    except RecursionError:
        return [], [], [SpecLimitError(f"nested more than {MAX_DEPTH} levels deep", file=path)]
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        return [], [], [SpecError(f"invalid YAML: {e}", file=path)]
    if all(doc is None for doc, _ in docs):
        return [], [], [SpecError("holds no FlinkApp (the file is empty, only comments, or null); delete the "
                              "file to remove its apps", file=path)]
    apps: list[LoadedApp] = []
    clusters: list[LoadedCluster] = []
    errors: list[SpecError] = []
    locator: _Locator | None = None
    for i, (doc, within_limits) in enumerate(docs):
        if doc is None:
            continue  # an empty document (e.g. a trailing ---)
        if keep is not None and (name := _doc_name(doc)) is not None and not keep(name):
            continue  # another shard's app
        try:
            if not within_limits:
                _check_nodes(doc)
        except SpecLimitError as e:
            errors.append(SpecLimitError(e.message, file=path, app=_doc_name(doc)))
            continue
        header = _header_error(doc)
        if header:
            locator = locator or _Locator(text)
            line, col = locator.find(i, (header[0],) if header[0] else ())
            errors.append(SpecError(header[1], file=path, line=line, column=col, field=header[0] or None,
                                    app=_doc_name(doc)))
            continue
        if doc.get("kind") == SESSION_KIND:
            try:
                cluster = FlinkSessionCluster.model_validate(doc)
                locator = locator or _Locator(text)
                clusters.append(LoadedCluster(cluster, path, i, _doc_start(text, i),
                                              locator.find(i, ("spec", "taskManager"))[0]))
            except RecursionError:
                errors.append(SpecLimitError(f"nested more than {MAX_DEPTH} levels deep", file=path))
            except ValidationError as e:
                locator = locator or _Locator(text)
                errors.extend(_spec_errors(e, path, i, doc, locator, model=FlinkSessionCluster))
            continue
        try:
            app = _shared_field_sets(FlinkApp.model_validate(doc))
        except RecursionError:
            errors.append(SpecLimitError(f"nested more than {MAX_DEPTH} levels deep", file=path))
            continue
        except ValidationError as e:
            locator = locator or _Locator(text)
            errors.extend(_spec_errors(e, path, i, doc, locator))
            continue
        if app.spec.session_cluster is None:
            apps.append(LoadedApp(app, path, i, _doc_start(text, i)))
            continue
        locator = locator or _Locator(text)
        refused = cluster_fields_given(doc)
        for key in refused:
            line, col = locator.find(i, ("spec", key))
            errors.append(SpecError(f"{key} belongs to the session cluster: app {app.name!r} runs on session cluster "
                                    f"{app.spec.session_cluster!r} (spec.sessionCluster), so set it there, or remove "
                                    "spec.sessionCluster to give the app its own cluster", file=path, line=line,
                                    column=col, field=f"spec.{key}", app=app.name))
        if not refused:
            apps.append(LoadedApp(app, path, i, _doc_start(text, i), locator.find(i, ("spec", "sessionCluster"))[0]))
    return apps, clusters, errors


def plain_name(text: str) -> str | None:
    """The app name a spec file's lines declare (spec/prescan.py), when it is a valid app name that this
    module's parser also reads as a string (not `null`, `true`, `123` or a date)."""
    name = declared_name(text)
    if name is None or not valid_name(name):
        return None
    return name if _RESOLVER.resolve(yaml.ScalarNode, name, (True, False)) == _STR else None


_RESOLVER = _Loader("")

_DOC_SEPARATOR = re.compile(r"^---(?:[ \t]|$)", re.MULTILINE)


_FIELD_SETS: dict[frozenset[str], set[str]] = {}


def _shared_field_sets(app: FlinkApp) -> FlinkApp:
    """`app`, each of its (frozen) models holding a shared copy of its set of explicitly given field
    names: pydantic keeps one set per model, a dozen per app, about half of a loaded spec's memory. The
    sets are only read (`model_fields_set`); a copy of a model copies its set before changing it."""
    stack: list[Any] = [app]
    while stack:
        model = stack.pop()
        names = model.__pydantic_fields_set__
        shared = _FIELD_SETS.setdefault(frozenset(names), names)
        if shared is not names:
            object.__setattr__(model, "__pydantic_fields_set__", shared)
        fields = model.__dict__
        for name in _model_valued(type(model)):
            value = fields[name]
            if isinstance(value, BaseModel):
                stack.append(value)
            elif isinstance(value, (tuple, list)):
                stack.extend(v for v in value if isinstance(v, BaseModel))
    return app


_MODEL_VALUED: dict[type[BaseModel], tuple[str, ...]] = {}


def _model_valued(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `cls` whose type names a model (the only ones `_shared_field_sets` must visit)."""
    names = _MODEL_VALUED.get(cls)
    if names is None:
        names = _MODEL_VALUED[cls] = tuple(n for n, f in cls.model_fields.items() if _model_in(f.annotation))
    return names


def _doc_start(text: str, doc_index: int) -> int:
    """1-based line where document `doc_index` starts (cheap: separators only, no parse)."""
    if doc_index == 0 and "---" not in text:
        return 1  # one document, from the top (what nearly every spec file is)
    seps = list(_DOC_SEPARATOR.finditer(text))
    starts = [text.count("\n", 0, m.start()) + 1 for m in seps]
    head = text[: seps[0].start()] if seps else text
    if any(ln.strip() and not ln.lstrip().startswith(("#", "%")) for ln in head.splitlines()):
        starts.insert(0, 1)  # content before the first '---' is a document of its own
    return starts[doc_index] if doc_index < len(starts) else 1


def _parse_docs(text: str) -> list[tuple[Any, bool]]:
    """Every document of `text`, as `yaml.load_all(text, Loader=_Loader)` gives them (same values, same
    errors), a third faster (10,000 specs: 0.81 -> 0.55 s): libyaml composes each document's nodes, and a
    plain one (see `_plain`) is built from them here instead of by PyYAML's general constructor. With each
    document: whether `_plain` built it, which proves what `_check_nodes` checks."""
    docs: list[tuple[Any, bool]] = []
    loader = _Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            try:
                docs.append((None if node is None else _plain(node, 0, set()), True))
            except (_NotPlainError, ValueError):  # built by PyYAML instead: its values and its errors
                docs.append((loader.construct_document(node), False))
            if len(docs) > MAX_DOCUMENTS:
                raise SpecLimitError(f"more than {MAX_DOCUMENTS} documents in one file", file="")
    finally:
        loader.dispose()
    return docs


class _NotPlainError(Exception):
    """The document needs PyYAML's constructor (an alias, a merge key, another tag, a duplicate key...)."""


_STR, _INT, _NULL, _BOOL, _FLOAT, _MAP, _SEQ = (f"tag:yaml.org,2002:{t}" for t in
                                                ("str", "int", "null", "bool", "float", "map", "seq"))
_BOOLS: dict[str, bool] = yaml.constructor.SafeConstructor.bool_values


def _plain(node: yaml.Node, depth: int, seen: set[int]) -> Any:
    """The value of a document made of mappings with unique string keys, sequences, strings, ints,
    floats, booleans and nulls (what a spec is); raises _NotPlainError for anything else. `seen`: the nodes
    built so far, so a node met twice (an alias) goes to PyYAML, which shares its value as it should.
    What it builds is within MAX_DEPTH and MAX_NODES (no alias expands it), as `_check_nodes` counts."""
    if depth > MAX_DEPTH or id(node) in seen or len(seen) >= MAX_NODES:
        raise _NotPlainError
    seen.add(id(node))
    tag = node.tag
    if type(node) is yaml.ScalarNode:
        value: str = node.value
        if tag == _STR:
            return value
        if tag == _INT:
            return _int(value)
        if tag == _NULL:
            return None
        if tag == _BOOL and value.lower() in _BOOLS:
            return _BOOLS[value.lower()]
        if tag == _FLOAT:
            return _RESOLVER.construct_yaml_float(node)
        raise _NotPlainError
    if type(node) is yaml.MappingNode and tag == _MAP:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if type(key_node) is not yaml.ScalarNode or key_node.tag != _STR or id(key_node) in seen:
                raise _NotPlainError  # a merge key (<<), a non-string key, an alias as a key
            key = key_node.value
            if key in out:
                raise _NotPlainError  # a duplicate: PyYAML's constructor reports it, with its place
            seen.add(id(key_node))
            out[key] = _plain(value_node, depth + 1, seen)
        return out
    if type(node) is yaml.SequenceNode and tag == _SEQ:
        return [_plain(item, depth + 1, seen) for item in node.value]
    raise _NotPlainError


def _check_nodes(doc: Any) -> None:
    """Count nodes as pydantic would see them (aliases expanded), stopping at MAX_NODES, and their
    nesting, stopping at MAX_DEPTH (deeper documents blow the recursion limit of diff and render)."""
    budget = MAX_NODES
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise SpecLimitError(
                f"document expands to more than {MAX_NODES} nodes (YAML alias bomb?)", file=""
            )
        if depth > MAX_DEPTH:
            raise SpecLimitError(f"document is nested more than {MAX_DEPTH} levels deep", file="")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _doc_name(doc: Any) -> str | None:
    """The document's metadata.name when it is a valid app name (an invalid one names no app)."""
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and valid_name(name) else None


def _header_error(doc: Any) -> tuple[str, str] | None:
    """One clear error for a document that is not a FlinkApp at all, instead of dozens of field errors."""
    if not isinstance(doc, dict):
        return "", f"a FlinkApp document must be a mapping, got {type(doc).__name__}"
    if doc.get("apiVersion") != API_VERSION:
        got = "missing" if "apiVersion" not in doc else repr(doc.get("apiVersion"))
        return "apiVersion", f"apiVersion must be {API_VERSION!r} (got {got})"
    if doc.get("kind") not in (KIND, SESSION_KIND):
        got = "missing" if "kind" not in doc else repr(doc.get("kind"))
        return "kind", f"kind must be {KIND!r} or {SESSION_KIND!r} (got {got})"
    return None


def _spec_errors(
    err: ValidationError, path: str, doc_index: int, doc: Any, locator: _Locator, *,
    model: type[BaseModel] = FlinkApp,
) -> list[SpecError]:
    app = _doc_name(doc)
    out = []
    for e in err.errors():
        loc = tuple(e["loc"])
        msg = _message(e, loc, model)
        line, col = locator.find(doc_index, loc)
        out.append(SpecError(msg, file=path, line=line, column=col, field=_dotted(loc) or None, app=app))
    return out


def _message(e: Any, loc: tuple[Any, ...], model: type[BaseModel] = FlinkApp) -> str:
    kind = e["type"]
    if kind == "extra_forbidden":
        hint = _did_you_mean(loc, model)
        return f"unknown field {loc[-1]!r}" + (f" (did you mean {hint!r}?)" if hint else "")
    if kind == "missing":
        return f"required field {loc[-1]!r} is missing"
    msg = str(e["msg"])
    return msg.removeprefix("Value error, ")


def _did_you_mean(loc: tuple[Any, ...], root: type[BaseModel] = FlinkApp) -> str | None:
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if model is None or isinstance(part, int):
            continue
        model = _child_model(model, str(part))
    if model is None:
        return None
    names = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    if not close:
        lowered = {n.lower(): n for n in names}
        return lowered.get(str(loc[-1]).lower().replace("_", "").replace("-", ""))
    return close[0]


def _child_model(model: type[BaseModel], alias: str) -> type[BaseModel] | None:
    for name, f in model.model_fields.items():
        if alias in (name, f.alias):
            return _model_in(f.annotation)
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found:
            return found
    return None


def _dotted(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


class _Locator:
    """Finds line:column of a field path with ruamel's round-trip parser (slow; errors only)."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._docs: list[Any] | None = None

    def _load(self) -> list[Any]:
        if self._docs is None:
            try:
                self._docs = list(YAML(typ="rt").load_all(self._text))
            except (MarkedYAMLError, RecursionError, ValueError):  # no location then, still the error
                self._docs = []
        return self._docs

    def find(self, doc_index: int, loc: tuple[Any, ...]) -> tuple[int | None, int | None]:
        docs = self._load()
        if doc_index >= len(docs):
            return None, None
        node = docs[doc_index]
        line, col = _start(node)
        for part in loc:
            if isinstance(node, CommentedMap) and part in node:
                line, col = node.lc.key(part)
                line, col = line + 1, col + 1
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
                line, col = node.lc.item(part)
                line, col = line + 1, col + 1
                node = node[part]
            else:
                break  # a missing field: point at its parent
        return line, col


def _start(node: Any) -> tuple[int | None, int | None]:
    lc = getattr(node, "lc", None)
    if lc is None or lc.line is None:
        return None, None
    return lc.line + 1, lc.col + 1
