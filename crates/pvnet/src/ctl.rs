//! The control channel of `pvnet switch` and its client, `pvnet ctl`; Prometheus metrics.
//!
//! The switch hands [`serve_ctl`] (and optionally [`serve_metrics`]) a closure that produces
//! its current [`Status`], and [`serve_ctl`] one that applies changes ([`Op`]); each server
//! runs on one thread of its own and never touches the dataplane itself.
//!
//! Protocol on the control socket (a Unix stream socket; docs/operations.md): the client
//! sends one request line and the server answers with one line of JSON and closes.
//! - Version 1, a JSON object: `{"version":1,"op":"port-add","spec":"KIND:key=value,..."}`,
//!   `{"version":1,"op":"port-del","name":"vm1"}`,
//!   `{"version":1,"op":"port-set","name":"vm1","set":{"qdisc":"fifo"}}`,
//!   `{"version":1,"op":"reload"}`, `{"version":1,"op":"status"}`; answered by a [`Reply`]:
//!   `{"version":1,"ok":true,"result":"added",...}` or `{"version":1,"ok":false,"error":...}`.
//! - The bare words `status`, `ports` and `macs` (the first protocol, kept): the whole
//!   [`Status`], or `{"error":"..."}`.
//!
//! Only the switch's own user (and root, and the members of the group the switch was given)
//! may talk to it: the socket is created 0600 (0660 with a group) and each connection's peer
//! credentials (`SO_PEERCRED`) are checked.

use crate::error::{failed, Error, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where `pvnet switch` listens for control requests unless told otherwise.
pub const DEFAULT_CTL_SOCKET: &str = "/run/pvnet/ctl.sock";

/// How often the accept loops look at `stop` when no client is waiting.
const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// Longest a client may take to send its request, and the server its answer.
const IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest request line / HTTP request head read.
const MAX_REQUEST: usize = 8192;
/// Longest the `pvnet ctl` client waits for an answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The switch's state as `pvnet ctl` and the metrics endpoint see it.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct Status {
    /// Seconds since the switch started.
    pub uptime_secs: f64,
    /// Every port, in the switch's order.
    pub ports: Vec<PortInfo>,
    /// The learned MAC address table.
    pub macs: Vec<MacInfo>,
    /// The dataplane's worker threads.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerRow>,
}

/// One dataplane worker thread.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct WorkerRow {
    /// Its index.
    pub worker: usize,
    /// The CPU it is pinned to, if it is.
    pub cpu: Option<usize>,
    /// Its CPU time since the switch started (user + system), seconds.
    pub cpu_secs: f64,
    /// That time as a share of the switch's uptime, percent (a worker that polls all the
    /// time is at 100).
    pub busy_pct: f64,
    /// The ports placed on it.
    pub ports: Vec<String>,
    /// Packets it handed to other workers, and that they handed to it.
    pub handoff_out: u64,
    /// See `handoff_out`.
    pub handoff_in: u64,
    /// Share of the last second it spent in rounds that moved packets, percent (what
    /// placement and rebalancing go by: polling empty rings is not load).
    pub load_pct: f64,
    /// Time it spent in rounds that moved packets since the switch started, seconds.
    pub busy_secs: f64,
    /// Ports moved onto it, and off it.
    pub moved_in: u64,
    /// See `moved_in`.
    pub moved_out: u64,
}

/// One switch port.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct PortInfo {
    /// Port name, unique within the switch.
    pub name: String,
    /// `vhost-user`, `tap`, `sink`, `gen`, ...
    pub kind: String,
    /// `up`, `down`, `listening`, ...
    pub state: String,
    /// Socket path, interface name, ...
    pub detail: String,
    /// Flat counter map (`rx_packets`, `tx_bytes`, `drops_no_buffer`, ...); rendered
    /// generically, so a new counter needs no change here.
    pub counters: BTreeMap<String, u64>,
    /// Why a queue of the port was last stopped (the rule its peer broke), if one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Each queue pair's counters (`rx_packets`, `tx_packets`, `drops`, ...), when the port
    /// has more than one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<BTreeMap<String, u64>>,
}

/// One learned MAC address.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct MacInfo {
    /// `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// Name of the port it was learned on.
    pub port: String,
    /// Seconds since a frame from it was last seen.
    pub age_secs: f64,
}

/// Produces the switch's current status; called on the server thread once per request.
pub type StatusFn = Arc<dyn Fn() -> Status + Send + Sync>;

/// The control protocol's version (the `version` of requests and replies).
pub const PROTOCOL_VERSION: u32 = 1;

/// A request of the JSON protocol.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Request {
    /// Protocol version the client speaks; the server refuses a newer one.
    pub version: u32,
    /// What to do.
    #[serde(flatten)]
    pub op: Op,
}

/// What a request asks for.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Op {
    /// The whole status (as the bare word `status`).
    Status,
    /// Add a port, `KIND:key=value,...` as `pvnet switch --port`. Idempotent: an identical
    /// port of that name is `exists`; a different one is an error.
    PortAdd {
        /// The port spec.
        spec: String,
    },
    /// Delete a port: its frontend is disconnected, what was in flight counted. Deleting a
    /// port that is not there is `absent`, not an error.
    PortDel {
        /// Port name.
        name: String,
    },
    /// Change settings of a port (`key=value` as in its spec).
    PortSet {
        /// Port name.
        name: String,
        /// Keys and values.
        set: BTreeMap<String, String>,
    },
    /// Move a vhost-user port to another worker (with its rings, queue and counters).
    PortMove {
        /// Port name.
        name: String,
        /// The worker's index.
        worker: usize,
    },
    /// Read the configuration file again and apply the difference (as `SIGHUP`).
    Reload,
}

/// The answer to a [`Request`].
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct Reply {
    /// [`PROTOCOL_VERSION`].
    pub version: u32,
    /// Whether the request was carried out.
    pub ok: bool,
    /// What happened: `added`, `exists`, `deleted`, `absent`, `changed`, `unchanged`,
    /// `reloaded`, `status`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Why not (with `ok: false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Details: what changed, what applies when.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The port concerned (a deleted port: its last counters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<PortInfo>,
    /// The status (`op: status`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

impl Reply {
    /// A successful reply.
    pub fn done(result: &str) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            ok: true,
            result: Some(result.into()),
            ..Self::default()
        }
    }
    /// A refusal.
    pub fn refused(error: impl Into<String>) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            ok: false,
            error: Some(error.into()),
            ..Self::default()
        }
    }
}

/// Applies a change; called on the control thread, one request at a time.
pub type ApplyFn = Arc<dyn Fn(&Op) -> Reply + Send + Sync>;

/// What the control socket serves and to whom.
#[derive(Clone)]
pub struct Server {
    /// The status.
    pub status: StatusFn,
    /// Changes (None: a read-only switch; change requests are refused).
    pub apply: Option<ApplyFn>,
    /// A group whose members may use the socket besides its owner (mode 0660, not 0600).
    pub group: Option<u32>,
}

