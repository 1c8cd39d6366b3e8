#!/usr/bin/env bash
# scripts/peers/bench_dpdk.sh - pvnet (switch and/or plain backend) side by side with DPDK's
# vhost-user backend, in one run.
# A benchmark, not a test: it prints numbers and ratios, and fails only when a run breaks.
#
# The frontend is always DPDK 22.11 testpmd with net_virtio_user (frames of SIZES bytes, 1 queue
# pair, ring size 256, burst 32), and the rate of every run is the one that same frontend reports
# (median of its 1 s `show port stats` Tx-pps / Rx-pps samples after a warm-up), so both backends
# are measured by the same tool. Per direction, interleaved A/B within every round (the order
# alternates between rounds):
#   v2h  frontend txonly -> (A) pvnet switch: vhost-user port -> sink port
#                           (A') pvnet backend --role sink     (B) testpmd net_vhost rxonly
#   h2v  frontend rxonly <- (A) pvnet switch: gen port -> vhost-user port
#                           (A') pvnet backend --role gen      (B) testpmd net_vhost txonly
#   bounce  (DIRS=bounce) two virtio-user ports of one testpmd in io forwarding, started with
#        `start tx_first`: what one port receives it sends out of the other, and the backend
#        carries each port's frames to the other (a PVP-style loop; the rate is the sum of both
#        ports' Rx-pps):       (A) pvnet switch: two vhost-user ports
#                           (A') pvnet backend --role forward  (B) testpmd net_vhost x2, io
# Each run records:
#   * the one-way core-to-core latency before and after (`pvnet limits`): these 2-vCPU VMs flip
#     between ~40-60 ns, ~90-120 ns and ~180-440 ns and rates follow it, so ratios are taken
#     within one state (both samples): fast < 75 ns <= mid < 150 ns <= slow, else "mixed";
#   * the CPU busy share just before, and what other processes took during the window (other
#     work on the 2 cores spoils a run; such runs are redone);
#   * the backend process's CPU ns/packet: user+sys from /proc/<pid>/stat over the measured
#     window / packets the frontend counted in that window.
# Pinning (2 cores): the frontend's forwarding lcore on CPU0 (-l 0,1 --main-lcore 1); the
# backend's worker on CPU1 (pvnet --cpu 1; testpmd -l 0,1 --main-lcore 0). Main lcores only
# sleep at their prompt.
#
# Usage: scripts/peers/bench_dpdk.sh        Env: ROUNDS=3 DUR=6 (measured s) WARM=2 (s)
#        DIRS="v2h h2v"  SIZES="64 1500" (frame bytes, Ethernet header included)
#        DOC=docs/interop.md (table written between the bench markers; DOC= to skip)
#        QUIET_PCT=15 QUIET_WAIT=60 (wait up to 60 s for the CPUs to be <15% busy)
#        OTHER_MAX=10 (a run during which other processes took >10% of the CPUs is redone, 3x)
#        PVNET_ARGS="--policy busy" (extra arguments for pvnet, e.g. its poll policy)
#        VU_OPTS=",dql=false" (appended to this build's `pvnet switch` vhost-user port specs)
#        RING=packed (the frontend offers the packed ring: net_virtio_user packed_vq=1; both
#        backends take it; default split)
#        QUEUES=2 (queue pairs per port on both sides: virtio-user queues=2 and testpmd
#        --rxq/--txq 2 at the frontend, net_vhost queues=2, pvnet queue_pairs=2 and its gen
#        port's frames over 64 flows so that they spread over the rings; the share of the
#        least-loaded queue is recorded per run as q_min_share; tables go to docs/scale.md)
#        FLOWS=64 (flows of pvnet's gen port; default 1, or 64 with QUEUES>1: set it to
#        compare one pair and two with the same traffic)
#        IMPLS="switch dpdk" (which backends; add "backend" for pvnet's plain backend roles,
#        "alt" / "altbackend" for `pvnet switch` / `pvnet backend` from the binary ALT_BIN: an
#        A/B of two builds in one run)
#        BURSTS=1 (the frontend records its bursts: RESULT gains fe_empty_pct, the share of its
#        receive polls that found nothing, fe_full_pct, of full bursts, and for txonly
#        fe_tx_full_pct, of transmit bursts that went out whole: who sets the pace)
#        TX_FIRST=N (bounce: the frontend starts with N bursts of 32 per port in flight instead
#        of 1: `start tx_first N`; the standard bounce is 1)
#        TXPKTS=64,594,1514 (the frontend's packets in segments of these sizes, testpmd
#        --txpkts: multi-segment chains, v2h; sets SIZES to the label 64+594+1514; a SIZES
#        entry with '+' means the same) SPLIT=rand (testpmd's set txsplit: a random number of
#        those segments per packet); the table goes to its own section (bench_dpdk_chains_split or _packed)
#        MBUFS=32768 (the frontend's mbuf pool, testpmd --total-num-mbufs, both sides)
#        MBUF_SIZE=2176 (testpmd --mbuf-size, both sides: bytes of one mbuf's data room and
#        headroom; larger puts the next mbuf's header further from a frame's end)
#        PERF=1 (profile the backend over the measured window: $B/<run>.perf.data, cpu-clock;
#        PERF=fe profiles the frontend instead;
#        it perturbs the run, so its figures are not comparable)
# Wall time: ~15 s per run; 3 rounds x 2 sizes x 2 directions x 3 IMPLS: ~9 min.
source "$(dirname "$0")/../lib/common.sh"
need_root
QUEUES="${QUEUES:-1}"; [ "$QUEUES" -gt 1 ] && DOC="${DOC-$PVNET_ROOT/docs/scale.md}"
DOC="${DOC-$PVNET_ROOT/docs/interop.md}"
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-6}"; WARM="${WARM:-2}"; DIRS="${DIRS:-v2h h2v}"; SIZES="${SIZES:-64 1500}"
QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"; OTHER_MAX="${OTHER_MAX:-10}"
PVNET_ARGS="${PVNET_ARGS:-}"; VU_OPTS="${VU_OPTS:-}"; PERF="${PERF:-}"; BURSTS="${BURSTS:-}"; IMPLS="${IMPLS:-switch dpdk}"; ALT_BIN="${ALT_BIN:-}"
case " $IMPLS " in *" backend "*|*" altbackend "*) [ "$QUEUES" = 1 ] || die "QUEUES>1: pvnet backend's bench roles have one flow; use IMPLS with switch, alt, dpdk";; esac
TXPKTS="${TXPKTS:-}"; SPLIT="${SPLIT:-}"
[ -n "$TXPKTS" ] && SIZES="${TXPKTS//,/+}"
RING="${RING:-split}"; case "$RING" in split) VU_RING= ;; packed) VU_RING=",packed_vq=1" ;; *) die "RING must be split or packed";; esac
SECTION=bench_dpdk; [[ "$SIZES" == *+* ]] && SECTION=bench_dpdk_chains_$RING
case " $IMPLS " in *" alt "*|*" altbackend "*) [ -x "$ALT_BIN" ] || die "IMPLS has alt: ALT_BIN must name a pvnet binary";; esac
"$PEERS_DIR/setup.sh" > "$WORK/setup.log" 2>&1 || { tail "$WORK/setup.log"; die "setup failed"; }
build_pvnet
B="$WORK/bench"; rm -rf "$B"; mkdir -p "$B"
# A private copy: a rebuild of target/ during the run must not swap the binary under it.
cp "$PVNET_BIN" "$B/pvnet"; PVNET_BIN="$B/pvnet"
[ -n "$ALT_BIN" ] && { cp "$ALT_BIN" "$B/pvnet-alt"; ALT_BIN="$B/pvnet-alt"; }
RES="$B/results.txt"; : > "$RES"
SOCK="$B/vu.sock"; TCK=$(getconf CLK_TCK)
FE_PREFIX=pvnet_bench_$$_fe; BE_PREFIX=pvnet_bench_$$_be
FE_ARGS=(-l "0,1" --main-lcore 1 --socket-mem 512 --single-file-segments --file-prefix "$FE_PREFIX" --no-pci
         --vdev "net_virtio_user0,path=$SOCK,queues=$QUEUES,queue_size=256$VU_RING")
