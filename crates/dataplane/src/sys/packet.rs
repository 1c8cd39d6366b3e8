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
//!
//! The kernel takes the VLAN tag of every frame it receives out of the frame's bytes
//! (`skb_vlan_untag`) before a packet socket sees it, and hands it out only beside the frame
//! (`PACKET_AUXDATA`, to a `recvmsg`). So two sockets are bound: a classic BPF filter on
//! whether the frame came with such a tag (`SKF_AD_VLAN_TAG_PRESENT`) gives the untagged
//! frames to the first, read with plain reads, and the tagged ones to the second, read with
//! `recvmsg` and their tag ([`vlan_of`]). A flow is tagged or not, so none is reordered; the
//! first socket alone sends.

use pvnet_net::HDR_LEN;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A bound `AF_PACKET` socket: the untagged frames and the writes, and beside it the socket of
/// the frames that came with a VLAN tag (the module docs).
#[derive(Debug)]
pub struct PacketSock {
    fd: OwnedFd,
    /// The frames the kernel took a VLAN tag out of, each read with its tag.
    tagged: OwnedFd,
    /// The interface's name.
    name: String,
}

/// `SKF_AD_OFF + SKF_AD_VLAN_TAG_PRESENT`: a classic BPF program's ancillary load of whether the
/// kernel took a VLAN tag out of the frame (1) or not (0).
const VLAN_TAG_PRESENT: u32 = 0xffff_f000 + 48;

/// The classic BPF filter that takes the frames the kernel took a VLAN tag out of (`tagged`),
/// or the others: `ld vlan_avail; jeq #0, A, B; A: ret; B: ret`.
fn vlan_filter(tagged: bool) -> [libc::sock_filter; 4] {
    let (none, some) = if tagged { (0, u32::MAX) } else { (u32::MAX, 0) };
    [
        // BPF_LD | BPF_W | BPF_ABS
        insn(0x20, 0, 0, VLAN_TAG_PRESENT),
        // BPF_JMP | BPF_JEQ | BPF_K: no tag -> insn 2, else 3
        insn(0x15, 0, 1, 0),
        // BPF_RET | BPF_K: the bytes to take (0: none)
        insn(0x06, 0, 0, none),
        insn(0x06, 0, 0, some),
    ]
}

/// One classic BPF instruction.
const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// `prog` as the kernel takes a classic BPF program (`struct sock_fprog`), pointing into it.
fn fprog(prog: &[libc::sock_filter]) -> libc::sock_fprog {
    libc::sock_fprog {
        len: u16::try_from(prog.len()).unwrap_or(0),
        filter: prog.as_ptr().cast_mut(),
    }
}

/// `setsockopt(fd, SOL_PACKET, opt, val)`; the error names `what`.
fn setopt(fd: RawFd, opt: libc::c_int, val: &impl Sized, what: &str) -> io::Result<()> {
    setopt_at(fd, libc::SOL_PACKET, opt, val, what)
}

