#!/usr/bin/env bash
# Real Ray Serve heads for the end-to-end tests (tests/ray_serve_e2e.rs).
# Each head runs inside its own network namespace joined to the host by a veth pair with private test
# addresses, so no Ray traffic leaves this machine's own test hosts and `ray stop` never touches another head.
#
#   ray.sh install                     venv with ray[serve]==2.60.0 cached outside the repo, plus the apt
#                                      packages the real-Ray test needs (python3-venv, iproute2, curl)
#   ray.sh start NAME INDEX APPDIR [ADDRESS]
#                                      head in netns NAME at 10.250.INDEX.2 (dashboard :8265, Serve :8000), or
#                                      at ADDRESS (a Pod IP kwok gave the head Pod, in 10.250.128.0/20), joined
#                                      point to point to the host's 10.250.64.1 (the same host end for every head)
#   ray.sh worker NAME HEAD_IP ADDRESS INDEX APPDIR
#                                      a Ray worker node declaring one GPU, inside head NAME's namespace at ADDRESS
#                                      (its worker Pod's IP, added to that namespace's loopback), joined to the
#                                      head at HEAD_IP, its ports offset by INDEX; in the foreground until killed
#                                      (`ray start --block` stops the node's processes with it)
#   ray.sh stop NAME                   stop that head and remove its namespace
#   ray.sh priority NAME NICENESS      renice every process in that namespace
#   ray.sh tree-priority PID NICENESS  renice that process and every process under it (a worker node's)
#   ray.sh venv                        print the venv directory
#
# RAYSHIFT_RAY_NICE sets the niceness `start` runs the head at (default 0). RAY_AUTH_MODE=token and
# RAY_AUTH_TOKEN, set as KubeRay sets them on a token-auth cluster's Pods, start a head that wants the token.
# With RAYSHIFT_OWNER_PID set, `start` leaves a watchdog that stops the head once that process has exited.
set -euo pipefail

RAY_VERSION=2.60.0
CACHE="${RAYSHIFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift}"
VENV="$CACHE/ray-$RAY_VERSION"
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
export RAY_USAGE_STATS_ENABLED=0
# Ray runs its workers (Serve replicas and proxy included) at nice 15, for nodes it shares with nothing else. Here
# the test control plane shares the same 2 cores and would starve them: run them at normal priority, as a
# dedicated Ray node effectively does.
export RAY_worker_niceness=0
# Metrics (Serve's request counters and latency) reach the head's export port every 2 s, not every 10: the SLO
# checks' real Prometheus scrapes them there (port 8080, as KubeRay's head Pods declare it). The head is started
# with its Pod IP as its node IP, as KubeRay starts it: a node on 127.0.0.1 would export only on loopback.
export RAY_metrics_report_interval_ms=2000
# Network namespaces need root.
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

log() { echo "ray: $*" >&2; }

install() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.ray.lock"
  flock 9
  local missing=()
  command -v ip >/dev/null || missing+=(iproute2)
  command -v curl >/dev/null || missing+=(curl)
  command -v ps >/dev/null || missing+=(procps)
  python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
  if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if [ -x "$VENV/bin/ray" ] && "$VENV/bin/python" -c "import ray; assert ray.__version__ == '$RAY_VERSION'" 2>/dev/null; then
    log "ray $RAY_VERSION cached in $VENV"
    return
  fi
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "ray[serve]==$RAY_VERSION"
  log "installed ray $RAY_VERSION into $VENV"
}

