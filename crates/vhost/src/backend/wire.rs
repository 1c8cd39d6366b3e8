//! The messages the `vhost` crate does not dispatch, on the wire: the one place pvnet reads and
//! decodes them, and frames its replies to them.
//!
//! `VHOST_USER_SET_LOG_FD` (7), `SET_VRING_ENABLE` (18: the crate refuses it before
//! `SET_FEATURES` acked protocol features, see `run`), `SEND_RARP` (19), `NET_SET_MTU` (20),
//! `SET_BACKEND_REQ_FD` (21) and `IOTLB_MSG` (22) come on the crate's framing: a 12-byte header (request, flags,
//! body size), the body, and the fds attached to it. The header is peeked, never consumed, to
//! learn whether the next message is one of these ([`peek_own`]); the crate reads anything
//! else.
//!
//! The frontend is untrusted. Each request has one shape ([`Request`]: the body sizes it may
//! have and the fds it carries); the size in the header is checked against it before a byte
//! of the body is read, so every read is bounded (at most [`IOTLB_RUN`] IOTLB messages, else
//! 20 bytes). [`decode`] checks a whole message against its shape (size, length on the wire,
//! fd count) and its body (the IOTLB message's type, the backend channel being a socket); a
//! message that fails is an error, and the session ends with it. Every fd received is owned
//! at once, so a refused one is closed.

use crate::iotlb::{
    IotlbMsg, BODY_LEN, HDR_LEN, HDR_NEED_REPLY, HDR_REPLY, HDR_VERSION, IOTLB_MSG,
    SET_BACKEND_REQ_FD,
};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// `VHOST_USER_SET_LOG_FD` (request 7).
pub(super) const SET_LOG_FD: u32 = 7;
/// `VHOST_USER_SET_VRING_ENABLE` (request 18): a `vhost_vring_state` body (index, num).
pub(super) const SET_VRING_ENABLE: u32 = 18;
/// `VHOST_USER_SEND_RARP` (request 19): the guest's MAC address in a u64 body.
pub(super) const SEND_RARP: u32 = 19;
/// `VHOST_USER_NET_SET_MTU` (request 20): the MTU the frontend gave the guest, in a u64 body.
pub(super) const NET_SET_MTU: u32 = 20;

/// IOTLB messages read (and applied) as one run before one publish.
pub(super) const IOTLB_RUN: usize = 256;
/// A reply: the header and a u64 status.
pub(super) const ACK_LEN: usize = HDR_LEN + 8;
/// One IOTLB message on the wire.
const IOTLB_LEN: usize = HDR_LEN + BODY_LEN;
/// The longest message read alone (every body but the IOTLB message's is 0 or 8 bytes).
const ONE_LEN: usize = HDR_LEN + 8;
/// Room for as many fds as a vhost-user message may carry, in every receive: with room for
/// one, vmm-sys-util's `recv_with_fd` leaks a second fd the kernel fits into the cmsg buffer's
/// alignment padding (found by the vhost_msg fuzz target).
const MAX_FDS: usize = 32;

/// A message's header: request, flags, body size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    /// The request code.
    pub(super) request: u32,
    /// Version, reply and need-reply bits.
    pub(super) flags: u32,
    /// The body size the frontend declares.
    pub(super) size: u32,
}

impl Header {
    /// The header at the start of `b`, if `b` holds one.
    fn parse(b: &[u8]) -> Option<Self> {
        let word = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        Some(Self {
            request: word(0)?,
            flags: word(4)?,
            size: word(8)?,
        })
    }

    /// The frontend asked for an ack (`NEED_REPLY`; sent only with `REPLY_ACK` negotiated).
    pub(super) fn need_reply(self) -> bool {
        self.flags & HDR_NEED_REPLY != 0
    }
}

/// A request pvnet reads itself, and the shape it has on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Request {
    /// `SET_LOG_FD`: one fd (an eventfd), a body of 0 or 8 bytes.
    SetLogFd,
    /// `SET_VRING_ENABLE`: an 8-byte body, no fd.
    SetVringEnable,
    /// `SEND_RARP`: an 8-byte body, no fd.
    SendRarp,
    /// `NET_SET_MTU`: an 8-byte body, no fd.
    SetMtu,
    /// `SET_BACKEND_REQ_FD`: one fd (a socket), a body of 0 or 8 bytes.
    SetBackendReqFd,
    /// `IOTLB_MSG`: a 32-byte `vhost_iotlb_msg`, no fd.
    Iotlb,
}

