"""Where the dashboard reads: the journal (the same records, in-flight executions, history and lineage that
`status` and `history` read), the branch tip, the last pass's app states and, when there is a runtime, the
live job of the apps on the page. Read-only: nothing here writes a record, a note or a cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import yaml

from reconciler.apply.journal import InFlight, Journal, Lineage, Transition
from reconciler.clock import Clock
from reconciler.core import render
from reconciler.core.diff import diff, pointer_tokens
from reconciler.core.observed import AppRecord, LiveApp, Records
from reconciler.core.plan import Action, FieldChange, Plan
from reconciler.core.planner import Policy, offline_input, plan
from reconciler.errors import ReconcilerError
from reconciler.live.observe import observe
from reconciler.live.ports import Runtime
from reconciler.logs import redact, redact_config
from reconciler.source.git import GitSource
from reconciler.source.specs import load_at
from reconciler.spec.load import LoadResult
from reconciler.spec.policy import SpecPolicy
from reconciler.ui.forge import commit_url
from reconciler.ui.model import (
    AppRow,
    Query,
    RowBuilder,
    Selection,
    StepView,
    Tip,
    savepoint_kind,
    select,
    step_views,
)

log = logging.getLogger(__name__)

ROWS_TTL_S = 1.0  # the overview's rows are at most this old (plus one rebuild) when served
# A sharded daemon's runtimes: one per shard this replica holds now, with the predicate of the apps it owns.
RuntimesByShard = Callable[[], Sequence[tuple[Runtime, Callable[[str], bool]]]]
LIVE_TTL_S = 2.0  # a page refreshed every second asks the runtime at most this often per app
FINAL_ACTIONS = frozenset({"delete", "suspend"})
PLAN_WAIT_S = 2.0  # /plan waits this long for the plan, then answers "computing" and refreshes


@dataclass(frozen=True)
class LiveInfo:
    job_id: str | None
    state: str  # Flink's job state, or the cluster's phase when there is no job
    checkpoint_at: datetime | None
    message: str | None = None


@dataclass(frozen=True)
class SavepointView:
    at: datetime
    kind: str
    revision: str | None
    path: str
    job_id: str | None


@dataclass(frozen=True)
class AppDetail:
    row: AppRow
    record: AppRecord | None
    inflight: InFlight | None
    stages: tuple[tuple[str, tuple[StepView, ...]], ...]
    applied_yaml: str | None
    diff: tuple[str, ...]  # `plan`'s diff lines, applied spec -> the branch tip's
    lineage: tuple[Lineage, ...]  # newest first
    savepoints: tuple[SavepointView, ...]  # newest first
    transitions: tuple[Transition, ...]  # newest first
    failures: tuple[Transition, ...]  # the history lines that failed or erred, newest first
    live: LiveInfo | None
    # The FlinkSessionCluster the app's job runs on (its applied spec's sessionCluster) and the other apps there.
    session: tuple[str, tuple[str, ...]] | None = None


def _session_cluster(applied: Mapping[str, Any] | None) -> str | None:
    spec = (applied or {}).get("spec") or {}
    name = spec.get("sessionCluster") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else None


@dataclass(frozen=True)
class Overview:
    selection: Selection
    tip: Tip | None
    live: Mapping[str, LiveInfo]
    loading: bool = False


class ReadSide:
    """Everything a page shows, from the one place each thing is kept."""

    def __init__(self, *, journals: Callable[[], Sequence[Journal]], tip: Callable[[], Tip | None],
                 clock: Clock, runtime: Runtime | RuntimesByShard | None = None,
                 pass_states: Callable[[], Mapping[str, tuple[str, str]]] | None = None,
                 source: GitSource | None = None, repo_url: str | None = None, subdir: str = "",
                 policy: Policy | None = None, spec_policy: SpecPolicy = SpecPolicy.RESTRICTED,
                 mode: str = "daemon") -> None:
        self._journals = journals
        self._tip = tip
        self.clock = clock
        self.runtime = runtime
        self._pass_states = pass_states or dict
        self.source = source
        self.repo_url = repo_url
        self.subdir = subdir
        self.policy = policy or Policy()
        self.spec_policy = spec_policy
        self.mode = mode  # "daemon" or "ui" (the read-only command): shown in the page header
        self._rows = RowBuilder()
        self._rows_lock = threading.Lock()
        self._snapshot: tuple[float, Tip | None, list[AppRow]] | None = None  # (built at, for tip, rows)
        self._rebuilding = threading.Event()
        self._live: dict[str, tuple[float, LiveInfo | None]] = {}
        self._subjects: dict[str, str | None] = {}
        self._plan: tuple[str, Plan | None, str | None] | None = None
        self._plan_lock = threading.Lock()
        self._plan_job: tuple[str, threading.Event] | None = None  # the plan being computed: (tip, done)

    # ---- the data -----------------------------------------------------------------------------------

    def tip(self) -> Tip | None:
        return self._tip()

    def _records(self) -> tuple[Records, dict[str, InFlight]]:
        apps: dict[str, AppRecord] = {}
        broken: dict[str, str] = {}
        inflight: dict[str, InFlight] = {}
        for j in self._journals():
            r = j.records()
            apps.update(r.apps)
            broken.update(r.broken)
            try:
                inflight.update(j.all_inflight())
            except ReconcilerError as e:  # one unreadable execution: its app shows as broken, not the page
                log.warning("dashboard: %s", e)
        return Records(apps=apps, broken=broken), inflight

    def rows(self, *, fresh: bool = False) -> tuple[list[AppRow], Tip | None]:
        """Every app's row. Stale-while-revalidate: a snapshot younger than ROWS_TTL_S is served as is; an
        older one is served too while a background rebuild runs (a page polled every second over 10,000 apps
        must not pay a full read each time). A new branch tip, or `fresh`, rebuilds now."""
        tip = self.tip()
        snap = self._snapshot
        if not fresh and snap is not None and _same_tip(snap[1], tip):
            if time.monotonic() - snap[0] > ROWS_TTL_S and not self._rebuilding.is_set():
                self._rebuilding.set()
                threading.Thread(target=self._rebuild_quietly, name="ui-rows", daemon=True).start()
            return snap[2], tip
        return self._rebuild(tip)

    def _rebuild(self, tip: Tip | None) -> tuple[list[AppRow], Tip | None]:
        with self._rows_lock:
            at = time.monotonic()
            records, inflight = self._records()
            rows = self._rows.rows(records, inflight, tip, self._pass_states())
            self._snapshot = (at, tip, rows)
            return rows, tip

    def _rebuild_quietly(self) -> None:
        try:
            self._rebuild(self.tip())
        except Exception:
            log.exception("dashboard: rebuilding the rows failed")
        finally:
            self._rebuilding.clear()

    def warm(self) -> None:
        """Build the rows in the background now, so the first page does not wait for them."""
        self._rebuilding.set()
        threading.Thread(target=self._rebuild_quietly, name="ui-rows", daemon=True).start()

    def overview(self, query: Query) -> Overview:
        """The overview; `loading` (and no rows) while the first read of every record is still running, so
        a page over 10,000 apps answers at once and fills in when they are read."""
        if self._snapshot is None and self._rebuilding.is_set():
            return Overview(select([], query), self.tip(), {}, loading=True)
        rows, tip = self.rows()
        sel = select(rows, query)
        return Overview(sel, tip, self.live([r.name for r in sel.rows]))

    def live(self, names: Sequence[str]) -> dict[str, LiveInfo]:
        """The job of each named app as the runtime shows it now (cached for LIVE_TTL_S); nothing in a dry run.
        A sharded daemon asks each app's own shard's runtime (`runtime` is then a callable: the shards this replica
        holds now, each with the apps it owns)."""
        if self.runtime is None or not names:
            return {}
        now = time.monotonic()
        stale = [n for n in names if (hit := self._live.get(n)) is None or now - hit[0] > LIVE_TTL_S]
        if stale:
            found: dict[str, LiveApp] = {}
            shards = self.runtime() if callable(self.runtime) else [(self.runtime, lambda _n: True)]
            for runtime, owns in shards:
                mine = [n for n in stale if n not in found and owns(n)]
                if not mine:
                    continue
                try:
                    found.update(observe(runtime, mine).apps)
                except ReconcilerError as e:
                    log.warning("dashboard: cannot observe the runtime: %s", e)
            for n in stale:
                la = found.get(n)
                self._live[n] = (now, _live_info(la) if la is not None else None)
        return {n: info for n in names if (info := self._live[n][1]) is not None}

    def subject(self, sha: str | None) -> str | None:
        """A commit's subject line (cached; None when the repository is not known here)."""
        if not sha or self.source is None:
            return None
        if sha not in self._subjects:
            try:
                self._subjects[sha] = self.source.commit_info(sha).subject
            except ReconcilerError:
                self._subjects[sha] = None
        return self._subjects[sha]

    def commit_url(self, sha: str | None) -> str | None:
        return commit_url(self.repo_url, sha)

    def _known(self, name: str) -> bool:
        """Whether `name` can have a row, without building every row: a name in the branch tip's specs (or
        its errors), the last rows, or any journal. So a page for a missing app costs a few lookups (a link
        to a gone app, a scanner), not a rebuild of every row."""
        tip = self.tip()
        if tip is not None and (name in tip.loaded.apps or any(e.app == name for e in tip.loaded.errors)):
            return True
        snap = self._snapshot
        if snap is not None and any(r.name == name for r in snap[2]):
            return True
        for j in self._journals():
            try:
                if j.record(name) is not None or j.inflight(name) is not None or j.history(name):
                    return True
            except ReconcilerError:  # an unreadable record: its row says so
                return True
        return False

    def app(self, name: str) -> AppDetail | None:
        if not self._known(name):
            return None
        rows, tip = self.rows(fresh=True)
        row = next((r for r in rows if r.name == name), None)
        if row is None:
            return None
        journal = self._journal_of(name)
        record = journal.record(name) if journal is not None else None
        inflight = journal.inflight(name) if journal is not None else None
        lineage = tuple(reversed(journal.lineage(name))) if journal is not None else ()
        transitions = tuple(reversed(journal.history(name))) if journal is not None else ()
        applied = record.last_applied_spec if record is not None else None
        changes: tuple[str, ...] = ()
        la = tip.loaded.apps.get(name) if tip is not None else None
        if la is not None and row.state in ("out-of-sync", "error", "blocked"):
            changes = tuple(render.diff_lines(tuple(_redacted(c) for c in diff(applied, la.app.canonical()))))
        finals = frozenset(e.revision for e in lineage if e.action.split(" ")[0] in FINAL_ACTIONS)
        savepoints = tuple(SavepointView(sp.taken_at, savepoint_kind(sp.kind, sp.revision, finals), sp.revision,
                                         sp.path, sp.job_id)
                           for sp in sorted(record.savepoints if record else (), key=lambda s: s.taken_at,
                                            reverse=True))
        return AppDetail(
            row=row, record=record, inflight=inflight,
            stages=step_views(inflight) if inflight is not None else (),
            applied_yaml=yaml.safe_dump(redact_config(applied), sort_keys=False) if applied else None,
            diff=changes, lineage=lineage, savepoints=savepoints, transitions=transitions,
            failures=tuple(t for t in transitions if t.outcome is not None and t.outcome.value in ("failure", "error")),
            live=self.live([name]).get(name),
            session=self._session_of(name, applied),
        )

    def _session_of(self, name: str, applied: Mapping[str, Any] | None) -> tuple[str, tuple[str, ...]] | None:
        cluster = _session_cluster(applied)
        if cluster is None:
            return None
        records, _ = self._records()
        others = tuple(sorted(a for a, r in records.apps.items()
                              if a != name and _session_cluster(r.last_applied_spec) == cluster))
        return cluster, others

    def _journal_of(self, name: str) -> Journal | None:
        journals = list(self._journals())
        for j in journals:
            if j.record(name) is not None or j.history(name) or j.inflight(name) is not None:
                return j
        return journals[0] if journals else None

    def plan(self, wait_s: float = PLAN_WAIT_S) -> tuple[Tip | None, Plan | None, str | None]:
        """The offline plan of the branch tip against its parent, as `flink-reconciler plan --repo R` makes
        it (cached per tip): (tip, plan, why there is none). It is computed in the background: a plan of
        10,000 apps takes longer than a request may, so after `wait_s` this answers (tip, None, None), the
        page says so and refreshes until it is there."""
        tip = self.tip()
        if tip is None or self.source is None:
            return tip, None, "no repository here: the plan needs the branch (give --repo)"
        with self._plan_lock:
            if self._plan is not None and self._plan[0] == tip.revision:
                return tip, self._plan[1], self._plan[2]
            job = self._plan_job
            if job is None or job[0] != tip.revision:
                job = (tip.revision, threading.Event())
                self._plan_job = job
                threading.Thread(target=self._compute_plan, args=(tip, job[1]), name="ui-plan", daemon=True).start()
        if job[1].wait(wait_s):
            with self._plan_lock:
                if self._plan is not None and self._plan[0] == tip.revision:
                    return tip, self._plan[1], self._plan[2]
        return tip, None, None

    def _compute_plan(self, tip: Tip, done: threading.Event) -> None:
        assert self.source is not None
        result: Plan | None = None
        why: str | None = "the plan could not be computed"
        try:
            try:
                parent: str | None = self.source.resolve(tip.revision + "~1")
            except ReconcilerError:
                parent = None
            base = load_at(self.source, parent, self.subdir, policy=SpecPolicy.PERMISSIVE) if parent \
                else LoadResult()
            result = plan(offline_input(base, tip.loaded, base_revision=parent or "0" * 40, revision=tip.revision,
                                        now=self.clock.now(), policy=self.policy))
            why = None
        except ReconcilerError as e:
            why = f"the plan could not be computed: {redact(str(e))}"
        except Exception as e:  # a bug must not leave the page waiting forever
            log.exception("dashboard: computing the plan failed")
            why = f"the plan could not be computed: {type(e).__name__}: {redact(str(e))}"
        finally:
            with self._plan_lock:
                if self._plan_job is not None and self._plan_job[1] is done:
                    self._plan = (tip.revision, result, why)
                    self._plan_job = None
            done.set()


