#!/usr/bin/env python3
"""tests/interop/run.sh's checkers and decoders.

    checks.py features HEX        virtio-net feature bits by name ("HEX = NAME ...")
    checks.py protocol HEX        vhost-user protocol feature bits by name
    checks.py bits BITS           a guest's features file (bit 0 first) as hex
    checks.py mq TESTPMD_LOG PVNET_JSON MOVES MOVES_LOG
        dpdk_multiqueue: testpmd's per-queue counters against pvnet's, queue by queue, what
        the ports took against what they delivered, dropped or hold, the workers' hand-off
        and the moves asked and made
    checks.py guest-mq CONSOLE PVNET_JSON
        guest_mq: the guest's per-queue counters (ethtool -S) against pvnet's, and the totals
The checkers print their findings, "BAD ..." for each that fails, and exit 1 on any.
"""

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "lib"))
from pvnet_report import final  # (scripts/lib, put on the path above)

FEATURES = {
    0: "CSUM", 1: "GUEST_CSUM", 2: "CTRL_GUEST_OFFLOADS", 3: "MTU", 5: "MAC",
    7: "GUEST_TSO4", 8: "GUEST_TSO6", 9: "GUEST_ECN", 10: "GUEST_UFO", 11: "HOST_TSO4", 12: "HOST_TSO6", 13: "HOST_ECN",
    14: "HOST_UFO", 15: "MRG_RXBUF", 16: "STATUS", 17: "CTRL_VQ", 18: "CTRL_RX",
    19: "CTRL_VLAN", 21: "GUEST_ANNOUNCE", 22: "MQ", 23: "CTRL_MAC_ADDR",
    28: "INDIRECT_DESC", 29: "EVENT_IDX", 30: "PROTOCOL_FEATURES", 32: "VERSION_1",
    33: "ACCESS_PLATFORM", 34: "RING_PACKED", 35: "IN_ORDER",
}  # fmt: skip
PROTOCOL = {0: "MQ", 1: "LOG_SHMFD", 2: "RARP", 3: "REPLY_ACK", 4: "MTU", 5: "BACKEND_REQ",
            9: "CONFIG", 15: "CONFIGURE_MEM_SLOTS", 16: "STATUS"}  # fmt: skip


def decode(hexs, names):
    v = int(hexs, 16)
    return "%s = %s" % (hexs, " ".join(names.get(b, "bit%d" % b) for b in range(64) if v >> b & 1))


def testpmd_queues(lines):
    """testpmd's per-queue counters, port by port (the xstats blocks, in port order)."""
    tp, port = {}, None
    for line in lines:
        m = re.search(r"NIC extended statistics for port (\d+)", line)
        if m:
            port = int(m.group(1))
            tp[port] = {}
        m = re.match(r"\s*([rt]x_q\d+_good_packets):\s*(\d+)", line)
        if m and port is not None:
            tp[port][m.group(1)] = int(m.group(2))
    return tp


