#!/usr/bin/env bash
# scripts/bench_tap_rx.sh - the host kernel's packets through `pvnet switch`'s tap port into a
# vhost-user frontend, read straight into the frontend's buffers (direct=true) against read
# into the tap port's own buffers and copied (direct=false): the switch's CPU per packet
# (docs/no-copy.md). A benchmark, not a test: it prints figures and ratios, and fails only when
# a run breaks.
#
# The receiver is `pvnet frontend --role drop --guest-tso` (pvnet's frontend, the only other
# port, so every packet goes to it; like a Linux guest it takes partial checksums, which the
# host's UDP packets carry), busy-polling on CPU0; the switch runs on CPU1 with --policy
# notify (it sleeps whenever it has nothing to do). The host's UDP stack is several times
# slower than pvnet's side, so a steady sender would measure the host; instead each burst
# fills the tap's queue while the switch is stopped (SIGSTOP; txqueuelen raised so the
# queue holds the burst): PKTS UDP datagrams of PAYLOAD bytes (22: 64-byte frames) to an
# address behind the tap (a static neighbour entry), sent with sendmmsg; then the switch is
# continued (SIGCONT) and drains the queue at its own pace into the frontend. Its CPU time
# over the drain comes from /proc/<pid>/task/*/schedstat (nanoseconds), its packets from `pvnet
# ctl`: switch CPU ns per packet, the tap's syscalls per packet, and the share read in place
# (rx_direct / rx_packets). BURSTS bursts per run; runs alternate between the two settings,
# the order reversed every round; medians. The switch, its tap, the tap's address and the
# sender run in a network namespace of this run's (scripts/lib/common.sh netns_new), never in
# the machine's own; the frontend attaches through the vhost-user socket from outside.
#
# Usage: scripts/bench_tap_rx.sh      Env: ROUNDS=3 BURSTS=10 PKTS=32768 PAYLOAD=22
#        IO=uring (the tap's io; IO=syscall: one read per packet, never in place)
#        DOC=docs/no-copy.md (DOC= to skip)
# Wall time: ~15 s per run: ~2 min with the defaults.
source "$(dirname "$0")/lib/common.sh"
need_root
ROUNDS="${ROUNDS:-3}"; BURSTS="${BURSTS:-10}"; PKTS="${PKTS:-32768}"; PAYLOAD="${PAYLOAD:-22}"; IO="${IO:-uring}"
DOC="${DOC-$PVNET_ROOT/docs/no-copy.md}"; QUIET_PCT="${QUIET_PCT:-15}"; QUIET_WAIT="${QUIET_WAIT:-60}"
NET=10.79.0; TAP=pvtr0
build_pvnet
B="$WORK/taprx"; rm -rf "$B"; mkdir -p "$B"
cp "$PVNET_BIN" "$B/pvnet"; PVNET_BIN="$B/pvnet"
RES="$B/results.txt"; : > "$RES"
SW_PID=; FE_PID=
cleanup() {
  [ -n "$FE_PID" ] && stop_pid "$FE_PID"
  [ -n "$SW_PID" ] && stop_pid "$SW_PID" INT
  netns_cleanup
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

# ctl_port FIELD : FIELD of the tap port ("host") from `pvnet ctl ports --json`.
ctl_port() {
  "$PVNET_BIN" ctl --ctl-socket "$B/ctl.sock" ports --json 2>/dev/null | python3 "$PYLIB/pvnet_report.py" ctl-port host "$1" 0
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

cpu_ns() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {printf "%d", s}'; }   # every thread
tx_dropped() { ip netns exec "$NS" cat "/sys/class/net/$TAP/statistics/tx_dropped"; }

run_one() {   # run_one DIRECT ROUND
  local direct="$1" round="$2" tag="d$1-$2" c2c sw b
  wait_quiet; c2c=$(c2c_ns)
  rm -f "$B/vu.sock"
  netns_new taprx   # a fresh one per run: the tap and its queue as new
  timeout -k 5 120 ip netns exec "$NS" "$PVNET_BIN" switch --cpu 1 --ctl-socket "$B/ctl.sock" --policy notify --rx-policy notify \
    --port "vhost-user:name=vm,socket=$B/vu.sock" --port "tap:name=host,ifname=$TAP,io=$IO,direct=$direct" \
    > "$B/$tag.sw.json" 2> "$B/$tag.sw.log" &
  SW_PID=$!
  wait_for 10 test -S "$B/vu.sock" || die "pvnet switch did not start ($B/$tag.sw.log)"
  sw=$(child_pid "$SW_PID")   # (ip netns exec execs the switch)
  ip -n "$NS" link set dev "$TAP" txqueuelen $((PKTS * 2))
  ip -n "$NS" addr add "$NET.1/24" dev "$TAP"
  ip -n "$NS" neigh replace "$NET.2" lladdr 02:00:00:00:79:02 dev "$TAP"
  timeout -k 5 100 "$PVNET_BIN" frontend --socket "$B/vu.sock" --role drop --cpu 0 --policy busy \
    --guest-tso --secs 90 --idle-timeout 90 > "$B/$tag.fe.json" 2> "$B/$tag.fe.log" &
  FE_PID=$!
  wait_for 10 grep -q '"ready"' "$B/$tag.fe.json" || die "pvnet frontend did not connect ($B/$tag.fe.log)"
  ip netns exec "$NS" taskset -c 0 python3 "$PYLIB/udp_send.py" "$NET.2" "$PAYLOAD" 1000 > /dev/null   # warm-up: learn, size
  sleep 0.3
  local cpu=0 pk=0 sc=0 dr=0 c0 p0 s0 d0 x0
  x0=$(tx_dropped)
  for b in $(seq "$BURSTS"); do
    p0=$(ctl_port rx_packets)   # (the control thread stops with the rest)
    kill -STOP "$sw"
    ip netns exec "$NS" taskset -c 0 python3 "$PYLIB/udp_send.py" "$NET.2" "$PAYLOAD" "$PKTS" > /dev/null
    c0=$(cpu_ns "$sw")
    kill -CONT "$sw"
    sleep 0.3
    cpu=$((cpu + $(cpu_ns "$sw") - c0))
    pk=$((pk + $(ctl_port rx_packets) - p0))
  done
  sc=$(ctl_port syscalls); dr=$(ctl_port rx_direct)
  local drops=$(( $(tx_dropped) - x0 ))
  stop_pid "$FE_PID" INT; wait "$FE_PID" 2>/dev/null; FE_PID=
  stop_pid "$SW_PID" INT; wait "$SW_PID" 2>/dev/null; SW_PID=
  netns_del "$NS"
  python3 "$PYLIB/bench_tap_rx.py" result "$direct" "$round" "$c2c" "$cpu" "$pk" "$sc" "$dr" "$drops" "$BURSTS" "$PKTS" | tee -a "$RES"
}

log "tap -> pvnet frontend: $ROUNDS rounds x direct {true,false}, $BURSTS bursts of $PKTS, UDP payload $PAYLOAD B"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order=(true false); else order=(false true); fi
  for d in "${order[@]}"; do run_one "$d" "$r"; done
done

python3 "$PYLIB/bench_tap_rx.py" summary "$RES" "$B/summary.md" "$PAYLOAD"

if [ -n "$DOC" ]; then
  doc_results "$DOC" "bench_tap_rx_$PAYLOAD" \
    "ROUNDS=$ROUNDS BURSTS=$BURSTS PKTS=$PKTS PAYLOAD=$PAYLOAD scripts/bench_tap_rx.sh" "$B/summary.md" "$RES"
fi
