#!/usr/bin/env bash
# scripts/peers/bench_guest_tap.sh - a Linux guest reaching the host kernel through pvnet switch
# (vhost-user port + tap port) versus through QEMU's own userspace virtio-net tap backend
# (-netdev tap,vhost=off with virtio-net-pci tx=bh and tx=timer), interleaved in one run.
# A benchmark, not a test: it prints numbers and ratios, and fails only when a run breaks.
#
# Every run boots the same Debian guest (scripts/peers/setup.sh; virtio_net, offloads as
# negotiated), guest 10.78.0.2 <-> host 10.78.0.1 on the tap, and runs in the guest, DUR s each:
#   tcp_g2h / tcp_h2g   iperf3 TCP (-R for host -> guest), Gbit/s at the receiver
#   udp_g2h / udp_h2g   iperf3 UDP, 22-byte payload = 64-byte frames, -b 0; pps the receiver got
#   rr                  sockperf ping-pong (UDP, 64 bytes) guest -> host, full RTT p50/p99 (us)
#                       and transactions/s
#   rrload              the same ping-pong while iperf3 -R -P 4 floods host -> guest (TCP): the
#                       replies cross the congested egress (the guest's receive ring and, in
#                       pvnet, its egress queue); also the bulk Gbit/s (rrload_bulk_gbit)
#   rrudp               requests at 2000/s (sockperf ul) while iperf3 -u -b 1G -R floods host ->
#                       guest (UDP: no window holds the flood back, so a backlog stands at the
#                       guest's egress): RTT p50/p99, the share of requests lost, the flood's
#                       Gbit/s at the guest (rrudp_bulk_gbit)
#   flood               the same UDP flood alone, no requests: Gbit/s at the guest (what the
#                       guest's egress costs the flood when no request competes for the guest)
# With FLOWS="1 10 100" every test also runs with N concurrent flows (test name suffix _xN):
# iperf3 -P N (the [SUM] line), and N sockperf ping-pong clients at once against one server
# (transactions/s summed; p50/p99 the median over the clients). 100 clients need
# GUEST_MEM=1536 (MiB; ~5 MB each).
# The host side lives in a network namespace of this run's (scripts/lib/common.sh netns_new),
# never in the machine's own: the taps, 10.78.0.1, iperf3 -s and sockperf sr; pvnet switch runs
# in it (its tap is made there), and so does QEMU when its own tap backend is measured (QEMU
# opens the tap by name in its namespace); with pvnet, QEMU attaches through the socket.
# Host side: iperf3 -s and sockperf sr, both on CPU1. Pinning: QEMU on CPU0 (-smp 1,maxcpus=2);
# pvnet's worker on CPU1; for QEMU's backend, QEMU's main-loop thread (where its tx bottom
# half / timer and the tap I/O run) is moved to CPU1 after boot, so each backend has the
# second CPU. Each run records the c2c one-way latency before and after (`pvnet limits`).
# Under TCG (this machine: /dev/kvm is PVM) the guest's own CPU cost dominates every figure:
# read the ratios with that in mind.
#
# QEMU 7.2 with TCG crashes with vhost-user unless the NIC uses legacy INTx interrupts
# (vectors=0); its own tap backend runs with MSI-X. CFGS entries bh:intx / timer:intx run QEMU's
# backend with vectors=0 too, to tell the interrupt mechanism's share from the backend's.
#
# Usage: scripts/peers/bench_guest_tap.sh     Env: ROUNDS=2 DUR=4 CFGS="pvnet bh timer bh:intx timer:intx"
#        TESTS="tcp_g2h tcp_h2g udp_g2h udp_h2g rr" (a subset runs only those)
#        (pvnet@KEY=V@KEY=V appends ,KEY=V,... to the switch's vhost-user port: its egress
#        options, e.g. pvnet@qdisc=fifo@dql=false or pvnet@qdisc=none; see docs/egress.md;
#        pvnet^KEY=V, last, appends to its tap port: pvnet^direct=false reads into the tap
#        port's own buffers first, see docs/no-copy.md; tap_direct_share in the RESULT lines
#        is the share of the tap's packets the kernel wrote straight into the guest)
#        (pvnet:POLICY runs the switch with --policy POLICY, e.g. pvnet:busy: never sleeps, so
#        the guest never kicks: the guest's own ceiling; a "+napi0" suffix, e.g. pvnet+napi0,
#        boots the guest with virtio_net napi_tx=0: no TX-completion interrupts)
#        (a "+viommu:strict", "+viommu:lazy" or "+viommu:pt" suffix, last, e.g. pvnet+viommu:strict, puts the
#        guest behind a virtual IOMMU: q35, intel-iommu with device IOTLB, the NIC with
#        iommu_platform=on,ats=on, the guest booted with intel_iommu=on iommu.strict=1 (every
#        buffer mapped and unmapped, each unmap an IOTLB invalidation pvnet acks) or
#        iommu.strict=0 (lazy: unmaps batched, invalidations deferred) or iommu=pt (the vIOMMU
#        passes the guest's addresses through: identity grants); see docs/grants.md)
#        QEMU_BIN=path: the QEMU to run the guests under (default the system's 7.2, whose
#        vIOMMU drops lazy flushes for vhost backends; QEMU_BIN=/tmp/pvnet-peers/qemu-bpo/
#        qemu-system-x86_64, which setup.sh unpacks from bookworm-backports, for lazy)
#        FLOWS="1" (concurrency levels, see above)
#        RESULTS=path/results.txt: no runs, the table (and DOC) from an earlier run's results
#        DOC=docs/guest-tap.md (table written between the bench markers; DOC= to skip)
#        SECTION=bench_guest_tap (the markers' name, for a second table in one DOC)
# Wall time: ~45 s per run: ~8 min with the defaults.
source "$(dirname "$0")/../lib/common.sh"
need_root
ROUNDS="${ROUNDS:-2}"; DUR="${DUR:-4}"; FLOWS="${FLOWS:-1}"; TESTS="${TESTS:-tcp_g2h tcp_h2g udp_g2h udp_h2g rr}"; CFGS="${CFGS:-pvnet bh timer bh:intx timer:intx}"
DOC="${DOC-$PVNET_ROOT/docs/guest-tap.md}"
QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"
NET=10.78.0; PVTAP=pvgt0; QTAP=qgt0; GMAC=02:00:00:00:00:02
"$PEERS_DIR/setup.sh" > "$WORK/setup.log" 2>&1 || { tail "$WORK/setup.log"; die "setup failed"; }
[ -s "$GUEST_DIR/vmlinux" ] && [ -s "$GUEST_DIR/base.cpio.gz" ] || die "no guest image in $GUEST_DIR"
build_pvnet
B="$WORK/guesttap"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; PVNET_BIN="$B/pvnet"
RES="$B/results.txt"; : > "$RES"
ACC=$(guest_accel); VEC=""; case "$ACC" in *tcg*) VEC=",vectors=0" ;; esac