impl Request {
    /// The request `code` names, if pvnet reads it itself.
    pub(super) fn of(code: u32) -> Option<Self> {
        Some(match code {
            SET_LOG_FD => Self::SetLogFd,
            SET_VRING_ENABLE => Self::SetVringEnable,
            SEND_RARP => Self::SendRarp,
            NET_SET_MTU => Self::SetMtu,
            SET_BACKEND_REQ_FD => Self::SetBackendReqFd,
            IOTLB_MSG => Self::Iotlb,
            _ => return None,
        })
    }

    /// Its name in errors.
    fn name(self) -> &'static str {
        match self {
            Self::SetLogFd => "SET_LOG_FD",
            Self::SetVringEnable => "SET_VRING_ENABLE",
            Self::SendRarp => "SEND_RARP",
            Self::SetMtu => "NET_SET_MTU",
            Self::SetBackendReqFd => "SET_BACKEND_REQ_FD",
            Self::Iotlb => "IOTLB message",
        }
    }

    /// The body sizes it may have.
    fn sizes(self) -> &'static [usize] {
        match self {
            Self::SetLogFd | Self::SetBackendReqFd => &[0, 8],
            Self::SetVringEnable | Self::SendRarp | Self::SetMtu => &[8],
            Self::Iotlb => &[BODY_LEN],
        }
    }

    /// The fds it carries.
    fn fds(self) -> usize {
        match self {
            Self::SetLogFd | Self::SetBackendReqFd => 1,
            Self::SetVringEnable | Self::SendRarp | Self::SetMtu | Self::Iotlb => 0,
        }
    }

    /// The whole message's length for the body `size` a header declares, if the request may
    /// have that size: checked before the body is read.
    pub(super) fn len(self, size: u32) -> Result<usize, DecodeError> {
        let body = usize::try_from(size).unwrap_or(usize::MAX);
        if self.sizes().contains(&body) {
            Ok(HDR_LEN + body)
        } else {
            Err(DecodeError::Size {
                what: self.name(),
                size,
            })
        }
    }
}

/// A message the crate does not dispatch, decoded and validated.
#[derive(Debug)]
pub(super) enum Own {
    /// `SET_LOG_FD`: the eventfd to signal dirty-log updates with.
    LogFd(File),
    /// `SET_VRING_ENABLE`: the ring and 1 (enable), 0 (disable) or anything else (refused).
    VringEnable {
        /// The ring.
        index: u32,
        /// The state asked for.
        num: u32,
    },
    /// `SEND_RARP`: the guest's MAC address.
    Rarp([u8; 6]),
    /// `NET_SET_MTU`: the MTU, as the frontend sent it (its range is the session's check).
    Mtu(u64),
    /// `SET_BACKEND_REQ_FD`: the backend channel's socket.
    BackendChannel(UnixStream),
    /// `IOTLB_MSG`: a grant or a revocation (its meaning is checked by the session).
    Iotlb(IotlbMsg),
}

/// Why a message pvnet reads itself was refused. The session ends with it.
#[derive(Debug, thiserror::Error)]
pub(super) enum DecodeError {
    /// A request pvnet leaves to the crate.
    #[error("request {0} is not one the session reads itself")]
    NotOurs(u32),
    /// A body size the request cannot have.
    #[error("{what} of {size} bytes")]
    Size {
        /// The request.
        what: &'static str,
        /// The size the header declares.
        size: u32,
    },
    /// Fewer bytes than the header declares (the frontend hung up in the middle).
    #[error("{what} cut short")]
    CutShort {
        /// The request.
        what: &'static str,
    },
    /// Not the fds the request carries.
    #[error("{what} with {fds} fds")]
    Fds {
        /// The request.
        what: &'static str,
        /// The fds that came with it.
        fds: usize,
    },
    /// An IOTLB message of a type that does not exist.
    #[error("IOTLB message of type {0}")]
    IotlbType(u8),
    /// A backend channel that is not a socket.
    #[error("SET_BACKEND_REQ_FD with an fd that is not a socket")]
    NotSocket,
}

