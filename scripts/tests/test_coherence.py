"""Tests of the coherence count's model and trace reader (scripts/coherence.py).

Run: python3 -m pytest scripts/tests (or python3 scripts/tests/test_coherence.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import coherence as c

MARKS = 0x1000
DESC, AVAIL, USED, BUFS = 0x10000, 0x11000, 0x12000, 0x13000


def layout(packets: int = 1) -> c.Layout:
    text = "\n".join([
        f"marks {MARKS:#x} 64",
        f"queue fe0.tx Split {DESC:#x} {AVAIL:#x} {USED:#x} {BUFS:#x} 2048 256 {BUFS + 256 * 2048:#x}",
        f"packets {packets}",
    ])
    return c.Layout.parse(text)


def mark(name: str) -> str:
    return f" S {MARKS + 64 * c.MARKS.index(name):x},8"


def access(kind: str, addr: int, size: int = 8) -> str:
    return f" {kind} {addr:x},{size}"


def run(lines: list[str], packets: int = 1) -> dict:
    model = c.run(layout(packets), [*lines])
    return c.summary(model, packets)


def test_a_line_written_by_one_side_and_read_by_the_other_moves_once():
    d = run([mark("begin"), mark("driver"), access("S", DESC), mark("device"),
             access("L", DESC), access("L", DESC + 8), mark("end")])
    assert d["device"]["read"] == 1
    assert d["device"]["fields"] == {"tx.desc": 1}
    assert d["driver"]["total"] == 0  # first touch: cold, not counted


def test_writing_a_shared_line_is_an_upgrade_and_an_owned_one_an_rfo():
    d = run([mark("driver"), access("S", USED + 8), mark("device"), access("L", USED + 8),
             mark("begin"),
             access("S", USED + 8),  # shared: upgrade
             mark("driver"), access("S", USED + 16),  # owned by the device: RFO
             mark("end")])
    assert d["device"]["upgrade"] == 1
    assert d["driver"]["rfo"] == 1
    assert d["device"]["fields"] == {"tx.used_ring": 1}


def test_nothing_outside_the_window_or_the_rings_counts():
    d = run([mark("driver"), access("S", DESC), mark("device"), access("L", DESC),
             mark("begin"), access("L", 0x9999000), mark("end"),
             mark("driver"), access("S", DESC)])
    assert d["device"]["total"] == 0 and d["driver"]["total"] == 0


def test_a_prefetch_takes_the_transfer_and_the_use_measures_how_far_ahead():
    d = run([mark("driver"), access("S", BUFS + 64), mark("begin"), mark("device"),
             mark("prefetchw"), access("L", BUFS + 64, 1), mark("prefetch_end"),
             "I  0401000,3", "I  0401003,3",
             access("S", BUFS + 70), mark("end")])
    assert d["device"]["rfo"] == 1  # a prefetch for writing takes the line owned
    assert d["device"]["prefetched"] == 1
    assert d["device"]["upgrade"] == 0  # the store then hits
    assert d["prefetch_distance"]["median"] == 2


def test_an_access_across_two_lines_touches_both():
    d = run([mark("driver"), access("S", BUFS + 60, 8), mark("begin"), mark("device"),
             access("L", BUFS + 60, 8), mark("end")])
    assert d["device"]["read"] == 2
    assert d["device"]["fields"] == {"tx.hdr": 2}  # attributed to the first byte's field


def test_fields_of_a_split_ring():
    q = layout().queues[0]
    assert q.field(AVAIL + 2) == "tx.avail_idx"
    assert q.field(AVAIL + 4) == "tx.avail_ring"
    assert q.field(AVAIL + 4 + 2 * 256) == "tx.used_event"
    assert q.field(USED) == "tx.used_idx"
    assert q.field(USED + 4 + 8 * 256) == "tx.avail_event"
    assert q.field(BUFS + 2048 + 63) == "tx.hdr"
    assert q.field(BUFS + 2048 + 64) == "tx.data"


if __name__ == "__main__":
    for name, f in list(globals().items()):
        if name.startswith("test_"):
            f()
    print("ok")
