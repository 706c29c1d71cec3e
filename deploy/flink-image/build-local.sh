#!/usr/bin/env bash
# build-local.sh: build the Flink image of deploy/flink-image without Docker or a registry and load it into
# containerd (for the node lab, scripts/k8s-node-lab.sh, or any machine with containerd and debootstrap).
# The same image as the Dockerfile beside it: Debian bookworm (debootstrap minbase) + openjdk-17-jre-headless
# + curl, the Flink distribution the project installs (pip apache-flink-libraries; or FLINK_HOME) under
# /opt/flink, our docker-entrypoint.sh, user flink (9999).
#
#   build-local.sh [--tag NAME:TAG]... [--usrlib DIR] [--no-import]
#     --tag      image names (default: flink:<major.minor> and flink:<version>)
#     --usrlib   also bake DIR/*.jar into /opt/flink/usrlib (a job image: jarURI local:///opt/flink/usrlib/x.jar)
#   env: CONTAINERD_ADDRESS (default /run/k8s-node-lab/containerd.sock), FLINK_IMAGE_CACHE (default
#        /var/cache/flink-reconciler-image: the JRE layer is built once, ~2 min), FLINK_HOME, PYTHON
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
CACHE=${FLINK_IMAGE_CACHE:-/var/cache/flink-reconciler-image}
ADDRESS=${CONTAINERD_ADDRESS:-/run/k8s-node-lab/containerd.sock}
SUITE=bookworm MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TAGS=(); USRLIB=""; IMPORT=1
while [ $# -gt 0 ]; do
  case $1 in
    --tag) TAGS+=("$2"); shift 2 ;;
    --usrlib) USRLIB=$2; shift 2 ;;
    --no-import) IMPORT=0; shift ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "build-local.sh needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "needs debootstrap: apt-get install debootstrap" >&2; exit 1; }
FLINK_HOME=${FLINK_HOME:-$("$PY" -c 'import pyflink; print(list(pyflink.__path__)[0])')}
DIST=$(ls "$FLINK_HOME"/lib/flink-dist-*.jar 2>/dev/null | tail -n1) || true
[ -n "$DIST" ] || { echo "$FLINK_HOME is not a Flink distribution (no lib/flink-dist-*.jar)" >&2; exit 1; }
VERSION=$(basename "$DIST" .jar); VERSION=${VERSION#flink-dist-}
[ ${#TAGS[@]} -gt 0 ] || TAGS=("flink:${VERSION%.*}" "flink:$VERSION")
mkdir -p "$CACHE"

# --- layer 1: the JRE (cached) ---
JRE=$CACHE/jre-$SUITE.tar
if [ ! -f "$JRE" ]; then
  ROOT=$CACHE/rootfs-$SUITE; rm -rf "$ROOT"
  echo "debootstrap $SUITE (minbase) ..."
  debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
  mount -t proc proc "$ROOT/proc"
  trap 'umount "$ROOT/proc" 2>/dev/null || true' EXIT
  chroot "$ROOT" /bin/sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends openjdk-17-jre-headless curl ca-certificates' >"$CACHE/jre.log" 2>&1 \
    || { tail -20 "$CACHE/jre.log" >&2; exit 1; }
  chroot "$ROOT" /bin/sh -c 'groupadd --system --gid 9999 flink && \
      useradd --system --home-dir /opt/flink --uid 9999 --gid flink flink && apt-get clean'
  umount "$ROOT/proc"; trap - EXIT
  rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/log/*.log
  tar --numeric-owner -C "$ROOT" --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -cf "$JRE.part" .
  mv "$JRE.part" "$JRE"; rm -rf "$ROOT"
fi

# --- layer 2: Flink under /opt/flink, the entrypoint, the default config (conf/) ---
FLINK_LAYER=$CACHE/flink-$VERSION.tar   # rebuilt when the entrypoint or this script changed
if [ ! -f "$FLINK_LAYER" ] || [ "$HERE/docker-entrypoint.sh" -nt "$FLINK_LAYER" ] || [ "$0" -nt "$FLINK_LAYER" ] \
    || [ "$HERE/conf/config.yaml" -nt "$FLINK_LAYER" ]; then
  STAGE=$CACHE/flink-$VERSION; rm -rf "$STAGE"; mkdir -p "$STAGE/opt/flink/bin" "$STAGE/opt/flink/conf" \
    "$STAGE/opt/flink/log" "$STAGE/opt/flink/usrlib"
  cp -r "$FLINK_HOME/lib" "$FLINK_HOME/opt" "$FLINK_HOME/plugins" "$STAGE/opt/flink/"
  cp "$FLINK_HOME/bin/bash-java-utils.jar" "$STAGE/opt/flink/bin/"
  install -m 0755 "$HERE/docker-entrypoint.sh" "$STAGE/docker-entrypoint.sh"
  cp "$HERE/conf/config.yaml" "$HERE/conf/log4j-console.properties" "$STAGE/opt/flink/conf/"
  tar --numeric-owner --owner=9999 --group=9999 -C "$STAGE" -cf "$FLINK_LAYER.part" .
  mv "$FLINK_LAYER.part" "$FLINK_LAYER"; rm -rf "$STAGE"
fi
LAYERS=(--layer "$JRE" --layer "$FLINK_LAYER")

# --- layer 3 (optional): the job's jars ---
if [ -n "$USRLIB" ]; then
  U=$CACHE/usrlib-stage; rm -rf "$U"; mkdir -p "$U/opt/flink/usrlib"; cp "$USRLIB"/*.jar "$U/opt/flink/usrlib/"
  tar --numeric-owner --owner=9999 --group=9999 -C "$U" -cf "$CACHE/usrlib.tar" .
  LAYERS+=(--layer "$CACHE/usrlib.tar")
fi

ARCHIVE=$CACHE/image.tar
norm() {   # containerd's CRI names an image without a registry docker.io/library/<name>
  local first=${1%%/*}
  if [[ $1 != */* ]]; then echo "docker.io/library/$1"
  elif [[ $first == *.* || $first == *:* || $first == localhost ]]; then echo "$1"; else echo "docker.io/$1"; fi
}
TAGARGS=(); for t in "${TAGS[@]}"; do TAGARGS+=(--tag "$(norm "$t")"); done
( cd "$REPO" && "$PY" -m tests.kubernetes.node_lab.image_archive "$ARCHIVE" "${TAGARGS[@]}" "${LAYERS[@]}" \
    --entrypoint '["/docker-entrypoint.sh"]' --cmd '["help"]' --workdir /opt/flink \
    --env PATH=/opt/flink/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env FLINK_HOME=/opt/flink --env JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 --user 9999 )
if [ $IMPORT = 1 ]; then
  ctr --address "$ADDRESS" -n k8s.io images import "$ARCHIVE" >/dev/null
  echo "imported ${TAGS[*]} into containerd ($ADDRESS, namespace k8s.io)"
fi
