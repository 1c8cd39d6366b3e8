//! `pvnet switch`: an L2 learning switch between vhost-user ports and host ports (tap, sink,
//! gen), run by the same worker and poll loop as every other port.
//!
//! Per source batch: chains popped once, each packet's Ethernet addresses read once (the first
//! 26 bytes, header included), the source address learned, the destination looked up; the
//! packet is then copied once, straight from the source's memory into each receiver's buffers
//! (another frontend's receive chains, the kernel via `writev` on the tap, or a sink's check).
//! Each receiver's receive batch is opened (one `available()` load, chains popped) the first
//! time the batch sends it something and published once at the end of the source batch.
//!
//! Offloads (virtio 1.x 5.1.6.2 / 5.1.6.4): a packet keeps its checksum and GSO metadata when
//! the receiver negotiated them (a tap always does). Otherwise pvnet completes the checksum or
//! segments the packet in software ([`crate::offload`]), counted per receiver (`sw_csum`,
//! `sw_gso`); those are the only paths with a second copy.
//!
//! Backpressure: a unicast packet whose receiver has no buffers waits in the source ring (or,
//! from a tap, in its staging buffer) for at most [`HOLD`]; after that, and always for
//! flooded copies, it is dropped and counted (`no_buffer`).

use crate::frame::{self, SeqCheck};
use crate::poll::Idle;
use crate::port::{deliver, deliver_frames, Delivered, Port, QueueSlot, HDR, MAX_MERGE};
use crate::stats::{bump, DropReason, PortStats};
use crate::tap::Tap;
use pvnet_net::offload::{self, VnetHdr};
use pvnet_vhost::backend::PortId;
use pvnet_vhost::features::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::mem::{copy_segs, read_segs, write_segs};
use virtq::Seg;

/// Longest a unicast packet waits for its receiver's buffers before it is dropped.
pub const HOLD: Duration = Duration::from_millis(2);
/// How often a tap is read while the worker polls other rings and the tap had nothing last
/// time (each look is a `read` syscall); right after every sleep it is read at once.
pub const TAP_LOOK: Duration = Duration::from_micros(20);
/// Largest packet (virtio-net header included) a host port buffers.
const MAX_PKT: usize = crate::tap::RECV_BUF_LEN;
/// Bytes of a packet read to switch it: the virtio-net header and both MAC addresses.
const HEAD: usize = 12 + 14;

/// Switch settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchConfig {
    /// How long a learned address stays without traffic from it.
    pub aging: Duration,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        Self {
            aging: Duration::from_secs(300),
        }
    }
}

// ---- MAC table --------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// 48-bit address + 1 (0: empty slot).
    key: u64,
    port: PortId,
    seen: Instant,
}

/// Learned station addresses: open addressing over a fixed power-of-two table, probed at most
/// [`MacTable::PROBE`] slots; a full probe run replaces its oldest entry. No allocation after
/// construction; aging is checked on lookup (an aged entry is a miss, and its slot is reused).
#[derive(Debug)]
pub struct MacTable {
    slots: Box<[Option<Entry>]>,
    aging: Duration,
}

/// One learned address (for `pvnet ctl macs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacEntry {
    /// The station address.
    pub mac: [u8; 6],
    /// Where it was last seen.
    pub port: PortId,
    /// Since when it has not sent.
    pub age: Duration,
}

fn mac_key(m: [u8; 6]) -> u64 {
    let mut k = [0u8; 8];
    k[..6].copy_from_slice(&m);
    u64::from_le_bytes(k) + 1
}

/// Group bit: broadcast and multicast.
#[inline]
fn is_group(m: &[u8]) -> bool {
    m[0] & 1 != 0
}

impl MacTable {
    /// Slots probed per address.
    pub const PROBE: usize = 8;

    /// A table of `slots` entries (rounded up to a power of two, at least 16).
    pub fn new(slots: usize, aging: Duration) -> Self {
        let n = slots.max(16).next_power_of_two();
        Self {
            slots: vec![None; n].into_boxed_slice(),
            aging,
        }
    }

    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing: the top bits of key * 2^64/phi.
        let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let bits = self.slots.len().trailing_zeros();
        usize::try_from(h >> (64 - bits)).unwrap_or(0)
    }

    /// Records that `mac` was seen on `port`. A group address is never learned.
    pub fn learn(&mut self, mac: [u8; 6], port: PortId, now: Instant) {
        if is_group(&mac) {
            return;
        }
        let key = mac_key(mac);
        let mask = self.slots.len() - 1;
        let home = self.home(key);
        let mut hole = None;
        let mut oldest = (home, None::<Instant>);
        for i in 0..Self::PROBE {
            let at = (home + i) & mask;
            match &mut self.slots[at] {
                Some(e) if e.key == key => {
                    e.port = port;
                    e.seen = now;
                    return;
                }
                Some(e) => {
                    if oldest.1.is_none_or(|o| e.seen < o) {
                        oldest = (at, Some(e.seen));
                    }
                }
                None => {
                    hole.get_or_insert(at);
                }
            }
        }
        self.slots[hole.unwrap_or(oldest.0)] = Some(Entry {
            key,
            port,
            seen: now,
        });
    }

    /// The port `mac` was last seen on, unless it is a group address, unknown, or aged out.
    #[inline]
    pub fn lookup(&self, mac: [u8; 6], now: Instant) -> Option<PortId> {
        if is_group(&mac) {
            return None;
        }
        let key = mac_key(mac);
        let mask = self.slots.len() - 1;
        let home = self.home(key);
        (0..Self::PROBE)
            .filter_map(|i| self.slots[(home + i) & mask])
            .find(|e| e.key == key)
            .filter(|e| now.saturating_duration_since(e.seen) < self.aging)
            .map(|e| e.port)
    }

    /// Forgets every address learned on `port` (it went down).
    pub fn flush_port(&mut self, port: PortId) {
        for s in self.slots.iter_mut() {
            if s.is_some_and(|e| e.port == port) {
                *s = None;
            }
        }
    }

    /// Every live entry.
    pub fn entries(&self, now: Instant) -> Vec<MacEntry> {
        let mut v: Vec<MacEntry> = self
            .slots
            .iter()
            .flatten()
            .filter(|e| now.saturating_duration_since(e.seen) < self.aging)
            .map(|e| {
                let b = (e.key - 1).to_le_bytes();
                MacEntry {
                    mac: [b[0], b[1], b[2], b[3], b[4], b[5]],
                    port: e.port,
                    age: now.saturating_duration_since(e.seen),
                }
            })
            .collect();
        v.sort_by_key(|e| (e.port, e.mac));
        v
    }
}

// ---- host ports -------------------------------------------------------------------------------

