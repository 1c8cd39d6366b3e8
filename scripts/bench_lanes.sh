#!/usr/bin/env bash
# scripts/bench_lanes.sh - an AF_XDP port spread over two workers (a lane each) against the same
# port on one worker, sending to the wire: `pvnet switch --workers 2` (CPUs 0 and 1) with two gen
# ports, one placed on each worker, writing 64-byte frames to a host on the far side of an af-xdp
# port on a two-queue veth (docs/afxdp.md). lanes=auto: each worker sends its gen's frames out of
# its own lane's queue (the kernel's transmit work, the veth's copy to its peer, on each
# worker's CPU); lanes=1: the port's one lane is on worker 0, and worker 1's frames cross the
# trunk to it first. A benchmark, not a test: it prints figures and ratios, and fails only when
# a run breaks.
#
# The far host's address is learned before the gens start (a frame from it, so that nothing is
# flooded); its frames are dropped by the far end's stack (not addressed to it). Per run: the
# core-to-core state (`pvnet limits` before and after), the packets the wire port sent per
# second (its lanes' sum) over the window, and the switch's CPU time (all its threads) per
# packet. Runs interleave lanes=1 and lanes=auto, ROUNDS rounds; each round's pair compared
# when both runs were in one c2c state. Everything lives in a network namespace of this run's.
#
# Usage: scripts/bench_lanes.sh   Env: ROUNDS=5 DUR=5 (measured s) WARM=1
#        DOC=docs/afxdp.md (section between the bench:lanes markers; DOC= to skip)
# Wall time: ~(DUR + WARM + 5) s per run: ~2 min with the defaults.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_root
ROUNDS="${ROUNDS:-5}"; DUR="${DUR:-5}"; WARM="${WARM:-1}"
DOC="${DOC-$PVNET_ROOT/docs/afxdp.md}"
build_pvnet
B="$WORK/lanes"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; BIN="$B/pvnet"
RES="$B/results.txt"; : > "$RES"
pid=
cleanup() {
  [ -n "$pid" ] && stop_pid "$pid" INT
  netns_cleanup   # the veth goes with it (and the XDP program)
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

netns_new benchlanes; HNS=$NS
ipn() { ip -n "$HNS" "$@"; }
ipn link add pvl0 numtxqueues 2 numrxqueues 2 type veth peer name pvl0p numtxqueues 2 numrxqueues 2
ipn link set pvl0 up; ipn link set pvl0p up
FAR=02:00:00:00:00:99
snap() { "$BIN" ctl --ctl-socket "$1" --json 2>/dev/null | python3 "$PYLIB/bench_lanes.py" snap w; }
# learn : a frame from the far host's address, in through the veth (the switch learns where it is).
learn() {
  ip netns exec "$HNS" python3 -c '
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("pvl0p", 0))
s.send(b"\xff" * 6 + bytes.fromhex(sys.argv[1].replace(":", "")) + b"\x88\xb5" + bytes(46))' "$FAR"
}

for r in $(seq 1 "$ROUNDS"); do
  for cfg in one auto; do
    tag="$cfg-$r"
    lanes=$([ "$cfg" = one ] && echo 1 || echo auto)
    NO_COLOR=1 PVNET_LOG=info ip netns exec "$HNS" "$BIN" switch --workers 2 --cpu 0 \
      --port "af-xdp:name=w,ifname=pvl0,queues=2,mode=native,lanes=$lanes" \
      --port "gen:name=g0,delay=1,src=02:00:00:00:01:01,dst=$FAR" \
      --port "gen:name=g1,delay=1,src=02:00:00:00:01:02,dst=$FAR" \
      --ctl-socket "$B/ctl.$tag" --secs $((DUR + WARM + 4)) > "$B/$tag.json" 2> "$B/$tag.log" &
    pid=$!
    wait_sock "$B/ctl.$tag"
    cb=$(c2c_ns)
    learn; sleep 0.2; learn
    sleep 1; sleep "$WARM"
    c0=$(cpu_ns "$pid"); read -r n0 _ < <(snap "$B/ctl.$tag")
    t0=$(date +%s.%N); sleep "$DUR"; t1=$(date +%s.%N)
    c1=$(cpu_ns "$pid"); read -r n1 lanes_tx < <(snap "$B/ctl.$tag")
    "$BIN" ctl --ctl-socket "$B/ctl.$tag" --json > "$B/$tag.ctl.json" 2>/dev/null || true
    kill -INT "$pid" 2>/dev/null || true; wait "$pid" || true; pid=
    ca=$(c2c_ns)
    line=$(python3 "$PYLIB/bench_lanes.py" result "$cfg" "$r" "$cb/$ca" "$t0" "$t1" "$n0" "$n1" "$c0" "$c1")
    echo "$line lanes_tx=${lanes_tx// /,}" | tee -a "$RES"
    [ "$n1" -gt "$n0" ] || { log "nothing sent in run $tag: see $B/$tag.log"; exit 1; }
  done
done

SUM="$B/summary.md"
python3 "$PYLIB/bench_lanes.py" summary "$RES" "$SUM" > /dev/null
cat "$SUM"
[ -z "$DOC" ] && exit 0
doc_results "$DOC" "bench:lanes" "ROUNDS=$ROUNDS DUR=$DUR scripts/bench_lanes.sh" "$SUM" "$RES"
