//! The poll loop's decisions, with no I/O: what a shard does after each round (poll on, or
//! arm and sleep until when), and when a held-back call to a driver goes out. Time comes in as
//! a value, so every decision is tested with a fake clock.
//!
//! A round ends with every queue the shard waits on saying what it wants ([`Settle`]):
//! a queue that had work keeps the shard polling; an idle one answers from its [`Poller`]
//! (poll, arm, or wake by a deadline). Only when no queue wants polling does the shard arm
//! notifications (arm, fence, re-check: the ports do that) and sleep, until the earliest
//! deadline or owed call ([`Plan`]).

use super::{Idle, Poller};
use std::time::{Duration, Instant};

/// What the shard does after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Some queue wants polling: run another round now.
    Poll,
    /// Every queue may sleep: arm, re-check, then sleep until this (None: until an event).
    Sleep(Option<Instant>),
}

/// The answers of one round's queues, combined.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Settle {
    poll: bool,
    deadline: Option<Instant>,
}

impl Settle {
    /// A round's answers so far: none.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// One queue's answer: `worked` if it had work this round (its poller learns the end of a
    /// gap), else, if the shard waits on it (`wanted`), what its poller wants now.
    #[inline]
    pub(crate) fn queue(&mut self, poller: &mut Poller, worked: bool, wanted: bool, now: Instant) {
        if worked {
            poller.on_work(now);
            self.poll = true;
        } else if wanted {
            self.idle(poller.on_empty(now));
        }
    }

    /// An answer given directly (a port that is not a ring: a tap, a generator).
    #[inline]
    pub(crate) fn idle(&mut self, idle: Idle) {
        match idle {
            Idle::Poll => self.poll = true,
            Idle::Arm => {}
            Idle::Until(t) => self.wake_by(t),
        }
    }

    /// The shard must be awake by `t` (an owed call, a paced generator).
    #[inline]
    pub(crate) fn wake_by(&mut self, t: Instant) {
        self.deadline = Some(self.deadline.map_or(t, |d| d.min(t)));
    }

    /// The decision.
    pub(crate) fn plan(&self) -> Plan {
        if self.poll {
            Plan::Poll
        } else {
            Plan::Sleep(self.deadline)
        }
    }
}

/// Interrupt coalescing for one queue's calls to its driver (like a NIC's tx-usecs).
///
/// A call after transmit completions only lets the driver free buffers (a Linux driver also
/// frees them from its next transmit): it is owed, and goes out `bound` after it was first
/// owed, or at once when the driver is called anyway (received packets) or is waiting for
/// buffers. Every other call goes out at once.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Calls {
    owed_since: Option<Instant>,
    owed: bool,
}

impl Calls {
    /// A completion call is owed (not sent yet). The bound starts at the first flush that
    /// sees it (the end of the round that owed it).
    #[inline]
    pub(crate) fn owe(&mut self) {
        self.owed = true;
    }

    /// Whether the owed call (if any) goes out now: when `force`d (the driver was called for
    /// something else) or once it has been owed for `bound`.
    #[inline]
    pub(crate) fn flush(&mut self, now: Instant, bound: Duration, force: bool) -> bool {
        if !self.owed {
            return false;
        }
        let since = *self.owed_since.get_or_insert(now);
        if force || now.saturating_duration_since(since) >= bound {
            self.owed = false;
            self.owed_since = None;
            return true;
        }
        false
    }

    /// When the owed call falls due (the shard must be awake then).
    #[inline]
    pub(crate) fn due(&self, bound: Duration) -> Option<Instant> {
        self.owed_since.filter(|_| self.owed).map(|t| t + bound)
    }
}

