//! Listening for frontends (server mode) and connecting to them (client mode): one session
//! thread each, a bound on the sessions a listener runs at once, the socket file's life.

use super::{run_session, BackendConfig, DeviceHooks, PortId, SharedConfig, MAX_SESSIONS};
use crate::eventfd::Stop;
use crate::peer_warn;
use crate::ratelimit::PeerLog;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, info};

/// Accepts frontends on a listening socket (server mode) until `stop` is set, one session
/// thread each. Returns after `max_sessions` sessions have come and gone, if given.
pub fn serve(
    path: &Path,
    cfg: BackendConfig,
    hooks: Arc<dyn DeviceHooks>,
    stop: Arc<Stop>,
    max_sessions: Option<u32>,
) -> std::io::Result<()> {
    let l = Listener::bind(path)?;
    serve_impl(
        l,
        Arc::new(Mutex::new(cfg)),
        hooks,
        stop,
        max_sessions,
        None,
    )
}

/// Like [`serve`] for one switch port, on a socket already bound ([`Listener::bind`]): every
/// frontend that connects gets `port`, one at a time (a second frontend is refused while one
/// is attached), until `stop` is set; then the attached frontend is disconnected and the
/// socket file removed.
pub fn serve_port(
    listener: Listener,
    port: PortId,
    cfg: SharedConfig,
    hooks: Arc<dyn DeviceHooks>,
    stop: Arc<Stop>,
) -> std::io::Result<()> {
    serve_impl(listener, cfg, hooks, stop, None, Some(port))
}

/// How long a switch port's new frontend waits for the previous one's session to finish
/// (a frontend that reconnects at once, as QEMU does, finds the old session still tearing
/// down) before it is refused.
const GRACE: Duration = Duration::from_millis(200);

