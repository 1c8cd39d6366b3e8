//! A mock over owned memory: one region laid out with a queue's rings and a buffer pool,
//! and both roles built on it. Shared by the unit tests, property tests, benches and fuzzers.

use crate::config::Format;
use crate::error::Result;
use crate::mem::{AddrSpace, MemTable, RegionSpec};
use crate::queue;
use crate::split::{ring_sizes, DeviceQueue, Direction, DriverQueue, QueueConfig, RingAddrs};
use crate::xlate::{Perm, Translate};
use std::ptr::NonNull;
use std::sync::Arc;

/// Owned, page-aligned memory.
#[derive(Debug)]
pub struct OwnedMem {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: plain heap memory; accessed only through raw pointers handed out by `MemTable`.
unsafe impl Send for OwnedMem {}
// SAFETY: as above.
unsafe impl Sync for OwnedMem {}

impl OwnedMem {
    /// Zeroed memory of `len` bytes, 4096-aligned.
    pub fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).expect("layout");
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr, layout }
    }

    /// Host pointer of the start.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for OwnedMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Guest address where the mock region starts (nonzero, so a zero address is unmapped).
pub const GPA_BASE: u64 = 0x1_0000;

/// One queue's rings plus `nbufs` buffers of `buf_size` bytes in one region.
#[derive(Debug)]
pub struct MockQueue {
    /// The table over the region.
    pub mem: Arc<MemTable>,
    /// Ring addresses (guest space).
    pub addrs: RingAddrs,
    /// Guest address of buffer 0.
    pub bufs: u64,
    /// Bytes per buffer.
    pub buf_size: u32,
    /// Queue size.
    pub size: u16,
    /// Region length.
    pub len: u64,
}

impl MockQueue {
    /// Lays out a queue of `size` with `size` buffers of `buf_size` bytes.
    pub fn new(size: u16, buf_size: u32) -> Self {
        let (dl, al, ul) = ring_sizes(size);
        let desc = GPA_BASE;
        let avail = desc + dl;
        let used = (avail + al + 4095) & !4095;
        let bufs = (used + ul + 4095) & !4095;
        let len = bufs + u64::from(size) * u64::from(buf_size) - GPA_BASE;
        let owned = OwnedMem::new(usize::try_from(len).expect("fits"));
        let spec = RegionSpec {
            gpa: GPA_BASE,
            len,
            uaddr: 0x7f00_0000_0000,
            host: owned.as_ptr(),
        };
        // SAFETY: the region is exactly the owned allocation, which the table keeps alive.
        let mem = unsafe { MemTable::new(&[spec], Box::new(owned)) }.expect("valid region");
        Self {
            mem: Arc::new(mem),
            addrs: RingAddrs { desc, avail, used },
            bufs,
            buf_size,
            size,
            len,
        }
    }

    /// Guest address of buffer `i`.
    pub fn buf(&self, i: u16) -> u64 {
        self.bufs + u64::from(i) * u64::from(self.buf_size)
    }

    /// A config for this layout.
    pub fn config(&self, direction: Direction, event_idx: bool, indirect: bool) -> QueueConfig {
        QueueConfig {
            format: Format::Split,
            size: self.size,
            addrs: self.addrs,
            space: AddrSpace::Guest,
            base: 0,
            event_idx,
            indirect,
            in_order: false,
            direction,
        }
    }

    /// Both roles over this layout.
    pub fn pair(
        &self,
        direction: Direction,
        event_idx: bool,
    ) -> Result<(DriverQueue, DeviceQueue)> {
        let cfg = self.config(direction, event_idx, true);
        let drv = DriverQueue::new(self.mem.clone(), &cfg)?;
        let dev = DeviceQueue::new(self.mem.clone(), &cfg)?;
        Ok((drv, dev))
    }

    /// Both roles over this layout in `format`, as the format-neutral queue types.
    pub fn pair_in(
        &self,
        format: Format,
        direction: Direction,
        event_idx: bool,
    ) -> Result<(queue::DriverQueue, queue::DeviceQueue)> {
        self.pair_with(format, direction, event_idx, false)
    }

    /// [`pair_in`](Self::pair_in), with `VIRTIO_F_IN_ORDER` negotiated or not.
    pub fn pair_with(
        &self,
        format: Format,
        direction: Direction,
        event_idx: bool,
        in_order: bool,
    ) -> Result<(queue::DriverQueue, queue::DeviceQueue)> {
        let cfg = QueueConfig {
            format,
            base: format.fresh_base(),
            in_order,
            ..self.config(direction, event_idx, true)
        };
        let drv = queue::DriverQueue::new(self.mem.clone(), &cfg)?;
        let dev = queue::DeviceQueue::new(self.mem.clone(), &cfg)?;
        Ok((drv, dev))
    }

    /// The host address of guest address `gpa` inside the region (for tools that read a
    /// trace of host addresses, e.g. the coherence count).
    pub fn host(&self, gpa: u64) -> usize {
        let p = self
            .mem
            .translate_range(AddrSpace::Guest, gpa, 1, Perm::Read)
            .expect("inside region");
        p.as_ptr() as usize
    }

    /// Raw write into the region (for tests that corrupt rings like a hostile peer would).
    pub fn poke(&self, gpa: u64, bytes: &[u8]) {
        let p = self
            .mem
            .translate_range(AddrSpace::Guest, gpa, bytes.len() as u64, Perm::Write)
            .expect("poke inside region");
        // SAFETY: the range was validated inside the owned region.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.as_ptr(), bytes.len()) }
    }

    /// Raw read from the region.
    pub fn peek(&self, gpa: u64, out: &mut [u8]) {
        let p = self
            .mem
            .translate_range(AddrSpace::Guest, gpa, out.len() as u64, Perm::Read)
            .expect("peek inside region");
        // SAFETY: the range was validated inside the owned region.
        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), out.as_mut_ptr(), out.len()) }
    }
}
