#!/usr/bin/env bash
# scripts/peers/setup.sh - prepares this machine for pvnet's interop tests and peer benchmarks.
# Idempotent; ~2 min on a fresh Debian 12 (apt-get), ~1 s when everything is in place.
#
#   * DPDK 22.11 dpdk-testpmd and the PMDs it needs (net_vhost, net_virtio_user, mempool ring)
#   * QEMU 7.2 (qemu-system-x86), iperf3, sockperf, ethtool, kmod, cpio, python3, gcc
#   * $HUGEPAGES (1024) 2 MiB hugepages reserved, hugetlbfs mounted on /dev/hugepages
#   * the guest, under $PVNET_PEERS_WORK/guest (default /tmp/pvnet-peers/guest), from Debian
#     packages only, without installing a kernel on this host:
#       vmlinux       the Debian 6.1 kernel as an ELF (QEMU boots it through its PVH entry,
#                     which skips the real-mode setup and in-guest decompression)
#       base.cpio.gz  busybox (static), iperf3 + sockperf (+ their libraries), the virtio_net,
#                     virtio_pci, pktgen and 8021q modules (+ dependencies) and /init, which loads the
#                     modules, runs /run.sh (appended per test as a second cpio) under a
#                     timeout, prints PVG-DONE and powers off.
# Then it prints the facts results depend on: KVM flavour and the accelerator chosen,
# hugepages, QEMU/DPDK/kernel versions, c2c latency.
#
# Env: PVNET_PEERS_WORK (work dir), HUGEPAGES (2 MiB pages, 1024), REBUILD_GUEST=1, ACCEL.
source "$(dirname "$0")/../lib/common.sh"
need_root
mkdir -p "$WORK"

apt_install "${DPDK_PKGS[@]}" "${QEMU_PKGS[@]}" "${TOOL_PKGS[@]}"
command -v shellcheck >/dev/null || apt_install shellcheck || true   # lint only
ensure_hugepages "$HUGEPAGES"

# ---- guest image ----------------------------------------------------------------------------
build_guest() {
  local G="$GUEST_DIR" debs="$WORK/debs" kpkg kver R
  mkdir -p "$G" "$debs"
  # The running kernel here is not Debian's and has no modules: take Debian's kernel package
  # (what linux-image-amd64 depends on) and busybox-static as .debs and unpack them here.
  kpkg=$(apt-cache depends --important linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$kpkg" ] || die "cannot resolve linux-image-amd64"
  local p
  for p in "$kpkg" busybox-static; do
    ls "$debs/${p}_"*.deb >/dev/null 2>&1 ||
      (cd "$debs" && timeout 600 apt-get download -q "$p" >&2) || die "apt-get download $p failed"
  done
  rm -rf "$G/pkg"; mkdir -p "$G/pkg"
  local deb
  for deb in "$debs/${kpkg}_"*.deb "$debs/busybox-static_"*.deb; do dpkg-deb -x "$deb" "$G/pkg"; done
  kver=$(find "$G/pkg/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | head -1)
  depmod -b "$G/pkg" "$kver"

  # vmlinuz is a bzImage with an xz payload; the payload is the ELF vmlinux.
  python3 "$PYLIB/extract_vmlinux.py" "$G/pkg/boot/vmlinuz-$kver" "$G/vmlinux.tmp"
  mv "$G/vmlinux.tmp" "$G/vmlinux"

  R="$G/root"; rm -rf "$R"
  mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,etc,lib/modules}
  cp "$G/pkg/bin/busybox" "$R/bin/busybox"
  install_with_libs "$R" /usr/bin/iperf3 /usr/bin/sockperf
  # Modules in dependency order (modprobe --show-depends against the unpacked tree).
  : > "$R/modules.order"
  local m ko base
  for m in virtio_pci virtio_net pktgen 8021q; do
    while read -r ko; do
      base=$(basename "$ko"); base=${base%.xz}; base=${base%.zst}
      grep -qx "$base" "$R/modules.order" && continue
      case "$ko" in
        *.xz) xz -dc "$ko" > "$R/lib/modules/$base" ;;
        *.zst) zstd -qdc "$ko" > "$R/lib/modules/$base" ;;
        *) cp "$ko" "$R/lib/modules/$base" ;;
      esac
      echo "$base" >> "$R/modules.order"
    done < <(modprobe -d "$G/pkg" -S "$kver" --show-depends "$m" | awk '$1=="insmod"{print $2}')
  done
  grep -qx virtio_net.ko "$R/modules.order" || die "virtio_net module not found in $kpkg"

  cat > "$R/init" <<'EOF'
#!/bin/busybox sh
# pvnet peer guest: load virtio_net, pktgen and 8021q, run /run.sh, power off. Kernel cmdline:
#   pvg.timeout=SECS (for /run.sh, default 120)
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod /lib/modules/$m || echo "PVG-WARN insmod $m failed"; done
TMO=120
for a in $(cat /proc/cmdline); do case "$a" in pvg.timeout=*) TMO=${a#pvg.timeout=};; esac; done
# Nothing but the test may send: no IPv6 (router solicitations, DAD), no address (ARP).
echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 2>/dev/null
echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 2>/dev/null
ip link set lo up
echo "PVG-READY uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r)"
if [ -f /run.sh ]; then timeout "$TMO" sh /run.sh; echo "PVG-DONE rc=$? uptime=$(cut -d' ' -f1 /proc/uptime)"; fi
poweroff -f
EOF
  chmod +x "$R/init"
  (cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) > "$G/base.cpio.gz.tmp"
  mv "$G/base.cpio.gz.tmp" "$G/base.cpio.gz"
  echo "$kver" > "$G/kernel.version"
  tr '\n' ' ' < "$R/modules.order" > "$G/modules.txt"
  rm -rf "$G/pkg"
  log "guest: kernel $kver, modules: $(cat "$G/modules.txt")"
}

