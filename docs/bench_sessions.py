#!/usr/bin/env python3
"""Resumed vs full handshakes per server CPU-second (results in docs/BENCHMARKS-sessions.md).

Server: `tlsterm serve` with workers = 1 pinned to CPU 0 (taskset -c 0), RSA-2048 certificate,
built-in backend. Client: `tlsterm bench` pinned to CPU 1. Server CPU = utime + stime from
/proc/PID/stat, read before and after each run. Each case runs RUNS times; medians reported.

usage: docs/bench_sessions.py [--duration 8s] [--runs 3]   (after cargo build --release)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import socket

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TLSTERM = os.path.join(ROOT, "target", "release", "tlsterm")
TICK = os.sysconf("SC_CLK_TCK")

CASES = [
    # name, server [session] body, bench args
    ("full TLS 1.3", "", ["--mode", "full"]),
    ("resume TLS 1.3 (tickets)", "", ["--mode", "resume", "--per-session", "4"]),
    ("full TLS 1.2", "", ["--mode", "full", "--tls-version", "1.2"]),
    ("resume TLS 1.2 (tickets)", "", ["--mode", "resume", "--per-session", "4", "--tls-version", "1.2"]),
    ("resume TLS 1.2 (session-ID cache)", "tickets = false",
     ["--mode", "resume", "--per-session", "4", "--tls-version", "1.2"]),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def start_server(tmp, session):
    port = free_port()
    config = os.path.join(tmp, f"server-{port}.toml")
    with open(config, "w") as f:
        f.write(f"""workers = 1
[log]
level = "warn"
[admin]
enabled = false
[session]
{session}
[[listener]]
address = "127.0.0.1:{port}"
backends = ["builtin"]
[[listener.certificate]]
cert = "{tmp}/rsa.pem"
key = "{tmp}/rsa.key"
""")
    proc = subprocess.Popen(["taskset", "-c", "0", TLSTERM, "serve", "-c", config],
                            stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.time() + 30
    while True:  # ready when it accepts connections
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                sys.exit("server did not start")
            time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", default="8s")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="write raw results here")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tlsterm-sessions-bench-")
    subprocess.run(["openssl", "req", "-x509", "-nodes", "-days", "2", "-newkey", "rsa:2048",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", f"{tmp}/rsa.key", "-out", f"{tmp}/rsa.pem"],
                   check=True, capture_output=True)
    results = []
    for name, session, bench in CASES:
        proc, port = start_server(tmp, session)
        runs = []
        try:
            for run in range(args.runs):
                before_load = loadavg()
                cpu0 = cpu_seconds(proc.pid)
                out = subprocess.run(
                    ["taskset", "-c", "1", TLSTERM, "bench", f"https://127.0.0.1:{port}/",
                     "--insecure", "-c", "32", "-d", args.duration, "--json", "--quiet"] + bench,
                    check=True, capture_output=True, text=True).stdout
                cpu = cpu_seconds(proc.pid) - cpu0
                r = json.loads(out)
                runs.append({
                    "handshakes": r["handshakes"], "resumed": r["resumed"],
                    "errors": r["errors_total"], "elapsed_s": r["elapsed_s"],
                    "server_cpu_s": cpu, "per_cpu_s": r["handshakes"] / cpu if cpu else 0.0,
                    "per_s": r["handshakes_per_s"], "p50_us": r["handshake_latency"]["p50_us"],
                    "negotiated": r["negotiated"], "load_before": before_load,
                    "load_after": loadavg(),
                })
                print(f"{name} run {run + 1}: {runs[-1]['handshakes']} handshakes "
                      f"({runs[-1]['resumed']} resumed), server CPU {cpu:.2f}s, "
                      f"{runs[-1]['per_cpu_s']:.0f}/CPU-s, load {runs[-1]['load_after']}",
                      file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait()
        results.append({"case": name, "session": session, "bench": bench, "runs": runs})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)

    med = lambda rs, k: statistics.median(r[k] for r in rs)
    print("| case | handshakes/s | resumed share | server CPU-s | handshakes per server CPU-s | p50 latency | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for res in results:
        rs = res["runs"]
        share = med(rs, "resumed") / max(med(rs, "handshakes"), 1)
        print(f"| {res['case']} | {med(rs, 'per_s'):.0f} | {share:.0%} | {med(rs, 'server_cpu_s'):.2f} "
              f"| **{med(rs, 'per_cpu_s'):.0f}** | {med(rs, 'p50_us') / 1000:.1f} ms | {sum(r['errors'] for r in rs)} |")
    # Cost of one resumed handshake alone: take the full handshakes in the mix out at the
    # cost measured in the matching full run.
    full = {("1.2" if "1.2" in r["case"] else "1.3"): r for r in results if r["case"].startswith("full")}
    print()
    for res in results:
        if not res["case"].startswith("resume"):
            continue
        f = full["1.2" if "1.2" in res["case"] else "1.3"]["runs"]
        full_cost = statistics.median(r["server_cpu_s"] / r["handshakes"] for r in f)
        costs = []
        for r in res["runs"]:
            full_n = r["handshakes"] - r["resumed"]
            costs.append((r["server_cpu_s"] - full_n * full_cost) / max(r["resumed"], 1))
        c = statistics.median(costs)
        print(f"- {res['case']}: ~{c * 1e6:.0f} µs of server CPU per resumed handshake vs "
              f"{full_cost * 1e6:.0f} µs per full one ({full_cost / c:.1f}x)")


if __name__ == "__main__":
    main()
