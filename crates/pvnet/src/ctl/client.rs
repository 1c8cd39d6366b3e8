//! The control socket's client: one request line out, one answer line back.

use super::protocol::{Op, Reply, Request, Status, PROTOCOL_VERSION};
use crate::error::{failed, Error, Result};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Longest the `pvnet ctl` client waits for an answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

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
