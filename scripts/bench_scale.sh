#!/usr/bin/env bash
# scripts/bench_scale.sh - how pvnet's cost scales with queue pairs, workers, ports and load.
# A benchmark, not a test: it prints figures and ratios, writes docs/scale.md's tables, and
# fails only when a run breaks. Parts (PARTS, default all four):
#
#   mq       DPDK testpmd net_virtio_user with 1 and with 2 queue pairs against `pvnet switch`
#            and against DPDK net_vhost with the same number of queues
#            (scripts/peers/bench_dpdk.sh QUEUES=1 / QUEUES=2, interleaved round by round):
#            2 pairs / 1 pair on one worker, and pvnet / DPDK with 2 pairs. The switch's gen
#            port (h2v) carries MQ_FLOWS flows (default 64) with 1 pair as with 2: the same
#            traffic, so that the ratio is what the second pair costs.
#   load     `pvnet backend --role sink`, one worker (CPU1), pvnet frontends (CPU0): one port
#            at its saturation rate, then paced at 10 % of it (CPU share against the saturated
#            one); 1, 16 and 64 connected ports with one of them paced at 10 K, 100 K and 1 M
#            frames/s (CPU share against offered load); 64 ports with 4 of them at 10 Kpps
#            each against 1 of them at 40 Kpps.
#   workers  `pvnet backend --role sink` with 2 ports each paced at RATE_W (default 1 Mpps),
#            on 1 worker and on 2 workers (--workers 2, one port each): worker CPU ns per frame.
#            (On this 2-CPU machine the second worker shares CPU0 with the frontends.)
#   idle     64 idle ports (scripts/bench_idle_ports.sh).
#   coalesce the load part's one-port points again, under the adaptive policy and under
#            `--policy coalesce:CO_US` with CO_QSIZE-entry rings (default 1000 us, 8192), in one
#            run: saturated, 10 % of saturation, 10 K, 100 K and 1 M frames/s (CPU share
#            against offered load, what interrupt moderation trades for latency). Its table
#            goes to its own section of docs/scale.md (bench_coalesce), so it runs alone.
#
# CPU share: user+sys ticks of the backend's worker threads (pvnet-shard*) over the window,
# in % of one CPU (10 ms ticks: ~0.1 % resolution over 10 s). The c2c state (pvnet limits)
# is recorded before each part: rates follow it.
# Usage: scripts/bench_scale.sh   Env: PARTS="mq load workers idle" (coalesce: on request)
#        ROUNDS=3 W=8 (s per load point) RATE_W=1000000 CO_US=1000 CO_QSIZE=8192
#        W_POLICY=adaptive W_QSIZE=256 (the workers part's backend policy and ring size)
#        DOC=docs/scale.md (DOC= to skip)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/lib/common.sh"
need_root
PARTS="${PARTS:-mq load workers idle}"; ROUNDS="${ROUNDS:-3}"; W="${W:-8}"; RATE_W="${RATE_W:-1000000}"
W_POLICY="${W_POLICY:-adaptive}"; W_QSIZE="${W_QSIZE:-256}"
DOC="${DOC-$ROOT/docs/scale.md}"
build_pvnet
bench_dir scale
TCK=$(getconf CLK_TCK)

