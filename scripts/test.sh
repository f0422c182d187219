#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and integration tests (real sockets on
# 127.0.0.1, real TLS clients, a real redis-server, sslyze), the engine's constant-time
# check under valgrind, and a bounded fuzzing run of every fuzz target.
# FUZZ_SECONDS (default 5) sets the fuzzing time per target: enough to replay the committed
# corpora and explore a little in CI's dev build; longer campaigns: fuzz/run.sh (see there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
# The release profile keeps line tables for perf; the tests need none, and building and
# linking every test binary without them saves minutes on a 2-core machine. Code
# generation is the same (the constant-time check runs on the same build).
export CARGO_PROFILE_RELEASE_DEBUG=0
start=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - start ))s)"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
# The feature adds the one example `cargo test` does not build (crates/engine/Cargo.toml).
cargo clippy --workspace --all-targets --release --features tlsterm-engine/avx2-x25519-prototype -- -D warnings

step "cargo test"
# Most of the integration tests' time is spent waiting (on clients, deadlines, the test
# CA): with two tests per core the suite took 61-64 s instead of 97 s on 2 cores, and
# passed with a busy loop taking one of them.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-$((2 * $(nproc)))}
cargo test --workspace --release

if [ -x crates/engine/ct/run.sh ]; then
    step "constant-time check (valgrind memcheck, key material undefined)"
    crates/engine/ct/run.sh
fi

step "fuzzing (cargo-fuzz, every target ${FUZZ_SECONDS:-5}s from the committed corpora)"
bash fuzz/run.sh "${FUZZ_SECONDS:-5}"

step "all tests passed"
