//! The switch over mock frontends: learning, flooding, offload fitting, header lengths,
//! backpressure, fixed wires and hairpin, each checked by what the frontends receive and by
//! the counters.

use super::*;
use crate::egress::{HoldPolicy, HOLD};
use crate::testing::{frame, get, mac, MockFe, MODERN};
use pvnet_net::features::{VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6};
use std::time::Duration;
use std::time::Instant;

#[test]
fn offload_fit() {
    let mut h = VnetHdr::default();
    assert_eq!(fit(&h, 0), Fit::Pass);
    h.flags = VnetHdr::F_NEEDS_CSUM;
    assert_eq!(fit(&h, 0), Fit::Csum);
    assert_eq!(fit(&h, VIRTIO_NET_F_GUEST_CSUM), Fit::Pass);
    h.gso_type = VnetHdr::GSO_TCPV4;
    assert_eq!(fit(&h, VIRTIO_NET_F_GUEST_CSUM), Fit::Gso);
    assert_eq!(
        fit(&h, VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO4),
        Fit::Pass
    );
    h.gso_type = VnetHdr::GSO_TCPV6 | VnetHdr::GSO_ECN;
    assert_eq!(
        fit(&h, VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO6),
        Fit::Gso
    );
    h.gso_type = VnetHdr::GSO_UDP_L4;
    assert_eq!(fit(&h, u64::MAX), Fit::Gso);
    let b = crate::port::vhost::header_for(
        &VnetHdr {
            flags: 2,
            ..VnetHdr::default()
        },
        0,
    );
    assert_eq!(b[0], 0);
}

fn csum(data: &[u8], init: u32) -> u16 {
    let mut sum = init;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from(c[0]) << 8
        };
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap_or(0xffff)
}

/// An Ethernet + IPv4 + TCP frame with `payload` bytes; TCP checksum left as the
/// pseudo-header sum (what a driver hands over with NEEDS_CSUM).
fn tcp4(dst: [u8; 6], src: [u8; 6], payload: usize) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 20 + payload];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = u16::try_from(20 + 20 + payload).unwrap();
    f[14] = 0x45;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[18..20].copy_from_slice(&7u16.to_be_bytes());
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    let c = csum(&f[14..34], 0);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f[34..36].copy_from_slice(&5001u16.to_be_bytes());
    f[36..38].copy_from_slice(&40000u16.to_be_bytes());
    f[38..42].copy_from_slice(&1000u32.to_be_bytes());
    f[46] = 5 << 4;
    f[47] = 0x18; // PSH|ACK
    for (i, b) in f[54..].iter_mut().enumerate() {
        *b = u8::try_from(i * 7 % 251).unwrap_or(0);
    }
    let pseudo = pseudo_sum(&f, u32::from(ip_len) - 20);
    f[50..52].copy_from_slice(&(!csum(&[], pseudo)).to_be_bytes());
    f
}

fn pseudo_sum(f: &[u8], l4_len: u32) -> u32 {
    let w = |i: usize| u32::from(u16::from_be_bytes([f[i], f[i + 1]]));
    w(26) + w(28) + w(30) + w(32) + 6 + l4_len
}

/// The TCP checksum of a full frame verifies (sums to zero with the pseudo-header).
fn tcp_ok(f: &[u8]) -> bool {
    let l4 = u32::from(u16::from_be_bytes([f[16], f[17]])) - 20;
    csum(&f[34..34 + l4 as usize], pseudo_sum(f, l4)) == 0 && csum(&f[14..34], 0) == 0
}

fn gso_hdr(payload_mss: u16) -> VnetHdr {
    VnetHdr {
        flags: VnetHdr::F_NEEDS_CSUM,
        gso_type: VnetHdr::GSO_TCPV4,
        hdr_len: 54,
        gso_size: payload_mss,
        csum_start: 34,
        csum_offset: 16,
        num_buffers: 0,
    }
}

fn run(f: &mut Fabric, ports: &mut [AnyPort], now: Instant) {
    for _ in 0..4 {
        f.round(ports, now);
    }
}

fn switch() -> Fabric {
    Fabric::new(Router::learning(SwitchConfig::default()), 64)
}

fn fe(id: PortId, features: u64) -> (MockFe, AnyPort) {
    MockFe::new(id, features, 256, HoldPolicy::Bounded(HOLD))
}

/// A shard's end of a trunk to shard `peer` (id `id`), counting on `stats`.
fn trunk_end(
    id: PortId,
    peer: usize,
    ring: (crate::port::trunk::Producer, crate::port::trunk::Consumer),
    stats: &std::sync::Arc<PortStats>,
) -> AnyPort {
    AnyPort::Trunk(crate::port::trunk::TrunkPort::new(
        (id, peer),
        stats.clone(),
        ring,
        pvnet_vhost::Notifier::new().expect("eventfd"),
        std::sync::Arc::default(),
        crate::poll::WakeCost::FALLBACK,
    ))
}

#[test]
fn floods_unknown_then_forwards_learned_unicast() {
    let mut f = switch();
    let ((mut a, pa), (mut b, pb), (mut c, pc)) = (fe(0, MODERN), fe(1, MODERN), fe(2, MODERN));
    let mut ports = vec![pa, pb, pc];
    let now = Instant::now();
    // a -> b's address, unknown: flooded to b and c
    a.send(&VnetHdr::default(), &tcp4(mac(2), mac(1), 10));
    run(&mut f, &mut ports, now);
    assert_eq!(b.received().len(), 1);
    assert_eq!(c.received().len(), 1);
    assert_eq!(get(&a.stats.flooded), 1);
    // b answers a (learned on port 0): only a gets it
    b.send(&VnetHdr::default(), &tcp4(mac(1), mac(2), 10));
    run(&mut f, &mut ports, now);
    assert_eq!(a.received().len(), 1);
    assert!(c.received().is_empty());
    // now a -> b is known too
    a.send(&VnetHdr::default(), &tcp4(mac(2), mac(1), 10));
    run(&mut f, &mut ports, now);
    assert_eq!(b.received().len(), 1);
    assert!(c.received().is_empty());
    // to a station on its own port: filtered, counted
    a.send(&VnetHdr::default(), &tcp4(mac(1), mac(3), 10));
    run(&mut f, &mut ports, now);
    assert!(b.received().is_empty() && c.received().is_empty());
    assert_eq!(get(&a.stats.drops[DropReason::Filtered as usize]), 1);
    let macs: Vec<_> = f.macs(now).iter().map(|e| (e.mac, e.port)).collect();
    assert_eq!(macs, vec![(mac(1), 0), (mac(3), 0), (mac(2), 1)]);
    // Every packet taken is accounted for: 3 from a, 1 from b.
    assert_eq!((get(&a.stats.rx_packets), get(&b.stats.rx_packets)), (3, 1));
    assert_eq!(a.completed(), 3);
}

#[test]
fn gso_packet_is_segmented_for_a_receiver_without_tso() {
    let mut f = switch();
    let ((mut a, pa), (mut b, pb)) = (fe(0, MODERN), fe(1, MODERN));
    let mut ports = vec![pa, pb];
    let frame = tcp4(mac(2), mac(1), 10_000);
    a.send(&gso_hdr(1448), &frame);
    run(&mut f, &mut ports, Instant::now());
    let got = b.received();
    assert_eq!(got.len(), 7, "10000 bytes at MSS 1448");
    let mut payload = Vec::new();
    for (h, seg) in &got {
        assert_eq!(
            (h.flags, h.gso_type),
            (0, 0),
            "plain packets for a plain receiver"
        );
        assert!(tcp_ok(seg), "segment checksums verify");
        payload.extend_from_slice(&seg[54..]);
    }
    assert_eq!(payload, frame[54..]);
    assert_eq!((get(&b.stats.sw_gso), get(&b.stats.tx_packets)), (1, 7));
    assert_eq!(get(&a.stats.rx_packets), 1);
}

/// A receiver with an MTU takes frames up to it plus the Ethernet and VLAN headers; a longer
/// one is dropped at the sender, counted `too_big`, and the rest of its run goes on; a GSO
/// packet passes (its segments fit); flooded copies are checked per receiver.
#[test]
fn a_frame_above_the_receivers_mtu_is_dropped_and_counted() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::with_mtu(
        1,
        MODERN | VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO4,
        256,
        EgressConfig::hold(HoldPolicy::Bounded(HOLD)),
        2048,
        1,
        Some(1500),
    );
    let (mut c, pc) = fe(2, MODERN);
    let mut ports = vec![pa, pb, pc];
    let now = Instant::now();
    // Learn b's and c's addresses.
    b.send(&VnetHdr::default(), &tcp4(mac(1), mac(2), 10));
    c.send(&VnetHdr::default(), &tcp4(mac(1), mac(3), 10));
    run(&mut f, &mut ports, now);
    a.received();
    b.received();
    c.received();
    // One run to b: fits (1518 bytes: MTU + 18), too big (1519), fits.
    let fits = tcp4(mac(2), mac(1), 1518 - 54);
    let big = tcp4(mac(2), mac(1), 1519 - 54);
    for fr in [&fits, &big, &fits] {
        a.send(&VnetHdr::default(), fr);
    }
    a.send(&gso_hdr(1448), &tcp4(mac(2), mac(1), 10_000));
    run(&mut f, &mut ports, now);
    let got: Vec<usize> = b.received().iter().map(|(_, g)| g.len()).collect();
    assert_eq!(got, [1518, 1518, 10_054]);
    assert_eq!(get(&a.stats.drops[DropReason::TooBig as usize]), 1);
    // Flooded (unknown destination): c takes it, b's copy is too big.
    a.send(&VnetHdr::default(), &tcp4(mac(9), mac(1), 4000));
    run(&mut f, &mut ports, now);
    assert_eq!(c.received().len(), 1);
    assert!(b.received().is_empty());
    assert_eq!(get(&a.stats.drops[DropReason::TooBig as usize]), 2);
    assert_eq!(get(&a.stats.rx_packets), 5);
}

#[test]
fn gso_packet_passes_whole_to_a_receiver_with_tso() {
    let mut f = switch();
    let ((mut a, pa), (mut b, pb)) = (
        fe(0, MODERN),
        fe(
            1,
            MODERN | VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO4,
        ),
    );
    let mut ports = vec![pa, pb];
    let frame = tcp4(mac(2), mac(1), 10_000);
    a.send(&gso_hdr(1448), &frame);
    run(&mut f, &mut ports, Instant::now());
    let got = b.received();
    assert_eq!(got.len(), 1);
    let (h, g) = &got[0];
    assert_eq!(
        (h.gso_type, h.gso_size, h.flags),
        (VnetHdr::GSO_TCPV4, 1448, VnetHdr::F_NEEDS_CSUM)
    );
    assert_eq!(h.num_buffers, 5, "10066 bytes over 2048-byte buffers");
    assert_eq!(g, &frame);
    assert_eq!(get(&b.stats.sw_gso), 0);
}

