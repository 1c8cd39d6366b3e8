//! What the shard calls on a vhost-user port outside the per-packet path: rings started and
//! stopped, a new memory table, new egress or polling settings, the kick fds.

use super::{QueuePair, QueueSlot, RxBatch, VhostConfig, VhostPort, MAX_STEER};
use crate::egress::{Egress, EgressConfig};
use crate::pkt::PortId;
use crate::poll::{Policy, Poller};
use crate::stats::{bump, DropReason, PortStats};
use pvnet_net::{hdr_len, QueueIndex, HDR_LEN};
use pvnet_vhost::backend::StartedQueue;
use std::sync::Arc;
use std::time::Instant;
use tracing::info;
use virtq::MemTable;

impl VhostPort {
    /// A port with no queues yet; `stats[k]` counts pair `k`.
    pub fn new(id: PortId, cfg: VhostConfig, stats: Vec<Arc<PortStats>>) -> Self {
        Self {
            id,
            cfg,
            features: 0,
            mtu: None,
            hdr_len: HDR_LEN,
            mergeable: false,
            qps: stats.iter().map(|_| None).collect(),
            stats,
            tx_qp: 0,
            steer: [0; MAX_STEER],
            nsteer: 0,
            tx_now: Instant::now(),
            loan_gen: 0,
            loaned: 0,
        }
    }

    /// How many pairs it has counters for (every pair one of whose queues started).
    pub(crate) fn pairs(&self) -> u16 {
        u16::try_from(self.qps.len()).unwrap_or(u16::MAX)
    }

    /// Takes the counters of pairs it did not have yet (`stats[k]` counts pair `k`; the ones
    /// it has are kept).
    pub(crate) fn add_pairs(&mut self, stats: Vec<Arc<PortStats>>) {
        for s in stats.into_iter().skip(self.stats.len()) {
            self.stats.push(s);
            self.qps.push(None);
        }
    }

    /// Installs a started queue (its pair's counters were added first: `add_pairs`).
    pub fn start(&mut self, q: StartedQueue) {
        self.new_loan_generation();
        let pair = QueueIndex(q.index).pair();
        if pair >= self.qps.len() {
            tracing::warn!(
                port = self.id,
                queue = q.index,
                "queue of a pair without counters: left idle"
            );
            return;
        }
        self.features = q.features;
        self.mtu = q.mtu;
        self.hdr_len = hdr_len(q.features);
        self.mergeable = q.mergeable;
        let (policy, is_rx) = if QueueIndex(q.index).is_rx() {
            (self.cfg.rx_policy, true)
        } else {
            (self.cfg.tx_policy, false)
        };
        let (stats, mergeable, hdr_len, egress, batch) = (
            self.stats[pair].clone(),
            self.mergeable,
            self.hdr_len,
            self.cfg.egress,
            self.cfg.batch,
        );
        let qp = self.qps[pair]
            .get_or_insert_with(|| QueuePair::new(stats, mergeable, hdr_len, egress, batch));
        // A pair's header length and merging follow the features of its latest start.
        qp.out.rxb = RxBatch::new(mergeable, hdr_len);
        if is_rx {
            // A new ring: nothing of it is in flight; the limit learns it afresh.
            qp.out.egress.ring_restarted();
        }
        let mut slot = QueueSlot::new(q, policy, self.cfg.wake);
        // The shard polls a new queue first: tell the driver not to kick until we arm. A
        // ring starts with `used->flags == 0` ("kick me"); left so, a driver without
        // EVENT_IDX (DPDK virtio-user) pays an eventfd write per burst while we poll anyway.
        slot.q.disable_notify();
        if is_rx {
            qp.rx = Some(slot);
        } else {
            qp.tx = Some(slot);
        }
    }

    /// New egress settings (`pvnet ctl port set`): each running pair gets a fresh egress;
    /// what waited in the old queue is dropped, counted as `reconfigured`.
    pub(crate) fn set_egress(&mut self, e: EgressConfig) {
        self.cfg.egress = e;
        let batch = self.cfg.batch;
        for qp in self.qps.iter_mut().flatten() {
            qp.empty_egress(DropReason::Reconfigured);
            qp.out.egress = Egress::with(e, crate::egress::dql_floor(batch));
        }
        info!(port = self.id, egress = ?e, "egress settings changed");
    }

