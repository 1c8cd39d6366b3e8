#!/usr/bin/env python3
"""pvnet's JSON reports, read in one place.

`pvnet switch`, `pvnet backend` and `pvnet frontend` print JSON lines on stdout: a `{"ready":
...}` line when they start and a `{"final": ...}` line with their counters when they end.
`pvnet ctl ... --json` prints the running switch's ports (and workers), `pvnet limits` the
machine's figures. The scripts read single fields from the shell through the commands below;
the benchmark modules import the functions.

    pvnet_report.py c2c                     < `pvnet limits` : the c2c hand-off, ns ("%.0f")
    pvnet_report.py port0 FILE PATH         FIELD (dotted) of port 0 of FILE's final report
    pvnet_report.py port FILE PORT COUNTER  a counter of the port named PORT in FILE's final
    pvnet_report.py drops FILE PORT         the sum of that port's drops_* counters
    pvnet_report.py drops-by FILE PORT      its drops by reason, "queue_limit=N aqm=M" (or "none")
    pvnet_report.py final FILE PATH         a field (dotted) of FILE's final report
    pvnet_report.py ready FILE PATH         a field (dotted) of FILE's first (ready) line
    pvnet_report.py ctl-port PORT COUNTER [DEFAULT]  < `pvnet ctl ports --json`
    pvnet_report.py ctl-state PORT          < `pvnet ctl ports --json`: the port's state
    pvnet_report.py ctl-worker PORT         < `pvnet ctl ports --json`: the port's worker
    pvnet_report.py ctl-up                  < `pvnet ctl ports --json`: ports that are up

A final report or port that is not there prints "missing"; a counter the port lacks "none"
(port, ctl-port without DEFAULT). `final` and `ready` exit non-zero when the field is absent.

The benchmark scripts' own lines (`RESULT key=value ...`) are read here too ([`fields`],
[`results`]), and their tables written ([`write_table`]).
"""

import json
import sys

MISSING = "missing"


def fields(line):
    """The key=value fields of a benchmark line (its first word, e.g. RESULT, is its kind)."""
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def state(c2c_ns):
    """A run's c2c state from its "before/after" probes: fast < 75 ns <= mid < 150 ns <= slow
    when both are in one, else mixed (a failed probe, "nan", counts as slow)."""
    a, b = (float(x) if x != "nan" else 1e9 for x in c2c_ns.split("/"))

    def bucket(ns):
        return "fast" if ns < 75 else "mid" if ns < 150 else "slow"

    return bucket(a) if bucket(a) == bucket(b) else "mixed"


def results(lines):
    """The fields of every RESULT line among LINES."""
    return [fields(line) for line in lines if line.startswith("RESULT")]


def write_table(out, path):
    """A table's lines OUT: written to PATH and printed."""
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))


def finals(path):
    """Every final report in FILE (one per process, in order)."""
    with open(path, errors="replace") as f:
        return [json.loads(line)["final"] for line in f if line.startswith('{"final"')]


def final(path):
    """FILE's last final report, or None."""
    f = finals(path)
    return f[-1] if f else None


def dig(x, path):
    """x's field at the dotted PATH ("drops.no_buffer", "ports.0"), or None."""
    for k in path.split("."):
        if isinstance(x, dict):
            x = x.get(k)
        elif isinstance(x, list) and k.isdigit() and int(k) < len(x):
            x = x[int(k)]
        else:
            return None
    return x


def port_named(report, name):
    """The port called NAME in a final report or a `pvnet ctl ports --json` answer, or None."""
    ports = report["ports"] if isinstance(report, dict) else report
    return next((p for p in ports if p["name"] == name), None)


def counters(report, name):
    """The counters of the port called NAME (a KeyError-free {} when there is none)."""
    p = port_named(report, name)
    return p.get("counters", p) if p else {}


def drops(ctrs):
    """The sum of a port's drops_* counters."""
    return sum(v for k, v in ctrs.items() if k.startswith("drops_"))


def port0(path, field):
    """json_port: FIELD (dotted) of port 0 of FILE's final report; "missing", "none"."""
    f = final(path)
    if f is None or not f["ports"]:
        return MISSING
    x = dig(f["ports"][0], field)
    return "none" if x is None else str(x)


def port_counter(path, name, counter):
    """sw_final: a counter of the port NAME in FILE's final report; "missing", "none"."""
    f = final(path)
    p = port_named(f, name) if f else None
    return MISSING if p is None else str(p["counters"].get(counter, "none"))


def c2c(text):
    """The c2c hand-off of a `pvnet limits` answer, in whole ns."""
    return "%.0f" % json.loads(text)["c2c_ns"]


def _field(x, path):
    v = dig(x, path)
    if v is None:
        sys.exit(MISSING)
    return str(v)


def main(argv):
    cmd, args = argv[0], argv[1:]
    if cmd == "c2c":
        print(c2c(sys.stdin.read()))
    elif cmd == "port0":
        print(port0(*args))
    elif cmd == "port":
        print(port_counter(*args))
    elif cmd == "drops":
        f = final(args[0])
        p = port_named(f, args[1]) if f else None
        if p is not None:
            print(drops(p["counters"]))
    elif cmd == "drops-by":
        f = final(args[0])
        p = port_named(f, args[1]) if f else None
        if p is not None:
            print(" ".join("%s=%d" % (k[6:], v) for k, v in p["counters"].items() if k.startswith("drops_") and v) or "none")
    elif cmd == "final":
        print(_field(final(args[0]), args[1]))
    elif cmd == "ready":
        with open(args[0]) as f:
            print(_field(json.loads(f.readline())["ready"], args[1]))
    elif cmd == "ctl-port":
        p = port_named(json.load(sys.stdin), args[0])
        if p is None:
            print(MISSING)
        else:
            print(p.get("counters", p).get(args[1], args[2] if len(args) > 2 else "none"))
    elif cmd == "ctl-state":
        p = port_named(json.load(sys.stdin), args[0])
        print(p.get("state", "none") if p else MISSING)
    elif cmd == "ctl-worker":
        w = [w["worker"] for w in json.load(sys.stdin).get("workers", []) if args[0] in w["ports"]]
        print(w[0] if w else "none")
    elif cmd == "ctl-up":
        print(sum(p["state"] == "up" for p in json.load(sys.stdin)["ports"]))
    else:
        sys.exit("pvnet_report.py: unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
