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
source "$(dirname "$0")/lib.sh"
need_root
QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-4}"; MODES="${MODES:-off per-packet pool}"; DIRS="${DIRS:-tx rx}"
IMPLS="${IMPLS:-pvnet dpdk}"; DOC="${DOC-$PVNET_ROOT/docs/grants.md}"
B="$WORK/grants"
if [ -n "${RESULTS:-}" ]; then
  [ -s "$RESULTS" ] || die "RESULTS=$RESULTS: no such results file"
  RES="$RESULTS"; ROUNDS=0
else
  "$PEERS_LIB_DIR/setup.sh" > "$WORK/setup.log" 2>&1 || { tail "$WORK/setup.log"; die "setup failed"; }
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
    timeout -k 5 $((DUR + 60)) "$PVNET_BIN" backend --socket "$SOCK" --role "$role" --gen-secs $((DUR + 30)) \
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
  python3 - "$fe_json" "$t0" "$t1" "$TCK" <<PY | tee -a "$RES"
import json, sys
f = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
fin = next((x["final"] for x in f if "final" in x), {})
secs = fin.get("secs") or 0
pkts = fin.get("data_sent") if "$dir" == "tx" else fin.get("dropped")
pkts = pkts or 0
io = fin.get("iotlb", {})
msgs = io.get("updates", 0) + io.get("invalidates", 0)
be_ns = (float(sys.argv[3]) - float(sys.argv[2])) * 1e9 / int(sys.argv[4]) / pkts if pkts else float("nan")
fe_ns = fin.get("cpu_ns", 0) / pkts if pkts else float("nan")
print("RESULT dir=$dir impl=$impl mode=$mode round=$round c2c_ns=$c2c_a/$c2c_b mpps=%.4f be_ns=%.1f fe_ns=%.1f "
      "iotlb_per_pkt=%.2f misses_answered=%d pkts=%d" % (pkts / secs / 1e6 if secs else 0, be_ns, fe_ns,
      msgs / pkts if pkts else 0, io.get("misses_answered", 0), pkts))
PY
}

for r in $(seq "$ROUNDS"); do
  for dir in $DIRS; do
    order="$MODES"; [ $((r % 2)) = 0 ] && order=$(echo "$MODES" | tr ' ' '\n' | tac | tr '\n' ' ')
    for mode in $order; do
      for impl in $IMPLS; do run_one "$dir" "$impl" "$mode" "$r"; done
    done
  done
done

python3 - "$RES" "$DOC" "$ROUNDS" "$DUR" <<'PY'
import re, sys, statistics, collections
res, doc, rounds, dur = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [dict(re.findall(r"(\w+)=(\S+)", l)) for l in open(res) if l.startswith("RESULT")]
def state(c):
    a, b = (float(x) if x != "nan" else 1e9 for x in c.split("/"))
    s = lambda v: "fast" if v < 75 else "mid" if v < 150 else "slow"
    return s(a) if s(a) == s(b) else "mixed"
combos = {(r["dir"], r["impl"], r["mode"]) for r in rows}
states = collections.Counter(state(r["c2c_ns"]) for r in rows)
used = "all runs"
for st, _ in states.most_common():
    if st != "mixed" and {(r["dir"], r["impl"], r["mode"]) for r in rows if state(r["c2c_ns"]) == st} == combos:
        rows = [r for r in rows if state(r["c2c_ns"]) == st]
        used = "the %d runs in the %s state" % (len(rows), st)
        break
by = collections.defaultdict(list)
for r in rows:
    by[(r["dir"], r["impl"], r["mode"])].append(r)
med = lambda k, f: statistics.median(float(r[f]) for r in by[k]) if by[k] else float("nan")
modes = [m for m in ["off", "per-packet", "pool"] if any(k[2] == m for k in by)]
out = []
out.append("| mode | pvnet TX Mpps | pvnet RX Mpps | DPDK TX Mpps | DPDK RX Mpps | pvnet/DPDK TX | pvnet/DPDK RX | pvnet backend ns/pkt TX / RX | IOTLB msgs/pkt |")
out.append("|---|---|---|---|---|---|---|---|---|")
for m in modes:
    p_tx, p_rx = med(("tx", "pvnet", m), "mpps"), med(("rx", "pvnet", m), "mpps")
    d_tx, d_rx = med(("tx", "dpdk", m), "mpps"), med(("rx", "dpdk", m), "mpps")
    ns = "%.0f / %.0f" % (med(("tx", "pvnet", m), "be_ns"), med(("rx", "pvnet", m), "be_ns"))
    msgs = med(("tx", "pvnet", m), "iotlb_per_pkt")
    out.append("| %s | %.3f | %.3f | %.3f | %.3f | %.2fx | %.2fx | %s | %.2f |" % (
        m, p_tx, p_rx, d_tx, d_rx, p_tx / d_tx if d_tx else float("nan"),
        p_rx / d_rx if d_rx else float("nan"), ns, msgs))
ratio = []
for impl in ["pvnet", "dpdk"]:
    for d in ["tx", "rx"]:
        off, pool, pp = (med((d, impl, m), "mpps") for m in ["off", "pool", "per-packet"])
        if off == off and pool == pool and pp == pp and pp > 0 and off > 0:
            ratio.append("| %s | %s | %.2fx | %.1fx |" % (impl, d.upper(), pool / off, pool / pp))
out.append("")
out.append("| backend | direction | pool / off | pool / per-packet |")
out.append("|---|---|---|---|")
out.extend(ratio)
out.append("")
out.append("Medians of %s (c2c states of every run: %s), %s s each, 64-byte frames, one queue pair." % (
    used, ", ".join("%s %d" % kv for kv in states.items()), dur))
table = "\n".join(out)
print(table)
if doc:
    import os
    text = open(doc).read() if os.path.exists(doc) else ""
    begin, end = "<!-- bench_grants begin -->", "<!-- bench_grants end -->"
    block = begin + "\n" + table + "\n" + end
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text + "\n" + block + "\n"
    open(doc, "w").write(text)
    print("written to", doc)
PY
