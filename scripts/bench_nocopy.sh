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
source "$(dirname "$0")/peers/lib.sh"
need_root
ROUNDS="${ROUNDS:-3}"; DUR="${DUR:-3}"; EXPS="${EXPS:-drop sizing copy}"; SENDERS="${SENDERS:-pvnet dpdk}"
DOC="${DOC-$PVNET_ROOT/docs/no-copy.md}"; QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"
case " $SENDERS " in *" dpdk "*) "$PEERS_LIB_DIR/setup.sh" > "$WORK/setup.log" 2>&1 || { tail "$WORK/setup.log"; die "setup failed"; } ;; esac
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
      --gen-secs $((DUR + 20)) --sessions 1 --cpu 1 > "$B/$tag.be.json" 2> "$B/$tag.be.log" &
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
  python3 - "$B/$tag.fe.json" "$exp" "$sender" "$size" "$mode" "$bufs" "$c2c" <<'PY' >> "$RES"
import json, sys
f = None
for line in open(sys.argv[1]):
    if line.startswith('{"final"'):
        f = json.loads(line)["final"]
if f is None or f["dropped"] == 0:
    sys.exit("no frames received")
exp, sender, size, mode, bufs, c2c = sys.argv[2:8]
print(exp, sender, size, mode, bufs, c2c, "%.4f" % f["mpps"], "%.1f" % f["busy_ns_per_frame"],
      "%.1f" % f["cpu_ns_per_frame"], "%.3f" % (f["rx_buffers"] / f["rx_packets"]),
      "%.3f" % (f["rx_truesize"] / f["rx_bytes"]))
PY
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

python3 - "$RES" "$ROUNDS" "$DUR" > "$B/report.md" <<'PY'
import sys, statistics
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    exp, sender, size, mode, bufs, c2c, mpps, busy, cpu, bpf, ts = line.split()
    rows[(exp, sender, int(size), mode, bufs)].append(
        (float(c2c) if c2c != "nan" else float("nan"), float(mpps), float(busy), float(cpu), float(bpf), float(ts)))
med = lambda xs: statistics.median(xs)
def col(k, i): return med([r[i] for r in rows[k]])
c2cs = sorted(r[0] for v in rows.values() for r in v)
print("Core-to-core latency over the runs: %.0f-%.0f ns (median %.0f). %s rounds of %s s, medians.\n"
      % (c2cs[0], c2cs[-1], med(c2cs), sys.argv[2], sys.argv[3]))
senders = sorted({k[1] for k in rows if k[0] == "drop"})
if senders:
    print("**Receive and drop, 64-byte frames** (EWMA buffers): in place against a copy of the whole frame.\n")
    print("| sender | mode | Mpps | busy ns/frame | CPU ns/frame | in place / copy (Mpps) | copy / in place (busy ns) |")
    print("|---|---|---|---|---|---|---|")
    for s in senders:
        c, p = ("drop", s, 64, "copy", "ewma"), ("drop", s, 64, "inplace", "ewma")
        if c not in rows or p not in rows:
            continue
        name = {"pvnet": "pvnet backend gen", "dpdk": "DPDK net_vhost txonly"}.get(s, s)
        print("| %s | copy | %.2f | %.1f | %.1f | | |" % (name, col(c, 1), col(c, 2), col(c, 3)))
        print("| %s | in place | %.2f | %.1f | %.1f | **%.3fx** | **%.3fx** |" % (
            name, col(p, 1), col(p, 2), col(p, 3), col(p, 1) / col(c, 1), col(c, 2) / col(p, 2)))
    print()
for exp, title in (("sizing", "**Buffer sizing, frames received in place** (sender: pvnet backend gen)"),
                   ("copy", "**Buffer sizing, frames copied out** (sender: pvnet backend gen)")):
    keys = sorted(k for k in rows if k[0] == exp)
    if not keys:
        continue
    print(title + ".\n")
    print("| frame bytes | buffers | Mpps | busy ns/frame | buffers/frame | memory held / frame bytes | Mpps vs fixed:4096 | memory vs fixed:4096 |")
    print("|---|---|---|---|---|---|---|---|")
    for size in sorted({k[2] for k in keys}):
        ref = next((k for k in keys if k[2] == size and k[4] == "fixed:4096"), None)
        for k in sorted((k for k in keys if k[2] == size), key=lambda k: ["fixed:1536", "fixed:4096", "ewma"].index(k[4])):
            r1 = "%.3fx" % (col(k, 1) / col(ref, 1)) if ref else ""
            r2 = "%.3fx" % (col(k, 5) / col(ref, 5)) if ref else ""
            print("| %d | %s | %.3f | %.1f | %.3f | %.2f | %s | %s |" % (
                size, k[4], col(k, 1), col(k, 2), col(k, 4), col(k, 5), r1, r2))
    print()
PY
cat "$B/report.md"
if [ -n "$DOC" ]; then
  { echo "Measured $(date -u +%Y-%m-%d) with \`ROUNDS=$ROUNDS DUR=$DUR EXPS=\"$EXPS\" SENDERS=\"$SENDERS\" scripts/bench_nocopy.sh\`."; echo; cat "$B/report.md"; } > "$B/section.md"
  doc_section "$DOC" bench "$B/section.md"
  log "wrote $DOC"
fi
