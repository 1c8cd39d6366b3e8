#!/usr/bin/env python3
"""scripts/soak.sh's accounting: every round's counts and the totals must add up.

    soak.py round DIR R ROUNDS T0
        round R: the tx and rx frontends' final reports (DIR/tx_R.json, rx_R.json) against
        the switch's counters before and after it (DIR/ctl_R-1.json, ctl_R.json); writes
        DIR/round_R.json, prints one line, exits 1 when something does not add up
    soak.py total DIR ROUNDS T0 T1 TOTAL
        the rounds' records against the switch's counters over the whole run
"""

import json
import sys
import time

from pvnet_report import drops as sum_drops
from pvnet_report import final


def _load(path):
    with open(path) as f:
        return json.load(f)


def ports(ctl):
    return {p["name"]: p["counters"] for p in ctl["ports"]}


def round_record(tx, rx, now, before):
    """The round's record and what does not add up. TX, RX: the frontends' final reports;
    NOW, BEFORE: the switch's counters by port after and before the round."""
    delta = {p: {k: now[p][k] - before[p].get(k, 0) for k in now[p]} for p in now}
    drops = {}
    for dp in delta.values():
        for k, v in dp.items():
            if k.startswith("drops_") and v:
                drops[k[6:]] = drops.get(k[6:], 0) + v
    sw_drops = sum(drops.values())
    end_lost = 0 if rx.get("end_count") is not None else 1
    rec = {
        "sent": tx["data_sent"], "frames_sent": tx["tx_packets"],
        "received": rx["data_received"], "frames_received": rx["rx_packets"],
        "missing": rx["missing"], "backward": rx["backward"], "seq_errors": rx["seq_errors"],
        "rx_errors": rx["rx_errors"], "end_lost": end_lost,
        "sw_in": delta["a"]["rx_packets"], "sw_out": delta["b"]["tx_packets"],
        "sw_backlog": now["b"]["backlog"], "drops": drops, "secs": tx["secs"],
    }  # fmt: skip
    bad = []

    def check(ok, what):
        if not ok:
            bad.append(what)

    check(rec["frames_sent"] == rec["sw_in"], f"tx frontend sent {rec['frames_sent']} frames, switch took {rec['sw_in']}")
    check(rec["sw_in"] == rec["sw_out"] + sw_drops, f"switch took {rec['sw_in']}, delivered {rec['sw_out']} + dropped {sw_drops}")
    check(
        rec["sw_out"] == rec["frames_received"] + rec["rx_errors"],
        f"switch delivered {rec['sw_out']}, rx frontend received {rec['frames_received']} (+{rec['rx_errors']} errors)",
    )
    check(rec["backward"] == 0, f"{rec['backward']} frames out of order or duplicated")
    check(
        rec["sent"] - rec["received"] == sw_drops - end_lost + rec["rx_errors"],
        f"{rec['sent'] - rec['received']} data frames lost, {sw_drops} switch drops ({end_lost} end markers)",
    )
    if not end_lost:
        check(rx["end_count"] == rec["sent"], f"end marker says {rx['end_count']}, tx sent {rec['sent']}")
        check(rec["missing"] == rec["sent"] - rec["received"], f"rx found {rec['missing']} missing, {rec['sent'] - rec['received']} lost")
    check(rec["sw_backlog"] == 0, f"{rec['sw_backlog']} frames still queued at b")
    return rec, bad


def round_line(r, rounds, rec, bad, elapsed):
    mpps = rec["sent"] / rec["secs"] / 1e6 if rec["secs"] > 0 else 0.0
    why = " ".join(f"{k} {v}" for k, v in sorted(rec["drops"].items())) or "none"
    return (
        f"round {r}/{rounds}: {rec['sent']} sent, {rec['received']} received, "
        f"{rec['sent'] - rec['received']} dropped ({why}"
        f"{', its end marker among them' if rec['end_lost'] else ''}), {mpps:.2f} Mpps, "
        f"{rec['secs']:.1f} s, elapsed {elapsed:.0f} s" + ("" if not bad else "  <- DOES NOT ADD UP: " + "; ".join(bad))
    )


