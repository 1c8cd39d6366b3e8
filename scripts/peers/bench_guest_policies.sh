#!/usr/bin/env bash
# scripts/peers/bench_guest_policies.sh - a real Linux guest driver (Debian 6.1 virtio_net, under
# QEMU 7.2) transmitting into pvnet's backend under each polling policy, and into QEMU's own
# userspace virtio-net backend on a TAP device (tx=bh, tx=timer), interleaved in one run.
# A benchmark, not a test: it prints numbers and ratios, and fails only when a run breaks.
#
# Every run boots the same guest image (scripts/peers/setup.sh) with one virtio-net-pci NIC; its
# /run.sh brings eth0 up (no address, no IPv6: nothing else sends) and runs kernel pktgen, 60-byte
# frames (64 with FCS), `count 0 delay 0 clone_skb 0 burst B`, for DUR seconds. Configurations
# (one guest boot each, per burst B, per round; the order reverses every round):
#   pvnet:P         -netdev vhost-user -> `pvnet backend --role sink --cpu 1 --policy P`
#                   for P in $POLICIES (notify timer:150 spin:256 busy adaptive)
#   pvnet:adaptive:napi0   the same with the guest's virtio_net loaded `napi_tx=0` ($NAPI0=1)
#   tap:bh|timer    -netdev tap,vhost=off + virtio-net-pci tx=bh|timer: QEMU's own backend, all
#                   of QEMU on CPU0 (as pinned for pvnet)
#   tap:bh:split|tap:timer:split   the same with QEMU's main-loop thread (where the tx bottom
#                   half / timer and the tap writes run) moved to CPU1 after boot, the vCPU
#                   thread left on CPU0: QEMU's backend gets the second CPU like pvnet's worker
#                   ($SPLIT=1)
# Pinning: `taskset -c 0 qemu-system-x86_64 -smp 1,maxcpus=2 ...`; pvnet's worker `--cpu 1`.
# Recorded per run (one RESULT line):
#   * guest pps: pktgen's own result line (packets / its elapsed usec);
#   * backend pkts: pvnet's final rx_packets, or the tap's rx_packets delta (the frames the host
#     received), and backend pps = that / pktgen's elapsed time;
#   * CPU %: on-CPU time from /proc/<pid>/task/*/schedstat over the window between the guest's
#     PVB_BEGIN / PVB_END console markers (printed just before pktgen starts / after it stops),
#     in % of one CPU: pvnet (all its threads) and QEMU (all threads: vCPU + main loop; for tap
#     runs that is QEMU's backend too);
#   * pvnet kicks, calls, sleeps per packet (final JSON);
#   * c2c one-way latency before/after (`pvnet limits`), CPU busy share before, and what other
#     processes took in the window (machine busy - ours); a run with other > OTHER_MAX % is
#     redone once and both attempts are kept (the spoiled one marked disturbed=1).
# Under TCG (this machine: /dev/kvm is PVM) the guest's pps measures TCG's cost of running the
# guest driver + pktgen as much as the backend: read the ratios with that in mind.
#
# Usage: scripts/peers/bench_guest_policies.sh
# Env:   QEMU_SMP=1,maxcpus=2 (-smp value)  ROUNDS=2 DUR=5 BURSTS="1 32" POLICIES="notify timer:150 spin:256 busy adaptive"
#        TAPS="bh timer" SPLIT=1 NAPI0=1 TAP=pvbtap0 TAP_NET=10.77.0 (host .1/24)
#        QUIET_PCT=15 QUIET_WAIT=60 OTHER_MAX=10 DOC=docs/guest-policies.md (DOC= to skip)
# Wall time: ~15 s per run; with the defaults 2 x 2 x 10 runs: ~10 min.
source "$(dirname "$0")/../lib/common.sh"
need_root
T_START=$(date +%s)
ROUNDS="${ROUNDS:-2}"; DUR="${DUR:-5}"; BURSTS="${BURSTS:-1 32}"
POLICIES="${POLICIES:-notify timer:150 spin:256 busy adaptive}"; TAPS="${TAPS:-bh timer}"
SPLIT="${SPLIT:-1}"; NAPI0="${NAPI0:-1}"; TAP="${TAP:-pvbtap0}"; TAP_NET="${TAP_NET:-10.77.0}"
QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"; OTHER_MAX="${OTHER_MAX:-10}"
DOC="${DOC-$PVNET_ROOT/docs/guest-policies.md}"
GMAC=02:00:00:00:00:02
# -smp 1,maxcpus=2: still one vCPU, but TCG then emits the guest's locked instructions and
# fences as host atomics/fences. With max_cpus 1 it does not, and the guest's virtio barriers
# do not order it against a backend on another CPU: lost kicks/interrupts (docs/guest-policies.md).
QEMU_SMP="${QEMU_SMP:-1,maxcpus=2}"

