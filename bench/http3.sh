#!/usr/bin/env bash
# HTTP/3 benchmark: QUIC full handshakes per server CPU-second, tlsterm vs HAProxy 3.3 +
# AWS-LC (USE_QUIC=1), RSA-2048 and ECDSA P-256, and both servers' TLS 1.3 figure over TCP
# in the same run. `--workload requests` measures requests per server CPU-second instead
# (keep-alive connections, 1 KiB responses), `--workload bulk` MiB per server CPU-second
# (1 MiB responses); both with the ECDSA certificate only, which they do not exercise. Each server has one worker (one thread) and the same backend
# (`tlsterm backend`); server and backend are pinned to CPU 0, the client (`tlsterm bench`,
# `--http3` for QUIC) to CPU 1, as in bench/peers.py, whose setup this reuses
# (certificates, process pinning, CPU time from /proc/PID/stat utime + stime).
#
# Scenarios are interleaved (each run goes through every server and certificate before the
# next run starts), repeated --runs times; the table gives medians.
#
# Run as root from anywhere:  bench/http3.sh [--runs 3] [--duration 8] [--concurrency 32]
#                                              [--server-quota 0.5 [--quota-period-ms 100]]
#                                              [--workload handshakes|requests|bulk]
#                                              [--profile]
#                                              [--json bench/results/http3.json]
# --profile records each measurement with perf and prints, per handshake or request, where
# each server's CPU time went (bench/where_time_goes.py groups the samples).
# --server-quota caps each server at that fraction of a core (as bench/peers.py does), so
# that the one client core saturates either server: figures per server CPU-second are
# then taken at full load for both.
# $HAPROXY_AWSLC names another HAProxy binary (default /opt/haproxy-awslc/sbin/haproxy).
# On a machine with more cores, CLIENT_CPUS=1-15 CLIENT_THREADS=15 gives the client enough
# of them to saturate either server without a quota (bench/peers.py reads both).
# TLSTERM_BASE=/path/to/tlsterm adds that binary as a third server, "tlsterm-base" (an A/B
# of a change, in the same run as the comparison with HAProxy).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/tlsterm ] || cargo build --release
exec python3 - "$@" <<'PY'
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, "bench")
import peers  # noqa: E402  (bench/peers.py: setup and CPU accounting)
import where_time_goes  # noqa: E402
from peers import (BACKEND, CLIENT_CPU, CLIENT_THREADS, HAPROXY_AWSLC, LISTEN, NICE, RUN, TLSTERM,  # noqa: E402
                   Proc, cpu_seconds, log, make_certs, port_free, raise_priority,
                   start_backend, wait_port)

ADMIN = ("127.0.0.1", 8444)
LISTEN_AT = f"{LISTEN[0]}:{LISTEN[1]}"
BACKEND_AT = f"{BACKEND[0]}:{BACKEND[1]}"


def tlsterm_config(crt, key):
    """One worker answering TLS over TCP and HTTP/3 over QUIC on the same port."""
    return f"""workers = 1
pin_workers = false

[log]
level = "warn"
connections = false

[admin]
address = "{ADMIN[0]}:{ADMIN[1]}"

[[listener]]
address = "{LISTEN_AT}"
backends = ["{BACKEND_AT}"]
alpn = []
max_version = "1.3"
max_connections = 10000
quic = true

[[listener.certificate]]
cert = "{crt}"
key = "{key}"
default = true
"""


def haproxy_config(pem):
    """One thread, HTTP/3 on UDP and TLS on TCP of the same port, the same backend. QUIC
    Retry is kept off (tlsterm has none), as is 0-RTT (HAProxy's default, and tlsterm's)."""
    return f"""global
    nbthread 1
    maxconn 4000
    tune.ssl.cachesize 100000
    tune.quic.fe.sec.retry-threshold 1000000

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
    http-reuse always

frontend fe
    bind quic4@{LISTEN_AT} ssl crt {pem} alpn h3
    bind {LISTEN_AT} ssl crt {pem} ssl-min-ver TLSv1.3
    default_backend be

backend be
    server s1 {BACKEND_AT} maxconn 1000
"""


# The servers of a run: tlsterm, HAProxy + AWS-LC, and the baseline tlsterm when given.
BASE = os.environ.get("TLSTERM_BASE")
SERVERS = ["tlsterm", "haproxy-awslc"] + (["tlsterm-base"] if BASE else [])


