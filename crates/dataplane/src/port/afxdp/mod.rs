//! An `AF_XDP` port: an interface (a veth, a NIC) through pvnet's own XDP program and
//! sockets ([`crate::sys::xdp`]), past the kernel's socket buffers.
//!
//! Receiving: the receive ring's descriptors point at frames in the UMEM; each becomes a
//! [`Pkt`] in place (a 12-byte virtio-net header, all zero, written into the kernel's headroom
//! in front of the frame), and the switch copies it once, into its receiver. Descriptors the
//! switch makes wait stay on the receive ring, in order, for the next round (the kernel does
//! not reuse a slot until it is released). Frames go back to the fill ring as one batch per
//! burst; the kernel is woken for them only if it asked (`need_wakeup`).
//!
//! Transmitting: each packet is copied into a free transmit frame of the UMEM (the one copy
//! of the hop) and described on the transmit ring; the batch is published once at
//! [`Port::tx_commit`](super::Port::tx_commit) and the kernel kicked (one `sendto`, more only
//! while it says it has more: copy mode sends at most a batch of 32 per call) only when its
//! ring says it sleeps. Frames come back through the completion ring, reclaimed at the next
//! batch.
//!
//! Its MTU is the interface's (read again about once a second: [`super::mtu`]): within a
//! UMEM frame, or, where the kernel
//! and the driver have AF_XDP multi-buffer (`XDP_USE_SG`), within [`MAX_FRAGS`] of them (a
//! jumbo frame comes as several descriptors, each but the last marked `XDP_PKT_CONTD`, and
//! becomes one packet of several segments; one going out is cut into frames the same way).
//! The switch drops a longer frame as `too_big`, never cuts it.
//!
//! Offloads: the one piece of XDP metadata a driver gives that pvnet uses is the RX hash
//! (where the program could be bound to the device: [`crate::sys::xdp::bpf`]): it becomes the
//! packet's [`Pkt::hash`], so that steering onto a frontend's receive rings and a VXLAN
//! source port take the kernel's (a NIC's RSS) hash instead of hashing the headers again.
//! No checksum status exists in XDP metadata (Linux 6.18: hash, timestamp, VLAN tag), and a
//! frame is sent with none: the port offers no receive offload, so the switch completes
//! checksums and segments GSO packets in software before they reach it (counted as `sw_csum`,
//! `sw_gso`), as for any receiver without them.
//!
//! Queues: one socket per interface queue (`queues=N`), all polled by the shard the port is
//! on. Each packet goes out on the queue its flow hash picks (the packet's, as the RX hash
//! above, or its headers'): a flow stays on one queue, in order.
//!
//! When the interface goes away under the port, the kernel unbinds its sockets: the next
//! kick fails (`ENXIO`), the port logs it once, marks itself down (`up` 0 in `pvnet ctl
//! ports`), and the switch drops what it is sent as `port_down`. The rest of the switch runs
//! on.

use super::loan::Lending;
use super::mtu::MtuWatch;
use super::{offer_each, Ingress};
use crate::egress::{Egress, EgressConfig, HoldPolicy};
use crate::pkt::{read_head, Caps, Pkt, PortId, TxOut, EMPTY, MACS, MAX_BURST};
use crate::poll::plan::Settle;
use crate::poll::{Every, Idle};
use crate::stats::{bump, DropReason, PortStats};
use crate::sys::xdp::{
    data_addr, XdpDev, Xsk, FRAME, LEND_CHUNK, RX_FRAMES, TX_FRAMES, XDP_HEADROOM,
};
use pvnet_net::HDR_LEN;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::read_segs;
use virtq::Armed;
use virtq::Seg;

/// How long a packet waits in its sender for a transmit frame (the kernel returns them as it
/// sends: a ring's worth takes well under this).
const XDP_HOLD: HoldPolicy = HoldPolicy::Bounded(Duration::from_millis(1));

/// Most `sendto` kicks of one commit (each sends up to 32 frames in copy mode).
const MAX_KICKS: usize = 64;

