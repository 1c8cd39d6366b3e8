//! Shared mappings of a peer's memory fds, and the memory table built over them.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use virtq::{MemTable, RegionSpec};

/// One `mmap(MAP_SHARED)` of a peer's fd; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    map_len: usize,
    /// Offset of the region's first byte inside the mapping (mmap_offset % page size).
    lead: usize,
    /// SIGBUS guard slot (see [`crate::fault`]).
    slot: usize,
    /// The file offset of `base`.
    offset: u64,
    file: File,
}

// SAFETY: a mapping is just address space; who may touch it is governed by the MemTable.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` starting at `offset` (any alignment), read-write, shared.
    pub fn new(file: File, offset: u64, len: u64) -> io::Result<Self> {
        let page = 4096u64;
        let lead = offset % page;
        let map_len = usize::try_from(len.checked_add(lead).ok_or(io::ErrorKind::InvalidInput)?)
            .map_err(|_| io::ErrorKind::InvalidInput)?;
        let off = libc::off_t::try_from(offset - lead).map_err(|_| io::ErrorKind::InvalidInput)?;
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // A region past the end of its file would fault (SIGBUS) on first touch.
        let meta = file.metadata()?;
        if meta.file_type().is_file() && offset.checked_add(len).is_none_or(|end| end > meta.len())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("region of {len:#x} bytes at offset {offset:#x} runs past the end of its {:#x}-byte file", meta.len()),
            ));
        }
        // SAFETY: a fresh mapping chosen by the kernel; the result is checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or(io::ErrorKind::Other)?;
        // A peer mapping the fault guard cannot cover would turn the peer's next truncation
        // into a SIGBUS that kills every port: refuse it instead.
        let Some(slot) = crate::fault::register(base.as_ptr() as usize, map_len) else {
            // SAFETY: exactly the range mmap returned above; nothing else has seen it.
            unsafe { libc::munmap(p, map_len) };
            return Err(io::Error::other(format!(
                "too many peer mappings (the fault guard covers {})",
                crate::fault::SLOTS
            )));
        };
        Ok(Self {
            base,
            map_len,
            lead: usize::try_from(lead).unwrap_or(0),
            slot,
            offset: offset - lead,
            file,
        })
    }

    /// True once the peer shrank the file and an access faulted (see `fault`).
    pub(crate) fn faulted(&self) -> bool {
        crate::fault::faulted(self.slot)
    }

    /// Host address of the region's first byte.
    pub fn start(&self) -> NonNull<u8> {
        // SAFETY: lead < page size <= map_len.
        unsafe { self.base.add(self.lead) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        crate::fault::unregister(self.slot);
        // SAFETY: exactly the range mmap returned; nothing uses it after the table drops.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

/// A region as the peer describes it, with its fd.
#[derive(Debug)]
pub(crate) struct PeerRegion {
    /// Guest physical address.
    pub gpa: u64,
    /// Size.
    pub len: u64,
    /// Peer's user address.
    pub uaddr: u64,
    /// Offset into the fd.
    pub mmap_offset: u64,
    /// The fd.
    pub file: File,
}

/// Maps all regions and builds the table that owns the mappings.
pub(crate) fn map_regions(regions: Vec<PeerRegion>) -> io::Result<Arc<MemTable>> {
    let mut specs = Vec::with_capacity(regions.len());
    let mut maps = Vec::with_capacity(regions.len());
    for r in regions {
        let m = Mapping::new(r.file, r.mmap_offset, r.len)?;
        specs.push(RegionSpec {
            gpa: r.gpa,
            len: r.len,
            uaddr: r.uaddr,
            host: m.start(),
        });
        maps.push(m);
    }
    // SAFETY: each spec covers exactly its mapping's region bytes, and the mappings move into
    // the table, which keeps them until it drops.
    let t = unsafe { MemTable::new(&specs, Box::new(maps)) }
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    Ok(Arc::new(t))
}

/// One mapping of a peer's memory, to be mapped again elsewhere: a device that must see the
/// memory as one range (an `AF_XDP` UMEM over a frontend's buffers) maps each file again, back
/// to back. Valid while the memory table it came from lives.
#[derive(Debug, Clone, Copy)]
pub struct View {
    /// The mapping's first byte in this process (page-aligned).
    pub base: NonNull<u8>,
    /// Its length.
    pub len: usize,
    /// The file it maps (the table's own descriptor: not to be closed).
    pub fd: std::os::fd::RawFd,
    /// The file offset of `base`.
    pub offset: u64,
}

// SAFETY: an address, a length and a descriptor number, for mapping the same file again.
unsafe impl Send for View {}

/// The mappings behind a memory table built from a peer's regions ([`map_regions`]), in
/// region order; None for another table (an IOTLB snapshot, one with a dirty log).
pub fn table_views(mem: &MemTable) -> Option<Vec<View>> {
    let maps = mem.owner().downcast_ref::<Vec<Mapping>>()?;
    Some(
        maps.iter()
            .map(|m| View {
                base: m.base,
                len: m.map_len,
                fd: m.file.as_raw_fd(),
                offset: m.offset,
            })
            .collect(),
    )
}

/// True if any mapping behind `mem` faulted (the peer shrank its file).
pub fn table_faulted(mem: &MemTable) -> bool {
    mem.owner()
        .downcast_ref::<Vec<Mapping>>()
        .is_some_and(|maps| maps.iter().any(Mapping::faulted))
}
