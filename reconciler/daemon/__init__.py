"""The long-running daemon: scheduler, webhook receiver, health/metrics endpoints, single-instance lock."""
