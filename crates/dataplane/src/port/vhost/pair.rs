//! One queue pair: the frontend's transmit ring, its receive ring, and what the receive side
//! keeps between batches.

use super::rx::{RxBatch, RxState};
use super::QueueSlot;
use crate::egress::{Egress, EgressConfig};
use crate::pkt::PortId;
use crate::stats::{bump, DropReason, PortStats};
use std::sync::Arc;
use std::time::Instant;
use virtq::Chain;

/// One queue pair of a port: the frontend's transmit ring (our ingress), its receive ring
/// (our egress) and what each side keeps between batches.
#[derive(Debug)]
pub(crate) struct QueuePair {
    /// Receive queue (device writes), index `2k`.
    pub rx: Option<QueueSlot>,
    /// Transmit queue (device reads), index `2k + 1`.
    pub tx: Option<QueueSlot>,
    /// This pair's counters (its only writer is the shard that owns it).
    pub stats: Arc<PortStats>,
    /// What the receive side keeps between packets of a batch and between rounds.
    pub(super) out: RxState,
    /// Transmit chains of the current batch.
    pub(super) chains: Vec<Chain>,
    /// The shard waits on the receive ring (packets waited for its buffers last round).
    pub(super) rx_wanted: bool,
    /// Loans completed since the last commit: packets, frame bytes (published and counted
    /// at the commit).
    pub(super) repaid: [u64; 2],
}

impl QueuePair {
    /// Whether its receive ring runs (started, not stopped for a violation).
    #[inline]
    pub(super) fn rx_runs(&self) -> bool {
        self.rx.as_ref().is_some_and(|s| !s.broken)
    }

    /// Drops everything waiting in the egress queue, counted under `why`; nothing waits after.
    pub(super) fn empty_egress(&mut self, why: DropReason) {
        self.out.egress.empty(&self.stats, why);
    }

    pub(super) fn new(
        stats: Arc<PortStats>,
        mergeable: bool,
        hdr_len: u32,
        egress: EgressConfig,
        batch: usize,
    ) -> Self {
        Self {
            rx: None,
            tx: None,
            stats,
            out: RxState {
                rxb: RxBatch::new(mergeable, hdr_len),
                open: false,
                retry: false,
                egress: Egress::with(egress, crate::egress::dql_floor(batch)),
                sent: [0; 2],
                now: Instant::now(),
            },
            chains: Vec::with_capacity(256),
            rx_wanted: false,
            repaid: [0; 2],
        }
    }

    /// Opens the receive batch (once per source batch) with `want` chains: what the sender's
    /// burst holds. A packet that needs more (merged buffers) makes the batch look once more
    /// for up to [`MAX_MERGE`](crate::pkt::MAX_MERGE). False if the ring is not running or just failed.
    pub(super) fn open(&mut self, id: PortId, want: usize, now: Instant) -> bool {
        let Some(rx) = QueueSlot::usable(&mut self.rx) else {
            return false;
        };
        self.out.open(rx, id, &self.stats, want, now)
    }

    /// [`RxState::reserve`] on this pair's receive ring.
    pub(super) fn reserve(&mut self, id: PortId, want: usize, now: Instant) -> bool {
        let Some(rx) = QueueSlot::usable(&mut self.rx) else {
            return false;
        };
        self.out.reserve(rx, id, &self.stats, want, now)
    }

    /// Publishes the open receive batch and the loans completed, and counts what they
    /// delivered.
    pub(super) fn commit(&mut self) {
        if let Some(rx) = self.rx.as_mut() {
            self.out.commit(rx, &self.stats);
            if self.repaid[0] > 0 {
                let [n, bytes] = std::mem::take(&mut self.repaid);
                rx.worked = true;
                rx.publish(&self.stats);
                bump(&self.stats.tx_packets, n);
                bump(&self.stats.tx_bytes, bytes);
            }
        }
    }
}
