"""Fixtures shared across the suite (real Flink: tests/fixtures/flink.py)."""

import pytest

pytest_plugins = ["tests.fixtures.flink"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run every real-Flink test in one xdist worker (scripts/test.sh runs two): its module-scoped clusters start
    once, and two Flink clusters never compete for this machine's 2 cores while the other worker runs the rest."""
    for item in items:
        if item.get_closest_marker("flink") is not None:
            item.add_marker(pytest.mark.xdist_group("flink"))
