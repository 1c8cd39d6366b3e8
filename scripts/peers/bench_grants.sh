#!/usr/bin/env bash
# scripts/peers/bench_grants.sh - the staging-grants table: pvnet's frontend behind an IOMMU
# (VIRTIO_F_ACCESS_PLATFORM, the vhost-user IOTLB) against pvnet's backend and DPDK's net_vhost
# (iommu-support=1), per grant mode, in one run.
# A benchmark, not a test: it prints numbers and ratios, and fails only when a run breaks.
#
# The frontend is always `pvnet frontend` (1 queue pair, ring 256, 64-byte frames), on CPU0;
# the backend's worker on CPU1. Modes (`--grants`):
#   off         no IOMMU: the device reaches all shared memory
#   per-packet  each buffer granted (IOTLB update) before it is posted and revoked (invalidate)
#               when it comes back, each message acked: a guest with iommu.strict=1, Xen's
#               per-packet grant
#   pool        rings and buffer pools granted once at start: staging grants
# Directions (the seed table's TX and RX, per queue):
#   tx  frontend --role tx   -> pvnet backend --role sink | testpmd net_vhost rxonly
#   rx  frontend --role drop <- pvnet backend --role gen  | testpmd net_vhost txonly
# The rate is what the frontend counted over its --secs; CPU ns/packet of the backend is
# user+sys from /proc/<pid>/stat over the same window. Runs are interleaved (every mode and
# backend once per round, order alternating) and each records the core-to-core latency before
# and after (`pvnet limits`): ratios are taken within one state.
#
# Usage: scripts/peers/bench_grants.sh     Env: ROUNDS=3 DUR=4 MODES="off per-packet pool"
#        DIRS="tx rx" IMPLS="pvnet dpdk" DOC=docs/grants.md (DOC= to skip)
#        RESULTS=path/results.txt: no runs, the table from an earlier run's RESULT lines
# The table takes the medians of the runs in the most common core-to-core state (both samples
# in it) when that state has every combination, else of all runs; it says which.
# Wall time: ~8 s per run; 3 rounds x 3 modes x 2 directions x 2 backends: ~5 min.
source "$(dirname "$0")/../lib/common.sh"
need_root
QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-4}"; MODES="${MODES:-off per-packet pool}"; DIRS="${DIRS:-tx rx}"
IMPLS="${IMPLS:-pvnet dpdk}"; DOC="${DOC-$PVNET_ROOT/docs/grants.md}"
B="$WORK/grants"
if [ -n "${RESULTS:-}" ]; then
  [ -s "$RESULTS" ] || die "RESULTS=$RESULTS: no such results file"
  RES="$RESULTS"; ROUNDS=0
else
  "$PEERS_DIR/setup.sh" > "$WORK/setup.log" 2>&1 || { tail "$WORK/setup.log"; die "setup failed"; }
  build_pvnet
  rm -rf "$B"; mkdir -p "$B"
  cp "$PVNET_BIN" "$B/pvnet"; PVNET_BIN="$B/pvnet"
  RES="$B/results.txt"; : > "$RES"
fi
SOCK="$B/vu.sock"; TCK=$(getconf CLK_TCK); BE_PREFIX=pvnet_grants_$$_be
BE_TPID=
cleanup() {
  testpmd_kill_all 2>/dev/null
  [ -n "$BE_TPID" ] && stop_pid "$BE_TPID"
  hugepage_cleanup "$BE_PREFIX"
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

ticks() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

run_one() {   # run_one DIR IMPL MODE ROUND
  local dir="$1" impl="$2" mode="$3" round="$4" tag="$1-$2-$3-$4" bepid role fwd
  local fe_json="$B/$tag.fe.json" be_log="$B/$tag.be.log" c2c_a c2c_b t0 t1
  wait_quiet; c2c_a=$(c2c_ns)
  rm -f "$SOCK"
  if [ "$impl" = pvnet ]; then
    role=sink; [ "$dir" = rx ] && role=gen
    timeout -k 5 $((DUR + 60)) "$PVNET_BIN" backend --socket "$SOCK" --role "$role" --secs $((DUR + 30)) \
      --frame-len 64 --sessions 1 --cpu 1 > "$B/$tag.be.json" 2> "$be_log" &
    BE_TPID=$!
    wait_for 10 test -S "$SOCK" || die "pvnet backend did not listen ($be_log)"
    bepid=$(child_pid "$BE_TPID")
  else
    fwd=rxonly; [ "$dir" = rx ] && fwd=txonly
    testpmd_start be "$be_log" $((DUR + 60)) -l 0,1 --main-lcore 0 --socket-mem 512 --file-prefix "$BE_PREFIX" \
      --no-pci --vdev "net_vhost0,iface=$SOCK,queues=1,iommu-support=1" -- \
      --nb-cores=1 --total-num-mbufs=32768 -i --txpkts=64 --forward-mode="$fwd"
    wait_for 30 test -S "$SOCK" || die "testpmd net_vhost did not create $SOCK ($be_log)"
    wait_for 10 grep -q 'testpmd> ' "$be_log" || die "net_vhost testpmd did not start ($be_log)"
    bepid=$(child_pid "${TP_PID[be]}")
    tp be start; sleep 0.5
  fi
  role=tx; [ "$dir" = rx ] && role=drop
  t0=$(ticks "$bepid")
  timeout -k 5 $((DUR + 30)) "$PVNET_BIN" frontend --socket "$SOCK" --role "$role" --grants "$mode" \
    --frame-len 64 --secs "$DUR" --cpu 0 --idle-timeout 10 > "$fe_json" 2> "$B/$tag.fe.log" \
    || log "$tag: frontend exit status $? ($B/$tag.fe.log)"
  t1=$(ticks "$bepid")
  if [ "$impl" = pvnet ]; then
    stop_pid "$BE_TPID" INT; wait "$BE_TPID" 2>/dev/null || true; BE_TPID=
  else
    testpmd_quit be 20 || log "$tag: net_vhost testpmd did not quit cleanly"; hugepage_cleanup "$BE_PREFIX"
  fi
  c2c_b=$(c2c_ns)
  python3 "$PYLIB/bench_grants.py" result "$fe_json" "$t0" "$t1" "$TCK" "$dir" \
    "dir=$dir impl=$impl mode=$mode round=$round c2c_ns=$c2c_a/$c2c_b" | tee -a "$RES"
}

for r in $(seq "$ROUNDS"); do
  for dir in $DIRS; do
    order="$MODES"; [ $((r % 2)) = 0 ] && order=$(echo "$MODES" | tr ' ' '\n' | tac | tr '\n' ' ')
    for mode in $order; do
      for impl in $IMPLS; do run_one "$dir" "$impl" "$mode" "$r"; done
    done
  done
done

python3 "$PYLIB/bench_grants.py" summary "$RES" "$DOC" "$DUR"
