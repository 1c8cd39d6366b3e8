#!/usr/bin/env bash
# scripts/bench_rebalance.sh - does moving a port off a saturated worker pay, here?
# A benchmark, not a test: it prints figures and the paired ratio, writes a table into
# docs/scale.md, and fails only when a run breaks.
#
# The layout: `pvnet switch --workers 2` with vhost-user ports a, b, c and a sink s, placed by
# count in that order (a and c on worker 0, b and s on worker 1; `pvnet ctl port move c 0`
# makes sure of c): worker 0 carries both senders, worker 1 only the sink's
# side of their flood (b has no frontend). Two pvnet frontends send 64-byte frames on a and
# c as fast as they can for SECS seconds. Each round runs the switch once with
# --rebalance true (the balancer should move a or c to worker 1 after about 3 s) and once
# with --rebalance false (static), in alternating order.
#
# Per run: the frames the frontends sent in the second half of the run (after the move) and
# over all of it, the switch's CPU time per frame, the moves made and how long the workers
# were paused for each, and the c2c state (pvnet limits) just before. The frontends, the two
# workers and the control thread share this machine's 2 CPUs: a frontend's rate is also its
# CPU share, so the figure is what the whole machine does, not a worker's capacity.
# Usage: scripts/bench_rebalance.sh   Env: ROUNDS=3 SECS=24 DOC=docs/scale.md (DOC= to skip)
#        SW_CPU=N pins the switch's workers (worker k on CPU N+k), FE_CPU=N both frontends,
#        SPARE=1 tells the balancer a CPU is idle (--rebalance-spare) instead of measuring:
#        here none is, and it moves nothing on its own measurement.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/lib/common.sh"
ROUNDS="${ROUNDS:-3}"; SECS="${SECS:-24}"
DOC="${DOC-$ROOT/docs/scale.md}"
build_pvnet
bench_dir rebalance
TCK=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run() { # run ROUND REBALANCE
  local round="$1" reb="$2" d="$B/r$1-$2" c2 sw t0 t1 p
  mkdir -p "$d"; c2=$(c2c)
  PVNET_LOG=info "$PV" switch --workers 2 ${SW_CPU:+--cpu "$SW_CPU"} --rebalance "$reb" ${SPARE:+--rebalance-spare "$SPARE"} --ctl-socket "$d/ctl" \
    --port "vhost-user:name=a,socket=$d/a.sock" --port "vhost-user:name=b,socket=$d/b.sock" \
    --port "vhost-user:name=c,socket=$d/c.sock" --port sink:name=s \
    --secs "$((SECS + 4))" > "$d/switch.json" 2> "$d/switch.log" &
  sw=$!; PIDS+=("$sw")
  wait_for 10 test -S "$d/ctl" || die "switch did not start ($d/switch.log)"
  "$PV" ctl --ctl-socket "$d/ctl" port move c 0 > "$d/move.txt" || die "move c 0 failed"
  t0=$(ticks "$sw")
  for p in a c; do
    "$PV" frontend --socket "$d/$p.sock" --role tx --secs "$SECS" ${FE_CPU:+--cpu "$FE_CPU"} > "$d/fe-$p.json" 2> "$d/fe-$p.log" &
    PIDS+=("$!")
  done
  sleep "$((SECS + 1))"
  t1=$(ticks "$sw")
  wait "$sw" || true
  python3 "$PYLIB/bench_rebalance.py" run "$round" "$reb" "$c2" "$d" "$t0" "$t1" "$TCK" | tee -a "$OUT"
}

for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="true false"; else order="false true"; fi
  for reb in $order; do log "round $r rebalance=$reb"; run "$r" "$reb"; done
done

python3 "$PYLIB/bench_rebalance.py" summary "$OUT" "$B/section.md" "$ROUNDS" "$SECS"
if [ -n "$DOC" ] && [ -f "$DOC" ]; then
  doc_section "$DOC" "bench_rebalance${SPARE:+_spare}" "$B/section.md"
  log "table written to $DOC"
fi