impl Server {
    /// A server that answers status requests only.
    #[cfg(test)]
    pub fn read_only(status: StatusFn) -> Self {
        Self {
            status,
            apply: None,
            group: None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Connection helpers shared by both servers.

/// A connected stream whose timeouts can be set (Unix or TCP).
trait Conn: Read + Write {
    fn read_timeout_to(&self, d: Duration) -> io::Result<()>;
    fn write_timeout_to(&self, d: Duration) -> io::Result<()>;
}

impl Conn for UnixStream {
    fn read_timeout_to(&self, d: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(d))
    }
    fn write_timeout_to(&self, d: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(d))
    }
}

impl Conn for TcpStream {
    fn read_timeout_to(&self, d: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(d))
    }
    fn write_timeout_to(&self, d: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(d))
    }
}

fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "client too slow"))
    } else {
        Ok(left)
    }
}

/// Reads until `complete(bytes so far)`, end of stream, [`MAX_REQUEST`] bytes or the deadline
/// (an error), whichever comes first: a client dribbling bytes cannot hold the server longer
/// than [`IO_TIMEOUT`].
fn read_request(c: &mut impl Conn, complete: fn(&[u8]) -> bool) -> io::Result<Vec<u8>> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !complete(&buf) {
        if buf.len() >= MAX_REQUEST {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request too long",
            ));
        }
        c.read_timeout_to(time_left(deadline)?)?;
        match c.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

/// `write_all` bounded by [`IO_TIMEOUT`] in total, not per write.
fn write_response(c: &mut impl Conn, mut data: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + IO_TIMEOUT;
    while !data.is_empty() {
        c.write_timeout_to(time_left(deadline)?)?;
        match c.write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    c.flush()
}

/// Calls the status closure; a panic in it fails this one request, not the server thread.
fn current_status(status: &StatusFn) -> Option<Status> {
    match catch_unwind(AssertUnwindSafe(|| status())) {
        Ok(s) => Some(s),
        Err(_) => {
            tracing::warn!("status function panicked");
            None
        }
    }
}

/// Accept loop shared by both servers: nonblocking accept polled every [`ACCEPT_POLL`] so
/// `stop` is seen, each connection handled to completion (bounded by the I/O timeouts) on
/// this same thread.
fn accept_loop<S>(
    what: &str,
    stop: &AtomicBool,
    mut accept: impl FnMut() -> io::Result<S>,
    mut handle: impl FnMut(S) -> io::Result<()>,
) {
    while !stop.load(Ordering::Relaxed) {
        match accept() {
            Ok(conn) => {
                if let Err(e) = handle(conn) {
                    tracing::debug!("{what}: client: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // EMFILE and friends: do not spin, try again later.
                tracing::warn!("{what}: accept: {e}");
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Control socket server.

/// Removes the control socket when the server thread ends (or fails to start), but only if
/// the path still names the socket this server bound: a later switch's socket is left alone.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
    id: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Binds the control socket at `path` atomically: a stale socket file (nobody accepting) is
/// removed, a live one is an error (`AddrInUse`: another switch owns it), anything else at
/// `path` is an error (`AlreadyExists`) and left alone. The socket is bound under a temporary
/// name in the same directory and renamed into place, so `path` only ever names a socket
/// that is already listening.
fn bind_ctl(path: &Path, group: Option<u32>) -> io::Result<(UnixListener, SocketFile)> {
    let ctx = |e: io::Error, what: &str| io::Error::new(e.kind(), format!("{what}: {e}"));
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{}: another switch is listening there", path.display()),
                ));
            }
            std::fs::remove_file(path)
                .map_err(|e| ctx(e, &format!("removing stale {}", path.display())))?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(ctx(e, &path.display().to_string())),
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| ctx(e, &format!("creating {}", dir.display())))?;
    static SEQ: AtomicU32 = AtomicU32::new(0);
    // Short on purpose: a socket path has to fit in sun_path (108 bytes).
    let tmp = dir.join(format!(
        ".pvnet-{}-{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&tmp);
    let listener =
        UnixListener::bind(&tmp).map_err(|e| ctx(e, &format!("binding {}", tmp.display())))?;
    // Owner only (and a group if given), set before the socket is reachable at `path`.
    let limit = || -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if let Some(g) = group {
            std::os::unix::fs::chown(&tmp, None, Some(g))?;
        }
        let mode = if group.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
    };
    if let Err(e) = limit() {
        let _ = std::fs::remove_file(&tmp);
        return Err(ctx(e, &format!("restricting {}", tmp.display())));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(ctx(
            e,
            &format!("renaming {} to {}", tmp.display(), path.display()),
        ));
    }
    let m = std::fs::symlink_metadata(path)?;
    let file = SocketFile {
        path: path.to_path_buf(),
        id: (m.dev(), m.ino()),
    };
    listener.set_nonblocking(true)?;
    Ok((listener, file))
}

/// The JSON line answering one control request.
fn ctl_answer(req: &str, server: &Server) -> String {
    let status = &server.status;
    let mut out = if req.starts_with('{') {
        let reply = match serde_json::from_str::<Request>(req) {
            Err(e) => Reply::refused(format!("bad request: {e}")),
            Ok(r) if r.version > PROTOCOL_VERSION || r.version == 0 => Reply::refused(format!(
                "protocol version {} not supported (this switch speaks 1..={PROTOCOL_VERSION})",
                r.version
            )),
            Ok(Request { op: Op::Status, .. }) => match current_status(status) {
                Some(s) => Reply {
                    status: Some(s),
                    ..Reply::done("status")
                },
                None => Reply::refused("status unavailable (status function panicked)"),
            },
            Ok(r) => match &server.apply {
                None => Reply::refused("this switch takes no changes"),
                Some(apply) => {
                    catch_unwind(AssertUnwindSafe(|| apply(&r.op))).unwrap_or_else(|_| {
                        Reply::refused("the request failed inside the switch (see its log)")
                    })
                }
            },
        };
        serde_json::to_string(&reply).unwrap_or_else(|e| {
            serde_json::json!({ "version": PROTOCOL_VERSION, "ok": false, "error": e.to_string() })
                .to_string()
        })
    } else {
        match req {
            "status" | "ports" | "macs" => match current_status(status) {
                Some(s) => serde_json::to_string(&s).unwrap_or_else(|e| {
                    serde_json::json!({ "error": format!("cannot encode status: {e}") }).to_string()
                }),
                None => {
                    serde_json::json!({ "error": "status unavailable (status function panicked)" })
                        .to_string()
                }
            },
            other => serde_json::json!({
                "error": format!("unknown request '{other}' (status|ports|macs, or a JSON request)")
            })
            .to_string(),
        }
    };
    out.push('\n');
    out
}

/// The peer's uid and gid (`SO_PEERCRED`).
fn peer_cred(c: &UnixStream) -> io::Result<(u32, u32)> {
    use std::os::fd::AsRawFd;
    // SAFETY: ucred is plain data; getsockopt writes at most `len` bytes into it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(size_of::<libc::ucred>())
        .map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: valid pointers to locals of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.uid, cred.gid))
}

/// Whether a peer with `uid`/`gid` may use the control socket: root, the switch's own user,
/// or the configured group.
fn peer_allowed((uid, gid): (u32, u32), group: Option<u32>) -> bool {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    uid == 0 || uid == me || group == Some(gid)
}

fn handle_ctl(mut c: UnixStream, server: &Server) -> io::Result<()> {
    // Accepted sockets do not inherit O_NONBLOCK on Linux; make sure on every platform.
    c.set_nonblocking(false)?;
    let cred = peer_cred(&c)?;
    if !peer_allowed(cred, server.group) {
        tracing::warn!(
            uid = cred.0,
            gid = cred.1,
            "control request refused: not the switch's user nor its group"
        );
        let reply = Reply::refused(format!(
            "permission denied: uid {} is not allowed on this control socket",
            cred.0
        ));
        let line = serde_json::to_string(&reply).unwrap_or_default() + "\n";
        return write_response(&mut c, line.as_bytes());
    }
    let buf = read_request(&mut c, |b| b.contains(&b'\n'))?;
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    let req = String::from_utf8_lossy(line);
    write_response(&mut c, ctl_answer(req.trim(), server).as_bytes())
}

/// Serves control requests on a Unix stream socket at `path` until `stop` is set, on one
/// thread named `pvnet-ctl`. See [`bind_ctl`] for what happens to an existing file at
/// `path`. The socket file is removed when the thread ends.
pub fn serve_ctl(path: &Path, server: Server, stop: Arc<AtomicBool>) -> io::Result<JoinHandle<()>> {
    let (listener, file) = bind_ctl(path, server.group)?;
    std::thread::Builder::new()
        .name("pvnet-ctl".into())
        .spawn(move || {
            let _file = file;
            accept_loop(
                "ctl",
                &stop,
                || listener.accept().map(|(c, _)| c),
                |c| handle_ctl(c, &server),
            );
        })
}

// ---------------------------------------------------------------------------------------
// Client.

/// Sends one request line to the switch listening on `path`; returns its answer line.
fn exchange(path: &Path, req: &str) -> Result<String> {
    let p = path.display();
    if req.contains(['\n', '\r']) {
        return Err(crate::error::usage(format!(
            "request {req:?} contains a line break"
        )));
    }
    let c = UnixStream::connect(path).map_err(|source| {
        let what = match source.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                format!("no switch listening on {p}")
            }
            io::ErrorKind::PermissionDenied => {
                format!("{p}: permission denied (the switch's user, root or its ctl_group only)")
            }
            _ => format!("cannot connect to {p}"),
        };
        Error::Io { what, source }
    })?;
    let io_err = crate::error::io(&p);
    let talk = || -> io::Result<String> {
        c.set_read_timeout(Some(CLIENT_TIMEOUT))?;
        c.set_write_timeout(Some(CLIENT_TIMEOUT))?;
        (&c).write_all(format!("{req}\n").as_bytes())?;
        let mut line = String::new();
        BufReader::new(&c).read_line(&mut line)?;
        Ok(line)
    };
    let line = talk().map_err(io_err)?;
    if line.trim().is_empty() {
        return Err(failed(format!(
            "{p}: the switch closed the connection without answering"
        )));
    }
    Ok(line)
}

