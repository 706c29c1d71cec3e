#!/usr/bin/env bash
# Installs what flink-reconciler needs on a fresh Debian/Ubuntu machine: Java 17 (for the local
# runtime and to build the example job) and a virtualenv in .venv with the package and its extras.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

java_ok() { command -v javac >/dev/null 2>&1 && javac -version 2>&1 | grep -qE 'javac (1[7-9]|[2-9][0-9])'; }
if ! java_ok; then
  echo "setup: installing OpenJDK 17 (apt)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-17-jdk-headless >/dev/null
fi

# Debian's chromium: the dashboard's browser tests drive it headless (Playwright's `playwright install` is never
# run: its download is not reachable here). Installed only if missing; the tests skip without it.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing chromium (apt)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null 2>&1; }; then
    echo "setup: chromium could not be installed; the browser tests will skip" >&2
  fi
fi

# Debian's Prometheus and Alertmanager: `promtool test rules` unit-tests deploy/alerts/, and an end-to-end test runs
# both against a daemon (tests/alerting). Installed only if missing; those tests skip, saying why, without them.
if { ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus-alertmanager >/dev/null 2>&1; } \
    && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing prometheus and prometheus-alertmanager (apt)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      --no-install-recommends -o DPkg::Lock::Timeout=600 prometheus prometheus-alertmanager >/dev/null 2>&1; }; then
    echo "setup: prometheus/prometheus-alertmanager could not be installed; the alert rule tests will skip" >&2
  fi
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
log="$(mktemp)"
.venv/bin/python -m pip install -q --upgrade pip >"$log" 2>&1 || true
if ! .venv/bin/python -m pip install -q -e '.[dev,local]' >>"$log" 2>&1; then
  cat "$log" >&2
  echo "setup: pip install failed" >&2
  exit 1
fi
rm -f "$log"
.venv/bin/python -c 'import reconciler, pyflink' || { echo "setup: install failed" >&2; exit 1; }