PVNET_REV=$(cd "$PVNET_ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
ACC=$(guest_accel)
if [ -n "${RESULTS:-}" ]; then   # summary and table only, from an earlier run's results.txt
  RES="$RESULTS"; B=$(mktemp -d); SUMMARY_TMP="$B"; SOCK=""; WALL="(earlier run)"
else
"$PEERS_DIR/setup.sh" > "$WORK/setup.log" 2>&1 || { tail "$WORK/setup.log"; die "setup failed"; }
if [ ! -s "$GUEST_DIR/vmlinux" ] || [ ! -s "$GUEST_DIR/base.cpio.gz" ]; then die "no guest image in $GUEST_DIR"; fi
# Build only when there is no binary (someone else rebuilds target/), then take a private copy so
# that a rebuild during the run cannot swap it.
if [ ! -x "$PVNET_BIN" ]; then
  (cd "$PVNET_ROOT" && timeout 1200 cargo build --release -q -p pvnet) >&2 || die "cargo build failed"
fi
B="$WORK/guestbench"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; PVNET_BIN="$B/pvnet"
RES="$B/results.txt"
echo "# pvnet=$PVNET_REV binary=$(date -u +'%F %T') rounds=$ROUNDS dur=$DUR smp=$QEMU_SMP" > "$RES"
SOCK="$B/vu.sock"; TCK=$(getconf CLK_TCK); NCPU=$(nproc)
VEC=""; case "$ACC" in *tcg*) VEC=",vectors=0" ;; esac   # see docs/interop.md (QEMU 7.2 + TCG + vhost-user)

PV_TPID=; Q_TPID=
cleanup() {
  [ -n "${SUMMARY_TMP:-}" ] && rm -rf "$SUMMARY_TMP"
  [ -n "$Q_TPID" ] && stop_pid "$Q_TPID"
  [ -n "$PV_TPID" ] && stop_pid "$PV_TPID"
  [ -n "${SOCK:-}" ] && rm -f "$SOCK"
  netns_cleanup   # the tap goes with its namespace
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM   # so that cleanup runs

# ---- the tap: host side 10.77.0.1/24, carries only this guest's frames -----------------------
# In a network namespace of this run's (scripts/lib/common.sh netns_new; IPv6 off there: the host
# sends nothing to the guest), never the machine's own: QEMU's tap backend runs in it (it
# opens the tap by name), the pvnet runs need none (vhost-user).
netns_new guestpol; HNS=$NS
ip -n "$HNS" tuntap add dev "$TAP" mode tap
ip -n "$HNS" addr add "$TAP_NET.1/24" dev "$TAP"; ip -n "$HNS" link set "$TAP" up
tap_rx() { ip netns exec "$HNS" cat "/sys/class/net/$TAP/statistics/rx_packets"; }

# ---- guest images ----------------------------------------------------------------------------
guest_script() {   # guest_script BURST
  cat <<EOF
S=/sys/class/net/eth0/statistics; N=/sys/class/net/eth0
echo "GUEST_PROBE driver=\$(basename "\$(readlink \$N/device/driver)") napi_tx=\$(cat /sys/module/virtio_net/parameters/napi_tx)"
ip link set eth0 up
i=0; while [ "\$(cat \$N/operstate)" != up ] && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i+1)); done
echo "GUEST_LINK carrier=\$(cat \$N/carrier) operstate=\$(cat \$N/operstate)"
echo "add_device eth0" > /proc/net/pktgen/kpktgend_0; P=/proc/net/pktgen/eth0
for c in "count 0" "pkt_size 60" "delay 0" "clone_skb 0" "burst $1" "dst 10.99.0.1" "dst_mac 02:00:00:00:00:09" "udp_dst_min 9" "udp_dst_max 9"; do
  echo "\$c" > \$P || echo "GUEST_WARN pktgen rejected \$c"; done
