#!/usr/bin/env bash
# Soak: TOTAL numbered frames of mixed sizes through `pvnet switch`, from one pvnet frontend
# (port a) to another (port b), in ROUNDS rounds. Each round both frontends connect anew (the
# switch keeps its ports and counters across reconnections), the receiver first, then the
# sender with exactly TOTAL/ROUNDS frames and an end marker.
#
# Every frame must be delivered or counted as a drop with a reason, exactly:
#   frames the tx frontend sent      == frames the switch took from port a
#   frames the switch took from a    == frames it delivered to b + its drops (all reasons)
#   frames the switch delivered to b == frames the rx frontend received
#   data frames sent - received      == frames the rx frontend found missing (sequence gaps
#                                       and the end marker's count) == the switch's drops
#                                       (minus end markers lost)
#   frames received out of order or twice == 0
# Exits non-zero if anything does not add up, or a process fails.
#
#   scripts/soak.sh                          # 10^9 frames, 20 rounds
#   TOTAL=2000000 ROUNDS=4 scripts/soak.sh   # quick check
#
# Knobs (environment): TOTAL (1000000000), ROUNDS (20), SIZES (64-1500: --frame-len of the
# sender, MIN-MAX = uniform mix), B_OPTS (extra options of port b, default qdisc=none: no
# egress queue, a full receiver holds the sender up to 2 ms, then no_buffer; "" for the
# default fq_codel queue), RX_QUEUE (4096: receive ring of the rx frontend), IDLE_TIMEOUT (5 s:
# the rx frontend gives up waiting for a lost end marker), FRONTEND_OPTS (extra options of
# both frontends, e.g. "--poll notify"), PVNET (binary; default: built
# with `cargo build --release`), KEEP=1 keeps the temp directory.
set -euo pipefail

TOTAL=${TOTAL:-1000000000}
ROUNDS=${ROUNDS:-20}
SIZES=${SIZES:-64-1500}
B_OPTS=${B_OPTS-qdisc=none}
RX_QUEUE=${RX_QUEUE:-4096}
IDLE_TIMEOUT=${IDLE_TIMEOUT:-5}
FRONTEND_OPTS=${FRONTEND_OPTS:-}

die() {
    echo "soak: FAIL: $*" >&2
    exit 1
}

[[ $TOTAL =~ ^[0-9]+$ && $ROUNDS =~ ^[0-9]+$ ]] || die "TOTAL and ROUNDS must be integers"
((ROUNDS > 0 && TOTAL >= ROUNDS)) || die "need TOTAL >= ROUNDS > 0"

root=$(cd "$(dirname "$0")/.." && pwd)
if [[ -z ${PVNET:-} ]]; then
    (cd "$root" && cargo build --release --quiet) || die "cargo build --release failed"
    PVNET=$root/target/release/pvnet
fi
[[ -x $PVNET ]] || die "no binary $PVNET"

dir=$(mktemp -d "${TMPDIR:-/tmp}/pvnet-soak.XXXXXX")
pids=()
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    if [[ -n ${KEEP:-} ]]; then
        echo "soak: kept $dir" >&2
    else
        rm -rf "$dir"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'echo "soak: interrupted" >&2; exit 130' INT
trap 'echo "soak: terminated" >&2; exit 143' TERM

