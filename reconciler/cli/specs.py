"""The commands over spec files that need no runtime: validate, render, schema, import."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reconciler.cli.common import (
    CACHE_HELP,
    EXIT_ERROR,
    EXIT_OK,
    PATH_HELP,
    Subparsers,
    env_branch,
    env_spec_policy,
    git_cache_dir,
    repo_arg,
)
from reconciler.errors import ConfigError, ReconcilerError, SpecError
from reconciler.spec.load import LoadResult, load_dir
from reconciler.spec.model import NAME_RE


def add_validate(sub: Subparsers) -> None:
    v = sub.add_parser("validate", help="check spec files (file:line errors); exit 1 on any error")
    v.add_argument("paths", nargs="*", default=["."], help="spec files or directories (default: .)")
    v.add_argument("--output", choices=["text", "json"], default="text", help="output format (default: %(default)s)")
    v.add_argument("--runtime", choices=["local", "kubernetes"], default=None,
                   help="also check what this runtime needs (kubernetes: durable state, HA, renderable) "
                        "(default: the configured runtime, FLINK_RECONCILER_RUNTIME, else local)")
    v.set_defaults(func=cmd_validate)


def add_render(sub: Subparsers) -> None:
    rd = sub.add_parser("render", help="print the Kubernetes manifests each app would get",
                        description="Print the Kubernetes objects of each app, from spec files (PATH) or from "
                                    "a Git revision (--repo).",
                        epilog="Example: flink-reconciler render apps/ | kubectl apply --dry-run=server -f -")
    rd.add_argument("spec_path", nargs="?", metavar="PATH",
                    help="a spec file, a directory of specs, or - for stdin (default: none, then --repo is required)")
    rd.add_argument("--repo", help="render a revision of this Git repository (path or URL) instead of PATH "
                                   "(default: none)")
    rd.add_argument("--rev", default=None, help="with --repo: the revision to render (default: HEAD)")
    rd.add_argument("--path", default="", help="with --repo: " + PATH_HELP)
    rd.add_argument("--app", action="append", help="only this app, repeatable (default: every app)")
    rd.add_argument("--cache-dir", type=Path, help="with --repo: " + CACHE_HELP)
    rd.set_defaults(func=cmd_render)


def add_schema(sub: Subparsers) -> None:
    s = sub.add_parser("schema", help="print the JSON Schema of a FlinkApp or FlinkSessionCluster")
    s.add_argument("--out", type=Path, help="write to this file (default: stdout)")
    s.add_argument("--kind", choices=("FlinkApp", "FlinkSessionCluster"), default="FlinkApp",
                   help="which kind's schema (default: FlinkApp)")
    s.add_argument("--reference", action="store_true",
                   help="the Markdown field reference instead (default: the JSON Schema)")
    s.set_defaults(func=cmd_schema)


def add_import(sub: Subparsers) -> None:
    im = sub.add_parser("import", help="convert Flink Kubernetes Operator resources into FlinkApp specs",
                        description="Convert flink.apache.org/v1beta1 FlinkDeployment and FlinkSessionJob "
                                    "documents (as `kubectl get ... -o yaml` prints them) into FlinkApp specs "
                                    "(a session-mode FlinkDeployment into a FlinkSessionCluster), "
                                    "each value commented with the field it came from. Exit 0 when every "
                                    "document runs the same under flink-reconciler, 1 when anything was not "
                                    "imported or would run differently (each listed with the reason). See "
                                    "docs/migrate-from-flink-operator.md.")
    im.add_argument("source", help="a YAML file, a directory of *.yaml/*.yml files, or - for stdin")
    im.add_argument("--out", type=Path, help="write one <name>.yaml per app into this directory and the report to "
                                             "stdout (default: the specs to stdout, the report to stderr)")
    im.add_argument("--force", action="store_true", help="overwrite existing files in --out (default: refuse)")
    im.add_argument("--namespace", type=_namespace,
                    help="the namespace of documents that name none: where they run (default: none; such documents "
                         "are written with namespace default and flagged)")
    im.add_argument("--output", choices=["text", "json"], default="text",
                    help="report format (default: %(default)s)")
    im.set_defaults(func=cmd_import)


# ---------------------------------------------------------------------------------------------- validate


def cmd_validate(args: argparse.Namespace) -> int:
    total_apps = total_files = total_clusters = 0
    problems: list[dict[str, object]] = []
    for raw in args.paths:
        root = Path(raw)
        if not root.exists():
            print(f"error: {raw}: no such file or directory", file=sys.stderr)
            return EXIT_ERROR
        policy = env_spec_policy()
        result = load_dir(root.parent, root.name, policy=policy) if root.is_file() else load_dir(root, policy=policy)
        prefix = root.parent if root.is_file() else root
        runtime_errors = _runtime_errors(result, args.runtime)
        total_apps += len(result.apps) - len({e.app for e in runtime_errors})
        total_files += len(result.files)
        total_clusters += len(result.clusters)
        for e in (*result.errors, *runtime_errors):
            problems.append({"file": str(prefix / e.file), "line": e.line, "column": e.column,
                             "field": e.field, "app": e.app, "message": e.message,
                             "text": f"{prefix / e.location()}: {e.message}"})
    if args.output == "json":
        print(json.dumps({"ok": not problems, "apps": total_apps, "sessionClusters": total_clusters,
                          "files": total_files, "errors": problems}, indent=2))
    else:
        for prob in problems:
            print(prob["text"], file=sys.stderr)
        word = "error" if len(problems) == 1 else "errors"
        status = f"{len(problems)} {word}" if problems else "ok"
        clusters = f" and {total_clusters} session cluster(s)" if total_clusters else ""
        print(f"{status}: {total_apps} valid app(s){clusters} in {total_files} file(s)")
    return EXIT_ERROR if problems else EXIT_OK


def _runtime_errors(result: LoadResult, runtime: str | None) -> list[SpecError]:
    """What the runtime would refuse of the loaded apps; an app's spec.runtime.type overrides `runtime`."""
    from reconciler.live.kubernetes.render import kubernetes_problems
    from reconciler.live.kubernetes.storage import runs_on_kubernetes
    from reconciler.settings import load_settings

    default = runtime or load_settings({}).runtime
    return [SpecError(p.message, file=la.file, line=la.line, field=p.field, app=la.app.name)
            for la in result.apps.values() if runs_on_kubernetes(la.app, default)
            for p in kubernetes_problems(la.app)]


