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
cargo test --workspace --locked --no-run 2>&1 | tee -a "$log"

# The end-to-end binaries other than the real-Ray one spend most of their time waiting for pacing intervals
# and controllers (20-36 % of the 2 cores each, BENCHMARKS.md "CI wall time"), so they run in two lanes side by
# side, each drawing test ports from a range of its own. The real-Ray binary runs alone afterwards: its heads
# need the cores, and its tests failed when the machine was starved.
lane() { # NAME FIRST-END CARGO-TEST-ARGS...
  local name=$1 ports=$2
  shift 2
  RAYSHIFT_TEST_PORTS=$ports cargo test --locked --no-fail-fast "$@" >>"$logs/$name" 2>&1 || touch "$logs/failed"
}
low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
upgrades=(incremental_e2e chaos_e2e)
rest=()
for f in tests/*.rs; do
  t=$(basename "$f" .rs)
  case " ${upgrades[*]} ray_serve_e2e " in *" $t "*) ;; *) rest+=(--test "$t") ;; esac
done
step "cargo test: two lanes side by side (${upgrades[*]} | everything else but ray_serve_e2e)"
began=$SECONDS
{
  lane upgrades "$((low - 12000))-$((low - 6000))" -p rayshift "${upgrades[@]/#/--test=}"
  echo "lane upgrades ended after $((SECONDS - began))s" >>"$logs/upgrades"
} &
{
  lane rest "$((low - 6000))-$low" --workspace --exclude rayshift
  lane rest "$((low - 6000))-$low" -p rayshift --bins "${rest[@]}"
  echo "lane rest ended after $((SECONDS - began))s" >>"$logs/rest"
} &
wait
for name in upgrades rest; do
  echo "--- lane $name ---"
  cat "$logs/$name"
done | tee -a "$log"

step "cargo test: the real-Ray binary, alone"
cargo test --locked --no-fail-fast -p rayshift --test ray_serve_e2e 2>&1 | tee -a "$log" || touch "$logs/failed"
passed=$(grep -Eo 'test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')

step "no control-plane, webhook, controller, Ray or Traefik process left behind"
cache_bin=$(bash tests/env/control-plane.sh bin)
kuberay_bin=$(bash tests/env/kuberay.sh bin)
for _ in $(seq 30); do
  left=$(pgrep -f "$cache_bin/(etcd|kube-apiserver|kube-controller-manager|kube-scheduler)|$kuberay_bin/(ray-operator|kwok)|/etcd --data-dir .*/rayshift-cp-|rayshift (webhook|controller)|$ray_venv/|$traefik_bin " || true)
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
