#!/usr/bin/env bash
# The tap's two directions with and without io_uring batching, 64-byte frames, on the host
# kernel: `pvnet switch` A writes a gen port's frames into tap pvb0 (pvnet -> kernel), a Linux
# bridge floods them to tap pvb1, and `pvnet switch` B reads them from pvb1 into a sink port
# (kernel -> pvnet). A on CPU 0, B on CPU 1. Per run: A's tap writes accepted per second, B's
# tap reads per second, syscalls per packet on each side (`read`/`writev`/`io_uring_enter`),
# from `pvnet ctl` counters sampled over the measured window. IO="syscall uring" interleaved.
#
# Usage: scripts/peers/bench_tap.sh     Env: ROUNDS=3 DUR=5 (measured s) WARM=1 IO="syscall uring"
#        DOC=docs/egress.md (table written between the bench:tap markers; DOC= to skip)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-5}"; WARM="${WARM:-1}"; IO="${IO:-syscall uring}"
DOC="${DOC-docs/egress.md}"
[ "$(id -u)" = 0 ] || { echo "needs root (taps, a bridge)" >&2; exit 1; }
cargo build -q --release -p pvnet
BIN=target/release/pvnet
W=$(mktemp -d); BR=pvbbr
cleanup() {
  pkill -f "$W/ctl" 2>/dev/null || true
  ip link del "$BR" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
ip link del "$BR" 2>/dev/null || true
ip link add "$BR" type bridge stp_state 0
ip link set "$BR" up

cputicks() { # pid -> utime+stime (clock ticks)
  awk '{print $14 + $15}' "/proc/$1/stat"
}

counter() { # socket port-name counter
  "$BIN" ctl --socket "$1" ports --json | python3 -c "
import json,sys
d=json.load(sys.stdin)
p=[p for p in d['ports'] if p['name']=='$2'][0]
print(p['counters'].get('$3',0))"
}

results=()
for r in $(seq 1 "$ROUNDS"); do
  for io in $IO; do
    tag="$io-$r"
    "$BIN" switch --port "tap:name=t,ifname=pvb1,io=$io" --port sink:name=s --cpu 1 \
      --ctl-socket "$W/ctl.b.$tag" --duration $((DUR + WARM + 3)) > "$W/b.$tag.json" 2> "$W/b.$tag.log" &
    bpid=$!
    for _ in $(seq 50); do [ -S "$W/ctl.b.$tag" ] && ip link show pvb1 >/dev/null 2>&1 && break; sleep 0.1; done
    ip link set pvb1 master "$BR"
    "$BIN" switch --port "tap:name=t,ifname=pvb0,io=$io" --port gen:name=g,delay=0.5 --cpu 0 \
      --ctl-socket "$W/ctl.a.$tag" --duration $((DUR + WARM + 2)) > "$W/a.$tag.json" 2> "$W/a.$tag.log" &
    apid=$!
    for _ in $(seq 50); do [ -S "$W/ctl.a.$tag" ] && ip link show pvb0 >/dev/null 2>&1 && break; sleep 0.1; done
    ip link set pvb0 master "$BR"
    sleep "$WARM"; sleep 0.5
    a0=$(counter "$W/ctl.a.$tag" t tx_packets); as0=$(counter "$W/ctl.a.$tag" t syscalls)
    b0=$(counter "$W/ctl.b.$tag" t rx_packets); bs0=$(counter "$W/ctl.b.$tag" t syscalls)
    ac0=$(cputicks "$apid"); bc0=$(cputicks "$bpid")
    t0=$(date +%s.%N); sleep "$DUR"; t1=$(date +%s.%N)
    ac1=$(cputicks "$apid"); bc1=$(cputicks "$bpid")
    a1=$(counter "$W/ctl.a.$tag" t tx_packets); as1=$(counter "$W/ctl.a.$tag" t syscalls)
    b1=$(counter "$W/ctl.b.$tag" t rx_packets); bs1=$(counter "$W/ctl.b.$tag" t syscalls)
    wait "$apid" || true; wait "$bpid" || true
    hz=$(getconf CLK_TCK)
    line=$(python3 -c "
dt=$t1-$t0; a=$a1-$a0; b=$b1-$b0
acpu=($ac1-$ac0)/$hz*1e9/max(a,1); bcpu=($bc1-$bc0)/$hz*1e9/max(b,1)
print(f'RESULT io=$io round=$r write_mpps={a/dt/1e6:.3f} write_syscalls_per_pkt={($as1-$as0)/max(a,1):.3f} write_cpu_ns_per_pkt={acpu:.0f} read_mpps={b/dt/1e6:.3f} read_syscalls_per_pkt={($bs1-$bs0)/max(b,1):.3f} read_cpu_ns_per_pkt={bcpu:.0f}')")
    echo "$line"; results+=("$line")
  done
done

table=$(printf '%s\n' "${results[@]}" | python3 -c "
import sys, statistics as st
rows={}
for l in sys.stdin:
    kv=dict(x.split('=') for x in l.split()[1:])
    rows.setdefault(kv['io'],[]).append(kv)
def med(io,k): return st.median(float(r[k]) for r in rows[io])
print('| tap io | pvnet -> kernel Mpps (writes) | syscalls/pkt | CPU ns/pkt (writer, kernel work included) | kernel -> pvnet Mpps (reads) | syscalls/pkt | CPU ns/pkt (reader) | runs |')
print('|---|---|---|---|---|---|---|---|')
for io in rows:
    print(f'| {io} | {med(io,\"write_mpps\"):.3f} | {med(io,\"write_syscalls_per_pkt\"):.3f} | {med(io,\"write_cpu_ns_per_pkt\"):.0f} | {med(io,\"read_mpps\"):.3f} | {med(io,\"read_syscalls_per_pkt\"):.3f} | {med(io,\"read_cpu_ns_per_pkt\"):.0f} | {len(rows[io])} |')
if 'uring' in rows and 'syscall' in rows:
    print()
    u = lambda k: med('uring', k) / med('syscall', k)
    print(f'uring / syscall (medians): writes {u(\"write_mpps\"):.2f}x Mpps, {u(\"write_cpu_ns_per_pkt\"):.2f}x CPU ns/pkt; reads {u(\"read_mpps\"):.2f}x Mpps, {u(\"read_cpu_ns_per_pkt\"):.2f}x CPU ns/pkt')
")
printf '%s\n' "$table"
[ -z "$DOC" ] && exit 0
stamp="$(date -u +%Y-%m-%d) ($(nproc) CPUs, $(git rev-parse --short HEAD)), \`ROUNDS=$ROUNDS DUR=$DUR scripts/peers/bench_tap.sh\`"
printf '%s\n' "$table" > "$W/table"
python3 - "$DOC" "$stamp" "$W/table" <<'PY'
import sys
doc, stamp, body = sys.argv[1], sys.argv[2], open(sys.argv[3]).read().strip()
s = open(doc).read()
a, b = "<!-- bench:tap -->", "<!-- /bench:tap -->"
i, j = s.index(a) + len(a), s.index(b)
s = s[:i] + "\n_Run " + stamp + "_\n\n" + body + "\n" + s[j:]
open(doc, "w").write(s)
PY
echo "written to $DOC"
