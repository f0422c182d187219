#!/usr/bin/env bash
# Handshakes per server CPU-second with metrics on and off (the metrics' cost budget: <= 2%).
# TLS 1.3 full handshakes, RSA-2048, batch engine, server on CPU 0, client on CPU 1, runs
# alternating (see bench/ab.sh).
#   bench/metrics-cost.sh [RUNS] [SECONDS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
exec "$ROOT/bench/ab.sh" "${1:-5}" "${2:-5}" on="$ROOT/target/release/tlsterm" \
    off="$ROOT/target/release/tlsterm,metrics=off"
