"""`python -m reconciler.cli`: the same as the `flink-reconciler` command."""

from reconciler.cli import main

raise SystemExit(main())
