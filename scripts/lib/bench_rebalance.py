#!/usr/bin/env python3
"""scripts/bench_rebalance.sh's figures: one run's JSON line and the section.

    bench_rebalance.py run ROUND REBALANCE C2C DIR T0 T1 TCK
        one JSON line from the run directory DIR (the frontends' fe-a.json and fe-c.json, the
        switch's log) and the switch's CPU ticks at the start and the end
    bench_rebalance.py summary RESULTS OUT ROUNDS SECS
        the section (every run, then on / off paired by round), written to OUT and printed;
        SW_CPU, FE_CPU and SPARE from the environment go into its command line
"""

import json
import os
import re
import statistics
import sys

from pvnet_report import finals, write_table


def run(rnd, reb, c2, fin, log, cpu_ns):
    """FIN: the two frontends' final reports; LOG: the switch's log (colours removed)."""
    sent = sum(f["tx_packets"] for f in fin)
    iv = [f["intervals"] for f in fin]
    n = min(len(x) for x in iv)
    half = sum(sum(x[n // 2 : n]) for x in iv) / max(n - n // 2, 1)
    moves = [m for m in re.findall(r"port moved between workers.*", log) if "paused_us" in m]
    return {
        "round": int(rnd), "rebalance": reb == "true", "c2c_ns": c2,
        "mpps_second_half": half / 1e6, "mpps_all": sent / len(iv[0]) / 1e6 if iv[0] else 0,
        "switch_cpu_ns_per_frame": cpu_ns / sent if sent else 0,
        "moves_by_balancer": log.count("worker saturated: moving a port"), "undone": log.count("moving the port back"),
        "moves": len(moves), "paused_us": [int(x) for x in re.findall(r"paused_us=(\d+)", log)],
    }  # fmt: skip


def summary(rows, rounds, secs, environ):
    env = " ".join("%s=%s" % (k, environ[k]) for k in ("SW_CPU", "FE_CPU", "SPARE") if environ.get(k))
    out = [
        "Command: `%sROUNDS=%s SECS=%s scripts/bench_rebalance.sh` (written by the script)."
        % (env + " " if env else "", rounds, secs),
        "",
        ("| round | rebalance | c2c ns | Mpps, 2nd half | Mpps, whole run | switch CPU ns/frame | balancer moves (undone)"
        " | pause per move, us |"),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append("| %d | %s | %s | %.2f | %.2f | %.1f | %d (%d) | %s |" % (
            r["round"], "on" if r["rebalance"] else "off", r["c2c_ns"], r["mpps_second_half"], r["mpps_all"],
            r["switch_cpu_ns_per_frame"], r["moves_by_balancer"], r["undone"],
            ", ".join(str(p) for p in r["paused_us"]) or "-",
        ))  # fmt: skip
    ratios = []
    for k in sorted({r["round"] for r in rows}):
        on = [r for r in rows if r["round"] == k and r["rebalance"]]
        off = [r for r in rows if r["round"] == k and not r["rebalance"]]
        if on and off and off[0]["mpps_second_half"]:
            ratios.append(on[0]["mpps_second_half"] / off[0]["mpps_second_half"])
    out += ["", "Rebalancing on / off, second half, paired by round: %s; median **%.2fx**." % (
        ", ".join("%.2f" % x for x in ratios), statistics.median(ratios) if ratios else float("nan"))]
    return out


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "run":
        rnd, reb, c2, d, t0, t1, tck = a
        fin = [f for p in "ac" for f in finals(f"{d}/fe-{p}.json")]
        with open(f"{d}/switch.log") as f:
            log = re.sub(r"\x1b\[[0-9;]*m", "", f.read())
        cpu_ns = (int(t1) - int(t0)) / int(tck) * 1e9
        print(json.dumps(run(rnd, reb, c2, fin, log, cpu_ns)))
    elif cmd == "summary":
        with open(a[0]) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
        out = summary(rows, a[2], a[3], os.environ)
        write_table(out, a[1])
    else:
        sys.exit("bench_rebalance.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
