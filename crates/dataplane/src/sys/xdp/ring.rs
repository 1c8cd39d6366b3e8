//! The four rings an `AF_XDP` socket shares with the kernel (Linux
//! `Documentation/networking/af_xdp.rst`): single-producer single-consumer arrays of a
//! power-of-two size with free-running `u32` producer and consumer indices, mapped from the
//! socket. pvnet produces on the fill and transmit rings and consumes the receive and
//! completion rings; the kernel the other way round.
//!
//! Indices are loaded once per batch: a producer looks at the consumer index only when its
//! cached view has no room, a consumer at the producer index only when its cached view is
//! empty (the kernel's own `xsk_queue.h` scheme). Every ordering is said where it is used.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};

/// One mapped ring: `T` is `u64` (fill, completion: UMEM addresses) or
/// [`libc::xdp_desc`] (receive, transmit).
#[derive(Debug)]
pub struct Ring<T> {
    map: NonNull<u8>,
    map_len: usize,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    descs: NonNull<T>,
    mask: u32,
    /// Producer rings: our next index (published at `submit`). Consumer rings: our next
    /// index to read (published at `release`).
    local: u32,
    /// The other side's index as last loaded.
    cached: u32,
}

// SAFETY: the mapping belongs to the ring alone (unmapped on drop); a ring is used by one
// thread at a time (the shard that owns its port), never shared.
unsafe impl<T> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// Maps the ring of `size` entries at page offset `pgoff` of socket `fd`, whose layout
    /// the kernel gave in `off`.
    pub fn map(fd: i32, pgoff: i64, size: u32, off: &libc::xdp_ring_offset) -> io::Result<Self> {
        let desc = usize::try_from(off.desc).unwrap_or(usize::MAX);
        let len = desc + size as usize * size_of::<T>();
        // SAFETY: a fresh shared mapping of the socket's ring; the kernel checks the offset
        // and the length against the ring it made.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))?;
        let at = |o: u64| {
            // SAFETY: the kernel's offsets lie within the mapping (it sized it from them).
            unsafe { base.add(usize::try_from(o).unwrap_or(0)) }
        };
        Ok(Self {
            map: base,
            map_len: len,
            producer: at(off.producer).cast(),
            consumer: at(off.consumer).cast(),
            flags: at(off.flags).cast(),
            descs: at(off.desc).cast(),
            mask: size - 1,
            // A new socket's rings start at zero on both sides.
            local: 0,
            cached: 0,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: mapped for the ring's life, 4-byte aligned, only ever accessed atomically.
        unsafe { self.producer.as_ref() }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as `producer`.
        unsafe { self.consumer.as_ref() }
    }

    fn slot(&self, idx: u32) -> *mut T {
        // SAFETY: `idx & mask` < size: within the descriptor array of the mapping.
        unsafe { self.descs.as_ptr().add((idx & self.mask) as usize) }
    }

    /// Whether the kernel asked to be woken for this ring (`XDP_RING_NEED_WAKEUP`). Called
    /// after publishing: the full fence orders our index store before the flag's load,
    /// pairing with the kernel's set-flag-then-check-ring, so that either it sees our
    /// entries or we see its flag.
    pub fn needs_wakeup(&self) -> bool {
        fence(Ordering::SeqCst);
        // SAFETY: as `producer`.
        let f = unsafe { self.flags.as_ref() };
        f.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// The producer side (fill and transmit rings).
impl<T: Copy> Ring<T> {
    /// Free entries, looking at the kernel's consumer index only if fewer than `want` are
    /// known free.
    pub fn free(&mut self, want: u32) -> u32 {
        let size = self.mask + 1;
        let mut free = size - self.local.wrapping_sub(self.cached);
        if free < want {
            // Acquire: the kernel's reads of the entries it consumed happen before we
            // overwrite them.
            self.cached = self.consumer().load(Ordering::Acquire);
            free = size - self.local.wrapping_sub(self.cached);
        }
        free
    }

    /// Writes one entry at the next free index (the caller made sure of room with
    /// [`free`](Self::free)); the kernel sees it at [`submit`](Self::submit).
    pub fn push(&mut self, v: T) {
        // SAFETY: the slot is within the mapping and, room having been checked, not owned by
        // the kernel (between its consumer and our producer index nothing is its).
        unsafe { self.slot(self.local).write(v) };
        self.local = self.local.wrapping_add(1);
    }

    /// Entries pushed and not yet submitted.
    pub fn unsubmitted(&self) -> u32 {
        self.local
            .wrapping_sub(self.producer().load(Ordering::Relaxed))
    }

    /// Publishes what was pushed. Release: the entries' writes happen before the kernel can
    /// see the new producer index.
    pub fn submit(&mut self) {
        self.producer().store(self.local, Ordering::Release);
    }

    /// Entries the kernel has not consumed yet (a producer ring's backlog).
    pub fn pending(&mut self) -> u32 {
        // Acquire: as in `free`.
        self.cached = self.consumer().load(Ordering::Acquire);
        self.local.wrapping_sub(self.cached)
    }
}

/// The consumer side (receive and completion rings).
impl<T: Copy> Ring<T> {
    /// Entries ready to read (up to `max`), looking at the kernel's producer index only if
    /// fewer are known.
    pub fn ready(&mut self, max: u32) -> u32 {
        let mut n = self.cached.wrapping_sub(self.local);
        if n < max {
            // Acquire: the kernel's writes of the entries happen before we read them.
            self.cached = self.producer().load(Ordering::Acquire);
            n = self.cached.wrapping_sub(self.local);
        }
        n.min(max)
    }

    /// The `k`-th ready entry (`k` < what [`ready`](Self::ready) said).
    pub fn get(&self, k: u32) -> T {
        // SAFETY: the entry lies between our consumer index and the kernel's producer index
        // as loaded (Acquire) in `ready`: written and not reusable by the kernel until we
        // release it.
        unsafe { self.slot(self.local.wrapping_add(k)).read() }
    }

    /// Gives the first `n` ready entries back. Release: our reads of them happen before the
    /// kernel may reuse their slots.
    pub fn release(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        self.consumer().store(self.local, Ordering::Release);
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours, made in `map`, and nothing points into it past here.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}
