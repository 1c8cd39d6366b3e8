//! Polling and notification policies: when to keep polling an empty ring, when to arm its
//! notifications and sleep.
//!
//! The consumer of a virtqueue that is faster than its producer drains the ring; if it then
//! arms notifications at once, every packet pays a kick and a wake-up (the "backend too fast"
//! regime: throughput collapses and oscillates). Polling forever (DPDK) avoids that for 100%
//! of a core. [`Policy::Adaptive`] polls only while polling pays:
//!
//! * Per queue it keeps the gap between "the ring went empty" and "work arrived again" as a
//!   smoothed mean and deviation, the way TCP keeps round-trip times (RFC 6298: gains 1/8 and
//!   1/4), each gap clamped to one wake-up first (so rare long stalls cannot outvote many short
//!   gaps). The polling window is `mean + max(4 * deviation, mean)`, the RTO formula with the
//!   mean as its floor: wide enough for almost every gap of the current arrival pattern.
//! * A gap that ended in a sleep is shortened by one wake-up: the consumer saw the work that
//!   much late, and that latency is its own, not the producer's.
//! * Polling through a gap costs the gap in CPU; sleeping costs one sleep/wake cycle
//!   ([`WakeCost`], measured on this machine at start-up) plus a kick from the producer. So
//!   when the typical gap is longer than half a wake-up (polling would save less than half of
//!   what it costs), the window is zero (sleep at once), and
//!   the window is never longer than two wake-ups: those are the only bounds, and both come
//!   from the measured cost, not from a tunable.
//! * A queue idle longer than its window is never spun on: it is armed and the worker sleeps.
//!
//! [`Policy::Coalesce`] adds interrupt moderation on top: a stream fast enough that the
//! adaptive policy would spin on it, yet slow enough that half the ring holds at least eight
//! wake-ups of it, is drained once per period with its notifications off; the period is what
//! half the ring lasts at the rate the last drain measured, never longer than the policy's
//! bound (the latency it may add). Half a ring per drain leaves the producer room; a drain
//! that finds three quarters of it filled halves the period. A trickle and silence go back
//! to the adaptive answer, so an idle queue still sleeps armed. A producer that waits for
//! what the drain gives back (request/response, a window-limited sender) sends less when
//! held: a coalesced cycle at under a quarter of the rate of the free ones before it stops
//! coalescing for a while (16 cycles, doubling while it repeats).
//!
//! Time is injected ([`Clock`]) so the policy is tested deterministically.

pub(crate) mod plan;

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// A source of time (injected, so polling policies are testable).
pub(crate) trait Clock {
    /// Now.
    fn now(&self) -> Instant;
}

/// The real monotonic clock (vDSO `clock_gettime`, no syscall).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct MonoClock;

impl Clock for MonoClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Something done at most once a period from a port's hooks, due at the first look: the
/// syscalls a host port makes now and then (its interface's MTU, the kernel's drop counts),
/// never per packet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Every {
    period: Duration,
    next: Option<Instant>,
}

impl Every {
    /// Once every `period`.
    pub(crate) const fn new(period: Duration) -> Self {
        Self { period, next: None }
    }

    /// Whether it is due at `now`; when it is, the next time is a period on.
    #[inline]
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if self.next.is_some_and(|t| now < t) {
            return false;
        }
        self.next = Some(now + self.period);
        true
    }
}

/// How a queue is polled and when its notifications are armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Arm as soon as the ring is empty (QEMU's bottom-half behaviour).
    Notify,
    /// Notifications off; drain the ring every period (QEMU `tx=timer`).
    Timer(Duration),
    /// Arm after this many consecutive empty polls (the original patch's fixed retry budget).
    Spin(u32),
    /// Never sleep (DPDK): 100% of a core, idle or not.
    Busy,
    /// Poll for a learned, time-bounded window (module docs).
    #[default]
    Adaptive,
    /// [`Adaptive`](Self::Adaptive), and while a stream flows that polling would spin on,
    /// drain it every period instead, notifications off, the period as long as half the ring
    /// lasts at the measured rate and never longer than this (interrupt moderation: CPU for
    /// latency; see `Poller::took`).
    Coalesce(Duration),
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Notify => write!(f, "notify"),
            Policy::Timer(d) => write!(f, "timer:{}", d.as_micros()),
            Policy::Spin(n) => write!(f, "spin:{n}"),
            Policy::Busy => write!(f, "busy"),
            Policy::Adaptive => write!(f, "adaptive"),
            Policy::Coalesce(d) => write!(f, "coalesce:{}", d.as_micros()),
        }
    }
}

