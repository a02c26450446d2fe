#!/usr/bin/env bash
# The container image's binary: rayshift linked statically, so the image needs no shared library, only what
# distroless/static gives it (CA certificates, the nonroot user) and what the kubelet mounts.
#
#   image.sh binary [--release] [--out FILE]    build it; print its path (or copy it to FILE)
#
# The Dockerfile's build stage runs `image.sh binary --release`; tests/manifests_e2e.rs runs the debug build in an
# empty root as the Deployment runs the image (user 65532, read-only root, in-cluster config).
#
# glibc's static libc: since glibc 2.34 its `files` and `dns` name lookups are built in, so /etc/hosts and
# /etc/resolv.conf work without NSS libraries (the test resolves a dashboard host through /etc/hosts).
# CARGO_TARGET_DIR is the target directory (default: the repo's target/); the host triple's artifacts go to a
# directory of their own there, so this never waits on, or rebuilds, the usual build.
set -euo pipefail
cd "$(dirname "$0")/.."

binary() {
  local profile=debug out="" args=()
  while [ $# -gt 0 ]; do
    case $1 in
      --release) profile=release; args+=(--release) ;;
      --out) out=${2:?--out FILE}; shift ;;
      *) echo "image.sh binary: unknown option $1" >&2; exit 2 ;;
    esac
    shift
  done
  local triple var
  triple=$(rustc -vV | sed -n 's/^host: //p')
  # Cargo reads the target's flags from CARGO_TARGET_<TRIPLE>_RUSTFLAGS; build scripts and proc macros, built
  # for the host, stay dynamic.
  var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/image"
  env "$var=-C target-feature=+crt-static" cargo build --locked --bin rayshift --target "$triple" "${args[@]}" >&2
  local built="$CARGO_TARGET_DIR/$triple/$profile/rayshift"
  if [ -n "$out" ]; then
    install -m 0755 "$built" "$out"
    echo "$out"
  else
    echo "$built"
  fi
}

case ${1:-} in
  binary) shift; binary "$@" ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
