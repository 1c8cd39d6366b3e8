//! Survive a peer that shrinks the file behind memory it shared.
//!
//! A frontend can truncate its memfd after the backend mapped it; the next access past the
//! new end raises SIGBUS, which by default kills the whole backend and every other port.
//! Here every peer mapping is registered; a SIGBUS inside one of them maps an anonymous page
//! over the faulting address (so the interrupted copy completes, with zeroes), marks that
//! mapping faulted and bumps a generation counter. The worker sees the counter move, finds
//! the tables whose mappings faulted, and stops those ports' queues with
//! `virtq::Error::MemoryFault`. A SIGBUS anywhere else is left fatal, as before.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

/// Peer mappings covered at once: 128 ports with 32 regions each, or 64 of them mid-way
/// through a memory-table change. A mapping past this is refused ([`crate::mmap`]).
pub(crate) const SLOTS: usize = 4096;

struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // used only to initialise the array below
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static GENERATION: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

/// Registers `start..start+len` as peer memory; returns its slot (None if all are taken: the
/// caller must not use such a mapping, as a fault there would be fatal).
pub(crate) fn register(start: usize, len: usize) -> Option<usize> {
    INSTALL.call_once(install);
    for (i, s) in TABLE.iter().enumerate() {
        // Claim a free slot; Relaxed/AcqRel: the handler only needs to see start before end.
        if s.start
            .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.faulted.store(false, Ordering::Relaxed);
            s.end.store(start + len, Ordering::Release);
            return Some(i);
        }
    }
    None
}

/// Forgets a slot (before the range is unmapped).
pub(crate) fn unregister(slot: usize) {
    if let Some(s) = TABLE.get(slot) {
        s.end.store(0, Ordering::Release);
        s.start.store(0, Ordering::Release);
    }
}

/// True once a fault hit this slot's range.
pub(crate) fn faulted(slot: usize) -> bool {
    TABLE
        .get(slot)
        .is_some_and(|s| s.faulted.load(Ordering::Acquire))
}

/// Bumped on every handled fault: one relaxed load per poll round tells the worker to look.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// Replaces the page(s) around `addr` with anonymous memory; false if the kernel refused.
fn patch(addr: usize) -> bool {
    // 4 KiB first; a hugetlbfs mapping only accepts its own page size.
    for page in [4096usize, 2 << 20] {
        let base = addr & !(page - 1);
        // SAFETY: MAP_FIXED over a page inside a registered peer mapping that we own; only
        // its contents change (to zeroes). mmap is a plain syscall, safe in a signal handler.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            return true;
        }
    }
    false
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &TABLE {
        let (start, end) = (
            s.start.load(Ordering::Acquire),
            s.end.load(Ordering::Acquire),
        );
        if start != 0 && addr >= start && addr < end && patch(addr) {
            s.faulted.store(true, Ordering::Release);
            GENERATION.fetch_add(1, Ordering::Release);
            return;
        }
    }
    // Not peer memory (or unpatchable): restore the default action; the access faults again
    // and the process dies as it would have without us.
    // SAFETY: resetting a signal disposition is async-signal-safe.
    unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
}

fn install() {
    // SAFETY: sigaction is plain data; the handler only uses async-signal-safe operations.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}
