//! End-to-end tests: the real `pvnet` binary as separate backend and frontend processes over
//! a vhost-user socket, with exact packet accounting on both sides.

mod common;

use common::{
    assert_tx_to_sink_exact, backend, drops, frontend, port, ports, run_frontend, u, Proc, TestDir,
    EVENT, RUN, START,
};
use serde_json::Value;

/// frontend TX -> backend sink, one session; returns (frontend final, backend port 0).
fn f2b(extra_fe: &[&str], frame_len: u64) -> (Value, Value) {
    let dir = TestDir::new("f2b");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink", "--sessions", "1"]);
    let mut args = vec!["--role", "tx", "--secs", "0.3"];
    args.extend_from_slice(extra_fe);
    let fe = run_frontend("frontend tx", &sock, &args);
    let fin = b.finish(RUN);
    assert_eq!(ports(&fin).len(), 1, "{fin}");
    let p = port(&fin, 0);
    assert_tx_to_sink_exact(&fe, &p, frame_len);
    (fe, p)
}

#[test]
fn frontend_to_backend_exact_counts() {
    let (fe, p) = f2b(&[], 64);
    assert_eq!(u(&fe, "/rx_errors"), 0, "{fe}");
    assert_eq!(u(&p, "/tx_packets"), 0, "a sink sends nothing: {p}");
}

/// backend generator -> frontend RX, one session.
fn b2f(extra_fe: &[&str]) {
    b2f_len(extra_fe, 64);
}

/// backend generator of `frame_len`-byte frames -> frontend RX, one session; returns the
/// frontend's final line.
fn b2f_len(extra_fe: &[&str], frame_len: u64) -> Value {
    let dir = TestDir::new("b2f");
    let len = frame_len.to_string();
    let (mut b, sock) = backend(
        &dir,
        "b",
        &[
            "--role",
            "gen",
            "--secs",
            "0.3",
            "--sessions",
            "1",
            "--frame-len",
            &len,
        ],
    );
    let mut args = vec!["--role", "rx"];
    args.extend_from_slice(extra_fe);
    let fe = run_frontend("frontend rx", &sock, &args);
    let fin = b.finish(RUN);
    let p = port(&fin, 0);
    // The port counts every frame it delivered: data frames and the end marker.
    let frames = u(&p, "/tx_packets");
    assert!(frames > 1, "generator sent nothing: {p}");
    let sent = frames - 1;
    assert_eq!(u(&fe, "/data_received"), sent, "frontend {fe}\nport {p}");
    assert_eq!(u(&fe, "/end_count"), sent, "frontend {fe}\nport {p}");
    assert_eq!(fe["complete"], Value::Bool(true), "{fe}");
    assert_eq!(u(&fe, "/seq_errors"), 0, "{fe}");
    assert_eq!(u(&fe, "/rx_errors"), 0, "{fe}");
    assert_eq!(u(&fe, "/rx_packets"), frames, "data + end marker: {fe}");
    assert_eq!(u(&p, "/tx_bytes"), frames * frame_len, "{p}");
    assert_eq!(u(&fe, "/rx_bytes"), frames * frame_len, "{fe}");
    assert_eq!(u(&p, "/queue_errors"), 0, "{p}");
    assert_eq!(drops(&p), 0, "{p}");
    fe
}

#[test]
fn backend_to_frontend_exact_counts() {
    b2f(&[]);
}

/// Every receive buffer mode, frames read in place or copied out: exact counts, and the
/// buffers and memory each frame took.
#[test]
fn receive_buffer_modes_deliver_exactly() {
    for (mode, bufs, len, per_frame) in [
        ("inplace", "ewma", 64, 1.0),
        ("copy", "ewma", 64, 1.0),
        ("inplace", "fixed:1536", 1500, 1.0),
        ("inplace", "fixed:200", 1500, 8.0),
        ("copy", "fixed:4096", 64, 1.0),
    ] {
        let fe = b2f_len(&["--rx-mode", mode, "--rx-buffers", bufs], len);
        let (frames, buffers) = (u(&fe, "/rx_packets"), u(&fe, "/rx_buffers"));
        #[allow(clippy::cast_precision_loss)] // counts of a short run
        let got = buffers as f64 / frames as f64;
        assert!(
            (got - per_frame).abs() < 0.01,
            "{mode} {bufs}: {got} buffers/frame {fe}"
        );
    }
}

