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

    // Ping both ways through the switch.
    ok(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.215.0.2"]);
    ok(&[
        "ip",
        "netns",
        "exec",
        &far.0,
        "ping",
        "-c",
        "3",
        "-i",
        "0.2",
        "-W",
        "2",
        "10.215.0.1",
    ]);

    // iperf3, TCP and UDP, both ways (-R: the server sends).
    let mut server = Command::new("ip")
        .args(["netns", "exec", &far.0, "iperf3", "-s", "-B", "10.215.0.2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("iperf3 server");
    std::thread::sleep(Duration::from_millis(500));
    common::iperf3_both_ways("10.215.0.2");
    let _ = server.kill();
    let _ = server.wait();

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
    let gone = Instant::now() + Duration::from_secs(2);
    while link_show(&x2a).contains("xdp") {
        assert!(Instant::now() < gone, "program left: {}", link_show(&x2a));
        std::thread::sleep(Duration::from_millis(10));
    }

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
