#!/usr/bin/env python3
"""scripts/bench_afxdp.sh's figures: a switch's readings, one run's RESULT line, the table.

    bench_afxdp.py snap PORT < ctl-status.json
        "tx_packets rx_packets syscalls busy_ns kernel_drops rx_direct delivered" of port PORT and
        the workers (busy_ns: the workers' time in rounds that moved packets; kernel_drops: what
        the kernel dropped on its way to the port; rx_direct: what it received straight into a
        frontend's buffers; delivered: what the receiving port "s" sent on), from one
        `pvnet ctl --json`
    bench_afxdp.py result CFG SIZE ROUND T0 T1 A0 A1 B0 B1 S0 S1 C0 C1 D0 D1 W0 W1 K0 K1 R0 R1 E0 E1
        the RESULT line over the window T0..T1 (seconds): A the source's sent packets, B the receiver's taken ones, S its
        port's syscalls, C / D the receiver's / the source's CPU ns, W the receiver's busy ns,
        K its port's kernel drops, R its packets received in place, E those delivered
    bench_afxdp.py summary RESULTS OUT
        the table (medians per receiver and frame size, ratios against af-packet, and for
        xdp-vm-direct against xdp-vm), to OUT and printed
"""

import json
import statistics
import sys

from pvnet_report import fields, state


def snap(port, status):
    c = next(p for p in status["ports"] if p["name"] == port)["counters"]
    busy = sum(w.get("busy_secs", 0) for w in status.get("workers", []))
    out = next((p["counters"] for p in status["ports"] if p["name"] == "s"), {})
    return "%d %d %d %d %d %d %d" % (
        c.get("tx_packets", 0),
        c.get("rx_packets", 0),
        c.get("syscalls", 0),
        int(busy * 1e9),
        c.get("kernel_drops", 0),
        c.get("rx_direct", 0),
        out.get("tx_packets", 0),
    )


def result(cfg, size, rnd, c2c, t0, t1, a0, a1, b0, b1, s0, s1, c0, c1, d0, d1, w0, w1, k0, k1, r0, r1, e0=0, e1=0):
    dt, a, b = t1 - t0, a1 - a0, b1 - b0
    return (
        "RESULT cfg=%s size=%s round=%s c2c_ns=%s rx_mpps=%.3f cpu_ns_per_pkt=%.0f busy_ns_per_pkt=%.0f"
        " syscalls_per_pkt=%.3f src_mpps=%.3f src_cpu_ns_per_pkt=%.0f kernel_drops_pct=%.2f direct_pct=%.1f"
        " delivered_mpps=%.3f"
    ) % (
        cfg,
        size,
        rnd,
        c2c,
        b / dt / 1e6,
        (c1 - c0) / max(b, 1),
        (w1 - w0) / max(b, 1),
        (s1 - s0) / max(b, 1),
        a / dt / 1e6,
        (d1 - d0) / max(a, 1),
        100.0 * (k1 - k0) / max(a, 1),
        100.0 * (r1 - r0) / max(b, 1),
        (e1 - e0) / dt / 1e6,
    )


def summary(lines):
    rows = {}
    for line in lines:
        if not line.startswith("RESULT "):
            continue
        kv = fields(line)
        st = state(kv["c2c_ns"]) if "c2c_ns" in kv else "-"
        rows.setdefault((kv["cfg"], kv["size"], st), []).append(kv)

    def med(key, k):
        return statistics.median(float(r[k]) for r in rows[key])

    head = (
        "| receiver | frame | c2c state | Mpps taken | Mpps delivered | switch CPU ns/pkt | busy ns/pkt | its syscalls/pkt | source Mpps"
        " | source CPU ns/pkt | kernel drops, % of sent | in place, % | vs af-packet (xdp-vm-direct: vs xdp-vm): Mpps"
        " | CPU ns/pkt | busy ns/pkt | runs |"
    )
    out = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # Ratios against AF_PACKET's runs in the same c2c state only (a run whose probes before
    # and after disagree is "mixed": shown, compared with nothing but other mixed runs).
    for key, runs in sorted(rows.items(), key=lambda kv: (int(kv[0][1]), kv[0][2], kv[0][0])):
        base = ("xdp-vm" if key[0] == "xdp-vm-direct" else "af-packet", key[1], key[2])
        ratios = ["-", "-", "-"]
        if base in rows:
            ratios = [
                "%.2fx" % (med(key, k) / max(med(base, k), 1e-9))
                for k in ("rx_mpps", "cpu_ns_per_pkt", "busy_ns_per_pkt")
            ]
        out.append(
            "| %s | %s B | %s | %.3f | %s | %.0f | %.0f | %.3f | %.3f | %.0f | %s | %s | %s | %s | %s | %d |"
            % (
                key[0],
                key[1],
                key[2],
                med(key, "rx_mpps"),
                "%.3f" % med(key, "delivered_mpps") if all("delivered_mpps" in r for r in runs) else "-",
                med(key, "cpu_ns_per_pkt"),
                med(key, "busy_ns_per_pkt"),
                med(key, "syscalls_per_pkt"),
                med(key, "src_mpps"),
                med(key, "src_cpu_ns_per_pkt"),
                # Runs from before the column have none.
                "%.2f" % med(key, "kernel_drops_pct") if all("kernel_drops_pct" in r for r in runs) else "-",
                "%.1f" % med(key, "direct_pct") if all("direct_pct" in r for r in runs) else "-",
                *ratios,
                len(runs),
            )
        )
    return "\n".join(out)


def main(argv):
    if argv[1] == "snap":
        print(snap(argv[2], json.load(sys.stdin)))
    elif argv[1] == "result":
        cfg, size, rnd, c2c = argv[2:6]
        nums = [float(x) for x in argv[6:26]]
        print(result(cfg, size, rnd, c2c, *nums))
    elif argv[1] == "summary":
        with open(argv[2]) as f:
            table = summary(f.readlines())
        with open(argv[3], "w") as f:
            f.write(table + "\n")
        print(table)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