#[test]
fn partial_checksum_is_completed_for_a_receiver_without_guest_csum() {
    let mut f = switch();
    let ((mut a, pa), (mut b, pb)) = (fe(0, MODERN), fe(1, MODERN));
    let mut ports = vec![pa, pb];
    let frame = tcp4(mac(2), mac(1), 300);
    let mut h = gso_hdr(0);
    h.gso_type = VnetHdr::GSO_NONE;
    a.send(&h, &frame);
    run(&mut f, &mut ports, Instant::now());
    let got = b.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.flags, 0);
    assert!(tcp_ok(&got[0].1));
    assert_eq!(get(&b.stats.sw_csum), 1);
}

#[test]
fn headers_change_length_between_legacy_and_modern_drivers() {
    // A legacy driver (neither VERSION_1 nor MRG_RXBUF) uses a 10-byte header; a modern one
    // 12 bytes with num_buffers. Frames cross unchanged; headers are rewritten.
    let mut f = switch();
    let ((mut old, po), (mut new, pn)) = (fe(0, 0), fe(1, MODERN | VIRTIO_NET_F_GUEST_CSUM));
    assert_eq!((old.hdr_len, new.hdr_len), (10, 12));
    let mut ports = vec![po, pn];
    let now = Instant::now();
    let to_new = frame(mac(2), mac(1), 7, 100);
    old.send(&VnetHdr::default(), &to_new);
    run(&mut f, &mut ports, now);
    let got = new.received();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].0.num_buffers, 1,
        "the modern receiver's header says one buffer"
    );
    assert_eq!(got[0].1, to_new, "the frame right behind a 12-byte header");
    // Back: a partial checksum from the modern side, completed for the legacy receiver, which
    // gets 10 bytes of header and the frame.
    let tcp = tcp4(mac(1), mac(2), 200);
    let mut h = gso_hdr(0);
    h.gso_type = VnetHdr::GSO_NONE;
    new.send(&h, &tcp);
    let plain = frame(mac(1), mac(2), 9, 80);
    new.send(&VnetHdr::default(), &plain);
    run(&mut f, &mut ports, now);
    let got = old.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0.flags, 0);
    assert!(tcp_ok(&got[0].1));
    assert_eq!(got[1].1, plain);
    assert_eq!(get(&old.stats.tx_bytes), (tcp.len() + plain.len()) as u64);
}

#[test]
fn a_full_receiver_holds_unicast_for_the_bound_then_drops() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::new(1, MODERN, 0, HoldPolicy::Bounded(HOLD));
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    // b speaks first (learned), then has no buffers for a's two packets.
    b.send(&VnetHdr::default(), &frame(mac(1), mac(2), 0, 60));
    run(&mut f, &mut ports, t0);
    a.send(&VnetHdr::default(), &frame(mac(2), mac(1), 1, 60));
    a.send(&VnetHdr::default(), &frame(mac(2), mac(1), 2, 60));
    run(&mut f, &mut ports, t0);
    assert_eq!(get(&a.stats.rx_packets), 0, "they wait in a's ring");
    assert_eq!(a.completed(), 0);
    // Buffers arrive within the bound: delivered, in order.
    b.post(1);
    run(&mut f, &mut ports, t0 + HOLD / 2);
    let got = b.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1[14], 1);
    // No more buffers: the second waits out the bound, then is dropped and counted.
    run(&mut f, &mut ports, t0 + HOLD / 2 + HOLD / 4);
    assert_eq!(get(&a.stats.rx_packets), 1);
    run(&mut f, &mut ports, t0 + HOLD * 2);
    assert_eq!(get(&a.stats.rx_packets), 2);
    assert_eq!(get(&a.stats.drops[DropReason::NoBuffer as usize]), 1);
    assert_eq!(a.completed(), 2, "every buffer returned");
}

#[test]
fn a_fixed_wire_waits_as_long_as_it_takes() {
    let mut f = Fabric::new(Router::Fixed(vec![(0, Wire::To(1))]), 64);
    let (mut a, pa) = MockFe::new(0, MODERN, 256, HoldPolicy::Forever);
    let (mut b, pb) = MockFe::new(1, MODERN, 0, HoldPolicy::Forever);
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    for n in 0..3 {
        a.send(&VnetHdr::default(), &frame(mac(2), mac(1), n, 60));
    }
    run(&mut f, &mut ports, t0);
    run(&mut f, &mut ports, t0 + Duration::from_secs(60));
    assert_eq!(get(&a.stats.rx_packets), 0, "nothing lost, nothing taken");
    b.post(8);
    run(&mut f, &mut ports, t0 + Duration::from_secs(61));
    let got: Vec<u8> = b.received().iter().map(|(_, f)| f[14]).collect();
    assert_eq!(got, [0, 1, 2]);
    assert_eq!(get(&a.stats.rx_packets), 3);
    assert_eq!(get(&b.stats.tx_packets), 3);
    // b has no wire: what it sends is dropped as port_down, counted.
    b.send(&VnetHdr::default(), &frame(mac(1), mac(2), 9, 60));
    run(&mut f, &mut ports, t0);
    assert_eq!(get(&b.stats.drops[DropReason::PortDown as usize]), 1);
}

#[test]
fn hairpin_sends_a_frontends_packets_back_to_it() {
    let mut f = Fabric::new(Router::Fixed(vec![(0, Wire::Hairpin)]), 64);
    let (mut a, pa) = MockFe::new(0, MODERN, 256, HoldPolicy::Forever);
    let mut ports = vec![pa];
    let sent = frame(mac(2), mac(1), 5, 300);
    a.send(&VnetHdr::default(), &sent);
    run(&mut f, &mut ports, Instant::now());
    let got = a.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, sent);
    assert_eq!((get(&a.stats.rx_packets), get(&a.stats.tx_packets)), (1, 1));
}

#[test]
fn a_short_packet_is_dropped_in_its_place_and_the_rest_go_on() {
    let mut f = Fabric::new(Router::Fixed(vec![(0, Wire::To(1))]), 64);
    let (mut a, pa) = MockFe::new(0, MODERN, 256, HoldPolicy::Forever);
    let (mut b, pb) = MockFe::new(1, MODERN, 256, HoldPolicy::Forever);
    let mut ports = vec![pa, pb];
    a.send(&VnetHdr::default(), &frame(mac(2), mac(1), 1, 60));
    a.send(&VnetHdr::default(), &[0u8; 0]); // header only: no addresses
    a.send(&VnetHdr::default(), &frame(mac(2), mac(1), 3, 60));
    run(&mut f, &mut ports, Instant::now());
    let got: Vec<u8> = b.received().iter().map(|(_, f)| f[14]).collect();
    assert_eq!(got, [1, 3]);
    assert_eq!(get(&a.stats.rx_packets), 3);
    assert_eq!(get(&a.stats.drops[DropReason::Invalid as usize]), 1);
    assert_eq!(a.completed(), 3);
}

// Egress queues: packets that find no room wait in the receiver's queue (copied), the sender
// goes on; drained first each round, in bulk or one per dequeue, bounded by DQL.

use crate::egress::queue::{Qdisc, QueueConfig};
use crate::egress::{EgressConfig, STALL};

fn queued(qdisc: Qdisc, limit: u32, dql: bool, bulk: bool) -> EgressConfig {
    EgressConfig {
        queue: Some(QueueConfig {
            qdisc,
            limit,
            ..QueueConfig::default()
        }),
        dql,
        bulk,
        ..EgressConfig::switch_default()
    }
}

/// `n` frames from `a` to station 2 (b), numbered from `first`.
fn send_n(a: &mut MockFe, first: u8, n: u8) {
    for k in 0..n {
        a.send(&VnetHdr::default(), &frame(mac(2), mac(1), first + k, 60));
    }
}

#[test]
fn a_full_receiver_queues_and_the_sender_goes_on() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::with_egress(1, MODERN, 0, queued(Qdisc::Fifo, 1024, false, true));
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    send_n(&mut a, 0, 40);
    run(&mut f, &mut ports, t0);
    assert_eq!(a.completed(), 40, "the sender has its buffers back");
    assert_eq!(get(&a.stats.rx_packets), 40);
    assert_eq!(get(&b.stats.queued), 40);
    assert_eq!(get(&b.stats.backlog), 40);
    // New packets queue behind the backlog even once there is room (order holds).
    b.post(256);
    send_n(&mut a, 40, 10);
    run(&mut f, &mut ports, t0);
    let got = b.received();
    let order: Vec<u8> = got.iter().map(|(_, fr)| fr[14]).collect();
    assert_eq!(order, (0..50).collect::<Vec<u8>>());
    assert_eq!(get(&b.stats.tx_packets), 50);
    assert_eq!(get(&b.stats.queued), get(&b.stats.dequeued));
    assert_eq!(get(&b.stats.backlog), 0);
    assert_eq!(
        get(&b.stats.dequeues),
        1,
        "bulk: the whole backlog in one drain"
    );
}

#[test]
fn one_per_dequeue_sends_each_packet_as_its_own_batch() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::with_egress(1, MODERN, 0, queued(Qdisc::Fifo, 1024, false, false));
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    send_n(&mut a, 0, 10);
    run(&mut f, &mut ports, t0);
    b.post(256);
    f.round(&mut ports, t0);
    assert_eq!(b.received().len(), 10);
    assert_eq!(get(&b.stats.dequeues), 10);
    assert_eq!(get(&b.stats.tx_batches), 10, "each its own publish");
}

#[test]
fn a_full_queue_drops_with_queue_limit_and_counts_add_up() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::with_egress(1, MODERN, 0, queued(Qdisc::Fifo, 16, false, true));
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    send_n(&mut a, 0, 40);
    run(&mut f, &mut ports, t0);
    assert_eq!(a.completed(), 40);
    assert_eq!(get(&b.stats.queued), 16);
    assert_eq!(get(&b.stats.drops[DropReason::QueueLimit as usize]), 24);
    b.post(256);
    run(&mut f, &mut ports, t0);
    let got = b.received();
    assert_eq!(got.len(), 16);
    assert_eq!(got[0].1[14], 0, "fifo drops the newest");
    assert_eq!(
        get(&a.stats.rx_packets),
        get(&b.stats.tx_packets) + get(&b.stats.drops[DropReason::QueueLimit as usize])
    );
}

#[test]
fn dql_keeps_the_ring_from_filling_ahead_of_a_frontend_that_does_not_give_buffers_back() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::with_egress(1, MODERN, 256, queued(Qdisc::FqCodel, 1024, true, true));
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    for round in 0..3u8 {
        send_n(&mut a, round * 60, 60);
        run(&mut f, &mut ports, t0);
        assert_eq!(a.completed(), 60);
    }
    // 256 buffers posted, but the limit starts at its floor (two batches of 64): 129 go in
    // (the batch that crosses the limit is allowed), the rest wait in the queue.
    let floor = crate::egress::dql_floor(64);
    assert_eq!(floor, 128);
    let first = u64::from(floor) + 1;
    let delivered = get(&b.stats.tx_packets);
    assert_eq!(delivered, first);
    assert_eq!(get(&b.stats.backlog), 180 - first);
    assert_eq!(get(&b.stats.dql_limit), u64::from(floor));
    // The frontend takes them and gives the buffers back: completions let the rest in.
    assert_eq!(b.received().len() as u64, first);
    b.post(u16::try_from(first).unwrap());
    run(&mut f, &mut ports, t0);
    let more = b.received().len();
    assert!(more > 0, "completions must open the limit again");
    let mut total = usize::try_from(first).unwrap() + more;
    for _ in 0..10 {
        b.post(256);
        run(&mut f, &mut ports, t0);
        total += b.received().len();
    }
    assert_eq!(total, 180, "everything delivered in the end");
    assert_eq!(get(&b.stats.backlog), 0);
}

