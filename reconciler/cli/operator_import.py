"""`flink-reconciler import`: the file side of the operator -> FlinkApp / FlinkSessionCluster mapping.

Reads YAML (a file, a directory of *.yaml/*.yml, or stdin), hands the documents to the pure mapping in
`reconciler.operator_migration.documents`, checks each result as `validate --runtime kubernetes` would (a session app on
the session cluster imported with it), and writes spec files whose comments say where each value came from.
Exit 0: every document became an app that runs the same; 1: something was not imported, would run differently,
or does not validate (all listed).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from reconciler.errors import ConfigError, SpecError, SpecLimitError
from reconciler.operator_migration.application import Finding, Imported
from reconciler.operator_migration.documents import import_groups
from reconciler.spec.model import KIND, FlinkApp
from reconciler.spec.session import SESSION_KIND, FlinkSessionCluster, capacity_problem, effective_app, fit_replicas

MAX_BYTES = 10 * 1024 * 1024
MAX_NODES = 100_000  # after alias expansion: stops a "billion laughs" document
MAX_DEPTH = 64

# The order a person reads a FlinkApp in (the model's field order).
_ORDER = ["apiVersion", "kind", "metadata", "spec", "name", "namespace", "labels", "annotations", "flinkVersion",
          "image", "runtime", "sessionCluster", "jobManager", "taskManager", "flinkConfiguration", "podTemplate",
          "highAvailability", "capacity", "addTaskManagers", "maxTaskManagers", "job", "jarURI", "entryClass", "args",
          "parallelism", "upgradeMode", "state", "allowNonRestoredState", "initialSavepointPath", "restartNonce",
          "savepointRedeployNonce", "maxCheckpointAge", "resources", "replicas", "slots", "cpu", "memory", "enabled",
          "storageDir", "savepoints", "deadlines"]


@dataclass(frozen=True)
class Source:
    name: str  # file name as given ("-" for stdin)
    text: str


def read_sources(target: str, stdin: TextIO) -> list[Source]:
    if target == "-":
        return [Source("-", stdin.read(MAX_BYTES + 1))]
    path = Path(target)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml"))
        if not files:
            raise ConfigError(f"{target}: no *.yaml or *.yml files in this directory")
    elif path.is_file():
        files = [path]
    else:
        raise ConfigError(f"{target}: no such file or directory")
    out = []
    for f in files:
        try:
            out.append(Source(str(f), f.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{f}: cannot read: {e}") from None
    return out


def parse(source: Source) -> list[Any]:
    """All documents of one source, aliases resolved; a clear SpecError (file:line) for anything else."""
    if len(source.text) > MAX_BYTES:
        raise SpecLimitError(f"larger than {MAX_BYTES // (1024 * 1024)} MiB", file=source.name)
    try:
        docs = list(YAML(typ="safe", pure=True).load_all(source.text))
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise SpecError(f"not valid YAML: {e.problem or e.context}", file=source.name,
                        line=mark.line + 1 if mark else None, column=mark.column + 1 if mark else None) from None
    except (YAMLError, ValueError, RecursionError) as e:
        raise SpecError(f"not valid YAML: {e}", file=source.name) from None
    for i, doc in enumerate(docs):
        _check_size(doc, source.name, i)
    return docs


def _check_size(doc: Any, file: str, index: int) -> None:
    """Walk the document as the mapping will (aliases expanded): bounded in nodes and depth, and acyclic."""
    count = 0
    stack: list[tuple[Any, int, frozenset[int]]] = [(doc, 0, frozenset())]
    while stack:
        node, depth, path = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise SpecLimitError(f"document {index + 1} expands to more than {MAX_NODES} nodes (a YAML alias "
                                 "bomb?)", file=file)
        if depth > MAX_DEPTH:
            raise SpecLimitError(f"document {index + 1} is nested more than {MAX_DEPTH} levels deep", file=file)
        if isinstance(node, dict | list):
            if id(node) in path:
                raise SpecError(f"document {index + 1} contains itself (a recursive YAML alias)", file=file)
            inner = path | {id(node)}
            children = node.values() if isinstance(node, dict) else node
            stack += [(c, depth + 1, inner) for c in children]


@dataclass(frozen=True)
class Outcome:
    source: str
    imported: Imported
    path: Path | None = None  # where the FlinkApp was written

    @property
    def failed(self) -> bool:
        return self.imported.changes_behaviour


def check(imp: Imported) -> Imported:
    """The pure result plus what `validate --runtime kubernetes` says of it, as findings. A session app is checked
    on its session cluster by `check_sessions`."""
    if imp.app is None:
        return imp
    from reconciler.live.kubernetes.render import kubernetes_problems

    model: type[FlinkApp] | type[FlinkSessionCluster] = FlinkSessionCluster if imp.out_kind == SESSION_KIND \
        else FlinkApp
    try:
        app = model.model_validate(imp.app)
    except ValidationError as e:
        found = [Finding(".".join(str(x) for x in err["loc"]) or "(document)",
                         f"the imported {imp.out_kind} is invalid: {err['msg']}", True) for err in e.errors()]
        return replace(imp, app=None, findings=(*imp.findings, *found))
    if not isinstance(app, FlinkApp) or app.spec.session_cluster is not None:
        return imp
    problems = [Finding(p.field, f"not runnable on Kubernetes as imported: {p.message}", True)
                for p in kubernetes_problems(app)]
    return replace(imp, findings=(*imp.findings, *problems))


def check_sessions(imps: list[Imported]) -> list[Imported]:
    """Each session app as `validate --runtime kubernetes` sees it: its job on the session cluster imported with
    it (its effective app), and every running job on that cluster within its task slots. An app whose cluster is
    not imported with it is left as it is (the mapping says so)."""
    from reconciler.live.kubernetes.render import kubernetes_problems

    clusters = {(c.metadata.namespace, c.name): c for c in
                (FlinkSessionCluster.model_validate(i.app) for i in imps
                 if i.app is not None and i.out_kind == SESSION_KIND)}
    apps = {n: FlinkApp.model_validate(i.app) for n, i in enumerate(imps) if i.app is not None and i.out_kind == KIND}
    members: dict[tuple[str, str], list[FlinkApp]] = {}
    for app in apps.values():
        if app.spec.session_cluster is not None:
            members.setdefault((app.metadata.namespace, app.spec.session_cluster), []).append(app)
    out = []
    for n, imp in enumerate(imps):
        member = apps.get(n)
        key = (member.metadata.namespace, member.spec.session_cluster or "") if member is not None else None
        if member is None or key not in clusters:
            out.append(imp)
            continue
        cluster = clusters[key]
        on = members[key]
        problems = [Finding(p.field, f"not runnable on Kubernetes as imported: {p.message}", True)
                    for p in kubernetes_problems(effective_app(member, cluster, fit_replicas(cluster, on)))]
        capacity = capacity_problem(cluster, on)
        if capacity is not None:
            problems.append(Finding("spec.job.parallelism", capacity, True))
        out.append(replace(imp, findings=(*imp.findings, *problems)))
    return out


def to_yaml(imp: Imported, source: str) -> str:
    """The FlinkApp as YAML: a header naming the source and every finding, a comment on each mapped value."""
    assert imp.app is not None
    doc = _commented(imp.app, (), imp)
    ns = imp.app["metadata"].get("namespace", "default")
    lines = [f"Imported by `flink-reconciler import` from {imp.kind} {ns}/{imp.name} ({source}).",
             f"Comments name the {imp.kind} field each value came from."]
    if imp.findings:
        lines.append("Not imported as it was (! = would not run the same; fix before applying):")
        lines += [f"  {'!' if f.changes_behaviour else '-'} {f.field}: {f.message}" for f in imp.findings]
    doc.yaml_set_start_comment("\n".join(lines))
    y = YAML()
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)
    buf = io.StringIO()
    y.dump(doc, buf)
    return buf.getvalue()


def _commented(value: Any, path: tuple[str, ...], imp: Imported) -> Any:
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (_ORDER.index(k) if k in _ORDER else len(_ORDER), k)) \
            if path[-1:] != ("flinkConfiguration",) and "podTemplate" not in path else list(value)
        cm = CommentedMap()
        for k in keys:
            cm[k] = _commented(value[k], (*path, k), imp)
            origin = imp.origins.get((*path, k))
            if origin:
                cm.yaml_add_eol_comment(f"from {origin}", k)
        return cm
    if isinstance(value, list):
        return CommentedSeq(_commented(x, path, imp) for x in value)
    return value


def run(target: str, out: Path | None, *, force: bool, output: str, stdin: TextIO, stdout: TextIO,
        stderr: TextIO, namespace: str | None = None) -> int:
    if out is not None:
        _out_dir(out)  # before anything is read: a wrong --out writes nothing
    errors: list[SpecError] = []
    parsed: list[tuple[str, list[Any]]] = []
    for src in read_sources(target, stdin):
        try:
            parsed.append((src.name, parse(src)))
        except SpecError as e:
            errors.append(e)
    groups = import_groups((docs for _, docs in parsed), namespace=namespace)
    names = [name for (name, _), group in zip(parsed, groups, strict=True) for _ in group]
    checked = check_sessions([check(imp) for group in groups for imp in group])
    outcomes = [Outcome(name, imp) for name, imp in zip(names, checked, strict=True)]
    written = _write(outcomes, out, force=force, stdout=stdout)
    report = stdout if out is not None else stderr
    if output == "json":
        print(json.dumps(_json(written, errors), indent=2), file=report)
    else:
        _text(written, errors, report)
    return 1 if errors or any(o.failed for o in written) else 0


def _out_dir(out: Path) -> None:
    """--out is a directory (made when missing); anything else is the caller's mistake, said as such."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory (--out names the directory the spec files "
                          "are written to, one per app)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create the directory: {e.strerror or e}") from e


