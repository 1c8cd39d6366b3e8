#!/usr/bin/env python3
"""scripts/bench_lanes.sh's figures: the wire port's readings, one run's RESULT line, the table.

    bench_lanes.py snap PORT < ctl-status.json
        "tx_packets lane_tx..." of port PORT: its total, then each lane's (or its one count)
    bench_lanes.py result CFG ROUND C2C T0 T1 N0 N1 C0 C1
        the RESULT line over the window T0..T1 (seconds): N the wire's sent packets, C the
        switch's CPU ns (every thread)
    bench_lanes.py summary RESULTS OUT
        the table: each round's runs side by side, the ratio lanes=auto against lanes=1 in the
        same round (in parentheses when the c2c probes around the two runs were not all in one
        state), and the medians per state of the rounds that were
"""

import statistics
import sys

from pvnet_report import fields, state, write_table


def snap(port, status):
    p = next(p for p in status["ports"] if p["name"] == port)
    lanes = [q.get("tx_packets", 0) for q in p.get("queues", [])] or [p["counters"].get("tx_packets", 0)]
    return " ".join(str(n) for n in [p["counters"].get("tx_packets", 0)] + lanes)


def result(cfg, rnd, c2c, t0, t1, n0, n1, c0, c1):
    dt, n = t1 - t0, n1 - n0
    return "RESULT cfg=%s round=%s c2c_ns=%s wire_mpps=%.3f cpu_ns_per_pkt=%.0f" % (
        cfg,
        rnd,
        c2c,
        n / dt / 1e6,
        (c1 - c0) / max(n, 1),
    )


def summary(lines):
    runs = [fields(x) for x in lines if x.startswith("RESULT ")]
    by_round = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["cfg"]] = r
    out = [
        "| round | c2c state | lanes=1 Mpps | lanes=auto Mpps | ratio | lanes=1 CPU ns/pkt | lanes=auto CPU ns/pkt | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    for rnd in sorted(by_round, key=int):
        one, auto = by_round[rnd].get("one"), by_round[rnd].get("auto")
        if not one or not auto:
            continue
        s1, s2 = state(one["c2c_ns"]), state(auto["c2c_ns"])
        st = s1 if s1 == s2 else "mixed"
        m1, m2 = float(one["wire_mpps"]), float(auto["wire_mpps"])
        c1, c2 = float(one["cpu_ns_per_pkt"]), float(auto["cpu_ns_per_pkt"])
        rm, rc = m2 / max(m1, 1e-9), c2 / max(c1, 1e-9)
        if st != "mixed":
            ratios.setdefault(st, []).append((rm, rc))
        # A round whose probes disagree: its ratio shown in parentheses, left out of the medians.
        fmt = "%.2fx" if st != "mixed" else "(%.2fx)"
        out.append("| %s | %s | %.3f | %.3f | %s | %.0f | %.0f | %s |" % (rnd, st, m1, m2, fmt % rm, c1, c2, fmt % rc))
    out.append("")
    mixed = [r for r in out[2:] if "| mixed |" in r]
    if mixed:
        out.append("%d round(s) with c2c probes in more than one state: not in the medians." % len(mixed))
    for st, rs in sorted(ratios.items()):
        out.append(
            "Median in the %s state (%d rounds): lanes=auto %.2fx the packets per second of lanes=1, at %.2fx its CPU per packet."
            % (st, len(rs), statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
        )
    return out


def main(argv):
    if argv[1] == "snap":
        import json

        print(snap(argv[2], json.load(sys.stdin)))
    elif argv[1] == "result":
        a = argv[2:]
        print(result(a[0], a[1], a[2], *(float(x) for x in a[3:])))
    elif argv[1] == "summary":
        with open(argv[2]) as f:
            write_table(summary(f.read().splitlines()), argv[3])
    else:
        sys.exit("usage: bench_lanes.py snap|result|summary ...")


if __name__ == "__main__":
    main(sys.argv)
