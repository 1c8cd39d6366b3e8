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
//! A fixed target is the wrong time for a receiver that sleeps between hand-backs: a Linux
//! guest's NAPI that empties its ring re-arms and waits for an interrupt, and while it waits
//! it takes nothing, however many packets pvnet holds back for it. The ceiling cannot see that
//! from the buffers alone (a late receiver hands back the same bursts), so the ring tells it:
//! a publish that finds the driver asleep on everything published before it
//! (`virtq::DeviceQueue::driver_idle`) while the limit held packets back is a receiver
//! starved by the limit. Each such witness adds a step of **reserve** to the target,
//!
//! ```text
//! ceiling = burst + rate * (target + reserve)
//! ```
//!
//! the time the receiver takes for an eighth of its burst (8 buffers for a NAPI guest,
//! whatever its rate: the ceiling rises by about that much), and each [`RESERVE_HOLD_NS`]
//! without a witness takes a step back (AIAD on a time, so a receiver whose rate changes keeps
//! the same slack in time). A receiver that polls, or one that is only late, is never witnessed
//! and keeps the plain ceiling. One that sleeps on its own timer between batches is (a publish
//! cannot tell that sleep from NAPI's wait for an interrupt) and loses nothing by it, so for
//! it the reserve only lengthens the ring: the reserve is opt-in (`dql_witness`), measured in
//! docs/egress.md.
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

/// How long a reserve step stays without a witnessed idle before it is taken back: CoDel's
/// interval (100 ms). With DQL's one-second hold, a receiver found asleep a few times a
/// second (pvnet's paced receiver, which sleeps between its batches and catches up after)
/// ratcheted the ceiling toward the ring: 7 witnesses a second against one step back.
pub(crate) const RESERVE_HOLD_NS: u64 = 100_000_000;

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
    /// Time added to the target by witnessed idles, in ns.
    reserve_ns: f64,
    /// When the reserve last changed (a witness, or a step back).
    reserve_at: u64,
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
            reserve_ns: 0.0,
            reserve_at: 0,
        }
    }

    /// The ring started over (the receiver may be another): nothing measured is kept.
    pub(crate) fn restart(&mut self) {
        self.since = None;
        self.done = 0;
        self.rate = None;
        self.burst = 0.0;
        self.reserve_ns = 0.0;
    }

    /// The receiver was witnessed asleep, having consumed everything, while the limit held
    /// packets back for it (at `now`, ns): one step of reserve more, the ceiling kept within
    /// `most` buffers (its ring). Nothing before the rate is measured (no ceiling yet).
    pub(crate) fn idle(&mut self, now: u64, most: u32) {
        let Some(r) = self.rate.filter(|&r| r > 0.0) else {
            return;
        };
        let room = (f64::from(most) - self.burst) / r - self.target_ns;
        self.reserve_ns = (self.reserve_ns + self.step(r)).min(room).max(0.0);
        self.reserve_at = now;
    }

    /// A reserve step: the time the receiver takes for an eighth of its burst (at least one
    /// buffer's), at rate `r`.
    fn step(&self, r: f64) -> f64 {
        (self.burst / 8.0).max(1.0) / r
    }

    /// The reserve now, in ns.
    #[cfg(test)]
    pub(crate) fn reserve_ns(&self) -> f64 {
        self.reserve_ns
    }

    /// `count` buffers came back at `now` (ns); `waiting`: packets waited for room at this
    /// look. Returns the ceiling, once the rate has been measured.
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn completed(&mut self, count: u32, now: u64, waiting: bool) -> Option<u32> {
        if self.reserve_ns > 0.0 && now.saturating_sub(self.reserve_at) >= RESERVE_HOLD_NS {
            if let Some(r) = self.rate.filter(|&r| r > 0.0) {
                self.reserve_ns = (self.reserve_ns - self.step(r)).max(0.0);
            }
            self.reserve_at = now;
        }
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
            (self.burst + r * (self.target_ns + self.reserve_ns))
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

    /// 64 buffers every 32 us (2 Mpps) for `n` looks from `t0`: the last ceiling.
    fn paced(p: &mut Pace, t0: u64, n: u64) -> u32 {
        let mut c = None;
        for i in 0..n {
            c = p.completed(64, t0 + i * 32 * US, true);
        }
        c.unwrap()
    }

    #[test]
    fn a_witnessed_idle_raises_the_ceiling_by_an_eighth_of_a_burst() {
        let mut p = Pace::new(TARGET);
        let before = paced(&mut p, 0, 1000);
        p.idle(32_000 * US, 256);
        // An eighth of 64 buffers at 2 per us: 4 us of reserve, 8 buffers of ceiling.
        assert!(
            (p.reserve_ns() - 4_000.0).abs() < 100.0,
            "{}",
            p.reserve_ns()
        );
        let after = p.ceiling().unwrap();
        assert!((7..=9).contains(&(after - before)), "{before} -> {after}");
        // Never past the ring, however many witnesses.
        for _ in 0..100 {
            p.idle(32_000 * US, 256);
        }
        assert!(p.ceiling().unwrap() <= 256);
    }

    #[test]
    fn the_reserve_steps_back_once_per_quiet_hold_and_never_below_zero() {
        let mut p = Pace::new(TARGET);
        let t = 1000 * 32 * US;
        paced(&mut p, 0, 1000);
        for _ in 0..3 {
            p.idle(t, 256);
        }
        let three = p.reserve_ns();
        assert!((three - 12_000.0).abs() < 300.0, "{three}");
        // Under a hold quiet: kept.
        paced(&mut p, t, 3_000);
        assert!((p.reserve_ns() - three).abs() < 1.0, "{}", p.reserve_ns());
        // Past it: one step back.
        paced(&mut p, t + 3_000 * 32 * US, 200);
        assert!(
            (p.reserve_ns() - 8_000.0).abs() < 300.0,
            "{}",
            p.reserve_ns()
        );
        // Three holds more: gone, not negative.
        paced(&mut p, t + 4_000 * 32 * US, 10_000);
        assert!(p.reserve_ns() == 0.0, "{}", p.reserve_ns());
        // Before a rate is measured a witness changes nothing.
        let mut q = Pace::new(TARGET);
        q.idle(0, 256);
        assert!(q.reserve_ns() == 0.0);
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
