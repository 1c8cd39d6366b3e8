//! The validated region table: guest (or IOVA) addresses and the peer's user addresses to
//! host pointers, with every access checked against the region's validated length.
//!
//! The same table, built with [`MemTable::granted`], is an IOTLB snapshot: its entries are
//! the IOVA ranges the peer granted (vhost-user `VIRTIO_F_ACCESS_PLATFORM`), each resolved
//! once to host memory through the region table and carrying its permission. The per-packet
//! lookup is the same code either way (the per-queue last hit, then a binary search), with the
//! permission folded into the bounds compare (`Region::ends`); a miss is retryable (the grant
//! may come) and an access the grant does not allow is refused.
//!
//! The table holds raw pointers into mappings it does not own. Whoever builds it promises
//! (in the `unsafe` constructor) that the mappings outlive the table; the vhost-user glue
//! does that by keeping the mappings and the table in one reference-counted object.
//!
//! Nothing here builds a `&[u8]` over shared memory: the peer may write it at any time.
//! Data moves with `ptr::copy` into or out of memory we own, through [`Seg`]. A `Seg<'m>`
//! borrows what keeps its memory mapped (the queue that parsed it, or a buffer of ours), so a
//! segment that outlives its memory does not compile.

pub(crate) use crate::config::AddrSpace;

use crate::dirty::DirtyLog;
use crate::error::{Error, Result};
use crate::xlate::{Miss, Perm, Translate, Window};
use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// One region as the peer described it and as we mapped it.
#[derive(Debug, Clone, Copy)]
pub struct RegionSpec {
    /// Guest physical (or IOVA) start address.
    pub gpa: u64,
    /// Length in bytes.
    pub len: u64,
    /// The peer's own virtual address of the start (vhost-user ring addresses use it).
    pub uaddr: u64,
    /// Where the region is mapped in this process.
    pub host: NonNull<u8>,
}

#[derive(Debug, Clone, Copy)]
struct Region {
    gpa: u64,
    /// `gpa + len`, checked not to overflow.
    gpa_end: u64,
    uaddr: u64,
    uaddr_end: u64,
    host: NonNull<u8>,
    /// What the peer allows (always read-write for shared memory; a grant's own otherwise).
    perm: Perm,
    /// The end of the range for an access needing each `Perm` (indexed by its bits): `gpa_end`
    /// where `perm` allows it, `gpa` (an empty range) where it does not. The per-packet check
    /// `gpa < ends[need]` is then the bounds check and the permission check in one compare.
    ends: [u64; 4],
}

impl Region {
    fn ends(gpa: u64, gpa_end: u64, perm: Perm) -> [u64; 4] {
        let end = |need| if perm.allows(need) { gpa_end } else { gpa };
        [gpa, end(Perm::Read), end(Perm::Write), end(Perm::ReadWrite)]
    }

    /// Whether `addr` lies in the region for an access needing `need`.
    #[inline(always)]
    fn holds(&self, addr: u64, need: Perm) -> bool {
        addr >= self.gpa && addr < self.ends[need as usize & 3]
    }
}

/// One IOVA range the peer granted: `iova .. iova + len` is its memory at its own user
/// address `uaddr`, with `perm` (vhost-user `VHOST_IOTLB_UPDATE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Start of the range in the device's I/O address space.
    pub iova: u64,
    /// Its length.
    pub len: u64,
    /// The peer's user address of the first byte.
    pub uaddr: u64,
    /// What the device may do there.
    pub perm: Perm,
}

/// A sorted, non-overlapping table of mapped regions, owning (optionally) what keeps the
/// mappings alive.
pub struct MemTable {
    regions: Box<[Region]>,
    /// Indices into `regions`, sorted by `uaddr` (ring addresses come in the peer's user space).
    by_uaddr: Box<[usize]>,
    /// An IOTLB snapshot: every address the peer writes (ring addresses included) is an IOVA,
    /// looked up in `regions`; a miss may be granted later.
    granted: bool,
    /// Live migration: where the pages written through this table are marked.
    dirty: Option<std::sync::Arc<DirtyLog>>,
    owner: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for MemTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemTable")
            .field("regions", &self.regions)
            .finish()
    }
}

// SAFETY: the table only holds pointers into shared mappings whose lifetime the constructor's
// caller guarantees; it has no interior mutability and no thread affinity.
unsafe impl Send for MemTable {}
// SAFETY: as above; `&MemTable` only translates addresses.
unsafe impl Sync for MemTable {}

