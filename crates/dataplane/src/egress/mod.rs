//! Where backpressure is decided: one [`Egress`] per port's transmit side (a frontend's
//! receive ring, a tap).
//!
//! When a port has no room for a packet, what happens to it is the egress's decision, and
//! nowhere else's. Two ways:
//!
//! * **No queue** (the bench roles, the tap): a packet that may wait stays where it is (in
//!   the sender's ring, a tap's read buffer, or not yet generated), which costs the sender
//!   nothing but its buffer; [`HoldPolicy`] says how long it may:
//!   - [`HoldPolicy::Forever`]: as long as it takes (bench roles: backpressure, nothing lost);
//!   - [`HoldPolicy::Bounded`]: a unicast packet waits at most this long for buffers, then it
//!     and what follows are dropped (`no_buffer`) so that one stalled receiver cannot stall its
//!     sender's traffic to everyone else for long; a flooded copy never waits; a generator's
//!     frames always wait (nothing is in flight yet, so waiting loses nothing).
//! * **A queue** ([`queue::Queue`], the switch's vhost-user ports by default): packets that
//!   find no room are copied into the receiver's egress queue and the sender gets its buffer
//!   back at once; a scheduler ([`queue::Qdisc`]: `fifo` or `fq_codel`) decides the order and
//!   the drops (`queue_limit`, `aqm`). Each round the port drains its queue first, in bulk: as
//!   many packets as the device queue's dynamic limit ([`dql::Dql`]) allows, in one batch (one
//!   publish, one call). While something waits, new packets queue behind it (a flow's order
//!   holds); while nothing does, packets go straight to the receiver (no copy, no queue).
//!
//! The device queue here is the frontend's receive ring: a packet is in it from the moment
//! pvnet writes it until the frontend gives the buffer back (posts it again), which is the
//! completion DQL learns from, in buffers.

pub(crate) mod dql;
pub(crate) mod drain;
pub(crate) mod pace;
pub(crate) mod queue;

use crate::pkt::Pkt;
use crate::stats::{bump, DropReason, PortStats};
use dql::Dql;
use pace::Pace;
use queue::{Queue, QueueConfig, QueueCounts};
use std::time::{Duration, Instant};

/// How long a packet may wait for room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldPolicy {
    /// As long as it takes.
    Forever,
    /// At most this long, for unicast packets; flooded copies never wait.
    Bounded(Duration),
}

/// Who offers a packet, as far as waiting goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    /// One copy of a flooded packet: never waits in its sender (the others went out).
    Flood,
    /// A unicast packet from a sender whose other traffic waits behind it.
    Unicast,
    /// A packet that can wait at no cost to anyone (a generator's next frame).
    Patient,
}

/// What to do with a packet the port had no room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backpressure {
    /// Leave it where it is; it is offered again next round.
    Wait,
    /// Copy it (and what follows in its run) into the egress queue.
    Queue,
    /// Drop it, counted.
    Drop(DropReason),
}

/// Fewest buffers the device queue limit goes down to, whatever the batch: a Linux guest
/// gives receive buffers back only once more than half its NAPI budget (64) is used, so a
/// limit under that could wait for a completion that never comes.
pub(crate) const DQL_MIN_BUFFERS: u32 = 64;

/// Fewest buffers the ceiling from the receiver's pace ([`pace`]) lets the limit have: a NAPI
/// budget and a half. A Linux guest overloaded by a flood (its application reads less than
/// reaches it) needs its ring to stay fuller than one poll takes, or NAPI runs dry at each
/// poll, re-arms, and its receive work takes the CPU in interrupt context ahead of the
/// application (receive livelock): measured with the TCG guest flooded alone, a ceiling of 64
/// left its application 0.45-0.58x of the flood, 96 and 128 gave it 0.97-1.00x
/// (docs/egress.md, the flood alone). Below two of the paced receiver's bursts of 64 (128),
/// a request that fq_codel puts first after a hand-back is still within the receiver's next
/// take, so the paced receiver's request latency is that of 64 (one-way p99 0.19x FIFO's;
/// 0.22x at 128).
pub(crate) const CEILING_MIN_BUFFERS: u32 = 96;

/// The device queue limit's floor for a port that moves `batch` packets per round: two
/// batches (one the frontend is taking while pvnet writes the next; below that the limit
/// cuts the batches themselves and bulk dequeue is lost: `docs/egress.md`, the device queue
/// and its limit), and never under [`DQL_MIN_BUFFERS`].
pub(crate) fn dql_floor(batch: usize) -> u32 {
    u32::try_from(batch.saturating_mul(2))
        .unwrap_or(u32::MAX)
        .max(DQL_MIN_BUFFERS)
}

