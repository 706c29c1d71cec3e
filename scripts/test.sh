#!/usr/bin/env bash
# Installs what the tests need, then runs the static checks and the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k planner`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 0
fi
exit "$rc"
