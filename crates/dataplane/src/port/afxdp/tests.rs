//! The `AF_XDP` port against the kernel on the other end of a veth pair, in the test thread's
//! private network namespace ([`crate::sys::tap::tests::private_netns`]): echo requests
//! answered, exact counts both ways, native and generic mode, the program gone with the
//! port and another one left alone, the interface deleted under the port.

use super::AfXdpPort;
use crate::frame;
use crate::pkt::{Pkt, TxOut};
use crate::port::{AnyPort, Port};
use crate::stats::{DropReason, PortStats};
use crate::sys::tap::tests::{fold, ip, ipv4_frame, parse_ipv4, private_netns, sum, Ipv4};
use crate::sys::xdp::{Mode, ModeReq, XdpConfig, XdpDev, ZeroCopy};
use crate::testing::{get, Collect};
use pvnet_net::{VnetHdr, HDR_LEN};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::Seg;

mod vlan;

/// A veth pair in the thread's private namespace: `<name>a` for pvnet, `<name>b` the kernel's
/// end with 10.214.`net`.1/24 and a static neighbour .2 (the frames' source); IPv6 off on both
/// so that the kernel sends nothing of its own. Deleted on drop (the namespace goes with the
/// thread anyway).
struct Veth {
    a: String,
    b: String,
}

impl Veth {
    fn new(tag: &str, net: u8) -> (Self, [u8; 6]) {
        private_netns();
        let name = format!("pvx{tag}{}", std::process::id() % 10000);
        let (a, b) = (format!("{name}a"), format!("{name}b"));
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        for i in [&a, &b] {
            // /proc/sys/net is the calling thread's namespace's.
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{i}/disable_ipv6"), "1");
        }
        ip(&["addr", "add", &format!("10.214.{net}.1/24"), "dev", &b]);
        ip(&["link", "set", &b, "up"]);
        ip(&["link", "set", &a, "up"]);
        ip(&[
            "neigh",
            "replace",
            &format!("10.214.{net}.2"),
            "lladdr",
            "02:00:00:00:13:02",
            "dev",
            &b,
        ]);
        let m = crate::sys::tap::hw_addr(&b).unwrap_or_else(|e| panic!("{e}"));
        (Veth { a, b }, m)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.a]).output();
    }
}

