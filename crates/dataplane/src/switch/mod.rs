//! The switch: one ingress loop over every port, whatever its kind.
//!
//! Per round, each port hands out a burst ([`Port::rx_burst`]); for each packet the switch
//! decides where it goes ([`Router`]): by learned addresses ([`Router::Learn`], `pvnet
//! switch`) or by a fixed wiring ([`Router::Fixed`], the bench roles of `pvnet backend`). A
//! route is decided once per run of packets with the same addresses in a burst. The packet is
//! then offered to each receiver ([`Port::tx_burst`]), whose transmit batch is opened the first
//! time the burst sends it something and committed once when the burst is done, before the
//! sender gets its buffers back.
//!
//! Offloads (virtio 1.x 5.1.6.2 / 5.1.6.4): a packet keeps its checksum and GSO metadata when
//! the receiver takes them ([`Caps::offloads`]; a tap always does). Otherwise the switch
//! completes the checksum or segments the packet in software ([`pvnet_net::offload`]), counted
//! per receiver (`sw_csum`, `sw_gso`): the only paths with a second copy.
//!
//! Backpressure is the receiver's [`Egress`](crate::egress::Egress) decision: a packet may
//! wait where it is (the sender keeps it for the next round) or is dropped and counted.
//!
//! VLANs ([`vlan`]): while no port has VLAN settings, every packet is in VLAN 0 and takes the
//! plain path above (one branch per burst more). Once some port has them, a burst from a port
//! with settings (or from another shard) goes packet by packet: classified into its VLAN
//! (or dropped, `vlan_filtered`), routed in it, and re-cut for each receiver that needs its
//! tag inserted or removed; a plain port's packets still take the plain path, to plain ports
//! only.

mod fit;
pub(crate) mod lanes;
pub mod vlan;

use crate::egress::drain::backpressure;
use crate::egress::{Backpressure, Offer};
use crate::mac::MacTable;
use crate::pkt::{fits_mtu, frame_fits_mtu, Pkt, PortId, Staged, TxOut, EMPTY, MAX_BURST};
use crate::port::loan::{Lending, Loan};
use crate::port::{AnyPort, Ingress, Lease, Port};
use crate::stats::{bump, DropReason, PortStats};
#[cfg(test)]
use fit::MIN_TCP_GSO_SIZE;
use fit::{fit, Fit, RateLog};
pub(crate) use fit::{gso_segments, SEG_BUDGET};
use lanes::Lanes;
use pvnet_net::features::VIRTIO_NET_F_GUEST_CSUM;
use pvnet_net::offload;
use pvnet_net::{VnetHdr, HDR_LEN};
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};
use virtq::read_segs;
use virtq::Seg;
use vlan::{Act, Side, VlanMode, Vlans, RETAG_SEGS, VID};

/// Segments of a re-cut packet in a run of them ([`Cx::emit_vlan_run`]).
const RUN_SEGS: usize = 4;

pub use crate::mac::MacEntry;

/// Largest packet (virtio-net header included) the switch stages for software offloads.
const MAX_PKT: usize = crate::sys::tap::RECV_BUF_LEN;

/// Learning-switch settings.
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

/// Where a port's packets go under a fixed wiring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// To this port.
    To(PortId),
    /// Back out of the port they came in on (a vhost-user port's own receive ring).
    Hairpin,
}

/// How the switch decides where packets go.
#[derive(Debug)]
pub enum Router {
    /// Learn source addresses; unicast to a learned one, flood the rest.
    Learn(MacTable),
    /// Each source's packets go where its wire says; a source with no wire drops them
    /// (`port_down`).
    Fixed(Vec<(PortId, Wire)>),
}

impl Router {
    /// A learning router.
    pub fn learning(cfg: SwitchConfig) -> Self {
        Router::Learn(MacTable::new(4096, cfg.aging))
    }

    fn wire(&self, src: PortId) -> Option<Wire> {
        match self {
            Router::Fixed(w) => w.iter().find(|(s, _)| *s == src).map(|&(_, w)| w),
            Router::Learn(_) => None,
        }
    }
}

/// A forwarding decision, valid for the rest of a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// One receiver, by index (`true`: the only candidate of a flood).
    One(usize, bool),
    /// Every other port that receives.
    Flood,
    Drop(DropReason),
}

/// What became of one copy of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    Sent,
    /// The receiver is full and the packet may wait: the sender keeps it.
    Wait,
    Dropped(DropReason),
}

/// The switch's state: the router and scratch space. The ports are the shard's, lent per
/// round.
#[derive(Debug)]
pub struct Fabric {
    router: Router,
    batch: usize,
    staging: Vec<u8>,
    segbuf: Vec<u8>,
    touched: Vec<usize>,
    /// Refused GSO packets, logged at most once a second.
    refused: RateLog,
    /// The VLAN settings of the ports that have some.
    vlans: Vlans,
    /// Where a packet of too many segments gets its tag inserted or removed by a copy
    /// (allocated the first time).
    retag_buf: Vec<u8>,
    /// The ports spread over several shards ([`Lanes`]).
    lanes: Lanes,
}