impl MemTable {
    /// Builds a table, rejecting regions that wrap or overlap (in either address space).
    /// `owner` is whatever keeps the mappings alive (the mmaps); it is dropped with the table.
    ///
    /// # Safety
    /// Every `host .. host + len` must be mapped, readable and writable, for as long as
    /// `owner` lives (pointers translated through the table are used only while it lives).
    pub unsafe fn new(
        specs: &[RegionSpec],
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Self> {
        let mut regions = Vec::with_capacity(specs.len());
        for (index, s) in specs.iter().enumerate() {
            let bad = |why| Error::BadRegion { index, why };
            if s.len == 0 {
                return Err(bad("empty"));
            }
            let gpa_end = s.gpa.checked_add(s.len).ok_or(bad("guest range wraps"))?;
            let uaddr_end = s.uaddr.checked_add(s.len).ok_or(bad("user range wraps"))?;
            (s.host.as_ptr() as usize)
                .checked_add(usize::try_from(s.len).map_err(|_| bad("too large"))?)
                .ok_or(bad("host range wraps"))?;
            regions.push(Region {
                gpa: s.gpa,
                gpa_end,
                uaddr: s.uaddr,
                uaddr_end,
                host: s.host,
                perm: Perm::ReadWrite,
                ends: Region::ends(s.gpa, gpa_end, Perm::ReadWrite),
            });
        }
        regions.sort_by_key(|r| r.gpa);
        for (i, w) in regions.windows(2).enumerate() {
            if w[0].gpa_end > w[1].gpa {
                return Err(Error::BadRegion {
                    index: i + 1,
                    why: "overlaps another region",
                });
            }
        }
        let mut by_uaddr: Vec<usize> = (0..regions.len()).collect();
        by_uaddr.sort_unstable_by_key(|&i| regions[i].uaddr);
        for (i, w) in by_uaddr.windows(2).enumerate() {
            if regions[w[0]].uaddr_end > regions[w[1]].uaddr {
                return Err(Error::BadRegion {
                    index: i + 1,
                    why: "user range overlaps another region",
                });
            }
        }
        Ok(Self {
            regions: regions.into_boxed_slice(),
            by_uaddr: by_uaddr.into_boxed_slice(),
            granted: false,
            dirty: None,
            owner,
        })
    }

    /// An IOTLB snapshot over `base` (the shared-memory table): `grants`, sorted by IOVA and
    /// not overlapping, each resolved to host memory through `base`'s user addresses (a grant
    /// that spans two shared regions becomes two entries). The snapshot keeps `base` alive.
    ///
    /// A grant whose bytes are not all in shared memory is an error naming it: the caller
    /// checks each grant with [`MemTable::covers_user`] as it arrives.
    pub fn granted<'g>(
        base: &std::sync::Arc<MemTable>,
        grants: impl IntoIterator<Item = &'g Grant>,
    ) -> Result<Self> {
        let grants = grants.into_iter();
        let mut regions: Vec<Region> = Vec::with_capacity(grants.size_hint().0);
        let mut last_end = 0;
        // The shared region of the last grant: the next one is nearly always in it too.
        let mut near: Option<&Region> = None;
        for (index, g) in grants.enumerate() {
            let bad = |why| Error::BadRegion { index, why };
            let end = g.iova.checked_add(g.len).ok_or(bad("IOVA range wraps"))?;
            if g.len == 0 || (index > 0 && g.iova < last_end) {
                return Err(bad("grants must be non-empty, sorted and not overlap"));
            }
            last_end = end;
            let (mut iova, mut uaddr) = (g.iova, g.uaddr);
            while iova < end {
                let r = match near.filter(|r| uaddr >= r.uaddr && uaddr < r.uaddr_end) {
                    Some(r) => r,
                    None => base.user_region(uaddr).ok_or(bad("not in shared memory"))?,
                };
                near = Some(r);
                let n = (end - iova).min(r.uaddr_end - uaddr);
                let (host, _) = Self::host_at(r, uaddr - r.uaddr);
                // Pieces that continue the previous one in IOVA, host memory and permission
                // are one entry (a vIOMMU grants page by page: a ring spans several).
                if let Some(p) = regions.last_mut() {
                    let ptr = p.host.as_ptr() as usize;
                    let contiguous = usize::try_from(p.gpa_end - p.gpa)
                        .ok()
                        .and_then(|l| ptr.checked_add(l))
                        == Some(host.as_ptr() as usize);
                    if p.gpa_end == iova && p.perm == g.perm && contiguous {
                        p.gpa_end += n;
                        p.ends = Region::ends(p.gpa, p.gpa_end, p.perm);
                        p.uaddr_end += n;
                        iova += n;
                        uaddr += n;
                        continue;
                    }
                }
                regions.push(Region {
                    gpa: iova,
                    gpa_end: iova + n,
                    uaddr,
                    uaddr_end: uaddr + n,
                    host,
                    perm: g.perm,
                    ends: Region::ends(iova, iova + n, g.perm),
                });
                iova += n;
                uaddr += n;
            }
        }
        Ok(Self {
            regions: regions.into_boxed_slice(),
            by_uaddr: Box::new([]),
            granted: true,
            dirty: None,
            owner: Box::new(base.clone()),
        })
    }

    /// `this` with writes marked in `log` (live migration): the same translations (the new
    /// table keeps `this` alive). Without a log, `this` itself is the table.
    pub fn with_log(this: &std::sync::Arc<MemTable>, log: std::sync::Arc<DirtyLog>) -> Self {
        Self {
            regions: this.regions.clone(),
            by_uaddr: this.by_uaddr.clone(),
            granted: this.granted,
            dirty: Some(log),
            owner: Box::new(this.clone()),
        }
    }

