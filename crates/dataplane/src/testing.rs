//! Test support: a frontend played by the test over mock rings, behind a real [`VhostPort`],
//! and a receiver that records what a port hands it.

use crate::egress::{EgressConfig, HoldPolicy};
use crate::pkt::{Pkt, PortId};
use crate::poll::{Policy, WakeCost};
use crate::port::vhost::{VhostConfig, VhostPort};
use crate::port::{AnyPort, Ingress};
use crate::stats::PortStats;
use pvnet_net::features::{VIRTIO_F_VERSION_1, VIRTIO_NET_F_MRG_RXBUF};
use pvnet_net::{hdr_len, QueueIndex, VnetHdr};
use pvnet_vhost::backend::StartedQueue;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use virtq::mock::MockQueue;
use virtq::{Armed, Buf, Direction, DriverQueue, Format};

/// Receive buffer size of a mock frontend.
pub const BUF: u32 = 2048;
/// Features of a modern frontend without offloads.
pub const MODERN: u64 = VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF;

/// The settings tests run vhost ports with.
pub fn vhost_config(hold: HoldPolicy) -> VhostConfig {
    VhostConfig {
        tx_policy: Policy::Notify,
        rx_policy: Policy::Notify,
        batch: 64,
        call_bound: Duration::from_micros(150),
        egress: EgressConfig::hold(hold),
        wake: WakeCost::FALLBACK,
    }
}

/// A frontend played by the test: per queue pair, a transmit ring it fills and a receive
/// ring it posts to. The methods without a pair index use pair 0.
#[allow(missing_debug_implementations)]
pub struct MockFe {
    /// Its port's counters (pair 0's).
    pub stats: Arc<PortStats>,
    /// Each pair's counters.
    pub pair_stats: Vec<Arc<PortStats>>,
    /// Bytes of its virtio-net header.
    pub hdr_len: u32,
    pairs: Vec<MockPair>,
    /// Bytes of each receive buffer it posts.
    buf: u32,
}

/// One queue pair of a [`MockFe`].
struct MockPair {
    txm: MockQueue,
    tx: DriverQueue,
    rxm: MockQueue,
    rx: DriverQueue,
    next_tx: u16,
}

impl MockFe {
    /// A frontend that acked `features`, with `posted` receive buffers; and its port.
    pub fn new(id: PortId, features: u64, posted: u16, hold: HoldPolicy) -> (Self, AnyPort) {
        Self::with_egress(id, features, posted, EgressConfig::hold(hold))
    }

    /// [`new`](Self::new) with an egress configuration of its own (a queue, DQL).
    pub fn with_egress(
        id: PortId,
        features: u64,
        posted: u16,
        egress: EgressConfig,
    ) -> (Self, AnyPort) {
        Self::with_buffers(id, features, posted, egress, BUF)
    }

    /// [`with_egress`](Self::with_egress) with receive buffers of `buf` bytes.
    pub fn with_buffers(
        id: PortId,
        features: u64,
        posted: u16,
        egress: EgressConfig,
        buf: u32,
    ) -> (Self, AnyPort) {
        Self::with_pairs(id, features, posted, egress, buf, 1)
    }

    /// A frontend with `pairs` queue pairs (`posted` receive buffers on each), all started.
    pub fn with_pairs(
        id: PortId,
        features: u64,
        posted: u16,
        egress: EgressConfig,
        buf: u32,
        pairs: u16,
    ) -> (Self, AnyPort) {
        Self::with_mtu(id, features, posted, egress, buf, pairs, None)
    }

    /// [`with_pairs`](Self::with_pairs) whose queues start with an MTU (`NET_SET_MTU`).
    pub fn with_mtu(
        id: PortId,
        features: u64,
        posted: u16,
        egress: EgressConfig,
        buf: u32,
        pairs: u16,
        mtu: Option<u16>,
    ) -> (Self, AnyPort) {
        Self::build(id, features, posted, egress, (buf, pairs, mtu, false))
    }

    /// [`with_egress`](Self::with_egress) whose receive ring has EVENT_IDX, as a Linux guest's
    /// has: it can ask to be interrupted at a used entry ([`arm_rx`](Self::arm_rx)).
    pub fn with_event_idx(
        id: PortId,
        features: u64,
        posted: u16,
        egress: EgressConfig,
    ) -> (Self, AnyPort) {
        Self::build(id, features, posted, egress, (BUF, 1, None, true))
    }