# Waits (up to $3 s) for file $1 to exist, while process $2 runs.
wait_for() {
    local i
    for ((i = 0; i < ${3:-20} * 20; i++)); do
        [[ -e $1 ]] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# Waits (up to 20 s) for a `ready` line in file $1 written by process $2.
wait_ready() {
    local i
    for ((i = 0; i < 400; i++)); do
        grep -q '"ready"' "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

a=$dir/a.sock
b=$dir/b.sock
ctl=$dir/ctl.sock
bspec="vhost-user:name=b,socket=$b${B_OPTS:+,$B_OPTS}"
PVNET_LOG=${PVNET_LOG:-warn} "$PVNET" switch \
    --port "vhost-user:name=a,socket=$a" --port "$bspec" \
    --ctl-socket "$ctl" >"$dir/switch.out" 2>"$dir/switch.err" &
sw=$!
pids+=("$sw")
for s in "$a" "$b" "$ctl"; do
    wait_for "$s" "$sw" || die "switch did not come up: $(tail -5 "$dir/switch.err")"
done
"$PVNET" ctl --socket "$ctl" ports --json >"$dir/ctl_0.json" || die "pvnet ctl failed"

per=$((TOTAL / ROUNDS))
echo "soak: $TOTAL frames of $SIZES B in $ROUNDS rounds through pvnet switch" \
    "(port b: ${B_OPTS:-default egress}), $dir"
t0=$(date +%s.%N)
for ((r = 1; r <= ROUNDS; r++)); do
    n=$per
    ((r == ROUNDS)) && n=$((TOTAL - per * (ROUNDS - 1)))
    "$PVNET" frontend --socket "$b" --role rx --queue-size "$RX_QUEUE" \
        --idle-timeout "$IDLE_TIMEOUT" $FRONTEND_OPTS >"$dir/rx_$r.json" 2>"$dir/rx_$r.err" &
    rx=$!
    pids+=("$rx")
    wait_ready "$dir/rx_$r.json" "$rx" || die "round $r: rx frontend not ready: $(tail -3 "$dir/rx_$r.err")"
    "$PVNET" frontend --socket "$a" --role tx --count "$n" --frame-len "$SIZES" $FRONTEND_OPTS \
        >"$dir/tx_$r.json" 2>"$dir/tx_$r.err" &
    tx=$!
    pids+=("$tx")
    txrc=0
    wait "$tx" || txrc=$?
    rxrc=0
    wait "$rx" || rxrc=$?
    pids=("$sw")
    ((txrc == 0)) || die "round $r: tx frontend exited $txrc: $(tail -3 "$dir/tx_$r.err")"
    # rx exits non-zero only if its end marker never came (a counted drop): accounted below.
    if ((rxrc != 0)) && ! grep -q '"timed_out":true' "$dir/rx_$r.json"; then
        die "round $r: rx frontend exited $rxrc: $(tail -3 "$dir/rx_$r.err")"
    fi
    "$PVNET" ctl --socket "$ctl" ports --json >"$dir/ctl_$r.json" || die "pvnet ctl failed"
    python3 - "$dir" "$r" "$ROUNDS" "$t0" <<'EOF' || die "round $r does not add up"
import json, sys, time

d, r, rounds, t0 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])

def final(path):
    for line in open(path):
        if line.startswith('{"final"'):
            return json.loads(line)["final"]
    raise SystemExit(f"no final line in {path}")

def ports(path):
    return {p["name"]: p["counters"] for p in json.load(open(path))["ports"]}

tx, rx = final(f"{d}/tx_{r}.json"), final(f"{d}/rx_{r}.json")
now, before = ports(f"{d}/ctl_{r}.json"), ports(f"{d}/ctl_{r - 1}.json")
delta = {p: {k: now[p][k] - before[p].get(k, 0) for k in now[p]} for p in now}
drops = {}
for p in delta:
    for k, v in delta[p].items():
        if k.startswith("drops_") and v:
            drops[k[6:]] = drops.get(k[6:], 0) + v
sw_drops = sum(drops.values())
end_lost = 0 if rx.get("end_count") is not None else 1
rec = {
    "sent": tx["data_sent"], "frames_sent": tx["tx_packets"],
    "received": rx["data_received"], "frames_received": rx["rx_packets"],
    "missing": rx["missing"], "backward": rx["backward"], "seq_errors": rx["seq_errors"],
    "rx_errors": rx["rx_errors"], "end_lost": end_lost,
    "sw_in": delta["a"]["rx_packets"], "sw_out": delta["b"]["tx_packets"],
    "sw_backlog": now["b"]["backlog"], "drops": drops, "secs": tx["secs"],
}
bad = []
def check(ok, what):
    if not ok:
        bad.append(what)
check(rec["frames_sent"] == rec["sw_in"], f"tx frontend sent {rec['frames_sent']} frames, switch took {rec['sw_in']}")
check(rec["sw_in"] == rec["sw_out"] + sw_drops,
      f"switch took {rec['sw_in']}, delivered {rec['sw_out']} + dropped {sw_drops}")
check(rec["sw_out"] == rec["frames_received"] + rec["rx_errors"],
      f"switch delivered {rec['sw_out']}, rx frontend received {rec['frames_received']} (+{rec['rx_errors']} errors)")