    /// The shared memory as (host start, length, guest physical start) ranges: what a dirty
    /// log maps back from (a table of shared memory, not an IOTLB snapshot).
    pub fn shared_ranges(&self) -> Vec<(NonNull<u8>, u64, u64)> {
        self.regions
            .iter()
            .map(|r| (r.host, r.gpa_end - r.gpa, r.gpa))
            .collect()
    }

    /// Whether `uaddr .. uaddr + len` (the peer's user addresses) lies wholly in shared
    /// memory: what a grant must name.
    pub fn covers_user(&self, mut uaddr: u64, len: u64) -> bool {
        let Some(end) = uaddr.checked_add(len) else {
            return false;
        };
        while uaddr < end {
            match self.user_region(uaddr) {
                Some(r) => uaddr = r.uaddr_end,
                None => return false,
            }
        }
        true
    }

    /// The shared region holding user address `uaddr`.
    fn user_region(&self, uaddr: u64) -> Option<&Region> {
        let i = self
            .by_uaddr
            .partition_point(|&k| self.regions[k].uaddr <= uaddr);
        let r = &self.regions[self.by_uaddr[i.checked_sub(1)?]];
        (uaddr < r.uaddr_end).then_some(r)
    }

    /// Whether this is an IOTLB snapshot ([`MemTable::granted`]).
    pub fn is_granted(&self) -> bool {
        self.granted
    }

    /// Whatever keeps the mappings alive (as given to [`MemTable::new`]).
    pub fn owner(&self) -> &(dyn std::any::Any + Send + Sync) {
        &*self.owner
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// True if the table has no regions.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    #[inline]
    fn host_at(r: &Region, off: u64) -> (NonNull<u8>, u64) {
        #[allow(clippy::cast_possible_truncation)]
        // off < region len, which fit usize at construction
        // SAFETY: off < len and host..host+len is one mapping (constructor contract).
        let p = unsafe { r.host.add(off as usize) };
        (p, r.gpa_end - r.gpa - off)
    }
}

/// The table grants every byte it maps for reading and writing (the peer shared it all); a
/// miss is an address outside every region, a violation of the peer's.
impl Translate for MemTable {
    #[inline]
    fn dirty_log(&self) -> Option<&DirtyLog> {
        self.dirty.as_deref()
    }

    /// The region `hint` names, its end for `perm` (its start where `perm` is not allowed:
    /// an empty window).
    #[inline(always)]
    fn window(&self, hint: usize, perm: Perm) -> Window<'_> {
        match self.regions.get(hint) {
            // SAFETY: host..host + (gpa_end - gpa) is the region's one mapping, which the
            // table keeps for as long as it lives; `ends` is at most `gpa_end`.
            Some(r) => unsafe { Window::new(r.gpa, r.ends[perm as usize & 3], r.host) },
            None => Window::EMPTY,
        }
    }

    /// The per-queue last-hit region first, then a binary search: never a linear scan.
    /// Always inlined: callers pass the permission as a constant, which folds its check into
    /// the bounds compare.
    #[inline(always)]
    fn translate(
        &self,
        gpa: u64,
        perm: Perm,
        hint: &mut usize,
    ) -> std::result::Result<(NonNull<u8>, u64), Miss> {
        if let Some(r) = self.regions.get(*hint) {
            if r.holds(gpa, perm) {
                return Ok(Self::host_at(r, gpa - r.gpa));
            }
        }
        let miss = Miss {
            addr: gpa,
            len: 1,
            perm,
        };
        let i = self.regions.partition_point(|r| r.gpa <= gpa);
        let r = self
            .regions
            .get(i.checked_sub(1).ok_or(miss)?)
            .ok_or(miss)?;
        if r.holds(gpa, perm) {
            *hint = i - 1;
            Ok(Self::host_at(r, gpa - r.gpa))
        } else {
            Err(miss)
        }
    }

    /// A binary search in the address space asked for; the range must lie in one region.
    fn translate_range(
        &self,
        space: AddrSpace,
        addr: u64,
        len: u64,
        perm: Perm,
    ) -> std::result::Result<NonNull<u8>, Miss> {
        let miss = Miss { addr, len, perm };
        let end = addr.checked_add(len).ok_or(miss)?;
        // Under an IOTLB the rings' addresses are IOVAs too.
        let space = if self.granted {
            AddrSpace::Guest
        } else {
            space
        };
        let (r, off) = match space {
            AddrSpace::Guest => {
                let i = self.regions.partition_point(|r| r.gpa <= addr);
                let r = &self.regions[i.checked_sub(1).ok_or(miss)?];
                (end <= r.gpa_end && r.perm.allows(perm)).then(|| (r, addr - r.gpa))
            }
            AddrSpace::User => {
                let i = self
                    .by_uaddr
                    .partition_point(|&k| self.regions[k].uaddr <= addr);
                let r = &self.regions[self.by_uaddr[i.checked_sub(1).ok_or(miss)?]];
                (end <= r.uaddr_end).then(|| (r, addr - r.uaddr))
            }
        }
        .ok_or(miss)?;
        Ok(Self::host_at(r, off).0)
    }

