//! `pvnet switch` end to end with pvnet's own frontends: frames cross the switch exactly,
//! `pvnet ctl` and the Prometheus endpoint report the same counters, and the final report
//! adds up. (Real peers, DPDK and a Linux guest with a tap, are in tests/interop/run.sh.)

mod common;

use common::{counters, frontend, placement, switch_drops, u, Switch, TestDir, RUN};
use std::io::{Read, Write};
use std::time::Duration;

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// b receives; a sends numbered frames to b's address (unknown at first: flooded to b and the
/// sink, then learned from nothing b sends, so flooding goes on; both copies count). Floods
/// never wait for a full receiver (their copy to it is dropped, counted), so b must keep up
/// even when this 2-core machine deschedules it: 1024 buffers at 20 Kpps last 50 ms (256 at
/// 50 Kpps, 5 ms, once lost 63 frames to a scheduler slice under CI load). Returns the frames
/// sent, each of which b got, in order, and ports a and b counted.
fn a_to_b(sw: &Switch) -> u64 {
    let mut rx = frontend(
        "frontend rx",
        &sw.b,
        &["--role", "rx", "--queue-size", "1024"],
    );
    rx.wait_json("ready", Duration::from_secs(20));
    let tx = frontend(
        "frontend tx",
        &sw.a,
        &["--role", "tx", "--secs", "0.4", "--rate", "20000"],
    )
    .finish(RUN);
    let rxf = rx.finish(RUN);
    let sent = u(&tx, "/tx_packets");
    assert!(sent > 5000, "{tx}");
    assert_eq!(u(&rxf, "/rx_packets"), sent, "b got every frame: {rxf}");
    assert!(
        rxf["complete"].as_bool().unwrap_or(false),
        "in order, end marker: {rxf}"
    );
    let st = sw.ctl("ports");
    assert_eq!(u(counters(&st, "a"), "/rx_packets"), sent);
    assert_eq!(u(counters(&st, "b"), "/tx_packets"), sent);
    sent
}

#[test]
fn frames_cross_the_switch_exactly_and_ctl_and_metrics_agree() {
    let dir = TestDir::new("sw");
    // A free port for the metrics endpoint.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let mut sw = Switch::start(&dir, &["--metrics", &metrics]);
    let sent = a_to_b(&sw);
    let st = sw.ctl("ports");
    let (ca, cb, cs) = (counters(&st, "a"), counters(&st, "b"), counters(&st, "s"));
    assert_eq!(
        u(cs, "/tx_packets"),
        sent,
        "the sink got the flooded copies"
    );
    assert_eq!(u(ca, "/flooded"), sent);
    // Batches (used->idx publishes): between one per ring's worth and one per packet.
    for (c, k) in [(ca, "rx"), (cb, "tx")] {
        let b = u(c, &format!("/{k}_batches"));
        assert!(
            b >= sent / 1024 && b > 0 && b <= sent,
            "{k}_batches {b} for {sent} packets: {c}"
        );
    }
    assert_eq!(switch_drops(ca), 0, "{ca}");
    // The sink checked the numbered frames: none out of order.
    assert_eq!(u(cs, "/seq_errors"), 0);

    let m = http_get(&metrics, "/metrics");
    assert!(m.starts_with("HTTP/1.0 200"), "{m}");
    let line = format!("pvnet_port_rx_packets_total{{port=\"a\",kind=\"vhost-user\"}} {sent}");
    assert!(m.contains(&line), "no `{line}` in\n{m}");
    assert!(http_get(&metrics, "/nope").starts_with("HTTP/1.0 404"));

    sw.proc.signal(libc::SIGINT);
    let fin = sw.proc.finish(RUN);
    assert_eq!(u(counters(&fin, "b"), "/tx_packets"), sent, "{fin}");
}

