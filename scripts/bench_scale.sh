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
#            on 1 worker and on 2 workers (--shards 2, one port each): worker CPU ns per frame.
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
source "$ROOT/scripts/peers/lib.sh"
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
  PVNET_LOG=warn timeout $((W + 40)) "$PV" backend --socket "$sock" --role sink --cpu 1 --shards "$shards" \
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
  python3 - "$name" "$ports" "$active" "$rate" "$shards" "$t0" "$t1" "$s0" "$s1" "$TCK" "$secs" "$B" "$policy" "$qsize" "$c2c_a/$c2c_b" <<'PY' | tee -a "$OUT"
import json, sys, glob
name, ports, active, rate, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
t0, t1, s0, s1, tck, secs = (float(x) for x in sys.argv[6:12])
b, policy, qsize, c2c = sys.argv[12], sys.argv[13], sys.argv[14], sys.argv[15]
sent = 0
for f in glob.glob(f"{b}/{name}.fe*.json"):
    for line in open(f):
        if line.startswith('{"final"'):
            sent += json.loads(line)["final"]["tx_packets"]
win = s1 - s0
cpu = (t1 - t0) / tck / win            # CPU-seconds per second
pps = sent / secs                      # the frontends' average rate
frames = pps * win
print("LOAD name=%s ports=%d active=%d rate=%d shards=%d policy=%s qsize=%s c2c_ns=%s cpu_pct=%.2f pps=%.0f ns_per_frame=%.1f"
      % (name, ports, active, rate, shards, policy, qsize, c2c, 100 * cpu, pps, 1e9 * cpu * win / frames if frames else float("nan")))
PY
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
  load_point tenth 1 1 "$(python3 -c "print(int($sat / 10))")"
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
  for r in "$(python3 -c "print(int($cosat / 10))")" 1000000 100000 10000; do
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
python3 - "$OUT" "$B/summary.md" "$B/coalesce.md" <<'PY'
import os, re, sys, statistics as st
rows = [dict(kv.split("=", 1) for kv in l.split()[1:] if "=" in kv) | {"kind": l.split()[0]} for l in open(sys.argv[1])]
out = []
med = lambda xs: st.median(xs) if xs else float("nan")
f2 = lambda v: "%.2f" % v if v == v else "-"
res = [r for r in rows if r["kind"] == "RESULT"]
if res:
    bucket = lambda ns: "fast" if ns < 75 else "mid" if ns < 150 else "slow"
    for r in res:
        a, b = (float(x) for x in r["c2c_ns"].split("/"))
        r["state"] = bucket(a) if bucket(a) == bucket(b) else "mixed"
    out += ["### Queue pairs: 1 and 2, pvnet switch and DPDK net_vhost (64 B, Mpps the frontend counted; h2v: the gen port's %s flows with 1 pair as with 2)" % os.environ.get("MQ_FLOWS", "64"), "",
            "| direction | c2c state | pvnet 1 pair | pvnet 2 pairs | **2 pairs / 1 pair** | DPDK 2 queues | **pvnet / DPDK, 2 queues** | least-loaded queue's share (pvnet, DPDK) | runs |",
            "|---|---|---|---|---|---|---|---|---|"]
    for d in ("v2h", "h2v"):
        for s in ("fast", "mid", "slow", "mixed"):
            g = lambda impl, q: [float(r["mpps"]) for r in res if r["dir"] == d and r["state"] == s and r["impl"] == impl and r["queues"] == q]
            p1, p2, d2 = g("switch", "1"), g("switch", "2"), g("dpdk", "2")
            if not (p1 or p2 or d2):
                continue
            sh = lambda impl: med([float(r.get("q_min_share", "nan")) for r in res if r["dir"] == d and r["state"] == s and r["impl"] == impl and r["queues"] == "2"])
            out.append("| %s | %s | %s | %s | **%s** | %s | **%s** | %s, %s | %d/%d/%d |" % (
                d, s, f2(med(p1)), f2(med(p2)), f2(med(p2) / med(p1)) if p1 and p2 else "-", f2(med(d2)),
                f2(med(p2) / med(d2)) if p2 and d2 else "-", f2(sh("switch")), f2(sh("dpdk")), len(p1), len(p2), len(d2)))
    out.append("")
