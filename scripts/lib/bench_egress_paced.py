#!/usr/bin/env python3
"""scripts/bench_egress_paced.sh's figures: RESULT lines of its runs and its two tables.

    bench_egress_paced.py bulk CFG ROUND C2C CTL0 CTL1
        a bulk run's RESULT line from the two `pvnet ctl --json` snapshots at the window's ends
    bench_egress_paced.py latency CFG ROUND C2C CTL0 CTL1 RR_JSON RX_JSON
        a latency run's RESULT line, with the rr client's and the receiver's final reports
    bench_egress_paced.py summary bulk|latency RESULTS OUT SEND_PPS RECV_PPS
        the part's table, written to OUT and printed
"""

import json
import statistics
import sys

from pvnet_report import counters, final, results, state, write_table


def _load(path):
    with open(path) as f:
        return json.load(f)


def latency_result(cfg, rnd, c2c, a, b, rr, rx):
    """A: the ctl snapshot at the window's start, B: at its end, RR: the rr client's final,
    RX: the receiver's (each request's one-way delay, from the client's send to its take)."""
    dt = b["uptime_secs"] - a["uptime_secs"]
    # b's delivered packets: the bulk sender's and the requests (a few thousand a second).
    mpps = (counters(b, "b")["tx_packets"] - counters(a, "b")["tx_packets"]) / dt / 1e6
    return (
        "RESULT cfg=%s round=%s c2c_ns=%s rr_p50_us=%.1f rr_p99_us=%.1f rr_p999_us=%.1f rr_per_sec=%.0f transactions=%d"
        " lost=%d strays=%d bulk_mpps=%.3f dql_limit=%d dql_idle=%d req_p50_us=%.1f req_p99_us=%.1f req_p999_us=%.1f"
    ) % (
        cfg, rnd, c2c, rr["p50_us"], rr["p99_us"], rr.get("p999_us", float("nan")), rr["rr_per_sec"], rr["transactions"],
        rr["lost"], rr["strays"], mpps, counters(b, "b")["dql_limit"], counters(b, "b").get("dql_idle", 0),
        rx["request_p50_us"], rx["request_p99_us"], rx["request_p999_us"],
    )  # fmt: skip


def bulk_result(cfg, rnd, c2c, a, b):
    a0, a1, b0, b1 = counters(a, "a"), counters(b, "a"), counters(a, "b"), counters(b, "b")
    dt = b["uptime_secs"] - a["uptime_secs"]
    w0, w1 = a["workers"][0], b["workers"][0]
    busy, cpu = (w1["busy_secs"] - w0["busy_secs"]) * 1e9, (w1["cpu_secs"] - w0["cpu_secs"]) * 1e9

    def d(k):
        return b1[k] - b0[k]

    took, deliv = a1["rx_packets"] - a0["rx_packets"], d("tx_packets")
    dropped = sum(b1[k] - b0[k] for k in b1 if k.startswith("drops_"))
    # What the switch took from a = delivered to b + dropped + the change in b's backlog.
    gap = took - deliv - dropped - (b1["backlog"] - b0["backlog"])
    return (
        "RESULT cfg=%s round=%s c2c_ns=%s took_mpps=%.3f mpps=%.3f busy_ns_per_pkt=%.1f cpu_ns_per_pkt=%.1f"
        " from_queue=%.3f per_dequeue=%.1f publishes_per_pkt=%.3f calls_per_pkt=%.4f drop_share=%.3f dql_limit=%d"
        " unaccounted=%d"
    ) % (
        cfg, rnd, c2c, took / dt / 1e6, deliv / dt / 1e6, busy / max(deliv, 1), cpu / max(deliv, 1),
        d("dequeued") / max(deliv, 1), d("dequeued") / max(d("dequeues"), 1), d("tx_batches") / max(deliv, 1),
        d("calls") / max(deliv, 1), dropped / max(took, 1), b1["dql_limit"], gap,
    )  # fmt: skip


def parse(lines):
    return results(lines)


class Rows:
    def __init__(self, rows):
        self.rows = rows

    def med(self, cfg, k):
        return statistics.median([float(r[k]) for r in self.rows if r["cfg"] == cfg])

    def c2c(self):
        return sorted(float(x) for r in self.rows for x in r["c2c_ns"].split("/"))


def bulk_ratio(rows, c, one_cfg, one):
    """Bulk against one per dequeue: paired, the two runs of a round side by side; a pair counts
    only when both ran in one core-to-core state, before and after each."""
    pairs = []
    for r in sorted({r["round"] for r in rows.rows}):
        x = [r2 for r2 in rows.rows if r2["round"] == r and r2["cfg"] == c]
        y = [r2 for r2 in rows.rows if r2["round"] == r and r2["cfg"] == one_cfg]
        if x and y and state(x[0]["c2c_ns"]) == state(y[0]["c2c_ns"]) != "mixed":
            pairs.append("%.2f %s" % (float(y[0]["busy_ns_per_pkt"]) / float(x[0]["busy_ns_per_pkt"]), state(x[0]["c2c_ns"])))
    if pairs:
        return "**%.2fx fewer ns** (median of the pairs in one state: %s)" % (
            statistics.median(float(p.split()[0]) for p in pairs), ", ".join(pairs))
    return "%.2fx fewer ns (medians; no pair ran in one state)" % (one / rows.med(c, "busy_ns_per_pkt"))


