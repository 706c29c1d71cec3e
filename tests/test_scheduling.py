"""How tests/conftest.py hands modules to the pytest-xdist workers: the Flink lane runs the real-Flink modules in
file order; the other workers run the rest first and only then take Flink modules, from the end."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import flink_modules, pick_scope

FLINK = frozenset({"tests/e2e/test_a.py", "tests/e2e/test_b.py", "tests/e2e/test_c.py"})


def hand_out(queue: list[str], lane: bool) -> str:
    scope = pick_scope(queue, FLINK, lane=lane)
    queue.remove(scope)
    return scope


def test_the_lane_takes_flink_modules_in_file_order_and_the_others_the_rest_first_then_flink_from_the_end() -> None:
    queue = ["tests/e2e/test_a.py", "tests/e2e/test_b.py", "tests/e2e/test_c.py", "tests/core/test_x.py",
             "tests/core/test_y.py"]
    assert hand_out(queue, lane=True) == "tests/e2e/test_a.py"
    assert hand_out(queue, lane=False) == "tests/core/test_x.py"
    assert hand_out(queue, lane=False) == "tests/core/test_y.py"
    assert hand_out(queue, lane=False) == "tests/e2e/test_c.py"  # nothing else left: the last Flink module
    assert hand_out(queue, lane=True) == "tests/e2e/test_b.py"
    assert queue == []


def test_the_lane_takes_other_modules_once_the_flink_ones_are_handed_out() -> None:
    queue = ["tests/e2e/test_a.py", "tests/core/test_x.py"]
    assert hand_out(queue, lane=True) == "tests/e2e/test_a.py"
    assert hand_out(queue, lane=True) == "tests/core/test_x.py"


def test_the_flink_modules_are_found_by_their_mark() -> None:
    found = flink_modules(Path(__file__).resolve().parents[1])
    assert "tests/e2e/test_apply_e2e.py" in found and "tests/live/test_flink_rest.py" in found
    assert "tests/core/test_planner.py" not in found and "tests/test_scheduling.py" not in found
