//! Machine limits: core-to-core cache-line hand-off and a plain shared-memory SPSC ring of
//! 64-byte slots (the most any path could carry 64-byte packets here).
//!
//! Two probes, both run on two threads pinned to two CPUs:
//!
//! * [`measure_c2c`]: a single `AtomicU64` on its own cache line is bounced between the two
//!   threads (ping = odd value, pong = the next even value). Half a round trip is the one-way
//!   cost of handing a cache line from one core to the other, the floor under any cross-core
//!   notification.
//! * [`measure_slot_ring`]: a single-producer single-consumer ring of 64-byte, cache-line
//!   aligned slots in ordinary memory, with batched index publication and cached peer indices.
//!   Its rate is an upper bound for moving 64-byte packets between two cores on this machine:
//!   any real dataplane (virtqueues, descriptors, notifications) does at least this much work.
//!
//! Every wait is bounded: the threads share a stop flag (also raised if either thread panics)
//! and give up when the peer makes no progress for a second, so a thread that fails
//! to start or dies never hangs the caller. When both threads share one CPU (or could not be
//! pinned) the waits yield the CPU instead of only spinning. A probe that could not run
//! returns `f64::NAN`.

use std::cell::UnsafeCell;
use std::hint::{black_box, spin_loop};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Machine limits measured by [`measure_default`].
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Limits {
    /// One-way cache-line hand-off between the two cores, in nanoseconds (median of samples).
    pub c2c_ns: f64,
    /// Rate of the 64-byte-slot ring, million slots per second.
    pub ring_mpps: f64,
    /// Publish batch used by the ring.
    pub ring_batch: usize,
}

/// Slots in the ring measured by [`measure_slot_ring`] (a power of two).
const RING_SLOTS: usize = 1024;
const _: () = assert!(RING_SLOTS.is_power_of_two());
/// Round trips per sample used by [`measure_default`].
const DEFAULT_C2C_ITERS: u32 = 200_000;
/// Samples used by [`measure_default`].
const DEFAULT_C2C_SAMPLES: u32 = 5;
/// Ring publish batch used by [`measure_default`].
const DEFAULT_RING_BATCH: usize = 32;
/// Ring measurement time used by [`measure_default`].
const DEFAULT_RING_DURATION: Duration = Duration::from_millis(500);

/// Untimed round trips run before the first c2c sample (at most; fewer if `iters` is smaller).
const C2C_WARMUP_MAX: u32 = 20_000;
/// Wall-time cap of one c2c sample; a sample that hits it is computed from the round trips done.
const C2C_SAMPLE_CAP: Duration = Duration::from_millis(250);
/// How often (in round trips, minus one: a mask) a c2c sample looks at the clock for
/// [`C2C_SAMPLE_CAP`].
const C2C_CLOCK_MASK: u32 = 1023;
/// How often (in consumed slots) the ring consumer looks at the clock.
const RING_CLOCK_EVERY: usize = 4096;
/// Longest the ring warm-up may be (it is a fifth of the measured duration otherwise).
const RING_WARMUP_MAX: Duration = Duration::from_millis(100);
/// A wait is abandoned when the peer made no progress for this long (dead or never started).
const STALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Spins between looks at the stop flag and the clock while waiting on a CPU of its own
/// (a power of two minus one, used as a mask). Each look also yields once, which is free
/// when nothing else wants the CPU and lets a descheduled peer run when something does.
const SPIN_CHECK_MASK: u32 = 1023;
/// Same as [`SPIN_CHECK_MASK`] when the peer shares the CPU (every wait step yields then).
const YIELD_CHECK_MASK: u32 = 63;

/// Filler written into bytes 8..64 of every ring slot.
const FILLER: u64 = 0xa5a5_5a5a_c3c3_3c3c;

/// Pads and aligns `T` to a cache line of its own.
#[repr(align(64))]
struct CacheLine<T>(T);

/// Raises a stop flag when dropped, including when its thread unwinds from a panic, so the
/// peer thread stops waiting at its next check.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        // Relaxed: the flag only ends waits; it publishes no data (results travel through
        // `join`, which synchronises on its own).
        self.0.store(true, Ordering::Relaxed);
    }
}

/// How one thread waits for its peer.
struct Waiter<'a> {
    /// Shared stop flag: once set, every wait gives up.
    stop: &'a AtomicBool,
    /// The peer may need this CPU to make progress: yield on every wait step.
    yield_always: bool,
}

