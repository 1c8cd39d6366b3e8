//! UDP sockets over the host's IPv4 stack, moved in batches (`recvmmsg(2)`, `sendmmsg(2)`):
//! the underlay of the VXLAN port (`port::vxlan`). The kernel builds and strips the outer
//! IPv4 and UDP headers; what pvnet reads and writes is the datagram's payload.
//!
//! A socket may be opened inside another network namespace ([`in_netns`]): a socket keeps the
//! namespace it was made in, whatever thread uses it later.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A bound, non-blocking IPv4 UDP socket.
#[derive(Debug)]
pub struct UdpSock {
    fd: OwnedFd,
    /// The port it is bound to (the kernel's choice for port 0).
    port: u16,
}

/// A `sockaddr_in` for `ip:port`.
pub(crate) fn sockaddr(ip: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or(2),
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn last(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn setopt(fd: RawFd, level: libc::c_int, opt: libc::c_int, val: libc::c_int) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(4);
    // SAFETY: `val` lives for the call and is `len` bytes; the kernel only reads it.
    let r = unsafe { libc::setsockopt(fd, level, opt, std::ptr::from_ref(&val).cast(), len) };
    if r < 0 {
        return Err(last("setsockopt"));
    }
    Ok(())
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked before use.
    let raw = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(last("UDP socket"));
    }
    // SAFETY: `raw` is a socket just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl UdpSock {
    /// A socket bound to `ip:port` (port 0: a free port the kernel picks).
    pub fn bind(ip: Ipv4Addr, port: u16) -> io::Result<Self> {
        let fd = socket()?;
        let sa = sockaddr(ip, port);
        let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).unwrap_or(16);
        // SAFETY: `sa` is a valid sockaddr_in of `len` bytes for the call.
        let r = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::from_ref(&sa).cast(), len) };
        if r < 0 {
            return Err(last(&format!("bind {ip}:{port}")));
        }
        let mut got = sockaddr(Ipv4Addr::UNSPECIFIED, 0);
        let mut glen = len;
        // SAFETY: `got` is writable for `glen` bytes; the kernel writes at most that.
        let r = unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                std::ptr::from_mut(&mut got).cast(),
                &mut glen,
            )
        };
        if r < 0 {
            return Err(last("getsockname"));
        }
        Ok(Self {
            fd,
            port: u16::from_be(got.sin_port),
        })
    }

    /// The local port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sets the kernel's receive and send buffers, bytes: what a burst of datagrams needs
    /// while the shard polls other rings or sleeps. Past `net.core.rmem_max` / `wmem_max`
    /// with `CAP_NET_ADMIN` (`SO_RCVBUFFORCE`), else up to them. Best effort.
    pub fn set_buffers(&self, bytes: u32) {
        let b = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        let fd = self.fd.as_raw_fd();
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setopt(fd, libc::SOL_SOCKET, force, b).is_err() {
                let _ = setopt(fd, libc::SOL_SOCKET, plain, b);
            }
        }
    }

    /// Receives up to `msgs.len()` datagrams without waiting: how many (0 when none waits).
    ///
    /// # Safety
    /// Every header's `msg_iov`, `msg_name` and `msg_control` must point at memory writable
    /// for the lengths they give, and nothing else may use it during the call.
    pub(crate) unsafe fn recv_many(&self, msgs: &mut [libc::mmsghdr]) -> io::Result<usize> {
        let n = libc::c_uint::try_from(msgs.len()).unwrap_or(0);
        // SAFETY: the caller's contract covers the buffers; `msgs` is `n` headers.
        let r = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        match usize::try_from(r) {
            Ok(k) => Ok(k),
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EAGAIN) {
                    Ok(0)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Sends the datagrams `msgs` describe, in order, until the kernel refuses one: how many
    /// went, or the errno of the first one if none did.
    ///
    /// # Safety
    /// Every header's `msg_iov` and `msg_name` must point at memory readable for the lengths
    /// they give during the call.
    pub(crate) unsafe fn send_many(&self, msgs: &mut [libc::mmsghdr]) -> Result<usize, i32> {
        let n = libc::c_uint::try_from(msgs.len()).unwrap_or(0);
        // SAFETY: the caller's contract covers the buffers; `msgs` is `n` headers.
        let r = unsafe {
            libc::sendmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n,
                libc::MSG_DONTWAIT,
            )
        };
        usize::try_from(r).map_err(|_| {
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        })
    }
}

/// `UDP_SEGMENT` (`linux/udp.h`): the segment size of one send, as a control message.
const UDP_SEGMENT: libc::c_int = 103;

