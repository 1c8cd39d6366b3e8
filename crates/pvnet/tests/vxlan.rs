//! `pvnet switch` with `vxlan` ports, in the test thread's private network namespace plus
//! named namespaces of its own (removed on drop), joined by veths:
//!
//! * against the Linux kernel's own `vxlan` device in another namespace: ping both ways
//!   between a tap in pvnet's namespace and the kernel's address behind its vxlan device,
//!   the kernel's counters and pvnet's agreeing exactly, each side learning the other's
//!   address behind the tunnel; iperf3 TCP and UDP both ways;
//! * two `pvnet switch` processes in two namespaces: a generator on one, a sink on the
//!   other, each way in turn, counts exact across the tunnel and addresses learned on both
//!   sides; the tunnel ports are trunks of VLAN 10 and the generator and sink its access
//!   ports, so every frame crosses the tunnel tagged (the tag inserted by the switch in
//!   memory of its own, copied by the port: `Port::staged`);
//! * the same two switches with pvnet's own vhost-user frontends on access ports: numbered
//!   frames each way, every one delivered once and in order, each port's counters exact,
//!   the sender learned behind the tunnel on the far side.

mod common;

use common::{ctl_json, port_named, wait_socket, Proc, TestDir};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> std::process::Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {args:?}: {e}"))
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Leaves the machine's network namespace for a private one (this thread and what it
/// starts), IPv6 off for what is made in it (nothing of the kernel's own on the links).
fn private_netns() {
    // SAFETY: plain syscall, no pointers.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
    ok(&["ip", "link", "set", "lo", "up"]);
    // /proc/sys/net is the calling thread's namespace's.
    let _ = std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
}

/// A named namespace, IPv6 off for the links made in it, deleted on drop.
struct NetNs(String);

impl NetNs {
    fn new(tag: &str) -> Self {
        let n = format!("pvnet-{}-{tag}", std::process::id());
        let _ = run(&["ip", "netns", "del", &n]);
        ok(&["ip", "netns", "add", &n]);
        ok(&["ip", "-n", &n, "link", "set", "lo", "up"]);
        ok(&[
            "ip",
            "netns",
            "exec",
            &n,
            "sysctl",
            "-qw",
            "net.ipv6.conf.default.disable_ipv6=1",
        ]);
        Self(n)
    }

    /// Runs `args` inside it; panics on failure; its stdout.
    fn exec(&self, args: &[&str]) -> String {
        let mut a = vec!["ip", "netns", "exec", &self.0];
        a.extend_from_slice(args);
        ok(&a)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = run(&["ip", "netns", "del", &self.0]);
    }
}

/// Veth `<name>a` (here, `addr_a`, up) and `<name>b` (moved into `ns`, `addr_b`, up, transmit
/// checksum offload off: a datagram's inner checksum must be complete on the wire).
fn veth(name: &str, ns: &NetNs, addr_a: &str, addr_b: &str) {
    let (a, b) = (format!("{name}a"), format!("{name}b"));
    ok(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]);
    ok(&["ip", "link", "set", &b, "netns", &ns.0]);
    ok(&["ip", "addr", "add", addr_a, "dev", &a]);
    ok(&["ip", "link", "set", &a, "up"]);
    ok(&["ip", "-n", &ns.0, "addr", "add", addr_b, "dev", &b]);
    ok(&["ip", "-n", &ns.0, "link", "set", &b, "up"]);
    let _ = run(&[
        "ip", "netns", "exec", &ns.0, "ethtool", "-K", &b, "tx", "off",
    ]);
}

/// A counter of port `name` of the switch at `sock`, now.
fn counter(sock: &Path, name: &str, key: &str) -> u64 {
    let (_, v) = ctl_json(sock, &["ports"]);
    port_named(&v, name)["counters"][key].as_u64().unwrap_or(0)
}