SW_PID=; Q_PID=; SRV_PIDS=()
cleanup() {
  if [ -n "$Q_PID" ]; then stop_pid "$Q_PID"; fi
  if [ -n "$SW_PID" ]; then stop_pid "$SW_PID" INT; fi
  local p; for p in "${SRV_PIDS[@]}"; do stop_pid "$p"; done
  netns_cleanup   # the taps go with the namespace
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM
netns_new guesttap; HNS=$NS

cat > "$B/run.sh" <<EOF
ip link set eth0 up; ip addr add $NET.2/24 dev eth0
i=0; while [ "\$(cat /sys/class/net/eth0/operstate)" != up ] && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i+1)); done
ping -c 1 -W 5 $NET.1 > /dev/null || echo "GUEST_WARN no ping reply"
t() { n=\$1; shift; "\$@" > /tmp/o.txt 2>&1; echo "BENCH_RC \$n \$?"; sed "s/^/BENCH \$n /" /tmp/o.txt; }
# rrn NAME N: N sockperf ping-pong clients at once, outputs one after the other
# (each client capped at 100000/N messages/s: sockperf sizes its sample buffer by that rate,
# ~45 MB per client uncapped; the caps sit well above what a client gets under TCG)
# rrl NAME: ping-pong while a 4-stream TCP flood comes from the host (started 1 s before)
rrl() { n=\$1; iperf3 -c $NET.1 -t \$(($DUR + 2)) -f m -R -P 4 > /tmp/bulk.txt 2>&1 & bp=\$!; sleep 1
  sockperf pp -i $NET.1 -p 11111 -t $DUR -m 64 --full-rtt > /tmp/o.txt 2>&1; rc=\$?; wait \$bp || rc=1
  echo "BENCH_RC \$n \$rc"; sed "s/^/BENCH \$n /" /tmp/o.txt; sed "s/^/BENCH \${n}_bulk /" /tmp/bulk.txt; }
