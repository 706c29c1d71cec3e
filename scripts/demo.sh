#!/usr/bin/env bash
# The README's main command: set up, turn examples-repo/ into a real Git repo with the example job's
# jar committed, apply it on the local runtime (real Flink JVMs on this host) and print the status.
#   bash scripts/demo.sh          set up and apply (again: re-applies the demo repo's HEAD)
#   bash scripts/demo.sh down     delete every demo app (final savepoints are taken) and stop Flink
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEMO="${DEMO_DIR:-$PWD/demo}"
REPO="$DEMO/gitops"
STATE="$DEMO/state"
FR=(.venv/bin/flink-reconciler)

bash scripts/setup.sh

if [ "${1:-}" = "down" ]; then
  [ -d "$REPO" ] || { echo "nothing to tear down ($REPO does not exist)"; exit 0; }
  git -C "$REPO" rm -q -r --ignore-unmatch apps
  git -C "$REPO" commit -q -m "demo: remove every app" || true
  "${FR[@]}" apply --repo "$REPO" --path apps --state-dir "$STATE" --prune --allow-mass-delete
  echo "all demo apps deleted; rm -rf $DEMO removes the demo repo and its savepoints"
  exit 0
fi

if [ ! -d "$REPO/.git" ]; then
  mkdir -p "$DEMO"
  cp -r examples-repo "$REPO"
  PYTHON=.venv/bin/python bash "$REPO/jobs/counter/build.sh" "$REPO/jobs/counter/counter.jar" >/dev/null
  git -C "$REPO" init -q -b main
  git -C "$REPO" add -A
  git -C "$REPO" -c user.name=demo -c user.email=demo@localhost commit -q -m "demo: example apps"
  echo "created the demo GitOps repo $REPO"
fi
"${FR[@]}" apply --repo "$REPO" --path apps --state-dir "$STATE"
