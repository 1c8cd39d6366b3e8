#!/usr/bin/env bash
# scripts/bench_egress_paced.sh - bulk dequeue against one packet per dequeue with a standing
# backlog, real processes over real vhost-user rings (docs/egress.md). A benchmark, not a test:
# it prints figures and ratios, and fails only when a run breaks.
#
# `pvnet switch` (CPU1) has two vhost-user ports. Port `a` is a pvnet frontend sending 64-byte
# frames at SEND_PPS; port `b` is a pvnet frontend receiving them at RECV_PPS < SEND_PPS
# (`--role drop --rate`): it takes RECV_BURST frames each time they are due and gives the
# buffers back, and what it has not taken stays in its RECV_RING-entry ring. So b's ring is
# full, a backlog stands in b's egress queue (its limit, 1024, holds the excess until it
# drops at the tail) and every round the switch drains as many as b has given back. Both
# frontends are paced in bursts and sleep between them (`--paced-batches`), so they share CPU0
# without taking it from each other. The switch's cost is what it spent in rounds that moved
# packets (`pvnet ctl`'s busy_secs: polling empty rings and sleeping excluded) over the
# packets it delivered to b, over a window of DUR seconds after a warm-up: taking a's
# frames, queueing them, dropping the excess and draining the queue, all included.
#
# Configurations of b's egress: fifo and fq_codel + DQL (the default), each with bulk=true
# (one batch per drain: one publish, one call decision) and bulk=false (one packet per
# dequeue, each its own publish). Runs interleaved, the order reversed every round; medians.
#
# Latency under load (PARTS=latency): the same bulk sender and paced receiver, and a third
# frontend `r` running request/response (`--role rr`, one request in flight) against the
# receiver, which answers requests (`--role echo`, the rest dropped as before): requests
# cross b's congested egress, answers go back through r's uncongested one. p50/p99 of the
# round trip per configuration of b's egress: fifo and fq_codel, each with and without DQL,
# and no queue (qdisc=none: packets wait in their sender). Each request's one-way delay, from
# the client's send to the receiver's take (both read CLOCK_MONOTONIC), is the receiver's
# figure: what b's egress, b's ring and the receiver's pace make a request wait, without the
# answer's way back (the client's wake-up on its CPU, which no egress touches). The client
# runs on RR_CPU (0: with the receiver and the sender). The pseudo-configuration `floor`
# (in LCFGS_ONLY) runs the request loop with the bulk sender off, b's egress at its default:
# the harness's own round trip (three frontends sharing CPU0, the receiver's pace), under
# which no egress can bring a request.
#
# Usage: scripts/bench_egress_paced.sh   Env: PARTS="bulk latency" ROUNDS=3 DUR=4
#        SEND_PPS=2200000 RECV_PPS=2000000 RECV_BURST=64 RECV_RING=256 RR_CPU=0
#        RR_POLICY= (the client's --policy; its default, adaptive, when empty)
#        DOC=docs/egress.md (DOC= to skip)
#        LCFGS_ONLY="qdisc=fifo,dql=false qdisc=fq_codel,dql=true" (latency: only these
#        configurations of b's egress; include qdisc=fifo,dql=false, the table's base)
# Wall time: ~9 s per run: ~2 min per part with the defaults.
source "$(dirname "$0")/lib/common.sh"
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-4}"; SEND_PPS="${SEND_PPS:-2200000}"; RECV_PPS="${RECV_PPS:-2000000}"
RECV_BURST="${RECV_BURST:-64}"; RECV_RING="${RECV_RING:-256}"; WARM=2; PARTS="${PARTS:-bulk latency}"
RR_CPU="${RR_CPU:-0}"; RR_POLICY="${RR_POLICY:-}"
DOC="${DOC-$PVNET_ROOT/docs/egress.md}"; QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"
[ "$RECV_PPS" -lt "$SEND_PPS" ] || die "RECV_PPS ($RECV_PPS) must be below SEND_PPS ($SEND_PPS): no backlog otherwise"
CMD="ROUNDS=$ROUNDS DUR=$DUR SEND_PPS=$SEND_PPS RECV_PPS=$RECV_PPS RECV_BURST=$RECV_BURST RECV_RING=$RECV_RING RR_CPU=$RR_CPU${RR_POLICY:+ RR_POLICY=$RR_POLICY} scripts/bench_egress_paced.sh"
build_pvnet
B="$WORK/egress-paced"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; PVNET_BIN="$B/pvnet"
RES="$B/results.txt"; : > "$RES"; LAT="$B/latency.txt"; : > "$LAT"
PIDS=()
cleanup() { local p; for p in "${PIDS[@]}"; do stop_pid "$p" INT; done; return 0; }
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

