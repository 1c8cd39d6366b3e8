//! pvnet's own virtio-net driver over vhost-user (the userspace frontend library).
//!
//! Memory is one memfd shared with the backend: both rings and persistent pools of buffers,
//! mapped once for the life of the connection: no per-packet mapping. With an IOMMU
//! ([`ClientConfig::grants`], `VIRTIO_F_ACCESS_PLATFORM`) the device reaches only what is
//! granted: the pools once (staging grants), or each buffer while it is posted. Transmit buffers are one
//! per descriptor (descriptor `i` always points at buffer `i`); receive buffers are carved
//! from chunks and sized by [`RxBuffers`] (an EWMA of the frames received, by default; see
//! `rxpool`). The device is untrusted: used ids and lengths are validated by
//! [`DriverQueue`].
//!
//! A received frame is handed out in place ([`RxFrame`]): its header parsed, its bytes
//! reachable as [`Seg`]s over the buffers it arrived in, with headroom in front to grow it,
//! and the buffers go back to the ring only once the caller is done with it. Nothing is
//! copied unless the caller asks ([`RxFrame::read`]). The bytes are never lent as a slice:
//! a device may go on writing a buffer it has returned (a broken or hostile one), so every
//! access is a copy through a [`Seg`], and what one read returns is validated by the caller
//! before use, never assumed to equal what an earlier read returned.
//!
//! Notification defaults follow the "tx napi" design: TX interrupts stay off and completed
//! TX buffers are reclaimed from the send path (poll context); the caller arms the TX
//! interrupt only when the ring is full and it must wait.

use crate::features::{RX_QUEUE, TX_QUEUE, VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_NET_F_MRG_RXBUF};
use crate::iotlb::Granter;
pub use crate::iotlb::{GrantMode, GrantStats, ParseGrantModeError};
pub use crate::rxpool::{ParseRxBuffersError, RxBuffers, DEFAULT_HEADROOM};
use crate::rxpool::{Posted, RxPool};
use pvnet_net::{hdr_len, VnetHdr, HDR_LEN};
use setup::{grant_fixed, negotiate, queues, rx_pool, set_vrings, share_memory, Watchdog};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;
use virtq::split::ring_sizes;
use virtq::AddrSpace;
use virtq::Armed;
use virtq::MemTable;
use virtq::{Buf, DriverQueue, RingAddrs};
use virtq::{Perm, Seg, Translate};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

mod setup;

/// Errors of the frontend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The vhost-user exchange failed.
    #[error("vhost-user: {0}")]
    Vhost(#[from] vhost::Error),
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What we were doing.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The backend broke a virtqueue rule.
    #[error("virtqueue: {0}")]
    Queue(#[from] virtq::Error),
    /// The backend lacks a feature we require.
    #[error("backend does not offer {0}")]
    Missing(&'static str),
    /// Bad configuration.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    /// The backend closed the vhost-user connection (it exited, or the port was deleted).
    #[error("the backend closed the vhost-user connection")]
    Disconnected,
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Os { what, source }
}

/// Frontend settings.
#[derive(Debug, Clone, Copy)]
pub struct ClientConfig {
    /// Descriptors per queue (power of two).
    pub queue_size: u16,
    /// Bytes per transmit buffer, header included.
    pub buf_size: u32,
    /// How receive buffers are sized.
    pub rx_buffers: RxBuffers,
    /// Bytes kept free in front of each received frame's header, for the caller to grow the
    /// frame at the front in place (rounded up to a cache line).
    pub rx_headroom: u32,
    /// Ask for `VIRTIO_F_EVENT_IDX`.
    pub event_idx: bool,
    /// How transmitted buffers are reclaimed.
    pub tx_mode: TxMode,
    /// Negotiate neither `VIRTIO_F_VERSION_1` nor `VIRTIO_NET_F_MRG_RXBUF`, as a legacy
    /// driver does: every packet then carries the 10-byte header (virtio 1.x 5.1.6).
    pub legacy_hdr: bool,
    /// Ask for the packed ring (`VIRTIO_F_RING_PACKED`); split if the backend does not offer it.
    pub packed: bool,
    /// Take TCP segmentation offload on receive (`VIRTIO_NET_F_GUEST_CSUM`, `GUEST_TSO4`,
    /// `GUEST_TSO6`): the device may then send frames of up to 64 KiB with a GSO header
    /// ([`RxFrame::hdr`]), which the receive buffers are sized for.
    pub guest_tso: bool,
    /// How long `connect` and `stop` may wait for the backend's answers before giving up (a
    /// backend that accepts the connection and then says nothing must not hang us).
    pub reply_timeout: Duration,
    /// Whether the device goes through an IOMMU, and how buffers are granted to it.
    pub grants: GrantMode,
}

/// How completed TX buffers come back (the Linux virtio-net "tx napi" series and what it
/// replaced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TxMode {
    /// TX interrupts off; completions reclaimed from the send path; the TX interrupt is armed
    /// only when the ring is full and the sender must wait (the default).
    #[default]
    Napi,
    /// Reclaim only on transmit: buffers are held until the next send, never an interrupt,
    /// a full ring is polled (completion latency unbounded: packets "orphaned").
    Xmit,
    /// TX interrupts always on: every completion batch calls us, reclaimed in poll context.
    Irq,
    /// TX completions cleaned from the RX poll (the RX interrupts fire anyway); TX interrupt
    /// armed only when the ring is full.
    RxPoll,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            queue_size: 256,
            buf_size: 2048,
            rx_buffers: RxBuffers::Ewma,
            rx_headroom: DEFAULT_HEADROOM,
            event_idx: true,
            tx_mode: TxMode::Napi,
            legacy_hdr: false,
            packed: false,
            guest_tso: false,
            reply_timeout: Duration::from_secs(10),
            grants: GrantMode::Off,
        }
    }
}