def mq(tp, fin, moves, said):
    """The findings and what failed: TP testpmd's queues by port, FIN pvnet's final report,
    MOVES the moves asked, SAID the answers "moved: " in the moves log."""
    out, bad = [], []
    sw = {p["name"]: p for p in fin.get("ports", [])}
    for i, name in enumerate("ab"):
        p = sw.get(name)
        if not p or len(p.get("queues", [])) != 2 or i not in tp:
            bad.append(f"{name}: no per-queue counters (pvnet {bool(p)}, testpmd {i in tp})")
            continue
        for k, q in enumerate(p["queues"]):
            t_tx, t_rx = tp[i].get(f"tx_q{k}_good_packets"), tp[i].get(f"rx_q{k}_good_packets")
            out.append(f"{name} q{k}: testpmd sent {t_tx}, pvnet took {q['rx_packets']} | pvnet delivered {q['tx_packets']}, testpmd read {t_rx}")
            if t_tx != q["rx_packets"]:
                bad.append(f"{name} q{k}: testpmd tx {t_tx} != pvnet rx {q['rx_packets']}")
            if t_rx != q["tx_packets"]:
                bad.append(f"{name} q{k}: pvnet tx {q['tx_packets']} != testpmd rx {t_rx}")
            if not q["rx_packets"] or not q["tx_packets"]:
                bad.append(f"{name} q{k}: no traffic one way")
    # conservation: what the ports took is what they delivered, dropped (counted, at either end:
    # a copy that finds the ring to the other worker full is dropped at its sender) or still waits
    c = [sw[n]["counters"] for n in "ab"]
    took = sum(x["rx_packets"] for x in c)
    dl = sum(x["tx_packets"] for x in c)
    drops = sum(v for x in c for k, v in x.items() if k.startswith("drops_"))
    left = sum(x.get("backlog", 0) for x in c)
    if not moves:
        out.append(f"a + b took {took} = delivered {dl} + dropped {drops} + waiting {left}")
        if took != dl + drops + left:
            bad.append(f"took {took} != delivered {dl} + dropped {drops} + waiting {left}")
    else:
        # flowgen's destination is never learned: every frame is flooded. While a and b share a
        # worker the flood has two candidates (the other port and the trunk), and a copy dropped
        # at either is counted though the other may have been delivered: every frame is counted
        # at least once, a frame dropped on both ways twice.
        out.append(f"a + b took {took} <= delivered {dl} + dropped {drops} (copies) + waiting {left}")
        if took > dl + drops + left:
            bad.append(f"took {took} > delivered {dl} + dropped {drops} + waiting {left}")
    w = fin.get("workers", [])
    if len(w) > 1:
        out.append("workers: " + "; ".join(
            f"{x['worker']}: ports {','.join(x['ports'])}, handed out {x['handoff_out']}, in {x['handoff_in']}" for x in w))
        if w[0]["handoff_out"] != w[1]["handoff_in"] or w[1]["handoff_out"] != w[0]["handoff_in"]:
            bad.append("the workers' hand-off counts differ")
        if not (w[0]["handoff_out"] and w[1]["handoff_out"]):
            bad.append("nothing crossed between the workers one way")
    if moves:
        done = sum(x.get("moved_in", 0) for x in w)
        out.append(f"ports moved between workers during the traffic: {done} (asked {moves}, {said} answered moved)")
        if done != moves or said != moves:
            bad.append(f"{done} moves made, {said} answered, of {moves} asked")
    return out, bad


def guest_mq(console, fin):
    """The findings and what failed: CONSOLE the guest's lines, FIN pvnet's final report."""
    g, st = {}, {}
    for line in console:
        if line.startswith("GUEST_QUEUES"):
            g = dict(kv.split("=") for kv in line.split()[1:])
        if line.startswith("GUEST_STATS"):
            st = dict(kv.split("=") for kv in line.split()[1:])
    vm = {p["name"]: p for p in fin["ports"]}.get("vm", {}) if fin else {}
    out, bad, q = [], [], vm.get("queues", [])
    if len(q) != 2:
        bad.append(f"pvnet has {len(q)} queue pairs' counters for vm, not 2")
    for k, pq in enumerate(q):
        gtx, grx = int(g.get(f"tx_queue_{k}_packets", -1)), int(g.get(f"rx_queue_{k}_packets", -1))
        out.append(f"queue {k}: guest sent {gtx}, pvnet took {pq['rx_packets']} | pvnet delivered {pq['tx_packets']}, guest received {grx}")
        if gtx != pq["rx_packets"]:
            bad.append(f"q{k}: guest tx {gtx} != pvnet rx {pq['rx_packets']}")
        if grx != pq["tx_packets"]:
            bad.append(f"q{k}: pvnet tx {pq['tx_packets']} != guest rx {grx}")
        if gtx <= 0 or grx <= 0:
            bad.append(f"q{k}: no traffic one way")
    c = vm.get("counters", {})
    out.append(f"total: guest tx {st.get('tx_packets')} rx {st.get('rx_packets')} | pvnet vm rx {c.get('rx_packets')} tx {c.get('tx_packets')}")
    if str(c.get("rx_packets")) != st.get("tx_packets") or str(c.get("tx_packets")) != st.get("rx_packets"):
        bad.append("totals differ")
    return out, bad


def report(out, bad):
    for line in out:
        print(line)
    for b in bad:
        print("BAD " + b)
    sys.exit(1 if bad else 0)


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "features":
        print(decode(a[0], FEATURES))
    elif cmd == "protocol":
        print(decode(a[0], PROTOCOL))
    elif cmd == "bits":
        print(hex(int(a[0][::-1], 2)))
    elif cmd == "mq":
        with open(a[0], errors="replace") as f:
            tp = testpmd_queues(f)
        moves, said = int(a[2]), 0
        if moves:
            with open(a[3], errors="replace") as f:
                said = f.read().count("moved: ")
        report(*mq(tp, final(a[1]) or {}, moves, said))
    elif cmd == "guest-mq":
        with open(a[0], errors="replace") as f:
            console = f.readlines()
        report(*guest_mq(console, final(a[1])))
    else:
        sys.exit("checks.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
