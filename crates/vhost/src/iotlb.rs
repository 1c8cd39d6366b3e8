//! The vhost-user IOTLB on the wire, both ways, and the backend request channel it uses.
//!
//! With `VIRTIO_F_ACCESS_PLATFORM` every address in the rings is an IOVA. The frontend grants
//! and revokes ranges with `VHOST_USER_IOTLB_MSG` (request 22) on the main channel
//! (`VHOST_IOTLB_UPDATE`, `VHOST_IOTLB_INVALIDATE`); the backend asks for what it misses with
//! `VHOST_USER_BACKEND_IOTLB_MSG` (request 1) on the backend channel, whose socket the
//! frontend passes with `VHOST_USER_SET_BACKEND_REQ_FD` (request 21), and reports a refused
//! access the same way (`VHOST_IOTLB_ACCESS_FAIL`). The body is the kernel's
//! `struct vhost_iotlb_msg`: `iova`, `size`, `uaddr` (u64 each), `perm`, `type` (u8 each),
//! padded to 32 bytes.
//!
//! The `vhost` crate dispatches none of these messages, so pvnet handles them here, on the
//! crate's framing (the 12-byte header) and the same socket.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use virtq::Perm;

/// Main channel: `VHOST_USER_SET_BACKEND_REQ_FD`.
pub(crate) const SET_BACKEND_REQ_FD: u32 = 21;
/// Main channel: `VHOST_USER_IOTLB_MSG`.
pub(crate) const IOTLB_MSG: u32 = 22;
/// Backend channel: `VHOST_USER_BACKEND_IOTLB_MSG`.
pub(crate) const BACKEND_IOTLB_MSG: u32 = 1;
/// `struct vhost_iotlb_msg` on the wire.
pub(crate) const BODY_LEN: usize = 32;
/// Header flags: protocol version 1, reply, need-reply (vhost-user spec, "Header"). These and
/// the header length serve every message pvnet frames itself (the session's too).
pub(crate) const HDR_VERSION: u32 = 0x1;
/// Reply flag.
pub(crate) const HDR_REPLY: u32 = 0x4;
/// Need-reply flag.
pub(crate) const HDR_NEED_REPLY: u32 = 0x8;
/// Header length: request, flags, body size (u32 each).
pub(crate) const HDR_LEN: usize = 12;

/// `type` of a `vhost_iotlb_msg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Backend -> frontend: no translation for `iova` with `perm`.
    Miss = 1,
    /// Frontend -> backend: grant `iova .. iova + size` at `uaddr` with `perm`.
    Update = 2,
    /// Frontend -> backend: revoke `iova .. iova + size`.
    Invalidate = 3,
    /// Backend -> frontend: an access to `iova` with `perm` was refused.
    AccessFail = 4,
}

/// One `vhost_iotlb_msg`, parsed. `perm` is kept raw: what it means is checked by whoever
/// acts on the message (an update with no or unknown access bits is refused there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IotlbMsg {
    /// Start of the range.
    pub iova: u64,
    /// Its length.
    pub size: u64,
    /// The frontend's user address of `iova` (updates only).
    pub uaddr: u64,
    /// `VHOST_ACCESS_RO` 1, `_WO` 2, `_RW` 3.
    pub perm: u8,
    /// What the message asks.
    pub kind: Kind,
}

impl IotlbMsg {
    /// Parses a body; `None` if it is not 32 bytes or its type is unknown.
    pub(crate) fn parse(b: &[u8]) -> Option<Self> {
        if b.len() != BODY_LEN {
            return None;
        }
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let kind = match b[25] {
            1 => Kind::Miss,
            2 => Kind::Update,
            3 => Kind::Invalidate,
            4 => Kind::AccessFail,
            _ => return None,
        };
        Some(Self {
            iova: u(0),
            size: u(8),
            uaddr: u(16),
            perm: b[24],
            kind,
        })
    }

