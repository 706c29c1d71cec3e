"""The executor's entry points: `run` a plan's apps, `resume` what a crashed process left in flight.

How one execution proceeds is in the layers beneath (`stages`, `steps`, `jobmanager`; see the package's
docstring). Here: apps are independent. `run` executes them on a bounded thread pool and one app's failure or
bug becomes that app's FAILURE, never the others'. A `BaseException` that is not an `Exception`
(KeyboardInterrupt, SystemExit, a test's simulated crash) is deliberately not caught: it models the process
dying, and the journal is what a later `resume` continues from.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from reconciler.apply.executor.events import AppResult
from reconciler.apply.executor.stages import Stages
from reconciler.apply.journal import InFlight
from reconciler.core.observed import Outcome
from reconciler.core.plan import Action, AppPlan, Plan
from reconciler.errors import FencedError, ReconcilerError, ShutdownRequested
from reconciler.live.records import is_record_name
from reconciler.logs import log_context

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


class Executor(Stages):
    """Runs plans and resumes executions: the executor's entry points."""

    # ---- entry points ---------------------------------------------------------------------------

    def run(self, plan: Plan) -> dict[str, AppResult]:
        """Execute every app of the plan that has something to do, concurrently and independently.

        Apps with an unfinished execution in the journal must be resumed first (`resume_all`): their new
        plan was computed against a half-done state, so they are refused (FAILURE, nothing touched); one that
        `resume_all` parked (a stop whose outcome is unknown) is refused so until its transition ends."""
        todo = [a for a in plan.apps if a.action is not Action.NOOP]
        self._stamp_revision(plan.revision)
        return self._parallel(todo, lambda a: a.app, lambda a: self._guarded(a.app, a.action,
                                                                            lambda: self.run_app(plan.revision, a)))

    def run_app(self, revision: str, app_plan: AppPlan) -> AppResult:
        if app_plan.action in (Action.BLOCKED, Action.ERROR, Action.NOOP):
            return self._not_executed(revision, app_plan)
        pending = self.journal.inflight(app_plan.app)
        if pending is not None:
            return AppResult(app=app_plan.app, action=app_plan.action, outcome=Outcome.FAILURE, failed_step=None,
                             message=f"not started: an unfinished execution of revision {pending.revision[:12]} "
                                     f"({pending.plan.action.value}) is still in flight; it is resumed first")
        self.journal.begin(app_plan.app, revision, app_plan)
        return self._drive(app_plan.app)

    def resume(self, app: str) -> AppResult | None:
        """Continue the app's execution left in the journal by a crashed process (None: nothing to do)."""
        pending = self.journal.inflight(app)
        if pending is None:
            return None
        self._stamp_revision(pending.revision)
        return self._drive(app)

    def resume_all(self) -> dict[str, AppResult]:
        """Resume every in-flight execution, those of one revision at a time (the runtime stamps it)."""
        by_revision: dict[str, list[InFlight]] = {}
        for i in self.journal.all_inflight().values():
            by_revision.setdefault(i.revision, []).append(i)
        results: dict[str, AppResult | None] = {}
        for _, pending in sorted(by_revision.items()):  # resume() stamps the group's revision
            results.update(self._parallel(
                pending, lambda i: i.app, lambda i: self._guarded(i.app, i.plan.action, lambda: self.resume(i.app))))
        return {k: v for k, v in results.items() if v is not None}

    def _stamp_revision(self, revision: str) -> None:
        """The one place a runtime that stamps its objects with the revision (Kubernetes) learns it; the Runtime
        protocol keeps it out of every call. A resumed execution stamps its own: another one (a new replica's
        "unknown", an older pass's) changes a Deployment's annotations, which rolls its pods (a warm standby's
        session cluster restarted, a just-submitted job's JobManager too)."""
        if hasattr(self.runtime, "revision"):
            self.runtime.revision = revision

    def _parallel(self, items: list[T], key: Callable[[T], str], fn: Callable[[T], R]) -> dict[str, R]:
        if not items:
            return {}
        crash: BaseException | None = None
        results: dict[str, R] = {}
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(items)),
                                thread_name_prefix="apply") as pool:
            futures = [(key(i), pool.submit(fn, i)) for i in items]
            for name, fut in futures:
                try:
                    results[name] = fut.result()
                except BaseException as e:  # a simulated/real crash in one worker: re-raised below
                    crash = crash or e
        if crash is not None:
            raise crash
        return results

    def _guarded(self, app: str, action: Action, fn: Callable[[], R]) -> R | AppResult:
        """Turn anything an app's execution raises (a journal error, a bug outside the steps) into
        that app's FAILURE. Its in-flight record, if any, is left alone: finishing it here could
        drop a half-done upgrade that only a resume can complete safely."""
        try:
            with log_context(app=app):  # every line this app's execution logs names it
                return fn()
        except ShutdownRequested:
            # The process stops while a step waits: the step stays in flight, as it is, and resumes at the next start.
            # Said in the app's history (best effort: the process is going away either way).
            inf = self.journal.inflight(app)
            if inf is not None:
                with contextlib.suppress(ReconcilerError):
                    self.journal.note(app, "parked", f"shutdown while step {inf.step_index + 1} ({inf.stage.value}) "
                                      "waited: it stays in flight and resumes at the next start",
                                      revision=inf.revision, outcome=Outcome.PENDING)
            raise
        except FencedError as e:  # deposed: stop here; the leader resumes from the record
            log.warning("%s: stopped, this replica may no longer act: %s", app, e)
            return AppResult(app=app, action=action, outcome=Outcome.FAILURE, failed_step=None,
                             message=f"stopped: {e}")
        except Exception as e:
            log.exception("applying %s failed unexpectedly", app)
            message = f"internal error: {type(e).__name__}: {e}"
            return AppResult(app=app, action=action, outcome=Outcome.FAILURE, failed_step=None, message=message)

    def _not_executed(self, revision: str, app_plan: AppPlan) -> AppResult:
        """No-op: nothing to record. Blocked / invalid: record the attempt, touch nothing live."""
        outcome = Outcome.SUCCESS
        if app_plan.action is not Action.NOOP:
            outcome = Outcome.ERROR if app_plan.action is Action.ERROR else Outcome.FAILURE
        # An error of a file that names no app (its plan entry is the file's path) has no record to keep; an app
        # whose record cannot be read keeps it as it is (never written over: it is what a human repairs).
        if (app_plan.action is not Action.NOOP and is_record_name(app_plan.app)
                and app_plan.app not in self.journal.broken()):
            self.journal.record_attempt(app_plan.app, revision, outcome, app_plan.reason,
                                        action=app_plan.action.value, source_file=app_plan.source_file)
        return AppResult(app=app_plan.app, action=app_plan.action, outcome=outcome, failed_step=None,
                         message=app_plan.reason)
