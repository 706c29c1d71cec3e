"""The kubernetes runtime: each app's Flink cluster as Kubernetes objects, reached through the API server.

  api.py             the API client and its error mapping; the only module that imports `kubernetes`
  runtime.py         `KubernetesRuntime`: server-side apply, observe by label, prune, drift, delete by cascade
  standby.py         the warm standby (a second cluster at the new spec), mixed into the runtime
  sessions.py        FlinkSessionClusters: the `SessionHost` half of the runtime, mixed in too
  session_runtime.py the `SessionRuntime` that `make_runtime` builds over the runtime
  operator.py        the Apache Flink operator's FlinkDeployments, for a takeover (mixed in)
  records.py         app records as ConfigMaps: compare-and-set, fenced by the Lease
  lease.py           leader election on a Lease (the daemon's and each shard's)
  quota.py           does a second cluster fit the namespace's ResourceQuotas
Pure (no I/O; an import-linter contract says so):
  render.py          FlinkApp -> objects (plain dicts), byte-identical for the same inputs
  status.py          what pods, workloads and HA ConfigMaps say about an app's clusters
  generations.py     an app's cluster generations: the root's pointers and one cycle's lists
  storage.py         what a stateful app needs to run here without losing or rewinding its state
"""
