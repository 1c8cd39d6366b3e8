#!/usr/bin/env bash
# scripts/bench_afxdp.sh - the host's frames into `pvnet switch` through an AF_XDP port (native
# and generic XDP) against an AF_PACKET port (io_uring) and a tap, 64 B and 1500 B, side by side
# in one run: packets per second the receiving switch takes, and its CPU ns per packet
# (docs/afxdp.md). A benchmark, not a test: it prints figures and ratios, and fails only when a
# run breaks.
#
# The same traffic source for every receiver: `pvnet switch` A (CPU 0) with a gen port writing
# into veth pvs0 through its own AF_XDP port (SRC=af-packet: an AF_PACKET port, io_uring;
# SRC=xdp-live: no socket buffer at all, XDP frames the kernel makes and redirects into pvs0
# as a driver's XDP_REDIRECT does, scripts/lib/xdp_live.py, with GRO on pvs0p so that its
# NAPI takes them for the stack's receivers too; the kernel's receive work (pvs0p's NAPI: the
# XDP program and the copy into the UMEM, or the socket buffer and the stack) runs on the
# sender's CPU, as the veth schedules it, or with NAPI_CPU=1 in pvs0p's NAPI thread pinned
# to the receiver's CPU, as a NIC's interrupt on the receiver's core);
# the kernel carries the frames to pvs0's peer pvs0p, where `pvnet switch` B (CPU 1) takes
# them into a sink port through the port under test:
#   xdp-native   af-xdp:ifname=pvs0p,mode=native   (the veth driver's XDP hook)
#   xdp-native-hash  the same with rx_hash=true: the program asks the driver for each
#                frame's RX hash (XDP metadata; a veth computes it in software)
#   xdp-native-novlan  the same with rx_vlan=false: the plain program (no metadata; a VLAN
#                tag carried beside a frame is lost)
#   xdp-generic  af-xdp:ifname=pvs0p,mode=generic  (XDP after the socket buffer is built)
#   af-packet    af-packet:ifname=pvs0p,io=uring
#   tap          tap pvb1, bridged with pvs0p (the kernel forwards into the tap)
#   xdp-vm       xdp-native into a vhost-user frontend instead of the sink (FE=dpdk: DPDK
#                testpmd net_virtio_user rxonly, in_order=0, FE_QS=1024 descriptors, its
#                forwarder on CPU FE_CPU=0, beside the source; FE=pvnet: `pvnet frontend --role
#                drop`, buffers of 2048 bytes, on CPU FE_CPU; FE_CPU=1: beside the receiving
#                switch instead): the switch copies each frame into it
#   xdp-vm-direct  the same with direct=true: the kernel copies each frame straight into the
#                frontend's buffers (compared with xdp-vm; "in place" is rx_direct's share)
# Per run: the core-to-core state (`pvnet limits` probed before and after; the summary
# compares receivers only within one state), B's rx_packets per second over the measured window, B's CPU time over it (all its
# threads, /proc/<pid>/task/*/schedstat) per packet, its worker's busy time per packet (the
# rounds that moved packets only: the cost of a packet without the sleeps and wake-ups a
# source slower than the receiver brings), the syscalls its port made per packet, what the
# kernel dropped on its way to the port (its kernel_drops: for AF_XDP no fill frame or ring
# room, for AF_PACKET a full socket, for the tap a full queue) as a share of what A sent,
# and A's sent packets per second and CPU per packet sent (when B takes less than A sends,
# the difference was dropped in the kernel). The kernel's own work
# of delivering a frame (the veth's NAPI, the XDP program, the copy into the UMEM or the
# socket buffer) runs in softirq on the sender's CPU and is not in B's figure. Runs
# interleave the receivers, ROUNDS rounds; medians. The veths, the bridge, the tap and both
# switches live in a network namespace of this run's (scripts/lib/common.sh netns_new), never
# in the machine's own.
#
# Usage: scripts/bench_afxdp.sh   Env: ROUNDS=3 DUR=5 (measured s) WARM=1 SIZES="64 1500"
#        CFGS="xdp-native xdp-generic af-packet tap" SRC=af-xdp|af-packet|xdp-live NAPI_CPU=
#        POLICY=adaptive (the receiving switch's --policy; busy: it never sleeps, so the
#        kernel never wakes it) PPS= (the source paced to that many frames a second: room
#        on CPU 0 for a frontend beside it)
#        DOC=docs/afxdp.md (section between the bench:afxdp markers; DOC= to skip)
# Wall time: ~(DUR + WARM + 3) s per run: ~5 min with the defaults.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_root
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-5}"; WARM="${WARM:-1}"; SIZES="${SIZES:-64 1500}"
CFGS="${CFGS:-xdp-native xdp-generic af-packet tap}"; SRC="${SRC:-af-xdp}"; POLICY="${POLICY:-adaptive}"
FE="${FE:-dpdk}"; FE_QS="${FE_QS:-1024}"; FE_CPU="${FE_CPU:-0}"
DOC="${DOC-$PVNET_ROOT/docs/afxdp.md}"
build_pvnet
B="$WORK/afxdp"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; BIN="$B/pvnet"
RES="$B/results.txt"; : > "$RES"
apid=; bpid=; fpid=
FE_PREFIX=pvnet_afxdp_$$_fe
cleanup() {
  [ -n "$apid" ] && stop_pid "$apid" INT
  [ -n "$fpid" ] && stop_pid "$fpid" INT
  testpmd_kill_all 2>/dev/null
  [ -n "$bpid" ] && stop_pid "$bpid" INT
  hugepage_cleanup "$FE_PREFIX" 2>/dev/null
  netns_cleanup   # the veths, the bridge and the tap go with it (and any XDP program)
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

netns_new benchxdp; HNS=$NS
ipn() { ip -n "$HNS" "$@"; }
ipn link add pvs0 type veth peer name pvs0p
ipn link add pvbbr type bridge stp_state 0
ipn link set pvbbr up; ipn link set pvs0 up; ipn link set pvs0p up

# snap SOCKET : "tx_packets rx_packets syscalls busy_ns" of port t and the workers.
snap() { "$BIN" ctl --ctl-socket "$1" --json 2>/dev/null | python3 "$PYLIB/bench_afxdp.py" snap t; }

case "$SRC" in
  af-xdp) SRCPORT="af-xdp:name=t,ifname=pvs0,mode=native" ;;
  af-packet) SRCPORT="af-packet:name=t,ifname=pvs0,io=uring" ;;
  xdp-live) SRCPORT=; ip netns exec "$HNS" ethtool -K pvs0p gro on > /dev/null
    [ -n "${NAPI_CPU:-}" ] && ip netns exec "$HNS" sh -c 'echo 1 > /sys/class/net/pvs0p/threaded' ;;
  *) die "SRC: af-xdp, af-packet or xdp-live" ;;
