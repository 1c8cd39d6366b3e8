//! The control socket's server: binds the socket (owner only, or a group), checks each peer's
//! credentials, answers one request line per connection.

use super::conn::{accept_loop, current_status, read_request, write_response};
use super::protocol::{ApplyFn, Op, Reply, Request, StatusFn, PROTOCOL_VERSION};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::client::request;
    use crate::ctl::protocol::Status;
    use crate::ctl::test_util::*;
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

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
}
