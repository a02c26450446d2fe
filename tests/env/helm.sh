#!/usr/bin/env bash
# Helm, built from its published Go module into a cache keyed by version (nothing upstream is committed), for
# the chart tests (helm lint, helm template, helm install into the test control plane).
#
#   helm.sh install    build helm once (idempotent, flock)
#   helm.sh bin        print the directory holding it
set -euo pipefail

HELM_VERSION=3.22.0
CACHE="${RAYSHIFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift}"
BIN="$CACHE/helm-$HELM_VERSION/bin"

log() { echo "helm: $*" >&2; }
die() { log "$*"; exit 1; }

# As helm's Makefile does: the Kubernetes version `helm template` and `helm lint` assume is that of the
# client-go it is built with (else v1.20).
k8s_version_flags() {
  local minor pkg
  minor=$(go list -m -f '{{.Version}}' k8s.io/client-go | sed 's/^v0\.\([0-9]*\)\..*/\1/')
  for pkg in pkg/lint/rules pkg/chartutil; do
    printf -- '-X helm.sh/helm/v3/%s.k8sVersionMajor=1 -X helm.sh/helm/v3/%s.k8sVersionMinor=%s ' "$pkg" "$pkg" "$minor"
  done
}

build() {
  local t0=$SECONDS src="$BIN/../src"
  rm -rf "$src" "$BIN.new" && mkdir -p "$src" "$BIN.new"
  (cd "$src" && printf 'module rayshift.local/helm\n\ngo 1.26.0\n' >go.mod \
    && CGO_ENABLED=0 GOFLAGS=-mod=mod go get -tool "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION" \
    && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION $(k8s_version_flags)" \
      -o "$BIN.new/helm" helm.sh/helm/v3/cmd/helm) \
    >"$src/build.log" 2>&1 || { tail -n 40 "$src/build.log" >&2; die "building helm failed (log: $src/build.log)"; }
  rm -rf "$BIN" && mv "$BIN.new" "$BIN"
  log "built helm v$HELM_VERSION in $((SECONDS - t0))s"
}

case "${1:-}" in
  install)
    mkdir -p "$BIN/.."
    exec 9>"$BIN/../.lock"
    flock 9
    if [ -x "$BIN/helm" ]; then log "cached in $BIN"; else
      command -v go >/dev/null || die "Go (>= 1.26) is needed to build helm from its Go module"
      build
    fi
    ;;
  bin) echo "$BIN" ;;
  *) echo "usage: $0 install | bin" >&2; exit 2 ;;
esac
