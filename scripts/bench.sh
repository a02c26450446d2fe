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
#   scripts/bench.sh scale            10, 100 and 1,000 RayServices (1,000 also over 20 namespaces) on the real
#                                     apiserver, release build: time to Ready, RSS, settled writes, CPU, Serve reads;
#                                     then how many upgrades at once keep every step on time (RAYSHIFT_SCALE_SWEEP,
#                                     "10 20 30 40" at 1,000), and what bounds them: the apiserver's time for 50
#                                     route writes at once, and its CPU per write of each kind rayshift writes
#   scripts/bench.sh fuzz             libFuzzer on the AdmissionReview handlers for RAYSHIFT_FUZZ_SECONDS (600),
#                                     growing fuzz/corpus/ (then minimised); a crash fails the run
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
  all | admission | chaos | zero-downtime | scale | fuzz) ;;
  *) echo "usage: $0 [all | admission | chaos | zero-downtime | scale | fuzz]" >&2; exit 2 ;;
esac

case "$what" in all | chaos | zero-downtime | scale) . scripts/prepare.sh ;; esac

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
if [ "$what" = all ] || [ "$what" = scale ]; then
  matplotlib_version=3.10.7
  step "scale: 10, 100, 1,000 RayServices (tests/scale_e2e.rs, release build)"
  report="$CARGO_TARGET_DIR/scale-report.md"
  upgrades="$CARGO_TARGET_DIR/scale-upgrades.md"
  rm -f "$report" "$upgrades"
  # RayServices:namespaces:upgrades started at once
  for run in ${RAYSHIFT_SCALE_RUNS:-10:1:3 100:1:30 1000:1:50 1000:20:50}; do
    IFS=: read -r services spaces started <<<"$run"
    RAYSHIFT_SCALE_SERVICES=$services RAYSHIFT_SCALE_NAMESPACES=$spaces RAYSHIFT_SCALE_UPGRADES=$started \
      RAYSHIFT_SCALE_SETTLE_SECONDS=${RAYSHIFT_SCALE_SETTLE_SECONDS:-60} RAYSHIFT_SCALE_REPORT=$report \
      RAYSHIFT_SCALE_UPGRADE_REPORT=$upgrades cargo test --release --locked --test scale_e2e -- --nocapture || true
  done
  step "how many upgrades at once stay on time: 1,000 RayServices, ${RAYSHIFT_SCALE_SWEEP:=10 20 30 40} upgrades at once"
  sweep="$CARGO_TARGET_DIR/scale-sweep-upgrades.md"
  rm -f "$sweep"
  for started in $RAYSHIFT_SCALE_SWEEP; do
    RAYSHIFT_SCALE_SERVICES=1000 RAYSHIFT_SCALE_NAMESPACES=1 RAYSHIFT_SCALE_UPGRADES=$started \
      RAYSHIFT_SCALE_SETTLE_SECONDS=30 RAYSHIFT_SCALE_UPGRADE_REPORT=$sweep \
      cargo test --release --locked --test scale_e2e -- --nocapture || true
  done
  step "50 HTTPRoute writes at once on an idle apiserver (what bounds 50 traffic steps due at one instant)"
  cargo test --release --locked --test scale_e2e fifty_route_writes_at_once -- --ignored --nocapture
  step "kube-apiserver CPU per write, by kind, one at a time on an idle apiserver (what bounds time to Ready)"
  cargo test --release --locked --test scale_e2e apiserver_cpu_per_write_by_kind -- --ignored --nocapture
  echo
  echo "| RayServices | namespaces | s to all Ready | API writes per RayService to Ready | RSS MiB at Ready | RSS MiB settled (peak) | API writes/min settled | CPU % of a core settled | Serve status reads per RayService per 10 s |"
  echo "|---|---|---|---|---|---|---|---|---|"
  cat "$report"
  echo
  echo "| RayServices | namespaces | upgrades at once | traffic steps | lateness p50 / p99 / max ms | steps ≤ 100 ms late | on the controller's clock: traffic steps | lateness p50 / p99 / max ms | steps ≤ 100 ms late |"
  echo "|---|---|---|---|---|---|---|---|---|"
  cat "$upgrades" "$sweep"
  step "plot: benchmarks/scale.png (matplotlib $matplotlib_version, in a venv of its own, installed once, cached)"
  plot_venv="${XDG_CACHE_HOME:-$HOME/.cache}/rayshift/plot-matplotlib-$matplotlib_version"
  [ -x "$plot_venv/bin/python" ] || { python3 -m venv "$plot_venv" && "$plot_venv/bin/pip" install -q "matplotlib==$matplotlib_version"; }
  "$plot_venv/bin/python" scripts/plot_scale.py "$report" benchmarks/scale.png
fi
if [ "$what" = all ] || [ "$what" = fuzz ]; then
  fuzz_version=0.13.2
  fuzz_root="${XDG_CACHE_HOME:-$HOME/.cache}/rayshift/cargo-fuzz-$fuzz_version"
  step "cargo-fuzz $fuzz_version (crates.io, installed once, cached)"
  [ -x "$fuzz_root/bin/cargo-fuzz" ] || cargo install --locked cargo-fuzz --version "$fuzz_version" --root "$fuzz_root"
  step "fuzz the AdmissionReview handlers for ${RAYSHIFT_FUZZ_SECONDS:=600} s (fuzz/fuzz_targets/admission_review.rs)"
  # Without a sanitizer: rayshift forbids unsafe code, so libFuzzer looks for panics, hangs and memory blow-ups.
  fuzz=(env PATH="$fuzz_root/bin:$PATH" cargo fuzz)
  opts=(-s none --target-dir "$CARGO_TARGET_DIR/fuzz")
  (cd fuzz && "${fuzz[@]}" run "${opts[@]}" admission_review corpus/admission_review seeds -- \
    -dict=admission_review.dict -max_len=65536 -timeout=10 -max_total_time="$RAYSHIFT_FUZZ_SECONDS" -print_final_stats=1)
  (cd fuzz && "${fuzz[@]}" cmin "${opts[@]}" admission_review corpus/admission_review -- -max_len=65536)
  echo "corpus: $(ls fuzz/corpus/admission_review | wc -l) inputs after minimising"
fi
