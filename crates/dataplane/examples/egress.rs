//! Egress experiments, in one thread: pvnet's switch, ports and egress queues as they run in
//! `pvnet switch`, the frontends played here over mock rings (`pvnet_dataplane::testing`).
//!
//! A receiver `B` slower than the load offered to it: a bulk sender `A` offers 6 Mpps of
//! 64-byte frames, `B` takes 4 Mpps (40 packets per 10 us step) and gives its buffers back the
//! way a Linux guest does (once more than 32 are used). A standing backlog forms at `B`'s
//! egress. Time is virtual (one switch round per step), so runs are repeatable and the
//! figures are the scheduler's, not this machine's state.
//!
//! * `latency`: a request/response flow `R` (one request in flight; `B` answers each at once)
//!   crosses the same egress as the bulk flow: its round-trip percentiles and the bulk rate,
//!   for each egress configuration (no queue, fifo, fq_codel, each with and without DQL).
//! * `bulk`: with the same standing backlog, the real CPU time of the switch's rounds per
//!   packet delivered to `B`, draining in bulk versus one packet per dequeue.
//!
//! `cargo run --release --example egress` prints both tables as markdown
//! (`scripts/bench_egress.sh` writes them to docs/egress.md). With `EGRESS_CSV=dir` it also
//! writes `latency.csv` (config, p50 and p99 round trip in us, bulk Mpps, requests answered)
//! and `bulk.csv` (config, dequeue mode, ns per packet) for the plots.

use pvnet_dataplane::testing::{frame, mac, MockFe, MODERN};
use pvnet_dataplane::{
    AnyPort, DropReason, EgressConfig, Fabric, HoldPolicy, PortStats, Qdisc, QueueConfig, Router,
    SwitchConfig, HOLD,
};
use pvnet_net::VnetHdr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Virtual time per step.
const STEP: Duration = Duration::from_micros(10);
/// Bulk packets offered per step (6 Mpps), while fewer than [`WINDOW`] are on their way.
const OFFER: usize = 60;
/// Most bulk packets on their way to `B` (sent, not yet taken): a window-limited sender, like
/// TCP's, that keeps a standing queue without overflowing a 1024-packet one.
const WINDOW: u64 = 1000;
/// A request not answered within this is lost (counted) and sent again.
const RR_TIMEOUT: u64 = 2_000;
/// Packets the receiver takes per step (4 Mpps).
const TAKE: usize = 40;
/// A Linux guest gives buffers back once more than half its NAPI budget is used.
const REFILL: u16 = 32;
/// The bursty receiver: owed this many packets per step (3.2 Mpps), it wakes every
/// [`WAKE`] steps and takes what it owes at once (64), except once in every [`LATE_EVERY`]
/// steps, when it oversleeps [`LATE`] steps and then takes its whole debt in one go; it gives
/// every buffer back as soon as it has taken it (pvnet's own paced receiver, `--role drop
/// --rate --paced-batches`).
const OWED_PER_STEP: u64 = 32;
const WAKE: u64 = 2;
const LATE_EVERY: u64 = 16;
const LATE: u64 = 6;

/// How `B` takes its packets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rx {
    /// [`TAKE`] a step, buffers back in chunks past [`REFILL`] (a Linux guest's NAPI).
    Steady,
    /// In bursts, late now and then (see [`OWED_PER_STEP`]).
    Bursty,
}
/// Steps run (300 ms of virtual time: three CoDel intervals) and steps of warm-up.
const STEPS: u64 = 30_000;
const WARMUP: u64 = 5_000;

fn cfg(qdisc: Option<Qdisc>, dql: bool, bulk: bool) -> EgressConfig {
    match qdisc {
        None => EgressConfig::hold(HoldPolicy::Bounded(HOLD)),
        Some(q) => EgressConfig {
            queue: Some(QueueConfig {
                qdisc: q,
                ..QueueConfig::default()
            }),
            dql,
            bulk,
            ..EgressConfig::switch_default()
        },
    }
}

/// DQL as Linux has it: no cap from the receiver's pace.
fn linux_dql(mut e: EgressConfig) -> EgressConfig {
    e.dql_target = Duration::ZERO;
    e
}