/// Where each part lives in the memfd (guest addresses).
#[derive(Debug, Clone, Copy)]
struct Layout {
    rx: RingAddrs,
    tx: RingAddrs,
    rx_bufs: u64,
    tx_bufs: u64,
    len: u64,
}

/// Guest address of the memfd's first byte (non-zero, so that address 0 is never valid).
pub const GPA_BASE: u64 = 0x10_0000;
/// With an IOMMU, the I/O address of the memfd's first byte: what the rings carry. Distinct
/// from every guest and user address, so that a device translating anything but the grants
/// fails at once.
pub const IOVA_BASE: u64 = 0x40_0000_0000;

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl Layout {
    /// Parts laid out from `base` (the address of the memfd's first byte in the space the
    /// rings use).
    fn new(c: &ClientConfig, rx_pool: u64, base: u64) -> Self {
        let (dl, al, ul) = ring_sizes(c.queue_size);
        let ring = |at: u64| -> (RingAddrs, u64) {
            let desc = at;
            let avail = desc + dl;
            let used = align(avail + al, 4096);
            (RingAddrs { desc, avail, used }, align(used + ul, 4096))
        };
        let (rx, next) = ring(base);
        let (tx, next) = ring(next);
        let pool = u64::from(c.queue_size) * u64::from(c.buf_size);
        let rx_bufs = next;
        let tx_bufs = align(rx_bufs + rx_pool, 4096);
        let len = align(tx_bufs + pool, 2 << 20) - base;
        Self {
            rx,
            tx,
            rx_bufs,
            tx_bufs,
            len,
        }
    }
}

/// From an address the rings carry to our user address of it (the memfd's two bases apart).
#[derive(Debug, Clone, Copy)]
struct ToUser(u64);

impl ToUser {
    fn at(self, a: u64) -> u64 {
        a.wrapping_add(self.0)
    }
}

/// Counters of one frontend.
#[derive(Debug, Default, Clone, Copy)]
pub struct ClientStats {
    /// Frames handed to the TX ring.
    pub tx_packets: u64,
    /// Frames received.
    pub rx_packets: u64,
    /// Bytes of the frames received (headers excluded).
    pub rx_bytes: u64,
    /// Receive buffers the device returned (those of frames dropped as malformed included).
    pub rx_buffers: u64,
    /// Memory those buffers held: the sum of their true sizes (see [`RxFrame::truesize`]).
    pub rx_truesize: u64,
    /// Received frames dropped: malformed (short, bad `num_buffers`).
    pub rx_errors: u64,
    /// Kicks written (eventfd writes).
    pub kicks: u64,
    /// Calls received (eventfd wake-ups).
    pub calls: u64,
    /// Times we slept waiting for the backend.
    pub sleeps: u64,
}