impl Fabric {
    /// A switch moving up to `batch` packets per source per round.
    pub fn new(router: Router, batch: u16) -> Self {
        Self {
            router,
            batch: usize::from(batch.max(1)),
            staging: vec![0u8; MAX_PKT],
            segbuf: Vec::with_capacity(MAX_PKT + 4096),
            touched: Vec::with_capacity(16),
            refused: RateLog::default(),
            vlans: Vlans::default(),
            retag_buf: Vec::new(),
            lanes: Lanes::default(),
        }
    }

    /// Port `port` has lanes on the shards of `mask` (0: none, it is not spread). The
    /// shard's trunks must then hand out bursts by origin ([`crate::port::trunk`]).
    pub(crate) fn set_lanes(&mut self, port: PortId, mask: u64) {
        self.lanes.set(port, mask);
    }

    /// Whether some port is spread over shards.
    pub(crate) fn spread(&self) -> bool {
        !self.lanes.is_empty()
    }

    /// Gives port `port` its VLAN settings (None: none, VLAN 0 untagged). What was learned
    /// on it in VLANs it no longer carries is forgotten.
    /// A VLAN that no port carries any more is forgotten everywhere (what other shards'
    /// trunks brought in it).
    pub fn set_vlan(&mut self, port: PortId, mode: Option<VlanMode>) {
        if let Router::Learn(m) = &mut self.router {
            match &mode {
                Some(v) => m.flush_port_vlans(port, |k| v.carries(k)),
                None => m.flush_port_vlans(port, |k| k == 0),
            }
        }
        let old = self.vlans.set(port, mode);
        if let (Some(old), Router::Learn(m)) = (old, &mut self.router) {
            let mut gone = vlan::VlanSet::new();
            for v in old.vlans().filter(|&v| !self.vlans.carried(v)) {
                gone.insert(v);
            }
            if !gone.is_empty() {
                m.flush_vlans(|v| !gone.contains(v));
            }
        }
    }

    /// Port `port`'s VLAN settings.
    pub(crate) fn vlan_of(&self, port: PortId) -> Option<&VlanMode> {
        self.vlans.of(port)
    }

    /// The router (to add wires, read the learned addresses).
    pub(crate) fn router_mut(&mut self) -> &mut Router {
        &mut self.router
    }

    /// The learned addresses (none under a fixed wiring).
    pub(crate) fn macs(&self, now: Instant) -> Vec<MacEntry> {
        match &self.router {
            Router::Learn(m) => m.entries(now),
            Router::Fixed(_) => Vec::new(),
        }
    }

    /// A port went away: forget what was learned on it and its wires.
    pub(crate) fn port_down(&mut self, port: PortId) {
        match &mut self.router {
            Router::Learn(m) => m.flush_port(port),
            Router::Fixed(w) => w.retain(|&(s, t)| s != port && t != Wire::To(port)),
        }
    }

    /// One round: every port's egress queue drained first (what waits goes before anything
    /// new), then every port's burst once. Returns the packets moved.
    pub fn round(&mut self, ports: &mut [AnyPort], now: Instant) -> usize {
        let mut work = 0;
        for p in ports.iter_mut() {
            work += p.drain(now);
        }
        for i in 0..ports.len() {
            work += self.burst(ports, i, now);
        }
        work
    }

    /// One burst of port `i` (the others receive). Returns the packets moved.
    #[inline(always)]
    pub(crate) fn burst(&mut self, ports: &mut [AnyPort], i: usize, now: Instant) -> usize {
        let (before, rest) = ports.split_at_mut(i);
        let Some((src, after)) = rest.split_first_mut() else {
            return 0;
        };
        let sid = src.id();
        let fixed = match self.router.wire(sid) {
            Some(Wire::Hairpin) if src.caps().hairpin => return src.hairpin(self.batch, now),
            // A port that cannot send its packets back: they have nowhere to go.
            Some(Wire::Hairpin) => Some(Route::Drop(DropReason::PortDown)),
            Some(Wire::To(dst)) => Some(
                index_of(before, after, dst)
                    .map_or(Route::Drop(DropReason::PortDown), |j| Route::One(j, false)),
            ),
            None if matches!(self.router, Router::Fixed(_)) => {
                Some(Route::Drop(DropReason::PortDown))
            }
            None => None,
        };
        let offer = if src.caps().patient {
            Offer::Patient
        } else {
            Offer::Unicast
        };
        let from_trunk = src.is_trunk();
        // What comes from a shard where a spread port has a lane follows the lanes' rules.
        let peer = src.trunk_peer().filter(|_| !self.lanes.is_empty());
        let vlans = self.vlans.active();
        let tagging = vlans && (from_trunk || self.vlans.of(sid).is_some());
        let mut cx = Cx {
            f: self,
            others: Others { before, after, i },
            sid,
            from_trunk,
            peer,
            learn_at: sid,
            vlans,
            tagging,
            now,
            offer,
            fixed,
            last: None,
            vlast: None,
            flooded: 0,
            hint: 1,
            segs_left: SEG_BUDGET,
        };
        let batch = cx.f.batch;
        src.rx_burst(batch, now, &mut cx)
    }
}

/// Every port but the sender, by index in the shard's port list.
struct Others<'a> {
    before: &'a mut [AnyPort],
    after: &'a mut [AnyPort],
    /// The sender's index.
    i: usize,
}

