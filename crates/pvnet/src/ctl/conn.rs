//! What both servers (the control socket and the metrics endpoint) do with a connection:
//! reads and writes bounded in time and size, the accept loop that sees `stop`.

use super::protocol::{Status, StatusFn};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often the accept loops look at `stop` when no client is waiting.
pub(super) const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// Longest a client may take to send its request, and the server its answer.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest request line / HTTP request head read.
pub(super) const MAX_REQUEST: usize = 8192;

/// A connected stream whose timeouts can be set (Unix or TCP).
pub(super) trait Conn: Read + Write {
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

pub(super) fn time_left(deadline: Instant) -> io::Result<Duration> {
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
pub(super) fn read_request(c: &mut impl Conn, complete: fn(&[u8]) -> bool) -> io::Result<Vec<u8>> {
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
pub(super) fn write_response(c: &mut impl Conn, mut data: &[u8]) -> io::Result<()> {
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
pub(super) fn current_status(status: &StatusFn) -> Option<Status> {
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
pub(super) fn accept_loop<S>(
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