/// A received frame, in place in the buffers it arrived in: valid for the call of the
/// [`NetClient::recv_burst`] closure it is handed to; its buffers go back to the ring after
/// that call, not before.
///
/// The bytes are reached only through copies ([`read`](Self::read), [`hdr`](Self::hdr),
/// and the [`Seg`]s of [`segments`](Self::segments) and [`headroom`](Self::headroom)), never
/// as a slice: the device could write a buffer after returning it, and a copy of bytes that
/// change under it is still a copy of some bytes, where a Rust reference to them would not be
/// sound. Read what you need once and check it there.
#[derive(Debug)]
pub struct RxFrame<'a> {
    pool: NonNull<u8>,
    posted: &'a [Posted],
    headroom: u32,
    hdr_len: u32,
    ids: &'a [(u16, u32)],
}

impl<'a> RxFrame<'a> {
    /// Frame length (the virtio-net header excluded).
    #[inline]
    pub fn len(&self) -> usize {
        let total: u64 = self.ids.iter().map(|&(_, l)| u64::from(l)).sum();
        usize::try_from(total)
            .unwrap_or(usize::MAX)
            .saturating_sub(self.hdr_len as usize)
    }

    /// True for an empty frame.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Buffers the frame arrived in.
    pub fn buffers(&self) -> usize {
        self.ids.len()
    }

    /// Memory the frame holds until it is released: the whole slots of its buffers (headroom
    /// and padding included), as Linux's `truesize`.
    pub fn truesize(&self) -> u64 {
        self.ids
            .iter()
            .map(|&(id, _)| u64::from(self.posted[usize::from(id)].slot))
            .sum()
    }

    /// The `len` bytes the device wrote into buffer `id`, from its header on.
    #[inline]
    fn written(&self, id: u16, len: u32) -> Seg<'a> {
        let p = self.posted[usize::from(id)];
        // SAFETY: `id` came back from `DriverQueue`, which checked it is in flight and that
        // `len` is no more than the `p.len` bytes we offered at `p.off + headroom`; that range
        // lies in the receive pool, mapped as long as the client (which `'a` borrows) lives.
        unsafe {
            Seg::from_raw(
                NonNull::new_unchecked(self.pool.as_ptr().add((p.off + self.headroom) as usize)),
                len,
            )
        }
    }

    /// The virtio-net header the device wrote (a legacy 10-byte one has `num_buffers` 0).
    #[inline]
    pub fn hdr(&self) -> VnetHdr {
        let &(id, len) = &self.ids[0];
        let b = self
            .written(id, len)
            .read_array::<{ VnetHdr::LEN }>(0)
            .unwrap_or([0; VnetHdr::LEN]);
        VnetHdr::parse_len(&b, self.hdr_len).unwrap_or_default()
    }

    /// The frame's bytes in place, buffer by buffer (the header left out), readable and
    /// writable through [`Seg`]'s copies: a frame can be inspected, rewritten or forwarded
    /// (`writev` from [`Seg::as_ptr`]) without copying it out.
    #[inline]
    pub fn segments(&self) -> impl Iterator<Item = Seg<'a>> + '_ {
        self.ids
            .iter()
            .enumerate()
            .filter_map(move |(k, &(id, len))| {
                let seg = self.written(id, len);
                let skip = if k == 0 { self.hdr_len } else { 0 };
                let rest = len.checked_sub(skip).filter(|&n| n > 0)?;
                // SAFETY: `skip..len` is inside `seg` (checked above), so inside its buffer.
                Some(unsafe {
                    Seg::from_raw(
                        NonNull::new_unchecked(seg.as_ptr().add(skip as usize)),
                        rest,
                    )
                })
            })
    }

    /// The bytes in front of the frame in its first buffer, the caller's to write: the
    /// configured headroom and the virtio-net header (already parsed: [`hdr`](Self::hdr)
    /// reads it again from there, so read it first). A frame grown at the front ends where
    /// this segment ends.
    #[inline]
    pub fn headroom(&self) -> Seg<'a> {
        let id = self.ids[0].0;
        let p = self.posted[usize::from(id)];
        // SAFETY: the slot `p.off..p.off + p.slot` is ours in the pool (see `written`), and
        // `headroom + hdr_len` bytes from its start are inside it (the header fit the buffer).
        unsafe {
            Seg::from_raw(
                NonNull::new_unchecked(self.pool.as_ptr().add(p.off as usize)),
                self.headroom + self.hdr_len,
            )
        }
    }

    /// Copies frame bytes from `off` into `dst`; returns how many were copied.
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) -> usize {
        let mut skip = off + self.hdr_len as usize;
        let mut done = 0;
        for &(id, len) in self.ids {
            let len = len as usize;
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = (len - skip).min(dst.len() - done);
            let at = self.posted[usize::from(id)].off + self.headroom;
            // SAFETY: as in `written`: `len` bytes at `at` are inside buffer `id` in the pool,
            // and `skip + n <= len`; `dst` is ours.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.pool.as_ptr().add(at as usize + skip),
                    dst.as_mut_ptr().add(done),
                    n,
                );
            }
            done += n;
            skip = 0;
            if done == dst.len() {
                break;
            }
        }
        done
    }
}