/// 9000-byte frames into EWMA buffers: merged across buffers, read in place, exact.
#[test]
fn large_frames_are_received_whole_into_ewma_buffers() {
    let fe = b2f_len(&["--rx-buffers", "ewma"], 9000);
    let (frames, buffers) = (u(&fe, "/rx_packets"), u(&fe, "/rx_buffers"));
    // The buffers grow to a page as the average follows: 3 of them per frame, 7 at first.
    assert!(buffers >= 3 * frames && buffers < 4 * frames, "{fe}");
    // Memory held: page-sized buffers for 9000 bytes and their headers.
    let held = u(&fe, "/rx_truesize");
    assert!(held < frames * 3 * 4200 && held > frames * 9000, "{fe}");
}

/// The receive-and-drop role: frames counted, their buffers and memory reported.
#[test]
fn drop_role_reports_rate_buffers_and_memory() {
    let dir = TestDir::new("drop");
    let (mut b, sock) = backend(
        &dir,
        "b",
        &["--role", "gen", "--secs", "1", "--sessions", "1"],
    );
    let fe = run_frontend(
        "frontend drop",
        &sock,
        &["--role", "drop", "--secs", "0.2", "--rx-mode", "copy"],
    );
    let _ = b.finish(RUN);
    let dropped = u(&fe, "/dropped");
    assert!(dropped > 0 && dropped <= u(&fe, "/rx_packets"), "{fe}");
    assert!(fe["mpps"].as_f64().is_some_and(|m| m > 0.0), "{fe}");
    assert!(
        fe["busy_ns_per_frame"].as_f64().is_some_and(|n| n > 0.0),
        "{fe}"
    );
    // 64-byte frames with EWMA buffers: one buffer each, 192 bytes of memory once the
    // average followed (it starts at 1514 bytes and takes a few hundred frames to come down).
    let frames = u(&fe, "/rx_packets");
    assert_eq!(u(&fe, "/rx_buffers"), frames, "{fe}");
    let held = u(&fe, "/rx_truesize");
    assert!(
        held >= 192 * frames && held <= 192 * frames + 1024 * 1600,
        "{fe}"
    );
}

/// frontend A TX -> backend forward -> frontend B RX (extra arguments for each).
fn f2f_with(frame_len: u64, extra_tx: &[&str], extra_rx: &[&str]) {
    let dir = TestDir::new("f2f");
    let (mut b, sock) = backend(&dir, "b", &["--role", "forward", "--sessions", "2"]);
    let len = frame_len.to_string();
    // Ports pair up in connection order: the receiver connects first (port 0), and is fully
    // running before the sender (port 1) connects.
    let mut rx_args = vec!["--role", "rx", "--frame-len", &len];
    rx_args.extend_from_slice(extra_rx);
    let mut rx = frontend("frontend rx", &sock, &rx_args);
    rx.wait_json("ready", START);
    let mut tx_args = vec!["--role", "tx", "--secs", "0.3", "--frame-len", &len];
    tx_args.extend_from_slice(extra_tx);
    let tf = run_frontend("frontend tx", &sock, &tx_args);
    let rf = rx.finish(RUN);
    let fin = b.finish(RUN);
    let (pa, pb) = (port(&fin, 1), port(&fin, 0));

    let sent = u(&tf, "/data_sent");
    assert!(sent > 0, "{tf}");
    assert_eq!(u(&tf, "/tx_packets"), sent + 1, "{tf}");
    assert_eq!(
        u(&rf, "/data_received"),
        sent,
        "tx {tf}\nrx {rf}\nbackend {fin}"
    );
    assert_eq!(u(&rf, "/end_count"), sent, "{rf}");
    assert_eq!(rf["complete"], Value::Bool(true), "{rf}");
    assert_eq!(u(&rf, "/seq_errors"), 0, "{rf}");
    assert_eq!(u(&rf, "/rx_errors"), 0, "{rf}");
    assert_eq!(u(&rf, "/rx_packets"), sent + 1, "{rf}");

    // The backend's per-port counters add up: what entered at A left at B or was dropped.
    let all_drops: u64 = ports(&fin).iter().map(drops).sum();
    assert_eq!(all_drops, 0, "{fin}");
    assert_eq!(u(&pa, "/rx_packets"), u(&tf, "/tx_packets"), "{fin}");
    assert_eq!(
        u(&pa, "/rx_packets"),
        u(&pb, "/tx_packets") + drops(&pa),
        "{fin}"
    );
    assert_eq!(u(&pa, "/rx_bytes"), u(&pb, "/tx_bytes"), "{fin}");
    assert_eq!(u(&pa, "/rx_bytes"), (sent + 1) * frame_len, "{fin}");
    assert_eq!(u(&pb, "/rx_packets"), 0, "{fin}");
    assert_eq!(u(&pa, "/tx_packets"), 0, "{fin}");
    for p in [&pa, &pb] {
        assert_eq!(u(p, "/queue_errors"), 0, "{p}");
    }
}

