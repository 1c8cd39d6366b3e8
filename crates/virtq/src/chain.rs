//! A parsed, validated descriptor chain, whatever ring format it came from, and the one
//! validation every format applies to each descriptor of a chain.

use crate::config::Direction;
use crate::error::{Error, Result};
use crate::mem::Seg;
use crate::xlate::{Miss, Perm, Translate, Window};
use std::ptr::NonNull;

/// One parsed, validated descriptor chain. Its segments are in the queue's scratch space
/// (read them with the queue's `readable` / `writable`) until the next batch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    /// The id to return in the used ring (split: the head descriptor index; packed: the
    /// buffer id of the chain's last descriptor).
    pub head: u16,
    /// Total device-readable bytes.
    pub readable: u32,
    /// Total device-writable bytes.
    pub writable: u32,
    /// First segment in the queue's scratch.
    pub(crate) start: u32,
    /// Readable segments (they come first).
    pub(crate) nread: u32,
    /// All segments.
    pub(crate) nsegs: u32,
}

impl Chain {
    /// A chain of one descriptor of `len` bytes, the device's to write if `write`, whose one
    /// segment is number `start` of the batch's scratch.
    #[inline(always)]
    pub(crate) fn single(head: u16, len: u32, write: bool, start: u32) -> Self {
        Self {
            head,
            readable: if write { 0 } else { len },
            writable: if write { len } else { 0 },
            start,
            nread: u32::from(!write),
            nsegs: 1,
        }
    }
}