# shard_ticks PID: user+sys ticks of the process's pvnet-shard* threads.
shard_ticks() {
  local t s=0
  for t in /proc/"$1"/task/*; do
    grep -q '^pvnet-shard' "$t/comm" 2>/dev/null || continue
    s=$((s + $(awk '{print $14 + $15}' "$t/stat")))
  done
  echo "$s"
}

# load_point NAME PORTS ACTIVE RATE [SHARDS] [POLICY] [QSIZE]: a sink backend (polling
# POLICY, default adaptive), PORTS frontends (rings of QSIZE entries, default 256) of which
# ACTIVE send at RATE frames/s each (0: as fast as they can); prints one LOAD line: the
# workers' CPU share over W s, frames sent in the window, CPU ns per frame.
load_point() {
  local name="$1" ports="$2" active="$3" rate="$4" shards="${5:-1}" policy="${6:-adaptive}" qsize="${7:-256}"
  local sock="$B/$1.sock" i be c2c_a c2c_b
  rm -f "$sock"
  c2c_a=$(c2c)
  PVNET_LOG=warn timeout $((W + 40)) "$PV" backend --socket "$sock" --role sink --cpu 1 --workers "$shards" \
    --policy "$policy" > "$B/$name.be.json" 2> "$B/$name.be.log" &
  be=$!; PIDS+=("$be")
  wait_for 10 test -S "$sock" || die "$name: backend did not listen"
  local bepid; bepid=$(child_pid "$be")
  local secs=$((W + 6)) fes=()
  for i in $(seq 1 $((ports - active))); do
    taskset -c 0 "$PV" frontend --socket "$sock" --role idle --queue-size "$qsize" --secs $((secs + 2)) > /dev/null 2>&1 &
    PIDS+=($!)
  done
  for i in $(seq 1 "$active"); do
    taskset -c 0 "$PV" frontend --socket "$sock" --role tx --rate "$rate" --queue-size "$qsize" --secs "$secs" > "$B/$name.fe$i.json" 2> /dev/null &
    fes+=($!); PIDS+=($!)
  done
  sleep 3
  local t0 t1 s0 s1
  t0=$(shard_ticks "$bepid"); s0=$(date +%s.%N)
  sleep "$W"
  t1=$(shard_ticks "$bepid"); s1=$(date +%s.%N)
  for i in "${fes[@]}"; do wait "$i" || true; done
  kill -INT "$be" 2>/dev/null; wait "$be" 2>/dev/null || true
  c2c_b=$(c2c)
  python3 "$PYLIB/bench_scale.py" load "$name" "$ports" "$active" "$rate" "$shards" "$t0" "$t1" "$s0" "$s1" "$TCK" "$secs" "$B" \
    "$policy" "$qsize" "$c2c_a/$c2c_b" | tee -a "$OUT"
}

# pps_of NAME: the frames/s of the last LOAD line of load point NAME.
pps_of() {
  awk -v n="$1" '$1 == "LOAD" && $2 == "name=" n {for(i=1;i<=NF;i++) if($i ~ /^pps=/) {sub("pps=","",$i); print $i}}' "$OUT" | tail -1
}

export MQ_FLOWS="${MQ_FLOWS:-64}"
if [[ " $PARTS " == *" mq "* ]]; then
  log "mq: $ROUNDS rounds of bench_dpdk.sh QUEUES=1 and QUEUES=2 (v2h, h2v; 64 B; switch, dpdk)"
  for r in $(seq "$ROUNDS"); do
    for q in 1 2; do
      FLOWS="$MQ_FLOWS" QUEUES=$q ROUNDS=1 SIZES=64 DOC= IMPLS="switch dpdk" PVNET_NO_BUILD=1 "$ROOT/scripts/peers/bench_dpdk.sh" 2>&1 |
        grep '^RESULT' | sed "s/round=1/round=$r/" | tee -a "$OUT"
    done
  done
fi

if [[ " $PARTS " == *" load "* ]]; then
  log "load: c2c $(c2c) ns"
  load_point sat 1 1 0
  sat=$(pps_of sat)
  load_point tenth 1 1 $((sat / 10))
  for p in 1 16 64; do
    for r in 10000 100000 1000000; do load_point "p$p-r$r" "$p" 1 "$r"; done
  done
  load_point four64 64 4 10000
  load_point one64 64 1 40000
fi

if [[ " $PARTS " == *" coalesce "* ]]; then
  CO_US="${CO_US:-1000}"; CO_QSIZE="${CO_QSIZE:-8192}"
  log "coalesce: c2c $(c2c) ns; adaptive against coalesce:$CO_US, $CO_QSIZE-entry rings, interleaved"
  for pol in adaptive "coalesce:$CO_US"; do
    load_point "co-sat-$pol" 1 1 0 1 "$pol" "$CO_QSIZE"
  done
  cosat=$(pps_of co-sat-adaptive)
  for r in $((cosat / 10)) 1000000 100000 10000; do
    for pol in adaptive "coalesce:$CO_US"; do
      load_point "co-r$r-$pol" 1 1 "$r" 1 "$pol" "$CO_QSIZE"
    done
  done
fi

if [[ " $PARTS " == *" workers "* ]]; then
  log "workers: c2c $(c2c) ns"
  for r in $(seq "$ROUNDS"); do
    load_point "w1-$r" 2 2 "$RATE_W" 1 "$W_POLICY" "$W_QSIZE"
    load_point "w2-$r" 2 2 "$RATE_W" 2 "$W_POLICY" "$W_QSIZE"
  done
fi

if [[ " $PARTS " == *" idle "* ]]; then
  log "idle: c2c $(c2c) ns"
  PVNET_BIN="$PV" N=64 W=10 "$ROOT/scripts/bench_idle_ports.sh" | sed 's/^/IDLE /' | tee -a "$OUT"
fi

# ---- summary ------------------------------------------------------------------------------------
python3 "$PYLIB/bench_scale.py" summary "$OUT" "$B/summary.md" "$B/coalesce.md"

run_line() { echo "Run: $(date -u +%Y-%m-%dT%H:%MZ), \`PARTS=\"$PARTS\" ROUNDS=$ROUNDS W=$W${CO_US:+ CO_US=$CO_US CO_QSIZE=$CO_QSIZE} scripts/bench_scale.sh\`, pvnet $(git -C "$ROOT" describe --always --dirty 2>/dev/null), $(nproc) CPUs."; }
if [ -n "$DOC" ] && [ -s "$B/coalesce.md" ] && grep -q '<!-- bench_coalesce:begin -->' "$DOC"; then
  { run_line; echo; cat "$B/coalesce.md"; echo; echo "<details><summary>raw lines</summary>"; echo; echo '```'
    grep '^LOAD name=co-' "$OUT"; echo '```'; echo; echo "</details>"; } > "$B/co-section.md"
  doc_section "$DOC" bench_coalesce "$B/co-section.md"
  log "coalescing table written to $DOC"
fi
# The parts other than coalesce own the bench_scale section: written only when one of them ran.
others=$(tr ' ' '\n' <<< "$PARTS" | grep -v -x -e coalesce -e '' | wc -l)
if [ -n "$DOC" ] && [ "$others" -gt 0 ] && [ -f "$DOC" ] && grep -q '<!-- bench_scale:begin -->' "$DOC"; then
  {
    run_line
    echo; cat "$B/summary.md"
    echo "<details><summary>raw lines</summary>"; echo; echo '```'; cat "$OUT"; echo '```'; echo; echo "</details>"
  } > "$B/section.md"
  doc_section "$DOC" bench_scale "$B/section.md"
  log "tables written to $DOC"
fi
log "results: $OUT"
