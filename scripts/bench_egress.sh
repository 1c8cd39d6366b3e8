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
tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT; printf '%s\n' "$out" > "$tmp"
python3 - "$DOC" "$stamp" "$tmp" <<'PY'
import sys
doc, stamp, body = sys.argv[1], sys.argv[2], open(sys.argv[3]).read().strip()
s = open(doc).read()
a, b = "<!-- bench:egress -->", "<!-- /bench:egress -->"
i, j = s.index(a) + len(a), s.index(b)
s = s[:i] + "\n_Run " + stamp + ", `scripts/bench_egress.sh`_\n\n" + body + "\n" + s[j:]
open(doc, "w").write(s)
PY
echo "written to $DOC"