/// Sends one status request (`status`, `ports` or `macs`) to the switch listening on `path`.
pub fn request(path: &Path, req: &str) -> Result<Status> {
    let p = path.display();
    let line = exchange(path, req)?;
    let v: serde_json::Value =
        serde_json::from_str(&line).map_err(|e| failed(format!("{p}: bad answer: {e}")))?;
    if let Some(err) = v.get("error") {
        let msg = err.as_str().map_or_else(|| err.to_string(), str::to_owned);
        return Err(failed(format!("switch on {p}: {msg}")));
    }
    serde_json::from_value(v).map_err(|e| failed(format!("{p}: bad status: {e}")))
}

/// Sends a versioned request; an answer with `ok: false` is an error.
pub fn change(path: &Path, op: Op) -> Result<Reply> {
    let p = path.display();
    let req = serde_json::to_string(&Request {
        version: PROTOCOL_VERSION,
        op,
    })?;
    let line = exchange(path, &req)?;
    let r: Reply =
        serde_json::from_str(&line).map_err(|e| failed(format!("{p}: bad answer: {e}")))?;
    if !r.ok {
        return Err(failed(format!(
            "switch on {p}: {}",
            r.error.as_deref().unwrap_or("refused")
        )));
    }
    Ok(r)
}

// ---------------------------------------------------------------------------------------
// `pvnet ctl`.

/// What `pvnet ctl` does.
#[derive(Debug, Clone, clap::Subcommand, PartialEq, Eq)]
pub enum CtlCmd {
    /// Ports: kind, state, packet/byte/drop/notification counters (the default).
    Ports,
    /// The learned MAC address table.
    Macs,
    /// Add, delete or change a port while the switch runs.
    #[command(subcommand)]
    Port(PortCmd),
    /// Read the switch's configuration file again and apply the difference (as SIGHUP).
    Reload,
}

/// `pvnet ctl port ...`.
#[derive(Debug, Clone, clap::Subcommand, PartialEq, Eq)]
pub enum PortCmd {
    /// Add a port: KIND:key=value,... as `pvnet switch --port` (see `pvnet switch --help`).
    /// Adding a port identical to one there succeeds ("exists"); a different port of that
    /// name is refused.
    Add {
        /// The port spec, e.g. vhost-user:name=vm1,socket=/run/vm1.sock
        spec: String,
    },
    /// Delete a port: its frontend is disconnected, what waited for it counted as dropped;
    /// prints its last counters. A port that is not there: "absent", not an error.
    Del {
        /// Port name.
        name: String,
    },
    /// Change a vhost-user port's settings: egress (qdisc, dql, bulk, limit) at once;
    /// offloads and queue_pairs from its frontend's next connection.
    Set {
        /// Port name.
        name: String,
        /// key=value, one or more.
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
    /// Move a vhost-user port to another worker (`pvnet switch --workers N`): its rings,
    /// egress queue, counters and learned addresses go along, the other workers paused for
    /// the move (about 0.1 ms here); no packet is lost or reordered by it. The balancer
    /// may move it again later unless `--rebalance false`.
    Move {
        /// Port name.
        name: String,
        /// The worker's index (as `pvnet ctl` lists them).
        worker: usize,
    },
}

/// `pvnet ctl` arguments.
#[derive(Args, Debug, Clone)]
#[command(after_help = "\
EXAMPLES:
  pvnet ctl                                  ports and their counters
  pvnet ctl port add vhost-user:name=vm2,socket=/run/pvnet/vm2.sock
  pvnet ctl port set vm2 qdisc=fifo limit=256
  pvnet ctl port del vm2
  pvnet ctl port move vm2 1                  put vm2 on worker 1
  pvnet ctl reload                           apply the edited --config file

The protocol (one JSON line each way, versioned) is in docs/operations.md.")]
pub struct CtlArgs {
    /// The switch's control socket.
    #[arg(long, default_value = DEFAULT_CTL_SOCKET, global = true)]
    pub socket: PathBuf,
    /// Print JSON instead of a table: the switch's whole status (every counter, the MAC
    /// table, uptime), or the reply to a change.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do (default: ports).
    #[command(subcommand)]
    pub cmd: Option<CtlCmd>,
}

/// `key=value` settings as a map.
fn settings(kv: &[String]) -> Result<BTreeMap<String, String>> {
    kv.iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| crate::error::usage(format!("'{s}' is not key=value")))
        })
        .collect()
}

