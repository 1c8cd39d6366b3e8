//! A vhost-user port: its two queues, what it does with packets, and its counters.
//!
//! Per batch: one `available()` load per ring, chains parsed once, used entries written into
//! the ring and published with one store, one call decision per ring. Packets move between
//! two frontends' memories with exactly one copy ([`virtq::mem::copy_segs`]), never through
//! an intermediate buffer.

use crate::frame::{self, SeqCheck};
use crate::poll::{Policy, Poller, WakeCost};
use crate::stats::{bump, DropReason, PortStats};
use pvnet_vhost::backend::{PortId, StartedQueue};
use pvnet_vhost::eventfd::Notifier;
const NET_HDR_LEN: usize = pvnet_net::HDR_LEN as usize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::error;
use virtq::mem::{copy_segs, read_segs, write_segs};
use virtq::Seg;
use virtq::{Chain, DeviceQueue};

/// `NET_HDR_LEN` as the u32 ring lengths use.
pub const HDR: u32 = 12;
/// Offset of `num_buffers` in `virtio_net_hdr_v1`.
pub const NUM_BUFFERS: u32 = 10;
/// Most receive chains one packet may span (64 KiB over the smallest sane buffers).
pub const MAX_MERGE: usize = 64;

/// What a port does with what its frontend sends and what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Consume every frame (read every byte, check bench sequence numbers).
    Sink,
    /// Consume like `Sink`, and fill the frontend's receive ring with bench frames.
    Gen(GenConfig),
    /// Send to the peer port (ports pair up in connection order: 0-1, 2-3, ...).
    Forward,
    /// Send back to the same frontend (request/response measurements).
    Echo,
    /// L2 learning switch between every port, host ports included ([`crate::switch`]).
    Switch(crate::switch::SwitchConfig),
}

/// Generator settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenConfig {
    /// Ethernet frame length (virtio-net header excluded).
    pub frame_len: usize,
    /// How long to generate after the receive queue starts; then the end marker goes out.
    pub duration: Duration,
}

/// A running queue and its notifiers.
#[derive(Debug)]
pub struct QueueSlot {
    /// The ring.
    pub q: DeviceQueue,
    /// Kick fd (None: the frontend polls).
    pub kick: Option<Notifier>,
    call: Option<Notifier>,
    err: Option<Notifier>,
    /// Stopped for a violation: no longer processed.
    pub broken: bool,
    /// vhost-user index.
    pub index: u16,
    /// Mergeable receive buffers negotiated.
    pub mergeable: bool,
    /// Features the frontend acked.
    pub features: u64,
    /// When to poll it and when to arm it.
    pub poll: Poller,
    /// It had work in the current round.
    pub worked: bool,
    /// A transmit-completion call is owed (see `publish`).
    call_owed: bool,
    owed_since: Option<Instant>,
    /// A call went out since the worker last looked (`take_called`).
    called: bool,
}

impl QueueSlot {
    /// Wraps a started queue, polled by `policy`.
    pub fn new(s: StartedQueue, policy: Policy, wake: WakeCost) -> Self {
        Self {
            q: s.queue,
            kick: s.kick,
            call: s.call,
            err: s.err,
            broken: false,
            index: s.index,
            mergeable: s.mergeable,
            features: s.features,
            poll: Poller::new(policy, wake),
            worked: false,
            call_owed: false,
            owed_since: None,
            called: false,
        }
    }

    /// Stops the queue for a violation: logged, counted, reported on the err fd. The process
    /// and every other queue go on.
    pub fn fail(&mut self, port: PortId, stats: &PortStats, e: virtq::Error) {
        if e.is_retryable() {
            // Nothing was consumed: the queue goes on and the chain is parsed again later.
            tracing::debug!(port, queue = self.index, "queue waits: {e}");
            return;
        }
        if !self.broken {
            error!(port, queue = self.index, "queue stopped: {e}");
            self.broken = true;
            bump(&stats.queue_errors, 1);
            if let Some(err) = &self.err {
                let _ = err.signal();
            }
        }
    }

