//! `pvnet bench`: the main job. Starts a pvnet backend and pvnet frontend processes on a
//! vhost-user socket, moves packets one way in each direction and both ways through the
//! backend between two frontends, checks that every count adds up, and prints the result
//! next to this machine's limits measured in the same run.
//!
//! The children's command lines are rendered from [`BackendArgs`] and [`FrontendArgs`]
//! (`command_line`), the structs those commands parse. [`child`] follows the children,
//! [`report`] prints what they measured, [`sweep`] is `pvnet bench sweep`.

mod child;
mod report;
mod sweep;

use crate::args::{RingArgs, TrafficArgs};
use crate::backend_cmd::{BackendArgs, RoleArg};
use crate::error::{failed, io, usage, Result};
use crate::frontend_cmd::{FrontRole, FrontendArgs};
use crate::limits::{self, Limits};
use crate::proc;
use child::{wait_socket, Proc};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use pvnet_dataplane::Policy;
use report::{drops_of, f, ns_per, per_k, print_table, result, total, u};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `pvnet bench` arguments.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The frames (one length) and seconds of every scenario.
    #[command(flatten)]
    pub traffic: TrafficArgs,
    /// The frontends' virtqueues.
    #[command(flatten)]
    pub ring: RingArgs,
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
    /// The backend's polling policy (values as `pvnet backend --policy`).
    #[arg(long, default_value = "adaptive")]
    pub policy: Policy,
    #[command(subcommand)]
    pub sub: Option<BenchSub>,
}

/// `pvnet bench` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchSub {
    /// Offered load from 10 Kpps to saturation and request/response at 1, 10 and 100 flows,
    /// for each backend policy: rate, stability, CPU, kicks/calls, latency. Writes CSV, PNG
    /// plots and a summary under --out.
    Sweep(sweep::SweepArgs),
}

impl Default for BenchArgs {
    fn default() -> Self {
        Self {
            traffic: TrafficArgs::default(),
            ring: RingArgs::default(),
            scenarios: ["f2b", "b2f", "f2f", "idle"].map(String::from).to_vec(),
            json: false,
            no_limits: false,
            policy: Policy::Adaptive,
            sub: None,
        }
    }
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
    /// The one frame length (checked in [`run`]).
    size: usize,
}

impl Ctx<'_> {
    fn backend(&self, role: RoleArg, sessions: u32) -> Result<(Proc, PathBuf)> {
        let name = role
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned());
        let sock = self.dir.join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&sock);
        let mut args = BackendArgs::new(sock.clone(), role);
        args.sessions = sessions;
        args.traffic = self.a.traffic.clone();
        args.dp.poll.cpu = Some(1);
        args.dp.poll.policy = Some(self.a.policy);
        let mut b = Proc::spawn("backend", &args.command_line())?;
        wait_socket(&sock, &mut b)?;
        Ok((b, sock))
    }

    fn frontend(&self, sock: &Path, role: FrontRole, cpu: Option<usize>) -> Result<Proc> {
        let mut args = FrontendArgs::new(sock.to_path_buf(), role);
        args.traffic = self.a.traffic.clone();
        args.ring = self.a.ring.clone();
        args.poll.cpu = cpu;
        Proc::spawn("frontend", &args.command_line())
    }
}

