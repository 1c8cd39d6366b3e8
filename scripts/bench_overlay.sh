#!/usr/bin/env bash
# scripts/bench_overlay.sh - frames between two `pvnet switch`es over VXLAN against the kernel's
# overlay path (its vxlan device + a bridge + a tap), 64 B and 1500 B, side by side in one run:
# packets per second delivered and CPU ns per packet (docs/overlay.md). A benchmark, not a
# test: it prints figures and ratios, and fails only when a run breaks.
#
# Two network namespaces of this run's (scripts/lib/common.sh netns_new), never the machine's
# own: A (10.240.0.1 on veth pvo0) and B (10.240.0.2 on pvo1), underlay MTU 1600 so that a
# 1500-byte frame fits behind the 50-byte encapsulation. `pvnet switch` A runs in A on CPU 0,
# `pvnet switch` B in B on CPU 1. The same traffic source for both paths, a gen port's frames
# at full rate; the same sink at the end of both paths.
#   decap (A -> B): A's gen -> A's vxlan port (pvnet encapsulates) -> veth -> B's end:
#     pvnet   B's vxlan port -> sink
#     pvnet-dgram  the same, both pvnet ports with gso=false,gro=false (a datagram per send
#             and per read: the per-datagram path, what a NIC without USO/GRO leaves)
#     pvnet-vlan   pvnet with every frame tagged across the tunnel: the gen and the sink
#             access ports of VLAN 10, both vxlan ports trunks of it (the tag inserted at A's
#             or B's sender, removed at the receiver): a tag's cost against `pvnet`
#     kernel  the kernel's vxlan device vx0 -> bridge -> tap pvk0 -> B's tap port -> sink
#   encap (B -> A): B's gen -> B's end -> veth -> A's vxlan port -> sink:
#     pvnet   B's vxlan port (pvnet encapsulates)
#     kernel  B's tap port -> tap pvk0 -> bridge -> vx0 (the kernel encapsulates)
# Per run: the sink's packets per second over the measured window; CPU ns per packet of the
# whole machine (both CPUs' busy time from /proc/stat, softirqs included: the kernel's path
# does its work there) and of each switch process (/proc/<pid>/task/*/schedstat); the
# source's rate (what it made; more than the sink took: the difference was dropped in the
# kernel or refused). The core-to-core hand-off time (`pvnet limits` c2c_ns) is probed before
# and after each run: pair runs within one state (docs/bench.md). Runs interleave the paths,
# ROUNDS rounds; medians.
#
# Usage: scripts/bench_overlay.sh   Env: ROUNDS=3 DUR=5 (measured s) WARM=1 SIZES="64 1500"
#        CFGS="pvnet pvnet-dgram kernel" (and pvnet-vlan) DIRS="decap encap" POLICY=adaptive (both switches' --policy)
#        DOC=docs/overlay.md (section between the bench:overlay markers; DOC= to skip)
#        QUIET_PCT=15 QUIET_WAIT=20: wait for the CPUs to be that quiet before each run
# Wall time: ~(DUR + WARM + 8) s per run plus two c2c probes: ~6 min with the defaults.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_root
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-5}"; WARM="${WARM:-1}"; SIZES="${SIZES:-64 1500}"
CFGS="${CFGS:-pvnet pvnet-dgram kernel}"; DIRS="${DIRS:-decap encap}"; POLICY="${POLICY:-adaptive}"
QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-20}"
DOC="${DOC-$PVNET_ROOT/docs/overlay.md}"
build_pvnet
B="$WORK/overlay"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; BIN="$B/pvnet"; PVNET_BIN="$BIN"
RES="$B/results.txt"; : > "$RES"
apid=; bpid=
cleanup() {
  [ -n "$apid" ] && stop_pid "$apid" INT
  [ -n "$bpid" ] && stop_pid "$bpid" INT
  netns_cleanup   # the veths, vx0, the bridge and the tap go with them
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

netns_new ovla; NSA=$NS
netns_new ovlb; NSB=$NS
ip -n "$NSA" link add pvo0 type veth peer name pvo1 netns "$NSB"
ip -n "$NSA" link set pvo0 mtu 1600; ip -n "$NSB" link set pvo1 mtu 1600
ip -n "$NSA" addr add 10.240.0.1/24 dev pvo0; ip -n "$NSB" addr add 10.240.0.2/24 dev pvo1
ip -n "$NSA" link set pvo0 up; ip -n "$NSB" link set pvo1 up
# Both ends as the kernel sets them up (checksum offload on: pvnet's segmented sends need
# it; the bench frames carry no checksum to complete).
ip -n "$NSB" link add pvobr type bridge stp_state 0
ip -n "$NSB" link set pvobr up

# kernel_up / kernel_down : the kernel's path in B (vx0 bridged; the tap joins once B made it).
kernel_up() {
  ip -n "$NSB" link add vx0 type vxlan id 1 local 10.240.0.2 remote 10.240.0.1 dstport 4789 dev pvo1
  ip -n "$NSB" link set vx0 master pvobr; ip -n "$NSB" link set vx0 up
}
kernel_down() { ip -n "$NSB" link del vx0 2> /dev/null || true; }

# snap SOCKET PORT : "rx_packets tx_packets drops" of PORT.
snap() { "$BIN" ctl --ctl-socket "$1" --json 2>/dev/null | python3 "$PYLIB/bench_overlay.py" snap "$2"; }
# sys_ns : both CPUs' busy time since boot, nanoseconds (everything but idle and iowait).
sys_ns() { awk -v hz="$(getconf CLK_TCK)" '/^cpu /{printf "%.0f", ($2+$3+$4+$7+$8+$9) * 1e9 / hz}' /proc/stat; }

VXA="vxlan:name=t,local=10.240.0.1,remote=10.240.0.2,vni=1"
VXB="vxlan:name=t,local=10.240.0.2,remote=10.240.0.1,vni=1"
TAPB="tap:name=t,ifname=pvk0,mtu=1550"

# start_b TAG CFG PORTS / start_a TAG PORT SUFFIX : switch B (in B, CPU 1: PORTS, two --port
# specs in one word) / switch A (in A, CPU 0: its vxlan port, SUFFIX appended, and PORT); set
# bpid / apid.
start_b() {
  # shellcheck disable=SC2086  # $3: two --port specs
  NO_COLOR=1 PVNET_LOG=info ip netns exec "$NSB" "$BIN" switch --port $3 --cpu 1 --policy "$POLICY" \
    --ctl-socket "$B/ctl.b.$1" --secs $((DUR + WARM + 8)) > "$B/b.$1.json" 2> "$B/b.$1.log" &
  bpid=$!
  wait_sock "$B/ctl.b.$1"
  if [ "$2" = kernel ]; then ip -n "$NSB" link set pvk0 master pvobr; fi
}
start_a() {
  NO_COLOR=1 PVNET_LOG=info ip netns exec "$NSA" "$BIN" switch --port "$VXA$3" --port "$2" --cpu 0 --policy "$POLICY" \
    --ctl-socket "$B/ctl.a.$1" --secs $((DUR + WARM + 8)) > "$B/a.$1.json" 2> "$B/a.$1.log" &
  apid=$!
  wait_sock "$B/ctl.a.$1"
}

# run_one DIR CFG SIZE ROUND : one run; appends a RESULT line.
run_one() {
  local dir="$1" cfg="$2" size="$3" r="$4" tag="$1-$2-$3-$4" pa pb src dst c2c
  local gen="gen:name=g,delay=0.5,frame_len=$size" sink="sink:name=s" sfx=
  [ "$cfg" = pvnet-dgram ] && sfx=",gso=false,gro=false"
  if [ "$cfg" = pvnet-vlan ]; then sfx=",trunk=10"; gen="$gen,vlan=10"; sink="$sink,vlan=10"; fi
  if [ "$cfg" = kernel ]; then kernel_up; pb="$TAPB"; else kernel_down; pb="$VXB$sfx"; fi
  if [ "$dir" = decap ]; then pa="$gen"; pb="$pb --port $sink"; src=a; dst=b
  else pa="$sink"; pb="$pb --port $gen"; src=b; dst=a; fi
  wait_quiet; c2c=$(c2c_ns)
  # The receiving end first: what the source sends before it binds would be lost.
  if [ "$dst" = b ]; then start_b "$tag" "$cfg" "$pb"; start_a "$tag" "$pa" "$sfx"
  else start_a "$tag" "$pa" "$sfx"; start_b "$tag" "$cfg" "$pb"; fi
  sleep "$WARM"; sleep 0.5
  local ca0 cb0 s0 g0 k0 ca1 cb1 s1 g1 k1 t0 t1
  ca0=$(cpu_ns "$apid"); cb0=$(cpu_ns "$bpid"); s0=$(sys_ns)
  read -r g0 _ _ < <(snap "$B/ctl.$src.$tag" g); read -r _ k0 _ < <(snap "$B/ctl.$dst.$tag" s)
  t0=$(date +%s.%N); sleep "$DUR"; t1=$(date +%s.%N)
  ca1=$(cpu_ns "$apid"); cb1=$(cpu_ns "$bpid"); s1=$(sys_ns)
  read -r g1 _ _ < <(snap "$B/ctl.$src.$tag" g); read -r _ k1 _ < <(snap "$B/ctl.$dst.$tag" s)
  # The source first: what it sends while the receiver stops would count as dropped.
  if [ "$src" = a ]; then stop_pid "$apid" INT; apid=; stop_pid "$bpid" INT; bpid=
  else stop_pid "$bpid" INT; bpid=; stop_pid "$apid" INT; apid=; fi
  c2c="$c2c/$(c2c_ns)"
  kernel_down
  line=$(python3 "$PYLIB/bench_overlay.py" result "$dir" "$cfg" "$size" "$r" "$c2c" "$t0" "$t1" \
    "$g0" "$g1" "$k0" "$k1" "$s0" "$s1" "$ca0" "$ca1" "$cb0" "$cb1")
  echo "$line" | tee -a "$RES"
  [ "$k1" -gt "$k0" ] || { log "nothing delivered in run $tag: see $B/[ab].$tag.log"; exit 1; }
}

for r in $(seq 1 "$ROUNDS"); do
  for size in $SIZES; do
    for dir in $DIRS; do
      for cfg in $CFGS; do
        run_one "$dir" "$cfg" "$size" "$r"
      done
    done
  done
done

SUM="$B/summary.md"
python3 "$PYLIB/bench_overlay.py" summary "$RES" "$SUM" > /dev/null
cat "$SUM"
[ -z "$DOC" ] && exit 0
doc_results "$DOC" "bench:overlay" "ROUNDS=$ROUNDS DUR=$DUR POLICY=$POLICY scripts/bench_overlay.sh" "$SUM" "$RES"
