#!/usr/bin/env bash
# Egress experiments (crates/dataplane/examples/egress.rs): pvnet's switch, ports and egress
# queues in one thread, the frontends played over mock rings, in virtual time:
#
# * latency under load: a request/response flow through the same congested egress as a
#   window-limited bulk flow, per egress configuration (fifo, fq_codel, each with and without
#   DQL, and no queue);
# * bulk dequeue: CPU time of the switch's rounds per delivered packet with a standing
#   backlog, bulk versus one packet per dequeue (interleaved, best of 3).
#
# Usage: scripts/bench_egress.sh        Env: DOC=docs/egress.md (tables written between the
#        bench markers; DOC= prints only), PLOTS=docs/egress (latency.png, bulk.png and their
#        CSVs; PLOTS= for none). About 30 s.
set -euo pipefail
cd "$(dirname "$0")/.."
DOC="${DOC-docs/egress.md}"
PLOTS="${PLOTS-docs/egress}"
[ -n "$PLOTS" ] && mkdir -p "$PLOTS"
out=$(EGRESS_CSV="$PLOTS" cargo run --release -q -p pvnet-dataplane --features testing --example egress)
printf '%s\n' "$out"
[ -n "$PLOTS" ] && python3 scripts/plot_egress.py "$PLOTS"
[ -z "$DOC" ] && exit 0
stamp="$(date -u +%Y-%m-%d) ($(nproc) CPUs, $(git rev-parse --short HEAD))"
tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
# shellcheck disable=SC2016  # backticks: Markdown
printf '_Run %s, `scripts/bench_egress.sh`_\n\n%s\n' "$stamp" "$out" > "$tmp"
python3 scripts/lib/docsection.py between "$DOC" "<!-- bench:egress -->" "<!-- /bench:egress -->" "$tmp"
echo "written to $DOC"
