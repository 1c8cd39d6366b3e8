#!/usr/bin/env python3
"""scripts/peers/bench_guest_tap.sh's figures: one run's RESULT line and the table.

    bench_guest_tap.py kicks PVNET_JSON
        the vm port's kicks and calls per packet, the tap port's direct share and the vm port's
        DQL limit, from the switch's final report (" vm_kicks_per_pkt=.. vm_calls_per_pkt=..
        tap_direct_share=.. vm_dql_limit=.. vm_dql_idle=..")
    bench_guest_tap.py result CONSOLE CFG ROUND C2C DUR TESTS EXTRA
        the RESULT line from the guest's console (its BENCH lines: iperf3 and sockperf)
    bench_guest_tap.py summary RESULTS OUT
        the table: medians per configuration and pvnet / each other one, to OUT and printed
"""

import math
import re
import statistics
import sys

from pvnet_report import counters, final, port_named, results, write_table

NAN = float("nan")


def kicks(report):
    p = counters(report, "vm")
    n = p.get("rx_packets", 0) + p.get("tx_packets", 0)
    h = counters(report, "host")
    return " vm_kicks_per_pkt=%.3f vm_calls_per_pkt=%.3f tap_direct_share=%.3f vm_dql_limit=%d vm_dql_idle=%d" % (
        p.get("kicks", 0) / max(n, 1), p.get("calls", 0) / max(n, 1), h.get("rx_direct", 0) / max(h.get("rx_packets", 0), 1),
        p.get("dql_limit", 0), p.get("dql_idle", 0))


