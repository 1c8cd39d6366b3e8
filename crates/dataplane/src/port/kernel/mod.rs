//! A kernel port: the host kernel's side of the switch, through a tap ([`crate::sys::tap`]) or
//! an `AF_PACKET` socket bound to an existing interface, a veth or a NIC
//! ([`crate::sys::packet`]). Both carry the same 12-byte virtio-net header in front of every
//! frame, so one port serves both; only where the frames go differs (the host's stack behind
//! the tap; the wire or the veth's peer behind the interface).
//!
//! Two ways to move packets, chosen per port ([`HostIo`]):
//!
//! * [`HostIo::Uring`] (the default): batched through `io_uring` ([`crate::sys::uring`]).
//!   Receiving: one submission of up to [`RX_BUFS`] reads into the port's buffers (as many as
//!   the last look found, doubled), the packets handed out as one burst; those the switch
//!   makes wait stay in their buffers, in order, and no read is made until they are gone.
//!   Transmitting: each packet becomes a gathered write straight from the sender's memory
//!   (the kernel's copy is the only one), all of a batch submitted at once at
//!   [`Port::tx_commit`](super::Port::tx_commit), before the sender gets its buffers back.
//!   A write the kernel refuses is counted at the tap (`no_buffer` for a full queue).
//! * [`HostIo::Syscall`]: one `read` and one `writev` per packet (where `io_uring` is not
//!   available, and for comparison).
//!
//! Either way, while the shard polls other rings and the tap had nothing last time, it is
//! read at most every [`TAP_LOOK`] (each look is a syscall); right after every sleep it is
//! read at once. `syscalls` counts every `read`, `writev` and `io_uring_enter`.

mod rx;

use super::mtu::MtuWatch;
use super::{offer_each, Ingress, RX_OFFLOADS};
use crate::egress::{Egress, EgressConfig, HoldPolicy};
use crate::pkt::{put_back, read_head, Caps, Pkt, PortId, Staged, TxOut, MACS, MAX_MERGE};
use crate::poll::plan::Settle;
use crate::poll::{Every, Idle};
use crate::stats::{bump, DropReason, PortStats};
use crate::sys::packet::{vlan_of, Ctrl, PacketSock, Tag};
use crate::sys::tap::{Tap, RECV_BUF_LEN};
use crate::sys::uring::Batch;
use pvnet_net::HDR_LEN;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::read_segs;
use virtq::Armed;
use virtq::Seg;

/// How often a tap is read while the shard polls other rings and the tap had nothing last
/// time (each look is a `read` syscall).
pub(crate) const TAP_LOOK: Duration = Duration::from_micros(20);

/// How long a packet waits in its sender for the kernel: not at all (the kernel never makes
/// a writer wait; a packet it has no room for is queued, with a queue, or dropped).
const KERNEL_HOLD: HoldPolicy = HoldPolicy::Bounded(Duration::ZERO);

/// Most iovecs of one write (a packet in more pieces goes through the staging buffer).
const MAX_IOV: usize = 64;

/// Receive buffers of a batched tap: the most packets one look reads.
pub(crate) const RX_BUFS: usize = 32;
/// Iovecs a batch of writes may use in all (a packet that does not fit waits for the next
/// submission).
const TX_IOVS: usize = 512;
/// Iovecs of one direct read of a small packet: its lent chain's first segments, then the
/// port's own buffer for what does not fit in them.
const LEND_IOV: usize = 8;
/// Iovecs of the one direct read of a large packet: the segments of as many lent chains as
/// a merged packet may take ([`MAX_MERGE`]), then the port's own buffer.
const LARGE_IOV: usize = MAX_MERGE + 1;

/// The kernel's end of a port.
#[derive(Debug)]
pub enum HostDev {
    /// A tap device: the host's own stack.
    Tap(Tap),
    /// An `AF_PACKET` socket bound to an interface.
    Packet(PacketSock),
}

