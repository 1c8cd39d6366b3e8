//! Egress queues on kernel ports, against the kernel's own queue: a tap and an `AF_PACKET`
//! port whose writes back up behind a rate-limited interface (`tbf`) hold the backlog in
//! their egress queue, and fq_codel there keeps a request/response flow's latency low under
//! a bulk stream, where a FIFO makes it wait behind the whole backlog.
//!
//! Everything runs in the test thread's private network namespace
//! ([`private_netns`](crate::sys::tap::tests::private_netns)): two frontends (a bulk sender
//! and a request/response client, played over mock rings) are wired to the kernel port; what
//! the port writes leaves through `va`, limited by `tbf` to [`RATE_MBIT`], and arrives at
//! `vb`, where the test reads it. The kernel's send buffer for the port's writes is small
//! (`sndbuf`), so the kernel's queue is short and the backlog forms in pvnet's queue. The bulk
//! sender keeps at most [`WINDOW`] frames on their way, as TCP would, fewer than the queue
//! holds: a FIFO then delays each request behind them rather than dropping it.

use super::{Fabric, Router, Wire};
use crate::egress::queue::{Qdisc, QueueConfig};
use crate::egress::{EgressConfig, HoldPolicy};
use crate::pkt::PortId;
use crate::port::kernel::{HostDev, HostIo, KernelPort};
use crate::port::AnyPort;
use crate::stats::{DropReason, PortStats};
use crate::sys::packet::PacketSock;
use crate::sys::tap::tests::{ip, private_netns};
use crate::testing::{frame, get, mac, MockFe, MODERN};
use pvnet_net::VnetHdr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The rate of the interface the kernel port's packets leave through.
const RATE_MBIT: u32 = 100;
/// Bytes of every frame.
const FRAME: usize = 1000;
/// The kernel's send buffer for the port's writes (about a dozen frames in flight).
const SNDBUF: u32 = 24 * 1024;
/// A request not answered within this counts as lost, at this latency.
const TIMEOUT: Duration = Duration::from_millis(300);
/// Most bulk frames on their way (sent, not yet arrived or dropped), as a TCP window: fewer
/// than the queue holds, so that a FIFO delays rather than drops.
const WINDOW: u64 = 600;
/// The bulk sender's and the client's station (and flow).
const BULK: u8 = 1;
const RR: u8 = 2;
const TAP: PortId = 7;

