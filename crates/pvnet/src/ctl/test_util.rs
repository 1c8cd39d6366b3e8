//! A sample status for the tests of the control modules.

use super::protocol::{MacInfo, PortInfo, Status, StatusFn};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub(crate) fn counters_of(v: &[(&str, u64)]) -> BTreeMap<String, u64> {
    v.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
}

pub(crate) fn sample() -> Status {
    let counters = counters_of;
    Status {
        uptime_secs: 12.5,
        ports: vec![
            PortInfo {
                name: "vm0".into(),
                kind: "vhost-user".into(),
                state: "up".into(),
                detail: "/run/pvnet/vm0.sock".into(),
                counters: counters(&[
                    ("rx_packets", 1_234_567),
                    ("rx_bytes", 98_765_432_100),
                    ("tx_packets", 7),
                    ("tx_bytes", 448),
                    ("drops_no_buffer", 3),
                    ("drops_too_big", 4),
                    ("kicks", 11),
                    ("calls", 12),
                    ("sw_gso", 5),
                    ("backlog", 17),
                ]),
                error: None,
                queues: Vec::new(),
            },
            PortInfo {
                name: "we\"ird\\po\nrt".into(),
                kind: "tap".into(),
                state: "down".into(),
                detail: "tap0".into(),
                counters: counters(&[("rx_packets", 5), ("flooded", 9)]),
                error: None,
                queues: Vec::new(),
            },
        ],
        macs: vec![
            MacInfo {
                vlan: 0,
                mac: "52:54:00:00:00:02".into(),
                port: "vm0".into(),
                age_secs: 125.25,
            },
            MacInfo {
                vlan: 10,
                mac: "52:54:00:00:00:01".into(),
                port: "vm0".into(),
                age_secs: 0.5,
            },
        ],
        workers: Vec::new(),
    }
}

pub(crate) fn sample_fn() -> StatusFn {
    Arc::new(sample)
}

/// Sets `stop` and joins the thread, which must end within a second.
pub(crate) fn stop_and_join(stop: &AtomicBool, t: JoinHandle<()>) {
    let t0 = Instant::now();
    stop.store(true, Ordering::Relaxed);
    t.join().expect("server thread panicked");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
}
