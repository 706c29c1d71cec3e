"""Fixtures shared across the suite (real Flink: tests/fixtures/flink.py), and how the suite is spread over
pytest-xdist workers (`scripts/test.sh` runs `-n 2`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.fixtures.flink"]

# How the suite is spread over the workers. Each module is one unit (whole, in order, on one worker): a module's
# tests build on each other through its module-scoped world. The modules that start real Flink JVMs (or a daemon
# driving them) are the bulk of the suite's time, so one worker (the Flink lane) runs them one after the other, in
# file order, from the start; the other workers run every other module meanwhile and, when none is left, take the
# remaining Flink modules from the end of the list (instead of waiting idle for the lane to finish). So two Flink
# worlds run at once only in the last part of the run, when the fast modules are done: never the lane beside a
# burst of CPU-bound tests plus a second Flink world.
_FLINK_MARK = re.compile(r"pytest\.mark\.flink\b")


def flink_modules(root: Path) -> frozenset[str]:
    """The test modules (node id form, relative to the root) that mark tests `flink`."""
    return frozenset(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                     if _FLINK_MARK.search(p.read_text(encoding="utf-8")))


def pick_scope(queue: list[str], flink: frozenset[str], *, lane: bool) -> str:
    """The next module for a worker, from the modules not yet handed out (`queue`, in xdist's order: most tests
    first; the Flink modules in it in file order). The Flink lane takes the first Flink module, then anything; any
    other worker takes the first other module, then the last Flink module."""
    flinks = [s for s in queue if s in flink]
    others = [s for s in queue if s not in flink]
    if lane:
        return flinks[0] if flinks else others[0]
    return others[0] if others else flinks[-1]


@pytest.hookimpl(optionalhook=True)  # a run without xdist (`-p no:xdist`) does not know this hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's LoadScope (a scope per module, each handed to one worker whole) with our choice of the next module
    (`pick_scope`). (xdist's own `loadgroup` cannot carry a group here: its node id suffix is lost under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    flink = flink_modules(config.rootpath)

    class FlinkLane(LoadScopeScheduling):  # type: ignore[misc]
        lane: Any = None  # the worker that took the first Flink module

        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node: Any) -> None:
            queue = list(self.workqueue)
            if self.lane is None and any(s in flink for s in queue):
                self.lane = node
            flink_in_file_order = sorted(s for s in queue if s in flink)
            ordered = flink_in_file_order + [s for s in queue if s not in flink]
            scope = pick_scope(ordered, flink, lane=node is self.lane)
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    return FlinkLane(config, log)