    /// For shared memory, a violation. For grants: an access the grant covering the address
    /// does not allow is refused for good; anything else waits for a grant.
    fn miss_error(&self, m: Miss) -> Error {
        if !self.granted {
            return Error::AddrNotMapped {
                addr: m.addr,
                len: m.len,
            };
        }
        let i = self.regions.partition_point(|r| r.gpa <= m.addr);
        match i.checked_sub(1).map(|i| &self.regions[i]) {
            Some(r) if m.addr < r.gpa_end && !r.perm.allows(m.perm) => Error::AccessDenied {
                addr: m.addr,
                len: m.len,
                perm: m.perm,
            },
            _ => Error::TranslationMiss {
                addr: m.addr,
                len: m.len,
                perm: m.perm,
            },
        }
    }
}

/// A validated piece of a buffer: a host pointer good for `len` bytes for as long as `'m`,
/// the borrow of whatever keeps the memory mapped (the queue that parsed the chain, whose
/// translator cannot be swapped while the borrow lasts, or a buffer of ours).
///
/// Bytes move only by copies through the methods below: never a `&[u8]` over memory the peer
/// may write at any time. Every offset is checked against `len` before any pointer arithmetic.
#[derive(Debug, Clone, Copy)]
pub struct Seg<'m> {
    ptr: NonNull<u8>,
    len: u32,
    _mem: PhantomData<&'m MemTable>,
}

// SAFETY: a Seg points into memory its lifetime keeps mapped (a queue's `Arc` translator or
// a buffer of ours); it is as sendable as a shared reference to that memory.
unsafe impl Send for Seg<'_> {}

impl<'m> Seg<'m> {
    /// Built only by the queue parsers, after translation. The queue stores its segments as
    /// `Seg<'static>` in its scratch and lends them out only as `&'q [Seg<'q>]`, borrowed from
    /// itself (covariance shortens the lifetime).
    pub(crate) fn new(ptr: NonNull<u8>, len: u32) -> Self {
        Self {
            ptr,
            len,
            _mem: PhantomData,
        }
    }

    /// A segment over a buffer of ours (a staging buffer, a frame template), so that
    /// host-made packets go through the same copy routines as the peer's. The buffer stays
    /// mutably borrowed while the segment (or any copy of it) lives.
    #[inline]
    pub fn from_mut(buf: &'m mut [u8]) -> Self {
        Self::new(
            NonNull::new(buf.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            u32::try_from(buf.len()).unwrap_or(u32::MAX),
        )
    }

    /// A segment over `len` bytes at `ptr` in memory shared with a peer, for a driver that
    /// owns its buffer pool (pvnet's frontend lends its receive buffers in place this way).
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must stay mapped, readable and writable for all of `'m` (the caller
    /// ties `'m` to a borrow of whatever owns the mapping). The peer may write it at any time:
    /// that is why a segment is read and written only through copies, never as a slice.
    #[inline]
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: u32) -> Self {
        Self::new(ptr, len)
    }

    /// The host address, for handing the bytes to the kernel (`writev`) without a copy.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True if the segment is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Hints the CPU to start loading the segment's first `lines` cache lines (for reading),
    /// so the misses of a whole batch overlap instead of queueing one by one ([`Prefetch`] for
    /// writing, with the CPU asked once per batch).
    #[inline]
    pub fn prefetch(&self, lines: u32) {
        Prefetch::read().seg(self, lines);
    }

    /// The pointer at `off` and how many of `want` bytes fit from there, if `off <= len`:
    /// the bound is checked before the pointer moves.
    #[inline]
    fn at(&self, off: u32, want: usize) -> Option<(*mut u8, usize)> {
        let avail = self.len.checked_sub(off)? as usize;
        // SAFETY: off <= len and the segment lies in one mapped range (or a buffer of ours),
        // so the pointer stays inside it or one past its end.
        let p = unsafe { self.ptr.as_ptr().add(off as usize) };
        Some((p, want.min(avail)))
    }

    /// The bytes `off..off + len` of this segment as a segment of their own (the same
    /// memory, the same lifetime), if the segment holds them all: how a packet is re-cut
    /// around an inserted or removed header (an 802.1Q tag) without copying it.
    #[inline]
    pub fn sub(&self, off: u32, len: u32) -> Option<Seg<'m>> {
        let (p, n) = self.at(off, len as usize)?;
        if n < len as usize {
            return None;
        }
        // `p` is inside the segment or one past its end (`at`), never null.
        NonNull::new(p).map(|p| Seg::new(p, len))
    }

    /// Copies `dst.len()` bytes from offset `off`; returns how many were copied (short at the end).
    #[inline]
    pub fn read(&self, off: u32, dst: &mut [u8]) -> usize {
        let Some((p, n)) = self.at(off, dst.len()) else {
            return 0;
        };
        // SAFETY: `p..p+n` is inside the segment (`at`); `dst` is memory we own, which cannot
        // overlap the peer's mapping.
        unsafe { copy_out(p, dst.as_mut_ptr(), n) };
        n
    }

    /// The `N` bytes at `off`, if the segment holds them: a fixed-size copy the compiler
    /// inlines (packet headers), where [`read`](Self::read) calls `memcpy`.
    #[inline]
    pub fn read_array<const N: usize>(&self, off: u32) -> Option<[u8; N]> {
        let (p, n) = self.at(off, N)?;
        if n < N {
            return None;
        }
        let mut out = [0u8; N];
        // SAFETY: `p..p+N` is inside the segment (`at`); `out` is ours.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), N) };
        Some(out)
    }

