//! The switch path in one thread, for instruction counting under callgrind: pvnet's ports over
//! mock rings (the driver sides played here, outside the counted functions), moving 64-byte
//! frames (+12-byte header) in rounds of 32:
//!
//! * `switch_vhost`: the learning switch, frontend A to frontend B (B's address learned);
//! * `forward_vhost`: a fixed wire, frontend A to frontend B (`pvnet backend --role forward`);
//! * `gen_vhost`: a generator into a frontend (`--role gen`, a switch's gen port);
//! * `vhost_sink`: a frontend into a sink (`--role sink`);
//! * `switch_gen_vhost`, `switch_vhost_sink`: the same two through the learning switch (what
//!   `pvnet switch`'s gen and sink ports do, e.g. beside DPDK in `bench_dpdk.sh`);
//! * `switch_gen_vhost_mq`: a gen port (64 flows) through the learning switch into a frontend
//!   with 2 queue pairs (each frame steered to a ring by its flow hash);
//! * `switch_vhost_packed`, `switch_gen_vhost_packed`: `switch_vhost` and `switch_gen_vhost`
//!   with the frontends' rings in the packed format;
//! * `chain{2,3,8}_sink`, `chain{2,3,8}_sink_packed`: a frontend into a sink port through the
//!   learning switch, each packet a chain of 2, 3 or 8 descriptors (the header's 12 bytes,
//!   then 64-byte segments of the frame), split and packed: what a chain costs beyond its
//!   first descriptor; `ind{2,3,8}_sink[_packed]`: the same chains as indirect tables, as
//!   DPDK's virtio PMD and Linux's virtio_net send them when INDIRECT_DESC is negotiated
//!   (the packed tables' header entry flagged WRITE, as DPDK leaves it);
//! * `switch_vhost_vlan_insert`, `switch_vhost_vlan_strip`: `switch_vhost` from an access port
//!   of VLAN 10 to a trunk of it (the tag inserted into each frame on the way) and back (the
//!   tag removed);
//! * `switch_trunk_vhost`: `switch_vhost` with A and B on two shards (`--workers 2`): A's
//!   shard copies the frame into the trunk ring, B's shard copies it out into B (both rounds
//!   counted, run one after the other in this one thread): what crossing workers costs.
//!
//! `scripts/callgrind.sh` runs it for N and 2N packets and divides the difference of each
//! function's inclusive count by N, so set-up cost cancels.

use pvnet_dataplane::{
    trunk_link, AnyPort, Counting, EgressConfig, Fabric, GenPort, GenSpec, HoldPolicy, Policy,
    PortStats, Router, SinkPort, SwitchConfig, TrunkPort, VhostConfig, VhostPort, VlanMode,
    WakeCost, Wire, TRUNK_RING_BYTES,
};
use pvnet_net::features::{VIRTIO_F_VERSION_1, VIRTIO_NET_F_MRG_RXBUF};
use pvnet_net::QueueIndex;
use pvnet_vhost::backend::StartedQueue;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::mock::MockQueue;
use virtq::{Buf, Direction, DriverQueue, Format};

const BATCH: u16 = 32;
const PKT: u32 = 76;
const BUF: u32 = 2048;

/// A frontend played by the harness: a transmit ring it fills, a receive ring it posts to.
struct Fe {
    txm: MockQueue,
    tx: DriverQueue,
    /// The transmit ring's next descriptor slot (packed: where the driver writes next).
    slot: u16,
    rxm: MockQueue,
    rx: DriverQueue,
    mac: [u8; 6],
    /// Bytes per transmitted packet (the header's 12 and the frame).
    len: u32,
    /// Whether the driver reads the header of each packet it receives, as a real one does
    /// (the coherence count; the instruction count leaves the driver's side out anyway).
    touch: bool,
    /// Where a packet's header starts in its buffer: 0, or 52 as DPDK's virtio PMD lays
    /// buffers out (the 12-byte header alone at the end of a line, the frame from the next),
    /// the transmit header then written once and left as it is, as the PMD's
    /// `ASSIGN_UNLESS_EQUAL` leaves it (the coherence count).
    hdr_at: u32,
}