impl From<DecodeError> for io::Error {
    fn from(e: DecodeError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// Decodes one whole message, `m` (header and body), and the fds that came with it: the one
/// decoder of the messages the crate does not dispatch. Checks the request, its body size,
/// the bytes on the wire against that size, the fd count, and the body.
pub(super) fn decode(m: &[u8], files: Vec<File>) -> Result<(Header, Own), DecodeError> {
    let hdr = Header::parse(m).ok_or(DecodeError::CutShort { what: "header" })?;
    let req = Request::of(hdr.request).ok_or(DecodeError::NotOurs(hdr.request))?;
    let what = req.name();
    if m.len() != req.len(hdr.size)? {
        return Err(DecodeError::CutShort { what });
    }
    if files.len() != req.fds() {
        let fds = files.len();
        return Err(DecodeError::Fds { what, fds });
    }
    let body = &m[HDR_LEN..];
    let mut files = files.into_iter();
    let own = match (req, files.next()) {
        (Request::SetLogFd, Some(f)) => Own::LogFd(f),
        (Request::SetBackendReqFd, Some(f)) => {
            let socket = f
                .metadata()
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
            if !socket {
                return Err(DecodeError::NotSocket);
            }
            Own::BackendChannel(UnixStream::from(OwnedFd::from(f)))
        }
        (Request::SetVringEnable, None) => Own::VringEnable {
            index: le32(body, 0),
            num: le32(body, 4),
        },
        (Request::SendRarp, None) => {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&body[..6]);
            Own::Rarp(mac)
        }
        (Request::SetMtu, None) => {
            Own::Mtu(u64::from(le32(body, 0)) | (u64::from(le32(body, 4)) << 32))
        }
        (Request::Iotlb, None) => Own::Iotlb(
            IotlbMsg::parse(body).ok_or(DecodeError::IotlbType(body[25]))?, // 25: `type`
        ),
        // The count was checked against the request above.
        (_, f) => {
            let fds = usize::from(f.is_some());
            return Err(DecodeError::Fds { what, fds });
        }
    };
    Ok((hdr, own))
}

/// The little-endian u32 at byte `i` of `b` (0 past its end; callers check lengths first).
fn le32(b: &[u8], i: usize) -> u32 {
    b.get(i..i + 4)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The next message's header if the message is one the session reads itself, peeked: the
/// bytes (and any fds) stay queued. `None` for anything else, and for no whole header queued
/// (EOF, an error, a header that lags its first byte): the crate reads and reports those.
pub(super) fn peek_own(sock: &UnixStream) -> Option<(Header, Request)> {
    let mut b = [0u8; HDR_LEN];
    if peek(sock, &mut b, 0) != HDR_LEN {
        return None;
    }
    let hdr = Header::parse(&b)?;
    Some((hdr, Request::of(hdr.request)?))
}

/// Copies what is queued on `sock` into `buf` without consuming it (`MSG_PEEK` and `flags`):
/// the bytes and any fds attached stay for whoever reads next. The bytes peeked; 0 on EOF or
/// an error.
fn peek(sock: &UnixStream, buf: &mut [u8], flags: libc::c_int) -> usize {
    // SAFETY: `buf` is valid for writes of its length; MSG_PEEK leaves the bytes queued.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | flags,
        )
    };
    usize::try_from(n).unwrap_or(0)
}