impl Waiter<'_> {
    /// Polls `poll` until it returns `Some`. Returns `None` if the stop flag is raised or
    /// nothing happened for [`STALL_TIMEOUT`].
    #[inline(always)]
    fn until<T>(&self, mut poll: impl FnMut() -> Option<T>) -> Option<T> {
        let mask = if self.yield_always {
            YIELD_CHECK_MASK
        } else {
            SPIN_CHECK_MASK
        };
        let mut spins: u32 = 0;
        let mut stalled_since: Option<Instant> = None;
        loop {
            if let Some(v) = poll() {
                return Some(v);
            }
            spins = spins.wrapping_add(1);
            if self.yield_always {
                thread::yield_now();
            } else {
                spin_loop();
            }
            if spins & mask == 0 {
                // Relaxed: the flag orders nothing, it only ends the wait (see StopOnDrop).
                if self.stop.load(Ordering::Relaxed) {
                    return None;
                }
                let now = Instant::now();
                match stalled_since {
                    None => stalled_since = Some(now),
                    Some(t) if now.duration_since(t) > STALL_TIMEOUT => return None,
                    Some(_) => {}
                }
                if !self.yield_always {
                    thread::yield_now();
                }
            }
        }
    }
}

pub use pvnet_dataplane::pin_current_thread;

/// Median of the finite values in `v` (mean of the middle two for an even count), or NaN if
/// there are none.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The state of these 2-vCPU machines as its core-to-core hand-off shows it: they flip between
/// ~40-60 ns, ~90-120 ns and ~180-440 ns one way, and packet rates follow by up to ~3x, so
/// rates are compared only within one state. Same thresholds as `scripts/peers/bench_dpdk.sh`.
pub fn c2c_state(ns: f64) -> &'static str {
    if ns.is_nan() {
        "unknown"
    } else if ns < 75.0 {
        "fast"
    } else if ns < 150.0 {
        "mid"
    } else {
        "slow"
    }
}

