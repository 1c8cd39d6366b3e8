//! A vhost-user port: a frontend's queue pairs, as the device sees them.
//!
//! Per batch: one `available()` load per ring, chains parsed once (every packet's first lines
//! prefetched), used entries written into the ring and published with one store, one call
//! decision per ring. Receiving (the frontend's transmit ring) hands out packets that borrow
//! the frontend's buffers; transmitting (its receive ring) copies straight into its buffers,
//! merging them when `VIRTIO_NET_F_MRG_RXBUF` was negotiated. The header length follows the
//! negotiated features (10 or 12 bytes); a packet whose header differs in length or must lose
//! metadata the frontend did not negotiate gets a header written for it, then its frame.
//!
//! Queue pairs: pair `k` is queues `2k` (receive) and `2k + 1` (transmit). A port holds the
//! pairs its shard owns, each with its own counters (one writer each) and its own egress
//! queue. Every pair the frontend enabled is serviced: its transmit ring is read each round,
//! and what the switch sends to the port is steered to a receive ring by a flow hash
//! (addresses, protocol and ports: one flow stays on one ring, in order), as a multiqueue
//! NIC's RSS would. With one receive ring running nothing is hashed. The driver picks how
//! many pairs it uses (`VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET` on its control queue); over
//! vhost-user the frontend keeps that queue and enables or disables the rings
//! (`SET_VRING_ENABLE`): the steering follows the rings that run.

use super::{offer_each, read_head, Caps, Ingress, Pkt, PortId, TxOut, MACS, RX_OFFLOADS};
use crate::egress::{Egress, EgressConfig};
use crate::poll::plan::{Calls, Settle};
use crate::poll::{Policy, Poller, WakeCost};
use crate::stats::{bump, DropReason, PortStats};
use pvnet_net::{hdr_len, VnetHdr, HDR_LEN, NUM_BUFFERS_OFF};
use pvnet_vhost::backend::StartedQueue;
use pvnet_vhost::eventfd::Notifier;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::info;
use virtq::event::Armed;
use virtq::mem::{copy_segs, write_segs, Prefetch};
use virtq::queue::FormatQueue;
use virtq::{Chain, DeviceQueue, MemTable, Seg};

/// Most receive chains one packet may span (64 KiB over the smallest sane buffers).
pub const MAX_MERGE: usize = 64;
/// Most receive rings the flow hash spreads a port's packets over (pairs past it still send
/// and are sent to only if an earlier one stops).
pub const MAX_STEER: usize = 64;

/// A running ring and its notifiers.
#[derive(Debug)]
pub struct QueueSlot {
    /// The ring.
    pub q: DeviceQueue,
    /// Kick fd (None: the frontend polls).
    pub kick: Option<Notifier>,
    call: Option<Notifier>,
    err: Option<Notifier>,
    /// Stopped for a violation: no longer processed.
    pub broken: bool,
    /// Neither stopped nor parked: the ring may be touched (one flag for the per-packet
    /// checks; `broken` and `lost` say why not).
    live: bool,
    /// vhost-user index.
    pub index: u16,
    /// When to poll it and when to arm it.
    pub poll: Poller,
    /// It had work in the current round.
    pub worked: bool,
    /// A transmit-completion call held back (interrupt coalescing).
    calls: Calls,
    /// A call went out since the shard last looked (`take_called`).
    called: bool,
    /// Under an IOMMU: where to ask for missing translations.
    iotlb: Option<Arc<pvnet_vhost::iotlb::BackendChannel>>,
    /// The translation the queue waits for, since when, and when it last asked.
    waiting: Option<Waiting>,
    /// Under an IOMMU: the ring's own memory was invalidated while it ran (a vIOMMU's
    /// domain-wide flush takes every translation, the rings' too). The ring is not touched
    /// until a snapshot translates it again; it is asked for meanwhile, within the miss bound.
    lost: Option<LostRing>,
}

/// A translation asked of the frontend (an IOTLB miss): asked again every
/// [`IOTLB_MISS_RETRY`], given up once [`IOTLB_MISS_BOUND`] has passed since the wait began.
#[derive(Debug, Clone, Copy)]
struct Asked {
    addr: u64,
    perm: virtq::Perm,
    since: Instant,
    asked: Instant,
}

impl Asked {
    /// Asks for `addr` now, in a wait that began at `since`.
    fn now(
        ch: &pvnet_vhost::iotlb::BackendChannel,
        stats: &PortStats,
        addr: u64,
        perm: virtq::Perm,
        since: Instant,
        now: Instant,
    ) -> Self {
        ch.miss(addr, perm);
        bump(&stats.iotlb_misses, 1);
        Self {
            addr,
            perm,
            since,
            asked: now,
        }
    }

    /// Within the bound: asks again if it is due, and returns true; false once the bound has
    /// passed.
    fn keep(
        &mut self,
        ch: &pvnet_vhost::iotlb::BackendChannel,
        stats: &PortStats,
        now: Instant,
    ) -> bool {
        if now.saturating_duration_since(self.since) > IOTLB_MISS_BOUND {
            return false;
        }
        if now.saturating_duration_since(self.asked) > IOTLB_MISS_RETRY {
            *self = Self::now(ch, stats, self.addr, self.perm, self.since, now);
        }
        true
    }
}

/// A running ring whose own translation was invalidated: what is asked for again.
#[derive(Debug, Clone, Copy)]
struct LostRing {
    ask: Asked,
    /// The ring part's length (for the error if it is never granted again).
    len: u64,
}

/// A queue waiting for a translation (an IOTLB miss).
#[derive(Debug, Clone, Copy)]
struct Waiting {
    ask: Asked,
    /// The last time the queue met this miss: a miss of the same address after a quiet gap
    /// is a new wait (the queue made progress in between; the success path keeps no state).
    last: Instant,
}

/// A miss of the same address this long after the last one starts a new wait.
const IOTLB_MISS_GAP: Duration = Duration::from_millis(100);

/// How long a queue waits for the frontend to answer an IOTLB miss before it is stopped
/// (QEMU answers in microseconds; a frontend that never does must not hold the queue).
pub const IOTLB_MISS_BOUND: Duration = Duration::from_secs(1);
/// How often a miss still unanswered is asked again.
const IOTLB_MISS_RETRY: Duration = Duration::from_millis(20);

impl QueueSlot {
    /// Wraps a started queue, polled by `policy`.
    pub fn new(s: StartedQueue, policy: Policy, wake: WakeCost) -> Self {
        Self {
            q: s.queue,
            kick: s.kick,
            call: s.call,
            err: s.err,
            broken: false,
            live: true,
            index: s.index,
            poll: Poller::new(policy, wake),
            worked: false,
            calls: Calls::default(),
            called: false,
            iotlb: s.iotlb,
            waiting: None,
            lost: None,
        }
    }

    /// Whether it is the frontend's transmit ring (the device reads it).
    #[inline]
    fn is_tx(&self) -> bool {
        self.index % 2 == 1
    }