fn name(qdisc: Option<Qdisc>, dql: bool) -> String {
    match qdisc {
        None => "none (2 ms hold in the sender)".into(),
        Some(q) => format!("{q}{}", if dql { " + DQL" } else { "" }),
    }
}

fn n(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// What one run measured.
struct Run {
    /// Request/response round trips, us.
    rtt: Vec<u64>,
    /// Requests lost (no answer within the timeout).
    lost: u64,
    /// Bulk packets `B` received per virtual second, after warm-up.
    bulk_mpps: f64,
    /// Real time spent in the switch's rounds per packet delivered to `B`.
    ns_per_pkt: f64,
    /// Packets per dequeue, publishes per delivered packet at `B`.
    per_dequeue: f64,
    publishes: f64,
    drops: Vec<(&'static str, u64)>,
    /// Everything `A` sent is delivered, dropped with a reason, or still waiting.
    adds_up: bool,
    dql_limit: u64,
}

fn run(egress: EgressConfig, rr: bool, rx: Rx) -> Run {
    let mut f = Fabric::new(Router::learning(SwitchConfig::default()), 64);
    let (mut a, pa) = MockFe::new(0, MODERN, 256, HoldPolicy::Bounded(HOLD));
    let (mut b, pb) = MockFe::with_egress(1, MODERN, 256, egress);
    let (mut r, pr) = MockFe::new(2, MODERN, 256, HoldPolicy::Bounded(HOLD));
    let mut ports: Vec<AnyPort> = vec![pa, pb, pr];
    let t0 = Instant::now();
    // Everyone speaks once: addresses learned, nothing floods.
    b.send(&VnetHdr::default(), &frame(mac(1), mac(2), 0, 60));
    a.send(&VnetHdr::default(), &frame(mac(2), mac(1), 0, 60));
    r.send(&VnetHdr::default(), &frame(mac(2), mac(3), 0, 60));
    f.round(&mut ports, t0);
    f.round(&mut ports, t0);
    let _ = (
        a.received(),
        b.received(),
        r.received(),
        a.completed(),
        b.completed(),
    );
    b.post(256);
    r.post(256);

    let mut rtt = Vec::new();
    let mut in_flight: Option<u64> = None;
    let mut bulk_got = 0u64;
    let (mut sent_a, mut bulk_all, mut lost) = (0u64, 0u64, 0u64);
    let mut used_since_refill = 0u16;
    let mut owed = 0u64;
    let mut busy = Duration::ZERO;
    let taken0 = n(&a.stats.rx_packets) + n(&r.stats.rx_packets);
    let drops0 = all_drops(&[&a.stats, &b.stats, &r.stats]);
    let b_tx0 = n(&b.stats.tx_packets);
    let base = (
        n(&b.stats.tx_packets),
        n(&b.stats.dequeued),
        n(&b.stats.dequeues),
        n(&b.stats.tx_batches),
    );
    let mut meas = base;
    for step in 0..STEPS {
        let now = t0 + STEP * u32::try_from(step).unwrap_or(u32::MAX);
        a.completed();
        let on_way = sent_a - bulk_all;
        let k = OFFER
            .min(a.room())
            .min(usize::try_from(WINDOW.saturating_sub(on_way)).unwrap_or(0));
        sent_a += k as u64;
        for _ in 0..k {
            a.send(&VnetHdr::default(), &frame(mac(2), mac(1), 1, 60));
        }
        if in_flight.is_some_and(|t| step - t > RR_TIMEOUT) {
            lost += 1;
            in_flight = None;
        }
        if rr && in_flight.is_none() {
            let mut fr = frame(mac(2), mac(3), 7, 60);
            fr[20..28].copy_from_slice(&step.to_le_bytes());
            r.send(&VnetHdr::default(), &fr);
            in_flight = Some(step);
        }
        r.completed();
        b.completed();
        let t = Instant::now();
        f.round(&mut ports, now);
        busy += t.elapsed();
        // B takes what it can this step, answers requests, gives buffers back in chunks.
        let got = match rx {
            Rx::Steady => b.receive(TAKE),
            Rx::Bursty => {
                owed += OWED_PER_STEP;
                let phase = step % LATE_EVERY;
                let awake = if phase < LATE_EVERY - LATE {
                    step % WAKE == WAKE - 1
                } else {
                    phase == LATE_EVERY - 1
                };
                if awake {
                    let got = b.receive(usize::try_from(owed).unwrap_or(usize::MAX));
                    owed -= got.len() as u64;
                    got
                } else {
                    Vec::new()
                }
            }
        };
        used_since_refill += u16::try_from(got.len()).unwrap_or(0);
        for (_, fr) in &got {
            if fr[6..12] == mac(3) {
                let mut reply = fr.clone();
                reply[..6].copy_from_slice(&mac(3));
                reply[6..12].copy_from_slice(&mac(2));
                b.send(&VnetHdr::default(), &reply);
            } else {
                bulk_all += 1;
                if step >= WARMUP {
                    bulk_got += 1;
                }
            }
        }
        if used_since_refill > REFILL || (rx == Rx::Bursty && used_since_refill > 0) {
            b.post(used_since_refill);
            used_since_refill = 0;
        }
        for (_, fr) in r.received() {
            if fr[14] == 7 {
                let sent = u64::from_le_bytes(fr[20..28].try_into().unwrap_or([0; 8]));
                if step >= WARMUP {
                    rtt.push((step + 1 - sent) * 10);
                }
                in_flight = None;
            }
        }
        r.post(256);
        if step == WARMUP {
            meas = (
                n(&b.stats.tx_packets),
                n(&b.stats.dequeued),
                n(&b.stats.dequeues),
                n(&b.stats.tx_batches),
            );
            busy = Duration::ZERO;
        }
    }
    let st: &PortStats = &b.stats;
    let delivered = n(&st.tx_packets) - meas.0;
    let dequeued = n(&st.dequeued) - meas.1;
    let dequeues = n(&st.dequeues) - meas.2;
    let batches = n(&st.tx_batches) - meas.3;
    let secs = STEP.as_secs_f64() * (STEPS - WARMUP) as f64;
    let drops: Vec<(&'static str, u64)> = DropReason::ALL
        .iter()
        .map(|&d| {
            (
                d.name(),
                n(&st.drops[d as usize]) + n(&a.stats.drops[d as usize]),
            )
        })
        .filter(|&(_, c)| c > 0)
        .collect();
    // What the switch took from A and R went to B, was dropped with a reason, or waits in
    // B's queue.
    let taken = n(&a.stats.rx_packets) + n(&r.stats.rx_packets) - taken0;
    let dropped = all_drops(&[&a.stats, &b.stats, &r.stats]) - drops0;
    let adds_up = taken == n(&st.tx_packets) - b_tx0 + dropped + n(&st.backlog);
    rtt.sort_unstable();
    Run {
        rtt,
        lost,
        bulk_mpps: bulk_got as f64 / secs / 1e6,
        ns_per_pkt: busy.as_nanos() as f64 / delivered.max(1) as f64,
        per_dequeue: dequeued as f64 / dequeues.max(1) as f64,
        publishes: batches as f64 / delivered.max(1) as f64,
        drops,
        adds_up,
        dql_limit: n(&st.dql_limit),
    }
}

fn all_drops(s: &[&PortStats]) -> u64 {
    s.iter()
        .flat_map(|s| s.drops.iter())
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
}

/// The `permille`-th percentile (nearest rank) of sorted `v`.
fn pct(v: &[u64], permille: usize) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = ((v.len() - 1) * permille + 500) / 1000;
    v[i.min(v.len() - 1)]
}

/// One latency table: every egress configuration against one receiver; its CSV rows to `csv`.
fn latency_table(rx: Rx, csv: &mut String) {
    // (qdisc, DQL, DQL without the pace cap)
    let cases = [
        (Some(Qdisc::Fifo), false, false),
        (Some(Qdisc::Fifo), true, false),
        (Some(Qdisc::FqCodel), false, false),
        (Some(Qdisc::FqCodel), true, true),
        (Some(Qdisc::FqCodel), true, false),
        (None, false, false),
    ];
    println!("| egress of B | RR p50 us | RR p99 us | RR p99 vs fifo | RR done / lost | bulk Mpps at B | bulk vs fifo | DQL limit (buffers) | drops | counts add up |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let fifo = run(cfg(Some(Qdisc::Fifo), false, true), true, rx);
    for (q, d, alone) in cases {
        let other;
        let r = if q == Some(Qdisc::Fifo) && !d {
            &fifo
        } else {
            let e = cfg(q, d, true);
            other = run(if alone { linux_dql(e) } else { e }, true, rx);
            &other
        };
        let label = match (d, alone) {
            (true, true) => format!("{} alone (Linux's, no pace cap)", name(q, d)),
            (true, false) => format!("{} capped by the receiver's pace", name(q, d)),
            _ => name(q, d),
        };
        let rx_name = match rx {
            Rx::Steady => "steady",
            Rx::Bursty => "bursty",
        };
        csv.push_str(&format!(
            "{rx_name},\"{label}\",{},{},{:.3},{}\n",
            pct(&r.rtt, 500),
            pct(&r.rtt, 990),
            r.bulk_mpps,
            r.rtt.len()
        ));
        let drops = r
            .drops
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let (p50, p99, vs) = if r.rtt.is_empty() {
            ("-".to_string(), "-".to_string(), "-".to_string())
        } else {
            (
                pct(&r.rtt, 500).to_string(),
                pct(&r.rtt, 990).to_string(),
                format!(
                    "{:.3}x",
                    pct(&r.rtt, 990) as f64 / pct(&fifo.rtt, 990).max(1) as f64
                ),
            )
        };
        println!(
            "| {label} | {p50} | {p99} | {vs} | {} / {} | {:.2} | {:.3}x | {} | {} | {} |",
            r.rtt.len(),
            r.lost,
            r.bulk_mpps,
            r.bulk_mpps / fifo.bulk_mpps.max(1e-9),
            if d {
                r.dql_limit.to_string()
            } else {
                "-".into()
            },
            if drops.is_empty() {
                "none".into()
            } else {
                drops
            },
            if r.adds_up { "yes" } else { "NO" },
        );
    }
}

fn main() {
    let csv = std::env::var_os("EGRESS_CSV").map(std::path::PathBuf::from);
    let mut lat_csv = String::from("receiver,config,p50_us,p99_us,bulk_mpps,answered\n");
    let mut bulk_csv = String::from("config,dequeue,ns_per_pkt\n");
    println!("### Latency under load (virtual time: 6 Mpps bulk offered, receiver takes 4 Mpps)\n");
    latency_table(Rx::Steady, &mut lat_csv);
    println!(
        "\n### Latency under load, a bursty receiver (virtual time: 6 Mpps offered, the receiver takes 3.2 Mpps in bursts of 64 and oversleeps {} us in every {} us)\n",
        LATE * 10,
        LATE_EVERY * 10
    );
    latency_table(Rx::Bursty, &mut lat_csv);
    println!("\n### Bulk dequeue with a standing backlog (real CPU time of the switch's rounds)\n");
    println!("| egress of B | dequeue | ns per delivered packet | packets per dequeue | publishes per packet | bulk vs one |");
    println!("|---|---|---|---|---|---|");
    for (q, d) in [(Qdisc::Fifo, false), (Qdisc::FqCodel, true)] {
        // Interleaved, best of 3 each (CPU time on a shared machine only gets worse).
        let mut best = [f64::MAX; 2];
        let mut runs: [Option<Run>; 2] = [None, None];
        for _ in 0..3 {
            for (k, bulk) in [true, false].into_iter().enumerate() {
                let r = run(cfg(Some(q), d, bulk), false, Rx::Steady);
                if r.ns_per_pkt < best[k] {
                    best[k] = r.ns_per_pkt;
                    runs[k] = Some(r);
                }
            }
        }
        for (k, label) in ["bulk", "one per dequeue"].into_iter().enumerate() {
            let Some(r) = &runs[k] else { continue };
            bulk_csv.push_str(&format!(
                "{},{label},{:.1}\n",
                name(Some(q), d),
                r.ns_per_pkt
            ));
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.3} | {} |",
                name(Some(q), d),
                label,
                r.ns_per_pkt,
                r.per_dequeue,
                r.publishes,
                if k == 0 {
                    format!("{:.2}x fewer ns", best[1] / best[0])
                } else {
                    "1x".into()
                },
            );
        }
    }
    if let Some(dir) = csv {
        for (f, body) in [("latency.csv", &lat_csv), ("bulk.csv", &bulk_csv)] {
            if let Err(e) = std::fs::write(dir.join(f), body) {
                eprintln!("{}: {e}", dir.join(f).display());
            }
        }
    }
}
