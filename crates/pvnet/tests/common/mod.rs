//! Shared helpers for the process-level tests: run the real `pvnet` binary as child processes,
//! follow their JSON lines (stdout) and logs (stderr), and wait on events with deadlines.
//!
//! Every child is killed when its [`Proc`] drops (also when a test panics), every wait is
//! bounded, and every test gets its own directory (and so its own socket paths).

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_pvnet");

/// Upper bound for a process to start (socket bound, `ready` printed). Only reached on failure.
pub const START: Duration = Duration::from_secs(20);
/// Upper bound for a short run (`--secs 0.3`) to finish. Only reached on failure.
pub const RUN: Duration = Duration::from_secs(60);
/// Upper bound for a log line or a signal to show up. Only reached on failure.
pub const EVENT: Duration = Duration::from_secs(10);

/// A fresh directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    /// A directory unique to this process and call (tests run in parallel threads).
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // Short: unix socket paths are limited to 108 bytes.
        let path = std::env::temp_dir().join(format!("pvt-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create test dir");
        Self { path }
    }

    /// A socket path inside the directory.
    pub fn sock(&self, name: &str) -> PathBuf {
        self.path.join(format!("{name}.sock"))
    }

    /// A `--port` spec: vhost-user port `name` on its own socket in this directory.
    pub fn vhost_port(&self, name: &str) -> String {
        format!(
            "vhost-user:name={name},socket={}",
            self.sock(name).display()
        )
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes ANSI escape sequences (colored log output) from a line.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            if it.peek() == Some(&'[') {
                it.next();
                // CSI: parameters and intermediates, then one final byte in 0x40..=0x7e.
                for d in it.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&d) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[derive(Debug, Default)]
struct Output {
    /// Every stdout line that parsed as JSON.
    json: Vec<Value>,
    /// Every stdout line, raw.
    stdout: Vec<String>,
    /// Every stderr line, ANSI stripped.
    stderr: Vec<String>,
    stdout_eof: bool,
    stderr_eof: bool,
}

type Shared = Arc<(Mutex<Output>, Condvar)>;

fn lock(s: &Shared) -> MutexGuard<'_, Output> {
    s.0.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A child `pvnet` process with its stdout and stderr followed by reader threads.
#[derive(Debug)]
pub struct Proc {
    /// A name for messages.
    pub name: String,
    child: Child,
    out: Shared,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `pvnet <args>` with extra environment variables.
    pub fn spawn(name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(args);
        Self::spawn_cmd(name, cmd, env)
    }

    /// [`Proc::spawn`] inside the network namespace `netns` (`ip netns exec`, which execs
    /// pvnet in its place: the process is pvnet's).
    pub fn spawn_netns(netns: &str, name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", netns, BIN]).args(args);
        Self::spawn_cmd(name, cmd, env)
    }

    fn spawn_cmd(name: &str, mut cmd: Command, env: &[(&str, &str)]) -> Self {
        cmd.env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !env.iter().any(|(k, _)| *k == "PVNET_LOG") {
            cmd.env_remove("PVNET_LOG");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let out: Shared = Arc::new((Mutex::new(Output::default()), Condvar::new()));
        let stdout = child.stdout.take().expect("stdout piped");
        let stderr = child.stderr.take().expect("stderr piped");
        let o = out.clone();
        let r1 = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut g = lock(&o);
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    g.json.push(v);
                }
                g.stdout.push(line);
                drop(g);
                o.1.notify_all();
            }
            lock(&o).stdout_eof = true;
            o.1.notify_all();
        });
        let o = out.clone();
        let r2 = std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = strip_ansi(String::from_utf8_lossy(&buf).trim_end());
                        lock(&o).stderr.push(line);
                        o.1.notify_all();
                    }
                }
            }
            lock(&o).stderr_eof = true;
            o.1.notify_all();
        });
        Self {
            name: name.to_string(),
            child,
            out,
            readers: vec![r1, r2],
            status: None,
        }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits i32")
    }

    /// Everything the process wrote on stderr so far.
    pub fn stderr(&self) -> String {
        lock(&self.out).stderr.join("\n")
    }

    /// Everything the process wrote on stdout so far.
    pub fn stdout(&self) -> String {
        lock(&self.out).stdout.join("\n")
    }

    fn context(&self) -> String {
        let g = lock(&self.out);
        format!(
            "--- {} stdout ---\n{}\n--- {} stderr ---\n{}",
            self.name,
            g.stdout.join("\n"),
            self.name,
            g.stderr.join("\n")
        )
    }

    /// Waits until `pred` holds on the output, the output ends (process gone) or `timeout`.
    fn wait_output<T>(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&Output) -> Option<T>,
    ) -> Option<T> {
        let until = Instant::now() + timeout;
        let mut g = lock(&self.out);
        loop {
            if let Some(t) = pred(&g) {
                return Some(t);
            }
            if g.stdout_eof && g.stderr_eof {
                return None;
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            g = self
                .out
                .1
                .wait_timeout(g, until - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Waits for a stdout JSON line with top-level `key` and returns its value.
    pub fn wait_json(&self, key: &str, timeout: Duration) -> Value {
        let r = self.wait_output(timeout, |o| o.json.iter().find_map(|v| v.get(key).cloned()));
        r.unwrap_or_else(|| {
            panic!(
                "{} did not print {key:?} within {timeout:?} (or exited)\n{}",
                self.name,
                self.context()
            )
        })
    }

    /// Waits for a stderr line containing `needle` and returns it.
    pub fn wait_stderr(&self, needle: &str, timeout: Duration) -> String {
        let r = self.wait_output(timeout, |o| {
            o.stderr.iter().find(|l| l.contains(needle)).cloned()
        });
        r.unwrap_or_else(|| {
            panic!(
                "{} did not log {needle:?} within {timeout:?} (or exited)\n{}",
                self.name,
                self.context()
            )
        })
    }

    /// Waits for `n` stderr lines that contain every one of `needles`.
    pub fn wait_stderr_count(&self, needles: &[&str], n: usize, timeout: Duration) {
        let r = self.wait_output(timeout, |o| {
            let c = o
                .stderr
                .iter()
                .filter(|l| needles.iter().all(|x| l.contains(x)))
                .count();
            (c >= n).then_some(())
        });
        if r.is_none() {
            panic!(
                "{} did not log {n} lines with {needles:?} within {timeout:?}\n{}",
                self.name,
                self.context()
            );
        }
    }

    /// Stderr lines that contain `needle`.
    pub fn stderr_lines(&self, needle: &str) -> Vec<String> {
        lock(&self.out)
            .stderr
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }

    /// True while the process has not exited.
    pub fn alive(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(st)) => {
                self.status = Some(st);
                false
            }
            Ok(None) => true,
            Err(e) => panic!("try_wait {}: {e}", self.name),
        }
    }

    /// Sends a signal.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; the child is not reaped before `Proc` drops
        // or `wait_exit` returns, so the pid cannot have been reused.
        let r = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(
            r,
            0,
            "kill({}, {sig}): {}",
            self.name,
            std::io::Error::last_os_error()
        );
    }

    /// Waits for the process to exit (panics after `timeout`, killing it), then for its
    /// output to be read to the end.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let until = Instant::now() + timeout;
        while self.alive() {
            if Instant::now() >= until {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not exit within {timeout:?}\n{}",
                    self.name,
                    self.context()
                );
            }
            // Bounded polling of the exit status: there is no portable "child exited" event
            // to block on without stealing SIGCHLD from the test harness.
            std::thread::sleep(Duration::from_millis(2));
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        self.status.expect("exited")
    }

    /// Waits for a successful exit and returns the `final` JSON object.
    pub fn finish(&mut self, timeout: Duration) -> Value {
        let st = self.wait_exit(timeout);
        assert!(
            st.success(),
            "{} exited with {st}\n{}",
            self.name,
            self.context()
        );
        self.final_json()
    }

    /// The `final` JSON object (after exit).
    pub fn final_json(&self) -> Value {
        let f = lock(&self.out)
            .json
            .iter()
            .find_map(|v| v.get("final").cloned());
        f.unwrap_or_else(|| panic!("{} printed no final report\n{}", self.name, self.context()))
    }

    /// The last stdout line that parsed as JSON (after exit).
    pub fn last_json(&self) -> Value {
        let v = lock(&self.out).json.last().cloned();
        v.unwrap_or_else(|| panic!("{} printed no JSON\n{}", self.name, self.context()))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

/// Starts `pvnet backend --socket <dir>/<name>.sock <args>` (info logs on stderr) and waits
/// until its socket is bound.
pub fn backend(dir: &TestDir, name: &str, args: &[&str]) -> (Proc, PathBuf) {
    let sock = dir.sock(name);
    let s = sock.to_str().expect("utf-8 path").to_string();
    let mut a = vec!["backend", "--socket", &s];
    a.extend_from_slice(args);
    let mut p = Proc::spawn(&format!("backend {name}"), &a, &[("PVNET_LOG", "info")]);
    wait_socket(&mut p, &sock);
    (p, sock)
}

/// Waits until the backend's listening socket exists (it binds before it creates the path's
/// entry, so existence means connect works).
pub fn wait_socket(p: &mut Proc, sock: &Path) {
    let until = Instant::now() + START;
    while !sock.exists() {
        assert!(
            p.alive(),
            "{} exited before binding {}\n{}",
            p.name,
            sock.display(),
            p.context()
        );
        assert!(
            Instant::now() < until,
            "{} did not bind {} in {START:?}",
            p.name,
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Starts `pvnet frontend --socket <sock> <args>`.
pub fn frontend(name: &str, sock: &Path, args: &[&str]) -> Proc {
    let s = sock.to_str().expect("utf-8 path").to_string();
    let mut a = vec!["frontend", "--socket", &s];
    a.extend_from_slice(args);
    Proc::spawn(name, &a, &[])
}

/// Runs a frontend to completion and returns its `final` object.
pub fn run_frontend(name: &str, sock: &Path, args: &[&str]) -> Value {
    frontend(name, sock, args).finish(RUN)
}

/// A u64 at a JSON pointer; panics (with the document) if absent.
pub fn u(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no u64 at {ptr} in {v}"))
}

/// `pvnet ctl ARGS --json` on the switch at `sock`: whether it succeeded, and its answer
/// (`Null` if it gave none).
pub fn ctl_json(sock: &Path, args: &[&str]) -> (bool, Value) {
    let out = Command::new(BIN)
        .args(["ctl", "--ctl-socket", sock.to_str().expect("utf-8")])
        .args(args)
        .arg("--json")
        .output()
        .expect("run pvnet ctl");
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.success(), v)
}

/// iperf3 against a server already listening at `addr`: TCP and UDP (50 Mbit/s), each way
/// (`-R`: the server sends), one second each; each must end well and move more than 1 Mbit/s.
/// The server takes a moment after each test and answers "busy" until then (in the JSON, exit
/// status 0), and iperf3 3.12's server closes its listening socket and opens a new one
/// between tests, resetting a connection that reached the old one's backlog ("unable to
/// connect to server: Connection reset by peer", more often on a loaded machine): both are
/// asked again for up to 10 s.
pub fn iperf3_both_ways(addr: &str) {
    for extra in [
        &[][..],
        &["-R"],
        &["-u", "-b", "50M"],
        &["-u", "-b", "50M", "-R"],
    ] {
        let mut args = vec!["-c", addr, "-t", "1", "-J"];
        args.extend_from_slice(extra);
        let until = Instant::now() + Duration::from_secs(10);
        let (ok, v) = loop {
            let out = Command::new("iperf3")
                .args(&args)
                .output()
                .unwrap_or_else(|e| panic!("iperf3 {args:?}: {e}"));
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            let busy = v["error"]
                .as_str()
                .is_some_and(|e| e.contains("busy") || e.contains("unable to connect"));
            if !busy || Instant::now() > until {
                break (out.status.success(), v);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(ok, "iperf3 {extra:?}: {v}");
        let bps = v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .or_else(|| v["end"]["sum"]["bits_per_second"].as_f64())
            .unwrap_or(0.0);
        assert!(bps > 1e6, "iperf3 {extra:?}: {bps} bit/s: {v}");
    }
}

/// The port called `name` in a `pvnet ctl ports --json` answer.
pub fn port_named<'a>(ports: &'a Value, name: &str) -> &'a Value {
    ports["ports"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no port {name} in {ports}"))
}

/// The `ports` array of a backend's `final` object.
pub fn ports(fin: &Value) -> Vec<Value> {
    fin.get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_else(|| panic!("no ports in {fin}"))
}

/// The entry of port `id` in a backend's `final` object.
pub fn port(fin: &Value, id: u64) -> Value {
    ports(fin)
        .into_iter()
        .find(|p| p.get("port").and_then(Value::as_u64) == Some(id))
        .unwrap_or_else(|| panic!("no port {id} in {fin}"))
}

/// Sum of every drop counter of a port entry.
pub fn drops(p: &Value) -> u64 {
    p.get("drops")
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("no drops in {p}"))
        .values()
        .map(|v| v.as_u64().expect("drop counter is a u64"))
        .sum()
}

/// Asserts a sink port received exactly what a `--role tx` frontend sent: every data frame and
/// the end marker, in order, with nothing dropped or failed.
pub fn assert_tx_to_sink_exact(fe: &Value, p: &Value, frame_len: u64) {
    let data = u(fe, "/data_sent");
    assert!(data > 0, "frontend sent no data: {fe}");
    assert_eq!(
        u(fe, "/tx_packets"),
        data + 1,
        "tx_packets = data + end marker: {fe}"
    );
    assert_eq!(
        u(p, "/rx_packets"),
        u(fe, "/tx_packets"),
        "port rx vs frontend tx\nport {p}\nfrontend {fe}"
    );
    assert_eq!(
        u(p, "/end_marker"),
        data,
        "end marker count vs data sent\nport {p}\nfrontend {fe}"
    );
    assert_eq!(
        u(p, "/rx_bytes"),
        u(fe, "/tx_packets") * frame_len,
        "rx_bytes: {p}"
    );
    assert_eq!(u(p, "/seq_errors"), 0, "{p}");
    assert_eq!(u(p, "/queue_errors"), 0, "{p}");
    assert_eq!(drops(p), 0, "{p}");
}

/// A running `pvnet switch` with vhost-user ports `a` and `b`, a sink port `s` and its
/// control socket, all in `dir`; `extra` are more options. Returns once every socket exists.
pub struct Switch {
    /// The process.
    pub proc: Proc,
    /// Socket of port `a`.
    pub a: PathBuf,
    /// Socket of port `b`.
    pub b: PathBuf,
    /// Control socket (`pvnet ctl`).
    pub ctl: PathBuf,
}

impl Switch {
    /// Starts it (with `PVNET_LOG=info`).
    pub fn start(dir: &TestDir, extra: &[&str]) -> Self {
        Self::start_env(dir, extra, &[])
    }

    /// [`Switch::start`] with more environment for the switch.
    pub fn start_env(dir: &TestDir, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let (a, b, ctl) = (dir.sock("a"), dir.sock("b"), dir.sock("ctl"));
        let spec = |n: &str, s: &Path| format!("vhost-user:name={n},socket={}", s.display());
        let (pa, pb) = (spec("a", &a), spec("b", &b));
        let c = ctl.to_str().expect("utf-8 path");
        let mut args = vec![
            "switch",
            "--port",
            &pa,
            "--port",
            &pb,
            "--port",
            "sink:name=s",
            "--ctl-socket",
            c,
        ];
        args.extend_from_slice(extra);
        let mut envs = vec![("PVNET_LOG", "info")];
        envs.extend_from_slice(env);
        let mut proc = Proc::spawn("switch", &args, &envs);
        for s in [&a, &b, &ctl] {
            wait_socket(&mut proc, s);
        }
        Self { proc, a, b, ctl }
    }

    /// `pvnet ctl WHAT --json` against it.
    pub fn ctl(&self, what: &str) -> Value {
        self.ctl_args(&[what])
    }

    /// `pvnet ctl ARGS... --json` against it (it must succeed).
    pub fn ctl_args(&self, args: &[&str]) -> Value {
        let out = Command::new(BIN)
            .args(["ctl", "--ctl-socket", self.ctl.to_str().unwrap()])
            .args(args)
            .arg("--json")
            .output()
            .expect("run pvnet ctl");
        assert!(out.status.success(), "pvnet ctl: {out:?}");
        serde_json::from_slice(&out.stdout).expect("ctl JSON")
    }

    /// The counters of port `name`, now.
    pub fn counters(&self, name: &str) -> Value {
        counters(&self.ctl("ports"), name).clone()
    }
}

/// The counters of port `port` in a `pvnet ctl ports --json` answer or a switch's `final`.
pub fn counters<'a>(status: &'a Value, port: &str) -> &'a Value {
    status["ports"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == port))
        .map(|p| &p["counters"])
        .unwrap_or_else(|| panic!("no port {port} in {status}"))
}

/// Each worker's port names in a `pvnet ctl ports --json` answer, worker by worker.
pub fn placement(status: &Value) -> Vec<Vec<String>> {
    status["workers"]
        .as_array()
        .unwrap_or_else(|| panic!("no workers in {status}"))
        .iter()
        .map(|w| {
            w["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .map(|p| p.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .collect()
}

/// Sum of a switch port's `drops_*` counters (every reason).
pub fn switch_drops(counters: &Value) -> u64 {
    counters
        .as_object()
        .unwrap_or_else(|| panic!("no counters: {counters}"))
        .iter()
        .filter(|(k, _)| k.starts_with("drops_"))
        .map(|(_, v)| v.as_u64().unwrap_or(0))
        .sum()
}