/// How long completion calls are held back: the configured delay, at least two wake-ups (the
/// adaptive polling window's own bound), so coalescing never costs less than sleeping would.
pub(crate) fn call_bound(delay: Duration, wake: Duration) -> Duration {
    delay.max(wake * 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::{Policy, WakeCost};

    fn wake() -> WakeCost {
        WakeCost {
            typical: Duration::from_micros(30),
            floor: Duration::from_micros(10),
        }
    }

    #[test]
    fn a_queue_with_work_keeps_the_shard_polling() {
        let t0 = Instant::now();
        let mut busy = Poller::new(Policy::Notify, wake());
        let mut idle = Poller::new(Policy::Notify, wake());
        let mut s = Settle::new();
        s.queue(&mut busy, true, true, t0);
        s.queue(&mut idle, false, true, t0);
        assert_eq!(s.plan(), Plan::Poll);
    }

    #[test]
    fn idle_queues_sleep_until_the_earliest_deadline() {
        let t0 = Instant::now();
        let period = Duration::from_micros(100);
        let mut timer = Poller::new(Policy::Timer(period), wake());
        let mut notify = Poller::new(Policy::Notify, wake());
        let mut s = Settle::new();
        s.queue(&mut notify, false, true, t0);
        s.queue(&mut timer, false, true, t0);
        let Plan::Sleep(Some(t)) = s.plan() else {
            panic!("timer queue must set a deadline: {:?}", s.plan());
        };
        assert!(t > t0 && t <= t0 + period, "{:?}", t - t0);
        // A call owed sooner than the timer moves the deadline.
        s.wake_by(t0 + Duration::from_micros(5));
        assert_eq!(s.plan(), Plan::Sleep(Some(t0 + Duration::from_micros(5))));
    }

    #[test]
    fn an_unwanted_idle_queue_does_not_keep_the_shard_awake() {
        let t0 = Instant::now();
        let mut busy = Poller::new(Policy::Busy, wake());
        let mut s = Settle::new();
        // A receive ring nobody is waiting for: its policy does not matter.
        s.queue(&mut busy, false, false, t0);
        assert_eq!(s.plan(), Plan::Sleep(None));
        s.queue(&mut busy, false, true, t0);
        assert_eq!(s.plan(), Plan::Poll);
    }

    #[test]
    fn adaptive_polls_within_its_window_then_sleeps() {
        let t0 = Instant::now();
        let mut p = Poller::new(Policy::Adaptive, wake());
        // Work arriving every 2 us: a short gap, learned.
        let mut t = t0;
        for _ in 0..64 {
            p.on_work(t);
            t += Duration::from_micros(2);
            let mut s = Settle::new();
            s.queue(&mut p, false, true, t);
        }
        let mut s = Settle::new();
        s.queue(&mut p, false, true, t + Duration::from_micros(1));
        assert_eq!(s.plan(), Plan::Poll, "inside the learned window");
        let mut s = Settle::new();
        s.queue(&mut p, false, true, t + Duration::from_millis(1));
        assert_eq!(s.plan(), Plan::Sleep(None), "far past it: arm and sleep");
    }

    #[test]
    fn owed_calls_go_out_after_the_bound_or_when_forced() {
        let t0 = Instant::now();
        let bound = call_bound(Duration::from_micros(150), Duration::from_micros(30));
        assert_eq!(bound, Duration::from_micros(150));
        assert_eq!(
            call_bound(Duration::ZERO, Duration::from_micros(30)),
            Duration::from_micros(60)
        );
        let mut c = Calls::default();
        assert!(!c.flush(t0, bound, true), "nothing owed, nothing sent");
        c.owe();
        assert!(!c.flush(t0, bound, false));
        assert_eq!(c.due(bound), Some(t0 + bound));
        // More completions while owed do not move the bound.
        c.owe();
        assert!(!c.flush(t0 + bound / 2, bound, false));
        assert!(c.flush(t0 + bound, bound, false), "due");
        assert_eq!(c.due(bound), None);
        c.owe();
        assert!(!c.flush(t0 + bound * 2, bound, false));
        assert!(
            c.flush(t0 + bound * 2, bound, true),
            "the driver is called anyway"
        );
    }
}