/// Cache-line ping-pong between a thread pinned on `cpu_a` and one on `cpu_b`; returns one-way ns
/// (round trip / 2), median of `samples` runs of `iters` round trips.
///
/// A short untimed warm-up (up to 20 000 round trips) precedes the samples. Each sample is
/// capped at 250 ms of wall time and is then computed from the round trips it completed.
/// Returns NaN if `iters` or `samples` is 0 or no sample could be taken (a thread failed to
/// start, panicked or its peer stalled for a second).
pub fn measure_c2c(cpu_a: usize, cpu_b: usize, iters: u32, samples: u32) -> f64 {
    if iters == 0 || samples == 0 {
        return f64::NAN;
    }
    // The ping-pong word and the stop flag each on a cache line of their own, so the only
    // line moving between the cores during a sample is the word's.
    let word = CacheLine(AtomicU64::new(0));
    let stop = CacheLine(AtomicBool::new(false));
    let same_cpu = cpu_a == cpu_b;

    thread::scope(|s| {
        let responder = thread::Builder::new()
            .name("c2c-pong".into())
            .spawn_scoped(s, || {
                let _stop = StopOnDrop(&stop.0);
                let pinned = pin_current_thread(cpu_b);
                let waiter = Waiter {
                    stop: &stop.0,
                    yield_always: same_cpu || !pinned,
                };
                c2c_pong(&word.0, &waiter);
            });
        let Ok(responder) = responder else {
            return f64::NAN;
        };
        let pinger = thread::Builder::new()
            .name("c2c-ping".into())
            .spawn_scoped(s, || {
                let _stop = StopOnDrop(&stop.0);
                let pinned = pin_current_thread(cpu_a);
                let waiter = Waiter {
                    stop: &stop.0,
                    yield_always: same_cpu || !pinned,
                };
                c2c_ping(&word.0, &waiter, iters, samples)
            });
        let per_sample = match pinger {
            Ok(pinger) => pinger.join().unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        // Relaxed: only ends the responder's wait; nothing is published through it.
        stop.0.store(true, Ordering::Relaxed);
        // A panic in the responder cannot invalidate samples already taken; ignore it.
        let _ = responder.join();
        median(per_sample)
    })
}

/// One ping-pong round trip: publish odd `*next`, wait for the responder's `*next + 1`.
/// Returns false if the wait was abandoned.
#[inline(always)]
fn round_trip(word: &AtomicU64, waiter: &Waiter<'_>, next: &mut u64) -> bool {
    let ping = *next;
    *next = ping.wrapping_add(2);
    // Release: orders this thread's earlier writes before the ping, the same hand-off a real
    // producer pays for (there is no other payload here; on x86 it is a plain store).
    word.store(ping, Ordering::Release);
    waiter
        .until(|| {
            // Acquire: pairs with the responder's Release store of the pong, so everything the
            // responder wrote before answering is visible after this load.
            (word.load(Ordering::Acquire) == ping.wrapping_add(1)).then_some(())
        })
        .is_some()
}

/// The pinging side: warm-up, then `samples` timed runs of `iters` round trips. Returns the
/// one-way nanoseconds of every completed sample.
fn c2c_ping(word: &AtomicU64, waiter: &Waiter<'_>, iters: u32, samples: u32) -> Vec<f64> {
    let mut next: u64 = 1;
    for _ in 0..iters.min(C2C_WARMUP_MAX) {
        if !round_trip(word, waiter, &mut next) {
            return Vec::new();
        }
    }
    let mut out = Vec::with_capacity(usize::try_from(samples).unwrap_or(0));
    for _ in 0..samples {
        let t0 = Instant::now();
        let mut done: u32 = 0;
        while done < iters {
            if !round_trip(word, waiter, &mut next) {
                return out;
            }
            done += 1;
            if done & C2C_CLOCK_MASK == 0 && t0.elapsed() >= C2C_SAMPLE_CAP {
                break;
            }
        }
        let elapsed_ns = t0.elapsed().as_secs_f64() * 1e9;
        out.push(elapsed_ns / (2.0 * f64::from(done)));
    }
    out
}

/// The answering side: every odd value seen is answered with the next even value, until the
/// stop flag is raised (or the pinger stalls).
fn c2c_pong(word: &AtomicU64, waiter: &Waiter<'_>) {
    loop {
        let ping = waiter.until(|| {
            // Acquire: pairs with the pinger's Release store of the ping.
            let v = word.load(Ordering::Acquire);
            (v & 1 == 1).then_some(v)
        });
        let Some(ping) = ping else {
            return;
        };
        // Release: orders this thread's earlier accesses (the load of the ping) before the
        // pong that the pinger Acquire-loads.
        word.store(ping.wrapping_add(1), Ordering::Release);
    }
}

/// One 64-byte ring slot on a cache line of its own.
#[repr(C, align(64))]
struct Slot(UnsafeCell<[u64; 8]>);

// SAFETY: a slot is only touched through raw pointers under the SPSC protocol of
// `ring_produce` / `ring_consume`: the producer writes slot `i` only after an Acquire load of
// the consumer's head shows the consumer has released it, and the consumer reads slot `i`
// only after an Acquire load of the producer's tail shows it was published (Release). So
// every write happens-before the read of the same slot and vice versa; no access races.
unsafe impl Sync for Slot {}

/// The shared state of the ring probe: slots, the two indices and the stop flag, each on
/// cache lines of their own (the slots are a separate heap allocation).
struct Ring {
    /// `RING_SLOTS` slots; index `i` lives at `slots[i & (RING_SLOTS - 1)]`.
    slots: Box<[Slot]>,
    /// Slots published by the producer (monotonic, written only by the producer).
    tail: CacheLine<AtomicUsize>,
    /// Slots released by the consumer (monotonic, written only by the consumer).
    head: CacheLine<AtomicUsize>,
    /// Raised when either side is done (or died); ends the other side's waits.
    stop: CacheLine<AtomicBool>,
}

impl Ring {
    fn new(slots: usize) -> Self {
        let slots = (0..slots)
            .map(|_| Slot(UnsafeCell::new([0; 8])))
            .collect::<Box<[Slot]>>();
        Ring {
            slots,
            tail: CacheLine(AtomicUsize::new(0)),
            head: CacheLine(AtomicUsize::new(0)),
            stop: CacheLine(AtomicBool::new(false)),
        }
    }
}

/// SPSC ring of `slots` 64-byte slots (cache-line aligned) in ordinary memory shared by two threads
/// pinned to `cpu_a` (producer) and `cpu_b` (consumer). The producer writes 64 bytes into each slot
/// (a sequence number in the first 8 bytes and filler), publishing its tail index with one Release store
/// per `batch` slots; the consumer copies each slot out into a local 64-byte buffer (read every byte,
/// check the sequence number), and publishes its head with one Release store per batch. Each side
/// reads the other's index only when it runs out of room/work (cache the peer index locally).
/// Runs for `dur` after a short warm-up; returns million slots per second.
///
/// The ring has 1024 slots; `batch` is clamped to `1..=1024`. The warm-up is a fifth of `dur`,
/// at most 100 ms. Returns NaN if a thread failed to start or panicked, the peer stalled for a
/// second, or a slot arrived with the wrong sequence number.
pub fn measure_slot_ring(cpu_a: usize, cpu_b: usize, batch: usize, dur: Duration) -> f64 {
    let batch = batch.clamp(1, RING_SLOTS);
    let warmup = (dur / 5).min(RING_WARMUP_MAX);
    let ring = Ring::new(RING_SLOTS);
    let same_cpu = cpu_a == cpu_b;

    thread::scope(|s| {
        let consumer = thread::Builder::new()
            .name("ring-consumer".into())
            .spawn_scoped(s, || {
                let _stop = StopOnDrop(&ring.stop.0);
                let pinned = pin_current_thread(cpu_b);
                let waiter = Waiter {
                    stop: &ring.stop.0,
                    yield_always: same_cpu || !pinned,
                };
                ring_consume(&ring, &waiter, batch, warmup, dur)
            });
        let Ok(consumer) = consumer else {
            return f64::NAN;
        };
        let producer = thread::Builder::new()
            .name("ring-producer".into())
            .spawn_scoped(s, || {
                let _stop = StopOnDrop(&ring.stop.0);
                let pinned = pin_current_thread(cpu_a);
                let waiter = Waiter {
                    stop: &ring.stop.0,
                    yield_always: same_cpu || !pinned,
                };
                ring_produce(&ring, &waiter, batch);
            });
        if producer.is_err() {
            // Relaxed: only ends the consumer's wait; nothing is published through it.
            ring.stop.0.store(true, Ordering::Relaxed);
        }
        let rate = consumer.join().ok().flatten();
        // Relaxed: as above, for the producer (the consumer normally raised it already).
        ring.stop.0.store(true, Ordering::Relaxed);
        if let Ok(producer) = producer {
            // A producer panic would have shown up as a stall or a bad sequence number.
            let _ = producer.join();
        }
        rate.unwrap_or(f64::NAN)
    })
}

/// Producer side of the ring: fills `batch` slots at a time and publishes them with one
/// Release store of the tail. Runs until the stop flag is raised.
fn ring_produce(ring: &Ring, waiter: &Waiter<'_>, batch: usize) {
    let n = ring.slots.len();
    let mask = n - 1;
    let mut tail: usize = 0;
    // Consumer's head as last seen: everything below it may be overwritten.
    let mut head_seen: usize = 0;
    loop {
        if tail - head_seen > n - batch {
            let head = waiter.until(|| {
                // Acquire: pairs with the consumer's Release store of head, so its reads of
                // the slots below head happen-before our overwriting them.
                let h = ring.head.0.load(Ordering::Acquire);
                (tail - h <= n - batch).then_some(h)
            });
            match head {
                Some(h) => head_seen = h,
                None => return,
            }
        }
        for seq in tail..tail + batch {
            let p = ring.slots[seq & mask].0.get();
            let data = [
                seq as u64, FILLER, FILLER, FILLER, FILLER, FILLER, FILLER, FILLER,
            ];
            // SAFETY: `seq < head_seen + n` (room checked above), so the consumer has released
            // this slot (Acquire load of head) and will not read it until the Release store
            // of a tail above `seq` below: this thread has exclusive access. `p` comes from a
            // live, aligned `UnsafeCell<[u64; 8]>`.
            unsafe { p.write(data) };
        }
        tail += batch;
        // Release: publishes the slot writes above to the consumer's Acquire load of tail.
        ring.tail.0.store(tail, Ordering::Release);
    }
}

/// Consumer side of the ring: copies every published slot out, checks its sequence number,
/// releases up to `batch` slots per Release store of the head. Runs `warmup`, then measures
/// for `dur`; returns million slots per second, or `None` on a stall or a bad slot.
fn ring_consume(
    ring: &Ring,
    waiter: &Waiter<'_>,
    batch: usize,
    warmup: Duration,
    dur: Duration,
) -> Option<f64> {
    let mask = ring.slots.len() - 1;
    let mut head: usize = 0;
    // Producer's tail as last seen: everything below it is published.
    let mut tail_seen: usize = 0;
    let warm_end = Instant::now() + warmup;
    let mut measure_from: Option<(Instant, usize)> = None;
    let mut next_clock = RING_CLOCK_EVERY;
    let result = loop {
        if head == tail_seen {
            let tail = waiter.until(|| {
                // Acquire: pairs with the producer's Release store of tail, so its writes of
                // the slots below tail are visible to the reads below.
                let t = ring.tail.0.load(Ordering::Acquire);
                (t != head).then_some(t)
            });
            match tail {
                Some(t) => tail_seen = t,
                None => break None,
            }
        }
        let end = head + batch.min(tail_seen - head);
        let mut bad = false;
        for seq in head..end {
            let p = ring.slots[seq & mask].0.get();
            // SAFETY: `seq < tail_seen`, so the producer published this slot (Release store
            // of tail, Acquire load above) and will not write it again until the Release
            // store of a head above `seq` below: nobody writes it concurrently. `p` comes from
            // a live, aligned `UnsafeCell<[u64; 8]>`.
            let copy: [u64; 8] = unsafe { p.read() };
            // The copy must really happen: every byte of the slot is read.
            let copy = black_box(copy);
            bad |= copy[0] != seq as u64;
        }
        head = end;
        // Release: orders the slot reads above before the producer's Acquire load of head
        // that lets it overwrite them.
        ring.head.0.store(head, Ordering::Release);
        if bad {
            break None;
        }
        if head >= next_clock {
            next_clock = head + RING_CLOCK_EVERY;
            let now = Instant::now();
            match measure_from {
                None if now >= warm_end => measure_from = Some((now, head)),
                Some((t0, h0)) if now.duration_since(t0) >= dur => {
                    let secs = now.duration_since(t0).as_secs_f64();
                    break Some((head - h0) as f64 / secs / 1e6);
                }
                _ => {}
            }
        }
    };
    // Relaxed: ends the producer's waits; the result travels through `join`.
    ring.stop.0.store(true, Ordering::Relaxed);
    result
}

/// CPUs used by [`measure_default`]: 0 and 1, or 0 and 0 when only one CPU is online.
fn default_cpus() -> (usize, usize) {
    // SAFETY: sysconf takes an integer name and has no memory-safety preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if online >= 2 {
        (0, 1)
    } else {
        (0, 0)
    }
}