/// One 10 us step of the bulk sender of [`paced_run`] and [`napi_run`] (`a`, with `flight`
/// frames on their way): up to 60 frames (6 Mpps), at most 1000 on their way (a TCP-like
/// window). Returns how many it sent.
fn bulk_step(a: &mut MockFe, flight: u64) -> u64 {
    a.completed();
    let k = 60
        .min(a.room())
        .min(usize::try_from(1000u64.saturating_sub(flight)).unwrap());
    for _ in 0..k {
        a.send(&VnetHdr::default(), &frame(mac(2), mac(1), 1, 60));
    }
    k as u64
}

/// A bulk sender offering 6 Mpps (60 frames a 10 us step, at most 1000 on their way) to a
/// receiver behind `egress` that takes, at step `i`, what `take(i, owed)` says (`owed`: what
/// it has not taken of its pace so far) and gives its buffers back at once: for each step
/// after a 20 ms warm-up, what the receiver took and whether packets waited for it; and the
/// DQL limit at the end.
fn paced_run(
    egress: EgressConfig,
    steps: u32,
    mut take: impl FnMut(u32, &mut u64) -> usize,
) -> (Vec<(usize, bool)>, u64) {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::with_egress(1, MODERN, 256, egress);
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    b.send(&VnetHdr::default(), &frame(mac(1), mac(2), 0, 60));
    f.round(&mut ports, t0);
    let _ = (a.received(), b.completed());
    let (mut sent, mut got, mut owed) = (0u64, 0u64, 0u64);
    let mut seen = Vec::new();
    for i in 0..steps {
        let now = t0 + Duration::from_micros(10) * i;
        sent += bulk_step(&mut a, sent - got);
        f.round(&mut ports, now);
        let waiting = get(&b.stats.backlog) > 0;
        let want = take(i, &mut owed);
        let n = b.receive(want).len();
        owed -= (n as u64).min(owed);
        got += n as u64;
        b.post(u16::try_from(n).unwrap());
        if i >= 2000 {
            seen.push((n, waiting && n < want));
        }
    }
    (seen, get(&b.stats.dql_limit))
}

#[test]
fn the_pace_cap_never_holds_a_steady_receiver_idle_while_packets_wait() {
    // 40 a step (4 Mpps) with packets always waiting: every step it finds its 40.
    let (seen, limit) = paced_run(EgressConfig::switch_default(), 6000, |_, _| 40);
    let short = seen.iter().filter(|&&(_, starved)| starved).count();
    assert_eq!(
        short, 0,
        "steps where the receiver found less than it takes while packets waited"
    );
    assert!(seen.iter().all(|&(n, _)| n == 40));
    // Burst (40) plus 4 Mpps * 25 us, at the floor of two batches (128) or a little above.
    assert!((128..=150).contains(&limit), "limit {limit}");
}

#[test]
fn the_pace_cap_keeps_a_bursty_late_receiver_from_taking_the_whole_ring() {
    // Owed 32 a step (3.2 Mpps); awake every other step, but once in 16 steps it oversleeps 6
    // and then takes its whole debt at once. DQL alone reads the catch-up as starvation and
    // lets the whole ring fill; with the pace cap the limit stays near a burst plus 25 us.
    let bursty = |i: u32, owed: &mut u64| {
        *owed += 32;
        let phase = i % 16;
        let awake = if phase < 10 { i % 2 == 1 } else { phase == 15 };
        if awake {
            usize::try_from(*owed).unwrap()
        } else {
            0
        }
    };
    let mut linux = EgressConfig::switch_default();
    linux.dql_target = Duration::ZERO;
    let (seen_linux, alone) = paced_run(linux, 6000, bursty);
    let (seen, capped) = paced_run(EgressConfig::switch_default(), 6000, bursty);
    assert!(alone >= 256, "DQL alone: limit {alone}");
    assert!(capped < 200, "capped: limit {capped}");
    // The receiver keeps its rate: 32 a step on average either way.
    let rate =
        |v: &[(usize, bool)]| v.iter().map(|&(n, _)| n).sum::<usize>() as f64 / v.len() as f64;
    assert!(
        (rate(&seen) - 32.0).abs() < 0.5,
        "capped rate {}",
        rate(&seen)
    );
    assert!((rate(&seen_linux) - 32.0).abs() < 0.5);
}

/// What a [`receiver_run`] measured after its warm-up.
#[derive(Debug)]
struct Napi {
    /// Packets the receiver took per step.
    rate: f64,
    /// Steps it slept (waiting for its interrupt) while packets waited for it.
    slept_waiting: u32,
    /// The port's limit at the end.
    limit: u64,
    /// Trials of the reserve, and those that kept it.
    trials: (u64, u64),
    /// Idles witnessed during the warm-up and after it.
    idle: (u64, u64),
    /// A request-response flow beside the bulk one (one request out at a time, from a third
    /// port): its requests' time to the receiver, p50 and p99, in steps.
    rtt: (u32, u32),
}

impl Napi {
    /// Asserts that this run's request p99 is at most `share` of `base`'s.
    fn assert_p99_within(&self, share: f64, base: &Napi) {
        assert!(
            f64::from(self.rtt.1) <= share * f64::from(base.rtt.1),
            "p99 {} against {}",
            self.rtt.1,
            base.rtt.1
        );
    }
}

/// The switch's egress with a target too short for a receiver that sleeps (2 us), the
/// witness on or off.
fn short_target(witness: bool) -> EgressConfig {
    let mut e = EgressConfig::switch_default();
    e.dql_target = Duration::from_micros(2);
    e.dql_witness = witness;
    e
}

/// [`paced_run`]'s bulk sender (6 Mpps) to a receiver that behaves as a Linux guest's NAPI:
/// it takes up to `per_step` packets a 10 us step, in polls of at most `budget` (a Linux
/// guest's: 64), giving its buffers back at the end of a poll when more than half a budget
/// are free (as `virtnet_receive` refills). A poll that used its whole budget polls again at
/// once; one that found the ring dry re-arms at its last used entry and sleeps until pvnet
/// publishes past it, and wakes `irq` steps after that (the interrupt's cost: long under
/// TCG). A third port sends the receiver a request whenever the last one arrived (a sparse
/// flow).
fn napi_run(egress: EgressConfig, steps: u32, per_step: usize, irq: u32, budget: usize) -> Napi {
    let half = u16::try_from(budget / 2).unwrap();
    // Asleep: None while polling; Some(None) until pvnet publishes; Some(Some(t)) awake at t.
    let mut asleep: Option<Option<u32>> = None;
    let (mut done, mut unposted) = (0usize, 0u16);
    receiver_run(egress, steps, |i, b| {
        asleep = match asleep {
            Some(None) if b.rx_ready() > 0 => Some(Some(i + irq)),
            Some(Some(t)) if i >= t => None,
            s => s,
        };
        if asleep.is_some() {
            return None;
        }
        let (mut cap, mut took) = (per_step, Vec::new());
        while cap > 0 {
            let r = b.receive(cap.min(budget - done));
            let n = r.len();
            took.extend(r);
            (cap, done, unposted) = (cap - n, done + n, unposted + u16::try_from(n).unwrap());
            let budget_used = done == budget;
            if !budget_used && cap > 0 {
                // Dry before the budget: refill, complete, re-arm (and re-check).
                if unposted > half {
                    b.post(std::mem::take(&mut unposted));
                }
                done = 0;
                if b.arm_rx() == virtq::Armed::Empty {
                    asleep = Some(None);
                    break;
                }
            } else if budget_used {
                if unposted > half {
                    b.post(std::mem::take(&mut unposted));
                }
                done = 0;
            }
        }
        Some(took)
    })
}

/// [`paced_run`]'s bulk sender (6 Mpps) to a receiver on its own clock, as pvnet's paced
/// receiver: owed `per_step` packets a 10 us step, it wakes every `period` steps (every
/// `late`-th time `period` late), takes what it is owed, gives the buffers back, arms its
/// notifications (it is asleep on everything it took) and sleeps till its next tick, whatever
/// pvnet publishes. The same request flow as [`napi_run`].
fn clocked_run(egress: EgressConfig, steps: u32, per_step: u64, period: u32, late: u32) -> Napi {
    let (mut owed, mut next, mut ticks) = (0u64, 0u32, 0u32);
    receiver_run(egress, steps, |i, b| {
        owed += per_step;
        if i < next {
            return None;
        }
        ticks += 1;
        next = i + if ticks % late == 0 {
            2 * period
        } else {
            period
        };
        let took = b.receive(usize::try_from(owed).unwrap());
        owed -= took.len() as u64;
        b.post(u16::try_from(took.len()).unwrap());
        let _ = b.arm_rx();
        Some(took)
    })
}

/// [`paced_run`]'s bulk sender (6 Mpps) and a request flow (a third port sends the receiver a
/// request whenever the last one arrived) to a receiver with an event index behind `egress`
/// that, at step `i`, takes what `rx(i, ..)` returns (None: it sleeps).
fn receiver_run(
    egress: EgressConfig,
    steps: u32,
    mut rx: impl FnMut(u32, &mut MockFe) -> Option<Vec<(VnetHdr, Vec<u8>)>>,
) -> Napi {
    // The first quarter warms up (the limit learned, a trial of reserve run).
    let warm = steps / 4;
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::with_event_idx(1, MODERN, 256, egress);
    let (mut c, pc) = fe(2, MODERN);
    let mut ports = vec![pa, pb, pc];
    let (mut request, mut rtt) = (None, Vec::new());
    let t0 = Instant::now();
    b.send(&VnetHdr::default(), &frame(mac(1), mac(2), 0, 60));
    f.round(&mut ports, t0);
    let _ = (a.received(), b.completed());
    let (mut sent, mut got, mut taken) = (0u64, 0u64, 0u64);
    let (mut slept_waiting, mut idle_warm) = (0, 0);
    for i in 0..steps {
        let now = t0 + Duration::from_micros(10) * i;
        sent += bulk_step(&mut a, sent - got);
        c.completed();
        if request.is_none() {
            c.send(&VnetHdr::default(), &frame(mac(2), mac(3), 200, 60));
            request = Some(i);
        }
        f.round(&mut ports, now);
        if i == warm {
            idle_warm = get(&b.stats.dql_idle);
        }
        let waiting = get(&b.stats.backlog) > 0;
        let Some(took) = rx(i, &mut b) else {
            slept_waiting += u32::from(waiting && i >= warm);
            continue;
        };
        if took.iter().any(|(_, fr)| fr[14] == 200) {
            if i >= warm {
                rtt.push(i - request.unwrap_or(i));
            }
            request = None;
        }
        got += took.len() as u64;
        if i >= warm {
            taken += took.len() as u64;
        }
    }
    rtt.sort_unstable();
    let pct = |p: usize| rtt[(rtt.len() - 1) * p / 100];
    #[allow(clippy::cast_precision_loss)]
    Napi {
        rtt: (pct(50), pct(99)),
        rate: taken as f64 / f64::from(steps - warm),
        slept_waiting,
        limit: get(&b.stats.dql_limit),
        trials: (get(&b.stats.dql_trials), get(&b.stats.dql_kept)),
        idle: (idle_warm, get(&b.stats.dql_idle) - idle_warm),
    }
}

