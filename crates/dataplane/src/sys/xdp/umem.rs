//! The packet memory a socket registers (`XDP_UMEM_REG`): pvnet's own frames and, for direct
//! receive, a frontend's memory mapped behind them.
//!
//! `XDP_UMEM_REG` takes one contiguous range of the process's address space and pins all of
//! it. A frontend's memory comes as several regions, each mapped on its own where its
//! vhost-user message put it; so the UMEM is a reservation holding the port's own frames
//! first and then each region again, back to back: a second view of the same pages
//! (`mremap` with an old size of 0 makes a new mapping of a shared mapping's pages, no file
//! needed). What the kernel writes through the UMEM is what the frontend reads through its
//! own mapping.
//!
//! A UMEM that lends is registered in unaligned chunk mode (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`):
//! a fill-ring address is taken as it is, not rounded down to a chunk, so a frontend's buffer
//! can be given at whatever address it has. The kernel writes a frame at the address plus its
//! 256-byte headroom and at most a chunk less that headroom, so the chunk is the smallest the
//! kernel takes ([`LEND_CHUNK`], 2048: 1792 bytes of frame) and a buffer is lent only if it
//! holds that much behind its header. The received descriptor then carries the fill address
//! in its low 48 bits and the frame's offset from it in the top 16 ([`data_addr`]).

use super::{setopt, FRAME};
use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;

/// Chunk size of a UMEM that lends (the kernel's least, `XDP_UMEM_MIN_CHUNK_SIZE`).
pub const LEND_CHUNK: u32 = 2048;

/// The kernel's headroom in front of each received frame (`XDP_PACKET_HEADROOM`).
pub const XDP_HEADROOM: u32 = 256;

/// Where a received descriptor's data starts in the UMEM: its address, plus, in unaligned
/// mode, the offset the kernel put in its top 16 bits (zero in aligned mode).
#[inline(always)]
pub fn data_addr(addr: u64) -> u64 {
    (addr & libc::XSK_UNALIGNED_BUF_ADDR_MASK) + (addr >> libc::XSK_UNALIGNED_BUF_OFFSET_SHIFT)
}

/// The fill address a received descriptor came from (unaligned mode: its low 48 bits).
#[inline(always)]
pub fn fill_addr(addr: u64) -> u64 {
    addr & libc::XSK_UNALIGNED_BUF_ADDR_MASK
}

/// One region of a frontend's memory as the UMEM sees it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Its first byte in the frontend's own mapping (pvnet's view through the memory table).
    host: usize,
    len: usize,
    /// Its first byte's offset in the UMEM.
    at: u64,
}

/// The packet memory of one socket: `frames` own frames of [`FRAME`] bytes (receive frames
/// first), then the frontend regions it lends from, if any.
#[derive(Debug)]
pub struct Umem {
    base: NonNull<u8>,
    /// The whole reservation.
    len: usize,
    /// Bytes of pvnet's own frames, at the start.
    own: usize,
    /// Chunk size as registered.
    chunk: u32,
    /// Registered in unaligned chunk mode (it lends, or may).
    unaligned: bool,
    slots: Vec<Slot>,
}

// SAFETY: the mapping is the Umem's alone (unmapped on drop); it moves with its port to one
// shard, which alone touches it.
unsafe impl Send for Umem {}

fn mmap_err(what: &str, len: usize) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what} of {len} bytes: {e}"))
}

impl Umem {
    /// `frames` own frames, aligned chunks of [`FRAME`] bytes: what a port that copies uses.
    pub(super) fn new(frames: u32) -> io::Result<Self> {
        Self::build(frames, None)
    }

    /// `frames` own frames, then each of `regions` (a frontend's memory as pvnet maps it:
    /// start and length, each start page-aligned), in unaligned chunk mode with chunks of
    /// [`LEND_CHUNK`] bytes. With no region it is a port's own memory only, ready to lend
    /// once it is rebuilt with the frontend's.
    pub(super) fn lending(frames: u32, regions: &[(NonNull<u8>, u64)]) -> io::Result<Self> {
        Self::build(frames, Some(regions))
    }

