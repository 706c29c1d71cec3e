#!/usr/bin/env bash
# Build counter.jar with javac against flink-dist from the apache-flink-libraries Python package.
# Usage: ./build.sh [OUTPUT_JAR]      (default: counter.jar next to this script)
# Env:   PYTHON  the Python that has apache-flink-libraries installed (default: python3)
#        FLINK_HOME  use this Flink instead of asking Python
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/counter.jar}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac

if [[ -z "${FLINK_HOME:-}" ]]; then
  py="${PYTHON:-python3}"
  # pyflink is a namespace package in a venv: __file__ is None, __path__ holds the directory.
  FLINK_HOME="$("$py" -c 'import pyflink; print(list(pyflink.__path__)[0])')" || {
    echo "build.sh: cannot import pyflink with $py; install apache-flink-libraries==2.3.0 or set PYTHON/FLINK_HOME" >&2
    exit 1
  }
fi
dist="$(ls "$FLINK_HOME"/lib/flink-dist-*.jar 2>/dev/null | head -n1 || true)"
if [[ -z "$dist" ]]; then
  echo "build.sh: no flink-dist-*.jar under $FLINK_HOME/lib" >&2
  exit 1
fi
command -v javac >/dev/null || { echo "build.sh: javac not found (install openjdk-17-jdk-headless)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/classes"
javac --release 17 -nowarn -cp "$dist" -d "$work/classes" $(find "$here/src" -name '*.java')
printf 'Main-Class: io.flinkreconciler.examples.CounterJob\n' > "$work/manifest.txt"
mkdir -p "$(dirname "$out")"
jar --create --file "$work/counter.jar" --manifest "$work/manifest.txt" -C "$work/classes" .
mv "$work/counter.jar" "$out"
echo "$out"