/// Most UMEM frames of one packet with multi-buffer (a 9000-byte MTU takes 3 received, 3
/// sent); the kernel's own bound is 17.
pub const MAX_FRAGS: u32 = 5;

/// The port.
#[derive(Debug)]
pub struct AfXdpPort {
    id: PortId,
    stats: Arc<PortStats>,
    dev: XdpDev,
    egress: Egress,
    /// Each socket's transmit side, by queue.
    txq: Vec<TxQueue>,
    /// Which queue to read first next round (fairness between queues).
    next: usize,
    /// Packets were left on a receive ring (the switch made them wait).
    left: bool,
    /// The interface is gone (the sockets were unbound).
    down: bool,
    /// When to read the kernel's drop counts.
    kernel_drops: Every,
    /// The interface's MTU (read again about once a second), within what its UMEM frames
    /// hold: the switch drops what is longer as `too_big` ([`crate::pkt::fits_mtu`]).
    mtu: MtuWatch,
    /// Transmit frames the egress's DQL lets this round still put on the rings (unbounded
    /// without DQL), and the round's time for asking it again.
    budget: usize,
    now: Instant,
    /// Transmit frames the kernel completed since DQL was last told.
    completed: u32,
    /// Direct receive into a frontend's buffers, where the device lends ([`direct`]).
    direct: Option<direct::Direct>,
    /// Its sockets were rebuilt since the shard last looked ([`Self::take_rebuilt`]).
    rebuilt: bool,
    /// What the kernel dropped on sockets closed by a rebuild (counted on in `kernel_drops`).
    closed_drops: u64,
}

impl AfXdpPort {
    /// Wraps an opened device.
    pub fn new(id: PortId, stats: Arc<PortStats>, dev: XdpDev) -> Self {
        // A received frame's data starts behind the kernel's headroom, in each descriptor.
        let frames = if dev.multi_buffer() { MAX_FRAGS } else { 1 };
        let chunk = if dev.lends() { LEND_CHUNK } else { FRAME };
        let most = frames * (chunk - XDP_HEADROOM) - crate::pkt::MTU_OVERHEAD;
        let direct = dev.lends().then(|| direct::Direct {
            mapped: None,
            socks: dev.queues.iter().map(|_| direct::Lent::new()).collect(),
        });
        let mtu = MtuWatch::new(dev.name(), most);
        let txq = dev.queues.iter().map(|_| TxQueue::new()).collect();
        Self {
            id,
            stats,
            dev,
            egress: Egress::new(XDP_HOLD),
            txq,
            next: 0,
            left: false,
            down: false,
            kernel_drops: Every::new(super::kernel::KERNEL_DROPS_EVERY),
            mtu,
            budget: usize::MAX,
            now: Instant::now(),
            completed: 0,
            direct,
            rebuilt: false,
            closed_drops: 0,
        }
    }

    /// New egress settings: a queue (`qdisc`, `limit`, `bulk`) and DQL over the transmit
    /// frames, or none. What waited in the old queue is dropped, counted as `reconfigured`.
    /// The transmit rings and their frames are the device queue, and the completion ring
    /// says when the kernel (a NIC's driver, after its DMA) is done with each frame: the
    /// completions Linux's BQL learns from, so `dql` applies as it does to a NIC's queue
    /// (Linux's algorithm alone: no pace cap, which is for a virtio receiver's bursts).
    pub(crate) fn set_egress(&mut self, e: EgressConfig) {
        self.egress.empty(&self.stats, DropReason::Reconfigured);
        let e = EgressConfig {
            hold: XDP_HOLD,
            dql_target: Duration::ZERO,
            ..e
        };
        self.egress = Egress::with(e, crate::egress::DQL_MIN_BUFFERS);
        // The frames in flight now were put before the limit existed: it starts from them.
        self.egress.used(self.in_flight());
        self.completed = 0;
        self.budget = usize::MAX;
        tracing::info!(port = self.id, egress = ?e, "egress settings changed");
    }

