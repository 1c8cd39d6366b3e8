#!/usr/bin/env bash
# The kernel ports' two directions with and without io_uring batching, 64-byte frames, on the
# host kernel: `pvnet switch` A writes a gen port's frames into the kernel (pvnet -> kernel), a
# Linux bridge floods them on, and `pvnet switch` B reads them into a sink port (kernel ->
# pvnet). A on CPU 0, B on CPU 1. DEVS: `tap` (taps pvb0 and pvb1, bridged) and `af-packet`
# (AF_PACKET sockets on veths pvx0 and pvx1, whose peers are bridged). Per run: A's writes
# accepted per second, B's reads per second, syscalls per packet on each side
# (`read`/`writev`/`io_uring_enter`) and CPU ns per packet of each process, from `pvnet ctl`
# counters and /proc sampled over the measured window. IO="syscall uring" interleaved.
# The taps, veths, bridges and both switches live in a network namespace of this run's
# (scripts/peers/lib.sh netns_new), never in the machine's own.
#
# Usage: scripts/peers/bench_tap.sh     Env: ROUNDS=3 DUR=5 (measured s) WARM=1
#        IO="syscall uring" DEVS="tap af-packet"
#        DOC=docs/egress.md (table written between the bench:tap markers; DOC= to skip)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/peers/lib.sh
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-5}"; WARM="${WARM:-1}"; IO="${IO:-syscall uring}"; DEVS="${DEVS:-tap af-packet}"
DOC="${DOC-docs/egress.md}"
[ "$(id -u)" = 0 ] || { echo "needs root (taps, veths, a bridge)" >&2; exit 1; }
cargo build -q --release -p pvnet
BIN=target/release/pvnet
W=$(mktemp -d); BR=pvbbr; XBR=pvxbr   # one bridge per kind: nothing floods across
apid=; bpid=
cleanup() {
  stop_pid "$apid"; stop_pid "$bpid"
  netns_cleanup   # the bridges, veths and taps go with it
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM   # so that cleanup runs
netns_new benchtap; HNS=$NS
ipn() { ip -n "$HNS" "$@"; }
ipn link add "$BR" type bridge stp_state 0
ipn link set "$BR" up
if [[ " $DEVS " == *" af-packet "* ]]; then
  ipn link add "$XBR" type bridge stp_state 0
  ipn link set "$XBR" up
  for i in 0 1; do
    ipn link add "pvx$i" type veth peer name "pvx${i}p"
    ipn link set "pvx${i}p" master "$XBR"; ipn link set "pvx${i}p" up
  done
fi

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
  for dev in $DEVS; do
    for io in $IO; do
      tag="$dev-$io-$r"
      if [ "$dev" = tap ]; then pa="tap:name=t,ifname=pvb0,io=$io"; pb="tap:name=t,ifname=pvb1,io=$io"
      else pa="af-packet:name=t,ifname=pvx0,io=$io"; pb="af-packet:name=t,ifname=pvx1,io=$io"; fi
      ip netns exec "$HNS" "$BIN" switch --port "$pb" --port sink:name=s --cpu 1 \
        --ctl-socket "$W/ctl.b.$tag" --duration $((DUR + WARM + 3)) > "$W/b.$tag.json" 2> "$W/b.$tag.log" &
      bpid=$!
      for _ in $(seq 50); do [ -S "$W/ctl.b.$tag" ] && break; sleep 0.1; done
      [ "$dev" = tap ] && ipn link set pvb1 master "$BR"
      ip netns exec "$HNS" "$BIN" switch --port "$pa" --port gen:name=g,delay=0.5 --cpu 0 \
        --ctl-socket "$W/ctl.a.$tag" --duration $((DUR + WARM + 2)) > "$W/a.$tag.json" 2> "$W/a.$tag.log" &
      apid=$!
      for _ in $(seq 50); do [ -S "$W/ctl.a.$tag" ] && break; sleep 0.1; done
      [ "$dev" = tap ] && ipn link set pvb0 master "$BR"
      sleep "$WARM"; sleep 0.5
      a0=$(counter "$W/ctl.a.$tag" t tx_packets); as0=$(counter "$W/ctl.a.$tag" t syscalls)
      b0=$(counter "$W/ctl.b.$tag" t rx_packets); bs0=$(counter "$W/ctl.b.$tag" t syscalls)
      ac0=$(cputicks "$apid"); bc0=$(cputicks "$bpid")
      t0=$(date +%s.%N); sleep "$DUR"; t1=$(date +%s.%N)
      ac1=$(cputicks "$apid"); bc1=$(cputicks "$bpid")
      a1=$(counter "$W/ctl.a.$tag" t tx_packets); as1=$(counter "$W/ctl.a.$tag" t syscalls)
      b1=$(counter "$W/ctl.b.$tag" t rx_packets); bs1=$(counter "$W/ctl.b.$tag" t syscalls)
      wait "$apid" || true; wait "$bpid" || true; apid=; bpid=
      hz=$(getconf CLK_TCK)
      line=$(python3 -c "
dt=$t1-$t0; a=$a1-$a0; b=$b1-$b0
acpu=($ac1-$ac0)/$hz*1e9/max(a,1); bcpu=($bc1-$bc0)/$hz*1e9/max(b,1)
print(f'RESULT dev=$dev io=$io round=$r write_mpps={a/dt/1e6:.3f} write_syscalls_per_pkt={($as1-$as0)/max(a,1):.3f} write_cpu_ns_per_pkt={acpu:.0f} read_mpps={b/dt/1e6:.3f} read_syscalls_per_pkt={($bs1-$bs0)/max(b,1):.3f} read_cpu_ns_per_pkt={bcpu:.0f}')")
      echo "$line"; results+=("$line")
    done
  done
done

table=$(printf '%s\n' "${results[@]}" | python3 -c "
import sys, statistics as st
rows={}
for l in sys.stdin:
    kv=dict(x.split('=') for x in l.split()[1:])
    rows.setdefault((kv['dev'], kv['io']), []).append(kv)
def med(key, k): return st.median(float(r[k]) for r in rows[key])
print('| port | io | pvnet -> kernel Mpps (writes) | syscalls/pkt | CPU ns/pkt (writer, kernel work included) | kernel -> pvnet Mpps (reads) | syscalls/pkt | CPU ns/pkt (reader) | runs |')
print('|---|---|---|---|---|---|---|---|---|')
for key in rows:
    print('| %s | %s | %.3f | %.3f | %.0f | %.3f | %.3f | %.0f | %d |' % (key[0], key[1],
        med(key, 'write_mpps'), med(key, 'write_syscalls_per_pkt'), med(key, 'write_cpu_ns_per_pkt'),
        med(key, 'read_mpps'), med(key, 'read_syscalls_per_pkt'), med(key, 'read_cpu_ns_per_pkt'), len(rows[key])))
print()
for dev in dict.fromkeys(k[0] for k in rows):
    if (dev, 'uring') in rows and (dev, 'syscall') in rows:
        u = lambda k: med((dev, 'uring'), k) / med((dev, 'syscall'), k)
        print('%s, uring / syscall (medians): writes %.2fx Mpps, %.2fx CPU ns/pkt; reads %.2fx Mpps, %.2fx CPU ns/pkt  ' % (dev,
            u('write_mpps'), u('write_cpu_ns_per_pkt'), u('read_mpps'), u('read_cpu_ns_per_pkt')))
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
