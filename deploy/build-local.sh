#!/usr/bin/env bash
# build-local.sh: build the reconciler's image (deploy/Dockerfile) without Docker or a registry and load it into
# containerd, for the node lab (scripts/k8s-node-lab.sh). Same contents as the Dockerfile: Debian bookworm's
# Python 3.11 (debootstrap minbase) + git + ca-certificates + openssh-client, the package built from this
# checkout and installed into /opt/venv, user 10001, the Dockerfile's environment and entrypoint.
#
#   sudo deploy/build-local.sh [--tag NAME:TAG]      (default flink-reconciler:dev)
#   env: CONTAINERD_ADDRESS (default /run/k8s-node-lab/containerd.sock), RECONCILER_IMAGE_CACHE
#        (default /var/cache/flink-reconciler-image), PYTHON (the project's venv python, for the archive writer)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
CACHE=${RECONCILER_IMAGE_CACHE:-/var/cache/flink-reconciler-image}
ADDRESS=${CONTAINERD_ADDRESS:-/run/k8s-node-lab/containerd.sock}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TAG=flink-reconciler:dev
[ "${1:-}" = --tag ] && TAG=$2
[ "$(id -u)" = 0 ] || { echo "build-local.sh needs root (debootstrap, chroot)" >&2; exit 1; }
mkdir -p "$CACHE"

BASE=$CACHE/python-bookworm.tar   # layer 1 (cached): Python, git, the user
if [ ! -f "$BASE" ]; then
  ROOT=$CACHE/rootfs-python; rm -rf "$ROOT"
  debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$CACHE/debootstrap-python.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap-python.log" >&2; exit 1; }
  chroot "$ROOT" /bin/sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends python3 python3-venv git ca-certificates openssh-client && apt-get clean && \
      groupadd --gid 10001 reconciler && useradd --uid 10001 --gid 10001 --create-home \
      --shell /usr/sbin/nologin reconciler' >"$CACHE/python.log" 2>&1 || { tail -20 "$CACHE/python.log" >&2; exit 1; }
  rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin
  tar --numeric-owner -C "$ROOT" --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -cf "$BASE.part" .
  mv "$BASE.part" "$BASE"; rm -rf "$ROOT"
fi

# layer 2: /opt/venv with the package, installed in a scratch copy of the base (pip needs the chroot's Python)
WORK=$CACHE/reconciler-build; rm -rf "$WORK"; mkdir -p "$WORK/root"
tar -C "$WORK/root" -xf "$BASE"
# the package and its dependencies as wheels, fetched by this host's pip (its index, proxy and CA settings), then
# installed offline into the image's Python (Debian bookworm's 3.11, the same ABI as the project's venv)
"$PY" -m pip wheel -q --wheel-dir "$WORK/root/wheels" "$REPO" >"$CACHE/reconciler-pip.log" 2>&1 \
  || { tail -20 "$CACHE/reconciler-pip.log" >&2; exit 1; }
chroot "$WORK/root" /bin/sh -c 'python3 -m venv /opt/venv && \
    /opt/venv/bin/pip install -q --no-index --find-links /wheels flink-reconciler' >>"$CACHE/reconciler-pip.log" 2>&1 \
  || { tail -20 "$CACHE/reconciler-pip.log" >&2; exit 1; }
mkdir -p "$WORK/layer/opt" "$WORK/layer/var/lib/flink-reconciler"
mv "$WORK/root/opt/venv" "$WORK/layer/opt/venv"
chown 10001:10001 "$WORK/layer/var/lib/flink-reconciler"
tar --numeric-owner -C "$WORK/layer" -cf "$CACHE/reconciler.tar" .
rm -rf "$WORK"

case $TAG in */*) REF=$TAG ;; *) REF=docker.io/library/$TAG ;; esac
( cd "$REPO" && "$PY" -m tests.kubernetes.node_lab.image_archive "$CACHE/reconciler-image.tar" --tag "$REF" \
    --layer "$BASE" --layer "$CACHE/reconciler.tar" --entrypoint '["flink-reconciler"]' --cmd '["run"]' \
    --workdir /home/reconciler --user 10001:10001 \
    --env PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env FLINK_RECONCILER_STATE_DIR=/var/lib/flink-reconciler --env FLINK_RECONCILER_LISTEN_HOST=0.0.0.0 \
    --env FLINK_RECONCILER_LISTEN_PORT=8080 --env PYTHONUNBUFFERED=1 --env PYTHONMALLOC=malloc \
    --env MALLOC_ARENA_MAX=2 )
ctr --address "$ADDRESS" -n k8s.io images import "$CACHE/reconciler-image.tar" >/dev/null
echo "imported $REF into containerd ($ADDRESS, namespace k8s.io)"
