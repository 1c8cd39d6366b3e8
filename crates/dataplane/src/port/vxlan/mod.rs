//! A VXLAN port (RFC 7348): the switch's segment stretched to other hosts through UDP
//! tunnels, speaking the same wire format as Linux's `vxlan` device, OVS and VPP.
//!
//! To the switch it is a plain L2 port: decapsulated Ethernet frames come out of it, frames
//! sent to it are encapsulated. One VNI per port.
//!
//! Underlay: the host's own UDP stack ([`crate::sys::udp`]); the kernel builds and strips the
//! outer IPv4 and UDP headers, routes, resolves neighbours and fragments nothing (a datagram
//! past the path's MTU is refused). pvnet writes and checks the 8-byte VXLAN header. The
//! outer UDP checksum is on with `gso` (segmented sends need it; the device computes it),
//! else zero, as RFC 7348 says for IPv4 and Linux's device does.
//!
//! Receiving: one `recvmmsg` of up to [`MAX_BURST`] datagrams into the port's own slots, each
//! read 4 bytes into its slot so that, once the VXLAN header is checked, the 12 bytes in front
//! of the inner frame become its virtio-net header (all zero: no offload metadata) and the
//! frame is handed out where it lies, no copy. With `gro` (`UDP_GRO`), a slot may hold a run
//! of datagrams the kernel coalesced (a peer's segmented send): each is checked alone, the
//! later ones handed out behind a shared zero header, as a segment of their own. A datagram whose flags are not exactly the I
//! flag (Linux drops those too), whose VNI is not the port's, that is shorter than a VXLAN
//! header and an Ethernet header, or that did not fit its slot, is dropped and counted
//! (`invalid`, `too_big`); one from an address that is not one of the port's remotes is
//! dropped as `filtered`. Every inner source address is learned to the remote it came from
//! ([`MacTable`], the switch's own kind of table, VLAN 0), aged as the switch's is. Frames the switch makes wait stay in their
//! slots, in order, and no datagram is read until they are gone.
//!
//! Transmitting: each frame becomes one datagram per destination remote, gathered straight
//! from the sender's memory behind one shared 8-byte header (the kernel's copy is the only
//! one): to the remote its destination address was learned behind, or, for broadcast,
//! multicast and unknown unicast, to every remote (head-end replication). The batch goes out
//! at [`Port::tx_commit`](super::Port::tx_commit), per source socket: each run of datagrams
//! to one remote of one size as one segmented send (`UDP_SEGMENT`, with `gso`: one buffer
//! the kernel cuts late), the rest by one `sendmmsg` (more only if the kernel stops
//! part-way). A frame whose datagram would be longer than the
//! underlay's path MTU is refused (`too_big`, at its sender); a datagram the kernel refuses
//! is counted at the port (`no_buffer` when its buffer is full, `too_big`, `port_down`).
//! `tx_packets` counts datagrams, as Linux's vxlan does: a frame flooded to N remotes counts
//! N. What the switch made in its own staging memory (a checksum it completed, a segment of a
//! GSO packet: the port takes no offload; a re-cut frame's new addresses and 802.1Q tag) is
//! copied into the batch's own memory when the switch says so
//! ([`Port::staged`](super::Port::staged)), since that memory is reused before the commit;
//! the copy keeps each datagram's iovecs where they were, so that runs stay runs.
//!
//! Outer source ports: a plain UDP socket sends from the port it is bound to. To spread flows
//! over the underlay's paths (ECMP, RSS on the far host), the port opens `srcports` sockets
//! on free ports the kernel picks and sends each inner flow (its flow hash) from one of them;
//! with `srcports=1` everything goes from the receiving socket (source port = `dstport`).
//! Building the outer headers itself (over AF_PACKET or AF_XDP) would give any source port
//! per packet, at the price of routing, ARP and fragmentation of its own: not done.
//!
//! MTU: the encapsulation costs 50 bytes of the underlay's MTU (outer IPv4 20, UDP 8, VXLAN 8,
//! the inner Ethernet header 14): [`Port::mtu`](super::Port::mtu) is the underlay path's MTU
//! less 50, so a guest behind a 1500-byte underlay needs an MTU of 1450 (`mtu=1450` on its
//! vhost-user port, or the switch's `--mtu`).
//!
//! Offloads: none either way (a datagram carries no metadata): the switch completes
//! checksums and segments GSO packets before they reach the port (`sw_csum`, `sw_gso`).

#[cfg(test)]
mod tests;

use super::kernel::{iovecs, TAP_LOOK};
use super::{offer_each, Ingress};
use crate::mac::MacTable;
use crate::pkt::{flow_hash_of, Caps, Pkt, PortId, Staged, TxOut, EMPTY, MACS, MAX_BURST};
use crate::poll::plan::Settle;
use crate::poll::Idle;
use crate::stats::{bump, DropReason, PortStats};
use crate::sys::udp::{self, UdpSock};
use pvnet_net::HDR_LEN;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::Armed;
use virtq::Seg;