    /// The body on the wire.
    pub(crate) fn body(&self) -> [u8; BODY_LEN] {
        let mut b = [0u8; BODY_LEN];
        b[0..8].copy_from_slice(&self.iova.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.uaddr.to_le_bytes());
        b[24] = self.perm;
        b[25] = self.kind as u8;
        b
    }

    /// A whole message: header (`request`, `flags`, size 32) and body.
    pub(crate) fn message(&self, request: u32, flags: u32) -> [u8; HDR_LEN + BODY_LEN] {
        let mut m = [0u8; HDR_LEN + BODY_LEN];
        m[0..4].copy_from_slice(&request.to_le_bytes());
        m[4..8].copy_from_slice(&flags.to_le_bytes());
        #[allow(clippy::cast_possible_truncation)] // 32
        m[8..12].copy_from_slice(&(BODY_LEN as u32).to_le_bytes());
        m[HDR_LEN..].copy_from_slice(&self.body());
        m
    }
}

/// The backend request channel of one frontend connection: where the dataplane asks for the
/// translations it misses. Shared by the session (which receives the socket) and the queues
/// (which send on it, from the worker, only when a translation is missing).
#[derive(Debug, Default)]
pub struct BackendChannel {
    sock: Mutex<Option<UnixStream>>,
    /// MISS requests sent.
    pub misses: AtomicU64,
    /// ACCESS_FAIL reports sent.
    pub access_fails: AtomicU64,
    /// Requests that could not be sent (no channel yet, or its buffer full).
    pub unsent: AtomicU64,
}

impl BackendChannel {
    /// Takes the socket the frontend passed (`SET_BACKEND_REQ_FD`), replacing any earlier one.
    /// Writes never block the worker: the socket is made non-blocking.
    pub(crate) fn set(&self, sock: UnixStream) -> io::Result<()> {
        sock.set_nonblocking(true)?;
        *self.sock.lock().unwrap_or_else(|p| p.into_inner()) = Some(sock);
        Ok(())
    }

    /// Whether the frontend gave a channel.
    pub fn is_set(&self) -> bool {
        self.sock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Asks the frontend for a translation of `iova` with `perm`. No reply is asked for: the
    /// answer is an `UPDATE` on the main channel. Returns whether it was sent.
    pub fn miss(&self, iova: u64, perm: Perm) -> bool {
        self.report(Kind::Miss, iova, perm, &self.misses)
    }

    /// Tells the frontend an access to `iova` with `perm` was refused.
    pub fn access_fail(&self, iova: u64, perm: Perm) -> bool {
        self.report(Kind::AccessFail, iova, perm, &self.access_fails)
    }

    /// Sends a backend's report about `iova` and counts it in `sent` if it went out.
    fn report(&self, kind: Kind, iova: u64, perm: Perm, sent: &AtomicU64) -> bool {
        let ok = self.send(IotlbMsg {
            iova,
            size: 0,
            uaddr: 0,
            perm: perm as u8,
            kind,
        });
        if ok {
            sent.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    fn send(&self, m: IotlbMsg) -> bool {
        let guard = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        let ok = guard.as_ref().is_some_and(|mut s| {
            s.write_all(&m.message(BACKEND_IOTLB_MSG, HDR_VERSION))
                .is_ok()
        });
        if !ok {
            self.unsent.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let m = IotlbMsg {
            iova: 0x1234_5000,
            size: 0x1000,
            uaddr: 0x7f00_0000_0000,
            perm: 3,
            kind: Kind::Update,
        };
        let wire = m.message(IOTLB_MSG, HDR_VERSION | HDR_NEED_REPLY);
        assert_eq!(&wire[0..4], &22u32.to_le_bytes());
        assert_eq!(&wire[8..12], &32u32.to_le_bytes());
        assert_eq!(IotlbMsg::parse(&wire[HDR_LEN..]), Some(m));
        assert_eq!(IotlbMsg::parse(&wire[HDR_LEN + 1..]), None, "short");
        let mut bad = m.body();
        bad[25] = 9;
        assert_eq!(IotlbMsg::parse(&bad), None, "unknown type");
    }
}

/// How a frontend grants the device access to its buffers (`VIRTIO_F_ACCESS_PLATFORM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GrantMode {
    /// No IOMMU: the device reaches all shared memory.
    #[default]
    Off,
    /// Each buffer granted (`UPDATE`) before it is posted and revoked (`INVALIDATE`) when it
    /// comes back, each acked: a guest with `iommu.strict=1`, Xen's original per-packet grant.
    PerPacket,
    /// The rings and both buffer pools granted once at start and kept: staging grants.
    Pool,
}

/// A grant mode that is none of `off`, `per-packet`, `pool` (the text given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("grants: off, per-packet or pool, not {0:?}")]
pub struct ParseGrantModeError(pub String);

impl std::str::FromStr for GrantMode {
    type Err = ParseGrantModeError;
    fn from_str(s: &str) -> Result<Self, ParseGrantModeError> {
        match s {
            "off" => Ok(Self::Off),
            "per-packet" => Ok(Self::PerPacket),
            "pool" => Ok(Self::Pool),
            _ => Err(ParseGrantModeError(s.to_owned())),
        }
    }
}

impl std::fmt::Display for GrantMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Off => "off",
            Self::PerPacket => "per-packet",
            Self::Pool => "pool",
        })
    }
}

