#!/usr/bin/env python3
"""scripts/coherence.sh's rows, from scripts/coherence.py's JSON for one path.

    coherence_table.py row JSON LABEL PATH RING SIZE    the table's row
    coherence_table.py json JSON LABEL PATH RING SIZE   the figures as one JSON line, labelled
"""

import json
import sys


def row(d, label, path, ring, size):
    dv, dr = d["device"], d["driver"]
    med = d["prefetch_distance"]["median"]
    return "| %s | %s | %s | %s | %.2f | %.2f | %.2f | **%.2f** | %.2f | %s | %.2f | %.2f |" % (
        label, path, ring, size, dv["read"], dv["rfo"], dv["upgrade"],
        dv["total"], dv["prefetched"], "-" if med is None else med, dr["total"], dv["total"] + dr["total"],
    )  # fmt: skip


def labelled(d, label, path, ring, size):
    d = dict(d)
    d.update(label=label, path=path, ring=ring, size=int(size))
    return json.dumps(d)


def main(argv):
    cmd, src, label, path, ring, size = argv
    with open(src) as f:
        d = json.load(f)
    if cmd == "row":
        print(row(d, label, path, ring, size))
    elif cmd == "json":
        print(labelled(d, label, path, ring, size))
    else:
        sys.exit("coherence_table.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