/// Waits up to `grace` for finished sessions to leave fewer than `limit`; true once they do.
/// With `ending_only`, it waits only while some session is already ending (its socket shut
/// down or hung up: the session closed it, or the peer did): at the session limit a frontend
/// that connects right after others hung up is not refused for sessions still tearing down,
/// and sessions whose peers are all there cost no wait, so a flood past the limit is refused
/// at once. Without it, it waits out the grace (a switch port's frontend reconnecting).
fn sessions_below_within(
    sessions: &mut Vec<(std::thread::JoinHandle<()>, UnixStream)>,
    limit: usize,
    grace: Duration,
    ending_only: bool,
) -> bool {
    let until = std::time::Instant::now() + grace;
    loop {
        sessions.retain(|(t, _)| !t.is_finished());
        if sessions.len() < limit {
            return true;
        }
        if std::time::Instant::now() >= until
            || (ending_only && !sessions.iter().any(|(_, s)| hung_up(s)))
        {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether a session's socket is shut down or its peer hung up (a poll that does not wait).
fn hung_up(s: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a timeout of 0; the fd stays open for the call (borrowed).
    let n = unsafe { libc::poll(&raw mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
}

/// A vhost-user server socket, listening. Bound apart from the accept loop so that a caller
/// (the switch adding a port at runtime) learns at once that the path cannot be bound.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    path: std::path::PathBuf,
    /// The inode bound: at exit only our own socket is unlinked, never one a newer backend
    /// has since bound at the same path.
    ours: Option<u64>,
}

impl Listener {
    /// Binds and listens at `path`, replacing a stale socket file there. Binds under a
    /// temporary name, then renames into place: the path only ever names a socket that is
    /// already listening (bind creates it before listen, and a frontend that connects in
    /// between, as QEMU and tests do the moment the path exists, is refused).
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        if path.exists() {
            std::fs::remove_file(path)?;
        }
        let tmp = path.with_file_name(format!(
            ".{}.{}.tmp",
            path.file_name()
                .map_or_else(|| "pvnet".into(), |n| n.to_string_lossy()),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp)?;
        std::fs::rename(&tmp, path)?;
        let ours = inode(path);
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener,
            path: path.to_path_buf(),
            ours,
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if inode(&self.path) == self.ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The inode `path` names now, if any.
fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path)
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
}

fn serve_impl(
    l: Listener,
    cfg: SharedConfig,
    hooks: Arc<dyn DeviceHooks>,
    stop: Arc<Stop>,
    max_sessions: Option<u32>,
    fixed: Option<PortId>,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (listener, path) = (&l.listener, l.path.as_path());
    info!(socket = %path.display(), "listening for vhost-user frontends");
    let log = Arc::new(PeerLog::default());
    let next = AtomicU32::new(0);
    let mut sessions: Vec<(std::thread::JoinHandle<()>, UnixStream)> = Vec::new();
    // With a bound on sessions, look every 20 ms whether they have all ended; else wake only
    // for a frontend connecting or the stop.
    let tick = max_sessions.map(|_| Duration::from_millis(20));
    while !stop.is_set() {
        sessions.retain(|(t, _)| !t.is_finished());
        if max_sessions.is_some_and(|m| next.load(Ordering::Relaxed) >= m) && sessions.is_empty() {
            break;
        }
        match listener.accept() {
            Ok((stream, _)) if max_sessions.is_some_and(|m| next.load(Ordering::Relaxed) >= m) => {
                peer_warn!(
                    log,
                    "refusing a frontend: this backend serves {} session(s)",
                    max_sessions.unwrap_or(0)
                );
                drop(stream);
            }
            Ok((stream, _))
                if fixed.is_some() && !sessions_below_within(&mut sessions, 1, GRACE, false) =>
            {
                peer_warn!(
                    log,
                    socket = %path.display(),
                    "refusing a frontend: this port already has one attached"
                );
                drop(stream);
            }
            Ok((stream, _))
                if sessions.len() >= MAX_SESSIONS
                    && !sessions_below_within(&mut sessions, MAX_SESSIONS, GRACE, true) =>
            {
                peer_warn!(
                    log,
                    socket = %path.display(),
                    "refusing a frontend: {MAX_SESSIONS} sessions already attached"
                );
                drop(stream);
            }
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                let n = next.fetch_add(1, Ordering::Relaxed);
                let port = fixed.unwrap_or(n);
                info!(port, "frontend connected");
                sessions.push(spawn_session(stream, port, &cfg, &hooks, &log)?);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                stop.wait(listener.as_raw_fd(), libc::POLLIN, tick);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    for (_, s) in &sessions {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    for (t, _) in sessions {
        let _ = t.join();
    }
    Ok(())
}

/// Runs a session for `stream` on a thread of its own, with the port's offer as it is now;
/// returns the thread and a copy of the socket, to shut it down from outside (which ends a
/// session blocked reading a silent frontend).
fn spawn_session(
    stream: UnixStream,
    port: PortId,
    cfg: &SharedConfig,
    hooks: &Arc<dyn DeviceHooks>,
    log: &Arc<PeerLog>,
) -> std::io::Result<(std::thread::JoinHandle<()>, UnixStream)> {
    let handle = stream.try_clone()?;
    let cfg = *cfg.lock().unwrap_or_else(|e| e.into_inner());
    let (hooks, log) = (hooks.clone(), log.clone());
    let t = std::thread::Builder::new()
        .name(format!("vu-ctl-{port}"))
        .spawn(move || run_session(stream, port, cfg, hooks, log))?;
    Ok((t, handle))
}

/// Client mode: connects to a frontend's listening socket (QEMU `server=on`), retrying every
/// `retry` until it answers, and runs the session; then reconnects, until `stop` is set (which
/// also ends a session in progress: the frontend sees the backend disconnect). Every session
/// gets `fixed` if given (a switch port), else 0, 1, 2, ...
pub fn connect_loop(
    path: &Path,
    cfg: SharedConfig,
    hooks: Arc<dyn DeviceHooks>,
    stop: Arc<Stop>,
    retry: Duration,
    fixed: Option<PortId>,
) {
    use std::os::fd::AsRawFd;
    let mut n = 0;
    let log = Arc::new(PeerLog::default());
    while !stop.is_set() {
        match UnixStream::connect(path) {
            Ok(stream) => {
                let port = fixed.unwrap_or(n);
                info!(socket = %path.display(), port, "connected to frontend");
                let Ok((t, handle)) = spawn_session(stream, port, &cfg, &hooks, &log) else {
                    continue;
                };
                // Sleep until the frontend hangs up or the stop (then shut the socket down:
                // that ends a session blocked reading it); a session that ended by itself
                // (a violation) is seen within a second.
                while !t.is_finished() {
                    if stop.is_set() {
                        let _ = handle.shutdown(std::net::Shutdown::Both);
                        break;
                    }
                    stop.wait(
                        handle.as_raw_fd(),
                        libc::POLLRDHUP,
                        Some(Duration::from_secs(1)),
                    );
                    if !t.is_finished() && !stop.is_set() {
                        // Hung up (or a second passed): give the session a moment to end.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                let _ = t.join();
                n += 1;
            }
            Err(e) => {
                debug!(socket = %path.display(), "connect failed ({e}), retrying");
                stop.wait(-1, 0, Some(retry));
            }
        }
    }
}
