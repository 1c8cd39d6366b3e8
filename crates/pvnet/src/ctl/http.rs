//! The metrics endpoint: a minimal HTTP/1.0 server that answers `GET /metrics` (and `HEAD`),
//! one request per connection, bounded in time and size like the control socket.

use super::conn::{accept_loop, current_status, read_request, time_left, write_response, Conn};
use super::metrics::render_metrics;
use super::protocol::StatusFn;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    use crate::ctl::test_util::*;
    use std::io::Write;

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