# ---------------------------------------------------------------------------------------------- render


UNVERSIONED = "unversioned"  # the revision stamped on objects rendered from files rather than a commit


def cmd_render(args: argparse.Namespace) -> int:
    from reconciler.core.plan import deterministic_job_id
    from reconciler.live.kubernetes.render import render_app, session_cluster_app, to_yaml

    if args.spec_path is not None:
        if args.repo or args.rev or args.path or args.cache_dir:
            raise ConfigError("render: give PATH or --repo (with --rev, --path, --cache-dir), not both")
        loaded, rev = _specs_from(args.spec_path), UNVERSIONED
    elif args.repo:
        loaded, rev = _specs_at(args)
    else:
        raise ConfigError("render needs PATH (a spec file, a directory of specs, or - for stdin) or --repo")
    for e in loaded.errors:
        print(f"{e}", file=sys.stderr)
    failed = bool(loaded.errors)
    unknown = sorted(set(args.app or ()) - set(loaded.apps) - set(loaded.clusters) - {e.app for e in loaded.errors})
    for name in unknown:
        print(f"error: no app or session cluster named {name!r}", file=sys.stderr)
        failed = True
    docs = []
    at = "" if rev == UNVERSIONED else f" at {rev[:12]}"
    # Session clusters first (their apps' jobs run on them, submitted over REST: no objects of their own).
    for name, lc in sorted(loaded.clusters.items()):
        if args.app and name not in args.app:
            continue
        try:
            objs = render_app(session_cluster_app(lc.cluster), revision=rev, job_id=None, restore_path=None)
        except ReconcilerError as e:
            print(f"error: {lc.file}: {e}", file=sys.stderr)
            failed = True
            continue
        docs.append(f"# session cluster {name} ({lc.file}){at}\n" + to_yaml(objs))
    for name, la in sorted(loaded.apps.items()):
        if args.app and name not in args.app:
            continue
        if la.app.spec.session_cluster is not None:
            docs.append(f"# app {name} ({la.file}){at}: its job runs on session cluster {la.app.spec.session_cluster}, "
                        "submitted through its JobManager's REST API (no objects of its own)\n")
            continue
        job_id = deterministic_job_id(name, rev, 1)
        try:
            objs = render_app(la.app, revision=rev, job_id=job_id, restore_path=None)
        except ReconcilerError as e:  # one app that cannot run on Kubernetes does not hide the others
            print(f"error: {la.file}: {e}", file=sys.stderr)
            failed = True
            continue
        docs.append(f"# app {name} ({la.file}){at}\n" + to_yaml(objs))
    sys.stdout.write("---\n".join(docs))
    return EXIT_ERROR if failed else EXIT_OK


def _specs_from(raw: str) -> LoadResult:
    """Specs from a file, a directory tree or stdin (`-`), each file named as the user will look for it."""
    from reconciler.spec.load import load_files, read_dir

    if raw == "-":
        return load_files({"<stdin>": sys.stdin.buffer.read()})
    root = Path(raw)
    if not root.exists():
        raise ConfigError(f"{raw}: no such file or directory")
    if root.is_file():
        return load_files({raw: root.read_bytes()})
    files = read_dir(root)
    if not files:
        raise ConfigError(f"{raw}: no spec files (*.yaml, *.yml) in this directory")
    return load_files({str(root / rel): data for rel, data in files.items()})


def _specs_at(args: argparse.Namespace) -> tuple[LoadResult, str]:
    from reconciler.source.git import GitSource
    from reconciler.source.specs import load_at

    repo = repo_arg(args.repo) or args.repo
    src = GitSource(repo, git_cache_dir(args, repo), branch=env_branch())
    src.fetch()
    rev = src.resolve(args.rev or "HEAD")
    return load_at(src, rev, args.path), rev


# ---------------------------------------------------------------------------------------------- schema


def schema_json(kind: str = "FlinkApp") -> str:
    from reconciler.spec.schema import schema_of

    return json.dumps(schema_of(kind), indent=2, sort_keys=False) + "\n"


def cmd_import(args: argparse.Namespace) -> int:
    from reconciler.cli import operator_import

    return operator_import.run(args.source, args.out, force=args.force, output=args.output, stdin=sys.stdin,
                               stdout=sys.stdout, stderr=sys.stderr, namespace=args.namespace)


def _namespace(text: str) -> str:
    if not NAME_RE.fullmatch(text) or len(text) > 63:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Kubernetes namespace name (a DNS-1123 label)")
    return text


def cmd_schema(args: argparse.Namespace) -> int:
    from reconciler.spec.reference import markdown

    text = markdown() if args.reference else schema_json(args.kind)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return EXIT_OK