#[test]
fn bad_configuration_is_refused_with_a_clear_error() {
    for (args, needle) in [
        (
            vec![
                "switch",
                "--port",
                "vhost-user:name=v,socket=/x,queue_pairs=0",
            ],
            "queue_pairs",
        ),
        (vec!["switch", "--port", "router:name=r"], "unknown variant"),
        (
            vec!["switch", "--port", "sink:name=s", "--port", "sink:name=s"],
            "unique",
        ),
        (vec!["switch", "--port", "gen:name=g,src=zz"], "MAC"),
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(&args)
            .output()
            .expect("run pvnet switch");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Started by a service manager (`Type=notify`): the switch says READY=1 once its control
/// socket answers, and STOPPING=1 when it is stopped.
#[test]
fn the_switch_tells_the_service_manager_when_it_is_ready() {
    let dir = TestDir::new("notify");
    let notify = dir.sock("notify");
    let sock = std::os::unix::net::UnixDatagram::bind(&notify).expect("bind notify socket");
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let ctl = dir.sock("ctl");
    let ctl_s = ctl.to_string_lossy().to_string();
    let mut sw = common::Proc::spawn(
        "switch",
        &["switch", "--port", "sink:name=s", "--ctl-socket", &ctl_s],
        &[("NOTIFY_SOCKET", &notify.to_string_lossy())],
    );
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("READY within 20 s");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.starts_with("READY=1\n"), "{msg}");
    assert!(msg.contains("STATUS=switching 1 ports"), "{msg}");
    // Ready means the control socket answers.
    let out = std::process::Command::new(common::BIN)
        .args(["ctl", "--ctl-socket", &ctl_s, "ports", "--json"])
        .output()
        .expect("pvnet ctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sw.signal(libc::SIGTERM);
    let n = sock.recv(&mut buf).expect("STOPPING");
    assert_eq!(&buf[..n], b"STOPPING=1");
    assert!(sw.wait_exit(RUN).success());
}

/// `pvnet ctl ARGS... --json` against the control socket `ctl`: (success, JSON or stderr).
fn ctl(ctl: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(common::BIN)
        .arg("ctl")
        .arg("--ctl-socket")
        .arg(ctl)
        .args(args)
        .arg("--json")
        .output()
        .expect("run pvnet ctl");
    let text = if out.status.success() {
        String::from_utf8_lossy(&out.stdout).to_string()
    } else {
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    (out.status.success(), text)
}

fn ctl_ok(c: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let (ok, text) = ctl(c, args);
    assert!(ok, "pvnet ctl {args:?}: {text}");
    serde_json::from_str(&text).expect("ctl JSON")
}

fn port_names(c: &std::path::Path) -> Vec<String> {
    ctl_ok(c, &["ports"])["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// Ports are added, changed and deleted (over the control socket and by a reload of the
/// configuration file on SIGHUP) while numbered frames flow between two others: not one of
/// those frames is lost or reordered. Adding is idempotent, a conflict is refused, deleting a
/// port disconnects its frontend and reports its last counters, a port added at runtime comes
/// back after a restart (state file), and only the switch's user may use the socket.
#[test]
fn ports_change_at_runtime_without_loss_on_the_others() {
    let dir = TestDir::new("rt");
    let (a, b, c, ctl_sock) = (dir.sock("a"), dir.sock("b"), dir.sock("c"), dir.sock("ctl"));
    let config = dir.sock("sw").with_extension("toml");
    let state = dir.sock("state").with_extension("toml");
    let file = |extra: &str| {
        format!(
            "[[port]]\nkind = \"vhost-user\"\nname = \"a\"\nsocket = \"{}\"\n\
             [[port]]\nkind = \"vhost-user\"\nname = \"b\"\nsocket = \"{}\"\n{extra}\
             [[port]]\nkind = \"sink\"\nname = \"s\"\n",
            a.display(),
            b.display()
        )
    };
    std::fs::write(&config, file("")).unwrap();
    let args: Vec<String> = [
        "switch",
        "--config",
        config.to_str().unwrap(),
        "--ctl-socket",
        ctl_sock.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut sw = common::Proc::spawn("switch", &argv, &[("PVNET_LOG", "info")]);
    for s in [&a, &b, &ctl_sock] {
        common::wait_socket(&mut sw, s);
    }
    // Owner only.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&ctl_sock).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "control socket mode {mode:o}");

    let mut rx = frontend("frontend rx", &b, &["--role", "rx", "--queue-size", "1024"]);
    rx.wait_json("ready", Duration::from_secs(20));
    let mut tx = frontend(
        "frontend tx",
        &a,
        &["--role", "tx", "--secs", "2.5", "--rate", "20000"],
    );
    std::thread::sleep(Duration::from_millis(300));

    // While frames flow a -> b: add a vhost-user port (twice: idempotent), attach a frontend,
    // change its egress, refuse a conflicting add, add and delete a sink, delete the port.
    let cs = format!("vhost-user:name=c,socket={}", c.display());
    assert_eq!(ctl_ok(&ctl_sock, &["port", "add", &cs])["result"], "added");
    assert_eq!(ctl_ok(&ctl_sock, &["port", "add", &cs])["result"], "exists");
    let (ok, err) = ctl(
        &ctl_sock,
        &[
            "port",
            "add",
            &format!("vhost-user:name=c,socket={}", b.display()),
        ],
    );
    assert!(!ok && err.contains("other settings"), "{err}");
    let (ok, err) = ctl(
        &ctl_sock,
        &[
            "port",
            "add",
            &format!("vhost-user:name=d,socket={}", b.display()),
        ],
    );
    assert!(!ok && err.contains("is port b's"), "{err}");
    let mut idle = frontend("frontend idle", &c, &["--role", "idle", "--secs", "30"]);
    idle.wait_json("ready", Duration::from_secs(20));
    let r = ctl_ok(&ctl_sock, &["port", "set", "c", "qdisc=fifo", "limit=256"]);
    assert_eq!(r["result"], "changed", "{r}");
    assert!(
        r["port"]["detail"]
            .as_str()
            .unwrap()
            .contains("egress fifo"),
        "{r}"
    );
    assert_eq!(
        ctl_ok(&ctl_sock, &["port", "set", "c", "qdisc=fifo"])["result"],
        "unchanged"
    );
    let (ok, err) = ctl(&ctl_sock, &["port", "set", "c", "socket=/elsewhere"]);
    assert!(!ok && err.contains("delete the port"), "{err}");
    assert_eq!(
        ctl_ok(&ctl_sock, &["port", "add", "sink:name=s2"])["result"],
        "added"
    );
    assert_eq!(
        ctl_ok(&ctl_sock, &["port", "del", "s2"])["result"],
        "deleted"
    );
    let r = ctl_ok(&ctl_sock, &["port", "del", "c"]);
    assert_eq!(r["result"], "deleted", "{r}");
    // c took the flooded copies of a's frames while it was there.
    assert!(
        r["port"]["counters"]["tx_packets"].as_u64().unwrap() > 0,
        "{r}"
    );
    assert_eq!(ctl_ok(&ctl_sock, &["port", "del", "c"])["result"], "absent");
    // Its frontend was disconnected: it ends (long before its 30 s).
    let _ = idle.wait_exit(Duration::from_secs(10));
    assert!(!c.exists(), "c's socket file is gone");

    // A reload while frames flow: the file gains a port and b's egress changes.
    std::fs::write(
        &config,
        file("qdisc = \"fifo\"\n[[port]]\nkind = \"sink\"\nname = \"s3\"\n"),
    )
    .unwrap();
    sw.signal(libc::SIGHUP);
    sw.wait_stderr("reload: changed b", Duration::from_secs(10));
    sw.wait_stderr("reload: added s3", Duration::from_secs(10));

    let txf = tx.finish(RUN);
    let rxf = rx.finish(RUN);
    let sent = u(&txf, "/tx_packets");
    assert!(sent > 20000, "{txf}");
    assert_eq!(u(&rxf, "/rx_packets"), sent, "b got every frame: {rxf}");
    assert!(
        rxf["complete"].as_bool().unwrap_or(false),
        "in order: {rxf}"
    );
    let st = ctl_ok(&ctl_sock, &["ports"]);
    assert_eq!(u(counters(&st, "a"), "/rx_packets"), sent);
    assert_eq!(switch_drops(counters(&st, "a")), 0);
    assert_eq!(switch_drops(counters(&st, "b")), 0);
    assert_eq!(port_names(&ctl_sock), ["a", "b", "s", "s3"]);

    // Another user is refused: the socket's mode keeps them out, and were it opened up, the
    // peer credentials would (SO_PEERCRED).
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "this test needs root (setpriv to another user)");
    let probe = |path: &std::path::Path| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"])
            .arg(
                "import socket,sys\ns=socket.socket(socket.AF_UNIX)\n\
                 try:\n s.connect(sys.argv[1])\nexcept OSError as e:\n print('connect:', e.strerror); sys.exit()\n\
                 s.sendall(b'status\\n'); print(s.recv(4096).decode())",
            )
            .arg(path)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .expect("setpriv")
    };
    let out = probe(&ctl_sock);
    assert!(out.contains("Permission denied"), "{out}");
    std::fs::set_permissions(
        &ctl_sock,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let out = probe(&ctl_sock);
    assert!(out.contains("permission denied: uid 65534"), "{out}");

    // A port added over the socket survives a restart; the file's ports come from the file.
    assert_eq!(
        ctl_ok(&ctl_sock, &["port", "add", "sink:name=keep"])["result"],
        "added"
    );
    sw.signal(libc::SIGTERM);
    assert!(sw.wait_exit(RUN).success());
    let mut sw = common::Proc::spawn("switch", &argv, &[("PVNET_LOG", "info")]);
    common::wait_socket(&mut sw, &ctl_sock);
    // (In the file's order now: s3 comes before s there.)
    assert_eq!(port_names(&ctl_sock), ["a", "b", "s3", "s", "keep"]);
    sw.signal(libc::SIGTERM);
    assert!(sw.wait_exit(RUN).success());
}

/// Two workers: ports a and the sink on worker 0, b on worker 1. Every frame a sends crosses
/// the trunk to b (flooded: its address is never learned), exactly once, in order, and the
/// workers' hand-off counters say so.
#[test]
fn frames_cross_workers_exactly() {
    let dir = TestDir::new("swk");
    let mut sw = Switch::start(&dir, &["--workers", "2"]);
    let sent = a_to_b(&sw);
    let st = sw.ctl("ports");
    assert_eq!(
        u(counters(&st, "s"), "/tx_packets"),
        sent,
        "the sink, on a's worker"
    );
    let w = st["workers"].as_array().expect("workers in the status");
    assert_eq!(w.len(), 2, "{st}");
    assert_eq!(w[0]["ports"], serde_json::json!(["a", "s"]), "{st}");
    assert_eq!(w[1]["ports"], serde_json::json!(["b"]), "{st}");
    assert_eq!(u(&w[0], "/handoff_out"), sent, "{st}");
    assert_eq!(u(&w[1], "/handoff_in"), sent, "{st}");
    sw.proc.signal(libc::SIGINT);
    sw.proc.finish(RUN);
}

/// Two workers, and ports moved between them by hand while a sends numbered frames to b at
/// 20 Kpps (flooded: b's address is never learned): b, then a, then b again... each move puts
/// the pair on one worker or splits it. b gets every frame, in order.
#[test]
fn ports_move_between_workers_under_traffic_without_reordering() {
    let dir = TestDir::new("swmv");
    let mut sw = Switch::start(&dir, &["--workers", "2", "--rebalance", "false"]);
    let mut rx = frontend(
        "frontend rx",
        &sw.b,
        &["--role", "rx", "--queue-size", "1024"],
    );
    rx.wait_json("ready", Duration::from_secs(20));
    let mut tx = frontend(
        "frontend tx",
        &sw.a,
        &["--role", "tx", "--secs", "2", "--rate", "20000"],
    );
    tx.wait_json("ready", Duration::from_secs(20));
    let worker_of = |st: &serde_json::Value, port: &str| {
        placement(st)
            .iter()
            .position(|w| w.iter().any(|n| n == port))
            .expect("placed")
    };
    let moves = 12;
    for i in 0..moves {
        std::thread::sleep(Duration::from_millis(120));
        let port = if i % 2 == 0 { "b" } else { "a" };
        let to = 1 - worker_of(&sw.ctl("ports"), port);
        let r = sw.ctl_args(&["port", "move", port, &to.to_string()]);
        assert_eq!(r["result"], "moved", "{r}");
        assert_eq!(worker_of(&sw.ctl("ports"), port), to);
    }
    let txf = tx.finish(RUN);
    let rxf = rx.finish(RUN);
    let sent = u(&txf, "/tx_packets");
    assert!(sent > 20_000, "{txf}");
    assert_eq!(u(&rxf, "/rx_packets"), sent, "b got every frame: {rxf}");
    assert!(
        rxf["complete"].as_bool().unwrap_or(false),
        "in order, none missing, end marker: {rxf}"
    );
    let st = sw.ctl("ports");
    assert_eq!(u(counters(&st, "a"), "/rx_packets"), sent, "{st}");
    assert_eq!(u(counters(&st, "b"), "/tx_packets"), sent, "{st}");
    let w = st["workers"].as_array().expect("workers");
    let moved: u64 = w.iter().map(|w| u(w, "/moved_in")).sum();
    assert_eq!(moved, moves, "{st}");
    sw.proc.signal(libc::SIGINT);
    sw.proc.finish(RUN);
}

/// 64 vhost-user ports, each attached by a frontend that stays idle: the switch sleeps for all
/// of them at once (measured 0.2 % of a CPU, scripts/bench_idle_ports.sh; bounded here at 2 %,
/// far under one port polled all the time: 100 %).
#[test]
fn sixty_four_idle_ports_cost_almost_nothing() {
    let dir = TestDir::new("idle64");
    let specs: Vec<String> = (2..64).map(|k| dir.vhost_port(&format!("p{k}"))).collect();
    let mut extra = Vec::new();
    for s in &specs {
        extra.extend(["--port", s.as_str()]);
    }
    let mut sw = Switch::start(&dir, &extra);
    let mut socks = vec![sw.a.clone(), sw.b.clone()];
    socks.extend((2..64).map(|k| dir.sock(&format!("p{k}"))));
    let fes: Vec<_> = socks
        .iter()
        .map(|s| frontend("idle", s, &["--role", "idle", "--secs", "30"]))
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let st = sw.ctl("ports");
        let up = st["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .filter(|p| p["kind"] == "vhost-user" && p["state"] == "up")
            .count();
        if up == 64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {up} of 64 up: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    let ticks = || {
        let st = std::fs::read_to_string(format!("/proc/{}/stat", sw.proc.pid())).expect("stat");
        let f: Vec<u64> = st
            .rsplit_once(')')
            .expect("stat")
            .1
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        // utime and stime: fields 14 and 15, the 12th and 13th numbers after the name
        f[10] + f[11]
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (t0, s0) = (ticks(), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let pct = 100.0 * (ticks() - t0) as f64 / hz / s0.elapsed().as_secs_f64();
    assert!(
        pct < 2.0,
        "64 idle ports: the switch used {pct:.2} % of a CPU"
    );
    drop(fes);
    sw.proc.signal(libc::SIGINT);
    sw.proc.finish(RUN);
}

/// A port's own polling policy (`policy=`), set in place with `pvnet ctl port set`: its
/// transmit rings are then drained once per coalescing period, not polled, and a bad policy
/// is refused with the port left as it was.
#[test]
fn a_ports_own_policy_coalesces_its_rings_and_changes_in_place() {
    let dir = TestDir::new("swpol");
    let mut sw = Switch::start(&dir, &[]);
    let r = sw.ctl_args(&["port", "set", "a", "policy=coalesce:2000"]);
    assert_eq!(r["result"], "changed", "{r}");
    let detail = |r: &serde_json::Value| r["port"]["detail"].as_str().unwrap_or("").to_string();
    assert!(detail(&r).contains("policy coalesce:2000"), "{r}");
    let (ok, err) = ctl(&sw.ctl, &["port", "set", "a", "policy=fastest"]);
    assert!(!ok && err.contains("policy"), "{err}");
    // 100 Kpps into a 1024-entry ring for `secs`.
    let paced = |secs: &str| {
        let args = ["--role", "tx", "--secs", secs, "--rate", "100000"];
        let ring = ["--queue-size", "1024"];
        frontend("frontend tx", &sw.a, &[&args[..], &ring[..]].concat())
    };
    // Half the ring lasts 5 ms, so the 2 ms bound is the period: about 500 drains a second,
    // each of ~200 frames taken in rounds of up to 64 (`--batch`); the switch's adaptive
    // policy drains every frame or two.
    let fe = paced("1.2").finish(RUN);
    let c = sw.counters("a");
    let (pkts, batches) = (u(&c, "/rx_packets"), u(&c, "/rx_batches"));
    assert_eq!(pkts, u(&fe, "/tx_packets"), "{fe}\n{c}");
    assert!(
        pkts >= 119_000 && pkts / batches >= 20,
        "{pkts} frames in {batches} batches: not coalesced\n{c}"
    );
    // Back to a policy that polls, while frames flow: the running ring switches at once
    // (a frame or two per drain at this rate), and the change is said so.
    let mut tx = paced("2");
    std::thread::sleep(Duration::from_millis(300));
    let r = sw.ctl_args(&["port", "set", "a", "policy=adaptive"]);
    assert_eq!(r["result"], "changed", "{r}");
    assert!(detail(&r).contains("policy adaptive"), "{r}");
    std::thread::sleep(Duration::from_millis(300));
    let c1 = sw.counters("a");
    std::thread::sleep(Duration::from_millis(800));
    let c2 = sw.counters("a");
    tx.finish(RUN);
    let d = |k: &str| u(&c2, k) - u(&c1, k);
    let (pkts, batches) = (d("/rx_packets"), d("/rx_batches"));
    assert!(
        pkts >= 50_000 && batches * 10 > pkts,
        "{pkts} frames in {batches} batches after the change: still coalesced\n{c1}\n{c2}"
    );
    sw.proc.signal(libc::SIGINT);
    sw.proc.wait_exit(RUN);
    assert!(
        sw.proc
            .stderr()
            .contains("transmit-ring policy now adaptive, applied at once"),
        "the change is logged"
    );
}

/// Request/response through the switch: `--role rr` on port a against `--role echo
/// --announce` on port b (the switch learns b's address from the announcement, so the
/// requests go to b alone; the answers, to the address the requests came from). Every
/// request is answered once, nothing stray, nothing lost.
#[test]
fn requests_cross_the_switch_to_an_echo_frontend_and_come_back() {
    let dir = TestDir::new("sw-echo");
    let mut sw = Switch::start(&dir, &[]);
    let mut echo = frontend(
        "frontend echo",
        &sw.b,
        &[
            "--role",
            "echo",
            "--announce",
            "--secs",
            "30",
            "--idle-timeout",
            "30",
        ],
    );
    echo.wait_json("ready", RUN);
    // The announcement has crossed once the switch knows b's address.
    let deadline = std::time::Instant::now() + RUN;
    while u(&sw.counters("b"), "/rx_packets") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no announcement from b"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rr = common::run_frontend("frontend rr", &sw.a, &["--role", "rr", "--secs", "0.5"]);
    echo.signal(libc::SIGINT);
    let e = echo.finish(RUN);
    let n = u(&rr, "/transactions");
    assert!(n > 100, "{rr}");
    assert_eq!((u(&rr, "/strays"), u(&rr, "/lost")), (0, 0), "{rr}");
    // The echo answered each request it took, and only those (the announcement was its own).
    assert_eq!(u(&e, "/answered"), n, "{e}\n{rr}");
    // It timed one way the requests whose round trip the client recorded (past its warm-up),
    // on the client's clock: more than the microsecond a crossing takes at least, less than
    // the slow round trips (a wrong clock is off by the machine's uptime, or reads 0).
    let recorded = u(&rr, "/recorded");
    assert!(recorded > n / 2, "{rr}");
    assert_eq!(u(&e, "/requests"), recorded, "{e}\n{rr}");
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let (one, rtt) = (f(&e, "request_p50_us"), f(&rr, "p99_us"));
    assert!(
        (1.0..=rtt).contains(&one),
        "one-way p50 {one} us, round trip p99 {rtt} us\n{e}"
    );
    let (ca, cb) = (sw.counters("a"), sw.counters("b"));
    assert_eq!(u(&cb, "/tx_packets"), n, "requests to b: {cb}");
    assert_eq!(u(&ca, "/tx_packets"), n, "answers to a: {ca}");
    assert_eq!(switch_drops(&ca) + switch_drops(&cb), 0, "{ca}\n{cb}");
    sw.proc.signal(libc::SIGINT);
    sw.proc.finish(RUN);
}
