//! `pvnet switch` with `af-xdp` ports on veth pairs, the kernel on their other ends: ping and
//! iperf3 through the switch both ways (one port in native mode, one in generic), a port added
//! and removed at runtime with no XDP program left behind, and an interface deleted under a
//! running port (the port goes down, the switch runs on). Everything in the test thread's
//! private network namespace plus one named namespace of its own (removed on drop).

mod common;

use common::{ctl_json, port_named, wait_socket, Proc, TestDir};
use std::process::Command;
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> std::process::Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {args:?}: {e}"))
}

fn ok(args: &[&str]) {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Leaves the machine's network namespace for a private one (this thread and what it starts).
fn private_netns() {
    // SAFETY: plain syscall, no pointers.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
    ok(&["ip", "link", "set", "lo", "up"]);
}

/// A named namespace (the far end's stack), deleted on drop.
struct NetNs(String);

impl NetNs {
    fn new(tag: &str) -> Self {
        let n = format!("pvnet-{}-{tag}", std::process::id());
        let _ = run(&["ip", "netns", "del", &n]);
        ok(&["ip", "netns", "add", &n]);
        ok(&["ip", "-n", &n, "link", "set", "lo", "up"]);
        Self(n)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = run(&["ip", "netns", "del", &self.0]);
    }
}

/// Veth `<name>a` (for pvnet, IPv6 off) and `<name>b` (the kernel's, up, checksum offload
/// off: an XDP port takes no partial checksum from the kernel), `b` moved into `ns` if given,
/// with `addr`.
fn veth(name: &str, ns: Option<&str>, addr: &str) {
    let (a, b) = (format!("{name}a"), format!("{name}b"));
    ok(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]);
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{a}/disable_ipv6"), "1");
    let _ = run(&["ethtool", "-K", &b, "tx", "off"]);
    if let Some(ns) = ns {
        ok(&["ip", "link", "set", &b, "netns", ns]);
        ok(&["ip", "-n", ns, "addr", "add", addr, "dev", &b]);
        ok(&["ip", "-n", ns, "link", "set", &b, "up"]);
    } else {
        ok(&["ip", "addr", "add", addr, "dev", &b]);
        ok(&["ip", "link", "set", &b, "up"]);
    }
}

fn link_show(dev: &str) -> String {
    String::from_utf8_lossy(&run(&["ip", "link", "show", "dev", dev]).stdout).into_owned()
}

