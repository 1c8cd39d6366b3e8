//! The host kernel's side of the switch: a Linux tap device opened with `IFF_VNET_HDR`, so
//! checksum and TSO offloads pass through in both directions (Linux
//! `Documentation/networking/tuntap.rst`, `drivers/net/tun.c`; QEMU's `net/tap-linux.c` is the
//! reference user).
//!
//! Every packet read or written starts with a 12-byte `virtio_net_hdr_v1` (`TUNSETVNETHDRSZ`
//! 12, little-endian fields, `TUNSETVNETLE`), so a frame moves between a virtio ring and the
//! tap with its header as is:
//!
//! * Written packets: the kernel honours `NEEDS_CSUM` (`csum_start`/`csum_offset`, the
//!   pseudo-header sum in the checksum field) and `GSO_TCPV4/6` (`gso_size`, `hdr_len`) whatever
//!   `Tap::set_offloads` says; a malformed header fails the write with `EINVAL`.
//!   `num_buffers` is ignored.
//! * Read packets: with the offloads on, the kernel may hand us partial-checksum packets
//!   (`NEEDS_CSUM`) and TCP GSO packets of up to 64 KiB; with them off it completes checksums
//!   and segments itself (flags 0). It may set `DATA_VALID` on packets whose checksum was
//!   verified (`CHECKSUM_UNNECESSARY`, e.g. forwarded from a NIC); packets the host makes
//!   itself come without it. `num_buffers` (bytes 10..12) is zeroed by kernels with "tun: Pad
//!   virtio headers" (2025; seen on 6.18) and left as the buffer held it by older ones: the
//!   reader sets it.
//!
//! The device lives as long as the file descriptor: it is not persistent.

use pvnet_net::HDR_LEN;
use std::fs::OpenOptions;
use std::io;
#[cfg(test)]
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU32, Ordering};

/// Length of the vnet header in front of every packet (`virtio_net_hdr_v1`).
pub const VNET_HDR_LEN: usize = HDR_LEN as usize;

/// The largest frame the kernel may hand us: an IP packet of 65535 bytes (the largest MTU a
/// tap takes; GSO packets are kept under 64 KiB, `gso_max_size`) behind an Ethernet header
/// and an 802.1Q tag (tun writes an offloaded VLAN tag into the frame).
pub const MAX_FRAME_LEN: usize = 65535 + 14 + 4;

/// Size of a receive buffer that never truncates a packet: the vnet header and
/// [`MAX_FRAME_LEN`].
pub const RECV_BUF_LEN: usize = VNET_HDR_LEN + MAX_FRAME_LEN;

/// `TUN_F_*` bits for checksum offload only.
const OFFLOAD_CSUM: u32 = libc::TUN_F_CSUM;
/// `TUN_F_*` bits for TCP segmentation offload (needs [`OFFLOAD_CSUM`]).
const OFFLOAD_TSO: u32 = libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;

/// A tap device: frames in and out of the host kernel's network stack.
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
    /// `TUN_F_*` bits last set with `TUNSETOFFLOAD`.
    offloads: AtomicU32,
}

/// Opens `/dev/net/tun` as a tap with a vnet header, non-blocking.
///
/// `name` is the interface name: empty (the kernel picks `tapN`), fixed, or a pattern such as
/// `pvtap%d`; [`Tap::name`] gives the name the kernel chose. With `offloads` the kernel may
/// send us partial-checksum and TSO packets (`TUN_F_CSUM | TSO4 | TSO6 | TSO_ECN`); if it
/// refuses, a warning is logged and the tap works without them (`Tap::offloads` is 0).
/// The link is down: see [`Tap::link_up`].
pub fn open(name: &str, offloads: bool) -> io::Result<Tap> {
    let mut ifr = ifreq(name)?;
    let fd: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| context(e, "open /dev/net/tun"))?
        .into();
    let flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
    ifr.ifr_ifru.ifru_flags = libc::c_short::try_from(flags).expect("tun flags fit in a short");
    // SAFETY: TUNSETIFF reads and writes back a `struct ifreq`; `ifr` is one, alive and
    // exclusively borrowed for the call.
    unsafe { ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut ifr) }
        .map_err(|e| context(e, &format!("TUNSETIFF {}", display_name(name))))?;
    let name = ifr_name(&ifr);

    let mut hdr_len = libc::c_int::try_from(VNET_HDR_LEN).expect("12 fits in an int");
    // SAFETY: TUNSETVNETHDRSZ reads an int through the pointer; `hdr_len` is one.
    unsafe { ioctl(fd.as_raw_fd(), libc::TUNSETVNETHDRSZ, &mut hdr_len) }
        .map_err(|e| context(e, &format!("TUNSETVNETHDRSZ {name}")))?;
    // virtio 1.x headers are little-endian. That is the kernel's default on a little-endian
    // host (old kernels without the ioctl are fine there); a big-endian host must have it.
    let mut le: libc::c_int = 1;
    // SAFETY: TUNSETVNETLE reads an int through the pointer; `le` is one.
    if let Err(e) = unsafe { ioctl(fd.as_raw_fd(), libc::TUNSETVNETLE, &mut le) } {
        if cfg!(target_endian = "big") {
            return Err(context(e, &format!("TUNSETVNETLE {name}")));
        }
    }

    let mut got = ifreq(&name)?;
    // SAFETY: TUNGETIFF writes a `struct ifreq`; `got` is one, exclusively borrowed.
    unsafe { ioctl(fd.as_raw_fd(), libc::TUNGETIFF, &mut got) }
        .map_err(|e| context(e, &format!("TUNGETIFF {name}")))?;
    // SAFETY: TUNGETIFF filled in `ifru_flags`; every bit pattern is a valid short.
    let got_flags = short_bits(unsafe { got.ifr_ifru.ifru_flags });
    if got_flags & flags != flags {
        return Err(io::Error::other(format!(
            "TUNGETIFF {name}: flags {got_flags:#x} lack IFF_TAP|IFF_NO_PI|IFF_VNET_HDR ({flags:#x})"
        )));
    }

    let tap = Tap {
        fd,
        name,
        offloads: AtomicU32::new(0),
    };
    if offloads {
        if let Err(e) = tap.set_offloads(true, true) {
            tracing::warn!(tap = %tap.name, "no checksum/TSO offloads from the kernel: {e}");
            // Leave a known state: a persistent tap we attached to may keep old offloads.
            tap.set_offloads(false, false)?;
        }
    } else {
        tap.set_offloads(false, false)?;
    }
    Ok(tap)
}