    /// Publishes used entries; calls the frontend if it asked.
    #[inline]
    pub fn publish(&mut self, stats: &PortStats) {
        let batches = if self.index % 2 == 1 {
            &stats.rx_batches
        } else {
            &stats.tx_batches
        };
        bump(batches, u64::from(self.q.unpublished() > 0));
        if self.q.publish() {
            // A driver that asked at its last seen entry with at least half its ring in
            // flight (or without EVENT_IDX, where we cannot tell) may be out of descriptors
            // and waiting: no coalescing for it.
            let waiting = self
                .q
                .driver_backlog()
                .is_none_or(|b| b >= self.q.size() / 2);
            if self.index % 2 == 1 && !waiting {
                // Transmit completions only let the driver free buffers (a Linux driver also
                // frees them from its next transmit): the call is owed and goes out after a
                // bound (`flush_call`, the worker's tx_call_delay), so a driver that keeps
                // sending takes one interrupt per bound instead of one per batch.
                self.call_owed = true;
            } else {
                self.signal_call(stats);
            }
        }
    }

    fn signal_call(&mut self, stats: &PortStats) {
        if let Some(c) = &self.call {
            if c.signal().is_ok() {
                bump(&stats.calls, 1);
                self.called = true;
            }
        }
    }

    /// Whether a call went out since the last look.
    pub fn take_called(&mut self) -> bool {
        std::mem::take(&mut self.called)
    }

    /// When an owed transmit-completion call falls due (`bound` after it was first owed).
    pub fn call_due(&self, bound: Duration) -> Option<Instant> {
        self.owed_since
            .filter(|_| self.call_owed)
            .map(|t| t + bound)
    }

    /// Sends a deferred transmit-completion call if one is owed and `force` or it has been
    /// owed for `bound`.
    pub fn flush_call(&mut self, stats: &PortStats, now: Instant, bound: Duration, force: bool) {
        if !self.call_owed {
            return;
        }
        let since = *self.owed_since.get_or_insert(now);
        if force || now.saturating_duration_since(since) >= bound {
            self.call_owed = false;
            self.owed_since = None;
            self.signal_call(stats);
        }
    }

    /// The slot if it is running and not stopped for a violation.
    pub fn usable(s: &mut Option<QueueSlot>) -> Option<&mut QueueSlot> {
        s.as_mut().filter(|s| !s.broken)
    }
}

#[derive(Debug)]
struct GenState {
    cfg: GenConfig,
    started: Option<Instant>,
    seq: u64,
    done: bool,
    template: Vec<u8>,
}

/// One frontend connection.
#[derive(Debug)]
pub struct Port {
    /// Port id.
    pub id: PortId,
    /// Receive queue (device writes), index 0.
    pub rx: Option<QueueSlot>,
    /// Transmit queue (device reads), index 1.
    pub tx: Option<QueueSlot>,
    /// Counters.
    pub stats: Arc<PortStats>,
    /// The frontend's receive ring ran dry while we had packets for it.
    pub rx_blocked: bool,
    /// Switch: since when a unicast packet has waited for this port's receive buffers.
    pub rx_held_since: Option<Instant>,
    /// Switch: the receive batch is open (filled this round, not yet published).
    pub rx_open: bool,
    /// Switch: the open receive batch may still look once for more buffers.
    pub rx_retry: bool,
    check: SeqCheck,
    gen: Option<GenState>,
    scratch: Vec<u8>,
    /// Receive chains of the current batch.
    pub rxb: RxBatch,
    /// Transmit chains of the current batch.
    pub chains: Vec<Chain>,
}

impl Port {
    /// A port with no queues yet.
    pub fn new(id: PortId, role: Role, stats: Arc<PortStats>) -> Self {
        let gen = match role {
            Role::Gen(cfg) => {
                let mut template = vec![0u8; NET_HDR_LEN + cfg.frame_len.max(frame::MIN_FRAME)];
                frame::write_template(
                    &mut template[NET_HDR_LEN..],
                    cfg.frame_len,
                    [2, 0, 0, 0, 0, 1],
                    [2, 0, 0, 0, 0, 2],
                );
                template[NUM_BUFFERS as usize..NET_HDR_LEN].copy_from_slice(&1u16.to_le_bytes());
                Some(GenState {
                    cfg,
                    started: None,
                    seq: 0,
                    done: false,
                    template,
                })
            }
            _ => None,
        };
        Self {
            id,
            rx: None,
            tx: None,
            stats,
            rx_blocked: false,
            rx_held_since: None,
            rx_open: false,
            rx_retry: false,
            check: SeqCheck::default(),
            gen,
            scratch: vec![0u8; 65536 + NET_HDR_LEN],
            rxb: RxBatch {
                chains: Vec::with_capacity(256),
                next: 0,
                max_merge: MAX_MERGE,
            },
            chains: Vec::with_capacity(256),
        }
    }