# rru NAME: requests at a fixed 2000 a second (sockperf under-load: sent whatever the answers
# do, so the guest's CPU spends the same on them in every configuration) while a UDP flood at
# 1 Gbit/s comes from the host (iperf3 -u -R, started 1 s before): the answers cross the
# flooded egress
rru() { n=\$1; iperf3 -c $NET.1 -t \$(($DUR + 2)) -f m -u -b 1G -R > /tmp/bulk.txt 2>&1 & bp=\$!; sleep 1
  sockperf ul -i $NET.1 -p 11111 -t $DUR -m 64 --full-rtt --mps=2000 --reply-every=1 > /tmp/o.txt 2>&1; rc=\$?; wait \$bp || rc=1
  echo "BENCH_RC \$n \$rc"; sed "s/^/BENCH \$n /" /tmp/o.txt; sed "s/^/BENCH \${n}_bulk /" /tmp/bulk.txt; }
rrn() { n=\$1; k=\$2; i=1; while [ \$i -le \$k ]; do sockperf pp -i $NET.1 -p 11111 -t $DUR -m 64 --full-rtt --mps=\$((100000 / k)) > /tmp/rr\$i.txt 2>&1 & i=\$((i+1)); done
  rc=0; for p in \$(jobs -p); do wait \$p || rc=1; done; echo "BENCH_RC \$n \$rc"; i=1; while [ \$i -le \$k ]; do sed "s/^/BENCH \$n /" /tmp/rr\$i.txt; i=\$((i+1)); done; }
EOF
ALL_TESTS=()
for f in $FLOWS; do
  for t in $TESTS; do
    n="$t"; P=""; [ "$f" = 1 ] || { n="${t}_x$f"; P="-P $f"; }
    ALL_TESTS+=("$n")
    case "$t" in
      tcp_g2h) echo "t $n iperf3 -c $NET.1 -t $DUR -f m $P" ;;
      tcp_h2g) echo "t $n iperf3 -c $NET.1 -t $DUR -f m -R $P" ;;
      udp_g2h) echo "t $n iperf3 -c $NET.1 -t $DUR -u -l 22 -b 0 $P" ;;
      udp_h2g) echo "t $n iperf3 -c $NET.1 -t $DUR -u -l 22 -b 0 -R $P" ;;
      rrload) echo "rrl $n" ;;
      rrudp) echo "rru $n" ;;
      flood) echo "t $n iperf3 -c $NET.1 -t $DUR -f m -u -b 1G -R $P" ;;
      rr) if [ "$f" = 1 ]; then echo "t $n sockperf pp -i $NET.1 -p 11111 -t $DUR -m 64 --full-rtt"; else echo "rrn $n $f"; fi ;;
      *) die "unknown test $t (tcp_g2h tcp_h2g udp_g2h udp_h2g rr rrload rrudp flood)" ;;
    esac
  done
