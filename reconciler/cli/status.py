"""What the reconciler knows of the apps: status, scale-advice, history, and record show / rebuild."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING

from reconciler.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    PATH_HELP,
    REPO_HELP,
    SETTINGS_EPILOG,
    Subparsers,
    output_flag,
    reconciler_for,
    runtime_flags,
    settings_of,
    show_help,
)
from reconciler.core.observed import AppRecord, JobPhase, LiveApp
from reconciler.errors import ConfigError, ReconcilerError
from reconciler.logs import redact
from reconciler.terminal import terminal_safe

if TYPE_CHECKING:
    from reconciler.apply.journal import Lineage
    from reconciler.service.reconcile import Reconciler


def add_status(sub: Subparsers) -> None:
    st = sub.add_parser("status", help="one line per app: applied revision, job, last savepoint, outcome",
                        epilog=SETTINGS_EPILOG)
    output_flag(st)
    runtime_flags(st)
    st.set_defaults(func=cmd_status)


def add_scale_advice(sub: Subparsers) -> None:
    sa = sub.add_parser("scale-advice", help="the parallelism an app's Flink metrics call for, and why",
                        description="Samples the app's running job twice, --seconds apart, and prints what its "
                                    "spec.autoscale would decide: per vertex the current and proposed parallelism "
                                    "and the numbers behind it (docs/autoscale.md). Changes nothing.",
                        epilog=SETTINGS_EPILOG)
    sa.add_argument("app", help="the app's metadata.name")
    sa.add_argument("--repo", help=REPO_HELP)
    sa.add_argument("--seconds", type=float, default=15.0,
                    help="how long to measure, the window of this advice (default: %(default)s)")
    output_flag(sa)
    runtime_flags(sa)
    sa.set_defaults(func=cmd_scale_advice)


def add_history(sub: Subparsers) -> None:
    hi = sub.add_parser("history", help="transitions and savepoints of one app", epilog=SETTINGS_EPILOG)
    hi.add_argument("app", help="the app's metadata.name")
    output_flag(hi)
    runtime_flags(hi)
    hi.set_defaults(func=cmd_history)


def add_record(sub: Subparsers) -> None:
    rc = sub.add_parser("record", help="show or repair an app's record (what the reconciler remembers of it)",
                        description="An app whose record cannot be read (a truncated file, a ConfigMap edited by "
                                    "hand) is blocked until it is repaired; every other app goes on. `record show` "
                                    "prints the record or what is wrong with it; `record rebuild` moves it aside "
                                    "(kept, never deleted) so the next pass adopts the app from what its runtime and "
                                    "the lineage in git notes show: from a savepoint or checkpoint, or blocked, "
                                    "never from empty state.", epilog=SETTINGS_EPILOG)
    rcs = rc.add_subparsers(metavar="ACTION")
    rcshow = rcs.add_parser("show", help="print the app's record as JSON, or what is wrong with it (exit 1)",
                            epilog=SETTINGS_EPILOG)
    rcshow.add_argument("app", help="the app's metadata.name")
    runtime_flags(rcshow)
    rcshow.set_defaults(func=cmd_record_show)
    rcre = rcs.add_parser("rebuild", help="move a broken record aside and show what the next pass does instead",
                          epilog=SETTINGS_EPILOG)
    rcre.add_argument("app", help="the app's metadata.name")
    rcre.add_argument("--force", action="store_true",
                      help="move a readable record aside too (its history goes with it; default: refuse)")
    rcre.add_argument("--repo", help="Git repository, to show the next pass's plan here "
                                     "(default: FLINK_RECONCILER_REPO_URL)")
    rcre.add_argument("--path", default=None, help=PATH_HELP)
    runtime_flags(rcre)
    rcre.set_defaults(func=cmd_record_rebuild)
    rc.set_defaults(func=lambda _args: show_help(rc))


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


def _cell(value: object) -> str:
    """A table cell: one line, control characters escaped before the columns are measured."""
    return terminal_safe(str(value), newlines=False)


def print_status(rec: Reconciler) -> None:
    rows = _with_autoscale(rec, _status_rows(rec))
    table = [["APP", "APPLIED", "JOB", "STATE", "LAST SAVEPOINT", "OUTCOME"]]
    for r in rows:
        sp = _cell(r["last_savepoint"] or "-")
        table.append([_cell(r["app"]), _cell(r["applied"] or "-")[:12], _cell(r["job_id"] or "-")[:12],
                      _cell(r["state"]), sp if len(sp) < 60 else "..." + sp[-57:], _cell(r["outcome"] or "-")])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print(redact("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()))
    for r in rows:
        if r["outcome"] == "blocked" and r["applied"] is None and r["message"]:
            print(redact(f"\n{r['app']}: {r['message']}"))
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
    settings = settings_of(args, repo_url=os.environ.get("FLINK_RECONCILER_REPO_URL") or ".")
    if not any((settings.state_dir / n).exists() for n in ("records", "journal.sqlite")):  # never create one to look
        if args.output == "json":
            print("[]")
        else:
            print(f"nothing recorded in {settings.state_dir}: no journal there (is --state-dir the one "
                  "`apply` or the daemon used?)")
        return EXIT_OK
    rec = reconciler_for(settings, report=False)
    if args.output == "json":
        print(redact(json.dumps(_with_autoscale(rec, _status_rows(rec)), indent=2)))
    else:
        print_status(rec)
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
    rec = reconciler_for(settings_of(args, repo_url=repo), report=False)
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

    rec = reconciler_for(settings_of(args, repo_url=os.environ.get("FLINK_RECONCILER_REPO_URL") or "."), report=False)
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
    settings = settings_of(args, **({} if args.repo else {"repo_url": repo or "."}))
    rec = reconciler_for(settings, report=False)
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
    rec = reconciler_for(settings_of(args, repo_url=os.environ.get("FLINK_RECONCILER_REPO_URL") or "."), report=False)
    transitions = rec.journal.history(args.app)
    record = rec.journal.record(args.app)
    savepoints = record.savepoints if record else ()
    lineage = rec.journal.lineage(args.app)
    if not transitions and not savepoints:
        print(f"error: no history for app {args.app!r}", file=sys.stderr)
        return EXIT_ERROR
    if args.output == "json":
        print(redact(json.dumps({"transitions": [t.__dict__ | {"at": t.at.isoformat()} for t in transitions],
                                 "savepoints": [s.model_dump(mode="json") for s in savepoints],
                                 "lineage": [_lineage_json(e) for e in lineage]}, indent=2, default=str)))
        return EXIT_OK
    print(f"lineage of {args.app} (per execution: the savepoints it took, the state its job started from):")
    width = max((len(e.action) for e in lineage), default=0)  # `upgrade -> rolled back` is wider than most
    for e in lineage:
        took = f"took {', '.join(e.savepoints)}; " if e.savepoints else ""
        started = "started no job" if e.restored_from is None else f"started from {e.restored_from or 'empty state'}"
        print(redact(f"  {e.at:%Y-%m-%d %H:%M:%S}  {e.revision[:12]:12}  {e.action:{max(width, 9)}} "
                     f"{e.outcome.value:8} {took}{started}"))
    print(f"transitions of {args.app}:")
    for t in transitions:
        outcome = t.outcome.value if t.outcome else ""
        again = f" (seen {t.count} times, last {t.last_seen:%Y-%m-%d %H:%M:%S})" if t.last_seen else ""
        rev = (t.revision or "-")[:12]
        print(redact(f"  {t.at:%Y-%m-%d %H:%M:%S}  {rev:12}  {t.action:10} {outcome:8} {t.message}{again}"))
    print(f"savepoints of {args.app} (newest first):")
    for sp in sorted(savepoints, key=lambda s: s.taken_at, reverse=True):
        print(redact(f"  {sp.taken_at:%Y-%m-%d %H:%M:%S}  {sp.kind:10} {(sp.revision or '-')[:12]:12}  {sp.path}"))
    return EXIT_OK


def _lineage_json(e: Lineage) -> dict[str, object]:
    return {"revision": e.revision, "at": e.at.isoformat(), "action": e.action, "outcome": e.outcome.value,
            "restored_from": e.restored_from, "savepoints": list(e.savepoints), "job_id": e.job_id}

