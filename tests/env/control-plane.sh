#!/usr/bin/env bash
# A real Kubernetes control plane for rayshift's tests: etcd + kube-apiserver + kube-controller-manager
# (garbage collector, namespace, endpoints, EndpointSlice, Deployment, ReplicaSet and disruption controllers), plus
# kube-scheduler and kubectl of the same release, all built from their published Go modules.
#
#   control-plane.sh install        build the binaries once into the cache (idempotent, flock)
#   control-plane.sh start DIR      start etcd, kube-apiserver and kube-controller-manager on random loopback
#                                   ports; writes DIR/kubeconfig (admin) and DIR/kubeconfig-rayshift
#   control-plane.sh stop DIR       stop what `start DIR` started (by PID) and remove DIR
#   control-plane.sh restart-apiserver DIR [compact]
#                                   kill -9 kube-apiserver and start it again on the same port and etcd; with
#                                   `compact`, compact etcd while it is down (resumed watches get 410 Gone)
#   control-plane.sh bin            print the directory holding the binaries
#   control-plane.sh version        print the Kubernetes and etcd versions
#
# With RAYSHIFT_OWNER_PID set, `start` also leaves a watchdog that stops the control plane once that
# process has exited, so a test binary that dies (or simply ends) leaves nothing running.
#
# Build: k8s.io/kubernetes pins its k8s.io/* staging modules to v0.0.0 with replace directives that do not
# apply to a dependency, so a small wrapper module (generated here, never committed) requires it and maps
# every staging module to its published v0.<minor>.<patch>, read from that release's own go.mod. etcd is the
# version that release requires. Cached outside the repo, keyed by version:
# ${RAYSHIFT_CACHE:-~/.cache/rayshift}/kube-<version>/bin.
set -euo pipefail

KUBE_VERSION=1.37.2
ETCD_VERSION=3.7.0
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
CACHE="${RAYSHIFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift}"
KUBE_CACHE="$CACHE/kube-$KUBE_VERSION-etcd-$ETCD_VERSION"
BIN="$KUBE_CACHE/bin"
SERVICE_RANGE=10.96.0.0/16 # covered by tests/env/local-routes.sh
# Niceness of the control plane's processes (RAYSHIFT_CP_NICE): tests that run real Ray heads on the same cores
# lower it, as a real control plane does not share a node with the Serve replicas it steers.
NICE="nice -n ${RAYSHIFT_CP_NICE:-0}"
COMMANDS="kube-apiserver kube-controller-manager kube-scheduler kubectl"

log() { echo "control-plane: $*" >&2; }
die() { log "$*"; exit 1; }

have_binaries() {
  local c
  for c in $COMMANDS etcd; do [ -x "$BIN/$c" ] || return 1; done
}