impl Others<'_> {
    #[inline]
    fn get(&mut self, j: usize) -> Option<&mut AnyPort> {
        match j.cmp(&self.i) {
            std::cmp::Ordering::Less => self.before.get_mut(j),
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Greater => self.after.get_mut(j - self.i - 1),
        }
    }

    #[inline]
    fn get_ref(&self, j: usize) -> Option<&AnyPort> {
        match j.cmp(&self.i) {
            std::cmp::Ordering::Less => self.before.get(j),
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Greater => self.after.get(j - self.i - 1),
        }
    }

    fn len(&self) -> usize {
        self.before.len() + 1 + self.after.len()
    }
}

fn index_of(before: &[AnyPort], after: &[AnyPort], id: PortId) -> Option<usize> {
    if let Some(j) = before.iter().position(|p| p.id() == id) {
        return Some(j);
    }
    after
        .iter()
        .position(|p| p.id() == id)
        .map(|k| before.len() + 1 + k)
}

/// One sender's burst going through the switch.
struct Cx<'a, 'p> {
    f: &'a mut Fabric,
    others: Others<'p>,
    sid: PortId,
    /// The sender is a trunk from another shard: what it brings goes to this shard's own
    /// ports only (split horizon, see [`crate::port::trunk`]).
    from_trunk: bool,
    /// The shard the trunk it came over leads to, while some port is spread over shards
    /// ([`Lanes`]); None otherwise.
    peer: Option<usize>,
    /// Where sources are learned: the sender, or for what a trunk brings from a spread
    /// port, the local lane of that port ([`Lanes`]).
    learn_at: PortId,
    /// Some port has VLAN settings: a flood goes only to ports that carry its VLAN.
    vlans: bool,
    /// The sender's packets take the VLAN path ([`Cx::burst_vlan`]): it has VLAN settings,
    /// or it is a trunk from another shard while some port has.
    tagging: bool,
    now: Instant,
    /// How the sender's packets wait for a full receiver.
    offer: Offer,
    /// The sender's fixed route (a fixed wiring), decided once per burst.
    fixed: Option<Route>,
    /// The last route of the burst, by destination + source address.
    last: Option<([u8; 12], Route)>,
    /// The same on the VLAN path, by addresses and VLAN.
    vlast: Option<([u8; 12], u16, Route)>,
    /// Packets of the burst that were flooded.
    flooded: u64,
    /// Packets the sender said its burst holds.
    hint: usize,
    /// Segments this sender's packets may still be cut into this round ([`SEG_BUDGET`]).
    segs_left: usize,
}

impl Cx<'_, '_> {
    /// Whether port `j` takes a flooded copy of a packet in VLAN `vid`: another port that
    /// receives (not a trunk, for what came over one) and carries the VLAN (while some port
    /// has VLAN settings; a trunk to another shard carries every VLAN).
    #[inline]
    fn floods_to(&self, j: usize, vid: u16) -> bool {
        let Some(p) = self.others.get_ref(j) else {
            return false;
        };
        if !p.caps().receives || (self.from_trunk && p.is_trunk()) {
            return false;
        }
        if let Some(s) = self.peer {
            if self.f.lanes.on(p.id(), s) {
                return false;
            }
        }
        !self.vlans || p.is_trunk() || self.f.vlans.of(p.id()).map_or(vid == 0, |m| m.carries(vid))
    }

    /// Where packets with these addresses go (and learns the source), in VLAN 0.
    fn route(&mut self, macs: &[u8; 12]) -> Route {
        self.route_in(macs, 0)
    }

    /// Where packets with these addresses go in VLAN `vid` (and learns the source there).
    #[inline]
    fn route_in(&mut self, macs: &[u8; 12], vid: u16) -> Route {
        if let Some(r) = self.fixed {
            return r;
        }
        let Router::Learn(table) = &mut self.f.router else {
            return Route::Drop(DropReason::PortDown);
        };
        let mut d = [0u8; 6];
        d.copy_from_slice(&macs[..6]);
        let mut s = [0u8; 6];
        s.copy_from_slice(&macs[6..]);
        table.learn(vid, s, self.learn_at, self.now);
        if let Some(dst) = table.lookup(vid, d, self.now) {
            if dst == self.sid {
                return Route::Drop(DropReason::Filtered);
            }
            if self.peer.is_some_and(|s| self.f.lanes.on(dst, s)) {
                // Behind a lane of a port the other shard has a lane of: it went to the
                // wire there, if it goes at all.
                return Route::Drop(DropReason::Filtered);
            }
            if let Some(j) = index_of(self.others.before, self.others.after, dst) {
                if self.from_trunk && self.others.get_ref(j).is_some_and(AnyPort::is_trunk) {
                    // Learned behind another shard: that shard was sent it directly.
                    return Route::Drop(DropReason::Filtered);
                }
                return Route::One(j, false);
            }
        }
        // Flood: every other port that can receive. With a single candidate the copy is a
        // unicast one (it may wait for buffers) rather than a flooded one.
        let mut only = None;
        let mut n = 0;
        for j in 0..self.others.len() {
            if self.floods_to(j, vid) {
                n += 1;
                only = Some(j);
            }
        }
        match (n, only) {
            (1, Some(j)) => Route::One(j, true),
            (0, _) | (_, None) => Route::Drop(DropReason::PortDown),
            _ => Route::Flood,
        }
    }

