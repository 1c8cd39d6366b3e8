#!/usr/bin/env bash
# The coherence count: cache lines that change owner between pvnet's device side and the driver
# per packet, for each path, deterministic (docs/coherence.md explains the model and the table).
#
# The switch harness (crates/dataplane/examples/switchpath.rs, `coherence` mode, built with the
# dataplane's `coherence` feature so that prefetches are traced) runs one path in one thread:
# pvnet's ports over mock rings, the driver side played by pvnet's own driver rings, each side's
# turn marked. valgrind's lackey lists every load and store; scripts/coherence.py plays them
# through a two-cache model at 64-byte granularity over the rings' memory and prints per packet:
# the device's read transfers and write transfers (RFO: the line came over with the write;
# upgrade: a shared copy was invalidated), how many of the device's a prefetch took ahead of use
# and how far ahead (instructions, median), and the driver's. Counts do not move with machine
# noise, so they compare two versions of the ring path (ALT=<dir of another checkout> prints
# that checkout's rows too, from the same harness).
#
# Usage: scripts/coherence.sh [PACKETS]   (counted per path after two warm laps; default 256)
#        PATHS="v2h h2v bounce wire" RINGS="split packed" SIZES="64 1500" (frame bytes)
#        JSON=<file> (every row's full figures, by structure, one JSON object per line)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-256}"
PATHS="${PATHS:-v2h h2v bounce wire}"; RINGS="${RINGS:-split packed}"; SIZES="${SIZES:-64 1500}"
command -v valgrind >/dev/null || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
[ -n "${JSON:-}" ] && : >"$JSON"

build() { # dir: the harness built with the coherence feature (own target dir), or exit
  (cd "$1" && CARGO_TARGET_DIR="$1/target/coherence" \
    cargo build -q --release -p pvnet-dataplane --example switchpath --features coherence) >&2 ||
    { echo "coherence.sh: building the harness in $1 failed" >&2; exit 1; }
}

row() { # label bin path ring size
  local label="$1" bin="$2" path="$3" ring="$4" size="$5"
  if ! valgrind --tool=lackey --trace-mem=yes --log-file="$tmp/trace" \
    "$bin" coherence "$path" "$ring" "$size" "$N" >"$tmp/out" 2>"$tmp/err"; then
    printf '| %s | %s | %s | %s | n/a (the harness failed: %s) |\n' "$label" "$path" "$ring" "$size" "$(tail -1 "$tmp/err")"
    return
  fi
  python3 scripts/coherence.py "$tmp/out" "$tmp/trace" >"$tmp/json"
  rm -f "$tmp/trace"
  [ -n "${JSON:-}" ] && python3 scripts/lib/coherence_table.py json "$tmp/json" "$label" "$path" "$ring" "$size" >>"$JSON"
  python3 scripts/lib/coherence_table.py row "$tmp/json" "$label" "$path" "$ring" "$size"
}

echo "| build | path | ring | bytes | device read | device RFO | device upgrade | device lines/pkt | of them prefetched | prefetch distance (instr, median) | driver lines/pkt | both |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
build "$PWD"; bins=("this=$PWD/target/coherence/release/examples/switchpath")
if [ -n "${ALT:-}" ]; then
  alt="$(cd "$ALT" && pwd)"; build "$alt"; bins+=("alt=$alt/target/coherence/release/examples/switchpath")
fi
for path in $PATHS; do
  for ring in $RINGS; do
    for size in $SIZES; do
      for b in "${bins[@]}"; do row "${b%%=*}" "${b#*=}" "$path" "$ring" "$size"; done
    done
  done
done
