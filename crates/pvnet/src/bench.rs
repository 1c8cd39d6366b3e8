//! `pvnet bench`: the main job. Starts a pvnet backend and pvnet frontend processes on a
//! vhost-user socket, moves packets one way in each direction and both ways through the
//! backend between two frontends, checks that every count adds up, and prints the result
//! next to this machine's limits measured in the same run.

use crate::error::{failed, io, usage, Result};
use crate::limits::{self, Limits};
use crate::proc;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pvnet_dataplane::Policy;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `pvnet bench` arguments.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Ethernet frame length in bytes (64 and 1500 are the reference sizes).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Seconds of traffic per scenario.
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
    /// Descriptors per queue.
    #[arg(long, default_value_t = 256)]
    pub queue_size: u16,
    /// Scenarios to run, comma separated: f2b (frontend to backend), b2f (backend to
    /// frontend), f2f (frontend to frontend through the backend), idle (CPU at rest).
    #[arg(long, default_value = "f2b,b2f,f2f,idle", value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Skip the machine-limit probes.
    #[arg(long)]
    pub no_limits: bool,
    /// The backend's polling/notification policy (adaptive, notify, timer:<us>, spin:<n>, busy).
    #[arg(long, default_value = "adaptive")]
    pub policy: Policy,
    /// Run the frontends on the packed virtqueue (virtio 1.1) instead of the split one.
    #[arg(long)]
    pub packed: bool,
    /// Put the backend behind an IOMMU and grant it the frontends' buffers: off, per-packet
    /// (an acked IOTLB update and invalidation per buffer) or pool (granted once).
    #[arg(long, default_value = "off")]
    pub grants: pvnet_vhost::frontend::GrantMode,
    #[command(subcommand)]
    pub sub: Option<BenchSub>,
}

/// `pvnet bench` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchSub {
    /// Offered load from 10 Kpps to saturation and request/response at 1, 10 and 100 flows,
    /// for each backend policy: rate, stability, CPU, kicks/calls, latency. Writes CSV, PNG
    /// plots and a summary under --out.
    Sweep(crate::sweep::SweepArgs),
}

impl Default for BenchArgs {
    fn default() -> Self {
        Self {
            size: 64,
            secs: 2.0,
            queue_size: 256,
            scenarios: ["f2b", "b2f", "f2f", "idle"].map(String::from).to_vec(),
            json: false,
            no_limits: false,
            policy: Policy::Adaptive,
            packed: false,
            grants: pvnet_vhost::frontend::GrantMode::Off,
            sub: None,
        }
    }
}

