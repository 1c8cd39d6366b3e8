#!/usr/bin/env python3
"""Helpers of scripts/bench_ecn.sh.

    bench_ecn.py count IFNAME SECS   counts, for SECS, the IPv4 UDP frames IFNAME receives and
                                     those with CE set (a packet socket); prints "N CE"
    bench_ecn.py report TOS SWITCH_JSON IPERF_JSON CE_TXT
                                     one RESULT line: what CoDel did at port pb, the counts
                                     checked to add up, and what the far end saw
"""

import json
import socket
import sys
import time

ETH_P_IP = 0x0800


def count(ifname, secs):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
    s.bind((ifname, ETH_P_IP))
    s.settimeout(0.2)
    n = ce = 0
    end = time.monotonic() + secs
    while time.monotonic() < end:
        try:
            f = s.recv(2048)
        except TimeoutError:
            continue
        # Ethernet, then IPv4: the TOS byte's low two bits are the ECN field; UDP only.
        if len(f) < 34 or f[23] != 17:
            continue
        n += 1
        ce += (f[15] & 3) == 3
    print(n, ce)


def report(tos, sw_json, iperf_json, ce_txt):
    with open(sw_json) as f:
        final = json.load(f)["final"]
    pb = next(p for p in final["ports"] if p["name"] == "pb")["counters"]
    with open(iperf_json) as f:
        end = json.load(f)["end"]["sum"]
    with open(ce_txt) as f:
        seen, ce = (int(x) for x in f.read().split())
    queued, dequeued = pb["queued"], pb["dequeued"]
    aqm, qlim = pb["drops_aqm"], pb["drops_queue_limit"]
    backlog = pb.get("backlog", 0)
    adds_up = queued == dequeued + aqm + qlim + backlog
    print(
        "RESULT tos=%s sent=%d lost_pct=%.1f ecn_marked=%d aqm=%d queue_limit=%d queued=%d "
        "dequeued=%d adds_up=%s far_end_udp=%d far_end_ce=%d"
        % (tos, end["packets"], end["lost_percent"], pb.get("ecn_marked", 0), aqm, qlim,
           queued, dequeued, adds_up, seen, ce),
        flush=True,
    )


def main(argv):
    if len(argv) >= 4 and argv[1] == "count":
        count(argv[2], float(argv[3]))
    elif len(argv) == 6 and argv[1] == "report":
        report(*argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
