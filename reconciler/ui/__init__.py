"""The read-only web dashboard: the apps, their transitions and their state history, over the same records
`status` and `history` read.

Served by the daemon's HTTP server (same port) and by `flink-reconciler ui`. Nothing here writes: the pages
show what the journal, the branch tip and (when there is one) the runtime say, and each action is offered
as the CLI command to copy. Layers: cli > daemon > ui > service (import-linter).
"""
