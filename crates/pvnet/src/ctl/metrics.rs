//! The status as Prometheus text (exposition format 0.0.4).

use super::protocol::{Status, WorkerRow};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Label value escaping of the text exposition format: backslash, double quote, newline.
fn escape_label(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// `# HELP` text escaping: backslash and newline.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A counter name as part of a metric name: `[a-zA-Z0-9_]`, anything else becomes `_`.
fn metric_part(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn fmt_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// The status in the Prometheus text exposition format 0.0.4: every port counter `X` as
/// `pvnet_port_X_total{port,kind}` (counter), `pvnet_port_up{port,kind}`, `pvnet_mac_entries`
/// and `pvnet_uptime_seconds` (gauges).
pub fn render_metrics(s: &Status) -> String {
    let mut o = String::new();
    head(
        &mut o,
        "pvnet_uptime_seconds",
        "gauge",
        "Seconds since the switch started.",
    );
    let _ = writeln!(o, "pvnet_uptime_seconds {}", fmt_float(s.uptime_secs));
    head(
        &mut o,
        "pvnet_mac_entries",
        "gauge",
        "Learned MAC addresses in the switch's table.",
    );
    let _ = writeln!(o, "pvnet_mac_entries {}", s.macs.len());
    workers(&mut o, &s.workers);
    let labels: Vec<String> = s
        .ports
        .iter()
        .map(|p| {
            format!(
                "port=\"{}\",kind=\"{}\"",
                escape_label(&p.name),
                escape_label(&p.kind)
            )
        })
        .collect();
    head(
        &mut o,
        "pvnet_port_up",
        "gauge",
        "1 when the port is up, 0 otherwise.",
    );
    for (p, l) in s.ports.iter().zip(&labels) {
        let _ = writeln!(o, "pvnet_port_up{{{l}}} {}", u8::from(p.state == "up"));
    }
    port_counters(&mut o, s, &labels);
    queue_counters(&mut o, s, &labels);
    o
}

/// The `# HELP` and `# TYPE` lines of a metric family.
fn head(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

/// A worker's metric: name, type, help, and its value of a worker.
type WorkerMetric = (
    &'static str,
    &'static str,
    &'static str,
    fn(&WorkerRow) -> String,
);

/// Every worker metric.
const WORKER_METRICS: [WorkerMetric; 7] = [
    (
        "pvnet_worker_cpu_seconds_total",
        "counter",
        "CPU time of a dataplane worker thread.",
        |w| fmt_float(w.cpu_secs),
    ),
    (
        "pvnet_worker_busy_seconds_total",
        "counter",
        "Time a dataplane worker spent in rounds that moved packets (its CPU time less polling and sleeping).",
        |w| fmt_float(w.busy_secs),
    ),
    (
        "pvnet_worker_load_ratio",
        "gauge",
        "Share of the last second a worker spent in rounds that moved packets.",
        |w| fmt_float(w.load_pct / 100.0),
    ),
    (
        "pvnet_worker_handoff_out_total",
        "counter",
        "Packets a worker handed to other workers.",
        |w| w.handoff_out.to_string(),
    ),
    (
        "pvnet_worker_handoff_in_total",
        "counter",
        "Packets other workers handed to a worker.",
        |w| w.handoff_in.to_string(),
    ),
    (
        "pvnet_worker_ports_moved_in_total",
        "counter",
        "Ports moved onto a worker (by the balancer or pvnet ctl port move).",
        |w| w.moved_in.to_string(),
    ),
    (
        "pvnet_worker_ports_moved_out_total",
        "counter",
        "Ports moved off a worker.",
        |w| w.moved_out.to_string(),
    ),
];

/// The worker families, one sample per worker (none without workers).
fn workers(o: &mut String, workers: &[WorkerRow]) {
    if workers.is_empty() {
        return;
    }
    for (name, kind, help, get) in WORKER_METRICS {
        head(o, name, kind, help);
        for w in workers {
            let _ = writeln!(o, "{name}{{worker=\"{}\"}} {}", w.worker, get(w));
        }
    }
}

/// Every port counter, one family per counter name (`labels[i]`: port i's labels).
fn port_counters(o: &mut String, s: &Status, labels: &[String]) {
    // Metric family -> (counter name for the help text, port index -> value). Counter names
    // that differ only in characters a metric name cannot hold share a family, so its HELP
    // and TYPE lines still come once. Gauges (what is now, not what has been) keep their name.
    let mut families: BTreeMap<String, (&str, BTreeMap<usize, u64>)> = BTreeMap::new();
    for (i, p) in s.ports.iter().enumerate() {
        for (k, v) in &p.counters {
            let part = metric_part(k);
            let part = part.strip_suffix("_total").unwrap_or(&part);
            let name = if GAUGES.contains(&k.as_str()) {
                format!("pvnet_port_{part}")
            } else {
                format!("pvnet_port_{part}_total")
            };
            let f = families
                .entry(name)
                .or_insert_with(|| (k.as_str(), BTreeMap::new()));
            let e = f.1.entry(i).or_insert(0);
            *e = e.saturating_add(*v);
        }
    }
    for (name, (counter, values)) in &families {
        if GAUGES.contains(counter) {
            head(o, name, "gauge", &format!("Port gauge {counter}."));
        } else {
            head(o, name, "counter", &format!("Port counter {counter}."));
        }
        for (i, v) in values {
            let _ = writeln!(o, "{name}{{{}}} {v}", labels[*i]);
        }
    }
}

/// Multiqueue ports: each pair's counters, labelled with its index.
fn queue_counters(o: &mut String, s: &Status, labels: &[String]) {
    let mut queues: BTreeMap<&str, Vec<(usize, usize, u64)>> = BTreeMap::new();
    for (i, p) in s.ports.iter().enumerate() {
        for (k, q) in p.queues.iter().enumerate() {
            for (c, v) in q {
                queues.entry(c.as_str()).or_default().push((i, k, *v));
            }
        }
    }
    for (counter, values) in &queues {
        let name = format!("pvnet_queue_{}_total", metric_part(counter));
        head(
            o,
            &name,
            "counter",
            &format!("Queue pair counter {counter}."),
        );
        for (i, k, v) in values {
            let _ = writeln!(o, "{name}{{{},queue=\"{k}\"}} {v}", labels[*i]);
        }
    }
}

/// Port values that are a level now, not a count so far: exported as gauges.
const GAUGES: [&str; 2] = ["backlog", "dql_limit"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::protocol::PortInfo;
    use crate::ctl::table::render_ports;
    use crate::ctl::test_util::*;

    #[test]
    fn metrics_text() {
        let m = render_metrics(&sample());
        for l in [
            "# HELP pvnet_uptime_seconds Seconds since the switch started.",
            "# TYPE pvnet_uptime_seconds gauge",
            "pvnet_uptime_seconds 12.5",
            "# TYPE pvnet_mac_entries gauge",
            "pvnet_mac_entries 2",
            "# TYPE pvnet_port_up gauge",
            "pvnet_port_up{port=\"vm0\",kind=\"vhost-user\"} 1",
            "pvnet_port_up{port=\"we\\\"ird\\\\po\\nrt\",kind=\"tap\"} 0",
            "# HELP pvnet_port_rx_packets_total Port counter rx_packets.",
            "# TYPE pvnet_port_rx_packets_total counter",
            "pvnet_port_rx_packets_total{port=\"vm0\",kind=\"vhost-user\"} 1234567",
            "pvnet_port_rx_packets_total{port=\"we\\\"ird\\\\po\\nrt\",kind=\"tap\"} 5",
            "pvnet_port_rx_bytes_total{port=\"vm0\",kind=\"vhost-user\"} 98765432100",
            "pvnet_port_drops_no_buffer_total{port=\"vm0\",kind=\"vhost-user\"} 3",
            "pvnet_port_sw_gso_total{port=\"vm0\",kind=\"vhost-user\"} 5",
            "pvnet_port_flooded_total{port=\"we\\\"ird\\\\po\\nrt\",kind=\"tap\"} 9",
        ] {
            assert!(m.lines().any(|x| x == l), "missing {l:?} in\n{m}");
        }
        // Every line is a comment or a sample; HELP/TYPE once per family, before its samples.
        let mut typed = std::collections::BTreeSet::new();
        for l in m.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().expect("name");
                assert!(typed.insert(name.to_owned()), "TYPE twice: {name}");
            } else if !l.starts_with("# HELP ") {
                let name = l.split(['{', ' ']).next().expect("name");
                assert!(typed.contains(name), "sample before TYPE: {l}");
                assert!(
                    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "{name}"
                );
            }
        }
        assert_eq!(m.matches("# HELP pvnet_port_rx_packets_total ").count(), 1);
        assert!(m.ends_with('\n'));
        // Counter names that do not fit a metric name, and a trailing _total.
        let mut s = Status::default();
        s.ports.push(PortInfo {
            name: "p".into(),
            kind: "sink".into(),
            state: "up".into(),
            counters: [("odd-name.x".to_owned(), 1), ("errs_total".to_owned(), 2)]
                .into_iter()
                .collect(),
            ..PortInfo::default()
        });
        s.uptime_secs = f64::INFINITY;
        let m = render_metrics(&s);
        assert!(
            m.contains("\npvnet_port_odd_name_x_total{port=\"p\",kind=\"sink\"} 1\n"),
            "{m}"
        );
        assert!(
            m.contains("\npvnet_port_errs_total{port=\"p\",kind=\"sink\"} 2\n"),
            "{m}"
        );
        assert!(m.contains("pvnet_uptime_seconds +Inf\n"), "{m}");
        // A multiqueue port: each pair's counters labelled with its index, and a row each in
        // the table under the port's.
        let mut s = sample();
        s.ports[0].queues = vec![
            counters_of(&[("rx_packets", 1_000_000), ("tx_packets", 3)]),
            counters_of(&[("rx_packets", 234_567), ("tx_packets", 4)]),
        ];
        let m = render_metrics(&s);
        assert!(
            m.contains("\npvnet_queue_rx_packets_total{port=\"vm0\",kind=\"vhost-user\",queue=\"1\"} 234567\n"),
            "{m}"
        );
        assert_eq!(
            m.matches("# TYPE pvnet_queue_tx_packets_total counter")
                .count(),
            1
        );
        let t = render_ports(&s);
        let rows: Vec<&str> = t.lines().collect();
        assert_eq!(rows.len(), 5, "{t}");
        assert!(
            rows[2].trim_start().starts_with("q0") && rows[3].contains("234567"),
            "{t}"
        );
        // Several workers: a table of them under the ports, and their counters as metrics.
        s.workers = (0..2u64)
            .map(|k| WorkerRow {
                worker: usize::try_from(k).unwrap_or(0),
                cpu: Some(0),
                cpu_secs: 1.5,
                busy_pct: 12.5,
                ports: vec![format!("p{k}")],
                handoff_out: 7 + k,
                handoff_in: 9,
                load_pct: 40.0,
                busy_secs: 0.25,
                moved_in: k,
                moved_out: 1 - k,
            })
            .collect();
        let t = render_ports(&s);
        assert!(
            t.contains("HANDOFF_OUT") && t.contains(" 12.5 ") && t.contains(" 40.0 "),
            "{t}"
        );
        assert!(t.contains(" 1/0 ") && t.contains(" 0/1 "), "{t}");
        let m = render_metrics(&s);
        assert!(
            m.contains("\npvnet_worker_handoff_out_total{worker=\"1\"} 8\n"),
            "{m}"
        );
        assert!(
            m.contains("\npvnet_worker_load_ratio{worker=\"0\"} 0.4\n")
                && m.contains("\npvnet_worker_busy_seconds_total{worker=\"1\"} 0.25\n")
                && m.contains("\npvnet_worker_ports_moved_in_total{worker=\"1\"} 1\n"),
            "{m}"
        );
    }
}
