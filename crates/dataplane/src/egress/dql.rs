//! Dynamic queue limits: how much may be in a device queue at once, learned from its
//! completions (Linux `lib/dynamic_queue_limits.c`, the algorithm behind BQL).
//!
//! A device queue (here: a frontend's receive ring) takes objects (bytes, or buffers) that
//! complete later. Too little in it and the device starves between two rounds of the
//! producer; too much and packets wait in the device, where no scheduler can reorder or drop
//! them. The limit follows the completions, with no tunable:
//!
//! * **starvation grows it**: the queue was over the limit and everything in it completed
//!   before the producer came back (or the previous interval's overshoot completed in full):
//!   the limit grows by what completed beyond the previous queue total, plus that overshoot;
//! * **sustained slack shrinks it**: while the queue stays busy, the slack (the limit plus the
//!   overshoot, less twice what completed, or the part of the last queuing above the
//!   overshoot) is tracked at its lowest over a hold time (one second, Linux's `HZ`); then the
//!   limit drops by that lowest slack.
//!
//! Counters are free-running `u32` and compared the way Linux does (`POSDIFF`, `AFTER_EQ`), so
//! they may wrap. The clock is the caller's (`now` in nanoseconds): tests drive it.

/// Largest limit (Linux `DQL_MAX_LIMIT`: half the counter range less the largest object).
pub(crate) const MAX_LIMIT: u32 = (u32::MAX / 2) - (u32::MAX / 16);

/// How long the lowest slack is watched before the limit shrinks by it (Linux: `HZ`).
pub(crate) const SLACK_HOLD_NS: u64 = 1_000_000_000;

/// `a - b` if positive, else 0 (free-running counters).
#[inline]
fn posdiff(a: u32, b: u32) -> u32 {
    let d = a.wrapping_sub(b);
    if (d as i32) > 0 {
        d
    } else {
        0
    }
}

