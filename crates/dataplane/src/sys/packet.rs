//! An `AF_PACKET` socket bound to one existing interface (a veth, a NIC): the frames the
//! interface receives come in, frames written go out of it (Linux `packet(7)`,
//! `net/packet/af_packet.c`).
//!
//! The socket carries the same 12-byte virtio-net header as the tap (`PACKET_VNET_HDR` with
//! `PACKET_VNET_HDR_SZ` 12, Linux 6.5 and later), so a frame moves between a virtio ring and
//! the interface with its checksum and GSO metadata as is, and the tap port's code serves both
//! (`port::kernel`). It ignores the frames the host itself sends out of the interface
//! (`PACKET_IGNORE_OUTGOING`: pvnet is the interface's other end, not a sniffer) and puts the
//! interface in promiscuous mode (a switch port takes every address).

use pvnet_net::HDR_LEN;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A bound `AF_PACKET` socket.
#[derive(Debug)]
pub struct PacketSock {
    fd: OwnedFd,
    /// The interface's name.
    name: String,
}

fn setopt(fd: RawFd, opt: libc::c_int, val: &impl Sized, what: &str) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of_val(val)).unwrap_or(0);
    // SAFETY: `val` is a live value of `len` bytes for the call; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            opt,
            std::ptr::from_ref(val).cast(),
            len,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// Opens a non-blocking `AF_PACKET` socket on interface `name` (which must exist), with the
/// 12-byte vnet header. Needs `CAP_NET_RAW`. The interface is brought up if it is down.
pub fn open(name: &str) -> io::Result<PacketSock> {
    let cname = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL"))?;
    // SAFETY: `cname` is a valid NUL-terminated string for the call.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("interface {name}: {e}")));
    }
    // Up before the bind: binding to a down interface leaves ENETDOWN pending on the socket
    // (`packet_do_bind`), and the first write would fail with it.
    crate::sys::tap::set_link_up(name, None)?;
    let proto = u16::try_from(libc::ETH_P_ALL).unwrap_or(3).to_be();
    // SAFETY: plain socket(2); the result is checked before use.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::c_int::from(proto),
        )
    };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("AF_PACKET socket: {e}")));
    }
    // SAFETY: `raw` is a socket we just opened and own alone.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let one: libc::c_int = 1;
    setopt(
        fd.as_raw_fd(),
        libc::PACKET_VNET_HDR,
        &one,
        "PACKET_VNET_HDR",
    )?;
    let hdr = libc::c_int::try_from(HDR_LEN).unwrap_or(12);
    setopt(
        fd.as_raw_fd(),
        libc::PACKET_VNET_HDR_SZ,
        &hdr,
        "PACKET_VNET_HDR_SZ 12 (Linux 6.5 or later)",
    )?;
    setopt(
        fd.as_raw_fd(),
        libc::PACKET_IGNORE_OUTGOING,
        &one,
        "PACKET_IGNORE_OUTGOING",
    )?;
    // The kernel takes a received frame's VLAN tag out of its data before a packet socket
    // sees it (`skb_vlan_untag`): it comes beside the frame, to be put back ([`vlan_of`]).
    setopt(fd.as_raw_fd(), libc::PACKET_AUXDATA, &one, "PACKET_AUXDATA")?;
    let ifindex = libc::c_int::try_from(index).unwrap_or(0);
    // SAFETY: all-zero is a valid `sockaddr_ll`; the fields that matter are set below.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = u16::try_from(libc::AF_PACKET).unwrap_or(17);
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex;
    let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>()).unwrap_or(0);
    // SAFETY: `sll` is a valid `sockaddr_ll` of `len` bytes for the call.
    let r = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::from_ref(&sll).cast(), len) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("bind to {name}: {e}")));
    }
    let mreq = libc::packet_mreq {
        mr_ifindex: ifindex,
        mr_type: u16::try_from(libc::PACKET_MR_PROMISC).unwrap_or(1),
        mr_alen: 0,
        mr_address: [0; 8],
    };
    setopt(
        fd.as_raw_fd(),
        libc::PACKET_ADD_MEMBERSHIP,
        &mreq,
        "promiscuous mode",
    )?;
    Ok(PacketSock {
        fd,
        name: name.to_string(),
    })
}

