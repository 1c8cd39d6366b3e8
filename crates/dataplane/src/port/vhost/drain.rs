//! The egress drain of a vhost-user port: each pair's egress queue into that pair's receive
//! ring, through the drain every queue-keeping port shares ([`crate::egress::drain`]).

use super::rx::{RxSide, RxState};
use super::{QueuePair, QueueSlot, VhostPort};
use crate::egress::drain::{drain, Sender};
use crate::egress::Egress;
use crate::pkt::{Pkt, PortId, TxOut};
use crate::port::offer_each;
use crate::stats::{DropReason, PortStats};
use std::time::Instant;

impl VhostPort {
    /// [`Port::drain`](crate::port::Port::drain)'s work: each pair's queue into its own ring; what
    /// waits for a ring that no longer runs has nowhere to go (a flow's packets are not
    /// moved to another ring behind later ones of the same flow).
    #[inline(never)]
    pub(super) fn drain_queue(&mut self, now: Instant) -> usize {
        let mut sent = 0;
        for k in 0..self.qps.len() {
            let Some(qp) = self.qps[k].as_mut() else {
                continue;
            };
            if !qp.rx_runs() {
                if qp.out.egress.queue_len().unwrap_or(0) > 0 {
                    qp.empty_egress(DropReason::PortDown);
                }
                continue;
            }
            if qp.out.egress.backlogged() {
                sent += self.drain_pair(k, now);
            }
        }
        sent
    }

    /// Drains pair `k`'s egress queue into its receive ring (which runs).
    pub(super) fn drain_pair(&mut self, k: usize, now: Instant) -> usize {
        let (id, features, hdr_len, batch) = (self.id, self.features, self.hdr_len, self.cfg.batch);
        let Some(QueuePair { rx, stats, out, .. }) = self.qps[k].as_mut() else {
            return 0;
        };
        let mut tx = PairTx {
            id,
            features,
            hdr_len,
            rx: QueueSlot::usable(rx),
            st: out,
            stats,
        };
        drain(&mut tx, batch, now)
    }
}

/// One pair's receive side as the drain's [`Sender`]: a batch of its receive ring's chains
/// (none if the ring is not usable now).
struct PairTx<'a> {
    id: PortId,
    features: u64,
    hdr_len: u32,
    rx: Option<&'a mut QueueSlot>,
    st: &'a mut RxState,
    stats: &'a PortStats,
}

impl Sender for PairTx<'_> {
    fn id(&self) -> PortId {
        self.id
    }

    fn begin(&mut self, now: Instant, hint: usize) -> bool {
        let Some(rx) = self.rx.as_deref_mut() else {
            return false;
        };
        self.st.open(rx, self.id, self.stats, hint, now)
    }

    /// Each packet through the per-packet delivery (headers rewritten, merged buffers, a
    /// second look for buffers).
    fn send(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        let Some(rx) = self.rx.as_deref_mut() else {
            return (0, TxOut::Dropped(DropReason::PortDown));
        };
        let mut side = RxSide {
            id: self.id,
            features: self.features,
            hdr_len: self.hdr_len,
            rx,
            st: self.st,
            stats: self.stats,
        };
        offer_each(pkts, |p| side.take(p))
    }

    fn commit(&mut self) {
        if let Some(rx) = self.rx.as_deref_mut() {
            self.st.commit(rx, self.stats);
        }
    }

    fn egress(&mut self) -> Option<&mut Egress> {
        Some(&mut self.st.egress)
    }

    fn stats(&self) -> &PortStats {
        self.stats
    }
}
