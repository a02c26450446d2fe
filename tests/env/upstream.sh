#!/usr/bin/env bash
# Upstream objects exactly as released, taken from their Go modules at test time (never copied into the repo).
#
#   upstream.sh crds kuberay        paths of KubeRay's CRDs (RayService, RayCluster, RayJob), CEL rules included
#   upstream.sh crds gateway-api    paths of the Gateway API standard-channel CRDs (and its safe-upgrades policy)
#   upstream.sh versions            the pinned versions
#   upstream.sh module NAME         the module directory of kuberay | gateway-api | kwok
#
# KubeRay v1.7.0 is not served by the Go module proxy here (403 "not available"); v1.6.2 is the newest it serves,
# and it carries what matters for rayshift: RayService managedBy with its CEL rules and the finalizer.
# Gateway API v1.5.1 is the version the gateway-api crate (0.22) is generated from.
set -euo pipefail

KUBERAY_VERSION=1.6.2
GATEWAY_API_VERSION=1.5.1
KWOK_VERSION=0.8.0

module_dir() {
  local mod=$1 dir
  command -v go >/dev/null || { echo "upstream: Go is needed to read upstream modules" >&2; exit 1; }
  dir=$(cd / && GOFLAGS=-mod=mod go mod download -json "$mod" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || { echo "upstream: could not download $mod" >&2; exit 1; }
  echo "$dir"
}

module() {
  case "$1" in
    kuberay) module_dir "github.com/ray-project/kuberay/ray-operator@v$KUBERAY_VERSION" ;;
    gateway-api) module_dir "sigs.k8s.io/gateway-api@v$GATEWAY_API_VERSION" ;;
    kwok) module_dir "sigs.k8s.io/kwok@v$KWOK_VERSION" ;;
    *) echo "upstream: unknown module $1" >&2; exit 2 ;;
  esac
}

crds() {
  local dir
  dir=$(module "$1")
  case "$1" in
    kuberay) printf '%s\n' "$dir"/config/crd/bases/ray.io_{rayservices,rayclusters,rayjobs}.yaml ;;
    gateway-api) ls "$dir"/config/crd/standard/*.yaml ;;
    *) echo "upstream: no CRDs for $1" >&2; exit 2 ;;
  esac
}

case "${1:-}" in
  crds) crds "${2:?kuberay | gateway-api}" ;;
  module) module "${2:?kuberay | gateway-api | kwok}" ;;
  versions) echo "KubeRay v$KUBERAY_VERSION, Gateway API v$GATEWAY_API_VERSION, kwok v$KWOK_VERSION" ;;
  *) echo "usage: $0 crds kuberay|gateway-api | module NAME | versions" >&2; exit 2 ;;
esac