esac
# src_sent TAG : the frames the source has sent so far (its port's, or pvs0's own count).
src_sent() {
  if [ -z "$SRCPORT" ]; then ip netns exec "$HNS" cat /sys/class/net/pvs0/statistics/tx_packets
  else local a; read -r a _ _ _ < <(snap "$B/ctl.a.$1"); echo "$a"; fi
}

# start_frontend SOCK TAG : the vhost-user receiver of the xdp-vm configurations, on CPU FE_CPU.
start_frontend() {
  if [ "$FE" = dpdk ]; then
    testpmd_start fe "$B/fe.$2.log" $((DUR + WARM + 30)) -l "$FE_CPU,$((1 - FE_CPU))" --main-lcore "$((1 - FE_CPU))" \
      --socket-mem 512 --single-file-segments \
      --file-prefix "$FE_PREFIX" --no-pci --vdev "net_virtio_user0,path=$1,queues=1,queue_size=$FE_QS,in_order=0" \
      -- --nb-cores=1 --total-num-mbufs=32768 --rxd="$FE_QS" --txd="$FE_QS" -i --forward-mode=rxonly
    wait_for 30 grep -q 'testpmd> ' "$B/fe.$2.log" || die "testpmd did not start ($B/fe.$2.log)"
    tp fe start
  else
    "$BIN" frontend --socket "$1" --role drop --cpu "$FE_CPU" --rx-buffers fixed:2048 --queue-size "$FE_QS" \
      --secs $((DUR + WARM + 20)) --idle-timeout 60 > "$B/fe.$2.json" 2> "$B/fe.$2.log" &
    fpid=$!
    wait_for 10 grep -q '"ready"' "$B/fe.$2.json" || die "pvnet frontend did not connect ($B/fe.$2.log)"
  fi
}
stop_frontend() {
  if [ "$FE" = dpdk ]; then
    [ -n "${TP_PID[fe]:-}" ] && { testpmd_quit fe 20 || log "testpmd did not quit cleanly"; hugepage_cleanup "$FE_PREFIX"; }
  elif [ -n "$fpid" ]; then stop_pid "$fpid" INT; wait "$fpid" 2>/dev/null || true; fpid=; fi
  return 0   # (none for the sink receivers)
}

