//! A port's egress queue: packets that found no room in their receiver wait here, as
//! pvnet-owned copies, under a scheduler: `fifo` (tail drop) or `fq_codel` (per-flow queues
//! served by deficit round robin, new flows first, each flow's head delay controlled by
//! CoDel; Linux `net/sched/sch_fq_codel.c` and `include/net/codel_impl.h`).
//!
//! What a waiting packet holds: a copy in one of the queue's preallocated slots (2 KiB for a
//! frame up to the MTU, a few 64 KiB ones for GSO packets). The sender's buffer goes back to
//! it at once, so a slow receiver holds no other port's ring; the cost is one more copy for
//! the packets that wait (none while nothing waits: packets then go straight to the
//! receiver). No allocation after construction: slots, entries and flow lists are sized once.
//!
//! Every packet offered is queued or dropped with a reason (`queue_limit` when the queue or
//! its memory is full, `aqm` when CoDel drops it at dequeue), counted in [`QueueCounts`].
//! Where CoDel would drop a packet whose sender declared ECN-capable transport, it sets
//! Congestion Experienced instead and sends it (`ecn`, on by default, as Linux's fq_codel),
//! counted as `ecn_marked`.

use crate::flow::flow_hash;
use crate::pkt::Pkt;
use crate::sys::pages::Pages;
use pvnet_net::VnetHdr;
use std::collections::VecDeque;
use virtq::read_segs;

/// Bytes of a small slot: a 1500-byte frame, its header and room for VLAN tags.
pub(crate) const SMALL_SLOT: usize = 2048;
/// Bytes of a large slot: the largest GSO packet and its header.
pub(crate) const LARGE_SLOT: usize = 65536 + 64;
/// Large slots per queue (4 MiB, touched only when used): a tap hands over TSO packets of up
/// to 64 KiB, so a few large slots would make a short queue of a bulk TCP flow.
pub(crate) const LARGE_SLOTS: usize = 64;

/// The scheduler of an egress queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qdisc {
    /// One queue in arrival order; a packet that finds it full is dropped.
    Fifo,
    /// Flow queues, deficit round robin, CoDel per flow (fq_codel's defaults).
    FqCodel,
}

/// A scheduler name that is neither `fifo` nor `fq_codel` (the text given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown qdisc {0:?} (fifo, fq_codel)")]
pub struct ParseQdiscError(pub String);

impl std::str::FromStr for Qdisc {
    type Err = ParseQdiscError;
    fn from_str(s: &str) -> Result<Self, ParseQdiscError> {
        match s {
            "fifo" => Ok(Qdisc::Fifo),
            "fq_codel" => Ok(Qdisc::FqCodel),
            o => Err(ParseQdiscError(o.to_owned())),
        }
    }
}

impl std::fmt::Display for Qdisc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Qdisc::Fifo => "fifo",
            Qdisc::FqCodel => "fq_codel",
        })
    }
}

/// Settings of an egress queue (fq_codel's defaults, but a per-port packet limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// The scheduler.
    pub qdisc: Qdisc,
    /// Most packets waiting (small slots: one each).
    pub limit: u32,
    /// Flow queues (fq_codel).
    pub flows: u16,
    /// Bytes a flow may send per round (fq_codel: 1514).
    pub quantum: u32,
    /// CoDel's acceptable standing delay, ns (5 ms).
    pub target_ns: u64,
    /// CoDel's interval, ns (100 ms).
    pub interval_ns: u64,
    /// Mark an ECN-capable packet CE where CoDel would drop it (fq_codel's `ecn`).
    pub ecn: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            qdisc: Qdisc::FqCodel,
            limit: 1024,
            flows: 1024,
            quantum: 1514,
            target_ns: 5_000_000,
            interval_ns: 100_000_000,
            ecn: true,
        }
    }
}

/// What happened to packets in the queue since the counts were last taken.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueCounts {
    /// Packets copied in.
    pub queued: u64,
    /// Packets handed out.
    pub dequeued: u64,
    /// Dropped because the queue (or its memory) was full.
    pub drop_limit: u64,
    /// Dropped by CoDel.
    pub drop_aqm: u64,
    /// Marked Congestion Experienced by CoDel instead of dropped (and sent).
    pub ecn_mark: u64,
}

