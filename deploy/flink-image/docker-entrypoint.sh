#!/usr/bin/env bash
# Entrypoint of the Flink image for flink-reconciler's Kubernetes runtime (deploy/flink-image/README.md).
#
# It honours the command contract of the official image's entrypoint (github.com/apache/flink-docker,
# docker-entrypoint.sh of the 2.2 Dockerfiles, read for this), which the rendered pods rely on:
#   jobmanager [args]        a session JobManager        (StandaloneSessionClusterEntrypoint)
#   standalone-job [args]    an application JobManager   (StandaloneApplicationClusterEntryPoint)
#   taskmanager [args]       a TaskManager               (TaskManagerRunner)
#   help                     usage;  anything else runs as a command (e.g. sh -c ... in an init container)
# and its environment: JOB_MANAGER_RPC_ADDRESS, TASK_MANAGER_NUMBER_OF_TASK_SLOTS, FLINK_PROPERTIES
# ("key: value" lines). Unlike the official one it never writes the config directory, which the reconciler
# mounts read-only from a ConfigMap: those settings are passed as dynamic properties (-D key=value), which
# take precedence over config.yaml, and they are applied only when set (config.yaml is the source of truth).
#
# Java is launched directly, as Flink's bin/*.sh do it: the memory flags come from Flink's BashJavaUtils for
# the mounted config.yaml, JVM options from env.java.default-opts.all, env.java.opts.all and their per-role keys
# (Flink 2 on Java 17 needs its --add-opens list there; the reconciler renders it as env.java.default-opts.all),
# the classpath is lib/*.jar with flink-dist last. config.yaml is read in the flat form the reconciler renders
# ("key: value" per line).
set -euo pipefail

FLINK_HOME=${FLINK_HOME:-/opt/flink}
CONF_DIR=${FLINK_CONF_DIR:-$FLINK_HOME/conf}
export FLINK_HOME FLINK_CONF_DIR=$CONF_DIR FLINK_LIB_DIR=${FLINK_LIB_DIR:-$FLINK_HOME/lib}
export FLINK_PLUGINS_DIR=${FLINK_PLUGINS_DIR:-$FLINK_HOME/plugins} FLINK_OPT_DIR=${FLINK_OPT_DIR:-$FLINK_HOME/opt}
export FLINK_LOG_DIR=${FLINK_LOG_DIR:-$FLINK_HOME/log}
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java

usage() {
  echo "Usage: $(basename "$0") (jobmanager|standalone-job|taskmanager) [args]  |  help  |  <command> [args]"
}

conf_value() {   # conf_value <key>: the value of a flat key in config.yaml, unquoted; empty when absent
  local line
  line=$(grep -E "^${1//./\\.}[[:space:]]*:" "$CONF_DIR/config.yaml" 2>/dev/null | tail -n1) || true
  line=${line#*:}; line="${line#"${line%%[![:space:]]*}"}"; line="${line%"${line##*[![:space:]]}"}"
  if [[ $line == \"*\" ]]; then line=${line:1:-1}; elif [[ $line == \'*\' ]]; then line=${line:1:-1}; fi
  printf '%s' "$line"
}

dynamic_properties() {   # the official entrypoint's environment settings, as -D arguments
  DYN=()
  [ -n "${JOB_MANAGER_RPC_ADDRESS:-}" ] && DYN+=(-D "jobmanager.rpc.address=$JOB_MANAGER_RPC_ADDRESS")
  [ -n "${TASK_MANAGER_NUMBER_OF_TASK_SLOTS:-}" ] && DYN+=(-D "taskmanager.numberOfTaskSlots=$TASK_MANAGER_NUMBER_OF_TASK_SLOTS")
  local prop key value
  while IFS= read -r prop; do
    prop=${prop//[[:space:]]/}
    [ -z "$prop" ] && continue
    key=${prop%%:*}; value=${prop#*:}
    DYN+=(-D "$key=$value")
  done <<<"${FLINK_PROPERTIES:-}"
  return 0
}

classpath() {   # lib/*.jar in name order, flink-dist last (as Flink's constructFlinkClassPath)
  local cp="" dist="" jar
  for jar in "$FLINK_LIB_DIR"/*.jar; do
    case $(basename "$jar") in flink-dist*) dist=$jar ;; *) cp="$cp:$jar" ;; esac
  done
  printf '%s' "${cp#:}:$dist"
}

memory_flags() {   # memory_flags JM|TM: sets MEM_JVM and MEM_DYN from BashJavaUtils' last two result lines
  local out lines dist
  dist=$(ls "$FLINK_LIB_DIR"/flink-dist*.jar | head -n1)
  if ! out=$("$JAVA" -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
      -classpath "$FLINK_HOME/bin/bash-java-utils.jar:$dist" org.apache.flink.runtime.util.bash.BashJavaUtils \
      "GET_$1_RESOURCE_PARAMS" --configDir "$CONF_DIR" "${DYN[@]}" 2>&1); then
    echo "[ERROR] Flink rejected the memory configuration in $CONF_DIR/config.yaml:" >&2
    echo "$out" >&2
    exit 1
  fi
  lines=$(grep '^BASH_JAVA_UTILS_EXEC_RESULT:' <<<"$out" | sed 's/^BASH_JAVA_UTILS_EXEC_RESULT://') || true
  if [ "$(wc -l <<<"$lines")" -lt 2 ]; then
    echo "[ERROR] unexpected BashJavaUtils output:" >&2; echo "$out" >&2; exit 1
  fi
  read -r -a MEM_JVM <<<"$(tail -n2 <<<"$lines" | head -n1)"
  read -r -a MEM_DYN <<<"$(tail -n1 <<<"$lines")"
}

launch() {   # launch <role> <JM|TM> <main class> [class args...]; options go before the class args: an
             # application entry point takes everything after its own options as the job's arguments
  local role=$1 kind=$2 main=$3; shift 3
  local opts=() key part
  for key in env.java.default-opts.all "env.java.default-opts.$role" env.java.opts.all "env.java.opts.$role"; do
    read -r -a part <<<"$(conf_value "$key")" || true
    opts+=("${part[@]}")
  done
  memory_flags "$kind"
  mkdir -p "$FLINK_LOG_DIR" 2>/dev/null || true
  echo "Starting $role ($main) on $(hostname)"
  exec "$JAVA" "${MEM_JVM[@]}" "${opts[@]}" \
    "-Dlog.file=$FLINK_LOG_DIR/flink-$role-$(hostname).log" \
    "-Dlog4j.configurationFile=file:$CONF_DIR/log4j-console.properties" -Dlog4j2.formatMsgNoLookups=true \
    -classpath "$(classpath)" "$main" --configDir "$CONF_DIR" "${MEM_DYN[@]}" "${DYN[@]}" "$@"
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case $cmd in
  help) usage ;;
  jobmanager)
    dynamic_properties
    # No `--executionMode cluster` (Flink 1.x's jobmanager.sh passed it): Flink 2's entry point parser does not
    # know it and stops there, ignoring every -D after it (a session JobManager's HA identity, found on a real node)
    launch jobmanager JM org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint "$@" ;;
  standalone-job)
    dynamic_properties
    launch jobmanager JM org.apache.flink.container.entrypoint.StandaloneApplicationClusterEntryPoint "$@" ;;
  taskmanager)
    dynamic_properties
    launch taskmanager TM org.apache.flink.runtime.taskexecutor.TaskManagerRunner "$@" ;;
  *) exec "$cmd" "$@" ;;
esac
