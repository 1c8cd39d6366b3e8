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
//! and keeps the plain ceiling. One that sleeps on its own timer between batches is: a publish
//! cannot tell that sleep from NAPI's wait for an interrupt. What tells them apart is the rate
//! each loses. NAPI asleep for want of buffers takes nothing meanwhile, so more buffers buy it
//! rate; a receiver on its own clock catches up at its next tick, so they buy it nothing and
//! only lengthen its ring. So reserve is taken on **trial**: the first step opens it, and the
//! steps of the next [`PROBE_NS`] share it; then the reserve goes (all of it: what an earlier
//! trial kept is judged again) for as long again, and the rates of the two halves (buffers
//! given back per ns while packets waited, each half's first [`PROBE_SETTLE_NS`] left out, at
//! least [`PROBE_BUFFERS`] each) decide: kept if the half with it was faster by
//! [`PROBE_GAIN`], else left off. Either way no reserve is added for [`PROBE_BACKOFF_NS`],
//! doubled after each trial in a row that bought nothing up to [`PROBE_BACKOFF_MAX_NS`]: a
//! receiver that gains nothing has its ring lengthened, and a NAPI receiver that gains is
//! starved again, for a half of about 20 ms every few seconds. A rate, not a count of
//! witnesses, judges because witnesses fall with the reserve for both kinds (a longer ring is
//! emptied less often whoever empties it). On by default
//! (`dql_witness=false`: the target alone), measured in docs/egress.md.
//!
//! Linux leaves `limit_max` to the administrator; here it follows the receiver. DQL's own rules
//! still run below it. It never goes under 96 buffers (`CEILING_MIN_BUFFERS`: a NAPI budget
//! and a half, so that a guest's NAPI that takes a budget finds more at its repoll and stays in
//! polling mode; under 64 a Linux guest gives none back at all), and under the limit's floor
//! of two batches only for a receiver whose pace calls for less: one that slow cannot be
//! outrun by any batch of pvnet's, which is what the floor is for. Until a window has been
//! measured there is no ceiling (DQL as Linux has it).

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

/// How long each half of a trial lasts at least (the reserve with it, then without it), and
/// the part of it left unmeasured while the ring settles to the other limit.
pub(crate) const PROBE_NS: u64 = 20 * WINDOW_NS;
const PROBE_SETTLE_NS: u64 = 5 * WINDOW_NS;

/// The least buffers each half measures: 64 NAPI polls, so that a receiver as slow as a guest
/// under TCG (tens of thousands of packets a second) is measured over about 100 ms, long
/// enough for the witnesses of the first half to climb and for its rate to be told within a
/// few percent.
const PROBE_BUFFERS: u64 = 4096;

/// The least gain in rate, while packets wait, that keeps the reserve taken on trial (10%:
/// pvnet's paced receiver, which gains nothing, measured within 3% between halves; a TCG
/// guest starved by the limit gained 1.2x).
const PROBE_GAIN: f64 = 1.10;

/// How long witnesses add no reserve after a trial: at first, and always after one whose
/// reserve was kept. A trial that bought nothing (the receiver sleeps on a clock of its own
/// and catches up after: more buffers only lengthen its ring) doubles it for the next, up to
/// [`PROBE_BACKOFF_MAX_NS`].
pub(crate) const PROBE_BACKOFF_NS: u64 = 1_000_000_000;

/// The longest back-off: a receiver that gains nothing has its ring lengthened for at most
/// about a two-hundredth of the time.
pub(crate) const PROBE_BACKOFF_MAX_NS: u64 = 8_000_000_000;

