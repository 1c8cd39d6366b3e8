//! Device side of a split virtqueue: the backend's view.
//!
//! Batch discipline: [`DeviceQueue::available`] loads `avail->idx` once per batch; [`pop`]
//! parses chains up to that index without touching the index again; [`push_used`] records used
//! entries in a local shadow; [`publish`] writes the batch's entries into the ring in one run,
//! makes them visible with one release store of `used->idx` and takes the one notification
//! decision of the batch. (Writing each entry into the ring as its packet completed, between
//! the packet copies, was slower against DPDK virtio-user, `docs/bench-notes.md`: batched, the
//! used-ring lines the driver reads are written in one burst, after the batch's data.)
//!
//! [`pop`]: DeviceQueue::pop
//! [`push_used`]: DeviceQueue::push_used
//! [`publish`]: DeviceQueue::publish

use super::{
    store_load_fence, Desc, Direction, Mapped, QueueConfig, AVAIL_F_NO_INTERRUPT, DESC_F_INDIRECT,
    DESC_F_NEXT, DESC_F_WRITE, USED_F_NO_NOTIFY,
};
use crate::chain::{Chain, Segs, Walk};
use crate::error::{Error, Result};
use crate::event::{need_event, Armed};
use crate::mem::{MemTable, Seg};
use crate::ring::{translate_buffer, RunXlate};
use crate::xlate::{Perm, Translate};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The device side of one split virtqueue.
#[derive(Debug)]
pub struct DeviceQueue<M: Translate = MemTable> {
    m: Mapped<M>,
    size: u16,
    dir: Direction,
    event_idx: bool,
    indirect: bool,
    /// Next avail slot to consume.
    last_avail: u16,
    /// `avail->idx` as last loaded.
    avail_idx: u16,
    /// Next used slot to write.
    used_idx: u16,
    /// `used->idx` as last stored.
    published: u16,
    /// Used entries (id, len) pushed since the last publish, in order.
    shadow: Vec<[u32; 2]>,
    /// Used index at the last notification decision (event-idx "old").
    signalled_used: u16,
    signalled_valid: bool,
    /// The last publish found the driver asleep on everything published before it (see
    /// [`driver_idle`](Self::driver_idle)).
    driver_idle: bool,
    /// Whether we last asked the driver for kicks.
    notify_on: bool,
    /// Last-hit region for address translation.
    hint: usize,
    /// Segments of the current batch.
    segs: Segs,
    /// Indirect-table entries whose write flag was ignored on a queue the device only reads
    /// (the chain module's `table_entry_writable`), since the last
    /// [`take_write_ignored`](Self::take_write_ignored).
    write_ignored: u64,
}