BE_ARGS=(-l "0,1" --main-lcore 0 --socket-mem 512 --file-prefix "$BE_PREFIX" --no-pci
         --vdev "net_vhost0,iface=$SOCK,queues=$QUEUES")
# The bounce: a second port on each side.
SOCK2="$B/vu2.sock"
FE_ARGS2=("${FE_ARGS[@]}" --vdev "net_virtio_user1,path=$SOCK2,queues=$QUEUES,queue_size=256$VU_RING")
BE_ARGS2=("${BE_ARGS[@]}" --vdev "net_vhost1,iface=$SOCK2,queues=$QUEUES")
APP_ARGS=(--nb-cores=1 --total-num-mbufs="${MBUFS:-32768}" --mbuf-size="${MBUF_SIZE:-2176}" -i --rxq="$QUEUES" --txq="$QUEUES")
# pvnet's side of the same layout: QUEUES pairs on its vhost-user ports, and a generator whose
# frames spread over the rings (64 flows) when there is more than one.
VU_Q=",queue_pairs=$QUEUES"; GEN_FLOWS=1; [ "$QUEUES" -gt 1 ] && GEN_FLOWS=64
GEN_FLOWS=",flows=${FLOWS:-$GEN_FLOWS}"
PV_TPID=
cleanup() {
  testpmd_kill_all 2>/dev/null
  [ -n "$PV_TPID" ] && stop_pid "$PV_TPID"
  hugepage_cleanup "$FE_PREFIX"; hugepage_cleanup "$BE_PREFIX"
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM   # so that cleanup runs

ticks() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo nan; }
machine_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }   # all CPUs, ticks