/// The vhost port settings every harness frontend's port runs with (always polled).
fn port_config() -> VhostConfig {
    VhostConfig {
        tx_policy: Policy::Busy,
        rx_policy: Policy::Busy,
        batch: usize::from(BATCH),
        call_bound: Duration::from_micros(150),
        egress: EgressConfig::hold(HoldPolicy::Forever),
        wake: WakeCost::FALLBACK,
    }
}

/// A receive ring with all its buffers posted: the harness's side, the device's side.
fn posted_rx(format: Format) -> (MockQueue, DriverQueue, virtq::DeviceQueue) {
    let rxm = MockQueue::new(256, BUF);
    let (mut rx, rxd) = rxm
        .pair_in(format, Direction::DeviceWrites, true)
        .expect("rx");
    for i in 0..256 {
        rx.add_one(Buf {
            addr: rxm.buf(i),
            len: BUF,
            write: true,
        })
        .expect("post");
    }
    rx.publish();
    (rxm, rx, rxd)
}

fn fe(id: u32, last: u8) -> (Fe, AnyPort) {
    fe_in(id, last, Format::Split)
}

/// A frontend whose two rings are in `format`.
fn fe_in(id: u32, last: u8, format: Format) -> (Fe, AnyPort) {
    let mut port = VhostPort::new(id, port_config(), vec![Arc::default()]);
    let features = VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF;
    let txm = MockQueue::new(256, BUF);
    let (tx, txd) = txm
        .pair_in(format, Direction::DeviceReads, true)
        .expect("tx");
    let (rxm, rx, rxd) = posted_rx(format);
    for (index, queue) in [(1u16, txd), (0, rxd)] {
        port.start(StartedQueue {
            index,
            queue,
            kick: None,
            call: None,
            err: None,
            mergeable: true,
            features,
            iotlb: None,
            mtu: None,
        });
    }
    let mac = [2, 0, 0, 0, 0, last];
    (
        Fe {
            txm,
            tx,
            slot: 0,
            rxm,
            rx,
            mac,
            len: PKT,
            touch: false,
            hdr_at: 0,
        },
        AnyPort::Vhost(port),
    )
}

impl Fe {
    /// Offers a batch of frames to `dst` (outside the counted functions).
    fn offer(&mut self, dst: [u8; 6]) {
        let mut b = vec![0u8; self.len as usize];
        b[12..18].copy_from_slice(&dst);
        b[18..24].copy_from_slice(&self.mac);
        self.post(&b);
    }

    /// [`offer`](Self::offer) with an 802.1Q tag of VLAN `vid` after the addresses (the frame
    /// the same length).
    fn offer_vlan(&mut self, dst: [u8; 6], vid: u16) {
        let mut b = vec![0u8; self.len as usize];
        b[12..18].copy_from_slice(&dst);
        b[18..24].copy_from_slice(&self.mac);
        b[24..26].copy_from_slice(&0x8100u16.to_be_bytes());
        b[26..28].copy_from_slice(&vid.to_be_bytes());
        self.post(&b);
    }

    /// A batch of the frame `b` (header included) onto the transmit ring.
    fn post(&mut self, b: &[u8]) {
        for _ in 0..BATCH {
            let id = self.tx.next_free().expect("free");
            let at = self.txm.buf(id) + u64::from(self.hdr_at);
            // The header (all zero) written once, the region starting zeroed: afterwards
            // only compared (read), as the PMD's `ASSIGN_UNLESS_EQUAL` does.
            let from = if self.hdr_at > 0 { 12 } else { 0 };
            if from > 0 {
                let mut hdr = [0u8; 12];
                self.txm.peek(at, &mut hdr);
                black_box(hdr);
            }
            self.txm.poke(at + from as u64, &b[from..]);
            self.tx
                .add_one(Buf {
                    addr: at,
                    len: self.len,
                    write: false,
                })
                .expect("add");
        }
        self.tx.publish();
        self.tx.used_available().expect("used");
        while self.tx.pop_used().expect("pop").is_some() {}
    }

