//! A trunk: the link between two shards (worker threads) of the learning switch.
//!
//! Each shard is a learning switch of its own over the ports placed on it, and every pair of
//! shards is joined by a trunk, one port on each side, as two switches are joined by a cable:
//! a frame for a station learned behind the trunk is sent into it, an unknown destination is
//! flooded into it, and what comes out of it is switched on the other shard (which learns
//! the frame's source as behind its end of the trunk). Split horizon: a frame that came in
//! over a trunk is never sent out of another one (each shard floods to every other shard
//! itself), so a full mesh of trunks has no loop.
//!
//! Each direction is a single-producer single-consumer byte ring in pvnet's memory
//! ([`Ring`]): the sending shard copies a frame from the sender's buffers into the ring (its
//! virtio-net header, then the frame, one record per packet, each on its own cache lines) and
//! publishes once per burst; the receiving shard hands the records out as packets that borrow
//! the ring, and gives the space back once its burst is committed. So a frame that crosses
//! shards is copied twice (into the ring, then into the receiver), where one shard copies it
//! once: that second copy, and the ring's cache lines moving between CPUs, is what crossing
//! costs (docs/scale.md has the measured figure).
//!
//! A full ring makes the sender wait (unicast, up to the switch's hold bound) or drops the
//! copy (flood), as a full receive ring does. A shard asleep is woken by the first burst
//! published while it sleeps (its `asleep` flag against the published tail: a sequentially
//! consistent store then load on each side, so at least one side sees the other).

use super::{offer_each, Ingress, RX_OFFLOADS};
use crate::egress::{Egress, HoldPolicy, HOLD};
use crate::pkt::{read_head, Caps, Pkt, PortId, TxOut, EMPTY, MAX_BURST};
use crate::poll::plan::Settle;
use crate::poll::{Policy, Poller, WakeCost};
use crate::stats::{bump, PortStats};
use pvnet_vhost::Notifier;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use virtq::Armed;
use virtq::Seg;

/// Bytes of each direction's ring: 16 full-size GSO packets, or thousands of small frames.
pub const TRUNK_RING_BYTES: usize = 1 << 20;
/// Records start on a cache line of their own.
const ALIGN: usize = 64;
/// A record's header: the packet's length (virtio-net header included), the header's length
/// in the low 16 bits of the second word and the packet's VLAN word ([`Pkt::vlan`]: its VLAN
/// and whether its frame is tagged) in the high 16: the frame crosses as it is, with its VLAN;
/// then the port it entered the switch on (its origin, for the rules of a port spread over
/// workers: [`crate::switch`]'s lanes), and 4 bytes to keep the frame 8-byte aligned.
const REC: usize = 16;
/// In a record's length: the rest of the ring up to its end is unused, go on at its start.
const WRAP: u32 = u32::MAX;

/// Padding so that the producer's and the consumer's indices sit on lines of their own.
#[repr(align(128))]
#[derive(Debug, Default)]
struct Line(AtomicUsize);

/// One direction of a trunk: bytes `head..tail` (indices that only grow; position = index mod
/// capacity) hold published records; the producer owns the rest.
#[derive(Debug)]
pub(crate) struct Ring {
    mem: NonNull<u8>,
    cap: usize,
    /// Consumed up to here (written by the consumer only).
    head: Line,
    /// Published up to here (written by the producer only).
    tail: Line,
}

// SAFETY: the producer writes only bytes it owns (outside head..tail), the consumer reads
// only published ones (inside), and ownership moves with the Release/Acquire of the indices.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Ring {
    /// An empty ring of `cap` bytes (a power of two, at least a few records).
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        let cap = cap.next_power_of_two().max(4 * ALIGN);
        let layout = std::alloc::Layout::from_size_align(cap, ALIGN).expect("ring layout");
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(mem) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        Arc::new(Self {
            mem,
            cap,
            head: Line::default(),
            tail: Line::default(),
        })
    }

    /// The largest packet a record can hold.
    pub(crate) fn max_packet(&self) -> usize {
        self.cap / 4 - REC
    }
}

