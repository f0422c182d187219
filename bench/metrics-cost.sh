#!/usr/bin/env bash
# Handshakes per server CPU-second with metrics on and off (issue 5's cost budget: <= 2%).
# TLS 1.3 full handshakes, RSA-2048, batch engine, server on CPU 0, client on CPU 1.
# Runs alternate on/off so slow drifts of a shared machine hit both alike.
#   bench/metrics-cost.sh [RUNS] [SECONDS]
set -euo pipefail
RUNS=${1:-5}
SECS=${2:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TLSTERM=$ROOT/target/release/tlsterm
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
openssl req -x509 -nodes -days 2 -newkey rsa:2048 -keyout key.pem -out cert.pem -subj /CN=localhost 2>/dev/null
"$TLSTERM" backend --listen 127.0.0.1:9719 2>/dev/null &
backend=$!
trap 'kill $backend 2>/dev/null; rm -rf "$WORK"' EXIT
for metrics in on off; do
    enabled=$([ $metrics = on ] && echo true || echo false)
    cat > $metrics.toml <<CONF
workers = 1
[admin]
enabled = $enabled
address = "127.0.0.1:9718"
[[listener]]
address = "127.0.0.1:9717"
backends = ["127.0.0.1:9719"]
[[listener.certificate]]
cert = "cert.pem"
key = "key.pem"
CONF
done
cpu() { awk '{print $14 + $15}' /proc/$1/stat; }
echo "load avg before: $(cut -d' ' -f1-3 /proc/loadavg)"
for run in $(seq 1 "$RUNS"); do
    for metrics in on off; do
        taskset -c 0 "$TLSTERM" serve -c $metrics.toml 2>serve.log &
        server=$!
        until grep -q "tlsterm serving" serve.log; do sleep 0.05; done
        before=$(cpu $server)
        handshakes=$(taskset -c 1 "$TLSTERM" bench https://127.0.0.1:9717/ --insecure --json -c 64 -d ${SECS}s --mode full --tls-version 1.3 2>/dev/null \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["handshakes"])')
        after=$(cpu $server)
        kill $server; wait $server 2>/dev/null || true
        ticks=$((after - before))
        echo "run $run metrics=$metrics handshakes=$handshakes server_cpu_s=$(echo "scale=2; $ticks/100" | bc) per_cpu_s=$(echo "scale=0; $handshakes*100/$ticks" | bc)"
    done
done
echo "load avg after: $(cut -d' ' -f1-3 /proc/loadavg)"
