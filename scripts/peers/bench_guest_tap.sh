#!/usr/bin/env bash
# scripts/peers/bench_guest_tap.sh - a Linux guest reaching the host kernel through pvnet switch
# (vhost-user port + tap port) versus through QEMU's own userspace virtio-net tap backend
# (-netdev tap,vhost=off with virtio-net-pci tx=bh and tx=timer), interleaved in one run.
# A benchmark, not a test: it prints numbers and ratios, and fails only when a run breaks.
#
# Every run boots the same Debian guest (scripts/peers/setup.sh; virtio_net, offloads as
# negotiated), guest 10.78.0.2 <-> host 10.78.0.1 on the tap, and runs in the guest, DUR s each:
#   tcp_g2h / tcp_h2g   iperf3 TCP (-R for host -> guest), Gbit/s at the receiver
#   udp_g2h / udp_h2g   iperf3 UDP, 22-byte payload = 64-byte frames, -b 0; pps the receiver got
#   rr                  sockperf ping-pong (UDP, 64 bytes) guest -> host, full RTT p50/p99 (us)
# Host side: iperf3 -s and sockperf sr, both on CPU1. Pinning: QEMU on CPU0 (-smp 1,maxcpus=2);
# pvnet's worker on CPU1; for QEMU's backend, QEMU's main-loop thread (where its tx bottom
# half / timer and the tap I/O run) is moved to CPU1 after boot, so each backend has the
# second CPU. Each run records the c2c one-way latency before and after (`pvnet limits`).
# Under TCG (this machine: /dev/kvm is PVM) the guest's own CPU cost dominates every figure:
# read the ratios with that in mind.
#
# QEMU 7.2 with TCG crashes with vhost-user unless the NIC uses legacy INTx interrupts
# (vectors=0); its own tap backend runs with MSI-X. CFGS entries bh:intx / timer:intx run QEMU's
# backend with vectors=0 too, to tell the interrupt mechanism's share from the backend's.
#
# Usage: scripts/peers/bench_guest_tap.sh     Env: ROUNDS=2 DUR=4 CFGS="pvnet bh timer bh:intx timer:intx"
#        TESTS="tcp_g2h tcp_h2g udp_g2h udp_h2g rr" (a subset runs only those)
#        (pvnet:POLICY runs the switch with --policy POLICY, e.g. pvnet:busy: never sleeps, so
#        the guest never kicks: the guest's own ceiling)
#        DOC=docs/guest-tap.md (table written between the bench markers; DOC= to skip)
# Wall time: ~45 s per run: ~8 min with the defaults.
source "$(dirname "$0")/lib.sh"
need_root
ROUNDS="${ROUNDS:-2}"; DUR="${DUR:-4}"; TESTS="${TESTS:-tcp_g2h tcp_h2g udp_g2h udp_h2g rr}"; CFGS="${CFGS:-pvnet bh timer bh:intx timer:intx}"
DOC="${DOC-$PVNET_ROOT/docs/guest-tap.md}"
QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"
NET=10.78.0; PVTAP=pvgt0; QTAP=qgt0; GMAC=02:00:00:00:00:02
"$PEERS_LIB_DIR/setup.sh" > "$WORK/setup.log" 2>&1 || { tail "$WORK/setup.log"; die "setup failed"; }
[ -s "$GUEST_DIR/vmlinux" ] && [ -s "$GUEST_DIR/base.cpio.gz" ] || die "no guest image in $GUEST_DIR"
build_pvnet
B="$WORK/guesttap"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; PVNET_BIN="$B/pvnet"
RES="$B/results.txt"; : > "$RES"
ACC=$(guest_accel); VEC=""; case "$ACC" in *tcg*) VEC=",vectors=0" ;; esac
for t in $PVTAP $QTAP; do ip link show "$t" >/dev/null 2>&1 && die "$t exists already (another run?)"; done
ip route | grep -q "^$NET.0/24" && die "$NET.0/24 is in use on this machine"

