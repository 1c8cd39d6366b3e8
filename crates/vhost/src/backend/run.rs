//! One session's thread: reads the next message; takes those the `vhost` crate does not
//! dispatch itself and hands the rest to the crate's `BackendReqHandler`.

use super::{BackendConfig, DeviceHooks, PortId, Session};
use crate::features::VHOST_USER_F_PROTOCOL_FEATURES;
use crate::iotlb::{IotlbMsg, HDR_LEN, HDR_NEED_REPLY, HDR_REPLY, HDR_VERSION};
use crate::peer_error;
use crate::ratelimit::PeerLog;
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::info;
use vhost::vhost_user::{
    BackendReqHandler, Error as VuError, VhostUserBackendReqHandlerMut, VhostUserProtocolFeatures,
};

/// Runs one session to its end on the calling thread: answers messages until the frontend
/// disconnects or breaks the protocol, then stops the port's queues and tells the dataplane.
/// The warnings the frontend causes count against `log` (one per listener: see
/// [`crate::ratelimit`]).
pub fn run_session(
    stream: UnixStream,
    port: PortId,
    cfg: BackendConfig,
    hooks: Arc<dyn DeviceHooks>,
    log: Arc<PeerLog>,
) {
    hooks.port_connected(port);
    let session = Arc::new(Mutex::new(Session::new(
        port,
        cfg,
        hooks.clone(),
        log.clone(),
    )));
    let peek = stream.try_clone().ok();
    let mut handler = BackendReqHandler::from_stream(stream, session.clone());
    loop {
        if let Some(sock) = &peek {
            match take_own_message(sock, &session) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    peer_error!(log, port, "closing session: {e}");
                    break;
                }
            }
        }
        match handler.handle_request() {
            Ok(()) => {}
            Err(VuError::Disconnected | VuError::PartialMessage | VuError::SocketBroken(_)) => {
                info!(port, "frontend disconnected");
                break;
            }
            Err(e) => {
                peer_error!(log, port, "closing session: {e}");
                break;
            }
        }
    }
    if let Ok(mut s) = session.lock() {
        s.stop_all();
        s.mem = None;
        s.base = None;
    }
    // The connection ends here for the frontend too, whoever else holds a copy of the fd (the
    // listener keeps one to end a silent session at a stop, and reaps it only when it next
    // wakes).
    if let Some(sock) = &peek {
        let _ = sock.shutdown(std::net::Shutdown::Both);
    }
    hooks.port_gone(port);
}

/// `VHOST_USER_SET_LOG_FD` (request 7): not dispatched by the crate.
pub(super) const SET_LOG_FD: u32 = 7;

