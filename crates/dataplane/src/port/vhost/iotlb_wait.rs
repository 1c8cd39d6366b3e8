//! Under an IOMMU: a queue waiting for a translation the frontend was asked for (an IOTLB
//! miss), asked again every [`IOTLB_MISS_RETRY`] and given up after [`IOTLB_MISS_BOUND`]; and a
//! running ring whose own memory was invalidated, parked until a grant covers it again.

use super::QueueSlot;
use crate::pkt::PortId;
use crate::stats::{bump, PortStats};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::MemTable;

/// A translation asked of the frontend (an IOTLB miss): asked again every
/// [`IOTLB_MISS_RETRY`], given up once [`IOTLB_MISS_BOUND`] has passed since the wait began.
#[derive(Debug, Clone, Copy)]
pub(super) struct Asked {
    pub(super) addr: u64,
    pub(super) perm: virtq::Perm,
    pub(super) since: Instant,
    pub(super) asked: Instant,
}

impl Asked {
    /// Asks for `addr` now, in a wait that began at `since`.
    pub(super) fn now(
        ch: &pvnet_vhost::BackendChannel,
        stats: &PortStats,
        addr: u64,
        perm: virtq::Perm,
        since: Instant,
        now: Instant,
    ) -> Self {
        ch.miss(addr, perm);
        bump(&stats.iotlb_misses, 1);
        Self {
            addr,
            perm,
            since,
            asked: now,
        }
    }

    /// Within the bound: asks again if it is due, and returns true; false once the bound has
    /// passed.
    pub(super) fn keep(
        &mut self,
        ch: &pvnet_vhost::BackendChannel,
        stats: &PortStats,
        now: Instant,
    ) -> bool {
        if now.saturating_duration_since(self.since) > IOTLB_MISS_BOUND {
            return false;
        }
        if now.saturating_duration_since(self.asked) > IOTLB_MISS_RETRY {
            *self = Self::now(ch, stats, self.addr, self.perm, self.since, now);
        }
        true
    }
}

/// A running ring whose own translation was invalidated: what is asked for again.
#[derive(Debug, Clone, Copy)]
pub(super) struct LostRing {
    pub(super) ask: Asked,
    /// The ring part's length (for the error if it is never granted again).
    pub(super) len: u64,
}

/// A queue waiting for a translation (an IOTLB miss).
#[derive(Debug, Clone, Copy)]
pub(super) struct Waiting {
    pub(super) ask: Asked,
    /// The last time the queue met this miss: a miss of the same address after a quiet gap
    /// is a new wait (the queue made progress in between; the success path keeps no state).
    pub(super) last: Instant,
}

/// A miss of the same address this long after the last one starts a new wait.
pub(super) const IOTLB_MISS_GAP: Duration = Duration::from_millis(100);

/// How long a queue waits for the frontend to answer an IOTLB miss before it is stopped
/// (QEMU answers in microseconds; a frontend that never does must not hold the queue).
pub(super) const IOTLB_MISS_BOUND: Duration = Duration::from_secs(1);
/// How often a miss still unanswered is asked again.
pub(super) const IOTLB_MISS_RETRY: Duration = Duration::from_millis(20);

impl QueueSlot {
    /// A translation is missing: ask the frontend (once, then every [`IOTLB_MISS_RETRY`]),
    /// and wait; the queue consumed nothing and is polled again. Past [`IOTLB_MISS_BOUND`]
    /// without an answer, or without an IOMMU to ask, the miss is an error that stops it.
    /// `now` is passed in (the caller reads the clock; tests pass their own times).
    #[cold]
    pub(super) fn wait_for_grant(
        &mut self,
        port: PortId,
        stats: &PortStats,
        addr: u64,
        perm: virtq::Perm,
        now: Instant,
    ) -> Result<(), virtq::Error> {
        let unanswered = virtq::Error::IotlbMissUnanswered {
            addr,
            waited_ms: IOTLB_MISS_BOUND.as_millis().try_into().unwrap_or(u32::MAX),
        };
        let Some(ch) = &self.iotlb else {
            return Err(unanswered);
        };
        let mut ask = match self.waiting {
            Some(w) if w.ask.addr == addr && now.duration_since(w.last) < IOTLB_MISS_GAP => w.ask,
            _ => {
                tracing::debug!(
                    port,
                    queue = self.index,
                    addr = format_args!("{addr:#x}"),
                    "IOTLB miss"
                );
                Asked::now(ch, stats, addr, perm, now, now)
            }
        };
        if !ask.keep(ch, stats, now) {
            self.waiting = None;
            return Err(unanswered);
        }
        self.waiting = Some(Waiting { ask, last: now });
        Ok(())
    }

