"""The dead-JobManager probe, and the restart of processes killed while a step waits.

Without high availability a JobManager killed mid-upgrade (kill -9) takes its jobs with it and nothing
restarts it: a step waiting for a savepoint or for the new job would wait until its deadline with the app
down, then park or roll back onto a dead cluster. The probe ends such a step at once (JobManagerGoneError),
and the stage reports the execution as interrupted, so the next pass restarts the app from its newest state.
A TaskManager killed mid-upgrade leaves a savepoint refused or a new job waiting for slots that nothing would
bring back (an app in flight gets no repair plan): `_restart_missing` restarts it on the live cluster.
"""

from __future__ import annotations

import logging

from reconciler.apply.executor.execution import ExecutorBase, Run
from reconciler.core.observed import ClusterPhase
from reconciler.core.plan import EnsureCluster, SpecRef, StartStandbyCluster, Step, StopWithSavepoint
from reconciler.errors import JobManagerGoneError, ReconcilerError

log = logging.getLogger(__name__)


class JobManagerProbe(ExecutorBase):
    """Is the JobManager dead for good; restart what was killed."""

    def _jobmanager_alive(self, run: Run, *, new_spec_too: bool = False) -> None:
        """Raise JobManagerGoneError when the app's JobManager is dead and the app has no HA (kill -9 mid-upgrade):
        its jobs are gone with it, so waiting for a savepoint or a job until the step's deadline, then parking or
        rolling back onto that cluster, would keep the app down. The job's state is in its retained checkpoints."""
        # HA of the spec the cluster may run: the previous one (the stop), or either once the new one may have started.
        refs = [SpecRef.PREVIOUS, *([SpecRef.DESIRED] if new_spec_too and run.plan.desired else [])]
        if run.plan.previous is None or any(self._spec(run, r).spec.high_availability.enabled for r in refs):
            return
        try:
            info = self.runtime.observe(run.app)
        except ReconcilerError:
            return
        if info.phase is ClusterPhase.FAILED and not info.session:
            raise JobManagerGoneError(f"the JobManager is not running ({info.message or 'dead'}); without high "
                                      "availability its jobs are gone with it")

    def _fail_fast_if_jobmanager_died(self, run: Run, step: Step) -> None:
        """After a failed attempt of a forward step: a dead JobManager that nothing restarts (local processes) will
        not answer before the deadline either, so the step ends now (JobManagerGoneError), not minutes later with
        the app down meanwhile. Not a cluster being started (the spec's own doing); the stop probes on its own. On
        Kubernetes a FAILED JobManager is crash-looping on the new spec: the usual failure path."""
        if self.runtime.restarts_processes or isinstance(step, EnsureCluster | StartStandbyCluster |
                                                           StopWithSavepoint):
            return
        self._jobmanager_alive(run, new_spec_too=True)

    def _restart_missing(self, run: Run, waiting: str, *, default: SpecRef | None = None) -> None:
        """A step waiting for the job's tasks (a savepoint refused because they are not running; a new job waiting
        for slots) may wait for a process killed during the upgrade: restart it on the live cluster, at the spec
        that cluster runs (by hash; else `default`), so Flink can run the tasks before the step's deadline. Nothing
        else would: an app in flight gets no repair plan. A cluster of another spec is left alone."""
        missing: tuple[str, ...] = ()
        try:
            info = self.runtime.observe(run.app)
            missing = info.missing
            if not missing or info.phase is ClusterPhase.FAILED:
                return
            refs = [r for r, raw in ((SpecRef.PREVIOUS, run.plan.previous), (SpecRef.DESIRED, run.plan.desired))
                    if raw]
            ref = next((r for r in refs if self._spec(run, r).spec_hash == info.spec_hash), default)
            if ref is None or ref not in refs:
                return
            self.runtime.ensure_cluster(self._spec(run, ref), deadline=self.clock.monotonic() + self.cleanup_deadline_s,
                                        keep_running=True)
        except ReconcilerError as e:  # the step's own waiting goes on; the next look tries again
            log.warning("%s: could not restart %s while %s: %s", run.app, ", ".join(missing), waiting, e)
            return
        self.journal.note(run.app, "repair", f"restarted {', '.join(missing)} while {waiting}", revision=run.revision)
