//! Ports: everything packets enter and leave the dataplane through, behind one interface.
//!
//! | kind | receives (ingress) | transmits (egress) |
//! |---|---|---|
//! | [`vhost`] | a frontend's transmit ring | its receive ring (mergeable buffers) |
//! | [`kernel`] (a tap, or an `AF_PACKET` socket on a veth or NIC) | reads from the kernel, in bursts | gathered writes to the kernel, in bursts |
//! | [`afxdp`] (an interface through `AF_XDP` sockets and pvnet's XDP program) | the receive rings' frames, in place | copied into the UMEM, one ring publish per batch |
//! | [`vxlan`] (UDP tunnels to other hosts, RFC 7348) | `recvmmsg` bursts, decapsulated in place | one datagram per remote, gathered from the sender's memory, `sendmmsg` per batch |
//! | [`sink`] | — | reads and checks every byte (bench frames) |
//! | [`gen`] | numbered bench frames, paced or not | — |
//! | [`trunk`] | what another shard sent over | copies into the ring to another shard |
//!
//! A port hands its packets out in bursts ([`Port::rx_burst`]): each [`Pkt`] borrows the
//! memory it sits in (a frontend's buffer, a tap's read buffer, a generator's template), so
//! the one copy of a hop goes straight from there into the receiver ([`Port::tx_burst`]);
//! nothing is staged. A transmit batch is opened once ([`Port::tx_begin`]), filled packet by
//! packet, and committed once ([`Port::tx_commit`]: one publish and one call decision, or one
//! batch of writes). The poll loop's hooks ([`Port::idle`], [`Port::arm`], [`Port::disarm`])
//! say what the port's queues want when they had no work.
//!
//! Dispatch is static ([`AnyPort`], an enum): one branch per call, inlined into the switch's
//! one ingress loop. A port does not know where its packets go; the switch decides.

pub(crate) mod afxdp;
pub(crate) mod gen;
pub(crate) mod kernel;
pub(crate) mod loan;
pub(crate) mod mtu;
pub(crate) mod sink;
pub(crate) mod trunk;
pub(crate) mod vhost;
pub(crate) mod vxlan;

use crate::egress::Egress;
use crate::pkt::{Caps, Pkt, PortId, Staged, TxOut, MAX_BURST};
use crate::poll::plan::Settle;
use crate::stats::PortStats;
use pvnet_net::VnetHdr;
use std::time::Instant;
use virtq::Armed;
use virtq::Seg;