    /// Installs a started queue.
    pub fn start(&mut self, q: StartedQueue, policy: Policy, wake: WakeCost, now: Instant) {
        if q.index > 1 {
            // One queue pair per port is serviced; a later pair must not replace the first.
            tracing::warn!(
                port = self.id,
                queue = q.index,
                "only the first queue pair is serviced; this ring is left idle"
            );
            return;
        }
        let mut slot = QueueSlot::new(q, policy, wake);
        // The worker polls a new queue first: tell the driver not to kick until we arm. A
        // ring starts with `used->flags == 0` ("kick me"); left so, a driver without
        // EVENT_IDX (DPDK virtio-user) pays an eventfd write per burst while we poll anyway.
        slot.q.disable_notify();
        if slot.index.is_multiple_of(2) {
            if let Some(g) = &mut self.gen {
                g.started.get_or_insert(now);
            }
            self.rx = Some(slot);
        } else {
            self.tx = Some(slot);
        }
    }

    /// True while a generator still has frames to send.
    pub fn gen_active(&self) -> bool {
        self.gen
            .as_ref()
            .is_some_and(|g| g.started.is_some() && !g.done)
    }

    /// Consumes up to `batch` frames from the frontend: reads every byte, checks bench
    /// sequence numbers, returns the buffers. Returns the frames processed.
    pub fn sink(&mut self, batch: u16) -> usize {
        let (id, stats) = (self.id, &*self.stats);
        let Some(tx) = QueueSlot::usable(&mut self.tx) else {
            return 0;
        };
        match tx.q.available() {
            Ok(0) => return 0,
            Ok(_) => tx.worked = true,
            Err(e) => {
                tx.fail(id, stats, e);
                return 0;
            }
        }
        let (mut pkts, mut bytes, mut bad) = (0u64, 0u64, 0u64);
        let mut end = None;
        // Parse the batch first and start loading every packet, then read them: the cache
        // misses of the whole batch overlap.
        self.chains.clear();
        let prefetch = |segs: &[Seg]| {
            if let Some(s) = segs.first() {
                s.prefetch(2);
            }
        };
        if let Err(e) =
            tx.q.pop_batch(&mut self.chains, usize::from(batch), prefetch)
        {
            // Chains popped before the bad one are still completed below.
            tx.fail(id, stats, e);
        }
        for c in &self.chains {
            let len = (c.readable as usize).min(self.scratch.len());
            if len < NET_HDR_LEN {
                bad += 1;
            } else {
                let n = read_segs(tx.q.readable(c), 0, &mut self.scratch[..len]);
                if self.check.feed(frame::parse(&self.scratch[NET_HDR_LEN..n])) {
                    end = self.check.end;
                }
                pkts += 1;
                bytes += (n - NET_HDR_LEN) as u64;
            }
            tx.q.push_used(c.head, 0);
        }
        tx.publish(stats);
        bump(&stats.rx_packets, pkts + bad);
        bump(&stats.rx_bytes, bytes);
        bump(&stats.drops[DropReason::Invalid as usize], bad);
        if let Some(e) = end {
            stats
                .end_marker
                .store(e + 1, std::sync::atomic::Ordering::Relaxed);
            stats
                .seq_errors
                .store(self.check.seq_errors, std::sync::atomic::Ordering::Relaxed);
        }
        usize::try_from(pkts + bad).unwrap_or(usize::MAX)
    }