def bulk_summary(rows, send, recv):
    rows = Rows(rows)
    med, c2c = rows.med, rows.c2c()
    out = [
        "Core-to-core latency over the runs: %.0f-%.0f ns. Offered %.2f Mpps, taken %.2f Mpps; medians of %d runs each."
        % (c2c[0], c2c[-1], send, recv, len(rows.rows) // 4),
        "",
        ("| egress of b | dequeue | delivered Mpps | switch busy ns per delivered packet | delivered from the queue"
        " | packets per dequeue | publishes per packet | dropped (queue limit) | counts add up | bulk vs one |"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for q, name in (("qdisc=fifo", "fifo"), ("qdisc=fq_codel,dql=true", "fq_codel + DQL")):
        one = med(q + ",bulk=false", "busy_ns_per_pkt")
        for bulk in ("true", "false"):
            c = q + ",bulk=" + bulk
            # The counters are read while the switch runs, so a window's ends may fall inside
            # a round: exact up to one round's packets (the tests check the exact counts).
            ok = all(abs(int(r["unaccounted"])) <= 256 for r in rows.rows if r["cfg"] == c)
            ratio = bulk_ratio(rows, c, q + ",bulk=false", one) if bulk == "true" else "1x"
            out.append("| %s | %s | %.3f | %.1f | %.3f | %.1f | %.3f | %.3f | %s | %s |" % (
                name, "bulk" if bulk == "true" else "one per dequeue", med(c, "mpps"), med(c, "busy_ns_per_pkt"),
                med(c, "from_queue"), med(c, "per_dequeue"), med(c, "publishes_per_pkt"), med(c, "drop_share"),
                "yes" if ok else "**no**", ratio,
            ))  # fmt: skip
    return out


LATENCY_CFGS = {
    "qdisc=fifo,dql=false": "fifo",
    "qdisc=fifo,dql=true": "fifo + DQL",
    "qdisc=fq_codel,dql=false": "fq_codel",
    "qdisc=fq_codel,dql=true,dql_target_us=0": "fq_codel + DQL alone (Linux's, no pace cap)",
    "qdisc=fq_codel,dql=true": "fq_codel + DQL capped by the receiver's pace, reserve on trial (default)",
    "qdisc=fq_codel,dql=true,dql_witness=false": "the same, the cap without its reserve (dql_witness=false)",
    "qdisc=none": "none (packets wait in their sender)",
    "floor": "no bulk sender: the request loop alone (the harness's floor)",
}


def latency_summary(rows, send, recv):
    rows = Rows(rows)
    med, c2c = rows.med, rows.c2c()
    base = "qdisc=fifo,dql=false"
    out = [
        "Core-to-core latency over the runs: %.0f-%.0f ns. Bulk offered %.2f Mpps, the receiver takes %.2f Mpps;"
        " one request in flight; medians of %d runs each."
        % (c2c[0], c2c[-1], send, recv, len(rows.rows) // len({r["cfg"] for r in rows.rows})),
        "",
        ("| egress of b | request one-way p50 / p99 / p99.9 us | one-way p99 vs fifo | RR p50 us | RR p99 us"
        " | RR p99.9 us | RR p99 vs fifo | transactions/s | requests lost | delivered to b, Mpps | vs fifo"
        " | DQL limit (buffers) |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def has(c, k):  # results from before a field was recorded have none
        return all(k in r for r in rows.rows if r["cfg"] == c)

    def p999(c):
        return "%.0f" % med(c, "rr_p999_us") if has(c, "rr_p999_us") else "-"

    def oneway(c):
        if not has(c, "req_p99_us"):
            return "-", "-"
        ratio = "%.3fx" % (med(c, "req_p99_us") / med(base, "req_p99_us")) if has(base, "req_p99_us") else "-"
        return "%.0f / %.0f / %.0f" % (med(c, "req_p50_us"), med(c, "req_p99_us"), med(c, "req_p999_us")), ratio

    for c, name in LATENCY_CFGS.items():
        if not any(r["cfg"] == c for r in rows.rows):
            continue
        out.append("| %s | %s | %s | %.0f | %.0f | %s | %.3fx | %.0f | %d | %.3f | %.3fx | %s |" % (
            name, *oneway(c), med(c, "rr_p50_us"), med(c, "rr_p99_us"), p999(c), med(c, "rr_p99_us") / med(base, "rr_p99_us"),
            med(c, "rr_per_sec"), sum(int(r["lost"]) for r in rows.rows if r["cfg"] == c), med(c, "bulk_mpps"),
            med(c, "bulk_mpps") / med(base, "bulk_mpps"), "%.0f" % med(c, "dql_limit") if "dql=true" in c else "-",
        ))  # fmt: skip
    return out


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "bulk":
        print(bulk_result(a[0], a[1], a[2], _load(a[3]), _load(a[4])))
    elif cmd == "latency":
        rr, rx = final(a[5]), final(a[6])
        for path, v in ((a[5], rr), (a[6], rx)):
            if v is None:
                sys.exit("no final line in %s" % path)
        print(latency_result(a[0], a[1], a[2], _load(a[3]), _load(a[4]), rr, rx))
    elif cmd == "summary":
        part, res, out_path, send, recv = a
        with open(res) as f:
            rows = parse(f)
        fn = bulk_summary if part == "bulk" else latency_summary
        out = fn(rows, int(send) / 1e6, int(recv) / 1e6)
        write_table(out, out_path)
    else:
        sys.exit("bench_egress_paced.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
