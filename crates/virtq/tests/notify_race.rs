//! The arm / fence / re-check protocol under two real threads.
//!
//! A producer thread plays the driver: it adds a few buffers at a time, publishes, and kicks
//! only when `publish()` says so; sometimes it streams, sometimes it waits for everything to
//! come back (request/response), and it waits whenever the ring is full. A consumer thread
//! plays the device: it drains with `available/pop/push_used/publish` with kicks disabled,
//! and when the ring is empty it arms (`arm_notify`), processes on `Armed::NotEmpty`, and on
//! `Armed::Empty` waits for a kick. The producer does the same with `arm_used_notify` when
//! it waits for used buffers, so both directions are exercised.
//!
//! Kicks and calls go through [`EventFd`], a counting wake-up built from std (an atomic
//! counter plus `park`/`unpark`), read-and-reset like an eventfd.
//!
//! Detecting a lost wake-up exactly: after each complete publish (the store of the index,
//! the notification decision and the kick if any) a side stores the index it published in a
//! "done" mark. A waiter whose wait times out reads the peer's mark, then its counter: if the
//! mark is past what the waiter consumed and no notification is pending, the peer published
//! entries after the waiter armed and saw an empty ring, decided not to notify, and finished:
//! a lost wake-up. (A slow peer, still between its index store and its kick, has not moved
//! its mark yet, so scheduling noise cannot produce a false positive; the timeout only sets
//! how soon a loss is noticed.)
//!
//! Budgets: each stress configuration runs for 200k handoffs or 3 s, whichever comes first
//! (`VIRTQ_RACE_HANDOFFS`, `VIRTQ_RACE_SECS` override).

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};
use virtq::mock::MockQueue;
use virtq::Armed;
use virtq::Format;
use virtq::{Buf, DeviceQueue, Direction, DriverQueue, QueueConfig};

/// A counting wake-up primitive: `kick` adds one and wakes the registered waiter, `wait`
/// consumes everything pending or times out.
#[derive(Debug, Default)]
struct EventFd {
    count: AtomicU64,
    waiter: OnceLock<Thread>,
}

impl EventFd {
    /// Makes the calling thread the one `kick` unparks.
    fn register(&self) {
        let _ = self.waiter.set(thread::current());
    }

    fn kick(&self) {
        // SeqCst RMW: the kicker's earlier stores (its ring index) happen before the waiter's
        // read of the counter that sees this increment.
        self.count.fetch_add(1, Ordering::SeqCst);
        if let Some(t) = self.waiter.get() {
            t.unpark();
        }
    }

    /// Drops pending notifications (done before arming, so that a wake-up proves a new kick).
    fn clear(&self) {
        self.count.swap(0, Ordering::SeqCst);
    }

    fn pending(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Spins for `spin`, then parks, until a kick arrives (true) or `timeout` passes (false).
    fn wait(&self, spin: Duration, timeout: Duration) -> bool {
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            if self.count.load(Ordering::Acquire) > 0 {
                self.count.swap(0, Ordering::SeqCst);
                return true;
            }
            i = i.wrapping_add(1);
            if !i.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return false;
            }
            if waited >= spin {
                thread::park_timeout((timeout - waited).min(Duration::from_millis(1)));
            }
        }
    }
}

/// Tiny xorshift, for jitter and burst sizes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Spins for a few iterations, to vary how the two threads' windows line up.
    fn jitter(&mut self, max: u64) {
        if max > 0 {
            for _ in 0..self.below(max) {
                std::hint::spin_loop();
            }
        }
    }
}

fn low16(v: u64) -> u16 {
    u16::try_from(v & 0xffff).expect("masked")
}

#[derive(Debug, Clone, Copy)]
struct Params {
    format: Format,
    size: u16,
    event_idx: bool,
    handoffs: u64,
    budget: Duration,
    /// How long a waiter sleeps before it checks for a lost wake-up.
    timeout: Duration,
    /// How long a waiter spins before it parks.
    spin: Duration,
    /// Upper bound of the random spin before publish and arm.
    jitter: u64,
    /// Stop at the first lost wake-up (the negative control only needs one).
    stop_at_first_loss: bool,
}

impl Params {
    fn stress(format: Format, event_idx: bool) -> Self {
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
        Self {
            format,
            size: 16,
            event_idx,
            handoffs: env("VIRTQ_RACE_HANDOFFS").unwrap_or(200_000),
            budget: Duration::from_secs(env("VIRTQ_RACE_SECS").unwrap_or(3)),
            timeout: Duration::from_millis(200),
            spin: Duration::from_micros(50),
            jitter: 16,
            stop_at_first_loss: false,
        }
    }
}