CFGS=("qdisc=fifo,bulk=true" "qdisc=fifo,bulk=false" "qdisc=fq_codel,dql=true,bulk=true" "qdisc=fq_codel,dql=true,bulk=false")
LCFGS=("qdisc=fifo,dql=false" "qdisc=fifo,dql=true" "qdisc=fq_codel,dql=false" "qdisc=fq_codel,dql=true,dql_target_us=0" "qdisc=fq_codel,dql=true" "qdisc=none")
[ -n "${LCFGS_ONLY:-}" ] && read -r -a LCFGS <<< "$LCFGS_ONLY"

# start_runs CFG TAG [rr]: the switch, the paced receiver (an echo with rr), the bulk sender
# (not for CFG `floor`: b's egress then at its default), and with rr the request/response
# client for DUR s after the warm-up; sets SW RX TX RR.
start_runs() {
  local cfg="$1" tag="$2" role=drop more=() bulk=1
  [ "$cfg" = floor ] && { cfg="qdisc=fq_codel"; bulk=; }
  [ -n "${3:-}" ] && { role=echo; more=(--port "vhost-user:name=r,socket=$B/r.sock"); }
  rm -f "$B"/*.sock
  timeout -k 5 60 "$PVNET_BIN" switch --cpu 1 --ctl-socket "$B/ctl.sock" \
    --port "vhost-user:name=a,socket=$B/a.sock" --port "vhost-user:name=b,socket=$B/b.sock,$cfg" "${more[@]}" \
    > "$B/$tag.sw.json" 2> "$B/$tag.sw.log" &
  SW=$!; PIDS=("$SW")
  wait_for 10 test -S "$B/b.sock" || die "pvnet switch did not start ($B/$tag.sw.log)"
  # --announce: the switch learns the receiver's address, so the sender's frames (and the
  # requests) go to it alone.
  timeout -k 5 60 "$PVNET_BIN" frontend --socket "$B/b.sock" --role "$role" --announce --cpu 0 --rate "$RECV_PPS" \
    --paced-batches --batch "$RECV_BURST" --queue-size "$RECV_RING" --secs $((WARM + DUR + 2)) --idle-timeout 10 \
    > "$B/$tag.rx.json" 2> "$B/$tag.rx.log" &
  RX=$!; PIDS+=("$RX")
  wait_for 10 grep -q '"ready"' "$B/$tag.rx.json" || die "receiver did not connect ($B/$tag.rx.log)"
  TX=
  if [ -n "$bulk" ]; then
    timeout -k 5 60 "$PVNET_BIN" frontend --socket "$B/a.sock" --role tx --cpu 0 --rate "$SEND_PPS" \
      --paced-batches --batch 256 --queue-size 1024 --secs $((WARM + DUR + 3)) \
      > "$B/$tag.tx.json" 2> "$B/$tag.tx.log" &
    TX=$!; PIDS+=("$TX")
  fi
  sleep "$WARM"
  RR=
  if [ -n "${3:-}" ]; then
    timeout -k 5 60 "$PVNET_BIN" frontend --socket "$B/r.sock" --role rr --flows 1 --cpu "$RR_CPU" ${RR_POLICY:+--policy "$RR_POLICY"} --secs "$DUR" \
      > "$B/$tag.rr.json" 2> "$B/$tag.rr.log" &
    RR=$!; PIDS+=("$RR")
  fi
}

# stop_runs TAG: waits for the frontends, stops the switch.
stop_runs() {
  [ -n "$RR" ] && { wait "$RR" || die "rr client failed ($B/$1.rr.log)"; }
  wait "$RX" || die "receiver failed ($B/$1.rx.log)"
  [ -z "$TX" ] || wait "$TX" || die "sender failed ($B/$1.tx.log)"
  stop_pid "$SW" INT; wait "$SW" 2>/dev/null; PIDS=()
}

run_lat() {   # run_lat CFG ROUND
  local cfg="$1" round="$2" tag c2c
  tag="lat-$(echo "$cfg" | tr ',=' '_-')-$round"
  wait_quiet; c2c=$(c2c_ns)
  start_runs "$cfg" "$tag" rr
  sleep 1
  "$PVNET_BIN" ctl --ctl-socket "$B/ctl.sock" --json > "$B/$tag.c0.json" || die "ctl failed ($B/$tag.sw.log)"
  sleep $((DUR - 1))
  "$PVNET_BIN" ctl --ctl-socket "$B/ctl.sock" --json > "$B/$tag.c1.json" || die "ctl failed ($B/$tag.sw.log)"
  stop_runs "$tag"
  c2c="$c2c/$(c2c_ns)"
  python3 "$PYLIB/bench_egress_paced.py" latency "$cfg" "$round" "$c2c" "$B/$tag.c0.json" "$B/$tag.c1.json" "$B/$tag.rr.json" "$B/$tag.rx.json" \
    | tee -a "$LAT"
}

run_one() {   # run_one CFG ROUND
  local cfg="$1" round="$2" tag c2c
  tag="$(echo "$cfg" | tr ',=' '_-')-$round"
  wait_quiet; c2c=$(c2c_ns)
  start_runs "$cfg" "$tag"
  "$PVNET_BIN" ctl --ctl-socket "$B/ctl.sock" --json > "$B/$tag.c0.json" || die "ctl failed ($B/$tag.sw.log)"
  sleep "$DUR"
  "$PVNET_BIN" ctl --ctl-socket "$B/ctl.sock" --json > "$B/$tag.c1.json" || die "ctl failed ($B/$tag.sw.log)"
  stop_runs "$tag"
  c2c="$c2c/$(c2c_ns)"
  python3 "$PYLIB/bench_egress_paced.py" bulk "$cfg" "$round" "$c2c" "$B/$tag.c0.json" "$B/$tag.c1.json" | tee -a "$RES"
}

# summarize PART RESULTS OUT : the table of a part from its RESULT lines.
summarize() {
  python3 "$PYLIB/bench_egress_paced.py" summary "$1" "$2" "$3" "$SEND_PPS" "$RECV_PPS"
}

rounds() {   # rounds FN CFG...: ROUNDS rounds of FN over the configurations, the order reversed every other round
  local fn="$1" r i; shift
  local cfgs=("$@") order
  for r in $(seq "$ROUNDS"); do
    order=("${cfgs[@]}")
    if [ $((r % 2)) = 0 ]; then order=(); for ((i = ${#cfgs[@]} - 1; i >= 0; i--)); do order+=("${cfgs[$i]}"); done; fi
    for c in "${order[@]}"; do "$fn" "$c" "$r"; done
  done
}

if [[ " $PARTS " == *" bulk "* ]]; then
log "bulk: egress of a paced receiver, $ROUNDS rounds x ${#CFGS[@]} configurations, $SEND_PPS pps offered, $RECV_PPS pps taken"
rounds run_one "${CFGS[@]}"

summarize bulk "$RES" "$B/summary.md"

if [ -n "$DOC" ]; then doc_results "$DOC" bench_egress_paced "PARTS=bulk $CMD" "$B/summary.md" "$RES"; fi
fi

if [[ " $PARTS " == *" latency "* ]]; then
log "latency: rr through the egress of a paced receiver, $ROUNDS rounds x ${#LCFGS[@]} configurations"
rounds run_lat "${LCFGS[@]}"
summarize latency "$LAT" "$B/lat.md"
if [ -n "$DOC" ]; then doc_results "$DOC" bench_egress_paced_latency "PARTS=latency $CMD" "$B/lat.md" "$LAT"; fi
fi