apt_install() {
  local missing=() SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

go_cmd() {
  command -v go >/dev/null || die "Go (>= 1.26) is needed to build the control plane from its Go modules"
  CGO_ENABLED=0 GOFLAGS=-mod=mod go "$@"
}

wrapper_module() {
  local src=$1 minor=${KUBE_VERSION#*.}
  minor=${minor%%.*}
  mkdir -p "$src"
  (cd "$src" && printf 'module rayshift.local/control-plane\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v%s\n' "$KUBE_VERSION" >go.mod)
  local kmod
  kmod=$(cd "$src" && go_cmd mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
  [ -f "$kmod" ] || die "could not download k8s.io/kubernetes v$KUBE_VERSION"
  {
    echo
    echo "replace ("
    sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 v0.'"${KUBE_VERSION#*.}"'#p' "$kmod"
    echo ")"
  } >>"$src/go.mod"
  grep -q "k8s.io/api => k8s.io/api v0.$minor." "$src/go.mod" || die "unexpected staging replaces in $kmod"
}

build() {
  apt_install openssl curl ca-certificates python3
  local src="$KUBE_CACHE/src" t0=$SECONDS
  rm -rf "$src"
  wrapper_module "$src"
  local pkgs=() c
  for c in $COMMANDS; do pkgs+=("k8s.io/kubernetes/cmd/$c@v$KUBE_VERSION"); done
  log "resolving k8s.io/kubernetes v$KUBE_VERSION and etcd v$ETCD_VERSION"
  (cd "$src" && go_cmd get -tool "${pkgs[@]}" "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >"$src/get.log" 2>&1) \
    || { tail -n 30 "$src/get.log" >&2; die "resolving the modules failed"; }
  # Discovery and `kubectl version` report the stamped version instead of v0.0.0.
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=v$KUBE_VERSION -X $p.gitMajor=${KUBE_VERSION%%.*} -X $p.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  log "building $COMMANDS and etcd (about 11 minutes on 2 cores with a cold Go cache)"
  mkdir -p "$src/bin"
  (cd "$src" && go_cmd build -trimpath -ldflags "$ld" -o bin/ $(for c in $COMMANDS; do echo "k8s.io/kubernetes/cmd/$c"; done) \
    && go_cmd build -trimpath -ldflags "-s -w" -o bin/etcd go.etcd.io/etcd/server/v3) >"$src/build.log" 2>&1 \
    || { tail -n 40 "$src/build.log" >&2; die "build failed (log: $src/build.log)"; }
  rm -rf "$BIN" && mv "$src/bin" "$BIN"
  log "built in $((SECONDS - t0))s"
}

install() {
  mkdir -p "$KUBE_CACHE"
  exec 9>"$KUBE_CACHE/.lock"
  flock 9
  apt_install openssl curl python3
  if have_binaries; then
    log "binaries cached in $BIN"
  else
    build
    log "built into $BIN"
  fi
  "$BIN/kube-apiserver" --version | grep "v$KUBE_VERSION" >/dev/null || die "kube-apiserver does not report v$KUBE_VERSION"
}

# N distinct free loopback ports, below the kernel's ephemeral range: a port from bind(0) is in that range, where
# any outgoing connection on this machine may take it before our server binds it (CI saw kube-apiserver fail so).
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
ports = []
while len(ports) < int(sys.argv[1]):
    port = random.randrange(max(1024, low - 12000), low)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    if port not in ports:
        ports.append(port)
print(*ports)
PY
}

wait_ready() {
  local url=$1 token=$2 deadline=$((SECONDS + 90))
  until curl -ksf -H "Authorization: Bearer $token" "$url/readyz" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

token() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

kubeconfig() {
  local url=$1 user=$2 token=$3
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rayshift-test
  cluster:
    server: $url
    insecure-skip-tls-verify: true
users:
- name: $user
  user:
    token: $token
contexts:
- name: rayshift-test
  context: {cluster: rayshift-test, user: $user}
current-context: rayshift-test
EOF
}

start_etcd() {
  local dir=$1 port=$2 peer=$3
  $NICE "$BIN/etcd" --data-dir "$dir/etcd" --name rayshift-test --log-level warn \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "rayshift-test=http://127.0.0.1:$peer" >"$dir/etcd.log" 2>&1 &
  echo $! >>"$dir/pids"
}

start_apiserver() {
  local dir=$1 etcd_port=$2 api_port=$3
  $NICE "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" \
    --secure-port="$api_port" --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
    --cert-dir="$dir/certs" --token-auth-file="$dir/tokens.csv" --authorization-mode="${RAYSHIFT_AUTHZ:-RBAC}" \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$dir/sa.pub" \
    --service-account-signing-key-file="$dir/sa.key" --service-cluster-ip-range="$SERVICE_RANGE" \
    --allow-privileged=true --disable-admission-plugins=ServiceAccount \
    --endpoint-reconciler-type=none >"$dir/apiserver.log" 2>&1 &
  echo $! >>"$dir/pids"
}

start() {
  local dir=${1:?usage: start DIR}
  have_binaries || install
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local etcd_port api_port peer_port admin sa
  read -r etcd_port api_port peer_port <<<"$(free_ports 3)"
  admin=$(token); sa=$(token)
  echo "$admin,admin,admin,system:masters" >"$dir/tokens.csv"
  # rayshift's own identity, for tests that run it under its least-privilege RBAC (manifests/deploy/rbac.yaml).
  echo "$sa,system:serviceaccount:rayshift-system:rayshift,rayshift-sa,\"system:serviceaccounts,system:serviceaccounts:rayshift-system,system:authenticated\"" >>"$dir/tokens.csv"
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
  : >"$dir/pids"
  echo "$etcd_port $api_port" >"$dir/ports"
  start_etcd "$dir" "$etcd_port" "$peer_port"
  start_apiserver "$dir" "$etcd_port" "$api_port"
  local url="https://127.0.0.1:$api_port"
  kubeconfig "$url" admin "$admin" >"$dir/kubeconfig"
  kubeconfig "$url" rayshift "$sa" >"$dir/kubeconfig-rayshift"
  if ! wait_ready "$url" "$admin"; then
    tail -n 30 "$dir/apiserver.log" "$dir/etcd.log" >&2
    stop "$dir"
    die "kube-apiserver did not become ready"
  fi
  $NICE "$BIN/kube-controller-manager" --kubeconfig="$dir/kubeconfig" \
    --controllers=garbage-collector-controller,namespace-controller,endpoints-controller,endpointslice-controller,endpointslice-mirroring-controller,deployment-controller,replicaset-controller,disruption-controller \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=0 >"$dir/controller-manager.log" 2>&1 &
  echo $! >>"$dir/pids"
  echo "$url" >"$dir/server"
  if [ -n "${RAYSHIFT_OWNER_PID:-}" ]; then
    # setsid: the watchdog outlives this script and is not in the caller's process group.
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; exec "$2" stop "$3"' \
      watchdog "$RAYSHIFT_OWNER_PID" "$SELF" "$dir" </dev/null >/dev/null 2>&1 &
  fi
  echo "$dir/kubeconfig"
}

# Stops kube-apiserver (SIGKILL: no graceful shutdown, every watch cut) and starts it again on the same port over
# the same etcd. With `compact`, etcd is compacted to its head revision while the apiserver is down, so a client
# that resumes a watch from its last resourceVersion gets 410 Gone and must list again.
restart_apiserver() {
  local dir=${1:?usage: restart-apiserver DIR [compact]} mode=${2:-} etcd_port api_port old
  read -r etcd_port api_port <"$dir/ports"
  old=$(sed -n 2p "$dir/pids")
  kill -9 "$old" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
  if [ "$mode" = compact ]; then
    local rev
    rev=$(curl -sf -X POST "http://127.0.0.1:$etcd_port/v3/kv/range" -d '{"key":"AA=="}' |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
    curl -sf -X POST "http://127.0.0.1:$etcd_port/v3/kv/compaction" -d "{\"revision\":\"$rev\",\"physical\":true}" >/dev/null
    log "etcd compacted to revision $rev"
  fi
  start_apiserver "$dir" "$etcd_port" "$api_port"
  # start_apiserver appended the new pid; put it where the old one was (stop's order stays right).
  local new
  new=$(tail -n 1 "$dir/pids")
  sed -i '$d' "$dir/pids"
  sed -i "2s/.*/$new/" "$dir/pids"
  local admin
  admin=$(head -n 1 "$dir/tokens.csv" | cut -d, -f1)
  wait_ready "https://127.0.0.1:$api_port" "$admin" || die "kube-apiserver did not come back"
}

stop() {
  local dir=${1:?usage: stop DIR}
  [ -d "$dir" ] || return 0
  if [ -f "$dir/pids" ]; then
    # Reverse order: controller-manager, apiserver, then etcd.
    local pids
    pids=$(tac "$dir/pids")
    for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    for pid in $pids; do
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    done
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  install) install ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  restart-apiserver) shift; restart_apiserver "$@" ;;
  bin) echo "$BIN" ;;
  version) echo "Kubernetes v$KUBE_VERSION, etcd v$ETCD_VERSION" ;;
  *) echo "usage: $0 install | start DIR | stop DIR | bin | version" >&2; exit 2 ;;
esac