/// Stops a queue on its first violation: records the error, which every later operation on
/// that queue returns again (the device cannot restart a queue by repairing its ring).
fn stop_on<T>(stopped: &mut Option<virtq::Error>, r: virtq::Result<T>) -> Result<T, Error> {
    r.map_err(|e| {
        *stopped = Some(e);
        Error::Queue(e)
    })
}

/// `Err` with the recorded violation if the queue is stopped.
fn check(stopped: Option<virtq::Error>) -> Result<(), Error> {
    stopped.map_or(Ok(()), |e| Err(Error::Queue(e)))
}

/// A connected virtio-net frontend with one queue pair.
///
/// The device is untrusted: the first virtqueue rule it breaks on a queue (a used id not in
/// flight, a used length past the buffer, a used index jump) stops that queue for good: the
/// call returns [`Error::Queue`], and so does every later call that would touch that queue
/// (see [`rx_error`](Self::rx_error), [`tx_error`](Self::tx_error)); nothing more is posted to
/// it. The other queue keeps working.
pub struct NetClient {
    fe: Frontend,
    /// The vhost-user socket (a clone), for [`Watchdog`].
    ctl: UnixStream,
    cfg: ClientConfig,
    lay: Layout,
    features: u64,
    /// Bytes of the virtio-net header in front of every packet (from `features`).
    hdr_len: usize,
    mem: Arc<MemTable>,
    rx: DriverQueue,
    tx: DriverQueue,
    rx_pool: NonNull<u8>,
    /// Which parts of the receive pool are posted, and how big the next buffer is.
    rxp: RxPool,
    /// Scratch for the buffers of one refill, carved before they are posted.
    staged: Vec<Posted>,
    tx_pool: NonNull<u8>,
    kick: [EventFd; 2],
    call: [EventFd; 2],
    /// The violation that stopped the RX queue, if any.
    rx_err: Option<virtq::Error>,
    /// The violation that stopped the TX queue, if any.
    tx_err: Option<virtq::Error>,
    /// Scratch for the (id, len) used entries of one receive batch.
    used: Vec<(u16, u32)>,
    /// The IOTLB side, unless `grants` is off.
    granter: Option<Granter>,
    /// Our user address of a ring address (grants name it).
    to_user: ToUser,
    /// Counters.
    pub stats: ClientStats,
}

impl std::fmt::Debug for NetClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetClient")
            .field("features", &self.features)
            .field("stats", &self.stats)
            .finish()
    }
}