SW_PID=; Q_PID=; SRV_PIDS=()
cleanup() {
  if [ -n "$Q_PID" ]; then stop_pid "$Q_PID"; fi
  if [ -n "$SW_PID" ]; then stop_pid "$SW_PID" INT; fi
  local p; for p in "${SRV_PIDS[@]}"; do stop_pid "$p"; done
  ip link del "$QTAP" 2>/dev/null || true; ip link del "$PVTAP" 2>/dev/null || true
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

cat > "$B/run.sh" <<EOF
ip link set eth0 up; ip addr add $NET.2/24 dev eth0
i=0; while [ "\$(cat /sys/class/net/eth0/operstate)" != up ] && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i+1)); done
ping -c 1 -W 5 $NET.1 > /dev/null || echo "GUEST_WARN no ping reply"
t() { n=\$1; shift; "\$@" > /tmp/o.txt 2>&1; echo "BENCH_RC \$n \$?"; sed "s/^/BENCH \$n /" /tmp/o.txt; }
EOF
for t in $TESTS; do
  case "$t" in
    tcp_g2h) echo "t tcp_g2h iperf3 -c $NET.1 -t $DUR -f m" ;;
    tcp_h2g) echo "t tcp_h2g iperf3 -c $NET.1 -t $DUR -f m -R" ;;
    udp_g2h) echo "t udp_g2h iperf3 -c $NET.1 -t $DUR -u -l 22 -b 0" ;;
    udp_h2g) echo "t udp_h2g iperf3 -c $NET.1 -t $DUR -u -l 22 -b 0 -R" ;;
    rr) echo "t rr sockperf pp -i $NET.1 -p 11111 -t $DUR -m 64 --full-rtt" ;;
    *) die "unknown test $t (tcp_g2h tcp_h2g udp_g2h udp_h2g rr)" ;;
  esac
done >> "$B/run.sh"
make_initrd "$B/run.sh" "$B/initrd.gz"

host_servers() {
  timeout -k 2 300 taskset -c 1 iperf3 -s -B "$NET.1" > "$B/iperf3s.log" 2>&1 &
  SRV_PIDS+=($!)
  timeout -k 2 300 taskset -c 1 sockperf sr -i "$NET.1" -p 11111 > "$B/sockperf.log" 2>&1 &
  SRV_PIDS+=($!)
}
stop_servers() { local p; for p in "${SRV_PIDS[@]}"; do stop_pid "$p"; done; SRV_PIDS=(); }

