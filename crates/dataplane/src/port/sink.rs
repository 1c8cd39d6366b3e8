//! A sink: takes every packet, reads every byte of its frame, checks bench sequence numbers
//! (`crate::frame`). The one consumer behind `pvnet switch`'s sink ports and `pvnet backend
//! --role sink`.

use super::{Ingress, RX_OFFLOADS};
use crate::frame::{self, SeqCheck};
use crate::pkt::{Caps, Pkt, PortId, TxOut};
use crate::poll::plan::Settle;
use crate::stats::{bump, PortStats};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use virtq::read_segs;
use virtq::Armed;

/// Whether a sink or generator is a port of its own or stands behind a frontend's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// A port of its own (`pvnet switch`'s sink and gen ports): what it takes is its
    /// `tx_packets`, what it makes its `rx_packets`.
    Own,
    /// Behind a frontend's port (the bench roles of `pvnet backend`), sharing that port's
    /// counters, which already count the packets: only the sequence check is recorded.
    Behind,
}

/// Consumes and checks.
#[derive(Debug)]
pub struct SinkPort {
    id: PortId,
    stats: Arc<PortStats>,
    counting: Counting,
    check: SeqCheck,
    scratch: Vec<u8>,
}

impl SinkPort {
    /// A sink taking frames of up to `max_frame` bytes whole.
    pub fn new(id: PortId, stats: Arc<PortStats>, counting: Counting, max_frame: usize) -> Self {
        Self {
            id,
            stats,
            counting,
            check: SeqCheck::default(),
            scratch: vec![0u8; max_frame],
        }
    }
}

impl super::Port for SinkPort {
    fn id(&self) -> PortId {
        self.id
    }

    fn tx_stats(&self) -> &PortStats {
        &self.stats
    }

    fn caps(&self) -> Caps {
        // It reads bytes and nothing else: any metadata may stay.
        Caps {
            receives: true,
            offloads: RX_OFFLOADS,
            ..Caps::default()
        }
    }

    fn rx_burst(&mut self, _max: usize, _now: Instant, _to: &mut impl Ingress) -> usize {
        0
    }

    fn tx_begin(&mut self, _now: Instant, _hint: usize) -> bool {
        true
    }

    /// Reads every frame whole and feeds its sequence number to the check; takes them all.
    #[inline]
    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        let errors = self.check.seq_errors;
        let mut bytes = 0u64;
        for pkt in pkts {
            let len = (pkt.frame_len() as usize).min(self.scratch.len());
            let n = read_segs(pkt.segs, pkt.hdr_len, &mut self.scratch[..len]);
            if self.check.feed(frame::parse(&self.scratch[..n])) {
                if let Some(e) = self.check.end {
                    self.stats.end_marker.store(e + 1, Ordering::Relaxed);
                }
            }
            bytes += n as u64;
        }
        if self.check.seq_errors != errors {
            self.stats
                .seq_errors
                .store(self.check.seq_errors, Ordering::Relaxed);
        }
        if self.counting == Counting::Own {
            bump(&self.stats.tx_packets, pkts.len() as u64);
            bump(&self.stats.tx_bytes, bytes);
        }
        (pkts.len(), TxOut::Sent)
    }

    fn tx_commit(&mut self) {}

    fn idle(&mut self, _now: Instant, _settle: &mut Settle) {}

    fn arm(&mut self) -> Armed {
        Armed::Empty
    }

    fn disarm(&mut self, _slept: bool) {}

    fn event(&mut self, _token: u16) {}
}