def _write(outcomes: list[Outcome], out: Path | None, *, force: bool, stdout: TextIO) -> list[Outcome]:
    done: list[Outcome] = []
    names: dict[str, str] = {}
    for o in outcomes:
        imp = o.imported
        if imp.app is None:
            done.append(o)
            continue
        name = imp.app["metadata"]["name"]
        if name in names:
            dup = Finding("metadata.name", f"app {name!r} was imported already from {names[name]}: app names are "
                          "unique in a repository; rename one", True)
            done.append(replace(o, imported=replace(imp, app=None, findings=(*imp.findings, dup))))
            continue
        names[name] = o.source
        text = to_yaml(imp, o.source)
        if out is None:
            stdout.write("---\n" + text)
            done.append(o)
            continue
        path = out / f"{name}.yaml"
        if path.exists() and not force:
            exists = Finding("metadata.name", f"{path} exists: not overwritten (--force overwrites)", True)
            done.append(replace(o, imported=replace(imp, findings=(*imp.findings, exists))))
            continue
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as e:
            failed = Finding("metadata.name", f"{path}: cannot be written: {e.strerror or e}", True)
            done.append(replace(o, imported=replace(imp, findings=(*imp.findings, failed))))
            continue
        done.append(replace(o, path=path))
    return done


def _label(o: Outcome) -> str:
    imp = o.imported
    return f"{o.source}: {imp.kind} {imp.name or '(no name)'}"


