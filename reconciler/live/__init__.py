"""The edge to running systems: Flink REST, runtimes (local JVMs, Kubernetes)."""