/// The control message of a segmented send: a `cmsghdr` and the 2-byte segment size, padded
/// as `CMSG_SPACE(2)` is.
#[repr(C)]
struct GsoCmsg {
    hdr: libc::cmsghdr,
    size: u16,
    pad: [u8; 6],
}

impl UdpSock {
    /// Sends one buffer (gathered from `iov`) to `to` as datagrams of `seg` bytes each, the
    /// last one shorter if the buffer ends so (`UDP_SEGMENT`, Linux 4.18+: the kernel builds
    /// one buffer and cuts it late, in the device or the receiving socket). Returns the bytes
    /// sent, or the errno (`EIO`: the route's device has no checksum offload; `EINVAL`: the
    /// socket sends without checksums, or the segments do not fit).
    ///
    /// # Safety
    /// `iov` must point at `iovlen` iovecs over memory readable for their lengths during
    /// the call.
    pub(crate) unsafe fn send_segmented(
        &self,
        to: &libc::sockaddr_in,
        iov: *mut libc::iovec,
        iovlen: usize,
        seg: u16,
    ) -> Result<usize, i32> {
        let mut c = GsoCmsg {
            hdr: libc::cmsghdr {
                cmsg_len: size_of::<libc::cmsghdr>() + size_of::<u16>(),
                cmsg_level: libc::SOL_UDP,
                cmsg_type: UDP_SEGMENT,
            },
            size: seg,
            pad: [0; 6],
        };
        // SAFETY: msghdr is plain data: all-zero is a valid value; the fields are set below.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_name = std::ptr::from_ref(to).cast_mut().cast();
        m.msg_namelen = libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).unwrap_or(16);
        m.msg_iov = iov;
        m.msg_iovlen = iovlen;
        m.msg_control = (&raw mut c).cast();
        m.msg_controllen = size_of::<GsoCmsg>();
        // SAFETY: `m` points at `to` and `c` (alive for the call) and at the caller's iovecs.
        let r = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &m, libc::MSG_DONTWAIT) };
        usize::try_from(r).map_err(|_| {
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        })
    }

    /// Lets reads return a run of datagrams from one sender as one, with their segment size
    /// in a control message (`UDP_GRO`, Linux 5.0+).
    pub(crate) fn set_gro(&self) -> io::Result<()> {
        setopt(self.fd.as_raw_fd(), libc::SOL_UDP, 104, 1)
    }

    /// Whether the socket sends with UDP checksums. Off (`SO_NO_CHECK`): zero, as RFC 7348
    /// says a VXLAN sender over IPv4 should and Linux's vxlan device does by default (the
    /// inner frame carries its own); segmented sends need them on. Best effort.
    pub(crate) fn checksum(&self, on: bool) {
        let _ = setopt(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            libc::c_int::from(!on),
        );
    }
}

impl AsRawFd for UdpSock {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The MTU of the path from `local` to `remote` (the route's, or the interface's): a UDP
/// socket connected there, asked for `IP_MTU`. No packet is sent.
pub fn path_mtu(local: Ipv4Addr, remote: Ipv4Addr) -> io::Result<u32> {
    let s = UdpSock::bind(local, 0)?;
    let sa = sockaddr(remote, 9);
    let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).unwrap_or(16);
    // SAFETY: `sa` is a valid sockaddr_in of `len` bytes for the call.
    let r = unsafe { libc::connect(s.as_raw_fd(), std::ptr::from_ref(&sa).cast(), len) };
    if r < 0 {
        return Err(last(&format!("route to {remote}")));
    }
    let mut mtu: libc::c_int = 0;
    let mut mlen = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(4);
    // SAFETY: `mtu` is writable for `mlen` bytes; the kernel writes at most that.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU,
            std::ptr::from_mut(&mut mtu).cast(),
            &mut mlen,
        )
    };
    if r < 0 {
        return Err(last("IP_MTU"));
    }
    u32::try_from(mtu).map_err(|_| io::Error::other("negative MTU"))
}

/// Runs `f` on a thread inside the network namespace `name` (`/run/netns/<name>`, as `ip
/// netns` makes them), for sockets that must live there. The caller's thread stays where it
/// is.
pub fn in_netns<T: Send>(name: &str, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let path = if name.contains('/') {
        std::path::PathBuf::from(name)
    } else {
        std::path::Path::new("/run/netns").join(name)
    };
    let ns = std::fs::File::open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("netns {}: {e}", path.display())))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: plain syscall on an fd we hold; it changes only this thread.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            if r < 0 {
                return Err(last(&format!("setns {}", path.display())));
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("netns thread panicked")))
    })
}