    fn build(frames: u32, lend: Option<&[(NonNull<u8>, u64)]>) -> io::Result<Self> {
        let own = frames as usize * FRAME as usize;
        let page = 4096usize;
        let mut slots = Vec::new();
        let mut len = own;
        for &(host, n) in lend.unwrap_or(&[]) {
            let host = host.as_ptr() as usize;
            let n = usize::try_from(n).map_err(|_| io::ErrorKind::InvalidInput)?;
            if !host.is_multiple_of(page) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a frontend region at {host:#x} does not start on a page"),
                ));
            }
            slots.push(Slot {
                host,
                len: n,
                at: len as u64,
            });
            len = len
                .checked_add(n.div_ceil(page) * page)
                .ok_or(io::ErrorKind::InvalidInput)?;
        }
        // SAFETY: a fresh reservation chosen by the kernel; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(mmap_err("UMEM", len));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))?;
        // From here the reservation is unmapped on any error (drop).
        let u = Self {
            base,
            len,
            own,
            chunk: if lend.is_some() { LEND_CHUNK } else { FRAME },
            unaligned: lend.is_some(),
            slots,
        };
        // SAFETY: the first `own` bytes of our own reservation, replaced by a fresh private
        // anonymous mapping (MAP_FIXED within what we reserved).
        let q = unsafe {
            libc::mmap(
                p,
                own,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if q != p {
            return Err(mmap_err("UMEM", own));
        }
        for s in &u.slots {
            let at = usize::try_from(s.at).map_err(|_| io::ErrorKind::InvalidInput)?;
            let n = s.len.div_ceil(page) * page;
            // SAFETY: `s.host` is the page-aligned start of a shared mapping the caller
            // holds for the Umem's life; an old size of 0 makes a second mapping of its
            // pages, placed (MREMAP_FIXED) on our own reservation at `at..at + n`.
            let r = unsafe {
                libc::mremap(
                    s.host as *mut libc::c_void,
                    0,
                    n,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    base.as_ptr().add(at).cast::<libc::c_void>(),
                )
            };
            // SAFETY: `at` lies within the reservation.
            if r != unsafe { base.as_ptr().add(at) }.cast() {
                return Err(mmap_err(
                    "a second view of the frontend's memory (mremap)",
                    n,
                ));
            }
        }
        Ok(u)
    }

    /// Registers it with socket `s` (`XDP_UMEM_REG`).
    pub(super) fn register(&self, s: RawFd) -> io::Result<()> {
        let reg = libc::xdp_umem_reg {
            addr: self.base.as_ptr() as u64,
            len: self.len as u64,
            chunk_size: self.chunk,
            headroom: 0,
            flags: if self.unaligned {
                libc::XDP_UMEM_UNALIGNED_CHUNK_FLAG
            } else {
                0
            },
            tx_metadata_len: 0,
        };
        setopt(s, libc::XDP_UMEM_REG, &reg, "XDP_UMEM_REG").map_err(|e| {
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOBUFS | libc::ENOMEM | libc::EPERM)
            ) {
                io::Error::new(
                    e.kind(),
                    format!("{e} (locked memory: needs CAP_IPC_LOCK or a higher ulimit -l)"),
                )
            } else {
                e
            }
        })
    }

    /// The start of the memory.
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Bytes of pvnet's own frames at the start: a descriptor past them is a lent buffer.
    pub fn own_len(&self) -> usize {
        self.own
    }

    /// Its whole length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most bytes of one descriptor: a transmitted frame is cut into pieces of this size, and
    /// a received one holds this less the kernel's headroom.
    pub fn chunk(&self) -> u32 {
        self.chunk
    }

    /// Whether it is registered to lend (unaligned chunks), with or without regions yet.
    pub fn lends(&self) -> bool {
        self.unaligned
    }

    /// Whether it maps a frontend's memory.
    pub fn has_regions(&self) -> bool {
        !self.slots.is_empty()
    }

    /// The UMEM offset of `p .. p + len` in the frontend's own mapping, if one region holds
    /// all of it.
    #[inline]
    pub fn offset_of(&self, p: *const u8, len: u32) -> Option<u64> {
        let p = p as usize;
        let end = p.checked_add(len as usize)?;
        self.slots
            .iter()
            .find(|s| p >= s.host && end <= s.host + s.len)
            .map(|s| s.at + (p - s.host) as u64)
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: our reservation, made in `build` (own frames and second views inside it);
        // the socket that registered it is closed first (field order of `Xsk`), and the
        // kernel holds its own page references until then. The frontend's own mappings are
        // untouched.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
