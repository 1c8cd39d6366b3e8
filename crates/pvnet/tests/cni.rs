//! The CNI plugin (`packaging/cni/pvnet-cni`, which runs `pvnet cni`) invoked the way a
//! container runtime invokes it: CNI_COMMAND and friends in the environment, the network
//! configuration on stdin, the result on stdout. No cluster: a running `pvnet switch`.

mod common;

use common::{counters, frontend, u, Proc, TestDir, BIN, RUN};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs the plugin script: (exit success, stdout as JSON if any).
fn cni(cmd: &str, id: &str, ifname: &str, conf: &str) -> (bool, Value) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/cni/pvnet-cni");
    let mut c = Command::new(script)
        .env("PVNET_BIN", BIN)
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_IFNAME", ifname)
        .env("CNI_NETNS", "/var/run/netns/test")
        .env("CNI_PATH", "/opt/cni/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the CNI plugin");
    c.stdin
        .take()
        .expect("stdin")
        .write_all(conf.as_bytes())
        .expect("write config");
    let out = c.wait_with_output().expect("plugin output");
    let text = String::from_utf8_lossy(&out.stdout);
    let v = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    };
    (out.status.success(), v)
}

fn conf(ctl: &Path, shared: &Path, mode: &str, version: &str) -> String {
    serde_json::json!({
        "cniVersion": version, "name": "pvnet", "type": "pvnet-cni",
        "ctlSocket": ctl, "sharedDir": shared,
        "host": { "vhost": { "mode": mode } },
        "port": { "qdisc": "fifo", "offloads": true },
    })
    .to_string()
}

/// The switch's status (`pvnet ctl ports --json`).
fn status(ctl: &Path) -> Value {
    let out = Command::new(BIN)
        .args(["ctl", "--ctl-socket"])
        .arg(ctl)
        .args(["ports", "--json"])
        .output()
        .expect("pvnet ctl");
    serde_json::from_slice(&out.stdout).expect("ctl json")
}

fn names(ctl: &Path) -> Vec<String> {
    status(ctl)["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

fn start_switch(ctl: &Path, state: &Path) -> Proc {
    let (c, s) = (ctl.to_str().unwrap(), state.to_str().unwrap());
    let mut p = Proc::spawn(
        "switch",
        &[
            "switch",
            "--port",
            "sink:name=s",
            "--ctl-socket",
            c,
            "--state",
            s,
        ],
        &[("PVNET_LOG", "info")],
    );
    common::wait_socket(&mut p, ctl);
    p
}

#[test]
fn the_cni_plugin_attaches_and_detaches_idempotently_across_a_switch_restart() {
    let dir = TestDir::new("cni");
    let ctl = dir.sock("ctl");
    let state = dir.sock("state").with_extension("toml");
    let shared: PathBuf = dir.sock("shared").with_extension("d");
    let mut sw = start_switch(&ctl, &state);
    let id = "0123456789abcdef0123456789abcdef";
    let server = conf(&ctl, &shared, "server", "1.0.0");
    let client = conf(&ctl, &shared, "client", "0.4.0");

    let (ok, v) = cni("VERSION", id, "net1", "");
    assert!(ok, "{v}");
    assert!(
        v["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == "1.0.0"),
        "{v}"
    );

    // ADD, twice: the same answer, one port.
    let sock = shared.join("0123456789ab").join("0123456789ab-net1");
    for _ in 0..2 {
        let (ok, v) = cni("ADD", id, "net1", &server);
        assert!(ok, "ADD: {v}");
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["interfaces"][0]["name"], "net1");
        assert_eq!(v["interfaces"][0]["socketPath"], sock.to_str().unwrap());
    }
    assert!(sock.exists(), "pvnet listens on {}", sock.display());
    assert_eq!(names(&ctl), ["s", "0123456789ab-net1"]);
    // A frontend on the pod's socket reaches the switch.
    let tx = frontend("frontend tx", &sock, &["--role", "tx", "--count", "1000"]).finish(RUN);
    assert_eq!(u(&tx, "/data_sent"), 1000, "{tx}");
    let st = status(&ctl);
    let net1 = counters(&st, "0123456789ab-net1");
    assert_eq!(u(net1, "/rx_packets"), u(&tx, "/tx_packets"), "{net1}");
    // A second interface, pvnet the client (the pod's application listens).
    let pod = std::os::unix::net::UnixListener::bind(sock.with_file_name("0123456789ab-net2"))
        .expect("the pod's socket");
    let (ok, v) = cni("ADD", id, "net2", &client);
    assert!(ok, "{v}");
    assert_eq!(v["cniVersion"], "0.4.0");
    let (ok, v) = cni("CHECK", id, "net2", &client);
    assert!(ok, "{v}");

    // The switch restarts: both come back (its state file), counters start over.
    sw.signal(libc::SIGTERM);
    assert!(sw.wait_exit(RUN).success());
    let mut sw = start_switch(&ctl, &state);
    assert_eq!(names(&ctl), ["s", "0123456789ab-net1", "0123456789ab-net2"]);
    let st = status(&ctl);
    let net1 = counters(&st, "0123456789ab-net1");
    assert_eq!(u(net1, "/rx_packets"), 0, "{net1}");
    assert!(sock.exists());

    // DEL, twice each: gone, the socket and then the directory with it.
    for _ in 0..2 {
        let (ok, v) = cni("DEL", id, "net1", &server);
        assert!(ok, "DEL: {v}");
    }
    assert!(!sock.exists());
    assert!(sock.parent().unwrap().exists(), "net2's directory stays");
    let (ok, v) = cni("DEL", id, "net2", &client);
    assert!(ok, "{v}");
    assert!(
        !sock.parent().unwrap().exists(),
        "the pod's directory is gone"
    );
    drop(pod);
    assert_eq!(names(&ctl), ["s"]);
    let (ok, v) = cni("CHECK", id, "net2", &client);
    assert!(!ok && v["code"] == 11, "{v}");

    // Errors are CNI error objects.
    let (ok, v) = cni("ADD", id, "net1", &conf(&ctl, &shared, "server", "9.9.9"));
    assert!(!ok && v["code"] == 1, "{v}");
    let (ok, v) = cni("ADD", id, "net1", &conf(&ctl, &shared, "sideways", "1.0.0"));
    assert!(!ok && v["code"] == 7, "{v}");
    let (ok, v) = cni("ADD", "../etc", "net1", &server);
    assert!(!ok && v["code"] == 4, "{v}");
    let (ok, v) = cni("ADD", id, "net1", "{not json");
    assert!(!ok && v["code"] == 6, "{v}");

    // With the switch gone, ADD fails (try again later) and DEL still succeeds.
    sw.signal(libc::SIGTERM);
    assert!(sw.wait_exit(RUN).success());
    let (ok, v) = cni("ADD", id, "net3", &server);
    assert!(!ok && v["code"] == 11, "{v}");
    let (ok, v) = cni("DEL", id, "net3", &server);
    assert!(ok, "{v}");
}