fn f2f(frame_len: u64) {
    f2f_with(frame_len, &[], &[]);
}

#[test]
fn frontend_to_frontend_through_forward() {
    f2f(64);
}

/// The negotiated features a frontend reports in its `ready` line.
fn features_of(sock: &std::path::Path, extra: &[&str]) -> u64 {
    let mut args = vec!["--role", "tx", "--secs", "0"];
    args.extend_from_slice(extra);
    let mut f = frontend("frontend", sock, &args);
    let r = f.wait_json("ready", START);
    f.finish(RUN);
    let s = r["features"].as_str().expect("features string").to_string();
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex features")
}

#[test]
fn legacy_driver_gets_10_byte_headers() {
    // A driver that negotiates neither VERSION_1 nor MRG_RXBUF puts a 10-byte header in front
    // of every packet (virtio 1.x 5.1.6); the backend must read and write exactly that.
    let dir = TestDir::new("legacy");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink", "--sessions", "1"]);
    let f = features_of(&sock, &["--legacy-hdr"]);
    assert_eq!(
        f & ((1 << 32) | (1 << 15)),
        0,
        "neither VERSION_1 nor MRG_RXBUF: {f:#x}"
    );
    b.finish(RUN);
    // Both directions, exact (sequence numbers sit right behind the header: one byte off and
    // every frame would be garbage).
    f2b(&["--legacy-hdr"], 64);
    f2b(&["--legacy-hdr", "--frame-len", "1500"], 1500);
    b2f(&["--legacy-hdr"]);
}

#[test]
fn forwarding_between_header_lengths() {
    // 12-byte sender to a 10-byte receiver and back: the header is rewritten, the frame is not.
    f2f_with(64, &[], &["--legacy-hdr"]);
    f2f_with(64, &["--legacy-hdr"], &[]);
}

#[test]
fn packed_ring_both_ways_and_through_forward() {
    // The packed virtqueue (virtio 1.1, 2.8) negotiated end to end, counts exact each way.
    let dir = TestDir::new("packed");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink", "--sessions", "2"]);
    let f = features_of(&sock, &["--packed"]);
    assert_ne!(f & (1 << 34), 0, "VIRTIO_F_RING_PACKED negotiated: {f:#x}");
    let split = features_of(&sock, &[]);
    assert_eq!(split & (1 << 34), 0, "split unless asked: {split:#x}");
    b.finish(RUN);
    f2b(&["--packed"], 64);
    f2b(&["--packed", "--frame-len", "1500"], 1500);
    f2b(&["--packed", "--no-event-idx"], 64);
    b2f(&["--packed"]);
    b2f(&["--packed", "--no-event-idx"]);
    f2f_with(64, &["--packed"], &["--packed"]);
    // One side packed, the other split: formats are per frontend.
    f2f_with(64, &["--packed"], &[]);
}

#[test]
fn two_shards_serve_two_frontends_exactly() {
    // Two worker threads; frontends are spread over them by port id, each counted exactly.
    let dir = TestDir::new("shards");
    let (mut b, sock) = backend(
        &dir,
        "b",
        &["--role", "sink", "--sessions", "2", "--workers", "2"],
    );
    let mut x = frontend("frontend X", &sock, &["--role", "tx", "--secs", "0.5"]);
    x.wait_json("ready", START);
    let mut y = frontend("frontend Y", &sock, &["--role", "tx", "--secs", "0.5"]);
    let fy = y.finish(RUN);
    let fx = x.finish(RUN);
    let fin = b.finish(RUN);
    assert_eq!(ports(&fin).len(), 2, "{fin}");
    assert_tx_to_sink_exact(&fx, &port(&fin, 0), 64);
    assert_tx_to_sink_exact(&fy, &port(&fin, 1), 64);
    let placed = b.stderr_lines("frontend port placed");
    for (shard, port) in [("shard=0", "port=0"), ("shard=1", "port=1")] {
        assert!(
            placed.iter().any(|l| l.contains(shard) && l.contains(port)),
            "{port} not on {shard}: {placed:?}"
        );
    }
}

#[test]
fn frames_1500_bytes_to_sink() {
    f2b(&["--frame-len", "1500"], 1500);
}

#[test]
fn frames_1500_bytes_through_forward() {
    f2f(1500);
}

