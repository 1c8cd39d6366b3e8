//! Markers for the coherence count (`scripts/coherence.sh`, `docs/coherence.md`).
//!
//! The count runs the one-thread switch harness under valgrind's lackey, which lists every
//! load and store with its address. What the trace cannot tell by itself is *who* made an
//! access (pvnet's device side or the driver the harness plays) and which loads were
//! prefetches (valgrind drops prefetch instructions). So the harness stores to one word of
//! `MARKS` when it hands the thread to the other side, and (with the `coherence` feature)
//! [`Prefetch`](crate::mem::Prefetch) turns each hint into a marked one-byte load of the line
//! it names. The analyser reads the markers' addresses from the harness's output and each
//! store to them as the event its index names.
//!
//! A marker is one relaxed atomic store (a plain `mov`): nothing on the per-packet path calls
//! one unless the `coherence` feature is on, and that feature is for the count's build only.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a store to a marker word says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Mark {
    /// From here the device (pvnet's port) runs.
    Device = 0,
    /// From here the driver (the harness's frontend) runs.
    Driver = 1,
    /// The counted window starts.
    Begin = 2,
    /// The counted window ends.
    End = 3,
    /// The loads up to [`Mark::PrefetchEnd`] are read prefetches.
    Prefetch = 4,
    /// The loads up to [`Mark::PrefetchEnd`] are prefetches with intent to write.
    PrefetchWrite = 5,
    /// The prefetch's loads end.
    PrefetchEnd = 6,
}

/// One word per [`Mark`], each on a line of its own so that no marker shares a line with data.
#[repr(C, align(64))]
struct Word(AtomicU64);

static MARKS: [Word; 7] = [const { Word(AtomicU64::new(0)) }; 7];

/// Records `m` in the trace.
#[inline(always)]
pub fn mark(m: Mark) {
    MARKS[m as usize].0.store(1, Ordering::Relaxed);
}

/// The address of marker 0 and the stride between markers (the analyser maps a store's
/// address to its [`Mark`] with them).
pub fn marks() -> (usize, usize) {
    (MARKS.as_ptr() as usize, size_of::<Word>())
}