def _text(outcomes: list[Outcome], errors: list[SpecError], out: TextIO) -> None:
    for e in errors:
        print(f"error: {e}", file=out)
    for o in outcomes:
        imp = o.imported
        if imp.app is None:
            verdict = "NOT IMPORTED"
        elif o.failed:
            verdict = "IMPORTED, RUNS DIFFERENTLY"
        else:
            verdict = "imported, runs the same"
        where = f" -> {o.path}" if o.path else ""
        print(f"{_label(o)}: {verdict}{where}", file=out)
        for f in imp.findings:
            print(f"  {'!' if f.changes_behaviour else '-'} {f.field}: {f.message}", file=out)
    same = sum(1 for o in outcomes if not o.failed)
    print(f"{same} of {len(outcomes)} document(s) imported to run the same"
          + (f"; {len(errors)} file(s) unreadable" if errors else ""), file=out)


def _json(outcomes: list[Outcome], errors: list[SpecError]) -> dict[str, Any]:
    def doc(o: Outcome) -> Iterator[tuple[str, Any]]:
        imp = o.imported
        yield "source", o.source
        yield "kind", imp.kind
        yield "name", imp.name
        yield "imported", imp.app is not None
        yield "runsTheSame", not o.failed
        yield "written", str(o.path) if o.path else None
        yield "findings", [{"field": f.field, "message": f.message, "changesBehaviour": f.changes_behaviour}
                           for f in imp.findings]

    return {"ok": not errors and not any(o.failed for o in outcomes),
            "errors": [str(e) for e in errors], "documents": [dict(doc(o)) for o in outcomes]}