    /// Stops the queue for a violation: logged, counted, reported on the err fd. The process
    /// and every other queue go on. A retryable error (a translation not there yet) consumed
    /// nothing and stops nothing.
    pub fn fail(&mut self, port: PortId, stats: &PortStats, e: virtq::Error) {
        let e = match e {
            virtq::Error::TranslationMiss { addr, perm, .. } => {
                match self.wait_for_grant(port, stats, addr, perm) {
                    Ok(()) => return,
                    Err(e) => e,
                }
            }
            e => e,
        };
        if let (virtq::Error::AccessDenied { addr, perm, .. }, Some(ch)) = (&e, &self.iotlb) {
            ch.access_fail(*addr, *perm);
        }
        if !self.broken {
            pvnet_vhost::peer_error!(stats.log, port, queue = self.index, "queue stopped: {e}");
            self.broken = true;
            self.live = false;
            bump(&stats.queue_errors, 1);
            *stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("queue {}: {e}", self.index));
            if let Some(err) = &self.err {
                let _ = err.signal();
            }
        }
    }

    /// A translation is missing: ask the frontend (once, then every [`IOTLB_MISS_RETRY`]),
    /// and wait; the queue consumed nothing and is polled again. Past [`IOTLB_MISS_BOUND`]
    /// without an answer, or without an IOMMU to ask, the miss is an error that stops it.
    #[cold]
    fn wait_for_grant(
        &mut self,
        port: PortId,
        stats: &PortStats,
        addr: u64,
        perm: virtq::Perm,
    ) -> Result<(), virtq::Error> {
        let now = Instant::now();
        let unanswered = virtq::Error::IotlbMissUnanswered {
            addr,
            waited_ms: IOTLB_MISS_BOUND.as_millis().try_into().unwrap_or(u32::MAX),
        };
        let Some(ch) = &self.iotlb else {
            return Err(unanswered);
        };
        let mut ask = match self.waiting {
            Some(w) if w.ask.addr == addr && now.duration_since(w.last) < IOTLB_MISS_GAP => w.ask,
            _ => {
                tracing::debug!(
                    port,
                    queue = self.index,
                    addr = format_args!("{addr:#x}"),
                    "IOTLB miss"
                );
                Asked::now(ch, stats, addr, perm, now, now)
            }
        };
        if !ask.keep(ch, stats, now) {
            self.waiting = None;
            return Err(unanswered);
        }
        self.waiting = Some(Waiting { ask, last: now });
        Ok(())
    }

    /// Publishes used entries; calls the frontend if it asked (a transmit-completion call may
    /// be held back, see [`Calls`]).
    #[inline]
    pub fn publish(&mut self, stats: &PortStats) {
        let batches = if self.is_tx() {
            &stats.rx_batches
        } else {
            &stats.tx_batches
        };
        bump(batches, u64::from(self.q.unpublished() > 0));
        let ignored = self.q.take_write_ignored();
        if ignored != 0 {
            write_flags_ignored(self.index, stats, ignored);
        }
        if self.q.logging() && !self.is_tx() {
            // Live migration: the buffers this publish hands back had their pages marked.
            bump(&stats.dirty_logged, u64::from(self.q.unpublished()));
        }
        if self.q.publish() {
            // A driver that asked at its last seen entry with at least half its ring in
            // flight (or without EVENT_IDX, where we cannot tell) may be out of descriptors
            // and waiting: no coalescing for it.
            let waiting = self
                .q
                .driver_backlog()
                .is_none_or(|b| b >= self.q.size() / 2);
            if self.is_tx() && !waiting {
                self.calls.owe();
            } else {
                self.signal_call(stats);
            }
        }
    }

    fn signal_call(&mut self, stats: &PortStats) {
        if let Some(c) = &self.call {
            if c.signal().is_ok() {
                bump(&stats.calls, 1);
                self.called = true;
            }
        }
    }

    /// Whether a call went out since the last look.
    fn take_called(&mut self) -> bool {
        std::mem::take(&mut self.called)
    }

    /// The slot if it is running and not stopped for a violation.
    #[inline]
    pub fn usable(s: &mut Option<QueueSlot>) -> Option<&mut QueueSlot> {
        s.as_mut().filter(|s| s.live)
    }

    /// Switches the ring to `mem`. Under an IOMMU a ring whose own memory `mem` no longer
    /// translates is parked, not stopped: an invalidation drops cached translations, it does
    /// not forbid the device to ask again (QEMU's intel-iommu sends a guest's domain-wide
    /// flush, Linux's lazy mode, as an invalidation of everything). The ring then waits,
    /// untouched, for a grant that covers it again, asked like any miss and within the same
    /// bound ([`Self::check_lost`]).
    fn set_mem(&mut self, port: PortId, stats: &PortStats, mem: &Arc<MemTable>, now: Instant) {
        if self.broken {
            return;
        }
        // A miss this table answers ends its wait: the same address missed again later (a
        // vIOMMU that flushes everything every few milliseconds, Linux's lazy mode, takes it
        // again) is a new miss with a bound of its own, not the old wait going on.
        if let Some(Waiting { ask, .. }) = self.waiting {
            if virtq::xlate::Translate::translate(&**mem, ask.addr, ask.perm, &mut 0).is_ok() {
                self.waiting = None;
                self.worked = true; // polled again before any sleep
            }
        }
        match self.q.set_mem(mem.clone()) {
            Ok(()) => {
                if let Some(l) = self.lost.take() {
                    self.live = true;
                    tracing::debug!(
                        port,
                        queue = self.index,
                        addr = format_args!("{:#x}", l.ask.addr),
                        waited_us = now.saturating_duration_since(l.ask.since).as_micros(),
                        "ring translated again: the queue goes on"
                    );
                    // Work may have arrived meanwhile, and no kick says so.
                    self.worked = true;
                }
            }
            Err(virtq::Error::TranslationMiss { addr, len, perm }) => match &self.iotlb {
                Some(ch) => {
                    // The first untranslated byte: a ring spans pages, and QEMU answers a
                    // miss with one page, so what is asked moves on as grants arrive (the
                    // bound counts from the first).
                    let since = match self.lost {
                        Some(l) if l.ask.addr == addr => return,
                        Some(l) => l.ask.since,
                        None => {
                            // Every few milliseconds under a lazy guest: counted, not logged.
                            tracing::debug!(port, queue = self.index,
                                addr = format_args!("{addr:#x}"), len,
                                "ring memory invalidated while the queue runs: parked, asking for it");
                            bump(&stats.rings_parked, 1);
                            now
                        }
                    };
                    self.lost = Some(LostRing {
                        ask: Asked::now(ch, stats, addr, perm, since, now),
                        len,
                    });
                    self.live = false;
                }
                None => self.fail(port, stats, virtq::Error::RingRevoked { addr, len }),
            },
            Err(e) => self.fail(port, stats, e),
        }
    }

    /// A parked ring (see [`Self::set_mem`]): asks again every [`IOTLB_MISS_RETRY`], and
    /// stops the queue once [`IOTLB_MISS_BOUND`] passes without a grant. Returns whether it
    /// is still parked.
    fn check_lost(&mut self, port: PortId, stats: &PortStats, now: Instant) -> bool {
        let (Some(mut l), Some(ch)) = (self.lost, self.iotlb.as_deref()) else {
            return false; // not parked (a ring is parked only under an IOMMU)
        };
        if l.ask.keep(ch, stats, now) {
            self.lost = Some(l);
            return true;
        }
        self.lost = None;
        let (addr, len) = (l.ask.addr, l.len);
        self.fail(port, stats, virtq::Error::RingRevoked { addr, len });
        false
    }
}

/// Outcome of delivering one packet into a receive ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// Written and its used entries pushed.
    Done,
    /// Not enough receive chains in this batch: nothing consumed.
    NoRoom,
    /// Larger than the whole ring can hold: drop it.
    TooBig,
}

/// Receive chains popped for one batch, each already being loaded for writing, consumed in
/// order; what is left goes back to the ring at [`finish`](RxBatch::finish).
#[derive(Debug)]
pub struct RxBatch {
    chains: Vec<Chain>,
    next: usize,
    /// Most chains one packet may take: 1 without `VIRTIO_NET_F_MRG_RXBUF`.
    max_merge: usize,
    /// Header length of this ring's frontend.
    hdr_len: u32,
    /// A dirty log is on (live migration): the chains the batch fills are marked when it is
    /// finished ([`RxBatch::log_used`]). Looked up once per batch.
    logging: bool,
}

impl RxBatch {
    fn new(mergeable: bool, hdr_len: u32) -> Self {
        Self {
            chains: Vec::with_capacity(256),
            next: 0,
            max_merge: if mergeable { MAX_MERGE } else { 1 },
            hdr_len,
            logging: false,
        }
    }

    /// Starts a batch: one `available()` load, then pops up to `max` chains, and no more
    /// than `cap` allows given the chains available (the device-queue limit), and prefetches
    /// the first lines of each for writing.
    #[inline]
    pub fn fill(
        &mut self,
        rx: &mut QueueSlot,
        (id, stats): (PortId, &PortStats),
        max: usize,
        cap: impl FnOnce(u16) -> usize,
    ) -> Result<(), virtq::Error> {
        self.chains.clear();
        self.next = 0;
        self.logging = rx.q.logging();
        let avail = rx.q.available()?;
        let max = max.min(cap(avail));
        let pf = Prefetch::write();
        match rx.q.pop_batch(&mut self.chains, max, |segs| {
            if let Some(s) = segs.first() {
                pf.seg(s, 2);
            }
        }) {
            // A translation missing (IOTLB) after some chains: the batch is those, and the
            // miss is asked for now (a packet that needs more chains than those would
            // otherwise retry without it ever being asked for).
            Err(e) if e.is_retryable() && !self.chains.is_empty() => {
                rx.fail(id, stats, e);
                Ok(())
            }
            r => r.map(|_| ()),
        }
    }

    /// Live migration: marks the pages of every chain the batch filled, once all of it is
    /// written and before it is published (once per batch, off the per-packet path). A chain's
    /// whole buffer is marked, not just the bytes written: a page too many costs the frontend
    /// a copy, a page too few would cost the guest its data.
    #[cold]
    #[inline(never)]
    fn log_used(&self, q: &DeviceQueue) {
        for c in &self.chains[..self.next] {
            q.log_written(q.writable(c), c.writable);
        }
    }

    /// Chains not consumed yet.
    pub fn remaining(&self) -> usize {
        self.chains.len() - self.next
    }

    /// Gives the unconsumed chains back (they are the last ones popped); returns the chains
    /// used.
    pub fn finish(&mut self, q: &mut DeviceQueue) -> u32 {
        if self.logging && self.next > 0 {
            self.log_used(q);
        }
        q.unpop(u16::try_from(self.remaining()).unwrap_or(0));
        let used = u32::try_from(self.next).unwrap_or(0);
        self.chains.clear();
        self.next = 0;
        used
    }
}