sleep 0.5
echo "PVB_BEGIN tx_packets=\$(cat \$S/tx_packets)"
echo start > /proc/net/pktgen/pgctrl & sleep $DUR; echo stop > /proc/net/pktgen/pgctrl; wait
echo "PVB_END tx_packets=\$(cat \$S/tx_packets)"
echo "GUEST_PKTGEN \$(grep -oE 'OK: .*\(|[0-9]+pps' \$P | tr '\n' ' ')"
last=-1; i=0; while [ "\$(cat \$S/tx_packets)" != "\$last" ] && [ \$i -lt 20 ]; do last=\$(cat \$S/tx_packets); sleep 0.5; i=\$((i+1)); done
echo "GUEST_STATS tx_packets=\$(cat \$S/tx_packets) rx_packets=\$(cat \$S/rx_packets) tx_dropped=\$(cat \$S/tx_dropped)"
EOF
}
napi0_init "$B/init.napi0"
for b in $BURSTS; do
  guest_script "$b" > "$B/run-b$b.sh"
  make_initrd "$B/run-b$b.sh" "$B/b$b.initrd.gz"
  make_initrd "$B/run-b$b.sh" "$B/b$b-napi0.initrd.gz" "$B/init.napi0"
done

# ---- measurement helpers -----------------------------------------------------------------------
sched_ns() {   # sched_ns PID : on-CPU ns of all its threads (0 when gone / no PID)
  [ -n "$1" ] || { echo 0; return; }
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s+=$1} END{printf "%.0f", s}'   # %.0f: mawk's %d stops at 2^31
}
# snap : "t_ns pvnet_ns qemu_ns machine_busy_ticks tap_rx"
snap() {
  echo "$(date +%s%N) $(sched_ns "$PV_PID") $(sched_ns "$Q_PID") $(awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat) $(tap_rx)"
}
run_one() {   # run_one CFG BURST ROUND ATTEMPT
  local cfg="$1" burst="$2" round="$3" att="$4" tag
  tag="$(echo "$cfg" | tr ':' '_')-b$burst-r$round-a$att"
  local kind pol="" txmode="" split=0 initrd="$B/b$burst.initrd.gz"
  case "$cfg" in
    pvnet:*) kind=pvnet; pol="${cfg#pvnet:}"
             if [[ "$pol" == *:napi0 ]]; then pol="${pol%:napi0}"; initrd="$B/b$burst-napi0.initrd.gz"; fi ;;
    tap:*)   kind=tap; txmode="${cfg#tap:}"
             if [[ "$txmode" == *:split ]]; then txmode="${txmode%:split}"; split=1; fi ;;
    *) die "unknown configuration $cfg" ;;
  esac
  local busy c2c_a c2c_b glog="$B/$tag.console" t0 netargs nsx=()
  wait_quiet; busy=$BUSY; c2c_a=$(c2c_ns)
  t0=$(date +%s%N)
  PV_PID=
  # shellcheck disable=SC2054  # the commas are QEMU's option syntax
  if [ "$kind" = pvnet ]; then
    rm -f "$SOCK"
    PVNET_LOG=info timeout -k 5 $((DUR + 90)) "$PVNET_BIN" backend --socket "$SOCK" --role sink --sessions 1 \
      --cpu 1 --policy "$pol" > "$B/$tag.pvnet.json" 2> "$B/$tag.pvnet.log" &
    PV_TPID=$!
    wait_for 10 test -S "$SOCK" || die "pvnet backend did not listen ($B/$tag.pvnet.log)"
    PV_PID=$(child_pid "$PV_TPID")
    netargs=(-object "memory-backend-memfd,id=mem,size=512M,share=on" -numa "node,memdev=mem"
             -chardev "socket,id=c0,path=$SOCK" -netdev vhost-user,id=n0,chardev=c0
             -device "virtio-net-pci,netdev=n0,mac=$GMAC$VEC")
  else
    netargs=(-object "memory-backend-memfd,id=mem,size=512M,share=on" -numa "node,memdev=mem"
             -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no,vhost=off"
             -device "virtio-net-pci,netdev=n0,mac=$GMAC,tx=$txmode$VEC")
    nsx=(ip netns exec "$HNS")   # (execs taskset, which execs QEMU: Q_PID stays QEMU's)
  fi
  local rx0; rx0=$(tap_rx)
  # shellcheck disable=SC2086  # $ACC is a list of arguments
  timeout -k 5 $((DUR + 80)) "${nsx[@]}" taskset -c 0 qemu-system-x86_64 $ACC -name pvb,debug-threads=on -m 512 -smp "$QEMU_SMP" -nodefaults -no-user-config \
    -display none -serial stdio -no-reboot -kernel "$GUEST_DIR/vmlinux" -initrd "$initrd" \
    -append "console=ttyS0 quiet panic=-1 pvg.timeout=$((DUR + 60))" "${netargs[@]}" \
    < /dev/null > "$glog" 2>&1 &
  Q_TPID=$!
  sleep 0.2; Q_PID=$(child_pid "$Q_TPID")
  # Follow the console: snapshots at the pktgen window's markers.
  local s_begin="" s_end="" t_ready="" split_done=0
  while kill -0 "$Q_TPID" 2>/dev/null; do
    if [ -z "$t_ready" ] && grep -q PVG-READY "$glog"; then
      t_ready=$(date +%s%N)
      if [ "$split" = 1 ] && [ "$split_done" = 0 ]; then split_qemu "$Q_PID" > "$B/$tag.affinity"; split_done=1; fi
    fi
    if [ -z "$s_begin" ] && grep -q PVB_BEGIN "$glog"; then s_begin=$(snap)
    elif [ -n "$s_begin" ] && [ -z "$s_end" ] && grep -q PVB_END "$glog"; then s_end=$(snap); fi
    sleep 0.05
  done
  local qrc=0; wait "$Q_TPID" 2>/dev/null || qrc=$?; Q_TPID=; Q_PID=
  local berc=0
  if [ "$kind" = pvnet ]; then wait_pid "$PV_TPID" 15 || berc=$?; PV_TPID=; fi
  local rx1; rx1=$(tap_rx)
  c2c_b=$(c2c_ns)
  tr -d '\r' < "$glog" > "$glog.txt"
  grep -q 'PVG-DONE rc=0' "$glog.txt" || log "$tag: guest did not finish its script (qemu status $qrc; $glog.txt)"
  [ "$berc" = 0 ] || log "$tag: pvnet backend exit status $berc"
  local bpk kicks calls sleeps
  if [ "$kind" = pvnet ]; then
    bpk=$(json_port "$B/$tag.pvnet.json" rx_packets); kicks=$(json_port "$B/$tag.pvnet.json" kicks)
    calls=$(json_port "$B/$tag.pvnet.json" calls); sleeps=$(json_port "$B/$tag.pvnet.json" sleeps)
  else
    bpk=$((rx1 - rx0)); kicks=nan; calls=nan; sleeps=nan
  fi
  python3 "$PYLIB/bench_guest_policies.py" result "$glog.txt" "$s_begin" "$s_end" "$t0" "${t_ready:-0}" "$kind" \
    "$bpk" "$kicks" "$calls" "$sleeps" "$TCK" "$NCPU" \
    "cfg=$cfg burst=$burst round=$round attempt=$att c2c_ns=$c2c_a/$c2c_b busy_before_pct=$busy" > "$B/$tag.result"
  cat "$B/$tag.result"
  grep -hE 'GUEST_WARN|PVG-WARN|qemu-system' "$glog.txt" | head -3 | sed 's/^/  console: /' || true
  if [ "$kind" = pvnet ]; then
    sed 's/\x1b\[[0-9;]*m//g' "$B/$tag.pvnet.log" | grep -E ' (ERROR|WARN) ' | head -3 | sed 's/^/  pvnet: /' || true
  fi
  # other work on the CPUs during the window?
  OTHER=$(grep -o 'other_pct=[0-9]*' "$B/$tag.result" | cut -d= -f2)
  GUEST_OK=1; grep -q 'guest_pkts=[1-9]' "$B/$tag.result" || GUEST_OK=0
}

