"""The command line: a thin shell over the core. Exit codes follow `terraform plan -detailed-exitcode`.

Over 600 lines because it is one concern, the argument surface of every subcommand and its rendering to
the terminal; each command's work lives in `reconciler.service` and below.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from reconciler import __version__
from reconciler.clock import SystemClock
from reconciler.core import render
from reconciler.core.observed import AppRecord, ClusterPhase, JobPhase, LiveApp
from reconciler.core.plan import Plan
from reconciler.core.planner import Policy, offline_input
from reconciler.errors import ConfigError, ReconcilerError, SourceError, SpecError
from reconciler.spec.load import LoadResult, load_dir
from reconciler.spec.policy import SpecPolicy

if TYPE_CHECKING:
    from reconciler.apply.executor import StepEvent
    from reconciler.apply.journal import Lineage
    from reconciler.service.reconcile import Reconciler
    from reconciler.settings import Settings
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
    p = argparse.ArgumentParser(prog="flink-reconciler", description="GitOps reconciler for Apache Flink apps.",
                                epilog="Run `flink-reconciler COMMAND --help` for the options of a command.")
    p.add_argument("--version", action="version", version=f"flink-reconciler {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(metavar="COMMAND")

    v = sub.add_parser("validate", help="check spec files (file:line errors); exit 1 on any error")
    v.add_argument("paths", nargs="*", default=["."], help="spec files or directories (default: .)")
    v.add_argument("--output", choices=["text", "json"], default="text", help="output format (default: %(default)s)")
    v.add_argument("--runtime", choices=["local", "kubernetes"], default=None,
                   help="also check what this runtime needs (kubernetes: durable state, HA, renderable) "
                        "(default: the configured runtime, FLINK_RECONCILER_RUNTIME, else local)")
    v.set_defaults(func=cmd_validate)

    pl = sub.add_parser("plan", help="what applying a revision would do, like terraform plan", epilog=_SETTINGS_EPILOG)
    pl.add_argument("--repo", required=True, help="Git repository: a path or URL")
    pl.add_argument("--base", help="the revision assumed to run (offline mode) (default: the parent of --head)")
    pl.add_argument("--head", default="HEAD", help="the revision to plan (default: %(default)s)")
    pl.add_argument("--path", default="", help=_PATH_HELP)
    pl.add_argument("--format", choices=["text", "markdown", "json"], default="text",
                    help="text for a terminal, markdown for a pull-request comment, json: the plan artifact "
                         "(default: %(default)s)")
    pl.add_argument("--out", type=Path, help="also write the plan as JSON to this file, for apply --plan "
                                             "(default: not written)")
    pl.add_argument("--detailed-exitcode", action="store_true",
                    help="exit 2 when there are changes (default: exit 0 for changes)")
    pl.add_argument("--prune", action="store_true", default=_env_bool("PRUNE"),
                    help="plan deletions of removed specs, as the daemon would with prune on "
                         "(default: off, or FLINK_RECONCILER_PRUNE)")
    pl.add_argument("--allow-mass-delete", action="store_true",
                    help="disable the mass-deletion guard (default: the guard is on)")
    pl.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                    help="colour the text output; auto: on a terminal without NO_COLOR (default: %(default)s)")
    pl.add_argument("--cache-dir", type=Path, help=_CACHE_HELP)
    pl.set_defaults(func=cmd_plan)

    pl.add_argument("--live", action="store_true",
                    help="plan against the live state (runtime + records) instead of --base; needs the runtime "
                         "(default: offline)")
    _runtime_flags(pl, repo=False)

    ap = sub.add_parser("apply", help="plan a revision against the live state and execute it",
                        epilog=_SETTINGS_EPILOG)
    ap.add_argument("--repo", help="Git repository: a path or URL (default: FLINK_RECONCILER_REPO_URL)")
    ap.add_argument("--rev", default=None, help="revision to apply (default: the branch tip)")
    ap.add_argument("--plan", type=Path, help="execute exactly this saved plan from `plan --live --out` "
                                              "(default: plan --rev now)")
    ap.add_argument("--prune", action="store_true", default=None,
                    help="delete apps whose spec was removed, after a final savepoint (default: off)")
    ap.add_argument("--path", default=None, help=_PATH_HELP)
    ap.add_argument("--allow-mass-delete", action="store_true",
                    help="disable the mass-deletion guard (default: the guard is on)")
    _runtime_flags(ap)
    ap.set_defaults(func=cmd_apply)

    st = sub.add_parser("status", help="one line per app: applied revision, job, last savepoint, outcome",
                        epilog=_SETTINGS_EPILOG)
    st.add_argument("--output", choices=["table", "json"], default="table", help="output format (default: %(default)s)")
    _runtime_flags(st)
    st.set_defaults(func=cmd_status)

    sa = sub.add_parser("scale-advice", help="the parallelism an app's Flink metrics call for, and why",
                        description="Samples the app's running job twice, --seconds apart, and prints what its "
                                    "spec.autoscale would decide: per vertex the current and proposed parallelism "
                                    "and the numbers behind it (docs/autoscale.md). Changes nothing.",
                        epilog=_SETTINGS_EPILOG)
    sa.add_argument("app", help="the app's metadata.name")
    sa.add_argument("--repo", help="Git repository: a path or URL (default: FLINK_RECONCILER_REPO_URL)")
    sa.add_argument("--seconds", type=float, default=15.0,
                    help="how long to measure, the window of this advice (default: %(default)s)")
    sa.add_argument("--output", choices=["table", "json"], default="table", help="output format (default: %(default)s)")
    _runtime_flags(sa)
    sa.set_defaults(func=cmd_scale_advice)

    hi = sub.add_parser("history", help="transitions and savepoints of one app", epilog=_SETTINGS_EPILOG)
    hi.add_argument("app", help="the app's metadata.name")
    hi.add_argument("--output", choices=["table", "json"], default="table", help="output format (default: %(default)s)")
    _runtime_flags(hi)
    hi.set_defaults(func=cmd_history)

    rb = sub.add_parser("rollback", help="go back to an app's spec at a commit, from the state it had there",
                        description="Plan (and with --apply run, or with --write-commit commit) running APP with "
                                    "its spec at REV, restored from the newest savepoint a job of REV's spec took "
                                    "(normally the one taken when REV was left). See docs/rollback.md.",
                        epilog=_SETTINGS_EPILOG)
    rb.add_argument("app", help="the app's metadata.name")
    rb.add_argument("--to", required=True, metavar="REV", help="the commit to go back to (sha, tag, main~2, ...)")
    rb.add_argument("--repo", help="Git repository: a path or URL (default: FLINK_RECONCILER_REPO_URL)")
    rb.add_argument("--path", default=None, help=_PATH_HELP)
    rb.add_argument("--apply", action="store_true",
                    help="execute the plan now; the branch tip is unchanged, so the next apply or daemon pass "
                         "goes back to it (default: only show the plan)")
    rb.add_argument("--write-commit", action="store_true",
                    help="commit REV's spec with initialSavepointPath and a new savepointRedeployNonce on the "
                         "branch and push it: the daemon (or apply) does the rest (default: no commit)")
    rb.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                    help="colour the plan; auto: on a terminal without NO_COLOR (default: %(default)s)")
    _runtime_flags(rb)
    rb.set_defaults(func=cmd_rollback)

    sv = sub.add_parser("savepoint", help="take a savepoint of an app's running job now (kept by retention)",
                        epilog=_SETTINGS_EPILOG)
    sv.add_argument("app", help="the app's metadata.name")
    sv.add_argument("--repo", help="Git repository, for the commit status (default: FLINK_RECONCILER_REPO_URL)")
    sv.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                    help="how long to wait for Flink to complete it (default: %(default)s)")
    _runtime_flags(sv)
    sv.set_defaults(func=cmd_savepoint)

    rc = sub.add_parser("record", help="show or repair an app's record (what the reconciler remembers of it)",
                        description="An app whose record cannot be read (a truncated file, a ConfigMap edited by "
                                    "hand) is blocked until it is repaired; every other app goes on. `record show` "
                                    "prints the record or what is wrong with it; `record rebuild` moves it aside "
                                    "(kept, never deleted) so the next pass adopts the app from what its runtime and "
                                    "the lineage in git notes show: from a savepoint or checkpoint, or blocked, "
                                    "never from empty state.", epilog=_SETTINGS_EPILOG)
    rcs = rc.add_subparsers(metavar="ACTION")
    rcshow = rcs.add_parser("show", help="print the app's record as JSON, or what is wrong with it (exit 1)",
                            epilog=_SETTINGS_EPILOG)
    rcshow.add_argument("app", help="the app's metadata.name")
    _runtime_flags(rcshow)
    rcshow.set_defaults(func=cmd_record_show)
    rcre = rcs.add_parser("rebuild", help="move a broken record aside and show what the next pass does instead",
                          epilog=_SETTINGS_EPILOG)
    rcre.add_argument("app", help="the app's metadata.name")
    rcre.add_argument("--force", action="store_true",
                      help="move a readable record aside too (its history goes with it; default: refuse)")
    rcre.add_argument("--repo", help="Git repository, to show the next pass's plan here "
                                     "(default: FLINK_RECONCILER_REPO_URL)")
    rcre.add_argument("--path", default=None, help=_PATH_HELP)
    _runtime_flags(rcre)
    rcre.set_defaults(func=cmd_record_rebuild)
    rc.set_defaults(func=lambda _args: _help(rc))

    rn = sub.add_parser("run", help="the daemon: poll Git (or take webhooks), reconcile, report on commits",
                        epilog=_SETTINGS_EPILOG)
    rn.add_argument("--repo", dest="repo", help="Git repository: a URL or path (default: FLINK_RECONCILER_REPO_URL)")
    rn.add_argument("--config", type=Path,
                    help="YAML config file, see docs/daemon.md (default: FLINK_RECONCILER_CONFIG)")
    rn.add_argument("--path", default=None, help=_PATH_HELP)
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
    _runtime_flags(rn)
    rn.set_defaults(func=cmd_run)

    ui = sub.add_parser("ui", help="serve the read-only web dashboard from the records, without a daemon",
                        description="Serve the dashboard (apps, transitions, lineage, the plan of the branch tip) "
                                    "read-only from the records in --state-dir, as the daemon serves it on its port. "
                                    "See docs/ui.md.", epilog=_SETTINGS_EPILOG)
    ui.add_argument("--repo", help="Git repository, for the sync state against the branch tip and /plan "
                                   "(default: FLINK_RECONCILER_REPO_URL, else none: records only)")
    ui.add_argument("--path", default=None, help=_PATH_HELP)
    ui.add_argument("--listen", default="127.0.0.1:8090", metavar="[HOST:]PORT",
                    help="where to serve; port 0: any free port (default: %(default)s)")
    ui.add_argument("--poll-interval", default=None, metavar="DURATION",
                    help="time between Git fetches of the branch tip (default: 15s)")
    ui.add_argument("--cache-dir", type=Path, help=_CACHE_HELP)
    _runtime_flags(ui)
    ui.set_defaults(func=cmd_ui)

    rd = sub.add_parser("render", help="print the Kubernetes manifests each app would get",
                        description="Print the Kubernetes objects of each app, from spec files (PATH) or from "
                                    "a Git revision (--repo).",
                        epilog="Example: flink-reconciler render apps/ | kubectl apply --dry-run=server -f -")
    rd.add_argument("spec_path", nargs="?", metavar="PATH",
                    help="a spec file, a directory of specs, or - for stdin (default: none, then --repo is required)")
    rd.add_argument("--repo", help="render a revision of this Git repository (path or URL) instead of PATH "
                                   "(default: none)")
    rd.add_argument("--rev", default=None, help="with --repo: the revision to render (default: HEAD)")
    rd.add_argument("--path", default="", help="with --repo: " + _PATH_HELP)
    rd.add_argument("--app", action="append", help="only this app, repeatable (default: every app)")
    rd.add_argument("--cache-dir", type=Path, help="with --repo: " + _CACHE_HELP)
    rd.set_defaults(func=cmd_render)

    s = sub.add_parser("schema", help="print the JSON Schema of a FlinkApp or FlinkSessionCluster")
    s.add_argument("--out", type=Path, help="write to this file (default: stdout)")
    s.add_argument("--kind", choices=("FlinkApp", "FlinkSessionCluster"), default="FlinkApp",
                   help="which kind's schema (default: FlinkApp)")
    s.add_argument("--reference", action="store_true",
                   help="the Markdown field reference instead (default: the JSON Schema)")
    s.set_defaults(func=cmd_schema)

    im = sub.add_parser("import", help="convert Flink Kubernetes Operator FlinkDeployments into FlinkApp specs",
                        description="Convert flink.apache.org/v1beta1 FlinkDeployment documents (application mode; "
                                    "as `kubectl get flinkdeployment -o yaml` prints them) into FlinkApp specs, "
                                    "each value commented with the field it came from. Exit 0 when every "
                                    "document runs the same under flink-reconciler, 1 when anything was not "
                                    "imported or would run differently (each listed with the reason). See "
                                    "docs/migrate-from-flink-operator.md.")
    im.add_argument("source", help="a YAML file, a directory of *.yaml/*.yml files, or - for stdin")
    im.add_argument("--out", type=Path, help="write one <name>.yaml per app into this directory and the report to "
                                             "stdout (default: the specs to stdout, the report to stderr)")
    im.add_argument("--force", action="store_true", help="overwrite existing files in --out (default: refuse)")
    im.add_argument("--output", choices=["text", "json"], default="text",
                    help="report format (default: %(default)s)")
    im.set_defaults(func=cmd_import)
    return p


def _help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return EXIT_ERROR


_PATH_HELP = "sub-directory of the repository holding the specs (default: the repository root)"
_CACHE_HELP = "where Git clones are cached (default: ~/.cache/flink-reconciler/git/<hash of --repo>)"
_SETTINGS_EPILOG = ("Flags override FLINK_RECONCILER_<SETTING> environment variables and the --config / "
                    "FLINK_RECONCILER_CONFIG file; every setting is listed in docs/daemon.md.")


def _runtime_flags(p: argparse.ArgumentParser, *, repo: bool = True) -> None:
    p.add_argument("--state-dir", type=Path, default=None,
                   help="records, local clusters, savepoints and the Git cache (default: .state)")
    p.add_argument("--runtime", choices=["local", "kubernetes"], default=None,
                   help="where Flink runs: JVMs on this host or a Kubernetes cluster (default: local)")
    p.add_argument("--branch", default=None, help="Git branch to follow (default: main)")
    p.add_argument("--dry-run", action="store_true", default=None,
                   help="no runtime: observe an empty runtime, plan and report only (default: off)")
    p.add_argument("--max-parallel", type=int, default=None, metavar="N",
                   help="apps reconciled at the same time (default: 4)")


def _settings(args: argparse.Namespace, **extra: object) -> Settings:
    from reconciler.settings import load_settings

    cli = {k: getattr(args, k, None) for k in ("state_dir", "runtime", "branch", "dry_run", "max_parallel",
                                                 "prune", "poll_interval", "drift_interval", "listen_port",
                                                 "log_format", "status_sink")}
    if getattr(args, "path", None) is not None:
        cli["path"] = args.path
    if getattr(args, "repo", None):
        cli["repo_url"] = _repo_arg(args.repo)
    return load_settings({**cli, **extra}, getattr(args, "config", None))


def _env_bool(name: str) -> bool:
    return os.environ.get(f"FLINK_RECONCILER_{name}", "").lower() in ("1", "true", "yes", "on")


def _spec_policy() -> SpecPolicy:
    """FLINK_RECONCILER_SPEC_POLICY, so validate and plan judge specs as the daemon does."""
    raw = os.environ.get("FLINK_RECONCILER_SPEC_POLICY") or SpecPolicy.RESTRICTED.value
    try:
        return SpecPolicy(raw)
    except ValueError:
        raise ConfigError(f"FLINK_RECONCILER_SPEC_POLICY must be restricted or permissive, got {raw!r}") from None


# ---------------------------------------------------------------------------------------------- validate


def cmd_validate(args: argparse.Namespace) -> int:
    total_apps = total_files = total_clusters = 0
    problems: list[dict[str, object]] = []
    for raw in args.paths:
        root = Path(raw)
        if not root.exists():
            print(f"error: {raw}: no such file or directory", file=sys.stderr)
            return EXIT_ERROR
        policy = _spec_policy()
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
    from reconciler.live.k8s_render import kubernetes_problems
    from reconciler.live.k8s_storage import runs_on_kubernetes
    from reconciler.settings import load_settings

    default = runtime or load_settings({}).runtime
    return [SpecError(p.message, file=la.file, line=la.line, field=p.field, app=la.app.name)
            for la in result.apps.values() if runs_on_kubernetes(la.app, default)
            for p in kubernetes_problems(la.app)]


# ---------------------------------------------------------------------------------------------- plan


def _cache_dir(args: argparse.Namespace, repo: str) -> Path:
    if args.cache_dir:
        return Path(args.cache_dir)
    from reconciler.source.git import cache_key

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flink-reconciler" / "git"
    return base / cache_key(repo)  # the resolved repository, not the argument as typed ('.')


def cmd_plan(args: argparse.Namespace) -> int:
    from reconciler.source.git import GitSource
    from reconciler.source.specs import load_at

    if args.live:
        rec = _reconciler(_settings(args), report=False)
        if args.allow_mass_delete:  # what `apply --allow-mass-delete` would do
            rec.policy = dataclasses.replace(rec.policy, allow_mass_delete=True)
        rec.source.fetch()
        return _emit_plan(rec.plan(rec.source.resolve(args.head)), args)

    src = GitSource(args.repo, _cache_dir(args, args.repo), branch=_branch())
    src.fetch()
    head = src.resolve(args.head)
    base = src.resolve(args.base) if args.base else _parent_or_none(src, head)
    head_specs = load_at(src, head, args.path, policy=_spec_policy())
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


def _branch() -> str:
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


# ---------------------------------------------------------------------------------------------- apply


def _repo_arg(repo: str | None) -> str | None:
    if repo and Path(repo).exists():
        return str(Path(repo).resolve())
    return repo


def _reconciler(settings: Settings, *, report: bool = True, progress: bool = False) -> Reconciler:
    from reconciler.service.factories import make_reconciler

    on_event = Progress(sys.stdout).event if progress else None
    return make_reconciler(settings, SystemClock(), on_event=on_event, report=report)


class Progress:
    """Step progress: one line per step start/end; on a terminal, a spinner line for the running ones."""

    FRAMES = "|/-\\"

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self._running: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None

    def event(self, ev: StepEvent) -> None:
        stage = "rollback " if ev.rollback else ""
        extra = f": {ev.message}" if ev.message else ""
        head = f"[{ev.app}] {stage}{ev.index + 1}/{ev.count} {ev.description}"
        with self._lock:
            if ev.phase.value == "started":
                self._running[ev.app] = (head, time.monotonic())
                if not self.tty:
                    print(f"{head} ... started", file=self.out, flush=True)
                elif self._ticker is None:
                    self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
                    self._ticker.start()
                return
            if ev.phase.value in ("done", "failed"):
                self._running.pop(ev.app, None)
            self._clear()
            print(f"{head} ... {ev.phase.value} ({ev.elapsed:.1f}s){extra}", file=self.out, flush=True)

    def _clear(self) -> None:
        if self.tty:
            self.out.write("\r\x1b[K")

    def _tick(self) -> None:
        n = 0
        while True:
            time.sleep(0.2)
            with self._lock:
                if not self._running:
                    continue
                head, t0 = list(self._running.values())[-1]
                more = f" (+{len(self._running) - 1} more)" if len(self._running) > 1 else ""
                self._clear()
                self.out.write(f"{self.FRAMES[n % 4]} {head} ... {time.monotonic() - t0:.0f}s{more}")
                self.out.flush()
            n += 1


def cmd_apply(args: argparse.Namespace) -> int:
    settings = _settings(args)
    rec = _reconciler(settings, progress=True)
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
    for name, res in sorted({**result.resumed, **result.results}.items()):
        print(f"{name}: {res.action.value} -> {res.outcome.value}: {res.message}")
    print()
    _print_status(rec)
    return EXIT_OK if result.ok else EXIT_ERROR


# ---------------------------------------------------------------------------------------------- status


def _status_rows(rec: Reconciler) -> list[dict[str, object]]:
    from reconciler.live.observe import observe
    from reconciler.service.sessions import prepare_from_records

    records = rec.journal.records()
    on = prepare_from_records(rec.runtime, {n: r.last_applied_spec for n, r in records.apps.items()})
    live = observe(rec.runtime, set(records.apps) | set(records.broken))
    rows: list[dict[str, object]] = []
    for name in sorted(set(records.apps) | set(live.apps) | set(records.broken)):
        r = records.get(name)
        la = live.get(name)
        sp = r.latest_savepoint if r else None
        why = records.broken.get(name) or la.unreadable
        if why is not None:  # its record or its runtime files cannot be read: blocked until repaired
            rows.append({"app": name, "applied": None, "attempted": None, "job_id": la.job_id,
                         "state": la.flink_state or la.cluster.value, "last_savepoint": None, "last_savepoint_at": None,
                         "outcome": "blocked", "message": why})
            continue
        rows.append({
            "app": name,
            "applied": r.last_applied_revision if r else None,
            "attempted": r.last_attempted_revision if r else None,
            "job_id": la.job_id,
            "state": _state_text(la, r),
            "unhealthy_since": r.unhealthy_since.isoformat() if r and r.unhealthy_since else None,
            "last_savepoint": sp.path if sp else None,
            "last_savepoint_at": sp.taken_at.isoformat() if sp else None,
            "outcome": r.last_outcome.value if r and r.last_outcome else None,
            "message": r.last_message if r else la.cluster_message,
            **({"sessionCluster": on[name]} if name in on else {}),
        })
    return rows


def _state_text(live: LiveApp, rec: AppRecord | None) -> str:
    """The job's Flink state, or `recovering (...) since ...` while the reconciler waits for it (or repairs it)."""
    state = live.flink_state or live.cluster.value
    if rec is None or rec.unhealthy_since is None or live.job is JobPhase.RUNNING:
        return state
    return f"recovering ({state}) since {rec.unhealthy_since:%Y-%m-%d %H:%M:%S}"