done >> "$B/run.sh"
make_initrd "$B/run.sh" "$B/initrd.gz"
napi0_init "$B/init.napi0"; make_initrd "$B/run.sh" "$B/initrd-napi0.gz" "$B/init.napi0"

host_servers() {
  timeout -k 2 300 ip netns exec "$HNS" taskset -c 1 iperf3 -s -B "$NET.1" > "$B/iperf3s.log" 2>&1 &
  SRV_PIDS+=($!)
  timeout -k 2 300 ip netns exec "$HNS" taskset -c 1 sockperf sr -i "$NET.1" -p 11111 > "$B/sockperf.log" 2>&1 &
  SRV_PIDS+=($!)
}
stop_servers() { local p; for p in "${SRV_PIDS[@]}"; do stop_pid "$p"; done; SRV_PIDS=(); }

run_one() {   # run_one CFG[+napi0] ROUND
  local cfg="$1" round="$2" tag="${1//[@=]/_}-$2" glog c2c_a c2c_b netdev dev initrd="$B/initrd.gz" vo=""
  glog="$B/$tag.console.log"
  local gappend="" qextra=() viommu="" gns=""
  if [[ "$cfg" == *+viommu:* ]]; then viommu="${cfg##*+viommu:}"; cfg="${cfg%+viommu:*}"
    case "$viommu" in strict) gappend="intel_iommu=on iommu.strict=1" ;; lazy) gappend="intel_iommu=on iommu.strict=0" ;;
      pt) gappend="intel_iommu=on iommu=pt" ;;
      *) die "+viommu:strict, +viommu:lazy or +viommu:pt, not $viommu" ;; esac
    qextra=(-machine q35 -device intel-iommu,intremap=on,device-iotlb=on)
  fi
  if [[ "$cfg" == *+napi0 ]]; then cfg="${cfg%+napi0}"; initrd="$B/initrd-napi0.gz"; fi
  local to=""
  if [[ "$cfg" == *^* ]]; then to=",${cfg#*^}"; to="${to//^/,}"; cfg="${cfg%%^*}"; fi
  if [[ "$cfg" == *@* ]]; then vo=",${cfg#*@}"; vo="${vo//@/,}"; cfg="${cfg%%@*}"; fi
  wait_quiet; c2c_a=$(c2c_ns)
  if [[ "$cfg" == pvnet* ]]; then
    # pvnet[:POLICY]: the switch's polling policy (default adaptive)
    # pvnet:POLICY:US also sets --tx-call-delay US
    local pol=adaptive dly=150 rest
    if [[ "$cfg" == pvnet:* ]]; then rest="${cfg#pvnet:}"; pol="${rest%%:*}"; [[ "$rest" == *:* ]] && dly="${rest#*:}"; fi
    rm -f "$B/vu.sock"
    timeout -k 5 300 ip netns exec "$HNS" "$PVNET_BIN" switch --cpu 1 --ctl-socket "$B/ctl.sock" --policy "$pol" --tx-call-delay "$dly" \
      --port "vhost-user:name=vm,socket=$B/vu.sock$vo" --port "tap:name=host,ifname=$PVTAP$to" \
      > "$B/$tag.pvnet.json" 2> "$B/$tag.pvnet.log" &
    SW_PID=$!
    wait_for 10 test -S "$B/vu.sock" || die "pvnet switch did not start ($B/$tag.pvnet.log)"
    ip -n "$HNS" addr add "$NET.1/24" dev "$PVTAP"
    netdev="-chardev socket,id=c0,path=$B/vu.sock -netdev vhost-user,id=n0,chardev=c0"
    dev="virtio-net-pci,netdev=n0,mac=$GMAC$VEC"
    [ -n "$viommu" ] && dev+=",disable-legacy=on,iommu_platform=on,ats=on"
  else
    ip -n "$HNS" tuntap add dev "$QTAP" mode tap
    ip -n "$HNS" addr add "$NET.1/24" dev "$QTAP"; ip -n "$HNS" link set "$QTAP" up
    gns=$HNS   # QEMU opens its tap in the namespace it runs in
    netdev="-netdev tap,id=n0,ifname=$QTAP,script=no,downscript=no,vhost=off"
    # cfg bh|timer[:intx]: :intx = legacy INTx interrupts (vectors=0) like the vhost-user
    # runs must use under TCG, to separate the interrupt mechanism from the backend.
    dev="virtio-net-pci,netdev=n0,mac=$GMAC,tx=${cfg%%:*}"
    [[ "$cfg" == *:intx ]] && dev+=",vectors=0"
  fi
  host_servers
  # shellcheck disable=SC2086  # $netdev is a list of arguments
  GUEST_NS=$gns guest_start 200 "$initrd" "$glog" "pvg.timeout=150 ipv6.disable=1 $gappend" "$dev" $netdev "${qextra[@]}"
  Q_PID=$GUEST_PID
  if [[ "$cfg" != pvnet* ]]; then
    wait_for 60 grep -q PVG-READY "$glog" && split_qemu "$(child_pid "$Q_PID")" > "$B/$tag.affinity"
  fi
  wait_pid "$Q_PID" 200 || log "$tag: qemu exit status $?"; Q_PID=
  stop_servers
  if [[ "$cfg" == pvnet* ]]; then stop_pid "$SW_PID" INT; wait "$SW_PID" 2>/dev/null; SW_PID=
  else ip -n "$HNS" link del "$QTAP"; fi
  c2c_b=$(c2c_ns)
  tr -d '\r' < "$glog" > "$glog.txt"
  local kc=""
  if [[ "$cfg" == pvnet* ]]; then
    kc=$(python3 "$PYLIB/bench_guest_tap.py" kicks "$B/$tag.pvnet.json" 2>/dev/null)
  fi
  python3 "$PYLIB/bench_guest_tap.py" result "$glog.txt" "$1" "$round" "$c2c_a/$c2c_b" "$DUR" "${ALL_TESTS[*]}" "$kc" | tee -a "$RES"
}

