//! The balancer of `pvnet switch --workers 2` moving a port off a saturated worker, with
//! pvnet's own frontends. A test binary of its own: the balancer moves only with CPU to
//! spare, which tests running beside it in one binary would take.

mod common;

use common::{frontend, placement, u, Switch, TestDir, RUN};
use std::time::Duration;

/// Two workers, two frontends sending as fast as they can on ports a and c, both placed on
/// worker 0 (by hand), worker 1 idle: once worker 0 has been saturated for 3 s, the balancer
/// moves one of them to worker 1, and every frame still reaches the switch, counted once.
/// On these two CPUs the frontends leave little CPU idle, and the balancer moves on its own
/// measurement only where it finds half a CPU to spare: `--rebalance-spare 1` says a CPU is
/// idle (saturated from 70% busy: a frontend off its CPU leaves worker 0 rounds with nothing
/// to move). Then, measured, with the machine's CPUs taken (a spinner on each, as other work
/// would: how much the frontends alone leave idle depends on the machine's state, from none
/// to half a CPU): worker 0 saturated, no CPU idle, no move.
#[test]
fn a_saturated_worker_hands_a_port_to_an_idle_one() {
    let dir = TestDir::new("swbal");
    let c = dir.vhost_port("c");
    let mut sw = Switch::start(
        &dir,
        &[
            "--workers",
            "2",
            "--rebalance-load",
            "70",
            "--rebalance-spare",
            "1",
            "--port",
            &c,
        ],
    );
    // Placed by count, in configuration order: a, s on worker 0; b, c on worker 1.
    assert_eq!(
        placement(&sw.ctl("ports")),
        [vec!["a", "s"], vec!["b", "c"]]
    );
    let r = sw.ctl_args(&["port", "move", "c", "0"]);
    assert_eq!(r["result"], "moved", "{r}");
    let fes: Vec<_> = [&sw.a, &dir.sock("c")]
        .into_iter()
        .map(|s| frontend("frontend tx", s, &["--role", "tx", "--secs", "7"]))
        .collect();

    let deadline = std::time::Instant::now() + Duration::from_secs(9);
    let st = loop {
        let st = sw.ctl("ports");
        if st["workers"][1]["moved_in"] == 1 {
            break st;
        }
        assert!(std::time::Instant::now() < deadline, "no move: {st}");
        std::thread::sleep(Duration::from_millis(250));
    };
    let w = placement(&st);
    assert!(
        w[1].contains(&"a".to_string()) != w[1].contains(&"c".to_string()),
        "one of a and c moved to worker 1: {st}"
    );
    sw.proc
        .wait_stderr("worker saturated: moving a port", Duration::from_secs(1));
    for (mut fe, port) in fes.into_iter().zip(["a", "c"]) {
        let f = fe.finish(RUN);
        assert_eq!(
            u(&sw.counters(port), "/rx_packets"),
            u(&f, "/tx_packets"),
            "{port}: {f}"
        );
    }
    sw.proc.signal(libc::SIGINT);
    sw.proc.finish(RUN);

    // The same load with the idle CPU measured: none is, and nothing moves.
    let dir = TestDir::new("swbal2");
    let c = dir.vhost_port("c");
    let mut sw = Switch::start(
        &dir,
        &["--workers", "2", "--rebalance-load", "70", "--port", &c],
    );
    let r = sw.ctl_args(&["port", "move", "c", "0"]);
    assert_eq!(r["result"], "moved", "{r}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    for mut fe in [&sw.a, &dir.sock("c")]
        .into_iter()
        .map(|s| frontend("frontend tx", s, &["--role", "tx", "--secs", "6"]))
        .collect::<Vec<_>>()
    {
        fe.finish(RUN);
    }
    let st = sw.ctl("ports");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in spinners {
        let _ = t.join();
    }
    assert!(
        st["workers"][0]["load_pct"].as_f64().unwrap_or(0.0) >= 70.0,
        "worker 0 saturated, as in the first half: {st}"
    );
    assert_eq!(placement(&st), [vec!["a", "s", "c"], vec!["b"]], "{st}");
    assert!(
        !sw.proc.stderr().contains("moving a port"),
        "{}",
        sw.proc.stderr()
    );
    sw.proc.signal(libc::SIGINT);
    sw.proc.finish(RUN);
}
