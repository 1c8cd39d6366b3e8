//! The tables `pvnet ctl` prints: ports (with queue pairs and workers) and learned addresses.

use super::protocol::{MacInfo, Status};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A table cell: control characters (a newline in a port name, a terminal escape) are shown
/// escaped instead of breaking the table or reaching the terminal.
fn cell(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for ch in v.chars() {
        if ch.is_control() {
            o.extend(ch.escape_debug());
        } else {
            o.push(ch);
        }
    }
    o
}

/// Columns separated by two spaces; `right[i]` right-aligns column i; the last column is
/// not padded.
fn render_table(head: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (wi, cell) in w.iter_mut().zip(r) {
            *wi = (*wi).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let head: Vec<String> = head.iter().map(|h| (*h).to_owned()).collect();
    for r in std::iter::once(&head).chain(rows) {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let last = i + 1 == r.len();
            match (right.get(i).copied().unwrap_or(false), last) {
                (true, _) => {
                    let _ = write!(line, "{cell:>0$}", w[i]);
                }
                (false, false) => {
                    let _ = write!(line, "{cell:<0$}", w[i]);
                }
                (false, true) => line.push_str(cell),
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Sum of every `drops*` counter, `None` when the port has none.
fn drops(counters: &BTreeMap<String, u64>) -> Option<u64> {
    counters
        .iter()
        .filter(|(k, _)| k.as_str() == "drops" || k.starts_with("drops_"))
        .map(|(_, v)| *v)
        .reduce(u64::saturating_add)
}

/// The `pvnet ctl ports` table. Counters a port does not have show as `-`.
pub fn render_ports(s: &Status) -> String {
    let head = [
        "NAME", "KIND", "STATE", "RX_PKTS", "RX_BYTES", "TX_PKTS", "TX_BYTES", "DROPS", "QUEUED",
        "KICKS", "CALLS", "DETAIL",
    ];
    let right = [
        false, false, false, true, true, true, true, true, true, true, true, false,
    ];
    let num = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    let mut rows: Vec<Vec<String>> = Vec::new();
    for p in &s.ports {
        let c = |k: &str| num(p.counters.get(k).copied());
        rows.push(vec![
            cell(&p.name),
            cell(&p.kind),
            cell(&p.state),
            c("rx_packets"),
            c("rx_bytes"),
            c("tx_packets"),
            c("tx_bytes"),
            num(drops(&p.counters)),
            c("backlog"),
            c("kicks"),
            c("calls"),
            cell(&p.detail),
        ]);
        // A multiqueue port: one row per queue pair under it.
        for (k, q) in p.queues.iter().enumerate() {
            let c = |n: &str| num(q.get(n).copied());
            rows.push(vec![
                format!("  q{k}"),
                String::new(),
                String::new(),
                c("rx_packets"),
                c("rx_bytes"),
                c("tx_packets"),
                c("tx_bytes"),
                c("drops"),
                "-".into(),
                c("kicks"),
                c("calls"),
                String::new(),
            ]);
        }
    }
    let mut out = render_table(&head, &right, &rows);
    for p in &s.ports {
        if let Some(e) = &p.error {
            out += &format!("{}: {}\n", cell(&p.name), cell(e));
        }
    }
    if s.workers.len() > 1 {
        let rows: Vec<Vec<String>> = s
            .workers
            .iter()
            .map(|w| {
                vec![
                    w.worker.to_string(),
                    w.cpu.map_or_else(|| "-".into(), |c| c.to_string()),
                    format!("{:.1}", w.busy_pct),
                    format!("{:.1}", w.load_pct),
                    format!("{}/{}", w.moved_in, w.moved_out),
                    w.handoff_out.to_string(),
                    w.handoff_in.to_string(),
                    cell(&w.ports.join(",")),
                ]
            })
            .collect();
        out += "\n";
        out += &render_table(
            &[
                "WORKER",
                "CPU",
                "CPU%",
                "LOAD%",
                "MOVED_IN/OUT",
                "HANDOFF_OUT",
                "HANDOFF_IN",
                "PORTS",
            ],
            &[true, true, true, true, true, true, true, false],
            &rows,
        );
    }
    out
}

/// The `pvnet ctl macs` table, by port, VLAN, then address (VLAN `-`: ports with no VLAN
/// settings).
pub fn render_macs(s: &Status) -> String {
    let mut macs: Vec<&MacInfo> = s.macs.iter().collect();
    macs.sort_by(|a, b| (&a.port, a.vlan, &a.mac).cmp(&(&b.port, b.vlan, &b.mac)));
    let rows: Vec<Vec<String>> = macs
        .iter()
        .map(|m| {
            vec![
                cell(&m.mac),
                if m.vlan == 0 {
                    "-".into()
                } else {
                    m.vlan.to_string()
                },
                cell(&m.port),
                format!("{:.1}s", m.age_secs),
            ]
        })
        .collect();
    render_table(
        &["MAC", "VLAN", "PORT", "AGE"],
        &[false, true, false, true],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::metrics::render_metrics;
    use crate::ctl::test_util::*;

    #[test]
    fn levels_are_gauges_and_the_table_shows_the_egress_backlog() {
        let s = sample();
        let m = render_metrics(&s);
        assert!(m.contains("# TYPE pvnet_port_backlog gauge"), "{m}");
        assert!(m.contains("pvnet_port_backlog{port=\"vm0\",kind=\"vhost-user\"} 17"));
        assert!(!m.contains("pvnet_port_backlog_total"));
        let t = render_ports(&s);
        assert!(
            t.lines().next().is_some_and(|h| h.contains("QUEUED")),
            "{t}"
        );
        assert!(t.lines().nth(1).is_some_and(|l| l.contains(" 17 ")), "{t}");
    }
    #[test]
    fn a_stopped_queue_shows_its_cause() {
        let mut s = sample();
        s.ports[0].error = Some("queue 1: avail index jumped from 0 to 999".into());
        let out = render_ports(&s);
        assert!(
            out.lines()
                .any(|l| l.ends_with("queue 1: avail index jumped from 0 to 999")),
            "{out}"
        );
        // The JSON carries it; a port without one carries no field.
        let j = serde_json::to_value(&s).expect("json");
        assert_eq!(
            j["ports"][0]["error"],
            "queue 1: avail index jumped from 0 to 999"
        );
        assert!(j["ports"][1].get("error").is_none());
    }
    /// The value in `row` right-aligned under `header` of `head`: it ends in the same column
    /// as the header and is preceded by a blank.
    fn under(head: &str, row: &str, header: &str) -> String {
        let end = head.find(header).unwrap_or_else(|| panic!("{header}")) + header.len();
        assert!(
            row.len() == end || row[end..].starts_with(' '),
            "{header}: {row:?}"
        );
        row[..end].rsplit(' ').next().unwrap_or_default().to_owned()
    }
    #[test]
    fn ports_table() {
        let t = render_ports(&sample());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        let (head, vm0, other) = (lines[0], lines[1], lines[2]);
        for h in [
            "NAME", "KIND", "STATE", "RX_PKTS", "RX_BYTES", "TX_PKTS", "TX_BYTES", "DROPS",
            "KICKS", "CALLS", "DETAIL",
        ] {
            assert!(head.contains(h), "{h} in {head}");
        }
        for w in ["vm0", "vhost-user", "up", "/run/pvnet/vm0.sock"] {
            assert!(vm0.contains(w), "{w} in {vm0}");
        }
        // Numbers right-aligned under their headers; drops = sum of drops_*; missing
        // counters shown as '-'.
        for (h, a, b) in [
            ("RX_PKTS", "1234567", "5"),
            ("RX_BYTES", "98765432100", "-"),
            ("TX_PKTS", "7", "-"),
            ("TX_BYTES", "448", "-"),
            ("DROPS", "7", "-"),
            ("KICKS", "11", "-"),
            ("CALLS", "12", "-"),
        ] {
            assert_eq!(under(head, vm0, h), a, "{h}\n{t}");
            assert_eq!(under(head, other, h), b, "{h}\n{t}");
        }
        assert!(vm0.ends_with("  /run/pvnet/vm0.sock"), "{vm0}");
        assert!(other.ends_with("  tap0"), "{other}");
        // Control characters escaped, not breaking the line.
        assert!(other.starts_with("we\"ird\\po\\nrt  tap"), "{other}");
        // Text columns left-aligned.
        assert_eq!(vm0.find("vhost-user"), head.find("KIND"));
        assert!(!t.lines().any(|l| l.ends_with(' ')), "no trailing blanks");
        // Nothing to show: just the header.
        assert_eq!(render_ports(&Status::default()).lines().count(), 1);
    }

    #[test]
    fn macs_table() {
        let t = render_macs(&sample());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(
            lines[0].starts_with("MAC") && lines[0].contains("PORT"),
            "{t}"
        );
        // Sorted by port, VLAN (`-`: none) then address; ages right-aligned.
        assert!(lines[0].contains("VLAN"), "{t}");
        assert!(lines[1].starts_with("52:54:00:00:00:02"), "{t}");
        assert!(lines[2].starts_with("52:54:00:00:00:01"), "{t}");
        let cols = |l: &str| l.split_whitespace().nth(1).map(str::to_owned);
        assert_eq!(cols(lines[1]).as_deref(), Some("-"), "{t}");
        assert_eq!(cols(lines[2]).as_deref(), Some("10"), "{t}");
        assert!(lines[2].ends_with("   0.5s"), "{t}");
        assert!(
            lines[1].ends_with("125.2s") || lines[1].ends_with("125.3s"),
            "{t}"
        );
        assert_eq!(lines[1].len(), lines[2].len());
        assert_eq!(lines[0].len(), lines[1].len());
    }
}