impl Tap {
    /// Bounds the bytes of this tap's writes the kernel holds and has not consumed yet
    /// (`TUNSETSNDBUF`, as QEMU's `sndbuf=`): past it a write finds no room (`EAGAIN`) and
    /// the port's egress decides. Unbounded by default (a write always goes in).
    pub(crate) fn set_sndbuf(&self, bytes: u32) -> io::Result<()> {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: TUNSETSNDBUF reads one int through the pointer, live for the call.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TUNSETSNDBUF, &v) };
        if rc < 0 {
            return Err(context(
                io::Error::last_os_error(),
                &format!("TUNSETSNDBUF {} {bytes}", self.name),
            ));
        }
        Ok(())
    }

    /// The interface name the kernel gave the tap.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `TUN_F_*` bits of what the kernel may send us (0: whole packets, complete checksums).
    #[cfg(test)]
    pub(crate) fn offloads(&self) -> u32 {
        self.offloads.load(Ordering::Relaxed)
    }

    /// Sets what the kernel may send us: partial checksums (`csum`) and TCP GSO packets
    /// (`tso`, which needs `csum`). Narrow it when a receiver cannot take GSO; the kernel then
    /// segments (and checksums) in software. Packets already queued on the tap keep their
    /// form. What we may write is not affected.
    pub(crate) fn set_offloads(&self, csum: bool, tso: bool) -> io::Result<()> {
        if tso && !csum {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TUNSETOFFLOAD {}: TSO needs checksum offload", self.name),
            ));
        }
        let bits = if csum { OFFLOAD_CSUM } else { 0 } | if tso { OFFLOAD_TSO } else { 0 };
        // SAFETY: TUNSETOFFLOAD takes its argument by value (an unsigned long), no memory.
        let rc = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(bits),
            )
        };
        if rc < 0 {
            return Err(context(
                io::Error::last_os_error(),
                &format!("TUNSETOFFLOAD {} {bits:#x}", self.name),
            ));
        }
        self.offloads.store(bits, Ordering::Relaxed);
        Ok(())
    }

    /// Makes the interface outlive this process (`TUNSETPERSIST`): with `on`, the interface,
    /// its addresses and routes stay when pvnet exits or is killed, and a pvnet started again
    /// with the same name attaches to it; with `off`, it goes away when the last fd closes.
    pub fn set_persist(&self, on: bool) -> io::Result<()> {
        set_persist_fd(self.fd.as_fd(), on, &self.name)
    }

    /// Another fd of the same tap (to clear persistence after the port is gone).
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Brings the link up (`SIOCSIFFLAGS` `IFF_UP`), first setting the MTU if given
    /// (`SIOCSIFMTU`). Until the link is up the kernel sends nothing to the tap.
    pub fn link_up(&self, mtu: Option<u32>) -> io::Result<()> {
        set_link_up(&self.name, mtu)
    }

    /// The tap's MAC address (`SIOCGIFHWADDR`): the host side's address on this link.
    #[cfg(test)]
    pub(crate) fn mac(&self) -> io::Result<[u8; 6]> {
        hw_addr(&self.name)
    }

    /// Reads one packet: the [`VNET_HDR_LEN`]-byte vnet header, then the Ethernet frame.
    /// `Ok(None)` when nothing is queued (`EAGAIN`).
    ///
    /// `buf` must hold [`RECV_BUF_LEN`] bytes (12 + 65535 + 18) to never truncate a GSO
    /// packet: the kernel fills a shorter buffer, returns its length and drops the rest of
    /// the packet, with no error. A buffer shorter than the vnet header fails with `EINVAL`.
    /// See the module documentation for `num_buffers`.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        read_fd(self.fd.as_raw_fd(), buf)
    }

    /// Writes one packet gathered from `iov`: the vnet header first, then the frame.
    /// Returns the bytes written (all of them: the kernel takes a packet whole or not at all),
    /// `Ok(None)` when the kernel cannot take it now (`EAGAIN`). `EINVAL`: a malformed vnet
    /// header (e.g. a checksum offset past the packet, GSO with `gso_size` 0) or a frame
    /// shorter than an Ethernet header. `EIO`: the link is down.
    #[cfg(test)]
    pub(crate) fn send(&self, iov: &[IoSlice<'_>]) -> io::Result<Option<usize>> {
        // SAFETY: `IoSlice` is ABI-compatible with `struct iovec` on Unix (std guarantees it).
        let raw = unsafe { std::slice::from_raw_parts(iov.as_ptr().cast(), iov.len()) };
        self.send_iovecs(raw)
    }

    /// [`Tap::send`] for raw `iovec`s, e.g. straight from a frontend's mapped memory. The
    /// kernel only reads through them; an address that is not mapped fails the write with
    /// `EFAULT` rather than faulting us.
    pub(crate) fn send_iovecs(&self, iov: &[libc::iovec]) -> io::Result<Option<usize>> {
        writev_fd(self.fd.as_raw_fd(), iov)
    }
}

