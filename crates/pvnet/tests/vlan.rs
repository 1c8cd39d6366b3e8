//! 802.1Q VLANs through `pvnet switch` end to end: generators in two VLANs flood at once
//! (on two workers, so floods cross the shards' trunks), and each sink gets exactly its
//! VLANs' frames, tagged on a trunk (4 bytes more each) and untagged on an access port or as
//! a trunk's native VLAN; a generator on a trunk with no native VLAN has every frame dropped
//! and counted (`vlan_filtered`); `pvnet ctl macs` shows the same address in two VLANs;
//! `pvnet ctl port set` changes a port's VLANs at once and refuses bad ones.
//! (Tagged frames from real peers: tests/interop/run.sh.)

mod common;

use common::{counters, switch_drops, u, Switch, TestDir, RUN};
use serde_json::Value;
use std::time::{Duration, Instant};

/// `pvnet ctl ARGS...` against `sw`: whether it succeeded, and what it printed.
fn ctl(sw: &Switch, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(common::BIN)
        .args(["ctl", "--ctl-socket", sw.ctl.to_str().unwrap()])
        .args(args)
        .output()
        .expect("run pvnet ctl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn detail(st: &Value, port: &str) -> String {
    st["ports"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == port))
        .and_then(|p| p["detail"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn vlans_isolate_floods_and_tag_exactly_across_workers() {
    let dir = TestDir::new("vlan");
    // Both generators send from the same address to an unknown one: flooded in their VLAN.
    // (They start half a second after the first receiver appears: every port is placed by
    // then, or a worker without its sinks yet would drop their first frames, port_down.)
    let mut sw = Switch::start(
        &dir,
        &[
            "--workers",
            "2",
            "--port",
            "gen:name=g10,vlan=10,rate=20000,secs=0.3,delay=0.5",
            "--port",
            "gen:name=g20,vlan=20,rate=10000,secs=0.3,delay=0.5",
            "--port",
            "gen:name=gx,trunk=30,rate=5000,secs=0.3,delay=0.5,src=02:00:00:00:00:33",
            "--port",
            "sink:name=s10,vlan=10",
            "--port",
            "sink:name=s20,vlan=20",
            "--port",
            "sink:name=tr,trunk=10,20",
            "--port",
            "sink:name=nat,trunk=20,native=10",
            "--port",
            "sink:name=plain",
        ],
    );
    sw.proc
        .wait_stderr_count(&["generator done"], 3, Duration::from_secs(20));
    // The last frames are switched within a round or two of the marker: wait until the
    // counts stop moving.
    let mut st = sw.ctl("ports");
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = sw.ctl("ports");
        let moving = ["s10", "s20", "tr", "nat"]
            .iter()
            .any(|p| counters(&now, p)["tx_packets"] != counters(&st, p)["tx_packets"]);
        st = now;
        if !moving || Instant::now() > until {
            break;
        }
    }
    let c = |n: &str| counters(&st, n).clone();
    let (g10, g20, gx) = (c("g10"), c("g20"), c("gx"));
    let (n10, n20) = (u(&g10, "/rx_packets"), u(&g20, "/rx_packets"));
    assert!(n10 > 1000 && n20 > 500, "{st}");
    assert_eq!(switch_drops(&g10), 0, "{g10}");
    assert_eq!(switch_drops(&g20), 0, "{g20}");
    // Access ports: their own VLAN's frames, as sent.
    let (s10, s20) = (c("s10"), c("s20"));
    assert_eq!(u(&s10, "/tx_packets"), n10, "{st}");
    assert_eq!(u(&s20, "/tx_packets"), n20, "{st}");
    assert_eq!(u(&s10, "/tx_bytes"), u(&g10, "/rx_bytes"), "{st}");
    assert_eq!(u(&s20, "/tx_bytes"), u(&g20, "/rx_bytes"), "{st}");
    // The trunk of both: every frame, each 4 bytes longer (tagged).
    let tr = c("tr");
    assert_eq!(u(&tr, "/tx_packets"), n10 + n20, "{st}");
    assert_eq!(
        u(&tr, "/tx_bytes"),
        u(&s10, "/tx_bytes") + u(&s20, "/tx_bytes") + 4 * (n10 + n20),
        "{st}"
    );
    // The trunk of 20 with native 10: VLAN 10 untagged, VLAN 20 tagged.
    let nat = c("nat");
    assert_eq!(u(&nat, "/tx_packets"), n10 + n20, "{st}");
    assert_eq!(
        u(&nat, "/tx_bytes"),
        u(&s10, "/tx_bytes") + u(&s20, "/tx_bytes") + 4 * n20,
        "{st}"
    );
    // Plain ports are in no VLAN: nothing reached them.
    for p in ["plain", "s"] {
        assert_eq!(u(&c(p), "/tx_packets"), 0, "{p}: {st}");
    }
    // Untagged frames on a trunk without a native VLAN: every one dropped, counted.
    let nx = u(&gx, "/rx_packets");
    assert!(nx > 100, "{gx}");
    assert_eq!(u(&gx, "/drops_vlan_filtered"), nx, "{gx}");
    assert_eq!(switch_drops(&gx), nx, "{gx}");

    // The generators' address is learned once in each VLAN; gx's in none.
    let macs = sw.ctl("macs");
    let mut seen: Vec<(u64, String)> = macs["macs"]
        .as_array()
        .expect("macs")
        .iter()
        .filter(|m| m["mac"] == "02:00:00:00:00:01")
        .map(|m| (u(m, "/vlan"), m["port"].as_str().unwrap_or("").to_string()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![(10, "g10".to_string()), (20, "g20".to_string())],
        "{macs}"
    );
    assert!(
        !macs["macs"].to_string().contains("02:00:00:00:00:33"),
        "{macs}"
    );
    let (ok, table) = ctl(&sw, &["macs"]);
    assert!(
        ok && table.starts_with("MAC") && table.contains("VLAN"),
        "{table}"
    );

    // The ports list says each port's VLANs.
    assert!(detail(&st, "tr").ends_with("trunk 10,20"), "{st}");
    assert!(detail(&st, "nat").ends_with("trunk 20 native 10"), "{st}");
    assert!(detail(&st, "s10").ends_with("vlan 10"), "{st}");
    assert!(!detail(&st, "plain").contains("vlan"), "{st}");

    // Changed at runtime, in place: s20 leaves VLAN 20 for a trunk; bad settings refused
    // with what is wrong, and the port keeps its settings.
    for (args, why) in [
        (vec!["port", "set", "s20", "trunk=5"], "not both"),
        (vec!["port", "set", "s20", "vlan=4095"], "out of range"),
        (
            vec!["port", "set", "s20", "vlan=", "trunk=30-20"],
            "is empty",
        ),
        (vec!["port", "set", "s20", "native=3"], "not both"),
    ] {
        let (ok, out) = ctl(&sw, &args);
        assert!(!ok && out.contains(why), "{args:?}: {out}");
    }
    let (ok, out) = ctl(&sw, &["port", "set", "s20", "vlan=", "trunk=20,40-41"]);
    assert!(ok && out.contains("VLANs now trunk 20,40-41"), "{out}");
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let st = sw.ctl("ports");
        if detail(&st, "s20").ends_with("trunk 20,40-41") {
            break;
        }
        assert!(Instant::now() < until, "{st}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Changed back; its counters stay.
    let (ok, out) = ctl(&sw, &["port", "set", "s20", "trunk=", "vlan=20"]);
    assert!(ok && out.contains("VLANs now vlan 20"), "{out}");
    assert_eq!(u(&sw.counters("s20"), "/tx_packets"), n20);

    sw.proc.signal(libc::SIGINT);
    let fin = sw.proc.finish(RUN);
    assert_eq!(u(counters(&fin, "tr"), "/tx_packets"), n10 + n20, "{fin}");
}
