//! [`Port`] for [`VhostPort`]: what the switch and the shard call on it every round.

use super::steer::Run;
use super::tx::ingress;
use super::{QueuePair, QueueSlot, VhostPort};
use crate::egress::Egress;
use crate::pkt::{Caps, Pkt, PortId, TxOut, MAX_BURST};
use crate::poll::plan::Settle;
use crate::poll::Policy;
use crate::port::{Ingress, Port, RX_OFFLOADS};
use crate::stats::{bump, PortStats};
use pvnet_net::QueueIndex;
use std::time::Instant;
use virtq::Armed;
use virtq::Seg;

impl Port for VhostPort {
    fn id(&self) -> PortId {
        self.id
    }

    fn tx_stats(&self) -> &PortStats {
        self.egress_pair()
            .and_then(|k| self.qps[k].as_ref())
            .map_or(&self.stats[0], |qp| &qp.stats)
    }

    #[inline]
    fn caps(&self) -> Caps {
        let receives = self.qps.iter().flatten().any(QueuePair::rx_runs);
        Caps {
            receives,
            offloads: self.features & RX_OFFLOADS,
            patient: false,
            hairpin: true,
        }
    }
    #[inline]
    fn mtu(&self) -> Option<u16> {
        self.mtu
    }

    /// Lends its receive batch's chains when its header is the kernel's 12 bytes, nothing
    /// waits in its egress queue and one receive ring runs ([`VhostPort::lend_rx`]).
    fn lend(&mut self, now: Instant, want: usize) -> Option<usize> {
        self.lend_rx(now, want)
    }
    fn lent(&self, k: usize) -> &[Seg<'_>] {
        self.lent_chain(k)
    }
    fn fill_lent(&mut self, len: u32) -> bool {
        self.take_in_place(len)
    }

    /// Each pair's transmit ring into its own receive ring ([`VhostPort::hairpin_pairs`]).
    fn hairpin(&mut self, max: usize, now: Instant) -> usize {
        self.hairpin_pairs(max, now)
    }

    /// The egress of the pair the last packets offered went to (the steered one), or of the
    /// first running pair (pair 0 before any runs).
    fn egress(&mut self) -> Option<&mut Egress> {
        Some(self.egress_of_tx())
    }

    #[inline]
    fn rx_burst(&mut self, max: usize, _now: Instant, to: &mut impl Ingress) -> usize {
        let (id, hdr_len) = (self.id, self.hdr_len);
        let mut work = 0;
        for qp in self.qps.iter_mut().flatten() {
            if let Some(tx) = QueueSlot::usable(&mut qp.tx) {
                work += ingress(id, hdr_len, tx, &mut qp.chains, &qp.stats, max, to);
            }
        }
        work
    }

    #[inline]
    fn tx_begin(&mut self, now: Instant, hint: usize) -> bool {
        let id = self.id;
        let Some(k) = self.egress_pair() else {
            return false;
        };
        self.tx_qp = k;
        if self.qps.len() > 1 && self.steer_rings(k) > 1 {
            // Several rings: each opens for the packets the burst has for it.
            self.tx_now = now;
            return true;
        }
        // A running ring whose batch could not open (a grant missing) still counts as
        // begun: its packets then meet "no room" and wait, rather than being dropped.
        self.qps[k]
            .as_mut()
            .is_some_and(|qp| qp.open(id, hint, now) || qp.rx_runs())
    }