    /// Transmit frames on a ring or in the kernel's hands, on every queue.
    fn in_flight(&self) -> u32 {
        let all = TX_FRAMES as usize * self.txq.len();
        let free: usize = self.txq.iter().map(|t| t.free.len()).sum();
        u32::try_from(all - all.min(free)).unwrap_or(u32::MAX)
    }

    /// Asks the egress's DQL how many frames this round may still put: the completions
    /// taken back since the last ask are credited first.
    fn ask_budget(&mut self) {
        let fresh = std::mem::take(&mut self.completed);
        self.budget = self.egress.cap_completed(fresh, self.now);
    }

    /// The sockets' fds, to wait on them (readable: a receive ring has frames).
    pub fn fds(&self) -> Vec<i32> {
        self.dev.queues.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Whether its sockets were rebuilt (direct receive) since the last call: their fds
    /// are new.
    pub(crate) fn take_rebuilt(&mut self) -> bool {
        std::mem::take(&mut self.rebuilt)
    }

    /// The device (its mode, its queues).
    pub fn dev(&self) -> &XdpDev {
        &self.dev
    }

    /// The frames the kernel dropped before the port saw them, on every socket: no free frame
    /// on the fill ring (the port fell behind returning them) or no room on the receive ring.
    /// A frame dropped for want of a fill frame counts in `rx_dropped` too, so it is
    /// `rx_dropped + rx_ring_full`. Into `kernel_drops`, about once a second (a `getsockopt`
    /// per socket).
    fn count_kernel_drops(&mut self, now: Instant) {
        if !self.kernel_drops.due(now) {
            return;
        }
        let n: u64 = self
            .dev
            .queues
            .iter()
            .filter_map(|x| x.kernel_stats().ok())
            .map(|k| k.rx_dropped + k.rx_ring_full)
            .sum();
        self.stats
            .kernel_drops
            .store(n + self.closed_drops, Ordering::Relaxed);
    }

    /// The interface went away: said once, the port marked down.
    fn gone(&mut self, e: &std::io::Error) {
        if !self.down {
            tracing::error!(
                port = self.id,
                ifname = self.dev.name(),
                "AF_XDP socket unbound ({e}): the interface is gone; the port is down"
            );
            self.down = true;
            self.stats.up.store(0, Ordering::Relaxed);
        }
    }

    /// Takes back the transmit frames the kernel is done with, on every queue.
    fn reclaim(&mut self) {
        for (x, t) in self.dev.queues.iter_mut().zip(&mut self.txq) {
            let n = x.comp.ready(TX_FRAMES);
            for k in 0..n {
                t.free.push(x.comp.get(k));
            }
            if n > 0 {
                x.comp.release(n);
                self.completed = self.completed.wrapping_add(n);
            }
        }
    }

    /// Publishes each queue's transmit batch and wakes the kernel where it sleeps.
    fn flush(&mut self) {
        for q in 0..self.txq.len() {
            self.flush_queue(q);
        }
    }

    /// Publishes queue `q`'s transmit batch and wakes the kernel if it sleeps.
    fn flush_queue(&mut self, q: usize) {
        let (n, bytes, frames) = std::mem::take(&mut self.txq[q].batch);
        if n == 0 {
            return;
        }
        self.dev.queues[q].tx.submit();
        self.egress.used(frames);
        match self.kick(q) {
            Ok(()) => {
                bump(&self.stats.tx_packets, n);
                bump(&self.stats.tx_bytes, bytes);
            }
            Err(e) => {
                // Nothing of the batch goes out any more.
                bump(&self.stats.drops[DropReason::PortDown as usize], n);
                self.gone(&e);
            }
        }
    }

    /// Wakes the kernel to send what queue `q`'s transmit ring holds, if it sleeps: again
    /// while it says it has more (copy mode sends up to 32 frames a call), at most
    /// [`MAX_KICKS`] times; what is still left is kicked again from
    /// [`Port::idle`](super::Port::idle).
    fn kick(&mut self, q: usize) -> std::io::Result<()> {
        let x = &mut self.dev.queues[q];
        let t = &mut self.txq[q];
        t.unsent = false;
        if !x.tx.needs_wakeup() {
            return Ok(());
        }
        for _ in 0..MAX_KICKS {
            bump(&self.stats.syscalls, 1);
            if !x.kick_tx()? || x.tx.pending() == 0 {
                return Ok(());
            }
        }
        t.unsent = true;
        Ok(())
    }

    /// The queue a packet goes out on: one flow always on one (its order kept), flows spread
    /// over all of them by their hash (the packet's, or its headers'), as Linux picks a
    /// transmit queue by the socket buffer's hash.
    #[inline]
    fn queue_of(&self, pkt: &Pkt<'_>) -> usize {
        let n = self.txq.len();
        if n == 1 {
            return 0;
        }
        let h = if pkt.hash != 0 {
            u64::from(pkt.hash)
        } else {
            crate::pkt::flow_hash_of(pkt)
        };
        // Multiply-shift onto 0..n (no division).
        (((h & 0xffff_ffff) * n as u64) >> 32) as usize
    }

    /// Copies one packet into free transmit frames of its queue (one, or with multi-buffer as
    /// many as it takes, each but the last marked `XDP_PKT_CONTD`) and describes them on the
    /// ring.
    fn put(&mut self, pkt: &Pkt<'_>) -> TxOut {
        let len = pkt.frame_len();
        let chunk = self.dev.queues.first().map_or(FRAME, |x| x.umem.chunk());
        let frames = len.div_ceil(chunk).max(1);
        let most = if self.dev.multi_buffer() {
            MAX_FRAGS
        } else {
            1
        };
        if frames > most {
            // Past the MTU the switch already dropped it; the UMEM frames are the last bound.
            return TxOut::Dropped(DropReason::TooBig);
        }
        let want = frames as usize;
        if self.budget < want {
            // The limit is reached as far as this round knew: what the kernel completed
            // meanwhile counts (copy mode completes at the kick; a NIC after its DMA).
            self.flush();
            self.reclaim();
            self.ask_budget();
            if self.budget < want {
                return TxOut::NoRoom;
            }
        }
        let q = self.queue_of(pkt);
        if self.txq[q].free.len() < want || self.dev.queues[q].tx.free(frames) < frames {
            // The kernel may have sent some since the batch began.
            self.flush_queue(q);
            self.reclaim();
        }
        let (x, t) = (&mut self.dev.queues[q], &mut self.txq[q]);
        if x.tx.free(frames) < frames || t.free.len() < want {
            return TxOut::NoRoom;
        }
        let base = x.umem.base();
        let mut at = 0u32;
        for f in 0..frames {
            let Some(addr) = t.free.pop() else {
                return TxOut::NoRoom;
            };
            let n = (len - at).min(chunk);
            // SAFETY: `addr` is a transmit frame of this UMEM (FRAME bytes within it) that is
            // free: neither on the transmit ring nor in the kernel's hands, so nothing else
            // reads or writes it; `n` <= chunk <= FRAME.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(
                    base.as_ptr().add(usize::try_from(addr).unwrap_or(0)),
                    n as usize,
                )
            };
            let k = read_segs(pkt.segs, pkt.hdr_len + at, dst);
            at += u32::try_from(k).unwrap_or(0);
            x.tx.push(libc::xdp_desc {
                addr,
                len: u32::try_from(k).unwrap_or(0),
                options: if f + 1 < frames {
                    libc::XDP_PKT_CONTD
                } else {
                    0
                },
            });
        }
        self.egress.sent();
        self.budget -= want;
        t.batch.0 += 1;
        t.batch.1 += u64::from(at);
        t.batch.2 += frames;
        TxOut::Sent
    }

    /// Hands out up to `max` packets of queue `q`'s receive ring, frames in own frames and
    /// in loans (direct receive) in turn; returns the packets taken and whether some were
    /// left waiting.
    fn rx_queue(&mut self, q: usize, max: usize, to: &mut impl Ingress) -> (usize, bool) {
        let mut done = 0;
        loop {
            let (k, left, lent) = self.rx_own(q, max - done, to);
            done += k;
            if left || !lent {
                return (done, left);
            }
            let (k, wait) = self.take_lent(q, max - done, to);
            done += k;
            if wait || k == 0 || done >= max {
                return (done, wait || done >= max);
            }
        }
    }

    /// Hands out up to `max` packets in own frames at the front of queue `q`'s receive ring;
    /// returns the packets taken, whether some were left waiting, and whether it stopped at
    /// a frame in a loan.
    fn rx_own(&mut self, q: usize, max: usize, to: &mut impl Ingress) -> (usize, bool, bool) {
        let stats = &*self.stats;
        let meta = self.dev.meta();
        let x = &mut self.dev.queues[q];
        let mut lent = self.direct.as_mut().and_then(|d| d.socks.get_mut(q));
        let own = lent.as_ref().map_or(usize::MAX, |_| x.umem.own_len());
        let mut done = 0;
        let mut at_loan = false;
        while done < max {
            // Descriptors: a packet is one, or with multi-buffer up to MAX_FRAGS.
            let want = u32::try_from((max - done).min(MAX_BURST)).unwrap_or(0);
            let n = x.rx.ready(want);
            if n == 0 {
                break;
            }
            let base = x.umem.base();
            let size = x.umem.len();
            let mut segs: [Seg<'_>; MAX_BURST] = std::array::from_fn(|_| Seg::from_mut(&mut []));
            let mut pkts = [EMPTY; MAX_BURST];
            // Each packet's descriptors: the first's index and how many.
            let mut spans = [(0u32, 0u32); MAX_BURST];
            let (mut m, mut k) = (0, 0u32);
            let mut bad = None;
            while k < n {
                match gather(
                    (base, size, own),
                    &x.rx,
                    (k, n),
                    meta.vlan,
                    &mut segs[k as usize..n as usize],
                ) {
                    Gather::Packet(len, descs, hash) => {
                        let first = [segs[k as usize]];
                        let Some((hdr, macs)) = read_head(&first, HDR_LEN) else {
                            bad = Some(descs);
                            break;
                        };
                        spans[m] = (k, descs);
                        pkts[m] = Pkt {
                            segs: &[],
                            len: len + HDR_LEN,
                            hdr_len: HDR_LEN,
                            hdr,
                            macs,
                            // The kernel's hash, from the program (0 where it has none).
                            hash: if meta.hash { hash } else { 0 },
                            vlan: 0,
                        };
                        m += 1;
                        k += descs;
                    }
                    Gather::Bad(descs) => {
                        bad = Some(descs);
                        break;
                    }
                    // The rest of a packet is past `want`: the next batch.
                    Gather::Partial => break,
                    Gather::Lent => {
                        at_loan = true;
                        break;
                    }
                }
            }
            for (p, &(k, c)) in pkts.iter_mut().zip(spans.iter()).take(m) {
                p.segs = &segs[k as usize..(k + c) as usize];
            }
            let taken = if m > 0 {
                to.burst(&pkts[..m], stats)
            } else {
                0
            };
            let bytes: u64 = pkts[..taken].iter().map(|p| u64::from(p.frame_len())).sum();
            bump(&stats.rx_packets, taken as u64);
            bump(&stats.rx_bytes, bytes);
            let mut used = spans[..taken].iter().map(|s| s.1).sum::<u32>();
            match bad {
                Some(descs) if m == 0 => {
                    // The first packet is not one: dropped in its place.
                    bump(&stats.drops[DropReason::Invalid as usize], 1);
                    bump(&stats.rx_packets, 1);
                    used = descs;
                    done += 1;
                }
                None if m == 0 => return (done, !at_loan, at_loan),
                _ => {}
            }
            done += taken;
            give_back(x, lent.as_deref_mut(), used, stats);
            if taken < m {
                return (done, true, false);
            }
            if at_loan {
                return (done, false, true);
            }
        }
        (done, false, false)
    }
}

