"""The edge to running systems: what every runtime shares here, one package per runtime below.

Shared by both runtimes (and by the executor, `status`, the daemon):
  ports.py         the seams: the `FlinkApi` and `Runtime` protocols the executor codes against
  flink.py         the only module that talks to Flink's REST API (`FlinkRestClient`)
  flink_errors.py  what Flink's answers mean: the `FlinkRestError` tree (pure)
  observe.py       runtime + REST + storage -> the planner's `LiveState`
  records.py       the `RecordStore` port for per-app records, and its local files backend
  session.py       `SessionRuntime`: many apps' jobs on one shared session cluster, over any `SessionHost`
  artifacts.py     a spec's `jarURI` -> a local file a runtime can upload

The runtimes (import-linter keeps them apart: neither imports the other):
  local/           Flink JVMs on this host (the embedded default)
  kubernetes/      Deployments/StatefulSets, Services, ConfigMaps and Leases through the API server
"""
