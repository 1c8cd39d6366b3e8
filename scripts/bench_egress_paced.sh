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
# frontends are paced in bursts and sleep between them (`--paced-bursts`), so they share CPU0
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
# and no queue (qdisc=none: packets wait in their sender).
#
# Usage: scripts/bench_egress_paced.sh   Env: PARTS="bulk latency" ROUNDS=3 DUR=4
#        SEND_PPS=2200000 RECV_PPS=2000000 RECV_BURST=64 RECV_RING=256
#        DOC=docs/egress.md (DOC= to skip)
# Wall time: ~9 s per run: ~2 min per part with the defaults.
source "$(dirname "$0")/peers/lib.sh"
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-4}"; SEND_PPS="${SEND_PPS:-2200000}"; RECV_PPS="${RECV_PPS:-2000000}"
RECV_BURST="${RECV_BURST:-64}"; RECV_RING="${RECV_RING:-256}"; WARM=2; PARTS="${PARTS:-bulk latency}"
DOC="${DOC-$PVNET_ROOT/docs/egress.md}"; QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"
[ "$RECV_PPS" -lt "$SEND_PPS" ] || die "RECV_PPS ($RECV_PPS) must be below SEND_PPS ($SEND_PPS): no backlog otherwise"
CMD="ROUNDS=$ROUNDS DUR=$DUR SEND_PPS=$SEND_PPS RECV_PPS=$RECV_PPS RECV_BURST=$RECV_BURST RECV_RING=$RECV_RING scripts/bench_egress_paced.sh"
build_pvnet
B="$WORK/egress-paced"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; PVNET_BIN="$B/pvnet"
RES="$B/results.txt"; : > "$RES"; LAT="$B/latency.txt"; : > "$LAT"
PIDS=()
cleanup() { local p; for p in "${PIDS[@]}"; do stop_pid "$p" INT; done; return 0; }
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

CFGS=("qdisc=fifo,bulk=true" "qdisc=fifo,bulk=false" "qdisc=fq_codel,dql=true,bulk=true" "qdisc=fq_codel,dql=true,bulk=false")
LCFGS=("qdisc=fifo,dql=false" "qdisc=fifo,dql=true" "qdisc=fq_codel,dql=false" "qdisc=fq_codel,dql=true" "qdisc=none")

# start_runs CFG TAG [rr]: the switch, the paced receiver (an echo with rr), the bulk sender,
# and with rr the request/response client for DUR s after the warm-up; sets SW RX TX RR.
start_runs() {
  local cfg="$1" tag="$2" role=drop more=()
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
    --paced-bursts --burst "$RECV_BURST" --queue-size "$RECV_RING" --secs $((WARM + DUR + 2)) --idle-timeout 10 \
    > "$B/$tag.rx.json" 2> "$B/$tag.rx.log" &
  RX=$!; PIDS+=("$RX")
  wait_for 10 grep -q '"ready"' "$B/$tag.rx.json" || die "receiver did not connect ($B/$tag.rx.log)"
  timeout -k 5 60 "$PVNET_BIN" frontend --socket "$B/a.sock" --role tx --cpu 0 --rate "$SEND_PPS" \
    --paced-bursts --burst 256 --queue-size 1024 --secs $((WARM + DUR + 3)) \
    > "$B/$tag.tx.json" 2> "$B/$tag.tx.log" &
  TX=$!; PIDS+=("$TX")
  sleep "$WARM"
  RR=
  if [ -n "${3:-}" ]; then
    timeout -k 5 60 "$PVNET_BIN" frontend --socket "$B/r.sock" --role rr --flows 1 --cpu 0 --secs "$DUR" \
      > "$B/$tag.rr.json" 2> "$B/$tag.rr.log" &
    RR=$!; PIDS+=("$RR")
  fi
}

# stop_runs TAG: waits for the frontends, stops the switch.
stop_runs() {
  [ -n "$RR" ] && { wait "$RR" || die "rr client failed ($B/$1.rr.log)"; }
  wait "$RX" || die "receiver failed ($B/$1.rx.log)"
  wait "$TX" || die "sender failed ($B/$1.tx.log)"
  stop_pid "$SW" INT; wait "$SW" 2>/dev/null; PIDS=()
}