    /// Writes the `N` bytes of `src` at `off`, if the segment holds them: a fixed-size store
    /// the compiler inlines (a header field), where [`write`](Self::write) calls `memcpy`.
    /// Returns false (and writes nothing) if they do not fit.
    #[inline]
    pub fn write_array<const N: usize>(&self, off: u32, src: [u8; N]) -> bool {
        match self.at(off, N) {
            Some((p, n)) if n == N => {
                // SAFETY: `p..p+N` is inside the segment (`at`); `src` is ours.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, N) };
                true
            }
            _ => false,
        }
    }

    /// Copies `src` to offset `off`; returns how many bytes were copied (short at the end).
    #[inline]
    pub fn write(&self, off: u32, src: &[u8]) -> usize {
        let Some((p, n)) = self.at(off, src.len()) else {
            return 0;
        };
        // SAFETY: `p..p+n` is inside the segment (`at`); `src` is ours and cannot overlap it
        // (a segment over a buffer of ours holds that buffer's only borrow).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, n) };
        n
    }
}

/// Hints the CPU to start loading `len` bytes at `p` (cache line by cache line), for
/// writing if `write`. No effect on correctness: a prefetch never faults.
#[inline]
pub fn prefetch_range(p: NonNull<u8>, len: u32, write: bool) {
    let pf = if write {
        Prefetch::write()
    } else {
        Prefetch::read()
    };
    pf.range(p, len);
}

/// Software prefetches of one kind, for a batch: the CPU's support for `PREFETCHW` is looked
/// up once when the value is made, so that a hint per buffer costs its instructions and a
/// test of a register.
///
/// For writing it is `PREFETCHW`, which asks for the line in exclusive state: the peer's
/// buffers sit in the other core's cache, and a read prefetch (`PREFETCHT0`, which is what
/// `_MM_HINT_ET0` compiles to without the `prfchw` target feature) brings them shared, so the
/// store that follows pays a second cross-core transfer to upgrade them. The instruction is
/// taken only where the CPU reports it (checked once per process).
#[derive(Debug, Clone, Copy)]
pub struct Prefetch {
    exclusive: bool,
}

impl Prefetch {
    /// Prefetches for reading.
    #[inline]
    pub(crate) fn read() -> Self {
        Self { exclusive: false }
    }

    /// Prefetches with intent to write (for reading where the CPU cannot).
    #[inline]
    pub fn write() -> Self {
        // The coherence count records the intent (its build issues no prefetch instruction).
        #[cfg(feature = "coherence")]
        let exclusive = true;
        #[cfg(all(target_arch = "x86_64", not(feature = "coherence")))]
        let exclusive = has_prefetchw();
        #[cfg(not(any(target_arch = "x86_64", feature = "coherence")))]
        let exclusive = false;
        Self { exclusive }
    }

    /// The first `lines` cache lines of a segment.
    #[inline(always)]
    pub(crate) fn seg(self, s: &Seg<'_>, lines: u32) {
        self.range(s.ptr, s.len.min(lines * 64));
    }

    /// The `lines` cache lines from the one holding the segment's byte `skip`, as far as the
    /// segment's first `skip + 64 * lines` bytes reach (a receive buffer's frame after its
    /// header). Not clamped to the segment: a hint past its end costs nothing and never
    /// faults (in the coherence build, whose hints are loads, callers keep it inside the
    /// mapping: a buffer is followed by the rest of its region).
    #[inline(always)]
    pub fn seg_from(self, s: &Seg<'_>, skip: u32, lines: u32) {
        // SAFETY: a non-null pointer plus a small offset inside one mapping is not null.
        let p = unsafe { NonNull::new_unchecked(s.ptr.as_ptr().wrapping_add(skip as usize)) };
        self.range(p, lines * 64);
    }

    /// `len` bytes at `p`, line by line.
    #[inline(always)]
    pub(crate) fn range(self, p: NonNull<u8>, len: u32) {
        #[cfg(feature = "coherence")]
        self.traced(p, len);
        #[cfg(all(target_arch = "x86_64", not(feature = "coherence")))]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let mut off = 0usize;
            while off < len as usize {
                let a = p.as_ptr().wrapping_add(off).cast_const();
                if self.exclusive {
                    // SAFETY: the CPU supports PREFETCHW (checked when `self` was made); a
                    // prefetch of any address never faults, touches no register or flag and
                    // has no architectural effect.
                    unsafe {
                        std::arch::asm!("prefetchw [{0}]", in(reg) a, options(nostack, preserves_flags, readonly));
                    }
                } else {
                    // SAFETY: SSE is part of the x86_64 baseline; a prefetch never faults.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(a.cast::<i8>()) };
                }
                off += 64;
            }
        }
        #[cfg(not(any(target_arch = "x86_64", feature = "coherence")))]
        let _ = (p, len, self.exclusive);
    }
}

