#!/usr/bin/env python3
"""Plots of `pvnet bench sweep` output: rate, CPU and notifications vs offered load, and
request/response latency, one line per backend policy. usage: plot_sweep.py DIR"""
import csv
import statistics
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

d = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/sweep")
with open(d / "load.csv") as f:
    load = list(csv.DictReader(f))
with open(d / "rr.csv") as f:
    rr = list(csv.DictReader(f))
policies = list(dict.fromkeys(r["policy"] for r in load))

def series(rows, policy, x, y, sat_x=None):
    pts = []
    for r in rows:
        if r["policy"] != policy:
            continue
        xv = float(r[x])
        if sat_x is not None and xv == 0:
            xv = sat_x
        pts.append((xv, float(r[y])))
    # several runs of one point (the saturation point): their median
    by_x = {}
    for xv, yv in pts:
        by_x.setdefault(xv, []).append(yv)
    xs = sorted(by_x)
    return xs, [statistics.median(by_x[xv]) for xv in xs]

sat_x = max(float(r["achieved_pps"]) for r in load) * 1.5
def load_plot(y, ylabel, name, logy=False, scale=1.0):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in policies:
        xs, ys = series(load, p, "offered_pps", y, sat_x)
        ax.plot(xs, [v * scale for v in ys], marker="o", label=p)
    ax.set_xscale("log")
    if logy == "log":
        ax.set_yscale("log")
    elif logy:
        ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("offered load, frames/s (rightmost point: saturation)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(d / name, dpi=110)
    plt.close(fig)

load_plot("achieved_pps", "achieved Mpps", "rate_vs_load.png", logy="log", scale=1e-6)
load_plot("cpu_backend_pct", "backend CPU %", "cpu_vs_load.png")
load_plot("kicks_per_pkt", "kicks per packet", "kicks_vs_load.png", logy=True)
load_plot("calls_per_pkt", "calls per packet", "calls_vs_load.png", logy=True)
load_plot("cov", "CoV of 1-s rate samples", "cov_vs_load.png")

fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
for p in policies:
    for ax, q in zip(axes, ("p50_us", "p99_us")):
        xs, ys = series(rr, p, "flows", q)
        ax.plot(xs, ys, marker="o", label=p)
for ax, q in zip(axes, ("p50", "p99")):
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent request/response flows")
    ax.set_ylabel(f"{q} latency, us")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
fig.tight_layout()
fig.savefig(d / "latency_vs_flows.png", dpi=110)
print(f"wrote plots to {d}")
