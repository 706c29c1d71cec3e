"""The long-running commands: `run` (the daemon) and `ui` (the read-only dashboard without a daemon)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
from pathlib import Path

from reconciler import __version__
from reconciler.cli.common import (
    CACHE_HELP,
    EXIT_OK,
    PATH_HELP,
    SETTINGS_EPILOG,
    Subparsers,
    git_cache_dir,
    repo_arg,
    runtime_flags,
    settings_of,
)
from reconciler.clock import SystemClock
from reconciler.errors import ConfigError


def add_run(sub: Subparsers) -> None:
    rn = sub.add_parser("run", help="the daemon: poll Git (or take webhooks), reconcile, report on commits",
                        epilog=SETTINGS_EPILOG)
    rn.add_argument("--repo", dest="repo", help="Git repository: a URL or path (default: FLINK_RECONCILER_REPO_URL)")
    rn.add_argument("--config", type=Path,
                    help="YAML config file, see docs/daemon.md (default: FLINK_RECONCILER_CONFIG)")
    rn.add_argument("--path", default=None, help=PATH_HELP)
    rn.add_argument("--prune", action="store_true", default=None,
                    help="delete apps whose spec was removed, after a final savepoint (default: off)")
    rn.add_argument("--poll-interval", default=None, metavar="DURATION",
                    help="time between Git fetches: 15, 30s, 500ms, 2m (default: 15s)")
    rn.add_argument("--drift-interval", default=None, metavar="DURATION",
                    help="time between full passes over every app, to repair drift (default: 60s)")
    rn.add_argument("--listen-port", type=int, default=None, metavar="PORT",
                    help="port of the webhook, /healthz, /readyz and /metrics server; 0: any free port "
                         "(default: 8080)")
    rn.add_argument("--log-format", choices=["text", "json"], default=None,
                    help="log lines on stderr as text or JSON (default: text)")
    rn.add_argument("--status-sink", choices=["notes", "github", "gitlab", "gitea", "none"], default=None,
                    help="where commit statuses go; forges need FLINK_RECONCILER_FORGE_* settings (default: notes)")
    runtime_flags(rn)
    rn.set_defaults(func=cmd_run)


def add_ui(sub: Subparsers) -> None:
    ui = sub.add_parser("ui", help="serve the read-only web dashboard from the records, without a daemon",
                        description="Serve the dashboard (apps, transitions, lineage, the plan of the branch tip) "
                                    "read-only from the records in --state-dir, as the daemon serves it on its port. "
                                    "See docs/ui.md.", epilog=SETTINGS_EPILOG)
    ui.add_argument("--repo", help="Git repository, for the sync state against the branch tip and /plan "
                                   "(default: FLINK_RECONCILER_REPO_URL, else none: records only)")
    ui.add_argument("--path", default=None, help=PATH_HELP)
    ui.add_argument("--listen", default="127.0.0.1:8090", metavar="[HOST:]PORT",
                    help="where to serve; port 0: any free port (default: %(default)s)")
    ui.add_argument("--poll-interval", default=None, metavar="DURATION",
                    help="time between Git fetches of the branch tip (default: 15s)")
    ui.add_argument("--cache-dir", type=Path, help=CACHE_HELP)
    ui.add_argument("--insecure-ui", action="store_true", default=None,
                    help="serve the dashboard without ui_auth on an address other than loopback, which is refused "
                         "otherwise (default: off)")
    runtime_flags(ui, acting=False)
    ui.set_defaults(func=cmd_ui)


def cmd_run(args: argparse.Namespace) -> int:
    from reconciler.daemon.main import make_service, run
    from reconciler.logs import setup_logging

    settings = settings_of(args)
    setup_logging(settings.log_format, settings.log_level)
    return run(settings, make_service)


# ---------------------------------------------------------------------------------------------- ui


def cmd_ui(args: argparse.Namespace) -> int:
    """The dashboard without a daemon: nothing is written (no state dir created, no record, no note)."""
    import signal

    from reconciler.apply.journal import Journal
    from reconciler.daemon.http import Endpoints, HttpServer, allowed_hosts, refuse_unsafe_exposure
    from reconciler.daemon.http_server import Limits
    from reconciler.daemon.metrics import Metrics
    from reconciler.daemon.webhooks import WebhookSecrets
    from reconciler.logs import mask_secrets
    from reconciler.service.factories import make_policy, make_record_store, make_runtime
    from reconciler.source.git import GitSource
    from reconciler.spec.policy import SpecPolicy
    from reconciler.ui.read import ReadSide
    from reconciler.ui.tip import TipWatcher
    from reconciler.ui.web import Dashboard, UiAuth

    repo = repo_arg(args.repo) or os.environ.get("FLINK_RECONCILER_REPO_URL")
    settings = settings_of(args, **({"repo_url": repo} if repo else {}),
                           **({"insecure_ui": True} if args.insecure_ui else {}))
    mask_secrets(*(v.get_secret_value() for v in (settings.git_token, settings.forge_token, settings.ui_auth,
                                                   settings.github_webhook_secret, settings.gitlab_webhook_token,
                                                   settings.gitea_webhook_secret) if v is not None))
    host, _, port_text = args.listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"--listen {args.listen}: expected [HOST:]PORT") from None
    refuse_unsafe_exposure(settings, host, webhook=False)
    clock = SystemClock()
    if not settings.state_dir.is_dir():
        print(f"note: {settings.state_dir} does not exist (yet): no records to show until `apply` or the daemon "
              "writes some there", file=sys.stderr)
    runtime = make_runtime(settings, clock) if settings.state_dir.is_dir() or settings.runtime != "local" else None
    journal = Journal(settings.state_dir / "journal", clock, store=make_record_store(settings, runtime))
    watcher = None
    source = None
    if repo:
        source = GitSource(repo, git_cache_dir(args, repo), branch=settings.branch, token=settings.git_token,
                           ssh_key_path=settings.git_ssh_key_path)
        watcher = TipWatcher(source, subdir=settings.path, interval=settings.poll_interval,
                             spec_policy=SpecPolicy(settings.spec_policy))
        watcher.start()
    read = ReadSide(journals=lambda: [journal], tip=watcher.tip if watcher else lambda: None, clock=clock,
                    runtime=runtime, source=source, repo_url=repo, subdir=settings.path,
                    policy=dataclasses.replace(make_policy(settings),
                                               warm_standby=settings.runtime in ("local", "kubernetes")),
                    spec_policy=SpecPolicy(settings.spec_policy), mode="ui")
    token = settings.ui_auth.get_secret_value() if settings.ui_auth is not None else None
    dashboard = Dashboard(read, auth=UiAuth.parse(token))
    read.warm()

    def status_page() -> str:
        from reconciler.ui.model import STATES, Query, select

        rows, tip = read.rows()
        sel = select(rows, Query(per_page=len(rows) or 1))
        lines = [f"flink-reconciler {__version__} ui (read-only): {len(rows)} apps in {settings.state_dir}",
                 "branch tip: " + (tip.revision if tip else "-"),
                 ", ".join(f"{sel.counts[s.key]} {s.label}" for s in STATES if sel.counts[s.key])]
        lines += [f"  {r.badge.label:12} {r.name}: {r.why}" for r in rows if r.state != "in-sync"][:200]
        return "\n".join(lines) + "\n"

    server = HttpServer(host, port, Endpoints(
        secrets=WebhookSecrets(), branch=settings.branch, on_push=lambda _event: False,
        readiness=lambda: (True, "ok: read-only dashboard"), metrics=Metrics(), status_page=status_page,
        ui=dashboard, webhook=False), hosts=allowed_hosts(host, settings.allowed_hosts),
        limits=Limits(max_per_client=settings.max_connections_per_client))
    server.start()
    print(f"dashboard: {server.url}/  (read-only; records in {settings.state_dir}"
          + (f", branch {settings.branch} of {read.repo_url and _redacted_url(read.repo_url)}" if repo else "")
          + "; Ctrl-C stops it)", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    if watcher is not None:
        watcher.stop()
    return EXIT_OK


def _redacted_url(url: str) -> str:
    from reconciler.settings import redact_url

    return redact_url(url)

