#!/usr/bin/env bash
# One-core comparison: tlsterm speed (BoringSSL inline vs the batch engine)
# and `openssl speed`, interleaved in the same minute, ROUNDS times; prints
# every run and the medians. Usage (from the repository root, after
# `cargo build --release --bin tlsterm`):
#   crates/engine/bench/compare.sh [ROUNDS=5] [SECONDS=3] [CPU=1]
# KERNEL=avx2 (or avx512ifma, portable) measures that kernel; default: the fastest.
set -euo pipefail
rounds=${1:-5}; secs=${2:-3}; cpu=${3:-1}
bin=target/release/tlsterm
out=$(mktemp -d)
for r in $(seq "$rounds"); do
    for bits in 2048 3072 4096; do
        taskset -c "$cpu" openssl speed -seconds "$secs" "rsa$bits" 2>/dev/null \
            | awk -v b="$bits" '/^rsa/ && $2 == b {print $6}' >>"$out/openssl$bits"
    done
    # shellcheck disable=SC2086
    taskset -c "$cpu" "$bin" speed --seconds "$secs" ${KERNEL:+--kernel $KERNEL} rsa2048 rsa3072 rsa4096 2>/dev/null \
        | awk -v o="$out" '/^algorithm/ {k=$3; sub("/s", "", k)} /^rsa/ {print $2 >> (o "/inline" substr($1,4)); print $3 >> (o "/batch" substr($1,4))} END {print k > (o "/kernel")}'
    echo "round $r: openssl $(tail -qn1 "$out"/openssl2048) inline $(tail -qn1 "$out"/inline2048) batch $(tail -qn1 "$out"/batch2048) (rsa2048 sign/s)" >&2
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf "%-8s %10s %10s %10s %12s %14s  (medians of %s runs of %ss on CPU %s, kernel %s)\n" \
    size openssl inline batch batch/inline batch/openssl "$rounds" "$secs" "$cpu" "$(cat "$out/kernel")"
for bits in 2048 3072 4096; do
    o=$(median "$out/openssl$bits"); i=$(median "$out/inline$bits"); b=$(median "$out/batch$bits")
    awk -v s="rsa$bits" -v o="$o" -v i="$i" -v b="$b" \
        'BEGIN {printf "%-8s %10.0f %10.0f %10.0f %12.2f %14.2f\n", s, o, i, b, b / i, b / o}'
done
echo "raw runs: $out" >&2