/// Generator settings of a `gen` port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenSpec {
    /// Ethernet frame length.
    pub frame_len: usize,
    /// Packets per second; 0: as fast as receivers take them.
    pub rate: u64,
    /// Stop after this long (then the end marker goes out); `None`: run until the switch stops.
    pub duration: Option<Duration>,
    /// Wait this long after a receiver appears before the first frame (a frontend that is
    /// still starting may discard what arrives early: DPDK's virtio PMD flushes its receive
    /// rings in `dev_start`, after the rings run).
    pub delay: Duration,
    /// Source address of the frames.
    pub src: [u8; 6],
    /// Destination address of the frames.
    pub dst: [u8; 6],
}

/// A tap port: the kernel's side.
#[derive(Debug)]
pub struct TapPort {
    tap: Tap,
    buf: Vec<u8>,
    /// Bytes of a packet read but not yet delivered (its receiver was full).
    pending: usize,
    /// Read again at once (the last read returned a packet, or the worker just woke).
    look: bool,
    last_look: Option<Instant>,
}

impl TapPort {
    /// Wraps an open tap (non-blocking, with the virtio-net header).
    pub fn new(tap: Tap) -> Self {
        Self {
            tap,
            buf: vec![0u8; MAX_PKT],
            pending: 0,
            look: true,
            last_look: None,
        }
    }
}

/// A sink port: reads every byte it is sent, checks bench sequence numbers.
#[derive(Debug)]
pub struct SinkPort {
    check: SeqCheck,
    scratch: Vec<u8>,
}

impl Default for SinkPort {
    fn default() -> Self {
        Self {
            check: SeqCheck::default(),
            scratch: vec![0u8; MAX_PKT],
        }
    }
}

/// A gen port: numbered bench frames at a set rate.
#[derive(Debug)]
pub struct GenPort {
    spec: GenSpec,
    /// Header + frame.
    template: Vec<u8>,
    seq: u64,
    started: Option<Instant>,
    /// When a receiver appeared (the delay runs from here).
    armed: Option<Instant>,
    done: bool,
}

impl GenPort {
    /// A generator that starts on the first round after it is added.
    pub fn new(spec: GenSpec) -> Self {
        let len = spec.frame_len.clamp(frame::MIN_FRAME, MAX_PKT - 12);
        let mut template = vec![0u8; 12 + len];
        frame::write_template(&mut template[12..], len, spec.src, spec.dst);
        Self {
            spec,
            template,
            seq: 0,
            started: None,
            armed: None,
            done: false,
        }
    }

    fn active(&self) -> bool {
        !self.done
    }

    /// Frames owed by now at the configured rate (all it may send when unpaced).
    fn owed(&self, now: Instant, batch: usize) -> usize {
        let Some(t0) = self.started else { return 0 };
        if self.spec.rate == 0 {
            return batch;
        }
        let ns = now.saturating_duration_since(t0).as_nanos();
        let due = ns.saturating_mul(u128::from(self.spec.rate)) / 1_000_000_000;
        let owed = due.saturating_sub(u128::from(self.seq));
        usize::try_from(owed).map_or(batch, |n| n.min(batch))
    }

    /// When the next paced frame is due.
    fn next_due(&self) -> Option<Instant> {
        let t0 = self.started?;
        (self.spec.rate > 0 && !self.done)
            .then(|| t0 + Duration::from_secs_f64((self.seq + 1) as f64 / self.spec.rate as f64))
    }
}

/// What a host port is.
#[derive(Debug)]
pub enum HostKind {
    /// The host kernel's tap device.
    Tap(TapPort),
    /// Consumes and checks.
    Sink(SinkPort),
    /// Produces.
    Gen(GenPort),
}

/// A switch port that is not a vhost-user frontend.
#[derive(Debug)]
pub struct HostPort {
    /// Port id (shared id space with vhost-user ports).
    pub id: PortId,
    /// Counters.
    pub stats: Arc<PortStats>,
    /// What it is.
    pub kind: HostKind,
}

impl HostPort {
    /// Whether packets can be sent to it (a generator only sends).
    pub fn receives(&self) -> bool {
        !matches!(self.kind, HostKind::Gen(_))
    }

    /// "tap", "sink" or "gen".
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            HostKind::Tap(_) => "tap",
            HostKind::Sink(_) => "sink",
            HostKind::Gen(_) => "gen",
        }
    }

    /// The tap's fd, to wait on it.
    pub fn tap_fd(&self) -> Option<i32> {
        match &self.kind {
            HostKind::Tap(t) => Some(std::os::fd::AsRawFd::as_raw_fd(&t.tap)),
            _ => None,
        }
    }
}

// ---- the switch -------------------------------------------------------------------------------

/// One packet being switched: its bytes (virtio-net header first) wherever they are.
struct Pkt<'a> {
    segs: &'a [Seg<'a>],
    /// Length, header included.
    len: u32,
    hdr: VnetHdr,
}

/// Every port as a target: the vhost-user ports, then the host ports.
fn targets(vhost: usize, host: usize) -> impl Iterator<Item = Target> {
    (0..vhost)
        .map(Target::Vhost)
        .chain((0..host).map(Target::Host))
}

/// What became of one copy of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    Sent,
    /// Unicast, receiver full, within [`HOLD`]: try again later.
    Held,
    Dropped(DropReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Vhost(usize),
    Host(usize),
}

/// A forwarding decision, valid for the rest of a source batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// One receiver (`true`: the only candidate of a flood).
    One(Target, bool),
    /// Every other port.
    Flood,
    Drop(DropReason),
}

/// The switch's state: learned addresses, host ports, scratch buffers.
#[derive(Debug)]
pub struct Fabric {
    /// Learned addresses.
    pub macs: MacTable,
    /// Tap, sink and gen ports.
    pub hosts: Vec<HostPort>,
    staging: Vec<u8>,
    segbuf: Vec<u8>,
    touched: Vec<usize>,
    batch: usize,
    /// The last route of the current source batch, by destination + source address.
    last: Option<([u8; 12], Route)>,
    /// Packets of the current source batch that were flooded.
    flooded: u64,
    /// The source is a generator: its frames wait for buffers as long as it takes (nothing
    /// is in flight yet, so waiting loses nothing; dropping would only burn the core).
    patient: bool,
}

#[inline]
fn read_head(segs: &[Seg]) -> ([u8; HEAD], usize) {
    // Nearly always the first segment holds it: a fixed-size copy the compiler inlines.
    if let Some(h) = segs.first().and_then(|s| s.read_array::<HEAD>(0)) {
        return (h, HEAD);
    }
    let mut h = [0u8; HEAD];
    let n = read_segs(segs, 0, &mut h);
    (h, n)
}

/// How a packet must change for a receiver with `features`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// As it is (flags the receiver cannot take cleared).
    Pass,
    /// Complete the partial checksum first.
    Csum,
    /// Segment first.
    Gso,
}

