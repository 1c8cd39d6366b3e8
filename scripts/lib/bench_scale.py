#!/usr/bin/env python3
"""scripts/bench_scale.sh's figures: a load point's LOAD line and the tables.

    bench_scale.py load NAME PORTS ACTIVE RATE SHARDS T0 T1 S0 S1 TCK SECS DIR POLICY QSIZE C2C
        the LOAD line of load point NAME: the workers' ticks T0, T1 at the window's times S0,
        S1 (s), the frames the frontends (DIR/NAME.fe*.json) sent in SECS
    bench_scale.py summary RESULTS OUT COALESCE_OUT
        the tables of the parts that ran (RESULT, LOAD and IDLE lines), to OUT and printed;
        the coalescing table to COALESCE_OUT (MQ_FLOWS from the environment names the flows)
"""

import glob
import math
import os
import re
import statistics
import sys

from pvnet_report import finals, write_table

NAN = float("nan")


def load(name, ports, active, rate, shards, t, s, tck, secs, sent, policy, qsize, c2c):
    """T, S: the workers' ticks and the times (s) at the window's ends; SENT: frames sent."""
    win = s[1] - s[0]
    cpu = (t[1] - t[0]) / tck / win  # CPU-seconds per second
    pps = sent / secs  # the frontends' average rate
    frames = pps * win
    return (
        "LOAD name=%s ports=%d active=%d rate=%d shards=%d policy=%s qsize=%s c2c_ns=%s cpu_pct=%.2f pps=%.0f"
        " ns_per_frame=%.1f"
    ) % (name, ports, active, rate, shards, policy, qsize, c2c, 100 * cpu, pps, 1e9 * cpu * win / frames if frames else NAN)


def med(xs):
    return statistics.median(xs) if xs else NAN


def f2(v):
    return "%.2f" % v if not math.isnan(v) else "-"


def parse(lines):
    lines = list(lines)
    rows = [dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv) | {"kind": line.split()[0]} for line in lines]
    return rows, [line for line in lines if line.startswith("IDLE")]


def bucket(ns):
    return "fast" if ns < 75 else "mid" if ns < 150 else "slow"


def mq_table(res, flows):
    for r in res:
        a, b = (float(x) for x in r["c2c_ns"].split("/"))
        r["state"] = bucket(a) if bucket(a) == bucket(b) else "mixed"
    out = [
        "### Queue pairs: 1 and 2, pvnet switch and DPDK net_vhost (64 B, Mpps the frontend counted; h2v: the gen"
        " port's %s flows with 1 pair as with 2)" % flows,
        "",
        ("| direction | c2c state | pvnet 1 pair | pvnet 2 pairs | **2 pairs / 1 pair** | DPDK 2 queues"
        " | **pvnet / DPDK, 2 queues** | least-loaded queue's share (pvnet, DPDK) | runs |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d in ("v2h", "h2v"):
        for s in ("fast", "mid", "slow", "mixed"):
            sel = [r for r in res if r["dir"] == d and r["state"] == s]

            def g(impl, q, sel=sel):
                return [float(r["mpps"]) for r in sel if r["impl"] == impl and r["queues"] == q]

            def sh(impl, sel=sel):
                return med([float(r.get("q_min_share", "nan")) for r in sel if r["impl"] == impl and r["queues"] == "2"])

            p1, p2, d2 = g("switch", "1"), g("switch", "2"), g("dpdk", "2")
            if not (p1 or p2 or d2):
                continue
            out.append("| %s | %s | %s | %s | **%s** | %s | **%s** | %s, %s | %d/%d/%d |" % (
                d, s, f2(med(p1)), f2(med(p2)), f2(med(p2) / med(p1)) if p1 and p2 else "-", f2(med(d2)),
                f2(med(p2) / med(d2)) if p2 and d2 else "-", f2(sh("switch")), f2(sh("dpdk")), len(p1), len(p2), len(d2),
            ))  # fmt: skip
    out.append("")
    return out


def coalesce_table(co):
    out = [
        "### CPU follows the load: the adaptive policy against coalescing (one port, `pvnet backend --role sink`,"
        " %s-entry rings)" % co[0]["qsize"],
        "",
        ("| offered | policy | frames/s | worker CPU % | of its saturated CPU (same policy) | CPU ns/frame"
        " | c2c ns before/after |"),
        "|---|---|---|---|---|---|---|",
    ]
    sats = {r["policy"]: float(r["cpu_pct"]) for r in co if r["rate"] == "0"}
    for r in sorted(co, key=lambda r: (-int(r["rate"]) if r["rate"] != "0" else -(10**12), r["policy"])):
        s0 = sats.get(r["policy"])
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            "saturation" if r["rate"] == "0" else r["rate"] + " frames/s", r["policy"], r["pps"], r["cpu_pct"],
            "%.1f %%" % (100 * float(r["cpu_pct"]) / s0) if s0 else "-", r["ns_per_frame"], r.get("c2c_ns", "-"),
        ))  # fmt: skip
    return out