/// No entry.
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Ent {
    /// Slot index (large slots after the small ones).
    slot: u32,
    /// Bytes stored: header and frame.
    len: u32,
    hdr_len: u32,
    hdr: VnetHdr,
    macs: [u8; 12],
    /// [`Pkt::vlan`] (a trunk between shards carries it).
    vlan: u16,
    /// Enqueue time, ns.
    t: u64,
    /// Next entry of its flow.
    next: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    None,
    New,
    Old,
}

/// CoDel's state of one flow (`struct codel_vars`).
#[derive(Debug, Clone, Copy, Default)]
struct Codel {
    count: u32,
    lastcount: u32,
    dropping: bool,
    /// When the head delay first stayed above target plus an interval (0: not above).
    first_above: u64,
    drop_next: u64,
}

#[derive(Debug, Clone, Copy)]
struct Flow {
    head: u32,
    tail: u32,
    /// Bytes waiting.
    backlog: u64,
    deficit: i64,
    list: List,
    codel: Codel,
}

impl Flow {
    const EMPTY: Flow = Flow {
        head: NIL,
        tail: NIL,
        backlog: 0,
        deficit: 0,
        list: List::None,
        codel: Codel {
            count: 0,
            lastcount: 0,
            dropping: false,
            first_above: 0,
            drop_next: 0,
        },
    };
}

/// An egress queue. See the module docs.
#[derive(Debug)]
pub(crate) struct Queue {
    cfg: QueueConfig,
    small: Pages,
    large: Pages,
    free_small: Vec<u32>,
    free_large: Vec<u32>,
    ents: Vec<Ent>,
    free_ents: Vec<u32>,
    flows: Vec<Flow>,
    new_flows: VecDeque<u16>,
    old_flows: VecDeque<u16>,
    /// A packet handed out and given back (no room): it goes out first next time.
    requeued: Option<u32>,
    qlen: u32,
    backlog: u64,
    counts: QueueCounts,
}

/// A handed-out packet's place in the queue: give it back with [`Queue::requeue`] or let it
/// go with [`Queue::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle(u32);

impl Queue {
    /// An empty queue; every slot and list is allocated here.
    pub(crate) fn new(cfg: QueueConfig) -> Self {
        let limit = cfg.limit.max(1);
        let nflows = if cfg.qdisc == Qdisc::Fifo {
            1
        } else {
            cfg.flows.max(1)
        };
        let ents = limit as usize + LARGE_SLOTS + 1;
        Self {
            cfg: QueueConfig { limit, ..cfg },
            // Pages from the kernel: touched only when a slot is used, returned when the
            // queue goes.
            small: Pages::zeroed(limit as usize * SMALL_SLOT),
            large: Pages::zeroed(LARGE_SLOTS * LARGE_SLOT),
            free_small: (0..limit).rev().collect(),
            free_large: (0..u32::try_from(LARGE_SLOTS).unwrap_or(0)).rev().collect(),
            ents: vec![
                Ent {
                    slot: 0,
                    len: 0,
                    hdr_len: 0,
                    hdr: VnetHdr::default(),
                    macs: [0; 12],
                    vlan: 0,
                    t: 0,
                    next: NIL,
                };
                ents
            ],
            free_ents: (0..u32::try_from(ents).unwrap_or(u32::MAX)).rev().collect(),
            flows: vec![Flow::EMPTY; usize::from(nflows)],
            new_flows: VecDeque::with_capacity(usize::from(nflows)),
            old_flows: VecDeque::with_capacity(usize::from(nflows)),
            requeued: None,
            qlen: 0,
            backlog: 0,
            counts: QueueCounts::default(),
        }
    }

    /// Packets waiting (one handed out and given back included).
    #[inline]
    pub(crate) fn len(&self) -> u32 {
        self.qlen + u32::from(self.requeued.is_some())
    }