/// A change's reply as a person reads it.
fn render_reply(r: &Reply) -> String {
    let mut o = r.result.clone().unwrap_or_default();
    if let Some(p) = &r.port {
        let _ = write!(o, ": {} ({})", p.name, p.kind);
    }
    o.push('\n');
    for n in &r.notes {
        let _ = writeln!(o, "  {n}");
    }
    if let Some(p) = r
        .port
        .as_ref()
        .filter(|_| r.result.as_deref() == Some("deleted"))
    {
        let c: Vec<String> = p
            .counters
            .iter()
            .filter(|(_, &v)| v != 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(o, "  last counters: {}", c.join(" "));
    }
    o
}

/// Runs `pvnet ctl`: asks the switch and prints a table or the JSON.
pub fn run(a: &CtlArgs) -> Result<()> {
    let cmd = a.cmd.clone().unwrap_or(CtlCmd::Ports);
    let op = match &cmd {
        CtlCmd::Ports | CtlCmd::Macs => None,
        CtlCmd::Reload => Some(Op::Reload),
        CtlCmd::Port(PortCmd::Add { spec }) => Some(Op::PortAdd { spec: spec.clone() }),
        CtlCmd::Port(PortCmd::Del { name }) => Some(Op::PortDel { name: name.clone() }),
        CtlCmd::Port(PortCmd::Set { name, settings: kv }) => Some(Op::PortSet {
            name: name.clone(),
            set: settings(kv)?,
        }),
        CtlCmd::Port(PortCmd::Move { name, worker }) => Some(Op::PortMove {
            name: name.clone(),
            worker: *worker,
        }),
    };
    let out = match op {
        Some(op) => {
            let r = change(&a.socket, op)?;
            if a.json {
                serde_json::to_string(&r)? + "\n"
            } else {
                render_reply(&r)
            }
        }
        None => {
            let s = request(
                &a.socket,
                if cmd == CtlCmd::Macs { "macs" } else { "ports" },
            )?;
            if a.json {
                serde_json::to_string(&s)? + "\n"
            } else if cmd == CtlCmd::Macs {
                render_macs(&s)
            } else {
                render_ports(&s)
            }
        }
    };
    match io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(crate::error::io("stdout")(e)),
        _ => Ok(()),
    }
}

/// A table cell: control characters (a newline in a port name, a terminal escape) are shown
/// escaped instead of breaking the table or reaching the terminal.
fn cell(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for ch in v.chars() {
        if ch.is_control() {
            o.extend(ch.escape_debug());
        } else {
            o.push(ch);
        }
    }
    o
}