if [ -n "${RESULTS:-}" ]; then   # table only, from an earlier run's results.txt
  cp "$RESULTS" "$RES"
else
log "guest via tap: $ROUNDS rounds x {$CFGS} x {$FLOWS} flows, ${DUR}s per test"
read -ra cfgs <<< "$CFGS"
for r in $(seq "$ROUNDS"); do
  order=("${cfgs[@]}")
  if [ $((r % 2)) = 0 ]; then order=(); for ((i=${#cfgs[@]}-1; i>=0; i--)); do order+=("${cfgs[i]}"); done; fi
  for c in "${order[@]}"; do run_one "$c" "$r"; done
done
fi

python3 "$PYLIB/bench_guest_tap.py" summary "$RES" "$B/summary.md"

if [ -n "$DOC" ]; then
  [ -f "$DOC" ] || printf '# Guest through pvnet switch + tap vs QEMU tap backend\n\n<!-- bench_guest_tap:begin -->\n<!-- bench_guest_tap:end -->\n' > "$DOC"
  {
    echo "Run: $(date -u +%Y-%m-%dT%H:%MZ), \`$([ "$QEMU_BIN" != qemu-system-x86_64 ] && echo "QEMU_BIN=$QEMU_BIN ")ROUNDS=$ROUNDS DUR=$DUR CFGS=\"$CFGS\" TESTS=\"$TESTS\" FLOWS=\"$FLOWS\" scripts/peers/bench_guest_tap.sh\`," \
         "$("$QEMU_BIN" --version | head -1) ($ACC), pvnet $(git -C "$PVNET_ROOT" describe --always --dirty 2>/dev/null), $(nproc) CPUs."
    echo; cat "$B/summary.md"; echo
    echo "<details><summary>raw RESULT lines</summary>"; echo; echo '```'; cat "$RES"; echo '```'; echo; echo "</details>"
  } > "$B/section.md"
  doc_section "$DOC" "${SECTION:-bench_guest_tap}" "$B/section.md"
  log "table written to $DOC"
fi