/// Every drop counter of every port of the switch at `sock`, summed.
fn all_drops(sock: &Path) -> u64 {
    let (_, v) = ctl_json(sock, &["ports"]);
    v["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["counters"].as_object().into_iter().flatten())
        .filter(|(k, _)| k.starts_with("drops_"))
        .map(|(_, n)| n.as_u64().unwrap_or(0))
        .sum()
}

/// The port `mac` is learned on in the switch at `sock`, if it is.
fn learned_on(sock: &Path, mac: &str) -> Option<String> {
    let (_, v) = ctl_json(sock, &["macs"]);
    let macs = v["macs"].as_array().or_else(|| v.as_array()).cloned()?;
    macs.iter()
        .find(|m| m["mac"] == mac)
        .and_then(|m| m["port"].as_str().map(str::to_string))
}

/// The kernel's packet counters of `dev` (in `ns` if given): (rx, tx).
fn kernel_counts(ns: Option<&NetNs>, dev: &str) -> (u64, u64) {
    let mut a = vec!["ip"];
    if let Some(n) = ns {
        a.extend_from_slice(&["-n", &n.0]);
    }
    a.extend_from_slice(&["-s", "-j", "link", "show", "dev", dev]);
    let v: Value = serde_json::from_str(&ok(&a)).expect("ip -j");
    let s = &v[0]["stats64"];
    (
        s["rx"]["packets"].as_u64().unwrap_or(0),
        s["tx"]["packets"].as_u64().unwrap_or(0),
    )
}

/// The MAC address of `dev` (in `ns` if given).
fn link_mac(ns: Option<&NetNs>, dev: &str) -> String {
    let mut a = vec!["ip"];
    if let Some(n) = ns {
        a.extend_from_slice(&["-n", &n.0]);
    }
    a.extend_from_slice(&["-j", "link", "show", "dev", dev]);
    let v: Value = serde_json::from_str(&ok(&a)).expect("ip -j");
    v[0]["address"].as_str().expect("address").to_string()
}

/// Waits until `f` holds, up to 10 s.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn vxlan_port_talks_to_the_kernels_vxlan_device_both_ways() {
    private_netns();
    let k = NetNs::new("vxk");
    let id = std::process::id() % 10000;
    let v = format!("pvv{id}");
    veth(&v, &k, "10.230.0.1/24", "10.230.0.2/24");
    // The kernel's side: its vxlan device (VNI 42) towards pvnet, an address behind it.
    let vb = format!("{v}b");
    ok(&[
        "ip",
        "-n",
        &k.0,
        "link",
        "add",
        "vx0",
        "type",
        "vxlan",
        "id",
        "42",
        "remote",
        "10.230.0.1",
        "local",
        "10.230.0.2",
        "dstport",
        "4789",
        "dev",
        &vb,
    ]);
    ok(&[
        "ip",
        "-n",
        &k.0,
        "addr",
        "add",
        "10.231.0.2/24",
        "dev",
        "vx0",
    ]);
    let _ = run(&[
        "ip", "netns", "exec", &k.0, "ethtool", "-K", "vx0", "tx", "off",
    ]);
    ok(&["ip", "-n", &k.0, "link", "set", "vx0", "up"]);

    // pvnet's side: the VXLAN port and a tap with the other address, MTU 1450 (50 less).
    let tap = format!("pvtv{id}");
    let dir = TestDir::new("vxk");
    let c = dir.sock("ctl");
    let t = "vxlan:name=t,local=10.230.0.1,remote=10.230.0.2,vni=42";
    let h = format!("tap:name=h,ifname={tap},mtu=1450");
    let mut sw = Proc::spawn(
        "switch",
        &[
            "switch",
            "--port",
            t,
            "--port",
            &h,
            "--ctl-socket",
            c.to_str().expect("utf-8"),
        ],
        &[("PVNET_LOG", "info")],
    );
    wait_socket(&mut sw, &c);
    let (_, ports) = ctl_json(&c, &["ports"]);
    let detail = port_named(&ports, "t")["detail"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(detail.contains("vni 42"), "{detail}");
    assert!(detail.contains("inner 1450"), "{detail}");
    ok(&["ip", "addr", "add", "10.231.0.1/24", "dev", &tap]);
    // Static neighbours: no ARP, so the counts below are the pings' alone.
    let (tap_mac, vx_mac) = (link_mac(None, &tap), link_mac(Some(&k), "vx0"));
    ok(&[
        "ip",
        "neigh",
        "replace",
        "10.231.0.2",
        "lladdr",
        &vx_mac,
        "dev",
        &tap,
        "nud",
        "permanent",
    ]);
    ok(&[
        "ip",
        "-n",
        &k.0,
        "neigh",
        "replace",
        "10.231.0.1",
        "lladdr",
        &tap_mac,
        "dev",
        "vx0",
        "nud",
        "permanent",
    ]);

    // Pings both ways (the first ones teach both sides where the other is).
    ok(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.231.0.2"]);
    k.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.231.0.1"]);

    // 20 more from the kernel's side: its vxlan device and pvnet's port count the same 20
    // each way, and so does the tap.
    let kb = kernel_counts(Some(&k), "vx0");
    let (trx, ttx) = (
        counter(&c, "t", "rx_packets"),
        counter(&c, "t", "tx_packets"),
    );
    let (hrx, htx) = (
        counter(&c, "h", "rx_packets"),
        counter(&c, "h", "tx_packets"),
    );
    k.exec(&[
        "ping",
        "-q",
        "-c",
        "20",
        "-i",
        "0.01",
        "-W",
        "2",
        "10.231.0.1",
    ]);
    let ka = kernel_counts(Some(&k), "vx0");
    assert_eq!(
        (ka.0 - kb.0, ka.1 - kb.1),
        (20, 20),
        "the kernel's vx0: rx, tx"
    );
    assert_eq!(counter(&c, "t", "rx_packets") - trx, 20, "pvnet's t: rx");
    assert_eq!(counter(&c, "t", "tx_packets") - ttx, 20, "pvnet's t: tx");
    assert_eq!(counter(&c, "h", "tx_packets") - htx, 20, "the tap: tx");
    assert_eq!(counter(&c, "h", "rx_packets") - hrx, 20, "the tap: rx");
    assert_eq!(all_drops(&c), 0);

    // Each side learned the other's address behind the tunnel.
    assert_eq!(learned_on(&c, &vx_mac).as_deref(), Some("t"));
    assert_eq!(learned_on(&c, &tap_mac).as_deref(), Some("h"));
    let fdb = ok(&["bridge", "-n", &k.0, "fdb", "show", "dev", "vx0"]);
    assert!(
        fdb.lines()
            .any(|l| l.starts_with(&tap_mac) && l.contains("dst 10.230.0.1")),
        "{fdb}"
    );

    // iperf3, TCP and UDP, both ways (-R: the server, behind the kernel's vxlan, sends).
    let mut server = Command::new("ip")
        .args(["netns", "exec", &k.0, "iperf3", "-s", "-B", "10.231.0.2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("iperf3 server");
    std::thread::sleep(Duration::from_millis(500));
    common::iperf3_both_ways("10.231.0.2");
    let _ = server.kill();
    let _ = server.wait();
    assert!(sw.alive(), "the switch runs on");
}

/// Waits until the generator `gen` of the switch at `from` has stopped and what it made has
/// reached `sink` of the switch at `to` (or 10 s).
fn wait_delivered(from: &Path, gen: &str, to: &Path, sink: &str) {
    let mut last = u64::MAX;
    wait_for("the generator's frames to arrive", || {
        let made = counter(from, gen, "rx_packets");
        let done = made > 0 && made == last && counter(to, sink, "tx_packets") >= made;
        last = made;
        std::thread::sleep(Duration::from_millis(200));
        done
    });
}

#[test]
fn two_switches_over_vxlan_count_exactly_and_learn_both_sides() {
    private_netns();
    let nb = NetNs::new("vxb");
    let id = std::process::id() % 10000;
    veth(&format!("pvw{id}"), &nb, "10.232.0.1/24", "10.232.0.2/24");
    let dir = TestDir::new("vx2");
    let (ca, cb) = (dir.sock("ca"), dir.sock("cb"));
    let (ga, gb) = ("02:00:00:00:0a:01", "02:00:00:00:0b:01");
    // B first (a datagram to a port nobody is bound to yet would be lost in the kernel):
    // its tunnel and a sink.
    let mut b = Proc::spawn_netns(
        &nb.0,
        "b",
        &[
            "switch",
            "--port",
            "vxlan:name=t,local=10.232.0.2,remote=10.232.0.1,vni=7,trunk=10",
            "--port",
            "sink:name=s,vlan=10",
            "--ctl-socket",
            cb.to_str().expect("utf-8"),
        ],
        &[("PVNET_LOG", "info")],
    );
    wait_socket(&mut b, &cb);
    // A: its tunnel and a generator, 20 Kpps for half a second.
    let gen_a = format!("gen:name=g,rate=20000,secs=0.5,delay=0.2,src={ga},dst={gb},vlan=10");
    let mut a = Proc::spawn(
        "a",
        &[
            "switch",
            "--port",
            "vxlan:name=t,local=10.232.0.1,remote=10.232.0.2,vni=7,trunk=10",
            "--port",
            &gen_a,
            "--ctl-socket",
            ca.to_str().expect("utf-8"),
        ],
        &[("PVNET_LOG", "info")],
    );
    wait_socket(&mut a, &ca);

    // A -> B: every frame made is sent into the tunnel, arrives and is taken by the sink.
    wait_delivered(&ca, "g", &cb, "s");
    let made = counter(&ca, "g", "rx_packets");
    assert!(made > 5000, "{made} frames");
    assert_eq!(counter(&ca, "t", "tx_packets"), made, "A's tunnel sent");
    assert_eq!(counter(&cb, "t", "rx_packets"), made, "B's tunnel received");
    assert_eq!(counter(&cb, "s", "tx_packets"), made, "B's sink took");
    assert_eq!(counter(&cb, "s", "seq_errors"), 0);
    assert_eq!(all_drops(&ca) + all_drops(&cb), 0);
    assert_eq!(learned_on(&cb, ga).as_deref(), Some("t"), "B learned A's");

    // B -> A: the generator on B, a sink on A in place of A's generator (so that A's address
    // is unknown there and its frames reach the sink). B sends them to the tunnel alone: A's
    // address is learned behind it, so B's own sink gets none.
    let (deleted, v) = ctl_json(&ca, &["port", "del", "g"]);
    assert!(deleted, "port del: {v}");
    let (added, v) = ctl_json(&ca, &["port", "add", "sink:name=s,vlan=10"]);
    assert!(added, "port add: {v}");
    let (a_rx, b_tx) = (
        counter(&ca, "t", "rx_packets"),
        counter(&cb, "t", "tx_packets"),
    );
    let b_sink = counter(&cb, "s", "tx_packets");
    let gen_b = format!("gen:name=g,rate=20000,secs=0.5,src={gb},dst={ga},vlan=10");
    let (added, v) = ctl_json(&cb, &["port", "add", &gen_b]);
    assert!(added, "port add: {v}");
    wait_delivered(&cb, "g", &ca, "s");
    let made = counter(&cb, "g", "rx_packets");
    assert!(made > 5000, "{made} frames");
    assert_eq!(
        counter(&cb, "t", "tx_packets") - b_tx,
        made,
        "B's tunnel sent"
    );
    assert_eq!(
        counter(&ca, "t", "rx_packets") - a_rx,
        made,
        "A's tunnel received"
    );
    assert_eq!(counter(&ca, "s", "tx_packets"), made, "A's sink took");
    assert_eq!(counter(&ca, "s", "seq_errors"), 0);
    assert_eq!(
        counter(&cb, "s", "tx_packets"),
        b_sink,
        "nothing flooded on B"
    );
    assert_eq!(all_drops(&ca) + all_drops(&cb), 0);
    assert_eq!(learned_on(&ca, gb).as_deref(), Some("t"), "A learned B's");
    assert_eq!(learned_on(&cb, gb).as_deref(), Some("g"));
    assert!(a.alive() && b.alive());
}

/// Numbered frames from pvnet's frontend on the switch at `ctl_tx` (its vhost-user port `v`
/// on `tx`) to pvnet's frontend on the other switch (`rx`, `ctl_rx`) through both tunnel
/// ports: each frame arrives once and in order, and every counter on the way says so.
/// Returns the frames sent.
fn frontend_across(tx: &Path, ctl_tx: &Path, rx: &Path, ctl_rx: &Path) -> u64 {
    let (t_tx0, t_rx0) = (
        counter(ctl_tx, "t", "tx_packets"),
        counter(ctl_rx, "t", "rx_packets"),
    );
    let (v_rx0, v_tx0) = (
        counter(ctl_tx, "v", "rx_packets"),
        counter(ctl_rx, "v", "tx_packets"),
    );
    let mut r = common::frontend("frontend rx", rx, &["--role", "rx", "--queue-size", "1024"]);
    r.wait_json("ready", common::START);
    let sent = common::run_frontend(
        "frontend tx",
        tx,
        &["--role", "tx", "--secs", "0.4", "--rate", "20000"],
    );
    let got = r.finish(common::RUN);
    let sent = common::u(&sent, "/tx_packets");
    assert!(sent > 5000, "{sent} frames");
    assert_eq!(
        common::u(&got, "/rx_packets"),
        sent,
        "every frame arrived: {got}"
    );
    assert!(
        got["complete"].as_bool().unwrap_or(false),
        "in order, end marker: {got}"
    );
    assert_eq!(
        counter(ctl_tx, "v", "rx_packets") - v_rx0,
        sent,
        "the sender's port took"
    );
    assert_eq!(
        counter(ctl_tx, "t", "tx_packets") - t_tx0,
        sent,
        "the tunnel sent"
    );
    assert_eq!(
        counter(ctl_rx, "t", "rx_packets") - t_rx0,
        sent,
        "the far tunnel received"
    );
    assert_eq!(
        counter(ctl_rx, "v", "tx_packets") - v_tx0,
        sent,
        "the receiver's port gave"
    );
    sent
}

#[test]
fn frontends_on_two_switches_over_vxlan_get_every_frame_both_ways() {
    private_netns();
    let nb = NetNs::new("vxf");
    let id = std::process::id() % 10000;
    veth(&format!("pvf{id}"), &nb, "10.233.0.1/24", "10.233.0.2/24");
    let dir = TestDir::new("vxf");
    let (ca, cb) = (dir.sock("ca"), dir.sock("cb"));
    let (va, vb) = (dir.sock("va"), dir.sock("vb"));
    // Each switch: a tunnel port (a trunk of VLAN 10) and a vhost-user port (an access port
    // of it): every frame crosses the tunnel tagged, its tag inserted and removed on the way.
    let spec = |local: &str, remote: &str, v: &Path, c: &Path| {
        [
            "switch".to_string(),
            "--port".into(),
            format!("vxlan:name=t,local={local},remote={remote},vni=9,trunk=10"),
            "--port".into(),
            format!("vhost-user:name=v,socket={},vlan=10", v.display()),
            "--ctl-socket".into(),
            c.display().to_string(),
        ]
    };
    let sb = spec("10.233.0.2", "10.233.0.1", &vb, &cb);
    let sa = spec("10.233.0.1", "10.233.0.2", &va, &ca);
    let (sb, sa) = (
        sb.each_ref().map(String::as_str),
        sa.each_ref().map(String::as_str),
    );
    let mut b = Proc::spawn_netns(&nb.0, "b", &sb, &[("PVNET_LOG", "info")]);
    wait_socket(&mut b, &cb);
    let mut a = Proc::spawn("a", &sa, &[("PVNET_LOG", "info")]);
    wait_socket(&mut a, &ca);
    wait_socket(&mut a, &va);
    wait_socket(&mut b, &vb);

    frontend_across(&va, &ca, &vb, &cb);
    // The sender's address (pvnet's frontend sends from 02:00:00:00:00:03) learned behind the
    // tunnel on the far side.
    assert_eq!(learned_on(&cb, "02:00:00:00:00:03").as_deref(), Some("t"));
    frontend_across(&vb, &cb, &va, &ca);
    assert_eq!(learned_on(&ca, "02:00:00:00:00:03").as_deref(), Some("t"));
    assert_eq!(all_drops(&ca) + all_drops(&cb), 0);
    assert!(a.alive() && b.alive());
}