/// Runs `ip`-less traffic control: `tc ARGS...`; panics on failure.
fn tc(args: &[&str]) {
    let out = std::process::Command::new("tc")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run `tc {}`: {e} (is iproute2 installed?)", args.join(" ")));
    assert!(
        out.status.success(),
        "`tc {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// The kernel's side: the port's device (a tap in a bridge with `va`, or an `AF_PACKET`
/// socket on `va`), `va` rate-limited, and a socket on `vb` that sees what left.
fn kernel_side(tag: &str, tap: bool) -> (HostDev, PacketSock) {
    private_netns();
    let n = std::process::id() % 10000;
    let (va, vb) = (format!("pq{tag}{n}a"), format!("pq{tag}{n}b"));
    ip(&[
        "link", "add", "name", &va, "type", "veth", "peer", "name", &vb,
    ]);
    for v in [&va, &vb] {
        ip(&["link", "set", v, "up"]);
    }
    let rate = format!("{RATE_MBIT}mbit");
    tc(&[
        "qdisc", "add", "dev", &va, "root", "tbf", "rate", &rate, "burst", "4k", "limit", "4m",
    ]);
    let dev = if tap {
        let name = format!("pq{tag}{n}t");
        let t = crate::sys::tap::open(&name, false).unwrap_or_else(|e| panic!("tap: {e}"));
        t.link_up(Some(1500)).unwrap_or_else(|e| panic!("{e}"));
        let br = format!("pq{tag}{n}r");
        ip(&["link", "add", "name", &br, "type", "bridge"]);
        ip(&["link", "set", &name, "master", &br]);
        ip(&["link", "set", &va, "master", &br]);
        ip(&["link", "set", &br, "up"]);
        HostDev::Tap(t)
    } else {
        HostDev::Packet(crate::sys::packet::open(&va).unwrap_or_else(|e| panic!("{e}")))
    };
    dev.set_sndbuf(SNDBUF).unwrap_or_else(|e| panic!("{e}"));
    let seen = crate::sys::packet::open(&vb).unwrap_or_else(|e| panic!("{e}"));
    (dev, seen)
}

fn queue(qdisc: Qdisc) -> EgressConfig {
    EgressConfig {
        queue: Some(QueueConfig {
            qdisc,
            ..QueueConfig::default()
        }),
        dql: false,
        ..EgressConfig::hold(HoldPolicy::Forever)
    }
}

/// What one run measured.
#[derive(Debug)]
struct Run {
    /// Request round trips (send to arrival at `vb`), sorted; lost ones at [`TIMEOUT`].
    rtt: Vec<Duration>,
    lost: usize,
    /// Bulk frames that arrived, per second.
    bulk_pps: f64,
    /// Packets the port's egress queue took.
    queued: u64,
}

impl Run {
    /// The `pct`-th percentile.
    fn p(&self, pct: usize) -> Duration {
        let k = (self.rtt.len().saturating_sub(1) * pct).div_ceil(100);
        self.rtt[k.min(self.rtt.len() - 1)]
    }
}

/// A frame of station `src`'s flow carrying `seq` (not IP: a bridge passes it as it is; the
/// flow hash of a frame that is not IP is its addresses, so each station is one flow).
fn datagram(src: u8, seq: u32) -> Vec<u8> {
    let mut f = frame(mac(9), mac(src), 0, FRAME);
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    f
}

/// The request's sequence number if `b` (as read from `vb`, header first) is one of the
/// client's frames, and whether it is a bulk frame.
fn classify(b: &[u8]) -> (Option<u32>, bool) {
    let f = &b[12..];
    if f.len() < 18 || f[12..14] != 0x88b5u16.to_be_bytes() {
        return (None, false);
    }
    match f[11] {
        RR => (
            Some(u32::from_be_bytes([f[14], f[15], f[16], f[17]])),
            false,
        ),
        BULK => (None, true),
        _ => (None, false),
    }
}

/// A bulk sender and a request/response client through a kernel port with `qdisc`, for
/// `secs` (the first fifth not measured, while the backlog builds).
fn run(tag: &str, tap: bool, qdisc: Qdisc, secs: f64) -> Run {
    let (dev, seen) = kernel_side(tag, tap);
    let stats: Arc<PortStats> = Arc::default();
    let mut kernel = KernelPort::new(TAP, stats.clone(), dev, HostIo::Uring, false);
    kernel.set_egress(queue(qdisc));
    let (mut bulk, pb) = MockFe::new(1, MODERN, 0, HoldPolicy::Forever);
    let (mut rr, pr) = MockFe::new(2, MODERN, 0, HoldPolicy::Forever);
    let wires = vec![(1, Wire::To(TAP)), (2, Wire::To(TAP))];
    let mut f = Fabric::new(Router::Fixed(wires), 64);
    let mut ports = vec![pb, pr, AnyPort::Kernel(kernel)];
    let bulk_frame = datagram(BULK, 0);
    let hdr = VnetHdr::default();
    let (t0, total) = (Instant::now(), Duration::from_secs_f64(secs));
    let warm = t0 + total / 5;
    let (mut seq, mut asked) = (0u32, None::<Instant>);
    let (mut rtt, mut lost, mut bulk_seen) = (Vec::new(), 0, 0u64);
    let (mut bulk_sent, mut bulk_arrived) = (0u64, 0u64);
    let mut buf = vec![0u8; 2048];
    while t0.elapsed() < total {
        let now = Instant::now();
        bulk.completed();
        // Window-limited, as TCP: what the queue dropped counts as gone.
        let gone = bulk_arrived
            + get(&stats.drops[DropReason::Aqm as usize])
            + get(&stats.drops[DropReason::QueueLimit as usize]);
        while bulk.room() > 0 && bulk_sent < gone + WINDOW {
            bulk.send(&hdr, &bulk_frame);
            bulk_sent += 1;
        }
        rr.completed();
        let due = asked.is_none_or(|t| now.saturating_duration_since(t) >= TIMEOUT);
        if due {
            if asked.is_some() && now >= warm {
                rtt.push(TIMEOUT);
                lost += 1;
            }
            seq += 1;
            rr.send(&hdr, &datagram(RR, seq));
            asked = Some(now);
        }
        f.round(&mut ports, now);
        // Not a busy loop: the suite's other tests measure CPU load (a round every ~50 us is
        // still well ahead of the line's 82 us per frame).
        std::thread::sleep(Duration::from_micros(20));
        while let Ok(Some((n, _))) = seen.recv(&mut buf) {
            match classify(&buf[..n]) {
                (Some(s), _) if s == seq => {
                    if let Some(t) = asked.take() {
                        if t >= warm {
                            rtt.push(t.elapsed());
                        }
                    }
                }
                (_, true) => {
                    bulk_arrived += 1;
                    bulk_seen += u64::from(Instant::now() >= warm);
                }
                _ => {}
            }
        }
    }
    rtt.sort();
    let measured = total.as_secs_f64() * 0.8;
    Run {
        rtt,
        lost,
        bulk_pps: bulk_seen as f64 / measured,
        queued: get(&stats.queued),
    }
}

/// fq_codel on a kernel port's egress keeps a request/response flow's p99 under a bulk
/// stream; the same port with a FIFO makes each request wait behind the bulk backlog.
fn sparse_flow_under_bulk(tag: &str, tap: bool) {
    let fq = run(&format!("{tag}f"), tap, Qdisc::FqCodel, 1.0);
    let fifo = run(&format!("{tag}o"), tap, Qdisc::Fifo, 1.0);
    let line_pps = f64::from(RATE_MBIT) * 1e6 / 8.0 / (FRAME as f64 + 24.0);
    for (name, r) in [("fq_codel", &fq), ("fifo", &fifo)] {
        println!(
            "{tag} {name}: RR p50 {:?} p99 {:?} ({} requests, {} lost), bulk {:.0} pps (line {:.0}), queued {}",
            r.p(50),
            r.p(99),
            r.rtt.len(),
            r.lost,
            r.bulk_pps,
            line_pps,
            r.queued
        );
        assert!(
            r.queued > 0,
            "{tag} {name}: the backlog is held in the port's queue"
        );
        assert!(
            r.bulk_pps > line_pps * 0.5,
            "{tag} {name}: the bulk stream keeps the line busy"
        );
    }
    assert!(fq.rtt.len() >= 100, "{tag}: enough requests answered");
    assert!(fifo.rtt.len() >= 5, "{tag}: enough requests answered");
    assert_eq!(fq.lost, 0, "{tag}: fq_codel loses no request");
    assert!(
        fq.p(99) < Duration::from_millis(30),
        "{tag}: fq_codel keeps RR p99 low: {:?}",
        fq.p(99)
    );
    assert!(
        fifo.p(99) > fq.p(99) * 3,
        "{tag}: a FIFO makes requests wait behind the bulk ({:?} vs {:?})",
        fifo.p(99),
        fq.p(99)
    );
}

#[test]
fn fq_codel_on_a_tap_keeps_a_request_flows_p99_under_a_bulk_stream() {
    sparse_flow_under_bulk("t", true);
}

#[test]
fn fq_codel_on_an_af_packet_port_keeps_a_request_flows_p99_under_a_bulk_stream() {
    sparse_flow_under_bulk("p", false);
}
