pytest_plugins = ["tests.fixtures.flink"]
