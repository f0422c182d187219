#!/usr/bin/env bash
# Builds tlsterm and runs `tlsterm serve` on its embedded default:
# https://127.0.0.1:8443/ with self-signed RSA-2048 and ECDSA P-256 certificates,
# forwarding to the built-in HTTP backend. Try: curl -k https://127.0.0.1:8443/
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what building and running needs (no test tools: Go, Pebble, valgrind, Redis).
bash scripts/setup.sh --run
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --bin tlsterm
exec target/release/tlsterm serve "$@"
