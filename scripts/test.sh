#!/usr/bin/env bash
# Installs what the tests need, then runs the static checks and the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k planner`). FLINK_RECONCILER_TEST_WORKERS sets
# how many pytest-xdist workers run (default 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports

# Did the caller select tests? Paths and node ids that exist, -k, -m, --deselect, --ignore*, --lf.
filtered=0
for arg in "$@"; do
  case "$arg" in
    -k*|-m*|--deselect*|--ignore*|--lf|--last-failed) filtered=1 ;;
    -*) ;;
    *) if [ -e "${arg%%::*}" ]; then filtered=1; fi ;;
  esac
done

# Two workers (tests/conftest.py: one runs the real-Flink modules in file order, the other the rest of the suite,
# then the last Flink modules); the caller's own -n wins (e.g. `-n 0` for one process). The slowest tests are
# listed at the end.
set +e
.venv/bin/python -m pytest -n "${FLINK_RECONCILER_TEST_WORKERS:-2}" --durations=25 "$@"
rc=$?
set -e
# pytest exits 5 when it collected nothing. A filter that matches nothing is the caller's business;
# a bare run that finds no tests means the suite is broken (moved, misconfigured) and must fail.
if [ "$rc" -eq 5 ] && [ "$filtered" -eq 1 ]; then
  echo "pytest collected no tests (filtered by the arguments given)" >&2
  exit 0
fi
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
fi
exit "$rc"