    /// Fills the frontend's receive ring with bench frames while the generator runs.
    pub fn generate(&mut self, batch: u16, now: Instant) -> usize {
        let (id, stats) = (self.id, &*self.stats);
        let Some(g) = self.gen.as_mut() else { return 0 };
        let Some(start) = g.started else { return 0 };
        if g.done {
            return 0;
        }
        let Some(rx) = QueueSlot::usable(&mut self.rx) else {
            return 0;
        };
        let finishing = now.duration_since(start) >= g.cfg.duration;
        match self.rxb.fill(&mut rx.q, usize::from(batch), rx.mergeable) {
            Ok(0) => {
                self.rx_blocked = true;
                return 0;
            }
            Ok(_) => {
                self.rx_blocked = false;
                rx.worked = true;
            }
            Err(e) => {
                rx.fail(id, stats, e);
                return 0;
            }
        }
        let len = u32::try_from(g.template.len()).unwrap_or(u32::MAX) - HDR;
        let todo = if finishing { 1 } else { usize::from(batch) };
        let (n, stop) = deliver_frames(
            &mut rx.q,
            &mut self.rxb,
            &mut g.template,
            g.seq,
            todo,
            finishing,
        );
        match stop {
            Ok(Delivered::Done) => {}
            Ok(Delivered::NoRoom) => self.rx_blocked = true,
            Ok(Delivered::TooBig) => {
                bump(&stats.drops[DropReason::TooBig as usize], 1);
                g.done = true;
            }
            Err(e) => rx.fail(id, stats, e),
        }
        // Every frame delivered counts, the end marker too: tx_packets is what the
        // frontend received.
        let sent = n as u64;
        if finishing {
            g.done |= n == 1;
        } else {
            g.seq += sent;
        }
        self.rxb.finish(&mut rx.q);
        rx.publish(stats);
        bump(&stats.tx_packets, sent);
        bump(&stats.tx_bytes, sent * u64::from(len));
        // A finishing round counts as work even if the marker found no room: try again.
        usize::try_from(sent)
            .unwrap_or(usize::MAX)
            .max(usize::from(finishing))
    }
}

/// Outcome of delivering one packet into a receive ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// Written and its used entries pushed.
    Done,
    /// Not enough receive chains in this batch: nothing consumed.
    NoRoom,
    /// Larger than the whole ring can hold: drop it.
    TooBig,
}

/// Receive chains popped for one batch, each already being loaded for writing, consumed in
/// order; what is left goes back to the ring at [`finish`](RxBatch::finish).
#[derive(Debug, Default)]
pub struct RxBatch {
    chains: Vec<Chain>,
    next: usize,
    /// Most chains one packet may take: 1 without `VIRTIO_NET_F_MRG_RXBUF`.
    max_merge: usize,
}

impl RxBatch {
    /// Starts a batch: one `available()` load, then pops up to `max` chains and prefetches
    /// the first lines of each for writing. Returns the chains taken.
    pub fn fill(
        &mut self,
        q: &mut DeviceQueue,
        max: usize,
        mergeable: bool,
    ) -> Result<usize, virtq::Error> {
        self.chains.clear();
        self.next = 0;
        self.max_merge = if mergeable { MAX_MERGE } else { 1 };
        q.available()?;
        q.pop_batch(&mut self.chains, max, |segs| {
            if let Some(s) = segs.first() {
                s.prefetch_write(2);
            }
        })?;
        Ok(self.chains.len())
    }

    /// Chains not consumed yet.
    pub fn remaining(&self) -> usize {
        self.chains.len() - self.next
    }

    /// Gives the unconsumed chains back (they are the last ones popped).
    pub fn finish(&mut self, q: &mut DeviceQueue) {
        q.unpop(u16::try_from(self.remaining()).unwrap_or(0));
        self.chains.clear();
        self.next = 0;
    }
}