#[test]
fn a_napi_receiver_that_runs_dry_gets_a_reserve_not_the_ring() {
    // A receiver that polls 128 at a time (twice a Linux guest's budget), 24 packets a step
    // while it polls; a target too short for a receiver that sleeps (2 us): the limit sits
    // at the ceiling's minimum (96), under one poll, so every poll finds the ring dry before
    // pvnet has refilled it, and the receiver sleeps through its interrupt.
    // 240 ms: the reserve's trial (with it, then without it) runs in the first 60.
    let fifo = napi_run(queued(Qdisc::Fifo, 1024, false, true), 24_000, 24, 5, 128);
    let plain = napi_run(short_target(false), 24_000, 24, 5, 128);
    let seen = napi_run(short_target(true), 24_000, 24, 5, 128);
    eprintln!("fifo {fifo:?}\nblind {plain:?}\nwitness {seen:?}");
    assert!(fifo.rate > 23.9, "fifo keeps it busy: {fifo:?}");
    assert!(
        plain.rate < 0.8 * fifo.rate,
        "without the witness it starves: {plain:?}"
    );
    assert!(
        plain.idle.1 > 100,
        "and every dry poll is counted: {plain:?}"
    );
    assert!(
        seen.rate >= 0.95 * fifo.rate,
        "the witness keeps its rate: {seen:?}"
    );
    assert!(seen.idle.1 <= 2, "starved in the warm-up only: {seen:?}");
    assert_eq!(seen.trials, (1, 1), "one trial, its reserve kept: {seen:?}");
    assert!(
        (97..=192).contains(&seen.limit),
        "well below the ring: {seen:?}"
    );
    // And a request waits behind that limit, not behind FIFO's queue and a full ring.
    seen.assert_p99_within(0.2, &fifo);
}

#[test]
fn a_guests_napi_is_kept_polling_by_the_ceilings_minimum() {
    // A Linux guest's NAPI (budget 64) with a target too short for it (2 us) and no
    // witness: the ceiling's minimum (a budget and a half) alone keeps its repoll fed, so it
    // never runs dry, takes FIFO's rate, and a request waits behind 96 buffers at most.
    let fifo = napi_run(queued(Qdisc::Fifo, 1024, false, true), 24_000, 12, 5, 64);
    let r = napi_run(short_target(false), 24_000, 12, 5, 64);
    eprintln!("fifo {fifo:?}\nblind {r:?}");
    assert!(r.rate >= 0.99 * fifo.rate, "{r:?} against {fifo:?}");
    assert_eq!((r.slept_waiting, r.idle.1), (0, 0), "{r:?}");
    assert_eq!(
        r.limit,
        u64::from(crate::egress::CEILING_MIN_BUFFERS),
        "{r:?}"
    );
    r.assert_p99_within(0.2, &fifo);
}

#[test]
fn a_receiver_on_its_own_clock_is_witnessed_but_keeps_the_plain_ceiling() {
    // 2 Mpps in wakes of 60 every 30 us, every eighth wake 30 us late: then it takes all it
    // is owed (more than the ring holds of it), arms and sleeps on its clock. Found asleep
    // with packets held back, it is witnessed; a reserve step buys it no rate (it catches up
    // at its next tick), so with the witness on the ceiling stays where the target alone puts
    // it, and so does the request's wait.
    let mut blind = EgressConfig::switch_default();
    blind.dql_witness = false;
    let plain = clocked_run(blind, 12_000, 20, 3, 8);
    let probed = clocked_run(EgressConfig::switch_default(), 12_000, 20, 3, 8);
    eprintln!("plain {plain:?}\nwitness {probed:?}");
    assert!(plain.idle.1 > 100, "it is witnessed: {plain:?}");
    assert!(probed.idle.1 > 100, "it is witnessed: {probed:?}");
    assert_eq!(probed.trials, (1, 0), "a trial, its reserve not kept");
    assert_eq!(plain.trials, (0, 0));
    assert!((probed.rate - 20.0).abs() < 0.2, "{probed:?}");
    assert!((plain.rate - 20.0).abs() < 0.2, "{plain:?}");
    assert!(
        probed.limit <= plain.limit + 4,
        "no reserve kept: {} against {}",
        probed.limit,
        plain.limit
    );
    probed.assert_p99_within(1.25, &plain);
}

#[test]
fn a_steady_napi_receiver_is_never_witnessed_starved() {
    // The default target: the ceiling leaves a budget's repoll enough, nothing runs dry.
    let r = napi_run(EgressConfig::switch_default(), 8000, 12, 5, 64);
    assert!(r.rate > 11.9, "{r:?}");
    assert_eq!((r.slept_waiting, r.idle.1), (0, 0), "{r:?}");
    assert!(r.limit < 200, "{r:?}");
}

#[test]
fn fq_codel_lets_a_sparse_flow_past_a_bulk_backlog_and_fifo_does_not() {
    for (qdisc, within) in [(Qdisc::FqCodel, 30usize), (Qdisc::Fifo, 61)] {
        let mut f = switch();
        let (mut a, pa) = fe(0, MODERN);
        let (mut s, ps) = fe(2, MODERN);
        let (mut b, pb) = MockFe::with_egress(1, MODERN, 0, queued(qdisc, 1024, false, true));
        let mut ports = vec![pa, pb, ps];
        let t0 = Instant::now();
        // b speaks first so that it is learned (nothing floods to s).
        b.send(&VnetHdr::default(), &frame(mac(1), mac(2), 0, 60));
        run(&mut f, &mut ports, t0);
        a.received();
        send_n(&mut a, 0, 60);
        run(&mut f, &mut ports, t0);
        s.send(&VnetHdr::default(), &frame(mac(2), mac(3), 200, 60));
        run(&mut f, &mut ports, t0);
        b.post(256);
        run(&mut f, &mut ports, t0);
        let got = b.received();
        assert_eq!(got.len(), 61, "{qdisc}");
        let at = got.iter().position(|(_, fr)| fr[14] == 200).unwrap();
        assert!(at < within, "{qdisc}: the sparse packet came {at}th");
        if qdisc == Qdisc::Fifo {
            assert_eq!(at, 60);
        }
    }
}

#[test]
fn a_receiver_that_goes_away_frees_its_queue() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (_b, pb) = MockFe::with_egress(1, MODERN, 0, queued(Qdisc::FqCodel, 1024, true, true));
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    send_n(&mut a, 0, 20);
    run(&mut f, &mut ports, t0);
    let bstats = ports[1].tx_stats().snapshot(1);
    assert_eq!(bstats.backlog, 20);
    ports[1].as_vhost().unwrap().stop(0);
    let s = ports[1].tx_stats().snapshot(1);
    assert_eq!(s.drops["port_down"], 20);
    assert_eq!(s.backlog, 0);
}

#[test]
fn a_stalled_receiver_is_emptied_after_the_stall_bound() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (b, pb) = MockFe::with_egress(1, MODERN, 0, queued(Qdisc::FqCodel, 1024, true, true));
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    send_n(&mut a, 0, 20);
    run(&mut f, &mut ports, t0);
    run(&mut f, &mut ports, t0 + STALL / 2);
    assert_eq!(get(&b.stats.backlog), 20, "still within the bound");
    run(&mut f, &mut ports, t0 + STALL + Duration::from_millis(1));
    assert_eq!(get(&b.stats.backlog), 0);
    assert_eq!(get(&b.stats.drops[DropReason::NoBuffer as usize]), 20);
}

// Software segmentation is budgeted: a sender cannot buy unbounded work with a tiny gso_size.

#[test]
fn a_tiny_tcp_gso_size_is_refused_not_segmented() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = fe(1, MODERN);
    let mut ports = vec![pa, pb];
    let t0 = Instant::now();
    b.send(&VnetHdr::default(), &tcp4(mac(1), mac(2), 10));
    run(&mut f, &mut ports, t0);
    a.received();
    // 3000 bytes of payload at gso_size 1 would be 3000 frames for b (no TSO).
    a.send(&gso_hdr(1), &tcp4(mac(2), mac(1), 3000));
    a.send(&gso_hdr(MIN_TCP_GSO_SIZE), &tcp4(mac(2), mac(1), 3000));
    run(&mut f, &mut ports, t0);
    assert_eq!(get(&a.stats.drops[DropReason::Offload as usize]), 1);
    let got = b.received();
    assert_eq!(
        got.len(),
        3000usize.div_ceil(usize::from(MIN_TCP_GSO_SIZE)),
        "only the second"
    );
    assert!(got.iter().all(|(_, fr)| tcp_ok(fr)));
    assert_eq!(a.completed(), 2, "both buffers back");
    assert_eq!(gso_segments(&gso_hdr(0), 1000), None);
    let mut udp = gso_hdr(8);
    udp.gso_type = VnetHdr::GSO_UDP_L4;
    assert_eq!(gso_segments(&udp, 54 + 8 * 128), Some(128));
    assert_eq!(gso_segments(&udp, 54 + 8 * 129), None);
}

#[test]
fn segmentation_is_budgeted_per_sender_per_round_and_others_go_on() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut c, pc) = fe(2, MODERN);
    let (mut b, pb) = MockFe::with_egress(1, MODERN, 256, queued(Qdisc::Fifo, 8192, false, true));
    let mut ports = vec![pa, pb, pc];
    let t0 = Instant::now();
    b.send(&VnetHdr::default(), &tcp4(mac(1), mac(2), 10));
    run(&mut f, &mut ports, t0);
    a.received();
    c.received();
    // 20 packets of 8000 bytes at the smallest gso_size: 91 segments each, 1820 in all.
    let per = 8000usize.div_ceil(usize::from(MIN_TCP_GSO_SIZE));
    for _ in 0..20 {
        a.send(&gso_hdr(MIN_TCP_GSO_SIZE), &tcp4(mac(2), mac(1), 8000));
    }
    c.send(&VnetHdr::default(), &tcp4(mac(2), mac(3), 100));
    f.round(&mut ports, t0);
    let taken = usize::try_from(get(&a.stats.rx_packets)).unwrap();
    assert!(
        taken * per <= SEG_BUDGET + per,
        "one round cut {taken} packets"
    );
    assert!(taken < 20, "the budget must have held some back");
    assert_eq!(
        get(&c.stats.rx_packets),
        1,
        "the other sender went on in the same round"
    );
    for _ in 0..10 {
        f.round(&mut ports, t0);
    }
    assert_eq!(get(&a.stats.rx_packets), 20, "all of them in the end");
    let mut delivered = 0;
    for _ in 0..20 {
        delivered += b.received().len();
        b.post(256);
        f.round(&mut ports, t0);
    }
    assert_eq!(
        delivered,
        20 * per + 1,
        "every segment and c's packet, nothing lost"
    );
}

