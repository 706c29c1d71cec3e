"""What every command shares: exit codes, the runtime flags, settings from flags, env and --config."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from reconciler.cli.progress import Progress
from reconciler.clock import SystemClock
from reconciler.errors import ConfigError
from reconciler.spec.policy import SpecPolicy

if TYPE_CHECKING:
    from reconciler.service.reconcile import Reconciler
    from reconciler.settings import Settings

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def show_help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return EXIT_ERROR


PATH_HELP = "sub-directory of the repository holding the specs (default: the repository root)"
CACHE_HELP = "where Git clones are cached (default: ~/.cache/flink-reconciler/git/<hash of --repo>)"
SETTINGS_EPILOG = ("Flags override FLINK_RECONCILER_<SETTING> environment variables and the --config / "
                   "FLINK_RECONCILER_CONFIG file; every setting is listed in docs/daemon.md.")


REPO_HELP = "Git repository: a path or URL (default: FLINK_RECONCILER_REPO_URL)"


def output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", choices=["table", "json"], default="table", help="output format (default: %(default)s)")


def runtime_flags(p: argparse.ArgumentParser, *, repo: bool = True, acting: bool = True) -> None:
    """`acting`: the command plans or applies (--dry-run, --max-parallel); a read-only one (`ui`) has neither."""
    p.add_argument("--state-dir", type=Path, default=None,
                   help="records, local clusters, savepoints and the Git cache (default: .state)")
    p.add_argument("--runtime", choices=["local", "kubernetes"], default=None,
                   help="where Flink runs: JVMs on this host or a Kubernetes cluster (default: local)")
    p.add_argument("--branch", default=None, help="Git branch to follow (default: main)")
    if not acting:
        return
    p.add_argument("--dry-run", action="store_true", default=None,
                   help="no runtime: observe an empty runtime, plan and report only (default: off)")
    p.add_argument("--max-parallel", type=int, default=None, metavar="N",
                   help="apps reconciled at the same time (default: 4)")


def settings_of(args: argparse.Namespace, **extra: object) -> Settings:
    from reconciler.settings import load_settings

    cli = {k: getattr(args, k, None) for k in ("state_dir", "runtime", "branch", "dry_run", "max_parallel",
                                                 "prune", "poll_interval", "drift_interval", "listen_port",
                                                 "log_format", "status_sink")}
    if getattr(args, "path", None) is not None:
        cli["path"] = args.path
    if getattr(args, "repo", None):
        cli["repo_url"] = repo_arg(args.repo)
    return load_settings({**cli, **extra}, getattr(args, "config", None))


def env_bool(name: str) -> bool:
    return os.environ.get(f"FLINK_RECONCILER_{name}", "").lower() in ("1", "true", "yes", "on")


def env_spec_policy() -> SpecPolicy:
    """FLINK_RECONCILER_SPEC_POLICY, so validate and plan judge specs as the daemon does."""
    raw = os.environ.get("FLINK_RECONCILER_SPEC_POLICY") or SpecPolicy.RESTRICTED.value
    try:
        return SpecPolicy(raw)
    except ValueError:
        raise ConfigError(f"FLINK_RECONCILER_SPEC_POLICY must be restricted or permissive, got {raw!r}") from None


def git_cache_dir(args: argparse.Namespace, repo: str) -> Path:
    if args.cache_dir:
        return Path(args.cache_dir)
    from reconciler.source.git import cache_key

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flink-reconciler" / "git"
    return base / cache_key(repo)  # the resolved repository, not the argument as typed ('.')


def env_branch() -> str:
    return os.environ.get("FLINK_RECONCILER_BRANCH", "main")


def repo_arg(repo: str | None) -> str | None:
    if repo and Path(repo).exists():
        return str(Path(repo).resolve())
    return repo


def reconciler_for(settings: Settings, *, report: bool = True, progress: bool = False) -> Reconciler:
    from reconciler.service.factories import make_reconciler

    on_event = Progress(sys.stdout).event if progress else None
    return make_reconciler(settings, SystemClock(), on_event=on_event, report=report)

