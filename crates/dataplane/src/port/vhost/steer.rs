//! Steering across queue pairs: a packet's receive ring chosen by its flow hash (one flow,
//! one ring, in order), as a multiqueue NIC's RSS would.

use super::{QueuePair, VhostPort, MAX_STEER};
use crate::pkt::{Pkt, TxOut, MAX_BURST};
use std::time::Instant;

impl VhostPort {
    /// Records the running receive rings' pairs for the steering; returns how many run
    /// (the first is `first`).
    pub(super) fn steer_rings(&mut self, first: usize) -> usize {
        let mut n = 0;
        for (k, qp) in self.qps.iter().enumerate().skip(first) {
            if n == MAX_STEER {
                break;
            }
            if qp.as_ref().is_some_and(QueuePair::rx_runs) {
                self.steer[n] = u16::try_from(k).unwrap_or(0);
                n += 1;
            }
        }
        self.nsteer = n;
        n
    }

    /// The index in `steer` of the ring a packet's flow goes to.
    #[inline]
    pub(super) fn slot_of(&self, p: &Pkt<'_>) -> usize {
        let h = if p.hash != 0 {
            u64::from(p.hash)
        } else {
            Self::hash_of(p)
        };
        // Multiply-shift onto 0..nsteer (no division).
        (((h * self.nsteer as u64) >> 32) as usize).min(MAX_STEER - 1)
    }

    /// The high 32 bits of a packet's flow hash, from its bytes (its source did not say).
    #[inline]
    pub(super) fn hash_of(p: &Pkt<'_>) -> u64 {
        crate::pkt::flow_hash_of(p)
    }

    /// The runs of consecutive packets (at most [`MAX_BURST`]) that go to one ring, in order,
    /// found in one pass (one hash each, or the one the packet carries): into `runs`, how many
    /// returned.
    pub(super) fn steer_runs(&self, pkts: &[Pkt<'_>], runs: &mut [Run; MAX_BURST]) -> usize {
        let pkts = pkts.get(..MAX_BURST).unwrap_or(pkts);
        let (mut n, mut ring, mut start) = (0, u16::MAX, 0);
        for (i, p) in pkts.iter().enumerate() {
            let r = self.steer[self.slot_of(p)];
            if r != ring {
                if i > 0 {
                    runs[n] = Run::new(ring, start, i);
                    n += 1;
                }
                (ring, start) = (r, i);
            }
        }
        if !pkts.is_empty() {
            runs[n] = Run::new(ring, start, pkts.len());
            n += 1;
        }
        n
    }

    /// `tx_burst` over several receive rings: every packet's ring first (one hash each, or
    /// the one the packet carries), so that each ring's batch opens for exactly the packets
    /// it gets here (a ring an earlier run of the round opened grows its batch for them,
    /// unpublished: one publish per ring per round); then each run of packets to its ring,
    /// in order.
    #[inline(never)]
    pub(super) fn tx_steered(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        let (id, now) = (self.id, self.tx_now);
        let mut done = 0;
        for chunk in pkts.chunks(MAX_BURST) {
            let mut runs = [Run::EMPTY; MAX_BURST];
            let n = self.steer_runs(chunk, &mut runs);
            let runs = &runs[..n];
            // How many each pair gets, counted by runs (a flow's packets come in runs: a
            // count per packet would chain each increment on the one before).
            let mut count = [0usize; MAX_STEER];
            for r in runs {
                count[usize::from(r.ring)] += r.range().len();
            }
            for (k, &n) in count.iter().enumerate().take(self.qps.len()) {
                if n > 0 {
                    if let Some(qp) = self.qps[k].as_mut() {
                        qp.reserve(id, n, now);
                    }
                }
            }
            for r in runs {
                self.tx_qp = usize::from(r.ring);
                let (n, out) = self.tx_run(&chunk[r.range()]);
                done += n;
                if n < r.range().len() {
                    return (done, out);
                }
            }
        }
        (done, TxOut::Sent)
    }

    /// Queues packets in pair `tx_qp`'s egress.
    pub(super) fn enqueue_pair(&mut self, pkts: &[Pkt<'_>], now: Instant) {
        let Some(qp) = self.qps.get_mut(self.tx_qp).and_then(Option::as_mut) else {
            return;
        };
        crate::egress::drain::enqueue(&mut qp.out.egress, &qp.stats, pkts, now);
    }
}

/// Packets `start..end` of a burst (of at most [`MAX_BURST`]), all for
/// receive ring `ring`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) ring: u16,
    pub(super) start: u16,
    pub(super) end: u16,
}

impl Run {
    pub(super) const EMPTY: Run = Run {
        ring: 0,
        start: 0,
        end: 0,
    };

    pub(super) fn new(ring: u16, start: usize, end: usize) -> Self {
        let at = |i: usize| u16::try_from(i).unwrap_or(u16::MAX);
        Self {
            ring,
            start: at(start),
            end: at(end),
        }
    }

    pub(super) fn range(&self) -> std::ops::Range<usize> {
        usize::from(self.start)..usize::from(self.end)
    }
}
