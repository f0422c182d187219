#!/usr/bin/env python3
"""Run the same TLS scenarios against nginx, HAProxy, HAProxy+AWS-LC, hitch and tlsterm in one run.

The terminator (and the plain HTTP backend it proxies to) are pinned to CPU 0, the
load generator (`tlsterm bench`) to CPU 1. Server CPU time is read from
/proc/PID/stat (utime + stime) of every process of the terminator, before and after
each run; the backend's CPU time is reported separately.

haproxy-awslc is HAProxy 3.3 statically linked with AWS-LC 5.5 (the strongest
open-source peer), built from source by ../shared/tools/build-haproxy-awslc.sh into
/opt/haproxy-awslc (bench/peers.sh builds it when missing; $HAPROXY_AWSLC names another
binary). It runs with the same bench/conf/haproxy.cfg, backend and settings as Debian's
haproxy; it is skipped, with a line saying so, when the binary is absent.

`tlsterm-base` runs the build named by $TLSTERM_BASE (say, one from before a change) beside
`tlsterm`, with the same client, backend and settings.

Usage (as root, from the repository root; bench/peers.sh installs what it needs):
    bench/.venv/bin/python bench/peers.py [--servers nginx,haproxy,haproxy-awslc,hitch,tlsterm] [--runs 3]
"""

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RUN = BENCH / "run"
CONF = BENCH / "conf"
RESULTS = BENCH / "results"
TLSTERM = ROOT / "target" / "release" / "tlsterm"
# HAProxy + AWS-LC, built by ../shared/tools/build-haproxy-awslc.sh (see bench/peers.sh).
HAPROXY_AWSLC = Path(os.environ.get("HAPROXY_AWSLC", "/opt/haproxy-awslc/sbin/haproxy"))
LISTEN = ("127.0.0.1", 8443)
BACKEND = ("127.0.0.1", 9000)
SERVER_CPU = "0"
# The client's cores (a taskset list) and its threads: one core of a 2-core machine by
# default; on a larger machine, enough client cores saturate the server without a quota.
CLIENT_CPU = os.environ.get("CLIENT_CPUS", "1")
CLIENT_THREADS = os.environ.get("CLIENT_THREADS", "1")
# Same TLS 1.2 suites everywhere (Mozilla intermediate, as tlsterm's default).
CIPHERS = ("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
           "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
           "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305")
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The machine is shared: run server, backend and client at a high priority so that
# other jobs take little of their cores (set by --nice; 0 turns it off).
NICE = ["nice", "-n", "-20"]

# name, certificate, bench arguments, URL path, concurrency key
# TLS 1.3 scenarios offer one suite so that every server negotiates the same one
# (OpenSSL servers follow the client's order, tlsterm has its own preference).
T13 = ["--tls-version", "1.3", "--cipher", "TLS_AES_128_GCM_SHA256"]
SCENARIOS = [
    ("tls13-rsa-full", "rsa", ["--mode", "full"] + T13, "/", "hs"),
    ("tls13-ecdsa-full", "ecdsa", ["--mode", "full"] + T13, "/", "hs"),
    # The post-quantum hybrid that current browsers offer first (tlsterm's default group).
    ("tls13-ecdsa-full-pq", "ecdsa", ["--mode", "full", "--group", "x25519mlkem768"] + T13,
     "/", "hs"),
    ("tls13-ecdsa-resume", "ecdsa", ["--mode", "resume", "--per-session", "4"] + T13, "/", "hs"),
    # The other two rows with the hybrid too: an RSA certificate, and resumption (a PSK with
    # a key share: the resumed handshake still computes one).
    ("tls13-rsa-full-pq", "rsa", ["--mode", "full", "--group", "x25519mlkem768"] + T13,
     "/", "hs"),
    ("tls13-ecdsa-resume-pq", "ecdsa", ["--mode", "resume", "--per-session", "4",
                                        "--group", "x25519mlkem768"] + T13, "/", "hs"),
    # An ECDSA P-384 certificate (X25519 key exchange, as its clients mostly use).
    ("tls13-ecdsa384-full", "ecdsa384", ["--mode", "full"] + T13, "/", "hs"),
    # ...and with a P-384 key exchange too (clients held to the NIST P-384 suite).
    ("tls13-ecdsa384-full-p384", "ecdsa384", ["--mode", "full", "--group", "p384"] + T13,
     "/", "hs"),
    ("tls12-rsa-full", "rsa", ["--mode", "full", "--tls-version", "1.2",
                               "--cipher", "ECDHE-RSA-AES128-GCM-SHA256"], "/", "hs"),
    ("tls13-rsa-resume", "rsa", ["--mode", "resume", "--per-session", "4"] + T13, "/", "hs"),
    ("bulk-1mib", "rsa", ["--mode", "bulk"] + T13, "/bytes/1048576", "bulk"),
    # Open loop at half of the server's measured tls13-rsa-full capacity.
    ("tls13-rsa-latency-half", "rsa", ["--mode", "full"] + T13, "/", "rate"),
    # Open loop, every server at the same rate: half of the slowest server's capacity.
    ("tls13-rsa-latency-common", "rsa", ["--mode", "full"] + T13, "/", "rate-common"),
]


# Servers that can negotiate X25519MLKEM768 (Debian's OpenSSL 3.0 cannot).
PQ_SERVERS = ("haproxy-awslc", "tlsterm")
# The server's cgroup (v1 cpu controller) when --server-quota caps it.
QUOTA_CGROUP = Path("/sys/fs/cgroup/cpu/tlsterm-bench-server")
SERVER_QUOTA = None