/// Gives the own frames of the first `used` slots of `x`'s receive ring back: to the kernel
/// (the fill ring holds every receive frame, so it has room), or with direct receive to the
/// spare ones (the fill ring takes them back while loans are short), then the slots (our
/// reads of them are done).
fn give_back(x: &mut Xsk, lent: Option<&mut direct::Lent>, used: u32, stats: &PortStats) {
    match lent {
        Some(l) => {
            for d in 0..used {
                l.own_back(data_addr(x.rx.get(d).addr) & !u64::from(FRAME - 1));
            }
            x.rx.release(used);
        }
        None => {
            for d in 0..used {
                x.fill
                    .push(data_addr(x.rx.get(d).addr) & !u64::from(FRAME - 1));
            }
            x.rx.release(used);
            x.fill.submit();
            if x.fill.needs_wakeup() {
                bump(&stats.syscalls, 1);
                let _ = x.kick_rx();
            }
        }
    }
}

/// One socket's transmit side.
#[derive(Debug)]
struct TxQueue {
    /// Its free transmit frames (UMEM addresses).
    free: Vec<u64>,
    /// Packets, bytes and frames put on its transmit ring and not yet published.
    batch: (u64, u64, u32),
    /// Frames are left on its transmit ring after the kicks of a commit.
    unsent: bool,
}

