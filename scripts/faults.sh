#!/usr/bin/env bash
# Faults without leaks, at full count (CI runs the same checks with small counts):
#   1. pvnet's own frontend killed with SIGKILL in traffic, and a frontend that vanishes
#      between SET_MEM_TABLE and SET_VRING_KICK, N of each against one `pvnet switch` port
#      (crates/pvnet/tests/faults.rs);
#   2. DPDK testpmd (net_virtio_user txonly) killed with SIGKILL in traffic, N times
#      (tests/interop/run.sh case dpdk_killed_leaves_nothing; installs DPDK on first run).
# Each prints the switch's fds, mappings and RSS before and after, and fails if they moved.
#
#   scripts/faults.sh            # N=1000 (about 15 min for 1, 30 min for 2 on 2 cores)
#   N=100 PARTS="1" scripts/faults.sh
set -uo pipefail
cd "$(dirname "$0")/.."
N="${N:-1000}"
PARTS="${PARTS:-1 2}"
rc=0
for part in $PARTS; do
  case "$part" in
    1) echo "== $N pvnet frontends killed + $N vanished before the kick"
       PVNET_FAULTS="$N" cargo test --release -q -p pvnet --test faults -- --nocapture 2>&1 \
         | grep -E '^faults:|test result|panicked|assert' || true
       [ "${PIPESTATUS[0]}" = 0 ] || rc=1 ;;
    2) echo "== $N DPDK testpmd killed in traffic"
       FAULT_KILLS="$N" INTEROP_CASES=dpdk_killed_leaves_nothing tests/interop/run.sh 2>&1 \
         | grep -E 'dpdk_killed|passed, .* failed' || true
       [ "${PIPESTATUS[0]}" = 0 ] || rc=1 ;;
  esac
done
exit "$rc"