/// Reserve on trial: the receiver's rate with all of it (what earlier trials kept and the
/// steps of this one), then with none; kept only if the first is higher by [`PROBE_GAIN`].
#[derive(Debug, Clone, Copy)]
struct Probe {
    /// The first half (with the reserve) is running.
    with: bool,
    /// When the half began.
    at: u64,
    /// The reserve at the end of the first half, and the rate measured with it.
    with_ns: f64,
    with_rate: f64,
    /// Buffers given back and the time, while packets waited, over the half's windows.
    done: u64,
    span: u64,
}

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
    /// When the reserve last changed, or a witness found it short.
    reserve_at: u64,
    /// The step on trial, if one is.
    probe: Option<Probe>,
    /// Witnesses add no reserve before this (ns): the last trial bought no rate.
    quiet_until: u64,
    /// The back-off after the next trial that buys nothing, in ns.
    backoff_ns: u64,
    /// Trials judged, and those whose reserve was kept, since the last
    /// [`take_trials`](Self::take_trials).
    trials: u64,
    kept: u64,
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
            probe: None,
            quiet_until: 0,
            backoff_ns: PROBE_BACKOFF_NS,
            trials: 0,
            kept: 0,
        }
    }

    /// Trials judged since the last call, and how many kept their reserve.
    pub(crate) fn take_trials(&mut self) -> (u64, u64) {
        (
            std::mem::take(&mut self.trials),
            std::mem::take(&mut self.kept),
        )
    }

    /// The ring started over (the receiver may be another): nothing measured is kept.
    pub(crate) fn restart(&mut self) {
        self.since = None;
        self.done = 0;
        self.rate = None;
        self.burst = 0.0;
        self.reserve_ns = 0.0;
        self.probe = None;
        self.quiet_until = 0;
        self.backoff_ns = PROBE_BACKOFF_NS;
    }

    /// The receiver was witnessed asleep, having consumed everything, while the limit held
    /// packets back for it (at `now`, ns): one step of reserve more, the ceiling kept within
    /// `most` buffers (its ring). The first step opens a trial ([`judge`](Self::judge)), whose
    /// first half the steps taken during it share. None in its second half, nor for the
    /// back-off after it, nor before the rate is measured (no ceiling yet); the reserve it has
    /// is kept from stepping back either way.
    pub(crate) fn idle(&mut self, now: u64, most: u32) {
        let Some(r) = self.rate.filter(|&r| r > 0.0) else {
            return;
        };
        self.reserve_at = now;
        if now < self.quiet_until || self.probe.is_some_and(|p| !p.with) {
            return;
        }
        let room = (f64::from(most) - self.burst) / r - self.target_ns;
        let before = self.reserve_ns;
        self.reserve_ns = (before + self.step(r)).min(room).max(0.0);
        if self.probe.is_none() && self.reserve_ns > before {
            self.probe = Some(Probe {
                with: true,
                at: now,
                with_ns: 0.0,
                with_rate: 0.0,
                done: 0,
                span: 0,
            });
        }
    }

    /// A window of `span` ns closed at `now` with `done` buffers given back, packets waiting
    /// all along: a trial measures it. A half ends once it has run [`PROBE_NS`] and measured
    /// [`PROBE_BUFFERS`] (windows that close in its first [`PROBE_SETTLE_NS`] are not its:
    /// the ring settles to the other limit). After the first half, the reserve goes (all of
    /// it: what an earlier trial kept is judged again, so that one kept by chance does not
    /// stay); after the second, it is restored if the rate with it was higher by
    /// [`PROBE_GAIN`] (the receiver had been losing time asleep for want of buffers: a NAPI
    /// poll that ran dry waits for its interrupt), and left off if not, with a longer
    /// back-off.
    ///
    /// The rate is the one while packets waited, as the ceiling's own. Over the whole half it
    /// would also count a receiver that keeps up once it has the reserve, but completions are
    /// credited in lumps when the limit changes at a half's boundary: pvnet's paced receiver,
    /// which gains nothing, then won 3 trials of 23 (docs/egress.md).
    #[allow(clippy::cast_precision_loss)]
    fn judge(&mut self, now: u64, done: u64, span: u64) {
        let Some(p) = self.probe.as_mut() else {
            return;
        };
        let run = now.saturating_sub(p.at);
        if run >= PROBE_SETTLE_NS {
            p.done += done;
            p.span += span;
        }
        if run < PROBE_NS || p.done < PROBE_BUFFERS {
            return;
        }
        let rate = p.done as f64 / p.span.max(1) as f64;
        if p.with {
            *p = Probe {
                with: false,
                at: now,
                with_ns: self.reserve_ns,
                with_rate: rate,
                done: 0,
                span: 0,
            };
            self.reserve_ns = 0.0;
            self.reserve_at = now;
            return;
        }
        let p = *p;
        self.probe = None;
        self.reserve_at = now;
        self.quiet_until = now + self.backoff_ns;
        self.trials += 1;
        let kept = p.with_rate >= rate * PROBE_GAIN;
        tracing::debug!(
            with_ns = p.with_ns,
            with_rate = p.with_rate,
            without_rate = rate,
            kept,
            "egress: the receiver's rate with the reserve against without it"
        );
        if kept {
            self.kept += 1;
            self.reserve_ns = p.with_ns;
            self.backoff_ns = PROBE_BACKOFF_NS;
        } else {
            self.backoff_ns = (2 * self.backoff_ns).min(PROBE_BACKOFF_MAX_NS);
        }
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
            self.probe = None;
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
                    self.judge(now, self.done, span);
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
        paced_every(p, t0, n, 32)
    }

    /// 64 buffers every `every` us for `n` looks from `t0`: the last ceiling.
    fn paced_every(p: &mut Pace, t0: u64, n: u64, every: u64) -> u32 {
        let mut c = None;
        for i in 0..n {
            c = p.completed(64, t0 + i * every * US, true);
        }
        c.unwrap()
    }

    /// A witness at `t` opens a trial: the receiver takes 64 buffers every `with` us while
    /// it has the reserve, then every `without` us without it. Returns the reserve in the
    /// second half and the time the trial ended.
    fn trial(p: &mut Pace, t: u64, with: u64, without: u64) -> (f64, u64) {
        p.idle(t, 256);
        let n = (PROBE_NS + 2 * WINDOW_NS) / (with * US);
        paced_every(p, t, n, with);
        let t = t + n * with * US;
        let during = p.reserve_ns();
        let n = (PROBE_NS + 2 * WINDOW_NS) / (without * US);
        paced_every(p, t, n, without);
        (during, t + n * without * US)
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
        // Each witness of the trial's first half adds a step; never past the ring.
        p.idle(32_000 * US, 256);
        assert!(p.ceiling().unwrap() > after + 6);
        for _ in 0..100 {
            p.idle(32_000 * US, 256);
        }
        assert!(p.ceiling().unwrap() <= 256);
    }

    #[test]
    fn reserve_that_buys_the_receiver_rate_is_kept() {
        // Found asleep at 2 Mpps; with the reserve it takes 64 every 28 us (2.29 Mpps),
        // without it 64 every 32 us again: kept.
        let mut p = Pace::new(TARGET);
        let plain = paced(&mut p, 0, 1000);
        let (during, t) = trial(&mut p, 32_000 * US, 28, 32);
        assert!(during == 0.0, "the second half runs without it: {during}");
        assert!(p.reserve_ns() > 3_000.0, "{}", p.reserve_ns());
        assert!(p.ceiling().unwrap() > plain + 6);
        // The next trial waits a back-off: a witness adds nothing till then.
        let kept = p.reserve_ns();
        p.idle(t + PROBE_BACKOFF_NS / 2, 256);
        assert!((p.reserve_ns() - kept).abs() < 1.0);
        // The next trial judges all of it again: the receiver no faster with it (a first
        // trial won by chance), none is left.
        let (during, _) = trial(&mut p, t + PROBE_BACKOFF_NS, 32, 32);
        assert!(during == 0.0, "the second half runs with none: {during}");
        assert!(p.reserve_ns() == 0.0, "{}", p.reserve_ns());
        assert_eq!(p.ceiling().unwrap(), plain);
    }

    #[test]
    fn reserve_that_buys_no_rate_is_taken_back_and_tried_ever_more_rarely() {
        // A receiver on its own clock (2 Mpps whatever its ring): found asleep, given reserve,
        // takes no more with it.
        let mut p = Pace::new(TARGET);
        let plain = paced(&mut p, 0, 1000);
        let (_, t) = trial(&mut p, 32_000 * US, 32, 32);
        assert!(p.reserve_ns() == 0.0, "{}", p.reserve_ns());
        assert_eq!(p.ceiling().unwrap(), plain);
        // Witnessed again and again within the back-off: nothing.
        for k in 0..19 {
            p.idle(t + k * 50_000 * US, 256);
            assert!(p.reserve_ns() == 0.0);
        }
        // After it, another trial, as fruitless: then twice the back-off, up to the longest.
        let mut t = t + PROBE_BACKOFF_NS;
        let mut backoff = PROBE_BACKOFF_NS;
        for _ in 0..5 {
            let (during, end) = trial(&mut p, t, 32, 32);
            assert!(during == 0.0 && p.reserve_ns() == 0.0);
            backoff = (2 * backoff).min(PROBE_BACKOFF_MAX_NS);
            p.idle(end + backoff - 5 * WINDOW_NS, 256);
            assert!(p.reserve_ns() == 0.0, "still backing off");
            t = end + backoff;
        }
        assert_eq!(backoff, PROBE_BACKOFF_MAX_NS);
    }

    #[test]
    fn the_reserve_steps_back_once_per_quiet_hold_and_never_below_zero() {
        let mut p = Pace::new(TARGET);
        paced(&mut p, 0, 1000);
        // Three witnesses in a trial that pays: three steps kept.
        let t = 32_000 * US;
        p.idle(t, 256);
        p.idle(t, 256);
        let (_, t) = trial(&mut p, t, 28, 32);
        let three = p.reserve_ns();
        assert!(three > 9_000.0, "{three}");
        // Under a hold quiet (from the trial's end, within the last windows): kept.
        paced_every(&mut p, t, (RESERVE_HOLD_NS - 5 * WINDOW_NS) / (28 * US), 28);
        assert!((p.reserve_ns() - three).abs() < 1.0, "{}", p.reserve_ns());
        // Past it: one step back.
        let t = t + RESERVE_HOLD_NS;
        paced_every(&mut p, t, 100, 28);
        let two = p.reserve_ns();
        assert!(two < three - 2_000.0 && two > 0.0, "{three} -> {two}");
        // Holds more: gone, not negative.
        paced_every(&mut p, t + 100 * 28 * US, 50_000, 28);
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