/// The IANA port for VXLAN.
pub const DEFAULT_PORT: u16 = 4789;
/// Bytes of the VXLAN header.
pub const VXLAN_HDR: u32 = 8;
/// Bytes in front of the inner frame on the wire: outer IPv4 (20), UDP (8), VXLAN (8).
const ENCAP: u32 = 20 + 8 + VXLAN_HDR;
/// What the encapsulation takes of the underlay's MTU, seen from an inner IP packet: the
/// outer headers and the inner Ethernet header (14).
pub const OVERHEAD: u32 = ENCAP + 14;
/// Most remotes of one port.
pub const MAX_REMOTES: usize = 64;
/// Most source sockets of one port.
pub const MAX_SRCPORTS: u16 = 64;
/// Datagrams queued per source socket before they are sent (a flood takes one per remote).
const TX_MSGS: usize = 256;
/// Iovecs of a transmit batch in all (the kernel takes at most 1024 per datagram).
const TX_IOVS: usize = 1024;
/// Bytes of the transmit batch's own copies (packets the switch staged: see
/// [`Port::staged`](super::Port::staged)).
const ARENA: usize = 256 << 10;
/// The kernel's buffers for the port's sockets, each way (capped by `net.core.rmem_max` and
/// `wmem_max`).
const SOCK_BUF: u32 = 4 << 20;
/// Learned inner addresses.
const FDB_SLOTS: usize = 4096;
/// The flag byte of a VXLAN header with a valid VNI (the I flag, RFC 7348 section 5).
const FLAG_I: u8 = 0x08;
/// `UDP_GRO` (`linux/udp.h`): the socket option, and the control message with a run's
/// segment size.
const UDP_GRO: libc::c_int = 104;
/// Slots of a port that reads coalesced runs (64 KiB each).
const GRO_SLOTS: usize = 32;
/// Most datagrams of one coalesced run taken (the kernel's `UDP_MAX_SEGMENTS`; more are
/// dropped, `too_big`).
const MAX_SEGS_IN: usize = 128;

/// A VXLAN port's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanConfig {
    /// The address the port's sockets are bound to (the outer source address).
    pub local: Ipv4Addr,
    /// The tunnel endpoints: where flooded frames go, and the only senders taken.
    pub remotes: Vec<Ipv4Addr>,
    /// The VXLAN network identifier (24 bits).
    pub vni: u32,
    /// The UDP port datagrams go to and are received on.
    pub dstport: u16,
    /// Sockets on kernel-picked ports that flows are spread over as their source port
    /// (1: the receiving socket sends, from `dstport`).
    pub srcports: u16,
    /// The network namespace the sockets are opened in (`ip netns` name or a path), if not
    /// the switch's.
    pub netns: Option<String>,
    /// Send runs of equal-sized datagrams to one remote as one segmented send
    /// (`UDP_SEGMENT`); falls back to one datagram per send where the underlay's device
    /// cannot (no checksum offload). Needs the outer UDP checksum on.
    pub gso: bool,
    /// Read runs of datagrams the kernel coalesced (`UDP_GRO`: a segmented send from a
    /// peer that reached the socket whole, or a NIC's GRO) as one, 64 KiB slots.
    pub gro: bool,
}

/// The port's sockets, opened (before the port goes to its shard).
#[derive(Debug)]
pub struct Underlay {
    cfg: VxlanConfig,
    /// `[0]`: bound to `dstport`, receives (and sends when there is no other); then the
    /// source sockets.
    socks: Vec<UdpSock>,
    /// The smallest path MTU towards the remotes.
    mtu: u32,
    /// The receiving socket reads coalesced runs.
    gro: bool,
}

impl Underlay {
    /// Binds the sockets (in `cfg.netns` if given) and reads the path MTU to every remote.
    pub fn open(cfg: &VxlanConfig) -> std::io::Result<Self> {
        let c = cfg.clone();
        let open = move || -> std::io::Result<(Vec<UdpSock>, u32, bool)> {
            let rx = UdpSock::bind(c.local, c.dstport)?;
            rx.set_buffers(SOCK_BUF);
            rx.checksum(c.gso);
            let gro = c.gro && rx.set_gro().is_ok();
            let mut socks = vec![rx];
            if c.srcports > 1 {
                for _ in 0..c.srcports {
                    let s = UdpSock::bind(c.local, 0)?;
                    s.set_buffers(SOCK_BUF);
                    s.checksum(c.gso);
                    socks.push(s);
                }
            }
            let mut mtu = u32::MAX;
            for &r in &c.remotes {
                mtu = mtu.min(udp::path_mtu(c.local, r)?);
            }
            Ok((socks, mtu, gro))
        };
        let (socks, mtu, gro) = match &cfg.netns {
            Some(ns) => udp::in_netns(ns, open)?,
            None => open()?,
        };
        if mtu < ENCAP + 14 + 68 {
            return Err(std::io::Error::other(format!(
                "the underlay's MTU ({mtu}) leaves no room for a frame"
            )));
        }
        Ok(Self {
            cfg: cfg.clone(),
            socks,
            mtu,
            gro,
        })
    }

    /// The inner MTU: the largest IP packet a frame through the tunnel may carry.
    pub fn inner_mtu(&self) -> u32 {
        self.mtu - OVERHEAD
    }