#[test]
fn dying_frontend_does_not_disturb_others() {
    let dir = TestDir::new("dying");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);

    // X sends for a long time; once it has shown progress it dies without a word.
    let mut x = frontend("frontend X", &sock, &["--role", "tx", "--secs", "5"]);
    x.wait_json("progress", START);
    x.signal(libc::SIGKILL);
    let st = x.wait_exit(EVENT);
    assert!(!st.success(), "X was killed: {st}");
    // The backend noticed X's session end, and is still running.
    b.wait_stderr("frontend disconnected", EVENT);
    b.wait_stderr("port removed", EVENT);
    assert!(b.alive(), "backend died with X\n{}", b.stderr());

    // Y runs normally and exactly.
    let y = run_frontend("frontend Y", &sock, &["--role", "tx", "--secs", "0.3"]);
    assert!(b.alive(), "backend died after Y\n{}", b.stderr());

    b.signal(libc::SIGTERM);
    let st = b.wait_exit(RUN);
    assert!(
        st.success(),
        "backend exit after SIGTERM: {st}\n{}",
        b.stderr()
    );
    let fin = b.final_json();
    assert_eq!(ports(&fin).len(), 2, "one entry per session: {fin}");
    assert_tx_to_sink_exact(&y, &port(&fin, 1), 64);
    let px = port(&fin, 0);
    assert!(u(&px, "/rx_packets") > 0, "X's traffic was counted: {px}");
    assert_eq!(u(&px, "/queue_errors"), 0, "{px}");
    assert_eq!(drops(&px), 0, "{px}");
}

#[test]
fn event_idx_off() {
    // Flag-based suppression (VRING_AVAIL_F_NO_INTERRUPT / VRING_USED_F_NO_NOTIFY) both ways.
    f2b(&["--no-event-idx"], 64);
    b2f(&["--no-event-idx"]);
}

#[test]
fn event_idx_off_negotiated() {
    // The `ready` line shows the negotiated features: bit 29 (EVENT_IDX) must be off.
    let dir = TestDir::new("noei");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink", "--sessions", "2"]);
    let feats = |extra: &[&str]| -> u64 {
        let mut args = vec!["--role", "tx", "--secs", "0"];
        args.extend_from_slice(extra);
        let mut f = frontend("frontend", &sock, &args);
        let r = f.wait_json("ready", START);
        f.finish(RUN);
        let s = r["features"].as_str().expect("features string").to_string();
        u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex features")
    };
    let on = feats(&[]);
    let off = feats(&["--no-event-idx"]);
    assert_ne!(
        on & (1 << 29),
        0,
        "EVENT_IDX negotiated by default: {on:#x}"
    );
    assert_eq!(
        off & (1 << 29),
        0,
        "EVENT_IDX off with --no-event-idx: {off:#x}"
    );
    b.finish(RUN);
}

fn bench(args: &[&str]) -> Value {
    let mut a = vec!["bench"];
    a.extend_from_slice(args);
    let mut p = Proc::spawn("bench", &a, &[]);
    let st = p.wait_exit(RUN);
    assert!(
        st.success(),
        "bench {args:?}: {st}\n{}\n{}",
        p.stdout(),
        p.stderr()
    );
    p.last_json()
}

#[test]
fn bench_json_smoke() {
    let v = bench(&[
        "--json",
        "--secs",
        "0.3",
        "--scenarios",
        "f2b,idle",
        "--no-limits",
    ]);
    for k in [
        "mpps",
        "packets_sent",
        "packets_received",
        "drops",
        "cpu_ns_per_packet",
        "kicks_per_kpkt",
        "calls_per_kpkt",
        "counts_add_up",
    ] {
        assert!(v.get(k).is_some_and(|x| !x.is_null()), "missing {k}: {v}");
    }
    assert_eq!(v["counts_add_up"], Value::Bool(true), "{v}");
    assert!(v["mpps"].as_f64().is_some_and(|m| m > 0.0), "{v}");
    assert!(u(&v, "/packets_sent") > 0, "{v}");
    assert_eq!(u(&v, "/packets_sent"), u(&v, "/packets_received"), "{v}");
    let names: Vec<&str> = v["scenarios"]
        .as_array()
        .expect("scenarios")
        .iter()
        .filter_map(|s| s["scenario"].as_str())
        .collect();
    assert_eq!(names, ["f2b", "idle"], "{v}");
    assert!(v.get("idle_cpu_percent").is_some(), "{v}");

    // The limit probes pin two threads to the two CPUs; while other tests load both CPUs a
    // probe can give up (it reports null rather than a made-up rate). Retry only that case.
    let mut v = Value::Null;
    for _ in 0..3 {
        v = bench(&["--json", "--secs", "0.3", "--scenarios", "f2b"]);
        if v.pointer("/limits/ring_mpps")
            .and_then(Value::as_f64)
            .is_some()
        {
            break;
        }
    }
    assert!(
        v["limit_fraction"].as_f64().is_some_and(|f| f > 0.0),
        "limit_fraction with limits on: {v}"
    );
    assert_eq!(v["counts_add_up"], Value::Bool(true), "{v}");
}

