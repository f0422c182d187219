#!/usr/bin/env bash
# Handshakes per server CPU-second of tlsterm at 1, 2, 4 and 8 workers: how much of a
# worker's efficiency is left as workers are added. The server is pinned to cores 0..W-1
# (one worker each), `tlsterm bench` to the cores after them, with one client thread per
# client core; a count of workers that leaves the client no core is skipped by name.
#
#   bench/scaling.sh [SECONDS] [WORKERS...]        (defaults: 5 s; 1 2 4 8)
#
# KEY=ec:p256 (default) or rsa:2048 for the certificate; MODE=full (default) or resume;
# GROUP= a key-exchange group for the client (default: the client's own order);
# BIN= the tlsterm to measure (default target/release/tlsterm; the client and the
# backend are always this checkout's). Needs more cores than workers: on a 2-core machine
# only 1 worker is measured. Prints one line per count and a table:
# workers, handshakes/s, server CPU (cores), handshakes per server CPU-second, and the
# efficiency per worker against 1 worker.
set -euo pipefail
SECS=${1:-5}
shift || true
COUNTS=("$@")
[ ${#COUNTS[@]} -gt 0 ] || COUNTS=(1 2 4 8)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLIENT=$ROOT/target/release/tlsterm
BIN=$(realpath "${BIN:-$CLIENT}")
KEY=${KEY:-ec:p256}
MODE=${MODE:-full}
CORES=$(nproc)
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT

if [ "$KEY" = ec:p256 ]; then
    openssl ecparam -name prime256v1 -out "$WORK/p256.pem"
    newkey=ec:$WORK/p256.pem
else
    newkey=$KEY
fi
openssl req -x509 -nodes -days 2 -newkey "$newkey" -keyout "$WORK/key.pem" -out "$WORK/cert.pem" \
    -subj /CN=localhost 2>/dev/null
# The backend shares the server's cores (as in bench/peers.py), and its CPU is not counted.
"$CLIENT" backend --listen 127.0.0.1:9729 2>/dev/null &

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
group_flag=()
[ -n "${GROUP:-}" ] && group_flag=(--group "$GROUP")
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $CORES cores;" \
    "key=$KEY mode=$MODE seconds=$SECS load avg before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A rate cpu per
measured=()
for workers in "${COUNTS[@]}"; do
    client_cores=$((CORES - workers))
    if [ "$client_cores" -lt 1 ]; then
        echo "skip $workers workers: this machine has $CORES cores, none would be left for the client"
        continue
    fi
    cat > "$WORK/tlsterm.toml" <<CONF
workers = $workers
pin_workers = true
[admin]
address = "127.0.0.1:9728"
[[listener]]
address = "127.0.0.1:9727"
backends = ["127.0.0.1:9729"]
[[listener.certificate]]
cert = "$WORK/cert.pem"
key = "$WORK/key.pem"
CONF
    : > "$WORK/serve.log"
    taskset -c "0-$((workers - 1))" "$BIN" serve -c "$WORK/tlsterm.toml" 2>"$WORK/serve.log" &
    server=$!
    until grep -q "tlsterm serving" "$WORK/serve.log"; do sleep 0.05; done
    before=$(cpu_ticks $server)
    report=$(taskset -c "$workers-$((CORES - 1))" "$CLIENT" bench https://127.0.0.1:9727/ --insecure \
        --json --threads "$client_cores" -c $((64 * workers)) -d "${SECS}s" --mode "$MODE" \
        "${group_flag[@]}" 2>/dev/null)
    after=$(cpu_ticks $server)
    kill $server
    wait $server 2>/dev/null || true
    handshakes=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["handshakes"])' <<<"$report")
    elapsed=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["elapsed_s"])' <<<"$report")
    ticks=$((after - before))
    rate[$workers]=$(python3 -c "print(round($handshakes / $elapsed))")
    cpu[$workers]=$(python3 -c "print(round($ticks / 100 / $elapsed, 2))")
    per[$workers]=$((handshakes * 100 / ticks))
    measured+=("$workers")
    echo "$workers workers: ${rate[$workers]} handshakes/s, server ${cpu[$workers]} cores," \
        "${per[$workers]} per server CPU-second"
done
[ ${#measured[@]} -gt 0 ] || exit 0
base=${per[${measured[0]}]}
echo
echo "| workers | handshakes/s | server CPU (cores) | per server CPU-s | per-worker efficiency |"
echo "|---:|---:|---:|---:|---:|"
for workers in "${measured[@]}"; do
    echo "| $workers | ${rate[$workers]} | ${cpu[$workers]} | ${per[$workers]} |" \
        "$(python3 -c "print(f'{${per[$workers]} / $base:.2f}')") |"
done
echo "per-worker efficiency: handshakes per server CPU-second over those of ${measured[0]} worker(s)"