fn fit(h: &VnetHdr, features: u64) -> Fit {
    let gso = h.gso_type & !VnetHdr::GSO_ECN;
    if gso != VnetHdr::GSO_NONE {
        let tso = match gso {
            VnetHdr::GSO_TCPV4 => VIRTIO_NET_F_GUEST_TSO4,
            VnetHdr::GSO_TCPV6 => VIRTIO_NET_F_GUEST_TSO6,
            _ => return Fit::Gso,
        };
        let ecn = if h.gso_type & VnetHdr::GSO_ECN != 0 {
            VIRTIO_NET_F_GUEST_ECN
        } else {
            0
        };
        let need = tso | ecn | VIRTIO_NET_F_GUEST_CSUM;
        return if features & need == need {
            Fit::Pass
        } else {
            Fit::Gso
        };
    }
    if h.flags & VnetHdr::F_NEEDS_CSUM != 0 && features & VIRTIO_NET_F_GUEST_CSUM == 0 {
        return Fit::Csum;
    }
    Fit::Pass
}

/// The header a receiver with `features` is given for a packet that passes as it is.
fn header_for(h: &VnetHdr, features: u64) -> [u8; 12] {
    let mut out = *h;
    out.num_buffers = 0;
    if features & VIRTIO_NET_F_GUEST_CSUM == 0 {
        // 5.1.6.4: without GUEST_CSUM the device sets no flags.
        out.flags = 0;
    }
    let mut b = [0u8; 12];
    out.write(&mut b);
    b
}

impl Fabric {
    /// An empty switch moving up to `batch` packets per source per round.
    pub fn new(cfg: SwitchConfig, batch: u16) -> Self {
        Self {
            macs: MacTable::new(4096, cfg.aging),
            hosts: Vec::new(),
            staging: vec![0u8; MAX_PKT],
            segbuf: Vec::with_capacity(MAX_PKT + 4096),
            touched: Vec::with_capacity(16),
            batch: usize::from(batch.max(1)),
            last: None,
            flooded: 0,
            patient: false,
        }
    }

    /// One round: every source once. Returns the packets taken from sources.
    pub fn round(&mut self, ports: &mut [Port], now: Instant) -> usize {
        let mut work = 0;
        for i in 0..ports.len() {
            work += self.ingress_vhost(ports, i, now);
        }
        for i in 0..self.hosts.len() {
            work += match self.hosts[i].kind {
                HostKind::Tap(_) => self.ingress_tap(ports, i, now),
                HostKind::Gen(_) => self.ingress_gen(ports, i, now),
                HostKind::Sink(_) => 0,
            };
        }
        work
    }

    /// The worker just woke: look at every tap at once.
    pub fn woke(&mut self) {
        for h in &mut self.hosts {
            if let HostKind::Tap(t) = &mut h.kind {
                t.look = true;
            }
        }
    }

    /// What the host ports want from the poll loop: `Poll` while a tap drains or holds a
    /// packet or an unpaced generator runs; `Until` a paced generator's next frame; else
    /// `Arm` (taps are waited on by epoll, level-triggered).
    pub fn idle(&self, now: Instant) -> Idle {
        let mut r = Idle::Arm;
        for h in &self.hosts {
            match &h.kind {
                HostKind::Tap(t) if t.look || t.pending > 0 => return Idle::Poll,
                HostKind::Gen(g) if g.active() && g.started.is_none() => {
                    if let Some(a) = g.armed {
                        let t = a + g.spec.delay;
                        r = match r {
                            Idle::Until(u) => Idle::Until(u.min(t)),
                            _ => Idle::Until(t),
                        }
                    }
                }
                HostKind::Gen(g) if g.active() => match g.next_due() {
                    None => return Idle::Poll,
                    Some(t) if t <= now => return Idle::Poll,
                    Some(t) => {
                        r = match r {
                            Idle::Until(u) => Idle::Until(u.min(t)),
                            _ => Idle::Until(t),
                        }
                    }
                },
                _ => {}
            }
        }
        r
    }

    /// A port went down: forget what was learned on it.
    pub fn port_down(&mut self, port: PortId) {
        self.macs.flush_port(port);
    }

    /// Whether `t` takes a flooded copy of a packet from `src`: another port that receives
    /// (a vhost-user port with its receive queue running, a tap or a sink).
    fn floods_to(&self, ports: &[Port], src: PortId, t: Target) -> bool {
        match t {
            Target::Vhost(i) => ports[i].id != src && ports[i].rx.is_some(),
            Target::Host(i) => self.hosts[i].id != src && self.hosts[i].receives(),
        }
    }

    fn target(&self, ports: &[Port], id: PortId) -> Option<Target> {
        if let Some(i) = ports.iter().position(|p| p.id == id) {
            return Some(Target::Vhost(i));
        }
        self.hosts.iter().position(|h| h.id == id).map(Target::Host)
    }

    /// Switches one packet from `src`: learn, look up, deliver (unicast) or flood. Returns
    /// `Held` if a unicast receiver is full and the packet should wait.
    /// Where packets from `src` with these addresses go (and learns the source).
    fn route(&mut self, ports: &[Port], src: PortId, head: &[u8; HEAD], now: Instant) -> Route {
        let mut d = [0u8; 6];
        d.copy_from_slice(&head[12..18]);
        let mut s = [0u8; 6];
        s.copy_from_slice(&head[18..24]);
        self.macs.learn(s, src, now);
        if let Some(dst) = self.macs.lookup(d, now) {
            if dst == src {
                return Route::Drop(DropReason::Filtered);
            }
            if let Some(t) = self.target(ports, dst) {
                return Route::One(t, false);
            }
        }
        // Flood: every other port that can receive. With a single candidate the copy is a
        // unicast one (it may wait for buffers) rather than a flooded one.
        let mut only = None;
        let mut n = 0;
        for t in targets(ports.len(), self.hosts.len()) {
            if self.floods_to(ports, src, t) {
                n += 1;
                only = Some(t);
            }
        }
        match (n, only) {
            (1, Some(t)) => Route::One(t, true),
            (0, _) | (_, None) => Route::Drop(DropReason::PortDown),
            _ => Route::Flood,
        }
    }

    /// Switches one packet from `src`: learn, look up, deliver (unicast) or flood. Packets of
    /// a batch with the same addresses as the one before reuse its route (bulk traffic pays
    /// the table once per batch). Returns `Held` if a unicast receiver is full and the packet
    /// should wait.
    fn switch(
        &mut self,
        ports: &mut [Port],
        src: PortId,
        sstats: &PortStats,
        pkt: &Pkt<'_>,
        head: &[u8; HEAD],
        now: Instant,
    ) -> Out {
        let mut key = [0u8; 12];
        key.copy_from_slice(&head[12..24]);
        let route = match self.last {
            Some((k, r)) if k == key => r,
            _ => {
                let r = self.route(ports, src, head, now);
                self.last = Some((key, r));
                r
            }
        };
        match route {
            Route::Drop(r) => Out::Dropped(r),
            Route::One(t, flooded) => {
                if flooded {
                    self.flooded += 1;
                }
                self.emit(ports, t, pkt, true, now)
            }
            Route::Flood => {
                self.flooded += 1;
                for t in targets(ports.len(), self.hosts.len()) {
                    if !self.floods_to(ports, src, t) {
                        continue;
                    }
                    match self.emit(ports, t, pkt, false, now) {
                        Out::Dropped(r) => bump(&sstats.drops[r as usize], 1),
                        Out::Sent | Out::Held => {}
                    }
                }
                // Every copy went out or was counted as a drop.
                Out::Sent
            }
        }
    }