/// Writes one packet of `len` bytes, virtio-net header included, produced by
/// `copy(dst_segs, dst_off, src_off, n)`, into as many of the batch's receive chains as it
/// needs (`VIRTIO_NET_F_MRG_RXBUF`), then sets `num_buffers` in the header it wrote and pushes
/// the used entries. One copy call per chain. On `NoRoom` nothing is consumed.
pub fn deliver(
    rx: &mut DeviceQueue,
    b: &mut RxBatch,
    len: u32,
    mut copy: impl FnMut(&[Seg], u32, u32, u32) -> u32,
) -> Result<Delivered, virtq::Error> {
    let need = u64::from(len);
    let mut have = 0u64;
    let mut k = b.next;
    while have < need {
        if k - b.next == b.max_merge {
            return Ok(Delivered::TooBig);
        }
        let Some(c) = b.chains.get(k) else {
            let whole_ring = b.next == 0 && b.chains.len() >= usize::from(rx.size());
            return Ok(if whole_ring {
                Delivered::TooBig
            } else {
                Delivered::NoRoom
            });
        };
        have += u64::from(c.writable);
        k += 1;
    }
    let first = b.chains[b.next];
    if first.writable < HDR {
        // Every receive buffer must hold the header (virtio 1.x 5.1.6.3.1).
        return Err(virtq::Error::BufferTooSmall {
            len: first.writable,
            need: HDR,
        });
    }
    let mut src_off = 0u32;
    for c in &b.chains[b.next..k] {
        let n = (len - src_off).min(c.writable);
        src_off += copy(rx.writable(c), 0, src_off, n);
        rx.push_used(c.head, n);
    }
    let nbufs = u16::try_from(k - b.next).unwrap_or(1);
    write_segs(rx.writable(&first), NUM_BUFFERS, &nbufs.to_le_bytes());
    b.next = k;
    Ok(Delivered::Done)
}

/// Writes up to `n` generator frames from `tpl` (virtio-net header + bench frame) into the
/// receive batch: data frames numbered `seq`, `seq + 1`, ..., or, if `end`, one end marker
/// carrying `seq`. Returns how many were written and why it stopped (`Done`: all `n`).
pub fn deliver_frames(
    q: &mut DeviceQueue,
    rxb: &mut RxBatch,
    tpl: &mut [u8],
    seq: u64,
    n: usize,
    end: bool,
) -> (usize, Result<Delivered, virtq::Error>) {
    let len = u32::try_from(tpl.len()).unwrap_or(0);
    for k in 0..n {
        if end {
            frame::set_end(&mut tpl[NET_HDR_LEN..], seq);
        } else {
            frame::set_seq(&mut tpl[NET_HDR_LEN..], seq + k as u64);
        }
        let t = &*tpl;
        let copy = |segs: &[Seg], dst_off, src_off: u32, c: u32| {
            let s = src_off as usize;
            u32::try_from(write_segs(segs, dst_off, &t[s..s + c as usize])).unwrap_or(0)
        };
        match deliver(q, rxb, len, copy) {
            Ok(Delivered::Done) => {}
            other => return (k, other),
        }
    }
    (n, Ok(Delivered::Done))
}

/// The receiving side of a move: a port's receive queue and its batch state.
struct Dst<'a> {
    id: PortId,
    stats: &'a PortStats,
    rx: &'a mut QueueSlot,
    blocked: &'a mut bool,
    rxb: &'a mut RxBatch,
}

impl<'a> Dst<'a> {
    fn of(
        id: PortId,
        stats: &'a PortStats,
        rx: &'a mut Option<QueueSlot>,
        blocked: &'a mut bool,
        rxb: &'a mut RxBatch,
    ) -> Option<Self> {
        QueueSlot::usable(rx).map(|rx| Dst {
            id,
            stats,
            rx,
            blocked,
            rxb,
        })
    }
}

/// Moves up to `batch` packets from `src`'s frontend to `dst`'s frontend, one copy each.
/// If `dst` has no receive buffers the packets wait in `src`'s ring (backpressure, nothing
/// lost); if `dst` is not running they are dropped as `port_down`.
pub fn forward(src: &mut Port, dst: Option<&mut Port>, batch: u16) -> usize {
    let Some(tx) = QueueSlot::usable(&mut src.tx) else {
        return 0;
    };
    let d = dst.and_then(|d| Dst::of(d.id, &d.stats, &mut d.rx, &mut d.rx_blocked, &mut d.rxb));
    move_batch(src.id, &src.stats, tx, &mut src.chains, d, batch)
}

impl Port {
    /// Reflects what the frontend sends back into its own receive ring (request/response
    /// tests): the same one-copy path as [`forward`].
    pub fn echo(&mut self, batch: u16) -> usize {
        let Some(tx) = QueueSlot::usable(&mut self.tx) else {
            return 0;
        };
        let d = Dst::of(
            self.id,
            &self.stats,
            &mut self.rx,
            &mut self.rx_blocked,
            &mut self.rxb,
        );
        move_batch(self.id, &self.stats, tx, &mut self.chains, d, batch)
    }
}