    /// Every constructor's: `(buf, pairs, mtu, rx_event_idx)`.
    fn build(
        id: PortId,
        features: u64,
        posted: u16,
        egress: EgressConfig,
        (buf, pairs, mtu, rx_event_idx): (u32, u16, Option<u16>, bool),
    ) -> (Self, AnyPort) {
        let pair_stats: Vec<Arc<PortStats>> = (0..pairs).map(|_| Arc::default()).collect();
        let mut cfg = vhost_config(HoldPolicy::Forever);
        cfg.egress = egress;
        let mut port = VhostPort::new(id, cfg, pair_stats.clone());
        let mut mocks = Vec::new();
        for k in 0..pairs {
            let txm = MockQueue::new(64, 65536 + 64);
            let (tx, txd) = txm
                .pair_in(Format::Split, Direction::DeviceReads, false)
                .expect("tx ring");
            let rxm = MockQueue::new(256, buf);
            let (rx, rxd) = rxm
                .pair_in(Format::Split, Direction::DeviceWrites, rx_event_idx)
                .expect("rx ring");
            for (q, queue) in [(QueueIndex::tx(k), txd), (QueueIndex::rx(k), rxd)] {
                port.start(StartedQueue {
                    index: q.0,
                    queue,
                    kick: None,
                    call: None,
                    err: None,
                    mergeable: features & VIRTIO_NET_F_MRG_RXBUF != 0,
                    features,
                    iotlb: None,
                    mtu,
                });
            }
            mocks.push(MockPair {
                txm,
                tx,
                rxm,
                rx,
                next_tx: 0,
            });
        }
        let mut fe = Self {
            stats: pair_stats[0].clone(),
            pair_stats,
            hdr_len: hdr_len(features),
            pairs: mocks,
            buf,
        };
        for k in 0..usize::from(pairs) {
            fe.post_on(k, posted);
        }
        (fe, AnyPort::Vhost(port))
    }

    /// Transmit descriptors free (what [`send`](Self::send) may still add).
    pub fn room(&self) -> usize {
        self.pairs[0].tx.free_count()
    }

    /// Posts `n` more receive buffers.
    pub fn post(&mut self, n: u16) {
        self.post_on(0, n);
    }

    /// Posts `n` more receive buffers on pair `k`.
    pub fn post_on(&mut self, k: usize, n: u16) {
        let (buf, p) = (self.buf, &mut self.pairs[k]);
        for _ in 0..n {
            let Some(id) = p.rx.next_free() else { break };
            p.rx.add_one(Buf {
                addr: p.rxm.buf(id),
                len: buf,
                write: true,
            })
            .expect("post");
        }
        p.rx.publish();
    }

    /// Asks to be interrupted at the next used entry of the receive ring, as Linux's NAPI does
    /// when it completes (`used_event` = its last used index), and re-checks.
    pub fn arm_rx(&mut self) -> Armed {
        self.pairs[0].rx.arm_used_notify().expect("arm")
    }

    /// Receive buffers not yet taken (delivered and waiting in the ring).
    pub fn rx_ready(&mut self) -> usize {
        usize::from(self.pairs[0].rx.used_available().expect("used"))
    }

    /// Sends `hdr ++ frame` as one descriptor (the header in this frontend's length).
    pub fn send(&mut self, hdr: &VnetHdr, frame: &[u8]) {
        self.send_on(0, hdr, frame);
    }

    /// [`send`](Self::send) on pair `k`'s transmit ring.
    pub fn send_on(&mut self, k: usize, hdr: &VnetHdr, frame: &[u8]) {
        let h = self.hdr_len as usize;
        let mut full = [0u8; VnetHdr::LEN];
        hdr.write(&mut full);
        let mut b = full[..h].to_vec();
        b.extend_from_slice(frame);
        let p = &mut self.pairs[k];
        let addr = p.txm.buf(p.next_tx);
        p.next_tx = (p.next_tx + 1) % 64;
        p.txm.poke(addr, &b);
        p.tx.add_one(Buf {
            addr,
            len: u32::try_from(b.len()).expect("fits"),
            write: false,
        })
        .expect("add");
        p.tx.publish();
    }

