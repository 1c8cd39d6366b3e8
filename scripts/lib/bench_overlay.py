#!/usr/bin/env python3
"""scripts/bench_overlay.sh's figures: a switch's readings, one run's RESULT line, the table.

    bench_overlay.py snap PORT < ctl-status.json
        "rx_packets tx_packets drops" of port PORT, from one `pvnet ctl --json`
    bench_overlay.py result DIR CFG SIZE ROUND C2C T0 T1 G0 G1 K0 K1 S0 S1 A0 A1 B0 B1
        the RESULT line over the window T0..T1 (seconds): G the source's made frames, K the
        sink's taken ones, S the machine's busy CPU ns, A / B switch A's / B's CPU ns; C2C the
        core-to-core probes before/after
    bench_overlay.py summary RESULTS OUT
        the table (medians per direction, frame size and path, ratios of each pvnet path to
        the kernel's; with pvnet-vlan, a second table: its ratios to pvnet of the same round
        within one core-to-core state, a tag's cost), to OUT and printed
"""

import json
import statistics
import sys

from pvnet_report import results, state, write_table


def snap(port, status):
    c = next(p for p in status["ports"] if p["name"] == port)["counters"]
    drops = sum(v for k, v in c.items() if k.startswith("drops_"))
    return "%d %d %d" % (c.get("rx_packets", 0), c.get("tx_packets", 0), drops)


def result(d, cfg, size, rnd, c2c, t0, t1, g0, g1, k0, k1, s0, s1, a0, a1, b0, b1):
    dt, made, took = t1 - t0, g1 - g0, k1 - k0
    n = max(took, 1)
    return (
        "RESULT dir=%s cfg=%s size=%s round=%s c2c=%s mpps=%.3f sys_ns_per_pkt=%.0f"
        " a_ns_per_pkt=%.0f b_ns_per_pkt=%.0f src_mpps=%.3f"
    ) % (d, cfg, size, rnd, c2c, took / dt / 1e6, (s1 - s0) / n, (a1 - a0) / n, (b1 - b0) / n, made / dt / 1e6)


def summary(lines):
    rows = {}
    for kv in results(lines):
        rows.setdefault((kv["dir"], kv["size"], kv["cfg"]), []).append(kv)

    def med(key, k):
        return statistics.median(float(r[k]) for r in rows[key])

    head = (
        "| direction | frame | path | Mpps delivered | machine CPU ns/pkt | switch A ns/pkt | switch B ns/pkt"
        " | source Mpps | pvnet / kernel: Mpps | CPU ns/pkt | c2c ns (before/after) | runs |"
    )
    out = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(rows):
        other = (key[0], key[1], "kernel")
        ratios = ["-", "-"]
        if key[2] != "kernel" and other in rows:
            ratios = [
                "%.2fx" % (med(key, "mpps") / max(med(other, "mpps"), 1e-9)),
                "%.2fx" % (med(key, "sys_ns_per_pkt") / max(med(other, "sys_ns_per_pkt"), 1e-9)),
            ]
        out.append(
            "| %s | %s B | %s | %.3f | %.0f | %.0f | %.0f | %.3f | %s | %s | %s | %d |"
            % (
                key[0],
                key[1],
                key[2],
                med(key, "mpps"),
                med(key, "sys_ns_per_pkt"),
                med(key, "a_ns_per_pkt"),
                med(key, "b_ns_per_pkt"),
                med(key, "src_mpps"),
                *ratios,
                " ".join(r["c2c"] for r in rows[key]),
                len(rows[key]),
            )
        )
    # A tag's cost: pvnet-vlan against pvnet of the same round, both runs in one core-to-core
    # state (rates follow it: docs/bench.md), the pairs' median per state.
    cols = ["mpps", "sys_ns_per_pkt", "a_ns_per_pkt", "b_ns_per_pkt"]
    tag = []
    for key in sorted(rows):
        if key[2] != "pvnet-vlan" or (key[0], key[1], "pvnet") not in rows:
            continue
        plain = {r["round"]: r for r in rows[(key[0], key[1], "pvnet")]}
        for st in ("fast", "slow"):
            pairs = [
                (r, plain[r["round"]])
                for r in rows[key]
                if r["round"] in plain and state(r["c2c"]) == st == state(plain[r["round"]]["c2c"])
            ]
            if pairs:
                meds = [
                    statistics.median(float(t[c]) / max(float(u[c]), 1e-9) for t, u in pairs)
                    for c in cols
                ]
                ratios = " | ".join("%.2fx" % m for m in meds)
                tag.append("| %s | %s B | %s | %d | %s |" % (*key[:2], st, len(pairs), ratios))
    if tag:
        out += [
            "",
            (
                "A VLAN tag's cost: pvnet-vlan / pvnet of the same round, both runs in one c2c"
                " state, median of the pairs (ns ratios above 1.00x cost more):"
            ),
            "",
            "| direction | frame | c2c state | pairs | Mpps | machine CPU ns/pkt | switch A ns/pkt | switch B ns/pkt |",
            "|---|---|---|---|---|---|---|---|",
            *tag,
        ]
    return "\n".join(out)


def main(argv):
    if argv[1] == "snap":
        print(snap(argv[2], json.load(sys.stdin)))
    elif argv[1] == "result":
        d, cfg, size, rnd, c2c = argv[2:7]
        nums = [float(x) for x in argv[7:19]]
        print(result(d, cfg, size, rnd, c2c, *nums))
    elif argv[1] == "summary":
        with open(argv[2]) as f:
            write_table(summary(f.readlines()).splitlines(), argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
