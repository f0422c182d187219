#!/usr/bin/env bash
# Memory and CPU of idle TLS connections: for each variant (a tlsterm binary, e.g. one
# built from another commit), a server with 2 workers relaying to the built-in backend
# (a process of its own, so that the server's RSS is the proxy's alone) is given
# CONNECTIONS connections by `tlsterm bench --mode idle` (handshake with an ECDSA P-256
# certificate, TLS 1.3, one keep-alive request each), which then holds them idle for
# SECONDS and reads the server's RSS and CPU from /proc. It opens half of them first and
# holds those idle for SECONDS too: besides RSS growth per connection from the start, it
# prints the growth per connection of the second half, without what the server pays once
# (code and allocator pools its first connections touch, pooled backend connections).
# Variants run one after another, each against a fresh server.
#
#   bench/idle.sh CONNECTIONS [SECONDS] NAME=BINARY ...
#   bench/idle.sh 4000 5 new=target/release/tlsterm old=/tmp/old/tlsterm
#   bench/idle.sh 4000 5 tlsterm=target/release/tlsterm haproxy=/opt/haproxy-awslc/sbin/haproxy
#
# A binary named `haproxy` is run as HAProxy with 2 threads in the listener's mode (`mode
# tcp`, or `mode http` with pooled backend connections), same certificate and backend.
#
# CLIENT=BINARY: the tlsterm that runs the client and the backend (default: this tree's).
# CERTS=DIR: DIR/cert.pem and DIR/key.pem instead of a new ECDSA P-256 certificate.
# MODE=http: the listener forwards HTTP requests over pooled backend connections
# (`mode = "http"`) instead of relaying bytes (the default, MODE=tcp). HTTP2=1 (with
# MODE=http): the servers offer h2 and the client chooses it, one HTTP/2 request each.
#
# Each connection takes two descriptors of the server's (client and backend) and one of
# the client's and of the backend's: `ulimit -n` bounds CONNECTIONS to about half of it.
set -euo pipefail
CONNECTIONS=${1:?usage: $0 CONNECTIONS [SECONDS] NAME=BINARY ...}
SECS=${2:-5}
shift 2 || true
[ $# -ge 1 ] || { echo "usage: $0 CONNECTIONS [SECONDS] NAME=BINARY ..." >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLIENT=${CLIENT:-$ROOT/target/release/tlsterm}
WORK=$(mktemp -d)
if [ -n "${CERTS:-}" ]; then
    cp "$CERTS/cert.pem" "$CERTS/key.pem" "$WORK/"
else
    openssl ecparam -name prime256v1 -out "$WORK/p256.pem"
    openssl req -x509 -nodes -days 2 -newkey "ec:$WORK/p256.pem" -keyout "$WORK/key.pem" \
        -out "$WORK/cert.pem" -subj /CN=localhost 2>/dev/null
fi
"$CLIENT" backend --listen 127.0.0.1:9729 2>/dev/null &
backend=$!
server=
trap 'kill $backend $server 2>/dev/null; rm -rf "$WORK"' EXIT
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs;" \
    "$CONNECTIONS connections, idle ${SECS}s; ulimit -n $(ulimit -n)"
for variant in "$@"; do
    name=${variant%%=*}
    binary=${variant#*=}
    if [ "$(basename "$binary")" = haproxy ]; then
        cat "$WORK/cert.pem" "$WORK/key.pem" > "$WORK/both.pem"
        # maxconn: HAProxy asks for descriptors by it, and this sandbox allows 20,000.
        cat > "$WORK/haproxy.cfg" <<CONF
global
    nbthread 2
    maxconn 9900
defaults
    mode ${MODE:-tcp}
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    ${MODE:+http-reuse always}
frontend fe
    bind 127.0.0.1:9728 ssl crt $WORK/both.pem alpn ${HTTP2:+h2,}http/1.1
    default_backend be
backend be
    server s1 127.0.0.1:9729
CONF
        "$binary" -db -f "$WORK/haproxy.cfg" 2> "$WORK/$name.log" &
        server=$!
        for _ in $(seq 100); do
            (exec 3<>/dev/tcp/127.0.0.1/9728) 2>/dev/null && break
            sleep 0.1
        done
    else
        cat > "$WORK/tlsterm.toml" <<CONF
workers = 2
max_connections = 1000000
[[listener]]
address = "127.0.0.1:9728"
backends = ["127.0.0.1:9729"]
${MODE:+mode = \"$MODE\"}
${HTTP2:+alpn = [\"h2\", \"http/1.1\"]}
max_connections = 1000000
[[listener.certificate]]
cert = "$WORK/cert.pem"
key = "$WORK/key.pem"
CONF
        "$binary" serve -c "$WORK/tlsterm.toml" 2> "$WORK/$name.log" &
        server=$!
        for _ in $(seq 100); do
            grep -q "tlsterm serving" "$WORK/$name.log" && break
            sleep 0.1
        done
        grep -q "tlsterm serving" "$WORK/$name.log" || { cat "$WORK/$name.log" >&2; exit 1; }
    fi
    "$CLIENT" bench --mode idle --insecure --quiet --json --tls-version 1.3 \
        -c "$CONNECTIONS" -d "${SECS}s" --timeout 60s --server-pid "$server" ${HTTP2:+--alpn h2} \
        https://127.0.0.1:9728/ > "$WORK/$name.json"
    python3 - "$name" "$WORK/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
print(f"{sys.argv[1]:>10}: {r['open']} open ({r['errors']} errors), RSS {r['before']['rss_kib']} -> "
      f"{r['half_idle']['rss_kib']} (half) -> {r['idle']['rss_kib']} KiB: "
      f"{r['rss_kib_per_connection']:.2f} KiB per connection, "
      f"{r['rss_kib_per_added_connection']:.2f} per connection of the second half; "
      f"idle CPU {r['idle_cpu_util']*100:.3f}% of a core")
PY
    kill "$server"
    wait "$server" 2>/dev/null || true
    server=
done