def start_server(name, cert, certs):
    crt, key, pem = certs / f"{cert}.crt", certs / f"{cert}.key", certs / f"{cert}.pem"
    if name.startswith("tlsterm"):
        conf = RUN / "http3-tlsterm.toml"
        conf.write_text(tlsterm_config(crt, key))
        binary = BASE if name == "tlsterm-base" else TLSTERM
        server = Proc(name, [binary, "serve", "-c", conf], capped=True)
    else:
        conf = RUN / "http3-haproxy.cfg"
        conf.write_text(haproxy_config(pem))
        server = Proc(name, [HAPROXY_AWSLC, "-db", "-f", conf], capped=True)
    # Both bind TCP and UDP together: the TCP port answering means QUIC is up too.
    wait_port(LISTEN)
    return server


def quic_handshakes():
    """tlsterm's own count of QUIC handshakes by kind (its /metrics)."""
    return peers.handshakes_by_kind("tlsterm_quic_handshakes_total", ADMIN)


# What each workload measures: the client's mode, the path it asks for, the unit counted
# and how to count it from the client's report.
WORKLOADS = {
    "handshakes": ("full", "/", "full handshakes", lambda r: r["handshakes"]),
    "requests": ("bulk", "/bytes/1024", "requests", lambda r: r["requests"]),
    "bulk": ("bulk", "/bytes/1048576", "MiB", lambda r: r["body_bytes"] / 2**20),
}


def bench(transport, args):
    mode, path, _, _ = WORKLOADS[args.workload]
    extra = (["--http3"] if transport == "quic"
             else ["--tls-version", "1.3", "--cipher", "TLS_AES_128_GCM_SHA256"])
    cmd = NICE + ["taskset", "-c", CLIENT_CPU, TLSTERM, "bench", f"https://{LISTEN_AT}{path}",
                  "--mode", mode, "--insecure", "--json", "--quiet",
                  "-c", str(args.concurrency), "-d", f"{args.duration}s",
                  "--threads", CLIENT_THREADS] + extra
    out = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True,
                         timeout=args.duration + 60)
    return json.loads(out.stdout)


def measure(server, transport, args):
    before = (quic_handshakes() if server.name.startswith("tlsterm") and transport == "quic"
              else None)
    pids = server.pids()
    recording = start_profile(server, transport, args, pids) if args.profile else None
    cpu0 = cpu_seconds(pids)
    report = bench(transport, args)
    cpu = cpu_seconds(sorted(set(pids) | set(server.pids()))) - cpu0
    units = WORKLOADS[args.workload][3](report)
    result = {
        "workload": args.workload,
        "units": units,
        "per_s": units / report["elapsed_s"],
        "per_server_cpu_s": units / cpu if cpu > 0 else 0.0,
        "handshakes": report["handshakes"],
        "resumed": report["resumed"],
        "errors": report["errors_total"],
        "error_kinds": report["errors"],
        "elapsed_s": report["elapsed_s"],
        "handshakes_per_s": report["handshakes_per_s"],
        "server_cpu_s": cpu,
        "server_util": cpu / report["elapsed_s"],
        "handshakes_per_server_cpu_s": report["handshakes"] / cpu if cpu > 0 else 0.0,
        "client_cpu_util": report["client_cpu_util"],
        "hs_p50_us": report["handshake_latency"]["p50_us"],
        "hs_p99_us": report["handshake_latency"]["p99_us"],
    }
    if before is not None:
        after = quic_handshakes()
        result["server_full"] = after["full"] - before["full"]
        result["server_resumed"] = after["resumed"] - before["resumed"]
    if recording is not None:
        process, data = recording
        process.send_signal(signal.SIGINT)
        process.wait()
        unit = WORKLOADS[args.workload][2].split()[-1].rstrip("s")
        _, groups = where_time_goes.print_breakdown(
            f"{server.name} over {transport}", data, cpu, int(units), unit=unit)
        result["profile"] = {name: us for name, _, us in groups}
    return result


