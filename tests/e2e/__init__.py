"""End-to-end tests: Git repo -> `flink-reconciler apply` -> real Flink JVMs on this host."""