def totals(recs, c0, c1, total):
    """What does not add up over the whole run, and the drops by reason. C0, C1: the switch's
    counters by port at the start and the end."""

    def s(k):
        return sum(x[k] for x in recs)

    drops = {}
    for x in recs:
        for k, v in x["drops"].items():
            drops[k] = drops.get(k, 0) + v
    sw_drops = sum(sum_drops(c) for c in c1.values()) - sum(sum_drops(c) for c in c0.values())
    lost = s("sent") - s("received")
    end_lost, rx_err = s("end_lost"), s("rx_errors")
    bad = []
    if s("sent") != total:
        bad.append(f"sent {s('sent')}, asked for {total}")
    if sw_drops != sum(drops.values()):
        bad.append(f"switch drops {sw_drops} overall, {sum(drops.values())} over the rounds")
    if c1["a"]["rx_packets"] - c0["a"]["rx_packets"] != s("frames_sent"):
        bad.append("switch port a rx_packets != frames sent")
    if c1["b"]["tx_packets"] - c0["b"]["tx_packets"] != s("frames_received") + rx_err:
        bad.append("switch port b tx_packets != frames received")
    if lost != sw_drops - end_lost + rx_err:
        bad.append(f"{lost} lost, {sw_drops} switch drops ({end_lost} end markers), {rx_err} rx errors")
    if s("backward"):
        bad.append(f"{s('backward')} frames out of order or duplicated")
    return bad, drops


def total_lines(recs, rounds, secs, bad, drops):
    def s(k):
        return sum(x[k] for x in recs)

    sent, received = s("sent"), s("received")
    why = ", ".join(f"{k} {v}" for k, v in sorted(drops.items())) or "none"
    tail = "counts add up" if not bad else "COUNTS DO NOT ADD UP: " + "; ".join(bad)
    return [
        (f"soak: {rounds} rounds ({rounds} reconnects of each frontend), {secs:.1f} s elapsed, "
        f"{sent / secs / 1e6:.2f} Mpps overall ({sent / s('secs') / 1e6:.2f} Mpps while sending)"),
        (f"soak: frames incl. end markers: {s('frames_sent')} sent, {s('frames_received')} received; "
        f"end markers lost {s('end_lost')}, rx errors {s('rx_errors')}, seq_errors (gaps) {s('seq_errors')}, "
        f"missing {s('missing')}, out of order/duplicated {s('backward')}"),
        f"soak: {sent} sent, {received} received, {sent - received} dropped (reasons: {why}), {tail}",
    ]


def _final(path):
    f = final(path)
    if f is None:
        raise SystemExit(f"no final line in {path}")
    return f


def main(argv):
    cmd, a = argv[0], argv[1:]
    if cmd == "round":
        d, r, rounds, t0 = a[0], int(a[1]), int(a[2]), float(a[3])
        tx, rx = _final(f"{d}/tx_{r}.json"), _final(f"{d}/rx_{r}.json")
        rec, bad = round_record(tx, rx, ports(_load(f"{d}/ctl_{r}.json")), ports(_load(f"{d}/ctl_{r - 1}.json")))
        with open(f"{d}/round_{r}.json", "w") as f:
            json.dump(rec, f)
        print(round_line(r, rounds, rec, bad, time.time() - t0), flush=True)
        sys.exit(1 if bad else 0)
    elif cmd == "total":
        d, rounds, t0, t1, total = a[0], int(a[1]), float(a[2]), float(a[3]), int(a[4])
        recs = [_load(f"{d}/round_{r}.json") for r in range(1, rounds + 1)]
        c0, c1 = ports(_load(f"{d}/ctl_0.json")), ports(_load(f"{d}/ctl_{rounds}.json"))
        bad, drops = totals(recs, c0, c1, total)
        print("\n".join(total_lines(recs, rounds, t1 - t0, bad, drops)), flush=True)
        sys.exit(1 if bad else 0)
    else:
        sys.exit("soak.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