def load_tables(load):
    sat, ten = load["sat"], load.get("tenth")
    out = [
        "### CPU follows the load (one port, `pvnet backend --role sink`, one worker)",
        "",
        "| load | frames/s | worker CPU % | CPU ns/frame |",
        "|---|---|---|---|",
        "| saturated | %s | %s | %s |" % (sat["pps"], sat["cpu_pct"], sat["ns_per_frame"]),
    ]
    if ten:
        out.append("| 10 %% of saturation | %s | %s | %s |" % (ten["pps"], ten["cpu_pct"], ten["ns_per_frame"]))
        out += ["", "At 10 %% of the saturation rate the worker uses **%.1f %%** of its saturated CPU."
                % (100 * float(ten["cpu_pct"]) / float(sat["cpu_pct"]))]  # fmt: skip
    out.append("")
    pts = [r for r in load.values() if re.match(r"p\d+-r\d+$", r["name"])]
    if pts:
        out += ["| connected ports | one of them paced at | worker CPU % | CPU ns/frame |", "|---|---|---|---|"]
        for r in sorted(pts, key=lambda r: (int(r["ports"]), int(r["rate"]))):
            out.append("| %s | %s frames/s | %s | %s |" % (r["ports"], r["rate"], r["cpu_pct"], r["ns_per_frame"]))
        out.append("")
    if "four64" in load and "one64" in load:
        a, b = load["four64"], load["one64"]
        out += ["64 connected ports: 4 of them at 10 Kpps each: **%s %%** CPU; 1 of them at 40 Kpps: **%s %%** (ratio %.2f)." % (
            a["cpu_pct"], b["cpu_pct"], float(a["cpu_pct"]) / float(b["cpu_pct"]) if float(b["cpu_pct"]) else NAN), ""]  # fmt: skip
    return out


def workers_table(ws):
    def g(sh):
        return [float(r["ns_per_frame"]) for r in ws if r["shards"] == sh]

    def c(sh):
        return [float(r["cpu_pct"]) for r in ws if r["shards"] == sh]

    return [
        "### Workers: 2 ports each paced, on 1 and on 2 workers",
        "",
        "| workers | runs | workers' CPU % (median) | CPU ns/frame (median) |",
        "|---|---|---|---|",
        "| 1 | %d | %s | %s |" % (len(g("1")), f2(med(c("1"))), f2(med(g("1")))),
        "| 2 | %d | %s | %s |" % (len(g("2")), f2(med(c("2"))), f2(med(g("2")))),
        "",
        "2 workers / 1 worker, CPU ns per frame: **%s**." % (f2(med(g("2")) / med(g("1"))) if med(g("1")) else "-"),
        "",
    ]


def summary(rows, idle, flows):
    """The bench_scale section's lines and the coalescing table's (None when that part did not run)."""
    out, cout = [], None
    res = [r for r in rows if r["kind"] == "RESULT"]
    if res:
        out += mq_table(res, flows)
    load = {r["name"]: r for r in rows if r["kind"] == "LOAD"}
    co = [r for r in load.values() if r["name"].startswith("co-")]
    if co:
        cout = coalesce_table(co)
    if "sat" in load:
        out += load_tables(load)
    ws = [r for r in rows if r["kind"] == "LOAD" and r["name"].startswith("w")]
    if ws:
        out += workers_table(ws)
    if idle:
        out += ["### Idle ports", "", "`" + idle[-1][5:].strip() + "`", ""]
    return out, cout


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "load":
        name, b = a[0], a[11]
        sent = sum(f["tx_packets"] for path in glob.glob(f"{b}/{name}.fe*.json") for f in finals(path))
        t0, t1, s0, s1, tck, secs = (float(x) for x in a[5:11])
        print(load(name, int(a[1]), int(a[2]), int(a[3]), int(a[4]), (t0, t1), (s0, s1), tck, secs, sent,
                   a[12], a[13], a[14]))  # fmt: skip
    elif cmd == "summary":
        with open(a[0]) as f:
            rows, idle = parse(f)
        out, cout = summary(rows, idle, os.environ.get("MQ_FLOWS", "64"))
        if cout is not None:
            write_table(cout, a[2])
        write_table(out, a[1])
    else:
        sys.exit("bench_scale.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
