//! Device side of a packed virtqueue: the backend's view.
//!
//! A descriptor is read once (its flags with acquire first, then the rest) into a local copy
//! and validated; used descriptors of a batch are written with the first one's flags last (one
//! release store makes the batch visible); notification arming is arm, fence, re-check.
//! pvnet's device completes chains in the order it popped them.

use super::{
    advance, avail_bits, is_avail, need_event_packed, retreat, used_bits, PackedDesc, Ring,
    DESC_F_AVAIL, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_USED, DESC_F_WRITE, EVENT_DESC,
    EVENT_DISABLE, EVENT_ENABLE,
};
use crate::chain::{Chain, Segs, Walk};
use crate::config::{Direction, QueueConfig};
use crate::error::{Error, Result};
use crate::event::Armed;
use crate::mem::{MemTable, Seg};
use crate::ring::{store_load_fence, Mapped, RunXlate};
use crate::xlate::{Perm, Translate};
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
    /// The last publish found the driver asleep on everything published before it (see
    /// [`driver_idle`](Self::driver_idle)).
    driver_idle: bool,
    notify_on: bool,
    hint: usize,
    /// Segments of the current batch.
    segs: Segs,
    /// Indirect-table entries whose write flag was ignored on a queue the device only reads
    /// (the chain module's `table_entry_writable`), since the last
    /// [`take_write_ignored`](Self::take_write_ignored).
    write_ignored: u64,
}

impl<M: Translate> DeviceQueue<M> {
    /// Starts the device side: the ring validated and translated once; `cfg.base` is the next
    /// slot in bits 0-14 and the avail wrap counter in bit 15 (vhost-user's encoding); every
    /// buffer before it has been returned.
    pub(crate) fn new(mem: Arc<M>, cfg: &QueueConfig) -> Result<Self> {
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
            driver_idle: false,
            notify_on: true,
            hint: 0,
            segs: Segs::with_capacity(4 * usize::from(cfg.size)),
            write_ignored: 0,
        })
    }

    /// Queue size.
    pub(crate) fn size(&self) -> u16 {
        self.size
    }

    /// Next slot to consume with the wrap counter in bit 15 (what `GET_VRING_BASE` returns).
    pub(crate) fn last_avail(&self) -> u16 {
        self.last_avail | (u16::from(self.avail_wrap) << 15)
    }

    /// The translator.
    pub(crate) fn mem(&self) -> &Arc<M> {
        &self.m.mem
    }

    /// Switches to a new translator, re-translating the ring.
    pub(crate) fn set_mem(&mut self, mem: Arc<M>) -> Result<()> {
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
    pub(crate) fn available(&mut self) -> Result<u16> {
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
    pub(crate) fn pending(&self) -> u16 {
        self.pending
    }

    /// Parses the next chain of the batch (`None`: the batch is done).
    #[inline]
    pub(crate) fn pop(&mut self) -> Result<Option<Chain>> {
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
    pub(crate) fn pop_batch(
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
    pub(crate) fn unpop(&mut self, n: u16) {
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
    pub(crate) fn segs(&self, c: &Chain) -> &[Seg<'_>] {
        self.segs.of(c)
    }

    /// The device-readable segments of a chain.
    #[inline]
    pub(crate) fn readable(&self, c: &Chain) -> &[Seg<'_>] {
        self.segs.readable(c)
    }

    /// The device-writable segments of a chain.
    #[inline]
    pub(crate) fn writable(&self, c: &Chain) -> &[Seg<'_>] {
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
    pub(crate) fn push_used(&mut self, id: u16, len: u32) {
        let n = self.ndesc.get(usize::from(id)).copied().unwrap_or(1).max(1);
        self.shadow.push((id, len, n));
    }

    /// Used entries pushed and not yet published.
    #[inline]
    pub(crate) fn unpublished(&self) -> u16 {
        u16::try_from(self.shadow.len()).unwrap_or(u16::MAX)
    }

    /// Writes the batch's used descriptors, the first one's flags last (one release store
    /// makes the batch visible), then takes the batch's one call decision.
    #[inline]
    pub(crate) fn publish(&mut self) -> bool {
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
    /// only reads, since the last call (DPDK's packed transmit tables: the chain module's
    /// `table_entry_writable`).
    #[inline]
    pub(crate) fn take_write_ignored(&mut self) -> u64 {
        std::mem::take(&mut self.write_ignored)
    }

    /// Whether a dirty log is on (see the split ring's).
    #[inline(always)]
    pub(crate) fn logging(&self) -> bool {
        self.m.logging
    }

    /// Whether the last publish found the driver asleep on everything published before it:
    /// a descriptor event at exactly the slot and wrap the previous publish ended with, which
    /// Linux writes when it re-arms after consuming all it was given (see the split ring's).
    /// False with events enabled or disabled as a whole.
    #[inline]
    pub(crate) fn driver_idle(&self) -> bool {
        self.driver_idle
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
        self.driver_idle = false;
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
        self.driver_idle = off_wrap == prev.0 | (u16::from(prev.1) << 15);
        let (new, mut old) = (self.used_idx, prev.0);
        if new <= old {
            old = old.wrapping_sub(self.size);
        }
        need_event_packed(off_wrap, new, old, self.used_wrap, self.size)
    }

    /// Not known for a packed ring: callers must assume the driver may be waiting.
    #[inline]
    pub(crate) fn driver_backlog(&self) -> Option<u16> {
        None
    }

    /// Stops asking for kicks (we are polling).
    #[inline]
    pub(crate) fn disable_notify(&mut self) {
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
    pub(crate) fn arm_notify(&mut self) -> Result<Armed> {
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