/// Writes one packet of `len` bytes, virtio-net header included, produced by
/// `copy(dst_segs, dst_off, src_off, n)`, into as many of the batch's receive chains as it
/// needs (`VIRTIO_NET_F_MRG_RXBUF`), then sets `num_buffers` in the header it wrote (12-byte
/// headers) and pushes the used entries. One copy call per chain. On `NoRoom` nothing is
/// consumed.
#[inline(always)]
pub fn deliver(
    rx: &mut DeviceQueue,
    b: &mut RxBatch,
    len: u32,
    mut copy: impl FnMut(&[Seg<'_>], u32, u32, u32) -> u32,
) -> Result<Delivered, virtq::Error> {
    // Nearly every packet: the next chain holds all of it (and the header).
    if let Some(&c) = b.chains.get(b.next) {
        if len <= c.writable && b.hdr_len <= c.writable {
            fill_chain(rx, &c, b.hdr_len, |segs| copy(segs, 0, 0, len));
            b.next += 1;
            return Ok(Delivered::Done);
        }
    }
    let need = u64::from(len);
    let mut have = 0u64;
    let mut k = b.next;
    while have < need {
        if k - b.next == b.max_merge {
            return Ok(Delivered::TooBig);
        }
        let Some(c) = b.chains.get(k) else {
            let whole_ring = b.next == 0 && b.chains.len() >= usize::from(rx.size());
            return Ok(if whole_ring {
                Delivered::TooBig
            } else {
                Delivered::NoRoom
            });
        };
        have += u64::from(c.writable);
        k += 1;
    }
    let first = b.chains[b.next];
    if first.writable < b.hdr_len {
        // Every receive buffer must hold the header (virtio 1.x 5.1.6.3.1).
        return Err(virtq::Error::BufferTooSmall {
            len: first.writable,
            need: b.hdr_len,
        });
    }
    let mut src_off = 0u32;
    for c in &b.chains[b.next..k] {
        let n = (len - src_off).min(c.writable);
        src_off += copy(rx.writable(c), 0, src_off, n);
        rx.push_used(c.head, n);
    }
    if b.hdr_len == HDR_LEN {
        set_num_buffers(rx.writable(&first), u16::try_from(k - b.next).unwrap_or(1));
    }
    b.next = k;
    Ok(Delivered::Done)
}

/// Sets `num_buffers` in the 12-byte header at the start of `segs`. The header is nearly
/// always in the first piece: a 2-byte store.
#[inline(always)]
fn set_num_buffers(segs: &[Seg<'_>], n: u16) {
    let nbufs = n.to_le_bytes();
    if !segs
        .first()
        .is_some_and(|s| s.write_array(NUM_BUFFERS_OFF, nbufs))
    {
        set_num_buffers_split(segs, nbufs);
    }
}

/// [`set_num_buffers`] for a header split across pieces (out of line: next to never).
#[cold]
#[inline(never)]
fn set_num_buffers_split(segs: &[Seg<'_>], nbufs: [u8; 2]) {
    write_segs(segs, NUM_BUFFERS_OFF, &nbufs);
}

/// One packet into chain `c`, which holds all of it (its `hdr_len`-byte header included):
/// `write` copies it into the chain's segments and returns the bytes written; `num_buffers`
/// is 1 (12-byte headers) and the used entry is pushed.
#[inline(always)]
fn fill_chain(
    q: &mut impl FormatQueue,
    c: &Chain,
    hdr_len: u32,
    write: impl FnOnce(&[Seg<'_>]) -> u32,
) {
    let segs = q.writable(c);
    let n = write(segs);
    if hdr_len == HDR_LEN {
        set_num_buffers(segs, 1);
    }
    q.push_used(c.head, n);
}

/// [`RxSide::take_plain`]'s loop, for one ring format: the packets taken and their frame
/// bytes.
#[inline(always)]
fn take_plain(
    q: &mut impl FormatQueue,
    b: &mut RxBatch,
    hdr_len: u32,
    pkts: &[Pkt<'_>],
) -> (usize, u64) {
    let (mut k, mut bytes) = (0usize, 0u64);
    let chains = b.chains.get(b.next..).unwrap_or(&[]);
    for (p, &c) in pkts.iter().zip(chains) {
        if p.hdr_len != hdr_len || p.has_offload() || p.len > c.writable {
            break;
        }
        // `fill_chain` without its split-header case: a chain whose first piece does not hold
        // the header goes through `take` (about 4 instructions a packet less, callgrind).
        let segs = q.writable(&c);
        let Some(first) = segs.first().filter(|s| s.len() >= hdr_len) else {
            break;
        };
        let n = copy_segs(p.segs, 0, segs, 0, p.len);
        if hdr_len == HDR_LEN {
            first.write_array(NUM_BUFFERS_OFF, 1u16.to_le_bytes());
        }
        q.push_used(c.head, n);
        bytes += u64::from(p.frame_len());
        k += 1;
    }
    b.next += k;
    (k, bytes)
}

/// The header a receiver with `features` and a `len`-byte header is given for a packet that
/// passes as it is: its metadata, less what the receiver did not negotiate.
pub fn header_for(h: &VnetHdr, features: u64) -> [u8; VnetHdr::LEN] {
    let mut out = *h;
    out.num_buffers = 0;
    if features & pvnet_net::features::VIRTIO_NET_F_GUEST_CSUM == 0 {
        // 5.1.6.4: without GUEST_CSUM the device sets no flags.
        out.flags = 0;
    }
    let mut b = [0u8; VnetHdr::LEN];
    out.write(&mut b);
    b
}

/// Writes bytes `soff..soff + n` of `hdr[..hlen] ++ frame` at `doff` of `dst`, where `frame`
/// is `src` from `src_frame_off` on; returns the bytes written.
#[inline]
fn copy_with_header(
    dst: &[Seg<'_>],
    doff: u32,
    soff: u32,
    n: u32,
    hdr: &[u8],
    src: &[Seg<'_>],
    src_frame_off: u32,
) -> u32 {
    let hlen = u32::try_from(hdr.len()).unwrap_or(0);
    let mut done = 0;
    if soff < hlen {
        let k = n.min(hlen - soff);
        let s = soff as usize;
        done += u32::try_from(write_segs(dst, doff, &hdr[s..s + k as usize])).unwrap_or(0);
    }
    if n > done {
        let from = soff + done - hlen + src_frame_off;
        done += copy_segs(src, from, dst, doff + done, n - done);
    }
    done
}

/// Pops up to `want` chains into `rxb`, no more than `egress`'s device-queue limit allows at
/// `now`; false (the ring stopped) if the ring is broken.
fn fill(
    rxb: &mut RxBatch,
    egress: &mut Egress,
    rx: &mut QueueSlot,
    who: (PortId, &PortStats),
    (want, now): (usize, Instant),
) -> bool {
    match rxb.fill(rx, who, want, |a| egress.cap(a, now)) {
        Ok(()) => true,
        Err(e) => {
            rx.fail(who.0, who.1, e);
            false
        }
    }
}

impl RxState {
    /// Opens the receive batch with `want` chains at `now`, once per source batch; the
    /// buffers the frontend gave back since the last batch complete the device queue's
    /// limit. False if the ring just failed.
    fn open(
        &mut self,
        rx: &mut QueueSlot,
        id: PortId,
        stats: &PortStats,
        want: usize,
        now: Instant,
    ) -> bool {
        if !self.open {
            if !fill(
                &mut self.rxb,
                &mut self.egress,
                rx,
                (id, stats),
                (want.max(1), now),
            ) {
                return false;
            }
            self.open = true;
            self.retry = true;
            self.now = now;
        }
        true
    }

    /// [`open`](Self::open), or, if the batch is open already with fewer than `want` chains
    /// left, grows it to `want` without publishing: a steered run into a ring that an
    /// earlier run of the round opened (its batch sized for that run) takes its chains
    /// here, once, rather than through the per-packet second look, which publishes.
    fn reserve(
        &mut self,
        rx: &mut QueueSlot,
        id: PortId,
        stats: &PortStats,
        want: usize,
        now: Instant,
    ) -> bool {
        if !self.open || self.rxb.remaining() >= want {
            return self.open(rx, id, stats, want, now);
        }
        // The chains consumed so far are accounted as at a publish (their used entries stay
        // unpublished until the batch's commit), the rest go back, and the batch refills.
        let used = self.rxb.finish(&mut rx.q);
        self.egress.used(used);
        fill(
            &mut self.rxb,
            &mut self.egress,
            rx,
            (id, stats),
            (want, now),
        )
    }

    /// Publishes the open batch and counts what it delivered (once per batch: no per-packet
    /// counter stores).
    fn commit(&mut self, rx: &mut QueueSlot, stats: &PortStats) {
        if std::mem::take(&mut self.open) {
            let used = self.rxb.finish(&mut rx.q);
            rx.worked = true;
            rx.publish(stats);
            bump(&stats.tx_packets, self.sent[0]);
            bump(&stats.tx_bytes, self.sent[1]);
            self.sent = [0; 2];
            self.egress.used(used);
        }
    }
}

/// One queue pair of a port: the frontend's transmit ring (our ingress), its receive ring
/// (our egress) and what each side keeps between batches.
#[derive(Debug)]
pub struct QueuePair {
    /// Receive queue (device writes), index `2k`.
    pub rx: Option<QueueSlot>,
    /// Transmit queue (device reads), index `2k + 1`.
    pub tx: Option<QueueSlot>,
    /// This pair's counters (its only writer is the shard that owns it).
    pub stats: Arc<PortStats>,
    /// What the receive side keeps between packets of a batch and between rounds.
    out: RxState,
    /// Transmit chains of the current batch.
    chains: Vec<Chain>,
    /// The shard waits on the receive ring (packets waited for its buffers last round).
    rx_wanted: bool,
}

/// The receive side's state of a pair, apart from its ring.
#[derive(Debug)]
struct RxState {
    rxb: RxBatch,
    /// The receive batch is open (opened this source batch, not yet published).
    open: bool,
    /// The open receive batch may still look once for more buffers.
    retry: bool,
    egress: Egress,
    /// Delivered into the open batch, not yet counted: packets, frame bytes.
    sent: [u64; 2],
    /// When the open batch was opened.
    now: Instant,
}

/// What the receive side of a pair needs to take one packet (split from the rest of the
/// pair, so that a pair can deliver its own packets back: hairpin).
struct RxSide<'a> {
    id: PortId,
    features: u64,
    hdr_len: u32,
    rx: &'a mut QueueSlot,
    st: &'a mut RxState,
    stats: &'a PortStats,
}

impl RxSide<'_> {
    /// Takes packets in order until one is not taken: how many, and what became of that one.
    /// The plain packets at the front go through [`take_plain`](Self::take_plain); the first
    /// one it leaves, and every one after it, through the per-packet [`take`](Self::take).
    #[inline]
    fn take_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        let n = self.take_plain(pkts);
        if n == pkts.len() {
            return (n, TxOut::Sent);
        }
        let (m, out) = offer_each(&pkts[n..], |p| self.take(p));
        (n + m, out)
    }

    /// The common case as one loop: packets whose header passes as it is, each into the next
    /// chain of the batch, which holds all of it (and the header in its first piece): one
    /// copy, `num_buffers` = 1, a used entry; counted once for the run. Stops at the first
    /// packet that is not such a one or finds no chain left: [`take`](Self::take) handles
    /// it, with everything else (headers rewritten, merged buffers, a second look for
    /// buffers, errors).
    #[inline(always)]
    fn take_plain(&mut self, pkts: &[Pkt<'_>]) -> usize {
        let (b, hdr_len) = (&mut self.st.rxb, self.hdr_len);
        let (k, bytes) = match &mut self.rx.q {
            DeviceQueue::Split(q) => take_plain(q, b, hdr_len, pkts),
            DeviceQueue::Packed(q) => take_plain(q, b, hdr_len, pkts),
        };
        if k > 0 {
            self.st.sent[0] += k as u64;
            self.st.sent[1] += bytes;
            self.st.egress.sent();
        }
        k
    }

    /// Delivers into the receive batch; when the batch runs out the first time, publishes
    /// what it delivered and looks once for more buffers. A receiver still out of buffers after
    /// that waits for the next round: looking again per packet would only trade used-index
    /// writes with the frontend.
    #[inline(always)]
    fn deliver_retry(
        &mut self,
        len: u32,
        mut copy: impl FnMut(&[Seg<'_>], u32, u32, u32) -> u32,
    ) -> Result<Delivered, virtq::Error> {
        // The batch holds no more chains than the device-queue limit allows (see
        // `Egress::cap`): running out of them is running out of room.
        let r = deliver(&mut self.rx.q, &mut self.st.rxb, len, &mut copy)?;
        if r != Delivered::NoRoom || !self.st.retry {
            return Ok(r);
        }
        self.retry(len, copy)
    }

    /// The batch ran out the first time: publish what it delivered, look once more for
    /// buffers (out of line: the per-packet path stays small).
    #[cold]
    #[inline(never)]
    fn retry(
        &mut self,
        len: u32,
        copy: impl FnMut(&[Seg<'_>], u32, u32, u32) -> u32,
    ) -> Result<Delivered, virtq::Error> {
        let st = &mut *self.st;
        st.retry = false;
        let used = st.rxb.finish(&mut self.rx.q);
        st.egress.used(used);
        self.rx.publish(self.stats);
        let (egress, now) = (&mut st.egress, st.now);
        st.rxb
            .fill(self.rx, (self.id, self.stats), MAX_MERGE, |a| {
                egress.cap(a, now)
            })?;
        deliver(&mut self.rx.q, &mut st.rxb, len, copy)
    }

    /// Direct receive: the next chains of the batch already hold a packet of `len` bytes,
    /// header first, written there by the kernel (the hop's one copy), filling each in turn.
    /// Completes it in place: `num_buffers` set, a used entry per chain it fills, counted as
    /// any delivery. False, with nothing consumed, if the batch's chains cannot hold it (more
    /// than a packet may merge, or none left).
    fn in_place(&mut self, len: u32, frame_len: u32) -> bool {
        match deliver(&mut self.rx.q, &mut self.st.rxb, len, |_, _, _, n| n) {
            Ok(Delivered::Done) => {
                self.st.sent[0] += 1;
                self.st.sent[1] += u64::from(frame_len);
                self.st.egress.sent();
                true
            }
            Ok(_) => false,
            Err(e) => {
                self.rx.fail(self.id, self.stats, e);
                false
            }
        }
    }

    /// One packet into the frontend's receive ring: the whole packet in one copy when its
    /// header can pass as it is, else a header written for this frontend, then the frame.
    /// Inlined into each caller: the per-packet path must not pay a call (the drain has its
    /// own copy).
    #[inline(always)]
    fn take(&mut self, pkt: &Pkt<'_>) -> TxOut {
        let segs = pkt.segs;
        let r = if pkt.hdr_len == self.hdr_len && !pkt.has_offload() {
            self.deliver_retry(pkt.len, |d, doff, soff, n| {
                copy_segs(segs, soff, d, doff, n)
            })
        } else {
            let hb = header_for(&pkt.hdr, self.features);
            let h = &hb[..self.hdr_len as usize];
            let from = pkt.hdr_len;
            let len = self.hdr_len + pkt.frame_len();
            self.deliver_retry(len, |d, doff, soff, n| {
                copy_with_header(d, doff, soff, n, h, segs, from)
            })
        };
        match r {
            Ok(Delivered::Done) => {
                self.st.sent[0] += 1;
                self.st.sent[1] += u64::from(pkt.frame_len());
                self.st.egress.sent();
                TxOut::Sent
            }
            Ok(Delivered::NoRoom) => TxOut::NoRoom,
            Ok(Delivered::TooBig) => TxOut::Dropped(DropReason::TooBig),
            // The next buffer is not granted yet (IOTLB): as if the ring were full.
            Err(e) if e.is_retryable() => {
                self.rx.fail(self.id, self.stats, e);
                TxOut::NoRoom
            }
            Err(e) => {
                self.rx.fail(self.id, self.stats, e);
                TxOut::Dropped(DropReason::PortDown)
            }
        }
    }
}

impl QueuePair {
    /// Whether its receive ring runs (started, not stopped for a violation).
    #[inline]
    fn rx_runs(&self) -> bool {
        self.rx.as_ref().is_some_and(|s| !s.broken)
    }

    /// Drops everything waiting in the egress queue, counted under `why`; nothing waits after.
    fn empty_egress(&mut self, why: DropReason) {
        let n = self.out.egress.purge();
        bump(&self.stats.drops[why as usize], n);
        self.stats
            .backlog
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }

    fn new(
        stats: Arc<PortStats>,
        mergeable: bool,
        hdr_len: u32,
        egress: EgressConfig,
        batch: usize,
    ) -> Self {
        Self {
            rx: None,
            tx: None,
            stats,
            out: RxState {
                rxb: RxBatch::new(mergeable, hdr_len),
                open: false,
                retry: false,
                egress: Egress::with(egress, crate::egress::dql_floor(batch)),
                sent: [0; 2],
                now: Instant::now(),
            },
            chains: Vec::with_capacity(256),
            rx_wanted: false,
        }
    }

    /// Opens the receive batch (once per source batch) with `want` chains: what the sender's
    /// burst holds. A packet that needs more (merged buffers) makes the batch look once more
    /// for up to [`MAX_MERGE`]. False if the ring is not running or just failed.
    fn open(&mut self, id: PortId, want: usize, now: Instant) -> bool {
        let Some(rx) = QueueSlot::usable(&mut self.rx) else {
            return false;
        };
        self.out.open(rx, id, &self.stats, want, now)
    }

    /// [`RxState::reserve`] on this pair's receive ring.
    fn reserve(&mut self, id: PortId, want: usize, now: Instant) -> bool {
        let Some(rx) = QueueSlot::usable(&mut self.rx) else {
            return false;
        };
        self.out.reserve(rx, id, &self.stats, want, now)
    }

    /// Publishes the open receive batch and counts what it delivered.
    fn commit(&mut self) {
        if let Some(rx) = self.rx.as_mut() {
            self.out.commit(rx, &self.stats);
        }
    }
}

/// The shard-side settings every vhost port of a shard shares.
#[derive(Debug, Clone, Copy)]
pub struct VhostConfig {
    /// Policy of the frontend's transmit rings (the ones it fills).
    pub tx_policy: Policy,
    /// Policy of its receive rings, while we wait for its buffers.
    pub rx_policy: Policy,
    /// Most chains per ring per batch.
    pub batch: usize,
    /// How long transmit-completion calls may be held back.
    pub call_bound: Duration,
    /// What happens to packets this port has no room for (a queue, or a hold in the sender).
    pub egress: EgressConfig,
    /// The measured wake-up cost (bounds adaptive polling).
    pub wake: WakeCost,
}

/// One frontend connection, as far as one shard owns it.
#[derive(Debug)]
pub struct VhostPort {
    id: PortId,
    cfg: VhostConfig,
    /// Features the frontend acked (from its first started queue).
    features: u64,
    hdr_len: u32,
    mergeable: bool,
    /// Counters of each pair this shard services (index = pair).
    stats: Vec<Arc<PortStats>>,
    /// The pairs, created when their first queue starts.
    qps: Vec<Option<QueuePair>>,
    /// The pair the open transmit batch goes to (set by `tx_begin`, and by the steering for
    /// each run of packets).
    tx_qp: usize,
    /// The running receive rings' pairs, in order, when more than one runs (set by
    /// `tx_begin`): flow hash modulo `nsteer` picks one.
    steer: [u16; MAX_STEER],
    nsteer: usize,
    /// When the open transmit batch began (a steered ring's batch opens when the burst's
    /// packets for it are known).
    tx_now: Instant,
}

impl VhostPort {
    /// A port with no queues yet; `stats[k]` counts pair `k`.
    pub fn new(id: PortId, cfg: VhostConfig, stats: Vec<Arc<PortStats>>) -> Self {
        Self {
            id,
            cfg,
            features: 0,
            hdr_len: HDR_LEN,
            mergeable: false,
            qps: stats.iter().map(|_| None).collect(),
            stats,
            tx_qp: 0,
            steer: [0; MAX_STEER],
            nsteer: 0,
            tx_now: Instant::now(),
        }
    }

    /// How many pairs it has counters for (every pair one of whose queues started).
    pub fn pairs(&self) -> u16 {
        u16::try_from(self.qps.len()).unwrap_or(u16::MAX)
    }

    /// Takes the counters of pairs it did not have yet (`stats[k]` counts pair `k`; the ones
    /// it has are kept).
    pub fn add_pairs(&mut self, stats: Vec<Arc<PortStats>>) {
        for s in stats.into_iter().skip(self.stats.len()) {
            self.stats.push(s);
            self.qps.push(None);
        }
    }

    /// Installs a started queue (its pair's counters were added first: `add_pairs`).
    pub fn start(&mut self, q: StartedQueue) {
        let pair = usize::from(q.index / 2);
        if pair >= self.qps.len() {
            tracing::warn!(
                port = self.id,
                queue = q.index,
                "queue of a pair without counters: left idle"
            );
            return;
        }
        self.features = q.features;
        self.hdr_len = hdr_len(q.features);
        self.mergeable = q.mergeable;
        let (policy, is_rx) = if q.index.is_multiple_of(2) {
            (self.cfg.rx_policy, true)
        } else {
            (self.cfg.tx_policy, false)
        };
        let (stats, mergeable, hdr_len, egress, batch) = (
            self.stats[pair].clone(),
            self.mergeable,
            self.hdr_len,
            self.cfg.egress,
            self.cfg.batch,
        );
        let qp = self.qps[pair]
            .get_or_insert_with(|| QueuePair::new(stats, mergeable, hdr_len, egress, batch));
        // A pair's header length and merging follow the features of its latest start.
        qp.out.rxb = RxBatch::new(mergeable, hdr_len);
        if is_rx {
            // A new ring: nothing of it is in flight; the limit learns it afresh.
            qp.out.egress.ring_restarted();
        }
        let mut slot = QueueSlot::new(q, policy, self.cfg.wake);
        // The shard polls a new queue first: tell the driver not to kick until we arm. A
        // ring starts with `used->flags == 0` ("kick me"); left so, a driver without
        // EVENT_IDX (DPDK virtio-user) pays an eventfd write per burst while we poll anyway.
        slot.q.disable_notify();
        if is_rx {
            qp.rx = Some(slot);
        } else {
            qp.tx = Some(slot);
        }
    }

    /// New egress settings (`pvnet ctl port set`): each running pair gets a fresh egress;
    /// what waited in the old queue is dropped, counted as `reconfigured`.
    pub fn set_egress(&mut self, e: EgressConfig) {
        self.cfg.egress = e;
        let batch = self.cfg.batch;
        for qp in self.qps.iter_mut().flatten() {
            qp.empty_egress(DropReason::Reconfigured);
            qp.out.egress = Egress::with(e, crate::egress::dql_floor(batch));
        }
        info!(port = self.id, egress = ?e, "egress settings changed");
    }

    /// Polls its transmit rings by `p` from now on (running ones start afresh).
    pub fn set_tx_policy(&mut self, p: Policy) {
        if self.cfg.tx_policy == p {
            return;
        }
        self.cfg.tx_policy = p;
        let wake = self.cfg.wake;
        for s in self
            .qps
            .iter_mut()
            .flatten()
            .filter_map(|qp| qp.tx.as_mut())
        {
            s.poll = Poller::new(p, wake);
        }
        info!(port = self.id, policy = %p, "transmit-ring policy changed");
    }

    /// Takes a queue back; returns its next avail index (what `GET_VRING_BASE` answers) and
    /// its kick fd's number (to leave the epoll set).
    pub fn stop(&mut self, index: u16) -> Option<(u16, Option<i32>)> {
        let qp = self.qps.get_mut(usize::from(index / 2))?.as_mut()?;
        let slot = if index.is_multiple_of(2) {
            qp.out.open = false;
            // What waited for this ring has nowhere to go now.
            qp.empty_egress(DropReason::PortDown);
            qp.rx.take()
        } else {
            qp.tx.take()
        }?;
        let (srtt, var, probe) = slot.poll.estimate();
        let (hits, misses) = slot.poll.hits_misses();
        info!(
            port = self.id, queue = index, policy = %slot.poll.policy(), window = ?slot.poll.window(),
            gap = ?srtt, gap_dev = ?var, probe_every = probe, hits, misses, "queue polling summary"
        );
        let fd = slot.kick.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        Some((slot.q.last_avail(), fd))
    }

    /// Switches every running ring to a new memory table. A ring whose own addresses no
    /// longer translate is parked until a grant covers them again ([`QueueSlot::set_mem`]).
    /// A queue that waited for a grant tries again at once (still under the same wait: a
    /// grant that does not cover the miss is asked again after the retry interval, and the
    /// bound holds).
    pub fn set_mem(&mut self, mem: &Arc<MemTable>) {
        let (id, now) = (self.id, Instant::now());
        for qp in self.qps.iter_mut().flatten() {
            for s in [&mut qp.rx, &mut qp.tx].into_iter().flatten() {
                s.set_mem(id, &qp.stats, mem, now);
            }
        }
    }

    /// Stops every ring whose memory table holds a mapping that faulted (the peer shrank what
    /// it shared).
    pub fn check_faults(&mut self) {
        let id = self.id;
        for qp in self.qps.iter_mut().flatten() {
            for s in [&mut qp.rx, &mut qp.tx].into_iter().flatten() {
                if pvnet_vhost::mmap::table_faulted(s.q.mem()) {
                    s.fail(id, &qp.stats, virtq::Error::MemoryFault);
                }
            }
        }
    }

    /// Every running ring's vhost-user index and kick fd (to enter or leave a shard's epoll
    /// set when the port moves between shards).
    pub fn kick_fds(&self) -> Vec<(u16, i32)> {
        self.qps
            .iter()
            .flatten()
            .flat_map(|qp| [qp.rx.as_ref(), qp.tx.as_ref()])
            .flatten()
            .filter_map(|s| {
                let fd = s.kick.as_ref()?;
                Some((s.index, std::os::fd::AsRawFd::as_raw_fd(fd)))
            })
            .collect()
    }

    /// The shard is going to sleep with this port armed (counted on every pair).
    pub fn count_sleep(&self) {
        for s in &self.stats {
            bump(&s.sleeps, 1);
        }
    }

    /// The size of its transmit ring (0 if none runs): how much a drain may have to take.
    pub fn tx_ring_size(&self) -> u16 {
        self.qps
            .iter()
            .flatten()
            .filter_map(|qp| qp.tx.as_ref())
            .map(|s| s.q.size())
            .max()
            .unwrap_or(0)
    }

    /// The egress state of the pair the last packets offered went to (the steered one), or
    /// of the first running pair (pair 0 before any runs).
    pub fn egress(&mut self) -> &mut Egress {
        let k = if self
            .qps
            .get(self.tx_qp)
            .and_then(Option::as_ref)
            .is_some_and(QueuePair::rx_runs)
        {
            self.tx_qp
        } else {
            self.egress_pair().unwrap_or(0)
        };
        let (stats, m, h, egress, batch) = (
            self.stats[k].clone(),
            self.mergeable,
            self.hdr_len,
            self.cfg.egress,
            self.cfg.batch,
        );
        &mut self.qps[k]
            .get_or_insert_with(|| QueuePair::new(stats, m, h, egress, batch))
            .out
            .egress
    }

    /// The pair packets for this frontend go to: the first with a running receive ring.
    #[inline]
    fn egress_pair(&self) -> Option<usize> {
        self.qps
            .iter()
            .position(|qp| qp.as_ref().is_some_and(QueuePair::rx_runs))
    }

    /// Whether a kernel port may read packets straight into this frontend's receive buffers
    /// (direct receive, docs/no-copy.md): its header is the kernel's 12 bytes, nothing
    /// waits in its egress queue (what waits goes first), and one receive ring runs (with
    /// more, the ring depends on the packet's flow, known only once the kernel wrote it:
    /// lending one ring's buffers would put every flow on it).
    pub fn lends(&self) -> bool {
        self.hdr_len == HDR_LEN
            && !super::Port::backlogged(self)
            && self.qps.iter().flatten().filter(|qp| qp.rx_runs()).count() <= 1
    }

    /// The open receive batch's chains not filled yet (0 when none is open).
    pub fn lent(&self) -> usize {
        match self.qps.get(self.tx_qp).and_then(Option::as_ref) {
            Some(qp) if qp.out.open && qp.rx_runs() => qp.out.rxb.remaining(),
            _ => 0,
        }
    }

    /// The writable segments of the open batch's `k`-th chain not filled yet (none past the
    /// batch). They stay the frontend's buffers, popped for this batch: a kernel port reads
    /// into them and then completes each with [`take_in_place`](Self::take_in_place), in
    /// order; the rest go back to the ring at the commit.
    pub fn lent_chain(&self, k: usize) -> &[Seg<'_>] {
        let Some(QueuePair {
            rx: Some(rx), out, ..
        }) = self.qps.get(self.tx_qp).and_then(Option::as_ref)
        else {
            return &[];
        };
        out.rxb
            .chains
            .get(out.rxb.next + k)
            .map_or(&[], |c| rx.q.writable(c))
    }

    /// Completes the next lent chains in place: they hold a packet of `len` bytes (header
    /// included) that the kernel wrote across them in order, each filled before the next.
    /// The caller knows it lies within the chains it lent that read. False, nothing consumed,
    /// if the chains cannot take it (more than a packet may merge, the ring stopped).
    pub fn take_in_place(&mut self, len: u32) -> bool {
        let frame_len = len.saturating_sub(self.hdr_len);
        self.rx_side()
            .is_some_and(|mut side| side.in_place(len, frame_len))
    }

    /// The receive side of the pair the open transmit batch goes to, if that batch is open
    /// and its ring running.
    #[inline(always)]
    fn rx_side(&mut self) -> Option<RxSide<'_>> {
        let (id, features, hdr_len) = (self.id, self.features, self.hdr_len);
        match self.qps.get_mut(self.tx_qp).and_then(Option::as_mut) {
            Some(QueuePair {
                rx: Some(rx),
                stats,
                out,
                ..
            }) if out.open && !rx.broken => Some(RxSide {
                id,
                features,
                hdr_len,
                rx,
                st: out,
                stats,
            }),
            _ => None,
        }
    }

    /// Whether the egress pair's receive ring runs (not stopped) with no batch open: what a
    /// retryable miss leaves.
    #[cold]
    fn rx_waits(&self) -> bool {
        self.qps
            .get(self.tx_qp)
            .and_then(Option::as_ref)
            .is_some_and(|qp| qp.rx_runs() && !qp.out.open)
    }

    /// Sends what the frontend transmits straight back to it (request/response benchmarks):
    /// the same one-copy path as any delivery, within one pair. Returns the packets taken.
    pub fn hairpin(&mut self, max: usize, now: Instant) -> usize {
        let (id, features, hdr_len) = (self.id, self.features, self.hdr_len);
        let mut work = 0;
        for qp in self.qps.iter_mut().flatten() {
            let QueuePair {
                rx,
                tx,
                stats,
                out,
                chains,
                ..
            } = qp;
            let Some(tx) = QueueSlot::usable(tx) else {
                continue;
            };
            let Some(rx) = QueueSlot::usable(rx) else {
                work += ingress(id, hdr_len, tx, chains, stats, max, &mut DropAll);
                continue;
            };
            let mut back = Hairpin {
                side: RxSide {
                    id,
                    features,
                    hdr_len,
                    rx,
                    st: out,
                    stats,
                },
                now,
            };
            work += ingress(id, hdr_len, tx, chains, stats, max, &mut back);
        }
        work
    }

    fn report_ring(
        id: PortId,
        stats: &PortStats,
        s: &mut QueueSlot,
        wanted: bool,
        now: Instant,
        settle: &mut Settle,
    ) {
        if s.broken {
            return;
        }
        if s.check_lost(id, stats, now) {
            // Parked: polled on (a grant wakes no one), within the miss bound.
            settle.queue(&mut s.poll, true, wanted, now);
            return;
        }
        // A queue waiting for a grant is polled on: the grant wakes no one (the frontend
        // kicked already), and the wait is bounded. It stops waiting once the miss is gone.
        let waiting = s
            .waiting
            .is_some_and(|w| now.saturating_duration_since(w.last) < IOTLB_MISS_GAP);
        if !waiting {
            s.waiting = None;
        }
        let worked = std::mem::take(&mut s.worked) || waiting;
        settle.queue(&mut s.poll, worked, wanted, now);
    }
}

/// One drain batch: up to `max` packets from `q` into the receive ring, published once.
/// Returns the packets sent and whether the ring could take more.
#[allow(clippy::too_many_arguments)]
fn drain_batch(
    q: &mut crate::egress::queue::Queue,
    rx: &mut QueueSlot,
    out: &mut RxState,
    stats: &PortStats,
    (id, features, hdr_len): (PortId, u64, u32),
    max: usize,
    batch: usize,
    now: Instant,
) -> (usize, bool) {
    if !out.open(rx, id, stats, max.min(batch), now) {
        return (0, false);
    }
    let t = out.egress.ns(now);
    let mut side = RxSide {
        id,
        features,
        hdr_len,
        rx: &mut *rx,
        st: &mut *out,
        stats,
    };
    let mut dropped = [0u64; DropReason::ALL.len()];
    let (mut sent, mut more) = (0, true);
    while sent < max {
        let Some(h) = q.dequeue(t) else {
            break;
        };
        let (seg, meta) = q.get(h);
        let segs = [seg];
        let pkt = Pkt {
            segs: &segs,
            ..meta
        };
        match side.take(&pkt) {
            TxOut::Sent => {
                q.release(h);
                sent += 1;
            }
            TxOut::NoRoom => {
                q.requeue(h);
                more = false;
                break;
            }
            TxOut::Dropped(r) => {
                q.release(h);
                dropped[r as usize] += 1;
            }
        }
    }
    for r in DropReason::ALL {
        bump(&stats.drops[r as usize], dropped[r as usize]);
    }
    out.commit(rx, stats);
    (sent, more)
}

/// Adds an egress queue's counts to the port's counters (`dequeues`: drains that sent).
fn count_queue(stats: &PortStats, c: &crate::egress::queue::QueueCounts, dequeues: u64) {
    bump(&stats.queued, c.queued);
    bump(&stats.dequeued, c.dequeued);
    bump(&stats.dequeues, dequeues);
    bump(&stats.drops[DropReason::QueueLimit as usize], c.drop_limit);
    bump(&stats.drops[DropReason::Aqm as usize], c.drop_aqm);
}

/// The hairpin's receiver: the same pair's receive side, its batch opened at the first
/// burst (an idle round touches no receive ring).
struct Hairpin<'a> {
    side: RxSide<'a>,
    now: Instant,
}

impl Ingress for Hairpin<'_> {
    fn burst(&mut self, pkts: &[Pkt<'_>], stats: &PortStats) -> usize {
        let s = &mut self.side;
        if !s.rx.broken {
            s.st.open(s.rx, s.id, s.stats, pkts.len(), self.now);
        }
        let mut k = 0;
        while k < pkts.len() {
            let (n, why) = if s.rx.broken {
                (0, TxOut::Dropped(DropReason::PortDown))
            } else {
                s.take_burst(&pkts[k..])
            };
            k += n;
            if k == pkts.len() {
                break;
            }
            let r = match why {
                TxOut::Sent => continue,
                TxOut::NoRoom => match s.st.egress.no_room(crate::egress::Offer::Unicast, self.now)
                {
                    crate::egress::Backpressure::Wait => break,
                    // A hairpin's egress holds no queue (bench roles): drop as no room.
                    crate::egress::Backpressure::Queue => DropReason::NoBuffer,
                    crate::egress::Backpressure::Drop(r) => r,
                },
                TxOut::Dropped(r) => r,
            };
            bump(&stats.drops[r as usize], 1);
            k += 1;
        }
        s.st.commit(s.rx, s.stats);
        k
    }

    fn has_receiver(&self) -> bool {
        !self.side.rx.broken
    }
}

/// A receiver that takes nothing: the packets have nowhere to go (`port_down`).
struct DropAll;

impl Ingress for DropAll {
    fn burst(&mut self, pkts: &[Pkt<'_>], stats: &PortStats) -> usize {
        bump(
            &stats.drops[DropReason::PortDown as usize],
            pkts.len() as u64,
        );
        pkts.len()
    }
    fn has_receiver(&self) -> bool {
        false
    }
}

/// One batch from a frontend's transmit ring to `to`: one `available()` load, the batch
/// parsed and every packet's first lines requested before any is read, each packet's header
/// and addresses read once, handed over as bursts, used entries published once (after `to`
/// committed its side). Packets `to` makes wait stay in the ring (unpopped) for the next
/// round; a packet too short to be one is dropped (`invalid`) in its place in the order.
#[inline]
fn ingress(
    id: PortId,
    hdr_len: u32,
    tx: &mut QueueSlot,
    chains: &mut Vec<Chain>,
    stats: &PortStats,
    max: usize,
    to: &mut impl Ingress,
) -> usize {
    match tx.q.available() {
        Ok(0) => return 0,
        Ok(_) => tx.worked = true,
        Err(e) => {
            tx.fail(id, stats, e);
            return 0;
        }
    }
    chains.clear();
    // The first lines of each chain, fetched for writing although pvnet only reads them: a
    // frontend that recycles its buffers (DPDK's mempool, a guest's page pool) soon posts a
    // transmitted buffer for receive, and pvnet then writes its header line. Owned from here,
    // that write finds the line in this core's cache; fetched for reading, the line stays
    // shared, or dirty in the frontend's cache from its transmit header, and the write waits
    // for a transfer. Measured against DPDK testpmd's io bounce: 1.67x (packed, fast
    // core-to-core state), 1.57x (slow), split 1.21x; frontend-to-backend rates unchanged
    // (docs/interop.md).
    let pf = Prefetch::write();
    if let Err(e) = tx.q.pop_batch(chains, max, |segs| {
        if let Some(s) = segs.first() {
            pf.seg(s, 2);
        }
    }) {
        // Chains popped before the bad one are still taken below.
        tx.fail(id, stats, e);
    }
    let (taken, bytes, bad) = match &tx.q {
        DeviceQueue::Split(q) => hand_over(q, chains, hdr_len, stats, to),
        DeviceQueue::Packed(q) => hand_over(q, chains, hdr_len, stats, to),
    };
    // Every chain taken (delivered, dropped, or too short) is returned, in order.
    tx.q.push_used_all(&chains[..taken], 0);
    // Chains not taken wait in the ring for the next round.
    tx.q.unpop(u16::try_from(chains.len() - taken).unwrap_or(0));
    tx.poll.took(taken, tx.q.size());
    tx.publish(stats);
    bump(&stats.rx_packets, taken as u64);
    bump(&stats.rx_bytes, bytes);
    bump(&stats.drops[DropReason::Invalid as usize], bad);
    taken
}

/// Counts a batch's indirect-table entries whose write flag was ignored on the frontend's
/// transmit ring (DPDK's packed multi-segment packets: `virtq`'s chain module says why), and
/// says so at debug level, the first time and then within the port's log limit.
#[cold]
#[inline(never)]
fn write_flags_ignored(queue: u16, stats: &PortStats, n: u64) {
    let first = stats
        .write_flags_ignored
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0;
    bump(&stats.write_flags_ignored, n);
    if first || stats.log.allow().is_some() {
        tracing::debug!(
            queue,
            n,
            "write flag ignored on indirect descriptors of a transmit ring (tolerated: the device only reads it)"
        );
    }
}

/// [`ingress`]'s hand-over, for one ring format: the batch's chains to `to` as bursts of
/// packets, in order, until one must wait. Returns the chains taken (delivered, dropped, or
/// too short), the bytes delivered and the chains too short to be a packet.
#[inline(always)]
fn hand_over(
    q: &impl FormatQueue,
    chains: &[Chain],
    hdr_len: u32,
    stats: &PortStats,
    to: &mut impl Ingress,
) -> (usize, u64, u64) {
    let (mut bytes, mut bad) = (0u64, 0u64);
    let mut taken = 0;
    let mut pkts = [super::EMPTY; super::MAX_BURST];
    while taken < chains.len() {
        // Gather a burst: valid packets up to the next short one (or the burst's room).
        let mut n = 0;
        for c in &chains[taken..] {
            if n == pkts.len() {
                break;
            }
            let segs = q.readable(c);
            let head = if c.readable >= hdr_len + MACS {
                read_head(segs, hdr_len)
            } else {
                None
            };
            let Some((hdr, macs)) = head else {
                break;
            };
            pkts[n] = Pkt {
                segs,
                len: c.readable,
                hdr_len,
                hdr,
                macs,
                hash: 0,
            };
            n += 1;
        }
        let k = if n > 0 {
            to.burst(&pkts[..n], stats)
        } else {
            0
        };
        for p in &pkts[..k] {
            bytes += u64::from(p.frame_len());
        }
        taken += k;
        if k < n {
            break;
        }
        // The chain that ended the gathering, if it was a short one: dropped in its place.
        if n < pkts.len() && taken < chains.len() {
            bad += 1;
            taken += 1;
        }
    }
    (taken, bytes, bad)
}

impl VhostPort {
    /// [`Port::drain`](super::Port::drain)'s work: each pair's queue into its own ring; what
    /// waits for a ring that no longer runs has nowhere to go (a flow's packets are not
    /// moved to another ring behind later ones of the same flow).
    #[inline(never)]
    fn drain_queue(&mut self, now: Instant) -> usize {
        let mut sent = 0;
        for k in 0..self.qps.len() {
            let Some(qp) = self.qps[k].as_mut() else {
                continue;
            };
            if !qp.rx_runs() {
                if qp.out.egress.queue_len().unwrap_or(0) > 0 {
                    qp.empty_egress(DropReason::PortDown);
                }
                continue;
            }
            if qp.out.egress.backlogged() {
                sent += self.drain_pair(k, now);
            }
        }
        sent
    }

    /// Drains pair `k`'s egress queue into its receive ring (which runs).
    fn drain_pair(&mut self, k: usize, now: Instant) -> usize {
        let (id, features, hdr_len, batch) = (self.id, self.features, self.hdr_len, self.cfg.batch);
        let Some(qp) = self.qps[k].as_mut() else {
            return 0;
        };
        let Some(mut q) = qp.out.egress.take_queue() else {
            return 0;
        };
        let bulk = qp.out.egress.bulk();
        let QueuePair { rx, stats, out, .. } = qp;
        let (mut sent, mut dequeues) = (0, 0u64);
        if let Some(rx) = QueueSlot::usable(rx) {
            // Bulk: everything the limit allows in one batch (one publish, one call). One per
            // dequeue: the same packets, each its own batch (a publish and a call decision
            // each), as a driver without `xmit_more` would.
            let mut left = q.len() as usize;
            while left > 0 {
                let max = if bulk { left } else { 1 };
                let (n, more) = drain_batch(
                    &mut q,
                    rx,
                    out,
                    stats,
                    (id, features, hdr_len),
                    max,
                    batch,
                    now,
                );
                sent += n;
                dequeues += u64::from(n > 0);
                left = left.saturating_sub(max);
                if !more || bulk {
                    break;
                }
            }
        }
        // Dequeued: delivered from the queue (a packet handed out and then refused by the
        // ring, too big for it, is a drop, not a dequeue: the counts stay exact).
        let c = crate::egress::queue::QueueCounts {
            dequeued: sent as u64,
            ..q.take_counts()
        };
        count_queue(stats, &c, dequeues);
        stats
            .backlog
            .store(u64::from(q.len()), std::sync::atomic::Ordering::Relaxed);
        if let Some(l) = out.egress.dql_limit() {
            stats
                .dql_limit
                .store(u64::from(l), std::sync::atomic::Ordering::Relaxed);
        }
        if out.egress.put_queue(q, sent, now) {
            let n = out.egress.purge();
            tracing::warn!(
                port = id,
                dropped = n,
                "egress queue could not drain: emptied"
            );
            bump(&stats.drops[DropReason::NoBuffer as usize], n);
            stats.backlog.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        sent
    }
}

impl VhostPort {
    /// Records the running receive rings' pairs for the steering; returns how many run
    /// (the first is `first`).
    fn steer_rings(&mut self, first: usize) -> usize {
        let mut n = 0;
        for (k, qp) in self.qps.iter().enumerate().skip(first) {
            if n == MAX_STEER {
                break;
            }
            if qp.as_ref().is_some_and(QueuePair::rx_runs) {
                self.steer[n] = u16::try_from(k).unwrap_or(0);
                n += 1;
            }
        }
        self.nsteer = n;
        n
    }

    /// The index in `steer` of the ring a packet's flow goes to.
    #[inline]
    fn slot_of(&self, p: &Pkt<'_>) -> usize {
        let h = if p.hash != 0 {
            u64::from(p.hash)
        } else {
            Self::hash_of(p)
        };
        // Multiply-shift onto 0..nsteer (no division).
        (((h * self.nsteer as u64) >> 32) as usize).min(MAX_STEER - 1)
    }

    /// The high 32 bits of a packet's flow hash, from its bytes (its source did not say).
    #[inline]
    fn hash_of(p: &Pkt<'_>) -> u64 {
        use crate::egress::queue::{flow_hash_head, flow_hash_l2, hashes_l3};
        let first = p.segs.first();
        // A frame without IP hashes its addresses, which the packet carries already: only
        // its EtherType is read.
        let et = first.and_then(|s| s.read_array::<2>(p.hdr_len + 12));
        let h = if et.is_some_and(|e| !hashes_l3(u16::from_be_bytes(e))) {
            flow_hash_l2(p.macs)
        } else {
            // The addresses and ports lie within the frame's first 64 bytes (VLAN and IPv6
            // included): one fixed-size copy when the first segment holds them (nearly always).
            let b = match first.and_then(|s| s.read_array::<64>(p.hdr_len)) {
                Some(b) => b,
                None => {
                    let mut b = [0u8; 64];
                    virtq::mem::read_segs(p.segs, p.hdr_len, &mut b);
                    b
                }
            };
            flow_hash_head(&b, p.frame_len() as usize)
        };
        h >> 32
    }

    /// The runs of consecutive packets (at most [`MAX_BURST`](super::MAX_BURST)) that go to one
    /// ring, in order, found in one pass (one hash each, or the one the packet carries): into
    /// `runs`, how many returned.
    fn steer_runs(&self, pkts: &[Pkt<'_>], runs: &mut [Run; super::MAX_BURST]) -> usize {
        let pkts = pkts.get(..super::MAX_BURST).unwrap_or(pkts);
        let (mut n, mut ring, mut start) = (0, u16::MAX, 0);
        for (i, p) in pkts.iter().enumerate() {
            let r = self.steer[self.slot_of(p)];
            if r != ring {
                if i > 0 {
                    runs[n] = Run::new(ring, start, i);
                    n += 1;
                }
                (ring, start) = (r, i);
            }
        }
        if !pkts.is_empty() {
            runs[n] = Run::new(ring, start, pkts.len());
            n += 1;
        }
        n
    }

    /// `tx_burst` over several receive rings: every packet's ring first (one hash each, or
    /// the one the packet carries), so that each ring's batch opens for exactly the packets
    /// it gets here (a ring an earlier run of the round opened grows its batch for them,
    /// unpublished: one publish per ring per round); then each run of packets to its ring,
    /// in order.
    #[inline(never)]
    fn tx_steered(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        let (id, now) = (self.id, self.tx_now);
        let mut done = 0;
        for chunk in pkts.chunks(super::MAX_BURST) {
            let mut runs = [Run::EMPTY; super::MAX_BURST];
            let n = self.steer_runs(chunk, &mut runs);
            let runs = &runs[..n];
            // How many each pair gets, counted by runs (a flow's packets come in runs: a
            // count per packet would chain each increment on the one before).
            let mut count = [0usize; MAX_STEER];
            for r in runs {
                count[usize::from(r.ring)] += r.range().len();
            }
            for (k, &n) in count.iter().enumerate().take(self.qps.len()) {
                if n > 0 {
                    if let Some(qp) = self.qps[k].as_mut() {
                        qp.reserve(id, n, now);
                    }
                }
            }
            for r in runs {
                self.tx_qp = usize::from(r.ring);
                let (n, out) = self.tx_run(&chunk[r.range()]);
                done += n;
                if n < r.range().len() {
                    return (done, out);
                }
            }
        }
        (done, TxOut::Sent)
    }

    /// Offers packets to the pair `tx_qp` (its batch open, or not if it could not open).
    #[inline(always)]
    fn tx_run(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        if let Some(mut side) = self.rx_side() {
            return side.take_burst(pkts);
        }
        if self.rx_waits() {
            // The ring runs but its batch could not open: it waits for a grant (IOTLB miss),
            // as if it were full.
            (0, TxOut::NoRoom)
        } else {
            (0, TxOut::Dropped(DropReason::PortDown))
        }
    }

    /// Queues packets in pair `tx_qp`'s egress.
    fn enqueue_pair(&mut self, pkts: &[Pkt<'_>], now: Instant) {
        let Some(qp) = self.qps.get_mut(self.tx_qp).and_then(Option::as_mut) else {
            return;
        };
        let c = qp.out.egress.enqueue(pkts, now);
        count_queue(&qp.stats, &c, 0);
        if let Some(q) = qp.out.egress.queue_len() {
            qp.stats
                .backlog
                .store(u64::from(q), std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Packets `start..end` of a burst (of at most [`MAX_BURST`](super::MAX_BURST)), all for
/// receive ring `ring`.
#[derive(Debug, Clone, Copy)]
struct Run {
    ring: u16,
    start: u16,
    end: u16,
}

impl Run {
    const EMPTY: Run = Run {
        ring: 0,
        start: 0,
        end: 0,
    };

    fn new(ring: u16, start: usize, end: usize) -> Self {
        let at = |i: usize| u16::try_from(i).unwrap_or(u16::MAX);
        Self {
            ring,
            start: at(start),
            end: at(end),
        }
    }

    fn range(&self) -> std::ops::Range<usize> {
        usize::from(self.start)..usize::from(self.end)
    }
}

impl super::Port for VhostPort {
    fn id(&self) -> PortId {
        self.id
    }

    fn kind(&self) -> &'static str {
        "vhost-user"
    }

    fn tx_stats(&self) -> &PortStats {
        self.egress_pair()
            .and_then(|k| self.qps[k].as_ref())
            .map_or(&self.stats[0], |qp| &qp.stats)
    }

    #[inline]
    fn caps(&self) -> Caps {
        let receives = self.qps.iter().flatten().any(QueuePair::rx_runs);
        Caps {
            receives,
            offloads: self.features & RX_OFFLOADS,
        }
    }

    #[inline]
    fn rx_burst(&mut self, max: usize, _now: Instant, to: &mut impl Ingress) -> usize {
        let (id, hdr_len) = (self.id, self.hdr_len);
        let mut work = 0;
        for qp in self.qps.iter_mut().flatten() {
            if let Some(tx) = QueueSlot::usable(&mut qp.tx) {
                work += ingress(id, hdr_len, tx, &mut qp.chains, &qp.stats, max, to);
            }
        }
        work
    }

    #[inline]
    fn tx_begin(&mut self, now: Instant, hint: usize) -> bool {
        let id = self.id;
        let Some(k) = self.egress_pair() else {
            return false;
        };
        self.tx_qp = k;
        if self.qps.len() > 1 && self.steer_rings(k) > 1 {
            // Several rings: each opens for the packets the burst has for it.
            self.tx_now = now;
            return true;
        }
        // A running ring whose batch could not open (a grant missing) still counts as
        // begun: its packets then meet "no room" and wait, rather than being dropped.
        self.qps[k]
            .as_mut()
            .is_some_and(|qp| qp.open(id, hint, now) || qp.rx_runs())
    }

    #[inline]
    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        if self.nsteer > 1 {
            return self.tx_steered(pkts);
        }
        self.tx_run(pkts)
    }

    #[inline]
    fn tx_commit(&mut self) {
        for qp in self.qps.iter_mut().flatten() {
            qp.commit();
        }
    }

    /// With several receive rings: whether any has packets waiting (a run then queues
    /// behind them, each packet in its own ring's queue: a flow is never overtaken).
    #[inline]
    fn backlogged(&self) -> bool {
        if self.nsteer > 1 {
            return self
                .qps
                .iter()
                .flatten()
                .any(|qp| qp.out.egress.backlogged());
        }
        self.qps
            .get(self.tx_qp)
            .and_then(Option::as_ref)
            .is_some_and(|qp| qp.out.egress.backlogged())
    }

    #[inline(never)]
    fn enqueue(&mut self, pkts: &[Pkt<'_>], now: Instant) {
        if self.nsteer > 1 {
            // Each packet into its own ring's queue.
            for chunk in pkts.chunks(super::MAX_BURST) {
                let mut runs = [Run::EMPTY; super::MAX_BURST];
                let n = self.steer_runs(chunk, &mut runs);
                for r in &runs[..n] {
                    self.tx_qp = usize::from(r.ring);
                    self.enqueue_pair(&chunk[r.range()], now);
                }
            }
            return;
        }
        self.enqueue_pair(pkts, now);
    }

    /// Nearly every round nothing waits: one check here, the drain itself out of line.
    #[inline]
    fn drain(&mut self, now: Instant) -> usize {
        let waits = self.qps.iter().flatten().any(|qp| {
            qp.out.egress.backlogged()
                || (qp.rx.is_none() && qp.out.egress.queue_len().unwrap_or(0) > 0)
        });
        if waits {
            self.drain_queue(now)
        } else {
            0
        }
    }

    fn idle(&mut self, now: Instant, settle: &mut Settle) {
        let (id, bound) = (self.id, self.cfg.call_bound);
        for qp in self.qps.iter_mut().flatten() {
            // Owed transmit-completion calls that are due go out, and so do those of a
            // frontend just called for received packets anyway (one interruption of the
            // driver instead of two: with INTx the guest's handler looks at every queue).
            let rx_called = qp.rx.as_mut().is_some_and(QueueSlot::take_called);
            if let Some(s) = qp.tx.as_mut() {
                if s.calls.flush(now, bound, rx_called) {
                    s.signal_call(&qp.stats);
                }
                if let Some(t) = s.calls.due(bound) {
                    settle.wake_by(t);
                }
                Self::report_ring(id, &qp.stats, s, true, now, settle);
            }
            // A receive ring matters only while packets wait for its buffers: those of the
            // round that just ended (a sender that still waits blocks it again next round).
            qp.rx_wanted = qp.out.egress.blocked();
            qp.out.egress.new_round();
            if let Some(l) = qp.out.egress.dql_limit() {
                qp.stats
                    .dql_limit
                    .store(u64::from(l), std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(s) = qp.rx.as_mut() {
                Self::report_ring(id, &qp.stats, s, qp.rx_wanted, now, settle);
            }
        }
    }

    fn arm(&mut self) -> Armed {
        let id = self.id;
        let mut armed = Armed::Empty;
        for qp in self.qps.iter_mut().flatten() {
            for (s, wanted) in [(qp.tx.as_mut(), true), (qp.rx.as_mut(), qp.rx_wanted)] {
                let Some(s) = s.filter(|s| wanted && s.live) else {
                    continue;
                };
                if matches!(s.poll.policy(), Policy::Timer(_)) || s.poll.coalescing() {
                    continue;
                }
                match s.q.arm_notify() {
                    Ok(Armed::Empty) => {}
                    Ok(Armed::NotEmpty) => armed = Armed::NotEmpty,
                    Err(e) => s.fail(id, &qp.stats, e),
                }
            }
        }
        armed
    }

    fn disarm(&mut self, slept: bool) {
        for qp in self.qps.iter_mut().flatten() {
            for s in [qp.tx.as_mut(), qp.rx.as_mut()].into_iter().flatten() {
                if s.live {
                    s.q.disable_notify();
                }
                if slept {
                    s.poll.woke();
                }
            }
        }
    }

    fn event(&mut self, token: u16) {
        let Some(qp) = self
            .qps
            .get_mut(usize::from(token / 2))
            .and_then(Option::as_mut)
        else {
            return;
        };
        let slot = if token.is_multiple_of(2) {
            qp.rx.as_ref()
        } else {
            qp.tx.as_ref()
        };
        if let Some(k) = slot.and_then(|s| s.kick.as_ref()) {
            // One kick per wake-up, whatever the value read: the eventfd's counter is the
            // frontend's to write (one legal write of 2^64 - 2 would make the counter wrap).
            bump(&qp.stats.kicks, u64::from(k.drain() != 0));
        }
    }
}