/// IOTLB counters of a frontend.
#[derive(Debug, Default, Clone, Copy)]
pub struct GrantStats {
    /// `UPDATE`s sent.
    pub updates: u64,
    /// `INVALIDATE`s sent.
    pub invalidates: u64,
    /// `MISS`es the device sent that were answered with a grant still held.
    pub misses_answered: u64,
    /// `MISS`es for ranges not granted (the device looked where it may not), and
    /// `ACCESS_FAIL`s.
    pub misses_refused: u64,
}

/// Messages a frontend queues before it sends them and reads their acks in one go.
const PIPELINE: usize = 256;

/// The frontend's side of the IOTLB: sends grants and revocations on the main channel (each
/// acked: the device holds the grant, or has dropped it, once its ack is read) and answers the
/// device's misses from what it still grants.
///
/// Messages are pipelined: [`queue_grant`](Self::queue_grant) and
/// [`queue_revoke`](Self::queue_revoke) only queue, and [`flush`](Self::flush) writes the
/// queue at once and reads one ack per message. A burst's grants thus cost one round trip,
/// not one each, as Xen's netback mapped a batch of grants in one hypercall: the per-packet
/// cost left is the device's work per message, which is what the mode measures.
#[derive(Debug)]
pub(crate) struct Granter {
    /// The main channel (a clone of the socket the `vhost` crate's frontend uses; the calls
    /// never interleave, the client is single-threaded).
    main: UnixStream,
    /// Our end of the backend request channel.
    backend: UnixStream,
    /// What we granted, to answer misses.
    held: virtq::Iotlb,
    /// Messages queued and not yet sent, on the wire.
    wire: Vec<u8>,
    /// The same messages, to name one the device refuses.
    queued: Vec<IotlbMsg>,
    /// Acks read back.
    acks: Vec<u8>,
    /// Each buffer is granted while posted (`GrantMode::PerPacket`), not the pools once.
    pub per_packet: bool,
    /// Counters.
    pub stats: GrantStats,
}

impl Granter {
    /// Over the main channel `main`, with our end of the backend channel `backend`;
    /// `per_packet`: buffers are granted one at a time (see [`GrantMode`]).
    pub(crate) fn new(main: UnixStream, backend: UnixStream, per_packet: bool) -> io::Result<Self> {
        backend.set_nonblocking(true)?;
        Ok(Self {
            main,
            backend,
            per_packet,
            held: virtq::Iotlb::new(usize::MAX),
            wire: Vec::with_capacity(PIPELINE * (HDR_LEN + BODY_LEN)),
            queued: Vec::with_capacity(PIPELINE),
            acks: vec![0; PIPELINE * (HDR_LEN + 8)],
            stats: GrantStats::default(),
        })
    }

