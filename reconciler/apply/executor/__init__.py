"""The executor: runs each app's planned steps against a Runtime, journaled and resumable.

Per step: the journal marks it started *before* anything happens outside and done *after* it completed;
each step has its own deadline on the injected clock; transient errors are retried with capped exponential
backoff until that deadline. Every step handler is idempotent given the journal's scratch data, so a retry
within this process and a resume after a crash are the same code path.

Built in layers, one concern per module, each a class extending the one beneath and calling only what is
beneath it (import-linter keeps it so):
  entry.py       `Executor`: `run`, `run_app`, `resume`, `resume_all`; apps in parallel, each one's failure its own
  stages.py      one execution's state machine: forward steps; abort, rollback, park or interrupted on a failure;
                 each stage's steps journaled, with deadline and retries
  steps.py       a handler per step kind (cluster, stop-with-savepoint, cancel, start, await, standby, takeover)
  jobmanager.py  the dead-JobManager probe, and the restart of processes killed while a step waits
  execution.py   what every layer shares: wiring, one execution's bookkeeping, spec/jar/job look-ups, the poll-wait
  events.py      what an execution tells its callers: `StepEvent` (progress), `AppResult` (per app)
"""

from reconciler.apply.executor.entry import Executor
from reconciler.apply.executor.events import AppResult, EventPhase, StepEvent

__all__ = ["AppResult", "EventPhase", "Executor", "StepEvent"]
