#!/usr/bin/env bash
# Runs every check and test of rayshift: formatting, clippy, unit, property and end-to-end tests.
# Works on a fresh machine; build artifacts are cached outside the repo, keyed by toolchain version.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1 || { echo "rayshift tests need '$1' on PATH: $2" >&2; exit 1; }; }
need cargo "install the Rust toolchain (rustup) first"

toolchain=$(rustc -V | tr -c 'A-Za-z0-9.\n-' '_')
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift/target/$toolchain}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR"
echo "== cargo target dir: $CARGO_TARGET_DIR"

step() { echo; echo "== $*"; }
start=$(date +%s)

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

# Everything the tests run against, from the project's own scripts (built or installed once, cached).
. scripts/prepare.sh

step "cargo test (workspace)"
# Loudly, before the real-Ray tests can create a host: every invented range must still fail locally.
bash tests/env/local-routes.sh check
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
log="$logs/all"
# One test binary at a time: the pacing tests assert step lateness, and failed when two lanes of end-to-end
# binaries ran side by side (BENCHMARKS.md "CI wall time").
began=$SECONDS
cargo test --workspace --locked --no-fail-fast 2>&1 | tee -a "$log" || touch "$logs/failed"
echo "cargo test (build and run) took $((SECONDS - began))s"
passed=$(grep -Eo 'test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo 'test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed' "$log" | awk '{s+=$6} END {print s+0}')

step "no control-plane, webhook, controller, Ray or Traefik process left behind"
cache_bin=$(bash tests/env/control-plane.sh bin)
kuberay_bin=$(bash tests/env/kuberay.sh bin)
for _ in $(seq 30); do
  left=$(pgrep -f "$cache_bin/(etcd|kube-apiserver|kube-controller-manager|kube-scheduler)|$kuberay_bin/(ray-operator|kwok)|/etcd --data-dir .*/rayshift-cp-|rayshift (webhook|controller|run) |$ray_venv/|$traefik_bin " || true)
  netns=$(ip netns list 2>/dev/null | grep -o '^rayshift-[0-9-]*' || true)
  [ -z "$left$netns" ] && break
  sleep 1
done
if [ -n "$left$netns" ]; then
  echo "left behind after the tests:" >&2
  [ -n "$left" ] && { ps -o pid,stat,cmd -p $left >&2 || true; }
  [ -n "$netns" ] && echo "network namespaces: $netns" >&2
  exit 1
fi
echo "none"

echo
echo "ran against: $(bash tests/env/control-plane.sh version); $(bash tests/env/upstream.sh versions)"
echo "summary: $passed passed, $failed failed"
if [ -e "$logs/failed" ]; then
  echo "== tests failed after $(( $(date +%s) - start ))s (search the log above for FAILED)" >&2
  exit 1
fi
echo "== all checks passed in $(( $(date +%s) - start ))s"