    /// Offers a batch of frames to `dst` as chains of `ndesc` descriptors: the header, then
    /// `ndesc - 1` segments of 64 bytes (outside the counted functions). With `indirect`, each
    /// chain is an indirect table in its slot's buffer (from byte 1024; the header and data
    /// from byte 0), the ring descriptor flagged INDIRECT by hand after the publish.
    fn offer_chains(&mut self, dst: [u8; 6], ndesc: u16, indirect: bool) {
        let data = 64 * u32::from(ndesc - 1);
        let mut b = vec![0u8; (12 + data) as usize];
        b[12..18].copy_from_slice(&dst);
        b[18..24].copy_from_slice(&self.mac);
        let packed = self.tx.format() == Format::Packed;
        let mut flagged = Vec::new();
        for _ in 0..BATCH {
            let id = self.tx.next_free().expect("free");
            let at = self.txm.buf(id);
            self.txm.poke(at, &b);
            // header, then the segments, each 64 bytes further (within this slot's buffer)
            let bufs: Vec<Buf> = (0..ndesc)
                .map(|k| Buf {
                    addr: if k == 0 {
                        at
                    } else {
                        at + 12 + 64 * u64::from(k - 1)
                    },
                    len: if k == 0 { 12 } else { 64 },
                    write: false,
                })
                .collect();
            if indirect {
                let table = at + 1024;
                let mut t = Vec::new();
                for (k, d) in (0u16..).zip(&bufs) {
                    let last = k + 1 == ndesc;
                    t.extend_from_slice(&d.addr.to_le_bytes());
                    t.extend_from_slice(&d.len.to_le_bytes());
                    if packed {
                        // id, flags: DPDK's header entry keeps WRITE (2) from its set-up
                        t.extend_from_slice(&k.to_le_bytes());
                        t.extend_from_slice(&(if k == 0 { 2u16 } else { 0 }).to_le_bytes());
                    } else {
                        // flags: NEXT (1) but the last; next: the following entry
                        t.extend_from_slice(&u16::from(!last).to_le_bytes());
                        t.extend_from_slice(&(k + 1).to_le_bytes());
                    }
                }
                self.txm.poke(table, &t);
                let slot = self.slot;
                self.tx
                    .add_one(Buf {
                        addr: table,
                        len: 16 * u32::from(ndesc),
                        write: false,
                    })
                    .expect("add");
                flagged.push(if packed { slot } else { id });
                self.slot = (self.slot + 1) % 256;
            } else {
                self.tx.add_chain(&bufs).expect("add");
                self.slot = (self.slot + ndesc) % 256;
            }
        }
        self.tx.publish();
        // INDIRECT (4) into the flags the driver published (split: bytes 12-13 of the
        // descriptor; packed: 14-15)
        let off = if packed { 14 } else { 12 };
        for d in flagged {
            let at = self.txm.addrs.desc + 16 * u64::from(d) + off;
            let mut f = [0u8; 2];
            self.txm.peek(at, &mut f);
            self.txm
                .poke(at, &(u16::from_le_bytes(f) | 4).to_le_bytes());
        }
    }

    /// Takes what arrived and posts the buffers again.
    fn drain(&mut self) {
        self.rx.used_available().expect("used");
        while let Some((id, _)) = self.rx.pop_used().expect("pop") {
            let at = self.rxm.buf(id) + u64::from(self.hdr_at);
            if self.touch {
                let mut hdr = [0u8; 12];
                self.rxm.peek(at, &mut hdr);
                black_box(hdr);
            }
            self.rx
                .add_one(Buf {
                    addr: at,
                    len: BUF - self.hdr_at,
                    write: true,
                })
                .expect("repost");
        }
        self.rx.publish();
        self.tx.used_available().expect("used");
        while self.tx.pop_used().expect("pop").is_some() {}
    }
}

/// Frontends A and B in `format` on the learning switch, B's address learned (B spoke first,
/// so A's frames go to it unicast).
fn learned_pair(format: Format, now: Instant) -> (Fe, Fe, Vec<AnyPort>, Fabric) {
    let (mut a, pa) = fe_in(0, 1, format);
    let (mut b, pb) = fe_in(1, 2, format);
    let mut ports = vec![pa, pb];
    let mut f = Fabric::new(Router::learning(SwitchConfig::default()), BATCH);
    b.offer(a.mac);
    f.round(&mut ports, now);
    a.drain();
    b.drain();
    (a, b, ports, f)
}

