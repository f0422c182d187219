#!/usr/bin/env bash
# Peer benchmark: nginx, HAProxy, hitch and tlsterm, same scenarios, one run.
# Run as root from anywhere:  bench/peers.sh [peers.py options, e.g. --runs 3 --servers nginx,tlsterm]
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for b in nginx haproxy hitch openssl taskset; do command -v "$b" >/dev/null || need+=("$b"); done
if ((${#need[@]})); then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y nginx haproxy hitch openssl util-linux
fi
if [ ! -x bench/.venv/bin/python ]; then
    python3 -m venv bench/.venv
    bench/.venv/bin/pip install -q matplotlib
fi
cargo build --release
# Debian starts no services in this container; make sure none hold our ports.
exec bench/.venv/bin/python bench/peers.py "$@"
