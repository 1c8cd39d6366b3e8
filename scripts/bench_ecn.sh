#!/usr/bin/env bash
# scripts/bench_ecn.sh - fq_codel's ECN marking end to end: a UDP flow from one network
# namespace to another through `pvnet switch` (two AF_PACKET ports), the far port's veth
# rate-limited (tbf) so that the backlog stands in that port's egress queue
# (qdisc=fq_codel, a small sndbuf: as crates/dataplane/src/switch/kernel_egress_tests.rs),
# once with the flow ECN-capable (iperf3 --tos 2: ECT(0)) and once not (--tos 0). Prints, per
# run, what CoDel did at the port: packets marked CE (ecn_marked) and dropped (aqm), with
# queued = dequeued + queue_limit + aqm checked; and how many frames the far end received
# with CE set (counted there by an nftables-free packet socket: scripts/lib/bench_ecn.py).
# A benchmark, not a test: nothing is asserted but the counts adding up.
#
# Everything in namespaces this run makes and deletes (scripts/lib/common.sh netns_new):
# S holds the switch and the veths' switch ends, A the sender (10.230.0.1), B the receiver.
# Usage: scripts/bench_ecn.sh   Env: RATE=50mbit OFFER=80M DUR=6 TOS="2 0"
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_root
RATE="${RATE:-50mbit}"; OFFER="${OFFER:-80M}"; DUR="${DUR:-6}"; TOS="${TOS:-2 0}"
build_pvnet
B="$WORK/ecn"; rm -rf "$B"; mkdir -p "$B"
SW=
cleanup() { [ -n "$SW" ] && stop_pid "$SW" INT; netns_cleanup; return 0; }
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

netns_new ecns; S=$NS; netns_new ecna; A=$NS; netns_new ecnb; R=$NS
ip -n "$S" link add a1 type veth peer name a0 netns "$A"
ip -n "$S" link add b1 type veth peer name b0 netns "$R"
ip -n "$S" link set a1 up; ip -n "$S" link set b1 up
ip -n "$A" addr add 10.230.0.1/24 dev a0; ip -n "$A" link set a0 up
ip -n "$R" addr add 10.230.0.2/24 dev b0; ip -n "$R" link set b0 up
# The kernel's partial checksums would reach pvnet's AF_PACKET ports unfinished otherwise.
ip netns exec "$A" ethtool -K a0 tx off tso off gso off > /dev/null
ip netns exec "$R" ethtool -K b0 tx off tso off gso off > /dev/null
ip netns exec "$S" tc qdisc add dev b1 root tbf rate "$RATE" burst 4k limit 4m

for tos in $TOS; do
  log "tos $tos: iperf3 -u -b $OFFER for ${DUR}s into a $RATE line"
  ip netns exec "$S" timeout $((DUR + 20)) "$PVNET_BIN" switch --cpu 1 --secs $((DUR + 4)) \
    --port af-packet:name=pa,ifname=a1 --port "af-packet:name=pb,ifname=b1,qdisc=fq_codel,sndbuf=24576" \
    > "$B/sw.$tos.json" 2> "$B/sw.$tos.log" & SW=$!
  sleep 1
  ip netns exec "$R" timeout $((DUR + 10)) python3 "$PYLIB/bench_ecn.py" count b0 $((DUR + 2)) > "$B/ce.$tos.txt" &
  cnt=$!
  ip netns exec "$A" ping -c 1 -W 2 10.230.0.2 > /dev/null || die "no ping through the switch"
  ip netns exec "$R" iperf3 -s -1 -B 10.230.0.2 > /dev/null 2>&1 &
  sleep 0.5
  ip netns exec "$A" iperf3 -c 10.230.0.2 -u -b "$OFFER" --tos "$tos" -t "$DUR" -J > "$B/iperf.$tos.json"
  wait "$cnt" || true
  wait "$SW" || true; SW=
  python3 "$PYLIB/bench_ecn.py" report "$tos" "$B/sw.$tos.json" "$B/iperf.$tos.json" "$B/ce.$tos.txt"
done
