//! Notifiers: a kick, call or err eventfd, used without blocking, with counters.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// An eventfd (or anything that behaves like one) owned by a queue.
#[derive(Debug)]
pub struct Notifier {
    file: File,
}

impl Notifier {
    /// Wraps a file received over vhost-user (or created with [`Notifier::new`]).
    pub(crate) fn from_file(file: File) -> Self {
        Self { file }
    }

    /// A fresh non-blocking eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the returned fd is checked and then owned by the File.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
        let file = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
        Ok(Self { file })
    }

    /// Signals once (adds 1). Errors are returned, not panicked on: a peer can close its end.
    #[inline]
    pub fn signal(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local u64 to our own fd.
        let r = unsafe { libc::write(self.file.as_raw_fd(), (&raw const one).cast(), 8) };
        if r == 8 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Reads and clears the counter without blocking; returns how many signals it held
    /// (0 if none, or if the fd is a blocking one the peer gave us and nothing was pending).
    #[inline]
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a local u64 from our own fd.
        let r = unsafe { libc::read(self.file.as_raw_fd(), (&raw mut v).cast(), 8) };
        if r == 8 {
            v
        } else {
            0
        }
    }

    /// Makes the fd non-blocking (fds from a peer may not be).
    pub(crate) fn set_nonblocking(&self) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        // SAFETY: fcntl on our own fd with valid flags.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if fl < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// A duplicate sharing the same counter.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            file: self.file.try_clone()?,
        })
    }
}

impl AsRawFd for Notifier {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// A stop request that threads blocked in `poll` see at once: a flag, and an eventfd signalled
/// when it is set (a listener waiting for frontends, a connector waiting on its session).
/// Waiting costs nothing while nothing happens: no periodic wake-ups, which with a thread per
/// port added up (`docs/scale.md`, idle ports).
#[derive(Debug)]
pub struct Stop {
    flag: std::sync::atomic::AtomicBool,
    wake: Notifier,
}

impl Stop {
    /// Not set.
    pub fn new() -> io::Result<std::sync::Arc<Self>> {
        Ok(std::sync::Arc::new(Self {
            flag: std::sync::atomic::AtomicBool::new(false),
            wake: Notifier::new()?,
        }))
    }

    /// Sets it and wakes every waiter (the eventfd stays readable).
    pub fn set(&self) {
        self.flag.store(true, std::sync::atomic::Ordering::Release);
        let _ = self.wake.signal();
    }

    /// Whether it is set.
    pub fn is_set(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until `fd` has one of `events`, the stop is set, or `timeout` passes (None:
    /// forever). Returns the events `fd` has (0: stopped or timed out; check
    /// [`Stop::is_set`]).
    pub(crate) fn wait(&self, fd: RawFd, events: i16, timeout: Option<std::time::Duration>) -> i16 {
        let mut fds = [
            libc::pollfd {
                fd,
                events,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake.file.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = timeout.map_or(-1, |t| {
            libc::c_int::try_from(t.as_millis()).unwrap_or(libc::c_int::MAX)
        });
        // SAFETY: two valid pollfd entries on fds that outlive the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if r <= 0 {
            return 0;
        }
        fds[0].revents
    }
}
