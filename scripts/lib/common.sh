# scripts/lib/common.sh - shell helpers shared by pvnet's scripts, its peer harness
# (scripts/peers/) and the interop tests (tests/interop/run.sh); sourced, never executed.
# The Python these helpers and the scripts call lives beside it, in scripts/lib/*.py
# ($PYLIB): pvnet_report.py reads pvnet's JSON reports, one module per benchmark its tables.
#
# Peers are programs pvnet did not write: DPDK 22.11 dpdk-testpmd (net_vhost, net_virtio_user)
# and a Debian Linux guest (virtio_net) under QEMU 7.2. Everything runs as root on Debian 12.
# Scratch files, logs, sockets and the guest image live in $PVNET_PEERS_WORK
# (default /tmp/pvnet-peers). Every process is started under `timeout` and stopped by its PID.
# shellcheck shell=bash

set -euo pipefail
PYLIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PVNET_ROOT="$(cd "$PYLIB/../.." && pwd)"
# shellcheck disable=SC2034  # used by the scripts that source this file
PEERS_DIR="$PVNET_ROOT/scripts/peers"   # setup.sh and the peer benchmarks
WORK="${PVNET_PEERS_WORK:-/tmp/pvnet-peers}"
GUEST_DIR="$WORK/guest"
# The QEMU the guests run under (Debian 12's 7.2 by default). QEMU_NEW: a newer one, unpacked
# from bookworm-backports by setup.sh beside the system's (not installed), for what 7.2 cannot
# do: a guest's lazy vIOMMU invalidations reach vhost-user backends only from QEMU 8.0 on.
QEMU_BIN="${QEMU_BIN:-qemu-system-x86_64}"
# shellcheck disable=SC2034  # used by the scripts that source this file
QEMU_NEW="$WORK/qemu-bpo/qemu-system-x86_64"
PVNET_BIN="${PVNET_BIN:-$PVNET_ROOT/target/release/pvnet}"
HUGEPAGES="${HUGEPAGES:-1024}"          # 2 MiB pages: 2 GiB, two testpmds take 512 MiB each

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "run as root (hugepages, apt-get, testpmd need it)"; }

# apt_install PKG... : installs only the packages that are missing (no recommends). Refreshes the
# package lists first when they are older than a day or an install fails on a stale list.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  log "apt-get install ${missing[*]}"
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
    timeout 300 apt-get update -q >&2
  fi
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 || {
    timeout 300 apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
  }
}

# Debian's `dpdk` package holds only scripts: dpdk-testpmd is in dpdk-dev, and the PMDs the
# harness loads are separate packages (not pulled in with --no-install-recommends).
# shellcheck disable=SC2034  # used by the scripts that source this file
DPDK_PKGS=(dpdk dpdk-dev librte-net-vhost23 librte-net-virtio23 librte-mempool-ring23)
# shellcheck disable=SC2034
QEMU_PKGS=(qemu-system-x86)
# shellcheck disable=SC2034
TOOL_PKGS=(iperf3 sockperf iputils-ping kmod cpio gzip python3 gcc libc6-dev procps util-linux coreutils iproute2 ethtool)

# ensure_hugepages N : reserves N 2 MiB pages and mounts hugetlbfs on /dev/hugepages.
ensure_hugepages() {
  local want="$1" have
  have=$(cat /proc/sys/vm/nr_hugepages)
  if [ "$have" -lt "$want" ]; then
    echo "$want" > /proc/sys/vm/nr_hugepages || true
    have=$(cat /proc/sys/vm/nr_hugepages)
  fi
  [ "$have" -ge "$want" ] || die "only $have of $want 2 MiB hugepages could be reserved"
  if ! grep -qs ' /dev/hugepages hugetlbfs ' /proc/mounts; then
    mkdir -p /dev/hugepages
    mount -t hugetlbfs -o pagesize=2M nodev /dev/hugepages
  fi
}

