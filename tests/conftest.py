"""Fixtures shared across the suite (real Flink: tests/fixtures/flink.py), and how the suite is spread over
pytest-xdist workers (`scripts/test.sh` runs `-n 2 --dist loadgroup`)."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.fixtures.flink"]

# Every module that starts real Flink JVMs (or a daemon driving them) runs on one worker, one module after the
# other, in file order: two Flink worlds at once on a 2-core machine would push both past their deadlines, and
# a module's tests build on each other through its module-scoped world. Every other module is a group of its
# own (whole, in order, on whichever worker is free), so the fast tests run beside the Flink ones.
FLINK_GROUP = "real-flink"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "no":
        return
    flink_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("flink")}
    for item in items:
        module = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(FLINK_GROUP if module in flink_modules else module))