impl HostDev {
    /// Reads one frame into `buf` and puts back the VLAN tag the kernel took out of it (an
    /// `AF_PACKET` socket's; a tap's frames keep theirs). Returns its length (0: a tag that
    /// found no room, counted as invalid by the caller).
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        match self {
            HostDev::Tap(t) => t.recv(buf),
            HostDev::Packet(p) => Ok(p.recv(buf)?.map(|(n, tag)| match tag {
                Some((tpid, tci)) => put_back(buf, n, tpid, tci).unwrap_or(0),
                None => n,
            })),
        }
    }

    /// An `AF_PACKET` port's socket of the frames the kernel took a VLAN tag out of.
    pub(crate) fn tagged_fd(&self) -> Option<i32> {
        match self {
            HostDev::Tap(_) => None,
            HostDev::Packet(p) => Some(p.tagged_fd()),
        }
    }

    fn send_iovecs(&self, iov: &[libc::iovec]) -> std::io::Result<Option<usize>> {
        match self {
            HostDev::Tap(t) => t.send_iovecs(iov),
            HostDev::Packet(p) => p.send_iovecs(iov),
        }
    }

    fn fd(&self) -> i32 {
        match self {
            HostDev::Tap(t) => std::os::fd::AsRawFd::as_raw_fd(t),
            HostDev::Packet(p) => std::os::fd::AsRawFd::as_raw_fd(p),
        }
    }

    /// Bounds the bytes of the port's writes the kernel holds (see `Tap::set_sndbuf`,
    /// `PacketSock::set_sndbuf`): the device queue in front of an egress queue.
    pub fn set_sndbuf(&self, bytes: u32) -> std::io::Result<()> {
        match self {
            HostDev::Tap(t) => t.set_sndbuf(bytes),
            HostDev::Packet(p) => p.set_sndbuf(bytes),
        }
    }
}

/// How often a host port reads what the kernel dropped on the way to it.
pub(crate) const KERNEL_DROPS_EVERY: Duration = Duration::from_secs(1);

/// What the kernel dropped on its way to a port (its queue for pvnet full), read now and then
/// into `kernel_drops`.
#[derive(Debug)]
struct KernelDrops {
    /// When to read.
    every: Every,
    /// A tap's `tx_dropped` when the port opened (the count runs from the interface's making).
    base: Option<u64>,
    /// An `AF_PACKET` socket's drops so far (each read returns those since the last).
    sum: u64,
}

impl KernelDrops {
    /// Starts the count at what the kernel reports now.
    fn open(dev: &HostDev) -> Self {
        let mut d = Self {
            every: Every::new(KERNEL_DROPS_EVERY),
            base: None,
            sum: 0,
        };
        let _ = d.read(dev);
        d.base = d.base.or(Some(0));
        d.sum = 0;
        d
    }

    /// The kernel's drops since the port opened, if it could be read.
    fn read(&mut self, dev: &HostDev) -> Option<u64> {
        match dev {
            HostDev::Tap(t) => {
                let now = crate::sys::tap::tx_dropped(t.name()).ok()??;
                let base = *self.base.get_or_insert(now);
                Some(now.saturating_sub(base))
            }
            HostDev::Packet(p) => {
                self.sum += p.drops_since().ok()?;
                Some(self.sum)
            }
        }
    }
}

/// How a kernel port moves packets (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostIo {
    /// A burst of reads or writes per `io_uring` submission.
    Uring,
    /// One syscall per packet.
    Syscall,
}

/// A kernel port I/O mode that is neither `uring` nor `syscall` (the text given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tap io {0:?} (uring, syscall)")]
pub struct ParseHostIoError(pub String);

impl std::str::FromStr for HostIo {
    type Err = ParseHostIoError;
    fn from_str(s: &str) -> Result<Self, ParseHostIoError> {
        match s {
            "uring" => Ok(HostIo::Uring),
            "syscall" => Ok(HostIo::Syscall),
            o => Err(ParseHostIoError(o.to_owned())),
        }
    }
}