/// A frontend in `format` and a gen port sending to it, on the learning switch.
fn gen_on_switch(format: Format) -> (Fe, Vec<AnyPort>, Fabric) {
    let (b, pb) = fe_in(1, 2, format);
    let gen = gen_to(5, b.mac);
    let f = Fabric::new(Router::learning(SwitchConfig::default()), BATCH);
    (b, vec![pb, gen], f)
}

/// The counted functions: one round each, a distinct constant each so that they are not
/// merged into one symbol (their bodies are otherwise the same).
macro_rules! counted {
    ($($name:ident = $k:literal),*) => {$(
        #[inline(never)]
        fn $name(f: &mut Fabric, ports: &mut [AnyPort], now: Instant) -> usize {
            f.round(ports, now) + black_box($k)
        }
    )*};
}

counted!(
    switch_vhost = 0,
    forward_vhost = 1,
    gen_vhost = 2,
    vhost_sink = 3,
    switch_gen_vhost = 4,
    switch_gen_vhost_mq = 7,
    switch_vhost_sink = 5,
    switch_vhost_packed = 8,
    switch_gen_vhost_packed = 9,
    chain2_sink = 10,
    chain3_sink = 11,
    chain8_sink = 12,
    chain2_sink_packed = 13,
    chain3_sink_packed = 14,
    chain8_sink_packed = 15,
    ind2_sink = 16,
    ind3_sink = 17,
    ind8_sink = 18,
    ind2_sink_packed = 19,
    ind3_sink_packed = 20,
    ind8_sink_packed = 21,
    switch_vhost_vlan_insert = 22,
    switch_vhost_vlan_strip = 23
);

type Counted = fn(&mut Fabric, &mut [AnyPort], Instant) -> usize;

/// A frontend in `format` into a sink port through the learning switch, each packet a chain
/// of `ndesc` descriptors (an indirect table if `indirect`), `rounds` batches counted by `f`.
fn chains_to_sink(format: Format, ndesc: u16, indirect: bool, rounds: u64, f: Counted) -> usize {
    let (mut a, pa) = fe_in(0, 1, format);
    let took = Arc::<PortStats>::default();
    let sink = AnyPort::Sink(SinkPort::new(6, took.clone(), Counting::Own, 2048));
    let mut ports = vec![pa, sink];
    let mut fab = Fabric::new(Router::learning(SwitchConfig::default()), BATCH);
    let now = Instant::now();
    let mut total = 0;
    for _ in 0..rounds {
        a.offer_chains([2, 0, 0, 0, 0, 9], ndesc, indirect);
        // Rounds until every chain is taken (a port that takes fewer a round pays for more
        // rounds); one that stops taking them (its queue stopped) ends the path.
        for k in 0.. {
            total += f(&mut fab, &mut ports, now);
            a.drain();
            if a.tx.in_flight() == 0 {
                break;
            }
            if k == 16 {
                eprintln!("{format:?} chains of {ndesc} (indirect {indirect}): not taken; skipped");
                return total;
            }
        }
    }
    let sunk = took.tx_packets.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        sunk,
        rounds * u64::from(BATCH),
        "{format:?} {ndesc} {indirect}"
    );
    total
}

/// 64-byte frames to `dst`, as fast as they may go, one flow.
fn gen_spec(dst: [u8; 6]) -> GenSpec {
    GenSpec {
        frame_len: PKT as usize - 12,
        rate: 0,
        duration: None,
        delay: Duration::ZERO,
        src: [2, 0, 0, 0, 0, 1],
        dst,
        flows: 1,
    }
}

/// A generator of 64-byte frames to `dst`, as fast as it may.
fn gen_to(id: u32, dst: [u8; 6]) -> AnyPort {
    AnyPort::Gen(GenPort::new(
        id,
        Arc::default(),
        gen_spec(dst),
        Counting::Own,
    ))
}

/// A frontend with `pairs` receive rings posted full (its transmit rings stay empty).
struct FeMq {
    rx: Vec<(MockQueue, DriverQueue)>,
}