/// Waits (<= 2 s) for `dev`'s XDP program to leave it (a port deleted: the kernel lets go of
/// the link a moment after the close).
fn wait_no_program(dev: &str) {
    let gone = Instant::now() + Duration::from_secs(2);
    while link_show(dev).contains("xdp") {
        assert!(Instant::now() < gone, "program left: {}", link_show(dev));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Ping both ways between this namespace (`near`) and namespace `ns` (`far`), then iperf3
/// (TCP and UDP, both ways) against a server at `far`.
fn ping_and_iperf3_both_ways(ns: &str, near: &str, far: &str) {
    ok(&["ping", "-c", "3", "-i", "0.2", "-W", "2", far]);
    ok(&[
        "ip", "netns", "exec", ns, "ping", "-c", "3", "-i", "0.2", "-W", "2", near,
    ]);
    let mut server = Command::new("ip")
        .args(["netns", "exec", ns, "iperf3", "-s", "-B", far])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("iperf3 server");
    std::thread::sleep(Duration::from_millis(500));
    common::iperf3_both_ways(far);
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn af_xdp_ports_carry_ping_and_iperf3_and_come_and_go() {
    private_netns();
    let far = NetNs::new("xdp");
    let id = std::process::id() % 10000;
    let (x0, x1, x2) = (
        format!("pvq{id}0"),
        format!("pvq{id}1"),
        format!("pvq{id}2"),
    );
    veth(&x0, None, "10.215.0.1/24");
    veth(&x1, Some(&far.0), "10.215.0.2/24");
    let dir = TestDir::new("xdp");
    let c = dir.sock("ctl");
    let p0 = format!("af-xdp:name=p0,ifname={x0}a,mode=native");
    // p1 with an egress queue under DQL (its frames in flight bounded by its completions).
    let p1 = format!("af-xdp:name=p1,ifname={x1}a,mode=generic,qdisc=fq_codel");
    let mut sw = Proc::spawn(
        "switch",
        &[
            "switch",
            "--port",
            &p0,
            "--port",
            &p1,
            "--ctl-socket",
            c.to_str().expect("utf-8"),
        ],
        &[("PVNET_LOG", "info")],
    );
    wait_socket(&mut sw, &c);
    let (_, ports) = ctl_json(&c, &["ports"]);
    let d0 = port_named(&ports, "p0")["detail"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let d1 = port_named(&ports, "p1")["detail"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(d0.contains("XDP native"), "{d0}");
    assert!(d1.contains("XDP generic"), "{d1}");
    assert!(d0.contains("egress none"), "{d0}");
    assert!(d1.contains("egress fq_codel+dql"), "{d1}");
    assert!(link_show(&format!("{x0}a")).contains("xdp "));
    assert!(link_show(&format!("{x1}a")).contains("xdpgeneric"));

    // Ping, and iperf3 TCP and UDP, both ways through the switch.
    ping_and_iperf3_both_ways(&far.0, "10.215.0.1", "10.215.0.2");

    // A port added and removed at runtime: its program comes and goes with it.
    veth(&x2, None, "10.216.0.1/24");
    let x2a = format!("{x2}a");
    let spec = format!("af-xdp:name=p2,ifname={x2a}");
    let (added, v) = ctl_json(&c, &["port", "add", &spec]);
    assert!(added, "port add: {v}");
    assert!(link_show(&x2a).contains("xdp"), "{}", link_show(&x2a));
    let (deleted, v) = ctl_json(&c, &["port", "del", "p2"]);
    assert!(deleted, "port del: {v}");
    // Added again at once: its queue, which the kernel lets go of a moment after the close,
    // is waited for, not refused.
    let (added, v) = ctl_json(&c, &["port", "add", &spec]);
    assert!(added, "port added again: {v}");
    let (deleted, v) = ctl_json(&c, &["port", "del", "p2"]);
    assert!(deleted, "port del: {v}");
    wait_no_program(&x2a);

    // The interface under p1 goes away: p1 goes down once it is sent something, the switch
    // and p0 run on.
    ok(&["ip", "link", "del", &format!("{x1}a")]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _ = run(&["ping", "-c", "1", "-W", "0.2", "10.215.0.2"]);
        let (answered, ports) = ctl_json(&c, &["ports"]);
        assert!(answered, "the switch answers");
        if port_named(&ports, "p1")["state"] == "down" {
            assert_eq!(port_named(&ports, "p0")["state"], "up");
            break;
        }
        assert!(Instant::now() < deadline, "p1 never went down: {ports}");
    }
    assert!(sw.alive(), "the switch runs on");
    assert!(sw
        .stderr()
        .contains("the interface is gone; the port is down"));
}

/// Veth `<name>a` (pvnet's) and `<name>b` (in `ns`, with `addr`), two queues each way, IPv6
/// off on both ends (no stray frames), the kernel's end sending on transmit queue `k` from
/// CPU `k` (XPS), so that which of pvnet's lanes a frame reaches is the sender's CPU.
fn veth2(name: &str, ns: &str, addr: &str) {
    let (a, b) = (format!("{name}a"), format!("{name}b"));
    ok(&[
        "ip",
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
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{a}/disable_ipv6"), "1");
    let _ = run(&["ethtool", "-K", &b, "tx", "off"]);
    ok(&["ip", "link", "set", &b, "netns", ns]);
    let sysctl = format!("net.ipv6.conf.{b}.disable_ipv6=1");
    ok(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", &sysctl]);
    for (q, cpus) in [(0, "1"), (1, "2")] {
        let xps = format!("/sys/class/net/{b}/queues/tx-{q}/xps_cpus");
        ok(&[
            "ip",
            "netns",
            "exec",
            ns,
            "sh",
            "-c",
            &format!("echo {cpus} > {xps}"),
        ]);
    }
    ok(&["ip", "-n", ns, "addr", "add", addr, "dev", &b]);
    ok(&["ip", "-n", ns, "link", "set", &b, "up"]);
}

/// Runs `f` on a thread of its own in network namespace `ns`, pinned to `cpu` (sockets it
/// opens stay in that namespace).
fn in_netns<T: Send>(ns: &str, cpu: usize, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let nsf = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("netns");
            // SAFETY: plain syscalls on a valid fd and a zeroed cpu set.
            unsafe {
                use std::os::fd::AsRawFd;
                assert_eq!(libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET), 0, "setns");
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, size_of_val(&set), &set),
                    0,
                    "pin"
                );
            }
            f()
        })
        .join()
        .expect("netns thread")
    })
}

/// Ethertype of the test's own frames (IEEE local experimental).
const PROBE: u16 = 0x88b5;

/// A packet socket on `ifname` (in the calling thread's namespace) for the test's frames.
fn probe_socket(ifname: &str) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    let name = std::ffi::CString::new(ifname).expect("name");
    // SAFETY: plain syscalls; the address struct is fully initialised.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(PROBE.to_be()));
        assert!(
            fd >= 0,
            "packet socket: {}",
            std::io::Error::last_os_error()
        );
        let fd = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut sa: libc::sockaddr_ll = std::mem::zeroed();
        sa.sll_family = u16::try_from(libc::AF_PACKET).expect("family");
        sa.sll_protocol = PROBE.to_be();
        sa.sll_ifindex = i32::try_from(libc::if_nametoindex(name.as_ptr())).expect("ifindex");
        use std::os::fd::AsRawFd;
        let rc = libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(sa).cast(),
            u32::try_from(size_of_val(&sa)).expect("len"),
        );
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        fd
    }
}

