"""`rollback` (to an app's spec at a commit, from the state it had there) and `savepoint` (one now)."""

from __future__ import annotations

import argparse
import os
import sys

from reconciler.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    PATH_HELP,
    REPO_HELP,
    SETTINGS_EPILOG,
    Subparsers,
    reconciler_for,
    repo_arg,
    runtime_flags,
    settings_of,
)
from reconciler.cli.console import show_plan
from reconciler.cli.progress import Progress
from reconciler.cli.status import print_status
from reconciler.core import render
from reconciler.errors import ConfigError


def add_rollback(sub: Subparsers) -> None:
    rb = sub.add_parser("rollback", help="go back to an app's spec at a commit, from the state it had there",
                        description="Plan (and with --apply run, or with --write-commit commit) running APP with "
                                    "its spec at REV, restored from the newest savepoint a job of REV's spec took "
                                    "(normally the one taken when REV was left). See docs/rollback.md.",
                        epilog=SETTINGS_EPILOG)
    rb.add_argument("app", help="the app's metadata.name")
    rb.add_argument("--to", required=True, metavar="REV", help="the commit to go back to (sha, tag, main~2, ...)")
    rb.add_argument("--repo", help=REPO_HELP)
    rb.add_argument("--path", default=None, help=PATH_HELP)
    rb.add_argument("--apply", action="store_true",
                    help="execute the plan now; the branch tip is unchanged, so the next apply or daemon pass "
                         "goes back to it (default: only show the plan)")
    rb.add_argument("--write-commit", action="store_true",
                    help="commit REV's spec with initialSavepointPath and a new savepointRedeployNonce on the "
                         "branch and push it: the daemon (or apply) does the rest (default: no commit)")
    rb.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                    help="colour the plan; auto: on a terminal without NO_COLOR (default: %(default)s)")
    runtime_flags(rb)
    rb.set_defaults(func=cmd_rollback)


def add_savepoint(sub: Subparsers) -> None:
    sv = sub.add_parser("savepoint", help="take a savepoint of an app's running job now (kept by retention)",
                        epilog=SETTINGS_EPILOG)
    sv.add_argument("app", help="the app's metadata.name")
    sv.add_argument("--repo", help="Git repository, for the commit status (default: FLINK_RECONCILER_REPO_URL)")
    sv.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                    help="how long to wait for Flink to complete it (default: %(default)s)")
    runtime_flags(sv)
    sv.set_defaults(func=cmd_savepoint)


def cmd_rollback(args: argparse.Namespace) -> int:
    from reconciler.core.rollback import Refusal
    from reconciler.service import rollback

    if args.apply and args.write_commit:
        raise ConfigError("rollback: give --apply or --write-commit, not both (a written commit is applied by "
                          "the daemon, or by `flink-reconciler apply`)")
    rec = reconciler_for(settings_of(args), report=args.apply, progress=args.apply)
    prepared = rollback.prepare(rec, args.app, args.to)
    if isinstance(prepared, Refusal):
        print(f"error: rollback of {args.app} to {args.to} refused: {prepared.reason}", file=sys.stderr)
        return EXIT_ERROR
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and "NO_COLOR" not in os.environ)
    show_plan(render.to_text(prepared.plan, color=color), color=color)
    if prepared.plan.apps[0].action.value == "blocked":
        return EXIT_ERROR
    if args.write_commit:
        checkout = rec.source.checkout_of_branch()
        sha = rollback.write_commit(rec, prepared)
        where = "and pushed" if checkout is None else f"in {checkout} (checked out there: work tree updated)"
        print(f"\ncommitted {sha[:12]} on {rec.source.branch} {where}: {args.app} at {prepared.revision[:12]}'s "
              f"spec with initialSavepointPath {prepared.point.savepoint.path}; the daemon (or `flink-reconciler "
              "apply`) redeploys it")
        return EXIT_OK
    if not args.apply:
        print("\nnothing done: --apply runs this plan now, --write-commit puts it on the branch")
        return EXIT_OK
    with rec.journal.lock_exclusive():
        res = rollback.execute(rec, prepared, on_event=Progress(sys.stdout).event)
    if rec.reporter:
        rec.reporter.close(timeout=30)
    print(f"\n{res.app}: rollback to {prepared.revision[:12]} -> {res.outcome.value}: {res.message}\n")
    print_status(rec)
    return EXIT_OK if res.outcome.value == "success" else EXIT_ERROR


def cmd_savepoint(args: argparse.Namespace) -> int:
    from reconciler.service.rollback import take_savepoint

    repo = repo_arg(args.repo) or os.environ.get("FLINK_RECONCILER_REPO_URL")
    rec = reconciler_for(settings_of(args, repo_url=repo or "."), report=bool(repo))
    if repo:
        rec.source.fetch()
    taken = take_savepoint(rec, args.app, deadline_s=args.timeout)
    if rec.reporter:
        rec.reporter.close(timeout=30)
    sp = taken.record
    at = f" (revision {taken.revision[:12]})" if taken.revision else ""
    print(f"{args.app}: savepoint {sp.path} of job {sp.job_id}{at} taken and recorded as manual; "
          "retention keeps it")
    return EXIT_OK