/// The segments of a batch's chains, in a queue's scratch. Stored as `Seg<'static>` and lent
/// out only borrowed from the queue (`&'q [Seg<'q>]`, covariance shortens the lifetime), so no
/// segment outlives a translator swap.
#[derive(Debug)]
pub(crate) struct Segs(pub(crate) Vec<Seg<'static>>);

impl Segs {
    /// Room for `n` segments (the queue never grows it on the packet path).
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    /// All segments of a chain: readable ones first, then writable ones.
    #[inline]
    pub(crate) fn of(&self, c: &Chain) -> &[Seg<'_>] {
        let s = c.start as usize;
        self.0.get(s..s + c.nsegs as usize).unwrap_or(&[])
    }

    /// The device-readable segments of a chain.
    #[inline]
    pub(crate) fn readable(&self, c: &Chain) -> &[Seg<'_>] {
        let s = c.start as usize;
        self.0.get(s..s + c.nread as usize).unwrap_or(&[])
    }

    /// The device-writable segments of a chain.
    #[inline]
    pub(crate) fn writable(&self, c: &Chain) -> &[Seg<'_>] {
        let s = (c.start + c.nread) as usize;
        self.0.get(s..(c.start + c.nsegs) as usize).unwrap_or(&[])
    }
}

impl std::ops::Deref for Segs {
    type Target = Vec<Seg<'static>>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Segs {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// Whether an indirect table's entry is the device's to write, by its `VRING_DESC_F_WRITE`
/// flag; on a queue the device only reads the flag is ignored, and counted in `ignored`.
///
/// DPDK's virtio PMD (22.11 and later) fills every entry of its packed transmit tables with
/// `VRING_DESC_F_WRITE` once, at set-up (`vring_desc_init_indirect_packed`), then rewrites the
/// flags of the segment entries per packet but never the header entry's: each multi-segment
/// packet it sends on a packed ring carries a "device-writable" virtio-net header. DPDK's
/// own vhost library takes the direction from the queue and never looks. The flag cannot
/// change what the device does here, since it writes nothing into a queue it only reads, and
/// reading a buffer marked device-writable is a SHOULD NOT for the device (virtio 1.2 2.7.5.1),
/// not a MUST NOT: refusing it would stop a real peer's transmit queue on its first packet.
/// The entry is translated for reading, so an IOTLB grant must still allow the read.
/// Descriptors in the ring itself keep the strict check: every driver seen writes them right.
#[inline]
fn table_entry_writable(dir: Direction, flags_write: bool, ignored: &mut u64) -> bool {
    if flags_write && dir == Direction::DeviceReads {
        *ignored += 1;
        return false;
    }
    flags_write
}

/// What a chain parse carries from one descriptor to the next: built once per chain, its
/// translation state in registers for the whole walk.
#[derive(Debug)]
pub(crate) struct Walk<'a, M: Translate> {
    mem: &'a M,
    /// The queue's region hint, carried in by [`new`](Self::new); the caller stores it back.
    pub(crate) hint: usize,
    /// The last region hit for `perm`, the access the queue's direction makes (the device
    /// reads, or writes): a descriptor inside it costs two compares and an add (`Window`).
    win: Window<'a>,
    perm: Perm,
    segs: &'a mut Vec<Seg<'static>>,
    dir: Direction,
    /// Queue size (the bound reported when the segment scratch is full).
    size: u16,
    /// A device-writable descriptor was seen (readable ones may not follow).
    saw_write: bool,
    /// Indirect-table entries whose write flag was ignored ([`table_entry_writable`]).
    pub(crate) ignored: u64,
}

impl<'a, M: Translate> Walk<'a, M> {
    /// A walk of one chain of a `dir` queue of `size`, its segments appended to `segs`.
    #[inline(always)]
    pub(crate) fn new(
        mem: &'a M,
        hint: usize,
        segs: &'a mut Vec<Seg<'static>>,
        dir: Direction,
        size: u16,
    ) -> Self {
        let perm = if dir == Direction::DeviceWrites {
            Perm::Write
        } else {
            Perm::Read
        };
        Self {
            mem,
            hint,
            win: mem.window(hint, perm),
            perm,
            segs,
            dir,
            size,
            saw_write: false,
            ignored: 0,
        }
    }

    /// A contiguous range (an indirect table) for reading, through the translator.
    #[inline]
    pub(crate) fn table(&mut self, addr: u64, len: u32) -> Result<NonNull<u8>> {
        self.mem
            .translate_contig(addr, u64::from(len), Perm::Read, &mut self.hint)
    }

    /// Validates an indirect table's entry (fields of a local copy) as [`add`](Self::add),
    /// its write flag taken by [`table_entry_writable`].
    #[inline(always)]
    pub(crate) fn add_entry(
        &mut self,
        addr: u64,
        len: u32,
        flags_write: bool,
        c: &mut Chain,
    ) -> Result<()> {
        let write = table_entry_writable(self.dir, flags_write, &mut self.ignored);
        self.add(addr, len, write, c)
    }

    /// `at`'s host pointer and contiguous length for `perm`: the window first.
    #[inline(always)]
    fn translate(&mut self, at: u64, perm: Perm) -> Option<(NonNull<u8>, u64)> {
        if perm == self.perm {
            if let Some(t) = self.win.get(at) {
                return Some(t);
            }
        }
        self.translate_miss(at, perm)
    }

    /// Outside the window: the translator, and for the window's access the window of the
    /// region it found.
    #[cold]
    #[inline(never)]
    fn translate_miss(&mut self, at: u64, perm: Perm) -> Option<(NonNull<u8>, u64)> {
        let t = self.mem.translate(at, perm, &mut self.hint).ok()?;
        if perm == self.perm {
            self.win = self.mem.window(self.hint, perm);
        }
        Some(t)
    }

    /// Validates one descriptor (fields of a local copy: address, length, whether the device
    /// writes it) against the queue's direction and the chain's order, adds its length with
    /// overflow checks, and appends its translated segments (a descriptor may span regions).
    #[inline(always)]
    pub(crate) fn add(&mut self, addr: u64, len: u32, write: bool, c: &mut Chain) -> Result<()> {
        match (self.dir, write) {
            (Direction::DeviceReads, true) => {
                return Err(Error::DirectionMismatch {
                    found: "writable",
                    queue: "device-reads",
                })
            }
            (Direction::DeviceWrites, false) => {
                return Err(Error::DirectionMismatch {
                    found: "readable",
                    queue: "device-writes",
                })
            }
            (Direction::Mixed, false) if self.saw_write => {
                return Err(Error::ReadableAfterWritable)
            }
            _ => {}
        }
        if write {
            self.saw_write = true;
            c.writable = c.writable.checked_add(len).ok_or(Error::LenOverflow)?;
        } else {
            c.readable = c.readable.checked_add(len).ok_or(Error::LenOverflow)?;
        }
        c.readable
            .checked_add(c.writable)
            .ok_or(Error::LenOverflow)?;
        let perm = if write { Perm::Write } else { Perm::Read };
        let (mut at, mut left) = (addr, len);
        while left > 0 {
            // The miss names the first byte not translated (under an IOTLB, what to ask for:
            // a buffer may cross into a page not granted yet).
            let Some((p, contig)) = self.translate(at, perm) else {
                return Err(self.mem.miss_error(Miss {
                    addr: at,
                    len: u64::from(left),
                    perm,
                }));
            };
            let n = u32::try_from(contig.min(u64::from(left))).unwrap_or(left);
            if self.segs.len() == self.segs.capacity() {
                return Err(Error::ChainTooLong {
                    max: u32::from(self.size),
                });
            }
            self.segs.push(Seg::new(p, n));
            c.nsegs += 1;
            if !write {
                c.nread += 1;
            }
            left -= n;
            // Cannot overflow: the translation found at..at+n inside one region.
            at += u64::from(n);
        }
        Ok(())
    }
}