    /// Polls its transmit rings by `p` from now on (running ones start afresh).
    pub(crate) fn set_tx_policy(&mut self, p: Policy) {
        if self.cfg.tx_policy == p {
            return;
        }
        self.cfg.tx_policy = p;
        let wake = self.cfg.wake;
        for s in self
            .qps
            .iter_mut()
            .flatten()
            .filter_map(|qp| qp.tx.as_mut())
        {
            s.poll = Poller::new(p, wake);
        }
        info!(port = self.id, policy = %p, "transmit-ring policy changed");
    }

    /// Takes a queue back; returns its next avail index (what `GET_VRING_BASE` answers) and
    /// its kick fd's number (to leave the epoll set).
    pub(crate) fn stop(&mut self, index: u16) -> Option<(u16, Option<i32>)> {
        self.new_loan_generation();
        let q = QueueIndex(index);
        let qp = self.qps.get_mut(q.pair())?.as_mut()?;
        let slot = if q.is_rx() {
            qp.out.open = false;
            // What waited for this ring has nowhere to go now.
            qp.empty_egress(DropReason::PortDown);
            qp.rx.take()
        } else {
            qp.tx.take()
        }?;
        let (srtt, var, probe) = slot.poll.estimate();
        let (hits, misses) = slot.poll.hits_misses();
        info!(
            port = self.id, queue = index, policy = %slot.poll.policy(), window = ?slot.poll.window(),
            gap = ?srtt, gap_dev = ?var, probe_every = probe, hits, misses, "queue polling summary"
        );
        let fd = slot.kick.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        Some((slot.q.last_avail(), fd))
    }

    /// Switches every running ring to a new memory table. A ring whose own addresses no
    /// longer translate is parked until a grant covers them again (`QueueSlot::set_mem`).
    /// A queue that waited for a grant tries again at once (still under the same wait: a
    /// grant that does not cover the miss is asked again after the retry interval, and the
    /// bound holds).
    pub(crate) fn set_mem(&mut self, mem: &Arc<MemTable>) {
        self.new_loan_generation();
        let (id, now) = (self.id, Instant::now());
        for qp in self.qps.iter_mut().flatten() {
            for s in [&mut qp.rx, &mut qp.tx].into_iter().flatten() {
                s.set_mem(id, &qp.stats, mem, now);
            }
        }
    }

    /// Stops every ring whose memory table holds a mapping that faulted (the peer shrank what
    /// it shared).
    pub(crate) fn check_faults(&mut self) {
        let id = self.id;
        for qp in self.qps.iter_mut().flatten() {
            for s in [&mut qp.rx, &mut qp.tx].into_iter().flatten() {
                if pvnet_vhost::table_faulted(s.q.mem()) {
                    s.fail(id, &qp.stats, virtq::Error::MemoryFault);
                }
            }
        }
    }

    /// Every running ring's vhost-user index and kick fd (to enter or leave a shard's epoll
    /// set when the port moves between shards).
    pub(crate) fn kick_fds(&self) -> Vec<(u16, i32)> {
        self.qps
            .iter()
            .flatten()
            .flat_map(|qp| [qp.rx.as_ref(), qp.tx.as_ref()])
            .flatten()
            .filter_map(|s| {
                let fd = s.kick.as_ref()?;
                Some((s.index, std::os::fd::AsRawFd::as_raw_fd(fd)))
            })
            .collect()
    }

    /// The shard is going to sleep with this port armed (counted on every pair).
    pub(crate) fn count_sleep(&self) {
        for s in &self.stats {
            bump(&s.sleeps, 1);
        }
    }

    /// The size of its transmit ring (0 if none runs): how much a drain may have to take.
    pub(crate) fn tx_ring_size(&self) -> u16 {
        self.qps
            .iter()
            .flatten()
            .filter_map(|qp| qp.tx.as_ref())
            .map(|s| s.q.size())
            .max()
            .unwrap_or(0)
    }
}