fn fe_mq(id: u32, pairs: u16) -> (FeMq, AnyPort) {
    let mut port = VhostPort::new(
        id,
        port_config(),
        (0..pairs).map(|_| Arc::default()).collect(),
    );
    let features = VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF;
    let mut rxs = Vec::new();
    for k in 0..pairs {
        let (rxm, rx, rxd) = posted_rx(Format::Split);
        port.start(StartedQueue {
            index: QueueIndex::rx(k).0,
            queue: rxd,
            kick: None,
            call: None,
            err: None,
            mergeable: true,
            features,
            iotlb: None,
            mtu: None,
        });
        rxs.push((rxm, rx));
    }
    (FeMq { rx: rxs }, AnyPort::Vhost(port))
}

impl FeMq {
    fn drain(&mut self) {
        for (rxm, rx) in &mut self.rx {
            rx.used_available().expect("used");
            while let Some((id, _)) = rx.pop_used().expect("pop") {
                rx.add_one(Buf {
                    addr: rxm.buf(id),
                    len: BUF,
                    write: true,
                })
                .expect("repost");
            }
            rx.publish();
        }
    }
}

/// Both shards' rounds of the trunk path.
#[inline(never)]
fn switch_trunk_vhost(f: &mut [Fabric; 2], p: &mut [Vec<AnyPort>; 2], now: Instant) -> usize {
    let [f1, f2] = f;
    let [p1, p2] = p;
    f1.round(p1, now) + f2.round(p2, now) + black_box(6)
}