    /// The source ports datagrams go out from.
    pub fn source_ports(&self) -> Vec<u16> {
        if self.socks.len() == 1 {
            vec![self.socks[0].port()]
        } else {
            self.socks[1..].iter().map(UdpSock::port).collect()
        }
    }

    /// For `pvnet ctl ports`.
    pub fn describe(&self) -> String {
        let remotes: Vec<String> = self.cfg.remotes.iter().map(ToString::to_string).collect();
        let sp = self.source_ports();
        format!(
            "vni {}, {}:{} -> {}, source ports {}, underlay MTU {} (inner {}){}{}{}",
            self.cfg.vni,
            self.cfg.local,
            self.cfg.dstport,
            remotes.join(" "),
            if sp.len() == 1 {
                sp[0].to_string()
            } else {
                format!("{} ({} sockets)", sp[0], sp.len())
            },
            self.mtu,
            self.inner_mtu(),
            if self.cfg.gso { ", gso" } else { "" },
            if self.gro { ", gro" } else { "" },
            self.cfg
                .netns
                .as_ref()
                .map_or(String::new(), |n| format!(", netns {n}"))
        )
    }
}

/// The receive side: the slots, the headers `recvmmsg` fills, the frames not handed out.
struct Rx {
    /// Bytes per slot (one datagram, or with `gro` one coalesced run of them).
    slot: usize,
    /// Slots, and so datagrams (or runs) per read.
    slots: usize,
    /// Whether reads may return coalesced runs (`UDP_GRO`).
    gro: bool,
    buf: Vec<u8>,
    iov: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_in>,
    msgs: Vec<libc::mmsghdr>,
    /// Each slot's control message (a run's segment size).
    ctrl: Vec<[u64; 4]>,
    /// A zero virtio-net header, for frames with no room in front of them (the second and
    /// later datagrams of a coalesced run).
    zero: Box<[u8; HDR_LEN as usize]>,
    /// Decapsulated frames not handed out yet, in order (`at..n` wait): (where the frame
    /// starts in `buf`, its bytes, whether its header is in place in front of it).
    ready: Box<[(u32, u32, bool)]>,
    at: usize,
    n: usize,
}

/// One source socket's queued datagrams.
struct Lane {
    /// Index of its socket in the port's.
    sock: usize,
    msgs: Vec<libc::mmsghdr>,
    /// The remote of each (index in `Tx::remotes`).
    to: Vec<u16>,
    /// Frame bytes of each.
    lens: Vec<u32>,
    n: usize,
}

/// Where a packet taken was queued (for [`VxlanPort::detach`]): its iovecs, which every
/// datagram made of it (one per remote) points at.
#[derive(Clone, Copy, Default)]
struct Queued {
    /// Its header's iovec; the packet's own follow.
    start: usize,
    /// Iovecs of the packet's own.
    n: usize,
}

/// The transmit side: the shared header, the iovecs and the queued datagrams.
struct Tx {
    /// The VXLAN header every datagram starts with (boxed: queued iovecs point at it).
    hdr: Box<[u8; VXLAN_HDR as usize]>,
    /// The remotes' addresses (boxed: queued headers point at them).
    remotes: Box<[libc::sockaddr_in]>,
    iov: Vec<libc::iovec>,
    iov_used: usize,
    lanes: Vec<Lane>,
    /// Copies of staged packets, until the flush (never reallocated: iovecs point into it).
    arena: Vec<u8>,
    arena_used: usize,
    /// The last packets taken (at most a burst's: `taken % MAX_BURST`), for `staged`.
    queued: [Queued; MAX_BURST],
    /// Packets taken since the last flush.
    taken: usize,
}

// SAFETY: the raw pointers in `Rx` point into its own boxed buffers (never reallocated) and
// are used only by the thread that owns the port, within one call. Those in `Tx` point into
// its own boxes and, between a queued datagram and the flush that sends it (both within one
// batch on the shard thread that owns the port), into the sender's packet memory; between
// batches they are stale and never dereferenced.
unsafe impl Send for Rx {}
// SAFETY: as for `Rx`.
unsafe impl Send for Tx {}