# The period over which the quota is enforced (the kernel's default). A capped server runs
# its share of each period and then waits; the part of tlsterm's key shares and signatures
# computed in batches (in each run's summary) shows whether it had work queued while it ran.
QUOTA_PERIOD_MS = 100


def set_server_quota(fraction, period_ms=QUOTA_PERIOD_MS):
    """Caps the server at `fraction` of a core (cgroup v1 CFS quota, enforced over
    `period_ms`), so that one client core saturates even the fastest server: handshakes
    per server CPU-second are then measured at full load for every server alike."""
    global SERVER_QUOTA
    period_us = int(period_ms * 1000)
    QUOTA_CGROUP.mkdir(exist_ok=True)
    (QUOTA_CGROUP / "cpu.cfs_period_us").write_text(str(period_us))
    (QUOTA_CGROUP / "cpu.cfs_quota_us").write_text(str(int(fraction * period_us)))
    # A group weighs as much as one task of its parent by default: give it the weight its
    # niceness would (the servers run at -20), or other jobs on the core take its time.
    (QUOTA_CGROUP / "cpu.shares").write_text("262144")
    SERVER_QUOTA = fraction


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


# ---------------------------------------------------------------- setup

def make_certs():
    """A local CA and, signed by it, an RSA-2048, an ECDSA P-256 and an ECDSA P-384 leaf
    for localhost."""
    certs = RUN / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    q = dict(capture_output=True)
    if not (certs / "ca.crt").exists():
        sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", certs / "ca.key", "-out", certs / "ca.crt", "-days", "365",
            "-subj", "/CN=tlsterm bench CA"], **q)
    ext = certs / "leaf.ext"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for kind, newkey in (("rsa", ["-newkey", "rsa:2048"]),
                         ("ecdsa", ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]),
                         ("ecdsa384", ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"])):
        if (certs / f"{kind}.crt").exists():
            continue
        sh(["openssl", "req", "-new", *newkey, "-nodes", "-keyout", certs / f"{kind}.key",
            "-out", certs / f"{kind}.csr", "-subj", "/CN=localhost"], **q)
        sh(["openssl", "x509", "-req", "-in", certs / f"{kind}.csr", "-CA", certs / "ca.crt",
            "-CAkey", certs / "ca.key", "-CAcreateserial", "-days", "365", "-extfile", ext,
            "-out", certs / f"{kind}.crt"], **q)
    for kind in ("rsa", "ecdsa", "ecdsa384"):
        pem = certs / f"{kind}.pem"  # certificate + key, for HAProxy and hitch
        pem.write_bytes((certs / f"{kind}.crt").read_bytes() + (certs / f"{kind}.key").read_bytes())
        os.chmod(certs / f"{kind}.key", 0o644)  # hitch workers run as nobody
    return certs


def raise_priority(nice):
    """With autogroup scheduling, nice only ranks processes inside one session; give
    this session's autogroup (server, backend, client are all in it) the priority."""
    if not nice:
        return
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
        log("autogroup:", Path("/proc/self/autogroup").read_text().strip())
    except OSError as e:
        log(f"cannot set autogroup nice ({e}); other jobs on the machine will compete")


def render(template, out, **vars):
    text = (CONF / template).read_text()
    for k, v in vars.items():
        text = text.replace(f"@{k}@", str(v))
    left = set(re.findall(r"@([A-Z_]+)@", text)) - {"VARS"}
    assert not left, f"unfilled {left} in {template}"
    (RUN / out).write_text(text)
    return RUN / out


# ---------------------------------------------------------------- processes

def wait_port(addr, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(addr, timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {addr} after {timeout}s")


def port_free(addr, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(addr, timeout=0.2).close()
            time.sleep(0.05)
        except OSError:
            return
    raise RuntimeError(f"{addr} still busy")


def descendants(pid):
    """pid and all its descendants (from /proc/*/stat parent links)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            fields = st[st.rfind(")") + 2:].split()
            parent[int(d)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


def cpu_seconds(pids):
    """utime + stime of these processes (all their threads), in seconds."""
    total = 0
    for p in pids:
        try:
            st = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = st[st.rfind(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLK_TCK


class Proc:
    def __init__(self, name, cmd, cpu=SERVER_CPU, logname=None, capped=False):
        self.name = name
        logf = open(RUN / f"{logname or name}.log", "ab")
        self.p = subprocess.Popen(NICE + ["taskset", "-c", cpu] + [str(c) for c in cmd],
                                  stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT)
        if capped and SERVER_QUOTA:
            # Before the server forks its workers: they inherit the group.
            (QUOTA_CGROUP / "cgroup.procs").write_text(str(self.p.pid))

    def pids(self):
        return descendants(self.p.pid)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def start_backend(kind):
    if kind == "tlsterm":
        b = Proc("backend", [TLSTERM, "backend", "--listen", f"{BACKEND[0]}:{BACKEND[1]}"])
    else:  # nginx serving static files, for when `tlsterm backend` is unavailable
        www = RUN / "www"
        (www / "bytes").mkdir(parents=True, exist_ok=True)
        (www / "index.html").write_text("hello\n")
        (www / "bytes" / "1048576").write_bytes(b"x" * 1048576)
        conf = RUN / "backend-nginx.conf"
        conf.write_text(f"""worker_processes 1; daemon off; pid {RUN}/backend-nginx.pid;
error_log {RUN}/backend-nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{ access_log off; server {{ listen {BACKEND[0]}:{BACKEND[1]};
root {www}; keepalive_requests 100000; }} }}
""")
        b = Proc("backend", ["nginx", "-c", conf])
    wait_port(BACKEND)
    return b


def start_server(name, cert, certs, engine):
    listen = f"{LISTEN[0]}:{LISTEN[1]}"
    backend = f"{BACKEND[0]}:{BACKEND[1]}"
    crt, key, pem = certs / f"{cert}.crt", certs / f"{cert}.key", certs / f"{cert}.pem"
    if name == "nginx":
        conf = render("nginx.conf", "nginx.conf", RUN=RUN, BACKEND=backend, LISTEN=listen,
                      CERT=crt, KEY=key, CIPHERS=CIPHERS)
        p = Proc(name, ["nginx", "-c", conf], capped=True)
    elif name in ("haproxy", "haproxy-awslc"):
        # Same template and settings for both: only the binary (and its TLS library) differs.
        # Groups: AWS-LC has the post-quantum hybrid, Debian's OpenSSL 3.0 does not.
        curves = (
            "X25519MLKEM768:X25519:P-256:P-384" if name == "haproxy-awslc" else "X25519:P-256:P-384")
        conf = render("haproxy.cfg", f"{name}.cfg", LISTEN=listen, BACKEND=backend, PEM=pem,
                      CIPHERS=CIPHERS, CURVES=curves)
        p = Proc(name, ["haproxy" if name == "haproxy" else HAPROXY_AWSLC, "-db", "-f", conf],
                 capped=True)
    elif name == "hitch":
        conf = render("hitch.conf", "hitch.conf", LISTEN_HOST=LISTEN[0], LISTEN_PORT=LISTEN[1],
                      BACKEND_HOST=BACKEND[0], BACKEND_PORT=BACKEND[1], PEM=pem, CIPHERS=CIPHERS)
        p = Proc(name, ["hitch", "--config", conf], capped=True)
    elif name.startswith("tlsterm"):
        conf = render("tlsterm.toml", f"{name}.toml", LISTEN=listen, BACKEND=backend, CERT=crt,
                      KEY=key, CIPHERS=CIPHERS, **engine_of(name, engine))
        binary = TLSTERM
        if name == "tlsterm-base":
            # An older build to compare with (e.g. one from before a change): it may not
            # know `key_shares`, so it gets BoringSSL's key shares, its only way then.
            binary = Path(os.environ["TLSTERM_BASE"])
            text = Path(conf).read_text()
            Path(conf).write_text("".join(line for line in text.splitlines(True)
                                          if not line.startswith(("key_shares", "mode"))))
        p = Proc(name, [binary, "serve", "-c", conf], capped=True)
    else:
        raise ValueError(name)
    try:
        wait_port(LISTEN)
    except RuntimeError:
        p.stop()
        raise
    time.sleep(0.3)  # let worker processes finish starting before CPU accounting
    return p


def try_start(name, cert, certs, engine):
    """Start a server; on failure log it (see bench/run/NAME.log) and skip it."""
    try:
        return start_server(name, cert, certs, engine)
    except Exception as e:  # noqa: BLE001 - one broken server must not end the run
        log(f"{name} did not start: {e}; see {RUN / (name + '.log')}")
        if port_busy(LISTEN):
            raise
        return None


def port_busy(addr):
    try:
        socket.create_connection(addr, timeout=0.2).close()
        return True
    except OSError:
        return False


def engine_of(name, default):
    """The [engine] settings a tlsterm server's name asks for: tlsterm-inline and
    tlsterm-batch force the mode; tlsterm-avx2, tlsterm-avx512f and tlsterm-avx512ifma batch
    with that kernel (the AVX2 and AVX-512F kernels can be measured on a CPU that also has
    IFMA). tlsterm-http forwards HTTP requests over pooled backend connections
    (`mode = "http"`, as HAProxy's `mode http` here) instead of relaying bytes."""
    suffix = name.split("-", 1)[1] if "-" in name else None
    if suffix == "http":
        return {"ENGINE": default, "KERNEL": "auto", "KEY_SHARES": "auto", "MODE": "http"}
    if suffix in ("avx2", "avx512f", "avx512ifma"):
        return {"ENGINE": "batch", "KERNEL": suffix, "KEY_SHARES": "auto", "MODE": "tcp"}
    if suffix == "base":
        # A baseline build ($TLSTERM_BASE), with the settings it knows (see start_server).
        return {"ENGINE": default, "KERNEL": "auto", "KEY_SHARES": "auto", "MODE": "tcp"}
    if suffix == "sharesinline":
        # Key shares left to BoringSSL, as before tlsterm computed them: the A/B of that.
        return {"ENGINE": default, "KERNEL": "auto", "KEY_SHARES": "inline", "MODE": "tcp"}
    return {"ENGINE": suffix or default, "KERNEL": "auto", "KEY_SHARES": "auto", "MODE": "tcp"}


# ---------------------------------------------------------------- measuring

def bench(extra, path, conc, duration, rate=None):
    cmd = NICE + ["taskset", "-c", CLIENT_CPU, TLSTERM, "bench", f"https://{LISTEN[0]}:{LISTEN[1]}{path}",
           "--insecure", "--json", "--quiet", "-c", str(conc), "-d", f"{duration}s",
           "--threads", CLIENT_THREADS] + extra
    if rate:
        cmd += ["--rate", f"{rate:.0f}"]
    out = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True,
                         timeout=duration + 60)
    return json.loads(out.stdout)


def tlsterm_metrics(admin=("127.0.0.1", 8444)):
    """tlsterm's /metrics; raises OSError when the admin port does not answer."""
    import urllib.request
    return urllib.request.urlopen(f"http://{admin[0]}:{admin[1]}/metrics", timeout=2).read().decode()


def handshakes_by_kind(series, admin=("127.0.0.1", 8444)):
    """tlsterm's own count of full and resumed handshakes in `series` (a counter with a
    `kind` label) from its /metrics; raises OSError when the admin port does not answer."""
    return handshake_kinds(tlsterm_metrics(admin), series)


def handshake_kinds(text, series):
    """Full and resumed handshakes in `series` of tlsterm's /metrics text."""
    out = {"full": 0, "resumed": 0}
    for line in text.splitlines():
        m = re.match(series + r'\{kind="(\w+)"\} (\d+)', line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


# tlsterm's counters of who computed its key shares and signatures, each summed by its
# `path` label (batch, aws-lc-rs, inline, ...): how much of the work the engine batched
# is what shows whether the server had work queued (a saturated server fills batches).
ENGINE_PATHS = {"key_shares": "tlsterm_key_shares_total",
                "signatures": "tlsterm_engine_operations_total"}


def engine_paths(text):
    """Key shares and signatures by path from tlsterm's /metrics text."""
    out = {kind: {} for kind in ENGINE_PATHS}
    for kind, series in ENGINE_PATHS.items():
        for m in re.finditer(series + r'\{[^}]*path="([\w-]+)"[^}]*\} (\d+)', text):
            out[kind][m.group(1)] = out[kind].get(m.group(1), 0) + int(m.group(2))
    return out


# The engine's batch-size histograms: how full its batches ran (a saturated server fills
# them; a batch of 5 costs the RSA kernel two passes where 4 cost one).
BATCH_SERIES = {"signatures": "tlsterm_engine_batch_operations",
                "key_shares": "tlsterm_engine_key_share_batch_operations"}


def batch_histograms(text):
    """Per kind: batches, operations in them, and batches of at most `le` operations."""
    out = {}
    for kind, series in BATCH_SERIES.items():
        buckets = {m.group(1): int(float(m.group(2))) for m in
                   re.finditer(series + r'_bucket\{le="([^"]+)"\} (\S+)', text)}
        count = re.search(series + r'_count (\S+)', text)
        total = re.search(series + r'_sum (\S+)', text)
        out[kind] = {"batches": int(float(count.group(1))) if count else 0,
                     "operations": int(float(total.group(1))) if total else 0,
                     "le": buckets}
    return out


def batch_deltas(before, after):
    """`batch_histograms` of what happened between two readings."""
    return {kind: {"batches": a["batches"] - before[kind]["batches"],
                   "operations": a["operations"] - before[kind]["operations"],
                   "le": {le: n - before[kind]["le"].get(le, 0) for le, n in a["le"].items()}}
            for kind, a in after.items()}


def tlsterm_counts(server):
    """tlsterm's own count of full and resumed handshakes, key shares and signatures by
    path (its /metrics), or None."""
    if not server.name.startswith("tlsterm"):
        return None
    try:
        text = tlsterm_metrics()
    except OSError:
        return None
    return (handshake_kinds(text, "tlsterm_handshakes_total") | engine_paths(text)
            | {"batches": batch_histograms(text)})


def mean_batch(runs, kind):
    """Operations per batch of `kind` over `runs`, or None without batches."""
    batches = [r["engine_batches"][kind] for r in runs if "engine_batches" in r]
    n = sum(b["batches"] for b in batches)
    return sum(b["operations"] for b in batches) / n if n else None


def batched_share(runs, kind):
    """The part of `kind` (key_shares or signatures) the engine computed in batches over
    `runs`, or None when there was none of that kind."""
    paths = {}
    for r in runs:
        for path, n in r.get("engine_paths", {}).get(kind, {}).items():
            paths[path] = paths.get(path, 0) + n
    total = sum(n for path, n in paths.items() if path != "not_applied")
    return paths.get("batch", 0) / total if total else None


# --profile: each measurement recorded with perf, and where the server's CPU time went per
# handshake printed (bench/where_time_goes.py).
PROFILE = {"on": False, "runs": 0}


def measure(server, backend, extra, path, conc, duration, rate=None):
    load = Path("/proc/loadavg").read_text().split()[0]
    srv_hs0 = tlsterm_counts(server)
    spids, bpids = server.pids(), backend.pids()
    profiler = None
    if PROFILE["on"]:
        PROFILE["runs"] += 1
        data = RUN / f"perf-{server.name}-{PROFILE['runs']}.data"
        profiler = subprocess.Popen(["perf", "record", "-q", "-F", "1999", "-o", str(data),
                                     "-p", ",".join(str(p) for p in spids)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s0, b0, busy0 = cpu_seconds(spids), cpu_seconds(bpids), cpu_busy()
    try:
        r = bench(extra, path, conc, duration, rate)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        log(f"bench failed: {e} {getattr(e, 'stderr', '')}")
        return None
    finally:
        if profiler:
            profiler.send_signal(signal.SIGINT)
            profiler.wait()
    busy1 = cpu_busy()
    srv_hs1 = tlsterm_counts(server)
    spids = sorted(set(spids) | set(server.pids()))
    s1, b1 = cpu_seconds(spids), cpu_seconds(bpids)
    scpu, bcpu = s1 - s0, b1 - b0
    el = r["elapsed_s"]
    busy = {c: busy1[c] - busy0[c] for c in busy1}
    res = {
        # CPU used during the run by anything but server, backend and client: noise.
        "other_cpu_s": sum(busy.values()) - scpu - bcpu - r["client_cpu_s"],
        "cpu_busy": {c: v / el for c, v in busy.items()},
        "loadavg_before": float(load),
        "elapsed_s": el,
        "concurrency": conc,
        "rate": rate,
        "handshakes": r["handshakes"],
        "resumed": r["resumed"],
        "requests": r["requests"],
        "handshakes_per_s": r["handshakes_per_s"],
        "requests_per_s": r["requests_per_s"],
        "mb_per_s": r["mb_per_s"],
        "errors": r["errors_total"],
        "error_kinds": r["errors"],
        "negotiated": r["negotiated"],
        "server_cpu_s": scpu,
        "backend_cpu_s": bcpu,
        "server_util": scpu / el,
        "core0_util": (scpu + bcpu) / el,
        "handshakes_per_server_cpu_s": r["handshakes"] / scpu if scpu > 0 else 0,
        "mb_per_server_cpu_s": r["wire_bytes"] / 1e6 / scpu if scpu > 0 else 0,
        "client_cpu_util": r["client_cpu_util"],
        "handshakes_per_client_cpu_s": r["handshakes_per_client_cpu_s"],
        "hs_p50_us": r["handshake_latency"]["p50_us"],
        "hs_p99_us": r["handshake_latency"]["p99_us"],
        "req_p99_us": r["request_latency"]["p99_us"],
        "total_p50_us": r["total_latency"]["p50_us"],
        "total_p99_us": r["total_latency"]["p99_us"],
        "total_p999_us": r["total_latency"]["p999_us"],
        "total_max_us": r["total_latency"]["max_us"],
    }
    if srv_hs0 and srv_hs1:
        # Server-side cross-check of the client's resumed count.
        res["server_full"] = srv_hs1["full"] - srv_hs0["full"]
        res["server_resumed"] = srv_hs1["resumed"] - srv_hs0["resumed"]
        res["engine_paths"] = {
            kind: {path: n - srv_hs0[kind].get(path, 0) for path, n in srv_hs1[kind].items()}
            for kind in ENGINE_PATHS}
        res["engine_batches"] = batch_deltas(srv_hs0["batches"], srv_hs1["batches"])
    if profiler:
        import where_time_goes
        where_time_goes.print_breakdown(f"{server.name} ({data})", data, scpu,
                                        r["handshakes"], "handshake")
    if rate:
        res["hs_cdf"] = r["handshake_latency"]["cdf"]
        res["lag_p50_us"] = r["start_lag"]["p50_us"]
        res["lag_p99_us"] = r["start_lag"]["p99_us"]
        res["total_cdf"] = r["total_latency"]["cdf"]
    return res


def cpu_busy():
    """Busy seconds per CPU from /proc/stat (everything but idle and iowait)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        f = line.split()
        if f[0].startswith("cpu") and f[0] != "cpu":
            v = [int(x) for x in f[1:9]]
            out[f[0]] = (sum(v) - v[3] - v[4]) / CLK_TCK
    return out


def median_of(runs, key):
    return statistics.median(r[key] for r in runs)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="nginx,haproxy,haproxy-awslc,hitch,tlsterm",
                    help="comma list; haproxy-awslc is HAProxy + AWS-LC ($HAPROXY_AWSLC, default "
                         "/opt/haproxy-awslc/sbin/haproxy; skipped when absent); tlsterm-inline / "
                         "tlsterm-batch force the engine mode, tlsterm-avx2 / tlsterm-avx512f / "
                         "tlsterm-avx512ifma the kernel")
    ap.add_argument("--scenarios", default=",".join(s[0] for s in SCENARIOS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--concurrency", type=int, default=64, help="handshake scenarios")
    ap.add_argument("--bulk-concurrency", type=int, default=8)
    ap.add_argument("--sweep", default="4,16,64,256", help="concurrency sweep for tls13-rsa-full ('' = none)")
    ap.add_argument("--engine", default="batch", help="tlsterm [engine] mode for plain 'tlsterm'")
    ap.add_argument("--backend", default="auto", choices=["auto", "tlsterm", "nginx"])
    ap.add_argument("--no-record", action="store_true", help="skip the record-layer microbenchmark")
    ap.add_argument("--profile", action="store_true",
                    help="record each measurement with perf and print where the server's CPU "
                    "time went per handshake (bench/where_time_goes.py); perf's own cost "
                    "lowers the figures a little")
    ap.add_argument("--interleave", action="store_true",
                    help="rotate servers run by run instead of all runs of one server in a row")
    ap.add_argument("--nice", type=int, default=-20, help="niceness of server, backend and client")
    ap.add_argument("--tag", default=time.strftime("%Y%m%d-%H%M%S"))
    ap.add_argument("--server-quota", type=float, default=None,
                    help="cap every terminator at this fraction of a core (cgroup v1 CPU quota, "
                         "e.g. 0.5) so that one client core saturates it")
    ap.add_argument("--quota-period-ms", type=float, default=QUOTA_PERIOD_MS,
                    help=f"the period over which the quota is enforced (default {QUOTA_PERIOD_MS}, "
                         "the kernel's)")
    ap.add_argument("--results-dir", default=str(RESULTS),
                    help="where the JSON, tables and charts go (default bench/results; give "
                         "another directory for smoke runs, so they stay out of the committed results)")
    args = ap.parse_args()
    PROFILE["on"] = args.profile
    global NICE
    NICE = ["nice", "-n", str(args.nice)] if args.nice else []
    raise_priority(args.nice)

    if args.server_quota:
        set_server_quota(args.server_quota, args.quota_period_ms)
    RUN.mkdir(parents=True, exist_ok=True)
    results_dir = Path(args.results_dir).resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    certs = make_certs()
    servers = args.servers.split(",")
    if "haproxy-awslc" in servers and not os.access(HAPROXY_AWSLC, os.X_OK):
        log(f"skip haproxy-awslc: {HAPROXY_AWSLC} is missing; build it with bench/peers.sh "
            "(runs ../shared/tools/build-haproxy-awslc.sh) or set HAPROXY_AWSLC")
        servers.remove("haproxy-awslc")
    wanted = args.scenarios.split(",")
    scenarios = [s for s in SCENARIOS if s[0] in wanted]
    backend_kind = args.backend
    if backend_kind == "auto":
        ok = subprocess.run([TLSTERM, "backend", "--help"], capture_output=True).returncode == 0
        backend_kind = "tlsterm" if ok else "nginx"
    port_free(LISTEN)
    port_free(BACKEND)
    backend = start_backend(backend_kind)
    meta = {
        "tag": args.tag,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "kernel": os.uname().release,
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
        # OpenSSL's own override of the CPU features it uses; set it to measure the
        # OpenSSL-based peers as they sign on a CPU without some instructions (for example
        # ":~0x200000" hides AVX-512 IFMA). tlsterm's engine detects its kernels itself.
        "openssl_ia32cap": os.environ.get("OPENSSL_ia32cap"),
        "nproc": os.cpu_count(),
        "backend": backend_kind,
        "server_cpu": SERVER_CPU,
        "client_cpu": CLIENT_CPU,
        "args": vars(args),
        "versions": versions(),
        "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip(),
    }
    results = {"meta": meta, "scenarios": {}, "sweep": {}}
    capacity = {}
    try:
        for name, cert, extra, path, kind in scenarios:
            per = results["scenarios"][name] = {}
            # --interleave: one run per server per round, so drift in the machine's
            # background load hits every server alike (costs a server restart per run).
            rounds = [1] * args.runs if args.interleave else [args.runs]
            for n in rounds:
                for srv in servers:
                    if name.endswith("-pq") and not srv.startswith(PQ_SERVERS):
                        log(f"skip {name} {srv}: its TLS library has no X25519MLKEM768")
                        continue
                    if kind.startswith("rate") and srv not in capacity:
                        log(f"skip {name} {srv}: no tls13-rsa-full capacity measured")
                        continue
                    server = try_start(srv, cert, certs, args.engine)
                    if server is None:
                        continue
                    runs = per.setdefault(srv, [])
                    try:
                        for _ in range(n):
                            if kind.startswith("rate"):
                                rate = (capacity[srv] if kind == "rate" else min(capacity.values())) / 2
                                r = measure(server, backend, extra, path, 256, args.duration, rate)
                            else:
                                conc = args.bulk_concurrency if kind == "bulk" else args.concurrency
                                r = measure(server, backend, extra, path, conc, args.duration)
                            if r is None:
                                continue
                            runs.append(r)
                            log(f"{name:24} {srv:14} run {len(runs)}: {r['handshakes_per_s']:8.0f} hs/s "
                                f"{r['handshakes_per_server_cpu_s']:7.0f} hs/srv-CPU-s "
                                f"{r['mb_per_s']:8.1f} MB/s srv {r['server_util'] * 100:3.0f}% "
                                f"core0 {r['core0_util'] * 100:3.0f}% cli {r['client_cpu_util'] * 100:3.0f}% "
                                f"p99 {r['total_p99_us'] / 1000:7.2f}ms resumed {r['resumed']} err {r['errors']} "
                                f"load {r['loadavg_before']} other {r['other_cpu_s']:.2f}s")
                    finally:
                        server.stop()
                        port_free(LISTEN)
            for srv in list(per):
                if not per[srv]:
                    del per[srv]
                elif name == "tls13-rsa-full":
                    capacity[srv] = median_of(per[srv], "handshakes_per_s")
        sweep = [int(c) for c in args.sweep.split(",") if c]
        if sweep and "tls13-rsa-full" in wanted:
            name, cert, extra, path, _ = SCENARIOS[0]
            for srv in servers:
                server = try_start(srv, cert, certs, args.engine)
                if server is None:
                    continue
                try:
                    results["sweep"][srv] = []
                    for c in sweep:
                        r = measure(server, backend, extra, path, c, args.duration)
                        if r is None:
                            continue
                        log(f"sweep c={c:<4} {srv:14} {r['handshakes_per_s']:8.0f} hs/s "
                            f"{r['handshakes_per_server_cpu_s']:7.0f} hs/srv-CPU-s cli {r['client_cpu_util'] * 100:3.0f}%")
                        results["sweep"][srv].append(r)
                finally:
                    server.stop()
                    port_free(LISTEN)
    finally:
        backend.stop()
    if not args.no_record:
        for key, step in (("record", record_bench), ("speed", speed_bench)):
            try:
                results[key] = step()
            except (OSError, subprocess.CalledProcessError, ValueError, IndexError) as e:
                log(f"{key} step failed: {e}")  # keep the load results regardless
    out = results_dir / f"peers-{args.tag}.json"
    out.write_text(json.dumps(results, indent=1))
    (results_dir / "peers-latest.json").write_text(json.dumps(results, indent=1))
    log(f"wrote {out}")
    md = summarize(results)
    (results_dir / f"peers-{args.tag}.md").write_text(md)
    print(md)
    try:
        import charts
        charts.draw(results, results_dir, args.tag)
    except ImportError as e:
        log(f"no charts ({e}); run bench/peers.sh to set up matplotlib")
    if args.nice:
        Path("/proc/self/autogroup").write_text("0")  # the session is shared: give it back


OPENSSL_EVP = {"AES128-GCM": "aes-128-gcm", "AES256-GCM": "aes-256-gcm", "CHACHA20": "chacha20-poly1305"}


def record_bench(seconds=3):
    """tlsterm's BoringSSL record layer in memory vs `openssl speed -evp`, 16 KiB, on CPU 1."""
    out = subprocess.run(["taskset", "-c", CLIENT_CPU, str(TLSTERM), "bench", "--mode", "record",
                          "--json"], check=True, capture_output=True, text=True)
    rows = json.loads(out.stdout)
    for row in rows:
        evp = next((v for k, v in OPENSSL_EVP.items() if k in row["cipher"]), None)
        if row["version"] != "TLSv1.2" or evp is None:
            continue
        sp = subprocess.run(["taskset", "-c", CLIENT_CPU, "openssl", "speed", "-evp", evp, "-bytes",
                             "16384", "-seconds", str(seconds)], capture_output=True, text=True)
        last = sp.stdout.strip().splitlines()[-1].split()
        # "<name> <N>k": thousands of bytes per CPU-second
        row["openssl_speed_evp"] = evp
        row["openssl_speed_mb_per_s"] = float(last[-1].rstrip("k")) / 1000
    return rows


def speed_bench(seconds=2):
    """Private-key operations per second on CPU 1: tlsterm's engine and BoringSSL
    (`tlsterm speed`) beside OpenSSL (`openssl speed`), for the "where the time goes" notes."""
    out = {}
    t = subprocess.run(["taskset", "-c", CLIENT_CPU, str(TLSTERM), "speed", "rsa2048", "ecdsap256", "--pss",
                        "--seconds", str(seconds)], capture_output=True, text=True)
    out["tlsterm_speed_output"] = t.stdout
    for line in t.stdout.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0] in ("rsa2048", "ecdsap256"):
            out[f"{f[0]}_inline_per_s"] = float(f[1])
            out[f"{f[0]}_batch_per_s"] = float(f[2])
    o = subprocess.run(["taskset", "-c", CLIENT_CPU, "openssl", "speed", "-seconds", str(seconds), "rsa2048",
                        "ecdsap256"], capture_output=True, text=True)
    out["openssl_speed_output"] = o.stdout
    for line in o.stdout.splitlines():
        f = line.split()
        if line.startswith("rsa 2048 bits"):
            out["rsa2048_openssl_per_s"] = float(f[-2])
        elif "ecdsa (nistp256)" in line:
            out["ecdsap256_openssl_per_s"] = float(f[-2])
    return out


def versions():
    def first_line(cmd):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True)
            return (p.stdout + p.stderr).strip().splitlines()[0]
        except (OSError, IndexError):
            return "?"

    def haproxy_ssl(binary):
        """The TLS library HAProxy runs on, from `haproxy -vv`."""
        try:
            p = subprocess.run([str(binary), "-vv"], capture_output=True, text=True)
        except OSError:
            return "?"
        m = re.search(r"Running on SSL library version : (.+)", p.stdout + p.stderr)
        return m.group(1).strip() if m else "?"

    def awslc_build():
        """The sources' tags and commits, from the BUILD-INFO the build script writes."""
        info = HAPROXY_AWSLC.parent.parent / "BUILD-INFO"
        try:
            return [l for l in info.read_text().splitlines()
                    if l.startswith(("built:", "haproxy source:", "aws-lc source:"))]
        except OSError:
            return None

    have_awslc = os.access(HAPROXY_AWSLC, os.X_OK)
    return {
        "nginx": first_line(["nginx", "-v"]),
        "haproxy": first_line(["haproxy", "-v"]),
        "haproxy_ssl": haproxy_ssl("haproxy"),
        "haproxy-awslc": first_line([HAPROXY_AWSLC, "-v"]) if have_awslc else None,
        "haproxy-awslc_ssl": haproxy_ssl(HAPROXY_AWSLC) if have_awslc else None,
        "haproxy-awslc_binary": str(HAPROXY_AWSLC) if have_awslc else None,
        "haproxy-awslc_build": awslc_build() if have_awslc else None,
        "hitch": first_line(["hitch", "--version"]),
        "openssl": first_line(["openssl", "version"]),
        "tlsterm": first_line([TLSTERM, "--version"]),
        "kernel": os.uname().release,
    }


def summarize(results):
    lines = []
    meta = results["meta"]
    lines.append(f"Run {meta['tag']} ({meta['date']}, git {meta['git']}), backend: {meta['backend']}, "
                 f"runs per cell: {meta['args']['runs']}, {meta['args']['duration']} s each; medians.\n")
    quota = meta["args"].get("server_quota")
    if quota:
        period = meta["args"].get("quota_period_ms", 100)
        lines.append(f"Every terminator capped at {quota} of a core, enforced over {period:g} ms periods.\n")
    v = meta.get("versions", {})
    if v.get("haproxy-awslc"):
        line = (f"haproxy-awslc: {v['haproxy-awslc']}, on {v.get('haproxy-awslc_ssl')} "
                f"({v.get('haproxy-awslc_binary')})")
        if v.get("haproxy", "?") != "?":
            line += f"; haproxy: {v['haproxy']}, on {v.get('haproxy_ssl')}"
        lines.append(line + ".\n")
    if meta.get("openssl_ia32cap") is not None:
        lines.append(f"OpenSSL ran with OPENSSL_ia32cap={meta['openssl_ia32cap']!r}: the OpenSSL-based "
                     "servers (nginx, HAProxy, hitch) did not use the CPU features it hides "
                     "(haproxy-awslc runs on AWS-LC, which reads OPENSSL_ia32cap too).\n")
    for name, per in results["scenarios"].items():
        if not per:
            continue
        lines.append(f"### {name}\n")
        bulk = name.startswith("bulk")
        rate = "latency" in name
        hdr = ["server", "hs/s", "hs per server CPU-s", "MB/s", "MB per server CPU-s",
               "server CPU", "core 0 CPU", "client CPU", "p50 ms", "p99 ms", "resumed", "errors",
               "other CPU-s"]
        if rate:
            hdr.insert(1, "rate /s")
        lines.append("| " + " | ".join(hdr) + " |")
        lines.append("|" + "---|" * len(hdr))
        for srv, runs in per.items():
            m = lambda k: median_of(runs, k)
            row = [srv]
            if rate:
                row.append(f"{runs[0]['rate']:.0f}")
            row += [f"{m('handshakes_per_s'):.0f}", f"{m('handshakes_per_server_cpu_s'):.0f}",
                    f"{m('mb_per_s'):.1f}", f"{m('mb_per_server_cpu_s'):.0f}",
                    f"{m('server_util') * 100:.0f}%", f"{m('core0_util') * 100:.0f}%",
                    f"{m('client_cpu_util') * 100:.0f}%",
                    f"{m('total_p50_us') / 1000:.2f}", f"{m('total_p99_us') / 1000:.2f}",
                    f"{sum(r['resumed'] for r in runs)}/{sum(r['handshakes'] for r in runs)}",
                    f"{sum(r['errors'] for r in runs)}", f"{m('other_cpu_s'):.2f}"]
            lines.append("| " + " | ".join(row) + " |")
        for srv, runs in per.items():
            if "server_resumed" in runs[0]:
                batched = [f"{kind.replace('_', ' ')} {share * 100:.0f}%" for kind in ENGINE_PATHS
                           if (share := batched_share(runs, kind)) is not None]
                sizes = [f"{kind.replace('_', ' ')} {size:.1f}" for kind in BATCH_SERIES
                         if (size := mean_batch(runs, kind)) is not None]
                lines.append(f"\n{srv}'s own count (/metrics): "
                             f"{sum(r['server_full'] for r in runs)} full, "
                             f"{sum(r['server_resumed'] for r in runs)} resumed handshakes"
                             + (f"; computed in batches: {', '.join(batched)}" if batched else "")
                             + (f"; operations per batch: {', '.join(sizes)}" if sizes else ""))
        # tlsterm / peer ratios on the per-CPU-second figure that matters for the scenario
        key = "mb_per_server_cpu_s" if bulk else "handshakes_per_server_cpu_s"
        mine = [s for s in per if s.startswith("tlsterm")]
        peers = [s for s in per if not s.startswith("tlsterm")]
        for t in mine:
            tv = median_of(per[t], key)
            ratios = ", ".join(f"{p} {tv / median_of(per[p], key):.2f}x" for p in peers
                               if median_of(per[p], key) > 0)
            if ratios:
                lines.append(f"\n{t} / peer ({key.replace('_', ' ')}): {ratios}")
        lines.append("")
    if results.get("record"):
        lines.append("### Record layer in memory (16 KiB records, MB = 10^6 B per CPU-second, CPU 1)\n")
        lines.append("| cipher | TLS | BoringSSL send (encrypt) | BoringSSL receive (decrypt) | openssl speed -evp |")
        lines.append("|---|---|---|---|---|")
        for row in results["record"]:
            sp = (f"{row['openssl_speed_mb_per_s']:.0f} ({row['openssl_speed_evp']})"
                  if "openssl_speed_mb_per_s" in row else "")
            lines.append(f"| {row['cipher']} | {row['version']} | {row['send_mb_per_cpu_s']:.0f} | "
                         f"{row['recv_mb_per_cpu_s']:.0f} | {sp} |")
        lines.append("")
    if results.get("sweep"):
        lines.append("### tls13-rsa-full, concurrency sweep (1 run each)\n")
        sweep = results["sweep"]
        concs = [r["concurrency"] for r in next(iter(sweep.values()))]
        lines.append("| server | " + " | ".join(f"c={c} hs/s (per srv CPU-s)" for c in concs) + " |")
        lines.append("|" + "---|" * (len(concs) + 1))
        for srv, runs in sweep.items():
            lines.append(f"| {srv} | " + " | ".join(
                f"{r['handshakes_per_s']:.0f} ({r['handshakes_per_server_cpu_s']:.0f})" for r in runs) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
