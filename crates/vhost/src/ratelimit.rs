//! Log lines a peer can cause, bounded.
//!
//! A frontend decides how often it connects, breaks the protocol or breaks a ring; if each of
//! those wrote a line, a hostile one could fill the disk through the log. Every warning a peer
//! can cause goes through a [`RateLimit`]: a burst of [`BURST`] lines, then one per
//! [`PERIOD`]; each line that does get through says how many were held back before it
//! (`held_back`), so no event goes unaccounted.
//!
//! Time is passed in ([`RateLimit::allow`]), so the limit is tested without sleeping;
//! [`PeerLog`] is the shared, clocked form the session and listener code uses.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines let through at once before the limit applies.
pub(crate) const BURST: u32 = 10;
/// One more line may go out per period after the burst is spent.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);

/// A token bucket of log lines: [`BURST`] deep, refilled one per [`PERIOD`].
#[derive(Debug)]
pub(crate) struct RateLimit {
    tokens: u32,
    /// When the bucket last gained a token (or was first used).
    refilled: Option<Instant>,
    held_back: u64,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            tokens: BURST,
            refilled: None,
            held_back: 0,
        }
    }
}

impl RateLimit {
    /// May a line be written at `now`? `Some(n)`: yes, and `n` lines were held back since the
    /// last one written (say so in the line). `None`: no; it is counted.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        let since = *self.refilled.get_or_insert(now);
        let periods = now.saturating_duration_since(since).as_nanos() / PERIOD.as_nanos();
        if periods > 0 {
            let add = u32::try_from(periods).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(add).min(BURST);
            // Keep the fraction of a period already elapsed (no drift), unless the bucket
            // is full anyway.
            self.refilled = Some(if self.tokens == BURST {
                now
            } else {
                since + PERIOD * add
            });
        }
        if self.tokens == 0 {
            self.held_back += 1;
            return None;
        }
        self.tokens -= 1;
        Some(std::mem::take(&mut self.held_back))
    }

    /// Lines held back and not yet reported.
    #[cfg(test)]
    pub(crate) fn held_back(&self) -> u64 {
        self.held_back
    }
}

/// A `RateLimit` shared by every session of one listener (a switch port, or a backend
/// socket), on the wall clock.
#[derive(Debug, Default)]
pub struct PeerLog(Mutex<RateLimit>);

impl PeerLog {
    /// `RateLimit::allow` now.
    pub fn allow(&self) -> Option<u64> {
        // A poisoned lock only means a panic elsewhere mid-update: the counts are still
        // usable.
        let mut r = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        r.allow(Instant::now())
    }
}

/// `warn!` through a [`PeerLog`]: written only if the limit allows, with `held_back` set to
/// the lines held back before it.
#[macro_export]
macro_rules! peer_warn {
    ($log:expr, $($arg:tt)+) => {
        if let Some(held_back) = $log.allow() {
            ::tracing::warn!(held_back, $($arg)+);
        }
    };
}

/// `error!` through a [`PeerLog`], as [`peer_warn!`].
#[macro_export]
macro_rules! peer_error {
    ($log:expr, $($arg:tt)+) => {
        if let Some(held_back) = $log.allow() {
            ::tracing::error!(held_back, $($arg)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_a_period_and_every_held_line_counted() {
        let t0 = Instant::now();
        let mut r = RateLimit::default();
        for _ in 0..BURST {
            assert_eq!(r.allow(t0), Some(0));
        }
        // A flood within the same instant: all held back, counted.
        for _ in 0..1000 {
            assert_eq!(r.allow(t0), None);
        }
        assert_eq!(r.held_back(), 1000);
        // Just short of a period: still nothing.
        assert_eq!(r.allow(t0 + PERIOD - Duration::from_nanos(1)), None);
        // One period on: one line, which reports the 1001 held back.
        assert_eq!(r.allow(t0 + PERIOD), Some(1001));
        assert_eq!(r.allow(t0 + PERIOD), None);
        assert_eq!(r.allow(t0 + PERIOD * 2), Some(1));
    }

    #[test]
    fn a_quiet_peer_gets_its_burst_back_but_no_more() {
        let t0 = Instant::now();
        let mut r = RateLimit::default();
        for _ in 0..BURST {
            r.allow(t0);
        }
        assert_eq!(r.allow(t0), None);
        // A long silence refills the bucket to BURST, not beyond.
        let later = t0 + PERIOD * 1000;
        let allowed = (0..BURST * 3).filter(|_| r.allow(later).is_some()).count();
        assert_eq!(allowed, BURST as usize);
    }

    #[test]
    fn over_a_long_flood_the_rate_is_one_a_period() {
        let t0 = Instant::now();
        let mut r = RateLimit::default();
        let (mut written, mut reported) = (0u64, 0u64);
        // 100 attempts a second for 60 s.
        for i in 0..6000u32 {
            if let Some(held) = r.allow(t0 + Duration::from_millis(10) * i) {
                written += 1;
                reported += held;
            }
        }
        assert_eq!(written, u64::from(BURST) + 59);
        assert_eq!(written + reported + r.held_back(), 6000);
    }
}
