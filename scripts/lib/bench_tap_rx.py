#!/usr/bin/env python3
"""scripts/bench_tap_rx.sh's figures: one run's RESULT line and the table.

    bench_tap_rx.py result DIRECT ROUND C2C CPU_NS PKTS SYSCALLS RX_DIRECT TAP_DROPPED BURSTS PER_BURST
        the switch's CPU ns over the drains, the packets it read, the tap port's syscalls and
        rx_direct since the start (the 1000 warm-up packets included)
    bench_tap_rx.py summary RESULTS OUT PAYLOAD
        the table (medians per setting) and direct / copied, to OUT and printed
"""

import statistics
import sys

from pvnet_report import results, write_table

WARMUP = 1000  # the warm-up packets each run sends first


def result(direct, rnd, c2c, cpu, pk, sc, dr, drops, bursts, pkts):
    # syscalls and rx_direct are totals since the start (warm-up included): per packet over all read.
    tot = pk + WARMUP
    return (
        "RESULT direct=%s round=%s c2c_ns=%s read=%d of=%d tap_dropped=%s sw_cpu_ns_per_pkt=%.1f drain_mpps=%.3f"
        " syscalls_per_pkt=%.3f direct_share=%.3f"
    ) % (direct, rnd, c2c, pk, bursts * pkts, drops, cpu / max(pk, 1), pk / max(cpu, 1) * 1e3, sc / tot, dr / tot)


def summary(rows, payload):
    def med(d, k):
        return statistics.median([float(r[k]) for r in rows if r["direct"] == d])

    c2c = sorted(float(r["c2c_ns"]) for r in rows)
    out = [
        "Core-to-core latency over the runs: %.0f-%.0f ns. UDP payload %s B (frame %d B). Medians of %d runs each;"
        " the switch's CPU over the drain of each burst." % (c2c[0], c2c[-1], payload, int(payload) + 42, len(rows) // 2),
        "",
        "| tap port | switch CPU ns/packet | Mpps per switch CPU | syscalls/packet | read in place |",
        "|---|---|---|---|---|",
    ]
    for d, name in (("false", "direct=false (read, then copied)"), ("true", "direct=true (read into the frontend's buffers)")):
        out.append("| %s | %.1f | %.3f | %.3f | %.3f |" % (
            name, med(d, "sw_cpu_ns_per_pkt"), med(d, "drain_mpps"), med(d, "syscalls_per_pkt"), med(d, "direct_share")))
    out += ["", "direct / copied: switch CPU ns per packet **%.3fx** (packets per CPU-second **%.3fx**)." % (
        med("true", "sw_cpu_ns_per_pkt") / med("false", "sw_cpu_ns_per_pkt"), med("true", "drain_mpps") / med("false", "drain_mpps"))]  # fmt: skip
    return out


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "result":
        print(result(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), int(a[6]), a[7], int(a[8]), int(a[9])))
    elif cmd == "summary":
        with open(a[0]) as f:
            rows = results(f)
        out = summary(rows, a[2])
        write_table(out, a[1])
    else:
        sys.exit("bench_tap_rx.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
