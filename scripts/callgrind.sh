#!/usr/bin/env bash
# Instruction count per packet of the device-side fast path (virtq DeviceQueue: available,
# pop, copy 76 bytes out, push_used, publish), from valgrind --tool=callgrind.
#
# Runs crates/virtq/examples/fastpath.rs for N and 2N packets and divides the difference of the
# inclusive count of `device_batch` by N: set-up cost cancels. Counts are per packet and do not
# move with machine noise, so they compare two versions of the fast path.
# Usage: scripts/callgrind.sh [N]   (default 200000). Prints one line per role.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-200000}"
command -v valgrind >/dev/null || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null; }
cargo build -q --release -p virtq --features mock --example fastpath
bin=target/release/examples/fastpath
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
inclusive() { # file function -> inclusive Ir
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
    awk -v f="examples/fastpath.rs:$2 " '!done && $0 ~ f {gsub(",","",$1); print $1; done = 1}'
}
for n in "$N" "$((2 * N))"; do
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$n" "$bin" "$n" >/dev/null 2>&1
done
for fn in device_batch driver_offer driver_reclaim; do
  a=$(inclusive "$tmp/cg.$N" "fastpath::$fn"); b=$(inclusive "$tmp/cg.$((2 * N))" "fastpath::$fn")
  awk -v a="$a" -v b="$b" -v n="$N" -v f="$fn" 'BEGIN { printf "%-16s %6.1f instructions/packet\n", f, (b - a) / n }'
done