# (An image from before the 802.1Q module joined the list is built again: guest_vlan needs it.)
if [ -n "${REBUILD_GUEST:-}" ] || [ ! -s "$GUEST_DIR/vmlinux" ] || [ ! -s "$GUEST_DIR/base.cpio.gz" ] ||
   ! grep -qw 8021q.ko "$GUEST_DIR/modules.txt" 2>/dev/null; then
  build_guest
fi

# ---- a newer QEMU, beside the system's -------------------------------------------------------
# QEMU 7.2 drops a guest's domain-wide IOTLB flush (Linux's lazy mode) for vhost backends: it
# walks only ranges it mapped itself, and a backend's translations come from misses (fixed
# upstream in 8.0, "intel-iommu: send UNMAP notifications for domain or global inv desc"). The
# lazy-vIOMMU case runs under bookworm-backports' QEMU: its packages are downloaded and unpacked
# under $WORK/qemu-bpo (nothing installed, the system's QEMU untouched), with a wrapper that
# points it at its own firmware and the system's SeaBIOS.
fetch_qemu_new() {
  local Q="$WORK/qemu-bpo" A=()
  [ -x "$QEMU_NEW" ] && "$QEMU_NEW" --version >/dev/null 2>&1 && return 0
  rm -rf "$Q"; mkdir -p "$Q/apt/lists/partial" "$Q/apt/cache/archives/partial" "$Q/debs" "$Q/root"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > "$Q/apt/bpo.sources"
  A=(-o Dir::Etc::sourcelist="$Q/apt/bpo.sources" -o Dir::Etc::sourceparts=/nonexistent
     -o Dir::State::Lists="$Q/apt/lists" -o Dir::Cache="$Q/apt/cache" -o APT::Sandbox::User=root)
  timeout 300 apt-get "${A[@]}" update -q >&2 || return 1
  (cd "$Q/debs" && timeout 600 apt-get "${A[@]}" download -q qemu-system-x86 qemu-system-data qemu-system-common >&2) || return 1
  local d; for d in "$Q"/debs/*.deb; do dpkg -x "$d" "$Q/root" || return 1; done
  printf '#!/bin/sh\nexec %s -L %s -L /usr/share/seabios "$@"\n' "$Q/root/usr/bin/qemu-system-x86_64" "$Q/root/usr/share/qemu" > "$QEMU_NEW"
  chmod +x "$QEMU_NEW"
  "$QEMU_NEW" --version >/dev/null
}
fetch_qemu_new || { rm -f "$QEMU_NEW"; log "warning: no QEMU from bookworm-backports: guest_tap_viommu_lazy cannot run"; }

# ---- facts ----------------------------------------------------------------------------------
ver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo missing; }
echo "== pvnet peers: facts"
echo "work dir:   $WORK"
echo "cpus:       $(nproc)   host kernel: $(uname -r)"
case "$(kvm_flavour)" in
  pvm)  echo "kvm:        /dev/kvm is kvm_pvm (PVM): stock guest kernels cannot run on it -> guests use TCG" ;;
  hw)   echo "kvm:        hardware KVM -> guests use KVM" ;;
  none) echo "kvm:        /dev/kvm absent -> guests use TCG" ;;
esac
echo "accel:      $(guest_accel)$( [ "$(guest_accel)" = "-accel tcg -cpu max" ] && echo '  (vhost-user needs virtio-net-pci vectors=0 under TCG: QEMU 7.2 segfaults in msix_set_vector_notifiers otherwise)')"
echo "hugepages:  $(cat /proc/sys/vm/nr_hugepages) x 2 MiB reserved, $(awk '/HugePages_Free/{print $2}' /proc/meminfo) free; hugetlbfs on /dev/hugepages: $(grep -c ' /dev/hugepages hugetlbfs ' /proc/mounts)"
echo "qemu:       $(ver qemu-system-x86)  ($(qemu-system-x86_64 --version | head -1))"
echo "qemu new:   $([ -x "$QEMU_NEW" ] && "$QEMU_NEW" --version | head -1 || echo missing)  ($QEMU_NEW: lazy-vIOMMU case)"
echo "dpdk:       $(ver dpdk-dev)  ($(command -v dpdk-testpmd))"
echo "guest:      kernel $(cat "$GUEST_DIR/kernel.version"), modules: $(cat "$GUEST_DIR/modules.txt")"
echo "vhost-net:  $([ -c /dev/vhost-net ] && echo present || echo 'absent (no CONFIG_VHOST_NET here)')"
if [ -x "$PVNET_BIN" ]; then echo "c2c:        $(c2c_ns) ns one-way CPU0<->CPU1 (pvnet limits)"; fi