/// Both of the above with the defaults used by `pvnet bench`: c2c with 200_000 iters x 5 samples,
/// ring with batch 32, 1024 slots, 0.5 s. cpus 0 and 1 (or 0 and 0 if only one CPU exists).
pub fn measure_default() -> Limits {
    let (a, b) = default_cpus();
    let c2c_ns = measure_c2c(a, b, DEFAULT_C2C_ITERS, DEFAULT_C2C_SAMPLES);
    let ring_mpps = measure_slot_ring(a, b, DEFAULT_RING_BATCH, DEFAULT_RING_DURATION);
    Limits {
        c2c_ns,
        ring_mpps,
        ring_batch: DEFAULT_RING_BATCH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Mutex, PoisonError};

    /// The probes spin on both CPUs; running them one at a time keeps the tests quick.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn c2c_quick() {
        let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let ns = measure_c2c(0, 1, 1000, 1);
        assert!(ns.is_finite() && ns > 0.0, "c2c {ns}");
    }

    #[test]
    fn ring_quick() {
        let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let mpps = measure_slot_ring(0, 1, 32, Duration::from_millis(50));
        assert!(mpps.is_finite() && mpps > 0.0, "ring {mpps}");
    }

    #[test]
    fn same_cpu_and_odd_batches_finish() {
        let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let ns = measure_c2c(0, 0, 1000, 1);
        assert!(ns.is_finite() && ns > 0.0, "c2c same cpu {ns}");
        for batch in [0, 1, 7, RING_SLOTS, 5000] {
            let mpps = measure_slot_ring(0, 0, batch, Duration::from_millis(20));
            assert!(mpps.is_finite() && mpps > 0.0, "ring batch {batch}: {mpps}");
        }
    }

    #[test]
    fn degenerate_arguments() {
        let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(measure_c2c(0, 1, 0, 5).is_nan());
        assert!(measure_c2c(0, 1, 5, 0).is_nan());
        let t0 = Instant::now();
        let _ = measure_slot_ring(0, 1, 32, Duration::ZERO);
        assert!(t0.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn pin_rejects_bad_cpu() {
        assert!(!pin_current_thread(usize::MAX));
        assert!(!pin_current_thread(100_000));
    }

    #[test]
    fn median_of_samples() {
        assert!(median(vec![]).is_nan());
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, f64::NAN, 2.0, 3.0]), 2.5);
    }
}