/// What receives a port's packets: the switch.
pub(crate) trait Ingress {
    /// Decides a burst of packets from the port, in order, and commits what they were sent
    /// to before returning (the receiver sees a packet no later than the sender sees it gone).
    /// Returns how many were taken (delivered, or dropped and counted on `stats`, the counters
    /// of the queue they came from); the rest must wait: the port keeps them, in order, for
    /// the next round.
    fn burst(&mut self, pkts: &[Pkt<'_>], stats: &PortStats) -> usize;
    /// Whether anything could take a packet from this port now (a generator starts only then).
    fn has_receiver(&self) -> bool;

    /// The packets of the bursts that follow entered the switch on port `port` of another
    /// shard (a trunk says so for what it brings over: see the switch's lanes).
    #[inline]
    fn origin(&mut self, port: PortId) {
        let _ = port;
    }

    /// Direct receive (technique 3, docs/no-copy.md), for a sender whose device can write
    /// packets into memory it is given (a kernel port's reads): lends it the transmit
    /// buffers of the port its packets are expected to go to, about `want` of them, if that
    /// port lends ([`Port::lend`]). `None`: read into the sender's own buffers as usual. The
    /// lease is closed ([`Lease::close`]) before anything else goes through.
    fn lend(&mut self, want: usize) -> Option<impl Lease> {
        let _ = want;
        None::<NoLease>
    }

    /// Loans (direct receive across rounds, [`loan`]), for a sender whose device keeps
    /// buffers until frames arrive (an `AF_XDP` fill ring): the port every packet of the
    /// sender is expected to go to, as for [`lend`](Self::lend): whether it lends now, and
    /// if so its id and loan generation.
    fn lender(&mut self) -> loan::Lending {
        loan::Lending::No
    }
    /// The memory the lender's loans lie in (pvnet's mappings of it, to map again).
    fn lender_memory(&mut self) -> Vec<pvnet_vhost::View> {
        Vec::new()
    }
    /// Borrows up to `want` of the lender's receive buffers with at least `room` bytes each
    /// behind the header, handed to `out` in ring order (one it refuses, false, goes back,
    /// and the borrowing stops). Returns how many.
    fn borrow(&mut self, want: usize, room: u32, out: &mut dyn FnMut(loan::Loan) -> bool) -> usize {
        let _ = (want, room, out);
        0
    }
    /// The device wrote a frame of `len` bytes, addressed `macs`, behind loan `l`'s header:
    /// routes it, learning its source, and completes the loan in place if it goes to its
    /// lender. False: nothing was done; the frame takes the usual path ([`burst`](Self::burst),
    /// copied out of the buffer, which the caller still holds).
    fn repay(&mut self, l: &loan::Loan, len: u32, macs: &[u8; 12]) -> bool {
        let _ = (l, len, macs);
        false
    }
    /// Commits what [`repay`](Self::repay) completed: one publish, one call decision.
    fn settle(&mut self, stats: &PortStats) {
        let _ = stats;
    }
}

/// Receive buffers lent to a sender's device (see [`Ingress::lend`]): their chains, in
/// order, each filled by the device before the next.
pub(crate) trait Lease {
    /// Chains lent.
    fn chains(&self) -> usize;
    /// The writable segments of the `k`-th lent chain not completed yet (none past them).
    fn chain(&self, k: usize) -> &[Seg<'_>];
    /// The next lent chains hold a packet the device wrote (`len` bytes, header included,
    /// decoded as `hdr` and `macs`): routes it, learning its source, and completes it in
    /// place if it goes to the lending port as it is. False: nothing was done; the packet,
    /// and every one read after it, takes the usual path (copied out of the chains first).
    fn take(&mut self, len: u32, hdr: &VnetHdr, macs: &[u8; 12]) -> bool;
    /// Commits what was completed in place (one publish, one call decision) and gives the
    /// chains not completed back.
    fn close(self, stats: &PortStats);
}

/// The lease of a receiver that never lends.
#[derive(Debug)]
pub(crate) enum NoLease {}

impl Lease for NoLease {
    fn chains(&self) -> usize {
        match *self {}
    }
    fn chain(&self, _k: usize) -> &[Seg<'_>] {
        match *self {}
    }
    fn take(&mut self, _len: u32, _hdr: &VnetHdr, _macs: &[u8; 12]) -> bool {
        match *self {}
    }
    fn close(self, _stats: &PortStats) {
        match self {}
    }
}

/// Every receive offload a virtio-net driver can take (`VIRTIO_NET_F_GUEST_*`): what a port
/// that takes metadata as it is (the kernel, a sink) says it takes.
pub(crate) const RX_OFFLOADS: u64 = pvnet_net::features::VIRTIO_NET_F_GUEST_CSUM
    | pvnet_net::features::VIRTIO_NET_F_GUEST_TSO4
    | pvnet_net::features::VIRTIO_NET_F_GUEST_TSO6
    | pvnet_net::features::VIRTIO_NET_F_GUEST_ECN;

/// Offers `pkts` one by one to `take` until one is not sent: how many were, and what became
/// of that one (a receiver's `tx_burst` over its per-packet step).
#[inline]
pub(crate) fn offer_each(
    pkts: &[Pkt<'_>],
    mut take: impl FnMut(&Pkt<'_>) -> TxOut,
) -> (usize, TxOut) {
    for (k, p) in pkts.iter().enumerate() {
        match take(p) {
            TxOut::Sent => {}
            other => return (k, other),
        }
    }
    (pkts.len(), TxOut::Sent)
}

/// A port, whatever it is. See the module docs for the contract.
pub(crate) trait Port {
    /// Its id.
    fn id(&self) -> PortId;
    /// What it takes.
    fn caps(&self) -> Caps;
    /// The largest IP packet it takes (its MTU), if it has one: the switch drops a frame
    /// longer than that plus an Ethernet and a VLAN header (`too_big`) rather than send it
    /// ([`crate::pkt::fits_mtu`]). A plain field read: the switch asks once per run.
    #[inline]
    fn mtu(&self) -> Option<u16> {
        None
    }
    /// The counters of the queue it transmits on (software offload work is counted there).
    fn tx_stats(&self) -> &PortStats;

    /// Hands up to `max` received packets to `to`, in order, until one must wait. Returns the
    /// packets taken (delivered or dropped), which is the work done.
    fn rx_burst(&mut self, max: usize, now: Instant, to: &mut impl Ingress) -> usize;

    /// Opens a transmit batch for about `hint` packets (what the sender's burst holds: a
    /// frontend's receive ring is opened for that many buffers, and looks once more if they
    /// run out). False if the port cannot take packets now (not running).
    fn tx_begin(&mut self, now: Instant, hint: usize) -> bool;
    /// Offers packets to the open batch, in order: returns how many it took, and, if not all,
    /// what became of the next one (it was not taken).
    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut);
    /// Commits the batch: one publish and call decision, one burst of writes.
    fn tx_commit(&mut self);
    /// The last `n` packets taken live (`part`: wholly, or their first segment) in memory
    /// the switch reuses before the commit (its staging for software offloads: a completed
    /// checksum, a segment; a re-cut's new header and 802.1Q tag): a port that reads packets
    /// only at [`tx_commit`](Self::tx_commit) copies that much of them now. Others read in
    /// [`tx_burst`](Self::tx_burst) and need nothing.
    #[inline]
    fn staged(&mut self, _n: usize, _part: Staged) {}

    /// Sends up to `max` of the packets it receives straight back out of itself, within
    /// the port (request/response benchmarks; only a port whose [`Caps::hairpin`] says so).
    /// Returns the packets taken.
    fn hairpin(&mut self, max: usize, now: Instant) -> usize {
        let _ = (max, now);
        0
    }

    /// Lends about `want` of its transmit buffers for a sender's device to write packets
    /// straight into (direct receive, docs/no-copy.md), opening its transmit batch at `now`
    /// as [`tx_begin`](Self::tx_begin) does (it is committed with the rest). `None`: it does
    /// not lend now, and nothing was opened; else how many chains it lends (maybe none).
    fn lend(&mut self, now: Instant, want: usize) -> Option<usize> {
        let _ = (now, want);
        None
    }
    /// The writable segments of the `k`-th lent chain not filled yet (none past them). They
    /// stay the port's buffers, popped for this batch.
    fn lent(&self, k: usize) -> &[Seg<'_>] {
        let _ = k;
        &[]
    }
    /// Completes the next lent chains in place: they hold a packet of `len` bytes (header
    /// included) that the device wrote across them in order. False, nothing consumed, if they
    /// cannot take it.
    fn fill_lent(&mut self, len: u32) -> bool {
        let _ = len;
        false
    }

    /// Its transmit side's backpressure state (what becomes of a packet it has no room for),
    /// if it keeps one.
    fn egress(&mut self) -> Option<&mut Egress> {
        None
    }
    /// Packets wait in its egress queue (new ones must queue behind them).
    fn backlogged(&self) -> bool {
        false
    }
    /// Copies `pkts` into its egress queue at `now` (they found no room, or others wait);
    /// every one is queued or dropped and counted by the port. A port without a queue drops
    /// them (`queue_limit`). Out of line: only when packets wait.
    #[inline(never)]
    fn enqueue(&mut self, pkts: &[Pkt<'_>], now: Instant) {
        // Without an egress, every packet is dropped as over the limit.
        let (c, backlog) = self.egress().map_or_else(
            || {
                let drop_limit = pkts.len() as u64;
                let c = crate::egress::queue::QueueCounts {
                    drop_limit,
                    ..Default::default()
                };
                (c, None)
            },
            |e| (e.enqueue(pkts, now), e.queue_len()),
        );
        crate::egress::drain::count_enqueued(self.tx_stats(), &c, backlog);
    }
    /// Sends what waits in its egress queue, as one batch (as many as the device queue's
    /// limit allows, or one) through its own transmit calls ([`crate::egress::drain`]):
    /// returns the packets sent.
    fn drain(&mut self, now: Instant) -> usize {
        if self.backlogged() {
            crate::egress::drain::drain(&mut Tx(self), MAX_BURST, now)
        } else {
            0
        }
    }

    /// After a round: what its queues want (poll on, may sleep armed, wake by a deadline).
    fn idle(&mut self, now: Instant, settle: &mut Settle);
    /// About to sleep: arms notifications (arm, fence, re-check). `NotEmpty`: work arrived.
    fn arm(&mut self) -> Armed;
    /// Back to polling (`slept`: the shard actually slept, not just armed).
    fn disarm(&mut self, slept: bool);
    /// An fd of the port's fired (a kick, a readable tap): `token` is the one it registered.
    fn event(&mut self, token: u16);
}

/// A port's transmit calls as the egress drain's [`Sender`](crate::egress::drain::Sender).
struct Tx<'a, P: ?Sized>(&'a mut P);

impl<P: Port + ?Sized> crate::egress::drain::Sender for Tx<'_, P> {
    fn id(&self) -> PortId {
        self.0.id()
    }
    fn begin(&mut self, now: Instant, hint: usize) -> bool {
        self.0.tx_begin(now, hint)
    }
    fn send(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        self.0.tx_burst(pkts)
    }
    fn commit(&mut self) {
        self.0.tx_commit();
    }
    fn egress(&mut self) -> Option<&mut Egress> {
        self.0.egress()
    }
    fn stats(&self) -> &PortStats {
        self.0.tx_stats()
    }
}

/// Every port kind, dispatched statically.
#[derive(Debug)]
pub enum AnyPort {
    /// A vhost-user frontend.
    Vhost(vhost::VhostPort),
    /// The host kernel: a tap, or an interface through `AF_PACKET`.
    Kernel(kernel::KernelPort),
    /// An interface through `AF_XDP`.
    AfXdp(afxdp::AfXdpPort),
    /// UDP tunnels to other hosts (VXLAN).
    Vxlan(vxlan::VxlanPort),
    /// Consumes and checks.
    Sink(sink::SinkPort),
    /// Produces.
    Gen(gen::GenPort),
    /// The link to another shard (worker) of the switch.
    Trunk(trunk::TrunkPort),
}

/// Forwards a call to the port of whatever kind.
macro_rules! each {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            AnyPort::Vhost($p) => $e,
            AnyPort::Kernel($p) => $e,
            AnyPort::AfXdp($p) => $e,
            AnyPort::Vxlan($p) => $e,
            AnyPort::Sink($p) => $e,
            AnyPort::Gen($p) => $e,
            AnyPort::Trunk($p) => $e,
        }
    };
}

impl Port for AnyPort {
    #[inline]
    fn id(&self) -> PortId {
        each!(self, p => p.id())
    }
    #[inline]
    fn caps(&self) -> Caps {
        each!(self, p => p.caps())
    }
    #[inline]
    fn mtu(&self) -> Option<u16> {
        each!(self, p => p.mtu())
    }
    #[inline]
    fn tx_stats(&self) -> &PortStats {
        each!(self, p => p.tx_stats())
    }
    // Always: the one call per port per round, inlined into the switch's loop with each
    // kind's burst (a trunk's, the largest and rarest, stays out of line).
    #[inline(always)]
    fn rx_burst(&mut self, max: usize, now: Instant, to: &mut impl Ingress) -> usize {
        each!(self, p => p.rx_burst(max, now, to))
    }
    #[inline]
    fn tx_begin(&mut self, now: Instant, hint: usize) -> bool {
        each!(self, p => p.tx_begin(now, hint))
    }
    #[inline]
    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        each!(self, p => p.tx_burst(pkts))
    }
    #[inline]
    fn tx_commit(&mut self) {
        each!(self, p => p.tx_commit())
    }
    #[inline]
    fn staged(&mut self, n: usize, part: Staged) {
        each!(self, p => p.staged(n, part))
    }
    #[inline]
    fn lend(&mut self, now: Instant, want: usize) -> Option<usize> {
        each!(self, p => p.lend(now, want))
    }
    #[inline]
    fn lent(&self, k: usize) -> &[Seg<'_>] {
        each!(self, p => p.lent(k))
    }
    #[inline]
    fn fill_lent(&mut self, len: u32) -> bool {
        each!(self, p => p.fill_lent(len))
    }
    #[inline]
    fn hairpin(&mut self, max: usize, now: Instant) -> usize {
        each!(self, p => p.hairpin(max, now))
    }
    #[inline]
    fn egress(&mut self) -> Option<&mut Egress> {
        each!(self, p => p.egress())
    }
    #[inline]
    fn backlogged(&self) -> bool {
        each!(self, p => p.backlogged())
    }
    #[inline]
    fn enqueue(&mut self, pkts: &[Pkt<'_>], now: Instant) {
        each!(self, p => p.enqueue(pkts, now))
    }
    #[inline]
    fn drain(&mut self, now: Instant) -> usize {
        each!(self, p => p.drain(now))
    }
    #[inline]
    fn idle(&mut self, now: Instant, settle: &mut Settle) {
        each!(self, p => p.idle(now, settle))
    }
    #[inline]
    fn arm(&mut self) -> Armed {
        each!(self, p => p.arm())
    }
    #[inline]
    fn disarm(&mut self, slept: bool) {
        each!(self, p => p.disarm(slept))
    }
    #[inline]
    fn event(&mut self, token: u16) {
        each!(self, p => p.event(token))
    }
}

impl AnyPort {
    /// Whether it is a trunk to another shard.
    #[inline]
    pub(crate) fn is_trunk(&self) -> bool {
        matches!(self, AnyPort::Trunk(_))
    }

    /// The shard at the other end, if it is a trunk.
    #[inline]
    pub(crate) fn trunk_peer(&self) -> Option<usize> {
        match self {
            AnyPort::Trunk(t) => Some(t.peer()),
            _ => None,
        }
    }

    /// The vhost-user port, if it is one.
    pub(crate) fn as_vhost(&mut self) -> Option<&mut vhost::VhostPort> {
        match self {
            AnyPort::Vhost(v) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
