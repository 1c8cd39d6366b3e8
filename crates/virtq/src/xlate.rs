//! The translation seam: how a queue turns an address the peer wrote into host memory.
//!
//! A [`Translate`] maps an address range to host memory with a permission. Two kinds fit it:
//!
//! * the guest-physical region table ([`MemTable`](crate::MemTable)): the whole truth about
//!   what the peer shared; a miss means the peer named memory it does not have, a violation;
//! * an IOTLB (vhost-user `VIRTIO_F_ACCESS_PLATFORM`): a cache of what the peer granted; a
//!   miss may be filled later (the backend asks, the frontend answers), so the queue must
//!   wait for it, not stop.
//!
//! A miss is therefore a value ([`Miss`]) that the translator turns into an [`Error`]
//! ([`Translate::miss_error`]): fatal for the table, retryable ([`Error::is_retryable`]) for
//! a cache. A queue that meets a retryable miss consumes nothing and tries again later.
//!
//! Per-packet translation is [`Translate::translate`] with a per-queue hint (the last region
//! hit): never a linear scan. Ring translations are done once and redone when
//! [`Translate::generation`] moves (an invalidation), checked once per batch.

use crate::config::AddrSpace;
pub(crate) use crate::config::Perm;
use crate::error::Error;
use std::ptr::NonNull;

/// One region's addresses for one kind of access, held in registers by a loop that
/// translates a run of buffers (most of which fall where the one before did): the peer's
/// addresses `start..end` and where `start` is mapped. A loop asks
/// [`Translate::window`] for it after each [`Translate::translate`] and tries it first; an
/// empty window (the default) sends every address to `translate`.
#[derive(Debug, Clone, Copy)]
pub struct Window<'t> {
    start: u64,
    end: u64,
    host: NonNull<u8>,
    _t: std::marker::PhantomData<&'t ()>,
}

impl<'t> Window<'t> {
    /// A window no address falls in.
    pub const EMPTY: Window<'static> = Window {
        start: 0,
        end: 0,
        host: NonNull::dangling(),
        _t: std::marker::PhantomData,
    };

    /// The window `start..end` mapped at `host`.
    ///
    /// # Safety
    /// `host .. host + (end - start)` must be one mapping, valid for reads and writes (as the
    /// permission the window was made for allows) for `'t`.
    #[inline]
    pub unsafe fn new(start: u64, end: u64, host: NonNull<u8>) -> Self {
        Self {
            start,
            end,
            host,
            _t: std::marker::PhantomData,
        }
    }

    /// `addr`'s host pointer and how many bytes stay contiguous from there, if it falls in
    /// the window (what [`Translate::translate`] would answer for it).
    #[inline(always)]
    pub(crate) fn get(&self, addr: u64) -> Option<(NonNull<u8>, u64)> {
        if addr < self.start || addr >= self.end {
            return None;
        }
        #[allow(clippy::cast_possible_truncation)]
        // addr - start < end - start, the length of one mapping, which fits usize
        // SAFETY: the offset is inside the mapping (constructor contract).
        let p = unsafe { self.host.add((addr - self.start) as usize) };
        Some((p, self.end - addr))
    }
}

/// A range the translator could not map (not granted, not shared, or not with that
/// permission).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss {
    /// Start of the range, as the peer wrote it.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// What the access needed.
    pub perm: Perm,
}

/// Maps the peer's addresses to host memory.
///
/// # Contract
/// A pointer handed out is valid for the bytes it covers for as long as the translator lives
/// (a queue keeps its translator in an `Arc` next to every pointer it caches).
pub trait Translate: Send + Sync + std::fmt::Debug {
    /// Translates the start of a guest (or IOVA) range: the host pointer and how many bytes
    /// stay contiguous from there. `hint` is the caller's per-queue last hit, tried first.
    fn translate(
        &self,
        addr: u64,
        perm: Perm,
        hint: &mut usize,
    ) -> Result<(NonNull<u8>, u64), Miss>;

    /// Translates a range that must be contiguous in host memory (rings, indirect tables).
    fn translate_range(
        &self,
        space: AddrSpace,
        addr: u64,
        len: u64,
        perm: Perm,
    ) -> Result<NonNull<u8>, Miss>;

    /// What a miss means to the queue that met it: a violation for a table that is the whole
    /// truth, a retryable wait for a cache that can be filled.
    fn miss_error(&self, m: Miss) -> Error;

    /// Translates `len` bytes at `addr` that must be contiguous in host memory and are read
    /// per chain (an indirect table): the per-queue hint first. A range that stops short
    /// names its first untranslated byte (under an IOTLB, the page to ask for).
    #[inline]
    fn translate_contig(
        &self,
        addr: u64,
        len: u64,
        perm: Perm,
        hint: &mut usize,
    ) -> Result<NonNull<u8>, Error> {
        match self.translate(addr, perm, hint) {
            Ok((p, contig)) if contig >= len => Ok(p),
            Ok((_, contig)) => Err(self.miss_error(Miss {
                addr: addr + contig,
                len: len - contig,
                perm,
            })),
            Err(m) => Err(self.miss_error(Miss { len, ..m })),
        }
    }

    /// The window of the region a translation last hit (`hint`, as
    /// [`translate`](Self::translate) left it) for an access needing `perm`: what a loop
    /// over a run of buffers tries first. Empty by default.
    #[inline]
    fn window(&self, hint: usize, perm: Perm) -> Window<'_> {
        let _ = (hint, perm);
        Window::EMPTY
    }

    /// Moves whenever a translation handed out may have been revoked (an invalidation):
    /// queues re-translate their rings when it changes. Constant for an immutable table.
    #[inline]
    fn generation(&self) -> u64 {
        0
    }

    /// The dirty log pages the device writes must be marked in (live migration), if one is on.
    #[inline]
    fn dirty_log(&self) -> Option<&crate::dirty::DirtyLog> {
        None
    }
}