check(rec["backward"] == 0, f"{rec['backward']} frames out of order or duplicated")
check(rec["sent"] - rec["received"] == sw_drops - end_lost + rec["rx_errors"],
      f"{rec['sent'] - rec['received']} data frames lost, {sw_drops} switch drops ({end_lost} end markers)")
if not end_lost:
    check(rx["end_count"] == rec["sent"], f"end marker says {rx['end_count']}, tx sent {rec['sent']}")
    check(rec["missing"] == rec["sent"] - rec["received"],
          f"rx found {rec['missing']} missing, {rec['sent'] - rec['received']} lost")
check(rec["sw_backlog"] == 0, f"{rec['sw_backlog']} frames still queued at b")
json.dump(rec, open(f"{d}/round_{r}.json", "w"))
mpps = rec["sent"] / rec["secs"] / 1e6 if rec["secs"] > 0 else 0.0
why = " ".join(f"{k} {v}" for k, v in sorted(drops.items())) or "none"
print(f"round {r}/{rounds}: {rec['sent']} sent, {rec['received']} received, "
      f"{rec['sent'] - rec['received']} dropped ({why}"
      f"{', its end marker among them' if end_lost else ''}), {mpps:.2f} Mpps, "
      f"{rec['secs']:.1f} s, elapsed {time.time() - t0:.0f} s"
      + ("" if not bad else "  <- DOES NOT ADD UP: " + "; ".join(bad)), flush=True)
sys.exit(1 if bad else 0)
EOF
done
t1=$(date +%s.%N)

python3 - "$dir" "$ROUNDS" "$t0" "$t1" "$TOTAL" <<'EOF' || die "totals do not add up"
import json, sys
d, rounds, t0, t1, total = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
recs = [json.load(open(f"{d}/round_{r}.json")) for r in range(1, rounds + 1)]
s = lambda k: sum(x[k] for x in recs)
drops = {}
for x in recs:
    for k, v in x["drops"].items():
        drops[k] = drops.get(k, 0) + v
first = json.load(open(f"{d}/ctl_0.json"))["ports"]
last = json.load(open(f"{d}/ctl_{rounds}.json"))["ports"]
c0 = {p["name"]: p["counters"] for p in first}
c1 = {p["name"]: p["counters"] for p in last}
sw_drops = sum(v for p in c1 for k, v in c1[p].items() if k.startswith("drops_")) - sum(
    v for p in c0 for k, v in c0[p].items() if k.startswith("drops_"))
sent, received, lost = s("sent"), s("received"), s("sent") - s("received")
end_lost, rx_err = s("end_lost"), s("rx_errors")
bad = []
if sent != total:
    bad.append(f"sent {sent}, asked for {total}")
if sw_drops != sum(drops.values()):
    bad.append(f"switch drops {sw_drops} overall, {sum(drops.values())} over the rounds")
if c1["a"]["rx_packets"] - c0["a"]["rx_packets"] != s("frames_sent"):
    bad.append("switch port a rx_packets != frames sent")
if c1["b"]["tx_packets"] - c0["b"]["tx_packets"] != s("frames_received") + rx_err:
    bad.append("switch port b tx_packets != frames received")
if lost != sw_drops - end_lost + rx_err:
    bad.append(f"{lost} lost, {sw_drops} switch drops ({end_lost} end markers), {rx_err} rx errors")
if s("backward"):
    bad.append(f"{s('backward')} frames out of order or duplicated")
secs = t1 - t0
why = ", ".join(f"{k} {v}" for k, v in sorted(drops.items())) or "none"
print(f"soak: {rounds} rounds ({rounds} reconnects of each frontend), {secs:.1f} s elapsed, "
      f"{sent / secs / 1e6:.2f} Mpps overall ({sent / s('secs') / 1e6:.2f} Mpps while sending)")
print(f"soak: frames incl. end markers: {s('frames_sent')} sent, {s('frames_received')} received; "
      f"end markers lost {end_lost}, rx errors {rx_err}, seq_errors (gaps) {s('seq_errors')}, "
      f"missing {s('missing')}, out of order/duplicated {s('backward')}")
tail = "counts add up" if not bad else "COUNTS DO NOT ADD UP: " + "; ".join(bad)
print(f"soak: {sent} sent, {received} received, {lost} dropped (reasons: {why}), {tail}", flush=True)
sys.exit(1 if bad else 0)
EOF