class Console:
    """The guest console's BENCH lines."""

    def __init__(self, text):
        self.lines = text.splitlines()

    def of(self, n):
        return [line.split(" ", 2)[2] for line in self.lines if line.startswith("BENCH %s " % n)]

    def receiver(self, n):
        r = [line for line in self.of(n) if "receiver" in line]
        return r[-1] if r else ""  # with -P N the last one is the [SUM] line

    def gbit(self, n):
        m = re.search(r"([\d.]+) Mbits/sec", self.receiver(n))
        return float(m.group(1)) / 1000 if m else NAN

    def pps(self, n):
        r = self.receiver(n)
        m = re.search(r"(\d+)/(\d+) \(", r)
        t = re.search(r"0.00-([\d.]+) +sec", r)
        if not (m and t):
            return NAN
        return (int(m.group(2)) - int(m.group(1))) / float(t.group(1))

    def rr(self, n):
        """One or more sockperf clients: percentiles per client (median over them), rate summed."""

        def pct(p):
            return [float(m.group(1)) for line in self.of(n) for m in [re.search(r"percentile %s *= *([\d.]+)" % p, line)] if m]

        p50, p99 = pct("50.000"), pct("99.000")
        tps = 0.0
        for line in self.of(n):
            m = re.search(r"RunTime=([\d.]+) sec; .*ReceivedMessages=(\d+)", line)
            if m and float(m.group(1)) > 0:
                tps += int(m.group(2)) / float(m.group(1))

        def med(v):
            return sorted(v)[len(v) // 2] if v else NAN

        return med(p50), med(p99), tps if tps else NAN

    def lost_pct(self, n):
        """Requests sent and not answered, percent (sockperf's [Total Run] line)."""
        for line in self.of(n):
            m = re.search(r"SentMessages=(\d+); ReceivedMessages=(\d+)", line)
            if m and int(m.group(1)) > 0:
                return 100.0 * (int(m.group(1)) - int(m.group(2))) / int(m.group(1))
        return NAN


def result(text, cfg, rnd, c2c, tests, extra):
    g = Console(text)
    ok = all(("BENCH_RC %s 0" % n) in g.lines for n in tests)
    out = []
    for n in tests:
        if n.startswith(("tcp", "flood")):
            out.append("%s_gbit=%.3f" % (n, g.gbit(n)))
        elif n.startswith("udp"):
            out.append("%s_pps=%.0f" % (n, g.pps(n)))
        elif n.startswith("rr"):
            a, b, c = g.rr(n)
            out.append("%s_p50_us=%.1f %s_p99_us=%.1f %s_tps=%.0f" % (n, a, n, b, n, c))
            if n.startswith(("rrload", "rrudp")):
                out.append("%s_bulk_gbit=%.3f" % (n, g.gbit(n + "_bulk")))
            if n.startswith("rrudp"):
                out.append("%s_lost_pct=%.2f" % (n, g.lost_pct(n)))
    return "RESULT cfg=%s round=%s c2c_ns=%s ok=%d %s%s" % (cfg, rnd, c2c, ok, " ".join(out), extra)


LABEL = {
    "rrload_p50_us": "ping-pong RTT p50 us under a host->guest TCP flood",
    "rrload_p99_us": "ping-pong RTT p99 us under a host->guest TCP flood",
    "rrload_tps": "ping-pong transactions/s under the flood",
    "rrload_bulk_gbit": "the flood's TCP Gbit/s",
    "rrudp_p50_us": "request RTT p50 us (2000/s, sockperf ul) under a host->guest UDP flood (1 Gbit/s)",
    "rrudp_p99_us": "request RTT p99 us (2000/s, sockperf ul) under a host->guest UDP flood (1 Gbit/s)",
    "rrudp_tps": "answers/s under the UDP flood",
    "rrudp_bulk_gbit": "the UDP flood's Gbit/s at the guest",
    "rrudp_lost_pct": "requests lost under the UDP flood, %",
    "flood_gbit": "the same UDP flood alone (no requests), Gbit/s at the guest",
    "vm_dql_limit": "the guest port's DQL limit at the end, buffers (0: no DQL)",
    "vm_dql_idle": "publishes that found the guest asleep on an empty ring while the limit held packets back",
    "tcp_g2h_gbit": "TCP guest->host Gbit/s",
    "tcp_h2g_gbit": "TCP host->guest Gbit/s",
    "udp_g2h_pps": "UDP 64 B guest->host pps",
    "udp_h2g_pps": "UDP 64 B host->guest pps",
    "rr_p50_us": "ping-pong RTT p50 us",
    "rr_p99_us": "ping-pong RTT p99 us",
    "rr_tps": "ping-pong transactions/s",
}
META = {"cfg", "round", "c2c_ns", "ok", "vm_kicks_per_pkt", "vm_calls_per_pkt", "tap_direct_share"}
ORDER = ["pvnet", "pvnet+napi0", "pvnet:busy", "pvnet:notify", "pvnet+viommu:strict", "pvnet+viommu:lazy",
         "pvnet+viommu:pt", "bh", "timer", "bh:intx", "timer:intx"]  # fmt: skip
NAMES = {
    "pvnet": "pvnet switch + tap (INTx)",
    "pvnet+napi0": "pvnet switch + tap, guest napi_tx=0",
    "pvnet+viommu:strict": "pvnet, guest vIOMMU iommu.strict=1",
    "pvnet+viommu:lazy": "pvnet, guest vIOMMU iommu.strict=0",
    "pvnet+viommu:pt": "pvnet, guest vIOMMU iommu=pt",
    "bh": "QEMU tap tx=bh",
    "timer": "QEMU tap tx=timer",
    "bh:intx": "QEMU tap tx=bh, INTx",
    "timer:intx": "QEMU tap tx=timer, INTx",
}


def describe(k):
    if k in LABEL:
        return LABEL[k]
    m = re.match(r"(.*?)(?:_x(\d+))?_(gbit|pps|p50_us|p99_us|tps|lost_pct)$", k)
    base = LABEL.get("%s_%s" % (m.group(1), m.group(3)), k) if m else k
    return base + (", %s flows" % m.group(2) if m and m.group(2) else "")


def name(c):
    if c in NAMES:
        return NAMES[c]
    return "pvnet switch --policy %s (INTx)" % c[6:].replace(":", ", tx-call-delay ") if c.startswith("pvnet:") else c


def summary(rows):
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in META]
    cfgs = [c for c in ORDER if any(r["cfg"] == c for r in rows)]
    cfgs += sorted({r["cfg"] for r in rows} - set(cfgs))

    def med(c, k):
        return statistics.median([float(r[k]) for r in rows if r["cfg"] == c and r["ok"] == "1" and k in r] or [NAN])

    def f(x):
        return ("%.3f" % x if x < 10 else "%.0f" % x) if not math.isnan(x) else "-"

    refs = [c for c in cfgs if c != "pvnet"]
    hdr = "| metric | " + " | ".join(name(c) for c in cfgs) + " | " + " | ".join("pvnet / " + c for c in refs) + " |"
    out = [hdr, "|" + "---|" * (len(cfgs) + len(refs) + 1)]
    for k in keys:
        v = {c: med(c, k) for c in cfgs}

        def r(c, v=v):
            return "%.2f" % (v["pvnet"] / v[c]) if "pvnet" in v and c in v and not math.isnan(v[c]) and v[c] > 0 else "-"

        out.append("| %s | %s | %s |" % (describe(k), " | ".join(f(v[c]) for c in cfgs), " | ".join(r(c) for c in refs)))
    out.append("")
    out.append("Medians over the runs whose tests all completed; for latency a ratio below 1 is better.")
    return out


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "kicks":
        report = final(a[0])
        if report is None or port_named(report, "vm") is None or port_named(report, "host") is None:
            sys.exit(1)
        print(kicks(report))
    elif cmd == "result":
        with open(a[0], errors="replace") as f:
            text = f.read()
        print(result(text, a[1], a[2], a[3], a[5].split(), a[6]))
    elif cmd == "summary":
        with open(a[0]) as f:
            rows = results(f)
        out = summary(rows)
        write_table(out, a[1])
    else:
        sys.exit("bench_guest_tap.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
