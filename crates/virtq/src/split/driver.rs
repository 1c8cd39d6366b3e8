//! Driver side of a split virtqueue: pvnet's own frontend.
//!
//! The device is not trusted: `used.id` must name a buffer in flight and `used.len` must fit
//! in it. Chain links are kept in a private shadow, never read back from the shared table.

use super::{
    store_load_fence, Desc, Mapped, QueueConfig, AVAIL_F_NO_INTERRUPT, DESC_F_NEXT, DESC_F_WRITE,
    USED_F_NO_NOTIFY,
};
use crate::config::Buf;
use crate::error::{Error, Result};
use crate::event::{need_event, Armed};
use crate::mem::MemTable;
use crate::ring::IdFifo;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const NONE: u16 = u16::MAX;

/// The driver side of one split virtqueue.
#[derive(Debug)]
pub struct DriverQueue {
    m: Mapped<MemTable>,
    size: u16,
    event_idx: bool,
    /// Free descriptor ids.
    free: IdFifo,
    /// Private shadow of chain links (`NONE` ends a chain).
    next: Vec<u16>,
    /// Writable capacity of each in-flight head; `None` when not in flight.
    cap: Vec<Option<u32>>,
    in_flight: u16,
    /// Next avail index to fill.
    avail_idx: u16,
    /// Avail index at the last kick decision (event-idx "old").
    kicked_at: u16,
    /// Next used index to consume.
    last_used: u16,
    /// `used->idx` as last loaded.
    used_cache: u16,
    irq_on: bool,
}

