#!/usr/bin/env bash
# Builds and runs every fuzz target for SECONDS each (default 20) on STABLE Rust.
# Exits non-zero if a target crashes (panic, abort, timeout) or shows no coverage.
#
#   fuzz/run.sh [SECONDS]            # all targets
#   TARGETS="desc_chain" fuzz/run.sh 60
#   FUZZ_DIRECT=1 fuzz/run.sh 10     # skip cargo-fuzz, build with cargo + RUSTFLAGS
#
# Route 1: `cargo fuzz run --sanitizer none`, which on stable only passes stable `-C` flags
# (SanitizerCoverage via -Cpasses=sancov-module and -Cllvm-args). cargo-fuzz is installed
# with `cargo install --locked` if it is missing.
# Route 2 (fallback, or FUZZ_DIRECT=1): the same flags by hand with plain `cargo build`.
# No AddressSanitizer on stable (-Zsanitizer is nightly-only); overflow checks and debug
# assertions are on in both routes, and every target checks its own invariants.
#
# Corpora: fuzz/seeds/<target> is kept in the repository (a minimized corpus, merged back
# after long campaigns: see docs/robustness.md); every run reads it and writes what it finds
# to fuzz/corpus/<target> (not kept). Crashes go to fuzz/artifacts/<target>; reproduce one
# with: cargo fuzz run --sanitizer none <target> fuzz/artifacts/<target>/crash-...
set -euo pipefail

SECONDS_PER_TARGET="${1:-20}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
TARGETS="${TARGETS:-desc_chain packed_chain driver_used packed_used gso vhost_msg}"
HOST="$(rustc -vV | sed -n 's/^host: //p')"
LOGDIR="$HERE/target/run-logs"
mkdir -p "$LOGDIR"

echo "== $(rustc -V) on $HOST; ${SECONDS_PER_TARGET}s per target"

use_cargo_fuzz=0
if [[ "${FUZZ_DIRECT:-0}" != 1 ]]; then
    if cargo fuzz --version >/dev/null 2>&1; then
        use_cargo_fuzz=1
    else
        echo "== installing cargo-fuzz (cargo install cargo-fuzz --locked)"
        if cargo install cargo-fuzz --locked; then
            use_cargo_fuzz=1
        else
            echo "== cargo-fuzz unavailable: building directly"
        fi
    fi
fi

# Flags of the direct route: what cargo-fuzz passes with --sanitizer none.
direct_rustflags=(
    -Cpasses=sancov-module
    -Cllvm-args=-sanitizer-coverage-level=4
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
    -Cllvm-args=-sanitizer-coverage-pc-table
    -Cllvm-args=-sanitizer-coverage-trace-compares
    --cfg fuzzing
    -Cdebug-assertions
    -Coverflow-checks
    -Cforce-frame-pointers
)

if [[ $use_cargo_fuzz == 1 ]]; then
    cargo fuzz build --sanitizer none
else
    RUSTFLAGS="${direct_rustflags[*]}" \
        cargo build --release --target "$HOST" --bins \
        --target-dir "$HERE/target/direct"
fi

failed=()
for t in $TARGETS; do
    mkdir -p "corpus/$t" "artifacts/$t" "seeds/$t"
    log="$LOGDIR/$t.log"
    echo "== $t: fuzzing for ${SECONDS_PER_TARGET}s (log: $log)"
    libfuzzer_args=(
        -max_total_time="$SECONDS_PER_TARGET"
        -timeout=10
        -rss_limit_mb=2048
        -malloc_limit_mb=512
        -print_final_stats=1
    )
    set +e
    if [[ $use_cargo_fuzz == 1 ]]; then
        cargo fuzz run --sanitizer none "$t" "corpus/$t" "seeds/$t" -- "${libfuzzer_args[@]}" >"$log" 2>&1
    else
        "$HERE/target/direct/$HOST/release/$t" "${libfuzzer_args[@]}" \
            -artifact_prefix="artifacts/$t/" "corpus/$t" "seeds/$t" >"$log" 2>&1
    fi
    rc=$?
    set -e
    grep -E '^#[0-9]+[[:space:]]+DONE|^Done|^stat::number_of_executed_units' "$log" || true
    if [[ $rc != 0 ]]; then
        echo "!! $t: exit code $rc"
        grep -m5 -E "panicked at|ERROR: libFuzzer|SUMMARY:|Failing input" -A2 "$log" || tail -n 40 "$log"
        failed+=("$t")
    elif ! grep -qE 'cov: [1-9]' "$log"; then
        echo "!! $t: no coverage reported: is the instrumentation on?"
        failed+=("$t")
    fi
done

if ((${#failed[@]})); then
    echo "== FAILED: ${failed[*]}"
    exit 1
fi
echo "== all targets ran clean"
