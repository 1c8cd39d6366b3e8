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
# (scripts/lib/common.sh netns_new), never in the machine's own.
#
# Usage: scripts/peers/bench_tap.sh     Env: ROUNDS=3 DUR=5 (measured s) WARM=1
#        IO="syscall uring" DEVS="tap af-packet"
#        DOC=docs/egress.md (table written between the bench:tap markers; DOC= to skip)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/common.sh
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
  "$BIN" ctl --ctl-socket "$1" ports --json | python3 "$PYLIB/pvnet_report.py" ctl-port "$2" "$3" 0
}

results=()
for r in $(seq 1 "$ROUNDS"); do
  for dev in $DEVS; do
    for io in $IO; do
      tag="$dev-$io-$r"
      if [ "$dev" = tap ]; then pa="tap:name=t,ifname=pvb0,io=$io"; pb="tap:name=t,ifname=pvb1,io=$io"
      else pa="af-packet:name=t,ifname=pvx0,io=$io"; pb="af-packet:name=t,ifname=pvx1,io=$io"; fi
      ip netns exec "$HNS" "$BIN" switch --port "$pb" --port sink:name=s --cpu 1 \
        --ctl-socket "$W/ctl.b.$tag" --secs $((DUR + WARM + 3)) > "$W/b.$tag.json" 2> "$W/b.$tag.log" &
      bpid=$!
      for _ in $(seq 50); do [ -S "$W/ctl.b.$tag" ] && break; sleep 0.1; done
      [ "$dev" = tap ] && ipn link set pvb1 master "$BR"
      ip netns exec "$HNS" "$BIN" switch --port "$pa" --port gen:name=g,delay=0.5 --cpu 0 \
        --ctl-socket "$W/ctl.a.$tag" --secs $((DUR + WARM + 2)) > "$W/a.$tag.json" 2> "$W/a.$tag.log" &
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
      line=$(python3 "$PYLIB/bench_tap.py" result "dev=$dev io=$io round=$r" "$t0" "$t1" "$hz" \
        "$a0" "$a1" "$as0" "$as1" "$ac0" "$ac1" "$b0" "$b1" "$bs0" "$bs1" "$bc0" "$bc1")
      echo "$line"; results+=("$line")
    done
  done
done

table=$(printf '%s\n' "${results[@]}" | python3 "$PYLIB/bench_tap.py" table)
printf '%s\n' "$table"
[ -z "$DOC" ] && exit 0
stamp="$(date -u +%Y-%m-%d) ($(nproc) CPUs, $(git rev-parse --short HEAD)), \`ROUNDS=$ROUNDS DUR=$DUR scripts/peers/bench_tap.sh\`"
printf '_Run %s_\n\n%s\n' "$stamp" "$table" > "$W/table"
python3 "$PYLIB/docsection.py" between "$DOC" "<!-- bench:tap -->" "<!-- /bench:tap -->" "$W/table"
echo "written to $DOC"