/// The batched path's state: the ring, what the queued writes point at, the receive
/// buffers and the packets read but not yet handed out.
struct Uring {
    batch: Batch,
    /// Iovecs of the queued writes (never reallocated: the kernel reads them at submission).
    iov: Vec<libc::iovec>,
    iov_used: usize,
    /// Headers rewritten for queued writes (a sender with a 10-byte header).
    hdrs: Vec<[u8; HDR_LEN as usize]>,
    /// Frame bytes of each queued write, by tag.
    lens: Vec<u32>,
    rx: Vec<u8>,
    /// Read packets not handed out yet: (buffer, bytes), in order.
    ready: std::collections::VecDeque<(usize, usize)>,
    /// Reads to make at the next look.
    reads: usize,
    /// Reads of an `AF_PACKET` port's socket of tagged frames to make at the next look, after
    /// the others (at least one).
    treads: usize,
    /// Iovecs of the direct reads, [`LEND_IOV`] per read (never reallocated).
    riov: Vec<libc::iovec>,
    /// Bytes of each direct read that land in lent chains (the rest in the port's buffer).
    lent: [u32; RX_BUFS],
    /// Packets are large (the last one read in place did not fit one chain): the next look
    /// makes one read over as many chains as a packet may take, not one chain per read.
    large: bool,
    /// Bytes the first chain of a large read holds (a packet within it: small again).
    first: u32,
    /// Each read's `msghdr`, iovec (a read into the port's own buffer) and control buffer,
    /// for the reads of an `AF_PACKET` port's socket of tagged frames (`recvmsg`: a frame's
    /// VLAN tag comes beside it); never reallocated.
    msgs: Vec<libc::msghdr>,
    miov: Vec<libc::iovec>,
    ctrl: Vec<Ctrl>,
    /// The VLAN tag the kernel took out of each read's frame, to be put back before it is
    /// handed out.
    tags: [Option<Tag>; RX_BUFS],
}

// SAFETY: the raw pointers in `iov` point at packet memory only between a queued write and
// the flush that completes it, both within one round on the shard thread that owns the port;
// between rounds they are stale and never dereferenced. The port moves to its shard before
// any is set.
unsafe impl Send for Uring {}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("batch", &self.batch)
            .field("ready", &self.ready.len())
            .finish_non_exhaustive()
    }
}

impl Uring {
    fn new() -> std::io::Result<Self> {
        let depth = crate::sys::uring::DEPTH as usize;
        Ok(Self {
            batch: Batch::new()?,
            iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                };
                TX_IOVS
            ],
            iov_used: 0,
            hdrs: vec![[0u8; HDR_LEN as usize]; depth],
            lens: vec![0; depth],
            rx: vec![0u8; RX_BUFS * RECV_BUF_LEN],
            ready: std::collections::VecDeque::with_capacity(RX_BUFS),
            reads: 1,
            treads: 1,
            riov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                };
                (RX_BUFS * LEND_IOV).max(LARGE_IOV)
            ],
            lent: [0; RX_BUFS],
            large: false,
            first: 0,
            // SAFETY: all-zero is a valid `msghdr` (set before each read).
            msgs: vec![unsafe { std::mem::zeroed() }; RX_BUFS],
            miov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                };
                RX_BUFS
            ],
            ctrl: vec![Ctrl::default(); RX_BUFS],
            tags: [None; RX_BUFS],
        })
    }

    /// Queues `recvmsg`s of socket `tfd` (an `AF_PACKET` port's socket of tagged frames, if
    /// it has one) into the port's buffers from `from` on, with their control buffers; as
    /// many as the last look found worth, one at least, within the buffers. Returns the
    /// reads' indices.
    fn queue_tagged(&mut self, tfd: Option<i32>, from: usize) -> std::ops::Range<usize> {
        let Some(tfd) = tfd else {
            return from..from;
        };
        let to = (from + self.treads).min(RX_BUFS);
        for i in from..to {
            self.miov[i] = libc::iovec {
                iov_base: self.rx[i * RECV_BUF_LEN..].as_mut_ptr().cast(),
                iov_len: RECV_BUF_LEN,
            };
            let iov = std::ptr::from_mut(&mut self.miov[i]);
            self.msgs[i] = self.ctrl[i].msghdr(iov, 1);
            let msg = std::ptr::from_mut(&mut self.msgs[i]);
            // SAFETY: `msgs[i]`, `miov[i]` and `ctrl[i]` live in vectors never reallocated;
            // buffer `i` of `rx` is untouched until the next `complete` returns (no packet is
            // ready, so none points into it).
            if !unsafe { self.batch.recvmsg(tfd, msg, i as u64) } {
                return from..i;
            }
        }
        from..to
    }

    /// After the reads (`res`: their results): notes the VLAN tag of each of `tagged`'s,
    /// none for the others, and queues what `tagged` read behind what is ready. Returns
    /// whether the socket had no more (true without one).
    fn take_tagged(&mut self, res: &[i32], tagged: std::ops::Range<usize>, id: PortId) -> bool {
        let mut drained = tagged.is_empty();
        let mut got = 0;
        for i in tagged {
            match read_len(res[i], id, "packet socket") {
                Some(n) => {
                    // (every tag noted is taken when its frame is handed out, and a look
                    // comes only once all are: no other slot holds one)
                    self.tags[i] = vlan_of(&self.ctrl[i], self.msgs[i].msg_controllen);
                    self.ready.push_back((i, n));
                    got += 1;
                }
                None => drained = true,
            }
        }
        self.treads = (got * 2).clamp(1, RX_BUFS / 2);
        drained
    }
}

