#!/usr/bin/env bash
# k8s-node-lab.sh up|down|status: a one-node Kubernetes on this machine, for running the Kubernetes e2e tests
# (tests/kubernetes) on real containers: containerd + runc + a CNI bridge + kubelet + kube-scheduler + the
# workload controllers + kube-proxy (nftables), a cluster DNS, a local-path PV provisioner and the API server
# reachable from pods (tests/kubernetes/node_lab/services.py). See docs/kubernetes.md, "On a real node".
#
# It never builds Kubernetes: it takes the binaries from K8S_LAB_BIN (default /tmp/k8s-lab/bin):
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl, and etcd (or lab-etcd)
# The official release binaries have these names (https://dl.k8s.io/release/v1.36.2/bin/linux/amd64/<name>;
# etcd from github.com/etcd-io/etcd releases). It installs Debian's containerd, runc, CNI plugins, nftables
# and gcc with apt-get when they are missing.
#
# Control plane: when an API server already answers with K8S_LAB_DIR/admin.kubeconfig (default /tmp/k8s-lab, the
# layout of a lab started before: certs/ca.{crt,key}, admin.kubeconfig) it is reused; otherwise etcd,
# kube-apiserver and kube-controller-manager are started from the binaries with a new CA in that directory.
#
# `up` is idempotent (starts what is not running). K8S_NODE_LAB_DEDICATED=1 taints the node
# node-lab.flink-reconciler.io/dedicated:NoSchedule: on a control plane others use too, only pods that tolerate
# it (the e2e apps do) run on it. `down` stops only what `up` started (PIDs in its state
# directory), kills the pods' containers, and restores the host: sysctls, nft tables, mounts, the cni0 bridge,
# kubelet's cgroups and directories; the Node object and the lab's PVs are deleted. The containerd image store
# lives in the state directory and goes with it (images are re-imported after the next `up`).
#
# Needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN, cgroups (v1 with cpu/memory/pids, or v2) and the kernel's
# overlay, bridge, veth and nftables support. CAP_SYS_RESOURCE is not needed (containerd's
# restrict_oom_score_adj keeps runc from writing a negative oom_score_adj, which needs it).
set -euo pipefail
CMD=${1:-status}
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=${K8S_LAB_BIN:-/tmp/k8s-lab/bin}
CP=${K8S_LAB_DIR:-/tmp/k8s-lab}
STATE=${K8S_NODE_LAB_STATE:-/var/lib/k8s-node-lab}
RUN=/run/k8s-node-lab
PY=${PYTHON:-$REPO/.venv/bin/python}
BRIDGE=cni0 POD_SUBNET=10.244.0.0/24 BRIDGE_IP=10.244.0.1 SERVICE_CIDR=10.96.0.0/16
SYSCTLS="net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.conf.all.route_localnet"
HOSTDIRS="/var/log/containers /var/log/pods /var/lib/cni /run/netns /etc/cni"
SOCK=$RUN/containerd.sock
KCFG=$CP/admin.kubeconfig
NODE_NAME=$(hostname)
TAINT=node-lab.flink-reconciler.io/dedicated   # K8S_NODE_LAB_DEDICATED=1: other API users' pods stay Pending