/// Waits up to a second for the whole message whose header `peek_own` saw (`len` bytes, at
/// most [`ONE_LEN`]) to be queued: a message sent with one sendmsg arrives whole, but a body
/// that lags its header is waited for rather than a half-seen message handed to the crate.
/// True once it is; false if it is not (or the socket ends) within the wait.
pub(super) fn wait_whole(sock: &UnixStream, len: usize) -> bool {
    let mut b = [0u8; ONE_LEN];
    let Some(b) = b.get_mut(..len) else {
        return false;
    };
    for attempt in 0..100 {
        let n = peek(sock, b, 0);
        if n == len {
            return true;
        }
        if n < HDR_LEN || attempt == 99 {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Reads and decodes the message (not an IOTLB message: see [`take_iotlb_run`]) whose header
/// `peek_own` saw: its size is checked first, so at most [`ONE_LEN`] bytes are read, with
/// their fds.
pub(super) fn take(sock: &UnixStream, hdr: Header, req: Request) -> io::Result<Own> {
    let len = req.len(hdr.size)?;
    let mut m = [0u8; ONE_LEN];
    let m = m.get_mut(..len).ok_or(DecodeError::Size {
        what: req.name(),
        size: hdr.size,
    })?;
    let files = recv_exact(sock, m, req.name())?;
    Ok(decode(m, files)?.1)
}

/// A run of IOTLB messages, decoded, in the order they came.
pub(super) struct IotlbRun {
    msgs: [Option<(IotlbMsg, bool)>; IOTLB_RUN],
}

impl IotlbRun {
    /// Each message and whether it asked for an ack.
    pub(super) fn iter(&self) -> impl Iterator<Item = (IotlbMsg, bool)> + '_ {
        self.msgs.iter().map_while(|m| *m)
    }
}

/// Reads the IOTLB message whose header (`first`) `peek_own` saw and those queued right
/// behind it, up to [`IOTLB_RUN`] and only what is queued already (a frontend that pipelines
/// its grants pays one read per burst; one that waits for each ack sees no difference); the
/// run stops at the first other message, left queued. Every message of the run is decoded
/// (the fds that came with the run are counted against its first message: it carries none);
/// a malformed one is an error.
pub(super) fn take_iotlb_run(sock: &UnixStream, first: Header) -> io::Result<IotlbRun> {
    Request::Iotlb.len(first.size)?;
    let mut buf = [0u8; IOTLB_RUN * IOTLB_LEN];
    // What is queued already (MSG_DONTWAIT: never wait for more), then the whole IOTLB
    // messages at its start.
    let peeked = peek(sock, &mut buf, libc::MSG_DONTWAIT);
    let mut whole = 0;
    while (whole + 1) * IOTLB_LEN <= peeked {
        match Header::parse(&buf[whole * IOTLB_LEN..]) {
            Some(h) if h.request == IOTLB_MSG => {
                Request::Iotlb.len(h.size)?;
                whole += 1;
            }
            _ => break,
        }
    }
    // The first message's body may still be on its way: then it alone, waiting for it.
    let m = &mut buf[..whole.max(1) * IOTLB_LEN];
    let mut files = recv_exact(sock, m, Request::Iotlb.name())?;
    let mut run = IotlbRun {
        msgs: [None; IOTLB_RUN],
    };
    for (m, out) in m.chunks_exact(IOTLB_LEN).zip(&mut run.msgs) {
        match decode(m, std::mem::take(&mut files))? {
            (hdr, Own::Iotlb(msg)) => *out = Some((msg, hdr.need_reply())),
            (hdr, _) => return Err(DecodeError::NotOurs(hdr.request).into()),
        }
    }
    Ok(run)
}

/// Fills `buf` from `sock` (one message, or a run of them), owning every fd that comes with
/// it. An error if the frontend hangs up first.
fn recv_exact(sock: &UnixStream, buf: &mut [u8], what: &'static str) -> io::Result<Vec<File>> {
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let mut files = Vec::new();
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        let mut iov = [libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        }];
        let mut raw = [-1; MAX_FDS];
        // SAFETY: the iovec points at `rest`, valid for writes of the length given.
        let (n, fds) = unsafe { sock.recv_with_fds(&mut iov, &mut raw) }
            .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
        // SAFETY: the first `fds` entries are fds just received, owned by nothing else.
        files.extend(
            raw[..fds]
                .iter()
                .map(|&fd| File::from(unsafe { OwnedFd::from_raw_fd(fd) })),
        );
        if n == 0 {
            return Err(DecodeError::CutShort { what }.into());
        }
        got += n;
    }
    Ok(files)
}

/// Acks a request the session handled itself, if the frontend asked (`NEED_REPLY` with
/// `REPLY_ACK` negotiated in `protocol`): `status` 0 for success.
pub(super) fn reply_ack(
    sock: &UnixStream,
    hdr: Header,
    protocol: u64,
    status: u64,
) -> io::Result<()> {
    if hdr.need_reply() && reply_ack_negotiated(protocol) {
        (&*sock).write_all(&ack(hdr.request, status))?;
    }
    Ok(())
}

/// Whether `REPLY_ACK` is among the protocol features acked.
pub(super) fn reply_ack_negotiated(protocol: u64) -> bool {
    protocol & vhost::vhost_user::VhostUserProtocolFeatures::REPLY_ACK.bits() != 0
}