/// Read result `r` as the bytes read; None if it read nothing, an error other than "nothing
/// queued" (`EAGAIN`) logged as a failed read of `what`.
fn read_len(r: i32, id: PortId, what: &str) -> Option<usize> {
    let n = usize::try_from(r).ok();
    if n.is_none() && r != -libc::EAGAIN {
        let e = std::io::Error::from_raw_os_error(-r);
        tracing::warn!(port = id, "{what} read: {e}");
    }
    n
}

/// The kernel's side.
#[derive(Debug)]
pub struct KernelPort {
    id: PortId,
    stats: Arc<PortStats>,
    dev: HostDev,
    buf: Vec<u8>,
    /// Staging for a packet in more pieces than one write takes.
    staging: Vec<u8>,
    /// Bytes of a packet read but not yet delivered (its receiver was full).
    pending: usize,
    /// Read again at once (the last read returned a packet, or the shard just woke).
    look: bool,
    last_look: Option<Instant>,
    egress: Egress,
    /// The batched path (None: a syscall per packet).
    uring: Option<Box<Uring>>,
    /// Read straight into the receive buffers of the frontend the packets go to, when the
    /// switch expects one (direct receive, batched path only).
    direct: bool,
    /// The interface's MTU (a tap's `mtu=` sets it at the start; read again about once a
    /// second): a frame too big for it is dropped by the switch and counted (`too_big`), not
    /// handed to the kernel, which would refuse it (`AF_PACKET`) or pass it on oversized (a
    /// tap).
    mtu: MtuWatch,
    /// What the kernel dropped on its way here.
    kernel_drops: KernelDrops,
}

impl KernelPort {
    /// Wraps an open tap (non-blocking, with the 12-byte virtio-net header), moving packets
    /// as `io` says; where `io_uring` cannot be set up it falls back to a syscall per packet
    /// (logged).
    pub(crate) fn new(
        id: PortId,
        stats: Arc<PortStats>,
        dev: HostDev,
        io: HostIo,
        direct: bool,
    ) -> Self {
        let uring = match io {
            HostIo::Syscall => None,
            HostIo::Uring => match Uring::new() {
                Ok(u) => Some(Box::new(u)),
                Err(e) => {
                    tracing::warn!(
                        port = id,
                        "io_uring not available ({e}): one syscall per packet"
                    );
                    None
                }
            },
        };
        let ifname = match &dev {
            HostDev::Tap(t) => t.name(),
            HostDev::Packet(p) => p.name(),
        };
        let mtu = MtuWatch::new(ifname, u32::from(u16::MAX));
        if mtu.get().is_none() {
            tracing::warn!(
                port = id,
                "the interface's MTU could not be read: no MTU check"
            );
        }
        let kernel_drops = KernelDrops::open(&dev);
        Self {
            uring,
            id,
            stats,
            dev,
            buf: vec![0u8; RECV_BUF_LEN],
            staging: vec![0u8; RECV_BUF_LEN],
            pending: 0,
            look: true,
            last_look: None,
            egress: Egress::new(KERNEL_HOLD),
            direct,
            mtu,
            kernel_drops,
        }
    }