/// Sends `n` broadcast frames of the test's ethertype, from source address `src`.
fn send_probes(fd: &std::os::fd::OwnedFd, src: u8, n: usize) {
    let mut f = [0u8; 60];
    f[..6].fill(0xff);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0x5e, src]);
    f[12..14].copy_from_slice(&PROBE.to_be_bytes());
    send_frames(fd, &f, n);
}

/// Sends frame `f` `n` times on `fd`, 200 us apart.
fn send_frames(fd: &std::os::fd::OwnedFd, f: &[u8], n: usize) {
    for _ in 0..n {
        send_frame(fd, f);
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Counts the test's frames that arrive on `fd`, by the last byte of their source address,
/// until none has come for half a second.
fn count_probes(fd: &std::os::fd::OwnedFd) -> [usize; 256] {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 500_000,
    };
    // SAFETY: a valid option value of its size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::addr_of!(tv).cast(),
            u32::try_from(size_of_val(&tv)).expect("len"),
        );
    }
    let mut buf = [0u8; 2048];
    let mut n = [0; 256];
    loop {
        // SAFETY: a valid buffer of its length.
        let r = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if r < 0 {
            return n;
        }
        if r >= 14 && buf[12..14] == PROBE.to_be_bytes() {
            n[usize::from(buf[11])] += 1;
        }
    }
}