def _print_status(rec: Reconciler) -> None:
    rows = _with_autoscale(rec, _status_rows(rec))
    table = [["APP", "APPLIED", "JOB", "STATE", "LAST SAVEPOINT", "OUTCOME"]]
    for r in rows:
        sp = str(r["last_savepoint"] or "-")
        table.append([str(r["app"]), str(r["applied"] or "-")[:12], str(r["job_id"] or "-")[:12],
                      str(r["state"]), sp if len(sp) < 60 else "..." + sp[-57:], str(r["outcome"] or "-")])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for r in rows:
        if r["outcome"] == "blocked" and r["applied"] is None and r["message"]:
            print(f"\n{r['app']}: {r['message']}")
    from reconciler.service.sessions import cluster_lines

    for c in cluster_lines(rec.runtime):
        jobs = c["jobs"] if isinstance(c["jobs"], dict) else {}
        many = f", {c['clusters']} clusters (a move in progress, or a job rolled back onto the old one)" if (
            isinstance(c["clusters"], int) and c["clusters"] > 1) else ""
        print(f"\nsession cluster {c['cluster']}: {c['state']}{many}; jobs: "
              + (", ".join(f"{a} {s}" for a, s in sorted(jobs.items())) or "none"))
    for r in rows:
        if "autoscale" in r:
            print(f"\n{r['app']}: {r['autoscale']}")