fn move_batch(
    sid: PortId,
    sstats: &PortStats,
    tx: &mut QueueSlot,
    chains: &mut Vec<Chain>,
    dst: Option<Dst<'_>>,
    batch: u16,
) -> usize {
    match tx.q.available() {
        Ok(0) => return 0,
        Ok(_) => tx.worked = true,
        Err(e) => {
            tx.fail(sid, sstats, e);
            return 0;
        }
    }
    // Parse the source batch and start loading every packet.
    chains.clear();
    let prefetch = |segs: &[Seg]| {
        if let Some(s) = segs.first() {
            s.prefetch(2);
        }
    };
    if let Err(e) = tx.q.pop_batch(chains, usize::from(batch), prefetch) {
        // Chains popped before the bad one are still forwarded below.
        tx.fail(sid, sstats, e);
    }
    let Some(Dst {
        id: did,
        stats: dstats,
        rx,
        blocked,
        rxb,
    }) = dst
    else {
        // No receiver: consume and count.
        for c in chains.iter() {
            tx.q.push_used(c.head, 0);
        }
        tx.publish(sstats);
        let n = chains.len() as u64;
        bump(&sstats.rx_packets, n);
        bump(&sstats.drops[DropReason::PortDown as usize], n);
        return chains.len();
    };
    let (mut pkts, mut bytes, mut bad, mut too_big) = (0u64, 0u64, 0u64, 0u64);
    // Room for every packet of the batch, and for one that spans MAX_MERGE buffers.
    let want = chains.len().max(MAX_MERGE);
    let mergeable = rx.mergeable;
    let mut rx_err = rxb.fill(&mut rx.q, want, mergeable).err();
    let mut refreshed = false;
    let mut taken = 0;
    for c in chains.iter() {
        if rx_err.is_some() {
            break;
        }
        if (c.readable as usize) < NET_HDR_LEN {
            bad += 1;
            tx.q.push_used(c.head, 0);
            taken += 1;
            continue;
        }
        let tsegs = tx.q.readable(c);
        let len = c.readable - HDR;
        let copy = |segs: &[Seg], dst_off, src_off, n| copy_segs(tsegs, src_off, segs, dst_off, n);
        let mut r = deliver(&mut rx.q, rxb, c.readable, copy);
        if matches!(r, Ok(Delivered::NoRoom)) && !refreshed {
            // Publish what this batch delivered, then look once for more buffers.
            refreshed = true;
            rxb.finish(&mut rx.q);
            rx.publish(dstats);
            r = rxb
                .fill(&mut rx.q, want, mergeable)
                .and_then(|_| deliver(&mut rx.q, rxb, c.readable, copy));
        }
        match r {
            Ok(Delivered::Done) => {
                pkts += 1;
                bytes += u64::from(len);
                tx.q.push_used(c.head, 0);
                *blocked = false;
            }
            Ok(Delivered::NoRoom) => {
                *blocked = true;
                break;
            }
            Ok(Delivered::TooBig) => {
                too_big += 1;
                tx.q.push_used(c.head, 0);
            }
            Err(e) => {
                rx_err = Some(e);
                break;
            }
        }
        taken += 1;
    }
    // Chains not forwarded wait in the source ring for the next round.
    tx.q.unpop(u16::try_from(chains.len() - taken).unwrap_or(0));
    rxb.finish(&mut rx.q);
    if let Some(e) = rx_err {
        rx.fail(did, dstats, e);
    }
    rx.worked |= pkts > 0;
    rx.publish(dstats);
    tx.publish(sstats);
    bump(&sstats.rx_packets, pkts + bad + too_big);
    bump(&sstats.rx_bytes, bytes);
    bump(&sstats.drops[DropReason::Invalid as usize], bad);
    bump(&sstats.drops[DropReason::TooBig as usize], too_big);
    bump(&dstats.tx_packets, pkts);
    bump(&dstats.tx_bytes, bytes);
    taken
}