impl DriverQueue {
    /// Lays out a fresh queue over memory we share with the device: zeroes the rings and fills
    /// the free list. `cfg.base` is the starting index for both rings.
    pub fn new(mem: Arc<MemTable>, cfg: &QueueConfig) -> Result<Self> {
        let m = Mapped::new(mem, cfg)?;
        m.ring.avail_flags().store(0, Ordering::Relaxed);
        m.ring.avail_idx().store(cfg.base, Ordering::Relaxed);
        m.ring.used_event().store(cfg.base, Ordering::Relaxed);
        m.ring.used_flags().store(0, Ordering::Relaxed);
        m.ring.used_idx().store(cfg.base, Ordering::Relaxed);
        m.ring.avail_event().store(cfg.base, Ordering::Relaxed);
        let size = cfg.size;
        for i in 0..size {
            m.ring.set_desc(i, Desc::default());
        }
        Ok(Self {
            m,
            size,
            event_idx: cfg.event_idx,
            free: IdFifo::full(size),
            next: vec![NONE; usize::from(size)],
            cap: vec![None; usize::from(size)],
            in_flight: 0,
            avail_idx: cfg.base,
            kicked_at: cfg.base,
            last_used: cfg.base,
            used_cache: cfg.base,
            irq_on: true,
        })
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Free descriptors.
    pub fn free_count(&self) -> usize {
        self.free.len
    }

    /// The id the next [`add_one`](Self::add_one) will use, if any is free. A driver with a
    /// persistent buffer per descriptor fills buffer `id` first, then adds it.
    #[inline]
    pub(crate) fn next_free(&self) -> Option<u16> {
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

    /// Adds a one-descriptor buffer to the avail ring (unpublished). Returns its id.
    #[inline(always)]
    pub fn add_one(&mut self, b: Buf) -> Result<u16> {
        let id = self.free.pop().ok_or(Error::NoFreeDescriptors)?;
        let flags = if b.write { DESC_F_WRITE } else { 0 };
        self.m.ring.set_desc(
            id,
            Desc {
                addr: b.addr,
                len: b.len,
                flags,
                next: 0,
            },
        );
        self.next[usize::from(id)] = NONE;
        self.cap[usize::from(id)] = Some(if b.write { b.len } else { 0 });
        self.m.ring.set_avail_entry(self.avail_idx, id);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.in_flight += 1;
        Ok(id)
    }

    /// Adds a chain (readable buffers before writable ones). Returns the head id.
    pub fn add_chain(&mut self, bufs: &[Buf]) -> Result<u16> {
        if bufs.is_empty() || bufs.len() > self.free.len {
            return Err(Error::NoFreeDescriptors);
        }
        let head = self.free.pop().ok_or(Error::NoFreeDescriptors)?;
        let mut cur = head;
        let mut cap = 0u32;
        for (k, b) in bufs.iter().enumerate() {
            let nxt = if k + 1 < bufs.len() {
                self.free.pop()
            } else {
                None
            };
            let mut flags = if b.write { DESC_F_WRITE } else { 0 };
            if nxt.is_some() {
                flags |= DESC_F_NEXT;
            }
            if b.write {
                cap = cap.saturating_add(b.len);
            }
            self.m.ring.set_desc(
                cur,
                Desc {
                    addr: b.addr,
                    len: b.len,
                    flags,
                    next: nxt.unwrap_or(0),
                },
            );
            self.next[usize::from(cur)] = nxt.unwrap_or(NONE);
            if let Some(n) = nxt {
                cur = n;
            }
        }
        self.cap[usize::from(head)] = Some(cap);
        self.m.ring.set_avail_entry(self.avail_idx, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.in_flight += 1;
        Ok(head)
    }

    /// Publishes every added buffer with one release store of `avail->idx`, then decides
    /// whether the device wants a kick. Returns true if the caller must kick.
    #[inline]
    pub fn publish(&mut self) -> bool {
        let old = self.kicked_at;
        let new = self.avail_idx;
        if old == new {
            return false;
        }
        // Release: descriptors and avail entries are visible before the new avail->idx
        // (pairs with the device's acquire load of avail->idx).
        self.m.ring.avail_idx().store(new, Ordering::Release);
        // StoreLoad: avail->idx is visible before we read avail_event / used flags (pairs with
        // the fence in the device's arm; without it both sides may miss each other).
        store_load_fence();
        self.kicked_at = new;
        if self.event_idx {
            need_event(self.m.ring.avail_event().load(Ordering::Relaxed), new, old)
        } else {
            self.m.ring.used_flags().load(Ordering::Relaxed) & USED_F_NO_NOTIFY == 0
        }
    }

    /// Loads `used->idx` once and returns how many used entries wait. Validates that the device
    /// did not return more than it holds.
    #[inline]
    pub fn used_available(&mut self) -> Result<u16> {
        // Acquire: used entries and the data the device wrote are visible after this load
        // (pairs with the device's release store of used->idx).
        let idx = self.m.ring.used_idx().load(Ordering::Acquire);
        let n = idx.wrapping_sub(self.last_used);
        if n > self.in_flight {
            return Err(Error::UsedIdxJump {
                last: self.last_used,
                idx,
                in_flight: self.in_flight,
            });
        }
        self.used_cache = idx;
        Ok(n)
    }

    /// Takes the next used entry of the current batch: (id, len), both validated, and frees
    /// the buffer's descriptors. `Ok(None)` when the batch is exhausted.
    #[inline]
    pub fn pop_used(&mut self) -> Result<Option<(u16, u32)>> {
        if self.last_used == self.used_cache {
            return Ok(None);
        }
        let id32 = self.m.ring.used_id(self.last_used);
        let id = u16::try_from(id32).map_err(|_| Error::UsedIdInvalid { id: id32 })?;
        let slot = self
            .cap
            .get_mut(usize::from(id))
            .ok_or(Error::UsedIdInvalid { id: id32 })?;
        let cap = slot.ok_or(Error::UsedIdInvalid { id: id32 })?;
        // A buffer the device only read has no length to report, and its entry's length is
        // not read (`Ring::used_len`; DPDK's PMD reads only the id on transmit).
        let len = if cap == 0 {
            0
        } else {
            crate::ring::used_len(id, self.m.ring.used_len(self.last_used), cap)?
        };
        *slot = None;
        self.last_used = self.last_used.wrapping_add(1);
        self.in_flight -= 1;
        let mut i = id;
        loop {
            self.free.push(i);
            let n = self.next[usize::from(i)];
            if n == NONE {
                break;
            }
            i = n;
        }
        Ok(Some((id, len)))
    }

    /// Asks the device not to interrupt us (we poll). With EVENT_IDX, `used_event` is put
    /// half the index space ahead, which the device cannot reach with one ring in flight.
    #[inline]
    pub fn disable_used_notify(&mut self) {
        if !self.irq_on {
            return;
        }
        self.irq_on = false;
        // Relaxed: hints; a late one only costs a spurious interrupt.
        if self.event_idx {
            self.m
                .ring
                .used_event()
                .store(self.last_used.wrapping_add(0x8000), Ordering::Relaxed);
        } else {
            self.m
                .ring
                .avail_flags()
                .store(AVAIL_F_NO_INTERRUPT, Ordering::Relaxed);
        }
    }

    /// Arm, fence, re-check: asks for an interrupt at the next used entry and re-reads
    /// `used->idx`. `Armed::Empty`: safe to sleep until the call fd fires.
    #[inline]
    pub fn arm_used_notify(&mut self) -> Result<Armed> {
        self.irq_on = true;
        if self.event_idx {
            self.m
                .ring
                .used_event()
                .store(self.last_used, Ordering::Relaxed);
        } else {
            self.m.ring.avail_flags().store(0, Ordering::Relaxed);
        }
        // StoreLoad: the arming store is visible before we re-read used->idx (pairs with the
        // device's fence between its used->idx store and its read of used_event).
        store_load_fence();
        Ok(if self.used_available()? > 0 {
            Armed::NotEmpty
        } else {
            Armed::Empty
        })
    }
}