run_one() {   # run_one DIR IMPL ROUND SIZE
  local dir="$1" impl="$2" round="$3" size="$4" tag="$1-$2-$3-$4" fe_fwd be_fwd field
  local ports=1 fe_args=("${FE_ARGS[@]}") be_args=("${BE_ARGS[@]}") start=start
  # a size of segments (64+594+1514): the frontend sends them as one chain, the backends'
  # own frames (h2v) are their sum
  local fe_txpkts="${size//+/,}" frame=$((${size//+/ + }))
  case "$dir" in
    v2h) fe_fwd=txonly; be_fwd=rxonly; field=TX ;;
    h2v) fe_fwd=rxonly; be_fwd=txonly; field=RX ;;
    bounce) fe_fwd=io; be_fwd=io; field=RX; ports=2; start="start tx_first${TX_FIRST:+ $TX_FIRST}"
      fe_args=("${FE_ARGS2[@]}"); be_args=("${BE_ARGS2[@]}") ;;
  esac
  local busy c2c_a c2c_b bepid fepid n=$((WARM + DUR)) fe_log="$B/$tag.fe.log" be_log="$B/$tag.be.log"
  # what runs as the backend: pvnet's switch or plain backend (from PVNET_BIN, or ALT_BIN for
  # the alt* impls), or DPDK's testpmd
  local kind=dpdk bin="$PVNET_BIN" extra; read -ra extra <<< "$PVNET_ARGS"
  case "$impl" in switch|alt) kind=switch ;; backend|altbackend) kind=backend ;; esac
  case "$impl" in alt*) bin="$ALT_BIN" ;; esac
  # pvnet's plain backend serves both frontend ports on one socket (forward pairs them)
  [ "$kind" = backend ] && [ "$dir" = bounce ] &&
    fe_args=("${FE_ARGS[@]}" --vdev "net_virtio_user1,path=$SOCK,queues=1,queue_size=256$VU_RING")
  wait_quiet; busy=$BUSY; c2c_a=$(c2c_ns)
  rm -f "$SOCK" "$SOCK2"
  if [ "$kind" = backend ]; then
    local role=sink sessions=1; [ "$dir" = h2v ] && role=gen; [ "$dir" = bounce ] && { role=forward; sessions=2; }
    timeout -k 5 $((n + 60)) "$bin" backend --socket "$SOCK" --role "$role" --secs $((n + 30)) \
      --frame-len "$frame" --sessions "$sessions" --cpu 1 "${extra[@]}" > "$B/$tag.pvnet.json" 2> "$be_log" &
    PV_TPID=$!
    wait_for 10 test -S "$SOCK" || die "pvnet backend did not listen ($be_log)"
    bepid=$(child_pid "$PV_TPID")
  elif [ "$kind" = switch ]; then
    local other="sink:name=sink"; [ "$dir" = h2v ] && other="gen:name=gen,delay=1,frame_len=$frame$GEN_FLOWS"
    # VU_OPTS (e.g. ",qdisc=none" or ",dql=false"): this build's vhost-user port options only.
    local vo="$VU_Q"; [ "$bin" = "$PVNET_BIN" ] && vo="$VU_Q$VU_OPTS"
    [ "$dir" = bounce ] && other="vhost-user:name=fe2,socket=$SOCK2$vo"
    timeout -k 5 $((n + 60)) "$bin" switch --port "vhost-user:name=fe,socket=$SOCK$vo" --port "$other" \
      --cpu 1 --ctl-socket "$B/ctl.sock" "${extra[@]}" > "$B/$tag.pvnet.json" 2> "$be_log" &
    PV_TPID=$!
    wait_for 10 test -S "$SOCK" || die "pvnet switch did not listen ($be_log)"
    bepid=$(child_pid "$PV_TPID")
  else
    testpmd_start be "$be_log" $((n + 60)) "${be_args[@]}" -- "${APP_ARGS[@]}" --txpkts="$frame" --forward-mode="$be_fwd"
    wait_for 30 test -S "$SOCK" || die "testpmd net_vhost did not create $SOCK ($be_log)"
    bepid=$(child_pid "${TP_PID[be]}")
  fi
  testpmd_start fe "$fe_log" $((n + 60)) "${fe_args[@]}" -- "${APP_ARGS[@]}" --txpkts="$fe_txpkts" --forward-mode="$fe_fwd"
  wait_for 30 grep -q 'testpmd> ' "$fe_log" || die "virtio-user testpmd did not start ($fe_log)"
  fepid=$(child_pid "${TP_PID[fe]}")
  if [ "$kind" = dpdk ]; then
    wait_for 10 grep -q 'testpmd> ' "$be_log" || die "net_vhost testpmd did not start ($be_log)"
    tp be start; sleep 0.5
  fi
  sleep 0.5
  [ -n "$BURSTS" ] && tp fe "set record-burst-stats on"
  [ -n "$SPLIT" ] && tp fe "set txsplit $SPLIT"
  tp fe "$start"
  : > "$B/$tag.ticks"
  local k
  for k in $(seq "$n"); do
    [ -n "$PERF" ] && [ "$k" = "$((WARM + 1))" ] && \
      perf record -q -F 2999 -p "$([ "$PERF" = fe ] && echo "$fepid" || echo "$bepid")" -o "$B/$tag.perf.data" -- sleep "$DUR" > /dev/null 2>&1 &
    sleep 1
    tp fe "show port stats all"; echo "$k $(ticks "$bepid") $(ticks "$fepid") $(machine_busy)" >> "$B/$tag.ticks"
  done
  [ "$QUEUES" -gt 1 ] && tp fe "show port xstats all"
  testpmd_quit fe 20 || log "$tag: virtio-user testpmd did not quit cleanly"
  hugepage_cleanup "$FE_PREFIX"
  if [ "$kind" = backend ]; then wait_pid "$PV_TPID" 15 || log "$tag: pvnet exit status $?"; PV_TPID=
  elif [ "$kind" = switch ]; then stop_pid "$PV_TPID" INT; wait "$PV_TPID" 2>/dev/null || log "$tag: pvnet exit status $?"; PV_TPID=
  else testpmd_quit be 20 || log "$tag: net_vhost testpmd did not quit cleanly"; hugepage_cleanup "$BE_PREFIX"; fi
  c2c_b=$(c2c_ns)
  # one RESULT line: Mpps (median of the window's samples), CPU ns/packet over the window
  python3 "$PYLIB/bench_dpdk.py" result "$fe_log" "$B/$tag.ticks" "$field" "$WARM" "$DUR" "$TCK" "$ports" "$(nproc)" "$QUEUES" \
    "dir=$dir size=$size impl=$impl round=$round queues=$QUEUES c2c_ns=$c2c_a/$c2c_b busy_before_pct=$busy" > "$B/$tag.result"
  if [ "$kind" = switch ]; then
    # packets per used->idx publish on the frontend's port: how the frontend's pace cut the
    # stream into batches (appended to the RESULT line)
    python3 "$PYLIB/bench_dpdk.py" batch "$B/$tag.pvnet.json" "$dir" "$B/$tag.result" || true
  fi
  cat "$B/$tag.result"
  grep -hE 'Cannot|Failed|ERROR|panicked' "$fe_log" "$be_log" 2>/dev/null | grep -v promiscuous | sort -u | head -3 | sed 's/^/  log: /' || true
}