load = {r["name"]: r for r in rows if r["kind"] == "LOAD"}
co = [r for r in load.values() if r["name"].startswith("co-")]
if co:
    cout = ["### CPU follows the load: the adaptive policy against coalescing (one port, `pvnet backend --role sink`, %s-entry rings)" % co[0]["qsize"], "",
            "| offered | policy | frames/s | worker CPU % | of its saturated CPU (same policy) | CPU ns/frame | c2c ns before/after |", "|---|---|---|---|---|---|---|"]
    sats = {r["policy"]: float(r["cpu_pct"]) for r in co if r["rate"] == "0"}
    for r in sorted(co, key=lambda r: (-int(r["rate"]) if r["rate"] != "0" else -10**12, r["policy"])):
        s0 = sats.get(r["policy"])
        cout.append("| %s | %s | %s | %s | %s | %s | %s |" % ("saturation" if r["rate"] == "0" else r["rate"] + " frames/s", r["policy"], r["pps"],
                    r["cpu_pct"], "%.1f %%" % (100 * float(r["cpu_pct"]) / s0) if s0 else "-", r["ns_per_frame"], r.get("c2c_ns", "-")))
    open(sys.argv[3], "w").write("\n".join(cout) + "\n")
    print("\n".join(cout))
if "sat" in load:
    sat, ten = load["sat"], load.get("tenth")
    out += ["### CPU follows the load (one port, `pvnet backend --role sink`, one worker)", "",
            "| load | frames/s | worker CPU % | CPU ns/frame |", "|---|---|---|---|",
            "| saturated | %s | %s | %s |" % (sat["pps"], sat["cpu_pct"], sat["ns_per_frame"])]
    if ten:
        out.append("| 10 %% of saturation | %s | %s | %s |" % (ten["pps"], ten["cpu_pct"], ten["ns_per_frame"]))
        out += ["", "At 10 %% of the saturation rate the worker uses **%.1f %%** of its saturated CPU." % (100 * float(ten["cpu_pct"]) / float(sat["cpu_pct"]))]
    out.append("")
    pts = [r for r in load.values() if re.match(r"p\d+-r\d+$", r["name"])]
    if pts:
        out += ["| connected ports | one of them paced at | worker CPU % | CPU ns/frame |", "|---|---|---|---|"]
        for r in sorted(pts, key=lambda r: (int(r["ports"]), int(r["rate"]))):
            out.append("| %s | %s frames/s | %s | %s |" % (r["ports"], r["rate"], r["cpu_pct"], r["ns_per_frame"]))
        out.append("")
    if "four64" in load and "one64" in load:
        a, b = load["four64"], load["one64"]
        out += ["64 connected ports: 4 of them at 10 Kpps each: **%s %%** CPU; 1 of them at 40 Kpps: **%s %%** (ratio %.2f)." % (
            a["cpu_pct"], b["cpu_pct"], float(a["cpu_pct"]) / float(b["cpu_pct"]) if float(b["cpu_pct"]) else float("nan")), ""]
ws = [r for r in rows if r["kind"] == "LOAD" and r["name"].startswith("w")]
if ws:
    g = lambda sh: [float(r["ns_per_frame"]) for r in ws if r["shards"] == sh]
    c = lambda sh: [float(r["cpu_pct"]) for r in ws if r["shards"] == sh]
    out += ["### Workers: 2 ports each paced, on 1 and on 2 workers", "",
            "| workers | runs | workers' CPU % (median) | CPU ns/frame (median) |", "|---|---|---|---|",
            "| 1 | %d | %s | %s |" % (len(g("1")), f2(med(c("1"))), f2(med(g("1")))),
            "| 2 | %d | %s | %s |" % (len(g("2")), f2(med(c("2"))), f2(med(g("2")))), "",
            "2 workers / 1 worker, CPU ns per frame: **%s**." % (f2(med(g("2")) / med(g("1"))) if med(g("1")) else "-"), ""]
idle = [l for l in open(sys.argv[1]) if l.startswith("IDLE")]
if idle:
    out += ["### Idle ports", "", "`" + idle[-1][5:].strip() + "`", ""]
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY

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