fn cli(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let mut p = Proc::spawn("pvnet", args, &[]);
    let st = p.wait_exit(EVENT);
    (st, p.stdout(), p.stderr())
}

#[test]
fn cli_errors() {
    let (st, _, err) = cli(&["bench", "--frame-len", "5"]);
    assert!(!st.success(), "bench --frame-len 5 must fail");
    assert!(
        err.contains("--frame-len"),
        "stderr names the bad option: {err}"
    );
    assert!(err.contains("error"), "{err}");
    // The old name still parses, and says which name replaced it.
    let (st, _, err) = cli(&["bench", "--size", "5"]);
    assert!(!st.success(), "bench --size 5 must fail");
    assert!(
        err.contains("--size is deprecated: use --frame-len"),
        "{err}"
    );
    assert!(err.contains("--frame-len must be"), "{err}");

    let (st, _, err) = cli(&["bench", "--scenarios", "nope"]);
    assert!(!st.success(), "bench --scenarios nope must fail");
    assert!(err.contains("nope") && err.contains("scenario"), "{err}");

    let (st, out, _) = cli(&["--help"]);
    assert!(st.success(), "--help exits 0");
    assert!(out.contains("bench"), "{out}");

    let (st, _, err) = cli(&[
        "frontend",
        "--socket",
        "/nonexistent/pvnet.sock",
        "--frame-len",
        "5",
    ]);
    assert!(!st.success());
    assert!(err.contains("--frame-len"), "{err}");
}

#[test]
fn iommu_grants_per_packet_and_pool_both_ways_and_through_forward() {
    // VIRTIO_F_ACCESS_PLATFORM negotiated end to end: every ring address is an IOVA the
    // backend translates through the IOTLB the frontend fills. Counts exact each way, in
    // each mode and ring format.
    let dir = TestDir::new("grants");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink", "--sessions", "2"]);
    let f = features_of(&sock, &["--grants", "pool"]);
    assert_ne!(
        f & (1 << 33),
        0,
        "VIRTIO_F_ACCESS_PLATFORM negotiated: {f:#x}"
    );
    let off = features_of(&sock, &[]);
    assert_eq!(off & (1 << 33), 0, "no IOMMU unless asked: {off:#x}");
    b.finish(RUN);
    for mode in ["pool", "per-packet"] {
        let (fe, p) = f2b(&["--grants", mode], 64);
        let sent = u(&fe, "/tx_packets");
        let msgs = u(&fe, "/iotlb/updates") + u(&fe, "/iotlb/invalidates");
        if mode == "pool" {
            // Two rings and two pools, granted once.
            assert_eq!(u(&fe, "/iotlb/updates"), 4, "{fe}");
            assert_eq!(u(&fe, "/iotlb/invalidates"), 0, "{fe}");
        } else {
            // One grant per buffer posted (the receive ring's too) and one revocation per
            // transmit buffer reclaimed: at least two messages per packet sent.
            assert!(msgs >= 2 * sent, "{msgs} messages for {sent} packets: {fe}");
        }
        let fe = b2f_len(&["--grants", mode], 64);
        if mode == "pool" {
            // Everything granted before the rings start: the device never misses.
            assert_eq!(u(&p, "/iotlb_misses"), 0, "granted before posted: {p}");
            assert_eq!(u(&fe, "/iotlb/misses_answered"), 0, "{fe}");
            assert_eq!(u(&fe, "/iotlb/misses_refused"), 0, "{fe}");
        }
        // Per packet, a grant reaches the worker without a wait: a look just before it
        // arrives is a miss, asked for and then found (or by then revoked: the frontend
        // leaves it unanswered). The counts stay exact either way (checked above).
        f2b(&["--grants", mode, "--packed"], 64);
        b2f(&["--grants", mode, "--packed"]);
        f2f_with(64, &["--grants", mode], &["--grants", mode]);
    }
    // One side behind an IOMMU, the other not: the IOTLB is per frontend.
    f2f_with(64, &["--grants", "pool"], &[]);
    f2f_with(1500, &[], &["--grants", "per-packet"]);
}
