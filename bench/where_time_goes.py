#!/usr/bin/env python3
"""Where a server's CPU time goes, per unit of work, from a `perf record` of it: samples
grouped by what their functions do (the kernel, each kind of cryptography, allocation,
copying, the QUIC stack, the TLS state machine, the runtime, HTTP) and turned into
microseconds per handshake or request with the server's CPU time over the same interval.

The groups are matched on symbol names, so they read tlsterm (statically linked BoringSSL,
aws-lc, quiche, tokio, hyper, the engine's kernels) and HAProxy + AWS-LC alike; what
matches none is "other user space" and its largest functions are listed, so that a group
missing from the patterns shows. bench/http3.sh --profile records and prints these.

    python3 bench/where_time_goes.py PERF_DATA CPU_SECONDS UNITS [--top N]
"""
import argparse
import re
import subprocess

# (group, pattern): the first that matches a symbol takes its samples. Order matters:
# the engine's kernels before the generic "x25519"/"p256", copying before allocation.
GROUPS = [
    ("kernel", r"\[k\]"),
    ("crypto: X25519", r"x25519|curve25519|X25519"),
    ("crypto: P-256 / ECDSA", r"p256|nistz256|ec_GFp|ec_point|EC_|ecdsa|ECDSA|ec_scalar|ec_felem"),
    ("crypto: RSA and other big numbers", r"tlsterm_engine::(rsa|ifma|mul32|mont)|rsaz|bn_|BN_|RSA_|rsa_"),
    ("crypto: ML-KEM / Keccak", r"keccak|Keccak|kyber|mlkem|mlk_|MLKEM|KYBER|rej_uniform"),
    ("crypto: SHA, AES, HMAC", r"sha256|sha512|sha1_|SHA|aes_|gcm|ghash|HMAC|hkdf|HKDF|aead|AEAD|CRYPTO_gcm"),
    ("crypto: random numbers", r"jent_|rdrand|RAND_|rand_|drbg|getrandom"),
    ("copying", r"memmove|memcpy|memset|memcmp"),
    ("allocation", r"malloc|free|rjem|_int_|realloc|calloc|__rust_alloc|__rust_dealloc|pool_alloc|pool_free|pool_put|pool_get|unlink_chunk|tcache|sdallocx"),
    ("QUIC (quiche, tlsterm's or HAProxy's own)", r"quiche::|octets::|tlsterm::quic::|quic_|qc_|qcc_|qcs_|qmux_|quic"),
    ("TLS state machine", r"bssl::|ssl_|SSL_|tls13_|tls1_|CBB_|CBS_|cbb_|cbs_|boring::"),
    ("runtime (tokio; HAProxy's scheduler)", r"tokio::|mio::|run_tasks|process_runnable|task_|tasklet|atomic_waker"),
    ("HTTP (hyper, h3, HAProxy's streams)", r"hyper|http|h1_|h3|qpack|htx|hpack|huff_|process_stream|stream_|sc_conn"),
    ("Rust collections and futures", r"core::|alloc::|std::|hashbrown|slab::|bytes::"),
]


def symbols(perf_data):
    """(percent of samples, where, symbol) for every symbol of the recording."""
    out = subprocess.run(["perf", "report", "-i", str(perf_data), "--no-children",
                          "--sort", "dso,sym", "--stdio"],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+(.*)", line)
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3).strip()))
    return rows


def breakdown(perf_data, cpu_seconds, units):
    """Groups with their share of the samples and µs per unit, and the largest unmatched."""
    total = {name: 0.0 for name, _ in GROUPS}
    other = []
    rows = symbols(perf_data)
    sampled = sum(p for p, _, _ in rows) or 100.0
    for percent, dso, symbol in rows:
        share = percent / sampled
        for name, pattern in GROUPS:
            if re.search(pattern, symbol):
                total[name] += share
                break
        else:
            other.append((share, dso, symbol))
    per_unit = cpu_seconds / units * 1e6 if units else 0.0
    groups = [(name, share, share * per_unit) for name, share in total.items()]
    rest = sum(share for share, _, _ in other)
    groups.append(("other user space", rest, rest * per_unit))
    return per_unit, groups, sorted(other, reverse=True)


def print_breakdown(title, perf_data, cpu_seconds, units, unit="unit", top=8):
    per_unit, groups, other = breakdown(perf_data, cpu_seconds, units)
    print(f"{title}: {per_unit:.1f} µs of server CPU per {unit} "
          f"({units} in {cpu_seconds:.2f} CPU-s)")
    print(f"| group | share of samples | µs per {unit} |")
    print("|---|---:|---:|")
    for name, share, us in groups:
        if share >= 0.0005:
            print(f"| {name} | {share:.1%} | {us:.1f} |")
    if top:
        print("largest in other user space: " + ", ".join(
            f"{symbol} ({share:.1%})" for share, _, symbol in other[:top]))
    print()
    return per_unit, groups


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("perf_data")
    ap.add_argument("cpu_seconds", type=float, help="the server's CPU time while recorded")
    ap.add_argument("units", type=int, help="handshakes or requests in that time")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    print_breakdown(args.perf_data, args.perf_data, args.cpu_seconds, args.units, top=args.top)


if __name__ == "__main__":
    main()