    fn emit(
        &mut self,
        ports: &mut [Port],
        t: Target,
        pkt: &Pkt<'_>,
        unicast: bool,
        now: Instant,
    ) -> Out {
        match t {
            Target::Vhost(i) => self.deliver_vhost(&mut ports[i], i, pkt, unicast, now),
            Target::Host(i) => {
                let h = &mut self.hosts[i];
                match &mut h.kind {
                    HostKind::Tap(tp) => to_tap(tp, &h.stats, pkt, &mut self.staging),
                    HostKind::Sink(sk) => to_sink(sk, &h.stats, pkt),
                    HostKind::Gen(_) => Out::Dropped(DropReason::PortDown),
                }
            }
        }
    }

    /// Opens `p`'s receive batch for this source batch (once): `None` if its receive queue is
    /// not running or just failed.
    fn open_rx<'p>(&mut self, p: &'p mut Port, idx: usize) -> Option<&'p mut QueueSlot> {
        let (id, stats) = (p.id, &*p.stats);
        let rx = QueueSlot::usable(&mut p.rx)?;
        if !p.rx_open {
            if let Err(e) = p
                .rxb
                .fill(&mut rx.q, self.batch.max(MAX_MERGE), rx.mergeable)
            {
                rx.fail(id, stats, e);
                return None;
            }
            p.rx_open = true;
            p.rx_retry = !self.patient;
            self.touched.push(idx);
        }
        Some(rx)
    }

    /// A generator's batch into one frontend (see [`deliver_frames`]). Returns the frames
    /// written and why it stopped; on `NoRoom` the rest waits (nothing is lost).
    fn gen_run(
        &mut self,
        p: &mut Port,
        idx: usize,
        tpl: &mut [u8],
        seq: u64,
        n: usize,
        end: bool,
    ) -> (usize, Option<DropReason>) {
        if self.open_rx(p, idx).is_none() {
            return (0, Some(DropReason::PortDown));
        }
        let (id, stats) = (p.id, &*p.stats);
        let Some(rx) = p.rx.as_mut() else {
            return (0, Some(DropReason::PortDown));
        };
        let (done, stop) = deliver_frames(&mut rx.q, &mut p.rxb, tpl, seq, n, end);
        let dropped = match stop {
            Ok(Delivered::Done) => None,
            Ok(Delivered::NoRoom) => {
                p.rx_blocked = true;
                None
            }
            Ok(Delivered::TooBig) => Some(DropReason::TooBig),
            Err(e) => {
                rx.fail(id, stats, e);
                Some(DropReason::PortDown)
            }
        };
        if done > 0 {
            p.rx_blocked = false;
        }
        let len = u64::try_from(tpl.len()).unwrap_or(0) - u64::from(HDR);
        bump(&stats.tx_packets, done as u64);
        bump(&stats.tx_bytes, done as u64 * len);
        (done, dropped)
    }

    fn deliver_vhost(
        &mut self,
        p: &mut Port,
        idx: usize,
        pkt: &Pkt<'_>,
        unicast: bool,
        now: Instant,
    ) -> Out {
        if self.open_rx(p, idx).is_none() {
            return Out::Dropped(DropReason::PortDown);
        }
        let (id, stats) = (p.id, &*p.stats);
        let Some(rx) = p.rx.as_mut() else {
            return Out::Dropped(DropReason::PortDown);
        };
        let features = rx.features;
        let r = match fit(&pkt.hdr, features) {
            Fit::Pass if pkt.hdr.flags == 0 && pkt.hdr.gso_type == VnetHdr::GSO_NONE => {
                // No offload metadata: the sender's header is the receiver's (deliver sets
                // num_buffers), so the whole packet is one copy.
                let segs = pkt.segs;
                deliver_retry(
                    rx,
                    &mut p.rxb,
                    &mut p.rx_retry,
                    stats,
                    pkt.len,
                    |d, doff, soff, n| copy_segs(segs, soff, d, doff, n),
                )
            }
            Fit::Pass => {
                let hb = header_for(&pkt.hdr, features);
                let segs = pkt.segs;
                let copy = |dst: &[Seg], doff: u32, soff: u32, n: u32| -> u32 {
                    let mut done = 0;
                    if soff < HDR {
                        let k = n.min(HDR - soff);
                        let s = soff as usize;
                        done += u32::try_from(write_segs(dst, doff, &hb[s..s + k as usize]))
                            .unwrap_or(0);
                    }
                    if n > done {
                        done += copy_segs(segs, soff + done, dst, doff + done, n - done);
                    }
                    done
                };
                deliver_retry(rx, &mut p.rxb, &mut p.rx_retry, stats, pkt.len, copy)
            }
            Fit::Csum => {
                let len = pkt.len as usize;
                let n = read_segs(pkt.segs, 0, &mut self.staging[..len.min(MAX_PKT)]);
                let buf = &mut self.staging[..n];
                let ok = n >= 12
                    && offload::complete_csum(
                        &mut buf[12..],
                        pkt.hdr.csum_start,
                        pkt.hdr.csum_offset,
                    )
                    .is_ok();
                if !ok {
                    return Out::Dropped(DropReason::Offload);
                }
                bump(&stats.sw_csum, 1);
                let body = &buf[12..];
                deliver_retry(
                    rx,
                    &mut p.rxb,
                    &mut p.rx_retry,
                    stats,
                    u32::try_from(n).unwrap_or(0),
                    |d, doff, soff, k| write_parts(d, doff, soff, k, &[0u8; 12], body),
                )
            }
            Fit::Gso => {
                let len = pkt.len as usize;
                let n = read_segs(pkt.segs, 0, &mut self.staging[..len.min(MAX_PKT)]);
                if n < 12 {
                    return Out::Dropped(DropReason::Offload);
                }
                let (frame, segbuf) = (&self.staging[12..n], &mut self.segbuf);
                let mut out = Ok(Delivered::Done);
                let mut sent = 0u64;
                let mut bytes = 0u64;
                let r = offload::segment(&pkt.hdr, frame, segbuf, |s: &[u8]| {
                    if !matches!(out, Ok(Delivered::Done)) {
                        return;
                    }
                    // Each segment: a plain header (full checksums inside) + the frame.
                    let total = u32::try_from(12 + s.len()).unwrap_or(0);
                    out = deliver_retry(
                        rx,
                        &mut p.rxb,
                        &mut p.rx_retry,
                        stats,
                        total,
                        |d, doff, soff, c| write_parts(d, doff, soff, c, &[0u8; 12], s),
                    );
                    if matches!(out, Ok(Delivered::Done)) {
                        sent += 1;
                        bytes += s.len() as u64;
                    }
                });
                if r.is_err() {
                    return Out::Dropped(DropReason::Offload);
                }
                bump(&stats.sw_gso, 1);
                // Segments count as packets delivered; the tail of a segmented packet that
                // found no room is lost (it cannot wait half-delivered).
                bump(&stats.tx_packets, sent);
                bump(&stats.tx_bytes, bytes);
                return match out {
                    Ok(Delivered::Done) => Out::Sent,
                    Ok(Delivered::NoRoom) => Out::Dropped(DropReason::NoBuffer),
                    Ok(Delivered::TooBig) => Out::Dropped(DropReason::TooBig),
                    Err(e) => {
                        rx.fail(id, stats, e);
                        Out::Dropped(DropReason::PortDown)
                    }
                };
            }
        };
        match r {
            Ok(Delivered::Done) => {
                bump(&stats.tx_packets, 1);
                bump(&stats.tx_bytes, u64::from(pkt.len - HDR));
                p.rx_blocked = false;
                p.rx_held_since = None;
                Out::Sent
            }
            Ok(Delivered::NoRoom) => {
                p.rx_blocked = true;
                let since = *p.rx_held_since.get_or_insert(now);
                if unicast && (self.patient || now.saturating_duration_since(since) < HOLD) {
                    Out::Held
                } else {
                    Out::Dropped(DropReason::NoBuffer)
                }
            }
            Ok(Delivered::TooBig) => Out::Dropped(DropReason::TooBig),
            Err(e) => {
                rx.fail(id, stats, e);
                Out::Dropped(DropReason::PortDown)
            }
        }
    }

    /// Publishes every receive batch this source batch opened; forgets its route; counts the
    /// batch's floods at the source.
    fn close(&mut self, ports: &mut [Port], sstats: &PortStats) {
        self.last = None;
        bump(&sstats.flooded, std::mem::take(&mut self.flooded));
        for &i in &self.touched {
            let p = &mut ports[i];
            p.rx_open = false;
            if let Some(rx) = p.rx.as_mut() {
                p.rxb.finish(&mut rx.q);
                rx.worked = true;
                rx.publish(&p.stats);
            }
        }
        self.touched.clear();
    }

    fn ingress_vhost(&mut self, ports: &mut [Port], i: usize, now: Instant) -> usize {
        let sid = ports[i].id;
        let Some(mut tx) = ports[i].tx.take() else {
            return 0;
        };
        if tx.broken {
            ports[i].tx = Some(tx);
            return 0;
        }
        match tx.q.available() {
            Ok(0) => {
                ports[i].tx = Some(tx);
                return 0;
            }
            Ok(_) => tx.worked = true,
            Err(e) => {
                tx.fail(sid, &ports[i].stats, e);
                ports[i].tx = Some(tx);
                return 0;
            }
        }
        // Only a round with work takes the counters' Arc (ports are lent to the receivers).
        let sstats = ports[i].stats.clone();
        let mut chains = std::mem::take(&mut ports[i].chains);
        chains.clear();
        if let Err(e) = tx.q.pop_batch(&mut chains, self.batch, |segs| {
            if let Some(s) = segs.first() {
                s.prefetch(2);
            }
        }) {
            tx.fail(sid, &sstats, e);
        }
        let (mut pkts, mut bytes) = (0u64, 0u64);
        let mut taken = 0;
        for c in &chains {
            let segs = tx.q.readable(c);
            let (head, n) = read_head(segs);
            let out = if n < HEAD {
                Out::Dropped(DropReason::Invalid)
            } else {
                let hdr = VnetHdr::parse(&head[..12]).unwrap_or_default();
                let pkt = Pkt {
                    segs,
                    len: c.readable,
                    hdr,
                };
                self.switch(ports, sid, &sstats, &pkt, &head, now)
            };
            if out == Out::Held {
                break;
            }
            if let Out::Dropped(r) = out {
                bump(&sstats.drops[r as usize], 1);
            }
            pkts += 1;
            bytes += u64::from(c.readable.saturating_sub(HDR));
            tx.q.push_used(c.head, 0);
            taken += 1;
        }
        tx.q.unpop(u16::try_from(chains.len() - taken).unwrap_or(0));
        self.close(ports, &sstats);
        tx.publish(&sstats);
        bump(&sstats.rx_packets, pkts);
        bump(&sstats.rx_bytes, bytes);
        ports[i].chains = chains;
        ports[i].tx = Some(tx);
        taken
    }

    fn ingress_tap(&mut self, ports: &mut [Port], h: usize, now: Instant) -> usize {
        let hp = &mut self.hosts[h];
        let sid = hp.id;
        let HostKind::Tap(t) = &mut hp.kind else {
            return 0;
        };
        if t.pending == 0
            && !t.look
            && t.last_look
                .is_some_and(|l| now.saturating_duration_since(l) < TAP_LOOK)
        {
            return 0;
        }
        // Only a round that reads takes the counters' Arc (ports are lent to the receivers).
        let sstats = hp.stats.clone();
        let mut buf = std::mem::take(&mut t.buf);
        let mut pending = t.pending;
        let mut done = 0;
        let mut drained = false;
        while done < self.batch {
            let n = if pending > 0 {
                std::mem::take(&mut pending)
            } else {
                let HostKind::Tap(t) = &mut self.hosts[h].kind else {
                    break;
                };
                match t.tap.recv(&mut buf) {
                    Ok(Some(n)) => n,
                    Ok(None) => {
                        drained = true;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(port = sid, "tap read: {e}");
                        drained = true;
                        break;
                    }
                }
            };
            if n < HEAD {
                bump(&sstats.drops[DropReason::Invalid as usize], 1);
                bump(&sstats.rx_packets, 1);
                done += 1;
                continue;
            }
            let mut head = [0u8; HEAD];
            head.copy_from_slice(&buf[..HEAD]);
            let hdr = VnetHdr::parse(&head[..12]).unwrap_or_default();
            let seg = [Seg::from_mut(&mut buf[..n])];
            let pkt = Pkt {
                segs: &seg,
                len: u32::try_from(n).unwrap_or(0),
                hdr,
            };
            let out = self.switch(ports, sid, &sstats, &pkt, &head, now);
            if out == Out::Held {
                pending = n;
                break;
            }
            if let Out::Dropped(r) = out {
                bump(&sstats.drops[r as usize], 1);
            }
            bump(&sstats.rx_packets, 1);
            bump(&sstats.rx_bytes, (n - 12) as u64);
            done += 1;
        }
        self.close(ports, &sstats);
        if let HostKind::Tap(t) = &mut self.hosts[h].kind {
            t.buf = buf;
            t.pending = pending;
            t.look = !drained && pending == 0;
            t.last_look = Some(now);
        }
        done
    }

    fn ingress_gen(&mut self, ports: &mut [Port], h: usize, now: Instant) -> usize {
        let sid = self.hosts[h].id;
        // A generator starts when something can receive its frames.
        let receivers =
            targets(ports.len(), self.hosts.len()).any(|t| self.floods_to(ports, sid, t));
        let hp = &mut self.hosts[h];
        let HostKind::Gen(g) = &mut hp.kind else {
            return 0;
        };
        if g.done {
            return 0;
        }
        if g.started.is_none() {
            if !receivers {
                g.armed = None;
                return 0;
            }
            let a = *g.armed.get_or_insert(now);
            if now.saturating_duration_since(a) < g.spec.delay {
                return 0;
            }
        }
        let t0 = *g.started.get_or_insert(now);
        let finishing = g
            .spec
            .duration
            .is_some_and(|d| now.saturating_duration_since(t0) >= d);
        let owed = if finishing {
            1
        } else {
            g.owed(now, self.batch)
        };
        if owed == 0 {
            return 0;
        }
        let sstats = hp.stats.clone();
        let mut tpl = std::mem::take(&mut g.template);
        self.patient = true;
        let mut seq = g.seq;
        let mut sent = 0;
        let mut end = false;
        let len = u32::try_from(tpl.len()).unwrap_or(0);
        // Every frame of the batch has the same addresses: one route. To a single frontend,
        // a tight loop straight into its receive batch (the common benchmark case).
        let mut head = [0u8; HEAD];
        head.copy_from_slice(&tpl[..HEAD]);
        let fast = match self.route(ports, sid, &head, now) {
            Route::One(Target::Vhost(i), flooded) => Some((i, flooded)),
            _ => None,
        };
        if let Some((i, flooded)) = fast {
            let (delivered, dropped) =
                self.gen_run(&mut ports[i], i, &mut tpl, seq, owed, finishing);
            // A frame the receiver cannot take is dropped and counted, as on the per-packet
            // path (and the generator goes on with the next one).
            let n = delivered + usize::from(dropped.is_some());
            if let Some(r) = dropped {
                bump(&sstats.drops[r as usize], 1);
            }
            sent = n;
            if flooded {
                self.flooded += n as u64;
            }
            if finishing && n == 1 {
                end = true;
            } else {
                seq += n as u64;
            }
        }
        for _ in 0..if fast.is_some() { 0 } else { owed } {
            if finishing {
                frame::set_end(&mut tpl[12..], seq);
            } else {
                frame::set_seq(&mut tpl[12..], seq);
            }
            let mut head = [0u8; HEAD];
            head.copy_from_slice(&tpl[..HEAD]);
            let seg = [Seg::from_mut(&mut tpl)];
            let pkt = Pkt {
                segs: &seg,
                len,
                hdr: VnetHdr::default(),
            };
            let out = self.switch(ports, sid, &sstats, &pkt, &head, now);
            if out == Out::Held {
                break;
            }
            if let Out::Dropped(r) = out {
                bump(&sstats.drops[r as usize], 1);
            }
            sent += 1;
            if finishing {
                end = true;
                break;
            }
            seq += 1;
        }
        self.close(ports, &sstats);
        self.patient = false;
        bump(&sstats.rx_packets, sent as u64);
        bump(&sstats.rx_bytes, sent as u64 * u64::from(len - HDR));
        if let HostKind::Gen(g) = &mut self.hosts[h].kind {
            g.template = tpl;
            g.seq = seq;
            g.done = end;
            if end {
                tracing::info!(
                    port = sid,
                    frames = seq + 1,
                    "generator done (end marker sent)"
                );
            }
        }
        sent.max(usize::from(finishing))
    }
}

