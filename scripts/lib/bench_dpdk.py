#!/usr/bin/env python3
"""scripts/peers/bench_dpdk.sh's figures: one run's RESULT line and the summary table.

    bench_dpdk.py result FE_LOG TICKS FIELD WARM DUR TCK PORTS NCPU QUEUES LABELS
        one run's RESULT line from the frontend testpmd's log (its 1 s `show port stats`
        samples) and the TICKS file (per second: k, backend ticks, frontend ticks, machine
        busy ticks); LABELS ("dir=.. size=.. ...") go first on the line
    bench_dpdk.py batch PVNET_JSON DIR RESULT_FILE
        appends pkts_per_batch (packets per used-index publish on the frontend's port) to
        the RESULT line in RESULT_FILE, from the switch's final report
    bench_dpdk.py summary RESULTS OUT
        the table: per size, direction, pvnet implementation and c2c state, medians and the
        ratios pvnet/DPDK, and the paired ratios of the rounds whose both runs were in that
        state; written to OUT and printed
"""

import math
import re
import statistics
import sys

from pvnet_report import fields, final, state, write_table

NAN = float("nan")


def samples(text, field, ports):
    """The (cumulative packets, pps) samples of FIELD (TX or RX) in a testpmd log, one per
    `show port stats all` (with several ports: the sum over the PORTS blocks in a row)."""
    blocks = text.split("NIC statistics for port")[1:]

    def num(pat, b):
        m = re.search(pat, b)
        return int(m.group(1)) if m else None

    vals = [(num(field + r"-packets: *(\d+)", b), num(field.capitalize() + r"-pps: *(\d+)", b)) for b in blocks]
    vals = [v for v in vals if None not in v]
    return [tuple(map(sum, zip(*vals[k : k + ports], strict=True))) for k in range(0, len(vals) - ports + 1, ports)]


def queue_share(text, field, queues):
    """The least-loaded queue's share of what the frontend counted (per-queue xstats)."""
    per = {}
    for m in re.finditer(r"(%s)_q(\d+)_good_packets: *(\d+)" % ("tx" if field == "TX" else "rx"), text):
        per[int(m.group(2))] = per.get(int(m.group(2)), 0) + int(m.group(3))
    tot = sum(per.values())
    return min(per.values()) / tot if tot and len(per) == queues else 0


def burst_stats(text):
    """BURSTS=1: the frontend's record of its bursts (testpmd's record-burst-stats): the
    share of receive polls that found nothing, and of full 32-packet bursts; for txonly the
    same of its transmit bursts (fe_tx_full_pct: went out whole, the backend kept up)."""
    bs = ""
    for kind, tag in (("RX", "fe"), ("TX", "fe_tx")):
        m = re.search(kind + r"-bursts : (\d+) \[(.*)\]", text)
        if m and int(m.group(1)) > 0:
            shares = re.findall(r"(\d+)% of (\d+) pkts", m.group(2))

            def share(k, shares=shares):
                return sum(int(p) for p, n in shares if int(n) == k)

            bs += " %s_bursts=%s %s_empty_pct=%d %s_full_pct=%d" % (tag, m.group(1), tag, share(0), tag, share(32))
    return bs


def result(fe_log, tfile, field, warm, dur, tck, ports, ncpu, queues, labels):
    """One RESULT line: Mpps (median of the window's samples), CPU ns/packet over the window."""
    with open(fe_log, errors="replace") as f:
        text = f.read()
    vals = samples(text, field, ports)
    cum, pps = [v[0] for v in vals], [v[1] for v in vals]
    with open(tfile) as f:
        rows = [[float(x) for x in line.split()[1:]] for line in f]
    ticks = [r[0] for r in rows]
    n = min(len(ticks), len(cum))
    w0, w1 = warm - 1, min(warm + dur, n) - 1  # sample k (1-based) is index k-1
    win = pps[w0 + 1 : w1 + 1]
    mpps = statistics.median(win) / 1e6 if win else NAN
    pk = cum[w1] - cum[w0] if n > w1 > w0 else 0
    ns = (ticks[w1] - ticks[w0]) * 1e9 / tck / pk if pk > 0 else NAN
    # CPU time of everything else on the machine during the window, in % of all CPUs: work
    # that is not ours competes for the 2 cores and spoils the run.
    other = NAN
    if n > w1 > w0:
        d = [rows[w1][i] - rows[w0][i] for i in range(3)]
        other = max(0.0, 100.0 * (d[2] - d[0] - d[1]) / (tck * (w1 - w0) * ncpu))
    qs = " q_min_share=%.2f" % queue_share(text, field, queues) if queues > 1 else ""
    return "RESULT %s other_pct=%.0f mpps=%.2f min=%.2f max=%.2f cpu_ns_per_pkt=%.1f pkts=%d%s%s" % (
        labels,
        other,
        mpps,
        min(win) / 1e6 if win else 0,
        max(win) / 1e6 if win else 0,
        ns,
        pk,
        qs,
        burst_stats(text),
    )