    /// The route of a packet with these addresses: the fixed one, the burst's last one if the
    /// addresses are the same, else decided (and learned) now and kept as the last one.
    #[inline(always)]
    fn route_of(&mut self, macs: &[u8; 12]) -> Route {
        match (self.fixed, self.last) {
            (Some(r), _) => r,
            (None, Some((m, r))) if m == *macs => r,
            _ => {
                let r = self.route(macs);
                self.last = Some((*macs, r));
                r
            }
        }
    }

    /// Offers a run of packets to port `j` (one copy each): opens its batch the first time,
    /// fits a packet with offload metadata to what the port takes (such a run is that one
    /// packet), and turns "no room" into the receiver's backpressure decision. Returns how
    /// many were taken and what became of the next one if not all were. A port with an MTU
    /// takes the run up to its first frame too big for it, which is dropped (`too_big`).
    #[inline]
    fn emit(&mut self, j: usize, run: &[Pkt<'_>], offer: Offer) -> (usize, Out) {
        let now = self.now;
        let Some(port) = self.others.get(j) else {
            return (0, Out::Dropped(DropReason::PortDown));
        };
        // The part of the run that fits the port's MTU, and what becomes of the packet after
        // it once that part is taken.
        let (run, after) = match port
            .mtu()
            .and_then(|m| run.iter().position(|p| !fits_mtu(p, m)))
        {
            Some(0) => return (0, Out::Dropped(DropReason::TooBig)),
            Some(k) => (&run[..k], Out::Dropped(DropReason::TooBig)),
            None => (run, Out::Sent),
        };

        let touched = &mut self.f.touched;
        if !touched.contains(&j) {
            if !port.tx_begin(now, self.hint) {
                return (0, Out::Dropped(DropReason::PortDown));
            }
            if let AnyPort::Trunk(t) = port {
                // Only this shard's own ports send over a trunk (never another trunk).
                t.set_origin(self.sid);
            }
            touched.push(j);
        }
        let (n, out) = match run.first() {
            Some(p) if p.has_offload() => {
                debug_assert_eq!(run.len(), 1, "a packet with offloads is offered alone");
                let out = match fit(&p.hdr, port.caps().offloads) {
                    Fit::Pass => put_one(port, p, offer, now),
                    Fit::Csum => csum_then(port, p, &mut self.f.staging, offer, now),
                    Fit::Gso => {
                        let Some(n) = gso_segments(&p.hdr, p.frame_len()) else {
                            self.f.refused.note(now, self.sid, &p.hdr);
                            return (0, Out::Dropped(DropReason::Offload));
                        };
                        if n > self.segs_left && self.segs_left < SEG_BUDGET {
                            // This sender's segmentation for the round is spent: the packet
                            // waits for the next round (a flooded copy cannot: counted).
                            if offer == Offer::Flood {
                                return (0, Out::Dropped(DropReason::Offload));
                            }
                            return (0, Out::Wait);
                        }
                        self.segs_left = self.segs_left.saturating_sub(n);
                        gso_then(port, p, &mut self.f.staging, &mut self.f.segbuf, offer, now)
                    }
                };
                (usize::from(out == TxOut::Sent), out)
            }
            _ if port.backlogged() => {
                // Packets wait in its queue: these go behind them.
                port.enqueue(run, now);
                (run.len(), TxOut::Sent)
            }
            _ => port.tx_burst(run),
        };
        if n == run.len() {
            return (n, after);
        }

        let out = match backpressure(out, port.egress(), offer, now) {
            None => Out::Sent,
            Some(Backpressure::Wait) => Out::Wait,
            Some(Backpressure::Queue) => {
                // The rest of the run waits in the receiver's queue; the sender is free.
                port.enqueue(&run[n..], now);
                return (run.len(), after);
            }
            Some(Backpressure::Drop(r)) => Out::Dropped(r),
        };
        (n, out)
    }
}

/// Offers one packet (as it is, or one the switch made: a checksum completed, a segment):
/// straight to the port, or into its egress queue when packets wait there or when it has no
/// room and keeps a queue. `NoRoom`: it has no room and no queue (the caller decides).
fn put_one(port: &mut AnyPort, p: &Pkt<'_>, offer: Offer, now: Instant) -> TxOut {
    if !port.backlogged() {
        match port.tx_burst(std::slice::from_ref(p)).1 {
            TxOut::NoRoom => {}
            o => return o,
        }
        if backpressure(TxOut::NoRoom, port.egress(), offer, now) != Some(Backpressure::Queue) {
            return TxOut::NoRoom;
        }
    }
    port.enqueue(std::slice::from_ref(p), now);
    TxOut::Sent
}

/// Completes a partial checksum in the staging buffer, then offers the result.
fn csum_then(
    port: &mut AnyPort,
    pkt: &Pkt<'_>,
    staging: &mut [u8],
    offer: Offer,
    now: Instant,
) -> TxOut {
    let h = HDR_LEN as usize;
    let flen = (pkt.frame_len() as usize).min(staging.len() - h);
    let n = read_segs(pkt.segs, pkt.hdr_len, &mut staging[h..h + flen]);
    if offload::complete_csum(
        &mut staging[h..h + n],
        pkt.hdr.csum_start,
        pkt.hdr.csum_offset,
    )
    .is_err()
    {
        return TxOut::Dropped(DropReason::Offload);
    }
    staging[..h].fill(0);
    bump(&port.tx_stats().sw_csum, 1);
    let seg = [Seg::from_mut(&mut staging[..h + n])];
    let p = Pkt {
        segs: &seg,
        len: u32::try_from(h + n).unwrap_or(0),
        hdr_len: HDR_LEN,
        hdr: VnetHdr::default(),
        macs: pkt.macs,
        hash: 0,
        vlan: pkt.vlan,
    };
    let out = put_one(port, &p, offer, now);
    // The staging buffer is reused by the next packet.
    port.staged(1, Staged::Whole);
    out
}

/// Segments a GSO packet (each segment with full checksums and a plain header), offering
/// each. Segments that find no room go into the receiver's queue if it keeps one; otherwise
/// the tail of a segmented packet that found no room is lost: it cannot wait half-delivered,
/// and it is not cut (no work for a receiver that cannot take it).
fn gso_then(
    port: &mut AnyPort,
    pkt: &Pkt<'_>,
    staging: &mut [u8],
    segbuf: &mut Vec<u8>,
    offer: Offer,
    now: Instant,
) -> TxOut {
    let flen = (pkt.frame_len() as usize).min(staging.len());
    let n = read_segs(pkt.segs, pkt.hdr_len, &mut staging[..flen]);
    let mut out = TxOut::Sent;
    let r = offload::segment_while(&pkt.hdr, &staging[..n], segbuf, |s: &mut [u8]| {
        let len = u32::try_from(HDR_LEN as usize + s.len()).unwrap_or(0);
        let mut hdr = [0u8; HDR_LEN as usize];
        let segs = [Seg::from_mut(&mut hdr), Seg::from_mut(s)];
        let p = Pkt {
            segs: &segs,
            len,
            hdr_len: HDR_LEN,
            hdr: VnetHdr::default(),
            macs: pkt.macs,
            hash: 0,
            vlan: pkt.vlan,
        };
        out = put_one(port, &p, offer, now);
        // The segment buffer is reused by the next segment.
        port.staged(1, Staged::Whole);
        out == TxOut::Sent
    });
    if r.is_err() {
        return TxOut::Dropped(DropReason::Offload);
    }
    bump(&port.tx_stats().sw_gso, 1);
    match out {
        TxOut::NoRoom => TxOut::Dropped(DropReason::NoBuffer),
        o => o,
    }
}

impl Cx<'_, '_> {
    /// How port `j` stands to VLANs.
    #[inline]
    fn side_of(&self, j: usize) -> Option<Side<'_>> {
        let p = self.others.get_ref(j)?;
        Some(if p.is_trunk() {
            Side::Shard
        } else {
            self.f.vlans.of(p.id()).map_or(Side::Plain, Side::Mode)
        })
    }

