//! Every port kind through the `Port` interface alone: what `rx_burst` hands out, what
//! `tx_burst` takes, what the poll-loop hooks say.

use super::gen::{GenPort, GenSpec};
use super::kernel::KernelPort;
use super::sink::{Counting, SinkPort};
use super::{AnyPort, Port};
use crate::egress::HoldPolicy;
use crate::frame;
use crate::pkt::{Pkt, Staged, TxOut};
use crate::poll::plan::{Plan, Settle};
use crate::stats::PortStats;
use crate::testing::{frame, get, mac, Collect, MockFe, MODERN};
use pvnet_net::{VnetHdr, HDR_LEN};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::Armed;
use virtq::Seg;

/// One-segment packets over `segs` (each a 12-byte header and a 64-byte frame).
fn pkts_over<'a>(segs: &'a [[Seg<'a>; 1]]) -> Vec<Pkt<'a>> {
    segs.iter()
        .map(|s| Pkt {
            segs: s,
            len: 76,
            hdr_len: HDR_LEN,
            hdr: VnetHdr::default(),
            macs: [0; 12],
            hash: 0,
            vlan: 0,
        })
        .collect()
}

fn bench_frame(seq: u64) -> Vec<u8> {
    let mut f = vec![0u8; HDR_LEN as usize + 64];
    frame::write_template(&mut f[HDR_LEN as usize..], 64, mac(1), mac(2));
    frame::set_seq(&mut f[HDR_LEN as usize..], seq);
    f
}

#[test]
fn vhost_port_hands_out_bursts_keeps_what_waits_and_delivers_in_order() {
    let (mut fe, mut port) = MockFe::new(0, MODERN, 4, HoldPolicy::Forever);
    let now = Instant::now();
    for n in 0..3 {
        fe.send(&VnetHdr::default(), &frame(mac(2), mac(1), n, 60));
    }
    // Takes two, the third waits in the ring.
    let mut c = Collect {
        room: 2,
        ..Collect::all()
    };
    assert_eq!(port.rx_burst(64, now, &mut c), 2);
    assert_eq!(fe.completed(), 2);
    c.room = usize::MAX;
    assert_eq!(port.rx_burst(64, now, &mut c), 1);
    let firsts: Vec<u8> = c.got.iter().map(|(h, b)| b[*h as usize + 14]).collect();
    assert_eq!(firsts, [0, 1, 2]);
    assert!(c.got.iter().all(|(h, b)| *h == 12 && b.len() == 72));
    // Transmit: 4 buffers posted, 5 offered: 4 taken, then no room.
    let mut bufs: Vec<Vec<u8>> = (0..5).map(bench_frame).collect();
    let segs: Vec<[Seg<'_>; 1]> = bufs.iter_mut().map(|b| [Seg::from_mut(b)]).collect();
    let pkts = pkts_over(&segs);
    assert!(port.tx_begin(now, 5));
    assert_eq!(port.tx_burst(&pkts), (4, TxOut::NoRoom));
    port.tx_commit();
    let got = fe.received();
    assert_eq!(got.len(), 4);
    for (k, (h, f)) in got.iter().enumerate() {
        assert_eq!(h.num_buffers, 1);
        assert_eq!(frame::parse(f), frame::Bench::Data(k as u64));
    }
    assert_eq!(get(&fe.stats.tx_packets), 4);
    assert_eq!(get(&fe.stats.rx_packets), 3);
    // The poll-loop hooks: it worked this round (poll on); idle next, it arms and sleeps,
    // and a packet arriving after arming is seen by the re-check.
    let mut s = Settle::new();
    port.idle(now, &mut s);
    assert_eq!(s.plan(), Plan::Poll);
    let mut s = Settle::new();
    port.idle(now + Duration::from_millis(5), &mut s);
    assert!(matches!(s.plan(), Plan::Sleep(_)));
    assert_eq!(port.arm(), Armed::Empty);
    fe.send(&VnetHdr::default(), &frame(mac(2), mac(1), 9, 60));
    assert_eq!(port.arm(), Armed::NotEmpty);
    port.disarm(false);
}

#[test]
fn sink_port_reads_every_frame_and_checks_the_sequence() {
    let stats: Arc<PortStats> = Arc::default();
    let mut port = AnyPort::Sink(SinkPort::new(7, stats.clone(), Counting::Own, 2048));
    assert!(port.caps().receives);
    let now = Instant::now();
    let mut bufs: Vec<Vec<u8>> = [0u64, 1, 3].iter().map(|&s| bench_frame(s)).collect();
    let mut end = bench_frame(0);
    frame::set_end(&mut end[HDR_LEN as usize..], 4);
    bufs.push(end);
    let segs: Vec<[Seg<'_>; 1]> = bufs.iter_mut().map(|b| [Seg::from_mut(b)]).collect();
    let pkts = pkts_over(&segs);
    assert!(port.tx_begin(now, 4));
    assert_eq!(port.tx_burst(&pkts), (4, TxOut::Sent));
    port.tx_commit();
    assert_eq!((get(&stats.tx_packets), get(&stats.tx_bytes)), (4, 256));
    assert_eq!(get(&stats.seq_errors), 1, "2 is missing");
    assert_eq!(
        get(&stats.end_marker),
        5,
        "end marker carried 4 (stored +1)"
    );
    // A sink has nothing to send and never keeps the shard awake.
    let mut c = Collect::all();
    assert_eq!(port.rx_burst(64, now, &mut c), 0);
    let mut s = Settle::new();
    port.idle(now, &mut s);
    assert_eq!(s.plan(), Plan::Sleep(None));
}

#[test]
fn gen_port_numbers_frames_regenerates_what_waits_and_ends_with_a_marker() {
    let stats: Arc<PortStats> = Arc::default();
    let spec = GenSpec {
        frame_len: 64,
        rate: 0,
        duration: Some(Duration::from_millis(10)),
        delay: Duration::ZERO,
        src: mac(1),
        dst: mac(2),
        flows: 1,
    };
    let mut port = AnyPort::Gen(GenPort::new(3, stats.clone(), spec, Counting::Own));
    assert!(!port.caps().receives);
    let t0 = Instant::now();
    // Nobody to receive: it does not start.
    let mut c = Collect::default();
    assert_eq!(port.rx_burst(8, t0, &mut c), 0);
    // A receiver with room for 5 of 8.
    let mut c = Collect {
        room: 5,
        ..Collect::all()
    };
    assert_eq!(port.rx_burst(8, t0, &mut c), 5);
    c.room = usize::MAX;
    assert_eq!(port.rx_burst(8, t0, &mut c), 8);
    let seqs: Vec<_> = c
        .got
        .iter()
        .map(|(h, b)| frame::parse(&b[*h as usize..]))
        .collect();
    let want: Vec<_> = (0..13).map(frame::Bench::Data).collect();
    assert_eq!(
        seqs, want,
        "the frames that waited come again with the same numbers"
    );
    assert_eq!(get(&stats.rx_packets), 13);
    // Unpaced and running: it wants polling.
    let mut s = Settle::new();
    port.idle(t0, &mut s);
    assert_eq!(s.plan(), Plan::Poll);
    // After its duration: the end marker, once, carrying the count.
    let late = t0 + Duration::from_millis(20);
    let mut c = Collect::all();
    assert_eq!(port.rx_burst(8, late, &mut c), 1);
    assert_eq!(port.rx_burst(8, late, &mut c), 0);
    assert_eq!(c.got.len(), 1);
    assert_eq!(frame::parse(&c.got[0].1[12..]), frame::Bench::End(13));
    let mut s = Settle::new();
    port.idle(late, &mut s);
    assert_eq!(s.plan(), Plan::Sleep(None), "done: nothing to wake for");
}

#[test]
fn tap_port_writes_to_the_kernel_and_reads_its_answer() {
    use super::kernel::HostIo;
    // Batched through io_uring, and one syscall per packet: the same answers.
    for (tag, net, io) in [("pru", 31, HostIo::Uring), ("prs", 32, HostIo::Syscall)] {
        tap_round_trip(tag, net, io);
    }
}

fn tap_round_trip(tag: &str, net: u8, io: super::kernel::HostIo) {
    let tap = crate::sys::tap::tests::setup(tag, net, true);
    let tap_mac = tap.mac().unwrap_or_else(|e| panic!("{e}"));
    round_trip(super::kernel::HostDev::Tap(tap), tap_mac, net, io);
}

/// A veth pair in the calling thread's private network namespace: the kernel's end `<name>b`
/// up with 10.213.`net`.1/24 (and the peer address .2 resolved to the frames' source),
/// `<name>a` left for pvnet; deleted on drop.
struct Veth(String);

impl Veth {
    fn new(tag: &str, net: u8) -> (Self, [u8; 6]) {
        use crate::sys::tap::tests::{ip, private_netns};
        private_netns();
        let name = format!("pv{tag}{}", std::process::id() % 10000);
        let (a, b) = (format!("{name}a"), format!("{name}b"));
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        let v = Veth(a);
        ip(&["addr", "add", &format!("10.213.{net}.1/24"), "dev", &b]);
        ip(&["link", "set", &b, "up"]);
        ip(&[
            "neigh",
            "replace",
            &format!("10.213.{net}.2"),
            "lladdr",
            "02:00:00:00:13:02",
            "dev",
            &b,
        ]);
        // (not /sys/class/net: sysfs shows the namespace it was mounted in, the machine's)
        let m = crate::sys::tap::hw_addr(&b).unwrap_or_else(|e| panic!("{e}"));
        (v, m)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.0])
            .status();
    }
}

#[test]
fn af_packet_port_writes_to_a_veth_and_reads_its_answer() {
    use super::kernel::{HostDev, HostIo};
    for (tag, net, io) in [("au", 33, HostIo::Uring), ("as", 34, HostIo::Syscall)] {
        let (veth, kernel_mac) = Veth::new(tag, net);
        let sock = crate::sys::packet::open(&veth.0).unwrap_or_else(|e| panic!("{e}"));
        round_trip(HostDev::Packet(sock), kernel_mac, net, io);
    }
}

/// The interface's MTU changed under a running `AF_PACKET` port: the port's follows within a
/// second (`port/mtu.rs`, polled from its transmit hook), so the switch checks frames against
/// the new one.
#[test]
fn af_packet_port_follows_its_interfaces_mtu() {
    use super::kernel::{HostDev, HostIo};
    let (veth, _) = Veth::new("mt", 37);
    let sock = crate::sys::packet::open(&veth.0).unwrap_or_else(|e| panic!("{e}"));
    let mut port = AnyPort::Kernel(KernelPort::new(
        9,
        Arc::default(),
        HostDev::Packet(sock),
        HostIo::Uring,
        true,
    ));
    follows_mtu(&mut port, &veth.0, 1500, 4000);
}

/// Sets `ifname`'s MTU from `before` to `after` under a running `port`: the port takes the new
/// one from its transmit hook a second after its last read, not half a second after.
pub(crate) fn follows_mtu(port: &mut AnyPort, ifname: &str, before: u16, after: u16) {
    use crate::sys::tap::tests::ip;
    let t0 = Instant::now();
    assert!(port.tx_begin(t0, 1));
    port.tx_commit();
    assert_eq!(port.mtu(), Some(before));
    ip(&["link", "set", ifname, "mtu", &after.to_string()]);
    assert!(port.tx_begin(t0 + Duration::from_millis(500), 1));
    port.tx_commit();
    assert_eq!(port.mtu(), Some(before), "read at most once a second");
    assert!(port.tx_begin(t0 + Duration::from_secs(2), 1));
    port.tx_commit();
    assert_eq!(port.mtu(), Some(after));
}

/// A packet staged in memory the switch reuses before the commit (`Port::staged`) leaves
/// with the bytes it had when it was offered: the io_uring path, which otherwise reads the
/// packet at the commit, writes it at once.
#[test]
fn af_packet_port_writes_a_staged_packet_before_its_memory_is_reused() {
    use super::kernel::{HostDev, HostIo};
    use crate::sys::tap::tests::{fold, ipv4_frame, sum};
    let (veth, kernel_mac) = Veth::new("st", 35);
    let sock = crate::sys::packet::open(&veth.0).unwrap_or_else(|e| panic!("{e}"));
    let stats: Arc<PortStats> = Arc::default();
    let mut port = AnyPort::Kernel(KernelPort::new(
        9,
        stats.clone(),
        HostDev::Packet(sock),
        HostIo::Uring,
        true,
    ));
    let mut icmp = vec![8, 0, 0, 0, 0x70, 0x76, 0, 7];
    icmp.extend_from_slice(&[0x5a; 32]);
    let c = !fold(sum(&icmp, 0));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let f = ipv4_frame(kernel_mac, [10, 213, 35, 2], [10, 213, 35, 1], 1, &icmp);
    let mut b = vec![0u8; 12];
    b.extend_from_slice(&f);
    let len = u32::try_from(b.len()).unwrap_or(0);
    let now = Instant::now();
    assert!(port.tx_begin(now, 1));
    {
        let seg = [Seg::from_mut(&mut b)];
        let pkt = Pkt {
            segs: &seg,
            len,
            hdr_len: 12,
            hdr: VnetHdr::default(),
            macs: [0; 12],
            hash: 0,
            vlan: 0,
        };
        assert_eq!(port.tx_burst(&[pkt]), (1, TxOut::Sent));
    }
    port.staged(1, Staged::Whole);
    // The switch reuses its staging for the next packet before it commits.
    b.fill(0);
    port.tx_commit();
    let mut c = Collect::all();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut answered = false;
    while !answered && Instant::now() < deadline {
        c.got.clear();
        port.rx_burst(64, Instant::now(), &mut c);
        answered = c.got.iter().any(|(_, f)| {
            crate::sys::tap::tests::parse_ipv4(&f[12..]).is_some_and(|ip| {
                ip.proto == 1 && ip.l4.len() >= 8 && ip.l4[0] == 0 && ip.l4[7] == 7
            })
        });
        port.disarm(true);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        answered,
        "the staged echo request left whole and was answered"
    );
    drop(veth);
}

/// Two echo requests into the kernel through `dev` (behind whose interface the kernel has
/// 10.213.`net`.1 at `kernel_mac`), one with a 12-byte header and one with a 10-byte one; both
/// answers come back through the port.
fn round_trip(dev: super::kernel::HostDev, tap_mac: [u8; 6], net: u8, io: super::kernel::HostIo) {
    use crate::sys::tap::tests::{fold, ipv4_frame, parse_ipv4, sum, Ipv4};
    let stats: Arc<PortStats> = Arc::default();
    let mut port = AnyPort::Kernel(KernelPort::new(9, stats.clone(), dev, io, true));
    let (peer, host) = ([10, 213, net, 2], [10, 213, net, 1]);
    if let AnyPort::Kernel(t) = &port {
        assert_eq!(t.io(), io, "io_uring must be available here");
    }
    let now = Instant::now();
    // Two echo requests, one behind a 12-byte header and one behind a legacy 10-byte one
    // (rewritten to 12 for the tap): the kernel answers both.
    for (seq, hdr_len) in [(1u16, 12u32), (2, 10)] {
        let mut icmp = vec![8, 0, 0, 0, 0x70, 0x76];
        icmp.extend_from_slice(&seq.to_be_bytes());
        icmp.extend_from_slice(&[0x5a; 32]);
        let c = !fold(sum(&icmp, 0));
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        let f = ipv4_frame(tap_mac, peer, host, 1, &icmp);
        let mut b = vec![0u8; hdr_len as usize];
        b.extend_from_slice(&f);
        let seg = [Seg::from_mut(&mut b)];
        let pkt = Pkt {
            segs: &seg,
            len: hdr_len + u32::try_from(f.len()).unwrap_or(0),
            hdr_len,
            hdr: VnetHdr::default(),
            macs: [0; 12],
            hash: 0,
            vlan: 0,
        };
        assert!(port.tx_begin(now, 1));
        assert_eq!(port.tx_burst(&[pkt]), (1, TxOut::Sent));
        port.tx_commit();
    }
    assert_eq!(
        get(&stats.tx_packets),
        2,
        "{io:?}: drops {:?}",
        stats.snapshot(9).drops
    );
    let mut c = Collect::all();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut replies = Vec::new();
    while replies.len() < 2 && Instant::now() < deadline {
        c.got.clear();
        port.rx_burst(64, Instant::now(), &mut c);
        for (h, b) in &c.got {
            assert_eq!(*h, 12);
            if let Some(Ipv4 { proto: 1, l4, .. }) = parse_ipv4(&b[12..]) {
                if l4.len() >= 8 && l4[0] == 0 {
                    replies.push(u16::from_be_bytes([l4[6], l4[7]]));
                }
            }
        }
        // The kernel answers asynchronously: look again (the port reads at most every
        // TAP_LOOK while it had nothing, at once after a wake-up).
        port.disarm(true);
        std::thread::sleep(Duration::from_millis(1));
    }
    replies.sort_unstable();
    assert_eq!(replies, [1, 2], "both requests answered ({io:?})");
    assert!(get(&stats.rx_packets) >= 2);
    assert!(get(&stats.syscalls) > 0);
}

#[test]
fn a_kick_counts_once_whatever_the_frontend_wrote() {
    use crate::testing::vhost_config;
    use pvnet_vhost::backend::StartedQueue;
    use pvnet_vhost::Notifier;
    use virtq::mock::MockQueue;
    use virtq::{Direction, Format};
    let stats: Arc<PortStats> = Arc::default();
    let mut port =
        super::vhost::VhostPort::new(0, vhost_config(HoldPolicy::Forever), vec![stats.clone()]);
    let txm = MockQueue::new(64, 2048);
    let (_tx, txd) = txm
        .pair_in(Format::Split, Direction::DeviceReads, false)
        .expect("tx ring");
    let kick = Notifier::new().expect("eventfd");
    let theirs = kick.try_clone().expect("clone");
    port.start(StartedQueue {
        index: 1,
        queue: txd,
        kick: Some(kick),
        call: None,
        err: None,
        mergeable: true,
        features: MODERN,
        iotlb: None,
        mtu: None,
    });
    let mut port = AnyPort::Vhost(port);
    // One legal eventfd write of 2^64 - 2: a single kick, not a counter wrapping around.
    let v: u64 = u64::MAX - 1;
    // SAFETY: writes 8 bytes from a local u64 to an eventfd we own.
    let r = unsafe {
        libc::write(
            std::os::fd::AsRawFd::as_raw_fd(&theirs),
            std::ptr::from_ref(&v).cast(),
            8,
        )
    };
    assert_eq!(r, 8);
    port.event(1);
    assert_eq!(get(&stats.kicks), 1);
    theirs.signal().expect("signal");
    theirs.signal().expect("signal");
    port.event(1);
    assert_eq!(get(&stats.kicks), 2, "a wake-up is a kick");
}

/// The kernel takes the VLAN tag out of every frame it receives before a packet socket sees
/// it (`skb_vlan_untag`; it comes beside the frame, in `PACKET_AUXDATA`): the `AF_PACKET`
/// port puts it back, so tagged frames from the wire reach a frontend tagged, byte for byte,
/// priority bits and all, on each read path (one syscall per packet, io_uring into the port's
/// buffers, io_uring straight into the frontend's buffers: there tagged frames come from the
/// port's second socket, into its own buffers, never in place untagged). Untagged frames pass
/// as they are. Each kind keeps its order (the two sockets are read one after the other).
#[test]
fn af_packet_port_puts_back_the_vlan_tags_the_kernel_took_out() {
    use super::kernel::{HostDev, HostIo};
    use crate::egress::EgressConfig;
    use crate::switch::{Fabric, Router, SwitchConfig};
    for (tag, net, io, direct) in [
        ("vs", 51, HostIo::Syscall, false),
        ("vu", 52, HostIo::Uring, false),
        ("vd", 53, HostIo::Uring, true),
    ] {
        let (veth, _) = Veth::new(tag, net);
        let sock = crate::sys::packet::open(&veth.0).unwrap_or_else(|e| panic!("{e}"));
        assert!(sock.fanned(), "one fanout group");
        let kb = format!("{}b", veth.0.trim_end_matches('a'));
        let wire = crate::sys::packet::open(&kb).unwrap_or_else(|e| panic!("{e}"));
        let stats: Arc<PortStats> = Arc::default();
        let (mut fe, vm) = MockFe::with_buffers(
            2,
            MODERN,
            256,
            EgressConfig::hold(HoldPolicy::Forever),
            2048,
        );
        let mut ports = vec![
            AnyPort::Kernel(KernelPort::new(
                9,
                stats.clone(),
                HostDev::Packet(sock),
                io,
                direct,
            )),
            vm,
        ];
        let mut f = Fabric::new(Router::learning(SwitchConfig::default()), 64);
        // 20 frames from the wire's end, every other one tagged (VLAN 10 with priority 1,
        // or 802.1ad 20), each numbered.
        let mut sent = Vec::new();
        for k in 0..20u8 {
            let mut fr = vec![0xff; 6];
            fr.extend_from_slice(&[2, 0, 0, 0, 0x5e, k]);
            match k % 4 {
                1 => fr.extend_from_slice(&[0x81, 0x00, 0x20, 10]),
                3 => fr.extend_from_slice(&[0x88, 0xa8, 0x00, 20]),
                _ => {}
            }
            fr.extend_from_slice(&[0x88, 0xb5]);
            fr.extend_from_slice(&[k; 46]);
            let hdr = [0u8; 12];
            let iov = [
                libc::iovec {
                    iov_base: hdr.as_ptr().cast_mut().cast(),
                    iov_len: 12,
                },
                libc::iovec {
                    iov_base: fr.as_ptr().cast_mut().cast(),
                    iov_len: fr.len(),
                },
            ];
            let w = wire.send_iovecs(&iov).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(w, Some(12 + fr.len()), "{io:?}: sent");
            sent.push(fr);
        }
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while got.len() < sent.len() && Instant::now() < deadline {
            f.round(&mut ports, Instant::now());
            got.extend(fe.received().into_iter().map(|(_, b)| b));
            ports[0].disarm(true);
            std::thread::sleep(Duration::from_millis(1));
        }
        // (the kernel's own frames, if any, are not the test's: by their source)
        got.retain(|b| b.len() > 12 && b[6..11] == [2, 0, 0, 0, 0x5e]);
        // Tagged frames come through the port's second socket: each kind in order.
        let split = |v: &[Vec<u8>]| -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
            v.iter()
                .cloned()
                .partition(|b| b[12..14] == [0x81, 0] || b[12..14] == [0x88, 0xa8])
        };
        assert_eq!(
            split(&got),
            split(&sent),
            "{io:?} direct={direct}: every frame as it was sent"
        );
        // Untagged frames (the kernel's own among them) are read straight into the
        // frontend's buffers; tagged ones never are (they come from the other socket).
        let direct_n = get(&stats.rx_direct);
        assert_eq!(direct_n > 0, direct, "{io:?}: {direct_n} in place");
        assert_eq!(
            get(&stats.drops[crate::stats::DropReason::Invalid as usize]),
            0
        );
    }
}