/// What one side saw.
#[derive(Debug, Default, Clone, Copy)]
struct Side {
    /// Buffers published (producer) or consumed (consumer).
    items: u64,
    /// Notifications sent to the peer.
    notified: u64,
    /// `Armed::NotEmpty`: the re-check caught work that arrived while arming.
    rechecks: u64,
    /// `Armed::Empty`: the side slept.
    sleeps: u64,
    /// Waits that timed out (whatever the reason).
    timeouts: u64,
    /// Lost wake-ups.
    lost: u64,
}

#[derive(Debug, Default)]
struct Shared {
    kick: EventFd,
    call: EventFd,
    /// Avail index after the producer's last complete publish (store, decision, kick).
    avail_done: AtomicU16,
    /// Used index after the consumer's last complete publish (store, decision, call).
    used_done: AtomicU16,
    /// The producer has finished; `avail_done` is final.
    stop: AtomicBool,
    /// Something went wrong: both sides leave.
    abort: AtomicBool,
    losses: AtomicU64,
}

impl Shared {
    fn fail(&self, why: String) -> String {
        self.abort.store(true, Ordering::SeqCst);
        self.kick.kick();
        self.call.kick();
        why
    }

    fn lost(&self, p: &Params) {
        self.losses.fetch_add(1, Ordering::SeqCst);
        if p.stop_at_first_loss {
            self.abort.store(true, Ordering::SeqCst);
            self.kick.kick();
            self.call.kick();
        }
    }
}

/// The queue both sides build, in the run's format.
fn config(mq: &MockQueue, p: &Params) -> QueueConfig {
    QueueConfig {
        format: p.format,
        base: p.format.fresh_base(),
        ..mq.config(Direction::DeviceReads, p.event_idx, false)
    }
}

/// The driver side: publish, kick when told to, reclaim; wait for calls when full or in
/// request/response mode.
fn producer(mq: &MockQueue, sh: &Shared, p: &Params, start: &Barrier) -> Result<Side, String> {
    let cfg = config(mq, p);
    let mut drv = DriverQueue::new(mq.mem.clone(), &cfg).map_err(|e| sh.fail(e.to_string()))?;
    sh.call.register();
    start.wait(); // rings initialised: the device may build its side
    start.wait(); // both waiters registered
    drv.disable_used_notify();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ u64::from(p.event_idx));
    let mut s = Side::default();
    let mut reclaimed = 0u64;
    let t0 = Instant::now();
    let hard = t0 + p.budget + Duration::from_secs(20);
    let buf = Buf {
        addr: mq.buf(0),
        len: 64,
        write: false,
    };
    let reclaim = |drv: &mut DriverQueue, reclaimed: &mut u64| -> Result<(), String> {
        if drv.used_available().map_err(|e| sh.fail(e.to_string()))? > 0 {
            while let Some((_, len)) = drv.pop_used().map_err(|e| sh.fail(e.to_string()))? {
                assert_eq!(len, 0);
                *reclaimed += 1;
            }
        }
        Ok(())
    };
    while s.items < p.handoffs && t0.elapsed() < p.budget && !sh.abort.load(Ordering::Relaxed) {
        reclaim(&mut drv, &mut reclaimed)?;
        let free = u64::try_from(drv.free_count()).expect("small");
        if free > 0 {
            let burst = (1 + rng.below(3)).min(free);
            for _ in 0..burst {
                drv.add_one(buf).map_err(|e| sh.fail(e.to_string()))?;
            }
            s.items += burst;
            rng.jitter(p.jitter);
            if drv.publish() {
                sh.kick.kick();
                s.notified += 1;
            }
            // Release: the publish and the kick above happen before a reader of this mark.
            sh.avail_done.store(low16(s.items), Ordering::Release);
        }
        // Request/response a quarter of the time; always wait when the ring is full.
        let wait_all = rng.below(4) == 0;
        loop {
            reclaim(&mut drv, &mut reclaimed)?;
            let done = if wait_all {
                drv.in_flight() == 0
            } else {
                drv.free_count() > 0
            };
            if done || sh.abort.load(Ordering::Relaxed) {
                break;
            }
            sh.call.clear();
            rng.jitter(p.jitter);
            match drv.arm_used_notify().map_err(|e| sh.fail(e.to_string()))? {
                Armed::NotEmpty => {
                    s.rechecks += 1;
                    drv.disable_used_notify();
                    continue;
                }
                Armed::Empty => s.sleeps += 1,
            }
            loop {
                if sh.call.wait(p.spin, p.timeout) {
                    break;
                }
                s.timeouts += 1;
                // Mark first, then the counter: a call made before the mark was stored is
                // visible to the counter read.
                let mark = sh.used_done.load(Ordering::Acquire);
                if sh.call.pending() {
                    break;
                }
                if mark != low16(reclaimed) {
                    s.lost += 1;
                    eprintln!(
                        "lost call: device published up to {mark}, driver armed at {} (event_idx {})",
                        low16(reclaimed),
                        p.event_idx
                    );
                    sh.lost(p);
                    break;
                }
                if sh.abort.load(Ordering::Relaxed) {
                    break;
                }
                if Instant::now() > hard {
                    return Err(sh.fail("producer: no progress".into()));
                }
            }
            drv.disable_used_notify();
        }
    }
    sh.stop.store(true, Ordering::Release);
    sh.kick.kick();
    Ok(s)
}