impl TxQueue {
    /// Every transmit frame of a fresh UMEM free.
    fn new() -> Self {
        Self {
            free: (RX_FRAMES..RX_FRAMES + TX_FRAMES)
                .rev()
                .map(|k| u64::from(k) * u64::from(FRAME))
                .collect(),
            batch: (0, 0, 0),
            unsent: false,
        }
    }
}

/// What [`gather`] found at a receive ring's slot.
enum Gather {
    /// A whole packet: its frame bytes (with a tag put back), its descriptors, and the RX
    /// hash from its metadata (where the program put it there).
    Packet(u32, u32, u32),
    /// Descriptors that are no packet (out of the UMEM, too short, too many): this many.
    Bad(u32),
    /// A frame in a loan (direct receive): [`AfXdpPort::take_lent`]'s.
    Lent,
    /// Its last descriptor is not among those ready yet.
    Partial,
}

/// Gathers the packet at slot `k` of `rx` (of `n` ready) into `segs`: one descriptor, or a
/// run of them each marked `XDP_PKT_CONTD` but the last (multi-buffer), at most
/// [`MAX_FRAGS`]. The first segment gets the virtio-net header in front, and the VLAN tag
/// from the metadata back in if `vlan` ([`frame_seg`]).
fn gather<'m>(
    (base, size, own): (NonNull<u8>, usize, usize),
    rx: &crate::sys::xdp::ring::Ring<libc::xdp_desc>,
    (k, n): (u32, u32),
    vlan: bool,
    segs: &mut [Seg<'m>],
) -> Gather {
    let (mut len, mut hash) = (0u32, 0u32);
    for c in 0..MAX_FRAGS {
        if k + c >= n {
            return Gather::Partial;
        }
        let d = rx.get(k + c);
        if c == 0 && data_addr(d.addr) >= own as u64 {
            return Gather::Lent;
        }
        let seg = if c == 0 {
            frame_seg(base, size, d, vlan, &mut hash)
        } else {
            frag_seg(base, size, d)
        };
        let Some(seg) = seg else {
            return Gather::Bad(c + 1);
        };
        len += seg.len() - if c == 0 { HDR_LEN } else { 0 };
        segs[c as usize] = seg;
        if d.options & libc::XDP_PKT_CONTD == 0 {
            return if len < MACS + 2 {
                Gather::Bad(c + 1)
            } else {
                Gather::Packet(len, c + 1, hash)
            };
        }
    }
    Gather::Bad(MAX_FRAGS)
}

