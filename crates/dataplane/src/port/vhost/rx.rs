//! Delivery into a frontend's receive ring: a batch of its chains popped once, each packet
//! copied into the next (merged across several with `VIRTIO_NET_F_MRG_RXBUF`), a header
//! written for this frontend when the packet's cannot pass as it is.

use super::{QueuePair, QueueSlot, VhostPort};
use crate::egress::Egress;
use crate::pkt::{Pkt, PortId, TxOut, MAX_MERGE};
use crate::port::offer_each;
use crate::stats::{bump, DropReason, PortStats};
use pvnet_net::{VnetHdr, HDR_LEN, NUM_BUFFERS_OFF};
use std::time::Instant;
use virtq::FormatQueue;
use virtq::{copy_segs, write_segs, Prefetch};
use virtq::{Chain, DeviceQueue, Seg};

/// Outcome of delivering one packet into a receive ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivered {
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
pub(crate) struct RxBatch {
    pub(super) chains: Vec<Chain>,
    pub(super) next: usize,
    /// Most chains one packet may take: 1 without `VIRTIO_NET_F_MRG_RXBUF`.
    pub(super) max_merge: usize,
    /// Header length of this ring's frontend.
    pub(super) hdr_len: u32,
    /// A dirty log is on (live migration): the chains the batch fills are marked when it is
    /// finished ([`RxBatch::log_used`]). Looked up once per batch.
    pub(super) logging: bool,
}

