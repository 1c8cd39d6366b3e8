//! The split virtqueue format (virtio 1.x section 2.7): layout, flags and the validated ring
//! pointers shared by both roles.
//!
//! ```text
//! desc  : [Desc; size]                               16-byte aligned, 16 bytes each
//! avail : flags u16 | idx u16 | ring [u16; size] | used_event u16        2-byte aligned
//! used  : flags u16 | idx u16 | ring [(id u32, len u32); size] | avail_event u16   4-byte aligned
//! ```

mod device;
mod driver;

pub use device::DeviceQueue;
pub use driver::DriverQueue;

pub use crate::config::{Buf, Direction, QueueConfig, RingAddrs, MAX_QUEUE_SIZE};

use crate::config::AddrSpace;
use crate::error::{Error, Result};
use crate::mem::Prefetch;
use crate::xlate::{Perm, Translate};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU16;

/// This descriptor continues via the `next` field.
pub const DESC_F_NEXT: u16 = 1;
/// The device writes this buffer (otherwise it reads it).
pub const DESC_F_WRITE: u16 = 2;
/// The buffer holds a table of indirect descriptors.
pub const DESC_F_INDIRECT: u16 = 4;
/// Driver to device: do not interrupt me (ignored with EVENT_IDX).
pub const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// Device to driver: do not kick me (ignored with EVENT_IDX).
pub const USED_F_NO_NOTIFY: u16 = 1;

/// A split-ring descriptor, exactly as laid out in shared memory (little-endian; x86 and
/// aarch64 hosts only, which is what vhost-user runs on).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Desc {
    /// Guest address of the buffer.
    pub addr: u64,
    /// Length of the buffer.
    pub len: u32,
    /// `DESC_F_*`.
    pub flags: u16,
    /// Next descriptor if `flags & DESC_F_NEXT`.
    pub next: u16,
}

/// Bytes of each ring part for `size` entries.
#[must_use]
pub fn ring_sizes(size: u16) -> (u64, u64, u64) {
    let n = u64::from(size);
    (16 * n, 6 + 2 * n, 6 + 8 * n)
}

/// Validated pointers to the three ring parts. Valid while the `MemTable` they came from
/// lives: every queue keeps an `Arc` of its table next to its `Ring`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ring {
    desc: NonNull<Desc>,
    avail: NonNull<u8>,
    used: NonNull<u8>,
    size: u16,
}

// SAFETY: the pointers point into a mapping kept alive by the `Arc<MemTable>` stored next to
// the ring (in `Mapped`); moving the queue to its owner thread moves both together. A ring is
// not `Sync`: exactly one thread drives a queue.
unsafe impl Send for Ring {}