/// One backend and one pvnet frontend on its own CPU; `judge(frontend, port)` reads
/// (sent, received, exact) from the two reports.
fn one_way(
    cx: &Ctx<'_>,
    (name, desc): (&str, &str),
    (backend_role, frontend_role): (RoleArg, FrontRole),
    judge: impl Fn(&Value, &Value) -> (u64, u64, bool),
) -> Result<Value> {
    let (b, sock) = cx.backend(backend_role, 1)?;
    let fe = cx.frontend(&sock, frontend_role, Some(0))?;
    watch(&cx.bar, name, cx.a.traffic.secs, &fe.progress, || {
        fe.has("final")
    });
    let (ff, fcpu) = fe.finish()?;
    let (bf, bcpu) = b.finish()?;
    let ports = bf["ports"].as_array().cloned().unwrap_or_default();
    let p = ports.first().cloned().unwrap_or_default();
    let drops = drops_of(&ports);
    let (sent, recv, exact) = judge(&ff, &p);
    let exact = exact && total(&drops) == 0;
    let mut r = result(name, desc, cx.size, sent, recv, f(&ff, "/secs"), exact);
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
        (RoleArg::Sink, FrontRole::Tx),
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
        (RoleArg::Gen, FrontRole::Rx),
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
    let (b, sock) = cx.backend(RoleArg::Forward, 2)?;
    let mut rxp = cx.frontend(&sock, FrontRole::Rx, None)?;
    rxp.wait_for("ready", Duration::from_secs(10))?;
    let txp = cx.frontend(&sock, FrontRole::Tx, None)?;
    watch(&cx.bar, "f2f", cx.a.traffic.secs, &rxp.progress, || {
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
        cx.size,
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
    let (b, sock) = cx.backend(RoleArg::Sink, 1)?;
    // The frontend's defaults, not the run's ring: a connected pair at rest.
    let mut args = FrontendArgs::new(sock, FrontRole::Idle);
    args.traffic.secs = 2.0;
    let mut fe = Proc::spawn("frontend", &args.command_line())?;
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

/// The one frame length of the run, with the other arguments checked.
fn check(a: &BenchArgs) -> Result<usize> {
    if !(a.traffic.secs.is_finite() && a.traffic.secs > 0.0) {
        return Err(usage("--secs must be positive"));
    }
    let (lo, hi) = (pvnet_dataplane::frame::MIN_FRAME, 2048 - 12);
    let size = match a.traffic.frame_len.single() {
        Some(n) if (lo..=hi).contains(&n) => n,
        _ => {
            return Err(usage(format!(
                "--frame-len must be one length within {lo}..={hi}"
            )))
        }
    };
    for s in &a.scenarios {
        if !["f2b", "b2f", "f2f", "idle"].contains(&s.as_str()) {
            return Err(usage(format!(
                "unknown scenario '{s}' (f2b, b2f, f2f, idle)"
            )));
        }
    }
    Ok(size)
}

/// The live progress bar (hidden for `--json`).
fn progress_bar(hidden: bool) -> ProgressBar {
    let bar = ProgressBar::new(1000);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if hidden {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

/// Runs each scenario: their results (with the rate as a fraction of the slot ring's) and
/// the failures, one line each.
fn run_scenarios(cx: &Ctx<'_>, limits: Option<&Limits>) -> (Vec<Value>, Vec<String>) {
    let mut scenarios = Vec::new();
    let mut failures = Vec::new();
    for s in &cx.a.scenarios {
        cx.bar.set_position(0);
        let r = match s.as_str() {
            "f2b" => f2b(cx),
            "b2f" => b2f(cx),
            "f2f" => f2f(cx),
            _ => idle(cx),
        };
        match r {
            Ok(mut v) => {
                if let Some(l) = limits {
                    if v.get("mpps").is_some() && l.ring_mpps > 0.0 {
                        v["limit_fraction"] = json!(f(&v, "/mpps") / l.ring_mpps);
                    }
                }
                scenarios.push(v);
            }
            Err(e) => failures.push(format!("{s}: {e}")),
        }
    }
    (scenarios, failures)
}

/// The run's JSON: its settings, the limits, every scenario, and the headline figures (the
/// one-way frontend -> backend run's, and the idle CPU share) at the top.
fn summary(
    cx: &Ctx<'_>,
    limits: Option<Value>,
    scenarios: Vec<Value>,
    failures: Vec<String>,
) -> Value {
    let a = cx.a;
    let mut out = json!({
        "frame_len": cx.size, "queue_size": a.ring.queue_size, "secs": a.traffic.secs,
        "ring": if a.ring.packed { "packed" } else { "split" },
        "grants": a.ring.grants.to_string(),
        "limits": limits, "scenarios": scenarios, "failures": failures,
    });
    let find = |name: &str| {
        out["scenarios"]
            .as_array()
            .and_then(|v| v.iter().find(|s| s["scenario"] == name))
            .cloned()
    };
    let (head, idle) = (find("f2b"), find("idle"));
    if let Some(h) = head {
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
    if let Some(i) = idle {
        out["idle_cpu_percent"] = i["cpu_percent"].clone();
    }
    out
}

/// Runs the benchmark.
pub fn run(a: &BenchArgs) -> Result<()> {
    if let Some(BenchSub::Sweep(s)) = &a.sub {
        return sweep::run(s);
    }
    let size = check(a)?;
    let dir = std::env::temp_dir().join(format!("pvnet-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io(dir.display()))?;
    let bar = progress_bar(a.json);
    let before: Option<Limits> = (!a.no_limits).then(|| {
        bar.set_message("measuring machine limits (c2c hand-off, 64-byte-slot ring)");
        limits::measure_default()
    });
    let cx = Ctx {
        a,
        dir: dir.clone(),
        bar: bar.clone(),
        size,
    };
    let (scenarios, failures) = run_scenarios(&cx, before.as_ref());
    let after = (!a.no_limits).then(|| limits::measure_c2c(0, 1, 200_000, 5));
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&dir);
    let limits = before.map(|l| {
        json!({ "c2c_ns_before": l.c2c_ns, "c2c_ns_after": after, "ring_mpps": l.ring_mpps, "ring_batch": l.ring_batch })
    });
    let out = summary(&cx, limits, scenarios, failures);
    if a.json {
        println!("{out}");
    } else {
        print_table(&out);
    }
    if let Some(f) = out["failures"].as_array().filter(|f| !f.is_empty()) {
        let f: Vec<&str> = f.iter().filter_map(Value::as_str).collect();
        return Err(failed(format!("scenarios failed: {}", f.join("; "))));
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