    /// Switches the ring to `mem`. Under an IOMMU a ring whose own memory `mem` no longer
    /// translates is parked, not stopped: an invalidation drops cached translations, it does
    /// not forbid the device to ask again (QEMU's intel-iommu sends a guest's domain-wide
    /// flush, Linux's lazy mode, as an invalidation of everything). The ring then waits,
    /// untouched, for a grant that covers it again, asked like any miss and within the same
    /// bound ([`Self::check_lost`]).
    pub(super) fn set_mem(
        &mut self,
        port: PortId,
        stats: &PortStats,
        mem: &Arc<MemTable>,
        now: Instant,
    ) {
        if self.broken {
            return;
        }
        // A miss this table answers ends its wait: the same address missed again later (a
        // vIOMMU that flushes everything every few milliseconds, Linux's lazy mode, takes it
        // again) is a new miss with a bound of its own, not the old wait going on.
        if let Some(Waiting { ask, .. }) = self.waiting {
            if virtq::Translate::translate(&**mem, ask.addr, ask.perm, &mut 0).is_ok() {
                self.waiting = None;
                self.worked = true; // polled again before any sleep
            }
        }
        match self.q.set_mem(mem.clone()) {
            Ok(()) => {
                if let Some(l) = self.lost.take() {
                    self.live = true;
                    tracing::debug!(
                        port,
                        queue = self.index,
                        addr = format_args!("{:#x}", l.ask.addr),
                        waited_us = now.saturating_duration_since(l.ask.since).as_micros(),
                        "ring translated again: the queue goes on"
                    );
                    // Work may have arrived meanwhile, and no kick says so.
                    self.worked = true;
                }
            }
            Err(virtq::Error::TranslationMiss { addr, len, perm }) => match &self.iotlb {
                Some(ch) => {
                    // The first untranslated byte: a ring spans pages, and QEMU answers a
                    // miss with one page, so what is asked moves on as grants arrive (the
                    // bound counts from the first).
                    let since = match self.lost {
                        Some(l) if l.ask.addr == addr => return,
                        Some(l) => l.ask.since,
                        None => {
                            // Every few milliseconds under a lazy guest: counted, not logged.
                            tracing::debug!(port, queue = self.index,
                                addr = format_args!("{addr:#x}"), len,
                                "ring memory invalidated while the queue runs: parked, asking for it");
                            bump(&stats.rings_parked, 1);
                            now
                        }
                    };
                    self.lost = Some(LostRing {
                        ask: Asked::now(ch, stats, addr, perm, since, now),
                        len,
                    });
                    self.live = false;
                }
                None => self.fail(port, stats, virtq::Error::RingRevoked { addr, len }),
            },
            Err(e) => self.fail(port, stats, e),
        }
    }

    /// A parked ring (see [`Self::set_mem`]): asks again every [`IOTLB_MISS_RETRY`], and
    /// stops the queue once [`IOTLB_MISS_BOUND`] passes without a grant. Returns whether it
    /// is still parked.
    pub(super) fn check_lost(&mut self, port: PortId, stats: &PortStats, now: Instant) -> bool {
        let (Some(mut l), Some(ch)) = (self.lost, self.iotlb.as_deref()) else {
            return false; // not parked (a ring is parked only under an IOMMU)
        };
        if l.ask.keep(ch, stats, now) {
            self.lost = Some(l);
            return true;
        }
        self.lost = None;
        let (addr, len) = (l.ask.addr, l.len);
        self.fail(port, stats, virtq::Error::RingRevoked { addr, len });
        false
    }
}