# stop_pid PID [SIG] : stops a process this harness started (by PID only): SIG (default TERM),
# then KILL after 3 s. Returns at once if it is gone.
stop_pid() {
  local pid="$1" sig="${2:-TERM}"
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -"$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# wait_pid PID SECS : waits for a child to exit, at most SECS; returns its status, or 124 after
# stopping it when it overstays.
wait_pid() {
  local pid="$1" secs="$2"
  for _ in $(seq $((secs * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then stop_pid "$pid"; wait "$pid" 2>/dev/null || true; return 124; fi
  local rc=0; wait "$pid" 2>/dev/null || rc=$?; return "$rc"
}

# wait_for SECS CMD... : polls CMD every 0.1 s until it succeeds; fails after SECS.
wait_for() {
  local secs="$1"; shift
  for _ in $(seq $((secs * 10))); do "$@" && return 0; sleep 0.1; done
  "$@"
}

median() { sort -g | awk '{a[NR]=$1} END{if(NR==0)print "nan"; else if(NR%2)print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# kvm_flavour: "pvm" (/dev/kvm is kvm_pvm: stock guest kernels cannot run, see docs/interop.md),
# "hw" (VMX/SVM KVM), or "none".
kvm_flavour() {
  if [ ! -c /dev/kvm ]; then echo none
  elif [ -d /sys/module/kvm_pvm ]; then echo pvm
  else echo hw; fi
}

# guest_accel: QEMU accelerator arguments. ACCEL=auto|kvm|tcg; auto = KVM with hardware
# virtualization, TCG when /dev/kvm is PVM (QEMU aborts on MSR 0x10a with -cpu host, the PVH
# vmlinux dies on an emulation failure) or absent.
guest_accel() {
  local a="${ACCEL:-auto}"
  if [ "$a" = auto ]; then [ "$(kvm_flavour)" = hw ] && a=kvm || a=tcg; fi
  case "$a" in
    kvm) echo "-accel kvm -cpu host" ;;
    tcg) echo "-accel tcg -cpu max" ;;
    *) die "ACCEL must be auto, kvm or tcg" ;;
  esac
}

# c2c_ns: one-way core-to-core cache-line hand-off CPU0<->CPU1 now, in ns (pvnet limits).
# The two vCPUs of these VMs flip between ~40-60 ns and ~180-440 ns; rates follow it ~3x.
c2c_ns() {
  timeout 20 "$PVNET_BIN" limits 2>/dev/null |
    python3 "$PYLIB/pvnet_report.py" c2c 2>/dev/null || echo nan
}

# build_pvnet: release build of the pvnet command (incremental, bounded).
build_pvnet() {
  if [ -z "${PVNET_NO_BUILD:-}" ]; then
    (cd "$PVNET_ROOT" && timeout 1200 cargo build --release -q -p pvnet) >&2 || die "cargo build failed"
  fi
  [ -x "$PVNET_BIN" ] || die "no pvnet binary at $PVNET_BIN"
}

# json_port FILE FIELD : FIELD of port 0 in pvnet backend's final JSON line in FILE
# (drops.<reason> for a drop counter); "missing" when there is no final line.
json_port() { python3 "$PYLIB/pvnet_report.py" port0 "$1" "$2"; }

# ---- network namespaces: test traffic never touches the machine's own network -----------------
# Every tap, veth, bridge, address, route and host-side tool (iperf3 -s, ping, sockperf) of a
# test or benchmark lives in a network namespace made here, never in the root namespace.
# pvnet switch runs under `ip netns exec NS` when it has a tap or AF_PACKET port (the tap is
# made in the namespace the switch runs in); QEMU and DPDK need none (vhost-user sockets and
# the control socket are filesystem paths, reachable from every namespace).
# Names are $NS_PREFIX-NAME: unique per run (the PID), under PVNET_NS_PREFIX (default
# "pvnet"), so a suite finds what it left: scripts/test.sh checks that nothing with its
# prefix is left, and that the root namespace's addresses, routes and links did not change.
NS_PREFIX="${PVNET_NS_PREFIX:-pvnet}-$$"
NETNS_MADE=()
# netns_new NAME : makes network namespace $NS_PREFIX-NAME (deleted first if a run with this
# PID left it), with lo up and IPv6 off (no router solicitations or MLD reports on the test
# links: the counters stay exact); sets NS to its name; netns_cleanup deletes it.
NS=
netns_new() {
  NS="$NS_PREFIX-$1"
  netns_del "$NS"
  ip netns add "$NS" || die "ip netns add $NS failed"
  NETNS_MADE+=("$NS")
  ip -n "$NS" link set lo up || die "lo up in $NS failed"
  ip netns exec "$NS" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
    || die "disable IPv6 in $NS failed"
}
# netns_del NS : stops what still runs in NS (only ours: nothing else knows its name), then
# deletes it; its taps, veths and bridges go with it (a tap once its last fd is closed).
netns_del() {
  local p
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$1" || return 0
  for p in $(ip netns pids "$1" 2>/dev/null); do stop_pid "$p" KILL; done
  ip netns del "$1" 2>/dev/null || true
}
# netns_cleanup : deletes every namespace this script made (for its EXIT trap).
netns_cleanup() { local n; for n in "${NETNS_MADE[@]}"; do netns_del "$n"; done; NETNS_MADE=(); }
# netns_left PREFIX : the namespaces whose name starts with PREFIX (one a line).
netns_left() { ip netns list 2>/dev/null | awk -v p="$1" 'index($1, p) == 1 {print $1}'; }
# root_net_state : the root namespace's network configuration, one item a line, stable
# between two calls when nothing changed: addresses (lifetimes left out), routes of every
# table (expiry left out), links with their UP flag. scripts/test.sh compares it before and
# after the suite.
root_net_state() {
  ip -o addr show | sed -E 's/\\? +(valid|preferred)_lft [^ ]+//g; s/ +$//' | sed 's/^/addr /'
  { ip -o -4 route show table all; ip -o -6 route show table all; } | sed -E 's/ expires [^ ]+//; s/ +$//' | sed 's/^/route /'
  ip -o link show | awk -F': ' '{ split($3, f, ">"); up = (f[1] ~ /[<,]UP(,|$)/) ? "UP" : "down"; print "link " $2 " " up }'
  # an XDP program attached to a root-namespace interface (prog/xdp, xdpgeneric, xdpdrv ...)
  ip -o link show | awk -F': ' '/ xdp| prog\/xdp/ {print "xdp " $2}'
}
# root_net_check BEFORE : fails, saying what changed, when the root namespace's state
# (root_net_state) differs from the file BEFORE, or a namespace named $PVNET_NS_PREFIX-... is
# left (a suite sets PVNET_NS_PREFIX for everything it runs).
root_net_check() {
  local after rc=0 left
  after=$(mktemp)
  root_net_state > "$after"
  if ! diff -q "$1" "$after" > /dev/null; then
    echo "the root network namespace changed (- before, + after):"
    diff -U0 "$1" "$after" | grep -E '^[-+][a-z]' | sed 's/^/  /' || true   # (diff's status 1: set -e)
    rc=1
  fi
  rm -f "$after"
  left=$(netns_left "${PVNET_NS_PREFIX:-pvnet}-")
  if [ -n "$left" ]; then
    echo "network namespaces left behind: $(echo "$left" | paste -sd ' ')"
    rc=1
  fi
  return "$rc"
}

# ---- testpmd ------------------------------------------------------------------------------
# Both testpmds run interactive (-i) with their prompt fed from a FIFO, so one script is the
# single timeline: start, show stats, stop, quit. EAL file prefixes keep the two apart.
#
# testpmd_start NAME LOG SECS ARGS... : starts dpdk-testpmd with stdin from $WORK/NAME.fifo,
# bounded by SECS (SIGINT, then KILL). Sets TP_PID[NAME]; open fd for writing is TP_FD[NAME].
declare -gA TP_PID=() TP_FD=()
testpmd_start() {
  local name="$1" logf="$2" secs="$3"; shift 3
  local fifo="$WORK/$name.fifo" fd
  rm -f "$fifo"; mkfifo "$fifo"
  # stdout line-buffered: into a file testpmd's statistics are otherwise written in 4 KiB
  # blocks, cut mid-line by the prompt's echo of the next command (which bypasses stdio)
  timeout -s INT -k 5 "$secs" stdbuf -oL dpdk-testpmd "$@" < "$fifo" > "$logf" 2>&1 &
  TP_PID[$name]=$!
  exec {fd}> "$fifo"
  TP_FD[$name]=$fd
}
tp() { local name="$1" fd; shift; fd=${TP_FD[$name]}; { echo "$*" >&"$fd"; } 2>/dev/null || true; }
# testpmd_quit NAME SECS : stop forwarding, print the port stats, quit; wait at most SECS.
testpmd_quit() {
  local name="$1" secs="${2:-10}" rc=0
  [ -n "${TP_PID[$name]:-}" ] || return 0
  local fd=${TP_FD[$name]}
  tp "$name" stop; tp "$name" "show port stats all"; tp "$name" quit
  exec {fd}>&-
  wait_pid "${TP_PID[$name]}" "$secs" || rc=$?
  unset "TP_PID[$name]" "TP_FD[$name]"
  return "$rc"
}
# hugepage_cleanup PREFIX : removes the hugetlbfs files an EAL with --file-prefix PREFIX left
# behind (with --single-file-segments the memseg file outlives the process and keeps its
# pages). Only our own prefixes are passed here, and only after that testpmd has exited.
# Its runtime directory (/var/run/dpdk/PREFIX) goes too.
hugepage_cleanup() {
  rm -f /dev/hugepages/"$1"map_* /dev/hugepages/"$1"_* 2>/dev/null || true
  [ -n "$1" ] && rm -rf "/var/run/dpdk/$1"
  return 0
}
testpmd_kill_all() { local n; for n in "${!TP_PID[@]}"; do stop_pid "${TP_PID[$n]}" INT; done; }

# tp_last LOG FIELD : last value of a "FIELD: N" counter in a testpmd log (port stats block).
tp_last() { grep -o "$2: *[0-9]*" "$1" | tail -1 | awk '{print $NF}'; }

# testpmd's "Accumulated forward statistics" TX/RX-packets after `stop` (the stop summary),
# added up over every stop in the log (forwarding started again counts afresh).
# (A block's own lines only: the port stats that follow are never taken for its total.)
tp_summary() { awk -v f="$2-packets:" '/Accumulated forward statistics/{on=1} /NIC statistics for port/{on=0} on{for(i=1;i<NF;i++) if($i==f){n+=$(i+1); on=0; break}} END{print n+0}' "$1"; }

# ---- guest --------------------------------------------------------------------------------
# The guest image (setup.sh): $GUEST_DIR/vmlinux (PVH ELF), base.cpio.gz (busybox, iperf3,
# sockperf, virtio_net + pktgen modules, /init). /init runs /run.sh from a second cpio that
# make_initrd appends (the kernel unpacks both).
# install_with_libs ROOT BIN... : each host BIN into ROOT at the same path, with the shared
# libraries it loads (the guest image's tools, a test's extra ones).
install_with_libs() {
  local root="$1" b l; shift
  for b in "$@"; do
    mkdir -p "$root$(dirname "$b")"; cp "$b" "$root$b"
    for l in $(ldd "$b" | grep -oE '/[^ ]+\.so[^ ]*'); do
      mkdir -p "$root$(dirname "$l")"; cp -L "$l" "$root$l"
    done
  done
}
# Env INITRD_BINS="/usr/sbin/ethtool ...": host binaries added to the overlay with their libraries.
make_initrd() {   # make_initrd RUN_SH OUT [INIT]   (INIT: a replacement /init, see napi0_init)
  local t; t=$(mktemp -d "$WORK/ov.XXXXXX")
  cp "$1" "$t/run.sh"; [ -n "${3:-}" ] && cp "$3" "$t/init"
  # shellcheck disable=SC2086  # a list of paths
  install_with_libs "$t" ${INITRD_BINS:-}
  (cd "$t" && find . -mindepth 1 -printf '%P\n' | cpio -o -H newc --quiet | gzip -1) > "$t/ov.cpio.gz"
  cat "$GUEST_DIR/base.cpio.gz" "$t/ov.cpio.gz" > "$2"
  rm -rf "$t"
}
# napi0_init OUT: the base image's /init with `napi_tx=0` on its virtio_net insmod, for
# make_initrd's INIT (the overlay's /init replaces the base one when the kernel unpacks the
# second cpio). The guest's driver then takes no TX-completion interrupts at all.
napi0_init() {
  # shellcheck disable=SC2016  # $m is the guest /init's variable
  zcat "$GUEST_DIR/base.cpio.gz" | (cd "$WORK" && cpio -i --quiet --to-stdout init) |
    sed 's|insmod /lib/modules/$m |insmod /lib/modules/$m $([ "$m" = virtio_net.ko ] \&\& echo napi_tx=0) |' > "$1"
  grep -q 'napi_tx=0' "$1" || die "could not patch the guest /init (insmod line not found)"
  chmod +x "$1"
}

# ---- shared by the benchmarks: quiet CPUs, the measured child -----------------------------------
# (QUIET_PCT and QUIET_WAIT are set by the calling script.)
# cpu_busy: percent of both CPUs busy over 0.5 s (everything but idle+iowait).
cpu_busy() {
  local a b
  a=$(awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6}' /proc/stat); sleep 0.5
  b=$(awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6}' /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN{split(a,x," "); split(b,y," "); t=y[1]-x[1]; i=y[2]-x[2]; printf "%.0f", (t > 0 ? 100*(t-i)/t : 0)}'
}
# wait_quiet: waits (<= QUIET_WAIT s) for the CPUs to be at most QUIET_PCT % busy; sets BUSY.
wait_quiet() {
  local i
  for i in $(seq "$QUIET_WAIT"); do
    BUSY=$(cpu_busy); [ "$BUSY" -le "$QUIET_PCT" ] && return
    [ "$i" = 1 ] && log "CPUs ${BUSY}% busy with other work; waiting up to ${QUIET_WAIT}s"
    sleep 0.5
  done
}
# cpu_ns PID : CPU time of all the process's threads, nanoseconds (0 once it is gone).
cpu_ns() { { cat /proc/"$1"/task/*/schedstat 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}'; }
# wait_sock PATH : waits (<= 10 s) for a control socket to appear, or dies.
wait_sock() { local i; for i in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.1; done; die "no control socket $1"; }
# child_pid PID: the single child of a `timeout` wrapper (the process we measure).
child_pid() { local c; c=$(cat "/proc/$1/task/$1/children" 2>/dev/null); echo "${c%% *}"; }
# split_qemu PID : QEMU's main-loop thread (tid == pid) to CPU1, the TCG vCPU thread(s) on CPU0.
split_qemu() {
  local t comm
  for t in /proc/"$1"/task/*; do
    comm=$(cat "$t/comm" 2>/dev/null) || continue
    case "$comm" in *TCG*|*KVM*) taskset -p -c 0 "${t##*/}" >/dev/null || true ;; esac
  done
  taskset -p -c 1 "$1" >/dev/null || true
  for t in /proc/"$1"/task/*; do echo "${t##*/} $(cat "$t/comm") $(taskset -p -c "${t##*/}" | sed 's/.*: //')"; done
}
# doc_section DOC NAME FILE : replaces what stands between `<!-- NAME:begin -->` and
# `<!-- NAME:end -->` in DOC with FILE's text (the markers are appended if DOC lacks them).
doc_section() { python3 "$PYLIB/docsection.py" section "$1" "$2" "$3"; }
# doc_results DOC NAME COMMAND SUMMARY RAW : DOC's NAME section becomes "Measured <date> with
# `COMMAND`, pvnet <revision>.", the SUMMARY file, and the RAW file (RESULT lines) folded.
doc_results() {
  local sec; sec=$(mktemp)
  {
    echo "Measured $(date -u +%Y-%m-%d) with \`$3\`, pvnet $(git -C "$PVNET_ROOT" describe --always --dirty 2>/dev/null)."
    echo; cat "$4"; echo
    echo "<details><summary>raw RESULT lines</summary>"; echo; echo '```'; cat "$5"; echo '```'; echo; echo "</details>"
  } > "$sec"
  doc_section "$1" "$2" "$sec"
  rm -f "$sec"
  log "table written to $1"
}
# guest_start SECS INITRD LOG APPEND DEVICE NETDEV_ARG... : boots the guest image in the
# background (all of QEMU on CPU0, -smp 1,maxcpus=2, memfd RAM shared with a vhost-user
# backend), serial console to LOG, bounded by SECS; sets GUEST_PID.
# maxcpus=2 (still one vCPU): with max_cpus == 1 QEMU's TCG drops the guest's memory barriers,
# so its virtio barriers would not order against a backend on another host CPU (lost
# interrupts and kicks were seen with -smp 1; docs/guest-policies.md).
# shellcheck disable=SC2034  # read by the scripts that source this file
GUEST_PID=
# GUEST_NS: a network namespace to run QEMU in (for its own tap backend, which opens the tap
# by name; vhost-user needs none). Every wrapper execs the next: GUEST_PID's child is QEMU.
guest_start() {   # env GUEST_MEM: guest RAM in MiB (512); GUEST_SMP: vCPUs (1, on CPU 0; 2: on both)
  local secs="$1" initrd="$2" glog="$3" append="$4" dev="$5" mem="${GUEST_MEM:-512}" smp="${GUEST_SMP:-1}" cpus=0; shift 5
  local acc nsx=(); read -ra acc <<< "$(guest_accel)"
  [ "$smp" -gt 1 ] && cpus=0,1
  [ -n "${GUEST_NS:-}" ] && nsx=(ip netns exec "$GUEST_NS")
  timeout -k 5 "$secs" "${nsx[@]}" taskset -c "$cpus" "$QEMU_BIN" "${acc[@]}" -m "$mem" -smp "$smp",maxcpus=2 -nodefaults \
    -no-user-config -display none -serial stdio -no-reboot -kernel "$GUEST_DIR/vmlinux" -initrd "$initrd" \
    -append "console=ttyS0 quiet panic=-1 $append" \
    -object "memory-backend-memfd,id=mem,size=${mem}M,share=on" -numa node,memdev=mem \
    "$@" -device "$dev" < /dev/null > "$glog" 2>&1 &
  # shellcheck disable=SC2034
  GUEST_PID=$!
}

# bench_dir NAME : a fresh work dir B=$WORK/NAME for a benchmark, with its own copy of the
# pvnet binary (PV: a rebuild meanwhile does not change the binary under a run), OUT for its
# result lines, and PIDS killed on exit.
# shellcheck disable=SC2034  # B, PV, OUT are the caller's
bench_dir() {
  B="$WORK/$1"; rm -rf "$B"; mkdir -p "$B"
  cp "$PVNET_BIN" "$B/pvnet"; PV="$B/pvnet"
  OUT="$B/results.txt"; : > "$OUT"
  PIDS=()
  trap bench_cleanup EXIT
  trap 'exit 130' INT; trap 'exit 143' TERM
}
bench_cleanup() { local p; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
# c2c : the one-way core-to-core latency now, ns (pvnet limits, with $PV), or nan.
c2c() { timeout 20 "$PV" limits 2>/dev/null | python3 "$PYLIB/pvnet_report.py" c2c 2>/dev/null || echo nan; }
