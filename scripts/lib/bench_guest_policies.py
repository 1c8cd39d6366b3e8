#!/usr/bin/env python3
"""scripts/peers/bench_guest_policies.sh's figures: one run's RESULT line and the summary.

    bench_guest_policies.py result CONSOLE SNAP_BEGIN SNAP_END T0 T_READY KIND BACKEND_PKTS
            KICKS CALLS SLEEPS TCK NCPU LABELS
        the RESULT line: pktgen's rate from the guest's console, the CPU of pvnet and QEMU and of
        everything else over the pktgen window (SNAP_*: "ns pvnet_ns qemu_ns machine_ticks"),
        the backend's packets and its kicks, calls and sleeps per packet (KIND pvnet)
    bench_guest_policies.py summary RESULTS OUT WALL ROUNDS DUR REV ACC OTHER_MAX
        the summary (medians per burst and configuration, ratios against QEMU's tap backend,
        paired per round), to OUT and printed; QEMU_SMP from the environment
"""

import collections
import datetime
import math
import os
import re
import statistics
import sys
import time

from pvnet_report import fields, write_table

NAN = float("nan")


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return NAN


def result(txt, sb, se, t0, tr, kind, bpk, kicks, calls, sleeps, tck, ncpu, labels, now_ns):
    m = re.search(r"OK: (\d+)\(c\d+\+d\d+\) usec, (\d+) ", txt)
    usec, gpk = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    gpps = gpk / usec * 1e6 if usec else NAN
    napi = re.search(r"napi_tx=(\S+)", txt)
    bpps = bpk / usec * 1e6 if usec else NAN
    if sb and se:
        d = [int(b) - int(a) for a, b in zip(sb, se, strict=False)]
        win = d[0] / 1e9
        pv = 100.0 * d[1] / d[0]
        qe = 100.0 * d[2] / d[0]
        other = max(0.0, 100.0 * (d[3] / tck - (d[1] + d[2]) / 1e9) / (win * ncpu))
    else:
        win = pv = qe = other = NAN

    def per(x):
        return x / bpk if bpk and not math.isnan(bpk) else NAN

    pvnet = kind == "pvnet"
    return (
        "RESULT %s other_pct=%.0f guest_pps=%.0f guest_pkts=%d pktgen_usec=%d backend_pkts=%d backend_pps=%.0f "
        "pvnet_cpu_pct=%s qemu_cpu_pct=%.1f kicks_per_pkt=%s calls_per_pkt=%s sleeps_per_pkt=%s "
        "window_s=%.2f boot_s=%.2f wall_s=%.1f napi_tx=%s"
    ) % (
        labels, other, gpps, gpk, usec, bpk if not math.isnan(bpk) else -1, bpps,
        ("%.1f" % pv) if pvnet else "-", qe,
        ("%.4f" % per(kicks)) if pvnet else "-", ("%.4f" % per(calls)) if pvnet else "-",
        ("%.4f" % per(sleeps)) if pvnet else "-",
        win, (tr - t0) / 1e9 if tr else NAN, (now_ns - t0) / 1e9, napi.group(1) if napi else "?",
    )  # fmt: skip


def med(v):
    v = [x for x in v if not math.isnan(x)]
    return statistics.median(v) if v else NAN


def fmt(x, p=1):
    return "-" if math.isnan(x) else ("%.*f" % (p, x))


def parse(lines, omax, meta):
    """RESULT lines (each marked bad when disturbed or other work took > OMAX %); a "# pvnet=.."
    line updates META (rev, rounds, dur, smp)."""
    allrows = []
    for line in lines:
        m = re.match(r"# pvnet=(\S+) binary=(\S+ \S+) rounds=(\S+) dur=(\S+)(?: smp=(\S+))?", line)
        if m:
            meta["rev"] = "%s (binary copied from target/ at %s)" % (m.group(1), m.group(2))
            meta["rounds"], meta["dur"] = m.group(3), m.group(4)
            meta["smp"] = m.group(5) or "1"
        if not line.startswith("RESULT"):
            continue
        d = fields(line)
        try:
            d["bad"] = d.get("disturbed") == "1" or float(d["other_pct"]) > float(omax)
        except ValueError:
            d["bad"] = True
        allrows.append(d)
    return allrows


def keep(allrows):
    """Runs during which other work took > OTHER_MAX % of the CPUs are left out, unless a
    configuration has no other run in that round (then it is kept and marked)."""
    rows, marked = [], set()
    for d in allrows:
        if not d["bad"]:
            rows.append(d)
            continue
        same = [e for e in allrows if (e["cfg"], e["burst"], e["round"]) == (d["cfg"], d["burst"], d["round"])]
        if not any(not e["bad"] for e in same) and d is same[-1]:
            rows.append(d)
            marked.add((d["cfg"], d["burst"]))
    return rows, marked


TAPS = ("tap:bh", "tap:timer", "tap:bh:split", "tap:timer:split")