/// A child process whose stdout JSON lines we follow.
pub(crate) struct Proc {
    name: &'static str,
    pub(crate) child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    pub(crate) progress: Arc<AtomicU64>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    pub(crate) fn spawn(name: &'static str, args: &[String]) -> Result<Self> {
        let exe = std::env::current_exe().map_err(io("finding the pvnet binary"))?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(io(format!("starting {name}")))?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| failed(format!("{name}: no stdout")))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let progress = Arc::new(AtomicU64::new(0));
        let (l, p) = (lines.clone(), progress.clone());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(std::io::Result::ok) {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if let Some(n) = v.pointer("/progress/packets").and_then(Value::as_u64) {
                    p.store(n, Ordering::Relaxed);
                } else {
                    l.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                }
            }
        });
        Ok(Self {
            name,
            child,
            lines,
            progress,
            reader: Some(reader),
        })
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|v| v.get(key).is_some())
    }

    pub(crate) fn wait_for(&mut self, key: &str, timeout: Duration) -> Result<()> {
        let until = Instant::now() + timeout;
        while !self.has(key) {
            if let Some(st) = self.child.try_wait()? {
                return Err(failed(format!(
                    "{} exited ({st}) before '{key}'",
                    self.name
                )));
            }
            if Instant::now() > until {
                return Err(failed(format!(
                    "{} did not report '{key}' in {timeout:?}",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Waits for exit; returns the `final` object and the process's CPU time.
    pub(crate) fn finish(mut self) -> Result<(Value, Duration)> {
        let (ok, cpu) = proc::wait_child(self.child.id(), Duration::from_secs(60))
            .map_err(io(format!("waiting for {}", self.name)))?;
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let fin = self
            .lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find_map(|v| v.get("final").cloned());
        match (ok, fin) {
            (true, Some(f)) => Ok((f, cpu)),
            (_, f) => Err(failed(format!(
                "{} failed (exit ok: {ok}, report: {f:?})",
                self.name
            ))),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

pub(crate) fn wait_socket(p: &Path, backend: &mut Proc) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(10);
    while !p.exists() {
        if let Some(st) = backend.child.try_wait()? {
            return Err(failed(format!("backend exited early: {st}")));
        }
        if Instant::now() > until {
            return Err(failed("backend socket did not appear"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Follows a receiving process's progress on a live bar until `done` says stop.
fn watch(
    bar: &ProgressBar,
    label: &str,
    secs: f64,
    p: &Arc<AtomicU64>,
    mut done: impl FnMut() -> bool,
) {
    let t0 = Instant::now();
    let (mut last_n, mut last_t) = (0u64, t0);
    while !done() {
        std::thread::sleep(Duration::from_millis(100));
        let (n, now) = (p.load(Ordering::Relaxed), Instant::now());
        let dt = now.duration_since(last_t).as_secs_f64();
        if dt >= 0.25 {
            let rate = n.saturating_sub(last_n) as f64 / dt / 1e6;
            bar.set_message(format!("{label}: {rate:6.2} Mpps, {n} packets"));
            (last_n, last_t) = (n, now);
        }
        let frac = (now.duration_since(t0).as_secs_f64() / secs.max(0.01)).min(1.0);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 0..=1000
        bar.set_position((frac * 1000.0) as u64);
    }
}

struct Ctx<'a> {
    a: &'a BenchArgs,
    dir: PathBuf,
    bar: ProgressBar,
}

impl Ctx<'_> {
    fn backend(&self, role: &str, sessions: u32) -> Result<(Proc, PathBuf)> {
        let sock = self.dir.join(format!("{role}.sock"));
        let _ = std::fs::remove_file(&sock);
        let args = [
            "backend",
            "--socket",
            &sock.to_string_lossy(),
            "--role",
            role,
            "--sessions",
            &sessions.to_string(),
            "--cpu",
            "1",
            "--frame-len",
            &self.a.size.to_string(),
            "--gen-secs",
            &self.a.secs.to_string(),
            "--policy",
            &self.a.policy.to_string(),
        ]
        .map(String::from);
        let mut b = Proc::spawn("backend", &args)?;
        wait_socket(&sock, &mut b)?;
        Ok((b, sock))
    }

    fn frontend(&self, sock: &Path, role: &str, cpu: Option<usize>) -> Result<Proc> {
        let mut args = [
            "frontend",
            "--socket",
            &sock.to_string_lossy(),
            "--role",
            role,
            "--frame-len",
            &self.a.size.to_string(),
            "--secs",
            &self.a.secs.to_string(),
            "--queue-size",
            &self.a.queue_size.to_string(),
        ]
        .map(String::from)
        .to_vec();
        if let Some(c) = cpu {
            args.extend(["--cpu".into(), c.to_string()]);
        }
        if self.a.packed {
            args.push("--packed".into());
        }
        args.extend(["--grants".into(), self.a.grants.to_string()]);
        Proc::spawn("frontend", &args)
    }
}

pub(crate) fn u(v: &Value, p: &str) -> u64 {
    v.pointer(p).and_then(Value::as_u64).unwrap_or(0)
}

pub(crate) fn f(v: &Value, p: &str) -> f64 {
    v.pointer(p).and_then(Value::as_f64).unwrap_or(0.0)
}

fn ns_per(cpu: Duration, pkts: u64) -> f64 {
    if pkts == 0 {
        return 0.0;
    }
    cpu.as_nanos() as f64 / pkts as f64
}

fn per_k(x: u64, pkts: u64) -> f64 {
    if pkts == 0 {
        return 0.0;
    }
    x as f64 * 1000.0 / pkts as f64
}

fn drops_of(ports: &[Value]) -> Value {
    let mut m = serde_json::Map::new();
    for p in ports {
        if let Some(d) = p.get("drops").and_then(Value::as_object) {
            for (k, v) in d {
                let cur = m.get(k).and_then(Value::as_u64).unwrap_or(0);
                m.insert(k.clone(), json!(cur + v.as_u64().unwrap_or(0)));
            }
        }
    }
    Value::Object(m)
}

fn total(d: &Value) -> u64 {
    d.as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
}

fn result(
    name: &str,
    desc: &str,
    size: usize,
    sent: u64,
    recv: u64,
    secs: f64,
    exact: bool,
) -> Value {
    let mpps = if secs > 0.0 {
        recv as f64 / secs / 1e6
    } else {
        0.0
    };
    json!({
        "scenario": name, "description": desc, "mpps": mpps,
        "gbps": mpps * 1e6 * size as f64 * 8.0 / 1e9,
        "packets_sent": sent, "packets_received": recv, "secs": secs, "counts_add_up": exact,
    })
}

/// One backend and one pvnet frontend on its own CPU; `judge(frontend, port)` reads
/// (sent, received, exact) from the two reports.
fn one_way(
    cx: &Ctx<'_>,
    (name, desc): (&str, &str),
    (backend_role, frontend_role): (&str, &str),
    judge: impl Fn(&Value, &Value) -> (u64, u64, bool),
) -> Result<Value> {
    let (b, sock) = cx.backend(backend_role, 1)?;
    let fe = cx.frontend(&sock, frontend_role, Some(0))?;
    watch(&cx.bar, name, cx.a.secs, &fe.progress, || fe.has("final"));
    let (ff, fcpu) = fe.finish()?;
    let (bf, bcpu) = b.finish()?;
    let ports = bf["ports"].as_array().cloned().unwrap_or_default();
    let p = ports.first().cloned().unwrap_or_default();
    let drops = drops_of(&ports);
    let (sent, recv, exact) = judge(&ff, &p);
    let exact = exact && total(&drops) == 0;
    let mut r = result(name, desc, cx.a.size, sent, recv, f(&ff, "/secs"), exact);
    r["drops"] = drops;
    r["cpu_ns_per_packet"] =
        json!({ "backend": ns_per(bcpu, recv), "frontend": ns_per(fcpu, recv) });
    r["kicks_per_kpkt"] = json!(per_k(u(&ff, "/kicks"), recv));
    r["calls_per_kpkt"] = json!(per_k(u(&p, "/calls"), recv));
    r["iotlb_msgs_per_pkt"] = json!(
        per_k(
            u(&ff, "/iotlb/updates") + u(&ff, "/iotlb/invalidates"),
            recv
        ) / 1000.0
    );
    r["iotlb_misses"] = json!(u(&p, "/iotlb_misses"));
    Ok(r)
}

/// frontend TX -> backend sink.
fn f2b(cx: &Ctx<'_>) -> Result<Value> {
    one_way(
        cx,
        ("f2b", "frontend -> backend (sink)"),
        ("sink", "tx"),
        |ff, p| {
            let (sent, recv) = (u(ff, "/data_sent"), u(p, "/end_marker"));
            // Every frame the frontend queued (data + end marker) reached the sink, in order.
            let exact = u(p, "/rx_packets") == u(ff, "/tx_packets")
                && recv == sent
                && u(p, "/seq_errors") == 0;
            (sent, recv, exact)
        },
    )
}

/// backend generator -> frontend RX.
fn b2f(cx: &Ctx<'_>) -> Result<Value> {
    one_way(
        cx,
        ("b2f", "backend (gen) -> frontend"),
        ("gen", "rx"),
        |ff, p| {
            // The port counts every frame it delivered, the end marker too.
            let (sent, recv) = (
                u(p, "/tx_packets").saturating_sub(1),
                u(ff, "/data_received"),
            );
            let exact = u(ff, "/rx_packets") == u(p, "/tx_packets")
                && recv == sent
                && u(ff, "/end_count") == sent
                && u(ff, "/seq_errors") == 0
                && u(ff, "/rx_errors") == 0;
            (sent, recv, exact)
        },
    )
}

/// frontend A TX -> backend forward -> frontend B RX.
fn f2f(cx: &Ctx<'_>) -> Result<Value> {
    let (b, sock) = cx.backend("forward", 2)?;
    let mut rxp = cx.frontend(&sock, "rx", None)?;
    rxp.wait_for("ready", Duration::from_secs(10))?;
    let txp = cx.frontend(&sock, "tx", None)?;
    watch(&cx.bar, "f2f", cx.a.secs, &rxp.progress, || {
        rxp.has("final")
    });
    let (tf, tcpu) = txp.finish()?;
    let (rf, rcpu) = rxp.finish()?;
    let (bf, bcpu) = b.finish()?;
    let ports = bf["ports"].as_array().cloned().unwrap_or_default();
    let sent = u(&tf, "/data_sent");
    let recv = u(&rf, "/data_received");
    let drops = drops_of(&ports);
    let fwd_in: u64 = ports.iter().map(|p| u(p, "/rx_packets")).sum();
    let fwd_out: u64 = ports.iter().map(|p| u(p, "/tx_packets")).sum();
    let exact = recv == sent
        && u(&rf, "/end_count") == sent
        && u(&rf, "/seq_errors") == 0
        && fwd_in == fwd_out + total(&drops)
        && fwd_in == u(&tf, "/tx_packets")
        && total(&drops) == 0;
    let mut r = result(
        "f2f",
        "frontend -> backend -> frontend",
        cx.a.size,
        sent,
        recv,
        f(&rf, "/secs"),
        exact,
    );
    r["drops"] = drops;
    r["cpu_ns_per_packet"] = json!({
        "backend": ns_per(bcpu, recv), "frontend_tx": ns_per(tcpu, recv), "frontend_rx": ns_per(rcpu, recv),
    });
    let calls: u64 = ports.iter().map(|p| u(p, "/calls")).sum();
    r["kicks_per_kpkt"] = json!(per_k(u(&tf, "/kicks") + u(&rf, "/kicks"), recv));
    r["calls_per_kpkt"] = json!(per_k(calls, recv));
    let msgs = ["/iotlb/updates", "/iotlb/invalidates"]
        .iter()
        .map(|k| u(&tf, k) + u(&rf, k))
        .sum::<u64>();
    r["iotlb_msgs_per_pkt"] = json!(per_k(msgs, recv) / 1000.0);
    r["iotlb_misses"] = json!(ports.iter().map(|p| u(p, "/iotlb_misses")).sum::<u64>());
    Ok(r)
}

/// A connected, idle frontend and backend: CPU share of each over one second.
fn idle(cx: &Ctx<'_>) -> Result<Value> {
    let (b, sock) = cx.backend("sink", 1)?;
    let args = [
        "frontend",
        "--socket",
        &sock.to_string_lossy(),
        "--role",
        "idle",
        "--secs",
        "2",
    ]
    .map(String::from);
    let mut fe = Proc::spawn("frontend", &args)?;
    fe.wait_for("ready", Duration::from_secs(10))?;
    // Let both sides pass their polling windows and go to sleep.
    std::thread::sleep(Duration::from_millis(200));
    let (bp, fp) = (b.child.id(), fe.child.id());
    let (b0, f0, t0) = (proc::cpu_time_of(bp), proc::cpu_time_of(fp), Instant::now());
    cx.bar
        .set_message("idle: measuring CPU of a connected, idle pair");
    std::thread::sleep(Duration::from_secs(1));
    let (b1, f1, dt) = (proc::cpu_time_of(bp), proc::cpu_time_of(fp), t0.elapsed());
    let share = |a: Option<Duration>, z: Option<Duration>| match (a, z) {
        (Some(a), Some(z)) => z.saturating_sub(a).as_secs_f64() / dt.as_secs_f64() * 100.0,
        _ => f64::NAN,
    };
    let r = json!({ "scenario": "idle", "cpu_percent": { "backend": share(b0, b1), "frontend": share(f0, f1) } });
    fe.finish()?;
    b.finish()?;
    Ok(r)
}

fn print_table(out: &Value) {
    let size = out["frame_len"].as_u64().unwrap_or(0);
    println!(
        "\npvnet bench: {size}-byte frames, {} ring of {}, grants {}, {} s per scenario",
        out["ring"].as_str().unwrap_or("split"),
        out["queue_size"],
        out["grants"].as_str().unwrap_or("off"),
        out["secs"]
    );
    if let Some(l) = out.get("limits").filter(|l| !l.is_null()) {
        println!(
            "machine limits: c2c hand-off {:.0} ns before / {:.0} ns after; 64-byte-slot ring (batch {}) {:.1} Mpps",
            f(l, "/c2c_ns_before"), f(l, "/c2c_ns_after"), l["ring_batch"], f(l, "/ring_mpps")
        );
    }
    println!(
        "\n{:<5} {:>8} {:>8} {:>12} {:>12} {:>8} {:>18} {:>9} {:>9} {:>8} {:>6} {:>6} {:>6}",
        "",
        "Mpps",
        "Gbit/s",
        "sent",
        "received",
        "drops",
        "cpu ns/pkt (b/f)",
        "kicks/k",
        "calls/k",
        "iotlb/pkt",
        "misses",
        "exact",
        "limit"
    );
    for s in out["scenarios"].as_array().into_iter().flatten() {
        let name = s["scenario"].as_str().unwrap_or("?");
        if name == "idle" {
            println!(
                "idle  connected, no traffic: backend {:.2}% CPU, frontend {:.2}% CPU",
                f(s, "/cpu_percent/backend"),
                f(s, "/cpu_percent/frontend")
            );
            continue;
        }
        let c = &s["cpu_ns_per_packet"];
        let fe = c
            .get("frontend")
            .or_else(|| c.get("frontend_tx"))
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let cpu = format!("{:.1}/{:.1}", f(c, "/backend"), fe);
        println!(
            "{:<5} {:>8.2} {:>8.2} {:>12} {:>12} {:>8} {:>18} {:>9.3} {:>9.3} {:>8.2} {:>6} {:>6} {:>5.0}%",
            name,
            f(s, "/mpps"),
            f(s, "/gbps"),
            u(s, "/packets_sent"),
            u(s, "/packets_received"),
            total(&s["drops"]),
            cpu,
            f(s, "/kicks_per_kpkt"),
            f(s, "/calls_per_kpkt"),
            f(s, "/iotlb_msgs_per_pkt"),
            u(s, "/iotlb_misses"),
            if s["counts_add_up"].as_bool() == Some(true) {
                "yes"
            } else {
                "NO"
            },
            f(s, "/limit_fraction") * 100.0
        );
    }
    println!("\nexact: every frame sent was received, in order, and drops by reason add up.");
    println!("iotlb/pkt: IOTLB updates + invalidations the frontends sent per packet; misses: the backend's.");
    println!("limit: pvnet's rate as a fraction of the 64-byte-slot ring measured in this run.");
}

/// Runs the benchmark.
pub fn run(a: &BenchArgs) -> Result<()> {
    if let Some(BenchSub::Sweep(s)) = &a.sub {
        return crate::sweep::run(s);
    }
    if !(a.secs.is_finite() && a.secs > 0.0) {
        return Err(usage("--secs must be positive"));
    }
    if a.size < pvnet_dataplane::frame::MIN_FRAME || a.size > 2048 - 12 {
        return Err(usage(format!(
            "--size must be within {}..={}",
            pvnet_dataplane::frame::MIN_FRAME,
            2048 - 12
        )));
    }
    for s in &a.scenarios {
        if !["f2b", "b2f", "f2f", "idle"].contains(&s.as_str()) {
            return Err(usage(format!(
                "unknown scenario '{s}' (f2b, b2f, f2f, idle)"
            )));
        }
    }
    let dir = std::env::temp_dir().join(format!("pvnet-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io(dir.display()))?;
    let bar = ProgressBar::new(1000);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let before: Option<Limits> = (!a.no_limits).then(|| {
        bar.set_message("measuring machine limits (c2c hand-off, 64-byte-slot ring)");
        limits::measure_default()
    });
    let cx = Ctx {
        a,
        dir: dir.clone(),
        bar: bar.clone(),
    };
    let mut scenarios = Vec::new();
    let mut failures = Vec::new();
    for s in &a.scenarios {
        bar.set_position(0);
        let r = match s.as_str() {
            "f2b" => f2b(&cx),
            "b2f" => b2f(&cx),
            "f2f" => f2f(&cx),
            _ => idle(&cx),
        };
        match r {
            Ok(mut v) => {
                if let Some(l) = before {
                    if v.get("mpps").is_some() && l.ring_mpps > 0.0 {
                        v["limit_fraction"] = json!(f(&v, "/mpps") / l.ring_mpps);
                    }
                }
                scenarios.push(v);
            }
            Err(e) => failures.push(format!("{s}: {e}")),
        }
    }
    let after = (!a.no_limits).then(|| limits::measure_c2c(0, 1, 200_000, 5));
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&dir);
    let limits = before.map(|l| {
        json!({ "c2c_ns_before": l.c2c_ns, "c2c_ns_after": after, "ring_mpps": l.ring_mpps, "ring_batch": l.ring_batch })
    });
    let mut out = json!({
        "frame_len": a.size, "queue_size": a.queue_size, "secs": a.secs,
        "ring": if a.packed { "packed" } else { "split" },
        "grants": a.grants.to_string(),
        "limits": limits, "scenarios": scenarios, "failures": failures,
    });
    // The headline figures are the one-way frontend -> backend run.
    if let Some(h) = out["scenarios"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["scenario"] == "f2b"))
        .cloned()
    {
        for k in [
            "mpps",
            "packets_sent",
            "packets_received",
            "drops",
            "cpu_ns_per_packet",
            "kicks_per_kpkt",
            "calls_per_kpkt",
            "limit_fraction",
            "counts_add_up",
        ] {
            out[k] = h.get(k).cloned().unwrap_or(Value::Null);
        }
    }
    if let Some(i) = out["scenarios"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["scenario"] == "idle"))
        .cloned()
    {
        out["idle_cpu_percent"] = i["cpu_percent"].clone();
    }
    if a.json {
        println!("{out}");
    } else {
        print_table(&out);
    }
    if !failures.is_empty() {
        return Err(failed(format!("scenarios failed: {}", failures.join("; "))));
    }
    let all_exact = out["scenarios"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|s| s.get("counts_add_up").is_none_or(|v| v == true));
    if !all_exact {
        return Err(failed("counts did not add up"));
    }
    Ok(())
}