    /// Transmit buffers the device has returned so far.
    pub fn completed(&mut self) -> usize {
        let tx = &mut self.pairs[0].tx;
        tx.used_available().expect("used");
        let mut n = 0;
        while tx.pop_used().expect("pop").is_some() {
            n += 1;
        }
        n
    }

    /// Every packet delivered so far: (header, frame), merged buffers joined.
    pub fn received(&mut self) -> Vec<(VnetHdr, Vec<u8>)> {
        self.receive(usize::MAX)
    }

    /// Every packet delivered so far on pair `k`.
    pub fn received_on(&mut self, k: usize) -> Vec<(VnetHdr, Vec<u8>)> {
        self.receive_on(k, usize::MAX)
    }

    /// At most `max` packets delivered so far (a frontend that takes only so many per poll).
    pub fn receive(&mut self, max: usize) -> Vec<(VnetHdr, Vec<u8>)> {
        self.receive_on(0, max)
    }

    /// [`receive`](Self::receive) on pair `k`.
    pub fn receive_on(&mut self, k: usize, max: usize) -> Vec<(VnetHdr, Vec<u8>)> {
        let h = self.hdr_len as usize;
        let mut out = Vec::new();
        let mut cur: Option<(VnetHdr, Vec<u8>, u16)> = None;
        let p = &mut self.pairs[k];
        p.rx.used_available().expect("used");
        while out.len() < max || cur.is_some() {
            let Some((id, len)) = p.rx.pop_used().expect("pop used") else {
                break;
            };
            let mut b = vec![0u8; len as usize];
            p.rxm.peek(p.rxm.buf(id), &mut b);
            match cur.take() {
                None => {
                    let hdr = VnetHdr::parse_len(&b, self.hdr_len).expect("header");
                    let left = hdr.num_buffers.max(1) - 1;
                    cur = Some((hdr, b[h..].to_vec(), left));
                }
                Some((hdr, mut f, left)) => {
                    f.extend_from_slice(&b);
                    cur = Some((hdr, f, left - 1));
                }
            }
            if let Some((hdr, f, 0)) = &cur {
                out.push((*hdr, f.clone()));
                cur = None;
            }
        }
        out
    }
}

/// Reads a counter.
pub fn get(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// A receiver that keeps copies of what it is handed and takes at most `room` packets a
/// burst (the rest must wait).
#[derive(Debug, Default)]
pub struct Collect {
    /// Each packet taken: (header length, bytes).
    pub got: Vec<(u32, Vec<u8>)>,
    /// Packets it takes per burst (`usize::MAX`: all).
    pub room: usize,
    /// Whether it claims a receiver exists.
    pub present: bool,
}

impl Collect {
    /// Takes everything.
    pub fn all() -> Self {
        Self {
            got: Vec::new(),
            room: usize::MAX,
            present: true,
        }
    }
}

impl Ingress for Collect {
    fn burst(&mut self, pkts: &[Pkt<'_>], _stats: &PortStats) -> usize {
        let n = pkts.len().min(self.room);
        for p in &pkts[..n] {
            let mut b = vec![0u8; p.len as usize];
            virtq::read_segs(p.segs, 0, &mut b);
            self.got.push((p.hdr_len, b));
        }
        n
    }

    fn has_receiver(&self) -> bool {
        self.present
    }
}

/// An Ethernet frame from `src` to `dst` carrying `n` (for bench-free tests).
pub fn frame(dst: [u8; 6], src: [u8; 6], n: u8, len: usize) -> Vec<u8> {
    let mut f = vec![n; len.max(60)];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f
}

/// A UDP/IPv4 frame of `len` bytes (at least the 38 of its headers' fields set here) from
/// 10.0.0.1:`sport` to 10.0.0.2:9,
/// behind a zeroed virtio-net header of `hdr` bytes: one flow per source port (the flow hash
/// reads these fields).
pub fn udp_frame(hdr: usize, sport: u16, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; hdr + len];
    let f = &mut b[hdr..];
    f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    f[34..36].copy_from_slice(&sport.to_be_bytes());
    f[36..38].copy_from_slice(&9u16.to_be_bytes());
    b
}

/// A station address.
pub fn mac(last: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0, last]
}