start() {
  local name=${1:?name} index=${2:?index} appdir=${3:?app dir} address=${4:-}
  # The whole test range must fail locally before any host in it exists (and after it is gone).
  bash "$(dirname "$SELF")/local-routes.sh" ensure
  local host_if="rs${index}h" ns_if="rs${index}n" host_ip="10.250.${index}.1/24" ns_ip="10.250.${index}.2"
  local ns_addr="$ns_ip/24"
  if [ -n "$address" ]; then
    # The Pod's own IP: a /32 on each end, each the other's peer (a host route only while the pair exists).
    # Every pair has the same host end, as every Pod has the same node to answer to (kwok hands a deleted Pod's
    # IP to a new one). The address is in 10.250.0.0/16, which local-routes.sh keeps unreachable off this host.
    local link_ip="10.250.64.1"
    ns_ip=$address host_ip="$link_ip peer $address" ns_addr="$address peer $link_ip"
  fi
  # A head left behind by a killed run would hold these names.
  $SUDO ip link del "$host_if" 2>/dev/null || true
  $SUDO ip netns del "$name" 2>/dev/null || true
  $SUDO ip netns add "$name"
  $SUDO ip link add "$host_if" type veth peer name "$ns_if"
  $SUDO ip link set "$ns_if" netns "$name"
  $SUDO ip addr add $host_ip dev "$host_if"
  $SUDO ip link set "$host_if" up
  $SUDO ip netns exec "$name" ip addr add $ns_addr dev "$ns_if"
  $SUDO ip netns exec "$name" ip link set "$ns_if" up
  $SUDO ip netns exec "$name" ip link set lo up
  local tmp="/tmp/ray-$name"
  mkdir -p "$tmp"
  $SUDO ip netns exec "$name" env PYTHONPATH="$appdir" nice -n "${RAYSHIFT_RAY_NICE:-0}" "$VENV/bin/ray" start --head --port 6379 \
    --node-ip-address "$ns_ip" --dashboard-host 0.0.0.0 --dashboard-port 8265 --include-dashboard true --num-cpus 2 \
    --metrics-export-port 8080 \
    --disable-usage-stats --temp-dir "$tmp" >"$tmp.log" 2>&1
  # Up to 2 minutes: a head starting next to a serving one on a loaded 2-core machine has taken more than one.
  local auth=()
  [ -n "${RAY_AUTH_TOKEN:-}" ] && auth=(-H "x-ray-authorization: Bearer $RAY_AUTH_TOKEN")
  for _ in $(seq 240); do
    if curl -sf "${auth[@]}" "http://$ns_ip:8265/api/serve/applications/" >/dev/null 2>&1; then
      if [ -n "${RAYSHIFT_OWNER_PID:-}" ]; then
        setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" stop "$3"' \
          watchdog "$RAYSHIFT_OWNER_PID" "$SELF" "$name" </dev/null >/dev/null 2>&1 &
      fi
      echo "http://$ns_ip:8265"
      return
    fi
    sleep 0.5
  done
  log "head $name did not become ready in 120 s; what the host and the namespace see:"
  {
    ip route get "$ns_ip" || true
    curl -sv --max-time 5 "${auth[@]}" "http://$ns_ip:8265/api/serve/applications/" 2>&1 | tail -n 15 || true
    $SUDO ip netns exec "$name" ip -br addr || true
    $SUDO ip netns exec "$name" ss -ltnp || true
    tail -n 15 "$tmp/session_latest/logs/dashboard.log" 2>/dev/null || true
  } >&2
  return 1
}

worker() {
  local name=${1:?name} head=${2:?head ip} address=${3:?address} index=${4:?index} appdir=${5:?app dir}
  # Only inside the namespace: the host never routes to it (10.250.0.0/16 is unreachable off the veth pairs).
  $SUDO ip netns exec "$name" ip addr add "$address/32" dev lo 2>/dev/null || true
  local base=$((21000 + index * 100))
  exec $SUDO ip netns exec "$name" env PYTHONPATH="$appdir" "$VENV/bin/ray" start --address "$head:6379" \
    --node-ip-address "$address" --num-cpus 1 --num-gpus 1 --disable-usage-stats --block \
    --node-manager-port "$base" --object-manager-port $((base + 1)) --dashboard-agent-grpc-port $((base + 2)) \
    --dashboard-agent-listen-port $((base + 3)) --metrics-export-port $((base + 4)) \
    --runtime-env-agent-port $((base + 5)) --min-worker-port $((base + 10)) --max-worker-port $((base + 99))
}

