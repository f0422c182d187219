#!/usr/bin/env bash
# Handshakes per server CPU-second of tlsterm (or of HAProxy + AWS-LC) at 1, 2, 4 and 8
# workers: how much of a worker's efficiency is left as workers are added. The server is
# pinned to cores 0..W-1 (one worker or thread each), `tlsterm bench` to the cores after
# them, with one client thread per client core; a count of workers that leaves the client
# no core is skipped by name.
#
#   bench/scaling.sh [SECONDS] [WORKERS...]        (defaults: 5 s; 1 2 4 8)
#
# KEY=ec:p256 (default) or rsa:2048 for the certificate (CERTS=DIR: DIR/cert.pem and
# DIR/key.pem instead of a new one); MODE=full (default) or resume;
# GROUP= a key-exchange group for the client (default: the client's own order);
# BACKEND_THREADS= threads of the backend (default 1; one thread answers about 20,000
# new connections per second, which 8 tlsterm workers exceed); BACKEND_CPUS= cores for it.
# ACCEPT=per-worker sets tlsterm's `accept` (default shared, tlsterm's own default).
# QUIC=1 measures HTTP/3 handshakes instead (`quic = true`; HAProxy's `bind quic4@`, its
# Retry kept off as tlsterm's stays off below 200 handshakes in progress per worker).
# BIN= the tlsterm to measure (default target/release/tlsterm; the client and the
# backend are always this checkout's). SERVER=haproxy-awslc measures HAProxy + AWS-LC
# instead ($HAPROXY_AWSLC, default /opt/haproxy-awslc/sbin/haproxy; built by bench/peers.sh)
# with bench/conf/haproxy.cfg's settings at `nbthread` W, each thread pinned to its core. Needs more cores than workers: on a 2-core machine
# only 1 worker is measured. Prints one line per count and a table:
# workers, handshakes/s, server CPU (cores), handshakes per server CPU-second, and the
# efficiency per worker against 1 worker; each line also says how busy the client's cores
# were and the backend's CPU, which tell a server that waits for its load from one that
# is slow.
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
SERVER=${SERVER:-tlsterm}
HAPROXY_AWSLC=${HAPROXY_AWSLC:-/opt/haproxy-awslc/sbin/haproxy}
case $SERVER in tlsterm | haproxy-awslc) ;; *) echo "SERVER=$SERVER: tlsterm or haproxy-awslc" >&2; exit 2 ;; esac
CORES=$(nproc)
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT

if [ -n "${CERTS:-}" ]; then
    cp "$CERTS/cert.pem" "$CERTS/key.pem" "$WORK/"
else
    if [ "$KEY" = ec:p256 ]; then
        openssl ecparam -name prime256v1 -out "$WORK/p256.pem"
        newkey=ec:$WORK/p256.pem
    else
        newkey=$KEY
    fi
    openssl req -x509 -nodes -days 2 -newkey "$newkey" -keyout "$WORK/key.pem" -out "$WORK/cert.pem" \
        -subj /CN=localhost 2>/dev/null
fi
# The backend runs on any core (BACKEND_CPUS= a taskset list to pin it), and its CPU is not
# counted as the server's.
taskset -c "${BACKEND_CPUS:-0-$((CORES - 1))}" "$CLIENT" backend --listen 127.0.0.1:9729 \
    --threads "${BACKEND_THREADS:-1}" 2>/dev/null &
backend=$!

# Starts tlsterm with W workers on cores 0..W-1; sets $server.
start_tlsterm() {
    cat > "$WORK/tlsterm.toml" <<CONF
workers = $1
pin_workers = true
accept = "${ACCEPT:-shared}"
[admin]
address = "127.0.0.1:9728"
[[listener]]
address = "127.0.0.1:9727"
backends = ["127.0.0.1:9729"]
quic = ${QUIC_ON:-false}
[[listener.certificate]]
cert = "$WORK/cert.pem"
key = "$WORK/key.pem"
CONF
    : > "$WORK/serve.log"
    taskset -c "0-$(($1 - 1))" "$BIN" serve -c "$WORK/tlsterm.toml" 2>"$WORK/serve.log" &
    server=$!
    until grep -q "tlsterm serving" "$WORK/serve.log"; do sleep 0.05; done
}

