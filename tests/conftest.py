"""Fixtures shared across the suite (real Flink: tests/fixtures/flink.py), and how the suite is spread over
pytest-xdist workers (`scripts/test.sh` runs `-n 2`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.fixtures.flink"]

# Every module that starts real Flink JVMs (or a daemon driving them) runs on one worker, one module after the
# other, in file order: two Flink worlds at once on a 2-core machine would push both past their deadlines, and
# a module's tests build on each other through its module-scoped world. Every other module is a unit of its own
# (whole, in order, on whichever worker is free), so the fast tests run beside the Flink ones.
FLINK_GROUP = "real-flink"
_FLINK_MARK = re.compile(r"pytest\.mark\.flink\b")


def flink_modules(root: Path) -> frozenset[str]:
    """The test modules (node id form, relative to the root) that mark tests `flink`."""
    return frozenset(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                     if _FLINK_MARK.search(p.read_text(encoding="utf-8")))


@pytest.hookimpl(optionalhook=True)  # a run without xdist (`-p no:xdist`) does not know this hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """A scope per module, all real-Flink modules one scope. (xdist's own `loadgroup` cannot carry a group
    here: its node id suffix is lost under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    flink = flink_modules(config.rootpath)

    class FlinkApart(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return FLINK_GROUP if module in flink else module

    return FlinkApart(config, log)
