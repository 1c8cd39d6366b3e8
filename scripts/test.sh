#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this). On a fresh Debian machine
# it installs what it needs first. Ends with one summary line: "N passed, N failed".
#
#   scripts/test.sh            # everything: static checks, unit/property/integration/e2e tests, fuzz
#   FUZZ_SECS=5 scripts/test.sh   # shorter fuzz runs (default 20 s per target)
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
FUZZ_SECS="${FUZZ_SECS:-20}"
log() { echo "== $*"; }

# --- set-up (idempotent) -------------------------------------------------------------------
need_apt=()
command -v cc >/dev/null || need_apt+=(gcc libc6-dev)
command -v valgrind >/dev/null || need_apt+=(valgrind)
command -v ethtool >/dev/null || need_apt+=(ethtool)
if ((${#need_apt[@]})); then
  log "installing ${need_apt[*]}"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}" >/dev/null
fi
for c in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c" >/dev/null 2>&1 || true
done
# The scripts' Python is linted with ruff and tested with pytest, both pinned, in a venv under
# target/ (Debian 12 packages no ruff; the system's Python is left as it is).
PYTOOLS=target/pytools RUFF_VERSION=0.17.6 PYTEST_VERSION=9.2.0
if ! "$PYTOOLS/bin/ruff" --version 2>/dev/null | grep -qx "ruff $RUFF_VERSION" ||
   ! "$PYTOOLS/bin/python" -m pytest --version 2>&1 | grep -qx "pytest $PYTEST_VERSION"; then
  log "installing ruff $RUFF_VERSION and pytest $PYTEST_VERSION into $PYTOOLS"
  python3 -c 'import ensurepip' 2>/dev/null || {
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv >/dev/null; }
  python3 -m venv "$PYTOOLS" && "$PYTOOLS/bin/pip" install -q "ruff==$RUFF_VERSION" "pytest==$PYTEST_VERSION"
fi

# The machine's own network: every test that moves traffic does so in network namespaces it
# makes (named $PVNET_NS_PREFIX-..., the cargo tests in anonymous ones); nothing may be
# configured in the root namespace. Its addresses, routes and links now, compared at the end.
export PVNET_NS_PREFIX="pvnet-t$$"
net_before=$(mktemp)
bash -c 'source scripts/lib/common.sh && root_net_state' > "$net_before"

passed=0; failed=0; failures=()
step() { # step NAME CMD...: runs a step that is one test of its own
  local name="$1"; shift
  log "$name"
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$name"); fi
}

# --- static checks ---------------------------------------------------------------------------
step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets --features virtq/mock -q -- -D warnings
step "no import circle between a crate's modules" python3 scripts/check_imports.py
step "no function over 100 lines, no file over 900 lines of code" python3 scripts/check_sizes.py
step "ruff check: the scripts' Python (ruff.toml)" "$PYTOOLS/bin/ruff" check -q scripts tests/interop
step "pytest scripts/tests: the scripts' figures, report reader, interop checkers, coherence model" \
  "$PYTOOLS/bin/python" -m pytest -q -p no:cacheprovider scripts/tests
step "the coherence harness builds (its prefetches traced)" cargo build -q --release -p pvnet-dataplane --example switchpath --features coherence --target-dir target/coherence

# --- cargo tests: unit, property, concurrency, malformed-ring, end-to-end, hostile frontend ----
log "cargo test (release: the end-to-end and stress tests move real traffic)"
out=$(mktemp)
cargo test --release --workspace --features virtq/mock --no-fail-fast 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
read -r p f < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } } END { print p + 0, f + 0 }' "$out")
passed=$((passed + p)); failed=$((failed + f))
if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); failures+=("cargo test (exit $rc)"); fi
[ "$f" -gt 0 ] && failures+=("cargo test: $f failed")
[ "$p" -eq 0 ] && { failed=$((failed + 1)); failures+=("cargo test ran no test"); }
rm -f "$out"

# --- interop with frontends pvnet did not write: DPDK testpmd virtio-user, a Linux guest ------
# (installs DPDK, QEMU, hugepages and a guest image from Debian packages on first run)
log "interop: DPDK testpmd and a Linux guest under QEMU against pvnet's backend"
out=$(mktemp)
tests/interop/run.sh 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
read -r p f < <(awk '/^[0-9]+ passed, [0-9]+ failed/ { p = $1; f = $3 } END { print p + 0, f + 0 }' "$out")
passed=$((passed + p)); failed=$((failed + f))
if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); failures+=("interop (exit $rc)"); fi
[ "$f" -gt 0 ] && failures+=("interop: $f failed")
rm -f "$out"

# --- fuzzing (stable Rust, libFuzzer via SanitizerCoverage), bounded ---------------------------
step "fuzz targets, ${FUZZ_SECS}s each" fuzz/run.sh "$FUZZ_SECS"

# --- the main job on its default, briefly: counts must add up ---------------------------------
step "pvnet bench smoke (counts add up)" ./target/release/pvnet bench --secs 0.5 --json

# --- nothing of the suite's left, the root namespace as it was ----------------------------------
# shellcheck disable=SC2016  # $1 is the inner shell's
step "root network namespace unchanged, no namespace of the suite left" \
  bash -c 'source scripts/lib/common.sh && root_net_check "$1"' _ "$net_before"
rm -f "$net_before"

echo
((${#failures[@]})) && printf 'FAILED: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