#[cfg(feature = "coherence")]
impl Prefetch {
    /// The coherence count's view of a prefetch, in place of the instruction (valgrind drops
    /// it): a marked one-byte load of each line, tagged with the intent the code asked for.
    #[inline(never)]
    fn traced(self, p: NonNull<u8>, len: u32) {
        use crate::trace::{mark, Mark};
        mark(if self.exclusive {
            Mark::PrefetchWrite
        } else {
            Mark::Prefetch
        });
        // The bytes are summed and the sum kept: valgrind's translator drops a load whose
        // value is never used, and the trace would lose all but the last line.
        let (mut off, mut sum) = (0usize, 0u8);
        while off < len as usize {
            // SAFETY: the coherence build prefetches only lines inside segments it translated
            // (a prefetch past them would not fault, this load could): the callers hint
            // ranges of segments or of ring memory they hold.
            sum ^= unsafe { std::ptr::read_volatile(p.as_ptr().wrapping_add(off)) };
            off += 64;
        }
        std::hint::black_box(sum);
        mark(Mark::PrefetchEnd);
    }
}

/// Whether the CPU has `PREFETCHW` (cpuid `prfchw`), detected once.
#[cfg(all(target_arch = "x86_64", not(feature = "coherence")))]
#[inline]
fn has_prefetchw() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0: not asked yet, 1: no, 2: yes. One relaxed load per call (a prefetch loop is on the
    // per-packet path); racing first callers compute the same answer.
    static HAS: AtomicU8 = AtomicU8::new(0);
    match HAS.load(Ordering::Relaxed) {
        0 => {
            // CPUID 0x8000_0001 ECX bit 8: PRFCHW (3DNowPrefetch). `is_x86_feature_detected!`
            // has no name for it on stable Rust.
            #[allow(unused_unsafe)]
            // SAFETY: CPUID exists on every x86_64 CPU; leaf 0x8000_0000 gives the highest
            // extended leaf, checked before 0x8000_0001 is asked for.
            let has = unsafe {
                use std::arch::x86_64::__cpuid;
                __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
            };
            HAS.store(if has { 2 } else { 1 }, Ordering::Relaxed);
            has
        }
        v => v == 2,
    }
}

/// A copy out of a peer's buffer this long or longer ends with [`TAIL_DOWN`] bytes copied
/// from the end down ([`copy_out`]) while the thread spares its peers; a shorter one is one
/// `memmove`.
const TAIL_MIN: usize = 1024;

std::thread_local! {
    /// Whether this thread's long copies out of peers' buffers take their tail downward
    /// ([`copy_out`]); set per batch by the poller ([`spare_peers`]).
    static SPARE: Cell<bool> = const { Cell::new(false) };
}

/// How this thread's long copies out of peers' buffers run until the next call: `true`
/// while it copies out of a peer it keeps up with (its batch from that peer was not full:
/// the peer's time sets the rate, and the copy spares it the lines a plain copy's prefetch
/// would take from it: [`copy_out`]), `false` otherwise (the thread's own time sets the
/// rate, or the source is its own memory: one `memmove`, the fastest copy for it, whose
/// prefetch also runs on into the next frame). `false` until set.
#[inline]
pub fn spare_peers(yes: bool) {
    SPARE.with(|s| s.set(yes));
}

/// The bytes at the end of a long copy taken last, one cache line at a time from the top.
const TAIL_DOWN: usize = 256;

/// Copies `n` bytes from `src` (a peer's buffer) to `dst`: while the thread spares its peers
/// ([`spare_peers`]) and the copy is long, all but the last [`TAIL_DOWN`] bytes upward in one
/// `memmove`, then those from the end down, a cache line at a time; else one `memmove`.
///
/// Why not one `memmove`: a copy that runs upward to the end of a buffer trains the core's
/// stream prefetcher, which then runs on for several lines past the end, into memory the
/// peer writes (a DPDK frontend keeps the next mbuf ten lines after a 1500-byte frame in its
/// 2 KB data room; a Linux guest an skb's shared info after its data). Each line brought
/// over costs the peer an invalidation when it next writes it. Measured in the slow
/// core-to-core state (docs/interop.md, "The frontend's next mbuf"): a DPDK frontend sending
/// 1500-byte frames to pvnet's sink ran faster with the last 256 bytes read downward, or
/// with its mbufs twice as far apart, and not with them prefetched first. Read downward,
/// the last lines give the prefetcher no upward run to follow.
///
/// # Safety
///
/// As for `ptr::copy`: `src` readable and `dst` writable for `n` bytes. They may overlap (a
/// hostile peer can arrange that): the bytes copied are then unspecified, as the peer's
/// own writes make them anyway, and nothing outside the two ranges is touched.
#[inline(always)]
unsafe fn copy_out(src: *const u8, dst: *mut u8, n: usize) {
    if n < TAIL_MIN {
        // SAFETY: the caller's.
        unsafe { std::ptr::copy(src, dst, n) };
    } else {
        // SAFETY: the caller's.
        unsafe { copy_long(src, dst, n) };
    }
}

