//! The egress drain, for every port that keeps a queue: what waits goes to the port's
//! transmit side ([`Sender`]: a port's `tx_begin`, `tx_burst`, `tx_commit`, or one queue
//! pair's), as many packets per batch as the limit allows (bulk) or one, and the queue's
//! counts go to the port's counters. Also the one rule for what becomes of a packet a port
//! had no room for ([`backpressure`]), and the copy into a queue ([`enqueue`]).

use super::queue::{Queue, QueueCounts};
use super::{Backpressure, Egress, Offer};
use crate::pkt::{Pkt, PortId, TxOut};
use crate::stats::{bump, DropReason, PortStats};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// A transmit side with an egress queue, as the drain sees it.
pub(crate) trait Sender {
    /// The port's id (for the log).
    fn id(&self) -> PortId;
    /// Opens a transmit batch for about `hint` packets. False if it cannot take packets now.
    fn begin(&mut self, now: Instant, hint: usize) -> bool;
    /// Offers packets to the open batch, in order: how many it took, and what became of
    /// the next one if not all.
    fn send(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut);
    /// Commits the batch.
    fn commit(&mut self);
    /// Its egress (the queue drained), if it keeps one.
    fn egress(&mut self) -> Option<&mut Egress>;
    /// The counters the queue's counts go to.
    fn stats(&self) -> &PortStats;
}

/// What becomes of a packet offered as `offer` that a port did not take (`out`, what it
/// said; `None` if it was taken), under the port's `egress` (a port without one has no room
/// and no queue: `no_buffer`). The one mapping from "no room" to waiting, queueing or
/// dropping, for the switch and for a port that sends to itself (hairpin).
#[inline]
pub(crate) fn backpressure(
    out: TxOut,
    egress: Option<&mut Egress>,
    offer: Offer,
    now: Instant,
) -> Option<Backpressure> {
    match out {
        TxOut::Sent => None,
        TxOut::Dropped(r) => Some(Backpressure::Drop(r)),
        TxOut::NoRoom => Some(
            egress.map_or(Backpressure::Drop(DropReason::NoBuffer), |e| {
                e.no_room(offer, now)
            }),
        ),
    }
}

/// Copies `pkts` into `egress`'s queue at `now` (each queued or dropped), counted on `stats`
/// with the backlog gauge.
#[inline(never)]
pub(crate) fn enqueue(egress: &mut Egress, stats: &PortStats, pkts: &[Pkt<'_>], now: Instant) {
    let c = egress.enqueue(pkts, now);
    count_enqueued(stats, &c, egress.queue_len());
}

/// Counts what an enqueue did (`c`) on `stats`, and the queue's length after it (`backlog`).
pub(crate) fn count_enqueued(stats: &PortStats, c: &QueueCounts, backlog: Option<u32>) {
    count_queue(stats, c, 0);
    if let Some(q) = backlog {
        stats.backlog.store(u64::from(q), Relaxed);
    }
}

/// Drains `tx`'s egress queue: everything the limit allows in one batch of at most about
/// `batch` packets (one commit: one publish and one call, or one burst of writes), or, with
/// bulk dequeue off, one packet per batch, as a driver without `xmit_more` would. Returns the
/// packets sent. A queue that sends nothing for [`STALL`](super::STALL) while packets wait is
/// emptied (`no_buffer`). Out of line: it runs only while packets wait.
#[inline(never)]
pub(crate) fn drain(tx: &mut impl Sender, batch: usize, now: Instant) -> usize {
    let Some(e) = tx.egress() else {
        return 0;
    };
    let Some(mut q) = e.take_queue() else {
        return 0;
    };
    let bulk = e.bulk();
    let (mut sent, mut dequeues) = (0, 0u64);
    let mut left = q.len() as usize;
    while left > 0 {
        let max = if bulk { left } else { 1 };
        let (n, more) = drain_batch(&mut q, tx, max, batch, now);
        sent += n;
        dequeues += u64::from(n > 0);
        left = left.saturating_sub(max);
        if !more || bulk {
            break;
        }
    }
    // Dequeued: delivered from the queue (a packet handed out and then refused by the port,
    // too big for it, is a drop, not a dequeue: the counts stay exact).
    let c = QueueCounts {
        dequeued: sent as u64,
        ..q.take_counts()
    };
    let backlog = u64::from(q.len());
    let (id, limit) = (tx.id(), tx.egress().and_then(|e| e.dql_limit()));
    let (trials, kept) = tx.egress().map_or((0, 0), Egress::take_trials);
    let stats = tx.stats();
    count_queue(stats, &c, dequeues);
    stats.backlog.store(backlog, Relaxed);
    if let Some(l) = limit {
        stats.dql_limit.store(u64::from(l), Relaxed);
    }
    if trials > 0 {
        bump(&stats.dql_trials, trials);
        bump(&stats.dql_kept, kept);
    }
    let Some(e) = tx.egress() else {
        return sent;
    };
    if e.put_queue(q, sent, now) {
        let n = e.purge();
        tracing::warn!(
            port = id,
            dropped = n,
            "egress queue could not drain: emptied"
        );
        let stats = tx.stats();
        bump(&stats.drops[DropReason::NoBuffer as usize], n);
        stats.backlog.store(0, Relaxed);
    }
    sent
}

/// One drain batch: up to `max` packets from `q` into `tx`, committed once. Returns the
/// packets sent and whether the port could take more.
fn drain_batch(
    q: &mut Queue,
    tx: &mut impl Sender,
    max: usize,
    batch: usize,
    now: Instant,
) -> (usize, bool) {
    if !tx.begin(now, max.min(batch)) {
        return (0, false);
    }
    let t = tx.egress().map_or(0, |e| e.ns(now));
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
        match tx.send(std::slice::from_ref(&pkt)) {
            (1, _) => {
                q.release(h);
                sent += 1;
            }
            (_, TxOut::Dropped(r)) => {
                q.release(h);
                dropped[r as usize] += 1;
            }
            _ => {
                q.requeue(h);
                more = false;
                break;
            }
        }
    }
    let stats = tx.stats();
    for r in DropReason::ALL {
        bump(&stats.drops[r as usize], dropped[r as usize]);
    }
    tx.commit();
    (sent, more)
}

/// Adds an egress queue's counts to the port's counters (`dequeues`: drains that sent).
pub(crate) fn count_queue(stats: &PortStats, c: &QueueCounts, dequeues: u64) {
    bump(&stats.queued, c.queued);
    bump(&stats.dequeued, c.dequeued);
    bump(&stats.dequeues, dequeues);
    bump(&stats.drops[DropReason::QueueLimit as usize], c.drop_limit);
    bump(&stats.drops[DropReason::Aqm as usize], c.drop_aqm);
    bump(&stats.ecn_marked, c.ecn_mark);
}