def _same_tip(a: Tip | None, b: Tip | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.revision == b.revision and a.loaded is b.loaded


def _live_info(la: LiveApp) -> LiveInfo:
    cp = la.latest_checkpoint
    return LiveInfo(job_id=la.job_id, state=la.flink_state or la.cluster.value,
                    checkpoint_at=cp.completed_at if cp is not None else None,
                    message=la.job_exception or la.cluster_message)


def _redacted(c: FieldChange) -> FieldChange:
    key = pointer_tokens(c.path)[-1] if c.path else ""
    return c.model_copy(update={"old": redact_config(c.old, key), "new": redact_config(c.new, key)})


PLAN_PER_PAGE = 100  # apps per page of /plan: 10,000 apps' plan is a hundred pages, not one of megabytes


@dataclass(frozen=True)
class PlanBlock:
    """One app's (or session cluster's) part of the plan: its head line and the lines under it."""

    name: str
    action: str
    head: str
    lines: tuple[str, ...]

    @property
    def changes(self) -> bool:
        """Shown open on the page; an unchanged app's block starts closed."""
        return self.action != Action.NOOP.value


@dataclass(frozen=True)
class PlanPage:
    head: tuple[str, ...]  # header, summary, guard
    blocks: tuple[PlanBlock, ...]  # this page's apps, in `plan`'s order; the session clusters on the last page
    apps: int
    page: int
    pages: int
    first: int  # 1-based number of this page's first app
    last: int  # and of its last


def plan_page(p: Plan, page: int, per_page: int = PLAN_PER_PAGE) -> PlanPage:
    """One page of `plan`'s text (`render.to_text`), app by app, secret-looking values in diffs masked."""
    apps = render.sorted_apps(p)
    per = max(1, per_page)
    pages = max(1, -(-len(apps) // per))
    page = min(max(1, page), pages)
    blocks = []
    for a in apps[(page - 1) * per: page * per]:
        head, *lines = render.app_lines(a.model_copy(update={"diff": tuple(_redacted(c) for c in a.diff)}))
        blocks.append(PlanBlock(a.app, a.action.value, head, tuple(lines)))
    if page == pages:
        for c in render.sorted_clusters(p):
            head, *lines = render.cluster_lines(c)
            blocks.append(PlanBlock(c.cluster, c.action.value, head, tuple(lines)))
    return PlanPage(tuple(render.head_lines(p)), tuple(blocks), len(apps), page, pages, (page - 1) * per + 1,
                    min(page * per, len(apps)))

