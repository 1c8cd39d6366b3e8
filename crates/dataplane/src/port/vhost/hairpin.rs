//! Hairpin: what a frontend transmits, straight back into its own receive ring, within one
//! pair (request/response benchmarks).

use super::rx::RxSide;
use super::tx::ingress;
use super::{QueuePair, QueueSlot, VhostPort};
use crate::egress::drain::{backpressure, enqueue};
use crate::egress::{Backpressure, Offer};
use crate::pkt::{Pkt, TxOut};
use crate::port::Ingress;
use crate::stats::{bump, DropReason, PortStats};
use std::time::Instant;

impl VhostPort {
    /// Sends what the frontend transmits straight back to it (request/response benchmarks):
    /// the same one-copy path as any delivery, within one pair. Returns the packets taken.
    pub(super) fn hairpin_pairs(&mut self, max: usize, now: Instant) -> usize {
        let (id, features, hdr_len) = (self.id, self.features, self.hdr_len);
        let mut work = 0;
        for qp in self.qps.iter_mut().flatten() {
            let QueuePair {
                rx,
                tx,
                stats,
                out,
                chains,
                ..
            } = qp;
            let Some(tx) = QueueSlot::usable(tx) else {
                continue;
            };
            let Some(rx) = QueueSlot::usable(rx) else {
                work += ingress(id, hdr_len, tx, chains, stats, max, &mut DropAll);
                continue;
            };
            let mut back = Hairpin {
                side: RxSide {
                    id,
                    features,
                    hdr_len,
                    rx,
                    st: out,
                    stats,
                },
                now,
            };
            work += ingress(id, hdr_len, tx, chains, stats, max, &mut back);
        }
        work
    }
}

/// The hairpin's receiver: the same pair's receive side, its batch opened at the first
/// burst (an idle round touches no receive ring).
pub(super) struct Hairpin<'a> {
    pub(super) side: RxSide<'a>,
    pub(super) now: Instant,
}

impl Ingress for Hairpin<'_> {
    fn burst(&mut self, pkts: &[Pkt<'_>], stats: &PortStats) -> usize {
        let s = &mut self.side;
        if !s.rx.broken {
            s.st.open(s.rx, s.id, s.stats, pkts.len(), self.now);
        }
        let mut k = 0;
        while k < pkts.len() {
            let (n, why) = if s.rx.broken {
                (0, TxOut::Dropped(DropReason::PortDown))
            } else {
                s.take_burst(&pkts[k..])
            };
            k += n;
            if k == pkts.len() {
                break;
            }
            let r = match backpressure(why, Some(&mut s.st.egress), Offer::Unicast, self.now) {
                None => continue,
                Some(Backpressure::Wait) => break,
                Some(Backpressure::Queue) => {
                    // The rest waits in the pair's own queue (drained next round).
                    enqueue(&mut s.st.egress, s.stats, &pkts[k..], self.now);
                    k = pkts.len();
                    break;
                }
                Some(Backpressure::Drop(r)) => r,
            };
            bump(&stats.drops[r as usize], 1);
            k += 1;
        }
        s.st.commit(s.rx, s.stats);
        k
    }

    fn has_receiver(&self) -> bool {
        !self.side.rx.broken
    }
}

/// A receiver that takes nothing: the packets have nowhere to go (`port_down`).
pub(super) struct DropAll;

impl Ingress for DropAll {
    fn burst(&mut self, pkts: &[Pkt<'_>], stats: &PortStats) -> usize {
        bump(
            &stats.drops[DropReason::PortDown as usize],
            pkts.len() as u64,
        );
        pkts.len()
    }
    fn has_receiver(&self) -> bool {
        false
    }
}