def start_profile(server, transport, args, pids):
    """`perf record` of the server's processes for the measurement that follows."""
    data = RUN / f"perf-{server.name}-{transport}-{args.workload}.data"
    process = subprocess.Popen(["perf", "record", "-q", "-F", "1999", "-o", str(data),
                                "-p", ",".join(str(p) for p in pids)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process, data


def main():
    ap = argparse.ArgumentParser(description="QUIC handshakes, requests or bulk bytes per "
                                 "server CPU-second against HAProxy + AWS-LC")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=int, default=8, help="seconds per measurement")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--server-quota", type=float, default=None,
                    help="cap each server at this fraction of a core (cgroup v1 CPU quota)")
    ap.add_argument("--quota-period-ms", type=float, default=peers.QUOTA_PERIOD_MS,
                    help="the period over which the quota is enforced (as in bench/peers.py)")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="handshakes",
                    help="what to count per server CPU-second (default: full handshakes)")
    ap.add_argument("--profile", action="store_true",
                    help="record each measurement with perf and print where the server's "
                    "CPU time went per handshake or request (bench/where_time_goes.py); "
                    "perf's own cost lowers the figures a little")
    ap.add_argument("--json", default=str(peers.RESULTS / "http3.json"))
    args = ap.parse_args()
    if not HAPROXY_AWSLC.exists():
        sys.exit(f"no HAProxy + AWS-LC at {HAPROXY_AWSLC} (bench/peers.sh builds it)")
    RUN.mkdir(parents=True, exist_ok=True)
    if args.server_quota:
        peers.set_server_quota(args.server_quota, args.quota_period_ms)
    raise_priority(-20)
    certs = make_certs()
    backend = start_backend("tlsterm")
    results = []
    try:
        for run in range(1, args.runs + 1):
            for cert in certificates(args.workload):
                for name in SERVERS:
                    server = start_server(name, cert, certs)
                    try:
                        for transport in ("quic", "tcp"):
                            r = measure(server, transport, args)
                            r.update(run=run, cert=cert, server=name, transport=transport)
                            unit = WORKLOADS[args.workload][2]
                            log(f"run {run} {cert} {name} {transport}: "
                                f"{r['per_server_cpu_s']:.0f} {unit}/server-CPU-s, "
                                f"{r['per_s']:.0f}/s, server {r['server_util']:.0%}, "
                                f"client {r['client_cpu_util']:.0%}, errors {r['errors']}"
                                + (f", server counted full {r['server_full']} resumed "
                                   f"{r['server_resumed']}" if "server_full" in r else ""))
                            results.append(r)
                    finally:
                        server.stop()
                        port_free(LISTEN)
    finally:
        backend.stop()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    if args.server_quota:
        print(f"Each server capped at {args.server_quota} of a core, enforced over "
              f"{args.quota_period_ms:g} ms periods.\n")
    print_table(results, args.workload)


def certificates(workload):
    """Handshakes differ by certificate; requests and bulk on open connections do not."""
    return ("rsa", "ecdsa") if workload == "handshakes" else ("ecdsa",)


def print_table(results, workload):
    def med(cert, name, transport, key):
        values = [r[key] for r in results
                  if (r["cert"], r["server"], r["transport"]) == (cert, name, transport)]
        return statistics.median(values) if values else float("nan")

    unit = WORKLOADS[workload][2]
    print(f"| certificate | transport | server | {unit} per server CPU-second (median) "
          f"| {unit}/s | server CPU | client CPU | errors (all runs) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for cert in certificates(workload):
        for transport in ("quic", "tcp"):
            for name in SERVERS:
                errors = sum(r["errors"] for r in results
                             if (r["cert"], r["server"], r["transport"]) == (cert, name, transport))
                print(f"| {cert} | {transport} | {name} "
                      f"| {med(cert, name, transport, 'per_server_cpu_s'):.0f} "
                      f"| {med(cert, name, transport, 'per_s'):.0f} "
                      f"| {med(cert, name, transport, 'server_util'):.0%} "
                      f"| {med(cert, name, transport, 'client_cpu_util'):.0%} | {errors} |")
    print()
    for cert in certificates(workload):
        for transport in ("quic", "tcp"):
            t = med(cert, "tlsterm", transport, "per_server_cpu_s")
            h = med(cert, "haproxy-awslc", transport, "per_server_cpu_s")
            print(f"{cert} {transport}: tlsterm / haproxy-awslc = {t / h:.2f}")
            if BASE:
                b = med(cert, "tlsterm-base", transport, "per_server_cpu_s")
                print(f"{cert} {transport}: tlsterm / tlsterm-base = {t / b:.2f}")
        q = med(cert, "tlsterm", "quic", "per_server_cpu_s")
        t = med(cert, "tlsterm", "tcp", "per_server_cpu_s")
        print(f"{cert}: tlsterm quic / tcp = {q / t:.2f}")


main()
PY