impl Ring {
    /// Reads published records from `head` on (up to `tail`), at most `room`, with
    /// `BY_ORIGIN` all of one origin (the port they entered the switch on): each one's
    /// segment, its length and header word, and the index past it. Returns how many, where
    /// reading stopped, and their origin (0 without `BY_ORIGIN`).
    #[inline(always)]
    fn read_burst<'a, const BY_ORIGIN: bool>(
        &'a self,
        (head, tail): (usize, usize),
        room: usize,
        segs: &mut [Seg<'a>; MAX_BURST],
        lens: &mut [(u32, u32); MAX_BURST],
        ends: &mut [usize; MAX_BURST],
    ) -> (usize, usize, PortId) {
        let (cap, base) = (self.cap, self.mem.as_ptr());
        let (mut n, mut at) = (0, head);
        let mut origin = None;
        while at != tail && n < room {
            let off = at & (cap - 1);
            // SAFETY: `off` is a record start inside `head..tail` (published, ours to read).
            let len = unsafe { base.add(off).cast::<u32>().read() };
            if len == WRAP {
                at += cap - off;
                continue;
            }
            // SAFETY: as above; the record's header.
            let word = unsafe { base.add(off + 4).cast::<u32>().read() };
            if BY_ORIGIN {
                // SAFETY: as above.
                let from = unsafe { base.add(off + 8).cast::<u32>().read() };
                if *origin.get_or_insert(from) != from {
                    break;
                }
            }
            // SAFETY: the record's bytes lie within the ring (our allocation, alive as long
            // as `self`), published, and stay the consumer's until its head moves past them,
            // after the burst's commit.
            segs[n] = unsafe { Seg::from_raw(NonNull::new_unchecked(base.add(off + REC)), len) };
            lens[n] = (len, word);
            at += (REC + len as usize).next_multiple_of(ALIGN);
            ends[n] = at;
            n += 1;
        }
        (n, at, origin.unwrap_or(0))
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.cap, ALIGN).expect("ring layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.mem.as_ptr(), layout) };
    }
}

/// The sending end of a ring (one shard's).
#[derive(Debug)]
pub struct Producer {
    ring: Arc<Ring>,
    /// The port the packets pushed now entered the switch on.
    origin: PortId,
    /// Written up to here, published or not.
    tail: usize,
    /// The consumer's head as last read (refreshed only when the ring looks full).
    head: usize,
}

impl Producer {
    /// Copies a packet into the ring as one record (not yet published); false if it has no
    /// room (or the packet could never fit).
    #[inline]
    pub(crate) fn push(&mut self, p: &Pkt<'_>) -> bool {
        let cap = self.ring.cap;
        let len = p.len as usize;
        if len > self.ring.max_packet() {
            return false;
        }
        let need = (REC + len).next_multiple_of(ALIGN);
        let off = self.tail & (cap - 1);
        let skip = if need > cap - off { cap - off } else { 0 };
        if self.tail + skip + need - self.head > cap {
            self.head = self.ring.head.0.load(Ordering::Acquire);
            if self.tail + skip + need - self.head > cap {
                return false;
            }
        }
        let base = self.ring.mem.as_ptr();
        if skip > 0 {
            // SAFETY: `off + 4 <= cap` (records are 64-byte aligned), a byte we own.
            unsafe { base.add(off).cast::<u32>().write(WRAP) };
            self.tail += skip;
        }
        let off = self.tail & (cap - 1);
        // SAFETY: `off + need <= cap` (a record never straddles the end) and `off..off+need`
        // is outside `head..tail`: ours until published.
        let dst = unsafe { std::slice::from_raw_parts_mut(base.add(off), REC + len) };
        dst[..4].copy_from_slice(&p.len.to_ne_bytes());
        let word = (p.hdr_len & 0xffff) | u32::from(p.vlan) << 16;
        dst[4..8].copy_from_slice(&word.to_ne_bytes());
        dst[8..12].copy_from_slice(&self.origin.to_ne_bytes());
        virtq::read_segs(p.segs, 0, &mut dst[REC..]);
        self.tail += need;
        true
    }

    /// Publishes what was pushed. Sequentially consistent: the caller then reads whether the
    /// consumer sleeps (see the module docs).
    #[inline]
    pub(crate) fn publish(&mut self) {
        self.ring.tail.0.store(self.tail, Ordering::SeqCst);
    }
}

/// The receiving end of a ring (the other shard's).
#[derive(Debug)]
pub struct Consumer {
    ring: Arc<Ring>,
    /// Consumed up to here (given back when a burst is done).
    head: usize,
}

impl Consumer {
    /// Whether published records wait (sequentially consistent: see the module docs).
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.ring.tail.0.load(Ordering::SeqCst) != self.head
    }
}

/// A trunk's two directions, each `cap` bytes, as its two ends take them: the first end
/// sends on one ring and receives on the other, the second the other way round.
pub fn link(cap: usize) -> ((Producer, Consumer), (Producer, Consumer)) {
    let (to_b, from_a) = ring(cap);
    let (to_a, from_b) = ring(cap);
    ((to_b, from_b), (to_a, from_a))
}

/// Both ends of a new trunk direction.
pub(crate) fn ring(cap: usize) -> (Producer, Consumer) {
    let r = Ring::new(cap);
    (
        Producer {
            ring: r.clone(),
            origin: 0,
            tail: 0,
            head: 0,
        },
        Consumer { ring: r, head: 0 },
    )
}

