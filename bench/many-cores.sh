#!/usr/bin/env bash
# tlsterm against HAProxy + AWS-LC on a machine with many cores: handshakes per server
# CPU-second at several worker counts (bench/scaling.sh: server on cores 0..W-1, the
# client on the rest) for ECDSA P-256 full, ECDSA P-256 resumed and RSA-2048 full
# handshakes, servers alternated run by run, ROUNDS rounds; then the memory of idle
# connections (bench/idle.sh) at IDLE connections. Prints every run, then the medians
# and tlsterm's ratio to HAProxy + AWS-LC per scenario and worker count.
#
#   bench/many-cores.sh [SECONDS] [ROUNDS]          (defaults: 5 s, 2 rounds)
#
# SERVERS="tlsterm haproxy-awslc" (also tlsterm-per-worker: tlsterm with accept = "per-worker";
# plain tlsterm has its default, "shared");
# SCENARIOS="ec-full ec-resume rsa-full"; BACKEND_THREADS as for bench/scaling.sh;
# COUNTS="1 4 8" worker counts; IDLE=50000 idle connections (0: none); CERTS=DIR with
# DIR/ec and DIR/rsa each holding cert.pem and key.pem (default: new ones by openssl);
# HAPROXY_AWSLC as for bench/scaling.sh. Run as root: it raises the descriptor limit and
# the local port range for the idle connections.
set -euo pipefail
SECS=${1:-5}
ROUNDS=${2:-2}
COUNTS=${COUNTS:-"1 4 8"}
IDLE=${IDLE:-50000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs," \
    "flags: $(grep -m1 -o -w -e avx512ifma -e avx2 /proc/cpuinfo | sort -u | tr '\n' ' ')"
for round in $(seq "$ROUNDS"); do
    for scenario in ${SCENARIOS:-ec-full ec-resume rsa-full}; do
        cert=${scenario%-*}
        mode=${scenario#*-}
        key=ec:p256
        [ "$cert" = rsa ] && key=rsa:2048
        for server in ${SERVERS:-tlsterm haproxy-awslc}; do
            accept=shared
            [ "$server" = tlsterm-per-worker ] && accept=per-worker
            echo "## round $round: $server $scenario"
            CERTS=${CERTS:+$CERTS/$cert} KEY=$key MODE=$mode SERVER=${server%-per-worker} \
                ACCEPT=$accept "$ROOT/bench/scaling.sh" "$SECS" $COUNTS | grep ' workers: ' |
                sed "s/^/$server $scenario /" | tee -a "$LOG"
        done
    done
done
python3 - "$LOG" <<'PY'
import collections, re, statistics, sys
runs = collections.defaultdict(list)
servers = []
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) (\S+) (\d+) workers: (\d+) handshakes/s, server ([\d.]+) cores, (\d+) per", line)
    if m:
        server, scenario, workers = m.group(1), m.group(2), int(m.group(3))
        servers += [server] * (server not in servers)
        runs[(scenario, workers, server)].append((int(m.group(4)), float(m.group(5)), int(m.group(6))))
peer = "haproxy-awslc"
ours = [s for s in servers if s != peer]
print("\n| scenario | workers | " + " | ".join(f"{s} hs/s | cores | per CPU-s" for s in servers)
      + "".join(f" | {s} / {peer}" for s in ours if peer in servers) + " |")
print("|---|---:" + "|---:|---:|---:" * len(servers) + "|---:" * (len(ours) if peer in servers else 0) + "|")
for scenario, workers in sorted({(s, w) for s, w, _ in runs}):
    row, per = [scenario, str(workers)], {}
    for server in servers:
        r = runs.get((scenario, workers, server), [])
        med = [statistics.median(x[i] for x in r) for i in range(3)] if r else None
        if med:
            per[server] = med[2]
        row += [f"{med[0]:.0f}", f"{med[1]:.2f}", f"{med[2]:.0f}"] if med else ["-"] * 3
    if peer in servers:
        row += [f"{per[s] / per[peer]:.2f}x" if s in per and peer in per else "-" for s in ours]
    print("| " + " | ".join(row) + " |")
print(f"medians of {max(len(v) for v in runs.values())} runs each; ratios of handshakes per server CPU-second")
PY
if [ "$IDLE" -gt 0 ]; then
    ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
    sysctl -q -w net.ipv4.ip_local_port_range="1024 65535" || true
    CERTS=${CERTS:+$CERTS/ec} "$ROOT/bench/idle.sh" "$IDLE" 5 tlsterm="$ROOT/target/release/tlsterm"
fi