/// Shard ends of a trunk between two shards (rings of `pvnet switch --workers`).
fn trunks() -> (AnyPort, AnyPort) {
    let (at_a, at_b) = trunk_link(TRUNK_RING_BYTES);
    let mk = |id, r| {
        AnyPort::Trunk(TrunkPort::new(
            id,
            Arc::default(),
            r,
            pvnet_vhost::Notifier::new().expect("eventfd"),
            Arc::default(),
            WakeCost::FALLBACK,
        ))
    };
    (mk((100, 1), at_a), mk((101, 0), at_b))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("coherence") {
        coherence(&args[2..]);
        return;
    }
    let packets: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rounds = packets / u64::from(BATCH);
    let now = Instant::now();
    let mut total = 0usize;

    // The learning switch.
    let (mut a, mut b, mut ports, mut f) = learned_pair(Format::Split, now);
    for _ in 0..rounds {
        a.offer(b.mac);
        total += switch_vhost(&mut f, &mut ports, now);
        b.drain();
    }

    // A fixed wire A -> B.
    let (mut a, pa) = fe(0, 1);
    let (mut b, pb) = fe(1, 2);
    let mut ports = vec![pa, pb];
    let mut f = Fabric::new(Router::Fixed(vec![(0, Wire::To(1))]), BATCH);
    for _ in 0..rounds {
        a.offer(b.mac);
        total += forward_vhost(&mut f, &mut ports, now);
        b.drain();
    }

    // A generator into a frontend.
    let (mut b, pb) = fe(1, 2);
    let gen = gen_to(0, b.mac);
    let mut ports = vec![gen, pb];
    let mut f = Fabric::new(Router::Fixed(vec![(0, Wire::To(1))]), BATCH);
    for _ in 0..rounds {
        total += gen_vhost(&mut f, &mut ports, now);
        b.drain();
    }

    // A frontend into a sink.
    let (mut a, pa) = fe(0, 1);
    let sink = AnyPort::Sink(SinkPort::new(1, Arc::default(), Counting::Own, 2048));
    let mut ports = vec![pa, sink];
    let mut f = Fabric::new(Router::Fixed(vec![(0, Wire::To(1))]), BATCH);
    for _ in 0..rounds {
        a.offer([2, 0, 0, 0, 0, 9]);
        total += vhost_sink(&mut f, &mut ports, now);
        a.drain();
    }
    // Through the learning switch: a gen port into a frontend, a frontend into a sink port.
    let (mut b, mut ports, mut f) = gen_on_switch(Format::Split);
    for _ in 0..rounds {
        total += switch_gen_vhost(&mut f, &mut ports, now);
        b.drain();
    }
    let (mut a, pa) = fe(0, 1);
    let sink = AnyPort::Sink(SinkPort::new(6, Arc::default(), Counting::Own, 2048));
    let mut ports = vec![pa, sink];
    let mut f = Fabric::new(Router::learning(SwitchConfig::default()), BATCH);
    for _ in 0..rounds {
        a.offer([2, 0, 0, 0, 0, 9]);
        total += switch_vhost_sink(&mut f, &mut ports, now);
        a.drain();
    }
    // VLANs: A an access port of VLAN 10, B a trunk of it; each learned in VLAN 10 first.
    let (mut a, pa) = fe_in(0, 1, Format::Split);
    let (mut b, pb) = fe_in(1, 2, Format::Split);
    let mut ports = vec![pa, pb];
    let mut f = Fabric::new(Router::learning(SwitchConfig::default()), BATCH);
    f.set_vlan(0, Some(VlanMode::Access(10)));
    f.set_vlan(
        1,
        VlanMode::from_keys(None, Some("10"), None).expect("trunk"),
    );
    b.offer_vlan(a.mac, 10);
    f.round(&mut ports, now);
    a.drain();
    b.drain();
    a.offer(b.mac);
    f.round(&mut ports, now);
    a.drain();
    b.drain();
    for _ in 0..rounds {
        a.offer(b.mac);
        total += switch_vhost_vlan_insert(&mut f, &mut ports, now);
        b.drain();
    }
    for _ in 0..rounds {
        b.offer_vlan(a.mac, 10);
        total += switch_vhost_vlan_strip(&mut f, &mut ports, now);
        a.drain();
    }
    // The packed ring: the learning switch frontend to frontend, and a gen port into one.
    let (mut a, mut b, mut ports, mut f) = learned_pair(Format::Packed, now);
    for _ in 0..rounds {
        a.offer(b.mac);
        total += switch_vhost_packed(&mut f, &mut ports, now);
        b.drain();
    }
    let (mut b, mut ports, mut f) = gen_on_switch(Format::Packed);
    for _ in 0..rounds {
        total += switch_gen_vhost_packed(&mut f, &mut ports, now);
        b.drain();
    }

    // Chains of 2, 3 and 8 descriptors into a sink, direct and as indirect tables.
    let paths: [(Format, u16, bool, Counted); 12] = [
        (Format::Split, 2, false, chain2_sink),
        (Format::Split, 3, false, chain3_sink),
        (Format::Split, 8, false, chain8_sink),
        (Format::Packed, 2, false, chain2_sink_packed),
        (Format::Packed, 3, false, chain3_sink_packed),
        (Format::Packed, 8, false, chain8_sink_packed),
        (Format::Split, 2, true, ind2_sink),
        (Format::Split, 3, true, ind3_sink),
        (Format::Split, 8, true, ind8_sink),
        (Format::Packed, 2, true, ind2_sink_packed),
        (Format::Packed, 3, true, ind3_sink_packed),
        (Format::Packed, 8, true, ind8_sink_packed),
    ];
    for (format, ndesc, indirect, f) in paths {
        total += chains_to_sink(format, ndesc, indirect, rounds, f);
    }

    // A gen port spreading 64 flows into a frontend with 2 queue pairs.
    let (mut b, pb) = fe_mq(1, 2);
    let g = AnyPort::Gen(GenPort::new(
        5,
        Arc::default(),
        GenSpec {
            flows: 64,
            ..gen_spec([2, 0, 0, 0, 0, 2])
        },
        Counting::Own,
    ));
    let mut ports = vec![pb, g];
    let mut f = Fabric::new(Router::learning(SwitchConfig::default()), BATCH);
    for _ in 0..rounds {
        total += switch_gen_vhost_mq(&mut f, &mut ports, now);
        b.drain();
    }

    // Frontend A on one shard, B on another, joined by a trunk.
    let (mut a, pa) = fe(0, 1);
    let (mut b, pb) = fe(1, 2);
    let (ta, tb) = trunks();
    let mut f = [
        Fabric::new(Router::learning(SwitchConfig::default()), BATCH),
        Fabric::new(Router::learning(SwitchConfig::default()), BATCH),
    ];
    let mut p = [vec![pa, ta], vec![pb, tb]];
    b.offer(a.mac);
    switch_trunk_vhost(&mut f, &mut p, now);
    a.drain();
    b.drain();
    for _ in 0..rounds {
        a.offer(b.mac);
        total += switch_trunk_vhost(&mut f, &mut p, now);
        b.drain();
    }
    println!("{packets} packets per path, {} moved", black_box(total));
}

