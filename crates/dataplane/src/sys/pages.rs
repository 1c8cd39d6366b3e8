//! Zero-filled memory straight from the kernel.

use std::ptr::NonNull;

/// Anonymous private pages, zero-filled by the kernel: they cost nothing until touched, and go
/// back to the kernel on drop. A `vec![0; n]` of the same size may instead be carved from a
/// heap the allocator keeps (glibc does once its mmap threshold has grown past `n`), which it
/// must clear, touching every page, and which stays resident after the free: a port's egress
/// queue (6 MiB) would then cost its whole size for as long as the process lives, used or not.
#[derive(Debug)]
pub(crate) struct Pages {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Pages` owns its mapping exclusively, like a `Vec<u8>`: moving it to another thread
// or sharing `&Pages` (read-only access) is as safe as for a `Vec<u8>`.
unsafe impl Send for Pages {}
// SAFETY: see `Send`: shared references only read.
unsafe impl Sync for Pages {}

impl Pages {
    /// `len` zero bytes. Panics if the kernel has no address space left (as `vec!` aborts).
    pub(crate) fn zeroed(len: usize) -> Self {
        if len == 0 {
            return Self {
                ptr: NonNull::dangling(),
                len,
            };
        }
        // SAFETY: a fresh private anonymous mapping chosen by the kernel; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap of {len} bytes: {}",
            std::io::Error::last_os_error()
        );
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap returned null");
        Self { ptr, len }
    }
}

impl std::ops::Deref for Pages {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes (the mapping, or dangling with len 0) for as
        // long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Pages {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: exactly the mapping made in `zeroed`; nothing borrows it any more.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_zero_writable_and_sized() {
        let mut p = Pages::zeroed(3 * 4096 + 5);
        assert_eq!(p.len(), 3 * 4096 + 5);
        assert!(p.iter().all(|&b| b == 0));
        p[4096] = 7;
        assert_eq!(p[4096], 7);
        assert!(Pages::zeroed(0).is_empty());
    }
}