impl PacketSock {
    /// The interface it is bound to.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Bounds the bytes of its writes the kernel holds and has not sent yet (`SO_SNDBUF`;
    /// the kernel doubles it for its bookkeeping): past it a write finds no room (`EAGAIN`)
    /// and the port's egress decides. `net.core.wmem_default` by default.
    pub(crate) fn set_sndbuf(&self, bytes: u32) -> io::Result<()> {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        let len = libc::socklen_t::try_from(size_of_val(&v)).unwrap_or(0);
        // SAFETY: `v` is a live int for the call; the kernel only reads it.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                std::ptr::from_ref(&v).cast(),
                len,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("SO_SNDBUF {bytes}: {e}")));
        }
        Ok(())
    }

    /// Frames the kernel dropped for this socket since the last call (its receive queue was
    /// full): `PACKET_STATISTICS`' `tp_drops`, which the read resets.
    pub(crate) fn drops_since(&self) -> io::Result<u64> {
        /// linux/if_packet.h
        const PACKET_STATISTICS: libc::c_int = 6;
        let mut st = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = libc::socklen_t::try_from(size_of_val(&st)).unwrap_or(0);
        // SAFETY: `st` is a live `tpacket_stats` of `len` bytes the kernel writes at most
        // `len` of.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_STATISTICS,
                std::ptr::from_mut(&mut st).cast(),
                &mut len,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("PACKET_STATISTICS: {e}")));
        }
        Ok(u64::from(st.tp_drops))
    }

    /// Reads one frame (header first) and the VLAN tag the kernel took out of it, if it
    /// had one (see [`vlan_of`]); `Ok(None)` when none is queued.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, Option<Tag>)>> {
        let mut ctrl = Ctrl::default();
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut msg = ctrl.msghdr(&mut iov, 1);
        loop {
            // SAFETY: `msg` describes `buf` (exclusively borrowed) and `ctrl`'s buffer, both
            // live for the call; the kernel writes at most their lengths.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
            match usize::try_from(n) {
                Ok(n) => return Ok(Some((n, vlan_of(&ctrl, msg.msg_controllen)))),
                Err(_) => match io::Error::last_os_error() {
                    e if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                    e if e.kind() == io::ErrorKind::Interrupted => continue,
                    e => return Err(e),
                },
            }
        }
    }

    /// Sends one frame gathered from `iov` (header first) out of the interface; `Ok(None)`
    /// when the kernel cannot take it now.
    pub(crate) fn send_iovecs(&self, iov: &[libc::iovec]) -> io::Result<Option<usize>> {
        crate::sys::tap::writev_fd(self.fd.as_raw_fd(), iov)
    }
}

/// A VLAN tag taken out of a received frame: its TPID and TCI.
pub(crate) type Tag = (u16, u16);

/// Room for a received frame's control messages (its `PACKET_AUXDATA`: a 16-byte header and
/// 20 bytes of `tpacket_auxdata`, padded).
#[derive(Debug, Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct Ctrl([u8; 64]);

impl Default for Ctrl {
    fn default() -> Self {
        Self([0; 64])
    }
}

impl Ctrl {
    /// A `msghdr` for a read into the `n` iovecs at `iov` with this control buffer (which
    /// must not move while the read is in flight).
    pub(crate) fn msghdr(&mut self, iov: *mut libc::iovec, n: usize) -> libc::msghdr {
        // SAFETY: all-zero is a valid `msghdr` (no name, no flags); the fields that matter
        // are set below.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = iov;
        m.msg_iovlen = n;
        m.msg_control = self.0.as_mut_ptr().cast();
        m.msg_controllen = self.0.len();
        m
    }
}

/// `tpacket_auxdata.tp_status`: the VLAN fields are valid (`TP_STATUS_VLAN_VALID`), and the
/// TPID is too (`TP_STATUS_VLAN_TPID_VALID`; without it, 802.1Q).
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;

/// The VLAN tag the kernel took out of a received frame, from the read's control messages
/// (`len` bytes of `ctrl`): its `PACKET_AUXDATA` with `TP_STATUS_VLAN_VALID`. None if the
/// frame had none.
pub(crate) fn vlan_of(ctrl: &Ctrl, len: usize) -> Option<Tag> {
    const HDR: usize = 16; // cmsghdr: len (8), level (4), type (4)
    let c = &ctrl.0[..len.min(ctrl.0.len())];
    let u16_at = |b: &[u8], i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
    let mut off = 0;
    while off + HDR <= c.len() {
        let l = usize::try_from(u64::from_ne_bytes(c[off..off + 8].try_into().ok()?)).ok()?;
        let level = i32::from_ne_bytes(c[off + 8..off + 12].try_into().ok()?);
        let kind = i32::from_ne_bytes(c[off + 12..off + 16].try_into().ok()?);
        if l < HDR || off + l > c.len() {
            return None;
        }
        if level == libc::SOL_PACKET && kind == libc::PACKET_AUXDATA && l >= HDR + 20 {
            let a = &c[off + HDR..off + l];
            let status = u32::from_ne_bytes(a[..4].try_into().ok()?);
            if status & TP_STATUS_VLAN_VALID == 0 {
                return None;
            }
            let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 {
                u16_at(a, 18)
            } else {
                0x8100
            };
            return Some((tpid, u16_at(a, 16)));
        }
        off += l.next_multiple_of(8);
    }
    None
}

impl AsRawFd for PacketSock {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
