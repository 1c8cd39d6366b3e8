//! A vhost-user port: a frontend's queue pairs, as the device sees them.
//!
//! Per batch: one `available()` load per ring, chains parsed once (every packet's first lines
//! prefetched), used entries written into the ring and published with one store, one call
//! decision per ring. Receiving (the frontend's transmit ring) hands out packets that borrow
//! the frontend's buffers; transmitting (its receive ring) copies straight into its buffers,
//! merging them when `VIRTIO_NET_F_MRG_RXBUF` was negotiated. The header length follows the
//! negotiated features (10 or 12 bytes); a packet whose header differs in length or must lose
//! metadata the frontend did not negotiate gets a header written for it, then its frame.
//!
//! Queue pairs: pair `k` is queues `2k` (receive) and `2k + 1` (transmit). A port holds the
//! pairs its shard owns, each with its own counters (one writer each) and its own egress
//! queue. Every pair the frontend enabled is serviced: its transmit ring is read each round,
//! and what the switch sends to the port is steered to a receive ring by a flow hash
//! (addresses, protocol and ports: one flow stays on one ring, in order), as a multiqueue
//! NIC's RSS would. With one receive ring running nothing is hashed. The driver picks how
//! many pairs it uses (`VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET` on its control queue); over
//! vhost-user the frontend keeps that queue and enables or disables the rings
//! (`SET_VRING_ENABLE`): the steering follows the rings that run.
//!
//! The files, one concern each: `slot.rs` a running ring, its notifiers and its call
//! coalescing; `iotlb_wait.rs` the wait for a missing translation and the park of a ring whose
//! own memory was invalidated; `tx.rs` the frontend's transmit ring into the switch; `rx.rs`
//! delivery into its receive ring; `steer.rs` the choice of a receive ring by flow; `drain.rs`
//! the egress queue into the receive rings; `lend.rs` direct receive (a kernel port reads
//! into the frontend's buffers); `hairpin.rs` the frontend's packets straight back to it;
//! `pair.rs` a queue pair; `control.rs` what the shard calls to start, stop and reconfigure
//! rings; `port.rs` the [`Port`](crate::port::Port) implementation.

mod control;
mod drain;
mod hairpin;
mod iotlb_wait;
mod lend;
mod pair;
mod port;
mod rx;
mod slot;
mod steer;
mod tx;

#[cfg(test)]
mod tests;

#[cfg(test)]
use iotlb_wait::IOTLB_MISS_BOUND;
pub(crate) use pair::QueuePair;
#[cfg(test)]
pub(crate) use rx::header_for;
pub(crate) use rx::RxBatch;
pub(crate) use slot::QueueSlot;

use crate::egress::{Egress, EgressConfig};
use crate::pkt::PortId;
use crate::poll::plan::Settle;
use crate::poll::{Policy, WakeCost};
use crate::stats::PortStats;
use iotlb_wait::IOTLB_MISS_GAP;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most receive rings the flow hash spreads a port's packets over (pairs past it still send
/// and are sent to only if an earlier one stops).
pub const MAX_STEER: usize = 64;

/// The shard-side settings every vhost port of a shard shares.
#[derive(Debug, Clone, Copy)]
pub struct VhostConfig {
    /// Policy of the frontend's transmit rings (the ones it fills).
    pub tx_policy: Policy,
    /// Policy of its receive rings, while we wait for its buffers.
    pub rx_policy: Policy,
    /// Most chains per ring per batch.
    pub batch: usize,
    /// How long transmit-completion calls may be held back.
    pub call_bound: Duration,
    /// What happens to packets this port has no room for (a queue, or a hold in the sender).
    pub egress: EgressConfig,
    /// The measured wake-up cost (bounds adaptive polling).
    pub wake: WakeCost,
}

/// One frontend connection, as far as one shard owns it.
#[derive(Debug)]
pub struct VhostPort {
    pub(super) id: PortId,
    pub(super) cfg: VhostConfig,
    /// Features the frontend acked (from its first started queue).
    pub(super) features: u64,
    /// The frontend's MTU (`NET_SET_MTU`) or the port's configured one, from its queues.
    pub(super) mtu: Option<u16>,
    pub(super) hdr_len: u32,
    pub(super) mergeable: bool,
    /// Counters of each pair this shard services (index = pair).
    pub(super) stats: Vec<Arc<PortStats>>,
    /// The pairs, created when their first queue starts.
    pub(super) qps: Vec<Option<QueuePair>>,
    /// The pair the open transmit batch goes to (set by `tx_begin`, and by the steering for
    /// each run of packets).
    pub(super) tx_qp: usize,
    /// The running receive rings' pairs, in order, when more than one runs (set by
    /// `tx_begin`): flow hash modulo `nsteer` picks one.
    pub(super) steer: [u16; MAX_STEER],
    pub(super) nsteer: usize,
    /// When the open transmit batch began (a steered ring's batch opens when the burst's
    /// packets for it are known).
    pub(super) tx_now: Instant,
    /// Loans: their generation (a loan of another is void) and how many are out.
    pub(super) loan_gen: u32,
    pub(super) loaned: usize,
}

impl VhostPort {
    /// The egress state of the pair the last packets offered went to (the steered one), or
    /// of the first running pair (pair 0 before any runs).
    pub(super) fn egress_of_tx(&mut self) -> &mut Egress {
        let k = if self
            .qps
            .get(self.tx_qp)
            .and_then(Option::as_ref)
            .is_some_and(QueuePair::rx_runs)
        {
            self.tx_qp
        } else {
            self.egress_pair().unwrap_or(0)
        };
        let (stats, m, h, egress, batch) = (
            self.stats[k].clone(),
            self.mergeable,
            self.hdr_len,
            self.cfg.egress,
            self.cfg.batch,
        );
        &mut self.qps[k]
            .get_or_insert_with(|| QueuePair::new(stats, m, h, egress, batch))
            .out
            .egress
    }

    /// The pair packets for this frontend go to: the first with a running receive ring.
    #[inline]
    pub(super) fn egress_pair(&self) -> Option<usize> {
        self.qps
            .iter()
            .position(|qp| qp.as_ref().is_some_and(QueuePair::rx_runs))
    }

    pub(super) fn report_ring(
        id: PortId,
        stats: &PortStats,
        s: &mut QueueSlot,
        wanted: bool,
        now: Instant,
        settle: &mut Settle,
    ) {
        if s.broken {
            return;
        }
        if s.check_lost(id, stats, now) {
            // Parked: polled on (a grant wakes no one), within the miss bound.
            settle.queue(&mut s.poll, true, wanted, now);
            return;
        }
        // A queue waiting for a grant is polled on: the grant wakes no one (the frontend
        // kicked already), and the wait is bounded. It stops waiting once the miss is gone.
        let waiting = s
            .waiting
            .is_some_and(|w| now.saturating_duration_since(w.last) < IOTLB_MISS_GAP);
        if !waiting {
            s.waiting = None;
        }
        let worked = std::mem::take(&mut s.worked) || waiting;
        settle.queue(&mut s.poll, worked, wanted, now);
    }
}