for r in $(seq 1 "$ROUNDS"); do
  for size in $SIZES; do
    for cfg in $CFGS; do
      tag="$cfg-$size-$r"
      recv="sink:name=s"
      case "$cfg" in
        xdp-native) pb="af-xdp:name=t,ifname=pvs0p,mode=native" ;;
        xdp-native-hash) pb="af-xdp:name=t,ifname=pvs0p,mode=native,rx_hash=true" ;;
        xdp-native-novlan) pb="af-xdp:name=t,ifname=pvs0p,mode=native,rx_vlan=false" ;;
        xdp-generic) pb="af-xdp:name=t,ifname=pvs0p,mode=generic" ;;
        af-packet) pb="af-packet:name=t,ifname=pvs0p,io=uring" ;;
        tap) pb="tap:name=t,ifname=pvb1,io=uring" ;;
        xdp-vm) pb="af-xdp:name=t,ifname=pvs0p,mode=native"; recv="vhost-user:name=s,socket=$B/vu.$tag.sock" ;;
        xdp-vm-direct) pb="af-xdp:name=t,ifname=pvs0p,mode=native,direct=true"; recv="vhost-user:name=s,socket=$B/vu.$tag.sock" ;;
        *) die "unknown receiver $cfg" ;;
      esac
      if [ "$cfg" = tap ]; then ipn link set pvs0p master pvbbr; else ipn link set pvs0p nomaster; fi
      NO_COLOR=1 PVNET_LOG=info ip netns exec "$HNS" "$BIN" switch --port "$pb" --port "$recv" --cpu 1 --policy "$POLICY" \
        --ctl-socket "$B/ctl.b.$tag" --secs $((DUR + WARM + 12)) > "$B/b.$tag.json" 2> "$B/b.$tag.log" &
      bpid=$!
      wait_sock "$B/ctl.b.$tag"
      case "$recv" in vhost-user:*) start_frontend "$B/vu.$tag.sock" "$tag" ;; esac
      cb=$(c2c_ns)
      # pvs0p's NAPI threads (made again when a port attaches its XDP program) on NAPI_CPU.
      if [ -z "$SRCPORT" ] && [ -n "${NAPI_CPU:-}" ]; then
        for t in $(pgrep '^napi/pvs0p-'); do taskset -p -c "$NAPI_CPU" "$t" > /dev/null; done
      fi
      if [ "$cfg" = tap ]; then ipn link set pvb1 master pvbbr; fi
      if [ -n "$SRCPORT" ]; then
        ip netns exec "$HNS" "$BIN" switch --port "$SRCPORT" --port "gen:name=g,delay=0.5,frame_len=$size${PPS:+,rate=$PPS}" --cpu 0 \
          --ctl-socket "$B/ctl.a.$tag" --secs $((DUR + WARM + 7)) > "$B/a.$tag.json" 2> "$B/a.$tag.log" &
        apid=$!
        wait_sock "$B/ctl.a.$tag"
      else
        ip netns exec "$HNS" taskset -c 0 python3 "$PYLIB/xdp_live.py" pvs0 $((DUR + WARM + 7)) "$size" ${PPS:-} \
          > "$B/a.$tag.log" 2>&1 &
        apid=$!
      fi
      sleep "$WARM"; sleep 0.5
      c0=$(cpu_ns "$bpid"); d0=$(cpu_ns "$apid")
      a0=$(src_sent "$tag"); read -r _ b0 s0 w0 k0 r0 e0 < <(snap "$B/ctl.b.$tag")
      t0=$(date +%s.%N); sleep "$DUR"; t1=$(date +%s.%N)
      c1=$(cpu_ns "$bpid"); d1=$(cpu_ns "$apid")
      a1=$(src_sent "$tag"); read -r _ b1 s1 w1 k1 r1 e1 < <(snap "$B/ctl.b.$tag")
      # The source first: what it sends while the receiver stops would count as the kernel's drops.
      kill -INT "$apid" 2>/dev/null || true; wait "$apid" || true; apid=
      stop_frontend
      kill -INT "$bpid" 2>/dev/null || true; wait "$bpid" || true; bpid=
      ca=$(c2c_ns)
      grep -ho "the kernel's own counts.*" "$B/b.$tag.log" | sed 's/^/  /' || true
      line=$(python3 "$PYLIB/bench_afxdp.py" result "$cfg" "$size" "$r" "$cb/$ca" "$t0" "$t1" "$a0" "$a1" "$b0" "$b1" \
        "$s0" "$s1" "$c0" "$c1" "$d0" "$d1" "$w0" "$w1" "$k0" "$k1" "$r0" "$r1" "$e0" "$e1")
      echo "$line" | tee -a "$RES"
      [ "$b1" -gt "$b0" ] || { log "no packets received in run $tag: see $B/b.$tag.log"; exit 1; }
    done
  done
done

SUM="$B/summary.md"
python3 "$PYLIB/bench_afxdp.py" summary "$RES" "$SUM" > /dev/null
cat "$SUM"
[ -z "$DOC" ] && exit 0
doc_results "$DOC" "bench:afxdp" "ROUNDS=$ROUNDS DUR=$DUR SRC=$SRC POLICY=$POLICY scripts/bench_afxdp.sh" "$SUM" "$RES"