# measure DIR IMPL ROUND SIZE: run_one until no other work took more than OTHER_MAX % of the CPUs
# during the window (3 attempts); spoiled attempts are kept in noisy.txt.
measure() {
  local a other tag="$1-$2-$3-$4"
  for a in 1 2 3; do
    run_one "$@"
    other=$(grep -o 'other_pct=[0-9nan-]*' "$B/$tag.result" | cut -d= -f2)
    if [ "$other" != nan ] && [ "${other:-100}" -le "$OTHER_MAX" ] 2>/dev/null; then break; fi
    if [ "$a" = 3 ]; then log "$tag: still ${other}% other CPU load after 3 attempts; kept"; break; fi
    log "$tag: other work took ${other}% of the CPUs during the window; again"
    sed 's/^RESULT/NOISY/' "$B/$tag.result" >> "$B/noisy.txt"
  done
  cat "$B/$tag.result" >> "$RES"
}

log "bench: $ROUNDS rounds x {$DIRS} x {$SIZES} B x {$IMPLS}, $RING ring, ${WARM}s warm-up + ${DUR}s measured per run"
read -ra impls <<< "$IMPLS"
for r in $(seq "$ROUNDS"); do
  for size in $SIZES; do
    for dir in $DIRS; do
      order=("${impls[@]}")
      if [ $((r % 2)) = 0 ]; then order=(); for ((i=${#impls[@]}-1; i>=0; i--)); do order+=("${impls[i]}"); done; fi
      for impl in "${order[@]}"; do measure "$dir" "$impl" "$r" "$size"; done
    done
  done
done

# ---- summary: ratios pvnet/DPDK per direction and c2c state -----------------------------------
python3 "$PYLIB/bench_dpdk.py" summary "$RES" "$B/summary.md"

if [ -n "$DOC" ] && [ -f "$DOC" ] && grep -q "<!-- $SECTION:begin -->" "$DOC"; then
  {
    echo "Run: $(date -u +%Y-%m-%dT%H:%MZ), \`ROUNDS=$ROUNDS DUR=$DUR WARM=$WARM SIZES=\"$SIZES\" IMPLS=\"$IMPLS\" RING=$RING$([ "$QUEUES" -gt 1 ] && echo " QUEUES=$QUEUES")${SPLIT:+ SPLIT=$SPLIT}${PVNET_ARGS:+ PVNET_ARGS=\"$PVNET_ARGS\"} scripts/peers/bench_dpdk.sh\`," \
         "DPDK $(dpkg-query -W -f='${Version}' dpdk-dev), pvnet $(git -C "$PVNET_ROOT" describe --always --dirty 2>/dev/null)," \
         "$(nproc) CPUs, $(uname -r)."
    echo
    cat "$B/summary.md"
    echo
    echo "<details><summary>raw RESULT lines</summary>"
    echo; echo '```'; cat "$RES"; [ -s "$B/noisy.txt" ] && cat "$B/noisy.txt"; echo '```'; echo; echo "</details>"
  } > "$B/section.md"
  doc_section "$DOC" "$SECTION" "$B/section.md"
  log "table written to $DOC"
fi
log "results: $RES"