/// Delivers into a receive batch; when the batch runs out the first time (`retry` set),
/// publishes what it delivered and looks once for more buffers. A receiver that is still out
/// of buffers after that waits for the next round: looking again per packet would only trade
/// used-index writes with the frontend.
fn deliver_retry(
    rx: &mut QueueSlot,
    rxb: &mut crate::port::RxBatch,
    retry: &mut bool,
    stats: &PortStats,
    len: u32,
    mut copy: impl FnMut(&[Seg], u32, u32, u32) -> u32,
) -> Result<Delivered, virtq::Error> {
    let r = deliver(&mut rx.q, rxb, len, &mut copy)?;
    if r != Delivered::NoRoom || !std::mem::take(retry) {
        return Ok(r);
    }
    rxb.finish(&mut rx.q);
    rx.publish(stats);
    let mergeable = rx.mergeable;
    rxb.fill(&mut rx.q, MAX_MERGE, mergeable)?;
    deliver(&mut rx.q, rxb, len, copy)
}

/// Writes bytes `soff..soff + n` of `hdr ++ body` at `doff` of `dst`; returns bytes written.
fn write_parts(dst: &[Seg], doff: u32, soff: u32, n: u32, hdr: &[u8; 12], body: &[u8]) -> u32 {
    let (s, n) = (soff as usize, n as usize);
    let mut done = 0usize;
    if s < 12 {
        let k = n.min(12 - s);
        done += write_segs(dst, doff, &hdr[s..s + k]);
    }
    if n > done {
        let from = (s + done - 12).min(body.len());
        let to = (s + n - 12).min(body.len());
        let at = doff + u32::try_from(done).unwrap_or(0);
        done += write_segs(dst, at, &body[from..to]);
    }
    u32::try_from(done).unwrap_or(0)
}

