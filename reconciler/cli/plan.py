"""`plan` (offline, or against the live state) and `apply`: one pass of the pipeline, stopped after the plan or
run to its end."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.cli.common import (
    CACHE_HELP,
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_OK,
    PATH_HELP,
    REPO_HELP,
    SETTINGS_EPILOG,
    Subparsers,
    env_bool,
    env_branch,
    env_spec_policy,
    git_cache_dir,
    reconciler_for,
    runtime_flags,
    settings_of,
)
from reconciler.cli.console import show_plan
from reconciler.cli.status import print_status
from reconciler.clock import SystemClock
from reconciler.core import render
from reconciler.core.observed import ClusterPhase
from reconciler.core.plan import Action, Plan
from reconciler.core.planner import Policy, offline_input
from reconciler.errors import SourceError
from reconciler.logs import redact
from reconciler.spec.load import LoadResult
from reconciler.spec.policy import SpecPolicy

if TYPE_CHECKING:
    from reconciler.source.git import GitSource


def add_plan(sub: Subparsers) -> None:
    pl = sub.add_parser("plan", help="what applying a revision would do, like terraform plan", epilog=SETTINGS_EPILOG)
    pl.add_argument("--repo", required=True, help="Git repository: a path or URL")
    pl.add_argument("--base", help="the revision assumed to run (offline mode) (default: the parent of --head)")
    pl.add_argument("--head", default="HEAD", help="the revision to plan (default: %(default)s)")
    pl.add_argument("--path", default="", help=PATH_HELP)
    pl.add_argument("--format", choices=["text", "markdown", "json"], default="text",
                    help="text for a terminal, markdown for a pull-request comment, json: the plan artifact "
                         "(default: %(default)s)")
    pl.add_argument("--out", type=Path, help="also write the plan as JSON to this file, for apply --plan "
                                             "(default: not written)")
    pl.add_argument("--detailed-exitcode", action="store_true",
                    help="exit 2 when there are changes (default: exit 0 for changes)")
    pl.add_argument("--prune", action="store_true", default=env_bool("PRUNE"),
                    help="plan deletions of removed specs, as the daemon would with prune on "
                         "(default: off, or FLINK_RECONCILER_PRUNE)")
    pl.add_argument("--allow-mass-delete", action="store_true",
                    help="disable the mass-deletion guard (default: the guard is on)")
    pl.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                    help="colour the text output; auto: on a terminal without NO_COLOR (default: %(default)s)")
    pl.add_argument("--cache-dir", type=Path, help=CACHE_HELP)
    pl.set_defaults(func=cmd_plan)

    pl.add_argument("--live", action="store_true",
                    help="plan against the live state (runtime + records) instead of --base; needs the runtime "
                         "(default: offline)")
    runtime_flags(pl, repo=False)


def add_apply(sub: Subparsers) -> None:
    ap = sub.add_parser("apply", help="plan a revision against the live state and execute it",
                        epilog=SETTINGS_EPILOG)
    ap.add_argument("--repo", help=REPO_HELP)
    ap.add_argument("--rev", default=None, help="revision to apply (default: the branch tip)")
    ap.add_argument("--plan", type=Path, help="execute exactly this saved plan from `plan --live --out` "
                                              "(default: plan --rev now)")
    ap.add_argument("--prune", action="store_true", default=None,
                    help="delete apps whose spec was removed, after a final savepoint (default: off)")
    ap.add_argument("--path", default=None, help=PATH_HELP)
    ap.add_argument("--allow-mass-delete", action="store_true",
                    help="disable the mass-deletion guard (default: the guard is on)")
    runtime_flags(ap)
    ap.set_defaults(func=cmd_apply)


# ---------------------------------------------------------------------------------------------- plan


def cmd_plan(args: argparse.Namespace) -> int:
    from reconciler.source.git import GitSource
    from reconciler.source.specs import load_at

    if args.live:
        rec = reconciler_for(settings_of(args), report=False)
        if args.allow_mass_delete:  # what `apply --allow-mass-delete` would do
            rec.policy = dataclasses.replace(rec.policy, allow_mass_delete=True)
        rec.source.fetch()
        return _emit_plan(rec.plan(rec.source.resolve(args.head)), args)

    src = GitSource(args.repo, git_cache_dir(args, args.repo), branch=env_branch())
    src.fetch()
    head = src.resolve(args.head)
    base = src.resolve(args.base) if args.base else _parent_or_none(src, head)
    head_specs = load_at(src, head, args.path, policy=env_spec_policy())
    base_specs = load_at(src, base, args.path, policy=SpecPolicy.PERMISSIVE) if base else LoadResult()
    # A preview plans warm standby when the configured runtime can run one (local and kubernetes can).
    from reconciler.settings import load_settings

    policy = Policy(prune=args.prune, allow_mass_delete=args.allow_mass_delete,
                    warm_standby=load_settings({}).runtime in ("local", "kubernetes"))
    from reconciler.core.session_planner import SessionLive, plan_with_sessions, sessions_from

    inp = offline_input(base_specs, head_specs, base_revision=base or "0" * 40, revision=head,
                        now=SystemClock().now(), policy=policy)
    # a preview assumes the base revision's session clusters run (with the jobs of their apps), as it does apps
    running = {c: SessionLive(phase=ClusterPhase.READY,
                              jobs=dict.fromkeys(base_specs.session_names.get(c, ()), "RUNNING"))
               for c in base_specs.clusters}
    result = plan_with_sessions(inp, sessions_from(head_specs, running))
    return _emit_plan(result, args)


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
        show_plan(render.to_text(result, color=color), color=color)
    if args.out:
        args.out.write_text(result.to_json())
    if result.has_errors:
        return EXIT_ERROR
    return EXIT_CHANGES if args.detailed_exitcode and result.has_changes else EXIT_OK


# ---------------------------------------------------------------------------------------------- apply


NAMED_AT_MOST = 20  # apps `apply` names that it planned and did not execute; `plan` lists them all


def _print_not_executed(plan: Plan, done: Mapping[str, object], *, dry_run: bool) -> None:
    """Name the apps the plan changes that were not executed (all of them in a dry run), as `plan` heads
    them, so "3 apps: 3 create" says which three."""
    planned = [a for a in render.sorted_apps(plan) if a.action is not Action.NOOP and a.app not in done]
    if not planned:
        return
    print("dry run, nothing executed:" if dry_run else "not executed:")
    for a in planned[:NAMED_AT_MOST]:
        print("  " + redact(render.app_lines(a)[0]))
    if len(planned) > NAMED_AT_MOST:
        print(f"  ... and {len(planned) - NAMED_AT_MOST} more (`flink-reconciler plan` lists them all)")


def cmd_apply(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    rec = reconciler_for(settings, progress=True)
    if args.allow_mass_delete:
        rec.policy = dataclasses.replace(rec.policy, allow_mass_delete=True)
    with rec.journal.lock_exclusive():
        if args.plan:
            saved = Plan.from_json(args.plan.read_text())
            rec.source.fetch()
            result = rec.apply(saved=saved)
        else:
            rec.source.fetch()
            rev = rec.source.resolve(args.rev) if args.rev else rec.source.head()
            result = rec.apply(rev)
    if rec.reporter:
        rec.reporter.close(timeout=30)
    print()
    sys.stdout.write(render.to_text(result.plan, color=False).split("\n", 2)[1] + "\n")
    done = {**result.resumed, **result.results}
    for name, res in sorted(done.items()):
        print(f"{name}: {res.action.value} -> {res.outcome.value}: {res.message}")
    _print_not_executed(result.plan, done, dry_run=settings.dry_run)
    print()
    print_status(rec)
    return EXIT_OK if result.ok else EXIT_ERROR

