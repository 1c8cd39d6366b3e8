//! What every ring format shares: the validated pointers kept alive by the translator they
//! came from (and redone when it revokes), the StoreLoad fence of arm / re-check, and the
//! driver's free-id list.

use crate::config::{AddrSpace, QueueConfig, RingAddrs};
use crate::error::Result;
use crate::xlate::Translate;
use std::sync::Arc;

/// A format's ring pointers, validated against a translator.
pub(crate) trait Layout: Sized {
    /// Translates and validates the ring parts at `a` for `size` entries.
    fn new<M: Translate>(mem: &M, space: AddrSpace, a: RingAddrs, size: u16) -> Result<Self>;
    /// Entries.
    fn size(&self) -> u16;
    /// The part of the ring the device writes (split: the used ring; packed: the descriptor
    /// ring), for the dirty log.
    fn device_part(&self) -> (std::ptr::NonNull<u8>, usize);
}

/// A full memory fence between a store that enables notifications (or publishes an index)
/// and the load that follows it (StoreLoad). Both sides use it; without it each side can
/// read the other's stale value and both go to sleep: the lost wake-up.
#[inline]
pub(crate) fn store_load_fence() {
    #[cfg(not(feature = "unfenced-for-test"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(feature = "unfenced-for-test")]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Shared by both roles of every format: keeps the translator alive and rebuilds the ring
/// pointers when it changes.
#[derive(Debug)]
pub(crate) struct Mapped<M: Translate, R> {
    pub(crate) mem: Arc<M>,
    pub(crate) ring: R,
    pub(crate) addrs: RingAddrs,
    pub(crate) space: AddrSpace,
    /// The translator's generation the ring pointers were made at.
    generation: u64,
    /// The translator has a dirty log on (live migration): what the device writes is marked.
    pub(crate) logging: bool,
}

impl<M: Translate, R: Layout> Mapped<M, R> {
    pub(crate) fn new(mem: Arc<M>, cfg: &QueueConfig) -> Result<Self> {
        let generation = mem.generation();
        let ring = R::new(&*mem, cfg.space, cfg.addrs, cfg.size)?;
        Ok(Self {
            logging: mem.dirty_log().is_some(),
            mem,
            ring,
            addrs: cfg.addrs,
            space: cfg.space,
            generation,
        })
    }

    /// Re-translates the ring after a translator change (vhost-user requires it).
    pub(crate) fn remap(&mut self, mem: Arc<M>) -> Result<()> {
        let generation = mem.generation();
        self.ring = R::new(&*mem, self.space, self.addrs, self.ring.size())?;
        self.logging = mem.dirty_log().is_some();
        self.mem = mem;
        self.generation = generation;
        Ok(())
    }

    /// Marks `len` bytes at `p` (a field of the ring the device wrote) in the dirty log.
    #[inline(never)]
    #[cold]
    pub(crate) fn log_bytes(&self, p: std::ptr::NonNull<u8>, len: usize) {
        if let Some(l) = self.mem.dirty_log() {
            l.mark_host(p.as_ptr(), len);
        }
    }

    /// Marks the ring part the device writes in the dirty log (after a publish; a few pages).
    #[inline(never)]
    #[cold]
    pub(crate) fn log_ring(&self) {
        if let Some(l) = self.mem.dirty_log() {
            let (p, len) = self.ring.device_part();
            l.mark_host(p.as_ptr(), len);
        }
    }

    /// Re-translates the ring if the translator revoked anything since it was translated
    /// (once per batch; a constant compare for a table that never changes).
    #[inline]
    pub(crate) fn refresh(&mut self) -> Result<()> {
        let g = self.mem.generation();
        if g != self.generation {
            self.ring = R::new(&*self.mem, self.space, self.addrs, self.ring.size())?;
            self.generation = g;
        }
        Ok(())
    }
}

/// Translates a single-descriptor buffer the device reads (`write` false) or writes, if the
/// queue's direction allows it. Each arm passes its permission as a constant, so once
/// inlined the permission check folds into the translator's bounds compare (the hot path of
/// every format's simple parser).
#[inline(always)]
pub(crate) fn translate_buffer<M: Translate>(
    mem: &M,
    dir: crate::config::Direction,
    write: bool,
    addr: u64,
    hint: &mut usize,
) -> Option<(std::ptr::NonNull<u8>, u64)> {
    use crate::config::Direction;
    use crate::xlate::Perm;
    match write {
        false if dir != Direction::DeviceWrites => mem.translate(addr, Perm::Read, hint).ok(),
        true if dir != Direction::DeviceReads => mem.translate(addr, Perm::Write, hint).ok(),
        _ => None,
    }
}

/// Translates the buffers of a pop run for one kind of access: the window of the region the
/// last buffer fell in first, from registers, then the translator with the queue's hint
/// (the window taken again after each miss). The run loops of both formats use it.
pub(crate) struct RunXlate<'m, M: Translate> {
    mem: &'m M,
    perm: crate::xlate::Perm,
    pub(crate) hint: usize,
    win: crate::xlate::Window<'m>,
}

