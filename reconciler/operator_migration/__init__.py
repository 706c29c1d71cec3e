"""Moving over from the Apache Flink Kubernetes Operator (docs/migrate-from-flink-operator.md), pure.

- `application`: an application-mode FlinkDeployment -> FlinkApp (and what every converter shares: findings,
  configuration flattening, Flink 1.x key renames, memory and CPU readings).
- `session`: a session-mode FlinkDeployment -> FlinkSessionCluster, a FlinkSessionJob -> FlinkApp on it.
- `documents`: which document of an input becomes what.
- `status`: what a FlinkDeployment's status says for a takeover (may it be taken over, is the suspend done).

The takeover's plan is `core.takeover`'s; its live side is `live.kubernetes.operator` (the runtime) and
`apply.operator_steps` (the suspend step); the `import` command's file side is `cli.operator_import`.
"""