impl RxBatch {
    pub(super) fn new(mergeable: bool, hdr_len: u32) -> Self {
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
    pub(crate) fn fill(
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
        // The lines the frame goes to are asked for owned, from the one holding the byte
        // after the header. The header's own line, when it is another one, is left as it is:
        // the copy reads it and writes it only if it differs (`copy_unless_equal`), so a
        // frontend that gives the header a line of its own (DPDK's) keeps its copy.
        let pf = Prefetch::write();
        match rx.q.pop_batch(&mut self.chains, max, |segs| {
            if let Some(s) = segs.first() {
                pf.seg_from(s, HDR_LEN, 2);
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
    pub(super) fn log_used(&self, q: &DeviceQueue) {
        for c in &self.chains[..self.next] {
            q.log_written(q.writable(c), c.writable);
        }
    }

    /// Chains not consumed yet.
    pub(crate) fn remaining(&self) -> usize {
        self.chains.len() - self.next
    }

    /// Gives the unconsumed chains back (they are the last ones popped); returns the chains
    /// used.
    pub(crate) fn finish(&mut self, q: &mut DeviceQueue) -> u32 {
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
pub(super) fn deliver(
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
pub(super) fn set_num_buffers(segs: &[Seg<'_>], n: u16) {
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
pub(super) fn set_num_buffers_split(segs: &[Seg<'_>], nbufs: [u8; 2]) {
    write_segs(segs, NUM_BUFFERS_OFF, &nbufs);
}

/// One packet into chain `c`, which holds all of it (its `hdr_len`-byte header included):
/// `write` copies it into the chain's segments and returns the bytes written; `num_buffers`
/// is 1 (12-byte headers) and the used entry is pushed.
#[inline(always)]
pub(super) fn fill_chain(
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
pub(super) fn take_plain(
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
        // the header goes through `take` (fewer instructions a packet: docs/callgrind.md).
        let segs = q.writable(&c);
        let Some(first) = segs.first().filter(|s| s.len() >= hdr_len) else {
            break;
        };
        let n = if hdr_len == HDR_LEN {
            copy_unless_equal(p, first, segs)
        } else {
            copy_segs(p.segs, 0, segs, 0, p.len)
        };
        q.push_used(c.head, n);
        bytes += u64::from(p.frame_len());
        k += 1;
    }
    b.next += k;
    (k, bytes)
}

/// The 12-byte header of a packet with no offload metadata, as a receiver gets it: all zero
/// but `num_buffers`, 1.
const PLAIN_HDR: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0];

/// Copies packet `p`, which carries no offload metadata, into `segs` (`first` their first
/// piece, holding the header): the frame, and the header [`PLAIN_HDR`] only where the buffer
/// does not hold it already. A frontend that gives the header a line of its own (DPDK's
/// virtio PMD posts buffers so that it ends where the frame's first line starts) reads it and
/// never writes it, so its line stays shared in both caches: unwritten, it changes owner
/// neither here nor when the frontend reads it (DPDK vhost's `ASSIGN_UNLESS_EQUAL` on
/// `num_buffers`). Returns the bytes the packet took.
#[inline(always)]
fn copy_unless_equal(p: &Pkt<'_>, first: &Seg<'_>, segs: &[Seg<'_>]) -> u32 {
    if first.read_array::<12>(0) != Some(PLAIN_HDR) {
        first.write_array(0, PLAIN_HDR);
    }
    HDR_LEN + copy_segs(p.segs, HDR_LEN, segs, HDR_LEN, p.len - HDR_LEN)
}

/// The header a receiver with `features` and a `len`-byte header is given for a packet that
/// passes as it is: its metadata, less what the receiver did not negotiate.
pub(crate) fn header_for(h: &VnetHdr, features: u64) -> [u8; VnetHdr::LEN] {
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
pub(super) fn copy_with_header(
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
pub(super) fn fill(
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

/// A publish found the frontend asleep on an empty receive ring: if the limit had held
/// packets back, it was starved by the limit (counted, and the limit's ceiling learns).
#[cold]
#[inline(never)]
fn starved(egress: &mut Egress, rx: &QueueSlot, stats: &PortStats, now: Instant) {
    if egress.driver_idle(now, rx.q.size()) {
        bump(&stats.dql_idle, 1);
    }
}

/// The receive side's state of a pair, apart from its ring.
#[derive(Debug)]
pub(super) struct RxState {
    pub(super) rxb: RxBatch,
    /// The receive batch is open (opened this source batch, not yet published).
    pub(super) open: bool,
    /// The open receive batch may still look once for more buffers.
    pub(super) retry: bool,
    pub(super) egress: Egress,
    /// Delivered into the open batch, not yet counted: packets, frame bytes.
    pub(super) sent: [u64; 2],
    /// When the open batch was opened.
    pub(super) now: Instant,
}

impl RxState {
    /// Opens the receive batch with `want` chains at `now`, once per source batch; the
    /// buffers the frontend gave back since the last batch complete the device queue's
    /// limit. False if the ring just failed.
    pub(super) fn open(
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
    pub(super) fn reserve(
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
    pub(super) fn commit(&mut self, rx: &mut QueueSlot, stats: &PortStats) {
        if std::mem::take(&mut self.open) {
            let used = self.rxb.finish(&mut rx.q);
            rx.worked = true;
            if rx.publish(stats) {
                starved(&mut self.egress, rx, stats, self.now);
            }
            bump(&stats.tx_packets, self.sent[0]);
            bump(&stats.tx_bytes, self.sent[1]);
            self.sent = [0; 2];
            self.egress.used(used);
        }
    }
}

/// What the receive side of a pair needs to take one packet (split from the rest of the
/// pair, so that a pair can deliver its own packets back: hairpin).
pub(super) struct RxSide<'a> {
    pub(super) id: PortId,
    pub(super) features: u64,
    pub(super) hdr_len: u32,
    pub(super) rx: &'a mut QueueSlot,
    pub(super) st: &'a mut RxState,
    pub(super) stats: &'a PortStats,
}

impl RxSide<'_> {
    /// Takes packets in order until one is not taken: how many, and what became of that one.
    /// The plain packets at the front go through [`take_plain`](Self::take_plain); the first
    /// one it leaves, and every one after it, through the per-packet [`take`](Self::take).
    #[inline]
    pub(super) fn take_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
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
    pub(super) fn take_plain(&mut self, pkts: &[Pkt<'_>]) -> usize {
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
    pub(super) fn deliver_retry(
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
    pub(super) fn retry(
        &mut self,
        len: u32,
        copy: impl FnMut(&[Seg<'_>], u32, u32, u32) -> u32,
    ) -> Result<Delivered, virtq::Error> {
        let st = &mut *self.st;
        st.retry = false;
        let used = st.rxb.finish(&mut self.rx.q);
        if self.rx.publish(self.stats) {
            starved(&mut st.egress, self.rx, self.stats, st.now);
        }
        st.egress.used(used);
        let (egress, now) = (&mut st.egress, st.now);
        st.rxb
            .fill(self.rx, (self.id, self.stats), MAX_MERGE, |a| {
                egress.cap(a, now)
            })?;
        deliver(&mut self.rx.q, &mut st.rxb, len, copy)
    }

    /// One packet into the frontend's receive ring: the whole packet in one copy when its
    /// header can pass as it is, else a header written for this frontend, then the frame.
    /// Inlined into each caller: the per-packet path must not pay a call (the drain has its
    /// own copy).
    #[inline(always)]
    pub(super) fn take(&mut self, pkt: &Pkt<'_>) -> TxOut {
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

impl VhostPort {
    /// The receive side of the pair the open transmit batch goes to, if that batch is open
    /// and its ring running.
    #[inline(always)]
    pub(super) fn rx_side(&mut self) -> Option<RxSide<'_>> {
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
    pub(super) fn rx_waits(&self) -> bool {
        self.qps
            .get(self.tx_qp)
            .and_then(Option::as_ref)
            .is_some_and(|qp| qp.rx_runs() && !qp.out.open)
    }

    /// Offers packets to the pair `tx_qp` (its batch open, or not if it could not open).
    #[inline(always)]
    pub(super) fn tx_run(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
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
}