/// Why a polling policy did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParsePolicyError {
    /// No policy of that name (the text given).
    #[error("unknown policy '{0}' (notify, timer:<us>, spin:<n>, busy, adaptive, coalesce:<us>)")]
    Unknown(String),
    /// A policy that takes a value, given without one.
    #[error("'{name}' needs a value: {name}:<{what}>")]
    NoValue {
        /// The policy.
        name: String,
        /// What its value counts.
        what: &'static str,
    },
    /// A value that is not a number.
    #[error("bad {what} in '{text}': {source}")]
    BadNumber {
        /// The text given.
        text: String,
        /// What the value counts.
        what: &'static str,
        /// Why it is not a number.
        source: std::num::ParseIntError,
    },
    /// A period of 0 (what the period is).
    #[error("{0} must be at least 1 us")]
    ZeroPeriod(&'static str),
    /// A spin count over `u32::MAX`.
    #[error("spin:{0}: at most {max} polls", max = u32::MAX)]
    TooManyPolls(u64),
}

impl FromStr for Policy {
    type Err = ParsePolicyError;
    fn from_str(s: &str) -> Result<Self, ParsePolicyError> {
        let (name, arg) = s.split_once(':').map_or((s, None), |(a, b)| (a, Some(b)));
        let num = |what: &'static str| -> Result<u64, ParsePolicyError> {
            let arg = arg.ok_or_else(|| ParsePolicyError::NoValue {
                name: name.to_owned(),
                what,
            })?;
            arg.parse::<u64>()
                .map_err(|source| ParsePolicyError::BadNumber {
                    text: s.to_owned(),
                    what,
                    source,
                })
        };
        match name {
            "notify" => Ok(Policy::Notify),
            "busy" => Ok(Policy::Busy),
            "adaptive" => Ok(Policy::Adaptive),
            "timer" => match num("microseconds")? {
                0 => Err(ParsePolicyError::ZeroPeriod("timer period")),
                us => Ok(Policy::Timer(Duration::from_micros(us))),
            },
            "coalesce" => match num("microseconds")? {
                0 => Err(ParsePolicyError::ZeroPeriod("coalescing bound")),
                us => Ok(Policy::Coalesce(Duration::from_micros(us))),
            },
            "spin" => {
                let n = num("polls")?;
                let n = u32::try_from(n).map_err(|_| ParsePolicyError::TooManyPolls(n))?;
                Ok(Policy::Spin(n))
            }
            _ => Err(ParsePolicyError::Unknown(s.to_owned())),
        }
    }
}

/// The measured cost of one sleep/wake cycle through an eventfd and epoll on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakeCost {
    /// Median one-way wake-up latency: what a sleep typically costs (bounds the window).
    pub typical: Duration,
    /// Smallest one seen: what a sleep costs at least (corrects gaps that ended in a sleep
    /// without ever removing more than the wake-up can have added).
    pub floor: Duration,
}

impl WakeCost {
    /// What these machines measure (30 us typical, 10 us at least): the cost assumed when the
    /// measurement cannot run, and by the test and bench harnesses.
    pub const FALLBACK: WakeCost = WakeCost {
        typical: Duration::from_micros(30),
        floor: Duration::from_micros(10),
    };

    /// Measures it: the calling thread sleeps in `epoll_wait` on an eventfd and is woken
    /// `rounds` times by a thread on another CPU; one-way latency from the write to the return
    /// from `epoll_wait`. Call it from the thread that will sleep, after pinning it.
    /// Falls back to [`FALLBACK`](Self::FALLBACK) if the measurement cannot run.
    pub fn measure(rounds: u32) -> Self {
        measure_wake(rounds).unwrap_or(Self::FALLBACK)
    }
}

fn measure_wake(rounds: u32) -> Option<WakeCost> {
    use crate::sys::{self, Epoll, EventFd};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let (ping, pong) = (
        Arc::new(EventFd::new(0).ok()?),
        Arc::new(EventFd::new(0).ok()?),
    );
    let sent_at = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let (p2, q2, s2) = (ping.clone(), pong.clone(), sent_at.clone());
    // The wake that matters is a producer on another core waking this (pinned) thread: put
    // the waker on a different CPU than ours.
    let ncpu = sys::online_cpus();
    let other = (sys::current_cpu() + 1) % ncpu;
    let waker = std::thread::spawn(move || {
        if ncpu > 1 {
            sys::pin_current_thread(other);
        }
        for _ in 0..rounds {
            // Let the sleeper block first.
            std::thread::sleep(Duration::from_micros(200));
            #[allow(clippy::cast_possible_truncation)] // nanoseconds of a sub-minute run
            s2.store(t0.elapsed().as_nanos() as u64, Ordering::Release);
            let _ = p2.write(1);
            // Blocks until the ack.
            let _ = q2.read();
        }
    });
    let ep = Epoll::new().ok()?;
    ep.add(std::os::fd::AsRawFd::as_raw_fd(&*ping), 0);
    let mut samples = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        let mut out = [vmm_sys_util::epoll::EpollEvent::default()];
        // A 1 s timeout bounds a lost wake-up.
        let n = ep.wait(1000, &mut out);
        #[allow(clippy::cast_possible_truncation)]
        let now = t0.elapsed().as_nanos() as u64;
        if n == 1 {
            samples.push(now.saturating_sub(sent_at.load(Ordering::Acquire)));
        }
        // Blocks until the waker's write if the wait timed out before it.
        let _ = ping.read();
        let _ = pong.write(1);
    }
    let _ = waker.join();
    samples.sort_unstable();
    let typical = Duration::from_nanos(*samples.get(samples.len() / 2)?);
    let floor = Duration::from_nanos(*samples.first()?);
    Some(WakeCost { typical, floor })
}