/// [`copy_out`] of `TAIL_MIN` bytes or more: out of line, so that the short copies inline
/// as one `memmove` call and a compare.
///
/// # Safety
///
/// As [`copy_out`]'s, and `n >= TAIL_MIN`.
#[cold]
#[inline(never)]
unsafe fn copy_long(src: *const u8, dst: *mut u8, n: usize) {
    if !SPARE.with(Cell::get) {
        // SAFETY: the caller's.
        unsafe { std::ptr::copy(src, dst, n) };
        return;
    }
    let head = n - TAIL_DOWN;
    // SAFETY: `head < n`: inside both ranges.
    unsafe { std::ptr::copy(src, dst, head) };
    let mut e = n;
    while e > head {
        e -= 64;
        // SAFETY: `head <= e` and `e + 64 <= n` (`TAIL_DOWN` is a multiple of 64): inside
        // both ranges. Unaligned reads and writes of plain bytes.
        unsafe {
            let line = std::ptr::read_unaligned(src.add(e).cast::<[u8; 64]>());
            std::ptr::write_unaligned(dst.add(e).cast::<[u8; 64]>(), line);
        }
    }
}

const _: () = assert!(TAIL_DOWN & 63 == 0 && TAIL_DOWN < TAIL_MIN);

/// Copies bytes from one chain's segments to another's: the one copy of a hop between two
/// peers' memories. Returns the number of bytes copied: `min(len, what both sides hold)`.
///
/// The two chains may be in the same peer's memory and may even overlap (a hostile peer can
/// arrange that), so this uses `ptr::copy` (memmove), never a non-overlapping copy.
#[inline]
pub fn copy_segs(src: &[Seg<'_>], src_off: u32, dst: &[Seg<'_>], dst_off: u32, len: u32) -> u32 {
    // Nearly every packet: all of it inside the first segment on both sides, one copy.
    if let (Some(s), Some(d)) = (src.first(), dst.first()) {
        if len <= s.len.saturating_sub(src_off) && len <= d.len.saturating_sub(dst_off) {
            // SAFETY: src_off + len <= s.len and dst_off + len <= d.len (checked just above,
            // without overflow); both segments lie in mapped regions. `ptr::copy` tolerates
            // overlap.
            unsafe {
                copy_out(
                    s.ptr.as_ptr().add(src_off as usize),
                    d.ptr.as_ptr().add(dst_off as usize),
                    len as usize,
                );
            }
            return len;
        }
    }
    copy_segs_walk(src, src_off, dst, dst_off, len)
}