run_lat() {   # run_lat CFG ROUND
  local cfg="$1" round="$2" tag c2c
  tag="lat-$(echo "$cfg" | tr ',=' '_-')-$round"
  wait_quiet; c2c=$(c2c_ns)
  start_runs "$cfg" "$tag" rr
  sleep 1
  "$PVNET_BIN" ctl --socket "$B/ctl.sock" --json > "$B/$tag.c0.json" || die "ctl failed ($B/$tag.sw.log)"
  sleep $((DUR - 1))
  "$PVNET_BIN" ctl --socket "$B/ctl.sock" --json > "$B/$tag.c1.json" || die "ctl failed ($B/$tag.sw.log)"
  stop_runs "$tag"
  c2c="$c2c/$(c2c_ns)"
  python3 - "$cfg" "$round" "$c2c" "$B/$tag.c0.json" "$B/$tag.c1.json" "$B/$tag.rr.json" <<'PY' | tee -a "$LAT"
import json, sys
cfg, rnd, c2c, f0, f1, frr = sys.argv[1:]
a, b = json.load(open(f0)), json.load(open(f1))
def ctr(d, name):
    return [p for p in d["ports"] if p["name"] == name][0]["counters"]
dt = b["uptime_secs"] - a["uptime_secs"]
# b's delivered packets: the bulk sender's and the requests (a few thousand a second).
mpps = (ctr(b, "b")["tx_packets"] - ctr(a, "b")["tx_packets"]) / dt / 1e6
rr = [json.loads(l)["final"] for l in open(frr) if l.startswith('{"final"')][0]
print("RESULT cfg=%s round=%s c2c_ns=%s rr_p50_us=%.1f rr_p99_us=%.1f rr_per_sec=%.0f transactions=%d lost=%d strays=%d bulk_mpps=%.3f dql_limit=%d"
      % (cfg, rnd, c2c, rr["p50_us"], rr["p99_us"], rr["rr_per_sec"], rr["transactions"], rr["lost"], rr["strays"], mpps,
         ctr(b, "b")["dql_limit"]))
PY
}

run_one() {   # run_one CFG ROUND
  local cfg="$1" round="$2" tag c2c
  tag="$(echo "$cfg" | tr ',=' '_-')-$round"
  wait_quiet; c2c=$(c2c_ns)
  start_runs "$cfg" "$tag"
  "$PVNET_BIN" ctl --socket "$B/ctl.sock" --json > "$B/$tag.c0.json" || die "ctl failed ($B/$tag.sw.log)"
  sleep "$DUR"
  "$PVNET_BIN" ctl --socket "$B/ctl.sock" --json > "$B/$tag.c1.json" || die "ctl failed ($B/$tag.sw.log)"
  stop_runs "$tag"
  c2c="$c2c/$(c2c_ns)"
  python3 - "$cfg" "$round" "$c2c" "$B/$tag.c0.json" "$B/$tag.c1.json" <<'PY' | tee -a "$RES"
import json, sys
cfg, rnd, c2c, f0, f1 = sys.argv[1:]
a, b = json.load(open(f0)), json.load(open(f1))
def ctr(d, name):
    return [p for p in d["ports"] if p["name"] == name][0]["counters"]
A0, A1, B0, B1 = ctr(a, "a"), ctr(b, "a"), ctr(a, "b"), ctr(b, "b")
dt = b["uptime_secs"] - a["uptime_secs"]
w0, w1 = a["workers"][0], b["workers"][0]
busy, cpu = (w1["busy_secs"] - w0["busy_secs"]) * 1e9, (w1["cpu_secs"] - w0["cpu_secs"]) * 1e9
d = lambda k: B1[k] - B0[k]
took, deliv = A1["rx_packets"] - A0["rx_packets"], d("tx_packets")
drops = sum(B1[k] - B0[k] for k in B1 if k.startswith("drops_"))
# What the switch took from a = delivered to b + dropped + the change in b's backlog.
gap = took - deliv - drops - (B1["backlog"] - B0["backlog"])
print("RESULT cfg=%s round=%s c2c_ns=%s took_mpps=%.3f mpps=%.3f busy_ns_per_pkt=%.1f cpu_ns_per_pkt=%.1f from_queue=%.3f "
      "per_dequeue=%.1f publishes_per_pkt=%.3f calls_per_pkt=%.4f drop_share=%.3f dql_limit=%d unaccounted=%d"
      % (cfg, rnd, c2c, took / dt / 1e6, deliv / dt / 1e6, busy / max(deliv, 1), cpu / max(deliv, 1),
         d("dequeued") / max(deliv, 1), d("dequeued") / max(d("dequeues"), 1), d("tx_batches") / max(deliv, 1),
         d("calls") / max(deliv, 1), drops / max(took, 1), B1["dql_limit"], gap))
PY
}