/// How much of a paced generator's rate reaches its sink over `secs` of real time while
/// frontend A floods GSO packets of 64 KiB at `gso_size` towards B, who cannot take them
/// whole (every one is cut in software).
fn paced_share_under_gso_flood(gso_size: u16, secs: f64) -> f64 {
    use crate::port::gen::{GenPort, GenSpec};
    use crate::port::sink::{Counting, SinkPort};
    const RATE: u64 = 20_000;
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = fe(1, MODERN);
    let gs: std::sync::Arc<PortStats> = std::sync::Arc::default();
    let ss: std::sync::Arc<PortStats> = std::sync::Arc::default();
    let g = AnyPort::Gen(GenPort::new(
        2,
        gs.clone(),
        GenSpec {
            frame_len: 64,
            rate: RATE,
            duration: None,
            delay: Duration::ZERO,
            src: mac(7),
            dst: mac(8),
            flows: 1,
        },
        Counting::Own,
    ));
    let s = AnyPort::Sink(SinkPort::new(3, ss.clone(), Counting::Own, 2048));
    let mut ports = vec![pa, pb, g, s];
    // B speaks first: A's packets go to it alone.
    b.send(&VnetHdr::default(), &tcp4(mac(1), mac(2), 10));
    f.round(&mut ports, Instant::now());
    a.received();
    let t0 = Instant::now();
    let base = get(&ss.tx_packets);
    while t0.elapsed().as_secs_f64() < secs {
        a.completed();
        while a.room() > 0 {
            a.send(&gso_hdr(gso_size), &tcp4(mac(2), mac(1), 60_000));
        }
        f.round(&mut ports, Instant::now());
        b.received();
        b.post(256);
    }
    let got = get(&ss.tx_packets) - base;
    got as f64 / (RATE as f64 * t0.elapsed().as_secs_f64())
}

#[test]
fn a_gso_flood_at_the_smallest_gso_size_leaves_other_ports_their_rate() {
    // The generator's frames flood to every receiver (its destination is unknown): the sink
    // counts them. Without the segmentation budget one round cut up to 64 packets of 682
    // segments (~44 000 frames) and the generator got a fraction of its rate.
    let share = paced_share_under_gso_flood(MIN_TCP_GSO_SIZE, 0.5);
    eprintln!("paced port share under the flood: {share:.3}");
    assert!(share >= 0.5, "the paced port kept {share:.2} of its rate");
}

/// Direct receive (docs/no-copy.md): the host's UDP datagrams, through a real tap, land in
/// the frontend's receive buffers with no copy of pvnet's (`rx_direct`), byte for byte and in
/// order. A packet longer than the frontend's buffers, a header the frontend cannot take as
/// it is (a partial checksum without GUEST_CSUM), and every packet read after either in its
/// batch take the usual path (merged buffers, the checksum completed): nothing lost, nothing
/// cut. With `direct=false` nothing is read in place.
#[test]
fn tap_packets_are_read_straight_into_the_frontends_buffers() {
    use pvnet_net::features::VIRTIO_NET_F_GUEST_CSUM;
    let csum = MODERN | VIRTIO_NET_F_GUEST_CSUM;
    // Small and full-size datagrams, some past a 512-byte buffer.
    let mixed = [
        18usize, 100, 64, 1000, 18, 1472, 300, 1472, 64, 700, 18, 18, 1200, 1472, 64, 90,
    ];
    let full = [1472usize; 16];
    let case = |tag, net, features, buf, sizes, direct, expect| TapCase {
        tag,
        net,
        features,
        buf,
        sizes,
        direct,
        expect,
        another: false,
    };
    for c in [
        case("dra", 41, csum, 2048, &mixed[..], true, Direct::All),
        case("drb", 42, csum, 512, &mixed, true, Direct::Some),
        case("drc", 43, csum, 2048, &mixed, false, Direct::None),
        case("drd", 44, MODERN, 2048, &mixed, true, Direct::NoUdp),
        // Every packet spans three buffers: after the first, each is read over as many
        // chains as a packet may take, and completed in place across three of them.
        case("drf", 46, csum, 512, &full, true, Direct::AllButFirst),
        // A second frontend on the switch: the kernel's packets could go to either, so
        // neither lends its buffers (a frontend never sees what was not sent to it).
        TapCase {
            another: true,
            ..case("dre", 45, csum, 2048, &mixed, true, Direct::None)
        },
    ] {
        tap_to_frontend(&c);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direct {
    All,
    AllButFirst,
    Some,
    None,
    NoUdp,
}

/// One run of [`tap_packets_are_read_straight_into_the_frontends_buffers`].
#[derive(Debug, Clone, Copy)]
struct TapCase<'a> {
    tag: &'a str,
    /// The tap's subnet, 10.213.`net`.0/24.
    net: u8,
    /// The frontend's features.
    features: u64,
    /// Its receive buffers' size.
    buf: u32,
    /// Datagram payloads sent, in bytes (four rounds of them).
    sizes: &'a [usize],
    /// The tap port's `direct`.
    direct: bool,
    expect: Direct,
    /// A second frontend on the switch.
    another: bool,
}

fn tap_to_frontend(c: &TapCase<'_>) {
    use crate::egress::EgressConfig;
    use crate::port::kernel::{HostDev, HostIo, KernelPort};
    use crate::sys::tap::tests::{parse_ipv4, setup};
    let TapCase {
        tag,
        net,
        features,
        buf,
        sizes,
        direct,
        expect,
        another,
    } = *c;
    let tap = setup(tag, net, true);
    let tap_stats: std::sync::Arc<PortStats> = std::sync::Arc::default();
    let (mut fe, vm) = MockFe::with_buffers(
        2,
        features,
        256,
        EgressConfig::hold(HoldPolicy::Forever),
        buf,
    );
    let kernel = KernelPort::new(
        1,
        tap_stats.clone(),
        HostDev::Tap(tap),
        HostIo::Uring,
        direct,
    );
    let mut f = switch();
    let mut ports = vec![AnyPort::Kernel(kernel), vm];
    // The other frontend learns its address first, so the datagrams are not flooded to it.
    let (mut fe2, vm2) = MockFe::new(3, features, 256, HoldPolicy::Forever);
    // Frames of the tap's own (the kernel's, e.g. an IPv6 report once the link is up) that
    // reached the frontend with the broadcast: counted with the tap's.
    let mut early = 0usize;
    if another {
        ports.push(vm2);
        fe2.send(&VnetHdr::default(), &frame(mac(0xff), mac(3), 0, 60));
        f.round(&mut ports, Instant::now());
        let got = fe.received();
        let from_fe2 = got.iter().filter(|(_, fr)| fr[6..12] == mac(3)).count();
        assert_eq!(from_fe2, 1, "the broadcast");
        early = got.len() - from_fe2;
        fe.post(256);
    }
    let before = get(&fe.stats.tx_packets) - early as u64;
    let sock = std::net::UdpSocket::bind(format!("10.213.{net}.1:0")).expect("bind");
    let to = format!("10.213.{net}.2:9");
    let mut sent = Vec::new();
    for round in 0..4u8 {
        for (i, &n) in sizes.iter().enumerate() {
            let p: Vec<u8> = (0..n)
                .map(|k| u8::try_from((k + i * 7 + usize::from(round)) % 251).unwrap_or(0))
                .collect();
            sock.send_to(&p, &to).expect("send");
            sent.push(p);
        }
    }
    let mut got = Vec::new();
    let mut all = early;
    let deadline = Instant::now() + Duration::from_secs(3);
    while got.len() < sent.len() && Instant::now() < deadline {
        f.round(&mut ports, Instant::now());
        for (h, fr) in fe.received() {
            all += 1;
            assert!(
                features & VIRTIO_NET_F_GUEST_CSUM != 0 || h.flags == 0,
                "a frontend without GUEST_CSUM gets no flags"
            );
            if let Some(ip) = parse_ipv4(&fr).filter(|ip| ip.proto == 17 && ip.l4.len() >= 8) {
                if ip.l4[2..4] == 9u16.to_be_bytes() {
                    got.push(ip.l4[8..].to_vec());
                }
            }
        }
        fe.post(256);
        ports[0].disarm(true);
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(got.len(), sent.len(), "{tag}: every datagram arrives");
    assert!(got == sent, "{tag}: byte for byte, in order");
    let (rx, in_place) = (get(&tap_stats.rx_packets), get(&tap_stats.rx_direct));
    let drops: u64 = tap_stats.drops.iter().map(get).sum();
    assert_eq!(drops, 0, "{tag}: {:?}", tap_stats.snapshot(1).drops);
    assert_eq!(
        get(&fe.stats.tx_packets) - before,
        rx,
        "{tag}: all delivered"
    );
    assert_eq!(all as u64, rx, "{tag}: the frontend got each packet once");
    match expect {
        Direct::All => assert_eq!(in_place, rx, "{tag}: every packet read in place"),
        Direct::AllButFirst => {
            // The first read is not in place (a small read: the packet does not fit it, and
            // the port reads large from then on). Nor is a frame of the kernel's own (an IPv6
            // report, ...; flooded, not the lender's alone), and, when it falls among ours,
            // the read after it: the small frame fitted a large read, so the port reads small
            // again, and the next full-size packet does not fit.
            let own = (all - got.len()) as u64;
            assert!(
                in_place + 1 + 2 * own >= rx,
                "{tag}: {in_place} of {rx} read in place ({own} of the kernel's own)"
            );
            assert!(get(&fe.stats.tx_batches) > 0);
        }
        Direct::Some => assert!(in_place > 0 && in_place < rx, "{tag}: {in_place} of {rx}"),
        Direct::None => assert_eq!(in_place, 0, "{tag}"),
        Direct::NoUdp => {
            assert!(
                in_place + sent.len() as u64 <= rx,
                "{tag}: {in_place} of {rx}"
            );
            assert!(
                get(&fe.stats.sw_csum) >= sent.len() as u64,
                "{tag}: checksums completed"
            );
        }
    }
}

/// A UDP frame of flow `flow` (its source port) carrying `n` in its payload.
fn udp_flow(dst: [u8; 6], src: [u8; 6], flow: u16, n: u8) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 8 + 18];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    f[34..36].copy_from_slice(&(10_000 + flow).to_be_bytes());
    f[36..38].copy_from_slice(&5001u16.to_be_bytes());
    f[42] = n;
    f
}

