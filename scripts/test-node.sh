#!/usr/bin/env bash
# The node lane (opt-in, not part of scripts/test.sh): the Kubernetes tests on a real kubelet and real containers.
# Brings the node lab up (scripts/k8s-node-lab.sh: it needs the Kubernetes binaries in K8S_LAB_BIN, root and
# containerd/runc/CNI, see its header), then runs tests/kubernetes with FLINK_RECONCILER_TEST_KUBECONFIG set: the
# API tests against the real API server, the e2e modules (test_*_e2e.py) with their pods on the node. Extra
# arguments go to pytest (e.g. `bash scripts/test-node.sh tests/kubernetes/test_flink_on_k8s_e2e.py`).
# Without the binaries it says why and exits 0: a machine without a node lab skips the lane, loudly.
# `K8S_NODE_LAB_KEEP=1` leaves the lab up afterwards (default: `down`, the host as it was).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${K8S_LAB_BIN:-/tmp/k8s-lab/bin}
missing=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  [ -x "$BIN/$b" ] || missing+=("$b"); done
[ -x "$BIN/etcd" ] || [ -x "$BIN/lab-etcd" ] || missing+=(etcd)
if [ ${#missing[@]} -gt 0 ] || [ "$(id -u)" != 0 ]; then
  echo "################################################################################"
  echo "# NODE LANE SKIPPED: ${missing[*]:+no ${missing[*]} in K8S_LAB_BIN=$BIN}$([ "$(id -u)" != 0 ] && echo ' (needs root)')"
  echo "# (the official Kubernetes release binaries; see docs/kubernetes.md, 'On a real node')"
  echo "################################################################################"
  exit 0
fi
bash scripts/setup.sh >/dev/null
was_up=0; bash scripts/k8s-node-lab.sh status >/dev/null 2>&1 && was_up=1
bash scripts/k8s-node-lab.sh up
set +e
FLINK_RECONCILER_TEST_KUBECONFIG=${K8S_LAB_DIR:-/tmp/k8s-lab}/admin.kubeconfig \
  .venv/bin/python -m pytest -p no:xdist -rs --durations=25 "${@:-tests/kubernetes}"
rc=$?
set -e
[ "$was_up" = 1 ] || [ "${K8S_NODE_LAB_KEEP:-0}" = 1 ] || bash scripts/k8s-node-lab.sh down
exit $rc