impl NetClient {
    /// Connects to a vhost-user net backend at `path`, negotiates, shares memory, starts both
    /// queues and posts every RX buffer.
    pub fn connect(path: &Path, cfg: ClientConfig) -> Result<Self, Error> {
        if cfg.queue_size == 0 || !cfg.queue_size.is_power_of_two() {
            return Err(Error::Config("queue size must be a power of two"));
        }
        if cfg.buf_size < HDR_LEN + 64 {
            return Err(Error::Config("buffers too small"));
        }
        let sock = UnixStream::connect(path).map_err(os("connect"))?;
        let ctl = sock.try_clone().map_err(os("socket"))?;
        let _dog = Watchdog::arm(&ctl, cfg.reply_timeout)?;
        let mut fe = Frontend::from_stream(sock, 2);
        fe.set_owner()?;
        let features = negotiate(&mut fe, &cfg)?;
        let iommu = cfg.grants != GrantMode::Off;
        let mut granter = None;
        if iommu {
            let (ours, theirs) = UnixStream::pair().map_err(os("socketpair"))?;
            fe.set_backend_request_fd(&theirs)?;
            let main = ctl.try_clone().map_err(os("socket"))?;
            let per_packet = cfg.grants == GrantMode::PerPacket;
            granter = Some(Granter::new(main, ours, per_packet).map_err(os("backend channel"))?);
        }

        let hdr = hdr_len(features);
        let rxp = rx_pool(&cfg, features, hdr);
        // Under an IOMMU the rings carry IOVAs; our own table maps them as the device's does.
        let base = if iommu { IOVA_BASE } else { GPA_BASE };
        let lay = Layout::new(&cfg, rxp.bytes(), base);
        let (mem, uaddr) = share_memory(&mut fe, &lay, base)?;
        let (format, rx, tx) = queues(&mem, &cfg, &lay, features)?;
        let pool = |at, len| {
            mem.translate_range(AddrSpace::Guest, at, len, Perm::ReadWrite)
                .map_err(|m| mem.miss_error(m))
        };
        let tx_len = u64::from(cfg.queue_size) * u64::from(cfg.buf_size);
        let (rx_pool, tx_pool) = (pool(lay.rx_bufs, rxp.bytes())?, pool(lay.tx_bufs, tx_len)?);
        let to_user = ToUser(uaddr.wrapping_sub(base));
        if let Some(g) = granter.as_mut() {
            grant_fixed(g, &cfg, &lay, rxp.bytes(), to_user)?;
        }
        let ev = || EventFd::new(EFD_NONBLOCK).map_err(os("eventfd"));
        let kick = [ev()?, ev()?];
        let call = [ev()?, ev()?];
        // Ring addresses: our user addresses, or under an IOMMU the IOVAs themselves.
        let to_u = |a: u64| if iommu { a } else { to_user.at(a) };
        set_vrings(&mut fe, &cfg, &lay, format, to_u, [&kick, &call])?;
        let c = Self {
            fe,
            ctl,
            cfg,
            lay,
            features,
            hdr_len: hdr as usize,
            mem,
            rx,
            tx,
            rx_pool,
            rxp,
            staged: Vec::with_capacity(usize::from(cfg.queue_size)),
            tx_pool,
            kick,
            call,
            rx_err: None,
            tx_err: None,
            used: Vec::with_capacity(usize::from(cfg.queue_size)),
            granter,
            to_user,
            stats: ClientStats::default(),
        };
        c.start()
    }