/// Per pair of `fe`, the (flow, number) of every packet it received.
fn by_pair(fe: &mut MockFe, pairs: usize) -> Vec<Vec<(u16, u8)>> {
    (0..pairs)
        .map(|k| {
            fe.received_on(k)
                .iter()
                .map(|(_, f)| (u16::from_be_bytes([f[34], f[35]]) - 10_000, f[42]))
                .collect()
        })
        .collect()
}

/// Every flow on one pair only, its packets in order; and which flows each pair had.
fn flows_stay_in_order(got: &[Vec<(u16, u8)>], flows: u16, per_flow: u8) -> Vec<Vec<u16>> {
    let mut seen = Vec::new();
    for p in got {
        let mut fl: Vec<u16> = p.iter().map(|x| x.0).collect();
        fl.sort_unstable();
        fl.dedup();
        for &f in &fl {
            let ns: Vec<u8> = p.iter().filter(|x| x.0 == f).map(|x| x.1).collect();
            assert_eq!(
                ns,
                (0..per_flow).collect::<Vec<_>>(),
                "flow {f} out of order"
            );
        }
        seen.push(fl);
    }
    let mut all: Vec<u16> = seen.concat();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..flows).collect::<Vec<_>>(),
        "a flow on two pairs, or lost"
    );
    seen
}

#[test]
fn a_multiqueue_port_gets_each_flow_on_one_ring_in_order_and_every_ring_is_read() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::with_pairs(1, MODERN, 256, EgressConfig::switch_default(), 2048, 2);
    let mut ports = vec![pa, pb];
    let now = Instant::now();
    let (flows, per_flow) = (16u16, 3u8);
    for n in 0..per_flow {
        for fl in 0..flows {
            a.send(&VnetHdr::default(), &udp_flow(mac(2), mac(1), fl, n));
        }
    }
    run(&mut f, &mut ports, now);
    let got = by_pair(&mut b, 2);
    let seen = flows_stay_in_order(&got, flows, per_flow);
    assert!(
        seen.iter().all(|s| !s.is_empty()),
        "both rings carry flows: {seen:?}"
    );
    for (st, g) in b.pair_stats.iter().zip(&got) {
        assert_eq!(get(&st.tx_packets), g.len() as u64);
    }
    // Both of b's transmit rings are read, each counted on its own pair.
    b.send_on(0, &VnetHdr::default(), &udp_flow(mac(1), mac(2), 0, 0));
    b.send_on(1, &VnetHdr::default(), &udp_flow(mac(1), mac(2), 1, 0));
    b.send_on(1, &VnetHdr::default(), &udp_flow(mac(1), mac(2), 2, 0));
    run(&mut f, &mut ports, now);
    assert_eq!(a.received().len(), 3);
    let rx: Vec<u64> = (0..2).map(|k| get(&b.pair_stats[k].rx_packets)).collect();
    assert_eq!(rx, [1, 2]);
}

#[test]
fn runs_of_one_burst_into_one_ring_of_a_multiqueue_port_publish_once() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = MockFe::with_pairs(1, MODERN, 256, EgressConfig::switch_default(), 2048, 2);
    let mut ports = vec![pa, pb];
    let now = Instant::now();
    // Four runs (each from its own source address, so the switch hands them over one at a
    // time) of one flow: one ring, whose batch grows for each run and is published once.
    for run in 0..4u8 {
        for n in 0..8 {
            a.send(
                &VnetHdr::default(),
                &udp_flow(mac(2), mac(10 + run), 0, run * 8 + n),
            );
        }
    }
    run(&mut f, &mut ports, now);
    let got = by_pair(&mut b, 2);
    assert_eq!(got.iter().map(Vec::len).sum::<usize>(), 32);
    let ring = usize::from(got[0].is_empty());
    let numbers: Vec<u8> = got[ring].iter().map(|x| x.1).collect();
    assert_eq!(
        numbers,
        (0..32).collect::<Vec<_>>(),
        "in order, on one ring"
    );
    let batches: Vec<u64> = (0..2).map(|k| get(&b.pair_stats[k].tx_batches)).collect();
    assert_eq!(batches.iter().sum::<u64>(), 1, "one publish: {batches:?}");
}

#[test]
fn a_multiqueue_port_queues_per_ring_and_a_flow_is_never_overtaken() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    // Pair 0 has no buffers, pair 1 plenty: pair 0's flows wait in its own queue.
    let (mut b, pb) = MockFe::with_pairs(
        1,
        MODERN,
        0,
        queued(Qdisc::Fifo, 1024, false, true),
        2048,
        2,
    );
    b.post_on(1, 256);
    let mut ports = vec![pa, pb];
    let now = Instant::now();
    let (flows, per_flow) = (16u16, 4u8);
    let send = |a: &mut MockFe, from: u8, to: u8| {
        for n in from..to {
            for fl in 0..flows {
                a.send(&VnetHdr::default(), &udp_flow(mac(2), mac(1), fl, n));
            }
        }
    };
    send(&mut a, 0, 2);
    run(&mut f, &mut ports, now);
    assert_eq!(
        a.completed(),
        usize::from(flows) * 2,
        "the sender has its buffers back"
    );
    let waiting = get(&b.pair_stats[0].backlog);
    assert!(waiting > 0, "pair 0's flows wait in its queue");
    assert_eq!(get(&b.pair_stats[1].backlog), 0);
    // More of every flow, then pair 0 gets buffers: everything arrives, each flow in order
    // on its one ring.
    send(&mut a, 2, per_flow);
    run(&mut f, &mut ports, now);
    b.post_on(0, 256);
    run(&mut f, &mut ports, now);
    let got = by_pair(&mut b, 2);
    flows_stay_in_order(&got, flows, per_flow);
    let q: Vec<(u64, u64)> = (0..2)
        .map(|k| (get(&b.pair_stats[k].queued), get(&b.pair_stats[k].dequeued)))
        .collect();
    assert!(q.iter().all(|(i, o)| i == o), "{q:?}");
    assert_eq!(get(&b.pair_stats[0].backlog), 0);
}

#[test]
fn a_generator_with_flows_reaches_every_ring_of_a_multiqueue_port() {
    use crate::port::gen::{GenPort, GenSpec};
    use crate::port::sink::Counting;
    let mut f = switch();
    let (mut b, pb) = MockFe::with_pairs(1, MODERN, 256, EgressConfig::switch_default(), 2048, 2);
    let g = AnyPort::Gen(GenPort::new(
        0,
        std::sync::Arc::default(),
        GenSpec {
            frame_len: 64,
            rate: 0,
            duration: None,
            delay: Duration::ZERO,
            src: mac(7),
            dst: mac(8),
            flows: 8,
        },
        Counting::Own,
    ));
    let mut ports = vec![g, pb];
    f.round(&mut ports, Instant::now());
    let got: Vec<Vec<(u8, u64)>> = (0..2)
        .map(|k| {
            b.received_on(k)
                .iter()
                .map(|(_, fr)| {
                    let seq = u64::from_le_bytes(fr[22..30].try_into().expect("seq"));
                    (fr[10], seq)
                })
                .collect()
        })
        .collect();
    assert!(got.iter().all(|g| !g.is_empty()), "{got:?}");
    // Each source address (flow) on one ring, its frames in order, every eighth number.
    for g in &got {
        for &(src, seq) in g {
            assert_eq!(u64::from(src), seq / 32 % 8, "frame {seq} from {src}");
            assert!(got.iter().filter(|o| o.iter().any(|x| x.0 == src)).count() == 1);
        }
        for w in g.windows(2).filter(|w| w[0].0 == w[1].0) {
            assert!(w[0].1 < w[1].1);
        }
    }
}

/// Three shards' switches joined by trunks (a full mesh), one frontend on each.
#[test]
fn shards_joined_by_trunks_switch_as_one_and_floods_do_not_loop() {
    use crate::port::trunk::link;
    use std::sync::Arc;
    let mut fes = Vec::new();
    let mut shards: Vec<(Fabric, Vec<AnyPort>)> = Vec::new();
    for k in 0..3u32 {
        let (fe, p) = fe(k, MODERN);
        fes.push(fe);
        shards.push((switch(), vec![p]));
    }
    let mut trunk_stats = Vec::new();
    for a in 0..3usize {
        for b in a + 1..3 {
            let (at_a, at_b) = link(1 << 16);
            let mk = |id: u32, r, stats: &Arc<PortStats>| {
                trunk_end(id, usize::try_from(id - 100).unwrap(), r, stats)
            };
            let (sa, sb): (Arc<PortStats>, Arc<PortStats>) = (Arc::default(), Arc::default());
            shards[a]
                .1
                .push(mk(100 + u32::try_from(b).unwrap(), at_a, &sa));
            shards[b]
                .1
                .push(mk(100 + u32::try_from(a).unwrap(), at_b, &sb));
            trunk_stats.push(sa);
            trunk_stats.push(sb);
        }
    }
    let now = Instant::now();
    let run_all = |shards: &mut Vec<(Fabric, Vec<AnyPort>)>| {
        for _ in 0..4 {
            for (f, ports) in shards.iter_mut() {
                f.round(ports, now);
            }
        }
    };
    // a -> unknown b: flooded to both other shards, each delivers it once (no loop).
    fes[0].send(&VnetHdr::default(), &tcp4(mac(2), mac(1), 10));
    run_all(&mut shards);
    assert_eq!(fes[1].received().len(), 1);
    assert_eq!(fes[2].received().len(), 1);
    // b answers a: b's shard learned a behind its trunk to a's shard: only a gets it.
    fes[1].send(&VnetHdr::default(), &tcp4(mac(1), mac(2), 10));
    run_all(&mut shards);
    assert_eq!(fes[0].received().len(), 1);
    assert!(fes[2].received().is_empty());
    // a -> b again: unicast over the one trunk now.
    fes[0].send(&VnetHdr::default(), &tcp4(mac(2), mac(1), 10));
    run_all(&mut shards);
    assert_eq!(fes[1].received().len(), 1);
    assert!(fes[2].received().is_empty());
    // Every shard sees only its own stations as its own: a's shard has b behind a trunk.
    let macs: Vec<_> = shards[0]
        .0
        .macs(now)
        .iter()
        .map(|e| (e.mac, e.port))
        .collect();
    assert_eq!(macs, vec![(mac(1), 0), (mac(2), 101)]);
    // What crossed: 2 flooded copies + 2 unicasts out, as many in.
    let out: u64 = trunk_stats.iter().map(|s| get(&s.tx_packets)).sum();
    let inn: u64 = trunk_stats.iter().map(|s| get(&s.rx_packets)).sum();
    assert_eq!((out, inn), (4, 4));
}