impl Drop for AfXdpPort {
    /// Logs what the kernel dropped before the port saw it (its rings full or its fill ring
    /// empty: `XDP_STATISTICS`), socket by socket (the port's `kernel_drops` has their sum).
    fn drop(&mut self) {
        for x in &self.dev.queues {
            closing(self.id, x);
        }
    }
}

/// Logs what the kernel counted on socket `x` of port `id`, which closes; returns its drops
/// (`rx_dropped + rx_ring_full`).
fn closing(id: PortId, x: &Xsk) -> u64 {
    let Ok(k) = x.kernel_stats() else {
        return 0;
    };
    tracing::info!(
        port = id,
        queue = x.queue,
        rx_dropped = k.rx_dropped,
        rx_ring_full = k.rx_ring_full,
        fill_ring_empty = k.rx_fill_ring_empty_descs,
        rx_invalid = k.rx_invalid_descs,
        tx_invalid = k.tx_invalid_descs,
        "AF_XDP socket closed: the kernel's own counts"
    );
    k.rx_dropped + k.rx_ring_full
}

/// The segment of a received packet's first frame with 12 bytes in front of it for the
/// virtio-net header (written, all zero: no offload metadata), if the descriptor lies within
/// one frame of the UMEM with that much headroom (the kernel leaves 256 bytes).
///
/// The 12 bytes in front of the frame are first read as metadata
/// ([`crate::sys::xdp::bpf::META_LEN`]): the RX hash goes to `hash`, and, if `vlan`, a VLAN
/// tag the kernel or the NIC took out of the frame goes back in behind its addresses (the
/// header and the addresses move 4 bytes to the front, into the headroom: 24 bytes moved
/// whatever the frame's length). Where the program put no metadata they are zero: the kernel
/// writes nothing in front of a frame but metadata, the UMEM starts zeroed, and each frame
/// always lands at the same offset, behind the header this writes.
#[inline]
fn frame_seg<'m>(
    base: NonNull<u8>,
    size: usize,
    d: libc::xdp_desc,
    vlan: bool,
    hash: &mut u32,
) -> Option<Seg<'m>> {
    const TAG: u32 = 4;
    let addr = data_addr(d.addr);
    let off = addr % u64::from(FRAME);
    let hdr = u64::from(HDR_LEN);
    if off < hdr + u64::from(TAG)
        || off + u64::from(d.len) > u64::from(FRAME)
        || addr + u64::from(d.len) > size as u64
        || d.len < MACS
        || (d.len < MACS + 2 && d.options & libc::XDP_PKT_CONTD == 0)
    {
        return None;
    }
    let start = usize::try_from(addr - hdr).ok()?;
    let len = d.len + HDR_LEN;
    let hl = HDR_LEN as usize;
    // SAFETY: `start - TAG..start + len` lies within one frame of the UMEM (checked above), a
    // frame the kernel handed over on the receive ring and does not touch until the
    // descriptor is released; the UMEM outlives the burst the segment is used in.
    unsafe {
        let p = base.as_ptr().add(start);
        let meta = p.cast::<[u8; 12]>().read();
        *hash = u32::from_ne_bytes([meta[4], meta[5], meta[6], meta[7]]);
        let tpid = [meta[0], meta[1]];
        if vlan && tpid != [0, 0] {
            let q = p.sub(TAG as usize);
            std::ptr::copy(p.add(hl), q.add(hl), MACS as usize);
            let tci = u16::from_ne_bytes([meta[2], meta[3]]).to_be_bytes();
            let tag = [tpid[0], tpid[1], tci[0], tci[1]];
            std::ptr::copy_nonoverlapping(tag.as_ptr(), q.add(hl + MACS as usize), TAG as usize);
            std::ptr::write_bytes(q, 0, hl);
            return Some(Seg::from_raw(NonNull::new_unchecked(q), len + TAG));
        }
        std::ptr::write_bytes(p, 0, hl);
        Some(Seg::from_raw(NonNull::new_unchecked(p), len))
    }
}

