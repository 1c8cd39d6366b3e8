//! The operating system, in one place: epoll, the timer, eventfds, CPU pinning and the tap
//! device ([`tap`]), `AF_PACKET` sockets ([`packet`]), `AF_XDP` sockets and their XDP program ([`xdp`]), batched I/O on both ([`uring`]), UDP sockets moved in batches ([`udp`]) and
//! zero-filled pages from the kernel ([`pages`]). Built on `vmm-sys-util` where it has the call; the rest of the dataplane
//! makes no syscall of its own.

pub mod packet;
pub(crate) mod pages;
pub mod tap;
pub mod udp;
pub(crate) mod uring;
pub mod xdp;

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;
use tracing::debug;
use vmm_sys_util::epoll::{ControlOperation, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

pub(crate) use vmm_sys_util::eventfd::EventFd;

/// An epoll set whose events carry a `u64` token, level-triggered, readable only.
#[derive(Debug)]
pub(crate) struct Epoll(vmm_sys_util::epoll::Epoll);

impl Epoll {
    /// A new, empty set.
    pub(crate) fn new() -> io::Result<Self> {
        vmm_sys_util::epoll::Epoll::new().map(Self)
    }

    /// Watches `fd` for input; its events carry `token`. A failure is logged, not returned:
    /// the fd is then polled, never waited on, which costs latency, not correctness.
    pub(crate) fn add(&self, fd: RawFd, token: u64) {
        let ev = EpollEvent::new(EventSet::IN, token);
        if let Err(e) = self.0.ctl(ControlOperation::Add, fd, ev) {
            debug!("epoll add {fd}: {e}");
        }
    }

    /// Stops watching `fd`.
    pub(crate) fn remove(&self, fd: RawFd) {
        if let Err(e) = self
            .0
            .ctl(ControlOperation::Delete, fd, EpollEvent::default())
        {
            debug!("epoll delete {fd}: {e}");
        }
    }

    /// Waits for events (`timeout_ms` -1: forever); returns the tokens of those that fired,
    /// written into `out` (at most its length). An interrupted wait returns none.
    pub(crate) fn wait(&self, timeout_ms: i32, evs: &mut [EpollEvent]) -> usize {
        self.0.wait(timeout_ms, evs).unwrap_or(0)
    }
}

/// A one-shot monotonic timer to put in an epoll set: epoll's own timeout has millisecond
/// resolution, too coarse for `timer:<us>` policies and call coalescing.
#[derive(Debug)]
pub(crate) struct Timer(TimerFd);

impl Timer {
    /// A disarmed timer.
    pub(crate) fn new() -> io::Result<Self> {
        TimerFd::new().map(Self).map_err(io::Error::from)
    }

    /// Fires once after `d` (at least 1 ns: zero would disarm it).
    pub(crate) fn set(&mut self, d: Duration) {
        // A failure only means a late wake-up (the next event wakes the worker anyway).
        let _ = self.0.reset(d.max(Duration::from_nanos(1)), None);
    }

    /// Disarms it and forgets an expiry not yet read (setting a timerfd resets its count), so
    /// a level-triggered epoll stops reporting it.
    pub(crate) fn clear(&mut self) {
        let _ = self.0.clear();
    }

    /// The fd, for the epoll set.
    pub(crate) fn fd(&self) -> RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.0)
    }
}

/// Pins the calling thread to one CPU (`sched_setaffinity`). Returns false if it failed (a
/// 1-CPU machine, a CPU outside the set); never panics.
#[cfg(target_os = "linux")]
pub fn pin_current_thread(cpu: usize) -> bool {
    let Ok(setsize) = usize::try_from(libc::CPU_SETSIZE) else {
        return false;
    };
    if cpu >= setsize {
        return false;
    }
    // SAFETY: cpu_set_t is a plain array of integers; all-zero bytes is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu < CPU_SETSIZE` (checked above), so CPU_SET stays inside `set`'s bit array.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 names the calling thread; `set` is an initialised cpu_set_t that lives
    // across the call and the size passed is exactly its size. The kernel only reads it.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    rc == 0
}

/// Takes `avoid` out of the calling thread's CPU set (threads it starts later inherit the
/// result), unless that would leave no CPU. Returns the CPUs it keeps, or `None` if it
/// changed nothing.
#[cfg(target_os = "linux")]
pub(crate) fn avoid_cpus(avoid: &[usize]) -> Option<Vec<usize>> {
    let setsize = usize::try_from(libc::CPU_SETSIZE).ok()?;
    // SAFETY: cpu_set_t is a plain array of integers; all-zero bytes is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return None;
    }
    let has = |s: &libc::cpu_set_t, c: usize| {
        // SAFETY: every index passed is < CPU_SETSIZE, inside the set's bit array.
        unsafe { libc::CPU_ISSET(c, s) }
    };
    let keep: Vec<usize> = (0..setsize)
        .filter(|&c| has(&set, c) && !avoid.contains(&c))
        .collect();
    if keep.is_empty() || !avoid.iter().any(|&c| c < setsize && has(&set, c)) {
        return None;
    }
    for &c in avoid.iter().filter(|&&c| c < setsize) {
        // SAFETY: c < CPU_SETSIZE.
        unsafe { libc::CPU_CLR(c, &mut set) };
    }
    // SAFETY: as for sched_getaffinity above; the kernel only reads `set`.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    (rc == 0).then_some(keep)
}

/// Not supported on this OS: changes nothing.
#[cfg(not(target_os = "linux"))]
pub fn avoid_cpus(avoid: &[usize]) -> Option<Vec<usize>> {
    let _ = avoid;
    None
}

/// Pins the calling thread to one CPU. Not supported on this OS: always false.
#[cfg(not(target_os = "linux"))]
pub fn pin_current_thread(cpu: usize) -> bool {
    let _ = cpu;
    false
}

/// The CPU the calling thread runs on now (0 if unknown).
pub(crate) fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0)
}

/// CPUs online (at least 1).
pub(crate) fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) })
        .unwrap_or(1)
        .max(1)
}

/// The machine's CPU time so far, from `/proc/stat`, in ticks: what was to spare (idle and
/// iowait) and the total. None if it cannot be read. (Time of niced processes is not spare:
/// a frontend may be niced, and a worker that polls takes all of its CPU.)
pub(crate) fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_ticks(stat.lines().next()?)
}

/// [`cpu_ticks`] of `/proc/stat`'s first line (`cpu  user nice system idle iowait irq softirq
/// steal ...`; guest time is inside user).
fn parse_cpu_ticks(line: &str) -> Option<(u64, u64)> {
    let mut f = line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
    if v.len() < 5 {
        return None;
    }
    Some((v[3] + v[4], v.iter().sum()))
}

#[cfg(test)]
mod cpu_tests {
    #[test]
    fn spare_and_total_ticks_of_proc_stat() {
        let l = "cpu  100 20 30 400 5 6 7 8 9 10";
        assert_eq!(super::parse_cpu_ticks(l), Some((405, 576)));
        assert_eq!(super::parse_cpu_ticks("cpu0 1 2 3 4 5"), None);
        assert_eq!(super::parse_cpu_ticks("cpu  1 2"), None);
        assert!(super::cpu_ticks().is_some_and(|(s, t)| s <= t && t > 0));
    }
}
