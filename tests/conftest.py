"""Fixtures shared across the suite (real Flink: tests/fixtures/flink.py)."""

pytest_plugins = ["tests.fixtures.flink"]
