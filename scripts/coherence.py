#!/usr/bin/env python3
"""The coherence count: cache lines that change owner between the two sides, per packet.

Reads what the switch harness printed (`switchpath coherence ...`: the markers' addresses,
the rings' host addresses, the packets counted) and valgrind lackey's trace of the same run
(every load and store with its address), and plays the trace through a two-cache model of
the shared memory at 64-byte granularity (docs/coherence.md explains it):

* each line has a set of holders (the device, the driver, or both);
* a read by a side that does not hold the line, while the other side does, is a read
  transfer (the line comes from the other core's cache);
* a write by a side while the other side holds the line is a write transfer: an RFO when
  the writer did not hold it (the data comes over too), an upgrade when it held a shared copy
  (the other copy is invalidated; a round trip without the data);
* a line neither side holds yet is cold (first touch: from memory, not counted).

Prefetches (with the `coherence` feature each is a marked load) take the line early: their
transfers are counted apart, with how far ahead of the side's first use (in instructions) they
were taken. Only the window between the Begin and End markers is counted.

Usage: coherence.py <harness output> <lackey log>   (prints one JSON object)
"""

from __future__ import annotations

import bisect
import json
import sys
from collections import Counter
from dataclasses import dataclass, field

DEVICE, DRIVER = 0, 1
SIDES = ("device", "driver")
MARKS = ("device", "driver", "begin", "end", "prefetch", "prefetchw", "prefetch_end")
LINE = 64


@dataclass
class Queue:
    """One ring's memory as the harness laid it out (host addresses)."""

    name: str
    fmt: str
    desc: int
    avail: int
    used: int
    bufs: int
    buf_size: int
    size: int
    end: int

    def field(self, addr: int) -> str:
        """The structure `addr` lies in, named as the tables name it."""
        ring = self.name.split(".")[-1]
        if addr >= self.bufs:
            off = (addr - self.bufs) % self.buf_size
            return f"{ring}.hdr" if off < LINE else f"{ring}.data"
        if addr >= self.used:
            if self.fmt == "Packed":
                return f"{ring}.device_event"
            off = addr - self.used
            if off < 4:
                return f"{ring}.used_idx"
            return f"{ring}.used_ring" if off < 4 + 8 * self.size else f"{ring}.avail_event"
        if addr >= self.avail:
            if self.fmt == "Packed":
                return f"{ring}.driver_event"
            off = addr - self.avail
            if off < 4:
                return f"{ring}.avail_idx"
            return f"{ring}.avail_ring" if off < 4 + 2 * self.size else f"{ring}.used_event"
        return f"{ring}.desc"


@dataclass
class Layout:
    """What the harness printed."""

    marks: dict[int, str]
    queues: list[Queue]
    packets: int
    starts: list[int] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Layout:
        marks: dict[int, str] = {}
        queues: list[Queue] = []
        packets = 0
        for line in text.splitlines():
            w = line.split()
            if not w:
                continue
            if w[0] == "marks":
                base, stride = int(w[1], 16), int(w[2])
                marks = {base + k * stride: m for k, m in enumerate(MARKS)}
            elif w[0] == "queue":
                a = [int(x, 16) for x in w[3:7]]
                queues.append(Queue(w[1], w[2], *a, int(w[7]), int(w[8]), int(w[9], 16)))
            elif w[0] == "packets":
                packets = int(w[1])
        queues.sort(key=lambda q: q.desc)
        layout = cls(marks, queues, packets)
        layout.starts = [q.desc for q in queues]
        return layout

    def queue(self, addr: int) -> Queue | None:
        k = bisect.bisect_right(self.starts, addr) - 1
        if k < 0:
            return None
        q = self.queues[k]
        return q if addr < q.end else None


