"""The command line: a thin shell over the core. Exit codes follow `terraform plan -detailed-exitcode`.

One module per group of commands, each with its flags and its rendering to the terminal; their work lives
in `reconciler.service` and below. `common` holds what they share (exit codes, runtime flags, settings);
`console` makes everything printed terminal-safe (control characters as escapes).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from reconciler import __version__
from reconciler.cli import plan, rollback, serve, specs, status
from reconciler.cli.common import EXIT_CHANGES, EXIT_ERROR, EXIT_OK
from reconciler.cli.console import safe_console
from reconciler.cli.progress import Progress
from reconciler.errors import ReconcilerError

__all__ = ["EXIT_CHANGES", "EXIT_ERROR", "EXIT_OK", "Progress", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    with safe_console():  # an app's message or a Flink error never drives the terminal (console.py)
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
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
    p = argparse.ArgumentParser(prog="flink-reconciler", description="GitOps reconciler for Apache Flink apps.",
                                epilog="Run `flink-reconciler COMMAND --help` for the options of a command.")
    p.add_argument("--version", action="version", version=f"flink-reconciler {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(metavar="COMMAND")
    # in the order `--help` lists them
    specs.add_validate(sub)
    plan.add_plan(sub)
    plan.add_apply(sub)
    status.add_status(sub)
    status.add_scale_advice(sub)
    status.add_history(sub)
    rollback.add_rollback(sub)
    rollback.add_savepoint(sub)
    status.add_record(sub)
    serve.add_run(sub)
    serve.add_ui(sub)
    specs.add_render(sub)
    specs.add_schema(sub)
    specs.add_import(sub)
    return p
