#!/usr/bin/env bash
# Does a core compute less when its neighbours compute too? `tlsterm speed` on one core
# alone, then on N cores at once (one process pinned to each), for every N given: the
# operations per CPU-second of each column (BoringSSL inline, each kernel), the median over
# the N processes, and that median against the one-core figure. A kernel whose figure falls
# while BoringSSL's does not points at the clock a core keeps when many run 512-bit code
# (or at a sibling hyperthread sharing its vector units), not at the server.
#
#   bench/parallel-speed.sh [SECONDS] [N...]      (defaults: 2 s; 4 8 16, capped at nproc)
#
# ALGS="rsa2048 ecdsap256 x25519" what to measure; BIN= the tlsterm to run.
set -euo pipefail
SECS=${1:-2}
shift || true
COUNTS=("$@")
[ ${#COUNTS[@]} -gt 0 ] || COUNTS=(4 8 16)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/tlsterm}
ALGS=${ALGS:-rsa2048 ecdsap256 x25519}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs;" \
    "siblings of CPU 0: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null || echo '?')"
run() { # N: one speed process on each of cores 0..N-1, all at once
    local n=$1 pids=()
    for core in $(seq 0 $((n - 1))); do
        # shellcheck disable=SC2086
        taskset -c "$core" "$BIN" speed --seconds "$SECS" $ALGS >"$OUT/$n.$core" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
}
echo "one core alone..." >&2
run 1
for n in "${COUNTS[@]}"; do
    [ "$n" -le "$(nproc)" ] || { echo "skipping $n processes: $(nproc) CPUs" >&2; continue; }
    echo "$n cores at once..." >&2
    run "$n"
done
python3 - "$OUT" <<'PY'
import glob, os, re, statistics, sys
out = sys.argv[1]
def table(path):
    """{(algorithm, column): ops per CPU-second} from one `tlsterm speed` output."""
    figures, header = {}, None
    for line in open(path):
        cells = line.split()
        if not cells:
            continue
        if cells[0] == "algorithm":
            header = cells[1:]
        elif cells[:2] == ["key", "share"]:
            header = cells[2:]
        elif header and re.fullmatch(r"[a-z0-9]+", cells[0]) and len(cells) == len(header) + 1:
            # a row's cells line up with its header's: ops/s, ratio or µs per column
            for column, value in zip(header, cells[1:]):
                if column.endswith("/s") and value != "-":
                    figures[(cells[0], column[:-2])] = int(value)
    return figures
runs = {}
for path in glob.glob(os.path.join(out, "*.*")):
    n = int(os.path.basename(path).split(".")[0])
    runs.setdefault(n, []).append(table(path))
alone = runs.pop(1)[0]
counts = sorted(runs)
print("\n| algorithm | column | 1 core | " + " | ".join(f"{n} cores: median per core | vs 1" for n in counts) + " |")
print("|---|---|---:" + "|---:|---:" * len(counts) + "|")
for key in sorted(alone):
    row = [key[0], key[1], str(alone[key])]
    for n in counts:
        values = [t[key] for t in runs[n] if key in t]
        median = statistics.median(values) if values else 0
        row += [f"{median:.0f}", f"{median / alone[key]:.2f}"]
    print("| " + " | ".join(row) + " |")
PY
