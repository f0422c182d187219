#!/usr/bin/env bash
# Installs what tlsterm needs on Debian 12 (as root).
#
#   bash scripts/setup.sh         everything the test suite needs (scripts/test.sh)
#   bash scripts/setup.sh --run   only what building and running tlsterm needs (scripts/run.sh)
#
# Building: compilers, cmake, clang/libclang for BoringSSL's bindings, git for the patches
# boring-sys applies to BoringSSL, and Rust (stable, via rustup) when cargo is missing.
# Testing adds the TLS clients the tests drive, redis-server, valgrind for the
# constant-time check, Go >= 1.26 for the Go test clients (Debian's golang-go is
# 1.19: a release from go.dev goes to /usr/local/go, checked against go.dev's published
# SHA-256) and Pebble, the test ACME CA.
set -euo pipefail

case "${1:-}" in
    "") run_only=false ;;
    --run) run_only=true ;;
    *) echo "usage: $0 [--run]" >&2; exit 2 ;;
esac

packages=(build-essential cmake clang libclang-dev perl git curl ca-certificates pkg-config)
if ! "$run_only"; then
    packages+=(golang-go openssl valgrind python3 procps redis-server)
fi
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

if "$run_only"; then
    exit 0
fi

# The Go test client needs crypto/tls with X25519MLKEM768 and ConnectionState().CurveID
# (Go 1.25); the HTTP/3 one (quic-go 0.65) needs Go 1.26.
go_new_enough() {
    local version
    version=$(GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null) || return 1
    python3 -c 'import sys; v = sys.argv[1].removeprefix("go").split("."); sys.exit(0 if (int(v[0]), int(v[1].split("rc")[0])) >= (1, 26) else 1)' "$version"
}
if ! go_new_enough go && ! go_new_enough /usr/local/go/bin/go; then
    go_version=1.26.8
    arch=$(dpkg --print-architecture)
    file="go${go_version}.linux-${arch}.tar.gz"
    echo "setup: installing Go ${go_version} in /usr/local/go"
    sum=$(curl -fsSL 'https://go.dev/dl/?mode=json&include=all' | python3 -c '
import json, sys
name = sys.argv[1]
print(next(f["sha256"] for r in json.load(sys.stdin) for f in r["files"] if f["filename"] == name))
' "$file")
    curl -fsSL -o "/tmp/$file" "https://go.dev/dl/$file"
    echo "$sum  /tmp/$file" | sha256sum -c --quiet
    rm -rf /usr/local/go
    tar -C /usr/local -xzf "/tmp/$file"
    rm -f "/tmp/$file"
fi

# Pebble (Let's Encrypt's test ACME server) and its DNS helper for the ACME tests, fetched
# now at the version tests/suite/common/pebble.rs pins (the tests build them from Go's cache).
pebble_version=v2.8.0
go_bin=go
go_new_enough go || go_bin=/usr/local/go/bin/go
for command in pebble pebble-challtestsrv; do
    GOTOOLCHAIN=local "$go_bin" install "github.com/letsencrypt/pebble/v2/cmd/${command}@${pebble_version}"
done


# cargo-deb builds the Debian package (scripts/package.sh; tests/suite/operator.rs inspects it).
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo deb --version >/dev/null 2>&1; then
    echo "setup: installing cargo-deb"
    cargo install cargo-deb --locked --version 3.8.0 --quiet
fi
