"""The pure core: observed-state models, diff, planner, plan and its renderings. No I/O here."""
