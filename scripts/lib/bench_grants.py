#!/usr/bin/env python3
"""scripts/peers/bench_grants.sh's figures: one run's RESULT line and the grants table.

    bench_grants.py result FE_JSON T0 T1 TCK DIR LABELS
        the RESULT line of a run from the frontend's final report and the backend's CPU
        ticks before (T0) and after (T1); DIR tx counts data_sent, rx dropped frames
    bench_grants.py summary RESULTS DOC DUR
        the table (medians of the most common c2c state that has every combination, else of
        all runs), printed and, when DOC is not empty, written between its bench_grants
        markers
"""

import collections
import math
import re
import statistics
import sys

import docsection
from pvnet_report import finals, state

NAN = float("nan")


def result(fe_json, t0, t1, tck, direction, labels):
    fin = next(iter(finals(fe_json)), {})
    secs = fin.get("secs") or 0
    pkts = fin.get("data_sent") if direction == "tx" else fin.get("dropped")
    pkts = pkts or 0
    io = fin.get("iotlb", {})
    msgs = io.get("updates", 0) + io.get("invalidates", 0)
    be_ns = (t1 - t0) * 1e9 / tck / pkts if pkts else NAN
    fe_ns = fin.get("cpu_ns", 0) / pkts if pkts else NAN
    return "RESULT %s mpps=%.4f be_ns=%.1f fe_ns=%.1f iotlb_per_pkt=%.2f misses_answered=%d pkts=%d" % (
        labels, pkts / secs / 1e6 if secs else 0, be_ns, fe_ns, msgs / pkts if pkts else 0,
        io.get("misses_answered", 0), pkts,
    )  # fmt: skip


def parse(lines):
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in lines if line.startswith("RESULT")]


def pick(rows):
    """The runs of the most common state that has every combination (else all of them), a
    description of that choice, and the count of runs per state."""
    combos = {(r["dir"], r["impl"], r["mode"]) for r in rows}
    states = collections.Counter(state(r["c2c_ns"]) for r in rows)
    for st, _ in states.most_common():
        if st != "mixed" and {(r["dir"], r["impl"], r["mode"]) for r in rows if state(r["c2c_ns"]) == st} == combos:
            rows = [r for r in rows if state(r["c2c_ns"]) == st]
            return rows, "the %d runs in the %s state" % (len(rows), st), states
    return rows, "all runs", states


def summary(rows, dur):
    rows, used, states = pick(rows)
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["dir"], r["impl"], r["mode"])].append(r)

    def med(k, f):
        return statistics.median(float(r[f]) for r in by[k]) if by[k] else NAN

    modes = [m for m in ["off", "per-packet", "pool"] if any(k[2] == m for k in by)]
    out = [
        (
            "| mode | pvnet TX Mpps | pvnet RX Mpps | DPDK TX Mpps | DPDK RX Mpps | pvnet/DPDK TX | pvnet/DPDK RX"
            " | pvnet backend ns/pkt TX / RX | IOTLB msgs/pkt |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in modes:
        p_tx, p_rx = med(("tx", "pvnet", m), "mpps"), med(("rx", "pvnet", m), "mpps")
        d_tx, d_rx = med(("tx", "dpdk", m), "mpps"), med(("rx", "dpdk", m), "mpps")
        ns = "%.0f / %.0f" % (med(("tx", "pvnet", m), "be_ns"), med(("rx", "pvnet", m), "be_ns"))
        msgs = med(("tx", "pvnet", m), "iotlb_per_pkt")
        out.append("| %s | %.3f | %.3f | %.3f | %.3f | %.2fx | %.2fx | %s | %.2f |" % (
            m, p_tx, p_rx, d_tx, d_rx, p_tx / d_tx if d_tx else NAN, p_rx / d_rx if d_rx else NAN, ns, msgs,
        ))  # fmt: skip
    ratio = []
    for impl in ["pvnet", "dpdk"]:
        for d in ["tx", "rx"]:
            off, pool, pp = (med((d, impl, m), "mpps") for m in ["off", "pool", "per-packet"])
            if not any(map(math.isnan, (off, pool, pp))) and pp > 0 and off > 0:
                ratio.append("| %s | %s | %.2fx | %.1fx |" % (impl, d.upper(), pool / off, pool / pp))
    out += ["", "| backend | direction | pool / off | pool / per-packet |", "|---|---|---|---|"]
    out.extend(ratio)
    out.append("")
    out.append("Medians of %s (c2c states of every run: %s), %s s each, 64-byte frames, one queue pair." % (
        used, ", ".join("%s %d" % kv for kv in states.items()), dur,
    ))  # fmt: skip
    return "\n".join(out)


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "result":
        print(result(a[0], float(a[1]), float(a[2]), int(a[3]), a[4], a[5]))
    elif cmd == "summary":
        res, doc, dur = a
        with open(res) as f:
            table = summary(parse(f), dur)
        print(table)
        if doc:
            try:
                with open(doc) as f:
                    text = f.read()
            except FileNotFoundError:
                text = ""
            with open(doc, "w") as f:
                f.write(docsection.between(text, "<!-- bench_grants begin -->", "<!-- bench_grants end -->", table, True))
            print("written to", doc)
    else:
        sys.exit("bench_grants.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
