#!/usr/bin/env bash
# rayshift's benchmarks and chaos runs, each against a baseline or with counts measured in the same run
# (BENCHMARKS.md records the results with these commands). The test suite runs a quicker subset of the same
# code (4 kill runs instead of 50; the zero-downtime test as is).
#
#   scripts/bench.sh                  all of the below
#   scripts/bench.sh admission        the webhook under load against a no-op axum+rustls server (release build)
#   scripts/bench.sh chaos            kill -9 at random instants of 50 upgrades (RAYSHIFT_CHAOS_RUNS, half of
#                                     them with two leader-elected replicas) and kube-apiserver restarts
#   scripts/bench.sh zero-downtime    12 upgrades of real Ray Serve heads through Traefik under load
#
# RAYSHIFT_CHAOS_SEED replays the random choices of a chaos run (each run prints its seed).
set -euo pipefail
cd "$(dirname "$0")/.."

toolchain=$(rustc -V | tr -c 'A-Za-z0-9.\n-' '_')
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift/target/$toolchain}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
step() { echo; echo "== $*"; }

what=${1:-all}
case "$what" in
  all | admission | chaos | zero-downtime) ;;
  *) echo "usage: $0 [all | admission | chaos | zero-downtime]" >&2; exit 2 ;;
esac

. scripts/prepare.sh

if [ "$what" = all ] || [ "$what" = admission ]; then
  step "admission webhook under load (cargo bench --bench admission)"
  cargo bench --locked --bench admission
fi
if [ "$what" = all ] || [ "$what" = chaos ]; then
  step "chaos: ${RAYSHIFT_CHAOS_RUNS:=50} kill -9 runs, kube-apiserver restarts (tests/chaos_e2e.rs)"
  RAYSHIFT_CHAOS_RUNS=$RAYSHIFT_CHAOS_RUNS cargo test --locked --test chaos_e2e -- --nocapture --test-threads 1
fi
if [ "$what" = all ] || [ "$what" = zero-downtime ]; then
  step "zero downtime through Traefik, real Ray Serve (tests/ray_serve_e2e.rs)"
  cargo test --locked --test ray_serve_e2e zero_downtime -- --nocapture
fi
