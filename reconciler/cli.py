"""The command line: a thin shell over the core. Exit codes follow `terraform plan -detailed-exitcode`."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler import __version__
from reconciler.clock import SystemClock
from reconciler.core import render
from reconciler.core.plan import Plan
from reconciler.core.planner import Policy, offline_input, plan
from reconciler.errors import ReconcilerError, SourceError
from reconciler.spec.load import LoadResult, load_dir

if TYPE_CHECKING:
    from reconciler.source.git import GitSource

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_ERROR
    try:
        code: int = args.func(args)
        return code
    except ReconcilerError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flink-reconciler", description="GitOps reconciler for Apache Flink apps.")
    p.add_argument("--version", action="version", version=f"flink-reconciler {__version__}")
    sub = p.add_subparsers(metavar="COMMAND")

    v = sub.add_parser("validate", help="check spec files (file:line errors); exit 1 on any error")
    v.add_argument("paths", nargs="*", default=["."], help="spec files or directories (default: .)")
    v.add_argument("--output", choices=["text", "json"], default="text")
    v.set_defaults(func=cmd_validate)

    pl = sub.add_parser("plan", help="what applying a revision would do, like terraform plan")
    pl.add_argument("--repo", required=True, help="Git repository: a path or URL")
    pl.add_argument("--base", help="the revision assumed to run (offline mode); default: HEAD~1 of --head")
    pl.add_argument("--head", default="HEAD", help="the revision to plan (default: HEAD)")
    pl.add_argument("--path", default="", help="sub-directory of the repo holding the specs")
    pl.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    pl.add_argument("--out", type=Path, help="also write the plan as JSON to this file (for apply --plan)")
    pl.add_argument("--detailed-exitcode", action="store_true", help="exit 2 when there are changes")
    pl.add_argument("--prune", action="store_true", default=_env_bool("PRUNE"),
                    help="plan deletions of removed specs (as the daemon would with prune on)")
    pl.add_argument("--allow-mass-delete", action="store_true", help="disable the mass-deletion guard")
    pl.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    pl.add_argument("--cache-dir", type=Path, help="where Git clones are cached")
    pl.set_defaults(func=cmd_plan)

    s = sub.add_parser("schema", help="print the JSON Schema of a FlinkApp spec")
    s.add_argument("--out", type=Path, help="write to this file instead of stdout")
    s.set_defaults(func=cmd_schema)
    return p


def _env_bool(name: str) -> bool:
    return os.environ.get(f"FLINK_RECONCILER_{name}", "").lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------------------------------- validate


def cmd_validate(args: argparse.Namespace) -> int:
    total_apps = total_files = 0
    problems: list[dict[str, object]] = []
    for raw in args.paths:
        root = Path(raw)
        if not root.exists():
            print(f"error: {raw}: no such file or directory", file=sys.stderr)
            return EXIT_ERROR
        result = load_dir(root.parent, root.name) if root.is_file() else load_dir(root)
        prefix = root.parent if root.is_file() else root
        total_apps += len(result.apps)
        total_files += len(result.files)
        for e in result.errors:
            problems.append({"file": str(prefix / e.file), "line": e.line, "column": e.column,
                             "field": e.field, "app": e.app, "message": e.message,
                             "text": f"{prefix / e.location()}: {e.message}"})
    if args.output == "json":
        print(json.dumps({"ok": not problems, "apps": total_apps, "files": total_files, "errors": problems},
                         indent=2))
    else:
        for prob in problems:
            print(prob["text"], file=sys.stderr)
        word = "error" if len(problems) == 1 else "errors"
        status = f"{len(problems)} {word}" if problems else "ok"
        print(f"{status}: {total_apps} valid app(s) in {total_files} file(s)")
    return EXIT_ERROR if problems else EXIT_OK


# ---------------------------------------------------------------------------------------------- plan


def _cache_dir(args: argparse.Namespace, repo: str) -> Path:
    if args.cache_dir:
        return Path(args.cache_dir)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flink-reconciler" / "git"
    return base / hashlib.sha256(repo.encode()).hexdigest()[:16]


def cmd_plan(args: argparse.Namespace) -> int:
    from reconciler.source.git import GitSource
    from reconciler.source.specs import load_at

    src = GitSource(args.repo, _cache_dir(args, args.repo), branch=_branch_of(args.repo))
    src.fetch()
    head = src.resolve(args.head)
    base = src.resolve(args.base) if args.base else _parent_or_none(src, head)
    head_specs = load_at(src, head, args.path)
    base_specs = load_at(src, base, args.path) if base else LoadResult()
    policy = Policy(prune=args.prune, allow_mass_delete=args.allow_mass_delete)
    result = plan(offline_input(base_specs, head_specs, base_revision=base or "0" * 40, revision=head,
                                now=SystemClock().now(), policy=policy))
    return _emit_plan(result, args)


def _branch_of(repo: str) -> str:
    return os.environ.get("FLINK_RECONCILER_BRANCH", "main")


def _parent_or_none(src: GitSource, head: str) -> str | None:
    try:
        return src.resolve(head + "~1")
    except SourceError:
        return None


def _emit_plan(result: Plan, args: argparse.Namespace) -> int:
    if args.format == "json":
        sys.stdout.write(render.to_json(result))
    elif args.format == "markdown":
        sys.stdout.write(render.to_markdown(result))
    else:
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty()
                                           and "NO_COLOR" not in os.environ)
        sys.stdout.write(render.to_text(result, color=color))
    if args.out:
        args.out.write_text(result.to_json())
    if result.has_errors:
        return EXIT_ERROR
    return EXIT_CHANGES if args.detailed_exitcode and result.has_changes else EXIT_OK


# ---------------------------------------------------------------------------------------------- schema


def schema_json() -> str:
    from reconciler.spec.schema import flinkapp_schema

    return json.dumps(flinkapp_schema(), indent=2, sort_keys=False) + "\n"


def cmd_schema(args: argparse.Namespace) -> int:
    text = schema_json()
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