impl Ring {
    pub(crate) fn new<M: Translate>(
        mem: &M,
        space: AddrSpace,
        a: RingAddrs,
        size: u16,
    ) -> Result<Self> {
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(Error::BadQueueSize(u32::from(size)));
        }
        for (part, addr, align) in [
            ("desc", a.desc, 16),
            ("avail", a.avail, 2),
            ("used", a.used, 4),
        ] {
            if !addr.is_multiple_of(align) {
                return Err(Error::RingMisaligned { part, addr });
            }
        }
        let (dl, al, ul) = ring_sizes(size);
        // Each part must be contiguous; what the device does to it decides the permission
        // (descriptors and the avail ring are read, the used ring written and read).
        let part = |addr, len, perm| {
            mem.translate_range(space, addr, len, perm)
                .map_err(|m| mem.miss_error(m))
        };
        let desc = part(a.desc, dl, Perm::Read)?.cast::<Desc>();
        let avail = part(a.avail, al, Perm::Read)?;
        let used = part(a.used, ul, Perm::ReadWrite)?;
        // Host alignment follows from guest alignment only if regions are page aligned;
        // check the host pointers too, since the atomics below need it.
        let misaligned = |p: *const u8, a: usize| !(p as usize).is_multiple_of(a);
        if misaligned(desc.as_ptr().cast(), 16)
            || misaligned(avail.as_ptr(), 2)
            || misaligned(used.as_ptr(), 4)
        {
            return Err(Error::RingMisaligned {
                part: "host",
                addr: a.desc,
            });
        }
        Ok(Self {
            desc,
            avail,
            used,
            size,
        })
    }

    #[inline]
    fn mask(&self) -> u16 {
        self.size - 1
    }

    /// `avail->flags` or `used->flags`/`idx` as an atomic, borrowed from the ring.
    #[inline]
    fn atomic(&self, base: NonNull<u8>, off: usize) -> &AtomicU16 {
        // SAFETY: `base` is one of this ring's parts and `off` is 0, 2 or the event field, all
        // inside the validated part and 2-byte aligned (checked in `new`). The owner of the
        // ring keeps the mapping alive for as long as the ring is borrowed.
        unsafe { &*base.as_ptr().add(off).cast::<AtomicU16>() }
    }

    #[inline]
    pub(crate) fn avail_flags(&self) -> &AtomicU16 {
        self.atomic(self.avail, 0)
    }
    #[inline]
    pub(crate) fn avail_idx(&self) -> &AtomicU16 {
        self.atomic(self.avail, 2)
    }
    /// `used_event`, at the tail of the avail ring.
    #[inline]
    pub(crate) fn used_event(&self) -> &AtomicU16 {
        self.atomic(self.avail, 4 + 2 * usize::from(self.size))
    }
    #[inline]
    pub(crate) fn used_flags(&self) -> &AtomicU16 {
        self.atomic(self.used, 0)
    }
    #[inline]
    pub(crate) fn used_idx(&self) -> &AtomicU16 {
        self.atomic(self.used, 2)
    }
    /// `avail_event`, at the tail of the used ring.
    #[inline]
    pub(crate) fn avail_event(&self) -> &AtomicU16 {
        self.atomic(self.used, 4 + 8 * usize::from(self.size))
    }

    /// Starts loading, for writing, the lines of `n` used entries from slot `used`.
    #[inline]
    pub(crate) fn prefetch_used(&self, used: u16, n: u16) {
        let n = n.min(self.size);
        let at = used & self.mask();
        let k = n.min(self.size - at);
        let pf = Prefetch::write();
        // To the ring's end, then from its start: slots at..at+k lie inside the used ring.
        for (at, k) in [(at, k), (0, n - k)] {
            pf.range(self.used_slot(at).cast(), 8 * u32::from(k));
        }
    }

    /// Starts loading descriptors `i..i + n` (inside the table: `i + n <= size`).
    #[inline(always)]
    pub(crate) fn prefetch_descs(&self, i: u16, n: u16) {
        debug_assert!(u32::from(i) + u32::from(n) <= u32::from(self.size));
        // SAFETY: i < size (callers check): the first descriptor lies inside the table, and
        // the range ends inside it.
        let p = unsafe { self.desc.add(usize::from(i)) };
        Prefetch::read().range(p.cast::<u8>(), 16 * u32::from(n));
    }

    /// Reads one avail ring entry (the slot is masked into range).
    #[inline]
    pub(crate) fn avail_entry(&self, idx: u16) -> u16 {
        let slot = usize::from(idx & self.mask());
        // SAFETY: slot < size, so the u16 at 4 + 2*slot is inside the validated avail ring,
        // 2-byte aligned. Read once, volatile: the driver may be writing other slots.
        unsafe {
            self.avail
                .as_ptr()
                .add(4 + 2 * slot)
                .cast::<u16>()
                .read_volatile()
        }
    }

    /// Writes one avail ring entry, unless it holds `head` already: a driver that hands out
    /// heads in ring order finds the same head in the same slot lap after lap, and a line it
    /// does not write stays shared with the device, which then reads it without a transfer
    /// (DPDK's virtio PMD does the same, `vq_update_avail_ring`).
    #[inline]
    pub(crate) fn set_avail_entry(&self, idx: u16, head: u16) {
        let slot = usize::from(idx & self.mask());
        // SAFETY: as in `avail_entry`; the driver owns unpublished slots.
        unsafe {
            let p = self.avail.as_ptr().add(4 + 2 * slot).cast::<u16>();
            if p.read_volatile() != head {
                p.write_volatile(head);
            }
        }
    }

    /// Reads one descriptor, once, into a local copy.
    #[inline]
    pub(crate) fn desc(&self, i: u16) -> Desc {
        debug_assert!(i < self.size);
        // SAFETY: callers check i < size; the table is validated for size*16 bytes and
        // 16-byte aligned.
        unsafe { self.desc.as_ptr().add(usize::from(i)).read_volatile() }
    }

    #[inline]
    pub(crate) fn set_desc(&self, i: u16, d: Desc) {
        debug_assert!(i < self.size);
        // SAFETY: as in `desc`; the driver owns descriptors that are not in flight.
        unsafe { self.desc.as_ptr().add(usize::from(i)).write_volatile(d) }
    }

    /// The used ring's entry `idx` (the slot masked into range): its id, then its length.
    #[inline(always)]
    fn used_slot(&self, idx: u16) -> NonNull<u32> {
        let slot = usize::from(idx & self.mask());
        // SAFETY: slot < size: the 8 bytes at 4 + 8*slot are inside the validated used ring,
        // 4-byte aligned (checked in `new`).
        unsafe { self.used.add(4 + 8 * slot).cast() }
    }

    /// Reads one used entry's id, once.
    #[inline]
    pub(crate) fn used_id(&self, idx: u16) -> u32 {
        // SAFETY: the entry lies inside the used ring (`used_slot`).
        unsafe { self.used_slot(idx).read_volatile() }
    }

    /// Reads one used entry's length, once. Read only when there is one to read: a driver
    /// that reads the length of a buffer the device only read pulls over, twice a lap, the
    /// line whose last length belongs to the next batch.
    #[inline]
    pub(crate) fn used_len(&self, idx: u16) -> u32 {
        // SAFETY: as in `used_id`; the length is the entry's second word.
        unsafe { self.used_slot(idx).add(1).read_volatile() }
    }

    #[inline]
    pub(crate) fn set_used_entry(&self, idx: u16, id: u32, len: u32) {
        // SAFETY: as in `used_id`; the device owns unpublished used slots.
        unsafe {
            self.used_slot(idx)
                .cast::<[u32; 2]>()
                .write_volatile([id, len])
        }
    }
}