CFGS=()
for p in $POLICIES; do CFGS+=("pvnet:$p"); done
[ "$NAPI0" = 1 ] && CFGS+=("pvnet:adaptive:napi0")
for t in $TAPS; do CFGS+=("tap:$t"); done
if [ "$SPLIT" = 1 ]; then for t in $TAPS; do CFGS+=("tap:$t:split"); done; fi
log "accel: $ACC; configs: ${CFGS[*]}; bursts: $BURSTS; rounds: $ROUNDS; DUR=$DUR s; pvnet $PVNET_REV"
for r in $(seq "$ROUNDS"); do
  order=("${CFGS[@]}")
  if [ $((r % 2)) = 0 ]; then order=(); for ((i=${#CFGS[@]}-1; i>=0; i--)); do order+=("${CFGS[i]}"); done; fi
  for b in $BURSTS; do
    for c in "${order[@]}"; do
      run_one "$c" "$b" "$r" 1
      if [ "$GUEST_OK" = 0 ] || [ "${OTHER:-0}" -gt "$OTHER_MAX" ]; then
        log "$c burst $b round $r: other work ${OTHER}% / guest ok $GUEST_OK: redo"
        sed -i 's/^RESULT /RESULT disturbed=1 /' "$B/$(echo "$c" | tr ':' '_')-b$b-r$r-a1.result"
        cat "$B/$(echo "$c" | tr ':' '_')-b$b-r$r-a1.result" >> "$RES"
        run_one "$c" "$b" "$r" 2
        cat "$B/$(echo "$c" | tr ':' '_')-b$b-r$r-a2.result" >> "$RES"
      else
        cat "$B/$(echo "$c" | tr ':' '_')-b$b-r$r-a1.result" >> "$RES"
      fi
    done
  done
done
WALL=$(( $(date +%s) - T_START ))
fi

# ---- summary: medians per config and burst, ratios against QEMU's own backend ----------------------
python3 "$PYLIB/bench_guest_policies.py" summary "$RES" "$B/summary.md" "$WALL" "$ROUNDS" "$DUR" "$PVNET_REV" "$ACC" "$OTHER_MAX"

if [ -n "$DOC" ]; then
  if [ ! -f "$DOC" ]; then
    printf '# A Linux guest driver into pvnet vs QEMU'"'"'s own virtio-net backend\n\n<!-- bench_guest:begin -->\n<!-- bench_guest:end -->\n' > "$DOC"
  fi
  { cat "$B/summary.md"; printf '\n<details><summary>raw RESULT lines</summary>\n\n```\n'; cat "$RES"
    printf '```\n\n</details>\n'; } > "$B/section.md"
  doc_section "$DOC" bench_guest "$B/section.md"
  log "table written to $DOC"
fi
log "results: $RES; logs: $B; wall time ${WALL} s"
if [ -n "${SUMMARY_TMP:-}" ]; then rm -rf "$SUMMARY_TMP"; fi
