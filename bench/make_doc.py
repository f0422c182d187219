#!/usr/bin/env python3
"""Fill docs/BENCHMARKS-peers.md from bench/doc-head.md, bench/doc-analysis.md and a run's tables."""
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
tag = sys.argv[1]
r = json.loads((BENCH / "results" / f"peers-{tag}.json").read_text())
v = r["meta"]["versions"]
subs = {"RUNS": str(r["meta"]["args"]["runs"]), "TAG": tag, "KERNEL": v["kernel"], "NGINX": v["nginx"], "HAPROXY": v["haproxy"].split(" - ")[0],
        "HITCH": v["hitch"], "OPENSSL": v["openssl"].split(" (")[0], "GIT": r["meta"]["git"]}
sc = r["scenarios"]


def med(scen, srv, key):
    vals = sorted(x[key] for x in sc[scen][srv])
    return vals[len(vals) // 2] if len(vals) % 2 else sum(vals[len(vals) // 2 - 1:len(vals) // 2 + 1]) / 2


def ratio(scen, key, a="tlsterm", b="nginx"):
    return med(scen, a, key) / med(scen, b, key)


HS, MB = "handshakes_per_server_cpu_s", "mb_per_server_cpu_s"


def target(scen, key, goal, unit):
    t, n, q = med(scen, "tlsterm", key), med(scen, "nginx", key), ratio(scen, key)
    verdict = "met" if q >= goal else f"missed by {(1 - q / goal) * 100:.0f}% ({q:.2f}x instead of {goal}x)"
    return f"{t:.0f} vs {n:.0f} {unit} = {q:.2f}x", verdict


subs["T_RSA"], subs["V_RSA"] = target("tls13-rsa-full", HS, 2.0, "handshakes per server CPU-s")
subs["T_EC"], subs["V_EC"] = target("tls13-ecdsa-full", HS, 1.3, "handshakes per server CPU-s")
subs["T_BULK"], subs["V_BULK"] = target("bulk-1mib", MB, 1.0, "MB per server CPU-s")
for k in ("I_RSA", "IV_RSA", "I_EC", "IV_EC"):
    subs[k] = "not run"
if len(sys.argv) > 2:
    # The interleaved cross-check, same formulas.
    r2 = json.loads((BENCH / "results" / f"peers-{sys.argv[2]}.json").read_text())
    main_sc, sc = sc, r2["scenarios"]
    subs["I_RSA"], subs["IV_RSA"] = target("tls13-rsa-full", HS, 2.0, "handshakes per server CPU-s")
    subs["I_EC"], subs["IV_EC"] = target("tls13-ecdsa-full", HS, 1.3, "handshakes per server CPU-s")
    rounds = [t[HS] / n[HS] for t, n in zip(sc["tls13-rsa-full"]["tlsterm"], sc["tls13-rsa-full"]["nginx"])]
    subs["I_RSA"] += f" (rounds: {', '.join(f'{q:.2f}x' for q in rounds)})"
    sc = main_sc
rsa_hs, ng_hs = med("tls13-rsa-full", "tlsterm", HS), med("tls13-rsa-full", "nginx", HS)
subs["RSA_HS"] = f"{rsa_hs:.0f}"
subs["RSA_US"] = f"{1e6 / rsa_hs:.0f}"
subs["NGINX_US"] = f"{1e6 / ng_hs:.0f}"
subs["TARGET_US"] = f"{1e6 / (2 * ng_hs):.0f}"
sw = {x["concurrency"]: x[HS] for x in r["sweep"]["tlsterm"]}
subs["SWEEP_C4"], subs["SWEEP_C64"] = f"{sw[4]:.0f}", f"{sw[64]:.0f}"
subs["HALF_EFF"] = f"{med('tls13-rsa-latency-half', 'tlsterm', HS):.0f}"
subs["HALF_CPU"] = f"{med('tls13-rsa-latency-half', 'tlsterm', 'server_util') * 100:.0f}%"
tl = sorted(x[HS] for x in sc["tls13-rsa-full"]["tlsterm"])
subs["T_SPREAD"] = f"{tl[0]:,.0f} to {tl[-1]:,.0f}"
swn = {x["concurrency"]: x[HS] for x in r["sweep"]["nginx"]}
subs["SWEEP_NGINX64"] = f"{swn[64]:.0f}"
subs["SWEEP_RATIO"] = f"{sw[64] / swn[64]:.2f}"
subs["COMMON_NGINX_CPU"] = f"{med('tls13-rsa-latency-common', 'nginx', 'server_util') * 100:.0f}%"
subs["HALF_RATE"] = f"{sc['tls13-rsa-latency-half']['tlsterm'][0]['rate']:.0f}"
subs["COMMON_RATE"] = f"{sc['tls13-rsa-latency-common']['tlsterm'][0]['rate']:.0f}"
subs["COMMON_RATIO"] = f"{ratio('tls13-rsa-latency-common', HS):.2f}x"
subs["INLINE_RATIO"] = f"{ratio('tls13-rsa-full', HS, 'tlsterm-inline'):.2f}x"
subs["EC_RATIO"] = f"{ratio('tls13-ecdsa-full', HS):.2f}x"
for srv in ("tlsterm", "nginx", "haproxy", "hitch"):
    subs["BULK_" + srv.upper()] = f"{med('bulk-1mib', srv, MB):.0f}"
subs["RES_RATIO"] = f"{ratio('tls13-rsa-resume', HS):.2f}x"
# Private-key speeds: from the run, or (older runs) the figures measured by hand that day.
sp = r.get("speed") or {"rsa2048_openssl_per_s": 3316.5, "rsa2048_inline_per_s": 1829,
                        "rsa2048_batch_per_s": 8814, "ecdsap256_inline_per_s": 50511,
                        "ecdsap256_openssl_per_s": 46595.5}
subs["SPEED_WHEN"] = "same run" if "speed" in r else "measured by hand the same day"
for key, name in (("rsa2048_openssl_per_s", "RSA_OSSL"), ("rsa2048_inline_per_s", "RSA_BSSL"),
                  ("rsa2048_batch_per_s", "RSA_BATCH"), ("ecdsap256_inline_per_s", "EC_BSSL"),
                  ("ecdsap256_openssl_per_s", "EC_OSSL")):
    subs[name] = f"{sp[key]:,.0f}"
    subs[name + "_US"] = f"{1e6 / sp[key]:.0f}"
subs["BSSL_SLOWER"] = f"{sp['rsa2048_openssl_per_s'] / sp['rsa2048_inline_per_s']:.1f}"
subs["REST_T"] = f"{1e6 / rsa_hs - 1e6 / sp['rsa2048_batch_per_s']:.0f}"
subs["REST_N"] = f"{1e6 / ng_hs - 1e6 / sp['rsa2048_openssl_per_s']:.0f}"
closed = [x for n, per in sc.items() if "latency" not in n for runs in per.values() for x in runs]
subs["CLIENT_MAX"] = f"{max(x['client_cpu_util'] for x in closed) * 100:.0f}%"
hs_rows = [x for n, per in sc.items() if n.endswith("full") or n.endswith("resume")
           for runs in per.values() for x in runs]
subs["CLI_MIN"] = f"{min(x['handshakes_per_client_cpu_s'] for x in hs_rows):,.0f}"
subs["CLI_MAX"] = f"{max(x['handshakes_per_client_cpu_s'] for x in hs_rows):,.0f}"
srv_closed = [x["server_util"] for n, per in sc.items() if "latency" not in n and not n.startswith("bulk")
              for runs in per.values() for x in runs]
subs["SRV_MIN"] = f"{min(srv_closed) * 100:.0f}%"
subs["SRV_MAX"] = f"{max(srv_closed) * 100:.0f}%"
lags = [x["lag_p99_us"] for n, per in sc.items() if "latency" in n for runs in per.values() for x in runs]
subs["LAG_MIN"], subs["LAG_MAX"] = f"{min(lags) / 1000:.1f}", f"{max(lags) / 1000:.1f}"
parts = []
for name in ("doc-head.md", "doc-analysis.md"):
    text = (BENCH / name).read_text()
    for k, val in subs.items():
        text = text.replace(f"@{k}@", val)
    parts.append(text)
tables = (BENCH / "results" / f"peers-{tag}.md").read_text()
doc = parts[0] + "\n## Results (run " + tag + ")\n\n" + tables.replace("### ", "#### ") + "\n"
if len(sys.argv) > 2:
    # A second run, with servers interleaved run by run, as a cross-check of the ratios.
    tag2 = sys.argv[2]
    doc += ("\n## Cross-check: servers interleaved run by run (run " + tag2 + ")\n\n"
            "Same scenarios, but `--interleave`: each round runs every server once, so a change in\n"
            "the machine's background load during the run affects all servers alike.\n\n"
            + (BENCH / "results" / f"peers-{tag2}.md").read_text().replace("### ", "#### ") + "\n")
doc += parts[1]
import re
left = set(re.findall(r"@([A-Z_0-9]+)@", doc))
assert not left, left
(BENCH.parent / "docs" / "BENCHMARKS-peers.md").write_text(doc)
