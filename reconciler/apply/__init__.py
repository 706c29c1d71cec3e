"""The imperative shell that changes the world: the journaled, resumable executor of plans.

  executor/          runs each app's planned steps against a runtime, in layers: entry (run, resume), stages
                     (the state machine: forward, abort, rollback, park, interrupted), steps (a handler per step
                     kind), jobmanager (the dead-JobManager probe), execution (what they share), events
  journal/           the per-app records, in parts under one `Journal`: document (the schema, pure), access
                     (store, cache, compare-and-set, lock), history, inflight (the write-ahead step log),
                     app_record (attempts, adoption, health), retention (savepoint pruning and disposal)
  rescale.py         the `RescaleInPlace` step: a new parallelism for the running job, with its fallback
  operator_steps.py  the `SuspendOperatorDeployment` step of a takeover from the Flink Kubernetes Operator
  retry.py           the backoff of transient step errors (exponential, capped, no jitter)
  migrate.py         imports 0.1's SQLite journal into per-app records, once

import-linter keeps the executor's layers in order, the journal's document pure, the journal apart from the
executor, and both reached from outside apply/ through their packages only. Each package's module map is in
its `__init__`.
"""