# Starts HAProxy + AWS-LC with W threads on cores 0..W-1 (bench/conf/haproxy.cfg, as
# bench/peers.py runs it); sets $server.
start_haproxy_awslc() {
    cat "$WORK/cert.pem" "$WORK/key.pem" > "$WORK/haproxy.pem"
    sed -e "s/nbthread 1/nbthread $1\n    cpu-map auto:1\/1-$1 0-$(($1 - 1))/" \
        -e "s/maxconn 4000/maxconn $(( 4000 * $1 < 9000 ? 4000 * $1 : 9000 ))/" \
        -e "s|@LISTEN@|127.0.0.1:9727|" -e "s|@BACKEND@|127.0.0.1:9729|" \
        -e "s|@PEM@|$WORK/haproxy.pem|" -e "s|@CURVES@|X25519MLKEM768:X25519:P-256|" \
        -e "s|@CIPHERS@|ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256|" \
        "$ROOT/bench/conf/haproxy.cfg" > "$WORK/haproxy.cfg"
    if [ -n "${QUIC:-}" ]; then
        sed -i -e "s|^global$|global\n    tune.quic.fe.sec.retry-threshold 1000000|" \
            -e "s|^\(    bind 127.0.0.1:9727 ssl crt \(\S*\) .*\)$|\1\n    bind quic4@127.0.0.1:9727 ssl crt \2 alpn h3|" \
            "$WORK/haproxy.cfg"
    fi
    taskset -c "0-$(($1 - 1))" "$HAPROXY_AWSLC" -db -f "$WORK/haproxy.cfg" 2>"$WORK/serve.log" &
    server=$!
    until (exec 3<>/dev/tcp/127.0.0.1/9727) 2>/dev/null; do
        kill -0 $server || { cat "$WORK/serve.log" >&2; exit 1; }
        sleep 0.05
    done
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Each thread's CPU ticks, one "TID TICKS" line each.
thread_ticks() { for t in /proc/"$1"/task/*/stat; do awk '{print $1, $14 + $15}' "$t"; done 2>/dev/null; }
# The busiest W threads' share of a core between two thread_ticks snapshots: how evenly
# the server's workers were loaded ("min-max").
thread_spread() {
    python3 - "$1" "$2" "$3" "$4" <<'PY'
import sys
before = dict(l.split() for l in open(sys.argv[1]))
after = dict(l.split() for l in open(sys.argv[2]))
busy = sorted((int(t) - int(before.get(tid, 0)) for tid, t in after.items()), reverse=True)
busy = [b / 100 / float(sys.argv[4]) for b in busy[: int(sys.argv[3])]]
print(f"{min(busy):.2f}-{max(busy):.2f}")
PY
}
# Busy and total jiffies of CPUs FIRST..LAST (/proc/stat): whether the load side's cores
# ran out (a server that is not saturated because its client is).
cores_ticks() {
    awk -v first="$1" -v last="$2" '/^cpu[0-9]/ { n = substr($1, 4) + 0
        if (n >= first && n <= last) { busy += $2 + $3 + $4 + $7 + $8; all += $2 + $3 + $4 + $5 + $6 + $7 + $8 } }
        END { print busy, all }' /proc/stat
}
group_flag=()
[ -n "${GROUP:-}" ] && group_flag=(--group "$GROUP")
[ -n "${QUIC:-}" ] && group_flag+=(--http3) && QUIC_ON=true
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $CORES cores;" \
    "server=$SERVER key=$KEY mode=$MODE${QUIC:+ quic} seconds=$SECS load avg before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A rate cpu per
measured=()
for workers in "${COUNTS[@]}"; do
    client_cores=$((CORES - workers))
    if [ "$client_cores" -lt 1 ]; then
        echo "skip $workers workers: this machine has $CORES cores, none would be left for the client"
        continue
    fi
    start_$(tr - _ <<<"$SERVER") "$workers"
    before=$(cpu_ticks $server)
    backend_before=$(cpu_ticks $backend)
    load_before=$(cores_ticks "$workers" $((CORES - 1)))
    thread_ticks $server > "$WORK/threads.before"
    report=$(taskset -c "$workers-$((CORES - 1))" "$CLIENT" bench https://127.0.0.1:9727/ --insecure \
        --json --threads "$client_cores" -c $((64 * workers)) -d "${SECS}s" --mode "$MODE" \
        "${group_flag[@]}" 2>/dev/null)
    after=$(cpu_ticks $server)
    backend_after=$(cpu_ticks $backend)
    load_after=$(cores_ticks "$workers" $((CORES - 1)))
    thread_ticks $server > "$WORK/threads.after"
    kill $server
    wait $server 2>/dev/null || true
    handshakes=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["handshakes"])' <<<"$report")
    elapsed=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["elapsed_s"])' <<<"$report")
    ticks=$((after - before))
    rate[$workers]=$(python3 -c "print(round($handshakes / $elapsed))")
    cpu[$workers]=$(python3 -c "print(round($ticks / 100 / $elapsed, 2))")
    per[$workers]=$((handshakes * 100 / ticks))
    measured+=("$workers")
    spread=$(thread_spread "$WORK/threads.before" "$WORK/threads.after" "$workers" "$elapsed")
    load_busy=$(python3 -c "b0, a0 = map(int, '$load_before'.split()); b1, a1 = map(int, '$load_after'.split()); print(f'{(b1 - b0) / max(a1 - a0, 1):.0%}')")
    backend_cores=$(python3 -c "print(round(($backend_after - $backend_before) / 100 / $elapsed, 2))")
    echo "$workers workers: ${rate[$workers]} handshakes/s, server ${cpu[$workers]} cores," \
        "${per[$workers]} per server CPU-second; busiest $workers threads $spread of a core each;" \
        "client cores $workers-$((CORES - 1)) busy $load_busy, backend $backend_cores cores"
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
