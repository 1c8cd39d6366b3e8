//! The packed virtqueue format (virtio 1.1+, section 2.8), both roles.
//!
//! ```text
//! ring         : [PackedDesc; size]  addr u64 | len u32 | id u16 | flags u16   16-byte aligned
//! driver area  : off_wrap u16 | flags u16  (the driver's event suppression)      4-byte aligned
//! device area  : off_wrap u16 | flags u16  (the device's event suppression)      4-byte aligned
//! ```
//!
//! One ring carries both directions: the driver makes a descriptor available by writing it
//! with `AVAIL` = its wrap counter and `USED` = the opposite; the device returns a buffer by
//! writing one used descriptor (`AVAIL` = `USED` = its wrap counter, the buffer id, the bytes
//! written) in the next used slot and skipping as many slots as the chain had descriptors
//! (2.8.6). Each side's wrap counter flips when its index wraps. vhost-user passes the driver
//! area as the "avail" address and the device area as the "used" address, and carries the
//! avail wrap counter in bit 15 of `SET_VRING_BASE` / `GET_VRING_BASE`.
//!
//! The same discipline as the split ring: a descriptor is read once (its flags with acquire
//! first, then the rest) into a local copy and validated (buffer ids, lengths, chains bounded
//! by the ring, indirect rules, directions, addresses); used descriptors of a batch are written
//! with the first one's flags last (one release store makes the batch visible); notification
//! arming is arm, fence, re-check. pvnet's device completes chains in the order it popped them.

use crate::chain::{Chain, Segs, Walk};
use crate::error::{Error, Result};
use crate::event::{need_event, Armed};
use crate::mem::{AddrSpace, MemTable, Seg};
use crate::queue::{Direction, QueueConfig, RingAddrs};
use crate::ring::{store_load_fence, IdFifo, Layout, Mapped, RunXlate};
use crate::xlate::{Perm, Translate};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

/// This descriptor continues in the next slot.
pub const DESC_F_NEXT: u16 = 1;
/// The device writes this buffer.
pub const DESC_F_WRITE: u16 = 2;
/// The buffer holds a table of descriptors (used in order, no `NEXT`).
pub const DESC_F_INDIRECT: u16 = 4;
/// Available: equals the driver's wrap counter when the descriptor is made available.
pub const DESC_F_AVAIL: u16 = 1 << 7;
/// Used: equals the device's wrap counter when the descriptor is used.
pub const DESC_F_USED: u16 = 1 << 15;
/// Event suppression: notify.
pub const EVENT_ENABLE: u16 = 0;
/// Event suppression: do not notify.
pub const EVENT_DISABLE: u16 = 1;
/// Event suppression: notify when the ring passes `off_wrap` (needs `VIRTIO_F_EVENT_IDX`).
pub const EVENT_DESC: u16 = 2;

/// A packed-ring descriptor, exactly as in shared memory (little-endian hosts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackedDesc {
    /// Buffer address.
    pub addr: u64,
    /// Buffer length (device to driver: bytes written).
    pub len: u32,
    /// Buffer id.
    pub id: u16,
    /// `DESC_F_*`.
    pub flags: u16,
}

/// Bytes of each part for `size` entries: ring, driver area, device area.
#[must_use]
pub fn ring_sizes(size: u16) -> (u64, u64, u64) {
    (16 * u64::from(size), 4, 4)
}

/// `AVAIL`/`USED` bits of a descriptor the driver makes available with `wrap`.
#[inline]
fn avail_bits(wrap: bool) -> u16 {
    if wrap {
        DESC_F_AVAIL
    } else {
        DESC_F_USED
    }
}

/// `AVAIL`/`USED` bits of a descriptor the device marks used with `wrap`.
#[inline]
fn used_bits(wrap: bool) -> u16 {
    if wrap {
        DESC_F_AVAIL | DESC_F_USED
    } else {
        0
    }
}

/// Whether `flags` say available for a side whose avail wrap counter is `wrap`.
#[inline]
fn is_avail(flags: u16, wrap: bool) -> bool {
    flags & (DESC_F_AVAIL | DESC_F_USED) == avail_bits(wrap)
}

/// Whether `flags` say used for a side whose used wrap counter is `wrap`.
#[inline]
fn is_used(flags: u16, wrap: bool) -> bool {
    flags & (DESC_F_AVAIL | DESC_F_USED) == used_bits(wrap)
}

/// Validated pointers to the three parts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ring {
    desc: NonNull<PackedDesc>,
    driver: NonNull<u8>,
    device: NonNull<u8>,
    size: u16,
}

// SAFETY: as for the split ring: the pointers point into a mapping kept alive by the `Arc`
// translator stored next to the ring (in `Mapped`); one thread drives a queue.
unsafe impl Send for Ring {}

impl Layout for Ring {
    fn new<M: Translate>(mem: &M, space: AddrSpace, a: RingAddrs, size: u16) -> Result<Self> {
        // Any size up to 2^15 is allowed by 2.8; pvnet takes powers of two, as for split.
        if size == 0 || !size.is_power_of_two() || size > crate::split::MAX_QUEUE_SIZE {
            return Err(Error::BadQueueSize(u32::from(size)));
        }
        for (part, addr, align) in [
            ("desc", a.desc, 16),
            ("driver", a.avail, 4),
            ("device", a.used, 4),
        ] {
            if !addr.is_multiple_of(align) {
                return Err(Error::RingMisaligned { part, addr });
            }
        }
        let (rl, dl, vl) = ring_sizes(size);
        // The ring is read and written (used descriptors); the driver area only read, the
        // device area written.
        let part = |addr, len, perm| {
            mem.translate_range(space, addr, len, perm)
                .map_err(|m| mem.miss_error(m))
        };
        let desc = part(a.desc, rl, Perm::ReadWrite)?.cast::<PackedDesc>();
        let driver = part(a.avail, dl, Perm::Read)?;
        let device = part(a.used, vl, Perm::ReadWrite)?;
        let misaligned = |p: *const u8, a: usize| !(p as usize).is_multiple_of(a);
        if misaligned(desc.as_ptr().cast(), 16)
            || misaligned(driver.as_ptr(), 4)
            || misaligned(device.as_ptr(), 4)
        {
            return Err(Error::RingMisaligned {
                part: "host",
                addr: a.desc,
            });
        }
        Ok(Self {
            desc,
            driver,
            device,
            size,
        })
    }

    fn size(&self) -> u16 {
        self.size
    }
    fn device_part(&self) -> (NonNull<u8>, usize) {
        (self.desc.cast(), 16 * usize::from(self.size))
    }
}