impl std::fmt::Debug for Rx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rx")
            .field("slot", &self.slot)
            .field("waiting", &(self.n - self.at))
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx")
            .field("lanes", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

fn zeroed_msg() -> libc::mmsghdr {
    // SAFETY: mmsghdr is plain data (pointers and integers): all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Bytes of a `sockaddr_in`.
const SOCKADDR_LEN: libc::socklen_t = 16;
const _: () = assert!(size_of::<libc::sockaddr_in>() == SOCKADDR_LEN as usize);

impl Rx {
    fn new(underlay_mtu: u32, gro: bool) -> Box<Self> {
        // A datagram's payload is at most the MTU less 28; 4 bytes in front of it. The slot
        // takes a little more, so that a datagram too big shows as cut (MSG_TRUNC). A
        // coalesced run is at most an IP packet's 64 KiB.
        let (slot, slots) = if gro {
            (65536 + 64, GRO_SLOTS)
        } else {
            (
                (underlay_mtu as usize).next_multiple_of(64).max(2048),
                MAX_BURST,
            )
        };
        let ready = if gro { slots * MAX_SEGS_IN } else { slots };
        let mut rx = Box::new(Self {
            slot,
            slots,
            gro,
            buf: vec![0u8; slot * slots],
            iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                };
                slots
            ],
            names: vec![udp::sockaddr(Ipv4Addr::UNSPECIFIED, 0); slots],
            msgs: (0..slots).map(|_| zeroed_msg()).collect(),
            ctrl: vec![[0; 4]; slots],
            zero: Box::new([0; HDR_LEN as usize]),
            ready: vec![(0, 0, false); ready].into_boxed_slice(),
            at: 0,
            n: 0,
        });
        let r = &mut *rx;
        for i in 0..slots {
            r.iov[i] = libc::iovec {
                iov_base: r.buf[i * slot + 4..].as_mut_ptr().cast(),
                iov_len: slot - 4,
            };
            let h = &mut r.msgs[i].msg_hdr;
            h.msg_iov = &raw mut r.iov[i];
            h.msg_iovlen = 1;
            h.msg_name = (&raw mut r.names[i]).cast();
            h.msg_namelen = SOCKADDR_LEN;
            if gro {
                h.msg_control = (&raw mut r.ctrl[i]).cast();
            }
        }
        rx
    }
}

/// The segment size of a coalesced run, from its slot's control message (`UDP_GRO`), if
/// the kernel gave one.
fn gro_size(ctrl: &[u64; 4], len: usize) -> Option<usize> {
    let mut b = [0u8; 32];
    for (d, w) in b.chunks_exact_mut(8).zip(ctrl) {
        d.copy_from_slice(&w.to_ne_bytes());
    }
    // struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; } then an int.
    let word = |at: usize| i32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    if len < 20 || word(8) != libc::SOL_UDP || word(12) != UDP_GRO {
        return None;
    }
    usize::try_from(word(16)).ok().filter(|&g| g > 0)
}

/// The VXLAN header for `vni`.
pub(crate) fn header(vni: u32) -> [u8; VXLAN_HDR as usize] {
    let v = vni.to_be_bytes();
    [FLAG_I, 0, 0, 0, v[1], v[2], v[3], 0]
}

/// Checks a datagram of `len` bytes (VXLAN header first) for `vni`: its inner frame's length,
/// or why it is dropped.
#[inline]
pub(crate) fn decap(d: &[u8], len: usize, vni: u32) -> Result<u32, DropReason> {
    if len < (VXLAN_HDR + MACS + 2) as usize || d.len() < len {
        return Err(DropReason::Invalid);
    }
    // Exactly the I flag and zero reserved bytes: what Linux takes without extensions.
    if d[..4] != [FLAG_I, 0, 0, 0] || d[7] != 0 {
        return Err(DropReason::Invalid);
    }
    if u32::from_be_bytes([0, d[4], d[5], d[6]]) != vni {
        return Err(DropReason::Invalid);
    }
    u32::try_from(len)
        .map(|l| l - VXLAN_HDR)
        .map_err(|_| DropReason::TooBig)
}

/// Why the kernel refused a datagram, from its errno.
fn refusal(errno: i32) -> DropReason {
    match errno {
        libc::EAGAIN | libc::ENOBUFS => DropReason::NoBuffer,
        libc::EMSGSIZE => DropReason::TooBig,
        _ => DropReason::PortDown,
    }
}

/// The port.
#[derive(Debug)]
pub struct VxlanPort {
    id: PortId,
    stats: Arc<PortStats>,
    vni: u32,
    socks: Vec<UdpSock>,
    /// The remotes' addresses as the kernel gives them (network order), to match senders.
    remote_ips: Box<[u32]>,
    /// The underlay path's MTU.
    underlay_mtu: u32,
    /// Segmented sends (see [`VxlanConfig::gso`]): off for good once the kernel refuses one.
    gso: bool,
    fdb: MacTable,
    /// The time of the open transmit batch.
    now: Instant,
    rx: Box<Rx>,
    tx: Box<Tx>,
    /// Read again at once (the last read filled every slot, or the shard just woke).
    look: bool,
    last_look: Option<Instant>,
    /// What the settings said, for messages.
    desc: String,
}

