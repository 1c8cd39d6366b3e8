#!/usr/bin/env bash
# scripts/bench_idle_ports.sh - what idle ports cost the switch: N vhost-user ports added at
# runtime (`pvnet ctl port add`), each attached by a pvnet frontend that stays idle (on CPU0),
# the switch's worker on CPU1; prints the switch process's CPU share over W seconds (user+sys
# from /proc/<pid>/stat, 10 ms ticks: about 0.1 % resolution over 10 s), and its memory per
# port: resident anonymous memory (pvnet's own: rings' state, egress queues, counters) and
# resident shared memory (the frontends' memory pvnet touched: their rings), before the ports
# and with them, divided by N.
# Usage: N=64 W=10 scripts/bench_idle_ports.sh   (needs target/release/pvnet)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="${PVNET_BIN:-$ROOT/target/release/pvnet}"; N="${N:-64}"; W="${W:-10}"
D="$(mktemp -d /tmp/pvnet-idle.XXXXXX)"
PVNET_LOG=warn "$B" switch --cpu 1 --ctl-socket "$D/ctl" --port sink:name=s > "$D/sw.json" 2> "$D/sw.log" &
sw=$!
trap 'kill ${pids[*]:-} 2>/dev/null; kill -INT $sw 2>/dev/null; wait 2>/dev/null; rm -rf "$D"' EXIT
for _ in $(seq 50); do [ -S "$D/ctl" ] && break; sleep 0.1; done
rss() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$sw/status"; }   # KiB
anon0=$(rss RssAnon); shm0=$(rss RssShmem)
pids=()
for i in $(seq 1 "$N"); do
  "$B" ctl --ctl-socket "$D/ctl" port add "vhost-user:name=p$i,socket=$D/p$i.sock" > /dev/null
  taskset -c 0 "$B" frontend --socket "$D/p$i.sock" --role idle --secs $((W + 8)) > /dev/null 2>&1 &
  pids+=($!)
done
sleep 4
up=$("$B" ctl --ctl-socket "$D/ctl" ports --json | python3 "$ROOT/scripts/lib/pvnet_report.py" ctl-up)
t0=$(awk '{print $14 + $15}' "/proc/$sw/stat"); s0=$(date +%s.%N)
sleep "$W"
t1=$(awk '{print $14 + $15}' "/proc/$sw/stat"); s1=$(date +%s.%N)
anon1=$(rss RssAnon); shm1=$(rss RssShmem)
awk -v a="$t0" -v b="$t1" -v s="$s0" -v e="$s1" -v hz="$(getconf CLK_TCK)" -v n="$N" -v up="$up" \
  -v a0="$anon0" -v a1="$anon1" -v m0="$shm0" -v m1="$shm1" \
  'BEGIN { printf "idle ports=%d (up: %d, with the sink) switch CPU %.2f %% over %.1f s; memory per port: %.0f KiB anonymous, %.0f KiB of the frontend'"'"'s shared memory\n", n, up, 100 * (b - a) / hz / (e - s), e - s, (a1 - a0) / n, (m1 - m0) / n }'