run_one() {   # run_one CFG ROUND
  local cfg="$1" round="$2" tag="$1-$2" glog c2c_a c2c_b netdev dev
  glog="$B/$tag.console.log"
  wait_quiet; c2c_a=$(c2c_ns)
  if [[ "$cfg" == pvnet* ]]; then
    # pvnet[:POLICY]: the switch's polling policy (default adaptive)
    # pvnet:POLICY:US also sets --tx-call-delay US
    local pol=adaptive dly=150 rest
    if [[ "$cfg" == pvnet:* ]]; then rest="${cfg#pvnet:}"; pol="${rest%%:*}"; [[ "$rest" == *:* ]] && dly="${rest#*:}"; fi
    rm -f "$B/vu.sock"
    timeout -k 5 300 "$PVNET_BIN" switch --cpu 1 --ctl-socket "$B/ctl.sock" --policy "$pol" --tx-call-delay "$dly" \
      --port "vhost-user:name=vm,socket=$B/vu.sock" --port "tap:name=host,ifname=$PVTAP" \
      > "$B/$tag.pvnet.json" 2> "$B/$tag.pvnet.log" &
    SW_PID=$!
    wait_for 10 test -S "$B/vu.sock" || die "pvnet switch did not start ($B/$tag.pvnet.log)"
    sysctl -qw "net.ipv6.conf.$PVTAP.disable_ipv6=1" || true
    ip addr add "$NET.1/24" dev "$PVTAP"
    netdev="-chardev socket,id=c0,path=$B/vu.sock -netdev vhost-user,id=n0,chardev=c0"
    dev="virtio-net-pci,netdev=n0,mac=$GMAC$VEC"
  else
    ip tuntap add dev "$QTAP" mode tap
    sysctl -qw "net.ipv6.conf.$QTAP.disable_ipv6=1" || true
    ip addr add "$NET.1/24" dev "$QTAP"; ip link set "$QTAP" up
    netdev="-netdev tap,id=n0,ifname=$QTAP,script=no,downscript=no,vhost=off"
    # cfg bh|timer[:intx]: :intx = legacy INTx interrupts (vectors=0) like the vhost-user
    # runs must use under TCG, to separate the interrupt mechanism from the backend.
    dev="virtio-net-pci,netdev=n0,mac=$GMAC,tx=${cfg%%:*}"
    [[ "$cfg" == *:intx ]] && dev+=",vectors=0"
  fi
  host_servers
  # shellcheck disable=SC2086  # $netdev is a list of arguments
  guest_start 200 "$B/initrd.gz" "$glog" "pvg.timeout=150 ipv6.disable=1" "$dev" $netdev
  Q_PID=$GUEST_PID
  if [[ "$cfg" != pvnet* ]]; then
    wait_for 60 grep -q PVG-READY "$glog" && split_qemu "$(child_pid "$Q_PID")" > "$B/$tag.affinity"
  fi
  wait_pid "$Q_PID" 200 || log "$tag: qemu exit status $?"; Q_PID=
  stop_servers
  if [[ "$cfg" == pvnet* ]]; then stop_pid "$SW_PID" INT; wait "$SW_PID" 2>/dev/null; SW_PID=
  else ip link del "$QTAP"; fi
  c2c_b=$(c2c_ns)
  tr -d '\r' < "$glog" > "$glog.txt"
  local kc=""
  if [[ "$cfg" == pvnet* ]]; then
    kc=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l) if l.startswith("{") else {}
    if "final" in d:
        p = [p for p in d["final"]["ports"] if p["name"] == "vm"][0]["counters"]
        n = p.get("rx_packets", 0) + p.get("tx_packets", 0)
        print(" vm_kicks_per_pkt=%.3f vm_calls_per_pkt=%.3f" % (p.get("kicks", 0) / max(n, 1), p.get("calls", 0) / max(n, 1)))' "$B/$tag.pvnet.json" 2>/dev/null)
  fi
  python3 - "$glog.txt" "$cfg" "$round" "$c2c_a/$c2c_b" "$DUR" "$TESTS" "$kc" <<'PY' | tee -a "$RES"
import re, sys
log, cfg, rnd, c2c, dur = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
L = open(log, errors="replace").read().splitlines()
def lines(n): return [l.split(" ", 2)[2] for l in L if l.startswith("BENCH %s " % n)]
def gbit(n):
    r = [l for l in lines(n) if "receiver" in l]
    m = re.search(r"([\d.]+) Mbits/sec", r[-1]) if r else None
    return float(m.group(1)) / 1000 if m else float("nan")
def pps(n):
    r = [l for l in lines(n) if "receiver" in l]
    m = re.search(r"(\d+)/(\d+) \(", r[-1]) if r else None
    t = re.search(r"0.00-([\d.]+) +sec", r[-1]) if r else None
    if not (m and t): return float("nan")
    return (int(m.group(2)) - int(m.group(1))) / float(t.group(1))
def pct(p):
    for l in lines("rr"):
        m = re.search(r"percentile %s *= *([\d.]+)" % re.escape(p), l)
        if m: return float(m.group(1))
    return float("nan")
ok = all(("BENCH_RC %s 0" % n) in L for n in sys.argv[6].split())
print("RESULT cfg=%s round=%s c2c_ns=%s ok=%d tcp_g2h_gbit=%.3f tcp_h2g_gbit=%.3f udp_g2h_pps=%.0f udp_h2g_pps=%.0f rr_p50_us=%.1f rr_p99_us=%.1f%s"
      % (cfg, rnd, c2c, ok, gbit("tcp_g2h"), gbit("tcp_h2g"), pps("udp_g2h"), pps("udp_h2g"), pct("50.000"), pct("99.000"), sys.argv[7]))