fn to_tap(t: &mut TapPort, stats: &PortStats, pkt: &Pkt<'_>, staging: &mut [u8]) -> Out {
    const MAX_IOV: usize = 64;
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_IOV];
    let n = if pkt.segs.len() <= MAX_IOV {
        // Straight from the sender's memory: the kernel's copy is the only one.
        for (v, s) in iov.iter_mut().zip(pkt.segs) {
            v.iov_base = s.as_ptr().cast();
            v.iov_len = s.len() as usize;
        }
        pkt.segs.len()
    } else {
        let k = read_segs(pkt.segs, 0, &mut staging[..(pkt.len as usize).min(MAX_PKT)]);
        iov[0].iov_base = staging.as_mut_ptr().cast();
        iov[0].iov_len = k;
        1
    };
    match t.tap.send_iovecs(&iov[..n]) {
        Ok(Some(_)) => {
            bump(&stats.tx_packets, 1);
            bump(&stats.tx_bytes, u64::from(pkt.len - HDR));
            Out::Sent
        }
        Ok(None) => Out::Dropped(DropReason::NoBuffer),
        Err(e) => {
            tracing::debug!("tap write refused: {e}");
            Out::Dropped(DropReason::Offload)
        }
    }
}

fn to_sink(s: &mut SinkPort, stats: &PortStats, pkt: &Pkt<'_>) -> Out {
    let len = (pkt.len as usize).min(s.scratch.len());
    let n = read_segs(pkt.segs, 0, &mut s.scratch[..len]);
    if n >= 12 && s.check.feed(frame::parse(&s.scratch[12..n])) {
        if let Some(e) = s.check.end {
            stats
                .end_marker
                .store(e + 1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    stats
        .seq_errors
        .store(s.check.seq_errors, std::sync::atomic::Ordering::Relaxed);
    bump(&stats.tx_packets, 1);
    bump(&stats.tx_bytes, n.saturating_sub(12) as u64);
    Out::Sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_looks_up_ages_and_flushes() {
        let t0 = Instant::now();
        let mut m = MacTable::new(16, Duration::from_secs(10));
        let a = [2, 0, 0, 0, 0, 1];
        let b = [2, 0, 0, 0, 0, 2];
        assert_eq!(m.lookup(a, t0), None);
        m.learn(a, 3, t0);
        m.learn(b, 4, t0);
        assert_eq!(m.lookup(a, t0), Some(3));
        assert_eq!(m.lookup(b, t0), Some(4));
        // moves
        m.learn(a, 5, t0 + Duration::from_secs(1));
        assert_eq!(m.lookup(a, t0 + Duration::from_secs(2)), Some(5));
        // ages
        assert_eq!(m.lookup(b, t0 + Duration::from_secs(11)), None);
        // group addresses are neither learned nor looked up
        m.learn([0xff; 6], 1, t0);
        assert_eq!(m.lookup([0xff; 6], t0), None);
        m.flush_port(5);
        assert_eq!(m.lookup(a, t0 + Duration::from_secs(2)), None);
        assert_eq!(m.entries(t0).len(), 1);
    }

    #[test]
    fn full_table_replaces_oldest() {
        let t0 = Instant::now();
        let mut m = MacTable::new(16, Duration::from_secs(1000));
        for i in 0..200u8 {
            m.learn(
                [2, 0, 0, 0, 1, i],
                u32::from(i),
                t0 + Duration::from_millis(u64::from(i)),
            );
        }
        // The newest is always found; the table never holds more than its slots.
        assert_eq!(
            m.lookup([2, 0, 0, 0, 1, 199], t0 + Duration::from_secs(1)),
            Some(199)
        );
        assert!(m.entries(t0 + Duration::from_secs(1)).len() <= 16);
    }

    #[test]
    fn offload_fit() {
        let mut h = VnetHdr::default();
        assert_eq!(fit(&h, 0), Fit::Pass);
        h.flags = VnetHdr::F_NEEDS_CSUM;
        assert_eq!(fit(&h, 0), Fit::Csum);
        assert_eq!(fit(&h, VIRTIO_NET_F_GUEST_CSUM), Fit::Pass);
        h.gso_type = VnetHdr::GSO_TCPV4;
        assert_eq!(fit(&h, VIRTIO_NET_F_GUEST_CSUM), Fit::Gso);
        assert_eq!(
            fit(&h, VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO4),
            Fit::Pass
        );
        h.gso_type = VnetHdr::GSO_TCPV6 | VnetHdr::GSO_ECN;
        assert_eq!(
            fit(&h, VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO6),
            Fit::Gso
        );
        h.gso_type = VnetHdr::GSO_UDP_L4;
        assert_eq!(fit(&h, u64::MAX), Fit::Gso);
        let b = header_for(
            &VnetHdr {
                flags: 2,
                ..VnetHdr::default()
            },
            0,
        );
        assert_eq!(b[0], 0);
    }

    // ---- the switch core over mock rings (one process, the driver side played by the test) --

    use crate::poll::{Policy, WakeCost};
    use crate::port::Role;
    use pvnet_vhost::backend::StartedQueue;
    use virtq::mock::MockQueue;
    use virtq::queue::Buf;
    use virtq::queue::{Direction, DriverQueue, Format};

    const BUF: u32 = 2048;

    /// A vhost port whose frontend is the test: a transmit ring the test fills and a receive
    /// ring it posts buffers to; `features` is what its frontend "acked".
    struct Fe {
        port: Port,
        txm: MockQueue,
        tx: DriverQueue,
        rxm: MockQueue,
        rx: DriverQueue,
        next_tx: u16,
    }

    fn fe(id: PortId, features: u64) -> Fe {
        let now = Instant::now();
        let wake = WakeCost {
            typical: Duration::from_micros(30),
            floor: Duration::from_micros(10),
        };
        let mut port = Port::new(id, Role::Switch(SwitchConfig::default()), Arc::default());
        let txm = MockQueue::new(64, 65536 + 64);
        let (tx, txd) = txm
            .pair_in(Format::Split, Direction::DeviceReads, false)
            .unwrap();
        let rxm = MockQueue::new(256, BUF);
        let (mut rx, rxd) = rxm
            .pair_in(Format::Split, Direction::DeviceWrites, false)
            .unwrap();
        for i in 0..256 {
            rx.add_one(Buf {
                addr: rxm.buf(i),
                len: BUF,
                write: true,
            })
            .unwrap();
        }
        rx.publish();
        for (index, queue) in [(1u16, txd), (0, rxd)] {
            let q = StartedQueue {
                index,
                queue,
                kick: None,
                call: None,
                err: None,
                mergeable: true,
                features,
            };
            port.start(q, Policy::Busy, wake, now);
        }
        Fe {
            port,
            txm,
            tx,
            rxm,
            rx,
            next_tx: 0,
        }
    }

    impl Fe {
        /// Sends `hdr ++ frame` as one descriptor.
        fn send(&mut self, hdr: &VnetHdr, frame: &[u8]) {
            let mut b = vec![0u8; 12 + frame.len()];
            hdr.write(&mut b);
            b[12..].copy_from_slice(frame);
            let addr = self.txm.buf(self.next_tx);
            self.next_tx += 1;
            self.txm.poke(addr, &b);
            let len = u32::try_from(b.len()).unwrap();
            self.tx
                .add_one(Buf {
                    addr,
                    len,
                    write: false,
                })
                .unwrap();
            self.tx.publish();
        }

        /// Every packet delivered so far: (header, frame), merged buffers joined.
        fn received(&mut self) -> Vec<(VnetHdr, Vec<u8>)> {
            let mut out = Vec::new();
            let mut cur: Option<(VnetHdr, Vec<u8>, u16)> = None;
            self.rx.used_available().unwrap();
            while let Some((id, len)) = self.rx.pop_used().unwrap() {
                let mut b = vec![0u8; len as usize];
                self.rxm.peek(self.rxm.buf(id), &mut b);
                match cur.take() {
                    None => {
                        let h = VnetHdr::parse(&b).unwrap();
                        let left = h.num_buffers.max(1) - 1;
                        cur = Some((h, b[12..].to_vec(), left));
                    }
                    Some((h, mut f, left)) => {
                        f.extend_from_slice(&b);
                        cur = Some((h, f, left - 1));
                    }
                }
                if let Some((h, f, 0)) = &cur {
                    out.push((*h, f.clone()));
                    cur = None;
                }
            }
            out
        }
    }

    fn mac(last: u8) -> [u8; 6] {
        [2, 0, 0, 0, 0, last]
    }

    fn csum(data: &[u8], init: u32) -> u16 {
        let mut sum = init;
        for c in data.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from(c[0]) << 8
            };
            sum += u32::from(w);
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !u16::try_from(sum).unwrap_or(0xffff)
    }

    /// An Ethernet + IPv4 + TCP frame with `payload` bytes; TCP checksum left as the
    /// pseudo-header sum (what a driver hands over with NEEDS_CSUM).
    fn tcp4(dst: [u8; 6], src: [u8; 6], payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + payload];
        f[0..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip_len = u16::try_from(20 + 20 + payload).unwrap();
        f[14] = 0x45;
        f[16..18].copy_from_slice(&ip_len.to_be_bytes());
        f[18..20].copy_from_slice(&7u16.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        let c = csum(&f[14..34], 0);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f[34..36].copy_from_slice(&5001u16.to_be_bytes());
        f[36..38].copy_from_slice(&40000u16.to_be_bytes());
        f[38..42].copy_from_slice(&1000u32.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = 0x18; // PSH|ACK
        for (i, b) in f[54..].iter_mut().enumerate() {
            *b = u8::try_from(i * 7 % 251).unwrap_or(0);
        }
        let pseudo = pseudo_sum(&f, u32::from(ip_len) - 20);
        f[50..52].copy_from_slice(&(!csum(&[], pseudo)).to_be_bytes());
        f
    }

    fn pseudo_sum(f: &[u8], l4_len: u32) -> u32 {
        let w = |i: usize| u32::from(u16::from_be_bytes([f[i], f[i + 1]]));
        w(26) + w(28) + w(30) + w(32) + 6 + l4_len
    }

    /// The TCP checksum of a full frame verifies (sums to zero with the pseudo-header).
    fn tcp_ok(f: &[u8]) -> bool {
        let l4 = u32::from(u16::from_be_bytes([f[16], f[17]])) - 20;
        csum(&f[34..34 + l4 as usize], pseudo_sum(f, l4)) == 0 && csum(&f[14..34], 0) == 0
    }

    fn gso_hdr(payload_mss: u16) -> VnetHdr {
        VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            gso_type: VnetHdr::GSO_TCPV4,
            hdr_len: 54,
            gso_size: payload_mss,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 0,
        }
    }

    fn run(f: &mut Fabric, fes: &mut [&mut Fe]) {
        let mut ports: Vec<Port> = Vec::new();
        for fe in fes.iter_mut() {
            let p = std::mem::replace(
                &mut fe.port,
                Port::new(u32::MAX, Role::Sink, Arc::default()),
            );
            ports.push(p);
        }
        let now = Instant::now();
        for _ in 0..4 {
            f.round(&mut ports, now);
        }
        for (fe, p) in fes.iter_mut().zip(ports) {
            fe.port = p;
        }
    }

    #[test]
    fn floods_unknown_then_forwards_learned_unicast() {
        let mut f = Fabric::new(SwitchConfig::default(), 64);
        let (mut a, mut b, mut c) = (fe(0, 0), fe(1, 0), fe(2, 0));
        // a -> b's address, unknown: flooded to b and c
        a.send(&VnetHdr::default(), &tcp4(mac(2), mac(1), 10));
        run(&mut f, &mut [&mut a, &mut b, &mut c]);
        assert_eq!(b.received().len(), 1);
        assert_eq!(c.received().len(), 1);
        assert_eq!(
            a.port
                .stats
                .flooded
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        // b answers a (learned on port 0): only a gets it
        b.send(&VnetHdr::default(), &tcp4(mac(1), mac(2), 10));
        run(&mut f, &mut [&mut a, &mut b, &mut c]);
        assert_eq!(a.received().len(), 1);
        assert!(c.received().is_empty());
        // now a -> b is known too
        a.send(&VnetHdr::default(), &tcp4(mac(2), mac(1), 10));
        run(&mut f, &mut [&mut a, &mut b, &mut c]);
        assert_eq!(b.received().len(), 1);
        assert!(c.received().is_empty());
        // to a station on its own port: filtered, counted
        a.send(&VnetHdr::default(), &tcp4(mac(1), mac(3), 10));
        run(&mut f, &mut [&mut a, &mut b, &mut c]);
        assert!(b.received().is_empty() && c.received().is_empty());
        let dropped = a.port.stats.drops[DropReason::Filtered as usize]
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(dropped, 1);
        let macs: Vec<_> = f
            .macs
            .entries(Instant::now())
            .iter()
            .map(|e| (e.mac, e.port))
            .collect();
        assert_eq!(macs, vec![(mac(1), 0), (mac(3), 0), (mac(2), 1)]);
    }

    #[test]
    fn gso_packet_is_segmented_for_a_receiver_without_tso() {
        let mut f = Fabric::new(SwitchConfig::default(), 64);
        let (mut a, mut b) = (fe(0, 0), fe(1, 0));
        let frame = tcp4(mac(2), mac(1), 10_000);
        a.send(&gso_hdr(1448), &frame);
        run(&mut f, &mut [&mut a, &mut b]);
        let got = b.received();
        assert_eq!(got.len(), 7, "10000 bytes at MSS 1448");
        let mut payload = Vec::new();
        for (h, seg) in &got {
            assert_eq!(
                (h.flags, h.gso_type),
                (0, 0),
                "plain packets for a plain receiver"
            );
            assert!(tcp_ok(seg), "segment checksums verify");
            payload.extend_from_slice(&seg[54..]);
        }
        assert_eq!(payload, frame[54..]);
        let r = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            (r(&b.port.stats.sw_gso), r(&b.port.stats.tx_packets)),
            (1, 7)
        );
        assert_eq!(r(&a.port.stats.rx_packets), 1);
    }

    #[test]
    fn gso_packet_passes_whole_to_a_receiver_with_tso() {
        use pvnet_vhost::features::{VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4};
        let mut f = Fabric::new(SwitchConfig::default(), 64);
        let (mut a, mut b) = (
            fe(0, 0),
            fe(1, VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO4),
        );
        let frame = tcp4(mac(2), mac(1), 10_000);
        a.send(&gso_hdr(1448), &frame);
        run(&mut f, &mut [&mut a, &mut b]);
        let got = b.received();
        assert_eq!(got.len(), 1);
        let (h, g) = &got[0];
        assert_eq!(
            (h.gso_type, h.gso_size, h.flags),
            (VnetHdr::GSO_TCPV4, 1448, VnetHdr::F_NEEDS_CSUM)
        );
        assert_eq!(h.num_buffers, 5, "10066 bytes over 2048-byte buffers");
        assert_eq!(g, &frame);
        assert_eq!(
            b.port
                .stats
                .sw_gso
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }

    #[test]
    fn partial_checksum_is_completed_for_a_receiver_without_guest_csum() {
        let mut f = Fabric::new(SwitchConfig::default(), 64);
        let (mut a, mut b) = (fe(0, 0), fe(1, 0));
        let frame = tcp4(mac(2), mac(1), 300);
        let mut h = gso_hdr(0);
        h.gso_type = VnetHdr::GSO_NONE;
        a.send(&h, &frame);
        run(&mut f, &mut [&mut a, &mut b]);
        let got = b.received();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.flags, 0);
        assert!(tcp_ok(&got[0].1));
        assert_eq!(
            b.port
                .stats
                .sw_csum
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }
}