    /// The last step of [`connect`](Self::connect): every RX buffer posted, both queues
    /// enabled, TX interrupts as the mode wants them.
    fn start(mut self) -> Result<Self, Error> {
        self.refill_rx()?;
        if self.features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            self.fe.set_vring_enable(RX_QUEUE, true)?;
            self.fe.set_vring_enable(TX_QUEUE, true)?;
        }
        // Only `Irq` takes TX interrupts; every other mode reclaims from a poll path.
        if self.cfg.tx_mode == TxMode::Irq {
            let _ = stop_on(&mut self.tx_err, self.tx.arm_used_notify())?;
        } else {
            self.tx.disable_used_notify();
        }
        Ok(self)
    }

    /// Negotiated feature bits.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The memory table over the shared memfd.
    pub fn mem(&self) -> &Arc<MemTable> {
        &self.mem
    }

    /// IOTLB counters (`None` without an IOMMU).
    pub fn grant_stats(&self) -> Option<GrantStats> {
        self.granter.as_ref().map(|g| g.stats)
    }

    /// The violation that stopped the RX queue (`None` while it runs).
    pub fn rx_error(&self) -> Option<virtq::Error> {
        self.rx_err
    }

    /// The violation that stopped the TX queue (`None` while it runs).
    pub fn tx_error(&self) -> Option<virtq::Error> {
        self.tx_err
    }

    /// Largest frame one TX buffer carries.
    pub fn max_frame(&self) -> usize {
        self.cfg.buf_size as usize - self.hdr_len
    }

    fn kick(&mut self, q: usize) {
        if self.kick[q].write(1).is_ok() {
            self.stats.kicks += 1;
        }
    }

    /// Posts a buffer on every free RX descriptor, each sized for what arrives (see
    /// [`RxBuffers`]), and kicks if the backend asked for it.
    pub fn refill_rx(&mut self) -> Result<(), Error> {
        check(self.rx_err)?;
        let base = self.lay.rx_bufs;
        let pool = &mut self.rxp;
        let head = u64::from(pool.headroom());
        // One size for the whole refill: the average moves only as frames arrive. The
        // buffers are carved first, so that posting them is a tight loop.
        let len = pool.next_len();
        let staged = &mut self.staged;
        staged.clear();
        for _ in 0..self.rx.free_count() {
            let Some(b) = pool.alloc(len) else { break };
            staged.push(b);
        }
        if let Some(g) = self.granter.as_mut().filter(|g| g.per_packet) {
            // One round trip for the batch's grants and the revocations `recv_burst` queued
            // (these buffers are only written by the device, after the grants).
            for b in staged.iter() {
                let at = base + u64::from(b.off) + head;
                g.queue_grant(at, u64::from(b.len), self.to_user.at(at), Perm::ReadWrite)
                    .map_err(os("IOTLB update"))?;
            }
            g.flush().map_err(os("IOTLB update"))?;
        }
        let posted = &mut pool.posted;
        let r = self.rx.add_many(staged.len(), |k, id| {
            let b = staged[k];
            posted[usize::from(id)] = b;
            Some(Buf {
                addr: base + u64::from(b.off) + head,
                len: b.len,
                write: true,
            })
        });
        if let Ok(n) = r {
            // Only a queue violation stops the run early: give back what was not posted.
            for &b in &staged[n..] {
                pool.release(b);
            }
        }
        let added = stop_on(&mut self.rx_err, r)? > 0;
        if added && self.rx.publish() {
            self.kick(RX_QUEUE);
        }
        Ok(())
    }

    /// Reclaims completed TX buffers (poll context); returns how many.
    pub fn reclaim_tx(&mut self) -> Result<usize, Error> {
        check(self.tx_err)?;
        let mut total = 0;
        loop {
            let n = stop_on(&mut self.tx_err, self.tx.used_available())?;
            for _ in 0..n {
                let e = stop_on(&mut self.tx_err, self.tx.pop_used())?;
                if let (Some((id, _)), Some(g)) =
                    (e, self.granter.as_mut().filter(|g| g.per_packet))
                {
                    let bs = u64::from(self.cfg.buf_size);
                    g.queue_revoke(self.lay.tx_bufs + u64::from(id) * bs, bs)
                        .map_err(os("IOTLB invalidate"))?;
                }
            }
            total += usize::from(n);
            // In `Irq` mode the interrupt stays armed: re-arm after each reclaim, and take
            // what arrived while arming.
            if self.cfg.tx_mode != TxMode::Irq
                || self.tx.in_flight() == 0
                || stop_on(&mut self.tx_err, self.tx.arm_used_notify())? == Armed::Empty
            {
                // The buffers are reused once their revocations are acked: one round trip.
                if let Some(g) = self.granter.as_mut() {
                    g.flush().map_err(os("IOTLB invalidate"))?;
                }
                return Ok(total);
            }
        }
    }

    /// The TX completion mode.
    pub fn tx_mode(&self) -> TxMode {
        self.cfg.tx_mode
    }

    /// Free TX slots.
    pub fn tx_free(&self) -> usize {
        self.tx.free_count()
    }

    /// TX buffers the backend still holds.
    pub fn tx_in_flight(&self) -> u16 {
        self.tx.in_flight()
    }

    /// Sends up to `max` frames produced by `fill(i, buf) -> len`, which writes frame `i` into
    /// `buf` (a local scratch buffer of `max_frame()` bytes). Each frame is copied once into
    /// its premapped TX buffer behind a zeroed virtio-net header; one publish and at most one
    /// kick per burst. Returns how many were queued (fewer if the ring is full).
    pub fn send_burst(
        &mut self,
        max: usize,
        scratch: &mut [u8],
        mut fill: impl FnMut(usize, &mut [u8]) -> usize,
    ) -> Result<usize, Error> {
        self.reclaim_tx()?;
        let bs = self.cfg.buf_size as usize;
        let h = self.hdr_len;
        let lim = scratch.len().min(bs - h);
        let (pool, base) = (self.tx_pool, self.lay.tx_bufs);
        let mut granter = self.granter.as_mut().filter(|g| g.per_packet);
        let to_u = self.to_user;
        let mut refused = None;
        let r = self.tx.add_many(max, |k, id| {
            let len = fill(k, &mut scratch[h..]).min(lim - h.min(lim));
            scratch[..h].fill(0);
            let total = h + len;
            // SAFETY: id < queue size, total <= buf_size: inside buffer `id` of the TX pool,
            // which only we write while the buffer is not in flight (it is free).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    scratch.as_ptr(),
                    pool.as_ptr().add(usize::from(id) * bs),
                    total,
                );
            }
            let addr = base + u64::from(id) * bs as u64;
            if let Some(g) = granter.as_deref_mut() {
                if let Err(e) = g.queue_grant(addr, total as u64, to_u.at(addr), Perm::Read) {
                    refused = Some(e);
                    return None;
                }
            }
            #[allow(clippy::cast_possible_truncation)] // total <= buf_size (u32)
            Some(Buf {
                addr,
                len: total as u32,
                write: false,
            })
        });
        let sent = stop_on(&mut self.tx_err, r)?;
        if let Some(e) = refused {
            return Err(os("IOTLB update")(e));
        }
        // The burst's grants, in one round trip, before the buffers are published.
        if let Some(g) = self.granter.as_mut() {
            g.flush().map_err(os("IOTLB update"))?;
        }
        if sent > 0 {
            self.stats.tx_packets += sent as u64;
            if self.tx.publish() {
                self.kick(TX_QUEUE);
            }
        }
        Ok(sent)
    }

    /// Receives up to `max` frames, calling `f` for each, then reposts the buffers (one
    /// publish, at most one kick). Returns how many frames were delivered; frames past `max`
    /// stay in the ring for the next call.
    ///
    /// The used entries of the batch (up to `max`) are taken first and every buffer's first
    /// lines start loading, so the batch's cache misses overlap; then the frames are handed
    /// out.
    pub fn recv_burst(
        &mut self,
        max: usize,
        mut f: impl FnMut(&RxFrame<'_>),
    ) -> Result<usize, Error> {
        check(self.rx_err)?;
        let head = self.rxp.headroom() as usize;
        self.used.clear();
        // Take no more entries than `max` frames need at least (one each); a merged frame
        // takes its other buffers below. An entry taken is a buffer freed for reposting, so
        // one taken and not handed out would be a frame lost.
        stop_on(
            &mut self.rx_err,
            self.rx.pop_used_batch(&mut self.used, max),
        )?;
        for &(id, _) in &self.used {
            // Start loading the buffer's first two lines (no effect on correctness).
            let at = self.rxp.posted[usize::from(id)].off as usize + head;
            if let Some(p) = NonNull::new(self.rx_pool.as_ptr().wrapping_add(at)) {
                virtq::prefetch_range(p, 128, false);
            }
        }
        let mrg = self.features & VIRTIO_NET_F_MRG_RXBUF != 0;
        #[allow(clippy::cast_possible_truncation)] // 10 or 12
        let hdr_len = self.hdr_len as u32;
        let (mut got, mut i) = (0usize, 0usize);
        while i < self.used.len() && got < max {
            let (id, len) = self.used[i];
            let mut want = 1usize;
            if mrg && len >= hdr_len {
                let mut nb = [0u8; 2];
                let at = self.rxp.posted[usize::from(id)].off as usize + head + 10;
                // SAFETY: id is in flight and 12 <= len <= the bytes offered at `off + head`
                // (validated by DriverQueue), so num_buffers (offset 10) is inside the buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.rx_pool.as_ptr().add(at),
                        nb.as_mut_ptr(),
                        2,
                    );
                }
                want = usize::from(u16::from_le_bytes(nb)).max(1);
            }
            let end = i + want;
            if end > self.used.len() {
                let more = end - self.used.len();
                stop_on(
                    &mut self.rx_err,
                    self.rx.pop_used_batch(&mut self.used, more),
                )?;
            }
            if len < hdr_len || end > self.used.len() {
                // Short, or a merged frame whose buffers the device did not publish together.
                self.stats.rx_errors += 1;
                i += 1;
                continue;
            }
            let frame = RxFrame {
                pool: self.rx_pool,
                posted: &self.rxp.posted,
                headroom: self.rxp.headroom(),
                hdr_len,
                ids: &self.used[i..end],
            };
            let bytes = frame.len() as u64;
            self.stats.rx_bytes += bytes;
            f(&frame);
            #[allow(clippy::cast_possible_truncation)] // at most 64 KiB times the ring
            self.rxp.ewma.add(bytes as u32);
            got += 1;
            i = end;
        }
        // Buffers a malformed merged frame took in that no frame used before `max` was
        // reached: dropped with it, and counted.
        self.stats.rx_errors += (self.used.len() - i) as u64;
        self.stats.rx_packets += got as u64;
        // Every buffer taken goes back to the pool, now that no frame refers to it.
        self.stats.rx_buffers += self.used.len() as u64;
        for &(id, _) in &self.used {
            let b = self.rxp.posted[usize::from(id)];
            self.stats.rx_truesize += u64::from(b.slot);
            self.rxp.release(b);
            if let Some(g) = self.granter.as_mut().filter(|g| g.per_packet) {
                let at = self.lay.rx_bufs + u64::from(b.off) + u64::from(self.rxp.headroom());
                // Sent with the refill's grants below, before the buffer is posted again.
                g.queue_revoke(at, u64::from(b.len))
                    .map_err(os("IOTLB invalidate"))?;
            }
        }
        self.refill_rx()?;
        // A stopped TX queue does not stop RX: its violation was reported once already.
        if self.cfg.tx_mode == TxMode::RxPoll && self.tx_err.is_none() {
            self.reclaim_tx()?;
        }
        Ok(got)
    }

    /// Arm, fence, re-check on the RX ring: `Armed::Empty` means it is safe to [`wait`](Self::wait).
    pub fn arm_rx(&mut self) -> Result<Armed, Error> {
        check(self.rx_err)?;
        stop_on(&mut self.rx_err, self.rx.arm_used_notify())
    }

    /// Stops RX interrupts (we are polling).
    pub fn disarm_rx(&mut self) {
        self.rx.disable_used_notify();
    }

    /// Arm, fence, re-check on the TX ring (only when full and the sender must wait).
    pub fn arm_tx(&mut self) -> Result<Armed, Error> {
        check(self.tx_err)?;
        stop_on(&mut self.tx_err, self.tx.arm_used_notify())
    }

    /// Stops TX interrupts again (except in `Irq` mode, where they stay on).
    pub fn disarm_tx(&mut self) {
        if self.cfg.tx_mode != TxMode::Irq {
            self.tx.disable_used_notify();
        }
    }

    /// Sleeps until a call arrives on either queue or `timeout` passes; drains the call fds.
    /// Returns true if a call arrived.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, Error> {
        let mut fds = [
            libc::pollfd {
                fd: self.call[RX_QUEUE].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.call[TX_QUEUE].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            // The backend hanging up (a sleeping frontend would not notice otherwise).
            libc::pollfd {
                fd: self.ctl.as_raw_fd(),
                events: libc::POLLRDHUP,
                revents: 0,
            },
        ];
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        self.stats.sleeps += 1;
        // SAFETY: three valid pollfd entries on our own fds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 3, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(Error::Os {
                what: "poll",
                source: e,
            });
        }
        if fds[2].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return Err(Error::Disconnected);
        }
        if let Some(g) = self.granter.as_mut() {
            g.serve_misses().map_err(os("backend channel"))?;
        }
        let mut any = false;
        for q in [RX_QUEUE, TX_QUEUE] {
            if let Ok(v) = self.call[q].read() {
                self.stats.calls += v;
                any = true;
            }
        }
        Ok(any)
    }

    /// Stops both rings at the backend (`GET_VRING_BASE`), so it no longer touches our memory,
    /// and returns the backend's final avail indices (rx, tx).
    pub fn stop(&mut self) -> Result<(u32, u32), Error> {
        let _dog = Watchdog::arm(&self.ctl, self.cfg.reply_timeout)?;
        let rx = self.fe.get_vring_base(RX_QUEUE)?;
        let tx = self.fe.get_vring_base(TX_QUEUE)?;
        Ok((rx, tx))
    }
}