/// A port spread over two shards (port 7, a lane on each: two frontends standing for one
/// wire), a frontend of its own on each shard (0 and 1), the shards joined by a trunk. The
/// wire gets every frame once: a flood or a unicast that crossed the trunk never leaves by
/// the second lane; a wire host's address is learned at the local lane on both shards, so
/// a frontend's answer goes straight out of its own shard's lane; the wire's own frames are
/// not sent back to it. With the lanes' rules off (no `set_lanes`), the same traffic
/// reaches the wire twice.
#[test]
fn a_port_spread_over_shards_gets_each_frame_once_and_learns_at_the_local_lane() {
    use crate::port::trunk::link;
    for lanes in [true, false] {
        let ((mut g0, p0), (mut w0, l0)) = (fe(0, MODERN), fe(7, MODERN));
        let ((mut g1, p1), (mut w1, l1)) = (fe(1, MODERN), fe(7, MODERN));
        let (at0, at1) = link(1 << 16);
        let trunk = |id: u32, peer: usize, r| trunk_end(id, peer, r, &Default::default());
        let mut shards = [
            (switch(), vec![p0, l0, trunk(101, 1, at0)]),
            (switch(), vec![p1, l1, trunk(100, 0, at1)]),
        ];
        if lanes {
            for (f, ports) in &mut shards {
                f.set_lanes(7, 0b11);
                for p in ports.iter_mut() {
                    if let AnyPort::Trunk(t) = p {
                        t.set_by_origin(true);
                    }
                }
            }
        }
        let now = Instant::now();
        let run_all = |shards: &mut [(Fabric, Vec<AnyPort>)]| {
            for _ in 0..4 {
                for (f, ports) in shards.iter_mut() {
                    f.round(ports, now);
                }
            }
        };
        // What the wire got: both lanes' frames.
        let wire = |w0: &mut MockFe, w1: &mut MockFe| w0.received().len() + w1.received().len();
        let h = mac(9);

        // A broadcast from frontend 0: the wire gets it once (through shard 0's lane).
        g0.send(&VnetHdr::default(), &tcp4([0xff; 6], mac(1), 10));
        run_all(&mut shards);
        let (got1, on_wire) = (g1.received().len(), wire(&mut w0, &mut w1));
        if !lanes {
            assert_eq!(
                (got1, on_wire),
                (1, 2),
                "without the rules: twice on the wire"
            );
            continue;
        }
        assert_eq!(
            (got1, on_wire),
            (1, 1),
            "the broadcast: once to 1, once on the wire"
        );
        // A wire host, in on shard 1's lane, to frontend 0 (learned behind the trunk):
        // delivered over the trunk, its address learned at shard 0's lane, not the trunk.
        w1.send(&VnetHdr::default(), &tcp4(mac(1), h, 10));
        run_all(&mut shards);
        assert_eq!(g0.received().len(), 1);
        assert_eq!(wire(&mut w0, &mut w1), 0, "not back to the wire");
        let at = |f: &Fabric, m: [u8; 6]| f.macs(now).iter().find(|e| e.mac == m).map(|e| e.port);
        assert_eq!(at(&shards[0].0, h), Some(7), "learned at the local lane");
        assert_eq!(at(&shards[1].0, h), Some(7));
        // Frontend 0 answers: out of its own shard's lane, nothing over the trunk.
        g0.send(&VnetHdr::default(), &tcp4(h, mac(1), 10));
        run_all(&mut shards);
        assert_eq!((w0.received().len(), w1.received().len()), (1, 0));
        // An unknown unicast from frontend 1: flooded, once on the wire (its own lane),
        // once to frontend 0; the trunk's copy is not sent out of shard 0's lane.
        g1.send(&VnetHdr::default(), &tcp4(mac(42), mac(2), 10));
        run_all(&mut shards);
        assert_eq!((w0.received().len(), w1.received().len()), (0, 1));
        assert_eq!(g0.received().len(), 1);
        // The wire's frame for another wire host (learned at the lane): not sent back.
        w0.send(&VnetHdr::default(), &tcp4(mac(1), mac(8), 10));
        run_all(&mut shards);
        assert_eq!(g0.received().len(), 1);
        // In on shard 1's lane (which has not seen host 8: flooded to frontend 1 and the
        // trunk), for host 8 (learned at shard 0's lane): not sent back to the wire.
        w1.send(&VnetHdr::default(), &tcp4(mac(8), h, 10));
        run_all(&mut shards);
        assert_eq!(wire(&mut w0, &mut w1), 0, "wire to wire: filtered");
        assert_eq!((g0.received().len(), g1.received().len()), (0, 1));
    }
}

/// `f` with an 802.1Q tag for `vid` after its addresses.
fn tagged(f: &[u8], vid: u16) -> Vec<u8> {
    let mut t = f[..12].to_vec();
    t.extend_from_slice(&[0x81, 0x00]);
    t.extend_from_slice(&vid.to_be_bytes());
    t.extend_from_slice(&f[12..]);
    t
}

/// [`gso_hdr`] for the frame with an 802.1Q tag: its offsets 4 bytes further.
fn tagged_gso_hdr(payload_mss: u16) -> VnetHdr {
    let h = gso_hdr(payload_mss);
    VnetHdr {
        csum_start: h.csum_start + 4,
        hdr_len: h.hdr_len + 4,
        ..h
    }
}

fn trunk_of(list: &str, native: Option<u32>) -> VlanMode {
    VlanMode::from_keys(None, Some(list), native)
        .expect("a good list")
        .expect("a trunk")
}

/// The frames a frontend got, headers left out.
fn frames(fe: &mut MockFe) -> Vec<Vec<u8>> {
    fe.received().into_iter().map(|(_, f)| f).collect()
}

fn vlan_drops(fe: &MockFe) -> u64 {
    get(&fe.stats.drops[DropReason::VlanFiltered as usize])
}

/// Frames to an address nobody has announced, from an access port to the one other port of
/// its VLAN (a trunk): a flood to one port, which leaves as one run as on the plain path,
/// each frame tagged, in order, every one counted as flooded; then the same with the
/// destination learned: a run again, no longer counted as flooded.
#[test]
fn a_flood_to_the_one_other_port_of_a_vlan_leaves_as_a_run() {
    let mut f = switch();
    let h = VnetHdr::default();
    let (mut a, pa) = fe(0, MODERN);
    let (mut d, pd) = fe(1, MODERN);
    f.set_vlan(0, Some(VlanMode::Access(10)));
    f.set_vlan(1, Some(trunk_of("10", None)));
    let mut ports = vec![pa, pd];
    let now = Instant::now();
    let sent: Vec<Vec<u8>> = (0..32).map(|k| frame(mac(9), mac(1), k, 60)).collect();
    for s in &sent {
        a.send(&h, s);
    }
    run(&mut f, &mut ports, now);
    let want: Vec<Vec<u8>> = sent.iter().map(|s| tagged(s, 10)).collect();
    assert_eq!(frames(&mut d), want);
    assert_eq!(get(&a.stats.flooded), 32);
    assert_eq!(get(&d.stats.tx_batches), 1, "one publish");
    // mac(9) answers from the trunk: learned there, the next frames are unicast.
    d.send(&h, &tagged(&frame(mac(1), mac(9), 0, 60), 10));
    run(&mut f, &mut ports, now);
    assert_eq!(frames(&mut a).len(), 1);
    for s in &sent {
        a.send(&h, s);
    }
    run(&mut f, &mut ports, now);
    assert_eq!(frames(&mut d), want);
    assert_eq!(get(&a.stats.flooded), 32, "unicast now");
}

/// Access ports in VLANs 10 and 20, a trunk of both, a trunk of 20 with native 10, and two
/// plain ports: a flood in one VLAN reaches only the ports of that VLAN, tagged on a trunk
/// and untagged on an access port or as a trunk's native VLAN; tagged frames from a trunk
/// leave access ports untagged; a frame in a VLAN its port does not carry is dropped and
/// counted (`vlan_filtered`); plain ports are one segment of their own where a tag is data;
/// addresses are learned per VLAN.
#[test]
fn vlans_isolate_floods_and_fit_each_ports_tags() {
    let mut f = switch();
    let h = VnetHdr::default();
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = fe(1, MODERN);
    let (mut c, pc) = fe(2, MODERN);
    let (mut d, pd) = fe(3, MODERN);
    let (mut n, pn) = fe(4, MODERN);
    let (mut e, pe) = fe(5, MODERN);
    let (mut g, pg) = fe(6, MODERN);
    f.set_vlan(0, Some(VlanMode::Access(10)));
    f.set_vlan(1, Some(VlanMode::Access(10)));
    f.set_vlan(2, Some(VlanMode::Access(20)));
    f.set_vlan(3, Some(trunk_of("10,20", None)));
    f.set_vlan(4, Some(trunk_of("20", Some(10))));
    let mut ports = vec![pa, pb, pc, pd, pn, pe, pg];
    let now = Instant::now();
    let bcast = [0xff; 6];

    // A flood in VLAN 10 from an access port.
    let sent: Vec<Vec<u8>> = (0..5).map(|k| frame(bcast, mac(1), k, 60)).collect();
    for s in &sent {
        a.send(&h, s);
    }
    run(&mut f, &mut ports, now);
    assert_eq!(frames(&mut b), sent, "access 10: untagged");
    let want: Vec<Vec<u8>> = sent.iter().map(|s| tagged(s, 10)).collect();
    assert_eq!(frames(&mut d), want, "trunk: tagged 10");
    assert_eq!(frames(&mut n), sent, "native 10 leaves untagged");
    for (name, x) in [("c", &mut c), ("e", &mut e), ("g", &mut g)] {
        assert!(x.received().is_empty(), "{name} is not in VLAN 10");
    }
    assert_eq!(get(&a.stats.flooded), 5);

    // VLAN 20 from an access port: tagged on both trunks, nowhere else.
    let s20 = frame(bcast, mac(3), 1, 100);
    c.send(&h, &s20);
    run(&mut f, &mut ports, now);
    assert_eq!(frames(&mut d), vec![tagged(&s20, 20)]);
    assert_eq!(frames(&mut n), vec![tagged(&s20, 20)]);
    for x in [&mut a, &mut b, &mut e, &mut g] {
        assert!(x.received().is_empty());
    }

    // From the trunk: tagged 10 leaves access ports and the native trunk untagged; tagged
    // 20 reaches c untagged and the other trunk tagged; untagged (no native), a VLAN not in
    // its list and a priority tag are dropped at the trunk.
    let t = frame(bcast, mac(4), 2, 80);
    d.send(&h, &tagged(&t, 10));
    d.send(&h, &tagged(&t, 20));
    d.send(&h, &t);
    d.send(&h, &tagged(&t, 30));
    d.send(&h, &tagged(&t, 0));
    run(&mut f, &mut ports, now);
    assert_eq!(frames(&mut a), vec![t.clone()]);
    assert_eq!(frames(&mut b), vec![t.clone()]);
    assert_eq!(frames(&mut c), vec![t.clone()]);
    assert_eq!(frames(&mut n), vec![t.clone(), tagged(&t, 20)]);
    assert_eq!(vlan_drops(&d), 3);

    // A tagged frame on an access port is dropped there.
    a.send(&h, &tagged(&frame(bcast, mac(1), 3, 60), 10));
    run(&mut f, &mut ports, now);
    assert_eq!(vlan_drops(&a), 1);
    for x in [&mut b, &mut c, &mut d, &mut n, &mut e, &mut g] {
        assert!(x.received().is_empty());
    }

    // Plain ports: a tagged frame is data, it reaches the other plain port as it is, and
    // no port with VLAN settings.
    let p = tagged(&frame(bcast, mac(6), 4, 60), 10);
    e.send(&h, &p);
    run(&mut f, &mut ports, now);
    assert_eq!(frames(&mut g), vec![p]);
    for x in [&mut a, &mut b, &mut c, &mut d, &mut n] {
        assert!(x.received().is_empty());
    }
    assert_eq!(vlan_drops(&e), 0);

    // Learning per VLAN: b answers mac(1) (learned on a in VLAN 10): a alone gets it, and
    // the trunk does not.
    let r = frame(mac(1), mac(2), 5, 60);
    b.send(&h, &r);
    run(&mut f, &mut ports, now);
    assert_eq!(frames(&mut a), vec![r]);
    assert!(d.received().is_empty() && n.received().is_empty());
    // The same address in VLAN 20 is another station: VLAN 10's entry stays.
    c.send(&h, &frame(bcast, mac(1), 6, 60));
    run(&mut f, &mut ports, now);
    let _ = (frames(&mut d), frames(&mut n));
    let m: Vec<(u16, [u8; 6], PortId)> = f
        .macs(now)
        .iter()
        .map(|e| (e.vlan, e.mac, e.port))
        .filter(|e| e.1 == mac(1))
        .collect();
    assert_eq!(m, vec![(10, mac(1), 0), (20, mac(1), 2)]);

    // What entered at a and d: delivered, or counted as a VLAN drop.
    assert_eq!((get(&a.stats.rx_packets), vlan_drops(&a)), (6, 1));
    assert_eq!((get(&d.stats.rx_packets), vlan_drops(&d)), (5, 3));

    // A port's settings change: what was learned on it in VLANs it leaves is forgotten.
    f.set_vlan(0, Some(VlanMode::Access(30)));
    assert!(f.macs(now).iter().all(|e| e.port != 0 || e.vlan == 30));
}

