#!/usr/bin/env bash
# The weighted data plane of the real-Ray test: one nginx (Debian's), configured by test code playing the
# Gateway controller, reloaded gracefully on every HTTPRoute change.
#
#   nginx.sh start DIR     run nginx with DIR/nginx.conf (pid and logs in DIR)
#   nginx.sh reload DIR    graceful reload: returns once no old worker accepts connections any more (new
#                          workers take the new config, old ones finish the requests they have)
#   nginx.sh stop DIR      graceful stop, then kill what is left
#
# With RAYSHIFT_OWNER_PID set, `start` leaves a watchdog that stops nginx once that process has exited.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

master() { cat "$1/nginx.pid" 2>/dev/null || true; }

# Workers holding nginx's listening socket (the master holds it too, but never accepts).
accepting() {
  local dir=$1 m port
  m=$(master "$dir")
  port=$(awk '/listen / {sub(/;/, "", $2); n = split($2, a, ":"); print a[n]; exit}' "$dir/nginx.conf")
  ss -Hltnp "sport = :$port" | grep -o 'pid=[0-9]*' | cut -d= -f2 | grep -vx "$m" | sort -u || true
}

case "${1:-}" in
  start)
    dir=${2:?dir}
    mkdir -p "$dir/tmp"
    "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log"
    for _ in $(seq 50); do [ -s "$dir/nginx.pid" ] && break; sleep 0.1; done
    if [ -n "${RAYSHIFT_OWNER_PID:-}" ]; then
      setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" stop "$3"' \
        watchdog "$RAYSHIFT_OWNER_PID" "$SELF" "$dir" </dev/null >/dev/null 2>&1 &
    fi
    ;;
  reload)
    dir=${2:?dir}
    "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -t -q
    old=$(accepting "$dir")
    kill -HUP "$(master "$dir")"
    # An old worker may still accept a connection (and route it by the old config) until it has
    # handled the QUIT the master sends it: the new config is in force only once none does.
    for _ in $(seq 200); do
      now=$(accepting "$dir")
      left=$(comm -12 <(echo "$old") <(echo "$now"))
      [ -z "$left" ] && exit 0
      sleep 0.02
    done
    echo "nginx: old workers $left still accept connections" >&2
    exit 1
    ;;
  stop)
    dir=${2:?dir}
    pid=$(master "$dir")
    [ -n "$pid" ] || exit 0
    kill -QUIT "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/nginx.pid"
    ;;
  *) echo "usage: $0 start DIR | reload DIR | stop DIR" >&2; exit 2 ;;
esac