/// The device side: drain with kicks off; when empty, arm / fence / re-check, then sleep.
fn consumer(mq: &MockQueue, sh: &Shared, p: &Params, start: &Barrier) -> Result<Side, String> {
    start.wait();
    let cfg = config(mq, p);
    let mut dev: DeviceQueue =
        DeviceQueue::new(mq.mem.clone(), &cfg).map_err(|e| sh.fail(e.to_string()))?;
    sh.kick.register();
    start.wait();
    dev.disable_notify();
    let mut rng = Rng(0xd1b5_4a32_d192_ed03 ^ u64::from(p.event_idx));
    let mut s = Side::default();
    let hard = Instant::now() + p.budget + Duration::from_secs(20);
    while !sh.abort.load(Ordering::Relaxed) {
        let n = dev.available().map_err(|e| sh.fail(e.to_string()))?;
        if n > 0 {
            for _ in 0..n {
                let c = dev
                    .pop()
                    .map_err(|e| sh.fail(e.to_string()))?
                    .ok_or_else(|| sh.fail("batch ended early".into()))?;
                dev.push_used(c.head, 0);
            }
            s.items += u64::from(n);
            rng.jitter(p.jitter);
            if dev.publish() {
                sh.call.kick();
                s.notified += 1;
            }
            // Release: the publish and the call above happen before a reader of this mark.
            sh.used_done.store(low16(s.items), Ordering::Release);
            continue;
        }
        if sh.stop.load(Ordering::Acquire)
            && sh.avail_done.load(Ordering::Acquire) == low16(s.items)
        {
            break;
        }
        sh.kick.clear();
        rng.jitter(p.jitter);
        match dev.arm_notify().map_err(|e| sh.fail(e.to_string()))? {
            Armed::NotEmpty => {
                s.rechecks += 1;
                dev.disable_notify();
                continue;
            }
            Armed::Empty => s.sleeps += 1,
        }
        loop {
            if sh.kick.wait(p.spin, p.timeout) {
                break;
            }
            s.timeouts += 1;
            let mark = sh.avail_done.load(Ordering::Acquire);
            if sh.kick.pending() {
                break;
            }
            if mark != low16(s.items) {
                s.lost += 1;
                eprintln!(
                    "lost kick: driver published up to {mark}, device armed at {} ({:?}, event_idx {})",
                    low16(s.items),
                    p.format,
                    p.event_idx
                );
                sh.lost(p);
                break;
            }
            if sh.stop.load(Ordering::Acquire) || sh.abort.load(Ordering::Relaxed) {
                break;
            }
            if Instant::now() > hard {
                return Err(sh.fail("consumer: no progress".into()));
            }
        }
        dev.disable_notify();
    }
    Ok(s)
}

/// Runs one producer and one consumer; returns what each saw and the elapsed time.
fn run(p: Params) -> (Side, Side, Duration) {
    let mq = MockQueue::new(p.size, 64);
    let sh = Shared::default();
    let start = Barrier::new(2);
    let t0 = Instant::now();
    let (prod, cons) = thread::scope(|sc| {
        let a = sc.spawn(|| producer(&mq, &sh, &p, &start));
        let b = sc.spawn(|| consumer(&mq, &sh, &p, &start));
        (a.join(), b.join())
    });
    let prod = prod.expect("producer panicked").expect("producer");
    let cons = cons.expect("consumer panicked").expect("consumer");
    let el = t0.elapsed();
    eprintln!(
        "event_idx {} ({el:.2?}): producer {prod:?}\n    consumer {cons:?}",
        p.event_idx
    );
    (prod, cons, el)
}

