#!/usr/bin/env bash
# Soak run: `tlsterm bench` (full handshakes, open loop) for MINUTES at about 70% of the
# capacity measured first, against `tlsterm serve` in front of a `tlsterm backend`
# process, with SIGHUP every $HUP_EVERY seconds and the backend killed and restarted
# (down for $OUTAGE seconds) every $RESTART_EVERY seconds. Checks at the end:
#   - no failed handshake: the faults (reload, backend outage) happen after the handshake
#     and explain none; the server's handshake_failures_total counts none either, except
#     clients that closed mid-handshake when the load generator stopped (<= concurrency);
#   - failed requests no more than the server closed for the outages
#     (connections_closed_total{reason="backend_unavailable"|"backend_error"}) plus, per
#     restart, the requests in flight at the kill;
#   - every SIGHUP answered "reloaded";
#   - VmRSS after warm-up grows less than 5% (median of the first 3 samples after warm-up
#     vs median of the last 3);
#   - descriptors: the count with no connection open is the same before and after.
#
# Usage: scripts/soak.sh [MINUTES]      (default 10; needs target/release/tlsterm)
# Environment: RATE (skip the capacity measurement), LOAD_FRACTION (0.7), CONCURRENCY
# (256), WORKERS (2), HUP_EVERY (20), RESTART_EVERY (60), OUTAGE (2), WARMUP (120 s,
# capped at a fifth of the run), SOAK_DIR (where logs and samples go; default a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-10}
BIN=target/release/tlsterm
[ -x "$BIN" ] || { echo "soak: $BIN missing (cargo build --release)" >&2; exit 2; }
LOAD_FRACTION=${LOAD_FRACTION:-0.7}
CONCURRENCY=${CONCURRENCY:-256}
WORKERS=${WORKERS:-2}
HUP_EVERY=${HUP_EVERY:-20}
RESTART_EVERY=${RESTART_EVERY:-60}
OUTAGE=${OUTAGE:-2}
DURATION=${DURATION_S:-$((MINUTES * 60))}
WARMUP=${WARMUP:-120}
[ "$WARMUP" -le $((DURATION / 5)) ] || WARMUP=$((DURATION / 5))
DIR=${SOAK_DIR:-$(mktemp -d /tmp/tlsterm-soak.XXXXXX)}
mkdir -p "$DIR"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
SERVE_PORT=$(free_port); BACKEND_PORT=$(free_port); ADMIN_PORT=$(free_port)
URL="https://127.0.0.1:$SERVE_PORT/"

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    [ -n "${BACKEND_PID:-}" ] && kill "$BACKEND_PID" 2>/dev/null || true
    [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT

wait_port() { # wait until something accepts on 127.0.0.1:$1
    for _ in $(seq 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "soak: nothing listens on $1" >&2; return 1
}

start_backend() {
    "$BIN" backend --listen "127.0.0.1:$BACKEND_PORT" 2>>"$DIR/backend.log" &
    BACKEND_PID=$!
    wait_port "$BACKEND_PORT"
}

metric() { # sum of a metric's samples whose line matches $1 (a grep -E pattern)
    { curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" || true; } | { grep -E "^$1" || true; } | awk '{s += $NF} END {printf "%d\n", s}'
}
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status"; }
fds() { ls "/proc/$SERVER_PID/fd" | wc -l; }
quiet_fds() { # descriptor count once no connection is open
    for _ in $(seq 200); do
        [ "$(metric 'tlsterm_connections_active')" = 0 ] && break
        sleep 0.05
    done
    fds
}

cat >"$DIR/tlsterm.toml" <<EOF
workers = $WORKERS
[log]
level = "info"
[admin]
address = "127.0.0.1:$ADMIN_PORT"
[[listener]]
address = "127.0.0.1:$SERVE_PORT"
backends = ["127.0.0.1:$BACKEND_PORT"]
alpn = ["http/1.1"]
connect_timeout = "2s"
backend_retry = "1s"
EOF

start_backend
"$BIN" serve -c "$DIR/tlsterm.toml" 2>"$DIR/serve.log" &
SERVER_PID=$!
for _ in $(seq 200); do grep -q "tlsterm serving" "$DIR/serve.log" && break; sleep 0.05; done
grep -q "tlsterm serving" "$DIR/serve.log" || { echo "soak: server did not start" >&2; cat "$DIR/serve.log"; exit 1; }

echo "soak: $(nproc) cores, loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$DIR/summary.txt"
if [ -z "${RATE:-}" ]; then
    "$BIN" bench --mode full -c 64 -d 15s --insecure --quiet --json "$URL" >"$DIR/capacity.json"
    CAPACITY=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["handshakes_per_s"])' "$DIR/capacity.json")
    RATE=$(python3 -c "print(int(float('$CAPACITY') * $LOAD_FRACTION))")
    echo "soak: capacity $CAPACITY handshakes/s (closed loop, -c 64, 15 s); soak rate $RATE/s" | tee -a "$DIR/summary.txt"
fi
FDS_BEFORE=$(quiet_fds)
BASE_CLOSED=$(metric 'tlsterm_connections_closed_total\{reason="backend_(unavailable|error)"\}')
BASE_HS_FAIL=$(metric 'tlsterm_handshake_failures_total')

echo "soak: ${DURATION} s at $RATE/s, SIGHUP every ${HUP_EVERY}s, backend restart every ${RESTART_EVERY}s (${OUTAGE}s down), warm-up ${WARMUP}s" | tee -a "$DIR/summary.txt"
"$BIN" bench --mode full --rate "$RATE" -c "$CONCURRENCY" -d "${DURATION}s" --insecure --quiet --json "$URL" >"$DIR/soak.json" &
BENCH_PID=$!
PIDS+=("$BENCH_PID")

START=$(date +%s)
HUPS=0; RESTARTS=0
next_hup=$HUP_EVERY; next_restart=$RESTART_EVERY; next_sample=0
echo "t_s rss_kb fds" >"$DIR/samples.txt"
while kill -0 "$BENCH_PID" 2>/dev/null; do
    now=$(( $(date +%s) - START ))
    if [ "$now" -ge "$next_sample" ]; then
        echo "$now $(rss_kb) $(fds)" >>"$DIR/samples.txt"
        next_sample=$((next_sample + 10))
    fi
    if [ "$now" -ge "$next_hup" ] && [ "$now" -lt $((DURATION - 5)) ]; then
        kill -HUP "$SERVER_PID"; HUPS=$((HUPS + 1)); next_hup=$((next_hup + HUP_EVERY))
    fi
    if [ "$now" -ge "$next_restart" ] && [ "$now" -lt $((DURATION - OUTAGE - 5)) ]; then
        kill "$BACKEND_PID"; wait "$BACKEND_PID" 2>/dev/null || true
        echo "$now backend killed" >>"$DIR/faults.txt"
        sleep "$OUTAGE" # the outage is the injected fault
        start_backend
        echo "$(( $(date +%s) - START )) backend back" >>"$DIR/faults.txt"
        RESTARTS=$((RESTARTS + 1)); next_restart=$((next_restart + RESTART_EVERY))
    fi
    sleep 1
done
wait "$BENCH_PID"
echo "$(( $(date +%s) - START )) $(rss_kb) $(fds)" >>"$DIR/samples.txt"
FDS_AFTER=$(quiet_fds)
CLOSED=$(( $(metric 'tlsterm_connections_closed_total\{reason="backend_(unavailable|error)"\}') - BASE_CLOSED ))
HS_FAIL=$(( $(metric 'tlsterm_handshake_failures_total') - BASE_HS_FAIL ))
RELOADED=$(grep -c "reloaded configuration" "$DIR/serve.log" || true)
REFUSED=$(grep -c "reload refused" "$DIR/serve.log" || true)
echo "soak: loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$DIR/summary.txt"

python3 - "$DIR" "$WARMUP" "$HUPS" "$RESTARTS" "$RELOADED" "$REFUSED" "$CLOSED" "$HS_FAIL" \
    "$FDS_BEFORE" "$FDS_AFTER" "$CONCURRENCY" <<'PY' | tee -a "$DIR/summary.txt"
import json, statistics, sys
d, warmup, hups, restarts, reloaded, refused, closed, hs_fail, fds_before, fds_after, conc = sys.argv[1:]
warmup, hups, restarts, reloaded, refused, closed, hs_fail = map(int, (warmup, hups, restarts, reloaded, refused, closed, hs_fail))
fds_before, fds_after, conc = int(fds_before), int(fds_after), int(conc)
r = json.load(open(d + "/soak.json"))
samples = [tuple(map(int, l.split())) for l in open(d + "/samples.txt").read().split("\n")[1:] if l.strip()]
after = [s for s in samples if s[0] >= warmup]
base = statistics.median(s[1] for s in after[:3])
final = statistics.median(s[1] for s in after[-3:])
growth = (final - base) / base * 100
hs_errors = sum(v for k, v in r["errors"].items() if k.startswith("handshake") or k.startswith("connect"))
allowed = closed + 2 * restarts
fails = []
def check(ok, text):
    print(("ok   " if ok else "FAIL ") + text)
    if not ok: fails.append(text)
print("bench: %.0f s, %d handshakes (%.1f/s), %d requests, %d errors %s, handshake p50 %d us p99 %d us"
      % (r["elapsed_s"], r["handshakes"], r["handshakes_per_s"], r["requests"], r["errors_total"],
         json.dumps(r["errors"]), r["handshake_latency"]["p50_us"], r["handshake_latency"]["p99_us"]))
print("server: closed for backend outage %d, handshake failures %d; faults: %d SIGHUP, %d backend restarts"
      % (closed, hs_fail, hups, restarts))
print("rss: first sample %d kB, after warm-up %d kB, end %d kB, max %d kB; fds (running) min %d max %d"
      % (samples[0][1], base, final, max(s[1] for s in samples), min(s[2] for s in samples), max(s[2] for s in samples)))
check(hs_errors == 0, "no failed handshake or connect on the client side (%d)" % hs_errors)
check(hs_fail <= conc, "server handshake failures %d <= clients cut at the end (%d)" % (hs_fail, conc))
check(r["errors_total"] <= allowed, "request errors %d <= explained by outages %d (closed %d + 2 x %d restarts)"
      % (r["errors_total"], allowed, closed, restarts))
check(reloaded == hups and refused == 0, "every SIGHUP reloaded (%d sent, %d reloaded, %d refused)" % (hups, reloaded, refused))
check(growth < 5.0, "RSS growth after warm-up %.2f%% < 5%%" % growth)
check(fds_after == fds_before, "descriptors with no connection open: %d before, %d after" % (fds_before, fds_after))
print("soak: " + ("PASSED" if not fails else "FAILED: " + "; ".join(fails)))
sys.exit(1 if fails else 0)
PY
status=${PIPESTATUS[0]}
echo "soak: logs and samples in $DIR"
exit "$status"