pub(crate) use crate::ring::{store_load_fence, Mapped as RingMapped};

/// The split ring's validated pointers, kept alive by the queue's translator.
pub(crate) type Mapped<M> = RingMapped<M, Ring>;

impl crate::ring::Layout for Ring {
    fn new<M: Translate>(mem: &M, space: AddrSpace, a: RingAddrs, size: u16) -> Result<Self> {
        Ring::new(mem, space, a, size)
    }
    fn size(&self) -> u16 {
        self.size
    }
    fn device_part(&self) -> (NonNull<u8>, usize) {
        (self.used, 6 + 8 * usize::from(self.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Armed;
    use crate::mock::MockQueue;

    #[test]
    fn tx_roundtrip_with_event_idx() {
        let mq = MockQueue::new(8, 256);
        let (mut drv, mut dev) = mq.pair(Direction::DeviceReads, true).unwrap();
        for i in 0..3u16 {
            mq.poke(mq.buf(i), &[u8::try_from(i).unwrap() + 1; 4]);
            drv.add_one(Buf {
                addr: mq.buf(i),
                len: 4,
                write: false,
            })
            .unwrap();
        }
        // avail_event starts at 0, so publishing 0..3 crosses it: kick.
        assert!(drv.publish());
        assert_eq!(dev.available().unwrap(), 3);
        let mut seen = vec![];
        while let Some(c) = dev.pop().unwrap() {
            let mut b = [0u8; 4];
            crate::mem::read_segs(dev.readable(&c), 0, &mut b);
            seen.push(b[0]);
            dev.push_used(c.head, 0);
        }
        assert_eq!(seen, [1, 2, 3]);
        assert!(dev.publish()); // first decision always notifies
        assert_eq!(drv.used_available().unwrap(), 3);
        let mut n = 0;
        while let Some((_, len)) = drv.pop_used().unwrap() {
            assert_eq!(len, 0);
            n += 1;
        }
        assert_eq!(n, 3);
        assert_eq!(drv.free_count(), 8);
        // Device polls: disabled notify means the next publish does not ask for a kick.
        dev.disable_notify();
        drv.add_one(Buf {
            addr: mq.buf(0),
            len: 4,
            write: false,
        })
        .unwrap();
        assert!(!drv.publish());
        // Arm with work pending reports NotEmpty.
        assert_eq!(dev.arm_notify().unwrap(), Armed::NotEmpty);
        let c = dev.pop().unwrap().unwrap();
        dev.push_used(c.head, 0);
        let _ = dev.publish();
        assert_eq!(dev.arm_notify().unwrap(), Armed::Empty);
        drv.add_one(Buf {
            addr: mq.buf(1),
            len: 4,
            write: false,
        })
        .unwrap();
        assert!(drv.publish(), "armed device must be kicked");
    }

    #[test]
    fn rx_roundtrip_without_event_idx() {
        let mq = MockQueue::new(4, 128);
        let (mut drv, mut dev) = mq.pair(Direction::DeviceWrites, false).unwrap();
        for i in 0..4u16 {
            drv.add_one(Buf {
                addr: mq.buf(i),
                len: 128,
                write: true,
            })
            .unwrap();
        }
        assert!(drv.publish());
        dev.disable_notify();
        assert_eq!(dev.available().unwrap(), 4);
        let c = dev.pop().unwrap().unwrap();
        assert_eq!(c.writable, 128);
        crate::mem::write_segs(dev.writable(&c), 0, b"hello");
        dev.push_used(c.head, 5);
        drv.disable_used_notify();
        assert!(!dev.publish(), "driver asked for no interrupts");
        assert_eq!(drv.used_available().unwrap(), 1);
        let (id, len) = drv.pop_used().unwrap().unwrap();
        assert_eq!(len, 5);
        let mut b = [0u8; 5];
        mq.peek(mq.buf(id), &mut b);
        assert_eq!(&b, b"hello");
        assert_eq!(drv.arm_used_notify().unwrap(), Armed::Empty);
        let c = dev.pop().unwrap().unwrap();
        dev.push_used(c.head, 0);
        assert!(dev.publish(), "driver armed: interrupt");
    }
}
