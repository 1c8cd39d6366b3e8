//! A running ring and its notifiers: stopping it for a violation, publishing its used
//! entries and the call decision (a transmit-completion call may be held back).

use super::iotlb_wait::{LostRing, Waiting};
use crate::pkt::PortId;
use crate::poll::plan::Calls;
use crate::poll::{Policy, Poller, WakeCost};
use crate::stats::{bump, PortStats};
use pvnet_net::QueueIndex;
use pvnet_vhost::backend::StartedQueue;
use pvnet_vhost::Notifier;
use std::sync::Arc;
use std::time::Instant;
use virtq::DeviceQueue;

/// A running ring and its notifiers.
#[derive(Debug)]
pub(crate) struct QueueSlot {
    /// The ring.
    pub q: DeviceQueue,
    /// Kick fd (None: the frontend polls).
    pub kick: Option<Notifier>,
    pub(super) call: Option<Notifier>,
    pub(super) err: Option<Notifier>,
    /// Stopped for a violation: no longer processed.
    pub broken: bool,
    /// Neither stopped nor parked: the ring may be touched (one flag for the per-packet
    /// checks; `broken` and `lost` say why not).
    pub(super) live: bool,
    /// vhost-user index.
    pub index: u16,
    /// When to poll it and when to arm it.
    pub poll: Poller,
    /// It had work in the current round.
    pub worked: bool,
    /// A transmit-completion call held back (interrupt coalescing).
    pub(super) calls: Calls,
    /// A call went out since the shard last looked (`take_called`).
    pub(super) called: bool,
    /// Under an IOMMU: where to ask for missing translations.
    pub(super) iotlb: Option<Arc<pvnet_vhost::BackendChannel>>,
    /// The translation the queue waits for, since when, and when it last asked.
    pub(super) waiting: Option<Waiting>,
    /// Under an IOMMU: the ring's own memory was invalidated while it ran (a vIOMMU's
    /// domain-wide flush takes every translation, the rings' too). The ring is not touched
    /// until a snapshot translates it again; it is asked for meanwhile, within the miss bound.
    pub(super) lost: Option<LostRing>,
}

impl QueueSlot {
    /// Wraps a started queue, polled by `policy`.
    pub(crate) fn new(s: StartedQueue, policy: Policy, wake: WakeCost) -> Self {
        Self {
            q: s.queue,
            kick: s.kick,
            call: s.call,
            err: s.err,
            broken: false,
            live: true,
            index: s.index,
            poll: Poller::new(policy, wake),
            worked: false,
            calls: Calls::default(),
            called: false,
            iotlb: s.iotlb,
            waiting: None,
            lost: None,
        }
    }

    /// Whether it is the frontend's transmit ring (the device reads it).
    #[inline]
    pub(super) fn is_tx(&self) -> bool {
        QueueIndex(self.index).is_tx()
    }

    /// Stops the queue for a violation: logged, counted, reported on the err fd. The process
    /// and every other queue go on. A retryable error (a translation not there yet) consumed
    /// nothing and stops nothing.
    pub(crate) fn fail(&mut self, port: PortId, stats: &PortStats, e: virtq::Error) {
        let e = match e {
            virtq::Error::TranslationMiss { addr, perm, .. } => {
                match self.wait_for_grant(port, stats, addr, perm, Instant::now()) {
                    Ok(()) => return,
                    Err(e) => e,
                }
            }
            e => e,
        };
        if let (virtq::Error::AccessDenied { addr, perm, .. }, Some(ch)) = (&e, &self.iotlb) {
            ch.access_fail(*addr, *perm);
        }
        if !self.broken {
            pvnet_vhost::peer_error!(stats.log, port, queue = self.index, "queue stopped: {e}");
            self.broken = true;
            self.live = false;
            bump(&stats.queue_errors, 1);
            *stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("queue {}: {e}", self.index));
            if let Some(err) = &self.err {
                let _ = err.signal();
            }
        }
    }

    /// Publishes used entries; calls the frontend if it asked (a transmit-completion call may
    /// be held back, see [`Calls`]). True if the frontend was found asleep on everything
    /// published before (`virtq::DeviceQueue::driver_idle`: it ran dry and waited for this).
    #[inline]
    pub(crate) fn publish(&mut self, stats: &PortStats) -> bool {
        let batches = if self.is_tx() {
            &stats.rx_batches
        } else {
            &stats.tx_batches
        };
        bump(batches, u64::from(self.q.unpublished() > 0));
        let ignored = self.q.take_write_ignored();
        if ignored != 0 {
            write_flags_ignored(self.index, stats, ignored);
        }
        if self.q.logging() && !self.is_tx() {
            // Live migration: the buffers this publish hands back had their pages marked.
            bump(&stats.dirty_logged, u64::from(self.q.unpublished()));
        }
        if self.q.publish() {
            // A driver that asked at its last seen entry with at least half its ring in
            // flight (or without EVENT_IDX, where we cannot tell) may be out of descriptors
            // and waiting: no coalescing for it.
            let waiting = self
                .q
                .driver_backlog()
                .is_none_or(|b| b >= self.q.size() / 2);
            if self.is_tx() && !waiting {
                self.calls.owe();
            } else {
                self.signal_call(stats);
            }
            // A driver found idle is always owed a call: asked only then.
            return self.q.driver_idle();
        }
        false
    }

    pub(super) fn signal_call(&mut self, stats: &PortStats) {
        if let Some(c) = &self.call {
            if c.signal().is_ok() {
                bump(&stats.calls, 1);
                self.called = true;
            }
        }
    }

    /// Whether a call went out since the last look.
    pub(super) fn take_called(&mut self) -> bool {
        std::mem::take(&mut self.called)
    }

    /// The slot if it is running and not stopped for a violation.
    #[inline]
    pub(crate) fn usable(s: &mut Option<QueueSlot>) -> Option<&mut QueueSlot> {
        s.as_mut().filter(|s| s.live)
    }
}

/// Counts a batch's indirect-table entries whose write flag was ignored on the frontend's
/// transmit ring (DPDK's packed multi-segment packets: `virtq`'s chain module says why), and
/// says so at debug level, the first time and then within the port's log limit.
#[cold]
#[inline(never)]
fn write_flags_ignored(queue: u16, stats: &PortStats, n: u64) {
    let first = stats
        .write_flags_ignored
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0;
    bump(&stats.write_flags_ignored, n);
    if first || stats.log.allow().is_some() {
        tracing::debug!(
            queue,
            n,
            "write flag ignored on indirect descriptors of a transmit ring (tolerated: the device only reads it)"
        );
    }
}