die() { echo "k8s-node-lab: $*" >&2; exit 1; }
ours() { [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q -- "$2"; }
pid_of() { awk -v n="$1" '$1 == n {print $2}' "$STATE/pids" 2>/dev/null | tail -n1; }
running() { local p; p=$(pid_of "$1"); [ -n "$p" ] && ours "$p" "$2"; }
launch() {   # launch <name> <match> <cmd...>: start detached unless running; PID into $STATE/pids
  local name=$1 match=$2; shift 2
  if running "$name" "$match"; then echo "$name: running ($(pid_of "$name"))"; return 0; fi
  setsid nohup "$@" >>"$STATE/logs/$name.log" 2>&1 </dev/null &
  local pid=$!
  { grep -v "^$name " "$STATE/pids" || true; echo "$name $pid"; } >"$STATE/pids.new"; mv "$STATE/pids.new" "$STATE/pids"
  echo "$name: started ($pid)"
}
waitfor() { local what=$1 n=$2; shift 2; for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  die "$what not ready after ${n}s (logs: $STATE/logs)"; }
kctl() { "$BIN/kubectl" --kubeconfig "$KCFG" "$@"; }
put() {   # put <file>: stdin into the file only when it differs (kube-proxy exits when its config file changes)
  local tmp; tmp=$(mktemp); cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}
etcd_bin() { if [ -x "$BIN/etcd" ]; then echo "$BIN/etcd"; elif [ -x "$BIN/lab-etcd" ]; then echo "$BIN/lab-etcd"; fi; }

preflight() {
  [ "$(id -u)" = 0 ] || die "needs root"
  local eff; eff=$((16#$(awk '/^CapEff/ {print $2}' /proc/self/status)))
  (( eff & (1 << 21) )) || die "needs CAP_SYS_ADMIN (mounts, namespaces)"
  (( eff & (1 << 12) )) || die "needs CAP_NET_ADMIN (bridge, veth, nftables)"
  if (( eff & (1 << 24) )); then echo "CAP_SYS_RESOURCE: present"; else
    echo "CAP_SYS_RESOURCE: absent (containerd runs with restrict_oom_score_adj = true)"; fi
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then CGROUP=v2
    for c in cpu memory pids; do grep -qw "$c" /sys/fs/cgroup/cgroup.controllers || die "cgroup v2 lacks the $c controller"; done
  else CGROUP=v1
    for c in cpu cpuacct memory pids cpuset; do
      [ -d "/sys/fs/cgroup/$c" ] && [ -w "/sys/fs/cgroup/$c" ] || die "cgroup v1 controller $c is not mounted writable at /sys/fs/cgroup/$c"
    done
  fi
  [ -w /proc/sys/net/ipv4/ip_forward ] || die "/proc/sys is read-only (net.ipv4.ip_forward must be set for Services)"
  grep -qw overlay /proc/filesystems || die "the kernel lacks overlayfs (containerd's snapshotter)"
  local missing=()
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
    [ -x "$BIN/$b" ] || missing+=("$b"); done
  [ -n "$(etcd_bin)" ] || missing+=(etcd)
  [ ${#missing[@]} = 0 ] || die "missing in K8S_LAB_BIN=$BIN: ${missing[*]} (the official Kubernetes release binaries of
  the same names, https://dl.k8s.io/release/v1.36.2/bin/linux/amd64/<name>; etcd from github.com/etcd-io/etcd releases)"
  [ -x "$PY" ] || die "needs the project's virtualenv ($PY): bash scripts/setup.sh"
  "$PY" -c 'import dnslib' 2>/dev/null || "$PY" -m pip install -q dnslib
  local pkgs=()
  command -v containerd >/dev/null || pkgs+=(containerd)
  command -v runc >/dev/null || pkgs+=(runc)
  [ -x /usr/lib/cni/bridge ] || pkgs+=(containernetworking-plugins)
  command -v nft >/dev/null || pkgs+=(nftables)
  command -v gcc >/dev/null || pkgs+=(gcc libc6-dev)
  command -v openssl >/dev/null || pkgs+=(openssl)
  if [ ${#pkgs[@]} -gt 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}"; fi
}

save_host() {   # once per up/down cycle: what `down` restores
  [ -f "$STATE/host/sysctls" ] && return 0
  mkdir -p "$STATE/host"
  for s in $SYSCTLS; do v=$(sysctl -n "$s" 2>/dev/null) && echo "$s=$v"; done >"$STATE/host/sysctls"
  nft list tables 2>/dev/null | sort >"$STATE/host/nft-tables" || true
  for d in $HOSTDIRS; do [ -e "$d" ] && echo "$d"; done >"$STATE/host/dirs" || true
  ip link show "$BRIDGE" >/dev/null 2>&1 && echo yes >"$STATE/host/bridge-existed" || true
}

cert() {   # cert <name> <subject> <extendedKeyUsage> [subjectAltName]: signed by the lab CA
  local d=$CP/certs; [ -f "$d/$1.crt" ] && return 0
  openssl req -new -newkey rsa:2048 -nodes -keyout "$d/$1.key" -subj "$2" -out "$d/$1.csr" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n%s\n' \
    "$3" "${4:+subjectAltName=$4}" >"$d/$1.ext"
  openssl x509 -req -in "$d/$1.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 3650 -sha256 \
    -extfile "$d/$1.ext" -out "$d/$1.crt" 2>/dev/null
}

control_plane() {   # reuse a running API server, or start etcd + kube-apiserver from the binaries
  if [ -f "$KCFG" ] && kctl get --raw /readyz >/dev/null 2>&1; then
    echo "control plane: reusing the API server of $KCFG"; OWN_CP=0; return 0; fi
  OWN_CP=1; mkdir -p "$CP/certs"; local d=$CP/certs
  [ -f "$d/ca.crt" ] || openssl req -x509 -new -nodes -newkey rsa:2048 -keyout "$d/ca.key" -out "$d/ca.crt" \
    -days 3650 -subj /CN=k8s-node-lab-ca 2>/dev/null
  cert apiserver /CN=kube-apiserver serverAuth "IP:127.0.0.1,IP:10.96.0.1,IP:$BRIDGE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin "/O=system:masters/CN=kubernetes-admin" clientAuth
  [ -f "$d/sa.key" ] || { openssl genrsa -out "$d/sa.key" 2048 2>/dev/null; openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null; }
  if [ ! -f "$KCFG" ]; then
    kctl config set-cluster lab --server=https://127.0.0.1:6443 --certificate-authority="$d/ca.crt" --embed-certs=true >/dev/null
    kctl config set-credentials admin --client-certificate="$d/admin.crt" --client-key="$d/admin.key" --embed-certs=true >/dev/null
    kctl config set-context lab --cluster=lab --user=admin >/dev/null; kctl config use-context lab >/dev/null
  fi
  put "$STATE/etcd.yaml" <<EOF
name: node-lab
data-dir: $STATE/etcd
listen-client-urls: http://127.0.0.1:2379
advertise-client-urls: http://127.0.0.1:2379
listen-peer-urls: http://127.0.0.1:2380
initial-advertise-peer-urls: http://127.0.0.1:2380
initial-cluster: node-lab=http://127.0.0.1:2380
EOF
  local e; e=$(etcd_bin)
  if [ "$(basename "$e")" = etcd ]; then launch etcd "$e" "$e" --config-file "$STATE/etcd.yaml"
  else launch etcd "$e" "$e" "$STATE/etcd.yaml"; fi
  waitfor etcd 60 curl -fs http://127.0.0.1:2379/health
  launch kube-apiserver "$BIN/kube-apiserver" "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=6443 \
    --tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" --client-ca-file="$d/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$d/sa.pub" --service-account-signing-key-file="$d/sa.key" \
    --authorization-mode=RBAC --service-cluster-ip-range=$SERVICE_CIDR --allow-privileged=true \
    --endpoint-reconciler-type=none
  waitfor kube-apiserver 120 curl -fs --cacert "$d/ca.crt" https://127.0.0.1:6443/readyz
}

containerd_up() {
  mkdir -p "$STATE/containerd" "$STATE/cni/net.d" "$RUN"
  put "$STATE/containerd/config.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$RUN/containerd"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "k8s-node-lab/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
  put "$STATE/cni/net.d/10-node-lab.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "node-lab", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$STATE/cni/ipam", "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$BRIDGE_IP"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  launch containerd "containerd --config $STATE" containerd --config "$STATE/containerd/config.toml"
  waitfor containerd 30 ctr --address "$SOCK" version
  if ! ctr --address "$SOCK" -n k8s.io images ls -q | grep -q '^docker.io/k8s-node-lab/pause:1$'; then
    local b=$STATE/pause-build; mkdir -p "$b/rootfs"
    gcc -static -O2 -o "$b/rootfs/pause" "$REPO/tests/kubernetes/node_lab/pause.c"
    tar --numeric-owner -C "$b/rootfs" -cf "$b/layer.tar" pause
    (cd "$REPO" && "$PY" -m tests.kubernetes.node_lab.image_archive "$b/pause.tar" --tag docker.io/k8s-node-lab/pause:1 \
      --layer "$b/layer.tar" --entrypoint '["/pause"]' >/dev/null)
    ctr --address "$SOCK" -n k8s.io images import "$b/pause.tar" >/dev/null
    ctr --address "$SOCK" -n k8s.io images label docker.io/k8s-node-lab/pause:1 io.cri-containerd.pinned=pinned >/dev/null
    echo "pause image: imported"
  fi
}

network_up() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge; ip addr add "$BRIDGE_IP/24" dev "$BRIDGE"; fi
  ip link set "$BRIDGE" up
  sysctl -qw net.ipv4.ip_forward=1
  # pods talk to each other and to this host only: nothing is forwarded between the bridge and other links
  nft list table inet k8s_node_lab >/dev/null 2>&1 || nft -f - <<EOF
table inet k8s_node_lab {
  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname "$BRIDGE" oifname != "$BRIDGE" drop
    oifname "$BRIDGE" iifname != "$BRIDGE" drop
  }
}
EOF
}

node_up() {
  mkdir -p "$STATE/kubelet" "$STATE/pod-logs" "$STATE/pv"
  put "$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
address: 127.0.0.1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
clusterDNS: [$BRIDGE_IP]
resolvConf: ""
failSwapOn: false
protectKernelDefaults: false
podLogsDir: $STATE/pod-logs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
containerRuntimeEndpoint: unix://$SOCK
maxPods: 110
# CPU limits are not enforced (no CFS quota): pods request little CPU so that a small machine schedules an
# upgrade's new pods beside the old ones, and their JVMs may use every core meanwhile. Memory limits are enforced.
cpuCFSQuota: false
EOF
  launch kubelet "$BIN/kubelet" "$BIN/kubelet" --config="$STATE/kubelet.yaml" --kubeconfig="$KCFG" \
    --root-dir="$STATE/kubelet" --cert-dir="$STATE/kubelet/pki" --node-ip="$BRIDGE_IP" --hostname-override="$NODE_NAME"
  launch kube-scheduler "$BIN/kube-scheduler" "$BIN/kube-scheduler" --kubeconfig="$KCFG" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port=10259
  local ctrls=deployment,replicaset,statefulset,endpointslice,endpoint,root-ca-cert-publisher,persistentvolume-binder,nodelifecycle,podgc,job,pvc-protection,pv-protection
  [ "$OWN_CP" = 1 ] && ctrls="$ctrls,garbagecollector,namespace,serviceaccount,serviceaccount-token"
  launch kube-controller-manager "$BIN/kube-controller-manager" "$BIN/kube-controller-manager" --kubeconfig="$KCFG" \
    --bind-address=127.0.0.1 --secure-port=10258 --leader-elect=false --controllers="$ctrls" \
    --use-service-account-credentials=false --service-account-private-key-file="$CP/certs/sa.key" \
    --root-ca-file="$CP/certs/ca.crt"
  put "$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: $KCFG}
hostnameOverride: $NODE_NAME
clusterCIDR: 10.244.0.0/16
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [$BRIDGE_IP/32]
nftables: {masqueradeAll: true}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  launch kube-proxy "$BIN/kube-proxy" "$BIN/kube-proxy" --config="$STATE/kube-proxy.yaml"
  launch services "node_lab.services" env PYTHONPATH="$REPO" "$PY" -m tests.kubernetes.node_lab.services \
    --kubeconfig "$KCFG" --bridge-ip "$BRIDGE_IP" --pv-root "$STATE/pv" --ca "$CP/certs/ca.crt"
  waitfor "node $NODE_NAME Ready" 90 sh -c "'$BIN/kubectl' --kubeconfig '$KCFG' get node '$NODE_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  waitfor "node $NODE_NAME untainted" 60 sh -c "! '$BIN/kubectl' --kubeconfig '$KCFG' get node '$NODE_NAME' -o jsonpath='{.spec.taints}' | grep -q not-ready"
  if [ "${K8S_NODE_LAB_DEDICATED:-0}" = 1 ]; then   # only pods that tolerate it (the e2e apps do) run here
    kctl taint node "$NODE_NAME" "$TAINT=true:NoSchedule" --overwrite >/dev/null
  else kctl taint node "$NODE_NAME" "$TAINT-" >/dev/null 2>&1 || true; fi
  waitfor "the API server on the bridge" 30 sh -c "'$PY' -c 'import socket; socket.create_connection((\"$BRIDGE_IP\", 6443), 2)'"
}

up() {
  preflight; mkdir -p "$STATE/logs" "$RUN"; touch "$STATE/pids"; save_host
  control_plane; containerd_up; network_up; node_up
  echo "node $NODE_NAME Ready. kubeconfig: $KCFG   containerd: $SOCK"
  echo "  export FLINK_RECONCILER_TEST_KUBECONFIG=$KCFG"
}

stop_pid() {   # stop_pid <name> <match>
  local p; p=$(pid_of "$1"); [ -n "$p" ] || return 0
  if ours "$p" "$2"; then kill "$p" 2>/dev/null || true
    for _ in $(seq 40); do ours "$p" "$2" || break; sleep 0.25; done
    ours "$p" "$2" && kill -9 "$p" 2>/dev/null || true; echo "stopped $1 ($p)"; fi
}

down() {
  [ -d "$STATE" ] || { echo "k8s-node-lab: not up (no $STATE)"; return 0; }
  [ -f "$KCFG" ] && kctl get --raw /readyz >/dev/null 2>&1 && API=1 || API=0
  if [ "$API" = 1 ]; then   # the lab's volumes, the node object: the API server may outlive the node
    kctl delete pv -l node-lab.flink-reconciler.io/provisioned=true --wait=false >/dev/null 2>&1 || true
  fi
  stop_pid services node_lab.services
  stop_pid kubelet "$BIN/kubelet"
  if running containerd "containerd --config $STATE"; then   # every pod's containers and sandboxes
    for t in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$SOCK" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$SOCK" -n k8s.io tasks delete -f "$t" >/dev/null 2>&1 || true; done
  fi
  stop_pid kube-proxy "$BIN/kube-proxy"; stop_pid kube-scheduler "$BIN/kube-scheduler"
  stop_pid kube-controller-manager "$BIN/kube-controller-manager"
  stop_pid containerd "containerd --config $STATE"
  pkill_shims
  [ "$API" = 1 ] && kctl delete node "$NODE_NAME" --wait=false >/dev/null 2>&1 || true
  stop_pid kube-apiserver "$BIN/kube-apiserver"; stop_pid etcd "$(etcd_bin)"
  restore_host
  rm -rf "$STATE" "$RUN"
  echo "node lab down; host restored"
}

pkill_shims() {   # containerd-shim processes of the lab's containerd (their command line names its socket/state)
  local p
  for p in $(pgrep -f containerd-shim-runc-v2 || true); do
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "$SOCK" && kill -9 "$p" 2>/dev/null || true
  done
}

restore_host() {
  local m
  # mounts under the state dir (pod volumes, the overlay snapshots) and the pods' network namespaces
  for m in $(findmnt -rn -o TARGET | grep -E "^($STATE|$RUN|/run/netns/cni-)" | sort -r); do umount -l "$m" 2>/dev/null || true; done
  rm -f /run/netns/cni-* 2>/dev/null || true
  if [ -f "$STATE/host/sysctls" ]; then
    while IFS== read -r k v; do sysctl -qw "$k=$v" 2>/dev/null || true; done <"$STATE/host/sysctls"; fi
  if [ -f "$STATE/host/nft-tables" ]; then
    nft list tables 2>/dev/null | sort | comm -13 "$STATE/host/nft-tables" - | while read -r _ fam name; do
      nft delete table "$fam" "$name" 2>/dev/null || true; done
  fi
  [ -f "$STATE/host/bridge-existed" ] || ip link del "$BRIDGE" 2>/dev/null || true
  # kubelet's cgroups (cgroupfs driver): depth first, only when empty
  for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true; done
  for d in $HOSTDIRS; do
    if [ -e "$d" ] && ! grep -qx "$d" "$STATE/host/dirs" 2>/dev/null; then rm -rf "$d"; fi; done
}

status() {
  [ -f "$STATE/pids" ] || { echo "k8s-node-lab: down"; return 3; }
  local ok=0
  while read -r name pid; do
    if [ -r "/proc/$pid/cmdline" ]; then echo "$name: running ($pid)"; else echo "$name: NOT running"; ok=1; fi
  done <"$STATE/pids"
  kctl get node -o wide 2>/dev/null || { echo "API server: not answering"; ok=1; }
  echo "kubeconfig: $KCFG   containerd: $SOCK"
  return $ok
}

case $CMD in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
