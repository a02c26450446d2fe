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

step "cargo test (workspace)"
cargo test --workspace --locked --no-fail-fast

echo
echo "== all checks passed in $(( $(date +%s) - start ))s"