impl<'m, M: Translate> RunXlate<'m, M> {
    #[inline(always)]
    pub(crate) fn new(mem: &'m M, perm: crate::xlate::Perm, hint: usize) -> Self {
        Self {
            mem,
            perm,
            hint,
            win: mem.window(hint, perm),
        }
    }

    /// The host address of `len` bytes at `addr`, if they lie in one region that allows the
    /// access.
    #[inline(always)]
    pub(crate) fn buffer(&mut self, addr: u64, len: u32) -> Option<std::ptr::NonNull<u8>> {
        let (p, contig) = match self.win.get(addr) {
            Some(t) => t,
            None => self.miss(addr)?,
        };
        (u64::from(len) <= contig).then_some(p)
    }

    /// Outside the window: the translator, and the window of the region it found.
    #[cold]
    #[inline(never)]
    fn miss(&mut self, addr: u64) -> Option<(std::ptr::NonNull<u8>, u64)> {
        let t = self.mem.translate(addr, self.perm, &mut self.hint).ok()?;
        self.win = self.mem.window(self.hint, self.perm);
        Some(t)
    }
}

/// The length a driver takes from a used entry for a buffer with `cap` writable bytes. For a
/// buffer the device only reads there is nothing to report: some devices write the bytes they
/// read there (DPDK's vhost does in its in-order transmit batches); it is ignored and 0 taken,
/// since no byte of such a buffer is ever read back. Past the writable bytes is a violation.
#[inline]
pub(crate) fn used_len(id: u16, len: u32, cap: u32) -> Result<u32> {
    match cap {
        0 => Ok(0),
        _ if len > cap => Err(crate::Error::UsedLenTooBig { id, len, cap }),
        _ => Ok(len),
    }
}

/// Free descriptor (or buffer) ids, first in first out: when the device completes in order,
/// ids (and the buffers a driver ties to them) cycle through the table in order, so
/// descriptor lines and buffers are touched sequentially and hardware prefetchers can follow.
#[derive(Debug)]
pub(crate) struct IdFifo {
    ids: Box<[u16]>,
    head: usize,
    pub(crate) len: usize,
}

impl IdFifo {
    /// Every id of a `size` (a power of two) table, in order.
    pub(crate) fn full(size: u16) -> Self {
        Self {
            ids: (0..size).collect(),
            head: 0,
            len: usize::from(size),
        }
    }

    #[inline]
    pub(crate) fn front(&self) -> Option<u16> {
        (self.len > 0).then(|| self.ids[self.head])
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<u16> {
        let id = self.front()?;
        self.head = (self.head + 1) & (self.ids.len() - 1);
        self.len -= 1;
        Some(id)
    }

    /// The id `n` places from the front (`n < len`), without taking it.
    #[inline]
    pub(crate) fn nth(&self, n: usize) -> u16 {
        debug_assert!(n < self.len);
        self.ids[(self.head + n) & (self.ids.len() - 1)]
    }

    /// Takes the first `n` ids (`n <= len`), as `n` pops would.
    #[inline]
    pub(crate) fn skip(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        self.head = (self.head + n) & (self.ids.len() - 1);
        self.len -= n;
    }

    /// The `k`-th oldest of the `in_flight` ids popped and not pushed back, when they come
    /// back in the order they left (IN_ORDER): they still sit, in that order, in the slots
    /// just before `head` (a pop leaves its slot as it was; a push writes the oldest one's
    /// slot, with that same id).
    #[inline]
    pub(crate) fn recent(&self, k: u16, in_flight: u16) -> u16 {
        let mask = self.ids.len() - 1;
        self.ids[(self.head + self.ids.len() - usize::from(in_flight) + usize::from(k)) & mask]
    }

    /// Never overflows: only ids that were popped are pushed back (validated in flight).
    #[inline]
    pub(crate) fn push(&mut self, id: u16) {
        let tail = (self.head + self.len) & (self.ids.len() - 1);
        self.ids[tail] = id;
        self.len += 1;
    }
}