impl VxlanPort {
    /// The port over opened sockets; addresses learned live `aging` without traffic.
    pub fn new(id: PortId, stats: Arc<PortStats>, u: Underlay, aging: Duration) -> Self {
        let desc = u.describe();
        let remotes: Box<[libc::sockaddr_in]> = u
            .cfg
            .remotes
            .iter()
            .map(|&r| udp::sockaddr(r, u.cfg.dstport))
            .collect();
        let remote_ips = remotes.iter().map(|s| s.sin_addr.s_addr).collect();
        let lane = |sock| Lane {
            sock,
            msgs: (0..TX_MSGS).map(|_| zeroed_msg()).collect(),
            to: vec![0; TX_MSGS],
            lens: vec![0; TX_MSGS],
            n: 0,
        };
        let lanes = if u.socks.len() == 1 {
            vec![lane(0)]
        } else {
            (1..u.socks.len()).map(lane).collect()
        };
        Self {
            id,
            stats,
            vni: u.cfg.vni,
            rx: Rx::new(u.mtu, u.gro),
            tx: Box::new(Tx {
                hdr: Box::new(header(u.cfg.vni)),
                remotes,
                iov: vec![
                    libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    };
                    TX_IOVS
                ],
                iov_used: 0,
                lanes,
                arena: vec![0u8; ARENA],
                arena_used: 0,
                queued: [Queued::default(); MAX_BURST],
                taken: 0,
            }),
            socks: u.socks,
            remote_ips,
            underlay_mtu: u.mtu,
            gso: u.cfg.gso,
            fdb: MacTable::new(FDB_SLOTS, aging),
            now: Instant::now(),
            look: true,
            last_look: None,
            desc,
        }
    }

    /// The receiving socket's fd, to wait on it.
    pub fn fd(&self) -> RawFd {
        self.socks[0].as_raw_fd()
    }

    /// The inner addresses learned and the remote each is behind.
    pub fn learned(&self, now: Instant) -> Vec<([u8; 6], Ipv4Addr)> {
        self.fdb
            .entries(now)
            .into_iter()
            .filter_map(|e| {
                let ip = self.remote_ips.get(usize::try_from(e.port).ok()?)?;
                Some((e.mac, Ipv4Addr::from(u32::from_be(*ip))))
            })
            .collect()
    }

    /// One `recvmmsg` of up to `max` datagrams (with `gro`, of runs of them: up to `max`
    /// runs): checks and decapsulates each datagram, learns its inner source; the good ones
    /// wait in `rx.ready`. Returns the datagrams dropped (work done: they count as taken).
    fn read(&mut self, max: usize, now: Instant) -> usize {
        let rx = &mut *self.rx;
        let k = max.clamp(1, rx.slots);
        for m in &mut rx.msgs[..k] {
            m.msg_hdr.msg_namelen = SOCKADDR_LEN;
            m.msg_hdr.msg_flags = 0;
            if rx.gro {
                m.msg_hdr.msg_controllen = size_of::<[u64; 4]>();
            }
            m.msg_len = 0;
        }
        bump(&self.stats.syscalls, 1);
        // SAFETY: every header points at its own slot (`slot - 4` bytes from offset 4),
        // address and control buffer in `rx` (set up in `Rx::new`, never reallocated); no
        // frame is waiting (`at == n`), so nothing else uses them during the call.
        let got = match unsafe { self.socks[0].recv_many(&mut rx.msgs[..k]) } {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(port = self.id, "vxlan read: {e}");
                0
            }
        };
        self.look = got == k;
        rx.at = 0;
        rx.n = 0;
        let mut dropped = [0u64; DropReason::ALL.len()];
        let slot = rx.slot;
        for i in 0..got {
            let m = &rx.msgs[i].msg_hdr;
            let len = rx.msgs[i].msg_len as usize;
            let base = i * slot;
            let from = rx.names[i].sin_addr.s_addr;
            let remote = self.remote_ips.iter().position(|&r| r == from);
            if m.msg_flags & libc::MSG_TRUNC != 0 {
                dropped[DropReason::TooBig as usize] += 1;
                continue;
            }
            let g = if rx.gro {
                gro_size(&rx.ctrl[i], m.msg_controllen).unwrap_or(len)
            } else {
                len
            }
            .max(1);
            // Each datagram of the run (one, without a run), in order.
            let mut off = 0;
            while off < len {
                let sl = g.min(len - off);
                let at = base + 4 + off;
                let first = off == 0;
                off += sl;
                if rx.n == rx.ready.len() {
                    dropped[DropReason::TooBig as usize] += 1;
                    continue;
                }
                let verdict = decap(&rx.buf[at..at + sl], sl, self.vni)
                    .and_then(|l| remote.map(|r| (l, r)).ok_or(DropReason::Filtered));
                let (flen, r) = match verdict {
                    Ok(v) => v,
                    Err(why) => {
                        dropped[why as usize] += 1;
                        continue;
                    }
                };
                let frame = at + VXLAN_HDR as usize;
                let mut src = [0u8; 6];
                src.copy_from_slice(&rx.buf[frame + 6..frame + 12]);
                self.fdb
                    .learn(0, src, u32::try_from(r).unwrap_or(u32::MAX), now);
                if first {
                    // The slot's first 12 bytes (4 spare, the VXLAN header) become the
                    // frame's virtio-net header.
                    rx.buf[base..base + HDR_LEN as usize].fill(0);
                }
                rx.ready[rx.n] = (u32::try_from(frame).unwrap_or(0), flen, first);
                rx.n += 1;
            }
        }
        let total: u64 = dropped.iter().sum();
        bump(&self.stats.rx_packets, total);
        for r in DropReason::ALL {
            bump(&self.stats.drops[r as usize], dropped[r as usize]);
        }
        usize::try_from(total).unwrap_or(0)
    }

    /// Hands out up to `max` of the decapsulated frames waiting, in order, in place (behind
    /// their own header bytes, or, for the later datagrams of a run, behind the shared zero
    /// header as a segment of its own). Returns the frames taken.
    fn hand_out(&mut self, max: usize, to: &mut impl Ingress) -> usize {
        let rx = &mut *self.rx;
        let stats = &*self.stats;
        let mut done = 0;
        while done < max && rx.at < rx.n {
            let want = (rx.n - rx.at).min(max - done).min(MAX_BURST);
            let mut segs: [[Seg<'_>; 2]; MAX_BURST] =
                std::array::from_fn(|_| [Seg::from_mut(&mut []), Seg::from_mut(&mut [])]);
            let mut two = [false; MAX_BURST];
            let mut pkts = [EMPTY; MAX_BURST];
            let mut m = 0;
            {
                let zero = Seg::from_mut(&mut rx.zero[..]);
                let mut rest: &mut [u8] = &mut rx.buf;
                let mut base = 0usize;
                for &(frame, flen, in_place) in &rx.ready[rx.at..rx.at + want] {
                    let frame = frame as usize;
                    let start = if in_place {
                        frame - HDR_LEN as usize
                    } else {
                        frame
                    };
                    let end = frame + flen as usize;
                    if start < base || end - base > rest.len() {
                        break;
                    }
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - base);
                    let (mine, tail) = tail.split_at_mut(end - start);
                    rest = tail;
                    base = end;
                    let mut macs = [0u8; 12];
                    let at = frame - start;
                    macs.copy_from_slice(&mine[at..at + MACS as usize]);
                    if in_place {
                        segs[m][0] = Seg::from_mut(mine);
                    } else {
                        segs[m] = [zero, Seg::from_mut(mine)];
                        two[m] = true;
                    }
                    pkts[m] = Pkt {
                        len: HDR_LEN + flen,
                        hdr_len: HDR_LEN,
                        macs,
                        ..EMPTY
                    };
                    m += 1;
                }
            }
            for ((p, s), &t) in pkts.iter_mut().zip(segs.iter()).zip(two.iter()).take(m) {
                p.segs = if t { &s[..] } else { &s[..1] };
            }
            let taken = to.burst(&pkts[..m], stats);
            let bytes: u64 = pkts[..taken].iter().map(|p| u64::from(p.frame_len())).sum();
            bump(&stats.rx_packets, taken as u64);
            bump(&stats.rx_bytes, bytes);
            rx.at += taken;
            done += taken;
            if taken < m {
                break;
            }
        }
        done
    }

    /// Queues one frame as a datagram to each of its remotes, gathered from its memory
    /// behind the shared header.
    fn put(&mut self, p: &Pkt<'_>) -> TxOut {
        let flen = p.frame_len();
        if flen + ENCAP > self.underlay_mtu {
            return TxOut::Dropped(DropReason::TooBig);
        }
        let need = 1 + p.segs.len();
        if need > TX_IOVS {
            return TxOut::Dropped(DropReason::TooBig);
        }
        let mut dst = [0u8; 6];
        dst.copy_from_slice(&p.macs[..6]);
        let one = self
            .fdb
            .lookup(0, dst, self.now)
            .and_then(|r| usize::try_from(r).ok());
        let copies = one.map_or(self.tx.remotes.len(), |_| 1);
        let lanes = self.tx.lanes.len();
        let li = if lanes == 1 {
            0
        } else {
            let h = if p.hash != 0 {
                u64::from(p.hash)
            } else {
                flow_hash_of(p)
            };
            // Multiply-shift onto 0..lanes (no division).
            usize::try_from(((h & 0xffff_ffff) * lanes as u64) >> 32).unwrap_or(0)
        };
        if self.tx.iov_used + need > TX_IOVS || self.tx.lanes[li].n + copies > TX_MSGS {
            self.flush();
        }
        let tx = &mut *self.tx;
        let start = tx.iov_used;
        tx.iov[start] = libc::iovec {
            iov_base: tx.hdr.as_mut_ptr().cast(),
            iov_len: VXLAN_HDR as usize,
        };
        let Some(n) = iovecs(p.segs, p.hdr_len, &mut tx.iov[start + 1..]) else {
            return TxOut::Dropped(DropReason::TooBig);
        };
        tx.iov_used += 1 + n;
        let iov = tx.iov[start..].as_mut_ptr();
        let targets = match one {
            Some(r) => r..r + 1,
            None => 0..tx.remotes.len(),
        };
        tx.queued[tx.taken % MAX_BURST] = Queued { start, n };
        tx.taken += 1;
        let lane = &mut tx.lanes[li];
        for r in targets {
            let h = &mut lane.msgs[lane.n].msg_hdr;
            h.msg_name = (&raw mut tx.remotes[r]).cast();
            h.msg_namelen = SOCKADDR_LEN;
            h.msg_iov = iov;
            h.msg_iovlen = 1 + n;
            lane.to[lane.n] = u16::try_from(r).unwrap_or(0);
            lane.lens[lane.n] = flen;
            lane.n += 1;
        }
        TxOut::Sent
    }

    /// Copies what the switch staged of the `k`-th packet taken since the flush (`part`),
    /// behind the VXLAN header, into the batch's own memory and points its iovecs there: the
    /// switch reuses that memory before the commit ([`Port::staged`]). The header and the
    /// copy take the first of the iovecs they replace, the others become empty: every
    /// datagram keeps its iovecs' count and place, so runs stay runs for the segmented send,
    /// and the kernel gathers no more pieces than for a frame that was not staged. When the
    /// copies fill up, the batch is sent at once instead (the packets' memory still holds
    /// them now): false then.
    ///
    /// [`Port::staged`]: super::Port::staged
    fn detach(&mut self, k: usize, part: Staged) -> bool {
        let tx = &mut *self.tx;
        let q = tx.queued[k % MAX_BURST];
        // The header's iovec, then the frame's.
        let iov = &mut tx.iov[q.start..=q.start + q.n];
        let m = 1 + match part {
            Staged::Whole => q.n,
            Staged::Head => q.n.min(1),
        };
        let total: usize = iov[..m].iter().map(|v| v.iov_len).sum();
        if tx.arena_used + total > ARENA {
            self.flush();
            return false;
        }
        let at = tx.arena_used;
        let mut end = at;
        for v in &iov[..m] {
            // SAFETY: the iovec was made in `put`: over the port's own header, or a segment
            // of a packet the switch offered in its last burst, `iov_len` bytes of memory it
            // holds until it returns from the call that made it call `staged` (it reuses the
            // memory only after that).
            let src = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
            tx.arena[end..end + src.len()].copy_from_slice(src);
            end += src.len();
        }
        let base = tx.arena[at..].as_mut_ptr();
        for (i, v) in iov[..m].iter_mut().enumerate() {
            *v = libc::iovec {
                iov_base: base.cast(),
                iov_len: if i == 0 { total } else { 0 },
            };
        }
        tx.arena_used = end;
        true
    }

    /// Sends every queued datagram and counts what the kernel took and refused: per source
    /// socket, each run of datagrams to one remote of one size (the last may be shorter)
    /// whose iovecs follow each other as one segmented send (`UDP_SEGMENT`, with `gso`),
    /// the rest by `sendmmsg` (more calls only if the kernel stops part-way).
    fn flush(&mut self) {
        let tx = &mut *self.tx;
        let mut c = Sent::default();
        let mut gso = self.gso;
        for lane in &mut tx.lanes {
            let sock = &self.socks[lane.sock];
            let mut at = 0;
            while at < lane.n {
                let (run, iovlen) = if gso { run_at(lane, at) } else { (1, 0) };
                if run >= 2 {
                    let seg = u16::try_from(VXLAN_HDR + lane.lens[at]).unwrap_or(u16::MAX);
                    let to = &tx.remotes[usize::from(lane.to[at])];
                    c.calls += 1;
                    // SAFETY: the run's iovecs follow each other in `tx.iov` (checked by
                    // `run_at`; boxed, never reallocated) over `tx.hdr`, `tx.arena` and the
                    // memory of packets the switch holds until this batch is committed.
                    match unsafe {
                        sock.send_segmented(to, lane.msgs[at].msg_hdr.msg_iov, iovlen, seg)
                    } {
                        Ok(_) => {
                            c.took(&lane.lens[at..at + run]);
                            at += run;
                            continue;
                        }
                        Err(e)
                            if matches!(
                                e,
                                libc::EIO | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOPROTOOPT
                            ) =>
                        {
                            // The route's device cannot take it: plain sends from now on.
                            let e = std::io::Error::from_raw_os_error(e);
                            tracing::warn!(
                                port = self.id,
                                "UDP_SEGMENT refused ({e}): one datagram per send from now on"
                            );
                            gso = false;
                        }
                        Err(e) => {
                            let why = refusal(e);
                            if why == DropReason::NoBuffer {
                                c.refused[why as usize] += (lane.n - at) as u64;
                                break;
                            }
                            c.refused[why as usize] += run as u64;
                            at += run;
                            continue;
                        }
                    }
                }
                // Datagrams that start no run, in one `sendmmsg` (everything, without gso).
                let mut end = at + 1;
                while gso && end < lane.n && run_at(lane, end).0 < 2 {
                    end += 1;
                }
                if !gso {
                    end = lane.n;
                }
                match send_plain(sock, lane, at, end, &mut c, self.id) {
                    Some(next) => at = next,
                    None => break,
                }
            }
            lane.n = 0;
        }
        if self.gso && !gso {
            self.gso = false;
            for s in &self.socks {
                s.checksum(false);
            }
        }
        tx.iov_used = 0;
        tx.arena_used = 0;
        tx.taken = 0;
        bump(&self.stats.syscalls, c.calls);
        bump(&self.stats.tx_packets, c.ok);
        bump(&self.stats.tx_bytes, c.bytes);
        for r in DropReason::ALL {
            bump(&self.stats.drops[r as usize], c.refused[r as usize]);
        }
    }
}

