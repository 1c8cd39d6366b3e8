#!/usr/bin/env python3
"""scripts/bench_nocopy.sh's figures: one run's result line and the report.

    bench_nocopy.py result FE_JSON EXP SENDER SIZE MODE BUFFERS C2C
        the receiver's figures from its final report, one line (fails when it got nothing)
    bench_nocopy.py report RESULTS ROUNDS DUR
        the tables (medians): in place against a copy, and the buffer sizing
"""

import statistics
import sys
from collections import defaultdict

from pvnet_report import final

BUFFERS = ["fixed:1536", "fixed:4096", "ewma"]


def result(f, labels):
    """F: the frontend's final report; LABELS: exp sender size mode bufs c2c."""
    return " ".join([
        *labels, "%.4f" % f["mpps"], "%.1f" % f["busy_ns_per_frame"], "%.1f" % f["cpu_ns_per_frame"],
        "%.3f" % (f["rx_buffers"] / f["rx_packets"]), "%.3f" % (f["rx_truesize"] / f["rx_bytes"]),
    ])  # fmt: skip


def parse(lines):
    rows = defaultdict(list)
    for line in lines:
        exp, sender, size, mode, bufs, c2c, mpps, busy, cpu, bpf, ts = line.split()
        rows[(exp, sender, int(size), mode, bufs)].append(
            (float(c2c) if c2c != "nan" else float("nan"), float(mpps), float(busy), float(cpu), float(bpf), float(ts))
        )
    return rows


def report(rows, rounds, dur):
    med = statistics.median

    def col(k, i):
        return med([r[i] for r in rows[k]])

    c2cs = sorted(r[0] for v in rows.values() for r in v)
    out = [
        "Core-to-core latency over the runs: %.0f-%.0f ns (median %.0f). %s rounds of %s s, medians.\n"
        % (c2cs[0], c2cs[-1], med(c2cs), rounds, dur)
    ]
    senders = sorted({k[1] for k in rows if k[0] == "drop"})
    if senders:
        out.append("**Receive and drop, 64-byte frames** (EWMA buffers): in place against a copy of the whole frame.\n")
        out.append("| sender | mode | Mpps | busy ns/frame | CPU ns/frame | in place / copy (Mpps) | copy / in place (busy ns) |")
        out.append("|---|---|---|---|---|---|---|")
        for s in senders:
            c, p = ("drop", s, 64, "copy", "ewma"), ("drop", s, 64, "inplace", "ewma")
            if c not in rows or p not in rows:
                continue
            name = {"pvnet": "pvnet backend gen", "dpdk": "DPDK net_vhost txonly"}.get(s, s)
            out.append("| %s | copy | %.2f | %.1f | %.1f | | |" % (name, col(c, 1), col(c, 2), col(c, 3)))
            out.append("| %s | in place | %.2f | %.1f | %.1f | **%.3fx** | **%.3fx** |" % (
                name, col(p, 1), col(p, 2), col(p, 3), col(p, 1) / col(c, 1), col(c, 2) / col(p, 2)))
        out.append("")
    for exp, title in (
        ("sizing", "**Buffer sizing, frames received in place** (sender: pvnet backend gen)"),
        ("copy", "**Buffer sizing, frames copied out** (sender: pvnet backend gen)"),
    ):
        keys = sorted(k for k in rows if k[0] == exp)
        if not keys:
            continue
        out.append(title + ".\n")
        out.append("| frame bytes | buffers | Mpps | busy ns/frame | buffers/frame | memory held / frame bytes"
                   " | Mpps vs fixed:4096 | memory vs fixed:4096 |")
        out.append("|---|---|---|---|---|---|---|---|")
        for size in sorted({k[2] for k in keys}):
            ref = next((k for k in keys if k[2] == size and k[4] == "fixed:4096"), None)
            for k in sorted((k for k in keys if k[2] == size), key=lambda k: BUFFERS.index(k[4])):
                r1 = "%.3fx" % (col(k, 1) / col(ref, 1)) if ref else ""
                r2 = "%.3fx" % (col(k, 5) / col(ref, 5)) if ref else ""
                out.append("| %d | %s | %.3f | %.1f | %.3f | %.2f | %s | %s |" % (
                    size, k[4], col(k, 1), col(k, 2), col(k, 4), col(k, 5), r1, r2))
        out.append("")
    return out


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "result":
        f = final(a[0])
        if f is None or f["dropped"] == 0:
            sys.exit("no frames received")
        print(result(f, a[1:7]))
    elif cmd == "report":
        with open(a[0]) as f:
            print("\n".join(report(parse(f), a[1], a[2])))
    else:
        sys.exit("bench_nocopy.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
