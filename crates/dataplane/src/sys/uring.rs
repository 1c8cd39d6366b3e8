//! Batched I/O on one fd through `io_uring` (the tap): a burst of reads, or of writes, in
//! one submission instead of a syscall each.
//!
//! Every request carries `RWF_NOWAIT`: the kernel completes it during the submission (the
//! bytes, or `-EAGAIN` when the tap has nothing to read or no room), never later. So when
//! [`Batch::complete`] returns, nothing is in flight: the memory a request pointed at (a
//! sender's buffer, a receive buffer) is the caller's again, and the caller may let it go.

use io_uring::{opcode, types, IoUring};
use std::io;
use std::os::fd::RawFd;

/// Requests one submission may carry.
pub(crate) const DEPTH: u32 = 128;

/// A submission queue and its completions, for one fd.
pub(crate) struct Batch {
    ring: IoUring,
    queued: u32,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("queued", &self.queued)
            .finish_non_exhaustive()
    }
}

impl Batch {
    /// A ring of [`DEPTH`] entries. Fails where `io_uring` is not available (an old kernel,
    /// `kernel.io_uring_disabled`, a seccomp filter): the caller then does a syscall per
    /// packet.
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            ring: IoUring::new(DEPTH)?,
            queued: 0,
        })
    }

    /// Requests queued and not yet submitted.
    pub(crate) fn queued(&self) -> u32 {
        self.queued
    }

    /// Whether another request fits.
    pub(crate) fn has_room(&self) -> bool {
        self.queued < DEPTH
    }

    /// Queues a gathered write of `iov` to `fd`, tagged `user`. False if the batch is full.
    ///
    /// # Safety
    ///
    /// `iov` and the memory it describes must stay valid and unchanged until the next
    /// [`complete`](Self::complete) returns.
    pub(crate) unsafe fn writev(&mut self, fd: RawFd, iov: &[libc::iovec], user: u64) -> bool {
        let Ok(n) = u32::try_from(iov.len()) else {
            return false;
        };
        let e = opcode::Writev::new(types::Fd(fd), iov.as_ptr(), n)
            .rw_flags(libc::RWF_NOWAIT)
            .build()
            .user_data(user);
        self.push(&e)
    }

    /// Queues a read of at most `len` bytes from `fd` into `buf`, tagged `user`. False if the
    /// batch is full.
    ///
    /// # Safety
    ///
    /// `buf` must be valid for writes of `len` bytes, and not otherwise accessed, until the
    /// next [`complete`](Self::complete) returns.
    pub(crate) unsafe fn read(&mut self, fd: RawFd, buf: *mut u8, len: u32, user: u64) -> bool {
        let e = opcode::Read::new(types::Fd(fd), buf, len)
            .rw_flags(libc::RWF_NOWAIT)
            .build()
            .user_data(user);
        self.push(&e)
    }

    /// Queues a scattered read from `fd` into `iov`, tagged `user`. False if the batch is
    /// full.
    ///
    /// # Safety
    ///
    /// `iov` and the memory it describes must stay valid, and not otherwise accessed, until
    /// the next [`complete`](Self::complete) returns.
    pub(crate) unsafe fn readv(&mut self, fd: RawFd, iov: &[libc::iovec], user: u64) -> bool {
        let Ok(n) = u32::try_from(iov.len()) else {
            return false;
        };
        let e = opcode::Readv::new(types::Fd(fd), iov.as_ptr(), n)
            .rw_flags(libc::RWF_NOWAIT)
            .build()
            .user_data(user);
        self.push(&e)
    }

    /// Queues a `recvmsg` from socket `fd` into what `msg` describes, tagged `user`. False if
    /// the batch is full.
    ///
    /// # Safety
    ///
    /// `msg`, its iovecs, the memory they describe and its control buffer must stay valid,
    /// and not otherwise accessed, until the next [`complete`](Self::complete) returns.
    pub(crate) unsafe fn recvmsg(&mut self, fd: RawFd, msg: *mut libc::msghdr, user: u64) -> bool {
        let e = opcode::RecvMsg::new(types::Fd(fd), msg)
            .flags(libc::MSG_DONTWAIT as u32)
            .build()
            .user_data(user);
        self.push(&e)
    }

    fn push(&mut self, e: &io_uring::squeue::Entry) -> bool {
        // SAFETY: the entry's buffers are the caller's to keep valid until `complete` (see
        // `writev`, `read` and `readv`), which drains every completion before returning.
        if unsafe { self.ring.submission().push(e) }.is_err() {
            return false;
        }
        self.queued += 1;
        true
    }

    /// Submits what is queued and hands every completion to `each(user, result)` (a result
    /// is the bytes moved or `-errno`), in the order the kernel completed them. Returns the
    /// `io_uring_enter` calls made (0 when nothing was queued; normally 1).
    pub(crate) fn complete(&mut self, mut each: impl FnMut(u64, i32)) -> io::Result<u32> {
        if self.queued == 0 {
            return Ok(0);
        }
        let want = self.queued as usize;
        let mut calls = 0;
        let mut got = 0;
        while got < want {
            // RWF_NOWAIT requests complete during the submission, so this wait returns at
            // once; it only guards against a kernel that would complete one later.
            match self.ring.submit_and_wait(want - got) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            calls += 1;
            for c in self.ring.completion() {
                each(c.user_data(), c.result());
                got += 1;
            }
        }
        self.queued = 0;
        Ok(calls)
    }
}
