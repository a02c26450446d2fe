#!/usr/bin/env bash
# The real KubeRay operator and kwok (fake nodes and Pods) for the end-to-end tests, built from their published
# Go modules (versions in tests/env/upstream.sh) into a cache keyed by version; nothing upstream is committed.
#
#   kuberay.sh install                   build ray-operator and kwok once (idempotent, flock)
#   kuberay.sh start DIR KUBECONFIG [FLAGS...]
#                                        run the KubeRay operator (with FLAGS), kube-scheduler and kwok against
#                                        that control plane, with one fake node whose Pods get addresses in the
#                                        local test range
#   kuberay.sh stop DIR                  stop them (by PID)
#   kuberay.sh bin                       print the directory holding the binaries
#
# With RAYSHIFT_OWNER_PID set, `start` leaves a watchdog that stops both once that process has exited;
# RAYSHIFT_CP_NICE sets their niceness, as for the control plane (control-plane.sh).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SELF="$HERE/$(basename "$0")"
read -r KUBERAY_VERSION KWOK_VERSION < <(bash "$HERE/upstream.sh" versions | sed 's/KubeRay v\([^,]*\), .*kwok v\(.*\)/\1 \2/')
CACHE="${RAYSHIFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift}"
BIN="$CACHE/kuberay-$KUBERAY_VERSION-kwok-$KWOK_VERSION/bin"
# Fake Pods' addresses: inside 10.250.0.0/16, whose unreachable route keeps them local (local-routes.sh).
POD_CIDR=10.250.128.0/20
NICE="nice -n ${RAYSHIFT_CP_NICE:-0}"

log() { echo "kuberay: $*" >&2; }
die() { log "$*"; exit 1; }

go_cmd() { CGO_ENABLED=0 GOFLAGS=-mod=mod go "$@"; }

# One wrapper module each: built together, Go's version selection would mix their dependencies (kwok's newer
# controller-runtime breaks ray-operator).
build_one() {
  local name=$1 pkg=$2 version=$3 ldflags=$4 src="$BIN/../src-$1"
  rm -rf "$src" && mkdir -p "$src"
  (cd "$src" && printf 'module rayshift.local/%s\n\ngo 1.26.0\n' "$name" >go.mod \
    && go_cmd get -tool "$pkg@v$version" && go_cmd build -trimpath -ldflags "-s -w $ldflags" -o "$BIN.new/$name" "$pkg") \
    >"$src/build.log" 2>&1 || { tail -n 40 "$src/build.log" >&2; die "building $name failed (log: $src/build.log)"; }
}

build() {
  local t0=$SECONDS
  rm -rf "$BIN.new" && mkdir -p "$BIN.new"
  build_one ray-operator github.com/ray-project/kuberay/ray-operator "$KUBERAY_VERSION" ""
  build_one kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" "-X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION"
  rm -rf "$BIN" && mv "$BIN.new" "$BIN"
  log "built KubeRay v$KUBERAY_VERSION and kwok v$KWOK_VERSION in $((SECONDS - t0))s"
}

install() {
  mkdir -p "$BIN/.."
  exec 9>"$BIN/../.lock"
  flock 9
  if [ -x "$BIN/ray-operator" ] && [ -x "$BIN/kwok" ]; then
    log "cached in $BIN"
  else
    command -v go >/dev/null || die "Go (>= 1.26) is needed to build KubeRay and kwok from their Go modules"
    build
  fi
  # Release the lock: the processes `start` runs next would otherwise inherit it and hold it for their life.
  exec 9>&-
}

# kwok's own "fast" stages, from its module: nodes turn Ready; Pods get an IP from their node's podCIDR and
# turn Running and Ready with every container running; deleted Pods go at once.
stage_args() {
  local kwok f
  kwok=$(bash "$HERE/upstream.sh" module kwok)
  for f in node/fast/node-initialize pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    printf -- '--config\n%s\n' "$kwok/kustomize/stage/$f.yaml"
  done
}

node() {
  cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-0
  labels: {type: kwok, kubernetes.io/hostname: kwok-node-0}
  annotations: {kwok.x-k8s.io/node: fake}
spec:
  podCIDR: $POD_CIDR
  podCIDRs: [$POD_CIDR]
EOF
}

start() {
  local dir=${1:?usage: start DIR KUBECONFIG} kubeconfig=${2:?usage: start DIR KUBECONFIG}
  install
  bash "$HERE/local-routes.sh" check
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  : >"$dir/pids"
  local cp_bin
  cp_bin="$(bash "$HERE/control-plane.sh" bin)"
  mapfile -t stages < <(stage_args)
  # The real scheduler binds the Pods KubeRay creates to the fake node.
  $NICE "$cp_bin/kube-scheduler" --kubeconfig "$kubeconfig" --leader-elect=false --secure-port=0 \
    >"$dir/scheduler.log" 2>&1 &
  echo $! >>"$dir/pids"
  $NICE "$BIN/kwok" --kubeconfig "$kubeconfig" "${stages[@]}" --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake --cidr "$POD_CIDR" \
    --node-ip 127.0.0.1 >"$dir/kwok.log" 2>&1 &
  echo $! >>"$dir/pids"
  local k=("$cp_bin/kubectl" --kubeconfig "$kubeconfig")
  node | "${k[@]}" apply -f - >/dev/null
  # The apiserver taints a new node not-ready; with no node lifecycle controller here (it would also evict the
  # Pods of a node that sends no kubelet heartbeats), lift the taint once kwok reports the node Ready.
  "${k[@]}" wait --for=condition=Ready node/kwok-node-0 --timeout=60s >/dev/null
  "${k[@]}" taint node kwok-node-0 node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  # GPU nodes run an "nvidia" RuntimeClass; without the object the apiserver rejects Pods that name it.
  printf 'apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: nvidia}\nhandler: nvidia\n' \
    | "${k[@]}" apply -f - >/dev/null
  $NICE "$BIN/ray-operator" --kubeconfig "$kubeconfig" --metrics-addr 0 --health-probe-bind-address 0 \
    --enable-leader-election=false --log-stdout-encoder console "${KUBERAY_ARGS[@]}" >"$dir/kuberay.log" 2>&1 &
  echo $! >>"$dir/pids"
  if [ -n "${RAYSHIFT_OWNER_PID:-}" ]; then
    # By PID, not through DIR: the owner may remove DIR before it exits.
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; shift; kill "$@"; sleep 3; kill -9 "$@"' \
      watchdog "$RAYSHIFT_OWNER_PID" $(cat "$dir/pids") </dev/null >/dev/null 2>&1 &
  fi
}

stop() {
  local dir=${1:?usage: stop DIR}
  [ -f "$dir/pids" ] || return 0
  local pids
  pids=$(cat "$dir/pids")
  for pid in $pids; do kill "$pid" 2>/dev/null || true; done
  for pid in $pids; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -f "$dir/pids"
}

KUBERAY_ARGS=()
case "${1:-}" in
  install) install ;;
  start) shift; dir=$1 kc=$2; shift 2; KUBERAY_ARGS=("$@"); start "$dir" "$kc" ;;
  stop) shift; stop "$@" ;;
  bin) echo "$BIN" ;;
  *) echo "usage: $0 install | start DIR KUBECONFIG [ray-operator flags...] | stop DIR | bin" >&2; exit 2 ;;
esac