/// What a queue wants after a round in which it found no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Keep polling it.
    Poll,
    /// It may sleep with notifications armed.
    Arm,
    /// It may sleep, notifications stay off; wake by this deadline to drain it.
    Until(Instant),
}

/// Per-queue polling state.
#[derive(Debug, Clone)]
pub struct Poller {
    policy: Policy,
    wake: Duration,
    /// `wake` in ns, as the estimator's arithmetic uses it (converted once, not per round).
    wake_ns: f64,
    wake_floor: Duration,
    /// When the ring went empty (None while work is flowing).
    empty_since: Option<Instant>,
    empty_polls: u32,
    /// Smoothed idle gap and its deviation, in ns (adaptive).
    srtt: f64,
    rttvar: f64,
    seeded: bool,
    /// Last drain of a timer queue.
    last_drain: Option<Instant>,
    /// Gaps that ended inside the window / after it (for reports and tests).
    hits: u64,
    misses: u64,
    /// The current gap ended in a sleep: work was seen one wake-up after it arrived.
    slept: bool,
    /// Exploration while the window is closed (see `on_empty`).
    probe_every: u32,
    since_probe: u32,
    probing: bool,
    /// Coalescing: packets drained since the ring last went empty, and the ring's size.
    found: u32,
    ring: u16,
    /// When the ring last went empty (the start of the cycle whose packets `found` counts).
    cycle_start: Option<Instant>,
    /// The current coalescing period, and the deadline of the sleep in progress (None: not
    /// coalescing; the adaptive answer holds).
    period: Duration,
    coalesce_until: Option<Instant>,
    /// Packets and ns of the cycles that were not coalesced (smoothed, each on its own: their
    /// ratio is the rate the producer sends at when it is not kept waiting; a mean of
    /// per-cycle rates would overweight the short cycles).
    free_pkts: f64,
    free_ns: f64,
    /// Cycles left without coalescing, and the next such hold (doubling, see `next_cycle`).
    hold: u32,
    next_hold: u32,
}

/// A duration in ns as f64, from its u64 seconds and u32 nanoseconds: `as_nanos() as f64`
/// goes through a u128 conversion (a libgcc call) on every idle round.
#[inline]
fn ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

/// Shortest coalescing period, in wake-ups: its wake-ups cost at most 1/8 of a CPU, and a
/// stream that half a ring holds for less than that is polled (four cost a saturated ring
/// part of its rate: `docs/scale.md`, CPU that follows the load).
const COALESCE_MIN_WAKES: u32 = 8;

/// Cycles a queue goes without coalescing after a coalesced cycle brought less than a
/// quarter of the rate of the free cycles before it (a producer that waits for the drain:
/// request/response, a window-limited sender), doubling while that repeats, up to the max.
const COALESCE_HOLD_MIN: u32 = 16;
const COALESCE_HOLD_MAX: u32 = 4096;

/// Longest back-off between probes of a closed window, in idle periods: bounds the CPU a
/// long-gap queue spends probing to one probe window per this many gaps.
const PROBE_BACKOFF_MAX: u32 = 64;

impl Poller {
    /// A poller for one queue; `wake` is the measured sleep/wake cost.
    pub fn new(policy: Policy, wake: WakeCost) -> Self {
        Self {
            policy,
            wake: wake.typical,
            wake_ns: ns(wake.typical),
            wake_floor: wake.floor.min(wake.typical),
            empty_since: None,
            empty_polls: 0,
            srtt: 0.0,
            rttvar: 0.0,
            seeded: false,
            last_drain: None,
            hits: 0,
            misses: 0,
            slept: false,
            probe_every: 1,
            since_probe: 0,
            probing: false,
            found: 0,
            ring: 0,
            cycle_start: None,
            period: Duration::ZERO,
            coalesce_until: None,
            free_pkts: 0.0,
            free_ns: 0.0,
            hold: 0,
            next_hold: COALESCE_HOLD_MIN,
        }
    }

    /// The policy.
    pub(crate) fn policy(&self) -> Policy {
        self.policy
    }

    /// The current polling window (what `Adaptive` would spin for now).
    pub(crate) fn window(&self) -> Duration {
        match self.policy {
            Policy::Adaptive | Policy::Coalesce(_) => self.adaptive_window(),
            Policy::Busy => Duration::MAX,
            _ => Duration::ZERO,
        }
    }

