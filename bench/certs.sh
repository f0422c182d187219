#!/usr/bin/env bash
# Load time, reload time and memory of `tlsterm serve` with N certificates (default
# 10,000 ECDSA P-256 self-signed, one SNI name each; generated once under $DIR).
#   bench/certs.sh [N] [DIR]
set -euo pipefail
N=${1:-10000}
DIR=${2:-/tmp/tlsterm-certs}
TLSTERM=${TLSTERM:-$(cd "$(dirname "$0")/.." && pwd)/target/release/tlsterm}
PORT=${PORT:-9711}
mkdir -p "$DIR"
cd "$DIR"

echo "generating $N certificates in $DIR (skips existing ones)" >&2
seq 0 $((N - 1)) | xargs -P 4 -I{} sh -c '[ -f c{}.pem ] || openssl req -x509 -nodes -days 30 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout k{}.pem -out c{}.pem -subj /CN=site{}.example.test -addext subjectAltName=DNS:site{}.example.test 2>/dev/null'

{
    printf 'workers = 1\n[admin]\nenabled = false\n[[listener]]\naddress = "127.0.0.1:%s"\nbackends = ["builtin"]\n' "$PORT"
    for i in $(seq 0 $((N - 1))); do
        printf '[[listener.certificate]]\ncert = "c%s.pem"\nkey = "k%s.pem"\n' "$i" "$i"
    done
} > certs.toml

echo "load avg: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -f "check (parse + load + build contexts): %e s wall, %U s user, %M KiB max RSS" "$TLSTERM" serve --check -c certs.toml

rm -f serve.log
start=$(date +%s.%N)
"$TLSTERM" serve -c certs.toml > serve.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
until grep -q "tlsterm serving" serve.log; do kill -0 $pid; sleep 0.05; done
echo "start to serving: $(echo "$(date +%s.%N) - $start" | bc) s, $(grep VmRSS /proc/$pid/status | tr -s ' ')"
last=$((N - 1))
for round in 1 2 3 4 5; do
    before=$(grep -c "reloaded" serve.log || true)
    t0=$(date +%s.%N)
    kill -HUP $pid
    until [ "$(grep -c "reloaded" serve.log || true)" -gt "$before" ]; do sleep 0.02; done
    echo "reload $round: $(echo "$(date +%s.%N) - $t0" | bc) s, $(grep VmRSS /proc/$pid/status | tr -s ' ')"
done
echo | openssl s_client -connect 127.0.0.1:$PORT -servername site$last.example.test 2>/dev/null | grep '^subject='