/// Reads a message carrying exactly one fd and a body of 0 or 8 bytes (`what` names it in
/// errors).
fn recv_one_fd(sock: &UnixStream, what: &str, size: usize) -> std::io::Result<File> {
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    if size != 0 && size != 8 {
        return Err(bad(format!("{what} of {size} bytes")));
    }
    let mut m = [0u8; HDR_LEN + 8];
    let mut iov = [libc::iovec {
        iov_base: m.as_mut_ptr().cast(),
        iov_len: HDR_LEN + size,
    }];
    // Room for as many fds as a vhost-user message may carry: with room for one,
    // vmm-sys-util's `recv_with_fd` leaks a second fd the kernel fits into the cmsg
    // buffer's alignment padding (found by the vhost_msg fuzz target).
    let mut raw = [-1; 32];
    // SAFETY: the iovec points at `m`, valid for writes of the length given.
    let (got, n) = unsafe { sock.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    // SAFETY: the first `n` entries are fds just received, owned by nothing else.
    let mut files: Vec<File> = raw[..n]
        .iter()
        .map(|&fd| unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        .collect();
    if got != HDR_LEN + size {
        return Err(bad(format!("{what} cut short")));
    }
    if files.len() != 1 {
        return Err(bad(format!("{what} with {} fds", files.len())));
    }
    Ok(files.swap_remove(0))
}

/// `VHOST_USER_SEND_RARP` (request 19): after a migration, the destination's frontend gives
/// the guest's MAC address; the crate does not dispatch it.
pub(super) const SEND_RARP: u32 = 19;

/// `VHOST_USER_SET_VRING_ENABLE` (request 18) on the wire: a 12-byte header (request, flags,
/// size) and a `vhost_vring_state` body (index, num), no fds.
pub(super) const SET_VRING_ENABLE: u32 = 18;
const VRING_STATE_LEN: usize = 8;

/// Handles a `SET_VRING_ENABLE` that arrives before `SET_FEATURES` acked
/// `VHOST_USER_F_PROTOCOL_FEATURES`, which the `vhost` crate refuses (`InactiveFeature`, which
/// ends the session) before our handler sees it.
///
/// QEMU's vhost-user-net sends exactly that: it checks the *offered* features
/// (`vhost_user_set_vring_enable`: `virtio_has_feature(dev->features, PROTOCOL_FEATURES)`), and
/// sends `SET_VRING_ENABLE(1)` when the guest writes its features (`virtio_net_set_features` ->
/// `peer_attach`) and again from `vhost_net_start` ("restore vring enable state"), which in
/// QEMU 7.2 runs *before* `vhost_net_start_one` sends `SET_FEATURES` (seen with Debian's 7.2:
/// five enables, all before `SET_FEATURES`, none after). Ignoring these would leave
/// the rings disabled forever (with protocol features a ring starts disabled, vhost-user spec
/// "Ring states"); DPDK's vhost library and libvhost-user accept the message at any time. So
/// the enable state is recorded now and takes effect when the ring is otherwise ready.
///
/// Peeks (never consumes) the next message; only a complete `SET_VRING_ENABLE` seen while
/// protocol features are not acked is read here, applied, and acked if the frontend asked
/// (`NEED_REPLY` with `REPLY_ACK`). Returns `Ok(true)` if it handled a message.
pub(super) fn take_early_vring_enable(
    sock: &UnixStream,
    session: &Mutex<Session>,
) -> std::io::Result<bool> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let protocol = match session.lock() {
        Ok(s) if s.acked & VHOST_USER_F_PROTOCOL_FEATURES == 0 => s.protocol,
        _ => return Ok(false),
    };
    let mut buf = [0u8; HDR_LEN + VRING_STATE_LEN];
    // A 20-byte message sent with one sendmsg arrives whole; still, wait a little for a body
    // that lags its header rather than hand a half-seen message to the crate.
    for attempt in 0..100 {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes. MSG_PEEK leaves the bytes
        // (and any fds attached to them) queued for `handle_request`.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK,
            )
        };
        // An error or EOF is for `handle_request` to report.
        let Ok(n) = usize::try_from(n) else {
            return Ok(false);
        };
        if n < HDR_LEN || le32(&buf, 0) != SET_VRING_ENABLE {
            return Ok(false);
        }
        if le32(&buf, 8) as usize != VRING_STATE_LEN {
            return Ok(false); // malformed: the crate rejects it
        }
        if n == buf.len() {
            break;
        }
        if attempt == 99 {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (&*sock).read_exact(&mut buf)?;
    let (flags, index, num) = (le32(&buf, 4), le32(&buf, 12), le32(&buf, 16));
    let res = match (num, session.lock()) {
        (0 | 1, Ok(mut s)) => {
            info!(
                port = s.port,
                queue = index,
                enable = num == 1,
                "SET_VRING_ENABLE before SET_FEATURES (QEMU vhost-user-net): recorded"
            );
            s.set_vring_enable(index, num == 1).is_ok()
        }
        _ => false,
    };
    reply_ack(sock, SET_VRING_ENABLE, flags, protocol, u64::from(!res))?;
    Ok(true)
}

/// Handles the messages the `vhost` crate does not dispatch, before it sees them:
/// `VHOST_USER_IOTLB_MSG`, `VHOST_USER_SET_BACKEND_REQ_FD` and `VHOST_USER_SET_LOG_FD` (with
/// their fds), `VHOST_USER_SEND_RARP`, and an early `SET_VRING_ENABLE` (see
/// [`take_early_vring_enable`]). Peeks the header; anything else is
/// left for the crate. Returns `Ok(true)` if it handled a message,
/// an error (which ends the session) for a malformed one or a violation.
pub(super) fn take_own_message(
    sock: &UnixStream,
    session: &Mutex<Session>,
) -> std::io::Result<bool> {
    use crate::iotlb::{IOTLB_MSG, SET_BACKEND_REQ_FD};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let mut hdr = [0u8; HDR_LEN];
    // SAFETY: `hdr` is valid for writes of its length; MSG_PEEK leaves the bytes (and any fd
    // attached) queued.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            hdr.as_mut_ptr().cast(),
            hdr.len(),
            libc::MSG_PEEK,
        )
    };
    if usize::try_from(n).ok() != Some(HDR_LEN) {
        return Ok(false); // EOF, error or a lagging header: for the crate to report
    }
    let (request, flags, size) = (le32(&hdr, 0), le32(&hdr, 4), le32(&hdr, 8) as usize);
    let ok = match request {
        IOTLB_MSG => return take_iotlb_run(sock, session, size),
        SET_BACKEND_REQ_FD => {
            let file = recv_one_fd(sock, "SET_BACKEND_REQ_FD", size)?;
            if !std::os::unix::fs::FileTypeExt::is_socket(&file.metadata()?.file_type()) {
                return Err(bad(
                    "SET_BACKEND_REQ_FD with an fd that is not a socket".into()
                ));
            }
            let s = session.lock().map_err(|_| bad("session poisoned".into()))?;
            // SAFETY: the fd was just received and is owned by `file` alone.
            let stream = unsafe {
                <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(
                    std::os::fd::IntoRawFd::into_raw_fd(file),
                )
            };
            s.channel.set(stream)?;
            info!(port = s.port, "backend request channel set");
            s.protocol
        }
        SET_VRING_ENABLE => return take_early_vring_enable(sock, session),
        SET_LOG_FD => {
            // An eventfd for the backend to signal log updates with (the crate does not
            // dispatch the message). pvnet marks the shared bitmap directly and QEMU reads it
            // when it syncs, so the fd is taken and closed, and the message acked.
            drop(recv_one_fd(sock, "SET_LOG_FD", size)?);
            let s = session.lock().map_err(|_| bad("session poisoned".into()))?;
            info!(
                port = s.port,
                "SET_LOG_FD: the log is read by the frontend at its syncs"
            );
            s.protocol
        }
        SEND_RARP => {
            if size != 8 {
                return Err(bad(format!("SEND_RARP of {size} bytes")));
            }
            let mut m = [0u8; HDR_LEN + 8];
            (&*sock).read_exact(&mut m)?;
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&m[HDR_LEN..HDR_LEN + 6]);
            let s = session.lock().map_err(|_| bad("session poisoned".into()))?;
            info!(
                port = s.port,
                mac = format_args!(
                    "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                    mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
                ),
                "SEND_RARP: the guest is here now (migrated)"
            );
            s.hooks.announce(s.port, mac);
            s.protocol
        }
        _ => return Ok(false),
    };
    reply_ack(sock, request, flags, ok, 0)?;
    Ok(true)
}