/// The stress runs share the machine's two CPUs: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn stress(format: Format, event_idx: bool) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (prod, cons, _) = run(Params::stress(format, event_idx));
    assert_eq!(prod.lost, 0, "lost calls (device -> driver)");
    assert_eq!(cons.lost, 0, "lost kicks (driver -> device)");
    // Everything published was consumed, and the run exercised the arm path both ways.
    assert_eq!(cons.items, prod.items);
    assert!(prod.items > 1000, "too few handoffs: {}", prod.items);
    assert!(
        cons.sleeps > 0 && prod.sleeps > 0,
        "both sides must sleep sometimes"
    );
    assert!(
        prod.notified > 0 && cons.notified > 0,
        "both sides must notify sometimes"
    );
}

#[test]
#[cfg_attr(
    feature = "unfenced-for-test",
    ignore = "fences are off: unfenced_loses_wakeups is the check"
)]
fn no_lost_wakeup_event_idx() {
    stress(Format::Split, true);
}

#[test]
#[cfg_attr(
    feature = "unfenced-for-test",
    ignore = "fences are off: unfenced_loses_wakeups is the check"
)]
fn no_lost_wakeup_flags() {
    stress(Format::Split, false);
}

#[test]
#[cfg_attr(
    feature = "unfenced-for-test",
    ignore = "fences are off: unfenced_loses_wakeups is the check"
)]
fn no_lost_wakeup_packed_event_idx() {
    stress(Format::Packed, true);
}

#[test]
#[cfg_attr(
    feature = "unfenced-for-test",
    ignore = "fences are off: unfenced_loses_wakeups is the check"
)]
fn no_lost_wakeup_packed_flags() {
    stress(Format::Packed, false);
}

/// Negative control: with `unfenced-for-test` the StoreLoad fences are compiler fences only,
/// and the stress test must catch a lost wake-up. Run it in release mode:
/// `cargo test -p virtq --release --features mock,unfenced-for-test --test notify_race`.
#[cfg(feature = "unfenced-for-test")]
#[test]
fn unfenced_loses_wakeups() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut total = 0;
    for (format, event_idx) in [
        (Format::Split, true),
        (Format::Split, false),
        (Format::Packed, true),
        (Format::Packed, false),
    ] {
        let p = Params {
            handoffs: u64::MAX,
            budget: Duration::from_secs(10),
            // Short waits and pure spinning keep both threads hot, so that the two arm/publish
            // windows (a few nanoseconds each) overlap as often as possible.
            timeout: Duration::from_millis(5),
            spin: Duration::from_millis(5),
            jitter: 4,
            stop_at_first_loss: true,
            ..Params::stress(format, event_idx)
        };
        let (prod, cons, el) = run(p);
        eprintln!(
            "unfenced, {format:?}, event_idx {event_idx}: {} lost kicks, {} lost calls after {} handoffs in {el:.2?}",
            cons.lost, prod.lost, prod.items
        );
        total += cons.lost + prod.lost;
    }
    assert!(
        total > 0,
        "no lost wake-up without the fence: the stress test did not catch it here"
    );
}

// ------------------------------------------------------- the re-check, deterministically

/// Every ring format, with and without event indexes.
fn every_format_and_mode() -> impl Iterator<Item = (Format, bool)> {
    Format::ALL.iter().flat_map(|&f| [(f, false), (f, true)])
}

