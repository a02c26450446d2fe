#!/usr/bin/env bash
# A real Kubernetes control plane for rayshift's tests: etcd + kube-apiserver v1.20.2
# (+ kube-controller-manager for garbage collection and namespace cleanup), from Debian packages alone.
#
#   control-plane.sh install        install packages, build the binaries once into the cache
#   control-plane.sh start DIR      start everything on random loopback ports; writes DIR/kubeconfig
#   control-plane.sh stop DIR       stop what `start DIR` started (by PID) and remove DIR
#
# With RAYSHIFT_OWNER_PID set, `start` also leaves a watchdog that stops the control plane once that
# process has exited, so a test binary that dies (or simply ends) leaves nothing running.
#   control-plane.sh bin            print the directory holding the binaries
#
# The build is cached outside the repo, keyed by version: ${RAYSHIFT_CACHE:-~/.cache/rayshift}/kube-<ver>.
# `install` is idempotent and safe to run twice in parallel (flock). Every `start` gets its own DIR and ports.
set -euo pipefail

KUBE_VERSION=1.20.2
DEB_VERSION=1.20.5+really1.20.2
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
CACHE="${RAYSHIFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift}"
KUBE_CACHE="$CACHE/kube-$KUBE_VERSION"
BIN="$KUBE_CACHE/bin"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

log() { echo "control-plane: $*" >&2; }
die() { log "$*"; exit 1; }

have_binaries() {
  [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/kubectl" ] && [ -x "$BIN/etcd" ]
}

apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

enable_deb_src() {
  local list=/etc/apt/sources.list.d/rayshift-deb-src.sources
  [ -f "$list" ] && return 0
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  uri=${uri:-http://deb.debian.org/debian}
  log "adding deb-src for $uri"
  printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" \
    | $SUDO tee "$list" >/dev/null
  $SUDO apt-get update -qq
}

build() {
  apt_install etcd-server golang-go rsync jq golang-github-modern-go-reflect2-dev openssl curl ca-certificates dpkg-dev
  enable_deb_src
  local work="$KUBE_CACHE/build"
  rm -rf "$work" && mkdir -p "$work"
  (cd "$work" && apt-get source --download-only kubernetes >/dev/null)
  local orig
  orig=$(ls "$work"/kubernetes_"$DEB_VERSION".orig.tar.gz 2>/dev/null | head -n1 || true)
  [ -n "$orig" ] || die "no kubernetes orig tarball downloaded"
  tar -xzf "$orig" -C "$work"
  local tree="$work/kubernetes-$KUBE_VERSION"
  [ -d "$tree" ] || die "unexpected layout of $orig"
  # The vendored reflect2 v1.0.1 crashes under Go >= 1.18 (SIGSEGV on the first custom-resource create);
  # Debian's 1.0.2 sources fix it.
  local r2=/usr/share/gocode/src/github.com/modern-go/reflect2
  rm -f "$tree"/vendor/github.com/modern-go/reflect2/*.go "$tree"/vendor/github.com/modern-go/reflect2/*.s
  find "$r2" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' -exec cp {} "$tree/vendor/github.com/modern-go/reflect2/" \;
  local targets="cmd/kube-apiserver cmd/kube-controller-manager"
  command -v kubectl >/dev/null 2>&1 || targets="$targets cmd/kubectl"
  log "building $targets (several minutes on a cold Go cache)"
  (cd "$tree" && env HOME="$KUBE_CACHE/home" GOFLAGS=-mod=vendor CGO_ENABLED=0 make WHAT="$targets" >"$work/build.log" 2>&1) \
    || { tail -n 40 "$work/build.log" >&2; die "build failed (log: $work/build.log)"; }
  mkdir -p "$BIN"
  cp "$tree/_output/bin/kube-apiserver" "$tree/_output/bin/kube-controller-manager" "$BIN/"
  if [ -x "$tree/_output/bin/kubectl" ]; then cp "$tree/_output/bin/kubectl" "$BIN/"; else ln -sf "$(command -v kubectl)" "$BIN/kubectl"; fi
  ln -sf "$(command -v etcd || echo /usr/bin/etcd)" "$BIN/etcd"
  rm -rf "$work"
}

install() {
  mkdir -p "$KUBE_CACHE"
  exec 9>"$KUBE_CACHE/.lock"
  flock 9
  # Runtime packages are needed even when the binaries are cached.
  apt_install etcd-server openssl curl
  if have_binaries; then
    log "binaries cached in $BIN"
  else
    build
    log "built into $BIN"
  fi
}

free_port() {
  command -v python3 >/dev/null 2>&1 || apt_install python3
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_ready() {
  local url=$1 token=$2 deadline=$((SECONDS + 60))
  until curl -ksf -H "Authorization: Bearer $token" "$url/readyz" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

start() {
  local dir=${1:?usage: start DIR}
  have_binaries || install
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local etcd_port peer_port api_port token
  etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port)
  token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"
  # rayshift's own identity, for tests that run it under its least-privilege RBAC (manifests/deploy/rbac.yaml).
  local sa_token
  sa_token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  echo "$sa_token,system:serviceaccount:rayshift-system:rayshift,rayshift-sa,\"system:serviceaccounts,system:serviceaccounts:rayshift-system,system:authenticated\"" >>"$dir/tokens.csv"
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
  : >"$dir/pids"

  "$BIN/etcd" --data-dir "$dir/etcd" --name rayshift-test \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "rayshift-test=http://127.0.0.1:$peer_port" >"$dir/etcd.log" 2>&1 &
  echo $! >>"$dir/pids"

  "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" \
    --secure-port="$api_port" --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
    --cert-dir="$dir/certs" --token-auth-file="$dir/tokens.csv" --authorization-mode="${RAYSHIFT_AUTHZ:-RBAC}" \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$dir/sa.pub" \
    --service-account-signing-key-file="$dir/sa.key" --service-cluster-ip-range=10.96.0.0/16 \
    --allow-privileged=true --disable-admission-plugins=ServiceAccount >"$dir/apiserver.log" 2>&1 &
  echo $! >>"$dir/pids"

  local url="https://127.0.0.1:$api_port"
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rayshift-test
  cluster:
    server: $url
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: $token
contexts:
- name: rayshift-test
  context: {cluster: rayshift-test, user: admin}
current-context: rayshift-test
EOF
  sed -e "s/token: $token/token: $sa_token/" -e "s/name: admin/name: rayshift/" -e "s/user: admin/user: rayshift/" \
    "$dir/kubeconfig" >"$dir/kubeconfig-rayshift"
  if ! wait_ready "$url" "$token"; then
    tail -n 30 "$dir/apiserver.log" >&2
    stop "$dir"
    die "kube-apiserver did not become ready"
  fi

  "$BIN/kube-controller-manager" --kubeconfig="$dir/kubeconfig" --controllers=garbagecollector,namespace \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=0 --port=0 >"$dir/controller-manager.log" 2>&1 &
  echo $! >>"$dir/pids"
  echo "$url" >"$dir/server"
  if [ -n "${RAYSHIFT_OWNER_PID:-}" ]; then
    # setsid: the watchdog outlives this script and is not in the caller's process group.
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; exec "$2" stop "$3"' \
      watchdog "$RAYSHIFT_OWNER_PID" "$SELF" "$dir" </dev/null >/dev/null 2>&1 &
  fi
  echo "$dir/kubeconfig"
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
  bin) echo "$BIN" ;;
  *) echo "usage: $0 install | start DIR | stop DIR | bin" >&2; exit 2 ;;
esac