/// The segment of a multi-buffer packet's later frame, as it is, if the descriptor lies within
/// one frame of the UMEM.
#[inline]
fn frag_seg<'m>(base: NonNull<u8>, size: usize, d: libc::xdp_desc) -> Option<Seg<'m>> {
    let addr = data_addr(d.addr);
    let off = addr % u64::from(FRAME);
    if off + u64::from(d.len) > u64::from(FRAME) || addr + u64::from(d.len) > size as u64 {
        return None;
    }
    let start = usize::try_from(addr).ok()?;
    // SAFETY: as for `frame_seg`: within one frame the kernel handed over and does not touch
    // until the descriptor is released.
    unsafe {
        let p = base.as_ptr().add(start);
        Some(Seg::from_raw(NonNull::new_unchecked(p), d.len))
    }
}

impl super::Port for AfXdpPort {
    fn id(&self) -> PortId {
        self.id
    }

    fn mtu(&self) -> Option<u16> {
        self.mtu.get()
    }

    fn caps(&self) -> Caps {
        // No receive offload: XDP frames carry no metadata (see the module docs).
        Caps {
            receives: true,
            ..Caps::default()
        }
    }

    fn tx_stats(&self) -> &PortStats {
        &self.stats
    }

    fn egress(&mut self) -> Option<&mut Egress> {
        Some(&mut self.egress)
    }