/// Longest a unicast packet waits for its receiver's buffers before it is dropped: a switch
/// port's hold ([`HoldPolicy::Bounded`]), with or without a queue.
pub const HOLD: Duration = Duration::from_millis(2);

/// Longest the queue may fail to send anything while packets wait; then they are dropped
/// (`no_buffer`) and their memory freed (a receiver that stopped taking packets).
pub(crate) const STALL: Duration = Duration::from_secs(1);

/// A port's egress settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressConfig {
    /// How long a packet waits in its sender when there is no queue.
    pub hold: HoldPolicy,
    /// The egress queue (None: packets wait in their senders).
    pub queue: Option<QueueConfig>,
    /// Bound what is in the device queue by a dynamic queue limit (with a queue only).
    pub dql: bool,
    /// Drain as many packets per round as the limit allows (false: one per dequeue, each
    /// its own publish and call, for comparison).
    pub bulk: bool,
    /// With DQL: the time a packet should wait in the ring beyond the receiver's burst, which
    /// with the receiver's measured pace caps the limit ([`pace`]); zero: no cap (DQL alone,
    /// as Linux has it).
    pub dql_target: Duration,
    /// With the cap: a receiver seen asleep on an empty ring while the limit held packets back
    /// raises it (a reserve on the target, [`pace`]), on trial: the reserve is kept only if
    /// the receiver's rate is higher with it than without it (a NAPI poll that runs dry and
    /// waits for its interrupt), not for a receiver that sleeps on its own clock; false: the
    /// target alone. On by default (docs/egress.md).
    pub dql_witness: bool,
}

impl EgressConfig {
    /// No queue: packets wait in their senders under `hold`.
    pub fn hold(hold: HoldPolicy) -> Self {
        Self {
            hold,
            queue: None,
            dql: false,
            bulk: true,
            dql_target: Duration::ZERO,
            dql_witness: false,
        }
    }

    /// A switch port's default: fq_codel with DQL, bulk dequeue.
    pub fn switch_default() -> Self {
        Self {
            hold: HoldPolicy::Bounded(HOLD),
            queue: Some(QueueConfig::default()),
            dql: true,
            bulk: true,
            dql_target: pace::TARGET,
            dql_witness: true,
        }
    }
}

/// The transmit side's queue state of one port.
#[derive(Debug)]
pub(crate) struct Egress {
    policy: HoldPolicy,
    /// Since when a packet has waited for room (None: nothing waits).
    held_since: Option<Instant>,
    /// The port ran out of room this round: the poll loop watches its buffers.
    blocked: bool,
    /// The queue, when packets wait here (moved out while it drains).
    queue: Option<Box<Queue>>,
    has_queue: bool,
    dql: Option<Dql>,
    /// The receiver's pace, which caps the limit (with DQL and a target).
    pace: Option<Pace>,
    /// The limit's floor, in buffers.
    floor: u32,
    bulk: bool,
    epoch: Instant,
    /// Buffers the frontend had posted in all, as last seen (None: not seen yet).
    posted: Option<u32>,
    /// Buffers used in all.
    used: u32,
    /// The last publish crossed the limit with packets waiting: the limit held them back.
    held: bool,
    /// Whether a witnessed idle raises the ceiling ([`EgressConfig::dql_witness`]).
    witness: bool,
    /// Since when the queue has sent nothing while packets wait.
    stalled_since: Option<Instant>,
}

impl Egress {
    /// An empty egress with no queue.
    pub(crate) fn new(policy: HoldPolicy) -> Self {
        Self::with(EgressConfig::hold(policy), DQL_MIN_BUFFERS)
    }

    /// An empty egress as configured (the queue's memory is allocated here), whose device
    /// queue limit stays at or above `floor` buffers (see [`dql_floor`]).
    pub(crate) fn with(cfg: EgressConfig, floor: u32) -> Self {
        let epoch = Instant::now();
        Self {
            policy: cfg.hold,
            held_since: None,
            blocked: false,
            queue: cfg.queue.map(|q| Box::new(Queue::new(q))),
            has_queue: cfg.queue.is_some(),
            dql: (cfg.queue.is_some() && cfg.dql).then(|| Dql::new(floor, 0)),
            pace: (cfg.queue.is_some() && cfg.dql && !cfg.dql_target.is_zero())
                .then(|| Pace::new(cfg.dql_target)),
            floor,
            bulk: cfg.bulk,
            epoch,
            posted: None,
            used: 0,
            held: false,
            witness: cfg.dql_witness,
            stalled_since: None,
        }
    }

