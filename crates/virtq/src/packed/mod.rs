//! The packed virtqueue format (virtio 1.1+, section 2.8): layout, flags and the validated ring
//! pointers shared by both roles ([`DeviceQueue`] in `device.rs`, [`DriverQueue`] in
//! `driver.rs`).
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

mod device;
mod driver;

pub use device::{DeviceQueue, SCAN};
pub use driver::DriverQueue;

use crate::config::{AddrSpace, RingAddrs, MAX_QUEUE_SIZE};
use crate::error::{Error, Result};
use crate::event::need_event;
use crate::ring::Layout;
use crate::xlate::{Perm, Translate};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

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
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
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