/// What a flush sent and what the kernel refused.
#[derive(Default)]
struct Sent {
    ok: u64,
    bytes: u64,
    calls: u64,
    refused: [u64; DropReason::ALL.len()],
}

impl Sent {
    fn took(&mut self, lens: &[u32]) {
        self.ok += lens.len() as u64;
        self.bytes += lens.iter().map(|&l| u64::from(l)).sum::<u64>();
    }
}

/// Most datagrams of one segmented send (the kernel's `UDP_MAX_SEGMENTS` is 64 or more).
const MAX_SEGS: usize = 64;

/// The run of datagrams from `at` that one segmented send can carry: to the same remote,
/// the same length (the last may be shorter), iovecs following each other, within
/// [`MAX_SEGS`] and an IP packet's 64 KiB. Returns its length and iovecs.
#[inline]
fn run_at(lane: &Lane, at: usize) -> (usize, usize) {
    let first = &lane.msgs[at].msg_hdr;
    let len = lane.lens[at];
    let seg = (VXLAN_HDR + len) as usize;
    let most = MAX_SEGS.min((65535 - 28) / seg);
    let mut iovlen = first.msg_iovlen;
    let mut end = first.msg_iov.wrapping_add(first.msg_iovlen);
    let mut j = at + 1;
    while j < lane.n && j - at < most {
        let h = &lane.msgs[j].msg_hdr;
        if lane.to[j] != lane.to[at] || h.msg_iov != end || lane.lens[j] > len {
            break;
        }
        iovlen += h.msg_iovlen;
        end = h.msg_iov.wrapping_add(h.msg_iovlen);
        j += 1;
        if lane.lens[j - 1] < len {
            break;
        }
    }
    (j - at, iovlen)
}