    /// Nanoseconds since this egress began (its queue's and DQL's clock).
    #[inline]
    pub(crate) fn ns(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The port took a packet.
    #[inline]
    pub(crate) fn sent(&mut self) {
        // Nearly always nothing waited: no store then.
        if self.blocked || self.held_since.is_some() {
            self.held_since = None;
            self.blocked = false;
        }
    }

    /// The port had no room for a packet offered as `offer` at `now`.
    #[inline]
    pub(crate) fn no_room(&mut self, offer: Offer, now: Instant) -> Backpressure {
        self.blocked = true;
        if self.has_queue && offer != Offer::Patient {
            return Backpressure::Queue;
        }
        let since = *self.held_since.get_or_insert(now);
        let wait = match (offer, self.policy) {
            (Offer::Flood, _) => false,
            (Offer::Patient, _) | (_, HoldPolicy::Forever) => true,
            (Offer::Unicast, HoldPolicy::Bounded(max)) => {
                now.saturating_duration_since(since) < max
            }
        };
        if wait {
            Backpressure::Wait
        } else {
            Backpressure::Drop(DropReason::NoBuffer)
        }
    }

    /// Whether it keeps a queue.
    #[inline]
    pub(crate) fn has_queue(&self) -> bool {
        self.has_queue
    }

    /// Packets wait in the queue: new ones must queue behind them.
    #[inline]
    pub(crate) fn backlogged(&self) -> bool {
        self.has_queue && self.queue.as_ref().is_some_and(|q| !q.is_empty())
    }

    /// Copies `pkts` into the queue at `now`; returns the counts (drops included). Without a
    /// queue every packet is dropped (`no_buffer`) and counted as `drop_limit`.
    pub(crate) fn enqueue(&mut self, pkts: &[Pkt<'_>], now: Instant) -> QueueCounts {
        let t = self.ns(now);
        self.blocked = true;
        match self.queue.as_mut() {
            Some(q) => {
                for p in pkts {
                    q.enqueue(p, t);
                }
                q.take_counts()
            }
            None => QueueCounts {
                drop_limit: pkts.len() as u64,
                ..QueueCounts::default()
            },
        }
    }

    /// Packets waiting, if there is a queue.
    pub(crate) fn queue_len(&self) -> Option<u32> {
        self.queue.as_ref().map(|q| q.len())
    }

    /// Takes the queue out to drain it (the port lends it packets from it while delivering).
    pub(crate) fn take_queue(&mut self) -> Option<Box<Queue>> {
        self.queue.take()
    }

    /// Puts the queue back after a drain that sent `sent` packets at `now`; `true` if it has
    /// failed to send anything for [`STALL`] while packets waited (the caller purges it).
    pub(crate) fn put_queue(&mut self, q: Box<Queue>, sent: usize, now: Instant) -> bool {
        let stalled = if q.is_empty() || sent > 0 {
            self.stalled_since = None;
            false
        } else {
            let since = *self.stalled_since.get_or_insert(now);
            now.saturating_duration_since(since) >= STALL
        };
        if !q.is_empty() {
            self.blocked = true;
        }
        self.queue = Some(q);
        stalled
    }

    /// Packets per drain: all the limit allows, or one.
    #[inline]
    pub(crate) fn bulk(&self) -> bool {
        self.bulk
    }

    /// The device-queue limit, if one is kept.
    pub(crate) fn dql_limit(&self) -> Option<u32> {
        self.dql.as_ref().map(Dql::limit)
    }

    /// The reserve's trials judged since the last call, and how many kept it.
    pub(crate) fn take_trials(&mut self) -> (u64, u64) {
        self.pace.as_mut().map_or((0, 0), Pace::take_trials)
    }

    /// A receive batch opens: the frontend has `avail` buffers posted beyond the ones pvnet
    /// used. Buffers it posted since the last look complete what pvnet had put in the device
    /// queue. Returns how many buffers the batch may take (unbounded without DQL): while the
    /// limit is not reached, one more than it allows (Linux lets the queuing that crosses the
    /// limit through), then none.
    #[inline]
    pub(crate) fn cap(&mut self, avail: u16, now: Instant) -> usize {
        if self.dql.is_none() {
            return usize::MAX;
        }
        usize::try_from(self.budget(avail, now) + 1).unwrap_or(0)
    }

    /// [`cap`](Self::cap) for a device that counts its completions itself (an `AF_XDP`
    /// port's completion ring): `fresh` buffers completed since the last call.
    #[inline]
    pub(crate) fn cap_completed(&mut self, fresh: u32, now: Instant) -> usize {
        if self.dql.is_none() {
            return usize::MAX;
        }
        usize::try_from(self.credit(fresh, now) + 1).unwrap_or(0)
    }

    /// [`cap`](Self::cap)'s reckoning: completions credited, then how many more buffers the
    /// limit allows (negative: over it).
    fn budget(&mut self, avail: u16, now: Instant) -> i64 {
        if self.dql.is_none() {
            return i64::MAX;
        }
        let posted = self.used.wrapping_add(u32::from(avail));
        let fresh = self.posted.map_or(0, |prev| posted.wrapping_sub(prev));
        self.posted = Some(posted);
        self.credit(fresh, now)
    }

    /// `fresh` buffers completed (a wrapped, negative count is none): credited to DQL, and
    /// to the pace ceiling, which bounds the limit; then how many more buffers the limit
    /// allows (negative: over it).
    fn credit(&mut self, fresh: u32, now: Instant) -> i64 {
        let waiting = self.waiting();
        let Some(d) = self.dql.as_mut() else {
            return i64::MAX;
        };
        if fresh != 0 && (fresh as i32) > 0 {
            let t = u64::try_from(now.saturating_duration_since(self.epoch).as_nanos())
                .unwrap_or(u64::MAX);
            let fresh = fresh.min(d.in_flight());
            if let Some(max) = self
                .pace
                .as_mut()
                .and_then(|p| p.completed(fresh, t, waiting))
            {
                // Under the two-batch floor only for a receiver whose pace calls for less
                // (no batch of pvnet's outruns it), and never under what keeps a NAPI
                // receiver polling.
                let max = max.max(CEILING_MIN_BUFFERS);
                d.set_bounds(self.floor.min(max), max);
            }
            d.completed(fresh, t);
        }
        d.avail()
    }

    /// Packets wait for room: queued, or the queue is out being drained.
    #[inline]
    fn waiting(&self) -> bool {
        self.has_queue && self.queue.as_ref().is_none_or(|q| !q.is_empty())
    }

    /// `bufs` buffers were used in one batch (its publish).
    #[inline]
    pub(crate) fn used(&mut self, bufs: u32) {
        if bufs != 0 {
            self.used = self.used.wrapping_add(bufs);
            if let Some(d) = self.dql.as_mut() {
                d.queued(bufs);
                self.held = d.avail() < 0 && self.has_queue;
            }
        }
    }

    /// A publish at `now` found the receiver asleep on everything published before it
    /// (`virtq::DeviceQueue::driver_idle`); `ring`: its size. If the limit had held packets
    /// back at the previous publish, the receiver was starved by the limit, not late: its
    /// ceiling gets a step of reserve ([`pace`]) if the port asked for it (`dql_witness`).
    /// True if it was such a starvation (counted as the port's `dql_idle` either way). Called
    /// before the publish's [`used`](Self::used).
    #[cold]
    pub(crate) fn driver_idle(&mut self, now: Instant, ring: u16) -> bool {
        if !(self.held && self.waiting()) {
            return false;
        }
        let t = self.ns(now);
        if let Some(p) = self.pace.as_mut().filter(|_| self.witness) {
            p.idle(t, u32::from(ring));
        }
        true
    }

    /// The device ring started again: nothing of it is in flight, its counts start over.
    pub(crate) fn ring_restarted(&mut self) {
        self.posted = None;
        self.used = 0;
        self.held = false;
        if let Some(d) = self.dql.as_mut() {
            *d = Dql::new(self.floor, 0);
        }
        if let Some(p) = self.pace.as_mut() {
            p.restart();
        }
    }

    /// Drops everything waiting (the receiver went away or stopped taking packets): returns
    /// how many, for the caller to count under its reason.
    pub(crate) fn purge(&mut self) -> u64 {
        self.stalled_since = None;
        self.queue.as_mut().map_or(0, |q| {
            let n = q.purge();
            // The purge moved them out of the queue: not counted as dequeued.
            let _ = q.take_counts();
            n
        })
    }

    /// [`purge`](Self::purge), the packets counted in `stats` as dropped for `why` and its
    /// backlog gauge zeroed: returns how many.
    pub(crate) fn empty(&mut self, stats: &PortStats, why: DropReason) -> u64 {
        let n = self.purge();
        bump(&stats.drops[why as usize], n);
        stats.backlog.store(0, std::sync::atomic::Ordering::Relaxed);
        n
    }

    /// Whether the port ran out of room since the last [`new_round`](Self::new_round): the
    /// poll loop then waits on its buffers.
    #[inline]
    pub(crate) fn blocked(&self) -> bool {
        self.blocked
    }

    /// A new round: a sender that still waits offers its packet again and blocks the port
    /// again; one that gave up (a generator that finished) no longer keeps it watched; a
    /// queue with packets keeps it watched.
    #[inline]
    pub(crate) fn new_round(&mut self) {
        self.blocked = self.backlogged();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_hold_then_drop_and_floods_never_wait() {
        let t0 = Instant::now();
        let hold = Duration::from_millis(2);
        let mut e = Egress::new(HoldPolicy::Bounded(hold));
        assert_eq!(e.no_room(Offer::Unicast, t0), Backpressure::Wait);
        assert!(e.blocked());
        assert_eq!(e.no_room(Offer::Unicast, t0 + hold / 2), Backpressure::Wait);
        assert_eq!(
            e.no_room(Offer::Unicast, t0 + hold),
            Backpressure::Drop(DropReason::NoBuffer)
        );
        assert_eq!(
            e.no_room(Offer::Patient, t0 + hold * 10),
            Backpressure::Wait
        );
        assert_eq!(
            e.no_room(Offer::Flood, t0),
            Backpressure::Drop(DropReason::NoBuffer)
        );
        // Room again: the clock restarts.
        e.sent();
        assert!(!e.blocked());
        assert_eq!(
            e.no_room(Offer::Unicast, t0 + hold * 20),
            Backpressure::Wait
        );
        e.new_round();
        assert!(!e.blocked());
    }

    /// A device that counts its own completions (an `AF_XDP` port's completion ring): what
    /// it may put is the limit less what is in flight, completions credited as they come;
    /// a device that completes half of what it has each round gets a steady stream, never more
    /// in flight than the limit and one, and keeps its limit near the floor; without DQL, no bound.
    #[test]
    fn a_device_counting_its_completions_is_bounded_by_the_limit() {
        let t0 = Instant::now();
        let cfg = EgressConfig {
            queue: Some(QueueConfig::default()),
            dql: true,
            dql_target: Duration::ZERO,
            ..EgressConfig::switch_default()
        };
        let mut e = Egress::with(cfg, DQL_MIN_BUFFERS);
        let first = e.cap_completed(0, t0);
        assert_eq!(
            first,
            DQL_MIN_BUFFERS as usize + 1,
            "the limit starts at the floor"
        );
        e.used(u32::try_from(first).unwrap_or(0));
        assert_eq!(e.cap_completed(0, t0), 0, "over the limit: nothing more");
        let mut in_flight = u32::try_from(first).unwrap_or(0);
        let mut t = t0;
        let mut put = 0u64;
        for _ in 0..2000 {
            t += Duration::from_micros(10);
            let done = in_flight / 2;
            in_flight -= done;
            let cap = e.cap_completed(done, t);
            let limit = e.dql_limit().unwrap_or(0);
            assert!(
                in_flight + u32::try_from(cap).unwrap_or(u32::MAX) <= limit + 1,
                "{in_flight} in flight and {cap} more against a limit of {limit}"
            );
            e.used(u32::try_from(cap).unwrap_or(0));
            in_flight += u32::try_from(cap).unwrap_or(0);
            put += cap as u64;
        }
        assert!(
            put >= 2000 * 16,
            "completions make room: {put} put in 2000 rounds"
        );
        let limit = e.dql_limit().unwrap_or(0);
        assert!(
            (DQL_MIN_BUFFERS..=2 * DQL_MIN_BUFFERS).contains(&limit),
            "a device that keeps up needs little: {limit}"
        );
        let mut none = Egress::new(HoldPolicy::Forever);
        assert_eq!(none.cap_completed(5, t0), usize::MAX);
    }

    #[test]
    fn forever_waits_for_unicast() {
        let t0 = Instant::now();
        let mut e = Egress::new(HoldPolicy::Forever);
        assert_eq!(e.no_room(Offer::Unicast, t0), Backpressure::Wait);
        assert_eq!(
            e.no_room(Offer::Unicast, t0 + Duration::from_secs(60)),
            Backpressure::Wait
        );
    }
}