/// `ip link show dev X` (empty if it is gone).
fn link_show(dev: &str) -> String {
    let out = Command::new("ip")
        .args(["link", "show", "dev", dev])
        .output()
        .expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `dev` is without an XDP program within 2 s. A dropped link's fd is closed at once,
/// but a child another test thread is starting holds a copy of every fd from its fork to its
/// exec (close-on-exec): the link goes when that copy does.
fn no_program(dev: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while link_show(dev).contains("xdp") {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// The kernel's packet counters of `dev` (`rx_packets`, `tx_packets`), from `/proc/net/dev`
/// as a child process sees it (in the thread's namespace; the test process's own
/// `/proc/self/net` is its main thread's).
fn kernel_counts(dev: &str) -> (u64, u64) {
    let out = Command::new("cat")
        .arg("/proc/net/dev")
        .output()
        .expect("run cat");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{dev}:")).map(str::to_owned))
        .unwrap_or_else(|| panic!("no {dev} in /proc/net/dev: {text}"));
    let v: Vec<u64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    (v[1], v[9])
}

fn open(ifname: &str, mode: ModeReq) -> XdpDev {
    XdpDev::open(&XdpConfig {
        mode,
        ..XdpConfig::new(ifname)
    })
    .unwrap_or_else(|e| panic!("open AF_XDP on {ifname}: {e}"))
}

/// Sends one frame (`hdr_len` bytes of header in front) through the port.
fn send(port: &mut AnyPort, f: &[u8], hdr_len: u32) -> TxOut {
    let mut b = vec![0u8; hdr_len as usize];
    b.extend_from_slice(f);
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
    assert!(port.tx_begin(Instant::now(), 1));
    let (n, out) = port.tx_burst(&[pkt]);
    port.tx_commit();
    if n == 1 {
        TxOut::Sent
    } else {
        out
    }
}

/// Sends `n` numbered bench frames of `len` bytes through the port to the kernel's end of
/// `veth`, each taken; returns how many the kernel's end counted within 2 s.
fn to_kernel(port: &mut AnyPort, veth: &Veth, kernel_mac: [u8; 6], len: usize, n: u64) -> u64 {
    let (rx0, _) = kernel_counts(&veth.b);
    let mut f = vec![0u8; len];
    frame::write_template(&mut f, len, [2, 0, 0, 0, 0x13, 2], kernel_mac);
    for s in 0..n {
        frame::set_seq(&mut f, s);
        assert_eq!(send(port, &f, HDR_LEN), TxOut::Sent);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while kernel_counts(&veth.b).0 - rx0 < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    kernel_counts(&veth.b).0 - rx0
}

/// Numbered bench frames `seqs` of `len` bytes from `macs` (destination, source), written
/// from the kernel's side through `sock` (an `AF_PACKET` socket on the kernel's end); `wait`:
/// a write the socket has no room for is tried again until it is taken, else every write
/// must be taken at once.
fn from_kernel(
    sock: &crate::sys::packet::PacketSock,
    seqs: std::ops::Range<u64>,
    len: usize,
    macs: ([u8; 6], [u8; 6]),
    wait: bool,
) {
    let mut f = vec![0u8; HDR_LEN as usize + len];
    frame::write_template(&mut f[HDR_LEN as usize..], len, macs.0, macs.1);
    for s in seqs {
        frame::set_seq(&mut f[HDR_LEN as usize..], s);
        let iov = [libc::iovec {
            iov_base: f.as_mut_ptr().cast(),
            iov_len: f.len(),
        }];
        loop {
            let sent = sock.send_iovecs(&iov).unwrap_or_else(|e| panic!("{e}"));
            assert!(sent.is_some() || wait, "the kernel took frame {s}");
            if sent.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Polls the port until `done` says enough arrived or 2 s pass.
fn collect(port: &mut AnyPort, c: &mut Collect, done: impl Fn(&Collect) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !done(c) && Instant::now() < deadline {
        if port.rx_burst(64, Instant::now(), c) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Echo requests into the kernel through the port and its answers back; then 1000 bench
/// frames each way, counted exactly on both sides.
fn round_trip(tag: &str, net: u8, mode: ModeReq, want: Mode) {
    let (veth, kernel_mac) = Veth::new(tag, net);
    let dev = open(&veth.a, mode);
    assert_eq!(dev.mode(), want, "{}", dev.describe());
    let shown = link_show(&veth.a);
    let mark = if want == Mode::Native {
        "xdp "
    } else {
        "xdpgeneric"
    };
    assert!(shown.contains(mark), "{mark} attached: {shown}");
    let stats: Arc<PortStats> = Arc::default();
    let mut port = AnyPort::AfXdp(AfXdpPort::new(5, stats.clone(), dev));
    assert_eq!(
        port.caps().offloads,
        0,
        "no offload: the switch does them in software"
    );
    let (peer, host) = ([10, 214, net, 2], [10, 214, net, 1]);
    for (seq, hdr_len) in [(1u16, 12u32), (2, 10)] {
        let mut icmp = vec![8, 0, 0, 0, 0x70, 0x77];
        icmp.extend_from_slice(&seq.to_be_bytes());
        icmp.extend_from_slice(&[0x5a; 32]);
        let c = !fold(sum(&icmp, 0));
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        let f = ipv4_frame(kernel_mac, peer, host, 1, &icmp);
        assert_eq!(send(&mut port, &f, hdr_len), TxOut::Sent);
    }
    let mut c = Collect::all();
    let replies = |c: &Collect| {
        let mut r: Vec<u16> = c
            .got
            .iter()
            .filter_map(|(h, b)| match parse_ipv4(&b[*h as usize..]) {
                Some(Ipv4 { proto: 1, l4, .. }) if l4.len() >= 8 && l4[0] == 0 => {
                    Some(u16::from_be_bytes([l4[6], l4[7]]))
                }
                _ => None,
            })
            .collect();
        r.sort_unstable();
        r
    };
    collect(&mut port, &mut c, |c| replies(c).len() >= 2);
    assert_eq!(replies(&c), [1, 2], "{mode:?}: both requests answered");
    assert!(c.got.iter().all(|(h, _)| *h == HDR_LEN));

    // pvnet -> kernel: 1000 frames, the kernel's end counts exactly that many.
    let tx0 = get(&stats.tx_packets);
    assert_eq!(
        to_kernel(&mut port, &veth, kernel_mac, 64, 1000),
        1000,
        "{mode:?}: the kernel got every frame"
    );
    assert_eq!(get(&stats.tx_packets) - tx0, 1000);
    assert_eq!(stats.snapshot(5).drops.iter().map(|d| d.1).sum::<u64>(), 0);

    // The interface's MTU, for the switch's too_big check; past what its frames hold (with
    // multi-buffer, MAX_FRAGS of them) the port itself refuses.
    assert_eq!(port.mtu(), Some(1500));
    let AnyPort::AfXdp(p) = &port else {
        unreachable!()
    };
    assert!(
        p.dev().multi_buffer(),
        "this kernel has AF_XDP multi-buffer"
    );
    let big = vec![0u8; (super::MAX_FRAGS * crate::sys::xdp::FRAME) as usize + 1];
    assert_eq!(
        send(&mut port, &big, HDR_LEN),
        TxOut::Dropped(DropReason::TooBig)
    );

    // kernel -> pvnet: 1000 frames from an AF_PACKET socket on the kernel's end, in bursts of
    // 100, all handed out in order, the port's counters equal to what it handed out.
    let sock = crate::sys::packet::open(&veth.b).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Collect::all();
    let rx_before = get(&stats.rx_packets);
    let peer = [2, 0, 0, 0, 0x13, 2];
    for burst in 0..10u64 {
        from_kernel(
            &sock,
            burst * 100..(burst + 1) * 100,
            64,
            (kernel_mac, peer),
            false,
        );
        let want = usize::try_from((burst + 1) * 100).unwrap_or(usize::MAX);
        collect(&mut port, &mut c, |c| c.got.len() >= want);
    }
    let seqs: Vec<u64> = c
        .got
        .iter()
        .filter_map(|(h, b)| match frame::parse(&b[*h as usize..]) {
            frame::Bench::Data(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(
        seqs,
        (0..1000).collect::<Vec<_>>(),
        "{mode:?}: every frame, in order"
    );
    assert_eq!(c.got.len(), 1000, "{mode:?}: nothing else arrived");
    assert_eq!(get(&stats.rx_packets) - rx_before, 1000);
    assert!(get(&stats.rx_bytes) >= 1000 * 60);

    // The port goes: its program goes with it.
    drop(port);
    assert!(no_program(&veth.a), "program left: {}", link_show(&veth.a));
}

#[test]
fn af_xdp_port_native_mode_round_trip_and_exact_counts() {
    round_trip("n", 41, ModeReq::Native, Mode::Native);
}

#[test]
fn af_xdp_port_generic_mode_round_trip_and_exact_counts() {
    round_trip("g", 42, ModeReq::Generic, Mode::Generic);
}

/// Jumbo frames (MTU 9000 on both ends of the veth) both ways through AF_XDP multi-buffer:
/// a 9000-byte echo request answered byte for byte, 100 jumbo frames each way counted
/// exactly, each arriving whole as one packet of several segments.
fn jumbo(tag: &str, net: u8, mode: ModeReq) {
    let (veth, kernel_mac) = Veth::new(tag, net);
    for i in [&veth.a, &veth.b] {
        ip(&["link", "set", i, "mtu", "9000"]);
    }
    let dev = open(&veth.a, mode);
    assert!(dev.multi_buffer(), "{}", dev.describe());
    assert!(
        dev.describe().contains("multi-buffer"),
        "{}",
        dev.describe()
    );
    let stats: Arc<PortStats> = Arc::default();
    let mut port = AnyPort::AfXdp(AfXdpPort::new(6, stats.clone(), dev));
    assert_eq!(port.mtu(), Some(9000));
    let (peer, host) = ([10, 214, net, 2], [10, 214, net, 1]);
    // 20 + 8 + 8972 = 9000 bytes of IP: the largest packet the MTU takes.
    let mut icmp = vec![8, 0, 0, 0, 0x70, 0x77, 0, 1];
    icmp.extend((0..8972u32).map(|i| u8::try_from(i % 251).unwrap_or(0)));
    let c = !fold(sum(&icmp, 0));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let f = ipv4_frame(kernel_mac, peer, host, 1, &icmp);
    assert_eq!(f.len(), 9014);
    assert_eq!(send(&mut port, &f, HDR_LEN), TxOut::Sent);
    let mut c = Collect::all();
    let reply = |c: &Collect| {
        c.got
            .iter()
            .find_map(|(h, b)| match parse_ipv4(&b[*h as usize..]) {
                Some(Ipv4 { proto: 1, l4, .. }) if l4.len() >= 8 && l4[0] == 0 => Some(l4.to_vec()),
                _ => None,
            })
    };
    collect(&mut port, &mut c, |c| reply(c).is_some());
    let r = reply(&c).unwrap_or_else(|| panic!("{mode:?}: no answer to the jumbo request"));
    assert_eq!(
        r.len(),
        icmp.len(),
        "{mode:?}: the whole answer, one packet"
    );
    assert_eq!(r[8..], icmp[8..], "{mode:?}: byte for byte");

    // 100 jumbo frames each way, counted exactly.
    assert_eq!(
        to_kernel(&mut port, &veth, kernel_mac, 9014, 100),
        100,
        "{mode:?}: the kernel got every jumbo frame"
    );
    let sock = crate::sys::packet::open(&veth.b).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Collect::all();
    for k in 0..5u64 {
        let seqs = k * 20..(k + 1) * 20;
        from_kernel(
            &sock,
            seqs,
            9014,
            (kernel_mac, [2, 0, 0, 0, 0x13, 2]),
            false,
        );
        let want = usize::try_from((k + 1) * 20).unwrap_or(usize::MAX);
        collect(&mut port, &mut c, |c| c.got.len() >= want);
    }
    let seqs: Vec<u64> = c
        .got
        .iter()
        .filter_map(|(h, b)| {
            assert_eq!(b.len() - *h as usize, 9014, "{mode:?}: whole");
            match frame::parse(&b[*h as usize..]) {
                frame::Bench::Data(s) => Some(s),
                _ => None,
            }
        })
        .collect();
    assert_eq!(
        seqs,
        (0..100).collect::<Vec<_>>(),
        "{mode:?}: every frame, in order"
    );
    assert_eq!(stats.snapshot(6).drops.iter().map(|d| d.1).sum::<u64>(), 0);
}

#[test]
fn af_xdp_native_mode_passes_jumbo_frames_both_ways() {
    jumbo("jn", 47, ModeReq::Native);
}

#[test]
fn af_xdp_generic_mode_passes_jumbo_frames_both_ways() {
    jumbo("jg", 48, ModeReq::Generic);
}

#[test]
fn af_xdp_auto_mode_takes_native_on_a_veth() {
    let (veth, _) = Veth::new("m", 43);
    let dev = open(&veth.a, ModeReq::Auto);
    assert_eq!(dev.mode(), Mode::Native);
    assert!(dev.describe().contains("XDP native"), "{}", dev.describe());
    assert!(!dev.zerocopy(), "a veth has no zero-copy: copy mode");
}

/// An interface with a program already attached (pvnet's own, in either mode) is refused
/// with a clear error, and that program stays; zero-copy that cannot be had is an error.
#[test]
fn af_xdp_refuses_an_interface_with_a_program_and_leaves_it_alone() {
    let (veth, _) = Veth::new("r", 44);
    let first = open(&veth.a, ModeReq::Native);
    for mode in [ModeReq::Native, ModeReq::Generic, ModeReq::Auto] {
        let e = XdpDev::open(&XdpConfig {
            mode,
            ..XdpConfig::new(&veth.a)
        })
        .expect_err("a second program must be refused");
        assert!(
            e.to_string().contains("already has an XDP program"),
            "{mode:?}: {e}"
        );
        assert!(
            link_show(&veth.a).contains("xdp "),
            "the first program stays"
        );
    }
    drop(first);
    assert!(no_program(&veth.a));
    let e = XdpDev::open(&XdpConfig {
        mode: ModeReq::Generic,
        zerocopy: ZeroCopy::On,
        ..XdpConfig::new(&veth.a)
    })
    .expect_err("zero-copy in generic mode");
    assert!(e.to_string().contains("zero-copy"), "{e}");
    assert!(no_program(&veth.a), "nothing left after a failed open");
    let e = XdpDev::open(&XdpConfig::new("pvnoifx0")).expect_err("no such interface");
    assert!(e.to_string().contains("pvnoifx0"), "{e}");
}

/// The interface deleted under a running port: the next transmit finds the socket unbound,
/// the port says so and goes down, further packets are refused (`port_down` at the switch),
/// and nothing panics, reading included.
#[test]
fn af_xdp_port_survives_its_interface_going_away() {
    let (veth, kernel_mac) = Veth::new("d", 45);
    let stats: Arc<PortStats> = Arc::default();
    stats.up.store(1, std::sync::atomic::Ordering::Relaxed);
    let mut port = AnyPort::AfXdp(AfXdpPort::new(
        6,
        stats.clone(),
        open(&veth.a, ModeReq::Native),
    ));
    let mut f = vec![0u8; 64];
    frame::write_template(&mut f, 64, [2, 0, 0, 0, 0x13, 2], kernel_mac);
    assert_eq!(send(&mut port, &f, HDR_LEN), TxOut::Sent);
    ip(&["link", "del", &veth.a]);
    let _ = send(&mut port, &f, HDR_LEN);
    assert_eq!(
        stats.up.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "the port is down"
    );
    assert_eq!(get(&stats.drops[DropReason::PortDown as usize]), 1);
    assert!(
        !port.tx_begin(Instant::now(), 1),
        "a down port takes nothing"
    );
    let mut c = Collect::all();
    assert_eq!(port.rx_burst(64, Instant::now(), &mut c), 0);
    drop(port);
}

/// `queues=2` on a veth with two queues: a socket bound to each, both polled by the port
/// (the kernel spreads the flows of the peer's two transmit queues over them), and both
/// transmitting (the port spreads its flows over them).
#[test]
fn af_xdp_port_takes_every_queue_it_is_given() {
    private_netns();
    let name = format!("pvxq{}", std::process::id() % 10000);
    let (a, b) = (format!("{name}a"), format!("{name}b"));
    ip(&[
        "link",
        "add",
        &a,
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "type",
        "veth",
        "peer",
        "name",
        &b,
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
    ]);
    let veth = Veth {
        a: a.clone(),
        b: b.clone(),
    };
    // The kernel's own frames (IPv6's reports once the link is up) would come in beside the
    // test's: none with IPv6 off on both ends and no address.
    for i in [&a, &b] {
        std::fs::write(format!("/proc/sys/net/ipv6/conf/{i}/disable_ipv6"), "1")
            .unwrap_or_else(|e| panic!("disable_ipv6 on {i}: {e}"));
    }
    ip(&["link", "set", &b, "up"]);
    let dev = XdpDev::open(&XdpConfig {
        queues: 2,
        mode: ModeReq::Native,
        ..XdpConfig::new(&a)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(dev.describe().ends_with("2 queues"), "{}", dev.describe());
    assert_eq!(dev.queues.len(), 2);
    let stats: Arc<PortStats> = Arc::default();
    let mut port = AnyPort::AfXdp(AfXdpPort::new(7, stats.clone(), dev));
    // Frames from the kernel's end, on both of its transmit queues (the queue is picked per
    // sending CPU and socket hash); every one arrives, whichever queue it came in on.
    let sock = crate::sys::packet::open(&veth.b).unwrap_or_else(|e| panic!("{e}"));
    let macs = ([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0, 8]);
    from_kernel(&sock, 0..200, 64, macs, false);
    let mut c = Collect::all();
    collect(&mut port, &mut c, |c| c.got.len() >= 200);
    // Nothing more comes (a frame of the kernel's would be one more).
    std::thread::sleep(Duration::from_millis(50));
    port.rx_burst(64, Instant::now(), &mut c);
    assert_eq!(c.got.len(), 200, "{:?}", stats.snapshot(7));
    assert_eq!(get(&stats.rx_packets), 200);
    transmit_spreads_flows_over_queues(&mut port, &b);
    drop(port);
    assert!(no_program(&a));
}

/// Frames of 32 flows (UDP source ports), 4 each, through a 2-queue port to the kernel's end
/// `b`: each flow's hash picks the queue it leaves on. The veth hands a frame sent on queue q
/// to its peer's receive queue q, so two packet sockets on `b` in a fanout group by receive
/// queue (`PACKET_FANOUT_QM`) tell the queues apart: both see flows, every frame arrives, and
/// each flow arrives whole on one.
fn transmit_spreads_flows_over_queues(port: &mut AnyPort, b: &str) {
    const PACKET_FANOUT: libc::c_int = 18;
    const PACKET_FANOUT_QM: u32 = 5;
    let socks = [0, 1].map(|_| {
        let s = crate::sys::packet::open_unfanned(b).unwrap_or_else(|e| panic!("{e}"));
        let v: u32 = 0x4242 | (PACKET_FANOUT_QM << 16);
        crate::sys::packet::setopt_at(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::SOL_PACKET,
            PACKET_FANOUT,
            &v,
            "PACKET_FANOUT",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        s
    });
    let mac = crate::sys::tap::hw_addr(b).unwrap_or_else(|e| panic!("{e}"));
    for sport in 0..32u16 {
        let mut udp = vec![0u8; 40];
        udp[0..2].copy_from_slice(&(2000 + sport).to_be_bytes());
        udp[2..4].copy_from_slice(&9u16.to_be_bytes());
        udp[4..6].copy_from_slice(&40u16.to_be_bytes());
        let f = ipv4_frame(mac, [10, 214, 61, 2], [10, 214, 61, 1], 17, &udp);
        for _ in 0..4 {
            assert_eq!(send(port, &f, HDR_LEN), TxOut::Sent);
        }
    }
    // Per socket: each flow's frames.
    let mut flows = [
        std::collections::HashMap::<u16, u32>::new(),
        std::collections::HashMap::new(),
    ];
    let mut buf = vec![0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs(2);
    while flows.iter().map(|f| f.values().sum::<u32>()).sum::<u32>() < 128
        && Instant::now() < deadline
    {
        for (s, seen) in socks.iter().zip(&mut flows) {
            while let Ok(Some((n, _))) = s.recv(&mut buf) {
                // Behind the socket's virtio-net header.
                let f = &buf[HDR_LEN as usize..n];
                if f.len() >= 42 && f[23] == 17 && f[30..34] == [10, 214, 61, 1] {
                    *seen.entry(u16::from_be_bytes([f[34], f[35]])).or_default() += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = flows.clone().map(|f| f.values().sum::<u32>());
    assert_eq!(got[0] + got[1], 128, "every frame arrives: {got:?}");
    assert!(got[0] > 0 && got[1] > 0, "both queues carry flows: {got:?}");
    for (q, f) in flows.iter().enumerate() {
        assert!(
            f.values().all(|&n| n == 4),
            "queue {q}: a flow split: {f:?}"
        );
    }
}

/// Records each packet's hash and its UDP source port.
#[derive(Default)]
struct Hashes(Vec<(u32, u16)>);

impl crate::port::Ingress for Hashes {
    fn burst(&mut self, pkts: &[Pkt<'_>], _stats: &PortStats) -> usize {
        for p in pkts {
            let mut b = vec![0u8; p.len as usize];
            virtq::read_segs(p.segs, 0, &mut b);
            let f = &b[p.hdr_len as usize..];
            // IPv4 (no options), UDP: the source port.
            if f.len() >= 42 && f[12..14] == [8, 0] && f[23] == 17 {
                self.0.push((p.hash, u16::from_be_bytes([f[34], f[35]])));
            }
        }
        pkts.len()
    }
    fn has_receiver(&self) -> bool {
        true
    }
}

/// UDP datagrams of 4 flows from the kernel's end (4 sockets, 5 each); the port's packets,
/// each with its hash and source port.
fn hashes_of_flows(net: u8, port: &mut AnyPort) -> Hashes {
    let socks: Vec<std::net::UdpSocket> = (0..4)
        .map(|_| std::net::UdpSocket::bind(format!("10.214.{net}.1:0")).expect("bind"))
        .collect();
    for _ in 0..5 {
        for s in &socks {
            s.send_to(&[0x5a; 32], format!("10.214.{net}.2:9"))
                .expect("send");
        }
    }
    let mut h = Hashes::default();
    let deadline = Instant::now() + Duration::from_secs(2);
    while h.0.len() < 20 && Instant::now() < deadline {
        if port.rx_burst(64, Instant::now(), &mut h) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(h.0.len(), 20, "every datagram arrives");
    h
}

/// Native mode on a veth, asked to (`rx_hash=true`): the program reads each frame's RX hash
/// from the driver (XDP metadata) and the packet carries it: never zero, one per flow,
/// different flows apart. Asked not to (`rx_hash=false`), in generic mode (no device-bound
/// program), or by default on a veth (a virtual device: auto leaves it off), packets carry
/// none and the switch hashes their headers.
#[test]
fn af_xdp_native_mode_carries_the_drivers_rx_hash_per_flow() {
    let (veth, _) = Veth::new("h", 47);
    let dev = XdpDev::open(&XdpConfig {
        mode: ModeReq::Native,
        rx_hash: Some(true),
        ..XdpConfig::new(&veth.a)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(dev.rx_hash(), "{}", dev.describe());
    assert!(!crate::sys::tap::has_hardware(&veth.a), "a veth is virtual");
    assert!(dev.describe().contains("rx-hash"), "{}", dev.describe());
    let mut port = AnyPort::AfXdp(AfXdpPort::new(8, Arc::default(), dev));
    let h = hashes_of_flows(47, &mut port);
    let mut per_flow = std::collections::HashMap::new();
    for &(hash, sport) in &h.0 {
        assert_ne!(hash, 0, "flow {sport} has no hash");
        let first = *per_flow.entry(sport).or_insert(hash);
        assert_eq!(first, hash, "flow {sport}: one hash");
    }
    let distinct: std::collections::HashSet<u32> = per_flow.values().copied().collect();
    assert_eq!((per_flow.len(), distinct.len()), (4, 4), "{per_flow:?}");
    drop(port);
    assert!(no_program(&veth.a));
    for (mode, rx_hash) in [
        (ModeReq::Native, Some(false)),
        (ModeReq::Generic, Some(true)),
        (ModeReq::Native, None),
    ] {
        let dev = XdpDev::open(&XdpConfig {
            mode,
            rx_hash,
            ..XdpConfig::new(&veth.a)
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!dev.rx_hash(), "{mode:?} {rx_hash:?}: {}", dev.describe());
        let mut port = AnyPort::AfXdp(AfXdpPort::new(8, Arc::default(), dev));
        let h = hashes_of_flows(47, &mut port);
        assert!(
            h.0.iter().all(|&(hash, _)| hash == 0),
            "{mode:?}: {:?}",
            h.0
        );
        drop(port);
        assert!(no_program(&veth.a));
    }
}

/// A port closed and at once opened again on the same queue, as removing and re-adding it at
/// runtime or restarting the switch does: the kernel lets go of a closed socket's queue a
/// moment after the close (from a work queue), and the new socket waits for that rather than
/// failing to bind with `EBUSY`.
#[test]
fn af_xdp_port_opens_a_queue_just_closed() {
    let (veth, _) = Veth::new("o", 50);
    for _ in 0..40 {
        for mode in [ModeReq::Native, ModeReq::Generic] {
            drop(open(&veth.a, mode));
        }
    }
    assert!(no_program(&veth.a));
}

/// With an egress queue and DQL (`qdisc=fq_codel,dql=true`): the limit bounds the transmit
/// frames in flight by what the completion ring gives back, and a kernel that completes at
/// each kick (copy mode on a veth sends in the `sendto`) never finds it in the way: 3040
/// frames in bursts of 160, each past the limit (64 at first), so that the port publishes,
/// takes back what the kernel completed and asks again within the burst; each burst taken
/// whole, every frame counted by the kernel's end, nothing dropped, the limit reported. A
/// port that credited no completion would refuse the first burst's 66th frame.
#[test]
fn af_xdp_port_under_dql_takes_every_burst_when_the_kernel_keeps_up() {
    use crate::egress::queue::{Qdisc, QueueConfig};
    use crate::egress::EgressConfig;
    let (veth, kernel_mac) = Veth::new("q", 51);
    let stats: Arc<PortStats> = Arc::default();
    let mut p = AfXdpPort::new(11, stats.clone(), open(&veth.a, ModeReq::Native));
    p.set_egress(EgressConfig {
        queue: Some(QueueConfig {
            qdisc: Qdisc::FqCodel,
            ..QueueConfig::default()
        }),
        dql: true,
        ..EgressConfig::switch_default()
    });
    let mut port = AnyPort::AfXdp(p);
    let (rx0, _) = kernel_counts(&veth.b);
    let h = HDR_LEN as usize;
    let (bursts, per) = (19u64, 160u64);
    for b in 0..bursts {
        let mut bufs: Vec<Vec<u8>> = (0..per)
            .map(|i| {
                let mut f = vec![0u8; h + 64];
                frame::write_template(&mut f[h..], 64, [2, 0, 0, 0, 0x13, 2], kernel_mac);
                frame::set_seq(&mut f[h..], b * per + i);
                f
            })
            .collect();
        let segs: Vec<[Seg<'_>; 1]> = bufs.iter_mut().map(|f| [Seg::from_mut(f)]).collect();
        let pkts: Vec<Pkt<'_>> = segs
            .iter()
            .map(|s| Pkt {
                segs: s,
                len: HDR_LEN + 64,
                hdr_len: HDR_LEN,
                hdr: VnetHdr::default(),
                macs: [0; 12],
                hash: 0,
                vlan: 0,
            })
            .collect();
        assert!(port.tx_begin(Instant::now(), pkts.len()));
        let (n, out) = port.tx_burst(&pkts);
        port.tx_commit();
        assert_eq!(n, pkts.len(), "burst {b}: {out:?}");
    }
    let sent = bursts * per;
    let deadline = Instant::now() + Duration::from_secs(2);
    while kernel_counts(&veth.b).0 - rx0 < sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        kernel_counts(&veth.b).0 - rx0,
        sent,
        "the kernel got every frame"
    );
    assert_eq!(get(&stats.tx_packets), sent);
    assert_eq!(stats.snapshot(11).drops.iter().map(|d| d.1).sum::<u64>(), 0);
    port.idle(Instant::now(), &mut crate::poll::plan::Settle::new());
    let limit = get(&stats.dql_limit);
    assert!(
        (64..=u64::from(crate::sys::xdp::TX_FRAMES)).contains(&limit),
        "the limit: {limit}"
    );
}

/// The interface's MTU changed under a running port: the port's follows within a second, so
/// the switch checks frames against the new one.
#[test]
fn af_xdp_port_follows_its_interfaces_mtu() {
    let (veth, _) = Veth::new("m", 48);
    let dev = open(&veth.a, ModeReq::Native);
    let mut port = AnyPort::AfXdp(AfXdpPort::new(9, Arc::default(), dev));
    crate::port::tests::follows_mtu(&mut port, &veth.a, 1500, 9000);
}

/// More frames than the port has receive frames, sent while it does not read: the kernel
/// drops the rest (no fill frame, no ring room) and the port's `kernel_drops` says how many,
/// so that what it received and what the kernel dropped add up to what was sent.
#[test]
fn af_xdp_port_counts_what_the_kernel_dropped_before_it() {
    let (veth, _) = Veth::new("k", 49);
    let stats: Arc<PortStats> = Arc::default();
    let mut port = AnyPort::AfXdp(AfXdpPort::new(
        10,
        stats.clone(),
        open(&veth.a, ModeReq::Native),
    ));
    let sock = crate::sys::packet::open(&veth.b).unwrap_or_else(|e| panic!("{e}"));
    let sent = 1500u64;
    from_kernel(
        &sock,
        0..sent,
        64,
        ([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0, 8]),
        true,
    );
    std::thread::sleep(Duration::from_millis(50));
    port.idle(Instant::now(), &mut crate::poll::plan::Settle::new());
    let dropped = get(&stats.kernel_drops);
    let mut c = Collect::all();
    collect(&mut port, &mut c, |c| c.got.len() as u64 + dropped >= sent);
    let got = get(&stats.rx_packets);
    assert!(dropped > 0, "the receive frames ran out: {dropped}");
    assert_eq!(
        got + dropped,
        sent,
        "received {got}, dropped in the kernel {dropped}"
    );
}