/// `TUNSETPERSIST` on a tap fd (see [`Tap::set_persist`]).
pub fn set_persist_fd(fd: BorrowedFd<'_>, on: bool, name: &str) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes its argument by value (an unsigned long), no memory.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETPERSIST, libc::c_ulong::from(on)) };
    if rc < 0 {
        return Err(context(
            io::Error::last_os_error(),
            &format!("TUNSETPERSIST {name} {}", u8::from(on)),
        ));
    }
    Ok(())
}

/// Brings interface `name` up (`SIOCSIFFLAGS` `IFF_UP`), first setting the MTU if given
/// (`SIOCSIFMTU`).
pub fn set_link_up(name: &str, mtu: Option<u32>) -> io::Result<()> {
    let sock = inet_socket()?;
    if let Some(mtu) = mtu {
        let mut ifr = ifreq(name)?;
        ifr.ifr_ifru.ifru_mtu = libc::c_int::try_from(mtu).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("MTU {mtu} too large"))
        })?;
        // SAFETY: SIOCSIFMTU reads a `struct ifreq`; `ifr` is one.
        unsafe { ioctl(sock.as_raw_fd(), libc::SIOCSIFMTU, &mut ifr) }
            .map_err(|e| context(e, &format!("SIOCSIFMTU {} {mtu}", name)))?;
    }
    let mut ifr = ifreq(name)?;
    // SAFETY: SIOCGIFFLAGS writes a `struct ifreq`; `ifr` is one, exclusively borrowed.
    unsafe { ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) }
        .map_err(|e| context(e, &format!("SIOCGIFFLAGS {}", name)))?;
    let up = libc::c_short::try_from(libc::IFF_UP).expect("IFF_UP fits in a short");
    // SAFETY: SIOCGIFFLAGS filled in `ifru_flags`; every bit pattern is a valid short.
    unsafe { ifr.ifr_ifru.ifru_flags |= up };
    // SAFETY: SIOCSIFFLAGS reads a `struct ifreq`; `ifr` is one.
    unsafe { ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut ifr) }
        .map_err(|e| context(e, &format!("SIOCSIFFLAGS {} up", name)))
}

/// The MTU of interface `name` in the calling thread's network namespace (`SIOCGIFMTU`).
pub fn link_mtu(name: &str) -> io::Result<u32> {
    let sock = inet_socket()?;
    let mut ifr = ifreq(name)?;
    // SAFETY: SIOCGIFMTU writes a `struct ifreq`; `ifr` is one, exclusively borrowed.
    unsafe { ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut ifr) }
        .map_err(|e| context(e, &format!("SIOCGIFMTU {name}")))?;
    // SAFETY: SIOCGIFMTU filled in `ifru_mtu`; every bit pattern is a valid int.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "negative MTU"))
}

/// Whether interface `name` has hardware behind it: its driver names a bus address
/// (`ETHTOOL_GDRVINFO`'s `bus_info`: a PCI device's, say), which a virtual device (a veth, a
/// tap, a bridge) does not. False where the driver cannot be asked.
pub fn has_hardware(name: &str) -> bool {
    /// `struct ethtool_drvinfo`: cmd, then driver, version, firmware and bus names (32 bytes
    /// each), then the rest this does not read.
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        names: [[u8; 32]; 4],
        rest: [u8; 64],
    }
    const ETHTOOL_GDRVINFO: u32 = 3;
    let (Ok(sock), Ok(mut ifr)) = (inet_socket(), ifreq(name)) else {
        return false;
    };
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        names: [[0; 32]; 4],
        rest: [0; 64],
    };
    ifr.ifr_ifru.ifru_data = std::ptr::from_mut(&mut info).cast();
    // SAFETY: SIOCETHTOOL with ETHTOOL_GDRVINFO writes at most a `struct ethtool_drvinfo`
    // (196 bytes) through `ifru_data`, which points at `info`, as large and live for the call.
    let r = unsafe { ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) };
    r.is_ok() && info.names[3][0] != 0
}

/// Packets interface `name`, in the calling thread's network namespace, dropped on transmit
/// since it was made (`/proc/thread-self/net/dev`); `None` if it is not there. For a tap this
/// is what the kernel could not queue for its reader (its queue of `txqueuelen` full).
pub fn tx_dropped(name: &str) -> io::Result<Option<u64>> {
    let text = std::fs::read_to_string("/proc/thread-self/net/dev")?;
    Ok(parse_tx_dropped(&text, name))
}

/// `tx_dropped`'s parse of a `/proc/net/dev` text: the 12th number after `name:` (receive:
/// bytes packets errs drop fifo frame compressed multicast; transmit: bytes packets errs drop).
fn parse_tx_dropped(text: &str, name: &str) -> Option<u64> {
    text.lines().skip(2).find_map(|l| {
        let (n, rest) = l.split_once(':')?;
        if n.trim() != name {
            return None;
        }
        rest.split_whitespace().nth(11)?.parse().ok()
    })
}