# summarize PART RESULTS OUT : the table of a part from its RESULT lines.
summarize() {
  python3 - "$2" "$3" "$SEND_PPS" "$RECV_PPS" "$1" <<'PY'
import sys, statistics as st
rows = [dict(kv.split("=", 1) for kv in l.split()[1:]) for l in open(sys.argv[1]) if l.startswith("RESULT")]
send, recv = int(sys.argv[3]) / 1e6, int(sys.argv[4]) / 1e6
def med(cfg, k):
    return st.median([float(r[k]) for r in rows if r["cfg"] == cfg])
c2c = sorted(float(x) for r in rows for x in r["c2c_ns"].split("/"))
if sys.argv[5] == "bulk":
    out = ["Core-to-core latency over the runs: %.0f-%.0f ns. Offered %.2f Mpps, taken %.2f Mpps; medians of %d runs each." %
           (c2c[0], c2c[-1], send, recv, len(rows) // 4), "",
           "| egress of b | dequeue | delivered Mpps | switch busy ns per delivered packet | delivered from the queue | packets per dequeue | publishes per packet | dropped (queue limit) | counts add up | bulk vs one |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for q, name in (("qdisc=fifo", "fifo"), ("qdisc=fq_codel,dql=true", "fq_codel + DQL")):
        one = med(q + ",bulk=false", "busy_ns_per_pkt")
        for bulk in ("true", "false"):
            c = q + ",bulk=" + bulk
            # The counters are read while the switch runs, so a window's ends may fall inside
            # a round: exact up to one round's packets (the tests check the exact counts).
            ok = all(abs(int(r["unaccounted"])) <= 256 for r in rows if r["cfg"] == c)
            ratio = "1x"
            if bulk == "true":
                # Paired: the two runs of a round sit side by side; a pair counts only when both
                # ran in one core-to-core state, before and after each (fast < 75 ns <= mid <
                # 150 ns <= slow).
                def state(v):
                    s = {"fast" if ns < 75 else "mid" if ns < 150 else "slow" for ns in map(float, v.split("/"))}
                    return s.pop() if len(s) == 1 else "mixed"
                pairs = []
                for r in sorted({r["round"] for r in rows}):
                    x = [r2 for r2 in rows if r2["round"] == r and r2["cfg"] == c]
                    y = [r2 for r2 in rows if r2["round"] == r and r2["cfg"] == q + ",bulk=false"]
                    if x and y and state(x[0]["c2c_ns"]) == state(y[0]["c2c_ns"]) != "mixed":
                        pairs.append("%.2f %s" % (float(y[0]["busy_ns_per_pkt"]) / float(x[0]["busy_ns_per_pkt"]),
                                                  state(x[0]["c2c_ns"])))
                if pairs:
                    ratio = "**%.2fx fewer ns** (median of the pairs in one state: %s)" % (
                        st.median(float(p.split()[0]) for p in pairs), ", ".join(pairs))
                else:
                    ratio = "%.2fx fewer ns (medians; no pair ran in one state)" % (one / med(c, "busy_ns_per_pkt"))
            out.append("| %s | %s | %.3f | %.1f | %.3f | %.1f | %.3f | %.3f | %s | %s |" % (
                name, "bulk" if bulk == "true" else "one per dequeue", med(c, "mpps"), med(c, "busy_ns_per_pkt"),
                med(c, "from_queue"), med(c, "per_dequeue"), med(c, "publishes_per_pkt"), med(c, "drop_share"),
                "yes" if ok else "**no**", ratio))
else:
    names = {"qdisc=fifo,dql=false": "fifo", "qdisc=fifo,dql=true": "fifo + DQL", "qdisc=fq_codel,dql=false": "fq_codel",
             "qdisc=fq_codel,dql=true": "fq_codel + DQL", "qdisc=none": "none (packets wait in their sender)"}
    base = "qdisc=fifo,dql=false"
    out = ["Core-to-core latency over the runs: %.0f-%.0f ns. Bulk offered %.2f Mpps, the receiver takes %.2f Mpps; one request in flight; medians of %d runs each." %
           (c2c[0], c2c[-1], send, recv, len(rows) // len(names)), "",
           "| egress of b | RR p50 us | RR p99 us | RR p99 vs fifo | transactions/s | requests lost | delivered to b, Mpps | vs fifo | DQL limit (buffers) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for c, name in names.items():
        if not any(r["cfg"] == c for r in rows):
            continue
        out.append("| %s | %.0f | %.0f | %.3fx | %.0f | %d | %.3f | %.3fx | %s |" % (
            name, med(c, "rr_p50_us"), med(c, "rr_p99_us"), med(c, "rr_p99_us") / med(base, "rr_p99_us"),
            med(c, "rr_per_sec"), sum(int(r["lost"]) for r in rows if r["cfg"] == c), med(c, "bulk_mpps"),
            med(c, "bulk_mpps") / med(base, "bulk_mpps"), "%.0f" % med(c, "dql_limit") if "dql=true" in c else "-"))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
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