    fn backlogged(&self) -> bool {
        self.egress.backlogged()
    }

    #[inline(never)]
    fn rx_burst(&mut self, max: usize, _now: Instant, to: &mut impl Ingress) -> usize {
        let lending = match self.direct {
            Some(_) => self.direct_round(to),
            None => Lending::No,
        };
        let n = self.dev.queues.len();
        let mut done = 0;
        self.left = false;
        for i in 0..n {
            let q = (self.next + i) % n;
            let (k, left) = self.rx_queue(q, max - done, to);
            if self.direct.is_some() {
                self.refill(q, k, lending, to);
            }
            done += k;
            if left {
                self.left = true;
                self.next = q;
                return done;
            }
            if done >= max {
                self.left = true;
                break;
            }
        }
        self.next = (self.next + 1) % n.max(1);
        done
    }

    fn tx_begin(&mut self, now: Instant, _hint: usize) -> bool {
        if self.down {
            return false;
        }
        self.mtu.poll(now, self.id);
        self.reclaim();
        self.now = now;
        self.ask_budget();
        true
    }

    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        offer_each(pkts, |p| self.put(p))
    }

    fn tx_commit(&mut self) {
        self.flush();
    }

    /// `Poll` while frames wait on a receive ring, a sender waits for frames, or frames
    /// wait on the transmit ring (kicked again); else it may sleep: epoll waits on the
    /// sockets (readable when a receive ring has frames).
    fn idle(&mut self, now: Instant, settle: &mut Settle) {
        self.mtu.poll(now, self.id);
        self.count_kernel_drops(now);
        self.egress.new_round();
        for q in 0..self.txq.len() {
            if self.txq[q].unsent && !self.down {
                if let Err(e) = self.kick(q) {
                    self.gone(&e);
                }
            }
        }
        if let Some(l) = self.egress.dql_limit() {
            self.stats.dql_limit.store(u64::from(l), Ordering::Relaxed);
        }
        let unsent = self.txq.iter().any(|t| t.unsent);
        let lending = self.direct.as_ref().is_some_and(direct::Direct::topping_up);
        if self.left || unsent || self.egress.blocked() || lending {
            settle.idle(Idle::Poll);
        }
    }

    /// Nothing to arm (the sockets wake epoll): re-checks the receive rings.
    fn arm(&mut self) -> Armed {
        if self.dev.queues.iter_mut().any(|x| x.rx.ready(1) > 0) {
            Armed::NotEmpty
        } else {
            Armed::Empty
        }
    }

    fn disarm(&mut self, _slept: bool) {}

    fn event(&mut self, _token: u16) {}
}

mod direct;

#[cfg(test)]
mod tests;