/// `setsockopt(fd, level, opt, val)`; the error names `what`.
pub(crate) fn setopt_at(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    val: &impl Sized,
    what: &str,
) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of_val(val)).unwrap_or(0);
    // SAFETY: `val` is a live value of `len` bytes for the call; the kernel only reads it
    // (a program's instructions, which a `sock_fprog` points at, it copies).
    let r = unsafe { libc::setsockopt(fd, level, opt, std::ptr::from_ref(val).cast(), len) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// linux/if_packet.h
const PACKET_FANOUT: libc::c_int = 18;

/// The fanout group socket `fd` is in, and its mode (`PACKET_FANOUT`: 0 for none).
fn fanout_of(fd: RawFd) -> io::Result<u32> {
    let mut v: u32 = 0;
    let mut len = libc::socklen_t::try_from(size_of_val(&v)).unwrap_or(0);
    // SAFETY: `v` is a live u32 of `len` bytes the kernel writes at most `len` of.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_PACKET,
            PACKET_FANOUT,
            std::ptr::from_mut(&mut v).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Opens a non-blocking `AF_PACKET` socket on interface `name` (which must exist), with the
/// 12-byte vnet header (and beside it the socket of tagged frames, the two one fanout group:
/// the module docs). Needs `CAP_NET_RAW`. The interface is brought up if it is down.
pub fn open(name: &str) -> io::Result<PacketSock> {
    open_with(name, true)
}

/// [`open`] with its two sockets in no fanout group, so that a test may put the first in one
/// of its own.
#[cfg(test)]
pub(crate) fn open_unfanned(name: &str) -> io::Result<PacketSock> {
    open_with(name, false)
}

fn open_with(name: &str, fanout: bool) -> io::Result<PacketSock> {
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
    let ifindex = libc::c_int::try_from(index).unwrap_or(0);
    let fd = bound(name, ifindex, false)?;
    let tagged = bound(name, ifindex, true)?;
    let joined = if fanout {
        fan_out(&fd, &tagged)
    } else {
        Ok(())
    };
    if let Err(e) = joined {
        // Each frame then passes both sockets' filters: correct, a little dearer.
        tracing::info!(
            ifname = name,
            "no packet fanout ({e}): both sockets see every frame"
        );
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
        tagged,
        name: name.to_string(),
    })
}

/// Joins the two sockets into one fanout group (`PACKET_FANOUT`, a fresh id the kernel picks)
/// whose classic BPF program (`PACKET_FANOUT_CBPF`, Linux 4.2) sends each frame to one of
/// them, the first unless the kernel took a VLAN tag out of it: one delivery a frame, where
/// two sockets on their own would each be handed every frame, the one that does not want it
/// dropping it only after its filter has run (their filters stay: a frame that came before
/// the join is still read by the right one).
fn fan_out(first: &OwnedFd, second: &OwnedFd) -> io::Result<()> {
    /// linux/if_packet.h
    const PACKET_FANOUT_DATA: libc::c_int = 22;
    const PACKET_FANOUT_CBPF: u32 = 6;
    const PACKET_FANOUT_FLAG_UNIQUEID: u32 = 0x2000;
    let mode = (PACKET_FANOUT_CBPF | PACKET_FANOUT_FLAG_UNIQUEID) << 16;
    setopt(first.as_raw_fd(), PACKET_FANOUT, &mode, "PACKET_FANOUT")?;
    let join = (PACKET_FANOUT_CBPF << 16) | (fanout_of(first.as_raw_fd())? & 0xffff);
    setopt(
        second.as_raw_fd(),
        PACKET_FANOUT,
        &join,
        "PACKET_FANOUT (join)",
    )?;
    // The member's index: 0 (the first socket) or 1 (the second), by `vlan_avail`.
    // BPF_LD | BPF_W | BPF_ABS, then BPF_RET | BPF_A
    let pick = [insn(0x20, 0, 0, VLAN_TAG_PRESENT), insn(0x16, 0, 0, 0)];
    let prog = fprog(&pick);
    setopt(
        first.as_raw_fd(),
        PACKET_FANOUT_DATA,
        &prog,
        "PACKET_FANOUT_DATA",
    )
}

/// A non-blocking `AF_PACKET` socket with the 12-byte vnet header, ignoring the host's own
/// frames, bound to interface `ifindex` (`name`) for the frames the kernel took a VLAN tag out
/// of (`tagged`: their tags beside them) or for the others, the filter on before the bind.
fn bound(name: &str, ifindex: libc::c_int, tagged: bool) -> io::Result<OwnedFd> {
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
    if tagged {
        setopt(fd.as_raw_fd(), libc::PACKET_AUXDATA, &one, "PACKET_AUXDATA")?;
    }
    let filter = vlan_filter(tagged);
    setopt_at(
        fd.as_raw_fd(),
        libc::SOL_SOCKET,
        libc::SO_ATTACH_FILTER,
        &fprog(&filter),
        "SO_ATTACH_FILTER",
    )?;
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
    Ok(fd)
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
        setopt_at(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            &v,
            &format!("SO_SNDBUF {bytes}"),
        )
    }

    /// Frames the kernel dropped for its sockets since the last call (a receive queue was
    /// full): `PACKET_STATISTICS`' `tp_drops`, which the read resets.
    pub(crate) fn drops_since(&self) -> io::Result<u64> {
        Ok(drops_since(self.fd.as_raw_fd())? + drops_since(self.tagged.as_raw_fd())?)
    }

    /// Whether its two sockets are in one fanout group ([`fan_out`]): the group each is in,
    /// as the kernel says (`PACKET_FANOUT`: 0 for none).
    #[cfg(test)]
    pub(crate) fn fanned(&self) -> bool {
        let group = |fd: &OwnedFd| fanout_of(fd.as_raw_fd()).unwrap_or(0);
        let (a, b) = (group(&self.fd), group(&self.tagged));
        a != 0 && a == b
    }

    /// The socket of the frames that came with a VLAN tag, to read with `recvmsg` and wait
    /// on.
    pub(crate) fn tagged_fd(&self) -> RawFd {
        self.tagged.as_raw_fd()
    }

    /// Reads one frame (header first) and the VLAN tag the kernel took out of it, if it
    /// had one (see [`vlan_of`]): an untagged one if one is queued, else a tagged one;
    /// `Ok(None)` when none is queued.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, Option<Tag>)>> {
        if let Some(n) = crate::sys::tap::read_fd(self.fd.as_raw_fd(), buf)? {
            return Ok(Some((n, None)));
        }
        let mut ctrl = Ctrl::default();
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut msg = ctrl.msghdr(&mut iov, 1);
        loop {
            // SAFETY: `msg` describes `buf` (exclusively borrowed) and `ctrl`'s buffer, both
            // live for the call; the kernel writes at most their lengths.
            let n = unsafe { libc::recvmsg(self.tagged.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
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

/// `PACKET_STATISTICS`' `tp_drops` of socket `fd` (the read resets it).
fn drops_since(fd: RawFd) -> io::Result<u64> {
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
            fd,
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