impl Ring {
    /// The flags of slot `i`, as an atomic (the one field whose store publishes a descriptor).
    #[inline]
    fn flags(&self, i: u16) -> &AtomicU16 {
        debug_assert!(i < self.size);
        // SAFETY: i < size (callers keep indexes in range); the flags field sits at offset 14
        // of a 16-byte aligned descriptor inside the validated ring, so it is 2-byte aligned.
        // Both sides access it atomically only; the reference lives as long as `&self`, and
        // the mapping outlives the ring (see `Mapped`).
        unsafe { AtomicU16::from_ptr(self.desc.as_ptr().add(usize::from(i)).cast::<u16>().add(7)) }
    }

    /// Walks up to `n` slots from `i` (all before the ring's end) while their AVAIL/USED bits
    /// are `want`: returns how many were, and how many of those end a chain (no `NEXT`).
    #[inline]
    fn walk_avail(&self, i: u16, n: u16, want: u16) -> (u16, u16) {
        debug_assert!(u32::from(i) + u32::from(n) <= u32::from(self.size));
        let (mut k, mut ends) = (0u16, 0u16);
        while k < n {
            // Acquire: the descriptor's other fields, written before its flags, are visible
            // to the reads that follow (pairs with the driver's release store of the flags).
            let f = self.flags(i + k).load(Ordering::Acquire);
            if f & (DESC_F_AVAIL | DESC_F_USED) != want {
                break;
            }
            ends += u16::from(f & DESC_F_NEXT == 0);
            k += 1;
        }
        (k, ends)
    }

    /// Reads descriptor `i` once into a local copy (its flags re-read as part of the copy:
    /// validation uses the copy only).
    #[inline]
    fn desc(&self, i: u16) -> PackedDesc {
        debug_assert!(i < self.size);
        // SAFETY: i < size; the ring is validated for size*16 bytes, 16-byte aligned.
        unsafe { self.desc.as_ptr().add(usize::from(i)).read_volatile() }
    }

    /// Writes a descriptor's address, length and id (not its flags).
    #[inline]
    fn set_body(&self, i: u16, addr: u64, len: u32, id: u16) {
        debug_assert!(i < self.size);
        // SAFETY: i < size; the 12 bytes written are inside the validated descriptor; the
        // writer owns the slot (the driver before making it available, the device after it
        // took the chain and before marking it used).
        unsafe {
            let d = self.desc.as_ptr().add(usize::from(i));
            (&raw mut (*d).addr).write_volatile(addr);
            (&raw mut (*d).len).write_volatile(len);
            (&raw mut (*d).id).write_volatile(id);
        }
    }

    /// Writes a whole descriptor in one store (the driver, for a slot the device will look at
    /// only after an earlier slot's flags are released).
    #[inline]
    fn set_desc(&self, i: u16, d: PackedDesc) {
        debug_assert!(i < self.size);
        // SAFETY: i < size; the ring is validated for size*16 bytes, 16-byte aligned; the
        // driver owns the slot until the batch's first flags are released.
        unsafe { self.desc.as_ptr().add(usize::from(i)).write_volatile(d) }
    }

    /// Writes a used descriptor's length and id (its flags are stored separately, last).
    #[inline]
    fn set_used(&self, i: u16, len: u32, id: u16) {
        debug_assert!(i < self.size);
        // SAFETY: i < size; the 6 bytes are inside the validated descriptor, which the device
        // owns between taking the chain and marking it used.
        unsafe {
            let d = self.desc.as_ptr().add(usize::from(i));
            (&raw mut (*d).len).write_volatile(len);
            (&raw mut (*d).id).write_volatile(id);
        }
    }

    /// An event suppression field: `part` is the driver or device area, `off` 0 (off_wrap)
    /// or 2 (flags).
    #[inline]
    fn event(&self, part: NonNull<u8>, off: usize) -> &AtomicU16 {
        // SAFETY: both areas are validated for 4 bytes, 4-byte aligned; off is 0 or 2.
        unsafe { AtomicU16::from_ptr(part.as_ptr().add(off).cast::<u16>()) }
    }
}

/// The next slot after `i`, flipping `wrap` when the ring wraps.
#[inline]
fn advance(i: u16, wrap: &mut bool, by: u16, size: u16) -> u16 {
    let n = u32::from(i) + u32::from(by);
    if n >= u32::from(size) {
        *wrap = !*wrap;
        u16::try_from(n - u32::from(size)).unwrap_or(0)
    } else {
        u16::try_from(n).unwrap_or(0)
    }
}

/// The slot `by` before `i`, flipping `wrap` back when it crosses the start.
#[inline]
fn retreat(i: u16, wrap: &mut bool, by: u16, size: u16) -> u16 {
    if by > i {
        *wrap = !*wrap;
        size - (by - i)
    } else {
        i - by
    }
}

/// `vring_need_event` for a packed ring: the peer asked for a notification at `off_wrap`;
/// entries `old..new` (slot indexes, wrap counter `wrap` at `new`) went out since the last
/// decision.
#[inline]
fn need_event_packed(off_wrap: u16, new: u16, old: u16, wrap: bool, size: u16) -> bool {
    let mut off = off_wrap & 0x7fff;
    if (off_wrap >> 15 != 0) != wrap {
        off = off.wrapping_sub(size);
    }
    need_event(off, new, old)
}

/// The window `available()` walks, in descriptors, widened a window at a time until it holds
/// as many whole chains (a batch's worth) or the ring ends.
pub const SCAN: u16 = 64;

/// The device side of one packed virtqueue.
#[derive(Debug)]
pub struct DeviceQueue<M: Translate = MemTable> {
    m: Mapped<M, Ring>,
    size: u16,
    dir: Direction,
    event_idx: bool,
    indirect: bool,
    /// Return a batch with one used descriptor (IN_ORDER, on a queue the device only reads:
    /// every length is 0, so one id says it all; 2.8.23).
    batch_used: bool,
    /// Next slot to consume, and the wrap counter there.
    last_avail: u16,
    avail_wrap: bool,
    /// Chains `available()` saw and not yet popped.
    pending: u16,
    /// The first slot (and its wrap counter) the last walk did not find available, and the
    /// chains that walk counted: the next walk starts there, counting those the batch since
    /// did not take. What a driver made available stays so until the device uses it, so
    /// each slot is walked once, however many batches it waits.
    frontier: (u16, bool),
    seen_chains: u16,
    /// Next used slot, and the wrap counter there.
    used_idx: u16,
    used_wrap: bool,
    /// Used entries (id, len, descriptors) pushed since the last publish, in order.
    shadow: Vec<(u16, u32, u16)>,
    /// Descriptors of each buffer id in flight (to skip them when it is used).
    ndesc: Box<[u16]>,
    /// Descriptors of each chain popped in the current batch, in order (for `unpop`).
    popped: Vec<u16>,
    /// Used slot and wrap at the last call decision.
    signalled: (u16, bool),
    signalled_valid: bool,
    notify_on: bool,
    hint: usize,
    /// Segments of the current batch.
    segs: Segs,
    /// Indirect-table entries whose write flag was ignored on a queue the device only reads
    /// ([`table_entry_writable`]), since the last [`take_write_ignored`](Self::take_write_ignored).
    write_ignored: u64,
}

