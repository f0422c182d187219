"""Charts for bench/peers.py results (matplotlib, headless)."""

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def draw(results, outdir: Path, tag: str):
    sweep = results.get("sweep") or {}
    if sweep:
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
        for srv, runs in sweep.items():
            c = [r["concurrency"] for r in runs]
            a.plot(c, [r["handshakes_per_s"] for r in runs], marker="o", label=srv)
            b.plot(c, [r["handshakes_per_server_cpu_s"] for r in runs], marker="o", label=srv)
        for ax, title in ((a, "handshakes/s"), (b, "handshakes per server CPU-second")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent connections")
            ax.set_title(title)
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
        a.legend()
        fig.suptitle("TLS 1.3 full handshakes, RSA-2048 (server on 1 core, client on 1 core)")
        fig.tight_layout()
        fig.savefig(outdir / "handshakes-vs-concurrency.png", dpi=110)
        plt.close(fig)

    scen = results.get("scenarios") or {}
    for key, fname, title in (
        ("tls13-rsa-latency-half", "latency-cdf.png", "at half of each server's own capacity"),
        ("tls13-rsa-latency-common", "latency-cdf-common-rate.png", "all servers at the same rate"),
    ):
        lat = scen.get(key) or {}
        if not lat:
            continue
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
        for srv, runs in lat.items():
            # The run with the median p99 stands for the server.
            p99s = [r["total_p99_us"] for r in runs]
            r = runs[p99s.index(statistics.median_low(p99s))]
            xs = [us / 1000 for _, us in r["total_cdf"]]
            qs = [q for q, _ in r["total_cdf"]]
            label = f"{srv} @ {r['rate']:.0f}/s"
            a.plot(xs, qs, label=label)
            tail = [(x, 1 - q) for x, q in zip(xs, qs) if q < 1]
            b.plot([x for x, _ in tail], [t for _, t in tail], label=label)
        a.set_ylabel("fraction of requests")
        a.set_title("CDF")
        b.set_yscale("log")
        b.set_ylabel("fraction slower than x")
        b.set_title("tail (log)")
        for ax in (a, b):
            ax.set_xscale("log")
            ax.set_xlabel("connect + handshake + request from scheduled start (ms)")
            ax.grid(True, which="both", alpha=0.3)
        a.legend()
        fig.suptitle(f"TLS 1.3 RSA-2048 full-handshake latency, open loop, {title}")
        fig.tight_layout()
        fig.savefig(outdir / fname, dpi=110)
        plt.close(fig)
