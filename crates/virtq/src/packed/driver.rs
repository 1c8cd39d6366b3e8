//! Driver side of a packed virtqueue: pvnet's own frontend.
//!
//! The device is not trusted: a used descriptor must name a buffer in flight and its length
//! must fit in it; the chain length of each buffer comes from our own bookkeeping.

use super::{
    advance, avail_bits, is_used, need_event_packed, PackedDesc, Ring, DESC_F_NEXT, DESC_F_WRITE,
    EVENT_DESC, EVENT_DISABLE, EVENT_ENABLE,
};
use crate::config::{Buf, QueueConfig};
use crate::error::{Error, Result};
use crate::event::Armed;
use crate::mem::MemTable;
use crate::ring::{store_load_fence, IdFifo, Mapped};
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
    pub(crate) fn new(mem: Arc<MemTable>, cfg: &QueueConfig) -> Result<Self> {
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
    pub(crate) fn free_count(&self) -> usize {
        self.free.len.min(usize::from(self.free_slots))
    }

    /// The id the next add will use, if any is free.
    #[inline]
    pub(crate) fn next_free(&self) -> Option<u16> {
        self.free.front()
    }

    /// Buffers the device holds.
    pub(crate) fn in_flight(&self) -> u16 {
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
    fn write_desc(&mut self, slot: u16, b: &Buf, id: u16, flags: u16) {
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
    fn put(&mut self, b: &Buf, id: u16, next: bool) {
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
    pub(crate) fn add_one(&mut self, b: Buf) -> Result<u16> {
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
    pub(crate) fn add_run(
        &mut self,
        max: usize,
        mut buf: impl FnMut(usize, u16) -> Option<Buf>,
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
            // One step, not `advance` (its general `by` costs instructions a buffer here:
            // docs/callgrind.md, the packed driver's re-posting).
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
    pub(crate) fn add_chain(&mut self, bufs: &[Buf]) -> Result<u16> {
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
    pub(crate) fn publish(&mut self) -> bool {
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
    pub(crate) fn used_available(&mut self) -> Result<u16> {
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
    pub(crate) fn pop_used(&mut self) -> Result<Option<(u16, u32)>> {
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
    pub(crate) fn pop_used_run(&mut self, out: &mut Vec<(u16, u32)>, max: usize) -> Result<usize> {
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
    pub(crate) fn disable_used_notify(&mut self) {
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
    pub(crate) fn arm_used_notify(&mut self) -> Result<Armed> {
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