/// The window the re-check closes, in one thread: the device drains and sees an empty ring,
/// the driver publishes while the device still polls (no kick asked), then the device arms.
/// A consumer that ignores the `Armed` result sleeps with work pending; with event_idx no
/// later publish crosses `avail_event` again, so the wake-up is lost for good.
#[test]
fn ignoring_armed_not_empty_sleeps_with_work_pending() {
    for (format, event_idx) in every_format_and_mode() {
        let mq = MockQueue::new(8, 64);
        let (mut drv, mut dev) = mq
            .pair_in(format, Direction::DeviceReads, event_idx)
            .expect("pair");
        let kick = EventFd::default();
        let buf = Buf {
            addr: mq.buf(0),
            len: 64,
            write: false,
        };
        // Warm up: one buffer round trip while the device polls.
        dev.disable_notify();
        drv.add_one(buf).expect("free");
        let _ = drv.publish();
        assert_eq!(dev.available(), Ok(1));
        let c = dev.pop().expect("valid").expect("chain");
        dev.push_used(c.head, 0);
        let _ = dev.publish();
        // The device sees an empty ring and decides to sleep...
        assert_eq!(dev.available(), Ok(0));
        // ...the driver publishes before the device armed: no kick is asked for...
        drv.add_one(buf).expect("free");
        assert!(!drv.publish(), "device still polling: no kick");
        // ...the device arms. The naive consumer ignores the result and sleeps:
        let armed = dev.arm_notify().expect("valid ring");
        let woke = kick.wait(Duration::ZERO, Duration::from_millis(20));
        assert!(!woke, "nobody kicked");
        assert_eq!(dev.available(), Ok(1), "slept with a buffer pending");
        if event_idx {
            // Lost for good: the next publishes do not cross avail_event either.
            drv.add_one(buf).expect("free");
            assert!(
                !drv.publish(),
                "event_idx: the armed index was already passed"
            );
        }
        // What the re-check said, and what a correct consumer does with it.
        assert_eq!(
            armed,
            Armed::NotEmpty,
            "the re-check saw the pending buffer"
        );
        assert!(dev.available().expect("valid") > 0);
        while let Some(c) = dev.pop().expect("valid") {
            dev.push_used(c.head, 0);
        }
        let _ = dev.publish();
        assert_eq!(dev.arm_notify(), Ok(Armed::Empty));
        // Armed on an empty ring: the very next publish kicks.
        drv.add_one(buf).expect("free");
        assert!(drv.publish(), "armed and empty: must kick");
    }
}

/// The other order: the device arms first, then the driver publishes before the device
/// sleeps. Here the re-check says Empty and the driver's publish kicks, so even a consumer
/// that goes to sleep is woken.
#[test]
fn publish_after_arm_kicks() {
    for (format, event_idx) in every_format_and_mode() {
        let mq = MockQueue::new(8, 64);
        let (mut drv, mut dev) = mq
            .pair_in(format, Direction::DeviceReads, event_idx)
            .expect("pair");
        let kick = EventFd::default();
        dev.disable_notify();
        assert_eq!(dev.arm_notify(), Ok(Armed::Empty));
        drv.add_one(Buf {
            addr: mq.buf(0),
            len: 64,
            write: false,
        })
        .expect("free");
        if drv.publish() {
            kick.kick();
        }
        assert!(kick.wait(Duration::ZERO, Duration::from_millis(20)));
    }
}

/// The same window in the other direction: the driver reclaims and sees nothing, the device
/// publishes while the driver polls (no call asked), then the driver arms.
#[test]
fn ignoring_armed_used_not_empty_sleeps_with_work_pending() {
    for (format, event_idx) in every_format_and_mode() {
        let mq = MockQueue::new(8, 64);
        let (mut drv, mut dev) = mq
            .pair_in(format, Direction::DeviceWrites, event_idx)
            .expect("pair");
        let call = EventFd::default();
        let buf = Buf {
            addr: mq.buf(0),
            len: 64,
            write: true,
        };
        drv.disable_used_notify();
        for _ in 0..3 {
            drv.add_one(buf).expect("free");
        }
        let _ = drv.publish();
        assert_eq!(dev.available(), Ok(3));
        // Warm-up: the first decision of a device always notifies.
        let c = dev.pop().expect("valid").expect("chain");
        dev.push_used(c.head, 8);
        let _ = dev.publish();
        assert_eq!(drv.used_available(), Ok(1));
        assert!(drv.pop_used().expect("valid").is_some());
        // The driver sees nothing more and decides to sleep...
        assert_eq!(drv.used_available(), Ok(0));
        // ...the device publishes before the driver armed: no call is asked for...
        let c = dev.pop().expect("valid").expect("chain");
        dev.push_used(c.head, 8);
        assert!(!dev.publish(), "driver still polling: no call");
        // ...the driver arms and, ignoring the result, sleeps.
        let armed = drv.arm_used_notify().expect("valid ring");
        assert!(!call.wait(Duration::ZERO, Duration::from_millis(20)));
        assert_eq!(
            drv.used_available(),
            Ok(1),
            "slept with a used buffer pending"
        );
        if event_idx {
            let c = dev.pop().expect("valid").expect("chain");
            dev.push_used(c.head, 8);
            assert!(
                !dev.publish(),
                "event_idx: the armed index was already passed"
            );
        }
        assert_eq!(armed, Armed::NotEmpty, "the re-check saw the used buffer");
    }
}
