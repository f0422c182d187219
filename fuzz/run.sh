#!/usr/bin/env bash
# Fuzzes every target for SECONDS each (default 20), starting from the committed seed
# corpora in corpus/<target>/ (never written to: new inputs go to a scratch directory).
# Installs the nightly toolchain and cargo-fuzz if missing; the main build never needs
# nightly. A crash leaves its input in fuzz/artifacts/<target>/ and fails the script.
#
#   fuzz/run.sh [SECONDS]
#   FUZZ_PROFILE=release fuzz/run.sh 600     # a longer campaign, fully optimised
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/crash-...   # reproduce
#
# The default dev build (the engine's arithmetic optimised, see Cargo.toml) compiles in
# about half the time of a release build and runs the other targets 15-50 times slower:
# enough to replay the corpora and explore for a few seconds, which is what CI asks of it.
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_PER_TARGET=${1:-20}
export PATH="$HOME/.cargo/bin:$PATH"

start=$(date +%s)
step() { echo "=== $* ($(($(date +%s) - start))s)"; }

if ! rustup toolchain list | grep -q '^nightly'; then
    step "installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi
if ! command -v cargo-fuzz >/dev/null; then
    step "installing cargo-fuzz"
    # A debug build of the tool: it only drives cargo, and a debug build compiles faster.
    cargo install cargo-fuzz --locked --debug
fi

# FUZZ_SANITIZER=address for AddressSanitizer (slower to build and run); CI uses none:
# the Rust code outside the SIMD kernels is memory safe, and BoringSSL is not
# instrumented either way.
SANITIZER=${FUZZ_SANITIZER:-none}
case "${FUZZ_PROFILE:-dev}" in
    dev) PROFILE=(--dev) ;;
    release) PROFILE=() ;;
    *) echo "FUZZ_PROFILE: dev or release" >&2; exit 2 ;;
esac
# BoringSSL's C code is built by CMake, never instrumented: the library the main release
# build compiled serves the fuzz build as well, instead of a second build of it (minutes
# on a small machine). Without a main build, boring-sys builds its own.
if [ -z "${BORING_BSSL_PATH:-}" ]; then
    built=$(ls -t ../target/release/build/boring-sys-*/out/build/libssl.a 2>/dev/null | head -1 || true)
    if [ -n "$built" ]; then
        out=$(realpath "$(dirname "$built")/..")
        export BORING_BSSL_PATH="$out/build" BORING_BSSL_INCLUDE_PATH="$out/boringssl/include"
        step "using the main build's BoringSSL ($out)"
    fi
fi
step "building the fuzz targets (nightly, ${FUZZ_PROFILE:-dev} profile, sanitizer: $SANITIZER)"
cargo +nightly fuzz build "${PROFILE[@]}" -s "$SANITIZER"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in $(cargo +nightly fuzz list); do
    step "fuzzing $target for ${SECONDS_PER_TARGET}s"
    mkdir -p "$scratch/$target"
    log="$scratch/$target.log"
    if ! cargo +nightly fuzz run "${PROFILE[@]}" -s "$SANITIZER" "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=30 -rss_limit_mb=4096 \
        -print_final_stats=1 >"$log" 2>&1; then
        tail -60 "$log"
        echo "fuzz target $target failed; the input is in fuzz/artifacts/$target/"
        exit 1
    fi
    grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^INFO: seed corpus" "$log" || true
done
step "all fuzz targets ran without a crash"