/// The reply to `request` carrying `status` (0: success) as its u64 body.
pub(super) fn ack(request: u32, status: u64) -> [u8; ACK_LEN] {
    let mut reply = [0u8; ACK_LEN];
    reply[0..4].copy_from_slice(&request.to_le_bytes());
    reply[4..8].copy_from_slice(&(HDR_VERSION | HDR_REPLY).to_le_bytes());
    reply[8..12].copy_from_slice(&8u32.to_le_bytes());
    reply[12..20].copy_from_slice(&status.to_le_bytes());
    reply
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iotlb::Kind;
    use std::io::Read;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;

    fn msg(request: u32, size: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&request.to_le_bytes());
        m.extend_from_slice(&(HDR_VERSION | HDR_NEED_REPLY).to_le_bytes());
        m.extend_from_slice(&size.to_le_bytes());
        m.extend_from_slice(body);
        m
    }

    fn memfd() -> File {
        // SAFETY: a valid NUL-terminated name; the fd is checked, then owned by the File.
        let fd = unsafe { libc::memfd_create(c"wire".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: just created, owned by nothing else.
        File::from(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn socket() -> File {
        File::from(OwnedFd::from(UnixStream::pair().unwrap().0))
    }

    fn grant() -> IotlbMsg {
        IotlbMsg {
            iova: 0x1000,
            size: 0x2000,
            uaddr: 0x7f00_0000_0000,
            perm: 3,
            kind: Kind::Update,
        }
    }

    /// Every request pvnet reads itself, well formed, decodes to what it says.
    #[test]
    fn good_messages_decode() {
        let rarp = msg(SEND_RARP, 8, &[2, 0, 0, 0, 0, 9, 0, 0]);
        let (hdr, own) = decode(&rarp, vec![]).unwrap();
        assert!(hdr.need_reply());
        assert!(matches!(own, Own::Rarp([2, 0, 0, 0, 0, 9])));
        let enable = msg(SET_VRING_ENABLE, 8, &[3, 0, 0, 0, 1, 0, 0, 0]);
        let (_, own) = decode(&enable, vec![]).unwrap();
        assert!(matches!(own, Own::VringEnable { index: 3, num: 1 }));
        for size in [0, 8] {
            let m = msg(SET_LOG_FD, size, &vec![0; size as usize]);
            assert!(matches!(decode(&m, vec![memfd()]), Ok((_, Own::LogFd(_)))));
            let m = msg(SET_BACKEND_REQ_FD, size, &vec![0; size as usize]);
            let got = decode(&m, vec![socket()]);
            assert!(matches!(got, Ok((_, Own::BackendChannel(_)))));
        }
        let m = grant().message(IOTLB_MSG, HDR_VERSION);
        let (hdr, own) = decode(&m, vec![]).unwrap();
        assert!(!hdr.need_reply());
        assert!(matches!(own, Own::Iotlb(g) if g == grant()));
    }

    /// A message shorter than its header says, or than a header, is refused.
    #[test]
    fn truncated_messages_are_refused() {
        let cut = |m: &[u8], files| matches!(decode(m, files), Err(DecodeError::CutShort { .. }));
        assert!(cut(&msg(SEND_RARP, 8, &[2, 0, 0, 0]), vec![]));
        assert!(cut(&msg(SEND_RARP, 8, &[])[..HDR_LEN - 1], vec![]));
        let iotlb = grant().message(IOTLB_MSG, HDR_VERSION);
        assert!(cut(&iotlb[..iotlb.len() - 1], vec![]));
        assert!(cut(&msg(SET_LOG_FD, 8, &[0; 4]), vec![memfd()]));
        // Over a socket: the frontend hangs up in the middle of the body.
        let (mut front, back) = UnixStream::pair().unwrap();
        front.write_all(&iotlb[..HDR_LEN + 10]).unwrap();
        front.shutdown(std::net::Shutdown::Write).unwrap();
        let (hdr, req) = peek_own(&back).unwrap();
        assert_eq!(req, Request::Iotlb);
        let e = take_iotlb_run(&back, hdr).err().expect("cut short");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("cut short"), "{e}");
    }

    /// A size the request cannot have is refused from the header alone: nothing of the body
    /// is read (a size of 4 GiB costs nothing).
    #[test]
    fn oversized_messages_are_refused_before_their_body_is_read() {
        for (request, size) in [
            (SEND_RARP, 9),
            (SEND_RARP, 0),
            (SET_VRING_ENABLE, 16),
            (SET_LOG_FD, 16),
            (SET_BACKEND_REQ_FD, 4096),
            (IOTLB_MSG, 33),
            (IOTLB_MSG, u32::MAX),
        ] {
            let m = msg(request, size, &[0; 40]);
            let e = decode(&m, vec![]).unwrap_err();
            assert!(
                matches!(e, DecodeError::Size { size: s, .. } if s == size),
                "{e}"
            );
            let (mut front, back) = UnixStream::pair().unwrap();
            front.write_all(&m).unwrap();
            let (hdr, req) = peek_own(&back).unwrap();
            let e = if req == Request::Iotlb {
                take_iotlb_run(&back, hdr).err()
            } else {
                take(&back, hdr, req).err()
            };
            let e = e.expect("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            let mut left = vec![0u8; m.len()];
            (&back).read_exact(&mut left).unwrap();
            assert_eq!(left, m, "request {request} of {size}: nothing read");
        }
    }

    /// A request with other fds than it carries is refused, and the fds are closed.
    #[test]
    fn wrong_fd_counts_are_refused() {
        let fds = |e: Result<_, DecodeError>, n| matches!(e, Err(DecodeError::Fds { fds, .. }) if fds == n);
        assert!(fds(decode(&msg(SET_LOG_FD, 0, &[]), vec![]), 0));
        assert!(fds(
            decode(&msg(SET_LOG_FD, 0, &[]), vec![memfd(), memfd()]),
            2
        ));
        assert!(fds(decode(&msg(SET_BACKEND_REQ_FD, 8, &[0; 8]), vec![]), 0));
        assert!(fds(decode(&msg(SEND_RARP, 8, &[0; 8]), vec![memfd()]), 1));
        let iotlb = grant().message(IOTLB_MSG, HDR_VERSION);
        assert!(fds(decode(&iotlb, vec![memfd()]), 1));
        // Over a socket: an IOTLB run whose second message carries an fd.
        let (front, back) = UnixStream::pair().unwrap();
        front.send_with_fds(&[&iotlb[..]], &[]).unwrap();
        let f = memfd();
        front
            .send_with_fds(&[&iotlb[..]], &[f.as_raw_fd()])
            .unwrap();
        let (hdr, _) = peek_own(&back).unwrap();
        let e = take_iotlb_run(&back, hdr).err().expect("an fd in the run");
        assert!(e.to_string().contains("with 1 fds"), "{e}");
        // A backend channel that is not a socket.
        let m = msg(SET_BACKEND_REQ_FD, 0, &[]);
        assert!(matches!(
            decode(&m, vec![memfd()]),
            Err(DecodeError::NotSocket)
        ));
    }

    /// The body is checked too: an IOTLB message of no known type; a request pvnet leaves to
    /// the crate is not decoded here, and not peeked as its own.
    #[test]
    fn bad_bodies_and_other_requests_are_refused() {
        let mut m = grant().message(IOTLB_MSG, HDR_VERSION);
        m[HDR_LEN + 25] = 9;
        assert!(matches!(decode(&m, vec![]), Err(DecodeError::IotlbType(9))));
        let get_features = msg(1, 0, &[]);
        assert!(matches!(
            decode(&get_features, vec![]),
            Err(DecodeError::NotOurs(1))
        ));
        let (mut front, back) = UnixStream::pair().unwrap();
        front.write_all(&get_features).unwrap();
        assert_eq!(peek_own(&back), None);
    }

    /// A pipelined run is read in one go up to the first other message, each message with its
    /// own need-reply bit.
    #[test]
    fn an_iotlb_run_stops_at_the_first_other_message() {
        let (mut front, back) = UnixStream::pair().unwrap();
        let quiet = grant().message(IOTLB_MSG, HDR_VERSION);
        let loud = grant().message(IOTLB_MSG, HDR_VERSION | HDR_NEED_REPLY);
        let other = msg(SEND_RARP, 8, &[0; 8]);
        front
            .write_all(&[&quiet[..], &loud[..], &other[..], &quiet[..]].concat())
            .unwrap();
        let (hdr, _) = peek_own(&back).unwrap();
        let run = take_iotlb_run(&back, hdr).unwrap();
        let got: Vec<bool> = run.iter().map(|(_, r)| r).collect();
        assert_eq!(got, [false, true]);
        assert_eq!(peek_own(&back).map(|(_, r)| r), Some(Request::SendRarp));
    }
}
