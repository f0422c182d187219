#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and integration tests (real sockets on
# 127.0.0.1, real TLS clients), and the engine's constant-time check under valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
start=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - start ))s)"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings

step "cargo test"
cargo test --workspace --release

if [ -x crates/engine/ct/run.sh ]; then
    step "constant-time check (valgrind memcheck, key material undefined)"
    crates/engine/ct/run.sh
fi

step "all tests passed"
