//! Where backpressure is decided: one [`Egress`] per port's transmit side (a frontend's
//! receive ring, a tap).
//!
//! When a port has no room for a packet, what happens to it is the egress queue's decision,
//! and nowhere else's. Today the queue holds no packets of its own: a packet that may wait
//! stays where it is (in the sender's ring, a tap's read buffer, or not yet generated), which
//! costs the sender nothing but its buffer; the queue decides how long it may wait:
//!
//! * [`HoldPolicy::Forever`]: wait as long as it takes (bench roles, where nothing else shares
//!   the sender's ring: backpressure, nothing lost);
//! * [`HoldPolicy::Bounded`]: a unicast packet waits at most this long for buffers, then it and
//!   what follows are dropped (`no_buffer`) so that one stalled receiver cannot stall its
//!   sender's traffic to everyone else for long (the switch: 2 ms); a flooded copy never
//!   waits; a generator's frames always wait (nothing is in flight yet, so waiting loses
//!   nothing and dropping would only burn the core).
//!
//! The dynamic-queue-limit issue gives it packets to hold, a byte limit and a scheduler; the
//! interface stays: a packet offered, an answer (sent, wait, or dropped with a reason).

use crate::stats::DropReason;
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
pub enum Offer {
    /// One copy of a flooded packet: never waits (the others went out).
    Flood,
    /// A unicast packet from a sender whose other traffic waits behind it.
    Unicast,
    /// A packet that can wait at no cost to anyone (a generator's next frame).
    Patient,
}

/// What to do with a packet the port had no room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backpressure {
    /// Leave it where it is; it is offered again next round.
    Wait,
    /// Drop it, counted.
    Drop(DropReason),
}

/// The transmit side's queue state of one port.
#[derive(Debug, Clone, Copy)]
pub struct Egress {
    policy: HoldPolicy,
    /// Since when a packet has waited for room (None: nothing waits).
    held_since: Option<Instant>,
    /// The port ran out of room this round: the poll loop watches its buffers.
    blocked: bool,
}

impl Egress {
    /// An empty queue.
    pub fn new(policy: HoldPolicy) -> Self {
        Self {
            policy,
            held_since: None,
            blocked: false,
        }
    }

    /// The port took a packet.
    #[inline]
    pub fn sent(&mut self) {
        // Nearly always nothing waited: no store then.
        if self.blocked || self.held_since.is_some() {
            self.held_since = None;
            self.blocked = false;
        }
    }

    /// The port had no room for a packet offered as `offer` at `now`.
    #[inline]
    pub fn no_room(&mut self, offer: Offer, now: Instant) -> Backpressure {
        self.blocked = true;
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

    /// Whether the port ran out of room since the last [`new_round`](Self::new_round): the
    /// poll loop then waits on its buffers.
    #[inline]
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// A new round: a sender that still waits offers its packet again and blocks the port
    /// again; one that gave up (a generator that finished) no longer keeps it watched.
    #[inline]
    pub fn new_round(&mut self) {
        self.blocked = false;
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