/// A GSO packet from an access port to a trunk keeps its offload: whole, to a trunk that
/// takes TSO (checksum start and header length 4 bytes further), or cut in software into
/// tagged segments whose checksums are right, for one that does not; and back, a tagged GSO
/// packet from the trunk loses its tag and 4 bytes of offsets on an access port.
#[test]
fn tags_move_the_checksum_and_gso_offsets() {
    let tso = MODERN | VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO4;
    let mut f = switch();
    let (mut a, pa) = fe(0, tso);
    let (mut t, pt) = fe(1, tso);
    let (mut s, ps) = fe(2, MODERN);
    f.set_vlan(0, Some(VlanMode::Access(7)));
    f.set_vlan(1, Some(trunk_of("7", None)));
    f.set_vlan(2, Some(trunk_of("7", None)));
    let mut ports = vec![pa, pt, ps];
    let now = Instant::now();
    let big = tcp4([0xff; 6], mac(1), 3000);
    a.send(&gso_hdr(1000), &big);
    run(&mut f, &mut ports, now);
    let got = t.received();
    assert_eq!(got.len(), 1, "whole, to the trunk that takes TSO");
    let (h, fr) = &got[0];
    assert_eq!((h.csum_start, h.hdr_len, h.gso_size), (38, 58, 1000));
    assert_eq!(fr, &tagged(&big, 7));
    let segs = s.received();
    assert_eq!(segs.len(), 3, "cut for the trunk that does not");
    for (h, fr) in &segs {
        assert_eq!(h.gso_type, VnetHdr::GSO_NONE);
        assert_eq!(&fr[12..16], &[0x81, 0, 0, 7], "each segment tagged");
        let mut plain = fr[..12].to_vec();
        plain.extend_from_slice(&fr[16..]);
        assert!(tcp_ok(&plain), "its checksums right");
    }
    assert_eq!(get(&s.stats.sw_gso), 1);

    // Back from the trunk, tagged: untagged at the access port, offsets 4 bytes back.
    let th = tagged_gso_hdr(1000);
    let back = tcp4(mac(1), mac(2), 3000);
    t.send(&th, &tagged(&back, 7));
    run(&mut f, &mut ports, now);
    let got = a.received();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0.csum_start, got[0].0.hdr_len), (34, 54));
    assert_eq!(got[0].1, back);
}

/// A burst of offloaded packets from a trunk to one access port (a guest's TCP stream over
/// its VLAN subinterface, as the guest sends it): every one arrives, each untagged with its
/// offsets moved, and what entered the trunk is what left the access port. (The run taken
/// as one burst on the VLAN path once delivered only its first offloaded packet and lost
/// the next one uncounted.)
#[test]
fn a_burst_of_offloaded_tagged_packets_arrives_whole() {
    let tso = MODERN | VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO4;
    let mut f = switch();
    let (mut a, pa) = fe(0, tso);
    let (mut t, pt) = fe(1, tso);
    f.set_vlan(0, Some(VlanMode::Access(7)));
    f.set_vlan(1, Some(trunk_of("7", None)));
    let mut ports = vec![pa, pt];
    let now = Instant::now();
    // a's address learned in VLAN 7.
    a.send(&VnetHdr::default(), &frame([0xff; 6], mac(1), 0, 60));
    run(&mut f, &mut ports, now);
    let _ = t.received();

    let th = tagged_gso_hdr(1000);
    let csum_only = VnetHdr {
        gso_type: VnetHdr::GSO_NONE,
        gso_size: 0,
        hdr_len: 0,
        ..th
    };
    let sent: Vec<(VnetHdr, Vec<u8>)> = (0..12u16)
        .map(|k| {
            let h = if k % 3 == 2 { csum_only } else { th };
            (h, tcp4(mac(1), mac(2), 900 + usize::from(k) * 100))
        })
        .collect();
    for (h, fr) in &sent {
        t.send(h, &tagged(fr, 7));
    }
    run(&mut f, &mut ports, now);
    let got = a.received();
    assert_eq!(got.len(), sent.len(), "every packet of the burst arrives");
    for ((h, fr), (sh, sf)) in got.iter().zip(&sent) {
        assert_eq!(fr, sf, "untagged, in order");
        assert_eq!((h.csum_start, h.gso_type), (sh.csum_start - 4, sh.gso_type));
    }
    assert_eq!(get(&t.stats.rx_packets), 12);
    assert_eq!(get(&a.stats.tx_packets), 12);
}

/// Two shards joined by a trunk: a frame keeps its VLAN across (a flood in VLAN 10 reaches
/// only VLAN 10's ports on the other shard, tagged on its trunk port), and a tagged frame
/// from a trunk port on one shard leaves an access port on the other untagged.
#[test]
fn a_frame_keeps_its_vlan_between_shards() {
    use crate::port::trunk::link;
    let (at_a, at_b) = link(1 << 16);
    let mk = |id: u32, r| {
        trunk_end(
            id,
            usize::try_from(id - 100).unwrap(),
            r,
            &Default::default(),
        )
    };
    let (mut a, pa) = fe(0, MODERN);
    let (mut b, pb) = fe(1, MODERN);
    let (mut c, pc) = fe(2, MODERN);
    let (mut d, pd) = fe(3, MODERN);
    let mut shards = vec![
        (switch(), vec![pa, mk(100, at_a)]),
        (switch(), vec![pb, pc, pd, mk(101, at_b)]),
    ];
    for (f, _) in &mut shards {
        f.set_vlan(0, Some(VlanMode::Access(10)));
        f.set_vlan(1, Some(VlanMode::Access(10)));
        f.set_vlan(2, Some(VlanMode::Access(20)));
        f.set_vlan(3, Some(trunk_of("10,20", None)));
    }
    let now = Instant::now();
    let run_all = |shards: &mut Vec<(Fabric, Vec<AnyPort>)>| {
        for _ in 0..4 {
            for (f, ports) in shards.iter_mut() {
                f.round(ports, now);
            }
        }
    };
    let h = VnetHdr::default();
    let s = frame([0xff; 6], mac(1), 1, 60);
    a.send(&h, &s);
    run_all(&mut shards);
    assert_eq!(frames(&mut b), vec![s.clone()]);
    assert_eq!(frames(&mut d), vec![tagged(&s, 10)]);
    assert!(c.received().is_empty());
    // From the trunk port, tagged 10, to a (learned behind the shards' trunk in VLAN 10).
    let r = frame(mac(1), mac(4), 2, 60);
    d.send(&h, &tagged(&r, 10));
    run_all(&mut shards);
    assert_eq!(frames(&mut a), vec![r]);
    assert!(b.received().is_empty() && c.received().is_empty());
    // Tagged 20 to a's address: not learned in VLAN 20, flooded to c (untagged) and over
    // to the other shard, where no port carries VLAN 20.
    let r20 = frame(mac(1), mac(4), 3, 60);
    d.send(&h, &tagged(&r20, 20));
    run_all(&mut shards);
    assert_eq!(frames(&mut c), vec![r20]);
    assert!(a.received().is_empty() && b.received().is_empty());
    // a's shard learned mac(4) in VLAN 20 behind its trunk; once no port carries VLAN 20,
    // that is forgotten too.
    let in20 = |f: &Fabric| f.macs(now).iter().filter(|e| e.vlan == 20).count();
    assert_eq!(in20(&shards[0].0), 1);
    shards[0].0.set_vlan(2, None);
    assert_eq!(in20(&shards[0].0), 1, "d still carries VLAN 20");
    shards[0].0.set_vlan(3, Some(trunk_of("10", None)));
    assert_eq!(in20(&shards[0].0), 0);
}

/// An MTU-sized frame gets its tag on a trunk with that MTU (MTU + 18 covers it); one that
/// would be longer is dropped, `too_big`.
#[test]
fn a_tag_fits_within_the_mtu_allowance() {
    let mut f = switch();
    let (mut a, pa) = fe(0, MODERN);
    let (mut t, pt) = MockFe::with_mtu(
        1,
        MODERN,
        256,
        EgressConfig::hold(HoldPolicy::Bounded(HOLD)),
        4096,
        1,
        Some(1500),
    );
    f.set_vlan(0, Some(VlanMode::Access(5)));
    f.set_vlan(1, Some(trunk_of("5", None)));
    let mut ports = vec![pa, pt];
    let now = Instant::now();
    let h = VnetHdr::default();
    let full = frame([0xff; 6], mac(1), 1, 1514);
    a.send(&h, &full);
    a.send(&h, &frame([0xff; 6], mac(1), 2, 1515));
    run(&mut f, &mut ports, now);
    assert_eq!(frames(&mut t), vec![tagged(&full, 5)], "1518 bytes tagged");
    assert_eq!(get(&a.stats.drops[DropReason::TooBig as usize]), 1);
}