/// `a` at or after `b` (free-running counters).
#[inline]
fn after_eq(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

/// One device queue's limit state.
#[derive(Debug, Clone)]
pub(crate) struct Dql {
    // Producer side.
    num_queued: u32,
    adj_limit: u32,
    last_obj_cnt: u32,
    // Completion side.
    limit: u32,
    num_completed: u32,
    prev_ovlimit: u32,
    prev_num_queued: u32,
    prev_last_obj_cnt: u32,
    lowest_slack: u32,
    slack_start: u64,
    min_limit: u32,
    max_limit: u32,
    hold_ns: u64,
}

impl Dql {
    /// A queue whose limit stays within `min_limit..=MAX_LIMIT`, starting at `min_limit`.
    pub(crate) fn new(min_limit: u32, now: u64) -> Self {
        Self {
            num_queued: 0,
            adj_limit: min_limit,
            last_obj_cnt: 0,
            limit: min_limit,
            num_completed: 0,
            prev_ovlimit: 0,
            prev_num_queued: 0,
            prev_last_obj_cnt: 0,
            lowest_slack: u32::MAX,
            slack_start: now,
            min_limit,
            max_limit: MAX_LIMIT,
            hold_ns: SLACK_HOLD_NS,
        }
    }

    /// `count` objects went into the device queue (one queuing operation).
    #[inline]
    pub(crate) fn queued(&mut self, count: u32) {
        self.last_obj_cnt = count;
        self.num_queued = self.num_queued.wrapping_add(count);
    }

    /// How many more objects may be queued: negative once over the limit (the producer then
    /// stops; the queue that crossed the limit was allowed, as in Linux).
    #[inline]
    pub(crate) fn avail(&self) -> i64 {
        i64::from(self.adj_limit.wrapping_sub(self.num_queued) as i32)
    }

    /// Objects queued and not completed.
    #[inline]
    pub(crate) fn in_flight(&self) -> u32 {
        self.num_queued.wrapping_sub(self.num_completed)
    }

    /// The current limit.
    #[inline]
    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    /// The bounds the limit stays within (Linux's `limit_min` and `limit_max`, set there by
    /// hand; here by the receiver's pace, [`super::pace`]): applied at the next completion.
    #[inline]
    pub(crate) fn set_bounds(&mut self, min: u32, max: u32) {
        self.min_limit = min.min(MAX_LIMIT);
        self.max_limit = max.clamp(self.min_limit, MAX_LIMIT);
    }

    /// `count` objects completed at `now` (at most what is in flight): recomputes the limit.
    pub(crate) fn completed(&mut self, count: u32, now: u64) {
        let num_queued = self.num_queued;
        let count = count.min(self.in_flight());
        let completed = self.num_completed.wrapping_add(count);
        let mut limit = self.limit;
        let mut ovlimit = posdiff(num_queued.wrapping_sub(self.num_completed), limit);
        let inprogress = num_queued.wrapping_sub(completed);
        let prev_inprogress = self.prev_num_queued.wrapping_sub(self.num_completed);
        let all_prev_completed = after_eq(completed, self.prev_num_queued);

        if (ovlimit != 0 && inprogress == 0) || (self.prev_ovlimit != 0 && all_prev_completed) {
            // Starved: over the limit last interval and now empty, or the previous overshoot
            // all completed (the queue may have run dry before the producer came back).
            limit = limit
                .wrapping_add(posdiff(completed, self.prev_num_queued))
                .wrapping_add(self.prev_ovlimit);
            self.slack_start = now;
            self.lowest_slack = u32::MAX;
        } else if inprogress != 0 && prev_inprogress != 0 && !all_prev_completed {
            // Busy the whole interval: how much more than needed was queued?
            let slack = posdiff(
                limit.wrapping_add(self.prev_ovlimit),
                completed.wrapping_sub(self.num_completed).wrapping_mul(2),
            );
            let slack_last_objs = if self.prev_ovlimit != 0 {
                posdiff(self.prev_last_obj_cnt, self.prev_ovlimit)
            } else {
                0
            };
            let slack = slack.max(slack_last_objs);
            self.lowest_slack = self.lowest_slack.min(slack);
            if now > self.slack_start.saturating_add(self.hold_ns) {
                limit = posdiff(limit, self.lowest_slack);
                self.slack_start = now;
                self.lowest_slack = u32::MAX;
            }
        }

        let limit = limit.clamp(self.min_limit, self.max_limit);
        if limit != self.limit {
            self.limit = limit;
            ovlimit = 0;
        }
        self.adj_limit = limit.wrapping_add(completed);
        self.prev_ovlimit = ovlimit;
        self.prev_last_obj_cnt = self.last_obj_cnt;
        self.num_completed = completed;
        self.prev_num_queued = num_queued;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A producer that fills the queue up to the limit each round, and a device that completes
    /// `rate` objects per round: returns the limit after `rounds` rounds.
    fn run(d: &mut Dql, rate: u32, rounds: u32, t: &mut u64, obj: u32) -> u32 {
        for _ in 0..rounds {
            while d.avail() >= 0 {
                d.queued(obj);
            }
            *t += MS;
            let done = rate.min(d.in_flight());
            d.completed(done, *t);
        }
        d.limit()
    }

    #[test]
    fn starts_at_min_and_allows_the_queuing_that_crosses_it() {
        let d = Dql::new(0, 0);
        assert_eq!(d.limit(), 0);
        assert_eq!(d.avail(), 0, "one queuing allowed when empty");
        let mut d = d;
        d.queued(64);
        assert!(d.avail() < 0);
        assert_eq!(d.in_flight(), 64);
    }

    #[test]
    fn starvation_grows_the_limit_by_completions_plus_overshoot() {
        let mut d = Dql::new(0, 0);
        // Over the limit (0) by 64, then everything completes: starved.
        d.queued(64);
        d.completed(64, MS);
        // Grows by what completed beyond the previous total (64 - 0) plus the previous
        // overshoot (0 on the first interval).
        assert_eq!(d.limit(), 64);
        assert_eq!(d.in_flight(), 0);
        assert_eq!(d.avail(), 64);
        // Queue 96 (32 over), all complete again: grows by 96 (completed beyond the previous
        // total of 64... which is 96) plus the previous overshoot.
        d.queued(96);
        d.completed(96, 2 * MS);
        assert!(d.limit() > 64, "starved again: limit {}", d.limit());
    }

    #[test]
    fn a_device_that_keeps_up_drives_the_limit_up_to_what_it_completes() {
        // The device completes 100 objects per round; the producer queues 10 at a time up to
        // the limit. From 0 the limit grows until the device no longer starves.
        let mut t = 0;
        let mut d = Dql::new(0, 0);
        let l = run(&mut d, 100, 50, &mut t, 10);
        assert!(l >= 100, "limit {l} must cover a round of completions");
    }

    #[test]
    fn sustained_slack_shrinks_the_limit_after_the_hold_time() {
        // A limit far above what the device needs (it completes 100 per round while 1000 are
        // allowed), and the queue never runs dry: slack every round.
        let mut t = 0;
        let mut d = Dql::new(0, 0);
        d.limit = 1000;
        d.adj_limit = 1000;
        let before = run(&mut d, 100, 900, &mut t, 10); // 0.9 s: within the hold time
        assert_eq!(before, 1000, "no shrink before the hold time");
        let after = run(&mut d, 100, 300, &mut t, 10); // past 1 s
        assert!(
            after < 1000,
            "sustained slack must shrink the limit: {after}"
        );
        assert!(
            after >= 100,
            "but not below what keeps the device busy: {after}"
        );
    }

    #[test]
    fn bounds_cap_the_limit_at_the_next_completion_and_the_floor_wins() {
        let mut t = 0;
        let mut d = Dql::new(64, 0);
        d.limit = 1000;
        d.adj_limit = 1000;
        d.set_bounds(64, 200);
        let l = run(&mut d, 100, 1, &mut t, 10);
        assert_eq!(l, 200);
        d.set_bounds(64, 10);
        let l = run(&mut d, 100, 1, &mut t, 10);
        assert_eq!(l, 64, "the floor holds");
    }

    #[test]
    fn limit_stays_within_bounds_and_counters_wrap() {
        let mut d = Dql::new(32, 0);
        d.num_queued = u32::MAX - 10;
        d.num_completed = u32::MAX - 10;
        d.prev_num_queued = u32::MAX - 10;
        d.adj_limit = d.limit.wrapping_add(d.num_completed);
        d.queued(40);
        assert!(d.avail() < 0);
        d.completed(40, MS);
        assert_eq!(d.in_flight(), 0);
        assert!(d.limit() >= 32);
        assert!(d.avail() >= 32);
        // Completing more than in flight is bounded.
        d.completed(1000, 2 * MS);
        assert_eq!(d.in_flight(), 0);
    }
}