/// A shard's end of a trunk to another shard.
#[derive(Debug)]
pub struct TrunkPort {
    id: PortId,
    /// The shard at its other end.
    peer: usize,
    /// Bursts are cut where the records' origin changes, and the switch is told each
    /// burst's ([`Ingress::origin`]): only while some port is spread over shards.
    by_origin: bool,
    stats: Arc<PortStats>,
    to: Producer,
    from: Consumer,
    /// Pushed since the last publish: packets, frame bytes.
    pushed: [u64; 2],
    /// The peer shard's wake-up and whether it sleeps.
    peer_wake: Notifier,
    peer_asleep: Arc<AtomicBool>,
    poll: Poller,
    worked: bool,
    /// A full ring holds unicast senders back for the switch's bound (and drops floods).
    egress: Egress,
}

impl TrunkPort {
    /// A trunk end to shard `peer`: packets go out through `to`, come in through `from`; the
    /// peer shard is woken through `peer_wake` when it sleeps (`peer_asleep`).
    pub fn new(
        (id, peer): (PortId, usize),
        stats: Arc<PortStats>,
        (to, from): (Producer, Consumer),
        peer_wake: Notifier,
        peer_asleep: Arc<AtomicBool>,
        wake: WakeCost,
    ) -> Self {
        Self {
            id,
            peer,
            by_origin: false,
            stats,
            to,
            from,
            pushed: [0; 2],
            peer_wake,
            peer_asleep,
            poll: Poller::new(Policy::Adaptive, wake),
            worked: false,
            egress: Egress::new(HoldPolicy::Bounded(HOLD)),
        }
    }

    /// Whether the other shard published packets not handed out yet.
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.from.pending()
    }

    /// The shard at its other end.
    #[inline]
    pub(crate) fn peer(&self) -> usize {
        self.peer
    }

    /// Whether received bursts go by origin (some port is spread over shards: the switch
    /// needs each packet's).
    pub(crate) fn set_by_origin(&mut self, on: bool) {
        self.by_origin = on;
    }

    /// The packets offered from now on entered the switch on port `port` (each record
    /// carries it to the other shard).
    #[inline]
    pub(crate) fn set_origin(&mut self, port: PortId) {
        self.to.origin = port;
    }
}

impl TrunkPort {
    /// [`super::Port::rx_burst`], each burst of one origin with `BY_ORIGIN`.
    #[inline(always)]
    fn rx<const BY_ORIGIN: bool>(&mut self, max: usize, to: &mut impl Ingress) -> usize {
        let r = &*self.from.ring;
        let tail = r.tail.0.load(Ordering::Acquire);
        let mut head = self.from.head;
        let mut work = 0;
        while head != tail && work < max {
            let mut segs: [Seg<'_>; MAX_BURST] = std::array::from_fn(|_| Seg::from_mut(&mut []));
            let mut ends = [0usize; MAX_BURST];
            let mut lens = [(0u32, 0u32); MAX_BURST];
            let (n, at, origin) = r.read_burst::<BY_ORIGIN>(
                (head, tail),
                MAX_BURST.min(max - work),
                &mut segs,
                &mut lens,
                &mut ends,
            );
            if n == 0 {
                head = at;
                break;
            }
            let mut pkts = [EMPTY; MAX_BURST];
            let mut good = 0;
            for k in 0..n {
                let (len, word) = lens[k];
                let (hdr_len, vlan) = (word & 0xffff, u16::try_from(word >> 16).unwrap_or(0));
                let Some((hdr, macs)) = read_head(std::slice::from_ref(&segs[k]), hdr_len) else {
                    break;
                };
                pkts[k] = Pkt {
                    segs: std::slice::from_ref(&segs[k]),
                    len,
                    hdr_len,
                    hdr,
                    macs,
                    hash: 0,
                    vlan,
                };
                good += 1;
            }
            let taken = if good > 0 {
                if BY_ORIGIN {
                    to.origin(origin);
                }
                to.burst(&pkts[..good], &self.stats)
            } else {
                0
            };
            let mut bytes = 0u64;
            for p in &pkts[..taken] {
                bytes += u64::from(p.frame_len());
            }
            bump(&self.stats.rx_packets, taken as u64);
            bump(&self.stats.rx_bytes, bytes);
            work += taken;
            if taken < good {
                if taken > 0 {
                    head = ends[taken - 1];
                }
                break;
            }
            if good < n {
                // A record too short to be a packet (the sending shard read its header, so
                // this cannot happen): skipped, counted.
                bump(
                    &self.stats.drops[crate::stats::DropReason::Invalid as usize],
                    1,
                );
                head = ends[good];
                continue;
            }
            head = ends[n - 1];
        }
        if head != self.from.head {
            self.from.head = head;
            r.head.0.store(head, Ordering::Release);
            self.worked = true;
        }
        work
    }
}

impl super::Port for TrunkPort {
    fn id(&self) -> PortId {
        self.id
    }

