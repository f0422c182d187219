#!/usr/bin/env bash
# Handshakes per server CPU-second of tlsterm variants, run alternately so that slow drifts
# of a shared machine hit all alike. Server on CPU 0, client on CPU 1, RSA-2048, one worker.
#
#   bench/ab.sh [RUNS] [SECONDS] NAME=BINARY[,metrics=off][,early_data] ...
#
# A variant is a tlsterm binary (e.g. one built from another commit) with the listener
# options after it (`early_data` also makes the client send its resumed requests as 0-RTT;
# `inline` signs with BoringSSL instead of batching: `[engine] mode = "inline"`;
# `shares=MODE` sets `[engine] key_shares` (e.g. `shares=inline`: BoringSSL computes them);
# `group=NAME` makes the client offer only that key-exchange group; `mlkem=N` sets
# `[engine] mlkem_small_batch_threshold` (e.g. `mlkem=100`: aws-lc encapsulates every
# ML-KEM-768 half); `unix` relays to the
# backend over a unix-domain socket instead of TCP (each run also prints the CPU of
# tlsterm and backend together, the figure that compares the two); `acme` turns ACME on:
# the listener also obtains a certificate for a.example from Pebble, the test ACME CA,
# which the script starts on loopback (installed by scripts/setup.sh), and the script
# prints how long the first one took from start to installed; the benchmark's handshakes
# still get the file certificate, so the variants differ only by ACME running).
# `quic` also answers HTTP/3 on the listener's port and makes the client's handshakes QUIC
# ones (`tlsterm bench --http3`).
# MODE=full|resume and TLS=1.2|1.3 choose the client's work (default: full TLS 1.3
# handshakes); KEY=rsa:2048 (default) or ec:p256 the certificate (an ECDSA P-256 key).
# MODE=bulk URL_PATH=/bytes/1024 counts requests instead (keep-alive connections asking
# for that path; the built-in backend answers /bytes/N with N bytes).
# QUOTA=0.5 caps the server at that fraction of a core (a cgroup v1 CPU quota, as
# bench/peers.py --server-quota), so that the one client core saturates it. Prints one line per run and the median per variant.
#   bench/ab.sh 5 5 new=target/release/tlsterm old=/tmp/old/tlsterm
set -euo pipefail
RUNS=${1:-5}
SECS=${2:-5}
shift 2 || true
[ $# -ge 1 ] || { echo "usage: $0 RUNS SECONDS NAME=BINARY[,metrics=off][,early_data] ..." >&2; exit 2; }
MODE=${MODE:-full}
# What is counted: requests in bulk mode, handshakes otherwise.
UNIT=handshakes
[ "$MODE" = bulk ] && UNIT=requests
TLS=${TLS:-1.3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLIENT=$ROOT/target/release/tlsterm
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
KEY=${KEY:-rsa:2048}
if [ "$KEY" = ec:p256 ]; then
    openssl ecparam -name prime256v1 -out "$WORK/p256.pem"
    newkey=ec:$WORK/p256.pem
else
    newkey=$KEY
fi
openssl req -x509 -nodes -days 2 -newkey "$newkey" -keyout "$WORK/key.pem" -out "$WORK/cert.pem" \
    -subj /CN=localhost 2>/dev/null
"$CLIENT" backend --listen 127.0.0.1:9719 2>/dev/null &
backend=$!
"$CLIENT" backend --listen "unix:$WORK/backend.sock" 2>/dev/null &
backend+=" $!"
trap 'kill $backend 2>/dev/null; rm -rf "$WORK"' EXIT

# Pebble and its DNS helper (every name resolves to 127.0.0.1), validating TLS-ALPN-01 on
# the benchmark's listener port.
start_pebble() {
    local bin certs
    bin=$(go env GOPATH 2>/dev/null || /usr/local/go/bin/go env GOPATH)/bin
    certs=$( (go env GOMODCACHE 2>/dev/null || /usr/local/go/bin/go env GOMODCACHE) )/github.com/letsencrypt/pebble/v2@v2.8.0/test/certs
    PEBBLE_CA=$certs/pebble.minica.pem
    cat > "$WORK/pebble.json" <<PEBBLE
{"pebble": {"listenAddress": "127.0.0.1:9714", "managementListenAddress": "127.0.0.1:9715",
 "certificate": "$certs/localhost/cert.pem", "privateKey": "$certs/localhost/key.pem",
 "httpPort": 9716, "tlsPort": 9717, "ocspResponderURL": "", "externalAccountBindingRequired": false,
 "retryAfter": {"authz": 1, "order": 1}, "profiles": {"default": {"description": "bench", "validityPeriod": 86400}}}}
PEBBLE
    "$bin/pebble-challtestsrv" -http01 "" -https01 "" -tlsalpn01 "" -doh "" -defaultIPv6 "" \
        -dns01 127.0.0.1:9712 -management 127.0.0.1:9713 >/dev/null 2>&1 &
    PEBBLE_PIDS="$!"
    PEBBLE_VA_NOSLEEP=1 PEBBLE_WFE_NONCEREJECT=0 "$bin/pebble" -config "$WORK/pebble.json" \
        -dnsserver 127.0.0.1:9712 > "$WORK/pebble.log" 2>&1 &
    PEBBLE_PIDS+=" $!"
    until grep -q "ACME directory available" "$WORK/pebble.log"; do sleep 0.05; done
    trap 'kill $backend $PEBBLE_PIDS 2>/dev/null; rm -rf "$WORK"' EXIT
}
[[ "$*" == *acme* ]] && start_pebble
acme_key_type=rsa-2048
[ "$KEY" = ec:p256 ] && acme_key_type=ecdsa-p256

names=()
declare -A binary client_flags acme
for variant in "$@"; do
    name=${variant%%=*}
    spec=${variant#*=}
    binary[$name]=$(realpath "${spec%%,*}")
    metrics=true
    early_data=false
    [[ $spec == *metrics=off* ]] && metrics=false
    engine_mode=batch
    [[ $spec == *,inline* ]] && engine_mode=inline
    # Written only when asked for: binaries from before the key exists refuse it.
    key_shares_line=
    if [[ $spec =~ shares=([a-z-]+) ]]; then
        key_shares_line="key_shares = \"${BASH_REMATCH[1]}\""
    fi
    if [[ $spec =~ mlkem=([0-9]+) ]]; then
        key_shares_line+=$'\n'"mlkem_small_batch_threshold = ${BASH_REMATCH[1]}"
    fi
    client_flags[$name]=
    if [[ $spec =~ group=([a-z0-9]+) ]]; then
        client_flags[$name]="--group ${BASH_REMATCH[1]}"
    fi
    backend_address=127.0.0.1:9719
    [[ $spec == *,unix* ]] && backend_address=unix:$WORK/backend.sock
    quic_line=
    if [[ $spec == *,quic* ]]; then
        quic_line="quic = true"
        client_flags[$name]+=" --http3"
    fi
    acme[$name]=false
    certificate=$'[[listener.certificate]]\ncert = "'"$WORK/cert.pem"$'"\nkey = "'"$WORK/key.pem"'"'
    acme_section=
    if [[ $spec == *acme* ]]; then
        acme[$name]=true
        certificate="acme = { names = [\"a.example\"], key_types = [\"$acme_key_type\"] }"$'\n'"$certificate"
        acme_section=$'[acme]\ndirectory = "https://127.0.0.1:9714/dir"\nstorage = "'"$WORK/acme-$name"$'"\nca_file = "'"$PEBBLE_CA"'"'
    fi
    session=
    if [[ $spec == *early_data* ]]; then
        early_data=true
        client_flags[$name]+=" --early-data"
        # The load generator is one client network: let it fill the whole 0-RTT replay
        # memory (binaries from before this key existed refuse it).
        session=$'[session]\nearly_data_replay_client_share = 1.0'
    fi
    cat > "$WORK/$name.toml" <<CONF
workers = 1
[engine]
mode = "$engine_mode"
$key_shares_line
$session
$acme_section
[admin]
enabled = $metrics
address = "127.0.0.1:9718"
[[listener]]
address = "127.0.0.1:9717"
backends = ["$backend_address"]
early_data = $early_data
$quic_line
$certificate
CONF
    names+=("$name")
done

QUOTA_CGROUP=/sys/fs/cgroup/cpu/tlsterm-bench-server
if [ -n "${QUOTA:-}" ]; then
    mkdir -p "$QUOTA_CGROUP"
    echo 100000 > "$QUOTA_CGROUP/cpu.cfs_period_us"
    awk -v q="$QUOTA" 'BEGIN {printf "%d\n", q * 100000}' > "$QUOTA_CGROUP/cpu.cfs_quota_us"
fi
cpu_ticks() { awk '{s += $14 + $15} END {print s}' $(printf '/proc/%s/stat ' "$@"); }
echo "key=$KEY mode=$MODE tls=$TLS runs=$RUNS seconds=$SECS quota=${QUOTA:-none} load avg before: $(cut -d' ' -f1-3 /proc/loadavg)"
for run in $(seq 1 "$RUNS"); do
    for name in "${names[@]}"; do
        taskset -c 0 "${binary[$name]}" serve -c "$WORK/$name.toml" 2>"$WORK/serve.log" &
        server=$!
        [ -z "${QUOTA:-}" ] || echo $server > "$QUOTA_CGROUP/cgroup.procs"
        started=$(date +%s.%N)
        until grep -q "tlsterm serving" "$WORK/serve.log"; do sleep 0.05; done
        if ${acme[$name]}; then
            # The first run orders the certificate; later ones load it from storage.
            until grep -q "ACME certificate installed\|loaded from storage" "$WORK/serve.log"; do sleep 0.01; done
            if grep -q "ACME certificate installed" "$WORK/serve.log"; then
                echo "$name: first ACME certificate installed $(echo "$(date +%s.%N) - $started" | bc) s after start"
            fi
        fi
        before=$(cpu_ticks $server)
        backend_before=$(cpu_ticks $backend)
        counted=$(taskset -c 1 "$CLIENT" bench "https://127.0.0.1:9717${URL_PATH:-/}" --insecure --json -c 64 \
            -d "${SECS}s" --mode "$MODE" --tls-version "$TLS" ${client_flags[$name]} 2>/dev/null \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$UNIT")
        after=$(cpu_ticks $server)
        backend_ticks=$(($(cpu_ticks $backend) - backend_before))
        kill $server; wait $server 2>/dev/null || true
        ticks=$((after - before))
        echo "run $run $name $UNIT=$counted server_cpu_s=$(echo "scale=2; $ticks/100" | bc) per_cpu_s=$((counted * 100 / ticks)) with_backend_per_cpu_s=$((counted * 100 / (ticks + backend_ticks)))" \
            | tee -a "$WORK/results"
    done
done
echo "load avg after: $(cut -d' ' -f1-3 /proc/loadavg)"
for name in "${names[@]}"; do
        for figure in per_cpu_s with_backend_per_cpu_s; do
        grep " $name " "$WORK/results" | sed "s/.* $figure=\([0-9]*\).*/\1/" | sort -n \
            | awk -v name="$name" -v figure="$figure" -v unit="$UNIT" '{v[NR]=$1} END {m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2; printf "median %s: %d %s per %s CPU-second\n", name, m, unit, (figure == "per_cpu_s") ? "server" : "server+backend"}'
    done
done
