#!/usr/bin/env bash
# scripts/bench_nocopy.sh - pvnet's frontend receiving frames in place against copying them
# out, and its receive buffers sized by an EWMA against fixed sizes (docs/no-copy.md).
# A benchmark, not a test: it prints figures and ratios, and fails only when a run breaks.
#
# The receiver is always `pvnet frontend --role drop` on CPU0: it receives for DUR seconds from
# its first frame and drops every frame after reading its Ethernet header, either where the
# frame arrived (--rx-mode inplace) or from a copy of the whole frame into a buffer of its own
# (--rx-mode copy, what a `read` into an application buffer does). The sender runs on CPU1.
# Per run it reports the rate, the receiver's busy ns per frame (time inside receive calls that
# returned frames: the cost of receiving, whoever sets the pace), its CPU ns per frame (which
# includes polling while the sender is slower), receive buffers per frame, and memory held per
# byte of frame (sum of the buffers' true sizes over the frames' lengths).
#
#   drop    64-byte frames, copy against in place (EWMA buffers), from two senders:
#           pvnet = `pvnet backend --role gen`; dpdk = DPDK testpmd net_vhost in txonly mode
#           (pvnet's frontend is its vhost-user frontend).
#   sizing  pvnet backend gen frames of 64, 1514 and 65000 bytes (the last with --guest-tso, so
#           the buffers are sized for 64 KiB frames), received in place into fixed:1536,
#           fixed:4096 and ewma buffers.
#   copy    the sizing frames received with a copy, fixed:4096 against ewma, to show the copy's
#           share at each size.
# Runs are interleaved within each round (the order alternates between rounds) and the median
# is taken; the core-to-core latency is recorded before each run (`pvnet limits`), so that
# ratios are taken within one state.
#
# Usage: scripts/bench_nocopy.sh      Env: ROUNDS=3 DUR=3 EXPS="drop sizing copy"
#        SENDERS="pvnet dpdk"  DOC=docs/no-copy.md (DOC= to skip writing it)
#        QUIET_PCT=15 QUIET_WAIT=60 (wait for the CPUs to be quiet before each run)
# Wall time: ~6 s per run; the defaults make 84 runs: ~9 min.
source "$(dirname "$0")/lib/common.sh"
need_root
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-3}"; EXPS="${EXPS:-drop sizing copy}"; SENDERS="${SENDERS:-pvnet dpdk}"
DOC="${DOC-$PVNET_ROOT/docs/no-copy.md}"; QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"
case " $SENDERS " in *" dpdk "*) "$PEERS_DIR/setup.sh" > "$WORK/setup.log" 2>&1 || { tail "$WORK/setup.log"; die "setup failed"; } ;; esac
build_pvnet
B="$WORK/nocopy"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; PVNET_BIN="$B/pvnet"
RES="$B/results.txt"; : > "$RES"
SOCK="$B/vu.sock"; BE_PREFIX=pvnet_nocopy_$$_be
SENDER_PID=
cleanup() {
  testpmd_kill_all 2>/dev/null
  [ -n "$SENDER_PID" ] && stop_pid "$SENDER_PID"
  hugepage_cleanup "$BE_PREFIX"
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

# run_one EXP SENDER SIZE MODE BUFFERS : one receive-and-drop run; appends a result line.
run_one() {
  local exp="$1" sender="$2" size="$3" mode="$4" bufs="$5" tag="$1-$2-$3-$4-${5/:/}" c2c fe_extra=()
  [ "$size" -gt 2048 ] && fe_extra=(--guest-tso)
  wait_quiet; c2c=$(c2c_ns)
  rm -f "$SOCK"
  if [ "$sender" = pvnet ]; then
    timeout -k 5 $((DUR + 40)) "$PVNET_BIN" backend --socket "$SOCK" --role gen --frame-len "$size" \
      --secs $((DUR + 20)) --sessions 1 --cpu 1 > "$B/$tag.be.json" 2> "$B/$tag.be.log" &
    SENDER_PID=$!
    wait_for 10 test -S "$SOCK" || die "pvnet backend did not listen ($B/$tag.be.log)"
  else
    testpmd_start be "$B/$tag.be.log" $((DUR + 60)) -l 0,1 --main-lcore 0 --socket-mem 512 \
      --file-prefix "$BE_PREFIX" --no-pci --vdev "net_vhost0,iface=$SOCK,queues=1" -- \
      --nb-cores=1 --total-num-mbufs=32768 -i --txpkts="$size" --forward-mode=txonly
    wait_for 30 test -S "$SOCK" || die "testpmd net_vhost did not create $SOCK ($B/$tag.be.log)"
    wait_for 10 grep -q 'testpmd> ' "$B/$tag.be.log" || die "net_vhost testpmd did not start"
  fi
  timeout -k 5 $((DUR + 30)) "$PVNET_BIN" frontend --socket "$SOCK" --role drop --cpu 0 \
    --secs "$DUR" --idle-timeout 10 --rx-mode "$mode" --rx-buffers "$bufs" "${fe_extra[@]}" \
    > "$B/$tag.fe.json" 2> "$B/$tag.fe.log" &
  local fe=$!
  if [ "$sender" = dpdk ]; then
    wait_for 10 grep -q '"ready"' "$B/$tag.fe.json" || die "pvnet frontend did not connect ($B/$tag.fe.log)"
    tp be start
  fi
  wait "$fe" || die "$tag: pvnet frontend failed ($B/$tag.fe.log)"
  if [ "$sender" = pvnet ]; then stop_pid "$SENDER_PID" INT; wait "$SENDER_PID" 2>/dev/null || true; SENDER_PID=
  else testpmd_quit be 20 || log "$tag: testpmd did not quit cleanly"; hugepage_cleanup "$BE_PREFIX"; fi
  python3 "$PYLIB/bench_nocopy.py" result "$B/$tag.fe.json" "$exp" "$sender" "$size" "$mode" "$bufs" "$c2c" >> "$RES"
  log "$(tail -1 "$RES")"
}

for round in $(seq "$ROUNDS"); do
  runs=()
  for exp in $EXPS; do
    case "$exp" in
      drop) for s in $SENDERS; do for m in copy inplace; do runs+=("drop $s 64 $m ewma"); done; done ;;
      sizing) for z in 64 1514 65000; do for b in fixed:1536 fixed:4096 ewma; do runs+=("sizing pvnet $z inplace $b"); done; done ;;
      copy) for z in 64 1514 65000; do for b in fixed:4096 ewma; do runs+=("copy pvnet $z copy $b"); done; done ;;
      *) die "unknown experiment $exp (drop, sizing, copy)" ;;
    esac
  done
  # Alternate the order between rounds.
  if [ $((round % 2)) = 0 ]; then
    for ((i = ${#runs[@]} - 1; i >= 0; i--)); do read -ra r <<< "${runs[$i]}"; run_one "${r[@]}"; done
  else
    for r in "${runs[@]}"; do read -ra a <<< "$r"; run_one "${a[@]}"; done
  fi
done

python3 "$PYLIB/bench_nocopy.py" report "$RES" "$ROUNDS" "$DUR" > "$B/report.md"
cat "$B/report.md"
if [ -n "$DOC" ]; then
  { echo "Measured $(date -u +%Y-%m-%d) with \`ROUNDS=$ROUNDS DUR=$DUR EXPS=\"$EXPS\" SENDERS=\"$SENDERS\" scripts/bench_nocopy.sh\`."; echo; cat "$B/report.md"; } > "$B/section.md"
  doc_section "$DOC" bench "$B/section.md"
  log "wrote $DOC"
fi