/// IOTLB messages applied as one run before one publish.
const IOTLB_RUN: usize = 256;

/// `VHOST_USER_IOTLB_MSG`s, the first already peeked (`size`): this one and those queued
/// right behind it (up to [`IOTLB_RUN`]) are applied in order, the snapshot is published once
/// for all of them, and then they are acked, in one write. A frontend that pipelines its
/// grants (a burst's worth, then the acks) pays two reads and one publish per burst instead
/// of per message; one that waits for each ack sees no difference. Every ack follows the
/// publish, so an invalidation has taken effect when it is acked.
fn take_iotlb_run(
    sock: &UnixStream,
    session: &Mutex<Session>,
    size: usize,
) -> std::io::Result<bool> {
    use crate::iotlb::{BODY_LEN, IOTLB_MSG};
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    const MSG: usize = HDR_LEN + BODY_LEN;
    const ACK: usize = HDR_LEN + 8;
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    if size != BODY_LEN {
        return Err(bad(format!("IOTLB message of {size} bytes")));
    }
    let mut buf = [0u8; IOTLB_RUN * MSG];
    // What is queued already (MSG_DONTWAIT: never wait for more), then the whole IOTLB
    // messages at its start, which the read below takes.
    // SAFETY: `buf` is valid for writes of its length; MSG_PEEK leaves the bytes queued.
    let peeked = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    let peeked = usize::try_from(peeked).unwrap_or(0);
    let mut whole = 0;
    while (whole + 1) * MSG <= peeked {
        let m = &buf[whole * MSG..];
        if le32(m, 0) != IOTLB_MSG {
            break;
        }
        if le32(m, 8) as usize != BODY_LEN {
            return Err(bad(format!("IOTLB message of {} bytes", le32(m, 8))));
        }
        whole += 1;
    }
    // The first message's body may still be on its way: then it alone, waiting for it.
    let whole = whole.max(1);
    (&*sock).read_exact(&mut buf[..whole * MSG])?;
    // Read before the lock: a frontend that sends half a message holds only its own session
    // thread, not whoever else needs the session.
    let mut s = session.lock().map_err(|_| bad("session poisoned".into()))?;
    let ack_wanted = s.protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0;
    let mut acks = [0u8; IOTLB_RUN * ACK];
    let mut n_acks = 0;
    let mut change: Option<bool> = None;
    for m in buf[..whole * MSG].chunks_exact(MSG) {
        let msg = IotlbMsg::parse(&m[HDR_LEN..])
            .ok_or_else(|| bad(format!("IOTLB message of type {}", m[HDR_LEN + 25])))?;
        if let Some(revoked) = s.iotlb_msg(msg).map_err(bad)? {
            change = Some(change.unwrap_or(false) | revoked);
        }
        if le32(m, 4) & HDR_NEED_REPLY != 0 && ack_wanted {
            acks[n_acks * ACK..][..ACK].copy_from_slice(&ack(IOTLB_MSG, 0));
            n_acks += 1;
        }
    }
    if let Some(wait) = change {
        s.publish(wait).map_err(|e| bad(e.to_string()))?;
    }
    drop(s);
    (&*sock).write_all(&acks[..n_acks * ACK])?;
    Ok(true)
}

/// Acks a request the session handled itself, if the frontend asked (`NEED_REPLY` with
/// `REPLY_ACK` negotiated): `status` 0 for success.
fn reply_ack(
    sock: &UnixStream,
    request: u32,
    flags: u32,
    protocol: u64,
    status: u64,
) -> std::io::Result<()> {
    use std::io::Write;
    if flags & HDR_NEED_REPLY != 0 && protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0 {
        (&*sock).write_all(&ack(request, status))?;
    }
    Ok(())
}

/// The reply to `request` carrying `status` (0: success) as its u64 body.
fn ack(request: u32, status: u64) -> [u8; HDR_LEN + 8] {
    let mut reply = [0u8; HDR_LEN + 8];
    reply[0..4].copy_from_slice(&request.to_le_bytes());
    reply[4..8].copy_from_slice(&(HDR_VERSION | HDR_REPLY).to_le_bytes());
    reply[8..12].copy_from_slice(&8u32.to_le_bytes());
    reply[12..20].copy_from_slice(&status.to_le_bytes());
    reply
}

/// The little-endian u32 at byte `i` of a message (the header's words).
fn le32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}
