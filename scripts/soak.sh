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
# both frontends, e.g. "--policy notify"), PVNET (binary; default: built
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
"$PVNET" ctl --ctl-socket "$ctl" ports --json >"$dir/ctl_0.json" || die "pvnet ctl failed"

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
    "$PVNET" ctl --ctl-socket "$ctl" ports --json >"$dir/ctl_$r.json" || die "pvnet ctl failed"
    python3 "$root/scripts/lib/soak.py" round "$dir" "$r" "$ROUNDS" "$t0" || die "round $r does not add up"
done
t1=$(date +%s.%N)

python3 "$root/scripts/lib/soak.py" total "$dir" "$ROUNDS" "$t0" "$t1" "$TOTAL" || die "totals do not add up"
