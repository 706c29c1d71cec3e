"""The reconcile pass: Git -> specs -> observe -> plan -> execute -> report. Used by `apply` and `run`.

This is the imperative shell around the pure planner. Each outside system is reached through its own
module (source.git, live.*, apply.journal, report.*); this module only sequences them and decides
which commit statuses to post.

Just over 600 lines for one concern, sequencing a pass; what it builds from settings is `factories.py`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from reconciler.apply.executor import AppResult, Executor, StepEvent
from reconciler.apply.journal import Journal, broken_reason
from reconciler.clock import Clock
from reconciler.core.context import FAILED_BEFORE
from reconciler.core.observed import (
    AppRecord,
    ClusterPhase,
    JobPhase,
    LiveApp,
    LiveState,
    Outcome,
    Records,
    SavepointRecord,
)
from reconciler.core.plan import Action, AppPlan, Plan, reason_key
from reconciler.core.planner import ADOPTED_RUNNING, Desired, PlanInput, Policy, desired_from
from reconciler.core.session_planner import plan_with_sessions
from reconciler.errors import ConfigError, ObserveError, PlanStaleError, ReconcilerError, SpecError
from reconciler.live.artifacts import resolve_jar
from reconciler.live.observe import observe, with_operator_deployments
from reconciler.live.ports import Runtime, StandbyCapacity, StandbyRuntime
from reconciler.logs import log_context
from reconciler.redaction import redact_url
from reconciler.report.reporter import Reporter
from reconciler.report.status import LINEAGE_PREFIX, CommitStatus
from reconciler.service import sessions
from reconciler.service.health import pass_facts
from reconciler.service.ports import APP_STATES, AppHealth, AutoscaleHook, PassMetrics
from reconciler.service.sharding import Shard, shard_view
from reconciler.source.git import GitSource
from reconciler.source.specs import spec_paths
from reconciler.spec.load import SPEC_SUFFIXES, LoadResult, load_files
from reconciler.spec.model import ChangeClass, FlinkApp, JobState
from reconciler.spec.policy import SpecPolicy
from reconciler.terminal import terminal_safe

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassResult:
    revision: str
    plan: Plan
    results: dict[str, AppResult] = field(default_factory=dict)
    resumed: dict[str, AppResult] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        bad = {Outcome.FAILURE, Outcome.ERROR}
        return not any(r.outcome in bad for r in (*self.results.values(), *self.resumed.values()))


class Reconciler:
    """One repository + one runtime + one journal. Thread-safe: passes run one at a time."""

    def __init__(
        self,
        *,
        source: GitSource,
        runtime: Runtime | None,
        journal: Journal,
        clock: Clock,
        subdir: str = "",
        policy: Policy | None = None,
        reporter: Reporter | None = None,
        metrics: PassMetrics | None = None,
        target_url: str | None = None,
        max_parallel: int = 4,
        on_event: Callable[[StepEvent], None] | None = None,
        artifact_cache: Path | None = None,
        leader: Callable[[], bool] | None = None,
        on_shutdown: Callable[[], None] | None = None,
        runtime_name: str | None = None,
        spec_policy: SpecPolicy = SpecPolicy.RESTRICTED,
        shard: Shard | None = None,
    ) -> None:
        self.shard = shard  # sharding (daemon/shards.py): only the apps of this shard are loaded, seen, planned
        self.source = source
        self.runtime = runtime
        self.journal = journal
        self.clock = clock
        self.subdir = subdir
        self.policy = policy or Policy()
        self.reporter = reporter
        self.metrics = metrics
        self.target_url = target_url
        self.max_parallel = max_parallel
        self.on_event = on_event
        self.artifact_cache = artifact_cache or journal.path.parent / "artifacts"
        self._lock = threading.Lock()
        self._loaded: LoadResult | None = None
        self._loaded_rev: str | None = None
        self._last_error: str | None = None
        self.leader = leader  # None: no election, always reconcile
        self._on_shutdown = on_shutdown
        self._leading = False  # whether the last sync found us leader (a new term re-reads every record)
        self._recovered: dict[str, tuple[SavepointRecord, ...]] | None = None  # lineage read from git notes
        self.runtime_name = runtime_name or (runtime.name if runtime is not None else "local")
        self.spec_policy = spec_policy  # what a spec may ask of the cluster (docs/security.md)
        self._problems: dict[tuple[str, str], tuple[SpecError, ...]] = {}
        self._said: dict[str, tuple[tuple[str, str], str]] = {}  # app -> the blocked/error status said (_stable)
        self._states: dict[str, tuple[str, str]] = {}  # app -> (state, why) after the last pass that planned it
        self._waiting: dict[str, tuple[str, str]] = {}  # app -> (state, why) last logged while it was not ok
        self._observed: PlanInput | None = None  # what the acting pass planned from (its apps' health facts)
        # spec.autoscale (service/autoscale.py): sampled and decided after each pass of the daemon
        self.autoscaler: AutoscaleHook | None = None

    # ------------------------------------------------------------------ ReconcileService

    def sync(self, *, full: bool, reason: str) -> None:
        """Fetch, then reconcile what changed (or everything on the drift pass). A pass that raised is
        remembered (readiness) and the next one is a full pass even when Git did not move: skipping it
        as "nothing changed" would report a still-broken daemon as healthy."""
        if self.leader is not None and not self.leader():
            log.debug("standby: another replica holds the lease; not reconciling (%s)", reason)
            if self._leading and isinstance(self.metrics, AppHealth):  # deposed: the leader's health is the truth
                self.metrics.forget_owner(str(self.shard or ""))
            self._leading = False
            return
        if self.leader is not None and not self._leading:
            # A new term: another replica may have written records (and left a transition in flight)
            # since we last looked; never act on what we cached as a standby or in an earlier term.
            self.journal.refresh()
            self._leading = True
        start = self.clock.monotonic()
        try:
            fetched = self.source.fetch()
        except ReconcilerError as e:
            self._last_error = f"git fetch failed: {e}"
            if self.metrics:
                self.metrics.observe_git_fetch(self.clock.monotonic() - start, error=type(e).__name__)
            raise
        if self.metrics:
            self.metrics.observe_git_fetch(self.clock.monotonic() - start)
        full = full or self._last_error is not None
        head = fetched.new_sha
        if fetched.rewritten:
            log.warning("history rewritten on %s: reloading every spec at %s", self.source.branch, head[:12])
            self._loaded = None
        if not full and head == self._loaded_rev and not self.journal.all_inflight():
            self._autoscale(head)
            return
        try:
            only = None if full else self._changed_apps(head)
            with log_context(revision=head[:12]):
                self.apply(head, only=only)
        except Exception as e:
            self._last_error = f"the pass at {head[:12]} failed: {type(e).__name__}: {e}"
            raise
        self._last_error = None
        self._autoscale(head)

    def _autoscale(self, head: str) -> None:
        """The autoscaler's tick after a pass; a commit it made to the branch is reconciled at once (an in-place
        rescale when only the parallelism changed), like a push. Its trouble never fails the pass."""
        if self.autoscaler is None or self.runtime is None:
            return
        try:
            made = self.autoscaler.tick(head)
        except Exception:
            log.exception("autoscaling failed in this pass")
            return
        if made is not None:
            self.sync(full=False, reason=made)

    def readiness(self) -> tuple[bool, str]:
        """Not ready while the last pass failed (its fetch or the pass itself); the daemon adds "not
        before the first pass completed"."""
        if self._last_error:
            return False, redact_url(self._last_error)
        if self.runtime is not None:
            try:
                self.runtime.list_clusters()
            except ReconcilerError as e:
                return False, f"runtime {self.runtime.name} unusable: {e}"
        role = "" if self.leader is None else (" (leader)" if self.leader() else " (standby)")
        at = self._loaded_rev[:12] if self._loaded_rev else "nothing fetched yet"
        return True, f"ok{role}: {redact_url(self.source.url)} at {at}"

    def shutdown(self, *, deadline_s: float) -> None:
        """Wait for the running pass (every step is journaled, so a pass cut short resumes next start)."""
        if self._on_shutdown:
            self._on_shutdown()
        if self._lock.acquire(timeout=max(0.0, deadline_s)):
            self._lock.release()
        else:
            log.warning("shutdown: a pass is still running after %.0fs; it resumes from the journal on restart",
                        deadline_s)
        if self.reporter:
            self.reporter.close(timeout=min(5.0, max(0.1, deadline_s)))

    # ------------------------------------------------------------------ planning

    def load(self, rev: str, changed: set[str] | None = None) -> LoadResult:
        """Specs at `rev`: incremental from the last loaded revision when there is one. `changed`: the
        spec paths changed since then, when the caller already asked Git."""
        if self._loaded is not None and self._loaded_rev is not None:
            if rev == self._loaded_rev:
                return self._loaded
            if changed is None:
                changed = self._changed_paths(rev)
            result = self._loaded.update(spec_paths(self.source.read_paths(rev, sorted(changed))),
                                         parse=self._own_files())
        else:
            result = load_files(spec_paths(self.source.read_tree(rev, self.subdir, SPEC_SUFFIXES)),
                                policy=self.spec_policy, keep=self.shard.owns if self.shard else None,
                                parse=self._own_files())
        self._loaded, self._loaded_rev = result, rev
        return result

    def _own_files(self) -> frozenset[str]:
        """A shard parses the files its apps came from even when their lines now name another shard's app:
        a file that broke, or whose app was renamed, must still protect (or delete) the app it held."""
        return self.journal.source_files() if self.shard is not None else frozenset()

    def _changed_paths(self, rev: str) -> set[str]:
        assert self._loaded_rev is not None
        return {p for p in self.source.changed_paths(self._loaded_rev, rev, self.subdir) if p.endswith(SPEC_SUFFIXES)}

    def _changed_apps(self, head: str) -> set[str] | None:
        old = self._loaded
        if old is None or self._loaded_rev is None:
            return None
        changed = self._changed_paths(head)
        new = self.load(head, changed)
        names = {la.app.name for p in changed for fr in (old.by_file.get(p), new.by_file.get(p)) if fr
                 for la in fr.apps}
        names |= {e.app for e in new.errors if e.app and e.file in changed}
        names |= {n for n, r in self.journal.records().apps.items() if r.source_file in changed}
        names |= set(self.journal.all_inflight())
        return names

    def recovered_lineage(self) -> dict[str, tuple[SavepointRecord, ...]]:
        """Savepoints named by the lineage lines of git notes (any clone has them), read once per process:
        the fallback when an app's record is gone (a lost state dir, a record deleted by hand)."""
        if self._recovered is None:
            try:
                notes = self.source.read_notes()
            except ReconcilerError as e:
                log.warning("could not read the lineage in git notes (%s); planning from records and live "
                            "state only", redact_url(str(e)))
                notes = {}
            self._recovered = lineage_from_notes(notes)
            if self.shard is not None:
                self._recovered = {a: sps for a, sps in self._recovered.items() if self.shard.owns(a)}
        return self._recovered

    def plan_input(self, rev: str, *, only: Collection[str] | None = None, track_health: bool = False) -> PlanInput:
        """What the planner needs at `rev`. `track_health` (a pass that may act): remember in each app's record
        since when its job is not running healthy, which the recovery grace period counts from."""
        loaded = self.load(rev)
        records = self.journal.records()
        # The notes are a fallback: read them (a fetch from origin) only when some app of this revision
        # has no savepoint on record, never in a steady state where every record knows its own.
        if self._recovered is not None or any(
                not (r := records.get(name)) or not r.savepoints for name in loaded.apps):
            records = with_recovered(records, self.recovered_lineage())
        previous: dict[str, FlinkApp] = {}
        unusable: dict[str, str] = {}
        for name, rec in records.apps.items():
            if rec.last_applied_spec:
                try:
                    previous[name] = FlinkApp.model_validate(rec.last_applied_spec)
                except ValidationError as e:  # a record edited by hand: that app waits, the others go on
                    first = e.errors()[0]
                    unusable[name] = broken_reason(name, f"{self.journal.store.where}: the applied spec on record "
                                                         f"of app {name!r} is not a valid FlinkApp ({e.error_count()} "
                                                         f"error(s), first: {first['loc']}: {first['msg']})")
        if unusable:
            records = records.model_copy(update={"broken": {**records.broken, **unusable}})
        sessions.prepare(self.runtime, loaded, previous)  # which app runs on which session cluster
        names = set(loaded.apps) | set(previous) | {e.app for e in loaded.errors if e.app} | set(records.broken)
        if only is not None:
            names &= set(only)
        desired = desired_from(loaded)
        refused = self.runtime_problems(loaded)
        if refused:
            desired = dataclasses.replace(desired, errors=desired.errors + refused)
        live = observe(shard_view(self.runtime, self.shard), names)
        # A takeover from the Flink Kubernetes Operator (core.takeover): its FlinkDeployments, for apps it concerns.
        live = with_operator_deployments(self.runtime, live, {n: a for n, a in desired.apps.items() if n in names},
                                         known={n for n, r in records.apps.items() if r.ran_here})
        if track_health:
            records = self._track_health(records, live, previous)
        return PlanInput(
            revision=rev,
            desired=desired,
            previous=previous,
            previous_sources={n: r.source_file for n, r in records.apps.items() if r.source_file},
            live=live,
            records=records,
            now=self.clock.now(),
            # warm standby only where the runtime can run two clusters of an app (the plan says which)
            policy=dataclasses.replace(self.policy, warm_standby=isinstance(self.runtime, StandbyRuntime),
                                       standby_refused=self._standby_refused(desired, previous, names)),
            mode="live",
        )

    def _track_health(self, records: Records, live: LiveState, previous: dict[str, FlinkApp]) -> Records:
        """Write `unhealthy_since` where it changed (a job seen down for the first time, or running again); an app
        mid-transition is skipped (its job is down on purpose) and so is one that cannot be observed."""
        apps = dict(records.apps)
        now = self.clock.now()
        for name, rec in records.apps.items():
            prev = previous.get(name)
            la = live.get(name)
            if prev is None or prev.spec.job.state is not JobState.RUNNING or la.cluster is ClusterPhase.UNKNOWN:
                continue
            if self.journal.inflight(name) is not None:
                continue
            healthy = la.job is JobPhase.RUNNING
            if healthy and self._late_repair(name, rec, la):
                apps[name] = rec.model_copy(update={"last_outcome": Outcome.SUCCESS, "job_id": la.job_id})
            if healthy == (rec.unhealthy_since is None):
                continue
            try:
                self.journal.mark_health(name, healthy=healthy)
            except ReconcilerError as e:  # only the grace period's start is lost: the next pass writes it
                log.warning("%s: cannot record its health: %s", name, e)
            apps[name] = apps[name].model_copy(update={"unhealthy_since": None if healthy else now})
        return Records(apps=apps) if apps != records.apps else records

    def _late_repair(self, name: str, rec: AppRecord, la: LiveApp) -> bool:
        """A failed repair whose job runs and has checkpointed since (its first checkpoint came after the step's
        deadline, as on a loaded machine): recorded as recovered. Any other failure stays until Git changes."""
        if rec.last_action != Action.REPAIR.value or rec.last_outcome is not Outcome.FAILURE:
            return False
        if (rec.last_message or "").startswith(FAILED_BEFORE):
            # Not the repair's failure: the answer given since about Git's failed spec, while the repair of the last
            # applied spec succeeded (core.heal.heal_previous). Recording "recovered" would flip-flop every pass.
            return False
        if la.job_id is None or la.job_id not in (rec.job_id, *rec.job_ids) or la.latest_checkpoint is None:
            return False
        try:
            self.journal.mark_recovered(name, job_id=la.job_id, message=(
                f"recovered: job {la.job_id} runs and completed checkpoint {la.latest_checkpoint.path} after the "
                "repair's deadline"))
        except ReconcilerError as e:
            log.warning("%s: cannot record that its repair recovered: %s", name, e)
            return False
        log.info("%s: the repair's job runs and checkpoints now: recovered", name)
        return True

    def _standby_refused(self, desired: Desired, previous: dict[str, FlinkApp], names: set[str]) -> dict[str, str]:
        """Apps whose changed spec could not get a warm standby now (the namespace quota): planned cold. Asked
        only for apps whose spec changed, so an unchanged repository costs no request."""
        if not isinstance(self.runtime, StandbyCapacity):
            return {}
        changed = [a for n, a in desired.apps.items()
                   if n in names and n in previous and previous[n].spec_hash != a.spec_hash]
        if not changed:
            return {}
        try:
            return self.runtime.standby_refusals(changed)
        except ObserveError as e:  # the standby's own check still runs when it starts
            log.warning("cannot check whether warm standbys fit: %s", e)
            return {}

    def plan(self, rev: str, *, only: Collection[str] | None = None) -> Plan:
        return self._plan(rev, only=only)

    def _plan(self, rev: str, *, only: Collection[str] | None = None, track_health: bool = False,
              keep_input: bool = False) -> Plan:
        """The plan of `rev`, session clusters included (core/session_planner.py). `keep_input`: remember what it
        was planned from, for the apps' health facts after the pass."""
        inp = self.plan_input(rev, only=only, track_health=track_health)
        if keep_input:
            self._observed = inp
        return plan_with_sessions(inp, sessions.observe(self.runtime, self.load(rev)), only=only)

    def runtime_problems(self, loaded: LoadResult) -> tuple[SpecError, ...]:
        """What the runtime refuses to run, as errors of those apps (an ERROR action: never destructive),
        so a spec Kubernetes cannot run safely (state not on durable storage, no HA for a stateful app, a
        jar in the repository) is refused by the plan instead of failing at its first step. Cached per spec."""
        if self.runtime_name != "kubernetes":
            return ()
        from reconciler.live.kubernetes.render import kubernetes_problems
        from reconciler.live.kubernetes.storage import runs_on_kubernetes

        out: list[SpecError] = []
        cache: dict[tuple[str, str], tuple[SpecError, ...]] = {}
        for la in loaded.apps.values():
            if not runs_on_kubernetes(la.app, self.runtime_name):
                continue
            key = (la.file, la.app.spec_hash)
            found = self._problems.get(key)
            if found is None:
                found = tuple(SpecError(p.message, file=la.file, line=la.line, field=p.field, app=la.app.name)
                              for p in kubernetes_problems(la.app))
            cache[key] = found
            out.extend(found)
        self._problems = cache
        return tuple(out)

    # ------------------------------------------------------------------ applying

    def apply(self, rev: str | None = None, *, saved: Plan | None = None,
              only: Collection[str] | None = None) -> PassResult:
        """Resume what a crash left, then plan `rev` (or take `saved`) and execute it."""
        with self._lock:
            executor = self._executor()
            if self.runtime is not None:  # a resumed job on a session cluster must be found there
                applied: dict[str, dict[str, object] | None] = {
                    n: r.last_applied_spec for n, r in self.journal.records().apps.items()}
                applied.update({n: inf.plan.desired or inf.plan.previous
                                for n, inf in self.journal.all_inflight().items()})
                sessions.prepare_from_records(self.runtime, applied)
            pending = self.journal.all_inflight()  # what each resumed execution was (its status names it)
            resumed = executor.resume_all()
            for name, res in resumed.items():
                record = self.journal.record(name)  # a resumed execution belongs to the revision it began at
                inf = pending.get(name)
                self._report_result(record.last_attempted_revision if record else rev, res,
                                    inf.plan if inf is not None else None)
            if saved is not None:
                the_plan = self._check_saved(saved)
            else:
                assert rev is not None
                the_plan = self._plan(rev, only=only, track_health=self.runtime is not None, keep_input=True)
            if self.leader is not None and not self.leader():
                log.warning("lost the lease while planning %s: nothing executed", the_plan.revision[:12])
                return PassResult(the_plan.revision, the_plan, {}, resumed)
            broken = self.journal.broken()
            for ap in the_plan.apps:
                if ap.source_file and ap.app not in broken:
                    self.journal.set_source_file(ap.app, ap.source_file)
            # An app resumed in this pass has reported its outcome; a plan made before its transition
            # ended is refused by the executor and would only bury that report.
            self._report_plan(the_plan, incremental=only is not None, skip=set(resumed))
            results = executor.run(the_plan)
            for res in results.values():
                if res.app not in resumed:
                    self._report_result(the_plan.revision, res, the_plan.app(res.app))
            if the_plan.clusters:  # session clusters go after their apps (their jobs' final savepoints)
                sessions.run_clusters(self.runtime, the_plan, {n: r.outcome for n, r in results.items()},
                                      deadline=self.clock.monotonic() + 120.0)
            self._after_run(the_plan, results)
            self._track_states(the_plan, {**resumed, **results}, full=only is None)
            return PassResult(the_plan.revision, the_plan, results, resumed)

    def _track_states(self, the_plan: Plan, results: dict[str, AppResult], *, full: bool) -> None:
        """Each app's state after this pass, for /metrics (`flink_reconciler_apps`) and the status page. A full
        pass plans every app and replaces them all; an incremental one updates the apps it planned."""
        states = {ap.app: app_state(ap, results.get(ap.app)) for ap in the_plan.apps}
        for ap in the_plan.apps:  # one log line when an app starts or stops waiting, not one per pass
            state, why = states[ap.app]
            before = self._states.get(ap.app)
            waiting = "recovering" if ap.repair == "recovering" else state
            was = self._waiting.get(ap.app)
            if waiting != "ok" and (was is None or was[0] != waiting or reason_key(was[1]) != reason_key(why)):
                if waiting == "recovering":
                    log.info("%s: %s", ap.app, why)
                else:
                    log.warning("%s: %s: %s", ap.app, waiting, why)
                self._waiting[ap.app] = (waiting, why)
            elif waiting == "ok" and was is not None and before is not None:
                log.info("%s: ok again (was %s)", ap.app, was[0])
                self._waiting.pop(ap.app, None)
        self._states = states if full else {**self._states, **states}
        if self.metrics:
            counts = {s: 0 for s in APP_STATES}
            for state, _ in self._states.values():
                counts[state] += 1
            self.metrics.set_app_states(counts, owner=str(self.shard or ""))
        inp, self._observed = self._observed, None
        if isinstance(self.metrics, AppHealth) and inp is not None and inp.revision == the_plan.revision:
            specs = {n: la.app for n, la in self._loaded.apps.items()} if self._loaded is not None else {}
            self.metrics.app_health(
                pass_facts(the_plan, results, inp, specs=specs, broken=self.journal.broken(),
                           record=self.journal.record, repair_window=self.policy.repair_window),
                full=full, owner=str(self.shard or ""))

    def status_text(self) -> str:
        """The status page's app lines: how many apps are in which state, and why each one that is not ok."""
        counts = {s: 0 for s in APP_STATES}
        for state, _ in self._states.values():
            counts[state] += 1
        head = "apps" + (f" of {self.shard}" if self.shard else "")
        lines = [f"{head}: {len(self._states)} after the last pass ("
                 + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"]
        unreadable = sorted(a for a in self.journal.broken() if a in self._states)
        if unreadable:
            lines.append(f"records that cannot be read: {len(unreadable)} ({', '.join(unreadable[:20])}"
                         + (" ..." if len(unreadable) > 20 else "") + ")")
        shown = [(a, st, why) for a, (st, why) in sorted(self._states.items()) if st != "ok"]
        for app, state, why in shown[:50]:
            lines.append(f"  {state:8} {app}: {terminal_safe(why[:400], newlines=False)}")  # one line each
        if len(shown) > 50:
            lines.append(f"  ... and {len(shown) - 50} more")
        return "\n".join(lines) + "\n"

    def app_states(self) -> dict[str, tuple[str, str]]:
        """app -> (one of APP_STATES, why) after the last pass that planned it (the dashboard's blocked/error)."""
        return dict(self._states)

    def loaded(self) -> tuple[str, LoadResult] | None:
        """The revision the last pass loaded (the branch tip as this process last saw it) and its specs."""
        loaded, rev = self._loaded, self._loaded_rev
        return (rev, loaded) if loaded is not None and rev is not None else None

    def drop_states(self) -> None:
        """This reconciler no longer owns its apps (a shard lost): they are no longer counted here."""
        self._states = {}
        if self.metrics:
            self.metrics.set_app_states({}, owner=str(self.shard or ""))
        if isinstance(self.metrics, AppHealth):
            self.metrics.forget_owner(str(self.shard or ""))

    def _check_saved(self, saved: Plan) -> Plan:
        if saved.mode != "live":
            raise ConfigError("this plan is an offline preview (computed without live state); "
                              "run `plan --live --out FILE` to get a plan that can be applied")
        current = self.plan_input(saved.revision)
        if current.live.fingerprint() != saved.live_fingerprint:
            raise PlanStaleError(
                f"the live state changed since this plan was made (fingerprint {saved.live_fingerprint} -> "
                f"{current.live.fingerprint()}); plan again")
        records = self.journal.records()
        for ap in saved.apps:
            rec = records.get(ap.app)
            if rec and rec.last_attempted_revision and self.journal.inflight(ap.app):
                raise PlanStaleError(f"app {ap.app} has an unfinished execution; plan again")
        return saved

    def _after_run(self, the_plan: Plan, results: dict[str, AppResult]) -> None:
        for ap in the_plan.apps:
            if ap.action is Action.NOOP and ap.diff and ap.desired and ap.change_class is ChangeClass.IGNORE:
                self.journal.record_applied(ap.app, the_plan.revision, ap.desired)
            elif ap.action is Action.NOOP and ap.reason == ADOPTED_RUNNING and ap.desired:
                self.journal.record_adopted(ap.app, the_plan.revision, ap.desired, source_file=ap.source_file)
        for name, res in results.items():
            ap = the_plan.app(name)
            if ap.action is Action.DELETE and res.outcome is Outcome.SUCCESS:
                self.journal.mark_deleted(name)
            if self.metrics and res.outcome is Outcome.SUCCESS:
                self.metrics.set_applied_revision(name, the_plan.revision)
            if ap.action is Action.REPAIR:
                if self.metrics:
                    self.metrics.count_repair(ap.repair or "job", res.outcome)
                level = logging.INFO if res.outcome is Outcome.SUCCESS else logging.WARNING
                log.log(level, "%s: repair of %s: %s: %s", name, ap.repair or "job", res.outcome.value, res.message)
            if self.metrics:
                for step, secs in res.step_timings:
                    self.metrics.observe_step(step, secs)
                self.metrics.observe_reconcile(name, sum(s for _, s in res.step_timings), res.outcome)
        if self.metrics:
            self.metrics.set_inflight_steps(len(self.journal.all_inflight()))

    def _executor(self) -> Executor | _DryExecutor:
        if self.runtime is None:
            return _DryExecutor()
        return Executor(self.runtime, self.journal, self.clock, resolve_jar=self._resolve_jar,
                        max_parallel=self.max_parallel, on_event=self.on_event)

    def _resolve_jar(self, app: FlinkApp) -> Path | None:
        # The jar of the desired spec comes from the revision being applied; a rollback's (previous) spec
        # from the revision it was applied at, so a rollback never runs the new jar by accident.
        # A resumed execution's desired spec (resume_all runs before this pass loads anything) is its own
        # revision's: its jar may not exist at the revision applied before it.
        rev = self._loaded_rev
        loaded = self._loaded.apps.get(app.name) if self._loaded else None
        if loaded is None or loaded.app.canonical() != app.canonical():
            inf = self.journal.inflight(app.name)
            if inf is not None and inf.plan.desired is not None and inf.plan.desired == app.canonical():
                rev = inf.plan.desired_revision or inf.revision  # a repair of the last applied spec: its revision
            else:
                rec = self.journal.record(app.name)
                rev = rec.last_applied_revision if rec and rec.last_applied_revision else rev
        uri = app.spec.job.jar_uri
        if "://" not in uri and not uri.startswith("/"):
            assert rev is not None
            return self.source.materialize(rev, uri, self.artifact_cache / "git")
        return resolve_jar(uri, repo_root=None, cache_dir=self.artifact_cache / "http",
                           sha256=app.spec.job.jar_sha256)

    # ------------------------------------------------------------------ reporting

    def _status(self, revision: str, app: str, state: Outcome, description: str, *,
                res: AppResult | None = None) -> None:
        if self.reporter is not None:
            self.reporter.report(self._commit_status(revision, app, state, description, res=res))

    def _commit_status(self, revision: str, app: str, state: Outcome, description: str, *,
                       res: AppResult | None = None) -> CommitStatus:
        status = CommitStatus(revision=revision, app=app, state=state, description=description,
                              target_url=self.target_url)
        if res is not None and (res.restored_from is not None or res.savepoints):
            status = CommitStatus(revision=revision, app=app, state=state, target_url=self.target_url,
                                  restored_from=res.restored_from, savepoints=res.savepoints, at=self.clock.now(),
                                  description="")
            status = dataclasses.replace(status, description=f"{description} ({status.lineage_text()})")
        return status

    def _report_plan(self, the_plan: Plan, *, incremental: bool, skip: Collection[str] = ()) -> None:
        if self.reporter is None:
            return
        rev = the_plan.revision
        out: list[CommitStatus] = []
        for ap in the_plan.apps:
            if ap.app in skip:
                continue
            if ap.action is Action.ERROR:
                out.append(self._commit_status(rev, ap.app, Outcome.ERROR, self._stable(rev, ap.app, ap.reason)))
            elif ap.action is Action.BLOCKED:
                rec = self.journal.record(ap.app)
                if rec and ap.repair is None and (
                        (rec.last_outcome is Outcome.FAILURE and rec.last_attempted_revision == rev)
                        or rec.failed_revision == rev):
                    # this commit already shows why it failed (and, after a repair of the last applied spec, that
                    # it runs again); "blocked" would only bury that
                    continue
                out.append(self._commit_status(rev, ap.app, Outcome.FAILURE,
                                               self._stable(rev, ap.app, "blocked: " + ap.reason)))
            elif ap.action is Action.NOOP:
                if incremental:  # a wait before healing the last applied spec: this commit's spec still failed
                    out.append(self._commit_status(rev, ap.app, Outcome.FAILURE if ap.failed else Outcome.SUCCESS,
                                                   ap.reason))
            else:  # a repair of the last applied spec because this commit's failed: the commit stays failed
                out.append(self._commit_status(rev, ap.app, Outcome.FAILURE if ap.failed else Outcome.PENDING,
                                               _pending_text(ap)))
        self.reporter.report_many(out)  # one batch: one note push for the whole pass

    def _stable(self, revision: str, app: str, text: str) -> str:
        """The words first said for this answer: a reason said again with other numbers (an age that grew) is
        the same status, which the reporter then does not post again (one note, not one per drift pass)."""
        key = (revision, reason_key(text))
        said = self._said.get(app)
        if said is not None and said[0] == key:
            return said[1]
        self._said[app] = (key, text)
        return text

    def _report_result(self, revision: str | None, res: AppResult, ap: AppPlan | None = None) -> None:
        if revision is None or res.action in (Action.ERROR, Action.BLOCKED, Action.NOOP):
            return
        if self.leader is not None and not self.leader():
            return  # a deposed replica reports nothing: the leader finishes the transition and reports it
        if ap is not None and ap.failed:  # both facts: this commit's spec failed; the last applied one runs again
            self._status(revision, res.app, Outcome.FAILURE, healed_text(ap, res), res=res)
        else:
            self._status(revision, res.app, res.outcome, res.message, res=res)
        if self._recovered is not None:  # keep the fallback current without re-reading every note
            for path in res.savepoints:
                sp = SavepointRecord(path=path, taken_at=self.clock.now(), revision=revision)
                self._recovered = {**self._recovered, res.app: (*self._recovered.get(res.app, ()), sp)}


def lineage_from_notes(notes: dict[str, str]) -> dict[str, tuple[SavepointRecord, ...]]:
    """The savepoints that lineage lines of git notes name, per app, oldest first."""
    found: dict[str, list[SavepointRecord]] = {}
    for commit, text in notes.items():
        for line in text.splitlines():
            if not line.startswith(LINEAGE_PREFIX):
                continue
            app, _, body = line[len(LINEAGE_PREFIX):].partition(": ")
            try:
                doc = json.loads(body)
                at = datetime.fromisoformat(doc["at"]) if doc.get("at") else None
                paths = [p for p in doc.get("savepoints") or () if isinstance(p, str) and p]
            except (ValueError, TypeError, KeyError, AttributeError):
                log.warning("ignoring an unreadable lineage line on commit %s: %.200s", commit[:12], line)
                continue
            if at is None:
                continue
            for path in paths:
                found.setdefault(app, []).append(SavepointRecord(path=path, taken_at=at, revision=commit))
    return {app: tuple(sorted(sps, key=lambda s: s.taken_at)) for app, sps in found.items()}


def with_recovered(records: Records, recovered: dict[str, tuple[SavepointRecord, ...]]) -> Records:
    """Records, plus what git notes say for apps whose record knows no savepoint (or is gone).

    A record that has savepoints is trusted as is: it also knows which ones retention disposed of."""
    apps = dict(records.apps)
    for app, sps in recovered.items():
        rec = apps.get(app)
        if rec is None:
            apps[app] = AppRecord(name=app, savepoints=sps)
        elif not rec.savepoints:
            apps[app] = rec.model_copy(update={"savepoints": sps})
    return records.model_copy(update={"apps": apps}) if apps != records.apps else records


def app_state(ap: AppPlan, res: AppResult | None) -> tuple[str, str]:
    """One of APP_STATES, and why: what the plan said, or how its execution ended."""
    if ap.action is Action.BLOCKED:
        return "blocked", ap.reason
    if ap.action is Action.ERROR or (res is not None and res.outcome is Outcome.ERROR):
        return "error", res.message if res is not None else ap.reason
    if res is not None and res.outcome is Outcome.FAILURE:
        return "failure", res.message
    return "ok", res.message if res is not None else ap.reason


def healed_text(ap: AppPlan, res: AppResult) -> str:
    """The status of a repair of the last applied spec, on a commit whose spec failed: both facts, what runs first
    (a forge shows the first 140 characters)."""
    assert ap.failed is not None
    spec = f"the last applied spec (revision {ap.desired_revision[:12]})" if ap.desired_revision else \
        "the last applied spec"
    if res.outcome is Outcome.SUCCESS:
        return (f"{spec[0].upper()}{spec[1:]} runs again" + (f": job {res.job_id}" if res.job_id else "")
                + f"; {ap.failed} (not retried until Git changes it)")
    return f"{ap.failed}; and the repair of {spec} failed too: {res.message}"


def _pending_text(ap: AppPlan) -> str:
    return f"{ap.action.value}: {ap.reason}"


class _DryExecutor:
    """dry_run: no runtime. Plans are computed and reported, nothing is executed."""

    def resume_all(self) -> dict[str, AppResult]:
        return {}

    def run(self, the_plan: Plan) -> dict[str, AppResult]:
        return {}