/// `switchpath coherence <path> <split|packed> <frame bytes> <packets>`: one path, for the
/// coherence count (`scripts/coherence.sh` runs it under valgrind's lackey). The paths:
/// `v2h` (a frontend into a sink port), `h2v` (a gen port into a frontend), `bounce` (frontend
/// A to frontend B through the learning switch) and `wire` (the same through a fixed wire),
/// the learning switch in the first three as `pvnet switch` runs them beside DPDK. Every
/// hand-over between the two sides is marked ([`virtq::trace`]); so are the counted window,
/// after two laps of the rings (the lines are warm), and the rings' host addresses, printed
/// for the analyser, with the markers' and the window's packets.
fn coherence(args: &[String]) {
    use virtq::trace::{mark, Mark};
    let usage =
        "usage: switchpath coherence <v2h|h2v|bounce|wire> <split|packed> <frame bytes> <packets>";
    let [path, format, frame, packets] = args else {
        panic!("{usage}");
    };
    let format = match format.as_str() {
        "split" => Format::Split,
        "packed" => Format::Packed,
        _ => panic!("{usage}"),
    };
    let frame: u32 = frame.parse().expect(usage);
    let rounds = packets.parse::<u64>().expect(usage) / u64::from(BATCH);
    let now = Instant::now();
    let (at, stride) = virtq::trace::marks();
    println!("marks {at:#x} {stride}");
    let dst = [2, 0, 0, 0, 0, 9];
    let (mut fes, mut ports, mut fab) = match path.as_str() {
        "v2h" => {
            let (a, pa) = fe_in(0, 1, format);
            let sink = AnyPort::Sink(SinkPort::new(6, Arc::default(), Counting::Own, 2048));
            let fab = Fabric::new(Router::learning(SwitchConfig::default()), BATCH);
            (vec![a], vec![pa, sink], fab)
        }
        "h2v" => {
            let (b, pb) = fe_in(1, 2, format);
            let spec = GenSpec {
                frame_len: frame as usize,
                ..gen_spec(b.mac)
            };
            let gen = AnyPort::Gen(GenPort::new(5, Arc::default(), spec, Counting::Own));
            let fab = Fabric::new(Router::learning(SwitchConfig::default()), BATCH);
            (vec![b], vec![pb, gen], fab)
        }
        "bounce" => {
            let (a, b, ports, fab) = learned_pair(format, now);
            (vec![a, b], ports, fab)
        }
        "wire" => {
            let (a, pa) = fe_in(0, 1, format);
            let (b, pb) = fe_in(1, 2, format);
            let fab = Fabric::new(Router::Fixed(vec![(0, Wire::To(1))]), BATCH);
            (vec![a, b], vec![pa, pb], fab)
        }
        _ => panic!("{usage}"),
    };
    for (k, fe) in fes.iter_mut().enumerate() {
        fe.len = frame + 12;
        fe.touch = true;
        fe.hdr_at = 52;
        for (ring, m) in [("tx", &fe.txm), ("rx", &fe.rxm)] {
            println!(
                "queue fe{k}.{ring} {format:?} {:#x} {:#x} {:#x} {:#x} {} {} {:#x}",
                m.host(m.addrs.desc),
                m.host(m.addrs.avail),
                m.host(m.addrs.used),
                m.host(m.bufs),
                m.buf_size,
                m.size,
                m.host(m.bufs) + usize::from(m.size) * m.buf_size as usize,
            );
        }
    }
    let warm = 2 * 256 / u64::from(BATCH);
    let to = if fes.len() == 2 { fes[1].mac } else { dst };
    mark(Mark::Driver);
    for round in 0..warm + rounds {
        if round == warm {
            mark(Mark::Begin);
        }
        if path != "h2v" {
            fes[0].offer(to);
        }
        mark(Mark::Device);
        black_box(fab.round(&mut ports, now));
        mark(Mark::Driver);
        fes.last_mut().expect("a frontend").drain();
    }
    mark(Mark::End);
    println!("packets {}", rounds * u64::from(BATCH));
}