/// The MAC address of interface `name` in the calling thread's network namespace
/// (`SIOCGIFHWADDR`).
pub fn hw_addr(name: &str) -> io::Result<[u8; 6]> {
    let sock = inet_socket()?;
    let mut ifr = ifreq(name)?;
    // SAFETY: SIOCGIFHWADDR writes a `struct ifreq`; `ifr` is one, exclusively borrowed.
    unsafe { ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut ifr) }
        .map_err(|e| context(e, &format!("SIOCGIFHWADDR {name}")))?;
    // SAFETY: SIOCGIFHWADDR filled in `ifru_hwaddr`; every bit pattern is valid for it.
    let data = unsafe { ifr.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (m, c) in mac.iter_mut().zip(data) {
        *m = c.to_ne_bytes()[0];
    }
    Ok(mac)
}

/// One `read` from a non-blocking fd: `Ok(None)` on `EAGAIN`, retried on `EINTR`.
pub fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`, which is
        // exclusively borrowed for the call.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        match usize::try_from(n) {
            Ok(n) => return Ok(Some(n)),
            Err(_) => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                e if e.kind() == io::ErrorKind::Interrupted => continue,
                e => return Err(e),
            },
        }
    }
}

/// One `writev` to a non-blocking fd: `Ok(None)` on `EAGAIN`, retried on `EINTR`. The kernel
/// only reads through the iovecs; an address that is not mapped fails with `EFAULT`.
pub fn writev_fd(fd: RawFd, iov: &[libc::iovec]) -> io::Result<Option<usize>> {
    let cnt = libc::c_int::try_from(iov.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many iovecs"))?;
    loop {
        // SAFETY: `iov` holds `cnt` iovecs for the call; the kernel reads the memory they
        // describe with its own fault handling and never writes it.
        let n = unsafe { libc::writev(fd, iov.as_ptr(), cnt) };
        match usize::try_from(n) {
            Ok(n) => return Ok(Some(n)),
            Err(_) => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                e if e.kind() == io::ErrorKind::Interrupted => continue,
                e => return Err(e),
            },
        }
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// An ioctl whose argument is a pointer; `-1` becomes the OS error.
///
/// # Safety
/// `arg` must point to what `req` reads or writes, valid for the call.
unsafe fn ioctl<T>(fd: RawFd, req: libc::c_ulong, arg: *mut T) -> io::Result<()> {
    // SAFETY: the caller vouches that `arg` is what `req` expects.
    if unsafe { libc::ioctl(fd, req, arg) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// An `ifreq` naming `name`, everything else zero.
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "interface name {name:?}: at most {} bytes, no NUL",
                libc::IFNAMSIZ - 1
            ),
        ));
    }
    // SAFETY: `ifreq` is plain data (a char array and a union of integers, sockaddrs and a
    // pointer); all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(bytes) {
        *d = libc::c_char::from_ne_bytes([*s]);
    }
    Ok(ifr)
}

/// The NUL-terminated name in an `ifreq`.
fn ifr_name(ifr: &libc::ifreq) -> String {
    let bytes: Vec<u8> = ifr
        .ifr_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Interface flags as the int `IFF_*` constants, without sign extension.
fn short_bits(flags: libc::c_short) -> libc::c_int {
    libc::c_int::from(u16::from_ne_bytes(flags.to_ne_bytes()))
}

/// `name` for error messages: the empty name is the kernel's choice.
fn display_name(name: &str) -> &str {
    if name.is_empty() {
        "(any name)"
    } else {
        name
    }
}

/// An `AF_INET` datagram socket for interface ioctls.
fn inet_socket() -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain syscall, no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(context(io::Error::last_os_error(), "socket(AF_INET)"));
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `e` with `what` in front, same kind.
fn context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{SocketAddr, TcpStream};
    use std::path::Path;
    use std::process::Command;
    use std::time::{Duration, Instant};

    #[test]
    fn tx_dropped_is_the_twelfth_number_of_the_interfaces_line() {
        let text = "Inter-|   Receive                            |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       2    0    0    0     0          0         0      100       2    0    0    0     0       0          0
pvt0: 5000 70 0 1 0 0 0 0 640000 9000 0 323 0 0 0 0
";
        assert_eq!(parse_tx_dropped(text, "pvt0"), Some(323));
        assert_eq!(parse_tx_dropped(text, "lo"), Some(0));
        assert_eq!(parse_tx_dropped(text, "pvt"), None);
        // The calling thread's namespace has a loopback.
        assert!(tx_dropped("lo").unwrap().is_some());
    }

    /// The made-up MAC of the far end of every test tap (10.213.N.2).
    const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x13, 0x02];
    const F_NEEDS_CSUM: u8 = 1;
    const F_DATA_VALID: u8 = 2;
    const GSO_NONE: u8 = 0;
    const GSO_TCPV4: u8 = 1;
    const TCP_SYN: u8 = 0x02;
    const TCP_RST: u8 = 0x04;
    const TCP_PSH: u8 = 0x08;
    const TCP_ACK: u8 = 0x10;
    /// Ethernet + IPv4 (no options) + TCP (no options).
    const TCP_HDRS: usize = 14 + 20 + 20;
    /// What `recv_until` fills its buffer with before each read.
    const FILL: u8 = 0xa5;

    /// Fails, never skips, where taps cannot be made.
    fn require_tap_env() {
        // SAFETY: plain syscall, no pointers.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "tap tests must run as root (they create and configure tap devices); euid is {euid}"
        );
        assert!(
            Path::new("/dev/net/tun").exists(),
            "tap tests need /dev/net/tun (load the tun module: modprobe tun)"
        );
    }

    std::thread_local! {
        /// Whether this thread already left the machine's network namespace.
        static PRIVATE_NETNS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Moves the calling thread into a network namespace of its own, with `lo` up, so that
    /// the taps, veths, addresses and routes a test makes never touch the machine's own
    /// network (and go away with the test). Every test that makes an interface calls this
    /// first ([`setup`] does); once per thread, later calls keep the namespace.
    ///
    /// The network namespace is a per-thread attribute in Linux: `unshare(CLONE_NEWNET)`
    /// moves only this thread, and the threads and processes (`ip`) it starts afterwards
    /// inherit it (clone copies the caller's namespaces). The namespace is freed when its
    /// last thread and the last fd into it (a tap's, a socket's) are gone. Sockets and
    /// ioctls by interface name resolve in the namespace of the socket's creator; `/sys` still
    /// shows the machine's namespace (it is not remounted), so tests ask through ioctls
    /// ([`super::hw_addr`]) or `ip`, never `/sys/class/net`.
    pub(crate) fn private_netns() {
        if PRIVATE_NETNS.with(std::cell::Cell::get) {
            return;
        }
        require_tap_env();
        // SAFETY: plain syscall, no pointers.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET) for a private network namespace: {}",
            io::Error::last_os_error()
        );
        PRIVATE_NETNS.with(|p| p.set(true));
        set_link_up("lo", None).unwrap_or_else(|e| panic!("lo up in the private namespace: {e}"));
    }

    /// Runs `ip ARGS...` in the calling thread's network namespace; panics on failure.
    pub(crate) fn ip(args: &[&str]) {
        let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
            panic!("run `ip {}`: {e} (is iproute2 installed?)", args.join(" "))
        });
        assert!(
            out.status.success(),
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    /// A tap named `pvt<tag><pid>`, up, with 10.213.`net`.1/24 and a static neighbour
    /// 10.213.`net`.2 at [`PEER_MAC`], in the calling thread's private network namespace
    /// ([`private_netns`]).
    pub(crate) fn setup(tag: &str, net: u8, offloads: bool) -> Tap {
        private_netns();
        let name = format!("pvt{tag}{}", std::process::id() % 10000);
        let tap = open(&name, offloads).unwrap_or_else(|e| panic!("open tap: {e}"));
        assert_eq!(tap.name(), name);
        tap.link_up(Some(1500)).unwrap_or_else(|e| panic!("{e}"));
        ip(&["addr", "add", &format!("10.213.{net}.1/24"), "dev", &name]);
        ip(&[
            "neigh",
            "replace",
            &format!("10.213.{net}.2"),
            "lladdr",
            "02:00:00:00:13:02",
            "dev",
            &name,
        ]);
        tap
    }

    /// Ones'-complement sum of `data` onto `acc` (not folded).
    pub(crate) fn sum(data: &[u8], mut acc: u32) -> u32 {
        let mut chunks = data.chunks_exact(2);
        for c in &mut chunks {
            acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [last] = chunks.remainder() {
            acc += u32::from(*last) << 8;
        }
        acc
    }

    /// Folds carries into 16 bits (not complemented).
    pub(crate) fn fold(mut acc: u32) -> u16 {
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        u16::try_from(acc).expect("folded")
    }

    fn pseudo(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> u32 {
        let len = u16::try_from(len).expect("L4 length fits in 16 bits");
        sum(&src, 0) + sum(&dst, 0) + u32::from(proto) + u32::from(len)
    }

    /// An Ethernet + IPv4 frame around `l4`.
    pub(crate) fn ipv4_frame(
        dst_mac: [u8; 6],
        src: [u8; 4],
        dst: [u8; 4],
        proto: u8,
        l4: &[u8],
    ) -> Vec<u8> {
        let mut f = Vec::with_capacity(34 + l4.len());
        f.extend_from_slice(&dst_mac);
        f.extend_from_slice(&PEER_MAC);
        f.extend_from_slice(&[0x08, 0x00]);
        let tot = u16::try_from(20 + l4.len()).expect("IPv4 packet fits in 64 KiB");
        f.extend_from_slice(&[0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, proto, 0, 0]);
        f[16..18].copy_from_slice(&tot.to_be_bytes());
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        let c = !fold(sum(&f[14..34], 0));
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(l4);
        f
    }

    /// A TCP segment (checksum field zero).
    fn tcp(
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        flags: u8,
        opts: &[u8],
        data: &[u8],
    ) -> Vec<u8> {
        assert_eq!(opts.len() % 4, 0);
        let doff = u8::try_from((20 + opts.len()) / 4).expect("TCP options fit") << 4;
        let mut t = Vec::with_capacity(20 + opts.len() + data.len());
        t.extend_from_slice(&sport.to_be_bytes());
        t.extend_from_slice(&dport.to_be_bytes());
        t.extend_from_slice(&seq.to_be_bytes());
        t.extend_from_slice(&ack.to_be_bytes());
        t.extend_from_slice(&[doff, flags, 0xff, 0xff, 0, 0, 0, 0]);
        t.extend_from_slice(opts);
        t.extend_from_slice(data);
        t
    }

    /// A `virtio_net_hdr_v1`, little-endian, `num_buffers` 0.
    fn vnet(
        flags: u8,
        gso_type: u8,
        hdr_len: u16,
        gso_size: u16,
        start: u16,
        off: u16,
    ) -> [u8; 12] {
        let mut h = [0u8; 12];
        h[0] = flags;
        h[1] = gso_type;
        h[2..4].copy_from_slice(&hdr_len.to_le_bytes());
        h[4..6].copy_from_slice(&gso_size.to_le_bytes());
        h[6..8].copy_from_slice(&start.to_le_bytes());
        h[8..10].copy_from_slice(&off.to_le_bytes());
        h
    }

    fn le16(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    fn be16(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    fn be32(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// An IPv4 packet in a frame.
    pub(crate) struct Ipv4<'a> {
        pub(crate) proto: u8,
        pub(crate) src: [u8; 4],
        pub(crate) dst: [u8; 4],
        /// L4 bytes, as far as `tot_len` says.
        pub(crate) l4: &'a [u8],
    }

    /// The TCP segment in a frame.
    struct Tcp {
        src: [u8; 4],
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        flags: u8,
        /// Payload bytes.
        len: usize,
    }

    pub(crate) fn parse_ipv4(f: &[u8]) -> Option<Ipv4<'_>> {
        if f.len() < 34 || f[12..14] != [0x08, 0x00] {
            return None;
        }
        let ihl = usize::from(f[14] & 0xf) * 4;
        let end = (14 + usize::from(be16(f, 16))).min(f.len());
        let l4 = f.get(14 + ihl..end)?;
        let ip4 = |at: usize| [f[at], f[at + 1], f[at + 2], f[at + 3]];
        Some(Ipv4 {
            proto: f[23],
            src: ip4(26),
            dst: ip4(30),
            l4,
        })
    }

    fn parse_tcp(f: &[u8]) -> Option<Tcp> {
        let ip = parse_ipv4(f).filter(|ip| ip.proto == 6 && ip.l4.len() >= 20)?;
        let l4 = ip.l4;
        Some(Tcp {
            src: ip.src,
            sport: be16(l4, 0),
            dport: be16(l4, 2),
            seq: be32(l4, 4),
            ack: be32(l4, 8),
            flags: l4[13],
            len: l4.len().checked_sub(usize::from(l4[12] >> 4) * 4)?,
        })
    }

    fn describe(vh: &[u8], f: &[u8]) -> String {
        let et = if f.len() >= 14 { be16(f, 12) } else { 0 };
        format!(
            "ethertype {et:#06x}, {} bytes, vnet {:02x?}",
            f.len(),
            &vh[..10]
        )
    }

    /// Reads packets until `want` takes one or `within` passes (then panics, listing what was
    /// skipped). Returns (vnet header, frame).
    fn recv_until(
        tap: &Tap,
        within: Duration,
        mut want: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> (Vec<u8>, Vec<u8>) {
        let deadline = Instant::now() + within;
        let mut skipped = Vec::new();
        loop {
            match recv_one(tap, deadline) {
                Some((vh, f)) if want(&vh, &f) => return (vh, f),
                Some((vh, f)) => skipped.push(describe(&vh, &f)),
                None => panic!("nothing wanted within {within:?}; skipped: {skipped:#?}"),
            }
        }
    }

    /// One packet, waiting until `deadline`; `None` once it passes.
    fn recv_one(tap: &Tap, deadline: Instant) -> Option<(Vec<u8>, Vec<u8>)> {
        let mut buf = vec![FILL; RECV_BUF_LEN];
        loop {
            if let Some(n) = tap.recv(&mut buf).expect("tap read") {
                assert!(n >= VNET_HDR_LEN, "short read {n}");
                return Some((buf[..VNET_HDR_LEN].to_vec(), buf[VNET_HDR_LEN..n].to_vec()));
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
            let mut pfd = libc::pollfd {
                fd: tap.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, exclusively borrowed for the call.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms.max(1)) };
            assert!(rc >= 0, "poll: {}", io::Error::last_os_error());
        }
    }

    fn send_all(tap: &Tap, hdr: &[u8], frame: &[u8]) -> io::Result<Option<usize>> {
        tap.send(&[IoSlice::new(hdr), IoSlice::new(frame)])
    }

    /// ICMP echo request from 10.213.0.2 to the host through the tap; the kernel's echo reply
    /// comes back through the tap. Proves vnet-header writes and reads end to end.
    /// The network namespace `/proc/<what>/ns/net` names (`net:[inode]`).
    fn netns_of(what: &str) -> String {
        let p = format!("/proc/{what}/ns/net");
        std::fs::read_link(&p)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .display()
            .to_string()
    }

    /// [`private_netns`] leaves the machine's namespace, and what the test starts afterwards
    /// (a thread, an `ip` process) is in the test's namespace, not the machine's.
    #[test]
    fn private_netns_is_inherited_by_threads_and_children() {
        let machine = netns_of("thread-self");
        private_netns();
        let mine = netns_of("thread-self");
        assert_ne!(mine, machine, "still in the machine's network namespace");
        private_netns();
        assert_eq!(
            netns_of("thread-self"),
            mine,
            "a second call keeps the namespace"
        );
        let thread = std::thread::spawn(|| netns_of("thread-self"))
            .join()
            .expect("thread");
        assert_eq!(thread, mine, "a thread the test starts");
        let out = Command::new("readlink")
            .arg("/proc/self/ns/net")
            .output()
            .expect("run readlink");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            mine,
            "a process the test starts"
        );
        // Only lo, up: no interface of the machine's is here.
        let out = Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .expect("run ip");
        let links = String::from_utf8_lossy(&out.stdout);
        assert_eq!(links.lines().count(), 1, "{links}");
        assert!(
            links.contains(": lo: <") && links.contains(",UP"),
            "{links}"
        );
    }

    #[test]
    fn tap_ping_through_kernel() {
        let tap = setup("png", 0, true);
        let mac = tap.mac().unwrap_or_else(|e| panic!("{e}"));
        let (peer, host) = ([10, 213, 0, 2], [10, 213, 0, 1]);
        let (ident, seq) = (0x7076_u16, 7_u16);
        let payload: Vec<u8> = (0u8..56).collect();
        let mut icmp = vec![8, 0, 0, 0];
        icmp.extend_from_slice(&ident.to_be_bytes());
        icmp.extend_from_slice(&seq.to_be_bytes());
        icmp.extend_from_slice(&payload);
        let c = !fold(sum(&icmp, 0));
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        let frame = ipv4_frame(mac, peer, host, 1, &icmp);
        let hdr = [0u8; VNET_HDR_LEN];
        let sent = send_all(&tap, &hdr, &frame).unwrap_or_else(|e| panic!("send: {e}"));
        assert_eq!(sent, Some(VNET_HDR_LEN + frame.len()));

        let (vh, reply) = recv_until(
            &tap,
            Duration::from_secs(2),
            |_, f| matches!(parse_ipv4(f), Some(ip) if ip.proto == 1 && ip.l4.len() >= 8 && ip.l4[0] == 0),
        );
        eprintln!(
            "echo reply: {} bytes, vnet header {vh:02x?} (bytes 10..12 were {FILL:#x} before the read)",
            reply.len()
        );
        assert_eq!(reply[..6], PEER_MAC, "reply goes to the neighbour's MAC");
        assert_eq!(reply[6..12], mac, "reply comes from the tap's MAC");
        let Ipv4 { src, dst, l4, .. } = parse_ipv4(&reply).expect("IPv4");
        assert_eq!((src, dst), (host, peer));
        assert_eq!(fold(sum(&reply[14..34], 0)), 0xffff, "IPv4 header checksum");
        assert_eq!(vh[1], GSO_NONE);
        assert_eq!(vh[0] & F_NEEDS_CSUM, 0, "ICMP comes checksummed");
        assert_eq!(fold(sum(l4, 0)), 0xffff, "ICMP checksum");
        assert_eq!((l4[0], l4[1]), (0, 0), "echo reply");
        assert_eq!((be16(l4, 4), be16(l4, 6)), (ident, seq));
        assert_eq!(l4[8..], payload[..]);
    }

    /// With offloads on, the kernel takes a partial-checksum TCP packet and a 20000-byte TCPv4
    /// GSO packet whole, and refuses a header whose checksum offset lies past the packet.
    #[test]
    fn tap_accepts_partial_csum_and_gso_writes() {
        let tap = setup("off", 1, true);
        assert_eq!(
            tap.offloads(),
            OFFLOAD_CSUM | OFFLOAD_TSO,
            "TUNSETOFFLOAD refused (see the warning)"
        );
        let mac = tap.mac().unwrap_or_else(|e| panic!("{e}"));
        let (peer, host) = ([10, 213, 1, 2], [10, 213, 1, 1]);
        let hdr_len = u16::try_from(TCP_HDRS).expect("54");
        // Nothing listens on port 9: the host answers with RSTs.
        let segment = |seq: u32, len: usize| {
            let data: Vec<u8> = (0..len).map(|i| b"pvnet"[i % 5]).collect();
            let t = tcp(40000, 9, seq, 1, TCP_ACK | TCP_PSH, &[], &data);
            let mut f = ipv4_frame(mac, peer, host, 6, &t);
            // Partial checksum: the pseudo-header sum, not complemented, in the field.
            let p = fold(pseudo(peer, host, 6, t.len()));
            f[34 + 16..34 + 18].copy_from_slice(&p.to_be_bytes());
            f
        };

        let f = segment(1000, 100);
        let h = vnet(F_NEEDS_CSUM, GSO_NONE, hdr_len, 0, 34, 16);
        let n = send_all(&tap, &h, &f).unwrap_or_else(|e| panic!("NEEDS_CSUM write: {e}"));
        assert_eq!(n, Some(VNET_HDR_LEN + f.len()));

        let bad = vnet(F_NEEDS_CSUM, GSO_NONE, hdr_len, 0, 34, 0x7ff0);
        let e = send_all(&tap, &bad, &f).expect_err("checksum offset past the packet");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");

        let f = segment(5000, 20000);
        let h = vnet(F_NEEDS_CSUM, GSO_TCPV4, hdr_len, 1448, 34, 16);
        let n = send_all(&tap, &h, &f).unwrap_or_else(|e| panic!("GSO write: {e}"));
        assert_eq!(n, Some(VNET_HDR_LEN + f.len()));

        // Not asserted (a firewall may eat them): the host's RSTs (seq = our ack) show the
        // stack took both packets.
        let deadline = Instant::now() + Duration::from_millis(1000);
        let mut rsts = 0;
        while let Some((vh, f)) = recv_one(&tap, deadline) {
            if let Some(Tcp {
                sport: 9,
                dport: 40000,
                seq,
                ack,
                flags,
                ..
            }) = parse_tcp(&f)
            {
                eprintln!(
                    "reply: flags {flags:#04x} seq {seq} ack {ack}, vnet {:02x?}",
                    &vh[..10]
                );
                rsts += usize::from(flags & TCP_RST != 0);
                if rsts == 2 {
                    break;
                }
            }
        }
        eprintln!("RSTs seen: {rsts} (one per packet the stack took)");
    }

    /// The host opens a TCP connection through the tap; we play the peer. With TSO on the
    /// kernel hands us GSO packets; narrowed to checksum only it segments (partial checksums);
    /// with nothing it sends whole, checksummed segments.
    #[test]
    fn tap_receives_gso_and_narrows() {
        let tap = setup("gso", 2, true);
        assert_eq!(tap.offloads(), OFFLOAD_CSUM | OFFLOAD_TSO);
        let mac = tap.mac().unwrap_or_else(|e| panic!("{e}"));
        let (peer, host, port) = ([10, 213, 2, 2], [10, 213, 2, 1], 7777_u16);
        let (conn_tx, conn_rx) = std::sync::mpsc::channel();
        let sender = std::thread::spawn(move || {
            let addr = SocketAddr::from((peer, port));
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
            s.set_write_timeout(Some(Duration::from_secs(5)))?;
            conn_tx.send(s.try_clone()?).expect("test alive");
            // Ends when the test shuts the connection down (or by timing out).
            let _ = s.write_all(&vec![0x5a; 1 << 20]);
            io::Result::Ok(())
        });

        let (_, syn) = recv_until(
            &tap,
            Duration::from_secs(3),
            |_, f| matches!(parse_tcp(f), Some(t) if t.dport == port && t.flags & TCP_SYN != 0),
        );
        let syn = parse_tcp(&syn).expect("SYN");
        let (sport, syn_seq) = (syn.sport, syn.seq);
        let isn = 0x1000_0000_u32;
        let mut rcv_nxt = syn_seq.wrapping_add(1);
        let send_tcp = |flags: u8, seq: u32, ack: u32, opts: &[u8]| {
            let mut t = tcp(port, sport, seq, ack, flags, opts, &[]);
            let c = !fold(sum(&t, pseudo(peer, host, 6, t.len())));
            t[16..18].copy_from_slice(&c.to_be_bytes());
            let f = ipv4_frame(mac, peer, host, 6, &t);
            let n = send_all(&tap, &[0; VNET_HDR_LEN], &f).expect("send TCP");
            assert_eq!(n, Some(VNET_HDR_LEN + f.len()));
        };
        // SYN-ACK, MSS 1460, no window scaling, no timestamps.
        send_tcp(TCP_SYN | TCP_ACK, isn, rcv_nxt, &[2, 4, 0x05, 0xb4]);

        // In-order data segments from the host until the link is quiet for 200 ms.
        let collect = |rcv_nxt: &mut u32| {
            let mut got = Vec::new();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(3) {
                let quiet = Instant::now() + Duration::from_millis(200);
                let Some((vh, f)) = recv_one(&tap, quiet) else {
                    if got.is_empty() {
                        continue;
                    }
                    break;
                };
                if let Some(t) = parse_tcp(&f) {
                    let ours = t.src == host && t.sport == sport && t.dport == port;
                    if ours && t.len > 0 && t.seq == *rcv_nxt {
                        *rcv_nxt = rcv_nxt.wrapping_add(u32::try_from(t.len).expect("len"));
                        got.push((vh, f));
                    }
                }
            }
            assert!(!got.is_empty(), "no data from the host");
            got
        };
        let show = |what: &str, got: &[(Vec<u8>, Vec<u8>)]| {
            for (vh, f) in got {
                eprintln!(
                    "{what}: frame {} bytes, flags {} gso_type {} hdr_len {} gso_size {} csum {}+{}",
                    f.len(),
                    vh[0],
                    vh[1],
                    le16(vh, 2),
                    le16(vh, 4),
                    le16(vh, 6),
                    le16(vh, 8)
                );
            }
        };

        let tso = collect(&mut rcv_nxt);
        show("TSO on", &tso);
        let gso: Vec<_> = tso.iter().filter(|(vh, _)| vh[1] == GSO_TCPV4).collect();
        assert!(!gso.is_empty(), "no GSO packet with TSO on");
        for (vh, f) in gso {
            assert!(f.len() > 1514, "GSO packet of {} bytes", f.len());
            assert_eq!(
                vh[0] & F_NEEDS_CSUM,
                F_NEEDS_CSUM,
                "GSO implies a partial checksum"
            );
            assert_eq!((le16(vh, 4), le16(vh, 6), le16(vh, 8)), (1460, 34, 16));
            assert_eq!(usize::from(le16(vh, 2)), TCP_HDRS, "hdr_len");
        }

        tap.set_offloads(true, false)
            .unwrap_or_else(|e| panic!("{e}"));
        send_tcp(TCP_ACK, isn + 1, rcv_nxt, &[]);
        let csum = collect(&mut rcv_nxt);
        show("checksum only", &csum);
        for (vh, f) in &csum {
            assert!(
                f.len() <= 1514 && vh[1] == GSO_NONE,
                "segmented by the kernel"
            );
            assert_eq!((vh[0], le16(vh, 6), le16(vh, 8)), (F_NEEDS_CSUM, 34, 16));
        }

        tap.set_offloads(false, false)
            .unwrap_or_else(|e| panic!("{e}"));
        send_tcp(TCP_ACK, isn + 1, rcv_nxt, &[]);
        let none = collect(&mut rcv_nxt);
        show("no offloads", &none);
        for (vh, f) in &none {
            assert!(
                f.len() <= 1514 && vh[1] == GSO_NONE,
                "segmented by the kernel"
            );
            assert_eq!(vh[0] & F_NEEDS_CSUM, 0, "checksum completed by the kernel");
            let Ipv4 { src, dst, l4, .. } = parse_ipv4(f).expect("IPv4");
            let ok = fold(sum(l4, pseudo(src, dst, 6, l4.len())));
            assert_eq!(ok, 0xffff, "TCP checksum");
            assert_eq!(vh[0] & F_DATA_VALID, 0, "locally made: no DATA_VALID");
        }

        let conn: TcpStream = conn_rx.recv().expect("connected");
        let _ = conn.shutdown(std::net::Shutdown::Both);
        drop(tap);
        sender.join().expect("sender thread").expect("connect");
    }
}