    /// Reads what the kernel dropped on its way here into `kernel_drops` (a file read or a
    /// `getsockopt`, about once a second).
    fn count_kernel_drops(&mut self) {
        if let Some(n) = self.kernel_drops.read(&self.dev) {
            self.stats
                .kernel_drops
                .store(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// New egress settings: a queue (`qdisc`, `limit`, `bulk`), or none. What waited in the
    /// old queue is dropped, counted as `reconfigured`. The kernel's own buffer (the socket's
    /// send buffer) is the device queue: there is no completion to learn a limit from, so
    /// `dql` is off and nothing is held in a sender (a packet that finds the kernel full is
    /// queued here, or dropped).
    pub(crate) fn set_egress(&mut self, e: EgressConfig) {
        self.egress.empty(&self.stats, DropReason::Reconfigured);
        let e = EgressConfig {
            hold: KERNEL_HOLD,
            dql: false,
            ..e
        };
        self.egress = Egress::with(e, crate::egress::DQL_MIN_BUFFERS);
        tracing::info!(port = self.id, egress = ?e, "egress settings changed");
    }

    /// The kernel end's fd, which it writes to.
    pub(crate) fn fd(&self) -> i32 {
        self.dev.fd()
    }

    /// The fds to wait on: the kernel end's, and an `AF_PACKET` port's socket of tagged
    /// frames.
    pub(crate) fn fds(&self) -> impl Iterator<Item = i32> {
        std::iter::once(self.dev.fd()).chain(self.dev.tagged_fd())
    }

    /// How it moves packets now.
    #[cfg(test)]
    pub(crate) fn io(&self) -> HostIo {
        if self.uring.is_some() {
            HostIo::Uring
        } else {
            HostIo::Syscall
        }
    }
}

/// Why the kernel refused a write, from its errno: no room (`no_buffer`), the interface down
/// or gone (`port_down`), or the frame itself (`offload`: a header it would not take).
fn refusal(errno: i32) -> DropReason {
    match errno {
        libc::EAGAIN | libc::ENOBUFS => DropReason::NoBuffer,
        libc::ENETDOWN | libc::EIO | libc::ENXIO | libc::ENODEV => DropReason::PortDown,
        _ => DropReason::Offload,
    }
}

/// The iovecs of a packet's bytes from `skip` on (its frame, when the header in front is
/// replaced). Returns how many, or `None` if they do not fit.
pub(super) fn iovecs(segs: &[Seg<'_>], mut skip: u32, iov: &mut [libc::iovec]) -> Option<usize> {
    let mut n = 0;
    for s in segs {
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        let v = iov.get_mut(n)?;
        v.iov_base = s.as_ptr().wrapping_add(skip as usize).cast();
        v.iov_len = (s.len() - skip) as usize;
        skip = 0;
        n += 1;
    }
    Some(n)
}

impl super::Port for KernelPort {
    fn id(&self) -> PortId {
        self.id
    }

    fn tx_stats(&self) -> &PortStats {
        &self.stats
    }

    fn egress(&mut self) -> Option<&mut Egress> {
        Some(&mut self.egress)
    }

    fn backlogged(&self) -> bool {
        self.egress.backlogged()
    }

    fn mtu(&self) -> Option<u16> {
        self.mtu.get()
    }

    fn caps(&self) -> Caps {
        // The kernel takes partial checksums and GSO packets as they are.
        Caps {
            receives: true,
            offloads: RX_OFFLOADS,
            ..Caps::default()
        }
    }

    /// Out of line, as a trunk's: a syscall's work, kept out of the other ports' dispatch.
    #[inline(never)]
    fn rx_burst(&mut self, max: usize, now: Instant, to: &mut impl Ingress) -> usize {
        if self.uring.is_some() {
            return self.rx_burst_uring(max, now, to);
        }
        if self.pending == 0
            && !self.look
            && self
                .last_look
                .is_some_and(|l| now.saturating_duration_since(l) < TAP_LOOK)
        {
            return 0;
        }
        let mut done = 0;
        let mut drained = false;
        while done < max {
            let n = if self.pending > 0 {
                std::mem::take(&mut self.pending)
            } else {
                bump(&self.stats.syscalls, 1);
                match self.dev.recv(&mut self.buf) {
                    Ok(Some(n)) => n,
                    Ok(None) => {
                        drained = true;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(port = self.id, "tap read: {e}");
                        drained = true;
                        break;
                    }
                }
            };
            let len = u32::try_from(n).unwrap_or(0);
            let head = if len >= HDR_LEN + MACS {
                read_head(&[Seg::from_mut(&mut self.buf[..n])], HDR_LEN)
            } else {
                None
            };
            let Some((hdr, macs)) = head else {
                bump(&self.stats.drops[DropReason::Invalid as usize], 1);
                bump(&self.stats.rx_packets, 1);
                done += 1;
                continue;
            };
            let seg = [Seg::from_mut(&mut self.buf[..n])];
            let pkt = Pkt {
                segs: &seg,
                len,
                hdr_len: HDR_LEN,
                hdr,
                macs,
                hash: 0,
                vlan: 0,
            };
            if to.burst(&[pkt], &self.stats) == 0 {
                self.pending = n;
                break;
            }
            bump(&self.stats.rx_packets, 1);
            bump(&self.stats.rx_bytes, u64::from(len - HDR_LEN));
            done += 1;
        }
        self.look = !drained && self.pending == 0;
        self.last_look = Some(now);
        done
    }

    fn tx_begin(&mut self, now: Instant, _hint: usize) -> bool {
        self.mtu.poll(now, self.id);
        true
    }

    /// Batched: each packet queued as a write, submitted at commit. Else, and with an egress
    /// queue, one `writev` each: a write the kernel has no room for must be known while the
    /// packet can still wait in the queue (a batch's refusals are known only at the commit,
    /// after its senders let go of their packets).
    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        if self.uring.is_some() && !self.egress.has_queue() {
            offer_each(pkts, |p| self.queue_write(p))
        } else {
            offer_each(pkts, |p| self.write(p))
        }
    }

    /// Submits the queued writes (one `io_uring_enter`), counts what the kernel took.
    fn tx_commit(&mut self) {
        self.flush();
    }

    /// The queued writes point into the packets' memory until the commit: a packet the
    /// switch staged in memory it reuses (a completed checksum, a segment, an inserted 802.1Q
    /// tag) is written now, with everything queued before it (a submit per staged packet, on
    /// those paths only).
    fn staged(&mut self, _n: usize, _part: Staged) {
        if self.uring.as_ref().is_some_and(|u| u.batch.queued() > 0) {
            self.flush();
        }
    }

    /// `Poll` while it drains or holds a packet; else it may sleep: epoll waits on its fd
    /// (level-triggered).
    /// Also `Poll` while packets wait in its egress queue: nothing signals room in the kernel.
    fn idle(&mut self, now: Instant, settle: &mut Settle) {
        if self.kernel_drops.every.due(now) {
            self.count_kernel_drops();
        }
        self.mtu.poll(now, self.id);
        let ready = self.uring.as_ref().is_some_and(|u| !u.ready.is_empty());
        self.egress.new_round();
        if self.look || self.pending > 0 || ready || self.egress.backlogged() {
            settle.idle(Idle::Poll);
        }
    }

    fn arm(&mut self) -> Armed {
        Armed::Empty
    }

    fn disarm(&mut self, slept: bool) {
        if slept {
            self.look = true;
        }
    }

    fn event(&mut self, _token: u16) {
        self.look = true;
    }
}

impl KernelPort {
    /// Writes one packet straight from its memory.
    fn write(&mut self, pkt: &Pkt<'_>) -> TxOut {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_IOV];
        // The tap's header is always 12 bytes: a shorter one is rewritten in front.
        let mut hdr = [0u8; HDR_LEN as usize];
        let (first, skip) = if pkt.hdr_len == HDR_LEN {
            (0, 0)
        } else {
            let mut h = pkt.hdr;
            h.num_buffers = 0;
            h.write(&mut hdr);
            iov[0].iov_base = hdr.as_mut_ptr().cast();
            iov[0].iov_len = hdr.len();
            (1, pkt.hdr_len)
        };
        // Straight from the sender's memory: the kernel's copy is the only one.
        let n = match iovecs(pkt.segs, skip, &mut iov[first..]) {
            Some(n) => first + n,
            None => {
                let len = (pkt.frame_len() as usize).min(self.staging.len() - hdr.len());
                pkt.hdr.write(&mut self.staging);
                let k = read_segs(pkt.segs, pkt.hdr_len, &mut self.staging[hdr.len()..][..len]);
                iov[0].iov_base = self.staging.as_mut_ptr().cast();
                iov[0].iov_len = hdr.len() + k;
                1
            }
        };
        bump(&self.stats.syscalls, 1);
        match self.dev.send_iovecs(&iov[..n]) {
            Ok(Some(_)) => {
                self.egress.sent();
                bump(&self.stats.tx_packets, 1);
                bump(&self.stats.tx_bytes, u64::from(pkt.frame_len()));
                TxOut::Sent
            }
            // The kernel's buffer is full: its egress decides (queue it, or drop it).
            Ok(None) => TxOut::NoRoom,
            Err(e) => {
                tracing::debug!(port = self.id, "write refused: {e}");
                TxOut::Dropped(refusal(e.raw_os_error().unwrap_or(libc::EINVAL)))
            }
        }
    }
}

impl KernelPort {
    /// Queues one packet as a gathered write from its memory (submitted at the commit). A
    /// packet in more pieces than one write takes goes out alone through [`write`](Self::write)
    /// after what is queued.
    fn queue_write(&mut self, pkt: &Pkt<'_>) -> TxOut {
        let fd = self.fd();
        let need = pkt.segs.len() + 1;
        let full = self
            .uring
            .as_ref()
            .is_some_and(|u| !u.batch.has_room() || u.iov_used + need > TX_IOVS);
        if full || need > MAX_IOV {
            self.flush();
            if need > MAX_IOV {
                return self.write(pkt);
            }
        }
        let Some(u) = self.uring.as_mut() else {
            return self.write(pkt);
        };
        let tag = u.batch.queued() as usize;
        let start = u.iov_used;
        let mut first = 0;
        let skip = if pkt.hdr_len == HDR_LEN {
            0
        } else {
            // The tap's header is always 12 bytes: a shorter one is rewritten in front.
            let mut h = pkt.hdr;
            h.num_buffers = 0;
            h.write(&mut u.hdrs[tag]);
            u.iov[start] = libc::iovec {
                iov_base: u.hdrs[tag].as_mut_ptr().cast(),
                iov_len: HDR_LEN as usize,
            };
            first = 1;
            pkt.hdr_len
        };
        let Some(n) = iovecs(pkt.segs, skip, &mut u.iov[start + first..]) else {
            return self.write(pkt);
        };
        let n = first + n;
        u.lens[tag] = pkt.frame_len();
        // SAFETY: the iovecs and the header live in `u` (never reallocated) and the packet's
        // memory is the sender's until the switch commits this batch, which submits and
        // completes every queued write first (`flush` from `tx_commit`).
        let queued = unsafe {
            u.batch.writev(
                fd,
                &u.iov[start..start + n],
                u64::try_from(tag).unwrap_or(0),
            )
        };
        if !queued {
            return self.write(pkt);
        }
        u.iov_used += n;
        TxOut::Sent
    }

    /// Submits the queued writes and counts what the kernel took and refused.
    fn flush(&mut self) {
        let Some(u) = self.uring.as_mut() else {
            return;
        };
        if u.batch.queued() == 0 {
            return;
        }
        let (mut ok, mut bytes) = (0u64, 0u64);
        let mut refused = [0u64; DropReason::ALL.len()];
        let (lens, id) = (&u.lens, self.id);
        let r = u.batch.complete(|tag, res| {
            if res >= 0 {
                ok += 1;
                bytes += u64::from(
                    lens.get(usize::try_from(tag).unwrap_or(usize::MAX))
                        .copied()
                        .unwrap_or(0),
                );
            } else {
                let why = refusal(-res);
                if why != DropReason::NoBuffer {
                    let e = std::io::Error::from_raw_os_error(-res);
                    tracing::debug!(port = id, "write refused: {e}");
                }
                refused[why as usize] += 1;
            }
        });
        u.iov_used = 0;
        match r {
            Ok(calls) => bump(&self.stats.syscalls, u64::from(calls)),
            Err(e) => {
                tracing::warn!(
                    port = self.id,
                    "io_uring submit failed ({e}): one syscall per packet from now on"
                );
                refused[DropReason::PortDown as usize] += u64::from(u.batch.queued());
                self.uring = None;
            }
        }
        bump(&self.stats.tx_packets, ok);
        bump(&self.stats.tx_bytes, bytes);
        for r in DropReason::ALL {
            bump(&self.stats.drops[r as usize], refused[r as usize]);
        }
    }

    /// [`Port::rx_burst`](super::Port::rx_burst) on the batched path: packets read earlier
    /// first; when none are left, one submission of reads.
    fn rx_burst_uring(&mut self, max: usize, now: Instant, to: &mut impl Ingress) -> usize {
        let Some(u) = self.uring.as_ref() else {
            return 0;
        };
        let mut drained = false;
        let mut done = 0;
        if u.ready.is_empty() {
            if !self.look
                && self
                    .last_look
                    .is_some_and(|l| now.saturating_duration_since(l) < TAP_LOOK)
            {
                return 0;
            }
            match self.look_uring(max, to) {
                Ok((n, gone)) => {
                    done += n;
                    drained |= gone;
                }
                Err(e) => {
                    tracing::warn!(
                        port = self.id,
                        "io_uring submit failed ({e}): one syscall per packet from now on"
                    );
                    self.uring = None;
                    return 0;
                }
            }
        }
        let Some(u) = self.uring.as_mut() else {
            return done;
        };
        done += rx::hand_out(u, max.saturating_sub(done), to, &self.stats);
        self.look = !drained && u.ready.is_empty();
        self.last_look = Some(now);
        done
    }

    /// One look of the batched path: a submission of reads, straight into the receive
    /// buffers the switch lends when it does (direct receive), else into the port's own.
    /// Returns the packets completed in place and whether the kernel had no more.
    fn look_uring(&mut self, max: usize, to: &mut impl Ingress) -> std::io::Result<(usize, bool)> {
        let (fd, id, direct) = (self.fd(), self.id, self.direct);
        let tfd = self.dev.tagged_fd();
        let Some(u) = self.uring.as_deref_mut() else {
            return Ok((0, false));
        };
        // Room for a read of the tagged frames' socket, if there is one.
        let k = u
            .reads
            .min(max.max(1))
            .min(RX_BUFS - usize::from(tfd.is_some()));
        let lease = if direct {
            to.lend(if u.large { MAX_MERGE } else { k })
        } else {
            None
        };
        match lease {
            Some(lease) => rx::direct_look(u, (fd, tfd), k, lease, &self.stats, id),
            None => rx::plain_look(u, (fd, tfd), k, &self.stats, id).map(|gone| (0, gone)),
        }
    }
}
