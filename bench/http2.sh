#!/usr/bin/env bash
# Requests per server CPU-second over kept-alive HTTP/2 and HTTP/1.1 connections: tlsterm's
# `mode = "http"` against HAProxy + AWS-LC's `mode http`, both forwarding to the same
# HTTP/1.1 backend (`tlsterm backend`) over pooled connections, h2load (nghttp2) as the
# client. ECDSA P-256 certificate, TLS 1.3; the server alone on CPU 0 (with the backend),
# capped at QUOTA of a core (default 0.5, so that the one client core saturates it), h2load
# on CPU 1. The servers and protocols alternate run by run; one line per run, then medians.
#
#   bench/http2.sh [RUNS] [SECONDS]
#
# URL_PATH (default /bytes/1024) is what each request asks for; STREAMS (default 8) how many
# requests an HTTP/2 connection has open at once; CONNECTIONS (default 16 for HTTP/2, 64 for
# HTTP/1.1, one request at a time each). HAPROXY_AWSLC names the HAProxy binary (default
# /opt/haproxy-awslc/sbin/haproxy, built by ../shared/tools/build-haproxy-awslc.sh; without
# it only tlsterm runs). TLSTERM_BASE=/path/to/tlsterm adds that build as "tlsterm-base", in
# the same runs (an A/B of a change). PROFILE=1 records each measurement with perf and
# prints, per request, where the server's CPU time went (bench/where_time_goes.py; perf's
# own cost lowers the figures a little).
set -euo pipefail
RUNS=${1:-5}
SECS=${2:-5}
QUOTA=${QUOTA:-0.5}
URL_PATH=${URL_PATH:-/bytes/1024}
STREAMS=${STREAMS:-8}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TLSTERM=$ROOT/target/release/tlsterm
HAPROXY=${HAPROXY_AWSLC:-/opt/haproxy-awslc/sbin/haproxy}
if ! command -v h2load >/dev/null; then
    echo "installing h2load (nghttp2-client)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-client >/dev/null
fi
WORK=$(mktemp -d)
openssl ecparam -name prime256v1 -out "$WORK/p256.pem"
openssl req -x509 -nodes -days 2 -newkey "ec:$WORK/p256.pem" -keyout "$WORK/key.pem" \
    -out "$WORK/cert.pem" -subj /CN=localhost 2>/dev/null
cat "$WORK/cert.pem" "$WORK/key.pem" > "$WORK/both.pem"
taskset -c 0 "$TLSTERM" backend --listen 127.0.0.1:9719 2>/dev/null &
backend=$!
trap 'kill $backend 2>/dev/null; rm -rf "$WORK"' EXIT

cat > "$WORK/tlsterm.toml" <<CONF
workers = 1
[log]
level = "warn"
connections = false
[[listener]]
address = "127.0.0.1:9717"
backends = ["127.0.0.1:9719"]
mode = "http"
alpn = ["h2", "http/1.1"]
[[listener.certificate]]
cert = "$WORK/cert.pem"
key = "$WORK/key.pem"
CONF
# As bench/conf/haproxy.cfg (bench/peers.py), with ALPN offering HTTP/2.
cat > "$WORK/haproxy.cfg" <<CONF
global
    nbthread 1
    maxconn 4000
    ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
    http-reuse always
frontend fe
    bind 127.0.0.1:9717 ssl crt $WORK/both.pem alpn h2,http/1.1
    default_backend be
backend be
    server s1 127.0.0.1:9719 maxconn 1000
CONF

servers=(tlsterm)
[ -x "$HAPROXY" ] && servers+=(haproxy-awslc) || echo "no $HAPROXY: tlsterm only" >&2
[ -n "${TLSTERM_BASE:-}" ] && servers+=(tlsterm-base)
QUOTA_CGROUP=/sys/fs/cgroup/cpu/tlsterm-bench-server
mkdir -p "$QUOTA_CGROUP"
echo 100000 > "$QUOTA_CGROUP/cpu.cfs_period_us"
awk -v q="$QUOTA" 'BEGIN {printf "%d\n", q * 100000}' > "$QUOTA_CGROUP/cpu.cfs_quota_us"
cpu_ticks() { awk '{s += $14 + $15} END {print s}' "/proc/$1/stat"; }
start() {
    case $1 in
        tlsterm) taskset -c 0 "$TLSTERM" serve -c "$WORK/tlsterm.toml" 2>"$WORK/server.log" & ;;
        tlsterm-base) taskset -c 0 "$TLSTERM_BASE" serve -c "$WORK/tlsterm.toml" 2>"$WORK/server.log" & ;;
        haproxy-awslc) taskset -c 0 "$HAPROXY" -db -f "$WORK/haproxy.cfg" 2>"$WORK/server.log" & ;;
    esac
    server=$!
    echo $server > "$QUOTA_CGROUP/cgroup.procs"
    until curl -sk -o /dev/null https://127.0.0.1:9717/; do sleep 0.05; done
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) runs=$RUNS seconds=$SECS quota=$QUOTA path=$URL_PATH"
for run in $(seq 1 "$RUNS"); do
    for protocol in h2 http/1.1; do
        for name in "${servers[@]}"; do
            start "$name"
            if [ "$protocol" = h2 ]; then
                flags=(-c "${CONNECTIONS:-16}" -m "$STREAMS")
            else
                flags=(--h1 -c "${CONNECTIONS:-64}")
            fi
            data="$WORK/perf-$name-${protocol//\//}.data"
            [ -n "${PROFILE:-}" ] && { perf record -q -F 1999 -o "$data" -p $server >/dev/null 2>&1 & profiler=$!; }
            before=$(cpu_ticks $server)
            out=$(taskset -c 1 h2load -D "$SECS" "${flags[@]}" "https://127.0.0.1:9717$URL_PATH" 2>&1)
            ticks=$(($(cpu_ticks $server) - before))
            [ -n "${PROFILE:-}" ] && { kill -INT $profiler; wait $profiler 2>/dev/null || true; }
            kill $server; wait $server 2>/dev/null || true
            done=$(sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p' <<< "$out")
            negotiated=$(sed -n 's/^Application protocol: //p' <<< "$out")
            echo "run $run $protocol $name requests=$done protocol=$negotiated server_cpu_s=$(echo "scale=2; $ticks/100" | bc) per_cpu_s=$((done * 100 / ticks))" \
                | tee -a "$WORK/results"
            if [ -n "${PROFILE:-}" ]; then
                echo "$name over $protocol: where a request's server CPU went"
                python3 "$ROOT/bench/where_time_goes.py" "$data" "$(echo "scale=2; $ticks/100" | bc)" "$done"
            fi
        done
    done
done
for protocol in h2 http/1.1; do
    for name in "${servers[@]}"; do
        grep " $protocol $name " "$WORK/results" | sed 's/.* per_cpu_s=\([0-9]*\).*/\1/' | sort -n \
            | awk -v name="$name" -v p="$protocol" '{v[NR]=$1} END {m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2; printf "median %s %s: %d requests per server CPU-second\n", p, name, m}'
    done
done