    /// Nothing waits.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.qlen == 0 && self.requeued.is_none()
    }

    /// Bytes waiting (headers included).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.backlog
    }

    /// Takes the counts accumulated since the last call.
    pub(crate) fn take_counts(&mut self) -> QueueCounts {
        std::mem::take(&mut self.counts)
    }

    /// Copies `p` in at `now` (ns). False if it was dropped instead (`queue_limit`, counted;
    /// under fq_codel the drop may hit another flow's packets instead of this one).
    pub(crate) fn enqueue(&mut self, p: &Pkt<'_>, now: u64) -> bool {
        let len = p.len as usize;
        let slot = if len <= SMALL_SLOT && self.qlen < self.cfg.limit {
            self.free_small.pop()
        } else if len <= LARGE_SLOT && self.qlen < self.cfg.limit {
            self.free_large.pop().map(|s| s + self.cfg.limit)
        } else {
            None
        };
        let Some(slot) = slot else {
            if self.cfg.qdisc == Qdisc::FqCodel && len <= LARGE_SLOT && self.qlen > 0 {
                // Full: make room from the fattest flow (fq_codel_drop), then retry once.
                self.drop_fattest();
                return self.enqueue(p, now);
            }
            self.counts.drop_limit += 1;
            return false;
        };
        let Some(e) = self.free_ents.pop() else {
            self.free_slot(slot);
            self.counts.drop_limit += 1;
            return false;
        };
        let buf = self.slot_mut(slot);
        let n = read_segs(p.segs, 0, &mut buf[..len]);
        let flow = self.classify(slot, p.hdr_len as usize, n);
        self.ents[e as usize] = Ent {
            slot,
            len: u32::try_from(n).unwrap_or(0),
            hdr_len: p.hdr_len,
            hdr: p.hdr,
            macs: p.macs,
            vlan: p.vlan,
            t: now,
            next: NIL,
        };
        let f = &mut self.flows[usize::from(flow)];
        if f.tail == NIL {
            f.head = e;
        } else {
            self.ents[f.tail as usize].next = e;
        }
        f.tail = e;
        f.backlog += n as u64;
        if f.list == List::None {
            f.list = List::New;
            f.deficit = i64::from(self.cfg.quantum);
            self.new_flows.push_back(flow);
        }
        self.qlen += 1;
        self.backlog += n as u64;
        self.counts.queued += 1;
        true
    }

    /// The next packet to send at `now` (ns), taken out of its flow: CoDel may drop packets
    /// (counted) before it. `None` when nothing is left.
    pub(crate) fn dequeue(&mut self, now: u64) -> Option<Handle> {
        if let Some(e) = self.requeued.take() {
            self.counts.dequeued += 1;
            return Some(Handle(e));
        }
        if self.cfg.qdisc == Qdisc::Fifo {
            let e = self.pop_head(0)?;
            self.counts.dequeued += 1;
            return Some(Handle(e));
        }
        loop {
            let (flow, new) = match self.new_flows.front() {
                Some(&f) => (f, true),
                None => (*self.old_flows.front()?, false),
            };
            let fi = usize::from(flow);
            if self.flows[fi].deficit <= 0 {
                self.flows[fi].deficit += i64::from(self.cfg.quantum);
                self.rotate_to_old(new);
                continue;
            }
            match self.codel_dequeue(flow, now) {
                Some(e) => {
                    self.flows[fi].deficit -= i64::from(self.ents[e as usize].len);
                    self.counts.dequeued += 1;
                    return Some(Handle(e));
                }
                None => {
                    // Empty: a new flow goes to the old list once (so it cannot come back as
                    // new at once and starve the old ones), an old one leaves.
                    if new && !self.old_flows.is_empty() {
                        self.rotate_to_old(true);
                    } else {
                        if new {
                            self.new_flows.pop_front();
                        } else {
                            self.old_flows.pop_front();
                        }
                        self.flows[fi].list = List::None;
                    }
                }
            }
        }
    }

    /// The packet behind `h`, as a [`Pkt`] over its slot.
    pub(crate) fn get(&mut self, h: Handle) -> (virtq::Seg<'_>, Pkt<'static>) {
        let e = self.ents[h.0 as usize];
        let seg = virtq::Seg::from_mut(&mut self.slot_mut(e.slot)[..e.len as usize]);
        let meta = Pkt {
            segs: &[],
            len: e.len,
            hdr_len: e.hdr_len,
            hdr: e.hdr,
            macs: e.macs,
            hash: 0,
            vlan: e.vlan,
        };
        (seg, meta)
    }

    /// `h` found no room: it goes out first next time.
    pub(crate) fn requeue(&mut self, h: Handle) {
        debug_assert!(self.requeued.is_none());
        self.counts.dequeued -= 1;
        self.requeued = Some(h.0);
    }

    /// `h` left (sent, or dropped by the receiver): its slot is free again.
    pub(crate) fn release(&mut self, h: Handle) {
        let e = self.ents[h.0 as usize];
        self.free_slot(e.slot);
        self.free_ents.push(h.0);
    }

    /// Drops everything waiting (the receiver went away): returns the packets dropped, which
    /// the caller counts under its own reason.
    pub(crate) fn purge(&mut self) -> u64 {
        let mut n = 0;
        if let Some(e) = self.requeued.take() {
            self.release(Handle(e));
            n += 1;
        }
        for f in 0..self.flows.len() {
            while let Some(e) = self.pop_head(u16::try_from(f).unwrap_or(0)) {
                self.release(Handle(e));
                n += 1;
            }
            self.flows[f].list = List::None;
            self.flows[f].codel = Codel::default();
        }
        self.new_flows.clear();
        self.old_flows.clear();
        n
    }

    fn rotate_to_old(&mut self, from_new: bool) {
        let f = if from_new {
            self.new_flows.pop_front()
        } else {
            self.old_flows.pop_front()
        };
        if let Some(f) = f {
            self.flows[usize::from(f)].list = List::Old;
            self.old_flows.push_back(f);
        }
    }

    fn slot_mut(&mut self, slot: u32) -> &mut [u8] {
        let s = slot as usize;
        let limit = self.cfg.limit as usize;
        if s < limit {
            &mut self.small[s * SMALL_SLOT..(s + 1) * SMALL_SLOT]
        } else {
            let s = s - limit;
            &mut self.large[s * LARGE_SLOT..(s + 1) * LARGE_SLOT]
        }
    }

    fn free_slot(&mut self, slot: u32) {
        if slot < self.cfg.limit {
            self.free_small.push(slot);
        } else {
            self.free_large.push(slot - self.cfg.limit);
        }
    }

    /// Takes the head of flow `f` out (accounting only; the slot stays until released).
    fn pop_head(&mut self, f: u16) -> Option<u32> {
        let fl = &mut self.flows[usize::from(f)];
        let e = fl.head;
        if e == NIL {
            return None;
        }
        let ent = self.ents[e as usize];
        fl.head = ent.next;
        if fl.head == NIL {
            fl.tail = NIL;
        }
        fl.backlog -= u64::from(ent.len);
        self.qlen -= 1;
        self.backlog -= u64::from(ent.len);
        Some(e)
    }

    /// Drops from the head of the flow with the most bytes waiting, up to half of them and at
    /// most 64 packets (`fq_codel_drop`).
    fn drop_fattest(&mut self) {
        let Some((f, max)) = self
            .flows
            .iter()
            .enumerate()
            .map(|(i, f)| (i, f.backlog))
            .max_by_key(|&(_, b)| b)
        else {
            return;
        };
        let threshold = max / 2;
        let mut dropped = 0u64;
        let mut n = 0;
        while n < 64 && dropped <= threshold {
            let Some(e) = self.pop_head(u16::try_from(f).unwrap_or(0)) else {
                break;
            };
            dropped += u64::from(self.ents[e as usize].len);
            self.release(Handle(e));
            self.counts.drop_limit += 1;
            n += 1;
        }
    }

    /// Flow of a packet stored at `slot` (`n` bytes, header `hdr_len`): the IP addresses,
    /// protocol and ports where the frame has them (IPv4, IPv6, behind one VLAN tag), else the
    /// Ethernet addresses.
    fn classify(&mut self, slot: u32, hdr_len: usize, n: usize) -> u16 {
        let nflows = self.flows.len() as u64;
        if nflows == 1 {
            return 0;
        }
        let b = &self.slot_mut(slot)[..n];
        let f = b.get(hdr_len..).unwrap_or(&[]);
        u16::try_from(flow_hash(f) % nflows).unwrap_or(0)
    }

    /// CoDel's dequeue over flow `f` (`codel_dequeue`): the head is dropped while its sojourn
    /// stays above target for an interval, at a rate growing with the square root of the
    /// drops.
    fn codel_dequeue(&mut self, f: u16, now: u64) -> Option<u32> {
        let interval = self.cfg.interval_ns;
        let mut e = self.pop_head(f);
        let Some(mut cur) = e else {
            self.flows[usize::from(f)].codel.dropping = false;
            return None;
        };
        let drop = self.should_drop(f, Some(cur), now);
        let fi = usize::from(f);
        if self.flows[fi].codel.dropping {
            if !drop {
                self.flows[fi].codel.dropping = false;
            } else if now >= self.flows[fi].codel.drop_next {
                while self.flows[fi].codel.dropping && now >= self.flows[fi].codel.drop_next {
                    self.flows[fi].codel.count += 1;
                    if self.mark_ce(cur) {
                        // Marked, not dropped: it goes, and the next mark is due later.
                        let c = &mut self.flows[fi].codel;
                        c.drop_next = control_law(c.drop_next, interval, c.count);
                        break;
                    }
                    self.drop_ent(cur);
                    e = self.pop_head(f);
                    if !self.should_drop(f, e, now) {
                        self.flows[fi].codel.dropping = false;
                    } else {
                        let c = &mut self.flows[fi].codel;
                        c.drop_next = control_law(c.drop_next, interval, c.count);
                    }
                    match e {
                        Some(x) => cur = x,
                        None => break,
                    }
                }
            }
        } else if drop {
            if !self.mark_ce(cur) {
                self.drop_ent(cur);
                e = self.pop_head(f);
                // Whether the new head is above target too only moves `first_above` here.
                self.should_drop(f, e, now);
            }
            let c = &mut self.flows[fi].codel;
            c.dropping = true;
            let delta = c.count.wrapping_sub(c.lastcount);
            let since = i128::from(now) - i128::from(c.drop_next);
            c.count = if delta > 1 && since < 16 * i128::from(interval) {
                delta
            } else {
                1
            };
            c.lastcount = c.count;
            c.drop_next = control_law(now, interval, c.count);
        }
        e
    }

    fn drop_ent(&mut self, e: u32) {
        self.release(Handle(e));
        self.counts.drop_aqm += 1;
    }

    /// Where CoDel would drop `e`: with `ecn`, sets CE in its IP header if its sender can
    /// take a mark for a loss (counted); false: drop it.
    fn mark_ce(&mut self, e: u32) -> bool {
        if !self.cfg.ecn {
            return false;
        }
        let en = self.ents[e as usize];
        let b = self.slot_mut(en.slot);
        let frame = b
            .get_mut(en.hdr_len as usize..en.len as usize)
            .unwrap_or(&mut []);
        let marked = pvnet_net::ecn::set_ce(frame);
        self.counts.ecn_mark += u64::from(marked);
        marked
    }

    /// `codel_should_drop`: the head `e`'s sojourn time is above target (and more than one
    /// MTU waits), and has been for an interval.
    fn should_drop(&mut self, f: u16, e: Option<u32>, now: u64) -> bool {
        let (target, interval) = (self.cfg.target_ns, self.cfg.interval_ns);
        let backlog = self.backlog;
        let c = &mut self.flows[usize::from(f)].codel;
        let Some(e) = e else {
            c.first_above = 0;
            return false;
        };
        let sojourn = now.saturating_sub(self.ents[e as usize].t);
        if sojourn < target || backlog <= 1514 {
            c.first_above = 0;
            return false;
        }
        if c.first_above == 0 {
            c.first_above = now + interval;
            false
        } else {
            now > c.first_above
        }
    }
}