/// Sends datagrams `at..end` of `lane` by `sendmmsg` until the kernel takes them all or
/// refuses one for want of room: the next one to send, or None when the rest of the lane is
/// dropped (`no_buffer`: the socket's buffer is full).
fn send_plain(
    sock: &UdpSock,
    lane: &mut Lane,
    mut at: usize,
    end: usize,
    c: &mut Sent,
    id: PortId,
) -> Option<usize> {
    while at < end {
        c.calls += 1;
        // SAFETY: each queued header points at an address in `tx.remotes` and at iovecs in
        // `tx.iov` (boxed, never reallocated) over `tx.hdr`, `tx.arena` and the memory of
        // packets the switch holds until this batch is committed (this flush is part of the
        // commit, or of the batch itself).
        match unsafe { sock.send_many(&mut lane.msgs[at..end]) } {
            Ok(k) if k > 0 => {
                c.took(&lane.lens[at..at + k]);
                at += k;
            }
            Ok(_) => {
                c.refused[DropReason::PortDown as usize] += (lane.n - at) as u64;
                return None;
            }
            Err(errno) => {
                let why = refusal(errno);
                if why == DropReason::NoBuffer {
                    c.refused[why as usize] += (lane.n - at) as u64;
                    return None;
                }
                let e = std::io::Error::from_raw_os_error(errno);
                tracing::debug!(port = id, "datagram refused: {e}");
                c.refused[why as usize] += 1;
                at += 1;
            }
        }
    }
    Some(at)
}

