//! What a benchmark prints: the JSON of each scenario and the table of `pvnet bench`, the
//! CSV files and the summary of `pvnet bench sweep`.

use crate::error::{io, Result};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

pub(super) fn u(v: &Value, p: &str) -> u64 {
    v.pointer(p).and_then(Value::as_u64).unwrap_or(0)
}

pub(super) fn f(v: &Value, p: &str) -> f64 {
    v.pointer(p).and_then(Value::as_f64).unwrap_or(0.0)
}

pub(super) fn ns_per(cpu: Duration, pkts: u64) -> f64 {
    if pkts == 0 {
        return 0.0;
    }
    cpu.as_nanos() as f64 / pkts as f64
}

pub(super) fn per_k(x: u64, pkts: u64) -> f64 {
    if pkts == 0 {
        return 0.0;
    }
    x as f64 * 1000.0 / pkts as f64
}

pub(super) fn drops_of(ports: &[Value]) -> Value {
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

pub(super) fn total(d: &Value) -> u64 {
    d.as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
}

pub(super) fn result(
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

pub(super) fn print_table(out: &Value) {
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

// ---------------------------------------------------------------------------------------
// `pvnet bench sweep`.

/// Every row a sweep measured.
#[derive(Default)]
pub(super) struct SweepRows {
    /// Offered-load points (saturation: one row per run).
    pub loads: Vec<Value>,
    /// Request/response points.
    pub rrs: Vec<Value>,
    /// Idle points.
    pub idles: Vec<Value>,
}

fn csv(path: &Path, rows: &[Value], cols: &[&str]) -> Result<()> {
    let mut s = cols.join(",") + "\n";
    for r in rows {
        let line: Vec<String> = cols
            .iter()
            .map(|c| match &r[*c] {
                Value::String(x) => x.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => String::new(),
            })
            .collect();
        s += &(line.join(",") + "\n");
    }
    std::fs::write(path, s).map_err(io(path.display()))?;
    Ok(())
}

/// `load.csv`, `rr.csv` and `idle.csv` in `out`.
pub(super) fn write_csvs(out: &Path, rows: &SweepRows) -> Result<()> {
    csv(
        &out.join("load.csv"),
        &rows.loads,
        &[
            "policy",
            "offered_pps",
            "run",
            "achieved_pps",
            "cov",
            "cpu_backend_pct",
            "cpu_frontend_pct",
            "kicks_per_pkt",
            "calls_per_pkt",
            "backend_sleeps",
            "exact",
            "c2c_ns",
            "steal_pct",
            "state_redone",
            "intervals",
        ],
    )?;
    csv(
        &out.join("rr.csv"),
        &rows.rrs,
        &[
            "policy",
            "flows",
            "rr_per_sec",
            "p50_us",
            "p99_us",
            "p999_us",
            "cpu_backend_pct",
            "cpu_frontend_pct",
            "kicks_per_txn",
            "calls_per_txn",
        ],
    )?;
    csv(
        &out.join("idle.csv"),
        &rows.idles,
        &["policy", "idle_cpu_backend_pct"],
    )
}

/// A policy's saturation rows (load 0), one per run.
fn sat_rows<'a>(loads: &'a [Value], policy: &'a str) -> impl Iterator<Item = &'a Value> {
    loads
        .iter()
        .filter(move |r| r["policy"] == policy && r["offered_pps"].as_u64() == Some(0))
}

/// Median achieved rate of a policy's saturation runs (NaN if none).
fn sat_rate(loads: &[Value], policy: &str) -> f64 {
    crate::limits::median(
        sat_rows(loads, policy)
            .map(|r| f(r, "/achieved_pps"))
            .collect(),
    )
}

/// Ratios `a / b` of the saturation runs taken in the same round, e.g. "0.98 1.01 0.97".
fn sat_pairs(loads: &[Value], a: &str, b: &str) -> String {
    let run = |p, k: u64| sat_rows(loads, p).find(|r| r["run"].as_u64() == Some(k));
    (1..)
        .map_while(|k| Some((run(a, k)?, run(b, k)?)))
        .map(|(x, y)| format!("{:.2}", f(x, "/achieved_pps") / f(y, "/achieved_pps")))
        .collect::<Vec<_>>()
        .join(" ")
}

fn find<'a>(rows: &'a [Value], policy: &str, key: &str, val: u64) -> Option<&'a Value> {
    rows.iter()
        .find(|r| r["policy"] == policy && r[key].as_u64() == Some(val))
}

/// The summary table, one row per policy.
pub(super) fn sweep_table(policies: &[String], rows: &SweepRows) -> String {
    let (loads, rrs, idles) = (&rows.loads, &rows.rrs, &rows.idles);
    let mut md = String::new();
    let _ = writeln!(md, "| policy | saturation Mpps | CoV max | backend CPU at 10 Kpps | backend CPU idle | kicks/pkt at 100 Kpps | calls/pkt at 100 Kpps | RR 1 flow p50/p99 us | RR 100 flows tps |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for ps in policies {
        let sat = sat_rate(loads, ps);
        let low = find(loads, ps, "offered_pps", 10_000);
        let mid = find(loads, ps, "offered_pps", 100_000);
        let covmax = loads
            .iter()
            .filter(|r| r["policy"] == ps.as_str())
            .map(|r| f(r, "/cov"))
            .fold(0.0, f64::max);
        let idle = idles
            .iter()
            .find(|r| r["policy"] == ps.as_str())
            .map_or(f64::NAN, |r| f(r, "/idle_cpu_backend_pct"));
        let rr1 = find(rrs, ps, "flows", 1);
        let rr100 = find(rrs, ps, "flows", 100);
        let g = |v: Option<&Value>, k: &str| v.map_or(f64::NAN, |v| f(v, k));
        let _ = writeln!(
            md,
            "| {ps} | {:.2} | {:.1}% | {:.1}% | {:.1}% | {:.3} | {:.3} | {:.1} / {:.1} | {:.0} |",
            sat / 1e6,
            covmax * 100.0,
            g(low, "/cpu_backend_pct"),
            idle,
            g(mid, "/kicks_per_pkt"),
            g(mid, "/calls_per_pkt"),
            g(rr1, "/p50_us"),
            g(rr1, "/p99_us"),
            g(rr100, "/rr_per_sec")
        );
    }
    md
}

/// The ratios the adaptive policy is judged by (DESIGN.md technique 2), one line each.
pub(super) fn sweep_ratios(rows: &SweepRows, sat_runs: u32) -> Vec<String> {
    let (loads, rrs, idles) = (&rows.loads, &rows.rrs, &rows.idles);
    let pick =
        |p: &str, k: &str, v: u64, col: &str| find(loads, p, k, v).map_or(f64::NAN, |r| f(r, col));
    vec![
        format!(
            "adaptive / busy throughput at saturation: {:.3} (target >= 0.95; medians of {} \
             runs each; run by run: {})",
            sat_rate(loads, "adaptive") / sat_rate(loads, "busy"),
            sat_runs,
            sat_pairs(loads, "adaptive", "busy")
        ),
        format!(
            "adaptive / notify backend CPU at 10 Kpps: {:.2} (target <= 1.5)",
            pick("adaptive", "offered_pps", 10_000, "/cpu_backend_pct")
                / pick("notify", "offered_pps", 10_000, "/cpu_backend_pct")
        ),
        format!(
            "adaptive / busy backend CPU at 10 Kpps: {:.3} (target <= 0.20)",
            pick("adaptive", "offered_pps", 10_000, "/cpu_backend_pct")
                / pick("busy", "offered_pps", 10_000, "/cpu_backend_pct")
        ),
        format!(
            "adaptive / busy RR p50, 1 flow: {:.2} (target <= 1.3)",
            find(rrs, "adaptive", "flows", 1).map_or(f64::NAN, |r| f(r, "/p50_us"))
                / find(rrs, "busy", "flows", 1).map_or(f64::NAN, |r| f(r, "/p50_us"))
        ),
        format!(
            "adaptive CoV, worst load point: {:.1}% (target <= 5%)",
            loads
                .iter()
                .filter(|r| r["policy"] == "adaptive")
                .map(|r| f(r, "/cov"))
                .fold(0.0, f64::max)
                * 100.0
        ),
        format!(
            "adaptive backend CPU idle: {:.2}%",
            idles
                .iter()
                .find(|r| r["policy"] == "adaptive")
                .map_or(f64::NAN, |r| f(r, "/idle_cpu_backend_pct"))
        ),
    ]
}
