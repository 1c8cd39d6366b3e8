//! `pvnet switch` end to end with pvnet's own frontends: frames cross the switch exactly,
//! `pvnet ctl` and the Prometheus endpoint report the same counters, and the final report
//! adds up. (Real peers, DPDK and a Linux guest with a tap, are in tests/interop/run.sh.)

mod common;

use common::{counters, frontend, switch_drops, u, Switch, TestDir, RUN};
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
    let (a, b) = (sw.a.clone(), sw.b.clone());
    // b receives; a sends numbered frames to b's address (unknown at first: flooded to b and
    // the sink, then learned from nothing b sends, so flooding goes on; both copies count).
    // Floods never wait for a full receiver (their copy to it is dropped, counted), so b must
    // keep up even when this 2-core machine deschedules it: 1024 buffers at 20 Kpps last 50 ms
    // (256 at 50 Kpps, 5 ms, once lost 63 frames to a scheduler slice under CI load).
    let mut rx = frontend("frontend rx", &b, &["--role", "rx", "--queue-size", "1024"]);
    rx.wait_json("ready", Duration::from_secs(20));
    let tx = frontend(
        "frontend tx",
        &a,
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
    let (ca, cb, cs) = (counters(&st, "a"), counters(&st, "b"), counters(&st, "s"));
    assert_eq!(u(ca, "/rx_packets"), sent);
    assert_eq!(u(cb, "/tx_packets"), sent);
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
        (vec!["switch"], "no ports"),
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
        .args(["ctl", "--socket", &ctl_s, "ports", "--json"])
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
