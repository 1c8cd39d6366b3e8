//! Process helpers: signals, per-process CPU time from the OS.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Fixes glibc's mmap threshold at its default (128 KiB), which turns off its dynamic
/// raising. Without it, the first large block freed (a queue's scratch, sized by its ring:
/// megabytes for a 32768-entry ring) raises the threshold to that size, every later block
/// that large comes from the heap, and small allocations spread over the grown heap keep
/// their pages resident: a frontend that asked for 64 pairs of the largest rings in a loop
/// took the switch from 23 to 130 MB in 400 sessions (docs/robustness.md, the memory bound).
/// With it, large blocks are mapped and unmapped whole and RSS stays flat. Nothing on the
/// packet path allocates, so the cost is a mapping per large block when a queue starts.
pub fn bound_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; called once, before other threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

/// Installs SIGINT/SIGTERM handlers that set a flag [`stopping`] reads.
pub fn install_stop_handler() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_hangup(_: libc::c_int) {
    RELOAD.store(true, Ordering::Relaxed);
}

/// Installs a SIGHUP handler: [`take_reload`] then says a reload was asked for.
pub fn install_reload_handler() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGHUP, on_hangup as *const () as libc::sighandler_t) };
}

/// True once per SIGHUP received since the last call.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::Relaxed)
}

/// Tells the service manager that `state` holds (`READY=1`, `STOPPING=1`, `STATUS=...`), if it
/// started us as a `Type=notify` service: one datagram to the socket named in `NOTIFY_SOCKET`
/// (a path, or an abstract name written with a leading `@`), the protocol `sd_notify(3)`
/// describes. Returns whether the message went out; without `NOTIFY_SOCKET` it does nothing.
pub fn sd_notify(state: &str) -> bool {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::UnixDatagram;
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return false;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return false;
    };
    let sent = match target.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
        }
        None => sock.send_to(state.as_bytes(), std::path::Path::new(&target)),
    };
    sent.is_ok()
}

/// True once SIGINT or SIGTERM arrived.
pub fn stopping() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// user + system CPU time of a process so far, from `/proc/<pid>/stat`.
pub fn cpu_time_of(pid: u32) -> Option<Duration> {
    cpu_time_in(&format!("/proc/{pid}/stat"))
}

/// user + system CPU time of one of this process's threads so far, from
/// `/proc/self/task/<tid>/stat` (`/proc/<tid>/stat` counts the whole process).
pub fn thread_cpu_time(tid: u32) -> Option<Duration> {
    cpu_time_in(&format!("/proc/self/task/{tid}/stat"))
}

fn cpu_time_in(path: &str) -> Option<Duration> {
    let s = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    clock_ticks(ticks)
}

/// `ticks` of the kernel's USER_HZ clock (`/proc` CPU times) as a duration.
fn clock_ticks(ticks: u64) -> Option<Duration> {
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&h| h > 0)?;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

/// Time the hypervisor took from this machine's CPUs (all of them together) so far: the
/// `steal` column of `/proc/stat`. A benchmark point during which it grew measured the host.
pub fn steal_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = s.lines().find(|l| l.starts_with("cpu "))?;
    // cpu user nice system idle iowait irq softirq steal ...
    clock_ticks(cpu.split_whitespace().nth(8)?.parse().ok()?)
}

/// On-CPU time of every thread of a process, exact (scheduler nanoseconds from
/// `/proc/<pid>/task/*/schedstat`), unlike tick-sampled user+sys: what a process that sleeps
/// thousands of times a second really used.
pub fn sched_time_of(pid: u32) -> Option<Duration> {
    let mut ns = 0u64;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let s = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
        ns += s.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(ns))
}

/// Waits for child `pid` (killing it after `timeout`) and returns (exit success, user+sys CPU
/// time) from `wait4`.
pub fn wait_child(pid: u32, timeout: Duration) -> std::io::Result<(bool, Duration)> {
    let deadline = std::time::Instant::now() + timeout;
    let mut status = 0;
    // SAFETY: rusage is plain data, zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    loop {
        // SAFETY: valid pointers to locals; waits only for our own child.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break;
        }
        if r == 0 {
            if std::time::Instant::now() > deadline {
                // SAFETY: signals our own child, which has not been reaped yet.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((ok, tv(ru.ru_utime) + tv(ru.ru_stime)))
}