/// Next drop time: `t + interval / sqrt(count)` (`codel_control_law`).
fn control_law(t: u64, interval: u64, count: u32) -> u64 {
    let c = f64::from(count.max(1));
    // Interval and count are far below 2^52: the quotient is exact enough and fits.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let step = (interval as f64 / c.sqrt()) as u64;
    t + step
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::tap::tests::{fold, sum};
    use virtq::Seg;

    const MS: u64 = 1_000_000;

    /// A UDP/IPv4 frame of `len` bytes (12-byte header in front) from source port `sport`,
    /// carrying `tag` in its last 4 bytes.
    fn frame(sport: u16, len: usize, tag: u32) -> Vec<u8> {
        let mut b = crate::testing::udp_frame(12, sport, len);
        let n = b.len();
        b[n - 4..].copy_from_slice(&tag.to_le_bytes());
        b
    }

    fn put(q: &mut Queue, sport: u16, len: usize, tag: u32, now: u64) -> bool {
        put_tos(q, sport, len, tag, now, 0)
    }

    /// The IPv4 header checksum of `h` summed from scratch: 0 when valid.
    fn ip_sum(h: &[u8]) -> u16 {
        !fold(sum(h, 0))
    }

    /// [`put`] with the IPv4 TOS byte `tos` (its low two bits the ECN field).
    fn put_tos(q: &mut Queue, sport: u16, len: usize, tag: u32, now: u64, tos: u8) -> bool {
        let mut b = frame(sport, len, tag);
        if tos != 0 {
            // 12-byte header, 14-byte Ethernet header: the IPv4 header at 26.
            b[27] = tos;
            b[36..38].fill(0);
            let c = ip_sum(&b[26..46]);
            b[36..38].copy_from_slice(&c.to_be_bytes());
        }
        let n = u32::try_from(b.len()).unwrap();
        let segs = [Seg::from_mut(&mut b)];
        q.enqueue(
            &Pkt {
                segs: &segs,
                len: n,
                hdr_len: 12,
                hdr: VnetHdr::default(),
                macs: [0; 12],
                hash: 0,
                vlan: 0,
            },
            now,
        )
    }

    /// Dequeues one packet at `now`: its bytes, header first.
    fn take_bytes(q: &mut Queue, now: u64) -> Option<Vec<u8>> {
        let h = q.dequeue(now)?;
        let (seg, meta) = q.get(h);
        let mut b = vec![0u8; meta.len as usize];
        seg.read(0, &mut b);
        q.release(h);
        Some(b)
    }

    /// Dequeues one packet at `now`: (source port, tag).
    fn take(q: &mut Queue, now: u64) -> Option<(u16, u32)> {
        let b = take_bytes(q, now)?;
        let f = &b[12..];
        let n = f.len();
        Some((
            u16::from_be_bytes([f[34], f[35]]),
            u32::from_le_bytes(f[n - 4..].try_into().unwrap()),
        ))
    }

    /// Dequeues one packet at `now`: its IPv4 TOS byte, and whether its header checksum holds.
    fn take_tos(q: &mut Queue, now: u64) -> Option<(u8, bool)> {
        let b = take_bytes(q, now)?;
        Some((b[27], ip_sum(&b[26..46]) == 0))
    }

    fn fifo(limit: u32) -> Queue {
        Queue::new(QueueConfig {
            qdisc: Qdisc::Fifo,
            limit,
            ..QueueConfig::default()
        })
    }

    #[test]
    fn fifo_keeps_order_and_tail_drops() {
        let mut q = fifo(4);
        for t in 0..6 {
            let ok = put(&mut q, 1000 + u16::try_from(t).unwrap(), 64, t, 0);
            assert_eq!(ok, t < 4, "packet {t}");
        }
        assert_eq!(q.len(), 4);
        let got: Vec<u32> = std::iter::from_fn(|| take(&mut q, 0))
            .map(|x| x.1)
            .collect();
        assert_eq!(got, vec![0, 1, 2, 3]);
        let c = q.take_counts();
        assert_eq!((c.queued, c.dequeued, c.drop_limit), (4, 4, 2));
        assert!(q.is_empty());
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn requeued_packet_goes_first() {
        let mut q = Queue::new(QueueConfig::default());
        put(&mut q, 1, 64, 10, 0);
        put(&mut q, 1, 64, 11, 0);
        let h = q.dequeue(0).unwrap();
        q.requeue(h);
        assert_eq!(q.len(), 2);
        assert_eq!(take(&mut q, 0), Some((1, 10)));
        assert_eq!(take(&mut q, 0), Some((1, 11)));
        assert_eq!(q.take_counts().dequeued, 2);
    }

    #[test]
    fn drr_shares_bytes_fairly_and_a_sparse_flow_goes_first() {
        let mut q = Queue::new(QueueConfig::default());
        // A bulk flow with 200 packets of 1000 bytes waiting.
        for t in 0..200 {
            put(&mut q, 5000, 1000, t, 0);
        }
        // Take a few: the bulk flow now sits in the old list.
        for _ in 0..3 {
            assert_eq!(take(&mut q, 0).unwrap().0, 5000);
        }
        // A request arrives on another flow: it is a new flow and goes next.
        put(&mut q, 7000, 64, 1, 0);
        assert_eq!(take(&mut q, 0), Some((7000, 1)));
        // Two bulk flows of equal sizes share in turns by quantum.
        let mut q = Queue::new(QueueConfig::default());
        for t in 0..50 {
            put(&mut q, 100, 1000, t, 0);
            put(&mut q, 200, 1000, t, 0);
        }
        let first40: Vec<u16> = (0..40).map(|_| take(&mut q, 0).unwrap().0).collect();
        let a = first40.iter().filter(|&&p| p == 100).count();
        assert!((18..=22).contains(&a), "flow 100 got {a} of 40");
    }

    #[test]
    fn codel_drops_only_after_the_delay_stays_above_target_for_an_interval() {
        let mut q = Queue::new(QueueConfig::default());
        // 1000 packets of 1000 bytes queued at t=0, drained one per ms: sojourn grows.
        for t in 0..1000 {
            assert!(put(&mut q, 1, 1000, t, 0));
        }
        let mut now = 0;
        let mut got = 0;
        while take(&mut q, now).is_some() {
            got += 1;
            now += MS;
            if now <= 105 * MS {
                // Above target from 5 ms on, but not yet for an interval (100 ms).
                assert_eq!(q.counts.drop_aqm, 0, "no drop before target + interval");
            }
        }
        let c = q.take_counts();
        assert!(c.drop_aqm > 0, "a standing queue must be controlled");
        assert_eq!(c.queued, 1000);
        assert_eq!(
            c.dequeued + c.drop_aqm,
            1000,
            "every packet out or counted: {c:?}"
        );
        assert_eq!(got, c.dequeued);
    }

    /// The standing queue above, every packet ECN-capable (ECT(0)): where CoDel would drop,
    /// it marks CE and sends, so every packet is delivered, as many carrying CE as were
    /// counted, each header's checksum still valid; with `ecn: false`, dropped as before.
    #[test]
    fn codel_marks_ecn_capable_packets_instead_of_dropping_them() {
        for ecn in [true, false] {
            let mut q = Queue::new(QueueConfig {
                ecn,
                ..QueueConfig::default()
            });
            for t in 0..1000 {
                assert!(put_tos(&mut q, 1, 1000, t, 0, 0xb8 | 0x02));
            }
            let (mut now, mut ce) = (0, 0u64);
            while let Some((tos, sum_ok)) = take_tos(&mut q, now) {
                assert!(sum_ok, "the IPv4 checksum holds");
                assert_eq!(tos & !3, 0xb8, "DSCP untouched");
                ce += u64::from(tos & 3 == 3);
                now += MS;
            }
            let c = q.take_counts();
            if ecn {
                assert_eq!(c.drop_aqm, 0, "{c:?}");
                assert!(c.ecn_mark > 0, "the standing queue is signalled: {c:?}");
                assert_eq!(c.dequeued, 1000);
                assert_eq!(ce, c.ecn_mark);
            } else {
                assert_eq!((c.ecn_mark, ce), (0, 0));
                assert!(c.drop_aqm > 0, "{c:?}");
            }
        }
    }

    #[test]
    fn codel_leaves_a_queue_under_target_alone() {
        let mut q = Queue::new(QueueConfig::default());
        let mut now = 0;
        for t in 0..10_000u32 {
            put(&mut q, 1, 1000, t, now);
            put(&mut q, 1, 1000, t, now);
            now += MS / 10;
            take(&mut q, now);
            take(&mut q, now);
        }
        assert_eq!(q.take_counts().drop_aqm, 0);
    }

    #[test]
    fn full_fq_codel_drops_from_the_fattest_flow() {
        let mut q = Queue::new(QueueConfig {
            limit: 100,
            ..QueueConfig::default()
        });
        for t in 0..100 {
            assert!(put(&mut q, 1, 500, t, 0));
        }
        // Full: a packet of another flow gets in; the bulk flow pays.
        assert!(put(&mut q, 2, 64, 999, 0));
        let c = q.take_counts();
        assert!(c.drop_limit >= 1 && c.drop_limit <= 64, "{c:?}");
        let mut seen_sparse = false;
        while let Some((p, tag)) = take(&mut q, 0) {
            if p == 2 {
                assert_eq!(tag, 999);
                seen_sparse = true;
            }
        }
        assert!(seen_sparse);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn purge_empties_and_slots_come_back() {
        let mut q = Queue::new(QueueConfig {
            limit: 8,
            ..QueueConfig::default()
        });
        for round in 0..3 {
            for t in 0..8 {
                assert!(
                    put(&mut q, u16::try_from(t).unwrap(), 64, t, 0),
                    "round {round}"
                );
            }
            let h = q.dequeue(0).unwrap();
            q.requeue(h);
            assert_eq!(q.purge(), 8);
            assert!(q.is_empty());
        }
        // A GSO-sized packet takes a large slot.
        assert!(put(&mut q, 1, 60_000, 5, 0));
        assert_eq!(take(&mut q, 0), Some((1, 5)));
    }
}