def cmd_status(args: argparse.Namespace) -> int:
    settings = _settings(args, repo_url=os.environ.get("FLINK_RECONCILER_REPO_URL") or ".")
    if not any((settings.state_dir / n).exists() for n in ("records", "journal.sqlite")):  # never create one to look
        if args.output == "json":
            print("[]")
        else:
            print(f"nothing recorded in {settings.state_dir}: no journal there (is --state-dir the one "
                  "`apply` or the daemon used?)")
        return EXIT_OK
    rec = _reconciler(settings, report=False)
    if args.output == "json":
        print(json.dumps(_with_autoscale(rec, _status_rows(rec)), indent=2))
    else:
        _print_status(rec)
    return EXIT_OK


def _with_autoscale(rec: Reconciler, rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each autoscaled app's row with the autoscaler's last word on its applied commit (git notes)."""
    from reconciler.service.autoscale import autoscale_notes

    scaled: dict[str, str] = {}
    for name, r in rec.journal.records().apps.items():
        mode = ((r.last_applied_spec or {}).get("spec") or {}).get("autoscale", {}).get("mode", "off")
        if mode != "off" and r.last_applied_revision:
            scaled[name] = r.last_applied_revision
    said = autoscale_notes(rec, scaled)
    return [row | ({"autoscale": said.get(str(row["app"]), "no advice yet")} if row["app"] in scaled else {})
            for row in rows]


def cmd_scale_advice(args: argparse.Namespace) -> int:
    from reconciler.service.autoscale import advise_now, evidence_table

    repo = args.repo or os.environ.get("FLINK_RECONCILER_REPO_URL")
    if not repo:
        raise ConfigError("scale-advice needs the repository: --repo or FLINK_RECONCILER_REPO_URL")
    rec = _reconciler(_settings(args, repo_url=repo), report=False)
    advice = advise_now(rec, args.app, seconds=args.seconds)
    if args.output == "json":
        print(json.dumps(advice.to_json(), indent=2))
        return EXIT_OK
    print(f"{advice.app}: {advice.verdict.value}: parallelism {advice.current} -> {advice.proposed}")
    print(advice.reason)
    if advice.vertices:
        print()
        print(evidence_table(advice))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- record


def cmd_record_show(args: argparse.Namespace) -> int:
    from reconciler.live.records import BrokenRecord

    rec = _reconciler(_settings(args, repo_url=os.environ.get("FLINK_RECONCILER_REPO_URL") or "."), report=False)
    got = rec.journal.store.get(args.app)
    if got is None:
        print(f"error: there is no record of app {args.app!r} in {rec.journal.store.where}", file=sys.stderr)
        return EXIT_ERROR
    if isinstance(got, BrokenRecord):
        from reconciler.apply.journal import broken_reason

        print(f"error: {broken_reason(args.app, got.reason)}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(got.doc, indent=2, sort_keys=True))
    why = rec.journal.broken().get(args.app)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def cmd_record_rebuild(args: argparse.Namespace) -> int:
    from reconciler.apply.journal import NEWER
    from reconciler.live.records import SetsAside

    repo = args.repo or os.environ.get("FLINK_RECONCILER_REPO_URL")
    settings = _settings(args, **({} if args.repo else {"repo_url": repo or "."}))
    rec = _reconciler(settings, report=False)
    store, app = rec.journal.store, args.app
    if not isinstance(store, SetsAside):
        raise ConfigError(f"{store.where}: records there cannot be moved aside")
    with rec.journal.lock_exclusive():
        if store.get(app) is None:
            print(f"error: there is no record of app {app!r} in {store.where}: nothing to rebuild (the next pass "
                  "adopts the app from what its runtime and the lineage in git notes show)", file=sys.stderr)
            return EXIT_ERROR
        why = rec.journal.broken().get(app)
        if why is None and not args.force:
            print(f"error: the record of app {app!r} is readable (`flink-reconciler record show {app}`); rebuilding "
                  "it would set its history aside with it. Pass --force to do it anyway", file=sys.stderr)
            return EXIT_ERROR
        if why is not None and NEWER in why and not args.force:
            print(f"error: {why}. Rebuilding would set aside what that newer version knows: upgrade this "
                  "flink-reconciler instead (or pass --force)", file=sys.stderr)
            return EXIT_ERROR
        inflight = rec.journal.inflight(app) if why is None else None
        aside = store.set_aside(app, time.strftime("broken-%Y%m%d-%H%M%S", time.gmtime()))
    print(f"moved the record of app {app} aside, to {aside} (delete it once the app runs again)")
    if inflight is not None:
        print(f"note: it had an unfinished {inflight.plan.action.value} of revision {inflight.revision[:12]} in "
              "flight; the next pass adopts the app from what the runtime shows instead")
    rec.journal.refresh()
    generic = ("the next pass adopts the app from what its runtime and the lineage in git notes show (from a "
               "savepoint or checkpoint, or blocked; never from empty state)")
    if not repo:
        print(f"{generic}; give --repo to see its plan here")
        return EXIT_OK
    try:
        rec.source.fetch()
        planned = [a for a in rec.plan(rec.source.head(), only={app}).apps if a.app == app]
    except ReconcilerError as e:
        print(f"{generic}; its plan could not be computed here: {e}")
        return EXIT_OK
    if not planned:
        print("next pass: nothing: Git has no spec of this app and its runtime shows nothing of it")
    for ap in planned:
        print(f"next pass: {ap.action.value}: {ap.reason}")
        for risk in ap.risks:
            print(f"  risk: {risk}")
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    rec = _reconciler(_settings(args, repo_url=os.environ.get("FLINK_RECONCILER_REPO_URL") or "."), report=False)
    transitions = rec.journal.history(args.app)
    record = rec.journal.record(args.app)
    savepoints = record.savepoints if record else ()
    lineage = rec.journal.lineage(args.app)
    if not transitions and not savepoints:
        print(f"error: no history for app {args.app!r}", file=sys.stderr)
        return EXIT_ERROR
    if args.output == "json":
        print(json.dumps({"transitions": [t.__dict__ | {"at": t.at.isoformat()} for t in transitions],
                          "savepoints": [s.model_dump(mode="json") for s in savepoints],
                          "lineage": [_lineage_json(e) for e in lineage]}, indent=2, default=str))
        return EXIT_OK
    print(f"lineage of {args.app} (per execution: the savepoints it took, the state its job started from):")
    width = max((len(e.action) for e in lineage), default=0)  # `upgrade -> rolled back` is wider than most
    for e in lineage:
        took = f"took {', '.join(e.savepoints)}; " if e.savepoints else ""
        started = "started no job" if e.restored_from is None else f"started from {e.restored_from or 'empty state'}"
        print(f"  {e.at:%Y-%m-%d %H:%M:%S}  {e.revision[:12]:12}  {e.action:{max(width, 9)}} {e.outcome.value:8} "
              f"{took}{started}")
    print(f"transitions of {args.app}:")
    for t in transitions:
        outcome = t.outcome.value if t.outcome else ""
        again = f" (seen {t.count} times, last {t.last_seen:%Y-%m-%d %H:%M:%S})" if t.last_seen else ""
        rev = (t.revision or "-")[:12]
        print(f"  {t.at:%Y-%m-%d %H:%M:%S}  {rev:12}  {t.action:10} {outcome:8} {t.message}{again}")
    print(f"savepoints of {args.app} (newest first):")
    for sp in sorted(savepoints, key=lambda s: s.taken_at, reverse=True):
        print(f"  {sp.taken_at:%Y-%m-%d %H:%M:%S}  {sp.kind:10} {(sp.revision or '-')[:12]:12}  {sp.path}")
    return EXIT_OK


def _lineage_json(e: Lineage) -> dict[str, object]:
    return {"revision": e.revision, "at": e.at.isoformat(), "action": e.action, "outcome": e.outcome.value,
            "restored_from": e.restored_from, "savepoints": list(e.savepoints), "job_id": e.job_id}


def cmd_rollback(args: argparse.Namespace) -> int:
    from reconciler.core.rollback import Refusal
    from reconciler.service import rollback

    if args.apply and args.write_commit:
        raise ConfigError("rollback: give --apply or --write-commit, not both (a written commit is applied by "
                          "the daemon, or by `flink-reconciler apply`)")
    rec = _reconciler(_settings(args), report=args.apply, progress=args.apply)
    prepared = rollback.prepare(rec, args.app, args.to)
    if isinstance(prepared, Refusal):
        print(f"error: rollback of {args.app} to {args.to} refused: {prepared.reason}", file=sys.stderr)
        return EXIT_ERROR
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and "NO_COLOR" not in os.environ)
    sys.stdout.write(render.to_text(prepared.plan, color=color))
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
    _print_status(rec)
    return EXIT_OK if res.outcome.value == "success" else EXIT_ERROR


def cmd_savepoint(args: argparse.Namespace) -> int:
    from reconciler.service.rollback import take_savepoint

    repo = _repo_arg(args.repo) or os.environ.get("FLINK_RECONCILER_REPO_URL")
    rec = _reconciler(_settings(args, repo_url=repo or "."), report=bool(repo))
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


def cmd_run(args: argparse.Namespace) -> int:
    from reconciler.daemon.main import make_service, run
    from reconciler.logs import setup_logging

    settings = _settings(args)
    setup_logging(settings.log_format, settings.log_level)
    return run(settings, make_service)


# ---------------------------------------------------------------------------------------------- ui


def cmd_ui(args: argparse.Namespace) -> int:
    """The dashboard without a daemon: nothing is written (no state dir created, no record, no note)."""
    import signal

    from reconciler.apply.journal import Journal
    from reconciler.daemon.http import Endpoints, HttpServer
    from reconciler.daemon.metrics import Metrics
    from reconciler.daemon.webhooks import WebhookSecrets
    from reconciler.logs import mask_secrets
    from reconciler.service.factories import make_policy, make_record_store, make_runtime
    from reconciler.source.git import GitSource
    from reconciler.spec.policy import SpecPolicy
    from reconciler.ui.read import ReadSide
    from reconciler.ui.tip import TipWatcher
    from reconciler.ui.web import Dashboard, UiAuth

    repo = _repo_arg(args.repo) or os.environ.get("FLINK_RECONCILER_REPO_URL")
    settings = _settings(args, **({"repo_url": repo} if repo else {}))
    mask_secrets(*(v.get_secret_value() for v in (settings.git_token, settings.forge_token, settings.ui_auth,
                                                   settings.github_webhook_secret, settings.gitlab_webhook_token,
                                                   settings.gitea_webhook_secret) if v is not None))
    host, _, port_text = args.listen.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"--listen {args.listen}: expected [HOST:]PORT") from None
    clock = SystemClock()
    if not settings.state_dir.is_dir():
        print(f"note: {settings.state_dir} does not exist (yet): no records to show until `apply` or the daemon "
              "writes some there", file=sys.stderr)
    runtime = make_runtime(settings, clock) if settings.state_dir.is_dir() or settings.runtime != "local" else None
    journal = Journal(settings.state_dir / "journal", clock, store=make_record_store(settings, runtime))
    watcher = None
    source = None
    if repo:
        source = GitSource(repo, _cache_dir(args, repo), branch=settings.branch, token=settings.git_token,
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

    server = HttpServer(host or "127.0.0.1", port, Endpoints(
        secrets=WebhookSecrets(), branch=settings.branch, on_push=lambda _event: False,
        readiness=lambda: (True, "ok: read-only dashboard"), metrics=Metrics(), status_page=status_page,
        ui=dashboard))
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


# ---------------------------------------------------------------------------------------------- render


UNVERSIONED = "unversioned"  # the revision stamped on objects rendered from files rather than a commit


def cmd_render(args: argparse.Namespace) -> int:
    from reconciler.core.plan import deterministic_job_id
    from reconciler.live.k8s_render import render_app, session_cluster_app, to_yaml

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

    repo = _repo_arg(args.repo) or args.repo
    src = GitSource(repo, _cache_dir(args, repo), branch=_branch())
    src.fetch()
    rev = src.resolve(args.rev or "HEAD")
    return load_at(src, rev, args.path), rev


# ---------------------------------------------------------------------------------------------- schema


def schema_json(kind: str = "FlinkApp") -> str:
    from reconciler.spec.schema import schema_of

    return json.dumps(schema_of(kind), indent=2, sort_keys=False) + "\n"


def cmd_import(args: argparse.Namespace) -> int:
    from reconciler import cli_import

    return cli_import.run(args.source, args.out, force=args.force, output=args.output, stdin=sys.stdin,
                          stdout=sys.stdout, stderr=sys.stderr)


def cmd_schema(args: argparse.Namespace) -> int:
    from reconciler.spec.reference import markdown

    text = markdown() if args.reference else schema_json(args.kind)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