/// [`copy_segs`] of a source that is two segments from `src_off` on (a chain's header and
/// frame, a frame re-cut around an inserted tag) into the destination's first segment: one
/// copy per source segment. None (nothing copied) for anything else.
#[inline]
fn copy_two(
    src: &[Seg<'_>],
    mut src_off: u32,
    dst: &[Seg<'_>],
    dst_off: u32,
    len: u32,
) -> Option<u32> {
    let d = dst.first()?;
    if len > d.len.saturating_sub(dst_off) {
        return None;
    }
    let mut i = 0;
    while src_off >= src.get(i)?.len {
        src_off -= src[i].len;
        i += 1;
    }
    let s0 = &src[i];
    let a = (s0.len - src_off).min(len);
    let b = len - a;
    let s1 = src.get(i + 1);
    if b > s1.map_or(0, |s| s.len) {
        return None;
    }
    // SAFETY: src_off + a <= s0.len, b <= s1.len and dst_off + a + b = dst_off + len <= d.len
    // (checked above without overflow: src_off < s0.len); all lie in mapped regions.
    // `ptr::copy` tolerates overlap.
    unsafe {
        let to = d.ptr.as_ptr().add(dst_off as usize);
        copy_out(s0.ptr.as_ptr().add(src_off as usize), to, a as usize);
        if let Some(s1) = s1.filter(|_| b > 0) {
            copy_out(s1.ptr.as_ptr(), to.add(a as usize), b as usize);
        }
    }
    Some(len)
}

/// [`copy_segs`] across segments: two source segments into one (the common case) by a copy
/// each, else both lists walked in step.
#[inline(never)]
fn copy_segs_walk(
    src: &[Seg<'_>],
    mut src_off: u32,
    dst: &[Seg<'_>],
    mut dst_off: u32,
    len: u32,
) -> u32 {
    if let Some(n) = copy_two(src, src_off, dst, dst_off, len) {
        return n;
    }
    let (mut si, mut di) = (0usize, 0usize);
    // Skip to the starting offsets.
    while si < src.len() && src_off >= src[si].len {
        src_off -= src[si].len;
        si += 1;
    }
    while di < dst.len() && dst_off >= dst[di].len {
        dst_off -= dst[di].len;
        di += 1;
    }
    let mut left = len;
    while left > 0 && si < src.len() && di < dst.len() {
        let (s, d) = (src[si], dst[di]);
        let n = left.min(s.len - src_off).min(d.len - dst_off);
        // SAFETY: src_off + n <= s.len and dst_off + n <= d.len; both segments lie in mapped
        // regions. `ptr::copy` tolerates overlap.
        unsafe {
            copy_out(
                s.ptr.as_ptr().add(src_off as usize),
                d.ptr.as_ptr().add(dst_off as usize),
                n as usize,
            );
        }
        left -= n;
        src_off += n;
        dst_off += n;
        if src_off == s.len {
            si += 1;
            src_off = 0;
        }
        if dst_off == d.len {
            di += 1;
            dst_off = 0;
        }
    }
    len - left
}

/// Reads from a chain at `off` into `dst`; returns the number of bytes read.
pub fn read_segs(segs: &[Seg<'_>], mut off: u32, dst: &mut [u8]) -> usize {
    let mut done = 0;
    for s in segs {
        if off >= s.len {
            off -= s.len;
            continue;
        }
        done += s.read(off, &mut dst[done..]);
        off = 0;
        if done == dst.len() {
            break;
        }
    }
    done
}

/// Writes `src` into a chain at `off`; returns the number of bytes written.
pub fn write_segs(segs: &[Seg<'_>], mut off: u32, src: &[u8]) -> usize {
    let mut done = 0;
    for s in segs {
        if off >= s.len {
            off -= s.len;
            continue;
        }
        done += s.write(off, &src[done..]);
        off = 0;
        if done == src.len() {
            break;
        }
    }
    done
}

/// The dirty log's marks by segment, here beside [`Seg`] so that `dirty` names nothing of the
/// crate's (it sits below `mem`: the memory table holds the log).
impl DirtyLog {
    /// Marks the first `len` bytes of `segs` (a receive chain the device filled).
    pub(crate) fn mark_segs(&self, segs: &[Seg<'_>], len: u32) {
        let mut left = len;
        for s in segs {
            if left == 0 {
                break;
            }
            let n = left.min(s.len());
            self.mark_host(s.as_ptr(), n as usize);
            left -= n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_segs, read_segs, Seg};

    /// Copies long enough to take their last lines downward ([`super::copy_out`]), through
    /// every path: one segment, two, the walk, and `read_segs`; nothing written past the end.
    #[test]
    fn long_copies_with_their_tail_taken_downward_match_a_plain_copy() {
        let bytes: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        for (len, spare) in [1023usize, 1024, 1025, 1087, 1500, 1514, 2048, 2999]
            .into_iter()
            .flat_map(|l| [(l, true), (l, false)])
        {
            super::spare_peers(spare);
            for cut in [None, Some(100usize), Some(len - 300)] {
                let mut src = bytes[..len].to_vec();
                let (a, b) = src.split_at_mut(cut.unwrap_or(len));
                let segs = [Seg::from_mut(a), Seg::from_mut(b)];
                let mut out = vec![0xeeu8; len + 8];
                let dst = [Seg::from_mut(&mut out[..len])];
                let n = u32::try_from(len).unwrap();
                assert_eq!(copy_segs(&segs, 0, &dst, 0, n), n);
                assert_eq!(&out[..len], &bytes[..len], "len {len} cut {cut:?}");
                assert!(
                    out[len..].iter().all(|&x| x == 0xee),
                    "written past the end"
                );
                let mut r = vec![0u8; len];
                assert_eq!(read_segs(&segs, 0, &mut r), len);
                assert_eq!(r, &bytes[..len], "read, len {len} cut {cut:?}");
            }
            // Three destination pieces: the walk.
            let mut src = bytes[..len].to_vec();
            let s = [Seg::from_mut(&mut src)];
            let mut out = vec![0u8; len];
            let (d0, rest) = out.split_at_mut(10);
            let (d1, d2) = rest.split_at_mut(len / 2);
            let dst = [Seg::from_mut(d0), Seg::from_mut(d1), Seg::from_mut(d2)];
            let n = u32::try_from(len).unwrap();
            assert_eq!(copy_segs(&s, 0, &dst, 0, n), n);
            assert_eq!(out, &bytes[..len], "walk, len {len}");
        }
    }

    /// Every split of a 40-byte source into segments, every source offset and length, into
    /// one destination buffer and into two: the bytes land as one plain copy puts them.
    #[test]
    fn copy_segs_matches_a_plain_copy_whatever_the_segments() {
        let bytes: Vec<u8> = (0..40u8).collect();
        for cut1 in 0..=40usize {
            for cut2 in cut1..=40usize {
                let mut a = bytes[..cut1].to_vec();
                let mut b = bytes[cut1..cut2].to_vec();
                let mut c = bytes[cut2..].to_vec();
                let src = [
                    Seg::from_mut(&mut a),
                    Seg::from_mut(&mut b),
                    Seg::from_mut(&mut c),
                ];
                for off in [0u32, 3, 12, 39] {
                    for len in [0u32, 1, 16, 40 - off]
                        .into_iter()
                        .filter(|l| off + l <= 40)
                    {
                        for dst_split in [None, Some(5usize)] {
                            let mut d = [0u8; 48];
                            let (d0, d1) = d.split_at_mut(dst_split.unwrap_or(48));
                            let segs = [Seg::from_mut(d0), Seg::from_mut(d1)];
                            let dst = if dst_split.is_some() {
                                &segs[..]
                            } else {
                                &segs[..1]
                            };
                            let n = copy_segs(&src, off, dst, 2, len);
                            assert_eq!(n, len, "cuts {cut1},{cut2} off {off} len {len}");
                            let want = &bytes[off as usize..(off + len) as usize];
                            assert_eq!(
                                &d[2..2 + len as usize],
                                want,
                                "cuts {cut1},{cut2} off {off} len {len} {dst_split:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
