#!/usr/bin/env python3
"""Plots of the egress experiment (crates/dataplane/examples/egress.rs, EGRESS_CSV=DIR):
the request/response round trip through the congested egress per egress configuration (with
the bulk rate each kept), and the switch's CPU ns per packet with bulk dequeue versus one per
dequeue.
usage: plot_egress.py DIR"""
import csv
import subprocess
import sys
from pathlib import Path

try:
    import matplotlib
except ImportError:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)
    import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/egress")
with open(d / "latency.csv") as f:
    lat = [r for r in csv.DictReader(f) if int(r["answered"]) > 0]
titles = {
    "steady": "a steady receiver (6 Mpps offered, 4 taken)",
    "bursty": "a bursty receiver, late now and then (6 Mpps offered, 3.2 taken)",
}
kinds = list(dict.fromkeys(r["receiver"] for r in lat))
fig, axes = plt.subplots(len(kinds), 1, figsize=(10, 4.5 * len(kinds)), squeeze=False)
for ax, kind in zip(axes[:, 0], kinds):
    rows = [r for r in lat if r["receiver"] == kind]
    for k, (q, label) in enumerate((("p50_us", "p50"), ("p99_us", "p99"))):
        ax.bar([i + k * 0.4 for i in range(len(rows))], [float(r[q]) for r in rows], 0.4, label=label)
    for i, r in enumerate(rows):
        ax.annotate(f"bulk {float(r['bulk_mpps']):.2f} Mpps", (i + 0.2, float(r["p99_us"])),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks([i + 0.2 for i in range(len(rows))], [r["config"].replace(" capped", "\ncapped").replace(" alone", "\nalone").replace(" (", "\n(") for r in rows], fontsize=7)
    ax.set_ylabel("request/response round trip, us")
    ax.set_title("RR through an egress with a standing bulk backlog: " + titles.get(kind, kind))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
fig.tight_layout()
fig.savefig(d / "latency.png", dpi=110)
plt.close(fig)

with open(d / "bulk.csv") as f:
    bulk = list(csv.DictReader(f))
fig, ax = plt.subplots(figsize=(7, 4))
cfgs = list(dict.fromkeys(r["config"] for r in bulk))
modes = list(dict.fromkeys(r["dequeue"] for r in bulk))
w = 0.8 / len(modes)
for k, m in enumerate(modes):
    ys = [next((float(r["ns_per_pkt"]) for r in bulk if r["config"] == c and r["dequeue"] == m), 0) for c in cfgs]
    ax.bar([i + k * w for i in range(len(cfgs))], ys, w, label=m)
ax.set_xticks([i + w * (len(modes) - 1) / 2 for i in range(len(cfgs))], cfgs)
ax.set_ylabel("switch CPU ns per delivered packet")
ax.grid(True, axis="y", alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(d / "bulk.png", dpi=110)
print(f"wrote plots to {d}")
