//! One session's thread: reads the next message; takes those the `vhost` crate does not
//! dispatch itself and hands the rest to the crate's `BackendReqHandler`.

use super::wire::{self, Header, Own, Request, ACK_LEN, IOTLB_RUN};
use super::{BackendConfig, DeviceHooks, PortId, Session};
use crate::features::VHOST_USER_F_PROTOCOL_FEATURES;
use crate::iotlb::IOTLB_MSG;
use crate::peer_error;
use crate::ratelimit::PeerLog;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use tracing::info;
use vhost::vhost_user::{BackendReqHandler, Error as VuError, VhostUserBackendReqHandlerMut};

/// Runs one session to its end on the calling thread: answers messages until the frontend
/// disconnects or breaks the protocol, then stops the port's queues and tells the dataplane.
/// The warnings the frontend causes count against `log` (one per listener: see
/// `ratelimit`).
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

/// Takes the next message if the `vhost` crate does not dispatch it, before the crate sees
/// it: `VHOST_USER_IOTLB_MSG` (a run of them: [`take_iotlb_run`]),
/// `VHOST_USER_SET_BACKEND_REQ_FD` and `VHOST_USER_SET_LOG_FD` (with their fds),
/// `VHOST_USER_SEND_RARP`, `VHOST_USER_NET_SET_MTU`, and an early `SET_VRING_ENABLE` ([`take_early_vring_enable`]).
/// Each is read and decoded by [`wire`]; anything else is left for the crate. Returns
/// `Ok(true)` if it handled a message, an error (which ends the session) for a malformed one
/// or a violation.
pub(super) fn take_own_message(sock: &UnixStream, session: &Mutex<Session>) -> io::Result<bool> {
    let Some((hdr, req)) = wire::peek_own(sock) else {
        return Ok(false);
    };
    match req {
        Request::Iotlb => take_iotlb_run(sock, session, hdr),
        Request::SetVringEnable => take_early_vring_enable(sock, session, hdr),
        Request::SetBackendReqFd | Request::SetLogFd | Request::SendRarp | Request::SetMtu => {
            let own = wire::take(sock, hdr, req)?;
            let mut s = lock(session)?;
            let status = apply(&mut s, own)?;
            let protocol = s.protocol;
            drop(s);
            wire::reply_ack(sock, hdr, protocol, status)?;
            Ok(true)
        }
    }
}

/// The session, or an error that ends it if a thread panicked holding it.
fn lock(session: &Mutex<Session>) -> io::Result<MutexGuard<'_, Session>> {
    session
        .lock()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "session poisoned"))
}

/// Applies a decoded `SET_BACKEND_REQ_FD`, `SET_LOG_FD`, `SEND_RARP` or `NET_SET_MTU`;
/// returns the ack's status (0: done; 1: refused, the session goes on).
fn apply(s: &mut Session, own: Own) -> io::Result<u64> {
    match own {
        Own::BackendChannel(stream) => {
            s.channel.set(stream)?;
            info!(port = s.port, "backend request channel set");
        }
        // An eventfd for the backend to signal log updates with. pvnet marks the shared
        // bitmap directly and QEMU reads it when it syncs, so the fd is closed, and the
        // message acked.
        Own::LogFd(file) => {
            drop(file);
            info!(
                port = s.port,
                "SET_LOG_FD: the log is read by the frontend at its syncs"
            );
        }
        Own::Rarp(mac) => {
            info!(
                port = s.port,
                mac = format_args!(
                    "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                    mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
                ),
                "SEND_RARP: the guest is here now (migrated)"
            );
            s.hooks.announce(s.port, mac);
        }
        Own::Mtu(mtu) => return Ok(u64::from(s.set_mtu(mtu).is_err())),
        // Read by `take_iotlb_run` and `take_early_vring_enable`, never here.
        Own::Iotlb(_) | Own::VringEnable { .. } => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "IOTLB message or SET_VRING_ENABLE read alone",
            ));
        }
    }
    Ok(0)
}

/// Handles a `SET_VRING_ENABLE` (its header `hdr` peeked) that arrives before `SET_FEATURES`
/// acked `VHOST_USER_F_PROTOCOL_FEATURES`, which the `vhost` crate refuses (`InactiveFeature`,
/// which ends the session) before our handler sees it.
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
/// Only a whole `SET_VRING_ENABLE` seen while protocol features are not acked is read here,
/// applied, and acked if the frontend asked (`NEED_REPLY` with `REPLY_ACK`; status 1 for a
/// state other than 0 or 1, or a queue that does not exist). Returns `Ok(true)` if it handled
/// the message; `Ok(false)` leaves it to the crate.
fn take_early_vring_enable(
    sock: &UnixStream,
    session: &Mutex<Session>,
    hdr: Header,
) -> io::Result<bool> {
    let protocol = match session.lock() {
        Ok(s) if s.acked & VHOST_USER_F_PROTOCOL_FEATURES == 0 => s.protocol,
        _ => return Ok(false),
    };
    let len = Request::SetVringEnable.len(hdr.size)?;
    if !wire::wait_whole(sock, len) {
        return Ok(false);
    }
    let Own::VringEnable { index, num } = wire::take(sock, hdr, Request::SetVringEnable)? else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "SET_VRING_ENABLE decoded as another request",
        ));
    };
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
    wire::reply_ack(sock, hdr, protocol, u64::from(!res))?;
    Ok(true)
}

/// `VHOST_USER_IOTLB_MSG`s, the first one's header (`first`) peeked: this one and those queued
/// right behind it ([`wire::take_iotlb_run`]) are applied in order, the snapshot is published
/// once for all of them, and then they are acked, in one write. A frontend that pipelines its
/// grants (a burst's worth, then the acks) pays two reads and one publish per burst instead
/// of per message; one that waits for each ack sees no difference. Every ack follows the
/// publish, so an invalidation has taken effect when it is acked.
fn take_iotlb_run(sock: &UnixStream, session: &Mutex<Session>, first: Header) -> io::Result<bool> {
    // Read before the lock: a frontend that sends half a message holds only its own session
    // thread, not whoever else needs the session.
    let run = wire::take_iotlb_run(sock, first)?;
    let mut s = lock(session)?;
    let ack_wanted = wire::reply_ack_negotiated(s.protocol);
    let mut acks = [0u8; IOTLB_RUN * ACK_LEN];
    let mut n_acks = 0;
    let mut change: Option<bool> = None;
    for (msg, need_reply) in run.iter() {
        let bad = |why| io::Error::new(io::ErrorKind::InvalidData, why);
        if let Some(revoked) = s.iotlb_msg(msg).map_err(bad)? {
            change = Some(change.unwrap_or(false) | revoked);
        }
        if need_reply && ack_wanted {
            acks[n_acks * ACK_LEN..][..ACK_LEN].copy_from_slice(&wire::ack(IOTLB_MSG, 0));
            n_acks += 1;
        }
    }
    if let Some(wait) = change {
        s.publish(wait)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    }
    drop(s);
    (&*sock).write_all(&acks[..n_acks * ACK_LEN])?;
    Ok(true)
}
