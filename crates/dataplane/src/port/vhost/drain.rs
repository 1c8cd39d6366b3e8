//! The egress drain: what waits in each pair's egress queue, into that pair's receive ring.

use super::rx::{RxSide, RxState};
use super::{QueuePair, QueueSlot, VhostPort};
use crate::pkt::{Pkt, PortId, TxOut};
use crate::stats::{bump, DropReason, PortStats};
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
        let Some(qp) = self.qps[k].as_mut() else {
            return 0;
        };
        let Some(mut q) = qp.out.egress.take_queue() else {
            return 0;
        };
        let bulk = qp.out.egress.bulk();
        let QueuePair { rx, stats, out, .. } = qp;
        let (mut sent, mut dequeues) = (0, 0u64);
        if let Some(rx) = QueueSlot::usable(rx) {
            // Bulk: everything the limit allows in one batch (one publish, one call). One per
            // dequeue: the same packets, each its own batch (a publish and a call decision
            // each), as a driver without `xmit_more` would.
            let mut left = q.len() as usize;
            while left > 0 {
                let max = if bulk { left } else { 1 };
                let (n, more) = drain_batch(
                    &mut q,
                    rx,
                    out,
                    stats,
                    (id, features, hdr_len),
                    max,
                    batch,
                    now,
                );
                sent += n;
                dequeues += u64::from(n > 0);
                left = left.saturating_sub(max);
                if !more || bulk {
                    break;
                }
            }
        }
        // Dequeued: delivered from the queue (a packet handed out and then refused by the
        // ring, too big for it, is a drop, not a dequeue: the counts stay exact).
        let c = crate::egress::queue::QueueCounts {
            dequeued: sent as u64,
            ..q.take_counts()
        };
        count_queue(stats, &c, dequeues);
        stats
            .backlog
            .store(u64::from(q.len()), std::sync::atomic::Ordering::Relaxed);
        if let Some(l) = out.egress.dql_limit() {
            stats
                .dql_limit
                .store(u64::from(l), std::sync::atomic::Ordering::Relaxed);
        }
        if out.egress.put_queue(q, sent, now) {
            let n = out.egress.purge();
            tracing::warn!(
                port = id,
                dropped = n,
                "egress queue could not drain: emptied"
            );
            bump(&stats.drops[DropReason::NoBuffer as usize], n);
            stats.backlog.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        sent
    }
}

/// One drain batch: up to `max` packets from `q` into the receive ring, published once.
/// Returns the packets sent and whether the ring could take more.
#[allow(clippy::too_many_arguments)]
pub(super) fn drain_batch(
    q: &mut crate::egress::queue::Queue,
    rx: &mut QueueSlot,
    out: &mut RxState,
    stats: &PortStats,
    (id, features, hdr_len): (PortId, u64, u32),
    max: usize,
    batch: usize,
    now: Instant,
) -> (usize, bool) {
    if !out.open(rx, id, stats, max.min(batch), now) {
        return (0, false);
    }
    let t = out.egress.ns(now);
    let mut side = RxSide {
        id,
        features,
        hdr_len,
        rx: &mut *rx,
        st: &mut *out,
        stats,
    };
    let mut dropped = [0u64; DropReason::ALL.len()];
    let (mut sent, mut more) = (0, true);
    while sent < max {
        let Some(h) = q.dequeue(t) else {
            break;
        };
        let (seg, meta) = q.get(h);
        let segs = [seg];
        let pkt = Pkt {
            segs: &segs,
            ..meta
        };
        match side.take(&pkt) {
            TxOut::Sent => {
                q.release(h);
                sent += 1;
            }
            TxOut::NoRoom => {
                q.requeue(h);
                more = false;
                break;
            }
            TxOut::Dropped(r) => {
                q.release(h);
                dropped[r as usize] += 1;
            }
        }
    }
    for r in DropReason::ALL {
        bump(&stats.drops[r as usize], dropped[r as usize]);
    }
    out.commit(rx, stats);
    (sent, more)
}

/// Adds an egress queue's counts to the port's counters (`dequeues`: drains that sent).
pub(super) fn count_queue(stats: &PortStats, c: &crate::egress::queue::QueueCounts, dequeues: u64) {
    bump(&stats.queued, c.queued);
    bump(&stats.dequeued, c.dequeued);
    bump(&stats.dequeues, dequeues);
    bump(&stats.drops[DropReason::QueueLimit as usize], c.drop_limit);
    bump(&stats.drops[DropReason::Aqm as usize], c.drop_aqm);
}