    #[inline]
    fn caps(&self) -> Caps {
        // Metadata passes as it is: the other shard fits it to the port it goes to.
        Caps {
            receives: true,
            offloads: RX_OFFLOADS,
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

    /// Hands out published records, in order, in bursts; gives back the space of those
    /// taken once each burst is committed. (Out of line: kept out of the other ports'
    /// dispatch, which it would otherwise outgrow.)
    #[inline(never)]
    fn rx_burst(&mut self, max: usize, _now: Instant, to: &mut impl Ingress) -> usize {
        if self.by_origin {
            self.rx::<true>(max, to)
        } else {
            self.rx::<false>(max, to)
        }
    }

    fn tx_begin(&mut self, _now: Instant, _hint: usize) -> bool {
        true
    }

    #[inline(never)]
    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        let (to, pushed, egress) = (&mut self.to, &mut self.pushed, &mut self.egress);
        offer_each(pkts, |p| {
            if to.push(p) {
                pushed[0] += 1;
                pushed[1] += u64::from(p.frame_len());
                egress.sent();
                TxOut::Sent
            } else {
                TxOut::NoRoom
            }
        })
    }

    fn tx_commit(&mut self) {
        if self.pushed[0] == 0 {
            return;
        }
        self.to.publish();
        bump(&self.stats.tx_packets, self.pushed[0]);
        bump(&self.stats.tx_bytes, self.pushed[1]);
        bump(&self.stats.tx_batches, 1);
        self.pushed = [0; 2];
        if self.peer_asleep.load(Ordering::SeqCst) {
            bump(&self.stats.calls, 1);
            let _ = self.peer_wake.signal();
        }
    }

    fn idle(&mut self, now: Instant, settle: &mut Settle) {
        self.egress.new_round();
        let worked = std::mem::take(&mut self.worked);
        settle.queue(&mut self.poll, worked, true, now);
    }

    fn arm(&mut self) -> Armed {
        if self.from.pending() {
            Armed::NotEmpty
        } else {
            Armed::Empty
        }
    }

    fn disarm(&mut self, slept: bool) {
        if slept {
            self.poll.woke();
        }
    }

    fn event(&mut self, _token: u16) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Collect;
    use pvnet_net::{VnetHdr, HDR_LEN};

    fn pkt(buf: &mut [u8]) -> (Seg<'_>, u32) {
        let n = u32::try_from(buf.len()).expect("fits");
        (Seg::from_mut(buf), n)
    }

    #[test]
    fn records_cross_in_order_wrap_and_the_space_comes_back() {
        let (mut tx, rx) = ring(4096);
        let mut a = TrunkPort::new(
            (1, 1),
            Arc::default(),
            ring(4096),
            Notifier::new().expect("eventfd"),
            Arc::default(),
            WakeCost::FALLBACK,
        );
        // Swap a's consumer for the other end of `tx`'s ring: a reads what tx writes.
        a.from = rx;
        let mut sent = 0u8;
        let mut got = Vec::new();
        for round in 0..40 {
            // Frames of growing size, several per round, more than the ring holds in all.
            for k in 0..3u8 {
                let mut b = vec![sent; HDR_LEN as usize + 60 + usize::from(k) * 200];
                b[..HDR_LEN as usize].fill(0);
                let (seg, len) = pkt(&mut b);
                let segs = [seg];
                let p = Pkt {
                    segs: &segs,
                    len,
                    hdr_len: HDR_LEN,
                    hdr: VnetHdr::default(),
                    macs: [sent; 12],
                    hash: 0,
                    vlan: 0,
                };
                if tx.push(&p) {
                    sent = sent.wrapping_add(1);
                }
            }
            tx.publish();
            let mut c = Collect::all();
            if round % 3 == 2 {
                c.room = 1; // a receiver that takes one and makes the rest wait
            }
            super::super::Port::rx_burst(&mut a, 64, Instant::now(), &mut c);
            got.extend(c.got.iter().map(|(_, b)| b[HDR_LEN as usize]));
        }
        let mut c = Collect::all();
        super::super::Port::rx_burst(&mut a, 1024, Instant::now(), &mut c);
        got.extend(c.got.iter().map(|(_, b)| b[HDR_LEN as usize]));
        assert_eq!(
            got.len(),
            usize::from(sent),
            "every pushed frame came out once"
        );
        assert!(
            got.iter().enumerate().all(|(i, &v)| usize::from(v) == i),
            "in order"
        );
        assert!(!a.from.pending());
        assert!(sent as usize > 4096 / 64, "the ring wrapped");
    }
}