@dataclass
class Model:
    """The two caches and what moved between them."""

    holders: dict[int, int] = field(default_factory=dict)
    counting: bool = False
    # (side, kind, field) -> transfers; kind: read, rfo, upgrade
    moved: Counter = field(default_factory=Counter)
    # (side, kind) -> transfers a prefetch took
    prefetched: Counter = field(default_factory=Counter)
    # side -> prefetches of lines the side already held, or that nobody held
    idle_prefetches: Counter = field(default_factory=Counter)
    # line -> (side, instruction count at the prefetch), until the side's first use
    pending: dict[int, tuple[int, int]] = field(default_factory=dict)
    distances: list[int] = field(default_factory=list)

    def access(self, side: int, line: int, write: bool, fld: str, icount: int,
               prefetch: bool = False) -> None:
        me, other = 1 << side, 1 << (1 - side)
        held = self.holders.get(line, 0)
        if prefetch:
            kind = self._transfer(me, other, held, write)
            self.holders[line] = me if write else held | me
            if self.counting:
                if kind:
                    self.moved[(SIDES[side], kind, fld)] += 1
                    self.prefetched[(SIDES[side], kind)] += 1
                else:
                    self.idle_prefetches[SIDES[side]] += 1
            self.pending[line] = (side, icount)
            return
        p = self.pending.pop(line, None)
        if p is not None and p[0] == side and self.counting:
            self.distances.append(icount - p[1])
        kind = self._transfer(me, other, held, write)
        if kind and self.counting:
            self.moved[(SIDES[side], kind, fld)] += 1
        self.holders[line] = me if write else held | me

    @staticmethod
    def _transfer(me: int, other: int, held: int, write: bool) -> str | None:
        if not held & other:
            return None  # cold, or held here alone: no transfer
        if write:
            return "upgrade" if held & me else "rfo"
        return None if held & me else "read"


def run(layout: Layout, trace) -> Model:
    """Plays the lackey trace through the model."""
    model = Model()
    side = DRIVER
    pf: str | None = None
    icount = 0
    lo = min(q.desc for q in layout.queues)
    hi = max(q.end for q in layout.queues)
    marks = layout.marks
    for line in trace:
        c = line[0]
        if c == "I":
            icount += 1
            continue
        if c != " ":
            continue
        kind = line[1]
        addr_s, size_s = line[3:].split(",")
        addr = int(addr_s, 16)
        if lo <= addr < hi:
            q = layout.queue(addr)
            if q is None:
                continue
            size = int(size_s)
            fld = q.field(addr)
            write = kind in "SM"
            for ln in range(addr // LINE, (addr + size - 1) // LINE + 1):
                if pf is not None:
                    model.access(side, ln, pf == "prefetchw", fld, icount, prefetch=True)
                else:
                    if kind == "M":
                        model.access(side, ln, False, fld, icount)
                    model.access(side, ln, write, fld, icount)
            continue
        m = marks.get(addr)
        if m is None or kind != "S":
            continue
        if m == "device":
            side = DEVICE
        elif m == "driver":
            side = DRIVER
        elif m == "begin":
            model.counting = True
        elif m == "end":
            model.counting = False
        elif m in ("prefetch", "prefetchw"):
            pf = m
        elif m == "prefetch_end":
            pf = None
    return model


def summary(model: Model, packets: int) -> dict:
    """Per-packet figures: by side and kind, by side and structure, and the prefetches."""
    n = max(packets, 1)
    out: dict = {"packets": packets}
    for s in SIDES:
        by_kind = Counter()
        by_field = Counter()
        for (side, kind, fld), v in model.moved.items():
            if side == s:
                by_kind[kind] += v
                by_field[fld] += v
        out[s] = {
            "read": by_kind["read"] / n,
            "rfo": by_kind["rfo"] / n,
            "upgrade": by_kind["upgrade"] / n,
            "total": sum(by_kind.values()) / n,
            "fields": {f: v / n for f, v in sorted(by_field.items())},
            "prefetched": sum(v for (side, _), v in model.prefetched.items() if side == s) / n,
            "idle_prefetches": model.idle_prefetches[s] / n,
        }
    d = sorted(model.distances)
    out["prefetch_distance"] = {
        "uses": len(d),
        "min": d[0] if d else None,
        "median": d[len(d) // 2] if d else None,
        "max": d[-1] if d else None,
    }
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        layout = Layout.parse(f.read())
    if not layout.queues or not layout.marks or not layout.packets:
        print(f"coherence.py: {argv[1]} lacks the harness's marks, queues or packets", file=sys.stderr)
        return 1
    with open(argv[2], errors="replace") as f:
        model = run(layout, f)
    print(json.dumps(summary(model, layout.packets)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