    /// Smoothed gap and deviation (adaptive), and the probe back-off, for logs.
    pub(crate) fn estimate(&self) -> (Duration, Duration, u32) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let d = |x: f64| Duration::from_nanos(x.max(0.0) as u64);
        (d(self.srtt), d(self.rttvar), self.probe_every)
    }

    /// Gaps that ended while polling / after the window (adaptive bookkeeping).
    pub(crate) fn hits_misses(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    fn adaptive_window(&self) -> Duration {
        if !self.seeded {
            // Nothing learned yet: poll for one wake-up, the break-even point.
            return self.wake;
        }
        let wake = self.wake_ns;
        if self.srtt > wake / 2.0 {
            // Polling pays while the typical gap is under half a wake-up: spinning through it
            // costs at most half of what a sleep costs (and spares the producer a kick). Gaps
            // are clamped to one wake-up before averaging, so rare long stalls cannot close
            // the window, and a mostly idle queue closes it.
            return Duration::ZERO;
        }
        if self.srtt < wake / 4.0 {
            // A busy queue (typical gap under a quarter wake-up) waits out its peer's rare
            // stalls for the whole bound: a sleep there costs a wake-up and, from a driver
            // without EVENT_IDX, a kick per burst until we are back.
            return self.wake * 2;
        }
        // RFC 6298's RTO is srtt + max(G, 4 * rttvar) with G the clock granularity; here the
        // floor under the deviation term is the mean itself, so a perfectly regular stream
        // still gets twice its period: jitter does not turn every gap into a sleep.
        let w = (self.srtt + (4.0 * self.rttvar).max(self.srtt)).min(2.0 * wake);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 0 <= w <= 2 * wake
        Duration::from_nanos(w as u64)
    }

    fn learn(&mut self, gap: Duration) {
        // A gap only needs to say "longer than a wake-up": clamp it there. A heavy tail (a
        // peer that stalls now and then) then cannot outvote the short gaps that make polling
        // pay, and one idle minute does not take minutes of arrivals to forget.
        let g = ns(gap).min(self.wake_ns);
        if self.seeded {
            self.rttvar = 0.75 * self.rttvar + 0.25 * (self.srtt - g).abs();
            self.srtt = 0.875 * self.srtt + 0.125 * g;
        } else {
            self.srtt = g;
            self.rttvar = g / 2.0;
            self.seeded = true;
        }
    }

    /// The queue found work this round.
    #[inline]
    pub fn on_work(&mut self, now: Instant) {
        if let Some(t) = self.empty_since.take() {
            let mut gap = now.saturating_duration_since(t);
            if std::mem::take(&mut self.probing) && !self.slept {
                // A probe caught work: the gap is exact. It shows polling pays only if it was
                // shorter than a wake-up; then the back-off resets. A longer one is a failed
                // probe: back off. Either way the gap is learned like any other.
                self.empty_polls = 0;
                if gap <= self.wake {
                    // Evidence that polling pays now: learn it, and probe every idle period
                    // until the estimate reopens the window.
                    self.probe_every = 1;
                    self.hits += 1;
                    self.learn(gap);
                    return;
                }
                self.probe_every = (self.probe_every * 2).min(PROBE_BACKOFF_MAX);
                self.misses += 1;
                self.learn(gap);
                return;
            }
            if std::mem::take(&mut self.slept) {
                // We saw the work one wake-up after it arrived: that latency is ours, not the
                // producer's. Without this correction a sleeping consumer would measure every
                // gap as longer than a wake-up and never learn that polling pays (a
                // request/response peer answers in microseconds once we poll).
                gap = gap.saturating_sub(self.wake_floor);
            }
            if gap <= self.window() {
                self.hits += 1;
            } else {
                self.misses += 1;
            }
            if matches!(self.policy, Policy::Adaptive | Policy::Coalesce(_)) {
                self.learn(gap);
            }
        }
        self.empty_polls = 0;
        if matches!(self.policy, Policy::Timer(_)) {
            self.last_drain = Some(now);
        }
    }

    /// The queue found no work this round: keep polling it, or may the worker sleep?
    #[inline]
    pub fn on_empty(&mut self, now: Instant) -> Idle {
        let since = *self.empty_since.get_or_insert(now);
        self.empty_polls = self.empty_polls.saturating_add(1);
        match self.policy {
            Policy::Busy => Idle::Poll,
            Policy::Notify => Idle::Arm,
            Policy::Spin(n) => {
                if self.empty_polls < n {
                    Idle::Poll
                } else {
                    Idle::Arm
                }
            }
            Policy::Timer(p) => {
                let last = *self.last_drain.get_or_insert(now);
                if now >= last + p {
                    // Drained (found empty) at its deadline: next drain one period on.
                    self.last_drain = Some(now);
                    Idle::Until(now + p)
                } else {
                    Idle::Until(last + p)
                }
            }
            Policy::Coalesce(bound) => {
                if self.empty_polls == 1 {
                    self.coalesce_until = self.next_cycle(now, bound);
                }
                match self.coalesce_until {
                    Some(t) if now < t => Idle::Until(t),
                    Some(_) => {
                        // A whole period without a packet: the stream stopped. Back to
                        // the adaptive answer (it arms: the gap is long).
                        self.coalesce_until = None;
                        self.cycle_start = None;
                        self.adaptive_idle(now, since)
                    }
                    None => self.adaptive_idle(now, since),
                }
            }
            Policy::Adaptive => self.adaptive_idle(now, since),
        }
    }

    /// Packets a drain of this queue took, from a ring of `ring` entries (what coalescing
    /// measures the rate by; other policies ignore it).
    #[inline]
    pub(crate) fn took(&mut self, n: usize, ring: u16) {
        self.found = self
            .found
            .saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
        self.ring = ring;
    }

    /// Whether the queue sleeps with notifications off until its coalescing deadline (the
    /// shard must not arm it).
    pub(crate) fn coalescing(&self) -> bool {
        self.coalesce_until.is_some()
    }

    /// The ring just went empty after draining `found` packets: the deadline of the next
    /// drain if the stream is worth coalescing. The rate is what the last cycle (ring empty
    /// to ring empty) brought; the period lets half the ring fill at that rate, at most
    /// `bound`, and halves when a drain found the ring three quarters full or more (the rate
    /// underestimated: it rose, or the ring filled and held the rest back). Not worth it,
    /// and the adaptive answer holds: the first cycle (no rate yet), a trickle (a drain of
    /// one packet: notifications cost one wake-up per packet anyway), a period under
    /// [`COALESCE_MIN_WAKES`] wake-ups, or a producer that coalescing slows down.
    fn next_cycle(&mut self, now: Instant, bound: Duration) -> Option<Instant> {
        let period = self.next_period(now, bound);
        // The period a later cycle halves (zero: not coalescing).
        self.period = period.unwrap_or(Duration::ZERO);
        period.map(|p| now + p)
    }

    /// [`next_cycle`](Self::next_cycle)'s decision: the next period, if any.
    fn next_period(&mut self, now: Instant, bound: Duration) -> Option<Duration> {
        let ring = u32::from(self.ring).max(2);
        let (n, half) = (std::mem::take(&mut self.found), ring / 2);
        let start = self.cycle_start.replace(now);
        let coalesced = self.coalesce_until.is_some();
        // The first cycle is only a start: a rate needs two ends (and a first period taken
        // blind would teach a producer that waits for us its own slow rate).
        let dt = ns(now.saturating_duration_since(start?)).max(1.0);
        // The cycle's rate, packets per ns.
        let r = f64::from(n) / dt;
        if !coalesced {
            let n = f64::from(n);
            (self.free_pkts, self.free_ns) = if self.free_ns > 0.0 {
                (
                    0.75 * self.free_pkts + 0.25 * n,
                    0.75 * self.free_ns + 0.25 * dt,
                )
            } else {
                (n, dt)
            };
        } else if self.free_ns > 0.0 && r < self.free_pkts / self.free_ns / 4.0 {
            // Coalescing slowed the producer down: it waits for what the drain gives back (a
            // request/response flow, a window-limited sender), so holding its packets for a
            // period holds its next ones too. Drain it at once for a while, then try again.
            self.hold = self.next_hold;
            self.next_hold = (self.next_hold * 2).min(COALESCE_HOLD_MAX);
            return None;
        } else {
            self.next_hold = COALESCE_HOLD_MIN;
        }
        if self.hold > 0 {
            self.hold -= 1;
            return None;
        }
        if n < 2 {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let fill = Duration::from_nanos((f64::from(half) / r.max(1e-12)).min(1e15) as u64);
        let mut period = fill.min(bound);
        if n >= ring / 4 * 3 && !self.period.is_zero() {
            period = period.min(self.period / 2);
        }
        (period >= self.wake * COALESCE_MIN_WAKES).then_some(period)
    }

    /// The adaptive policy's answer for a queue empty since `since`.
    fn adaptive_idle(&mut self, now: Instant, since: Instant) -> Idle {
        let mut w = self.adaptive_window();
        if self.empty_polls == 1 && w.is_zero() {
            // A closed window never sees a short gap again (the consumer sleeps and
            // every gap looks a wake-up long). So every `probe_every`-th idle period
            // polls for a full window anyway; a probe that catches nothing doubles the
            // interval (up to PROBE_BACKOFF_MAX), one that does reopens the window.
            self.since_probe += 1;
            if self.since_probe >= self.probe_every {
                self.since_probe = 0;
                self.probing = true;
            }
        }
        if self.probing {
            w = 2 * self.wake;
        }
        if now.saturating_duration_since(since) < w {
            Idle::Poll
        } else {
            if std::mem::take(&mut self.probing) {
                self.probe_every = (self.probe_every * 2).min(PROBE_BACKOFF_MAX);
            }
            Idle::Arm
        }
    }

    /// The worker slept and woke: a gap that ends now was not covered by polling.
    pub fn woke(&mut self) {
        self.empty_polls = 0;
        if self.empty_since.is_some() {
            self.slept = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAKE: WakeCost = WakeCost {
        typical: Duration::from_micros(30),
        floor: Duration::from_micros(10),
    };

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Drives a poller with arrivals every `gap` (work found) for `n` gaps, polling every
    /// `step` in between, and returns how often it wanted to sleep.
    fn drive(p: &mut Poller, t: &mut Instant, gap: Duration, n: u32, step: Duration) -> u32 {
        let mut sleeps = 0;
        for _ in 0..n {
            p.on_work(*t);
            let end = *t + gap;
            let mut now = *t + step;
            while now < end {
                if p.on_empty(now) != Idle::Poll {
                    sleeps += 1;
                    break;
                }
                now += step;
            }
            *t = end;
        }
        sleeps
    }

    #[test]
    fn parses_every_policy() {
        assert_eq!("notify".parse(), Ok(Policy::Notify));
        assert_eq!("busy".parse(), Ok(Policy::Busy));
        assert_eq!("adaptive".parse(), Ok(Policy::Adaptive));
        assert_eq!("timer:150".parse(), Ok(Policy::Timer(us(150))));
        assert_eq!("spin:64".parse(), Ok(Policy::Spin(64)));
        assert!("timer".parse::<Policy>().is_err());
        assert!("timer:0".parse::<Policy>().is_err());
        assert!("spin:x".parse::<Policy>().is_err());
        assert!("fast".parse::<Policy>().is_err());
        assert_eq!("coalesce:500".parse(), Ok(Policy::Coalesce(us(500))));
        assert!("coalesce:0".parse::<Policy>().is_err());
        assert!("coalesce".parse::<Policy>().is_err());
        for p in [
            Policy::Notify,
            Policy::Busy,
            Policy::Adaptive,
            Policy::Timer(us(7)),
            Policy::Spin(3),
            Policy::Coalesce(us(250)),
        ] {
            assert_eq!(p.to_string().parse(), Ok(p));
        }
    }

    #[test]
    fn window_widens_under_steady_arrivals() {
        let mut p = Poller::new(Policy::Adaptive, WAKE);
        let mut t = Instant::now();
        // Arrivals every 10 us (shorter than a 30 us wake-up): polling pays.
        let sleeps = drive(&mut p, &mut t, us(10), 200, us(1));
        let w = p.window();
        assert!(w >= us(9) && w <= us(60), "window {w:?}");
        assert!(sleeps <= 2, "slept {sleeps} times on a steady 10 us stream");
    }

    #[test]
    fn window_collapses_when_gaps_are_long_and_when_idle() {
        let mut p = Poller::new(Policy::Adaptive, WAKE);
        let mut t = Instant::now();
        drive(&mut p, &mut t, us(10), 100, us(1));
        assert!(p.window() > Duration::ZERO);
        // Now 10 Kpps: 100 us gaps, longer than a wake-up: sleeping is cheaper.
        drive(&mut p, &mut t, us(100), 50, us(1));
        assert_eq!(p.window(), Duration::ZERO);
        // And a long idle period keeps it at zero.
        p.on_work(t);
        t += Duration::from_secs(5);
        p.on_work(t);
        assert_eq!(p.window(), Duration::ZERO);
        assert_eq!(
            p.on_empty(t + us(1)),
            Idle::Arm,
            "never spins on an idle queue"
        );
    }

    #[test]
    fn window_is_bounded_by_two_wake_ups() {
        let mut p = Poller::new(Policy::Adaptive, WAKE);
        let mut t = Instant::now();
        // Irregular gaps, all shorter than half a wake-up: deviation is large, window capped.
        for i in 0..400u64 {
            drive(
                &mut p,
                &mut t,
                us(if i % 2 == 0 { 3 } else { 14 }),
                1,
                us(1),
            );
        }
        assert!(p.window() <= us(60), "window {:?}", p.window());
        assert!(p.window() > Duration::ZERO, "{:?}", p.estimate());
    }

    #[test]
    fn window_recovers_after_the_pattern_changes_back() {
        let mut p = Poller::new(Policy::Adaptive, WAKE);
        let mut t = Instant::now();
        drive(&mut p, &mut t, us(500), 50, us(5));
        assert_eq!(p.window(), Duration::ZERO);
        // Dense traffic again: the gaps it sleeps through are short, so it learns to poll.
        drive(&mut p, &mut t, us(5), 100, us(1));
        assert!(p.window() > Duration::ZERO, "window {:?}", p.window());
    }

    #[test]
    fn learns_to_poll_for_a_fast_responder_even_after_sleeping() {
        // Request/response: the peer answers 3 us after our response, but only once we are
        // awake; while we sleep every gap is seen one 30 us wake-up late. The estimator must
        // not take that latency for the peer's.
        let mut p = Poller::new(Policy::Adaptive, WAKE);
        let mut t = Instant::now();
        for _ in 0..20 {
            p.on_work(t);
            // The ring empties; the policy decides.
            if p.on_empty(t + us(1)) == Idle::Arm {
                p.woke();
                t += us(3) + WAKE.typical;
            } else {
                t += us(3);
            }
        }
        assert!(p.window() >= us(3), "window {:?}", p.window());
        assert_eq!(p.on_empty(t + us(1)), Idle::Poll);
    }

    #[test]
    fn probing_reopens_a_closed_window_and_backs_off_when_it_fails() {
        let mut p = Poller::new(Policy::Adaptive, WAKE);
        let mut t = Instant::now();
        // Long gaps close the window.
        drive(&mut p, &mut t, us(200), 40, us(1));
        assert_eq!(p.window(), Duration::ZERO);
        // While gaps stay long, probes fail and back off: few idle periods poll at all.
        let mut polled = 0;
        for _ in 0..200 {
            p.on_work(t);
            if p.on_empty(t + us(1)) == Idle::Poll {
                polled += 1;
                assert_eq!(
                    p.on_empty(t + us(61)),
                    Idle::Arm,
                    "a probe lasts two wake-ups at most"
                );
            }
            p.woke();
            t += us(200);
        }
        assert!(polled <= 12, "probed {polled} of 200 long gaps");
        // Gaps become short (8 us): the next probe catches one and the window reopens.
        for _ in 0..(2 * PROBE_BACKOFF_MAX) {
            p.on_work(t);
            let mut now = t + us(1);
            let mut slept = false;
            while now < t + us(8) {
                if p.on_empty(now) != Idle::Poll {
                    slept = true;
                    break;
                }
                now += us(1);
            }
            if slept {
                p.woke();
            }
            t += us(8);
        }
        assert!(p.window() >= us(8), "window {:?}", p.window());
    }

    #[test]
    fn a_probe_that_catches_a_long_gap_still_backs_off() {
        // Wake-ups here cost 30 us, so a probe polls 60 us; gaps of 50 us are caught by every
        // probe but are longer than a wake-up: polling through them does not pay.
        let mut p = Poller::new(Policy::Adaptive, WAKE);
        let mut t = Instant::now();
        let sleeps = drive(&mut p, &mut t, us(50), 400, us(1));
        assert_eq!(p.window(), Duration::ZERO);
        assert!(p.estimate().2 >= 32, "probe back-off {}", p.estimate().2);
        assert!(
            sleeps >= 350,
            "polled through {} of 400 long gaps",
            400 - sleeps
        );
    }

    #[test]
    fn rare_long_stalls_do_not_close_the_window() {
        // 1 us gaps with a 500 us stall every 30th: polling still pays almost every time.
        let mut p = Poller::new(Policy::Adaptive, WAKE);
        let mut t = Instant::now();
        let mut sleeps = 0;
        for i in 0..3000u32 {
            let gap = if i % 30 == 29 { us(500) } else { us(2) };
            sleeps += drive(&mut p, &mut t, gap, 1, Duration::from_nanos(250));
        }
        assert!(p.window() > Duration::ZERO, "window {:?}", p.window());
        assert!(
            sleeps <= 3000 / 30 + 10,
            "slept {sleeps} times, stalls are only 100"
        );
    }

    #[test]
    fn a_busy_queue_waits_out_stalls_for_the_whole_bound() {
        let mut p = Poller::new(Policy::Adaptive, WAKE);
        let mut t = Instant::now();
        drive(&mut p, &mut t, us(2), 200, Duration::from_nanos(500));
        assert_eq!(p.window(), 2 * WAKE.typical);
        // A 45 us stall is polled through, not slept (the gap starts at the first empty poll).
        p.on_work(t);
        assert_eq!(p.on_empty(t + us(1)), Idle::Poll);
        assert_eq!(p.on_empty(t + us(46)), Idle::Poll);
        assert_eq!(
            p.on_empty(t + us(62)),
            Idle::Arm,
            "but never past two wake-ups"
        );
    }

    #[test]
    fn fixed_policies_behave_as_named() {
        let t = Instant::now();
        assert_eq!(Poller::new(Policy::Notify, WAKE).on_empty(t), Idle::Arm);
        assert_eq!(
            Poller::new(Policy::Busy, WAKE).on_empty(t + Duration::from_secs(9)),
            Idle::Poll
        );
        let mut s = Poller::new(Policy::Spin(3), WAKE);
        assert_eq!(
            [s.on_empty(t), s.on_empty(t), s.on_empty(t)],
            [Idle::Poll, Idle::Poll, Idle::Arm]
        );
        s.on_work(t);
        assert_eq!(s.on_empty(t), Idle::Poll, "work resets the budget");
        let mut tm = Poller::new(Policy::Timer(us(150)), WAKE);
        tm.on_work(t);
        assert_eq!(tm.on_empty(t + us(1)), Idle::Until(t + us(150)));
        // Found empty at the deadline: the next drain is one period later.
        assert_eq!(tm.on_empty(t + us(150)), Idle::Until(t + us(300)));
        assert_eq!(tm.on_empty(t + us(151)), Idle::Until(t + us(300)));
    }

    /// One drain cycle of a coalescing queue: at `now` the shard finds `n` packets in a ring
    /// of `ring` entries, drains them, and the ring is empty again; returns the answer.
    fn cycle(p: &mut Poller, now: Instant, n: usize, ring: u16) -> Idle {
        p.woke();
        p.took(n, ring);
        if n > 0 {
            p.on_work(now);
        }
        p.on_empty(now)
    }

    #[test]
    fn coalescing_drains_a_stream_every_half_ring_up_to_its_bound() {
        // 1 Mpps into a 1024-entry ring: half of it fills in 512 us.
        let mut p = Poller::new(Policy::Coalesce(us(2000)), WAKE);
        let t = Instant::now();
        // The first drain of a stream only starts the measurement.
        assert!(!matches!(cycle(&mut p, t, 10, 1024), Idle::Until(_)));
        assert!(!p.coalescing());
        // 240 packets in the next 240 us: 1 per us, so half the ring lasts 512 us.
        let t2 = t + us(240);
        assert_eq!(cycle(&mut p, t2, 240, 1024), Idle::Until(t2 + us(512)));
        assert!(p.coalescing(), "a coalescing queue is not armed");
        // Woken early by another queue, still empty: the deadline stands.
        assert_eq!(p.on_empty(t2 + us(50)), Idle::Until(t2 + us(512)));
        let t3 = t2 + us(512);
        assert_eq!(cycle(&mut p, t3, 512, 1024), Idle::Until(t3 + us(512)));
        // The same stream under a tighter bound: the bound is the period.
        let mut b = Poller::new(Policy::Coalesce(us(300)), WAKE);
        cycle(&mut b, t, 10, 1024);
        assert_eq!(
            cycle(&mut b, t + us(240), 240, 1024),
            Idle::Until(t + us(540))
        );
    }

    #[test]
    fn coalescing_halves_the_period_when_a_drain_finds_the_ring_half_full() {
        let mut p = Poller::new(Policy::Coalesce(us(2000)), WAKE);
        let t = Instant::now();
        cycle(&mut p, t, 10, 1024);
        let t2 = t + us(240);
        assert_eq!(cycle(&mut p, t2, 240, 1024), Idle::Until(t2 + us(512)));
        // The rate quadrupled: the drain finds the ring full (1024 in 512 us, capped there):
        // the period halves, whatever the rate it measured.
        let t3 = t2 + us(512);
        assert_eq!(cycle(&mut p, t3, 1024, 1024), Idle::Until(t3 + us(256)));
    }

    #[test]
    fn coalescing_leaves_trickles_fast_streams_and_silence_to_the_adaptive_policy() {
        let t = Instant::now();
        // A trickle: each wake-up finds one packet; notifications cost that wake-up anyway.
        let mut p = Poller::new(Policy::Coalesce(us(1000)), WAKE);
        for k in 0..5 {
            let now = t + us(1000 * k);
            assert!(!matches!(cycle(&mut p, now, 1, 1024), Idle::Until(_)));
            assert!(!p.coalescing());
        }
        // 1 packet per us into a 256-entry ring: half of it lasts 128 us, under eight
        // wake-ups: the adaptive policy polls.
        let mut f = Poller::new(Policy::Coalesce(us(1000)), WAKE);
        cycle(&mut f, t, 64, 256);
        assert!(!matches!(
            cycle(&mut f, t + us(240), 240, 256),
            Idle::Until(_)
        ));
        assert!(!f.coalescing());
        // A stream that stops: the drain at the deadline finds nothing, and the queue goes
        // back to the adaptive answer (which arms it: the gap is long).
        let mut s = Poller::new(Policy::Coalesce(us(1000)), WAKE);
        cycle(&mut s, t, 10, 1024);
        assert!(!matches!(
            cycle(&mut s, t + us(240), 0, 1024),
            Idle::Until(_)
        ));
        assert!(!s.coalescing());
        assert_eq!(s.on_empty(t + us(1000)), Idle::Arm);
    }

    #[test]
    fn coalescing_backs_off_from_a_producer_that_waits_for_the_drain() {
        // A window-limited sender: 10 packets every 100 us while it is drained at once (0.1
        // per us: half a 256-entry ring lasts 1.28 ms, so the 500 us bound is the period);
        // held for a period, its next 10 come only after it.
        let mut p = Poller::new(Policy::Coalesce(us(500)), WAKE);
        let mut t = Instant::now();
        cycle(&mut p, t, 10, 256);
        // A free cycle coalesces; the held one after it brings a fifth of the free rate,
        // which ends coalescing; the `held` cycles after that are drained at once, at the
        // free rate again.
        let mut slowed_then_held = |held: u32| {
            t += us(100);
            assert_eq!(cycle(&mut p, t, 10, 256), Idle::Until(t + us(500)));
            t += us(500);
            assert!(
                !matches!(cycle(&mut p, t, 10, 256), Idle::Until(_)),
                "a coalesced cycle at a fifth of the free rate ends coalescing"
            );
            for _ in 0..held {
                t += us(100);
                assert!(!matches!(cycle(&mut p, t, 10, 256), Idle::Until(_)));
            }
        };
        slowed_then_held(COALESCE_HOLD_MIN);
        // Then it tries again; a second slowdown holds it twice as long.
        slowed_then_held(2 * COALESCE_HOLD_MIN);
        t += us(100);
        assert!(matches!(cycle(&mut p, t, 10, 256), Idle::Until(_)));
    }

    #[test]
    fn wake_cost_is_measured() {
        let w = WakeCost::measure(20);
        assert!(
            w.typical > Duration::ZERO && w.typical < Duration::from_millis(50),
            "{w:?}"
        );
        assert!(w.floor <= w.typical);
    }
}