/// `pvnet switch --workers 2` with an `af-xdp` port on a two-queue veth: a lane on each
/// worker, each reading the queue its CPU's frames come in on. The far end's broadcasts
/// from both CPUs reach the other port once each; the other port's broadcasts reach the far
/// end once each (not once through each lane); ping and iperf3 (TCP over 4 streams, UDP)
/// through it both ways; removed, its program leaves the interface.
#[test]
fn an_af_xdp_port_spread_over_workers_carries_each_frame_once() {
    private_netns();
    let far = NetNs::new("lanes");
    let id = std::process::id() % 10000;
    let (xw, xk) = (format!("pvl{id}w"), format!("pvl{id}k"));
    veth2(&xw, &far.0, "10.217.0.2/24");
    veth(&xk, None, "10.217.0.1/24");
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{xk}b/disable_ipv6"), "1");
    let dir = TestDir::new("lanes");
    let c = dir.sock("ctl");
    let wire = format!("af-xdp:name=wire,ifname={xw}a,queues=2,mode=native");
    let host = format!("af-packet:name=host,ifname={xk}a");
    let mut sw = Proc::spawn(
        "switch",
        &[
            "switch",
            "--workers",
            "2",
            "--port",
            &wire,
            "--port",
            &host,
            "--ctl-socket",
            c.to_str().expect("utf-8"),
        ],
        &[("PVNET_LOG", "info")],
    );
    wait_socket(&mut sw, &c);
    let (_, ports) = ctl_json(&c, &["ports"]);
    let detail = port_named(&ports, "wire")["detail"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        detail.contains("2 queues") && detail.contains("2 lanes"),
        "{detail}"
    );
    let placed = common::placement(&ports);
    assert!(
        placed.iter().all(|w| w.contains(&"wire".to_string())),
        "a lane on each worker: {placed:?}"
    );

    // The far end broadcasts 100 frames from each CPU (so on each queue): the host's end
    // gets each once; each lane read those of its queue.
    let at_host = probe_socket(&format!("{xk}b"));
    for cpu in [0, 1] {
        in_netns(&far.0, cpu, || {
            send_probes(
                &probe_socket(&format!("{xw}b")),
                0x10 + u8::try_from(cpu).expect("cpu"),
                100,
            );
        });
    }
    let got = count_probes(&at_host);
    assert_eq!((got[0x10], got[0x11]), (100, 100), "from CPU 0, from CPU 1");
    let (_, ports) = ctl_json(&c, &["ports"]);
    let lanes = port_named(&ports, "wire")["queues"].clone();
    let rx: Vec<u64> = lanes
        .as_array()
        .unwrap_or_else(|| panic!("per-lane counters: {lanes}"))
        .iter()
        .map(|q| q["rx_packets"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        rx.len() == 2 && rx.iter().all(|&n| n >= 100),
        "each lane read its queue: {rx:?}"
    );

    // The host's end broadcasts 100: the far end gets each once (one lane sends it).
    let (far_ns, xwb) = (far.0.clone(), format!("{xw}b"));
    let counted = std::thread::scope(|s| {
        let t = s.spawn(|| in_netns(&far_ns, 0, || count_probes(&probe_socket(&xwb))[0x20]));
        std::thread::sleep(Duration::from_millis(200));
        send_probes(&at_host, 0x20, 100);
        t.join().expect("counter")
    });
    assert_eq!(counted, 100, "each broadcast once on the wire");

    // Ping and iperf3 both ways.
    ping_and_iperf3_both_ways(&far.0, "10.217.0.1", "10.217.0.2");

    // Removed: both lanes go, and the program with the last of them.
    let (deleted, v) = ctl_json(&c, &["port", "del", "wire"]);
    assert!(deleted, "port del: {v}");
    wait_no_program(&format!("{xw}a"));
    assert!(sw.alive(), "the switch runs on");
}

/// An `af-packet` trunk port (VLANs 10 and 20, no native VLAN) on a veth: frames the far end
/// sends tagged reach the sink of their VLAN, each once, although the kernel takes every
/// received tag out of the frame before a packet socket sees it (the port puts it back from
/// `PACKET_AUXDATA`). Before that fix, every one was dropped as `vlan_filtered`.
#[test]
fn an_af_packet_trunk_port_keeps_the_tags_the_kernel_took_out() {
    private_netns();
    let xk = format!("pvt{}k", std::process::id() % 10000);
    veth(&xk, None, "10.218.0.1/24");
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{xk}b/disable_ipv6"), "1");
    trunk_keeps_tags(
        "aftag",
        &format!("af-packet:name=a,ifname={xk}a,trunk=10,20"),
        &format!("{xk}b"),
    );
}

/// An `af-xdp` trunk port (native mode) on a veth behind a Linux bridge: the bridge's port
/// took each frame's tag out of its bytes on receipt (`skb_vlan_untag`) and sends it on with
/// the tag beside the frame (the veth's transmit VLAN offload), so XDP sees the frame
/// untagged; the program reads the tag (`bpf_xdp_metadata_rx_vlan_tag`) and the port puts it
/// back, and each frame reaches the sink of its VLAN once. Before, every one was dropped as
/// `vlan_filtered`.
#[test]
fn an_af_xdp_trunk_port_keeps_the_tags_a_bridge_took_out() {
    private_netns();
    let id = std::process::id() % 10000;
    let (src, wire, br) = (
        format!("pvt{id}s"),
        format!("pvt{id}w"),
        format!("pvt{id}r"),
    );
    ok(&["ip", "link", "add", &br, "type", "bridge", "stp_state", "0"]);
    for v in [&src, &wire] {
        let (a, b) = (format!("{v}a"), format!("{v}b"));
        ok(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]);
        ok(&["ip", "link", "set", &b, "master", &br]);
    }
    for d in [
        &br,
        &format!("{src}a"),
        &format!("{src}b"),
        &format!("{wire}b"),
    ] {
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{d}/disable_ipv6"), "1");
        ok(&["ip", "link", "set", d, "up"]);
    }
    let c = trunk_keeps_tags(
        "xdptag",
        &format!("af-xdp:name=a,ifname={wire}a,mode=native,trunk=10,20"),
        &format!("{src}a"),
    );
    let (_, ports) = ctl_json(&c.1, &["ports"]);
    let detail = port_named(&ports, "a")["detail"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(detail.contains("rx-vlan"), "{detail}");
}

/// `pvnet switch` with `trunk` (a trunk port of VLANs 10 and 20) and a sink in each VLAN; 50
/// broadcasts tagged 10 and 30 tagged 20 sent into interface `source`, whose frames reach the
/// trunk's interface: the sinks take exactly 50 and 30. Returns the running switch and its
/// control socket.
fn trunk_keeps_tags(tag: &str, trunk: &str, source: &str) -> (Proc, std::path::PathBuf, TestDir) {
    let dir = TestDir::new(tag);
    let c = dir.sock("ctl");
    let mut sw = Proc::spawn(
        "switch",
        &[
            "switch",
            "--port",
            trunk,
            "--port",
            "sink:name=s10,vlan=10",
            "--port",
            "sink:name=s20,vlan=20",
            "--ctl-socket",
            c.to_str().expect("utf-8"),
        ],
        &[("PVNET_LOG", "info")],
    );
    wait_socket(&mut sw, &c);
    let wire = probe_socket(source);
    for (vid, n) in [(10u8, 50), (20, 30)] {
        let mut f = [0u8; 64];
        f[..6].fill(0xff);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0x5e, vid]);
        f[12..16].copy_from_slice(&[0x81, 0x00, 0x00, vid]);
        f[16..18].copy_from_slice(&PROBE.to_be_bytes());
        send_frames(&wire, &f, n);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let took = |ports: &serde_json::Value, name: &str| {
        port_named(ports, name)["counters"]["tx_packets"]
            .as_u64()
            .unwrap_or(0)
    };
    loop {
        let (_, ports) = ctl_json(&c, &["ports"]);
        let got = (took(&ports, "s10"), took(&ports, "s20"));
        if got == (50, 30) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sinks took {got:?} of (50, 30): {ports}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(sw.alive());
    (sw, c, dir)
}

/// Numbered bench frames `first..first + n` (lengths cycling over 60..=1514: every size the
/// port may lend for), then the end marker counting `first + n`, into interface `fd`'s link,
/// from source address `src` to `dst`; in bursts of 32, 1 ms apart (the kernel drops what
/// finds no buffer, and the receiver checks every number).
fn send_numbered(fd: &std::os::fd::OwnedFd, (src, dst): ([u8; 6], [u8; 6]), first: u64, n: u64) {
    use pvnet_dataplane::frame::{set_end, set_seq, write_template};
    let mut f = vec![0u8; 1514];
    for (k, seq) in (first..first + n).enumerate() {
        let len = 60 + (k * 97) % (1514 - 60 + 1);
        write_template(&mut f, len, src, dst);
        set_seq(&mut f, seq);
        send_frame(fd, &f[..len]);
        if k % 32 == 31 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    write_template(&mut f, 60, src, dst);
    set_end(&mut f, first + n);
    std::thread::sleep(Duration::from_millis(20));
    send_frame(fd, &f[..60]);
}

/// Sends frame `f` once on `fd`.
fn send_frame(fd: &std::os::fd::OwnedFd, f: &[u8]) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid buffer of its length.
    let w = unsafe { libc::send(fd.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
    assert_eq!(
        usize::try_from(w).ok(),
        Some(f.len()),
        "send: {}",
        std::io::Error::last_os_error()
    );
}

/// Direct receive (`direct=true`): `pvnet switch` with a native `af-xdp` port and a vhost-user
/// frontend (`pvnet frontend --role rx`, buffers of 2048 bytes), 2000 numbered frames of 60 to
/// 1514 bytes sent into the veth: the frontend takes every one, in order, and the port wrote
/// every one straight into the frontend's buffers (`rx_direct` = `rx_packets`). The frontend
/// goes and a second one comes, with memory of its own: the port called the first one's loans
/// in, rebuilt its socket over the second one's memory, and every frame goes in place again.
/// With buffers too small to lend (1024 bytes), every frame arrives, copied (`rx_direct` 0).
#[test]
fn an_af_xdp_port_receives_straight_into_a_frontends_buffers() {
    private_netns();
    let id = std::process::id() % 10000;
    let name = format!("pvd{id}");
    veth(&name, None, "10.215.0.1/24");
    // Nothing of the kernel's own (IPv6 neighbour discovery) among the counted frames.
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}b/disable_ipv6"), "1");
    ok(&["ip", "link", "set", &format!("{name}a"), "up"]);
    let dir = TestDir::new("xdpdirect");
    let (c, vu) = (dir.sock("ctl"), dir.sock("vm"));
    let mut sw = Proc::spawn(
        "switch",
        &[
            "switch",
            "--port",
            &format!("vhost-user:name=vm,socket={}", vu.display()),
            "--port",
            &format!("af-xdp:name=wire,ifname={name}a,mode=native,direct=true"),
            "--ctl-socket",
            c.to_str().expect("utf-8"),
        ],
        &[("PVNET_LOG", "info")],
    );
    wait_socket(&mut sw, &vu);
    wait_socket(&mut sw, &c);
    let fd = probe_socket(&format!("{name}b"));
    let macs = ([2, 0, 0, 0, 0x5d, 1], [2, 0, 0, 0, 0x5d, 2]);
    let wire = || {
        let (_, ports) = ctl_json(&c, &["ports"]);
        port_named(&ports, "wire").clone()
    };
    let mut seen = (0, 0);
    for (round, bufs) in ["fixed:2048", "fixed:2048", "fixed:1024"]
        .iter()
        .enumerate()
    {
        let fe = common::frontend(
            "frontend",
            &vu,
            &["--role", "rx", "--rx-buffers", bufs, "--idle-timeout", "20"],
        );
        fe.wait_json("ready", Duration::from_secs(10));
        if round < 2 {
            sw.wait_stderr_count(
                &["sockets rebuilt over the frontend's memory"],
                round + 1,
                Duration::from_secs(10),
            );
        }
        std::thread::sleep(Duration::from_millis(200));
        send_numbered(&fd, macs, 0, 2000);
        let mut fe = fe;
        let fin = fe.finish(Duration::from_secs(30));
        assert_eq!(fin["data_received"], 2000, "round {round}: {fin}");
        assert_eq!(fin["seq_errors"], 0, "round {round}: {fin}");
        assert_eq!(fin["complete"], true, "round {round}: {fin}");
        let w = wire();
        let (rx, direct) = (
            common::u(&w, "/counters/rx_packets"),
            common::u(&w, "/counters/rx_direct"),
        );
        let (n, d) = (rx - seen.0, direct - seen.1);
        assert_eq!(n, 2001, "round {round}: {w}");
        if round < 2 {
            assert_eq!(d, n, "round {round}: every frame in place: {w}");
        } else {
            assert_eq!(d, 0, "buffers too small to lend: copied: {w}");
        }
        seen = (rx, direct);
        assert!(w["detail"].as_str().unwrap_or("").contains("direct"), "{w}");
        if round == 0 {
            sw.wait_stderr("loans called in", Duration::from_secs(10));
        }
    }
    assert_eq!(common::u(&wire(), "/counters/drops_invalid"), 0);
    sw.signal(libc::SIGINT);
    sw.wait_exit(Duration::from_secs(10));
    wait_no_program(&format!("{name}a"));
}