    /// Grants `iova .. iova + len` at our user address `uaddr` with `perm`, and waits for the
    /// ack (with everything queued before it).
    pub(crate) fn grant(&mut self, iova: u64, len: u64, uaddr: u64, perm: Perm) -> io::Result<()> {
        self.queue_grant(iova, len, uaddr, perm)?;
        self.flush()
    }

    /// Queues a grant of `iova .. iova + len` at our user address `uaddr` with `perm`: the
    /// device may be given the range once [`flush`](Self::flush) has returned.
    pub(crate) fn queue_grant(
        &mut self,
        iova: u64,
        len: u64,
        uaddr: u64,
        perm: Perm,
    ) -> io::Result<()> {
        self.held
            .update(virtq::Grant {
                iova,
                len,
                uaddr,
                perm,
            })
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.stats.updates += 1;
        self.queue(IotlbMsg {
            iova,
            size: len,
            uaddr,
            perm: perm as u8,
            kind: Kind::Update,
        })
    }

    /// Queues the revocation of `iova .. iova + len`: the device no longer reaches it once
    /// [`flush`](Self::flush) has returned (until then the range must not be reused).
    pub(crate) fn queue_revoke(&mut self, iova: u64, len: u64) -> io::Result<()> {
        self.held.invalidate(iova, len);
        self.stats.invalidates += 1;
        self.queue(IotlbMsg {
            iova,
            size: len,
            uaddr: 0,
            perm: 0,
            kind: Kind::Invalidate,
        })
    }

    fn queue(&mut self, m: IotlbMsg) -> io::Result<()> {
        self.wire
            .extend_from_slice(&m.message(IOTLB_MSG, HDR_VERSION | HDR_NEED_REPLY));
        self.queued.push(m);
        if self.queued.len() == PIPELINE {
            self.flush()?;
        }
        Ok(())
    }

    /// Sends what is queued (one write) and reads an ack for each message; an error names the
    /// first message refused.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        use std::io::Read;
        if self.queued.is_empty() {
            return Ok(());
        }
        self.main.write_all(&self.wire)?;
        self.wire.clear();
        let acks = &mut self.acks[..self.queued.len() * (HDR_LEN + 8)];
        (&self.main).read_exact(acks)?;
        for (ack, m) in acks.chunks_exact(HDR_LEN + 8).zip(&self.queued) {
            let status = u64::from_le_bytes(ack[HDR_LEN..].try_into().unwrap_or([0xff; 8]));
            if ack[0..4] != IOTLB_MSG.to_le_bytes() || status != 0 {
                let m = *m;
                self.queued.clear();
                return Err(io::Error::other(format!(
                    "IOTLB {:?} of {:#x}+{:#x} refused (status {status})",
                    m.kind, m.iova, m.size
                )));
            }
        }
        self.queued.clear();
        Ok(())
    }

    /// Answers the misses the device sent (non-blocking): a range still granted is granted
    /// again, anything else is counted and left unanswered (the device then stops the queue
    /// after its bound). Returns how many messages were read.
    pub(crate) fn serve_misses(&mut self) -> io::Result<usize> {
        use std::io::Read;
        let mut n = 0;
        loop {
            let mut m = [0u8; HDR_LEN + BODY_LEN];
            match (&self.backend).read_exact(&mut m) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(n),
                Err(e) => return Err(e),
            }
            n += 1;
            let msg = IotlbMsg::parse(&m[HDR_LEN..]);
            let held = msg
                .filter(|g| g.kind == Kind::Miss)
                .and_then(|g| self.held.find(g.iova, Perm::from_bits(g.perm)?));
            match held {
                Some(h) => {
                    self.grant(h.iova, h.len, h.uaddr, h.perm)?;
                    self.stats.misses_answered += 1;
                }
                None => self.stats.misses_refused += 1,
            }
        }
    }
}
