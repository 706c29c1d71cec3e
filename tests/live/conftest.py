"""Real-Flink fixtures are registered in tests/conftest.py."""
