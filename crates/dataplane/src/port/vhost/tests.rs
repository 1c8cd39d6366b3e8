//! The vhost-user port's time-dependent machines with time passed in: the IOTLB miss wait,
//! the park of a ring whose memory was invalidated, and the steering across queue pairs. No
//! test reads the clock but once, for an origin `t0`: every other `Instant` is an offset from
//! it, so each runs the same whatever the machine's load.

use super::iotlb_wait::{Asked, LostRing, IOTLB_MISS_GAP, IOTLB_MISS_RETRY};
use super::{QueueSlot, VhostPort, IOTLB_MISS_BOUND, MAX_STEER};
use crate::egress::{EgressConfig, HoldPolicy};
use crate::poll::{Policy, WakeCost};
use crate::port::{AnyPort, Pkt, Port, TxOut};
use crate::stats::PortStats;
use crate::testing::{MockFe, BUF, MODERN};
use pvnet_net::{VnetHdr, HDR_LEN};
use pvnet_vhost::backend::StartedQueue;
use pvnet_vhost::BackendChannel;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::mock::MockQueue;
use virtq::{Direction, Format};
use virtq::{Perm, Seg};

const MS: Duration = Duration::from_millis(1);

fn get(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// A running transmit ring under an IOMMU (no frontend behind the channel: an ask is counted
/// in `iotlb_misses`, and in the channel's `unsent`).
fn slot_under_iommu(mock: &MockQueue) -> (QueueSlot, Arc<BackendChannel>) {
    let (_driver, device) = mock
        .pair_in(Format::Split, Direction::DeviceReads, false)
        .expect("ring");
    let ch = Arc::new(BackendChannel::default());
    let s = StartedQueue {
        index: 1,
        queue: device,
        kick: None,
        call: None,
        err: None,
        mergeable: true,
        features: MODERN,
        iotlb: Some(ch.clone()),
        mtu: None,
    };
    (QueueSlot::new(s, Policy::Notify, WakeCost::FALLBACK), ch)
}

#[test]
fn a_miss_is_asked_once_then_every_retry_interval() {
    let ch = BackendChannel::default();
    let stats = PortStats::default();
    let t0 = Instant::now();
    let mut a = Asked::now(&ch, &stats, 0x1000, Perm::Read, t0, t0);
    assert_eq!(get(&stats.iotlb_misses), 1, "asked at once");
    // Within the retry interval: kept, not asked again.
    assert!(a.keep(&ch, &stats, t0 + IOTLB_MISS_RETRY));
    assert_eq!(get(&stats.iotlb_misses), 1);
    // Past it: asked again, and the next interval counts from that ask.
    let t1 = t0 + IOTLB_MISS_RETRY + MS;
    assert!(a.keep(&ch, &stats, t1));
    assert_eq!(get(&stats.iotlb_misses), 2);
    assert_eq!((a.since, a.asked), (t0, t1));
    assert!(a.keep(&ch, &stats, t1 + IOTLB_MISS_RETRY));
    assert_eq!(get(&stats.iotlb_misses), 2);
    // Past the bound (from the first ask, not the last): given up, nothing asked.
    assert!(a.keep(&ch, &stats, t0 + IOTLB_MISS_BOUND));
    let asked = get(&stats.iotlb_misses);
    assert!(!a.keep(&ch, &stats, t0 + IOTLB_MISS_BOUND + MS));
    assert_eq!(get(&stats.iotlb_misses), asked);
    assert_eq!(get(&ch.unsent), asked, "each ask went to the channel");
}

#[test]
fn a_queue_waits_for_a_grant_within_the_bound_then_gives_up() {
    let mock = MockQueue::new(64, 2048);
    let (mut s, _ch) = slot_under_iommu(&mock);
    let stats = PortStats::default();
    let (addr, perm) = (0x7000, Perm::Read);
    let t0 = Instant::now();
    // Met every 10 ms (the queue is polled on while it waits): one wait, asked again once
    // per retry interval.
    let mut t = t0;
    while t <= t0 + IOTLB_MISS_BOUND {
        assert!(
            s.wait_for_grant(0, &stats, addr, perm, t).is_ok(),
            "at {:?}",
            t - t0
        );
        t += 10 * MS;
    }
    let asks = get(&stats.iotlb_misses);
    let per_retry = (IOTLB_MISS_BOUND.as_millis() / (IOTLB_MISS_RETRY + 10 * MS).as_millis())
        .try_into()
        .unwrap_or(0u64);
    assert!(asks >= per_retry && asks <= per_retry + 2, "{asks} asks");
    // Past the bound: the miss is an error (the caller stops the queue), the wait is over.
    let r = s.wait_for_grant(0, &stats, addr, perm, t0 + IOTLB_MISS_BOUND + 10 * MS);
    assert!(
        matches!(r, Err(virtq::Error::IotlbMissUnanswered { addr: a, .. }) if a == addr),
        "{r:?}"
    );
    assert!(s.waiting.is_none());
}

#[test]
fn a_miss_after_a_quiet_gap_is_a_new_wait() {
    let mock = MockQueue::new(64, 2048);
    let (mut s, _ch) = slot_under_iommu(&mock);
    let stats = PortStats::default();
    let t0 = Instant::now();
    assert!(s.wait_for_grant(0, &stats, 0x7000, Perm::Read, t0).is_ok());
    // The queue made progress meanwhile (the success path keeps no state): the same address
    // missed again after the gap starts a wait of its own, asked at once, bounded afresh.
    let t2 = t0 + IOTLB_MISS_GAP + MS;
    assert!(s.wait_for_grant(0, &stats, 0x7000, Perm::Read, t2).is_ok());
    assert_eq!(get(&stats.iotlb_misses), 2);
    assert_eq!(s.waiting.map(|w| w.ask.since), Some(t2));
    // Another address is another wait too, even within the gap.
    assert!(s
        .wait_for_grant(0, &stats, 0x9000, Perm::Read, t2 + MS)
        .is_ok());
    assert_eq!(get(&stats.iotlb_misses), 3);
    assert_eq!(s.waiting.map(|w| w.ask.addr), Some(0x9000));
}

#[test]
fn without_an_iommu_a_miss_is_an_error_at_once() {
    let mock = MockQueue::new(64, 2048);
    let (mut s, _ch) = slot_under_iommu(&mock);
    s.iotlb = None;
    let stats = PortStats::default();
    let r = s.wait_for_grant(0, &stats, 0x7000, Perm::Read, Instant::now());
    assert!(matches!(r, Err(virtq::Error::IotlbMissUnanswered { .. })));
    assert_eq!(get(&stats.iotlb_misses), 0);
}

#[test]
fn a_parked_ring_is_asked_for_then_stopped_past_the_bound() {
    let mock = MockQueue::new(64, 2048);
    let (mut s, ch) = slot_under_iommu(&mock);
    let stats = PortStats::default();
    let t0 = Instant::now();
    // Parked as `set_mem` parks it: its ring part asked for, the queue not live.
    s.lost = Some(LostRing {
        ask: Asked::now(&ch, &stats, 0x4000, Perm::Read, t0, t0),
        len: 4096,
    });
    s.live = false;
    assert!(
        s.check_lost(0, &stats, t0 + IOTLB_MISS_RETRY),
        "still parked"
    );
    assert_eq!(get(&stats.iotlb_misses), 1);
    assert!(s.check_lost(0, &stats, t0 + IOTLB_MISS_RETRY + MS));
    assert_eq!(get(&stats.iotlb_misses), 2, "asked again");
    assert!(s.check_lost(0, &stats, t0 + IOTLB_MISS_BOUND));
    assert!(!s.broken);
    // Past the bound without a grant: stopped, counted, no longer parked.
    assert!(!s.check_lost(0, &stats, t0 + IOTLB_MISS_BOUND + MS));
    assert!(s.broken && s.lost.is_none());
    assert_eq!(get(&stats.queue_errors), 1);
    // A ring not parked is not.
    assert!(!s.check_lost(0, &stats, t0 + 2 * IOTLB_MISS_BOUND));
}

fn udp(sport: u16) -> Vec<u8> {
    crate::testing::udp_frame(HDR_LEN as usize, sport, 64)
}

fn pkt<'a>(segs: &'a [Seg<'a>], hash: u32) -> Pkt<'a> {
    Pkt {
        segs,
        len: HDR_LEN + 64,
        hdr_len: HDR_LEN,
        hdr: VnetHdr::default(),
        macs: [0; 12],
        hash,
        vlan: 0,
    }
}

/// A port whose frontend runs `pairs` queue pairs, each with 64 receive buffers posted.
fn steered(pairs: u16) -> (MockFe, AnyPort) {
    MockFe::with_pairs(
        1,
        MODERN,
        64,
        EgressConfig::hold(HoldPolicy::Forever),
        BUF,
        pairs,
    )
}

fn vhost(p: &mut AnyPort) -> &mut VhostPort {
    p.as_vhost().expect("a vhost-user port")
}

#[test]
fn the_ring_is_the_hash_scaled_onto_the_running_rings() {
    let (_fe, mut port) = steered(4);
    let v = vhost(&mut port);
    assert_eq!(v.steer_rings(0), 4);
    let mut buf = [0u8; 76];
    let seg = [Seg::from_mut(&mut buf)];
    // The carried hash's share of 2^32 picks the ring (multiply-shift: no division).
    for (hash, ring) in [
        (1, 0),
        (0x3fff_ffff, 0),
        (0x4000_0000, 1),
        (0x8000_0000, 2),
        (0xbfff_ffff, 2),
        (0xc000_0000, 3),
        (u32::MAX, 3),
    ] {
        assert_eq!(v.slot_of(&pkt(&seg, hash)), ring, "hash {hash:#x}");
    }
    assert!(v.slot_of(&pkt(&seg, u32::MAX)) < MAX_STEER);
}

#[test]
fn a_flow_keeps_its_ring_and_runs_follow_the_rings() {
    let (_fe, mut port) = steered(4);
    let v = vhost(&mut port);
    v.steer_rings(0);
    let mut bufs: Vec<Vec<u8>> = (0..64u16).map(|k| udp(1000 + k % 16)).collect();
    let segs: Vec<[Seg<'_>; 1]> = bufs.iter_mut().map(|b| [Seg::from_mut(b)]).collect();
    let pkts: Vec<Pkt<'_>> = segs.iter().map(|s| pkt(s, 0)).collect();
    // The hash read from the bytes: one flow (source port), one ring, every time.
    let ring_of: Vec<usize> = pkts.iter().map(|p| v.slot_of(p)).collect();
    for (i, p) in pkts.iter().enumerate() {
        assert_eq!(ring_of[i], ring_of[i % 16], "flow {} moved", i % 16);
        assert_eq!(v.slot_of(p), ring_of[i], "the same packet, another ring");
    }
    let used: std::collections::BTreeSet<usize> = ring_of.iter().copied().collect();
    assert!(used.len() > 1, "16 flows on one ring of 4: {ring_of:?}");
    // The runs cover the burst in order, each packet on its flow's ring, and a run ends
    // only where the ring changes.
    let mut runs = [super::steer::Run::EMPTY; crate::pkt::MAX_BURST];
    let n = v.steer_runs(&pkts, &mut runs);
    let mut next = 0;
    for (j, r) in runs[..n].iter().enumerate() {
        assert_eq!(r.range().start, next);
        next = r.range().end;
        for i in r.range() {
            assert_eq!(usize::from(r.ring), ring_of[i]);
        }
        if j > 0 {
            assert_ne!(runs[j - 1].ring, r.ring);
        }
    }
    assert_eq!(next, pkts.len().min(crate::pkt::MAX_BURST));
}

#[test]
fn a_steered_burst_delivers_each_flow_on_one_pair() {
    let (mut fe, mut port) = steered(4);
    let t0 = Instant::now();
    let mut bufs: Vec<Vec<u8>> = (0..28u16).map(|k| udp(2000 + k % 7)).collect();
    let segs: Vec<[Seg<'_>; 1]> = bufs.iter_mut().map(|b| [Seg::from_mut(b)]).collect();
    let pkts: Vec<Pkt<'_>> = segs.iter().map(|s| pkt(s, 0)).collect();
    for round in 0..2u32 {
        let now = t0 + round * MS;
        assert!(port.tx_begin(now, pkts.len()));
        let (n, out) = port.tx_burst(&pkts);
        port.tx_commit();
        assert_eq!((n, out), (pkts.len(), TxOut::Sent));
    }
    // Every flow's 8 packets (4 a round, 2 rounds) arrived on one pair, none elsewhere (7 flows:
    // a flow's packets do not fall on one ring by their place in the burst alone).
    let mut pair_of = std::collections::BTreeMap::new();
    let mut total = 0;
    for k in 0..4 {
        for (_, frame) in fe.received_on(k) {
            let sport = u16::from_be_bytes([frame[34], frame[35]]);
            assert_eq!(*pair_of.entry(sport).or_insert(k), k, "flow {sport} split");
            total += 1;
        }
    }
    assert_eq!(total, 2 * pkts.len());
    assert_eq!(pair_of.len(), 7);
    let pairs: std::collections::BTreeSet<usize> = pair_of.values().copied().collect();
    assert!(
        pairs.len() > 1,
        "7 flows, all on one pair of 4: {pair_of:?}"
    );
    let sent: u64 = fe.pair_stats.iter().map(|s| get(&s.tx_packets)).sum();
    assert_eq!(sent, 2 * pkts.len() as u64);
}
