#!/usr/bin/env bash
# Builds the Debian package: target/debian/tlsterm_<version>-1_<arch>.deb (the release
# binary, /etc/tlsterm/tlsterm.toml, the hardened systemd unit packaging/tlsterm.service,
# the tlsterm system user). Installs cargo-deb when missing.
#
#   bash scripts/package.sh && dpkg -i target/debian/tlsterm_*.deb
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo deb --version >/dev/null 2>&1; then
    cargo install cargo-deb --locked --version 3.8.0
fi
cargo deb