def table(rows, marked):
    """The table's rows and the ratio lines."""
    cfgs = list(dict.fromkeys(r["cfg"] for r in rows))
    bursts = list(dict.fromkeys(r["burst"] for r in rows))
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["cfg"], r["burst"])].append(r)
    lines, ratios = [], []
    for b in bursts:
        ref = {t: med([num(r["guest_pps"]) for r in by.get((t, b), [])]) for t in TAPS}
        for c in cfgs:
            rs = by.get((c, b), [])
            if not rs:
                continue
            g = [num(r["guest_pps"]) for r in rs]
            gm = med(g)

            def col(k, rs=rs):
                return med([num(r[k]) for r in rs])

            lines.append("| %s | `%s` | %d%s | %s (%s-%s) | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                b, c, len(rs), "*" if (c, b) in marked else "", fmt(gm / 1e3), fmt(min(g) / 1e3), fmt(max(g) / 1e3),
                fmt(col("backend_pps") / 1e3), fmt(col("pvnet_cpu_pct")), fmt(col("qemu_cpu_pct")),
                fmt(col("kicks_per_pkt"), 4), fmt(col("calls_per_pkt"), 4), fmt(col("sleeps_per_pkt"), 4),
                " ".join(r["c2c_ns"] for r in rs), fmt(gm / ref["tap:bh"], 2), fmt(gm / ref["tap:timer"], 2),
            ))  # fmt: skip
            if c.startswith("pvnet"):
                ratios.append("burst %s: `%s` / tap:bh = %s, / tap:timer = %s, / tap:bh:split = %s, / tap:timer:split = %s" % (
                    b, c, fmt(gm / ref["tap:bh"], 2), fmt(gm / ref["tap:timer"], 2),
                    fmt(gm / ref["tap:bh:split"], 2), fmt(gm / ref["tap:timer:split"], 2),
                ))  # fmt: skip
    return lines, ratios, by, bursts


def paired(rows, by, bursts):
    """Per round, pvnet:adaptive / each tap configuration (guest pps, same round and burst)."""
    out = []
    for b in bursts:
        for t in TAPS:
            pr = []
            for rnd in sorted({r["round"] for r in rows}):
                a = [num(r["guest_pps"]) for r in by.get(("pvnet:adaptive", b), []) if r["round"] == rnd]
                q = [num(r["guest_pps"]) for r in by.get((t, b), []) if r["round"] == rnd]
                if a and q:
                    pr.append("%.2f" % (a[0] / q[0]))
            if pr:
                out.append("* burst %s, adaptive / %s: %s" % (b, t, " ".join(pr)))
    return out


def summary(allrows, meta, when, omax):
    rows, marked = keep(allrows)
    lines, ratios, by, bursts = table(rows, marked)
    m = meta
    out = [
        (
            "Run: %s, `QEMU_SMP=%s ROUNDS=%s DUR=%s scripts/peers/bench_guest_policies.sh`, pvnet %s, %s CPUs, %s,"
            " QEMU `%s -smp %s`; wall time %s s."
        )
        % (when, m["smp"], m["rounds"], m["dur"], m["rev"], os.cpu_count(), os.uname().release, m["acc"], m["smp"],
           m["wall"]),
        "",
        (
            "Medians over the rounds; runs during which other processes took > %s%% of the CPUs are left out when the"
            " same round has a clean attempt (else kept, marked *). guest kpps" % omax
        )
        + (
            " = pktgen's result; backend kpps = frames the backend received (pvnet rx_packets / tap rx_packets) /"
            " pktgen's time; CPU in % of one CPU over the pktgen window."
        ),
        "",
        (
            "| burst | config | runs | guest kpps (min-max) | backend kpps | pvnet CPU % | QEMU CPU % | kicks/pkt"
            " | calls/pkt | sleeps/pkt | c2c ns before/after | vs tap:bh | vs tap:timer |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *lines,
        "",
        "Ratios of guest pps (medians):",
        "",
        *["* " + x for x in ratios],
        "",
        "Per round, `pvnet:adaptive` / tap (guest pps, same round and burst):",
        "",
        *paired(rows, by, bursts),
    ]  # fmt: skip
    return out


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "result":
        with open(a[0], errors="replace") as f:
            txt = f.read()
        print(result(txt, a[1].split(), a[2].split(), int(a[3]), int(a[4]), a[5], num(a[6]), num(a[7]), num(a[8]),
                     num(a[9]), int(a[10]), int(a[11]), a[12], time.time_ns()))  # fmt: skip
    elif cmd == "summary":
        res, out_path, wall, rounds, dur, rev, acc, omax = a
        meta = {"smp": os.environ.get("QEMU_SMP", "1,maxcpus=2"), "rounds": rounds, "dur": dur, "rev": rev, "acc": acc,
                "wall": wall}  # fmt: skip
        with open(res) as f:
            allrows = parse(f, omax, meta)
        when = datetime.datetime.fromtimestamp(os.path.getmtime(res), datetime.UTC).strftime("%Y-%m-%dT%H:%MZ")
        out = summary(allrows, meta, when, omax)
        write_table(out, out_path)
    else:
        sys.exit("bench_guest_policies.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