    #[inline]
    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        if self.nsteer > 1 {
            return self.tx_steered(pkts);
        }
        self.tx_run(pkts)
    }

    #[inline]
    fn tx_commit(&mut self) {
        for qp in self.qps.iter_mut().flatten() {
            qp.commit();
        }
    }

    /// With several receive rings: whether any has packets waiting (a run then queues
    /// behind them, each packet in its own ring's queue: a flow is never overtaken).
    #[inline]
    fn backlogged(&self) -> bool {
        if self.nsteer > 1 {
            return self
                .qps
                .iter()
                .flatten()
                .any(|qp| qp.out.egress.backlogged());
        }
        self.qps
            .get(self.tx_qp)
            .and_then(Option::as_ref)
            .is_some_and(|qp| qp.out.egress.backlogged())
    }

    #[inline(never)]
    fn enqueue(&mut self, pkts: &[Pkt<'_>], now: Instant) {
        if self.nsteer > 1 {
            // Each packet into its own ring's queue.
            for chunk in pkts.chunks(MAX_BURST) {
                let mut runs = [Run::EMPTY; MAX_BURST];
                let n = self.steer_runs(chunk, &mut runs);
                for r in &runs[..n] {
                    self.tx_qp = usize::from(r.ring);
                    self.enqueue_pair(&chunk[r.range()], now);
                }
            }
            return;
        }
        self.enqueue_pair(pkts, now);
    }

    /// Nearly every round nothing waits: one check here, the drain itself out of line.
    #[inline]
    fn drain(&mut self, now: Instant) -> usize {
        let waits = self.qps.iter().flatten().any(|qp| {
            qp.out.egress.backlogged()
                || (qp.rx.is_none() && qp.out.egress.queue_len().unwrap_or(0) > 0)
        });
        if waits {
            self.drain_queue(now)
        } else {
            0
        }
    }

    fn idle(&mut self, now: Instant, settle: &mut Settle) {
        let (id, bound) = (self.id, self.cfg.call_bound);
        for qp in self.qps.iter_mut().flatten() {
            // Owed transmit-completion calls that are due go out, and so do those of a
            // frontend just called for received packets anyway (one interruption of the
            // driver instead of two: with INTx the guest's handler looks at every queue).
            let rx_called = qp.rx.as_mut().is_some_and(QueueSlot::take_called);
            if let Some(s) = qp.tx.as_mut() {
                if s.calls.flush(now, bound, rx_called) {
                    s.signal_call(&qp.stats);
                }
                if let Some(t) = s.calls.due(bound) {
                    settle.wake_by(t);
                }
                Self::report_ring(id, &qp.stats, s, true, now, settle);
            }
            // A receive ring matters only while packets wait for its buffers: those of the
            // round that just ended (a sender that still waits blocks it again next round).
            qp.rx_wanted = qp.out.egress.blocked();
            qp.out.egress.new_round();
            if let Some(l) = qp.out.egress.dql_limit() {
                qp.stats
                    .dql_limit
                    .store(u64::from(l), std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(s) = qp.rx.as_mut() {
                Self::report_ring(id, &qp.stats, s, qp.rx_wanted, now, settle);
            }
        }
    }

    fn arm(&mut self) -> Armed {
        let id = self.id;
        let mut armed = Armed::Empty;
        for qp in self.qps.iter_mut().flatten() {
            for (s, wanted) in [(qp.tx.as_mut(), true), (qp.rx.as_mut(), qp.rx_wanted)] {
                let Some(s) = s.filter(|s| wanted && s.live) else {
                    continue;
                };
                if matches!(s.poll.policy(), Policy::Timer(_)) || s.poll.coalescing() {
                    continue;
                }
                match s.q.arm_notify() {
                    Ok(Armed::Empty) => {}
                    Ok(Armed::NotEmpty) => armed = Armed::NotEmpty,
                    Err(e) => s.fail(id, &qp.stats, e),
                }
            }
        }
        armed
    }

    fn disarm(&mut self, slept: bool) {
        for qp in self.qps.iter_mut().flatten() {
            for s in [qp.tx.as_mut(), qp.rx.as_mut()].into_iter().flatten() {
                if s.live {
                    s.q.disable_notify();
                }
                if slept {
                    s.poll.woke();
                }
            }
        }
    }

    fn event(&mut self, token: u16) {
        let q = QueueIndex(token);
        let Some(qp) = self.qps.get_mut(q.pair()).and_then(Option::as_mut) else {
            return;
        };
        let slot = if q.is_rx() {
            qp.rx.as_ref()
        } else {
            qp.tx.as_ref()
        };
        if let Some(k) = slot.and_then(|s| s.kick.as_ref()) {
            // One kick per wake-up, whatever the value read: the eventfd's counter is the
            // frontend's to write (one legal write of 2^64 - 2 would make the counter wrap).
            bump(&qp.stats.kicks, u64::from(k.drain() != 0));
        }
    }
}
