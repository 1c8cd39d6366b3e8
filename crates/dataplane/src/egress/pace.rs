//! The receiver's pace: how far a device queue limit may grow (DQL's `limit_max`).
//!
//! DQL ([`super::dql`]) calls a device starved when everything queued by the last look has
//! completed by this one, and grows its limit by the overshoot. A virtio frontend gives its
//! receive buffers back in bursts: a NAPI poll's worth, a paced receiver's batch, or two of them
//! back to back when it woke late. To that rule a burst that empties what pvnet had put in the
//! ring looks like starvation even when the receiver was only late, so the limit grows to the
//! whole ring (measured: 256-306 buffers for a 256-entry ring, docs/egress.md) and every packet
//! waits behind it, where no scheduler can reorder or drop it.
//!
//! What a receiver needs is time-shaped, as CoDel's target is: enough buffers to stay busy
//! across one hand-back, and what it consumes while pvnet answers that hand-back. So the limit
//! gets a ceiling:
//!
//! ```text
//! ceiling = burst + rate * target
//! ```
//!
//! * `rate`: buffers the receiver gives back per nanosecond while packets wait for it (so the
//!   rate it can take, not the rate offered), over windows of [`WINDOW_NS`], smoothed;
//! * `burst`: buffers it gives back at one look while packets wait, smoothed. A receiver that
//!   takes everything pvnet lets into its ring each time (the ceiling holds it back) hands back
//!   the whole ceiling at once, so the ceiling rises by `rate * target` at each such look: a
//!   ceiling too low for the receiver climbs, and it can never hold a receiver idle for long;
//! * `target`: the port's `dql_target` (default [`TARGET`]), the time a packet should wait in
//!   the ring beyond one burst.
//!
//! Linux leaves `limit_max` to the administrator; here it follows the receiver. DQL's own rules
//! still run below it. It never goes under 64 buffers (what a Linux guest uses before it gives
//! any back), and under the limit's floor of two batches only for a receiver whose pace calls
//! for less: one that slow cannot be outrun by any batch of pvnet's, which is what the floor
//! is for. Until a window has been measured there is no ceiling (DQL as Linux has it).

use std::time::Duration;

/// The default target: a packet waits in the ring about one burst plus this. With a 10 Gbit/s
/// NIC, BQL settles at a few tens of kilobytes, a few tens of microseconds of the wire.
pub const TARGET: Duration = Duration::from_micros(25);

/// How long the rate is measured over, while packets wait all along.
pub(crate) const WINDOW_NS: u64 = 1_000_000;

/// A receiver's measured pace.
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    target_ns: f64,
    /// When the current window began (None: nothing waited at the last look).
    since: Option<u64>,
    /// Buffers given back in the current window.
    done: u64,
    /// Buffers given back per nanosecond while packets waited, smoothed (None: not measured).
    rate: Option<f64>,
    /// Buffers given back at one look while packets waited, smoothed.
    burst: f64,
}

impl Pace {
    /// A pace aiming at `target` (non-zero) in the ring beyond one burst.
    pub(crate) fn new(target: Duration) -> Self {
        #[allow(clippy::cast_precision_loss)]
        Self {
            target_ns: target.as_nanos() as f64,
            since: None,
            done: 0,
            rate: None,
            burst: 0.0,
        }
    }

    /// The ring started over (the receiver may be another): nothing measured is kept.
    pub(crate) fn restart(&mut self) {
        self.since = None;
        self.done = 0;
        self.rate = None;
        self.burst = 0.0;
    }

    /// `count` buffers came back at `now` (ns); `waiting`: packets waited for room at this
    /// look. Returns the ceiling, once the rate has been measured.
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn completed(&mut self, count: u32, now: u64, waiting: bool) -> Option<u32> {
        if !waiting {
            // The receiver kept up: what it gives back now is what it was offered.
            self.since = None;
            self.done = 0;
            return self.ceiling();
        }
        let count_f = f64::from(count);
        self.burst += (count_f - self.burst) / 8.0;
        match self.since {
            None => self.since = Some(now),
            Some(since) => {
                self.done += u64::from(count);
                let span = now.saturating_sub(since);
                if span >= WINDOW_NS {
                    let sample = self.done as f64 / span as f64;
                    self.rate = Some(self.rate.map_or(sample, |r| r + (sample - r) / 4.0));
                    self.since = Some(now);
                    self.done = 0;
                }
            }
        }
        self.ceiling()
    }

    /// The most buffers the receiver's pace calls for (None: not measured yet).
    pub(crate) fn ceiling(&self) -> Option<u32> {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        self.rate.map(|r| {
            (self.burst + r * self.target_ns)
                .ceil()
                .min(f64::from(u32::MAX)) as u32
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    #[test]
    fn no_ceiling_until_a_window_of_waiting_was_measured() {
        let mut p = Pace::new(TARGET);
        assert_eq!(p.completed(64, 0, true), None);
        assert_eq!(p.completed(64, 500 * US, true), None);
        // Nothing waited: the window starts over.
        assert_eq!(p.completed(64, 900 * US, false), None);
        assert_eq!(p.completed(64, 1_500 * US, true), None);
        assert_eq!(p.completed(64, 2_000 * US, true), None);
        assert!(p.completed(64, 2_600 * US, true).is_some());
    }

    #[test]
    fn a_paced_receiver_gets_one_burst_plus_its_rate_times_the_target() {
        // 64 buffers every 32 us: 2 Mpps.
        let mut p = Pace::new(TARGET);
        let mut c = None;
        for i in 0..1000 {
            c = p.completed(64, i * 32 * US, true);
        }
        // 64 + 0.002 * 25_000 = 114.
        let c = c.unwrap();
        assert!((112..=116).contains(&c), "ceiling {c}");
    }

    #[test]
    fn late_wakes_raise_the_ceiling_little() {
        // The same receiver, late one time in eight by three bursts, which it then takes at
        // once (four bursts in one hand-back).
        let mut p = Pace::new(TARGET);
        let (mut t, mut c) = (0, None);
        for i in 0..1000 {
            if i % 8 == 7 {
                t += 4 * 32 * US;
                c = p.completed(256, t, true);
            } else {
                t += 32 * US;
                c = p.completed(64, t, true);
            }
        }
        let c = c.unwrap();
        assert!(
            c < 200,
            "ceiling {c} must stay well below the 256-entry ring"
        );
    }

    #[test]
    fn a_receiver_held_back_by_the_ceiling_raises_it() {
        // A receiver that empties its ring every 16 us and could take 200 each time (12.5
        // Mpps), held to the floor (64) at first: it hands back all it was let have, and the
        // ceiling must climb past what it can take.
        let mut p = Pace::new(TARGET);
        let mut c = 64u32;
        for i in 0..2000u64 {
            let got = c.min(200);
            if let Some(n) = p.completed(got, i * 16 * US, true) {
                c = n.max(64);
            }
        }
        assert!(
            c > 200,
            "ceiling {c} must leave the receiver room beyond what it takes"
        );
    }
}
