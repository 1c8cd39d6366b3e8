//! The dirty log of live migration (vhost-user `VHOST_F_LOG_ALL` with
//! `VHOST_USER_PROTOCOL_F_LOG_SHMFD`): a bitmap shared with the frontend, one bit per 4 KiB
//! page of guest physical memory, set for every page the device writes while the frontend
//! migrates the guest (the frontend reads and clears the bits, and copies those pages again).
//!
//! A device writes guest memory through host pointers (receive buffers, the used ring); the log
//! is by guest physical address, so the log keeps its own copy of the shared memory's
//! host-to-guest map (under a vIOMMU the descriptors name IOVAs, but the pages are still the
//! guest's: the same map answers). Marks are atomic ORs on the bitmap's bytes, made after the
//! data is written: the frontend clears a bit and then copies the page, so a write it has not
//! copied is always marked after it lands.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Bytes of guest memory per bit of the log (`VHOST_LOG_PAGE`).
pub const LOG_PAGE: u64 = 4096;

/// One range of shared memory: host `start .. end` is guest physical `gpa ..`.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    gpa: u64,
}

/// A dirty log mapped from the frontend.
pub struct DirtyLog {
    bits: NonNull<AtomicU8>,
    /// Bytes of bitmap.
    len: usize,
    /// Shared memory by host address, sorted, not overlapping.
    map: Box<[Span]>,
    /// Pages marked (each mark of each page counted; for the counters).
    marked: AtomicU64,
    /// Keeps the bitmap mapped (shared with [`DirtyLog::with_shared`]'s logs).
    owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

// SAFETY: the bitmap is only touched through atomics; the map is immutable; the mapping lives
// as long as `_owner`, which the log owns.
unsafe impl Send for DirtyLog {}
// SAFETY: as above.
unsafe impl Sync for DirtyLog {}

impl std::fmt::Debug for DirtyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyLog")
            .field("bytes", &self.len)
            .field("marked", &self.marked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl DirtyLog {
    /// A log over `len` bytes at `bits`, for shared memory given as (host start, length, guest
    /// physical start) ranges.
    ///
    /// # Safety
    /// `bits .. bits + len` must be mapped read-write for as long as `owner` lives.
    pub unsafe fn new(
        bits: NonNull<u8>,
        len: usize,
        shared: impl IntoIterator<Item = (NonNull<u8>, u64, u64)>,
        owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        Self {
            bits: bits.cast(),
            len,
            map: Self::spans(shared),
            marked: AtomicU64::new(0),
            owner,
        }
    }

    /// The same bitmap over a new memory table's shared ranges (the frontend changed its
    /// memory while logging).
    pub fn with_shared(&self, shared: impl IntoIterator<Item = (NonNull<u8>, u64, u64)>) -> Self {
        Self {
            bits: self.bits,
            len: self.len,
            map: Self::spans(shared),
            marked: AtomicU64::new(self.marked()),
            owner: self.owner.clone(),
        }
    }

    fn spans(shared: impl IntoIterator<Item = (NonNull<u8>, u64, u64)>) -> Box<[Span]> {
        let mut map: Vec<Span> = shared
            .into_iter()
            .filter_map(|(host, l, gpa)| {
                let start = host.as_ptr() as usize;
                Some(Span {
                    start,
                    end: start.checked_add(usize::try_from(l).ok()?)?,
                    gpa,
                })
            })
            .collect();
        map.sort_by_key(|s| s.start);
        map.into_boxed_slice()
    }

    /// Marks the pages of guest physical `gpa .. gpa + len`. Pages past the end of the bitmap
    /// are not marked (the frontend sized it for its memory: a guest cannot make us write
    /// outside it).
    pub(crate) fn mark_gpa(&self, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        for page in first..=last {
            let Ok(byte) = usize::try_from(page / 8) else {
                return;
            };
            if byte >= self.len {
                return;
            }
            // SAFETY: `byte < len`, inside the mapping (see `new`).
            let b = unsafe { &*self.bits.as_ptr().add(byte) };
            // Release: the data written before is visible before the bit (the frontend reads
            // the bit, then the page).
            b.fetch_or(1 << (page % 8), Ordering::Release);
        }
        self.marked.fetch_add(last - first + 1, Ordering::Relaxed);
    }

    /// Marks the pages behind host `ptr .. ptr + len` (memory the device wrote).
    pub(crate) fn mark_host(&self, ptr: *const u8, len: usize) {
        let mut p = ptr as usize;
        let Some(end) = p.checked_add(len) else {
            return;
        };
        while p < end {
            let i = self.map.partition_point(|s| s.start <= p);
            let Some(s) = i.checked_sub(1).map(|i| self.map[i]).filter(|s| p < s.end) else {
                return; // not shared memory (cannot happen for what a queue translated)
            };
            let n = end.min(s.end) - p;
            self.mark_gpa(s.gpa + (p - s.start) as u64, n as u64);
            p += n;
        }
    }

    /// Pages marked so far.
    pub fn marked(&self) -> u64 {
        self.marked.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_the_pages_written_by_guest_address() {
        const PAGE: usize = 4096;
        let mut bitmap = vec![0u8; 4];
        let mut mem = vec![0u8; 5 * PAGE];
        let host = NonNull::new(mem.as_mut_ptr()).unwrap();
        // SAFETY: both buffers outlive the log (dropped at the end of the test).
        let log = unsafe {
            DirtyLog::new(
                NonNull::new(bitmap.as_mut_ptr()).unwrap(),
                bitmap.len(),
                [(host, mem.len() as u64, 8 * LOG_PAGE)],
                std::sync::Arc::new(()),
            )
        };
        // Guest page 8 + 1, the last byte of it and the first of the next.
        log.mark_host(host.as_ptr().wrapping_add(2 * PAGE - 1), 2);
        // Outside the shared memory: nothing.
        log.mark_host(host.as_ptr().wrapping_add(mem.len()), 16);
        // Past the bitmap's 32 pages: nothing, no write out of it.
        log.mark_gpa(32 * LOG_PAGE, LOG_PAGE * 4);
        assert_eq!(log.marked(), 2);
        drop(log);
        assert_eq!(bitmap, [0, 0b0000_0110, 0, 0]);
    }
}
