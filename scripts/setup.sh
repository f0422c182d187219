#!/usr/bin/env bash
# Installs what building and testing tlsterm needs on Debian 12 (as root): compilers and
# cmake for BoringSSL, the TLS clients the tests drive, valgrind for the constant-time
# check, and Rust (stable, via rustup) when cargo is missing.
set -euo pipefail

packages=(build-essential cmake clang libclang-dev golang-go perl git curl ca-certificates
          openssl pkg-config valgrind python3 procps redis-server)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        :
    else
        echo "setup: installing Rust (stable) with rustup"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
    fi
fi
