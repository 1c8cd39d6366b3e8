//! The packet memory a socket registers (`XDP_UMEM_REG`): pvnet's own frames and, for direct
//! receive, a frontend's memory mapped behind them.
//!
//! `XDP_UMEM_REG` takes one contiguous range of the process's address space and pins all of
//! it. A frontend's memory comes as several regions, each mapped on its own where its
//! vhost-user message put it; so the UMEM is a reservation holding the port's own frames
//! first and then each region's file mapped again, back to back ([`View`]: a second view of
//! the same pages, each on a boundary of the file's page size, 2 MiB for a hugetlbfs file;
//! a gap a boundary leaves is filled with anonymous memory). What the kernel writes through
//! the UMEM is what the frontend reads through its own mapping.
//!
//! A UMEM that lends is registered in unaligned chunk mode (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`):
//! a fill-ring address is taken as it is, not rounded down to a chunk, so a frontend's buffer
//! can be given at whatever address it has. The kernel writes a frame at the address plus its
//! 256-byte headroom and at most a chunk less that headroom, so the chunk is the smallest the
//! kernel takes ([`LEND_CHUNK`], 2048: 1792 bytes of frame) and a buffer is lent only if it
//! holds that much behind its header. The received descriptor then carries the fill address
//! in its low 48 bits and the frame's offset from it in the top 16 ([`data_addr`]).

use super::{setopt, FRAME};
use pvnet_vhost::View;
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

/// One mapping of a frontend's memory as the UMEM sees it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Its first byte in pvnet's own mapping of it (through the memory table).
    host: usize,
    len: usize,
    /// Its first byte's offset in the UMEM.
    at: u64,
}

/// The page size of the file behind `fd` (2 MiB for a hugetlbfs file): a mapping of it
/// starts on such a boundary.
fn page_of(fd: RawFd) -> io::Result<usize> {
    // SAFETY: all-zero is a valid `stat`; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live `stat` for the call.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(st.st_blksize).unwrap_or(4096).max(4096))
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

    /// `frames` own frames, then each of `views` (a frontend's memory as pvnet maps it),
    /// in unaligned chunk mode with chunks of [`LEND_CHUNK`] bytes. With no view it is a
    /// port's own memory only, ready to lend once it is rebuilt with the frontend's.
    pub(super) fn lending(frames: u32, views: &[View]) -> io::Result<Self> {
        Self::build(frames, Some(views))
    }

    fn build(frames: u32, lend: Option<&[View]>) -> io::Result<Self> {
        let own = frames as usize * FRAME as usize;
        // Where each view goes: on a boundary of its file's page size.
        let (mut slots, mut pages, mut len, mut align) = (Vec::new(), Vec::new(), own, 4096);
        for v in lend.unwrap_or(&[]) {
            let page = page_of(v.fd)?;
            let at = len.div_ceil(page) * page;
            slots.push(Slot {
                host: v.base.as_ptr() as usize,
                len: v.len,
                at: at as u64,
            });
            pages.push(page);
            align = align.max(page);
            len = at
                .checked_add(v.len.div_ceil(page) * page)
                .ok_or(io::ErrorKind::InvalidInput)?;
        }
        let u = Self::reserve(len, align, own, lend.is_some(), slots)?;
        let at = |off: usize| {
            // SAFETY: `off` lies within the reservation (checked by the caller's layout).
            unsafe { u.base.as_ptr().add(off) }.cast::<libc::c_void>()
        };
        let fixed = |off: usize, n: usize, prot_flags: (libc::c_int, libc::c_int), fd, fo| {
            // SAFETY: `off..off + n` lies within our own reservation, replaced (MAP_FIXED) by
            // a mapping of our own: anonymous memory or a frontend's file the caller holds
            // open for the call.
            let q = unsafe { libc::mmap(at(off), n, prot_flags.0, prot_flags.1, fd, fo) };
            if q == at(off) {
                Ok(())
            } else {
                Err(mmap_err("UMEM", n))
            }
        };
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
        fixed(0, own, (rw, anon | libc::MAP_POPULATE), -1, 0)?;
        let mut end = own;
        for ((s, v), page) in u.slots.iter().zip(lend.unwrap_or(&[])).zip(&pages) {
            let off = usize::try_from(s.at).map_err(|_| io::ErrorKind::InvalidInput)?;
            if off > end {
                // The gap a page boundary left: pinned with the rest, so it must be memory.
                fixed(end, off - end, (rw, anon), -1, 0)?;
            }
            let n = v.len.div_ceil(*page) * page;
            let fo = libc::off_t::try_from(v.offset).map_err(|_| io::ErrorKind::InvalidInput)?;
            fixed(off, n, (rw, libc::MAP_SHARED | libc::MAP_FIXED), v.fd, fo).map_err(|e| {
                io::Error::new(e.kind(), format!("the frontend's memory again: {e}"))
            })?;
            end = off + n;
        }
        Ok(u)
    }

    /// A reservation of `len` bytes on an `align` boundary (nothing mapped in it yet).
    fn reserve(
        len: usize,
        align: usize,
        own: usize,
        lends: bool,
        slots: Vec<Slot>,
    ) -> io::Result<Self> {
        let whole = len + align;
        // SAFETY: a fresh reservation chosen by the kernel; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                whole,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(mmap_err("UMEM", len));
        }
        let start = p as usize;
        let aligned = start.div_ceil(align) * align;
        // SAFETY: the parts of our own reservation in front of and behind the aligned range.
        unsafe {
            if aligned > start {
                libc::munmap(p, aligned - start);
            }
            let tail = start + whole - (aligned + len);
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
        }
        let base =
            NonNull::new(aligned as *mut u8).ok_or_else(|| io::Error::other("mmap: null"))?;
        Ok(Self {
            base,
            len,
            own,
            chunk: if lends { LEND_CHUNK } else { FRAME },
            unaligned: lends,
            slots,
        })
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
