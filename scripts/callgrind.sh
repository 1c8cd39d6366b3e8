#!/usr/bin/env bash
# Instruction count per packet of the fast paths, from valgrind --tool=callgrind:
#
# * the ring (crates/virtq/examples/fastpath.rs): device_batch (available, pop, copy 76 bytes
#   out, push_used, publish), driver_offer, driver_reclaim, and the same on the packed ring
#   (`_packed`; an older checkout without it prints n/a);
# * the switch path (crates/dataplane/examples/switchpath.rs): switch_vhost (learning switch,
#   frontend to frontend), forward_vhost (fixed wire), gen_vhost (generator into a frontend),
#   vhost_sink (frontend into a sink), switch_gen_vhost and switch_vhost_sink (those two
#   through the learning switch, as `pvnet switch` gen and sink ports), switch_gen_vhost_mq
#   (a gen port's 64 flows into a frontend with 2 queue pairs, steered), switch_trunk_vhost
#   (switch_vhost with the two frontends on two workers, across a trunk), switch_vhost_packed
#   and switch_gen_vhost_packed (the first and fifth over packed rings), chain{2,3,8}_sink and
#   ind{2,3,8}_sink (a frontend into a sink through the switch, each packet a chain of 2, 3
#   or 8 descriptors, direct or as an indirect table; `_packed`: on the packed ring), each
#   switch_vhost_vlan_insert and _strip (switch_vhost from an access port of VLAN 10 to a trunk
#   of it, the tag inserted, and back, removed), each through pvnet's ports over mock rings (an older checkout without a path prints n/a).
#
# Each program runs for N and 2N packets; the difference of each function's inclusive count
# divided by N is its cost per packet (set-up cancels). Counts do not move with machine noise,
# so they compare two versions of the fast path (ALT=<dir of another checkout> prints that
# checkout's figures too, built from the same examples).
# Usage: scripts/callgrind.sh [N]   (default 200000). Prints one line per function.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-200000}"
command -v valgrind >/dev/null || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

inclusive() { # file example function -> inclusive Ir
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
    awk -v f="examples/$2.rs:$2::$3 " '!done && index($0, f) {gsub(",","",$1); print $1; done = 1}'
}

measure() { # dir label
  local dir="$1" label="$2"
  (cd "$dir" &&
    cargo build -q --release -p virtq --features mock --example fastpath &&
    cargo build -q --release -p pvnet-dataplane --example switchpath)
  for ex in fastpath switchpath; do
    local bin="$dir/target/release/examples/$ex"
    [ -x "$bin" ] || continue
    for n in "$N" "$((2 * N))"; do
      valgrind --tool=callgrind --callgrind-out-file="$tmp/$label.$ex.$n" "$bin" "$n" >/dev/null 2>&1
    done
    local fns="device_batch driver_offer driver_reclaim device_batch_packed driver_offer_packed driver_reclaim_packed"
    [ "$ex" = switchpath ] && fns="switch_vhost forward_vhost gen_vhost vhost_sink switch_gen_vhost switch_vhost_sink switch_gen_vhost_mq switch_trunk_vhost switch_vhost_packed switch_gen_vhost_packed chain2_sink chain3_sink chain8_sink chain2_sink_packed chain3_sink_packed chain8_sink_packed ind2_sink ind3_sink ind8_sink ind2_sink_packed ind3_sink_packed ind8_sink_packed switch_vhost_vlan_insert switch_vhost_vlan_strip"
    for fn in $fns; do
      a=$(inclusive "$tmp/$label.$ex.$N" "$ex" "$fn"); b=$(inclusive "$tmp/$label.$ex.$((2 * N))" "$ex" "$fn")
      awk -v a="$a" -v b="$b" -v n="$N" -v f="$fn" -v l="$label" \
        'BEGIN { if (a == "" || b == "") printf "%-6s %-16s    n/a\n", l, f; else printf "%-6s %-16s %6.1f instructions/packet\n", l, f, (b - a) / n }'
    done
  done
}

measure . this
[ -n "${ALT:-}" ] && measure "$ALT" alt
exit 0