def pkts_per_batch(report, direction):
    """Packets per used->idx publish on the frontend's (vhost-user) port, or None."""
    c = next(p["counters"] for p in report["ports"] if p["kind"] == "vhost-user")
    k = "tx" if direction == "h2v" else "rx"
    return c[k + "_packets"] / c[k + "_batches"] if c.get(k + "_batches") else None


def parse(lines):
    """RESULT lines as dicts, with their c2c state and numbers."""
    rows = []
    for line in lines:
        d = fields(line)
        d["state"] = state(d["c2c_ns"])
        d["mpps"], d["ns"] = float(d["mpps"]), float(d["cpu_ns_per_pkt"])
        d.setdefault("size", "64")
        rows.append(d)
    return rows


DIRS = (
    ("v2h", "v2h: virtio-user txonly -> backend"),
    ("h2v", "h2v: backend -> virtio-user rxonly"),
    ("bounce", "bounce: virtio-user io x2 <-> backend (sum of both ports)"),
)


def med(xs):
    return statistics.median(xs) if xs else NAN


def summary(rows):
    """The table's lines: ratios pvnet/DPDK per direction and c2c state."""
    out = [
        (
            "| direction | bytes | pvnet | c2c state | runs pvnet/DPDK | pvnet Mpps | DPDK Mpps | Mpps pvnet/DPDK"
            " | pvnet CPU ns/pkt | DPDK CPU ns/pkt | ns/pkt pvnet/DPDK | paired Mpps ratios |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    impls = [i for i in ("switch", "alt", "backend", "altbackend", "pvnet") if any(x["impl"] == i for x in rows)]
    sizes = sorted({x["size"] for x in rows}, key=lambda s: [int(k) for k in s.split("+")])
    for size in sizes:
        for dr, name in DIRS:
            for impl in impls:
                for st in ("fast", "mid", "slow", "mixed"):
                    line = summary_row(rows, dr, name, size, impl, st)
                    if line:
                        out.append(line)
    return out


def summary_row(rows, dr, name, size, impl, st):
    """One row of the table (None when neither side ran in that state)."""

    def runs(i):
        return [x for x in rows if x["dir"] == dr and x["size"] == size and x["impl"] == i and x["state"] == st]

    p, q = runs(impl), runs("dpdk")
    if not p and not q:
        return None
    pm, qm = med([x["mpps"] for x in p]), med([x["mpps"] for x in q])
    pn, qn = med([x["ns"] for x in p]), med([x["ns"] for x in q])
    # A/B of the same round whose runs were both in this state
    pairs = []
    for x in p:
        y = [z for z in q if z["round"] == x["round"]]
        if y:
            pairs.append("%.2f" % (x["mpps"] / y[0]["mpps"]))

    def r(a, b):
        return "%.2f" % (a / b) if p and q and not math.isnan(b) and b > 0 else "-"

    def f(v):
        return "%.2f" % v if not math.isnan(v) else "-"

    def g(v):
        return "%.1f" % v if not math.isnan(v) else "-"

    return "| %s | %s | %s | %s | %d/%d | %s | %s | **%s** | %s | %s | %s | %s |" % (
        name, size, impl, st, len(p), len(q), f(pm), f(qm), r(pm, qm), g(pn), g(qn), r(pn, qn), " ".join(pairs) or "-",
    )  # fmt: skip


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "result":
        print(result(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), int(a[6]), int(a[7]), int(a[8]), a[9]))
    elif cmd == "batch":
        per = pkts_per_batch(final(a[0]), a[1])
        if per is not None:
            with open(a[2]) as f:
                line = f.read().rstrip("\n")
            with open(a[2], "w") as f:
                f.write("%s pkts_per_batch=%.1f\n" % (line, per))
    elif cmd == "summary":
        with open(a[0]) as f:
            out = summary(parse(f))
        write_table(out, a[1])
    else:
        sys.exit("bench_dpdk.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