PY
}

log "guest via tap: $ROUNDS rounds x {$CFGS}, ${DUR}s per test"
read -ra cfgs <<< "$CFGS"
for r in $(seq "$ROUNDS"); do
  order=("${cfgs[@]}")
  if [ $((r % 2)) = 0 ]; then order=(); for ((i=${#cfgs[@]}-1; i>=0; i--)); do order+=("${cfgs[i]}"); done; fi
  for c in "${order[@]}"; do run_one "$c" "$r"; done
done

python3 - "$RES" "$B/summary.md" <<'PY'
import sys, statistics as st
rows = [dict(kv.split("=", 1) for kv in l.split()[1:]) for l in open(sys.argv[1]) if l.startswith("RESULT")]
keys = [("tcp_g2h_gbit", "TCP guest->host Gbit/s", 1), ("tcp_h2g_gbit", "TCP host->guest Gbit/s", 1),
        ("udp_g2h_pps", "UDP 64 B guest->host pps", 1), ("udp_h2g_pps", "UDP 64 B host->guest pps", 1),
        ("rr_p50_us", "ping-pong RTT p50 us", -1), ("rr_p99_us", "ping-pong RTT p99 us", -1)]
order = ["pvnet", "pvnet:busy", "pvnet:notify", "bh", "timer", "bh:intx", "timer:intx"]
cfgs = [c for c in order if any(r["cfg"] == c for r in rows)]
cfgs += sorted({r["cfg"] for r in rows} - set(cfgs))
med = lambda c, k: st.median([float(r[k]) for r in rows if r["cfg"] == c and r["ok"] == "1"] or [float("nan")])
names = {"pvnet": "pvnet switch + tap (INTx)", "bh": "QEMU tap tx=bh", "timer": "QEMU tap tx=timer",
         "bh:intx": "QEMU tap tx=bh, INTx", "timer:intx": "QEMU tap tx=timer, INTx"}
name = lambda c: names.get(c, "pvnet switch --policy %s (INTx)" % c[6:].replace(":", ", tx-call-delay ") if c.startswith("pvnet:") else c)
refs = [c for c in cfgs if not c.startswith("pvnet")]
hdr = "| metric | " + " | ".join(name(c) for c in cfgs) + " | " + " | ".join("pvnet / " + c for c in refs) + " |"
out = [hdr, "|" + "---|" * (len(cfgs) + len(refs) + 1)]
for k, name, better in keys:
    v = {c: med(c, k) for c in cfgs}
    f = lambda x: ("%.3f" % x if x < 10 else "%.0f" % x) if x == x else "-"
    r = lambda c: "%.2f" % (v["pvnet"] / v[c]) if "pvnet" in v and c in v and v[c] == v[c] and v[c] > 0 else "-"
    out.append("| %s | %s | %s |" % (name, " | ".join(f(v[c]) for c in cfgs), " | ".join(r(c) for c in refs)))
out.append("")
out.append("Medians over the runs whose five tests all completed; for latency a ratio below 1 is better.")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY

if [ -n "$DOC" ]; then
  [ -f "$DOC" ] || printf '# Guest through pvnet switch + tap vs QEMU tap backend\n\n<!-- bench_guest_tap:begin -->\n<!-- bench_guest_tap:end -->\n' > "$DOC"
  {
    echo "Run: $(date -u +%Y-%m-%dT%H:%MZ), \`ROUNDS=$ROUNDS DUR=$DUR scripts/peers/bench_guest_tap.sh\`," \
         "QEMU $(dpkg-query -W -f='${Version}' qemu-system-x86) ($ACC), pvnet $(git -C "$PVNET_ROOT" describe --always --dirty 2>/dev/null), $(nproc) CPUs."
    echo; cat "$B/summary.md"; echo
    echo "<details><summary>raw RESULT lines</summary>"; echo; echo '```'; cat "$RES"; echo '```'; echo; echo "</details>"
  } > "$B/section.md"
  doc_section "$DOC" bench_guest_tap "$B/section.md"
  log "table written to $DOC"
fi