impl<M: Translate> DeviceQueue<M> {
    /// Starts the device side of a queue. The ring addresses are validated and translated once;
    /// `mem` stays referenced for as long as the queue lives.
    pub fn new(mem: Arc<M>, cfg: &QueueConfig) -> Result<Self> {
        let m = Mapped::new(mem, cfg)?;
        // Scratch for one batch of segments: a chain may hold `size` descriptors and a
        // descriptor may span two regions, and we want at least one whole chain per batch.
        let cap = 4 * usize::from(cfg.size);
        Ok(Self {
            m,
            size: cfg.size,
            dir: cfg.direction,
            event_idx: cfg.event_idx,
            indirect: cfg.indirect,
            last_avail: cfg.base,
            avail_idx: cfg.base,
            used_idx: cfg.base,
            published: cfg.base,
            shadow: Vec::with_capacity(usize::from(cfg.size)),
            signalled_used: cfg.base,
            signalled_valid: false,
            driver_idle: false,
            notify_on: true,
            hint: 0,
            segs: Segs::with_capacity(cap),
            write_ignored: 0,
        })
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Resumes from the ring's own `used->idx` when it differs from the base the queue was
    /// started with; returns `(base, used)` if it did. A frontend whose previous backend
    /// stopped without `GET_VRING_BASE` (killed, or restarted) cannot know where that backend
    /// was: QEMU then gives the used index as the base, DPDK's virtio-user gives 0. What the
    /// frontend's ring says it got back is the one place the two sides agree, so the device
    /// starts over from there (as DPDK's vhost library does): a transmit chain taken but not
    /// yet returned is taken again (sent again), a receive buffer is reused. Nothing is
    /// completed twice, nothing is lost from the ring. Called once, before the first batch.
    pub(crate) fn resume_from_used(&mut self) -> Option<(u16, u16)> {
        // Acquire: whatever the previous device wrote before its last used->idx store.
        let used = self.m.ring.used_idx().load(Ordering::Acquire);
        if used == self.used_idx {
            return None;
        }
        let base = self.last_avail;
        self.last_avail = used;
        self.avail_idx = used;
        self.used_idx = used;
        self.published = used;
        self.signalled_used = used;
        self.signalled_valid = false;
        Some((base, used))
    }

    /// Next avail index to consume (what `GET_VRING_BASE` returns).
    pub fn last_avail(&self) -> u16 {
        self.last_avail
    }

    /// Next used index to write.
    pub fn used_idx(&self) -> u16 {
        self.used_idx
    }

    /// The translator the queue goes through.
    pub(crate) fn mem(&self) -> &Arc<M> {
        &self.m.mem
    }

    /// Switches to a new translator (after `SET_MEM_TABLE`), re-translating the rings.
    pub(crate) fn set_mem(&mut self, mem: Arc<M>) -> Result<()> {
        self.segs.clear();
        self.m.remap(mem)
    }

    /// Starts a batch: loads `avail->idx` once and returns how many chains are available.
    /// Clears the segment scratch, so chains from the previous batch must be finished.
    #[inline]
    pub fn available(&mut self) -> Result<u16> {
        self.segs.clear();
        // A translator that revoked something since the rings were translated: redo them.
        self.m.refresh()?;
        // Acquire: the avail ring entries and descriptors the driver wrote before its release
        // store of avail->idx are visible to the reads that follow.
        let idx = self.m.ring.avail_idx().load(Ordering::Acquire);
        let n = idx.wrapping_sub(self.last_avail);
        if n > self.size {
            return Err(Error::AvailIdxJump {
                last: self.last_avail,
                idx,
                size: self.size,
            });
        }
        self.avail_idx = idx;
        if n > 0 {
            // The used entries this batch will write, asked for owned now: the frontend read
            // them last lap, and their transfers overlap the batch's work instead of stalling
            // the publish's fence one after the other.
            self.m.ring.prefetch_used(self.used_idx, n);
        }
        Ok(n)
    }

    /// Chains left in the current batch (no memory access).
    #[inline]
    pub fn pending(&self) -> u16 {
        self.avail_idx.wrapping_sub(self.last_avail)
    }

    /// Parses the next chain of the batch. `Ok(None)` when the batch is exhausted, or when the
    /// segment scratch is full (finish the batch and call `available` again).
    #[inline(always)]
    pub fn pop(&mut self) -> Result<Option<Chain>> {
        if self.avail_idx == self.last_avail {
            return Ok(None);
        }
        let head = self.m.ring.avail_entry(self.last_avail);
        if let Some(c) = self.parse_simple(head) {
            self.last_avail = self.last_avail.wrapping_add(1);
            return Ok(Some(c));
        }
        self.pop_slow(head)
    }

    /// [`pop`](Self::pop) for a chain the simple parser did not take (`head` is the avail
    /// entry at `last_avail`): the general walk, its errors and the scratch-full rollback.
    #[cold]
    fn pop_slow(&mut self, head: u16) -> Result<Option<Chain>> {
        let start = self.segs.len();
        match self.parse_slow(head) {
            Ok(mut c) => {
                self.last_avail = self.last_avail.wrapping_add(1);
                c.start = u32::try_from(start).unwrap_or(u32::MAX);
                Ok(Some(c))
            }
            Err(Error::ChainTooLong { .. })
                if start > 0 && self.segs.len() == self.segs.capacity() =>
            {
                // Scratch full mid-batch: roll back, the chain is retried in the next batch.
                self.segs.truncate(start);
                self.avail_idx = self.last_avail;
                Ok(None)
            }
            Err(e) => {
                // Drop the failed chain's partial segments: left in the scratch they would
                // fill it on retries and turn the error into the rollback's `Ok(None)`.
                self.segs.truncate(start);
                if e.is_retryable() {
                    // Nothing consumed: the chain is parsed again once the translation is
                    // there. The batch ends here so no later chain overtakes it.
                    self.avail_idx = self.last_avail;
                }
                Err(e)
            }
        }
    }

    /// Pops up to `max` chains of the current batch into `out` (appended), calling `each`
    /// with every chain's segments as it is parsed (to start loading them, say). Stops at the
    /// end of the batch or when the segment scratch is full. Returns how many were popped.
    ///
    /// Generic over `each`, so it is compiled into the caller with the parser inlined: one
    /// loop per batch instead of a call and a `Result<Option<_>>` per chain. Runs of
    /// single-descriptor chains in the queue's direction (almost every network buffer) go
    /// through `pop_simple_run` and straight into `out`, their chain
    /// never on the stack; anything else, errors included, through the simple parser and the
    /// general walk.
    #[inline]
    pub(crate) fn pop_batch(
        &mut self,
        out: &mut Vec<Chain>,
        max: usize,
        mut each: impl FnMut(&[Seg<'_>]),
    ) -> Result<usize> {
        let want = usize::from(self.avail_idx.wrapping_sub(self.last_avail)).min(max);
        self.prefetch_descs(want);
        let mut n = 0;
        while n < max && self.avail_idx != self.last_avail {
            n += if self.dir == Direction::DeviceWrites {
                self.pop_simple_run::<true>(max - n, out, &mut each)
            } else {
                self.pop_simple_run::<false>(max - n, out, &mut each)
            };
            if n == max || self.avail_idx == self.last_avail {
                break;
            }
            // What the run stopped at: a chain of several descriptors, one against the
            // queue's direction, one that fails a check (the general walk reports it), or
            // the segment scratch full.
            let head = self.m.ring.avail_entry(self.last_avail);
            // The simple chain is pushed from its own branch: merged with the slow path's
            // result it would go through the stack (see `parse_simple`).
            if let Some(c) = self.parse_simple(head) {
                self.last_avail = self.last_avail.wrapping_add(1);
                each(self.segs(&c));
                out.push(c);
            } else {
                let Some(c) = self.pop_slow(head)? else {
                    break;
                };
                each(self.segs(&c));
                out.push(c);
            }
            n += 1;
        }
        Ok(n)
    }

    /// Requests the descriptor lines of the next `n` chains' heads before the first is read:
    /// the parse depends on each in turn, their transfers need not. Drivers hand out heads
    /// in order (a free list that is a ring), so when the first and the last head are `n - 1`
    /// apart the run is one range, asked for line by line; otherwise each head's line.
    #[inline]
    fn prefetch_descs(&self, n: usize) {
        let ring = self.m.ring;
        let Ok(k) = u16::try_from(n) else { return };
        if k < 2 {
            return;
        }
        let first = ring.avail_entry(self.last_avail);
        let last = ring.avail_entry(self.last_avail.wrapping_add(k - 1));
        if last >= first && last - first == k - 1 && last < self.size {
            ring.prefetch_descs(first, k);
            return;
        }
        let mut line = u16::MAX;
        for j in 0..k {
            let head = ring.avail_entry(self.last_avail.wrapping_add(j));
            if head < self.size && head >> 2 != line {
                line = head >> 2;
                ring.prefetch_descs(head, 1);
            }
        }
    }

    /// The run of simple chains from the next avail entry, up to `max` (and the batch's end
    /// and the scratch's room), in one loop: each a single descriptor in the queue's
    /// direction (`WRITE`: the device writes it), checked and translated as
    /// [`parse_simple`](Self::parse_simple) does, pushed into `out` and handed to `each`.
    /// What the loop reads of the queue (the ring, the memory table, the region hint, the
    /// scratch) is taken once into locals: its stores per chain would otherwise make the
    /// compiler load each again. Stops at the first entry that is anything else, left for
    /// the general path. Returns how many it took.
    #[inline(always)]
    fn pop_simple_run<const WRITE: bool>(
        &mut self,
        max: usize,
        out: &mut Vec<Chain>,
        each: &mut impl FnMut(&[Seg<'_>]),
    ) -> usize {
        let (ring, mem, size) = (self.m.ring, &*self.m.mem, self.size);
        let perm = if WRITE { Perm::Write } else { Perm::Read };
        let want = if WRITE { DESC_F_WRITE } else { 0 };
        let first = self.last_avail;
        let segs = &mut self.segs.0;
        let base = segs.len();
        let Ok(start) = u32::try_from(base) else {
            return 0;
        };
        let mut xlate = RunXlate::new(mem, perm, self.hint);
        // The scratch never grows on this path: each segment is written into its room, the
        // length set once at the end.
        let spare = segs.spare_capacity_mut();
        let run = usize::from(self.avail_idx.wrapping_sub(first))
            .min(max)
            .min(spare.len());
        let mut k = 0usize;
        while k < run {
            let head = ring.avail_entry(first.wrapping_add(u16::try_from(k).unwrap_or(0)));
            if head >= size {
                break;
            }
            let d = ring.desc(head);
            // A zero-length descriptor takes the general walk, which gives it no segment.
            if d.flags & (DESC_F_NEXT | DESC_F_INDIRECT | DESC_F_WRITE) != want || d.len == 0 {
                break;
            }
            // The flags matched this queue's direction, so the permission is the direction's.
            let Some(p) = xlate.buffer(d.addr, d.len) else {
                break;
            };
            let seg = Seg::new(p, d.len);
            each(std::slice::from_ref(&seg));
            let at = start + u32::try_from(k).unwrap_or(0);
            out.push(Chain::single(head, d.len, WRITE, at));
            spare[k].write(seg);
            k += 1;
        }
        self.hint = xlate.hint;
        // SAFETY: the `k` slots after the old length were written in the loop above (each
        // `spare[i]`, i < k, once), and k <= run <= the spare capacity.
        unsafe { segs.set_len(base + k) };
        self.last_avail = first.wrapping_add(u16::try_from(k).unwrap_or(0));
        k
    }

    /// Takes back the last `n` chains popped, unconsumed: they are popped again next batch.
    /// For a consumer that found no room for them downstream (backpressure).
    pub(crate) fn unpop(&mut self, n: u16) {
        self.last_avail = self.last_avail.wrapping_sub(n);
        self.avail_idx = self.last_avail;
    }

    /// All segments of a chain: readable ones first, then writable ones.
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

    /// The fast path: one descriptor, inside one region, in the queue's direction (almost
    /// every network buffer). Same checks as the general walk, without its loop; `None` sends
    /// the chain to [`parse_slow`](Self::parse_slow), which also reports every error. Its
    /// chain's `start` is set; the general walk's is set by [`pop_slow`](Self::pop_slow).
    ///
    /// Kept apart from the slow path so that its chain stays in registers: when both paths
    /// return through one `Result`, the result lives on the stack and LLVM reloads it with
    /// loads wider than the stores that wrote it, a store-forwarding stall (~15 cycles) per
    /// chain that was a fifth of the forwarding loop's samples.
    #[inline(always)]
    fn parse_simple(&mut self, head: u16) -> Option<Chain> {
        if head >= self.size {
            return None;
        }
        let d = self.m.ring.desc(head);
        // A zero-length descriptor takes the general walk, which gives it no segment.
        if d.flags & (DESC_F_NEXT | DESC_F_INDIRECT) == 0
            && d.len != 0
            && self.segs.len() < self.segs.capacity()
        {
            let write = d.flags & DESC_F_WRITE != 0;
            {
                if let Some((p, contig)) =
                    translate_buffer(&*self.m.mem, self.dir, write, d.addr, &mut self.hint)
                {
                    if u64::from(d.len) <= contig {
                        let start = u32::try_from(self.segs.len()).unwrap_or(u32::MAX);
                        self.segs.push(Seg::new(p, d.len));
                        return Some(Chain::single(head, d.len, write, start));
                    }
                }
            }
        }
        None
    }

    /// The general walk: chained, indirect, region-crossing or invalid descriptors. One
    /// [`Walk`] carries the chain's translation state from descriptor to descriptor.
    #[cold]
    fn parse_slow(&mut self, head: u16) -> Result<Chain> {
        let size = self.size;
        if head >= size {
            return Err(Error::DescIndexOutOfRange { index: head, size });
        }
        let mut c = Chain {
            head,
            readable: 0,
            writable: 0,
            start: 0,
            nread: 0,
            nsegs: 0,
        };
        let ring = self.m.ring;
        let mut w = Walk::new(&*self.m.mem, self.hint, &mut self.segs.0, self.dir, size);
        // Spec 2.7.5.2: a chain is at most `size` descriptors, indirect ones included.
        let max = u32::from(size);
        let mut count = 0u32;
        let mut i = head;
        loop {
            let d = ring.desc(i);
            count += 1;
            if count > max {
                return Err(Error::ChainTooLong { max });
            }
            if d.flags & DESC_F_INDIRECT != 0 {
                if !self.indirect {
                    return Err(Error::IndirectNotNegotiated);
                }
                if d.flags & DESC_F_NEXT != 0 {
                    return Err(Error::IndirectNested);
                }
                parse_indirect(&mut w, &d, &mut c, &mut count, size)?;
                break;
            }
            w.add(d.addr, d.len, d.flags & DESC_F_WRITE != 0, &mut c)?;
            if d.flags & DESC_F_NEXT == 0 {
                break;
            }
            if d.next >= size {
                return Err(Error::DescIndexOutOfRange {
                    index: d.next,
                    size,
                });
            }
            i = d.next;
        }
        let (hint, ignored) = (w.hint, w.ignored);
        self.hint = hint;
        self.write_ignored += ignored;
        Ok(c)
    }

    /// Records a used entry for the next unpublished slot. Nothing reaches the ring, let alone
    /// the driver, until [`publish`](Self::publish).
    #[inline]
    pub fn push_used(&mut self, head: u16, len: u32) {
        self.shadow.push([u32::from(head), len]);
        self.used_idx = self.used_idx.wrapping_add(1);
    }

    /// Used entries pushed and not yet published (the current batch's).
    #[inline]
    pub(crate) fn unpublished(&self) -> u16 {
        self.used_idx.wrapping_sub(self.published)
    }

    /// Publishes every pushed used entry with one release store of `used->idx`, then takes the
    /// batch's one notification decision. Returns true if the driver must be notified (a call).
    #[inline]
    pub fn publish(&mut self) -> bool {
        if self.used_idx == self.published {
            return false;
        }
        let mut at = self.published;
        for e in self.shadow.drain(..) {
            self.m.ring.set_used_entry(at, e[0], e[1]);
            at = at.wrapping_add(1);
        }
        // Release: the used entries and the data the device wrote into the buffers are visible
        // before the new used->idx (pairs with the driver's acquire load of used->idx).
        self.m
            .ring
            .used_idx()
            .store(self.used_idx, Ordering::Release);
        self.published = self.used_idx;
        if self.m.logging {
            self.m.log_ring();
        }
        // StoreLoad: the used->idx store is globally visible before we read the driver's
        // used_event / flags (pairs with the fence in the driver's arm; else a lost interrupt).
        store_load_fence();
        self.need_call()
    }

    /// Indirect-table entries whose write flag was ignored, this queue being one the device
    /// only reads, since the last call (DPDK's packed transmit tables: the chain module's
    /// `table_entry_writable`).
    #[inline]
    pub fn take_write_ignored(&mut self) -> u64 {
        std::mem::take(&mut self.write_ignored)
    }

    /// Whether a dirty log is on (live migration): the caller marks what it writes into the
    /// buffers ([`crate::DirtyLog::mark_segs`] through [`Translate::dirty_log`]).
    #[inline(always)]
    pub(crate) fn logging(&self) -> bool {
        self.m.logging
    }

    /// How many buffers the driver has made available beyond the point where it asked to be
    /// interrupted (`avail->idx` minus `used_event`, both read now): near the queue size when
    /// it asked at its last seen entry with its ring full (it waits for the call), small when
    /// it asked for an interrupt well ahead. `None` without EVENT_IDX. Two loads of the
    /// driver's lines: for the rare publish that must decide about a call, not per batch.
    #[inline]
    pub(crate) fn driver_backlog(&self) -> Option<u16> {
        self.event_idx.then(|| {
            let event = self.m.ring.used_event().load(Ordering::Relaxed);
            let avail = self.m.ring.avail_idx().load(Ordering::Relaxed);
            avail.wrapping_sub(event)
        })
    }

    /// Whether the last publish found the driver asleep on everything published before it:
    /// it asked to be interrupted at exactly the entry the previous publish ended with
    /// (`used_event` = the old `used->idx`), which a driver writes when it re-arms after
    /// consuming all it was given (Linux's NAPI completing: `virtqueue_enable_cb_prepare`
    /// writes its last used index). So it ran dry and waited for this publish. A driver
    /// still working, or one that polls (its `used_event` far behind), is never idle here.
    /// False without EVENT_IDX (a flag cannot say where the driver stopped). Read from the
    /// load the call decision does anyway.
    #[inline]
    pub(crate) fn driver_idle(&self) -> bool {
        self.driver_idle
    }

    fn need_call(&mut self) -> bool {
        if self.event_idx {
            let event = self.m.ring.used_event().load(Ordering::Relaxed);
            let old = self.signalled_used;
            self.signalled_used = self.published;
            self.driver_idle = event == old && self.signalled_valid;
            if !self.signalled_valid {
                self.signalled_valid = true;
                return true;
            }
            need_event(event, self.published, old)
        } else {
            self.m.ring.avail_flags().load(Ordering::Relaxed) & AVAIL_F_NO_INTERRUPT == 0
        }
    }

    /// Stops asking for kicks (we are polling). With EVENT_IDX nothing is written: the old
    /// `avail_event` stays behind and the driver will not pass it again for 2^16 entries.
    #[inline]
    pub fn disable_notify(&mut self) {
        if !self.notify_on {
            return;
        }
        self.notify_on = false;
        if !self.event_idx {
            // Relaxed: a hint; being late only costs a spurious kick.
            self.m
                .ring
                .used_flags()
                .store(USED_F_NO_NOTIFY, Ordering::Relaxed);
            if self.m.logging {
                self.m.log_ring();
            }
        }
    }

    /// Arm, fence, re-check: asks for a kick at the next avail entry, then re-reads
    /// `avail->idx`. `Armed::Empty` means it is safe to sleep until a kick;
    /// `Armed::NotEmpty` means work arrived in between and a new batch is ready.
    #[inline]
    pub fn arm_notify(&mut self) -> Result<Armed> {
        self.notify_on = true;
        if self.event_idx {
            self.m
                .ring
                .avail_event()
                .store(self.last_avail, Ordering::Relaxed);
        } else {
            self.m.ring.used_flags().store(0, Ordering::Relaxed);
        }
        // Live migration: this write to the used ring is the device's too.
        if self.m.logging {
            self.m.log_ring();
        }
        // StoreLoad: the arming store above is visible before we re-read avail->idx (pairs
        // with the driver's fence between its avail->idx store and its read of avail_event).
        store_load_fence();
        Ok(if self.available()? > 0 {
            Armed::NotEmpty
        } else {
            Armed::Empty
        })
    }
}

/// Walks a split ring's indirect table (2.7.5.3): one region, read once per entry, bounded
/// (`count` goes on from the ring's descriptors).
fn parse_indirect<M: Translate>(
    w: &mut Walk<'_, M>,
    d: &Desc,
    c: &mut Chain,
    count: &mut u32,
    size: u16,
) -> Result<()> {
    let len = d.len;
    if len == 0 || !len.is_multiple_of(16) {
        return Err(Error::IndirectBadLen { len });
    }
    let n = len / 16;
    if n > u32::from(size) {
        return Err(Error::IndirectBadLen { len });
    }
    // The table must be contiguous in host memory: one translation, its length checked.
    let table = w.table(d.addr, len)?;
    let mut i = 0u32;
    loop {
        // SAFETY: i < n and the table of n*16 bytes was validated inside one region;
        // read_unaligned because the spec does not force the table's alignment.
        let e: Desc = unsafe {
            table
                .as_ptr()
                .add(i as usize * 16)
                .cast::<Desc>()
                .read_unaligned()
        };
        *count += 1;
        if *count > u32::from(size) + 1 {
            return Err(Error::ChainTooLong {
                max: u32::from(size),
            });
        }
        if e.flags & DESC_F_INDIRECT != 0 {
            return Err(Error::IndirectNested);
        }
        w.add_entry(e.addr, e.len, e.flags & DESC_F_WRITE != 0, c)?;
        if e.flags & DESC_F_NEXT == 0 {
            return Ok(());
        }
        if u32::from(e.next) >= n {
            return Err(Error::DescIndexOutOfRange {
                index: e.next,
                size: u16::try_from(n).unwrap_or(u16::MAX),
            });
        }
        i = u32::from(e.next);
    }
}
