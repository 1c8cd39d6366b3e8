#!/usr/bin/env python3
"""scripts/peers/bench_tap.sh's figures: one run's RESULT line and the table.

    bench_tap.py result LABELS T0 T1 HZ A0 A1 AS0 AS1 AC0 AC1 B0 B1 BS0 BS1 BC0 BC1
        the writer's (A) and the reader's (B) packets, syscalls and CPU ticks at the window's
        ends, T0 and T1 its times in seconds: rates, syscalls and CPU ns per packet
    bench_tap.py table < RESULT lines
        medians per port kind and io, then uring / syscall per port kind
"""

import statistics
import sys


def result(labels, t0, t1, hz, a, asys, acpu, b, bsys, bcpu):
    """a, asys, acpu (and b...): the writer's packets, syscalls and ticks at the two ends."""
    dt = t1 - t0
    na, nb = a[1] - a[0], b[1] - b[0]
    acpu = (acpu[1] - acpu[0]) / hz * 1e9 / max(na, 1)
    bcpu = (bcpu[1] - bcpu[0]) / hz * 1e9 / max(nb, 1)
    return (
        f"RESULT {labels} write_mpps={na / dt / 1e6:.3f} write_syscalls_per_pkt={(asys[1] - asys[0]) / max(na, 1):.3f}"
        f" write_cpu_ns_per_pkt={acpu:.0f} read_mpps={nb / dt / 1e6:.3f}"
        f" read_syscalls_per_pkt={(bsys[1] - bsys[0]) / max(nb, 1):.3f} read_cpu_ns_per_pkt={bcpu:.0f}"
    )


def table(lines):
    rows = {}
    for line in lines:
        kv = dict(x.split("=") for x in line.split()[1:])
        rows.setdefault((kv["dev"], kv["io"]), []).append(kv)

    def med(key, k):
        return statistics.median(float(r[k]) for r in rows[key])

    out = [
        (
            "| port | io | pvnet -> kernel Mpps (writes) | syscalls/pkt | CPU ns/pkt (writer, kernel work included)"
            " | kernel -> pvnet Mpps (reads) | syscalls/pkt | CPU ns/pkt (reader) | runs |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, rs in rows.items():
        out.append("| %s | %s | %.3f | %.3f | %.0f | %.3f | %.3f | %.0f | %d |" % (
            key[0], key[1], med(key, "write_mpps"), med(key, "write_syscalls_per_pkt"), med(key, "write_cpu_ns_per_pkt"),
            med(key, "read_mpps"), med(key, "read_syscalls_per_pkt"), med(key, "read_cpu_ns_per_pkt"), len(rs),
        ))  # fmt: skip
    out.append("")
    for dev in dict.fromkeys(k[0] for k in rows):
        if (dev, "uring") in rows and (dev, "syscall") in rows:

            def u(k, dev=dev):
                return med((dev, "uring"), k) / med((dev, "syscall"), k)

            out.append("%s, uring / syscall (medians): writes %.2fx Mpps, %.2fx CPU ns/pkt; reads %.2fx Mpps, %.2fx CPU ns/pkt  " % (
                dev, u("write_mpps"), u("write_cpu_ns_per_pkt"), u("read_mpps"), u("read_cpu_ns_per_pkt"),
            ))  # fmt: skip
    return out


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "result":
        n = [float(x) for x in a[1:]]
        print(result(a[0], n[0], n[1], n[2], n[3:5], n[5:7], n[7:9], n[9:11], n[11:13], n[13:15]))
    elif cmd == "table":
        print("\n".join(table(sys.stdin)))
    else:
        sys.exit("bench_tap.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