stop() {
  local name=${1:?name}
  # By PID, never `ray stop`: that kills every Ray process on the machine, whatever its namespace.
  local pids
  pids=$($SUDO ip netns pids "$name" 2>/dev/null || true)
  [ -n "$pids" ] && $SUDO kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 50); do
    pids=$($SUDO ip netns pids "$name" 2>/dev/null || true)
    [ -z "$pids" ] && break
    sleep 0.1
  done
  [ -n "$pids" ] && $SUDO kill -KILL $pids 2>/dev/null || true
  for _ in $(seq 50); do
    [ -z "$($SUDO ip netns pids "$name" 2>/dev/null || true)" ] && break
    sleep 0.1
  done
  # Delete the host end of the veth first: the namespace (and the pair with it) may outlive `ip netns del` for a
  # moment, and while it does the head's /24 still routes to it. Once the host end is gone, its address fails
  # locally at once (local-routes.sh).
  local ns_if
  ns_if=$($SUDO ip netns exec "$name" ip -o link show type veth 2>/dev/null | awk -F': ' 'NR == 1 {print $2}' | cut -d@ -f1)
  [ -n "$ns_if" ] && $SUDO ip link del "${ns_if%n}h" 2>/dev/null || true
  $SUDO ip netns del "$name" 2>/dev/null || true
  if [ -n "${RAYSHIFT_KEEP_RAY_LOGS:-}" ]; then
    # Serve's proxy and replica logs, to follow a request that hung (debugging only).
    mkdir -p "$RAYSHIFT_KEEP_RAY_LOGS"
    cp -rL "/tmp/ray-$name/session_latest/logs" "$RAYSHIFT_KEEP_RAY_LOGS/$name" 2>/dev/null || true
  fi
  rm -rf "/tmp/ray-$name" "/tmp/ray-$name.log"
}

# Sets the niceness of every process in the head's network namespace (processes Ray starts later are not
# covered: call it again).
priority() {
  local name=${1:?name} nice=${2:?niceness} pids
  pids=$($SUDO ip netns pids "$name" 2>/dev/null || true)
  set_nice "$nice" $pids
}

# Sets the niceness of a process and all its descendants: a worker node's (its raylet starts each Ray worker, a
# Serve replica's included, in a process group of its own, so the node's group does not cover them).
tree_priority() {
  local root=${1:?pid} nice=${2:?niceness} pids
  pids=$(ps -e -o pid=,ppid= | awk -v root="$root" '
    { parent[$1] = $2 }
    END { for (p in parent) { q = p; while (q != root && q in parent && q > 1) q = parent[q]; if (q == root) print p } }')
  set_nice "$nice" $pids
}

# Sets NICENESS on the PIDs that follow; a process gone meanwhile is no error.
set_nice() {
  local nice=$1
  shift
  [ $# -eq 0 ] || $SUDO renice --priority "$nice" -p "$@" >/dev/null 2>&1 || true
}

# Sends SIGNAL (STOP or CONT) to the head's dashboard process, the one listening on the dashboard port: stopped,
# the kernel still accepts connections and nothing answers them, as in a long pause.
dashboard_signal() {
  local name=${1:?name} signal=${2:?signal} pid found=
  for pid in $($SUDO ip netns pids "$name" 2>/dev/null || true); do
    if grep -qa 'dashboard/dashboard.py' "/proc/$pid/cmdline" 2>/dev/null; then
      $SUDO kill -s "$signal" "$pid" && found=1
    fi
  done
  [ -n "$found" ] || { log "no dashboard process in $name"; return 1; }
}

# A head that did not come up is started once more, from scratch (CI saw one of dozens never answer).
start_or_retry() {
  start "$@" && return
  log "starting $1 again"
  stop "$1"
  start "$@"
}

case "${1:-}" in
  install) install ;;
  start) shift; start_or_retry "$@" ;;
  stop) shift; stop "$@" ;;
  priority) shift; priority "$@" ;;
  tree-priority) shift; tree_priority "$@" ;;
  dashboard-signal) shift; dashboard_signal "$@" ;;
  worker) shift; worker "$@" ;;
  venv) echo "$VENV" ;;
  *) echo "usage: $0 install | start NAME INDEX APPDIR [ADDRESS] | worker NAME HEAD_IP ADDRESS INDEX APPDIR | stop NAME | priority NAME NICENESS | tree-priority PID NICENESS | dashboard-signal NAME STOP|CONT | venv" >&2; exit 2 ;;
esac