impl super::Port for VxlanPort {
    fn id(&self) -> PortId {
        self.id
    }

    fn caps(&self) -> Caps {
        // No offload: a datagram carries no metadata (see the module docs).
        Caps {
            receives: true,
            ..Caps::default()
        }
    }

    fn mtu(&self) -> Option<u16> {
        u16::try_from(self.underlay_mtu - OVERHEAD).ok()
    }

    fn tx_stats(&self) -> &PortStats {
        &self.stats
    }

    /// Out of line, as a kernel port's: a syscall's work.
    #[inline(never)]
    fn rx_burst(&mut self, max: usize, now: Instant, to: &mut impl Ingress) -> usize {
        let mut done = 0;
        if self.rx.at == self.rx.n {
            if !self.look
                && self
                    .last_look
                    .is_some_and(|l| now.saturating_duration_since(l) < TAP_LOOK)
            {
                return 0;
            }
            self.last_look = Some(now);
            done += self.read(max, now);
        }
        done + self.hand_out(max.saturating_sub(done), to)
    }

    fn tx_begin(&mut self, now: Instant, _hint: usize) -> bool {
        self.now = now;
        true
    }

    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        offer_each(pkts, |p| self.put(p))
    }

    fn tx_commit(&mut self) {
        self.flush();
    }

    /// Copies what the switch staged of the last `n` packets taken: that memory is reused
    /// before the commit.
    fn staged(&mut self, n: usize, part: Staged) {
        let taken = self.tx.taken;
        for k in taken - n.min(taken).min(MAX_BURST)..taken {
            if !self.detach(k, part) {
                return;
            }
        }
    }

    /// `Poll` while frames wait in their slots or the last read filled every slot; else it
    /// may sleep: epoll waits on the receiving socket (level-triggered).
    fn idle(&mut self, _now: Instant, settle: &mut Settle) {
        if self.look || self.rx.at < self.rx.n {
            settle.idle(Idle::Poll);
        }
    }

    fn arm(&mut self) -> Armed {
        if self.rx.at < self.rx.n {
            Armed::NotEmpty
        } else {
            Armed::Empty
        }
    }

    fn disarm(&mut self, slept: bool) {
        if slept {
            self.look = true;
        }
    }

    fn event(&mut self, _token: u16) {
        self.look = true;
    }
}

impl std::fmt::Display for VxlanPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.desc)
    }
}