    /// How the sender stands to VLANs.
    #[inline]
    fn src_side(&self) -> Side<'_> {
        if self.from_trunk {
            Side::Shard
        } else {
            self.f.vlans.of(self.sid).map_or(Side::Plain, Side::Mode)
        }
    }

    /// [`Cx::route_of`] on the VLAN path: by addresses and VLAN.
    #[inline]
    fn route_vlan(&mut self, macs: &[u8; 12], vid: u16) -> Route {
        match (self.fixed, self.vlast) {
            (Some(r), _) => r,
            (None, Some((m, v, r))) if m == *macs && v == vid => r,
            _ => {
                let r = self.route_in(macs, vid);
                self.vlast = Some((*macs, vid, r));
                r
            }
        }
    }

    /// Offers `q` (its VLAN word set) to port `j`: dropped (`vlan_filtered`) if the port
    /// does not carry its VLAN, else as it is or with its tag inserted or removed, re-cut
    /// over its own memory (the port's copy writes the new frame).
    fn emit_vlan(&mut self, j: usize, q: &Pkt<'_>, offer: Offer) -> (usize, Out) {
        let Some(side) = self.side_of(j) else {
            return (0, Out::Dropped(DropReason::PortDown));
        };
        let Some(act) = vlan::egress(side, q.vlan) else {
            return (0, Out::Dropped(DropReason::VlanFiltered));
        };
        if act == Act::Pass {
            return self.emit(j, std::slice::from_ref(q), offer);
        }
        let mut head = [0u8; vlan::HEAD];
        let mut segs = [Seg::from_mut(&mut []); RETAG_SEGS];
        if let Some(r) = vlan::retag(q, act, q.vlan, &mut head, &mut segs) {
            let out = self.emit(j, std::slice::from_ref(&r), offer);
            // The new header and tag live in this frame.
            self.staged(j, out.0, Staged::Head);
            return out;
        }
        self.emit_retag_copy(j, q, act, offer)
    }

    /// [`Cx::emit_vlan`] for a run: `pkts[0]` (classified as `word`, routed to port `j` alone,
    /// as a flood to that one port if `flooded`) and the packets after it that classify the
    /// same and go the same way, re-cut and offered as one burst (one call into the port, as
    /// on the plain path). Returns the packets taken, what became of the first one not taken,
    /// and the run's length.
    fn emit_vlan_run(
        &mut self,
        j: usize,
        flooded: bool,
        word: u16,
        pkts: &[Pkt<'_>],
        offer: Offer,
    ) -> (usize, Out, usize) {
        let Some(side) = self.side_of(j) else {
            return (0, Out::Dropped(DropReason::PortDown), 1);
        };
        let Some(act) = vlan::egress(side, word) else {
            return (0, Out::Dropped(DropReason::VlanFiltered), 1);
        };
        let vid = word & VID;
        // As on the plain path, a packet with offload metadata goes alone ([`Cx::emit`]
        // fits one such packet to its receiver at a time), and ends the run before it.
        let mut m = 1;
        let lone = pkts[0].has_offload();
        let same = vlan::Same::of(self.src_side(), word);
        while !lone && m < pkts.len().min(MAX_BURST) {
            if !same.holds(&pkts[m])
                || pkts[m].has_offload()
                || self.route_vlan(&pkts[m].macs, vid) != Route::One(j, flooded)
            {
                break;
            }
            m += 1;
        }
        let mut run = [EMPTY; MAX_BURST];
        if act == Act::Pass {
            for (r, p) in run.iter_mut().zip(&pkts[..m]) {
                *r = Pkt { vlan: word, ..*p };
            }
            let (n, out) = self.emit(j, &run[..m], offer);
            return (n, out, m);
        }
        // Each packet's new head (header, addresses, tag) and re-cut segments (a plain
        // one-segment frame takes two); one of more segments ends the run and goes alone (its
        // own re-cut, or a copy).
        // Made as they are used (a run is often half of MAX_BURST): not ~6 KB set per call.
        let mut heads = [const { MaybeUninit::<[u8; vlan::HEAD]>::uninit() }; MAX_BURST];
        let mut segs = [const { MaybeUninit::<[Seg<'_>; RUN_SEGS]>::uninit() }; MAX_BURST];
        let mut r = 0;
        for ((p, h), o) in pkts[..m].iter().zip(heads.iter_mut()).zip(segs.iter_mut()) {
            let h = h.write([0u8; vlan::HEAD]);
            let o = o.write([Seg::from_mut(&mut []); RUN_SEGS]);
            let q = Pkt { vlan: word, ..*p };
            let Some(x) = vlan::retag(&q, act, word, h, o) else {
                break;
            };
            run[r] = x;
            r += 1;
        }
        if r == 0 {
            let (n, out) = self.emit_vlan(
                j,
                &Pkt {
                    vlan: word,
                    ..pkts[0]
                },
                offer,
            );
            return (n, out, 1);
        }
        let (n, out) = self.emit(j, &run[..r], offer);
        // The new headers and tags live in this frame.
        self.staged(j, n, Staged::Head);
        (n, out, r)
    }

    /// The last `n` packets port `j` took live (`part` of each) in memory reused before
    /// the commit (see [`Port::staged`]).
    #[inline]
    fn staged(&mut self, j: usize, n: usize, part: Staged) {
        if let Some(port) = self.others.get(j) {
            port.staged(n, part);
        }
    }

    /// [`Cx::emit_vlan`] for a packet of more segments than a re-cut holds: by a copy.
    #[inline(never)]
    fn emit_retag_copy(&mut self, j: usize, q: &Pkt<'_>, act: Act, offer: Offer) -> (usize, Out) {
        let mut buf = std::mem::take(&mut self.f.retag_buf);
        if buf.is_empty() {
            buf = vec![0u8; MAX_PKT + vlan::TAG_LEN as usize];
        }
        let mut one = [Seg::from_mut(&mut [])];
        let out = match vlan::retag_copy(q, act, &mut buf, &mut one) {
            Some(r) => {
                let out = self.emit(j, std::slice::from_ref(&r), offer);
                // The copy's buffer is the next one's.
                self.staged(j, out.0, Staged::Whole);
                out
            }
            // Its checksum or headers point into the tag that goes.
            None => (0, Out::Dropped(DropReason::Offload)),
        };
        self.f.retag_buf = buf;
        out
    }

    /// A burst on the VLAN path: each packet classified into its VLAN by the port it came in
    /// on (or dropped, `vlan_filtered`), routed and learned in that VLAN, then sent to each
    /// receiver that carries the VLAN, its tag fitted to that receiver. Out of line: the
    /// plain path's code stays as it was.
    #[inline(never)]
    fn burst_vlan(&mut self, pkts: &[Pkt<'_>], stats: &PortStats) -> usize {
        let mut k = 0;
        while k < pkts.len() {
            let p = &pkts[k];
            let Some(word) = vlan::classify(self.src_side(), p) else {
                bump(&stats.drops[DropReason::VlanFiltered as usize], 1);
                k += 1;
                continue;
            };
            let q = Pkt { vlan: word, ..*p };
            let vid = word & VID;
            let out = match self.route_vlan(&q.macs, vid) {
                Route::Drop(r) => Out::Dropped(r),
                Route::One(j, flooded) => {
                    // The packets after it that go the same way leave with it, as one burst
                    // (a flood to one port too: an unknown destination behind the only
                    // other port of the VLAN, as on the plain path).
                    let (n, out, m) = self.emit_vlan_run(j, flooded, word, &pkts[k..], self.offer);
                    if flooded {
                        self.flooded +=
                            n as u64 + u64::from(n < m && matches!(out, Out::Dropped(_)));
                    }
                    k += n;
                    if n == m {
                        continue;
                    }
                    out
                }
                Route::Flood => {
                    self.flooded += 1;
                    for j in 0..self.others.len() {
                        if !self.floods_to(j, vid) {
                            continue;
                        }
                        if let (0, Out::Dropped(r)) = self.emit_vlan(j, &q, Offer::Flood) {
                            bump(&stats.drops[r as usize], 1);
                        }
                    }
                    Out::Sent
                }
            };
            match out {
                Out::Sent => k += 1,
                Out::Wait => break,
                Out::Dropped(r) => {
                    bump(&stats.drops[r as usize], 1);
                    k += 1;
                }
            }
        }
        self.commit(stats);
        k
    }
}

impl Ingress for Cx<'_, '_> {
    /// Learn, look up, deliver (unicast) or flood, a run at a time: consecutive packets with
    /// the same addresses share a route (bulk traffic pays the table once per run) and go to
    /// their receiver as one burst. Then every batch the burst opened is committed.
    fn burst(&mut self, pkts: &[Pkt<'_>], stats: &PortStats) -> usize {
        self.hint = pkts.len();
        if self.tagging {
            return self.burst_vlan(pkts, stats);
        }
        let mut k = 0;
        while k < pkts.len() {
            let p = &pkts[k];
            let route = self.route_of(&p.macs);
            let (n, out) = match route {
                Route::Drop(r) => (0, Out::Dropped(r)),
                Route::One(j, flooded) => {
                    // The run: every following packet with the same addresses (a fixed
                    // route: all of them), up to one with offload metadata.
                    let mut end = k + 1;
                    if !p.has_offload() {
                        while end < pkts.len()
                            && !pkts[end].has_offload()
                            && (self.fixed.is_some() || pkts[end].macs == p.macs)
                        {
                            end += 1;
                        }
                    }
                    let (n, out) = self.emit(j, &pkts[k..end], self.offer);
                    if flooded {
                        self.flooded += n as u64 + u64::from(matches!(out, Out::Dropped(_)));
                    }
                    (n, out)
                }
                Route::Flood => {
                    self.flooded += 1;
                    for j in 0..self.others.len() {
                        if !self.floods_to(j, 0) {
                            continue;
                        }
                        if let (0, Out::Dropped(r)) =
                            self.emit(j, std::slice::from_ref(p), Offer::Flood)
                        {
                            bump(&stats.drops[r as usize], 1);
                        }
                    }
                    // Every copy went out or was counted as a drop.
                    (1, Out::Sent)
                }
            };
            k += n;
            match out {
                Out::Sent => {}
                Out::Wait => break,
                Out::Dropped(r) => {
                    bump(&stats.drops[r as usize], 1);
                    k += 1;
                }
            }
        }
        self.commit(stats);
        k
    }

    /// What a trunk brings next entered the switch on `port` of the other shard: with a
    /// local lane of that port, its sources are learned there ([`Lanes`]).
    #[inline]
    fn origin(&mut self, port: PortId) {
        let local_lane = self.peer.is_some_and(|s| self.f.lanes.on(port, s))
            && index_of(self.others.before, self.others.after, port).is_some();
        self.learn_at = if local_lane { port } else { self.sid };
    }

    fn has_receiver(&self) -> bool {
        match self.fixed {
            Some(Route::One(j, _)) => {
                let p = if j < self.others.i {
                    self.others.before.get(j)
                } else {
                    self.others.after.get(j - self.others.i - 1)
                };
                p.is_some_and(|p| p.caps().receives)
            }
            Some(_) => false,
            None => self
                .others
                .before
                .iter()
                .chain(self.others.after.iter())
                .any(|p| p.caps().receives),
        }
    }

    /// Lends the transmit buffers of the port every packet of the sender goes to: its fixed
    /// route, or under learning the only other port that receives. Never a guess among
    /// several: the kernel writes a packet into the lending frontend's memory before the
    /// switch has read where it goes, so a frontend lends only where it would be sent the
    /// packet anyway. (Under learning, a packet addressed to a station on the sender's own
    /// side is then dropped as `filtered` after it sat in that buffer, unseen by the
    /// frontend unless it reads buffers it has not been given back: as with vhost-net, where
    /// everything the tap carries goes to the guest.) Whether and what the port lends is its
    /// own ([`Port::lend`]).
    fn lend(&mut self, want: usize) -> Option<impl Lease> {
        let j = self.lends_to()?;
        let now = self.now;
        let n = self.others.get(j)?.lend(now, want)?;
        if !self.f.touched.contains(&j) {
            self.f.touched.push(j);
        }
        (n > 0).then_some(Lent { cx: self, j, n })
    }

    fn lender(&mut self) -> Lending {
        self.lends_to()
            .and_then(|j| self.others.get_ref(j))
            .map_or(Lending::No, AnyPort::lender)
    }

    fn lender_memory(&mut self) -> Vec<pvnet_vhost::View> {
        self.lends_to()
            .and_then(|j| self.others.get_ref(j))
            .map(AnyPort::loan_memory)
            .unwrap_or_default()
    }

    fn borrow(&mut self, want: usize, room: u32, out: &mut dyn FnMut(Loan) -> bool) -> usize {
        self.lends_to()
            .and_then(|j| self.others.get(j))
            .map_or(0, |p| p.loan(want, room, out))
    }

    /// In place as a lent chain is ([`Cx::in_place`]), the route being the lender (an
    /// `AF_XDP` frame carries no offload metadata).
    fn repay(&mut self, l: &Loan, len: u32, macs: &[u8; 12]) -> bool {
        if self.tagging {
            return false;
        }
        let to = |_: usize, p: &AnyPort| p.id() == l.lender;
        self.in_place(len, &VnetHdr::default(), macs, to, |p| p.repay(l, len))
    }

    fn settle(&mut self, stats: &PortStats) {
        self.commit(stats);
    }
}

impl Cx<'_, '_> {
    /// A packet a device wrote into a port's lent buffer (`frame_len` bytes of frame,
    /// decoded as `hdr` and `macs`): routes it, learning its source, and completes it there
    /// with `fill` if its route is that port alone (`to`, by index and port), the header can
    /// pass as it is (no metadata, or metadata the port negotiated: no software checksum or
    /// segmentation to do) and the frame fits the port's MTU (too big, the usual path drops
    /// it and counts it). False: nothing was completed.
    fn in_place(
        &mut self,
        frame_len: u32,
        hdr: &VnetHdr,
        macs: &[u8; 12],
        to: impl Fn(usize, &AnyPort) -> bool,
        fill: impl FnOnce(&mut AnyPort) -> bool,
    ) -> bool {
        let Route::One(k, flooded) = self.route_of(macs) else {
            return false;
        };
        let Some(port) = self.others.get(k).filter(|p| to(k, p)) else {
            return false;
        };
        if hdr.flags != 0 || hdr.gso_type != VnetHdr::GSO_NONE {
            let offloads = port.caps().offloads;
            if offloads & VIRTIO_NET_F_GUEST_CSUM == 0 || fit(hdr, offloads) != Fit::Pass {
                return false;
            }
        }
        if port
            .mtu()
            .is_some_and(|m| !frame_fits_mtu(frame_len, hdr, m))
        {
            return false;
        }
        if !fill(port) {
            return false;
        }
        if !self.f.touched.contains(&k) {
            self.f.touched.push(k);
        }
        self.flooded += u64::from(flooded);
        true
    }

    /// The port every packet of the sender goes to, where a port may lend it buffers: its
    /// fixed route, or under learning the only other port that receives. None while its
    /// packets take the VLAN path (classified, maybe re-cut, one by one).
    fn lends_to(&self) -> Option<usize> {
        if self.tagging {
            return None;
        }
        match self.fixed {
            Some(Route::One(j, _)) => Some(j),
            Some(_) => None,
            None => self.expected(),
        }
    }
}

/// The transmit buffers of port `j`, lent to the sender's reads for one look.
struct Lent<'c, 'a, 'p> {
    cx: &'c mut Cx<'a, 'p>,
    j: usize,
    n: usize,
}

impl Lease for Lent<'_, '_, '_> {
    fn chains(&self) -> usize {
        self.n
    }

    fn chain(&self, k: usize) -> &[Seg<'_>] {
        self.cx.others.get_ref(self.j).map_or(&[], |p| p.lent(k))
    }

    /// In place when the route is the lending port ([`Cx::in_place`]).
    fn take(&mut self, len: u32, hdr: &VnetHdr, macs: &[u8; 12]) -> bool {
        let j = self.j;
        let frame = len.saturating_sub(HDR_LEN);
        let to = |k: usize, _: &AnyPort| k == j;
        self.cx.in_place(frame, hdr, macs, to, |p| p.fill_lent(len))
    }

    fn close(self, stats: &PortStats) {
        self.cx.commit(stats);
    }
}

impl Cx<'_, '_> {
    /// Under learning, the only port other than the sender that receives, if there is one
    /// (every packet of the sender goes there, or is dropped).
    fn expected(&self) -> Option<usize> {
        if !matches!(self.f.router, Router::Learn(_)) {
            return None;
        }
        let mut only = None;
        for j in 0..self.others.len() {
            // With VLANs, a plain sender's packets go only to ports in VLAN 0.
            let takes = if self.vlans {
                self.floods_to(j, 0)
            } else {
                self.others.get_ref(j).is_some_and(|p| p.caps().receives)
            };
            if takes {
                if only.is_some() {
                    return None;
                }
                only = Some(j);
            }
        }
        only
    }
}

impl Cx<'_, '_> {
    /// Commits every transmit batch the burst opened; forgets its routes; counts its floods.
    fn commit(&mut self, stats: &PortStats) {
        self.last = None;
        self.vlast = None;
        bump(&stats.flooded, std::mem::take(&mut self.flooded));
        for k in 0..self.f.touched.len() {
            let j = self.f.touched[k];
            if let Some(p) = self.others.get(j) {
                p.tx_commit();
            }
        }
        self.f.touched.clear();
    }
}

#[cfg(test)]
mod kernel_egress_tests;
#[cfg(test)]
mod tests;