impl<M: Translate> DeviceQueue<M> {
    /// Starts the device side: the ring validated and translated once; `cfg.base` is the next
    /// slot in bits 0-14 and the avail wrap counter in bit 15 (vhost-user's encoding); every
    /// buffer before it has been returned.
    pub fn new(mem: Arc<M>, cfg: &QueueConfig) -> Result<Self> {
        let m = Mapped::new(mem, cfg)?;
        let idx = cfg.base & 0x7fff;
        if idx >= cfg.size {
            return Err(Error::DescIndexOutOfRange {
                index: idx,
                size: cfg.size,
            });
        }
        let wrap = cfg.base & 0x8000 != 0;
        Ok(Self {
            m,
            size: cfg.size,
            dir: cfg.direction,
            event_idx: cfg.event_idx,
            indirect: cfg.indirect,
            batch_used: cfg.in_order && cfg.direction == Direction::DeviceReads,
            last_avail: idx,
            avail_wrap: wrap,
            pending: 0,
            frontier: (idx, wrap),
            seen_chains: 0,
            used_idx: idx,
            used_wrap: wrap,
            shadow: Vec::with_capacity(usize::from(cfg.size)),
            ndesc: vec![0; usize::from(cfg.size)].into_boxed_slice(),
            popped: Vec::with_capacity(usize::from(cfg.size)),
            signalled: (idx, wrap),
            signalled_valid: false,
            notify_on: true,
            hint: 0,
            segs: Segs::with_capacity(4 * usize::from(cfg.size)),
            write_ignored: 0,
        })
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Next slot to consume with the wrap counter in bit 15 (what `GET_VRING_BASE` returns).
    pub fn last_avail(&self) -> u16 {
        self.last_avail | (u16::from(self.avail_wrap) << 15)
    }

    /// The translator.
    pub fn mem(&self) -> &Arc<M> {
        &self.m.mem
    }

    /// Switches to a new translator, re-translating the ring.
    pub fn set_mem(&mut self, mem: Arc<M>) -> Result<()> {
        self.segs.clear();
        self.forget_walk();
        self.m.remap(mem)
    }

    /// The next walk starts again at the next slot.
    fn forget_walk(&mut self) {
        self.frontier = (self.last_avail, self.avail_wrap);
        self.seen_chains = 0;
        self.popped.clear();
    }

    /// Slots from the next one to the last walk's frontier (`None`: behind it, which only a
    /// rewound position can make).
    fn ahead(&self) -> Option<u16> {
        let (f, fw) = self.frontier;
        match (fw == self.avail_wrap, f >= self.last_avail) {
            (true, true) => Some(f - self.last_avail),
            (false, false) => Some(f + self.size - self.last_avail),
            (false, true) if f == self.last_avail => Some(self.size),
            _ => None,
        }
    }

    /// Starts a batch: walks the flags from the next slot (one acquire load each) and returns
    /// how many whole chains are available within the next [`SCAN`] descriptors (a packed
    /// ring has no index to read: the walk touches the lines the parse reads next, and is
    /// bounded so that a full ring does not cost a walk of all of it per batch).
    #[inline]
    pub fn available(&mut self) -> Result<u16> {
        // Chains the last walk counted that the batch since did not take (`popped` holds the
        // chains taken, those given back already removed).
        let taken = u16::try_from(self.popped.len()).unwrap_or(u16::MAX);
        self.segs.clear();
        self.popped.clear();
        self.m.refresh()?;
        let ahead = self.ahead().unwrap_or_else(|| {
            self.forget_walk();
            0
        });
        // A chain whose tail is not available yet is not counted (a driver makes the head
        // available last; one that does not is caught when the chain is parsed). A chain
        // longer than the window is still counted once it is whole: the window widens.
        let size = self.size;
        // The last walk's chains still ahead, at most one per slot still ahead: a driver that
        // rewrote a counted chain longer before it was taken left fewer slots than chains
        // (pop validates each chain anyway; the count must not exceed the ring).
        let left = self.seen_chains.saturating_sub(taken).min(ahead);
        let (mut chains, mut descs) = (left, ahead);
        let mut wrap = self.avail_wrap;
        let mut i = advance(self.last_avail, &mut wrap, descs, size);
        let mut want = avail_bits(wrap);
        let mut limit = size.min(SCAN).max(descs);
        loop {
            if descs == limit {
                // A window's worth of chains, or the whole ring, is enough. Chains of several
                // descriptors (a driver without indirect tables) widen it a window at a time:
                // a batch of them is as many packets as a batch of single ones.
                if chains >= SCAN || limit == size {
                    break;
                }
                limit = size.min(limit + SCAN);
            }
            // To the ring's end or the limit, with one pattern of AVAIL/USED bits (it flips
            // where the ring wraps): one load, one compare and one count per slot.
            let run = (size - i).min(limit - descs);
            let (n, c) = self.m.ring.walk_avail(i, run, want);
            descs += n;
            chains += c;
            i += n;
            if i == size {
                i = 0;
                want ^= DESC_F_AVAIL | DESC_F_USED;
            }
            if n < run {
                break;
            }
        }
        self.frontier = (i, want == avail_bits(true));
        self.seen_chains = chains;
        self.pending = chains;
        Ok(chains)
    }

    /// Chains left in the current batch.
    #[inline]
    pub fn pending(&self) -> u16 {
        self.pending
    }

    /// Parses the next chain of the batch (`None`: the batch is done).
    #[inline]
    pub fn pop(&mut self) -> Result<Option<Chain>> {
        if self.pending == 0 {
            return Ok(None);
        }
        let mut one = None;
        if self.pop_singles(1, |c, _| one = Some(c)) == 1 {
            return Ok(one);
        }
        self.pop_slow()
    }

    /// [`pop`](Self::pop) for a chain the fast path did not take: the general walk, its
    /// errors and the scratch-full rollback.
    #[cold]
    fn pop_slow(&mut self) -> Result<Option<Chain>> {
        let start = self.segs.len();
        match self.parse() {
            Ok(mut c) => {
                c.start = u32::try_from(start).unwrap_or(u32::MAX);
                self.pending -= 1;
                Ok(Some(c))
            }
            Err(Error::ChainTooLong { .. })
                if start > 0 && self.segs.len() == self.segs.capacity() =>
            {
                // Scratch full mid-batch: the chain is parsed again next batch.
                self.segs.truncate(start);
                self.pending = 0;
                Ok(None)
            }
            Err(e) => {
                self.segs.truncate(start);
                if e.is_retryable() {
                    self.pending = 0;
                }
                Err(e)
            }
        }
    }

    /// Pops up to `max` chains into `out`, calling `each` with each chain's segments.
    /// Runs of single-descriptor chains (almost every network buffer) take
    /// `pop_singles`; anything else, errors included, the general walk.
    /// Out of line: a batch pays one call, and the split ring's callers keep their inlining.
    #[inline(never)]
    pub fn pop_batch(
        &mut self,
        out: &mut Vec<Chain>,
        max: usize,
        mut each: impl FnMut(&[Seg<'_>]),
    ) -> Result<usize> {
        let mut n = 0;
        while n < max && self.pending > 0 {
            n += self.pop_singles(max - n, |c, seg| {
                each(std::slice::from_ref(seg));
                out.push(c);
            });
            if n == max || self.pending == 0 {
                break;
            }
            // What the run stopped at (the next run starts at the ring's start by itself): a
            // chain of several descriptors, one that fails a check (the general walk reports
            // it), or the batch's segment scratch full.
            let Some(c) = self.pop_slow()? else { break };
            each(self.segs(&c));
            out.push(c);
            n += 1;
        }
        Ok(n)
    }

    /// The fast path: the run of single-descriptor chains from the next slot, up to `max`
    /// and the ring's end, in one loop, each handed to `take` with its one segment. Each
    /// descriptor is read once and passes the general walk's checks without its loop: its
    /// flags against the one pattern a plain buffer of this queue's direction has (available,
    /// no `NEXT`, no `INDIRECT`), a length, an id inside the ring, its bytes inside one
    /// region. The slot and batch bookkeeping is done once for the run. Stops at the first
    /// descriptor that is anything else, which is left for the general walk (and its errors).
    #[inline(always)]
    fn pop_singles(&mut self, max: usize, take: impl FnMut(Chain, &Seg<'_>)) -> usize {
        if self.dir == Direction::DeviceWrites {
            self.pop_singles_in::<true>(max, take)
        } else {
            self.pop_singles_in::<false>(max, take)
        }
    }

    /// [`pop_singles`](Self::pop_singles) for one direction (`WRITE`: the device writes the
    /// buffers), so that the flag pattern, the permission and the chain's shape are
    /// constants. What the loop reads of the queue (the ring, the memory table, the region
    /// hint, the id table, the scratch) is taken once into locals: the stores it makes per
    /// descriptor would otherwise make the compiler load each again.
    #[inline(always)]
    fn pop_singles_in<const WRITE: bool>(
        &mut self,
        max: usize,
        mut take: impl FnMut(Chain, &Seg<'_>),
    ) -> usize {
        const MASK: u16 = DESC_F_AVAIL | DESC_F_USED | DESC_F_WRITE | DESC_F_NEXT | DESC_F_INDIRECT;
        let want = avail_bits(self.avail_wrap) | if WRITE { DESC_F_WRITE } else { 0 };
        let (first, size) = (self.last_avail, self.size);
        let (ring, mem) = (self.m.ring, &*self.m.mem);
        let perm = if WRITE { Perm::Write } else { Perm::Read };
        let (ndesc, segs) = (&mut self.ndesc[..], &mut self.segs.0);
        let mut xlate = RunXlate::new(mem, perm, self.hint);
        let base = segs.len();
        // The scratch never grows on this path: the run is bounded by its room, and each
        // segment is written into that room, the length set once at the end.
        let spare = segs.spare_capacity_mut();
        let run = usize::from(self.pending.min(size - first))
            .min(max)
            .min(spare.len());
        let Ok(start) = u32::try_from(base) else {
            return 0;
        };
        let mut k = 0usize;
        while k < run {
            let at = first + u16::try_from(k).unwrap_or(0);
            let d = ring.desc(at);
            if d.flags & MASK != want || d.len == 0 || d.id >= size {
                break;
            }
            // The flags matched this queue's direction, so the permission is the direction's.
            let Some(p) = xlate.buffer(d.addr, d.len) else {
                break;
            };
            let Some(n) = ndesc.get_mut(usize::from(d.id)) else {
                break;
            };
            *n = 1;
            let seg = Seg::new(p, d.len);
            let at = start + u32::try_from(k).unwrap_or(0);
            take(Chain::single(d.id, d.len, WRITE, at), &seg);
            spare[k].write(seg);
            k += 1;
        }
        self.hint = xlate.hint;
        // SAFETY: the `k` slots after the old length were written in the loop above (each
        // `spare[i]`, i < k, once), and k <= run <= the spare capacity.
        unsafe { segs.set_len(base + k) };
        let k = u16::try_from(k).unwrap_or(0);
        if k > 0 {
            self.popped.extend(std::iter::repeat_n(1, usize::from(k)));
            self.pending -= k;
            self.last_avail = advance(first, &mut self.avail_wrap, k, self.size);
        }
        usize::from(k)
    }

    /// Takes back the last `n` chains popped, unconsumed.
    pub fn unpop(&mut self, n: u16) {
        let n = usize::from(n).min(self.popped.len());
        let back: u32 = self
            .popped
            .drain(self.popped.len() - n..)
            .map(u32::from)
            .sum();
        let back = u16::try_from(back).unwrap_or(0);
        self.last_avail = retreat(self.last_avail, &mut self.avail_wrap, back, self.size);
        self.pending = 0;
    }

    /// All segments of a chain.
    #[inline]
    pub fn segs(&self, c: &Chain) -> &[Seg<'_>] {
        self.segs.of(c)
    }

    /// The device-readable segments of a chain.
    #[inline]
    pub fn readable(&self, c: &Chain) -> &[Seg<'_>] {
        self.segs.readable(c)
    }

    /// The device-writable segments of a chain.
    #[inline]
    pub fn writable(&self, c: &Chain) -> &[Seg<'_>] {
        self.segs.writable(c)
    }

    /// Walks one chain from `last_avail`: each descriptor read once, checked available with
    /// the wrap counter of its slot, validated and translated; the buffer id is the last
    /// descriptor's (2.8.6). Consumes the chain's slots only if it is whole and valid. One
    /// [`Walk`] carries the chain's translation state from descriptor to descriptor.
    fn parse(&mut self) -> Result<Chain> {
        let mut c = Chain {
            head: 0,
            readable: 0,
            writable: 0,
            start: 0,
            nread: 0,
            nsegs: 0,
        };
        let (ring, size) = (self.m.ring, self.size);
        let mut w = Walk::new(&*self.m.mem, self.hint, &mut self.segs.0, self.dir, size);
        let (mut i, mut wrap) = (self.last_avail, self.avail_wrap);
        let mut count = 0u16;
        loop {
            let d = ring.desc(i);
            if !is_avail(d.flags, wrap) {
                return Err(Error::DescNotAvailable { index: i });
            }
            count += 1;
            if count > size {
                return Err(Error::ChainTooLong {
                    max: u32::from(size),
                });
            }
            c.head = d.id;
            i = advance(i, &mut wrap, 1, size);
            if d.flags & DESC_F_INDIRECT != 0 {
                if !self.indirect {
                    return Err(Error::IndirectNotNegotiated);
                }
                if d.flags & DESC_F_NEXT != 0 {
                    return Err(Error::IndirectNested);
                }
                parse_indirect(&mut w, &d, &mut c, size)?;
                break;
            }
            w.add(d.addr, d.len, d.flags & DESC_F_WRITE != 0, &mut c)?;
            if d.flags & DESC_F_NEXT == 0 {
                break;
            }
        }
        if c.head >= size {
            return Err(Error::DescIndexOutOfRange {
                index: c.head,
                size,
            });
        }
        let (hint, ignored) = (w.hint, w.ignored);
        self.hint = hint;
        self.write_ignored += ignored;
        self.ndesc[usize::from(c.head)] = count;
        self.popped.push(count);
        self.last_avail = i;
        self.avail_wrap = wrap;
        Ok(c)
    }

    /// Records a used entry for buffer `id` (popped in this queue); nothing reaches the ring
    /// until [`publish`](Self::publish).
    #[inline]
    pub fn push_used(&mut self, id: u16, len: u32) {
        let n = self.ndesc.get(usize::from(id)).copied().unwrap_or(1).max(1);
        self.shadow.push((id, len, n));
    }

    /// Used entries pushed and not yet published.
    #[inline]
    pub fn unpublished(&self) -> u16 {
        u16::try_from(self.shadow.len()).unwrap_or(u16::MAX)
    }

    /// Writes the batch's used descriptors, the first one's flags last (one release store
    /// makes the batch visible), then takes the batch's one call decision.
    #[inline]
    pub fn publish(&mut self) -> bool {
        if self.shadow.is_empty() {
            return false;
        }
        let (first, first_flags) = (self.used_idx, used_bits(self.used_wrap));
        if self.batch_used && self.shadow.iter().all(|e| e.1 == 0) {
            // IN_ORDER: one used descriptor for the batch, carrying the last buffer's id, in
            // the batch's first slot; the driver frees every buffer up to that id and skips
            // the batch's descriptors.
            let last = self.shadow[self.shadow.len() - 1].0;
            self.m.ring.set_used(first, 0, last);
            let total: u32 = self.shadow.iter().map(|e| u32::from(e.2)).sum();
            self.shadow.clear();
            let mut rest = total;
            while rest > 0 {
                let step = u16::try_from(rest.min(u32::from(self.size))).unwrap_or(self.size);
                self.used_idx = advance(self.used_idx, &mut self.used_wrap, step, self.size);
                rest -= u32::from(step);
            }
            // Release: as below, for the one descriptor.
            self.m
                .ring
                .flags(first)
                .store(first_flags, Ordering::Release);
            if self.m.logging {
                self.m.log_ring();
            }
            store_load_fence();
            return self.need_call();
        }
        for (k, &(id, len, n)) in self.shadow.iter().enumerate() {
            self.m.ring.set_used(self.used_idx, len, id);
            if k > 0 {
                // Relaxed: the driver looks at these only after the first one's flags, whose
                // release store below orders them.
                self.m
                    .ring
                    .flags(self.used_idx)
                    .store(used_bits(self.used_wrap), Ordering::Relaxed);
            }
            self.used_idx = advance(self.used_idx, &mut self.used_wrap, n, self.size);
        }
        self.shadow.clear();
        // Release: every used descriptor of the batch and the data written into the buffers
        // are visible before the first one is marked used (pairs with the driver's acquire
        // load of that descriptor's flags).
        self.m
            .ring
            .flags(first)
            .store(first_flags, Ordering::Release);
        if self.m.logging {
            self.m.log_ring();
        }
        // StoreLoad: the used descriptors are visible before we read the driver's event
        // suppression (pairs with the fence in the driver's arm).
        store_load_fence();
        self.need_call()
    }

    /// Indirect-table entries whose write flag was ignored, this queue being one the device
    /// only reads, since the last call (DPDK's packed transmit tables: [`table_entry_writable`]).
    #[inline]
    pub fn take_write_ignored(&mut self) -> u64 {
        std::mem::take(&mut self.write_ignored)
    }

    /// Whether a dirty log is on (see the split ring's).
    #[inline(always)]
    pub fn logging(&self) -> bool {
        self.m.logging
    }

    /// The batch's call decision, as DPDK's vhost and Linux decide it (2.8.10).
    fn need_call(&mut self) -> bool {
        let flags = self
            .m
            .ring
            .event(self.m.ring.driver, 2)
            .load(Ordering::Relaxed);
        let prev = std::mem::replace(&mut self.signalled, (self.used_idx, self.used_wrap));
        let valid = std::mem::replace(&mut self.signalled_valid, true);
        if flags != EVENT_DESC || !self.event_idx {
            // Enabled or disabled as a whole: exactly what the driver asked, the first time
            // too (a driver that polls gets no call).
            return flags != EVENT_DISABLE;
        }
        if !valid {
            // The first decision with a descriptor event: nothing to measure it against.
            return true;
        }
        let off_wrap = self
            .m
            .ring
            .event(self.m.ring.driver, 0)
            .load(Ordering::Relaxed);
        let (new, mut old) = (self.used_idx, prev.0);
        if new <= old {
            old = old.wrapping_sub(self.size);
        }
        need_event_packed(off_wrap, new, old, self.used_wrap, self.size)
    }

    /// Not known for a packed ring: callers must assume the driver may be waiting.
    #[inline]
    pub fn driver_backlog(&self) -> Option<u16> {
        None
    }

    /// Stops asking for kicks (we are polling).
    #[inline]
    pub fn disable_notify(&mut self) {
        if !self.notify_on {
            return;
        }
        self.notify_on = false;
        // Relaxed: a hint; being late only costs a spurious kick.
        self.m
            .ring
            .event(self.m.ring.device, 2)
            .store(EVENT_DISABLE, Ordering::Relaxed);
        if self.m.logging {
            self.m.log_bytes(self.m.ring.device, 4);
        }
    }

    /// Arm, fence, re-check: asks for a kick at the next slot, then looks at it again.
    #[inline]
    pub fn arm_notify(&mut self) -> Result<Armed> {
        self.notify_on = true;
        let dev = self.m.ring.device;
        if self.event_idx {
            let off = self.last_avail | (u16::from(self.avail_wrap) << 15);
            self.m.ring.event(dev, 0).store(off, Ordering::Relaxed);
            self.m
                .ring
                .event(dev, 2)
                .store(EVENT_DESC, Ordering::Relaxed);
        } else {
            self.m
                .ring
                .event(dev, 2)
                .store(EVENT_ENABLE, Ordering::Relaxed);
        }
        // Live migration: the device's event suppression area is the device's write too.
        if self.m.logging {
            self.m.log_bytes(dev, 4);
        }
        // StoreLoad: the arming stores are visible before we re-read the next slot's flags
        // (pairs with the driver's fence between making descriptors available and reading
        // our event suppression).
        store_load_fence();
        Ok(if self.available()? > 0 {
            Armed::NotEmpty
        } else {
            Armed::Empty
        })
    }
}

/// The driver side of one packed virtqueue: pvnet's own frontend.
///
/// The device is not trusted: a used descriptor must name a buffer in flight and its length
/// must fit in it; the chain length of each buffer comes from our own bookkeeping.
#[derive(Debug)]
pub struct DriverQueue {
    m: Mapped<MemTable, Ring>,
    size: u16,
    event_idx: bool,
    free: IdFifo,
    /// Free slots.
    free_slots: u16,
    /// Descriptors of each buffer id in flight, and its writable capacity.
    ndesc: Box<[u16]>,
    cap: Box<[Option<u32>]>,
    in_flight: u16,
    next_avail: u16,
    avail_wrap: bool,
    /// The first descriptor added since the last publish: its slot and the flags withheld.
    held: Option<(u16, u16)>,
    /// Slots made available since the last kick decision.
    added: u16,
    next_used: u16,
    used_wrap: bool,
    /// Used buffers `used_available` counted and not yet popped.
    used_pending: u16,
    irq_on: bool,
    /// `VIRTIO_F_IN_ORDER` negotiated: buffers come back in the order they were made
    /// available, and one used descriptor (the batch's last buffer id, in the batch's first
    /// slot) may return a whole batch.
    in_order: bool,
    /// Descriptors of the buffers already popped of the batch whose used descriptor sits at
    /// `next_used` (it is passed once the batch's last buffer is popped).
    batch_descs: u16,
}

impl DriverQueue {
    /// Lays out a fresh queue (every slot unavailable, both wrap counters 1).
    pub fn new(mem: Arc<MemTable>, cfg: &QueueConfig) -> Result<Self> {
        let m: Mapped<MemTable, Ring> = Mapped::new(mem, cfg)?;
        for i in 0..cfg.size {
            m.ring.set_body(i, 0, 0, 0);
            m.ring.flags(i).store(0, Ordering::Relaxed);
        }
        for part in [m.ring.driver, m.ring.device] {
            m.ring.event(part, 0).store(0, Ordering::Relaxed);
            m.ring.event(part, 2).store(EVENT_ENABLE, Ordering::Relaxed);
        }
        Ok(Self {
            m,
            size: cfg.size,
            event_idx: cfg.event_idx,
            free: IdFifo::full(cfg.size),
            free_slots: cfg.size,
            ndesc: vec![0; usize::from(cfg.size)].into_boxed_slice(),
            cap: vec![None; usize::from(cfg.size)].into_boxed_slice(),
            in_flight: 0,
            next_avail: 0,
            avail_wrap: true,
            held: None,
            added: 0,
            next_used: 0,
            used_wrap: true,
            used_pending: 0,
            irq_on: true,
            in_order: cfg.in_order,
            batch_descs: 0,
        })
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Free buffer ids.
    pub fn free_count(&self) -> usize {
        self.free.len.min(usize::from(self.free_slots))
    }

    /// The id the next add will use, if any is free.
    #[inline]
    pub fn next_free(&self) -> Option<u16> {
        self.free.front()
    }

    /// Buffers the device holds.
    pub fn in_flight(&self) -> u16 {
        self.in_flight
    }

    /// The memory table.
    pub fn mem(&self) -> &Arc<MemTable> {
        &self.m.mem
    }

    /// Writes descriptor `slot`: the first of a publish without its flags (held back for
    /// `publish`'s release store), any other in one store, flags included (the device reads
    /// it only after the held first one is made available).
    #[inline(always)]
    fn write_desc(&mut self, slot: u16, b: &crate::split::Buf, id: u16, flags: u16) {
        if self.held.is_none() {
            self.m.ring.set_body(slot, b.addr, b.len, id);
            self.held = Some((slot, flags));
        } else {
            self.m.ring.set_desc(
                slot,
                PackedDesc {
                    addr: b.addr,
                    len: b.len,
                    id,
                    flags,
                },
            );
        }
    }

    /// Writes one descriptor at the next slot; the first of a publish has its flags held back.
    #[inline]
    fn put(&mut self, b: &crate::split::Buf, id: u16, next: bool) {
        let slot = self.next_avail;
        let mut flags = avail_bits(self.avail_wrap);
        if b.write {
            flags |= DESC_F_WRITE;
        }
        if next {
            flags |= DESC_F_NEXT;
        }
        self.write_desc(slot, b, id, flags);
        self.next_avail = advance(slot, &mut self.avail_wrap, 1, self.size);
        self.free_slots -= 1;
        self.added += 1;
    }

    /// Adds a one-descriptor buffer (unpublished). Returns its id.
    #[inline(always)]
    pub fn add_one(&mut self, b: crate::split::Buf) -> Result<u16> {
        if self.free_slots == 0 {
            return Err(Error::NoFreeDescriptors);
        }
        let id = self.free.pop().ok_or(Error::NoFreeDescriptors)?;
        self.put(&b, id, false);
        self.ndesc[usize::from(id)] = 1;
        self.cap[usize::from(id)] = Some(if b.write { b.len } else { 0 });
        self.in_flight += 1;
        Ok(id)
    }

    /// Adds up to `max` one-descriptor buffers in one pass (unpublished): `buf(k, id)` gives
    /// the `k`-th, which will carry id `id`; `None` ends the run. Returns how many were added.
    /// [`add_one`](Self::add_one) in a loop, with the room counted once, each id taken from
    /// the free list once, and the slot, wrap counter and counts kept in registers until the
    /// end (the re-posting of a receive burst).
    #[inline]
    pub fn add_run(
        &mut self,
        max: usize,
        mut buf: impl FnMut(usize, u16) -> Option<crate::split::Buf>,
    ) -> usize {
        let room = max.min(usize::from(self.free_slots)).min(self.free.len);
        let (mut slot, mut wrap) = (self.next_avail, self.avail_wrap);
        let mut n = 0;
        while n < room {
            let id = self.free.nth(n);
            let Some(b) = buf(n, id) else { break };
            let flags = avail_bits(wrap) | if b.write { DESC_F_WRITE } else { 0 };
            self.write_desc(slot, &b, id, flags);
            self.ndesc[usize::from(id)] = 1;
            self.cap[usize::from(id)] = Some(if b.write { b.len } else { 0 });
            // One step, not `advance` (its general `by` costs 5.5 instructions a buffer more
            // here: driver_offer_packed 46.0 against 51.5).
            slot += 1;
            if slot == self.size {
                slot = 0;
                wrap = !wrap;
            }
            n += 1;
        }
        self.free.skip(n);
        let k = u16::try_from(n).unwrap_or(u16::MAX);
        (self.next_avail, self.avail_wrap) = (slot, wrap);
        self.free_slots -= k;
        self.added += k;
        self.in_flight += k;
        n
    }

    /// Adds a chain in consecutive slots (readable buffers first). Returns its id.
    pub fn add_chain(&mut self, bufs: &[crate::split::Buf]) -> Result<u16> {
        let n = u16::try_from(bufs.len()).map_err(|_| Error::NoFreeDescriptors)?;
        if n == 0 || n > self.free_slots {
            return Err(Error::NoFreeDescriptors);
        }
        let id = self.free.pop().ok_or(Error::NoFreeDescriptors)?;
        let mut cap = 0u32;
        for (k, b) in bufs.iter().enumerate() {
            if b.write {
                cap = cap.saturating_add(b.len);
            }
            self.put(b, id, k + 1 < bufs.len());
        }
        self.ndesc[usize::from(id)] = n;
        self.cap[usize::from(id)] = Some(cap);
        self.in_flight += 1;
        Ok(id)
    }

    /// Makes every added descriptor available with one release store (the first one's flags),
    /// then decides whether the device wants a kick.
    #[inline]
    pub fn publish(&mut self) -> bool {
        let Some((slot, flags)) = self.held.take() else {
            return false;
        };
        // Release: every descriptor of the batch (and the data in the buffers) is visible
        // before the first is made available (pairs with the device's acquire load).
        self.m.ring.flags(slot).store(flags, Ordering::Release);
        // StoreLoad: made available before we read the device's event suppression (pairs
        // with the fence in the device's arm).
        store_load_fence();
        let new = self.next_avail;
        let old = new.wrapping_sub(std::mem::take(&mut self.added));
        let dev = self.m.ring.device;
        let flags = self.m.ring.event(dev, 2).load(Ordering::Relaxed);
        if flags != EVENT_DESC || !self.event_idx {
            return flags != EVENT_DISABLE;
        }
        let off_wrap = self.m.ring.event(dev, 0).load(Ordering::Relaxed);
        need_event_packed(off_wrap, new, old, self.avail_wrap, self.size)
    }

    /// Walks the used descriptors from the next used slot (one acquire load each) and
    /// returns how many buffers came back, validating each id against what is in flight.
    #[inline]
    pub fn used_available(&mut self) -> Result<u16> {
        if self.in_order {
            return self.used_available_in_order();
        }
        let (mut i, mut wrap) = (self.next_used, self.used_wrap);
        let mut n = 0u16;
        while n < self.in_flight {
            // Acquire: the descriptor's id and length, written before its flags, are visible
            // (pairs with the device's release store).
            let f = self.m.ring.flags(i).load(Ordering::Acquire);
            if !is_used(f, wrap) {
                break;
            }
            let id = self.m.ring.desc(i).id;
            let k = self.in_flight_desc(id)?;
            i = advance(i, &mut wrap, k, self.size);
            n += 1;
        }
        self.used_pending = n;
        Ok(n)
    }

    fn in_flight_desc(&self, id: u16) -> Result<u16> {
        match (
            self.cap.get(usize::from(id)),
            self.ndesc.get(usize::from(id)),
        ) {
            (Some(Some(_)), Some(&k)) => Ok(k),
            _ => Err(Error::UsedIdInvalid { id: u32::from(id) }),
        }
    }

    /// [`used_available`](Self::used_available) under IN_ORDER: each used descriptor returns
    /// every buffer in flight up to the one it names, oldest first; the next one sits past
    /// all their descriptors. A named buffer that is not in flight stops the queue.
    #[inline]
    fn used_available_in_order(&mut self) -> Result<u16> {
        let (mut i, mut wrap) = (self.next_used, self.used_wrap);
        // Buffers counted, oldest in flight first.
        let mut n = 0u16;
        // A batch partly popped already: its used descriptor is still at `next_used`.
        let mut skip = self.batch_descs;
        while n < self.in_flight {
            // Acquire: as in `used_available`.
            let f = self.m.ring.flags(i).load(Ordering::Acquire);
            if !is_used(f, wrap) {
                break;
            }
            let last = self.m.ring.desc(i).id;
            let mut descs = std::mem::take(&mut skip);
            loop {
                if n == self.in_flight {
                    return Err(Error::UsedIdInvalid {
                        id: u32::from(last),
                    });
                }
                let id = self.free.recent(n, self.in_flight);
                descs += self.in_flight_desc(id)?;
                n += 1;
                if id == last {
                    break;
                }
            }
            i = advance(i, &mut wrap, descs, self.size);
        }
        self.used_pending = n;
        Ok(n)
    }

    /// The used descriptor at `next_used`, if `used_available` counted a buffer still to pop
    /// (read once; it must still be marked used).
    #[inline]
    fn pending_used(&self) -> Result<Option<PackedDesc>> {
        if self.used_pending == 0 {
            return Ok(None);
        }
        let d = self.m.ring.desc(self.next_used);
        if !is_used(d.flags, self.used_wrap) {
            return Err(Error::UsedIdInvalid {
                id: u32::from(d.id),
            });
        }
        Ok(Some(d))
    }

    /// [`pop_used`](Self::pop_used) under IN_ORDER: the oldest buffer in flight. Before the
    /// batch's last one it comes back with length 0 (the batch's one used descriptor carries
    /// the last buffer's length); the last one passes the batch's descriptors.
    #[inline]
    fn pop_used_in_order(&mut self) -> Result<Option<(u16, u32)>> {
        let Some(d) = self.pending_used()? else {
            return Ok(None);
        };
        let id = self.free.recent(0, self.in_flight);
        let k = self.in_flight_desc(id)?;
        // The batch's slots are freed together once its last buffer is popped: the used
        // descriptor sits in the first of them until then.
        let (len, freed) = if id == d.id {
            let cap = self.cap[usize::from(id)].unwrap_or(0);
            let len = crate::ring::used_len(id, d.len, cap)?;
            let descs = std::mem::take(&mut self.batch_descs) + k;
            self.next_used = advance(self.next_used, &mut self.used_wrap, descs, self.size);
            (len, descs)
        } else {
            if self.used_pending == 1 {
                // The device changed the descriptor since it was counted: the batch counted
                // ends here, and not at the buffer it names now.
                return Err(Error::UsedIdInvalid {
                    id: u32::from(d.id),
                });
            }
            self.batch_descs += k;
            (0, 0)
        };
        self.cap[usize::from(id)] = None;
        self.free_slots += freed;
        self.free.push(id);
        self.in_flight -= 1;
        self.used_pending -= 1;
        Ok(Some((id, len)))
    }

    /// Takes the next used buffer of the batch: (id, len), validated, its slots freed.
    #[inline]
    pub fn pop_used(&mut self) -> Result<Option<(u16, u32)>> {
        if self.in_order {
            return self.pop_used_in_order();
        }
        let Some(d) = self.pending_used()? else {
            return Ok(None);
        };
        let e = self.take_used(&d)?;
        self.used_pending -= 1;
        Ok(Some(e))
    }

    /// Takes the one buffer the used descriptor `d` (read at `next_used`) returns: its id
    /// in flight, its length within what it offered, its slots freed.
    #[inline(always)]
    fn take_used(&mut self, d: &PackedDesc) -> Result<(u16, u32)> {
        let id = d.id;
        let k = self.in_flight_desc(id)?;
        let slot = &mut self.cap[usize::from(id)];
        let len = crate::ring::used_len(id, d.len, slot.unwrap_or(0))?;
        *slot = None;
        self.next_used = advance(self.next_used, &mut self.used_wrap, k, self.size);
        self.free_slots += k;
        self.free.push(id);
        self.in_flight -= 1;
        Ok((id, len))
    }

    /// The fast part of [`queue::DriverQueue::pop_used_batch`](crate::queue::DriverQueue::pop_used_batch):
    /// takes up to `max` used buffers into `out`, (id, len) each, validated and their slots
    /// freed, while each used descriptor returns one buffer (every one, without IN_ORDER;
    /// with it, one naming the oldest buffer in flight): each is read once, where
    /// [`used_available`](Self::used_available) then [`pop_used`](Self::pop_used) read it
    /// twice. Stops at anything else (one descriptor for a batch, a batch partly popped),
    /// which those two take. Returns how many were taken.
    pub fn pop_used_run(&mut self, out: &mut Vec<(u16, u32)>, max: usize) -> Result<usize> {
        if self.batch_descs != 0 {
            return Ok(0);
        }
        let limit = max.min(usize::from(self.in_flight));
        out.reserve(limit);
        // The walk's position, wrap counter and counts stay in registers until the run ends
        // (`take_used` stores each back per buffer).
        let (mut at, mut wrap, mut slots) = (self.next_used, self.used_wrap, 0u16);
        let (mut k, mut broke) = (0u16, None);
        while usize::from(k) < limit {
            // Acquire: the descriptor's id and length, written before its flags, are visible
            // (pairs with the device's release store).
            let f = self.m.ring.flags(at).load(Ordering::Acquire);
            if !is_used(f, wrap) {
                break;
            }
            let d = self.m.ring.desc(at);
            let id = usize::from(d.id);
            if self.in_order && d.id != self.free.recent(0, self.in_flight - k) {
                break;
            }
            let (Some(&n), Some(&Some(cap))) = (self.ndesc.get(id), self.cap.get(id)) else {
                broke = Some(Error::UsedIdInvalid {
                    id: u32::from(d.id),
                });
                break;
            };
            let len = match crate::ring::used_len(d.id, d.len, cap) {
                Ok(len) => len,
                Err(e) => {
                    broke = Some(e);
                    break;
                }
            };
            self.cap[id] = None;
            at = advance(at, &mut wrap, n, self.size);
            slots += n;
            self.free.push(d.id);
            out.push((d.id, len));
            k += 1;
        }
        (self.next_used, self.used_wrap) = (at, wrap);
        self.free_slots += slots;
        self.in_flight -= k;
        self.used_pending = self.used_pending.saturating_sub(k);
        broke.map_or(Ok(usize::from(k)), Err)
    }

    /// Asks the device not to interrupt us.
    #[inline]
    pub fn disable_used_notify(&mut self) {
        if !self.irq_on {
            return;
        }
        self.irq_on = false;
        // Relaxed: a hint.
        self.m
            .ring
            .event(self.m.ring.driver, 2)
            .store(EVENT_DISABLE, Ordering::Relaxed);
    }

    /// Arm, fence, re-check for used buffers.
    #[inline]
    pub fn arm_used_notify(&mut self) -> Result<Armed> {
        self.irq_on = true;
        let drv = self.m.ring.driver;
        if self.event_idx {
            let off = self.next_used | (u16::from(self.used_wrap) << 15);
            self.m.ring.event(drv, 0).store(off, Ordering::Relaxed);
            self.m
                .ring
                .event(drv, 2)
                .store(EVENT_DESC, Ordering::Relaxed);
        } else {
            self.m
                .ring
                .event(drv, 2)
                .store(EVENT_ENABLE, Ordering::Relaxed);
        }
        // StoreLoad: the arming stores are visible before we look at the next used slot
        // (pairs with the device's fence after marking descriptors used).
        store_load_fence();
        Ok(if self.used_available()? > 0 {
            Armed::NotEmpty
        } else {
            Armed::Empty
        })
    }
}

/// A packed ring's indirect table (2.8.7): `len / 16` descriptors used in order, read once
/// each; of their flags only WRITE counts (the rest are reserved, and ignored).
fn parse_indirect<M: Translate>(
    w: &mut Walk<'_, M>,
    d: &PackedDesc,
    c: &mut Chain,
    size: u16,
) -> Result<()> {
    let len = d.len;
    if len == 0 || !len.is_multiple_of(16) || len / 16 > u32::from(size) {
        return Err(Error::IndirectBadLen { len });
    }
    let table = w.table(d.addr, len)?;
    for k in 0..len / 16 {
        // SAFETY: k < len/16 and the table of len bytes was validated inside one region;
        // read_unaligned: the spec does not force the table's alignment.
        let e: PackedDesc = unsafe {
            table
                .as_ptr()
                .add(k as usize * 16)
                .cast::<PackedDesc>()
                .read_unaligned()
        };
        if e.flags & DESC_F_INDIRECT != 0 {
            return Err(Error::IndirectNested);
        }
        w.add_entry(e.addr, e.len, e.flags & DESC_F_WRITE != 0, c)?;
    }
    Ok(())
}