/// Columns separated by two spaces; `right[i]` right-aligns column i; the last column is
/// not padded.
fn render_table(head: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (wi, cell) in w.iter_mut().zip(r) {
            *wi = (*wi).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let head: Vec<String> = head.iter().map(|h| (*h).to_owned()).collect();
    for r in std::iter::once(&head).chain(rows) {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let last = i + 1 == r.len();
            match (right.get(i).copied().unwrap_or(false), last) {
                (true, _) => {
                    let _ = write!(line, "{cell:>0$}", w[i]);
                }
                (false, false) => {
                    let _ = write!(line, "{cell:<0$}", w[i]);
                }
                (false, true) => line.push_str(cell),
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Sum of every `drops*` counter, `None` when the port has none.
fn drops(counters: &BTreeMap<String, u64>) -> Option<u64> {
    counters
        .iter()
        .filter(|(k, _)| k.as_str() == "drops" || k.starts_with("drops_"))
        .map(|(_, v)| *v)
        .reduce(u64::saturating_add)
}

/// The `pvnet ctl ports` table. Counters a port does not have show as `-`.
pub fn render_ports(s: &Status) -> String {
    let head = [
        "NAME", "KIND", "STATE", "RX_PKTS", "RX_BYTES", "TX_PKTS", "TX_BYTES", "DROPS", "QUEUED",
        "KICKS", "CALLS", "DETAIL",
    ];
    let right = [
        false, false, false, true, true, true, true, true, true, true, true, false,
    ];
    let num = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    let mut rows: Vec<Vec<String>> = Vec::new();
    for p in &s.ports {
        let c = |k: &str| num(p.counters.get(k).copied());
        rows.push(vec![
            cell(&p.name),
            cell(&p.kind),
            cell(&p.state),
            c("rx_packets"),
            c("rx_bytes"),
            c("tx_packets"),
            c("tx_bytes"),
            num(drops(&p.counters)),
            c("backlog"),
            c("kicks"),
            c("calls"),
            cell(&p.detail),
        ]);
        // A multiqueue port: one row per queue pair under it.
        for (k, q) in p.queues.iter().enumerate() {
            let c = |n: &str| num(q.get(n).copied());
            rows.push(vec![
                format!("  q{k}"),
                String::new(),
                String::new(),
                c("rx_packets"),
                c("rx_bytes"),
                c("tx_packets"),
                c("tx_bytes"),
                c("drops"),
                "-".into(),
                c("kicks"),
                c("calls"),
                String::new(),
            ]);
        }
    }
    let mut out = render_table(&head, &right, &rows);
    for p in &s.ports {
        if let Some(e) = &p.error {
            out += &format!("{}: {}\n", cell(&p.name), cell(e));
        }
    }
    if s.workers.len() > 1 {
        let rows: Vec<Vec<String>> = s
            .workers
            .iter()
            .map(|w| {
                vec![
                    w.worker.to_string(),
                    w.cpu.map_or_else(|| "-".into(), |c| c.to_string()),
                    format!("{:.1}", w.busy_pct),
                    format!("{:.1}", w.load_pct),
                    format!("{}/{}", w.moved_in, w.moved_out),
                    w.handoff_out.to_string(),
                    w.handoff_in.to_string(),
                    cell(&w.ports.join(",")),
                ]
            })
            .collect();
        out += "\n";
        out += &render_table(
            &[
                "WORKER",
                "CPU",
                "CPU%",
                "LOAD%",
                "MOVED_IN/OUT",
                "HANDOFF_OUT",
                "HANDOFF_IN",
                "PORTS",
            ],
            &[true, true, true, true, true, true, true, false],
            &rows,
        );
    }
    out
}

/// The `pvnet ctl macs` table, by port then address.
pub fn render_macs(s: &Status) -> String {
    let mut macs: Vec<&MacInfo> = s.macs.iter().collect();
    macs.sort_by(|a, b| (&a.port, &a.mac).cmp(&(&b.port, &b.mac)));
    let rows: Vec<Vec<String>> = macs
        .iter()
        .map(|m| vec![cell(&m.mac), cell(&m.port), format!("{:.1}s", m.age_secs)])
        .collect();
    render_table(&["MAC", "PORT", "AGE"], &[false, false, true], &rows)
}

// ---------------------------------------------------------------------------------------
// Prometheus.

/// Label value escaping of the text exposition format: backslash, double quote, newline.
fn escape_label(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// `# HELP` text escaping: backslash and newline.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A counter name as part of a metric name: `[a-zA-Z0-9_]`, anything else becomes `_`.
fn metric_part(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn fmt_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// The status in the Prometheus text exposition format 0.0.4: every port counter `X` as
/// `pvnet_port_X_total{port,kind}` (counter), `pvnet_port_up{port,kind}`, `pvnet_mac_entries`
/// and `pvnet_uptime_seconds` (gauges).
pub fn render_metrics(s: &Status) -> String {
    fn head(o: &mut String, name: &str, kind: &str, help: &str) {
        let _ = writeln!(o, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(o, "# TYPE {name} {kind}");
    }
    let mut o = String::new();
    head(
        &mut o,
        "pvnet_uptime_seconds",
        "gauge",
        "Seconds since the switch started.",
    );
    let _ = writeln!(o, "pvnet_uptime_seconds {}", fmt_float(s.uptime_secs));

    head(
        &mut o,
        "pvnet_mac_entries",
        "gauge",
        "Learned MAC addresses in the switch's table.",
    );
    let _ = writeln!(o, "pvnet_mac_entries {}", s.macs.len());

    if !s.workers.is_empty() {
        for (name, kind, help, get) in [
            (
                "pvnet_worker_cpu_seconds_total",
                "counter",
                "CPU time of a dataplane worker thread.",
                (|w: &WorkerRow| fmt_float(w.cpu_secs)) as fn(&WorkerRow) -> String,
            ),
            (
                "pvnet_worker_busy_seconds_total",
                "counter",
                "Time a dataplane worker spent in rounds that moved packets (its CPU time less polling and sleeping).",
                |w: &WorkerRow| fmt_float(w.busy_secs),
            ),
            (
                "pvnet_worker_load_ratio",
                "gauge",
                "Share of the last second a worker spent in rounds that moved packets.",
                |w: &WorkerRow| fmt_float(w.load_pct / 100.0),
            ),
            (
                "pvnet_worker_handoff_out_total",
                "counter",
                "Packets a worker handed to other workers.",
                |w: &WorkerRow| w.handoff_out.to_string(),
            ),
            (
                "pvnet_worker_handoff_in_total",
                "counter",
                "Packets other workers handed to a worker.",
                |w: &WorkerRow| w.handoff_in.to_string(),
            ),
            (
                "pvnet_worker_ports_moved_in_total",
                "counter",
                "Ports moved onto a worker (by the balancer or pvnet ctl port move).",
                |w: &WorkerRow| w.moved_in.to_string(),
            ),
            (
                "pvnet_worker_ports_moved_out_total",
                "counter",
                "Ports moved off a worker.",
                |w: &WorkerRow| w.moved_out.to_string(),
            ),
        ] {
            head(&mut o, name, kind, help);
            for w in &s.workers {
                let _ = writeln!(o, "{name}{{worker=\"{}\"}} {}", w.worker, get(w));
            }
        }
    }

    let labels: Vec<String> = s
        .ports
        .iter()
        .map(|p| {
            format!(
                "port=\"{}\",kind=\"{}\"",
                escape_label(&p.name),
                escape_label(&p.kind)
            )
        })
        .collect();
    head(
        &mut o,
        "pvnet_port_up",
        "gauge",
        "1 when the port is up, 0 otherwise.",
    );
    for (p, l) in s.ports.iter().zip(&labels) {
        let _ = writeln!(o, "pvnet_port_up{{{l}}} {}", u8::from(p.state == "up"));
    }

    // Metric family -> (counter name for the help text, port index -> value). Counter names
    // that differ only in characters a metric name cannot hold share a family, so its HELP
    // and TYPE lines still come once. Gauges (what is now, not what has been) keep their name.
    let mut families: BTreeMap<String, (&str, BTreeMap<usize, u64>)> = BTreeMap::new();
    for (i, p) in s.ports.iter().enumerate() {
        for (k, v) in &p.counters {
            let part = metric_part(k);
            let part = part.strip_suffix("_total").unwrap_or(&part);
            let name = if GAUGES.contains(&k.as_str()) {
                format!("pvnet_port_{part}")
            } else {
                format!("pvnet_port_{part}_total")
            };
            let f = families
                .entry(name)
                .or_insert_with(|| (k.as_str(), BTreeMap::new()));
            let e = f.1.entry(i).or_insert(0);
            *e = e.saturating_add(*v);
        }
    }
    for (name, (counter, values)) in &families {
        if GAUGES.contains(counter) {
            head(&mut o, name, "gauge", &format!("Port gauge {counter}."));
        } else {
            head(&mut o, name, "counter", &format!("Port counter {counter}."));
        }
        for (i, v) in values {
            let _ = writeln!(o, "{name}{{{}}} {v}", labels[*i]);
        }
    }
    // Multiqueue ports: each pair's counters, labelled with its index.
    let mut queues: BTreeMap<&str, Vec<(usize, usize, u64)>> = BTreeMap::new();
    for (i, p) in s.ports.iter().enumerate() {
        for (k, q) in p.queues.iter().enumerate() {
            for (c, v) in q {
                queues.entry(c.as_str()).or_default().push((i, k, *v));
            }
        }
    }
    for (counter, values) in &queues {
        let name = format!("pvnet_queue_{}_total", metric_part(counter));
        head(
            &mut o,
            &name,
            "counter",
            &format!("Queue pair counter {counter}."),
        );
        for (i, k, v) in values {
            let _ = writeln!(o, "{name}{{{},queue=\"{k}\"}} {v}", labels[*i]);
        }
    }
    o
}

/// Port values that are a level now, not a count so far: exported as gauges.
const GAUGES: [&str; 2] = ["backlog", "dql_limit"];

/// Parses the request line of an HTTP request head: (method, path without query).
fn parse_request_line(head: &[u8]) -> Option<(String, String)> {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().next()?;
    let mut it = line.split_whitespace();
    let method = it.next()?.to_owned();
    let target = it.next()?;
    let version = it.next()?;
    if !version.starts_with("HTTP/") || it.next().is_some() {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target).to_owned();
    Some((method, path))
}

fn head_complete(b: &[u8]) -> bool {
    b.windows(4).any(|w| w == b"\r\n\r\n") || b.windows(2).any(|w| w == b"\n\n")
}

fn handle_http(mut c: TcpStream, status: &StatusFn) -> io::Result<()> {
    c.set_nonblocking(false)?;
    let head = read_request(&mut c, head_complete)?;
    if head.is_empty() {
        return Ok(());
    }
    let text = "text/plain; charset=utf-8";
    let (code, ctype, body, is_head) = match parse_request_line(&head) {
        None => ("400 Bad Request", text, "bad request\n".to_owned(), false),
        Some((m, _)) if m != "GET" && m != "HEAD" => (
            "405 Method Not Allowed",
            text,
            "only GET and HEAD\n".to_owned(),
            false,
        ),
        Some((m, p)) if p == "/metrics" => match current_status(status) {
            Some(s) => (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                render_metrics(&s),
                m == "HEAD",
            ),
            None => (
                "500 Internal Server Error",
                text,
                "status unavailable\n".to_owned(),
                m == "HEAD",
            ),
        },
        Some((m, _)) => (
            "404 Not Found",
            text,
            "not found: metrics are at /metrics\n".to_owned(),
            m == "HEAD",
        ),
    };
    let mut resp = format!(
        "HTTP/1.0 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if code.starts_with("405") {
        resp.push_str("Allow: GET, HEAD\r\n");
    }
    resp.push_str("\r\n");
    if !is_head {
        resp.push_str(&body);
    }
    write_response(&mut c, resp.as_bytes())?;
    // Closing with unread bytes in the receive buffer would reset the connection and could
    // lose the answer at the client: half-close, then read until the client closes (briefly).
    let _ = c.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_millis(200);
    let mut sink = [0u8; 512];
    while let Ok(left) = time_left(deadline) {
        if c.read_timeout_to(left).is_err() || !matches!(c.read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
    Ok(())
}

/// Serves `GET /metrics` (Prometheus text format 0.0.4) over HTTP/1.0 on `addr` until `stop`
/// is set, on one thread named `pvnet-metrics`, one request per connection. Returns the
/// bound address (`addr` may have port 0) and the thread.
pub fn serve_metrics(
    addr: SocketAddr,
    status: StatusFn,
    stop: Arc<AtomicBool>,
) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("binding metrics on {addr}: {e}")))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let t = std::thread::Builder::new()
        .name("pvnet-metrics".into())
        .spawn(move || {
            accept_loop(
                "metrics",
                &stop,
                || listener.accept().map(|(c, _)| c),
                |c| handle_http(c, &status),
            );
        })?;
    Ok((bound, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_gauges_and_the_table_shows_the_egress_backlog() {
        let s = sample();
        let m = render_metrics(&s);
        assert!(m.contains("# TYPE pvnet_port_backlog gauge"), "{m}");
        assert!(m.contains("pvnet_port_backlog{port=\"vm0\",kind=\"vhost-user\"} 17"));
        assert!(!m.contains("pvnet_port_backlog_total"));
        let t = render_ports(&s);
        assert!(
            t.lines().next().is_some_and(|h| h.contains("QUEUED")),
            "{t}"
        );
        assert!(t.lines().nth(1).is_some_and(|l| l.contains(" 17 ")), "{t}");
    }

    fn counters_of(v: &[(&str, u64)]) -> BTreeMap<String, u64> {
        v.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
    }

    fn sample() -> Status {
        let counters = counters_of;
        Status {
            uptime_secs: 12.5,
            ports: vec![
                PortInfo {
                    name: "vm0".into(),
                    kind: "vhost-user".into(),
                    state: "up".into(),
                    detail: "/run/pvnet/vm0.sock".into(),
                    counters: counters(&[
                        ("rx_packets", 1_234_567),
                        ("rx_bytes", 98_765_432_100),
                        ("tx_packets", 7),
                        ("tx_bytes", 448),
                        ("drops_no_buffer", 3),
                        ("drops_too_big", 4),
                        ("kicks", 11),
                        ("calls", 12),
                        ("sw_gso", 5),
                        ("backlog", 17),
                    ]),
                    error: None,
                    queues: Vec::new(),
                },
                PortInfo {
                    name: "we\"ird\\po\nrt".into(),
                    kind: "tap".into(),
                    state: "down".into(),
                    detail: "tap0".into(),
                    counters: counters(&[("rx_packets", 5), ("flooded", 9)]),
                    error: None,
                    queues: Vec::new(),
                },
            ],
            macs: vec![
                MacInfo {
                    mac: "52:54:00:00:00:02".into(),
                    port: "vm0".into(),
                    age_secs: 125.25,
                },
                MacInfo {
                    mac: "52:54:00:00:00:01".into(),
                    port: "vm0".into(),
                    age_secs: 0.5,
                },
            ],
            workers: Vec::new(),
        }
    }

    fn sample_fn() -> StatusFn {
        Arc::new(sample)
    }

    /// A fresh directory for one test's sockets.
    fn temp_dir(tag: &str) -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "pvnet-ctl-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    /// Sets `stop` and joins the thread, which must end within a second.
    fn stop_and_join(stop: &AtomicBool, t: JoinHandle<()>) {
        let t0 = Instant::now();
        stop.store(true, Ordering::Relaxed);
        t.join().expect("server thread panicked");
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    fn raw_ctl(path: &Path, req: &[u8]) -> String {
        let mut c = UnixStream::connect(path).expect("connect");
        c.write_all(req).expect("write");
        // End of request without a newline: half-close, as `socat` or `nc -U` do at EOF.
        c.shutdown(std::net::Shutdown::Write).expect("shutdown");
        let mut s = String::new();
        c.read_to_string(&mut s).expect("read");
        s
    }

    #[test]
    fn a_stopped_queue_shows_its_cause() {
        let mut s = sample();
        s.ports[0].error = Some("queue 1: avail index jumped from 0 to 999".into());
        let out = render_ports(&s);
        assert!(
            out.lines()
                .any(|l| l.ends_with("queue 1: avail index jumped from 0 to 999")),
            "{out}"
        );
        // The JSON carries it; a port without one carries no field.
        let j = serde_json::to_value(&s).expect("json");
        assert_eq!(
            j["ports"][0]["error"],
            "queue 1: avail index jumped from 0 to 999"
        );
        assert!(j["ports"][1].get("error").is_none());
    }

    #[test]
    fn ctl_round_trip_unknown_and_exit() {
        let dir = temp_dir("rt");
        let path = dir.join("ctl.sock");
        let stop = Arc::new(AtomicBool::new(false));
        let t = serve_ctl(&path, Server::read_only(sample_fn()), stop.clone()).expect("serve_ctl");
        assert!(std::fs::symlink_metadata(&path)
            .expect("socket exists")
            .file_type()
            .is_socket());
        for req in ["status", "ports", "macs"] {
            assert_eq!(request(&path, req).expect(req), sample(), "{req}");
        }
        // Request without a trailing newline, with surrounding blanks.
        let ans = raw_ctl(&path, b" macs ");
        assert!(
            ans.ends_with('\n') && ans.matches('\n').count() == 1,
            "{ans:?}"
        );
        let s: Status = serde_json::from_str(&ans).expect("status json");
        assert_eq!(s, sample());

        let ans = raw_ctl(&path, b"bogus\nstatus\n");
        let v: serde_json::Value = serde_json::from_str(&ans).expect("json");
        assert_eq!(
            v,
            serde_json::json!({ "error": "unknown request 'bogus' (status|ports|macs, or a JSON request)" })
        );
        // The versioned JSON protocol: status, a newer version refused, a malformed request,
        // a change asked of a read-only server.
        let ask = |req: &str| -> Reply {
            serde_json::from_str(&raw_ctl(&path, format!("{req}\n").as_bytes())).expect("reply")
        };
        let r = ask(r#"{"version":1,"op":"status"}"#);
        assert!(r.ok && r.version == PROTOCOL_VERSION, "{r:?}");
        assert_eq!(r.status, Some(sample()));
        let r = ask(r#"{"version":2,"op":"status"}"#);
        assert!(!r.ok && r.error.unwrap().contains("version 2 not supported"));
        let r = ask(r#"{"version":1,"op":"port-frob"}"#);
        assert!(!r.ok && r.error.unwrap().contains("bad request"));
        let r = ask(r#"{"version":1,"op":"port-del","name":"x"}"#);
        assert!(!r.ok && r.error.unwrap().contains("takes no changes"));
        // The socket is the owner's only.
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let e = request(&path, "bogus").expect_err("unknown request");
        assert!(
            e.to_string()
                .contains("unknown request 'bogus' (status|ports|macs, or a JSON request)"),
            "{e}"
        );
        // No temporary socket names left behind.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("ctl.sock")]);

        stop_and_join(&stop, t);
        assert!(!path.exists(), "socket file removed on exit");
        let e = request(&path, "status").expect_err("gone");
        assert!(e.to_string().starts_with("no switch listening on "), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ctl_stale_live_and_foreign_files() {
        let dir = temp_dir("stale");
        let path = dir.join("ctl.sock");
        // Stale: a socket file nobody listens on any more.
        drop(UnixListener::bind(&path).expect("bind"));
        let e = request(&path, "status").expect_err("refused");
        assert!(e.to_string().starts_with("no switch listening on "), "{e}");
        let stop = Arc::new(AtomicBool::new(false));
        let t = serve_ctl(&path, Server::read_only(sample_fn()), stop.clone())
            .expect("replaces stale socket");
        assert_eq!(request(&path, "ports").expect("ports"), sample());
        // Live: a second server must not steal the first one's socket.
        let stop2 = Arc::new(AtomicBool::new(false));
        let e = serve_ctl(&path, Server::read_only(sample_fn()), stop2).expect_err("in use");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        assert_eq!(request(&path, "ports").expect("still served"), sample());
        stop_and_join(&stop, t);

        // Not a socket: left alone.
        let file = dir.join("notes.txt");
        std::fs::write(&file, "keep me").expect("write");
        let e = serve_ctl(
            &file,
            Server::read_only(sample_fn()),
            Arc::new(AtomicBool::new(false)),
        )
        .expect_err("not a socket");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&file).expect("kept"), "keep me");

        // Missing directory: created.
        let nested = dir.join("a/b/ctl.sock");
        let stop = Arc::new(AtomicBool::new(false));
        let t = serve_ctl(&nested, Server::read_only(sample_fn()), stop.clone()).expect("nested");
        assert_eq!(request(&nested, "macs").expect("macs"), sample());
        stop_and_join(&stop, t);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ctl_slow_client_does_not_wedge() {
        let dir = temp_dir("slow");
        let path = dir.join("ctl.sock");
        let stop = Arc::new(AtomicBool::new(false));
        let t = serve_ctl(&path, Server::read_only(sample_fn()), stop.clone()).expect("serve_ctl");
        // Connects and sends half a request, never the end of the line.
        let mut idle = UnixStream::connect(&path).expect("connect");
        idle.write_all(b"sta").expect("write");
        let t0 = Instant::now();
        assert_eq!(request(&path, "status").expect("status"), sample());
        let waited = t0.elapsed();
        assert!(waited < Duration::from_millis(2500), "{waited:?}");
        // The slow client was cut off, without an answer.
        let mut rest = String::new();
        idle.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let _ = idle.read_to_string(&mut rest);
        assert!(rest.is_empty(), "{rest:?}");
        stop_and_join(&stop, t);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ctl_status_panic_fails_one_request() {
        let dir = temp_dir("panic");
        let path = dir.join("ctl.sock");
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU32::new(0));
        let f: StatusFn = {
            let calls = calls.clone();
            Arc::new(move || {
                assert!(
                    calls.fetch_add(1, Ordering::Relaxed) != 0,
                    "first call fails"
                );
                sample()
            })
        };
        let t = serve_ctl(&path, Server::read_only(f), stop.clone()).expect("serve_ctl");
        let e = request(&path, "status").expect_err("panicked");
        assert!(e.to_string().contains("status unavailable"), "{e}");
        assert_eq!(request(&path, "status").expect("second"), sample());
        stop_and_join(&stop, t);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The value in `row` right-aligned under `header` of `head`: it ends in the same column
    /// as the header and is preceded by a blank.
    fn under(head: &str, row: &str, header: &str) -> String {
        let end = head.find(header).unwrap_or_else(|| panic!("{header}")) + header.len();
        assert!(
            row.len() == end || row[end..].starts_with(' '),
            "{header}: {row:?}"
        );
        row[..end].rsplit(' ').next().unwrap_or_default().to_owned()
    }

    #[test]
    fn only_root_the_owner_and_the_group_may_talk() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert!(peer_allowed((0, 0), None));
        assert!(peer_allowed((me, 12345), None));
        let other = if me == 4242 { 4243 } else { 4242 };
        assert!(!peer_allowed((other, 777), None));
        assert!(peer_allowed((other, 777), Some(777)));
        assert!(!peer_allowed((other, 778), Some(777)));
    }

    #[test]
    fn ports_table() {
        let t = render_ports(&sample());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        let (head, vm0, other) = (lines[0], lines[1], lines[2]);
        for h in [
            "NAME", "KIND", "STATE", "RX_PKTS", "RX_BYTES", "TX_PKTS", "TX_BYTES", "DROPS",
            "KICKS", "CALLS", "DETAIL",
        ] {
            assert!(head.contains(h), "{h} in {head}");
        }
        for w in ["vm0", "vhost-user", "up", "/run/pvnet/vm0.sock"] {
            assert!(vm0.contains(w), "{w} in {vm0}");
        }
        // Numbers right-aligned under their headers; drops = sum of drops_*; missing
        // counters shown as '-'.
        for (h, a, b) in [
            ("RX_PKTS", "1234567", "5"),
            ("RX_BYTES", "98765432100", "-"),
            ("TX_PKTS", "7", "-"),
            ("TX_BYTES", "448", "-"),
            ("DROPS", "7", "-"),
            ("KICKS", "11", "-"),
            ("CALLS", "12", "-"),
        ] {
            assert_eq!(under(head, vm0, h), a, "{h}\n{t}");
            assert_eq!(under(head, other, h), b, "{h}\n{t}");
        }
        assert!(vm0.ends_with("  /run/pvnet/vm0.sock"), "{vm0}");
        assert!(other.ends_with("  tap0"), "{other}");
        // Control characters escaped, not breaking the line.
        assert!(other.starts_with("we\"ird\\po\\nrt  tap"), "{other}");
        // Text columns left-aligned.
        assert_eq!(vm0.find("vhost-user"), head.find("KIND"));
        assert!(!t.lines().any(|l| l.ends_with(' ')), "no trailing blanks");
        // Nothing to show: just the header.
        assert_eq!(render_ports(&Status::default()).lines().count(), 1);
    }

    #[test]
    fn macs_table() {
        let t = render_macs(&sample());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(
            lines[0].starts_with("MAC") && lines[0].contains("PORT"),
            "{t}"
        );
        // Sorted by port then address; ages right-aligned.
        assert!(lines[1].starts_with("52:54:00:00:00:01"), "{t}");
        assert!(lines[2].starts_with("52:54:00:00:00:02"), "{t}");
        assert!(lines[1].ends_with("   0.5s"), "{t}");
        assert!(
            lines[2].ends_with("125.2s") || lines[2].ends_with("125.3s"),
            "{t}"
        );
        assert_eq!(lines[1].len(), lines[2].len());
        assert_eq!(lines[0].len(), lines[1].len());
    }

    #[test]
    fn metrics_text() {
        let m = render_metrics(&sample());
        for l in [
            "# HELP pvnet_uptime_seconds Seconds since the switch started.",
            "# TYPE pvnet_uptime_seconds gauge",
            "pvnet_uptime_seconds 12.5",
            "# TYPE pvnet_mac_entries gauge",
            "pvnet_mac_entries 2",
            "# TYPE pvnet_port_up gauge",
            "pvnet_port_up{port=\"vm0\",kind=\"vhost-user\"} 1",
            "pvnet_port_up{port=\"we\\\"ird\\\\po\\nrt\",kind=\"tap\"} 0",
            "# HELP pvnet_port_rx_packets_total Port counter rx_packets.",
            "# TYPE pvnet_port_rx_packets_total counter",
            "pvnet_port_rx_packets_total{port=\"vm0\",kind=\"vhost-user\"} 1234567",
            "pvnet_port_rx_packets_total{port=\"we\\\"ird\\\\po\\nrt\",kind=\"tap\"} 5",
            "pvnet_port_rx_bytes_total{port=\"vm0\",kind=\"vhost-user\"} 98765432100",
            "pvnet_port_drops_no_buffer_total{port=\"vm0\",kind=\"vhost-user\"} 3",
            "pvnet_port_sw_gso_total{port=\"vm0\",kind=\"vhost-user\"} 5",
            "pvnet_port_flooded_total{port=\"we\\\"ird\\\\po\\nrt\",kind=\"tap\"} 9",
        ] {
            assert!(m.lines().any(|x| x == l), "missing {l:?} in\n{m}");
        }
        // Every line is a comment or a sample; HELP/TYPE once per family, before its samples.
        let mut typed = std::collections::BTreeSet::new();
        for l in m.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().expect("name");
                assert!(typed.insert(name.to_owned()), "TYPE twice: {name}");
            } else if !l.starts_with("# HELP ") {
                let name = l.split(['{', ' ']).next().expect("name");
                assert!(typed.contains(name), "sample before TYPE: {l}");
                assert!(
                    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "{name}"
                );
            }
        }
        assert_eq!(m.matches("# HELP pvnet_port_rx_packets_total ").count(), 1);
        assert!(m.ends_with('\n'));
        // Counter names that do not fit a metric name, and a trailing _total.
        let mut s = Status::default();
        s.ports.push(PortInfo {
            name: "p".into(),
            kind: "sink".into(),
            state: "up".into(),
            counters: [("odd-name.x".to_owned(), 1), ("errs_total".to_owned(), 2)]
                .into_iter()
                .collect(),
            ..PortInfo::default()
        });
        s.uptime_secs = f64::INFINITY;
        let m = render_metrics(&s);
        assert!(
            m.contains("\npvnet_port_odd_name_x_total{port=\"p\",kind=\"sink\"} 1\n"),
            "{m}"
        );
        assert!(
            m.contains("\npvnet_port_errs_total{port=\"p\",kind=\"sink\"} 2\n"),
            "{m}"
        );
        assert!(m.contains("pvnet_uptime_seconds +Inf\n"), "{m}");
        // A multiqueue port: each pair's counters labelled with its index, and a row each in
        // the table under the port's.
        let mut s = sample();
        s.ports[0].queues = vec![
            counters_of(&[("rx_packets", 1_000_000), ("tx_packets", 3)]),
            counters_of(&[("rx_packets", 234_567), ("tx_packets", 4)]),
        ];
        let m = render_metrics(&s);
        assert!(
            m.contains("\npvnet_queue_rx_packets_total{port=\"vm0\",kind=\"vhost-user\",queue=\"1\"} 234567\n"),
            "{m}"
        );
        assert_eq!(
            m.matches("# TYPE pvnet_queue_tx_packets_total counter")
                .count(),
            1
        );
        let t = render_ports(&s);
        let rows: Vec<&str> = t.lines().collect();
        assert_eq!(rows.len(), 5, "{t}");
        assert!(
            rows[2].trim_start().starts_with("q0") && rows[3].contains("234567"),
            "{t}"
        );
        // Several workers: a table of them under the ports, and their counters as metrics.
        s.workers = (0..2u64)
            .map(|k| WorkerRow {
                worker: usize::try_from(k).unwrap_or(0),
                cpu: Some(0),
                cpu_secs: 1.5,
                busy_pct: 12.5,
                ports: vec![format!("p{k}")],
                handoff_out: 7 + k,
                handoff_in: 9,
                load_pct: 40.0,
                busy_secs: 0.25,
                moved_in: k,
                moved_out: 1 - k,
            })
            .collect();
        let t = render_ports(&s);
        assert!(
            t.contains("HANDOFF_OUT") && t.contains(" 12.5 ") && t.contains(" 40.0 "),
            "{t}"
        );
        assert!(t.contains(" 1/0 ") && t.contains(" 0/1 "), "{t}");
        let m = render_metrics(&s);
        assert!(
            m.contains("\npvnet_worker_handoff_out_total{worker=\"1\"} 8\n"),
            "{m}"
        );
        assert!(
            m.contains("\npvnet_worker_load_ratio{worker=\"0\"} 0.4\n")
                && m.contains("\npvnet_worker_busy_seconds_total{worker=\"1\"} 0.25\n")
                && m.contains("\npvnet_worker_ports_moved_in_total{worker=\"1\"} 1\n"),
            "{m}"
        );
    }

    fn http_get(addr: SocketAddr, req: &str) -> String {
        let mut c = TcpStream::connect(addr).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        c.write_all(req.as_bytes()).expect("write");
        let mut s = String::new();
        c.read_to_string(&mut s).expect("read");
        s
    }

    #[test]
    fn metrics_http() {
        let stop = Arc::new(AtomicBool::new(false));
        let (addr, t) = serve_metrics(
            "127.0.0.1:0".parse().expect("addr"),
            sample_fn(),
            stop.clone(),
        )
        .expect("serve_metrics");
        assert_ne!(addr.port(), 0);
        let r = http_get(addr, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
        let (head, body) = r.split_once("\r\n\r\n").expect("head and body");
        assert!(head.starts_with("HTTP/1.0 200 OK\r\n"), "{head}");
        assert!(
            head.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(
            head.contains(&format!("\r\nContent-Length: {}", body.len())),
            "{head}"
        );
        assert_eq!(body, render_metrics(&sample()));
        // HTTP/1.1 with a query string, bare newlines.
        let r = http_get(addr, "GET /metrics?x=1 HTTP/1.1\nHost: x\n\n");
        assert!(r.starts_with("HTTP/1.0 200 OK\r\n"), "{r}");
        let r = http_get(addr, "HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.0 200 OK\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        let r = http_get(addr, "GET /foo HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.0 404 Not Found\r\n"), "{r}");
        let r = http_get(addr, "POST /metrics HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.0 405 "), "{r}");
        let r = http_get(addr, "nonsense\r\n\r\n");
        assert!(r.starts_with("HTTP/1.0 400 "), "{r}");
        // A client that never finishes its request does not hold the server.
        let mut idle = TcpStream::connect(addr).expect("connect");
        idle.write_all(b"GET /metr").expect("write");
        let t0 = Instant::now();
        let r = http_get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.0 200 OK\r\n"), "{r}");
        assert!(
            t0.elapsed() < Duration::from_millis(2500),
            "{:?}",
            t0.elapsed()
        );
        stop_and_join(&stop, t);
        assert!(TcpStream::connect(addr).is_err(), "listener closed");
    }
}
