#!/usr/bin/env bash
# Prometheus for the tests that check the dashboard's queries and the alert rules: Debian's `prometheus`
# package, downloaded with apt and unpacked into a cache keyed by its version (not installed system-wide: the
# package would start a service), never committed.
#
#   prometheus.sh install    download and unpack once (idempotent, flock)
#   prometheus.sh bin        print the directory holding prometheus and promtool
set -euo pipefail

VERSION=2.42.0+ds-5+deb12u1
CACHE="${RAYSHIFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift}"
ROOT="$CACHE/prometheus-${VERSION//+/_}"
BIN="$ROOT/bin"

log() { echo "prometheus: $*" >&2; }
die() { log "$*"; exit 1; }

fetch() {
  local work="$ROOT/download"
  rm -rf "$work" "$BIN" && mkdir -p "$work" "$BIN"
  # apt's sandbox user cannot write an arbitrary directory: fetch as the caller.
  (cd "$work" && apt-get download -o APT::Sandbox::User=root "prometheus=$VERSION") >"$ROOT/download.log" 2>&1 \
    || { (apt-get update && cd "$work" && apt-get download -o APT::Sandbox::User=root "prometheus=$VERSION") >>"$ROOT/download.log" 2>&1; } \
    || { tail -n 20 "$ROOT/download.log" >&2; die "apt-get download prometheus=$VERSION failed"; }
  dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
  cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$BIN/"
  rm -rf "$work"
  log "unpacked Debian's prometheus $VERSION into $BIN"
}

case "${1:-}" in
  install)
    mkdir -p "$ROOT"
    exec 9>"$ROOT/.lock"
    flock 9
    if [ -x "$BIN/prometheus" ] && [ -x "$BIN/promtool" ]; then log "cached in $BIN"; else fetch; fi
    ;;
  bin) echo "$BIN" ;;
  *) echo "usage: $0 install | bin" >&2; exit 2 ;;
esac
