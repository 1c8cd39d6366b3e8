//! The processes a benchmark starts: `pvnet backend` and `pvnet frontend` children whose
//! stdout JSON lines are followed (progress, `ready`, the `final` report).

use crate::error::{failed, io, Result};
use crate::proc;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A child process whose stdout JSON lines we follow.
pub(crate) struct Proc {
    name: &'static str,
    pub(crate) child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    pub(crate) progress: Arc<AtomicU64>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    pub(crate) fn spawn(name: &'static str, args: &[String]) -> Result<Self> {
        let exe = std::env::current_exe().map_err(io("finding the pvnet binary"))?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(io(format!("starting {name}")))?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| failed(format!("{name}: no stdout")))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let progress = Arc::new(AtomicU64::new(0));
        let (l, p) = (lines.clone(), progress.clone());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(std::io::Result::ok) {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if let Some(n) = v.pointer("/progress/packets").and_then(Value::as_u64) {
                    p.store(n, Ordering::Relaxed);
                } else {
                    l.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                }
            }
        });
        Ok(Self {
            name,
            child,
            lines,
            progress,
            reader: Some(reader),
        })
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|v| v.get(key).is_some())
    }

    pub(crate) fn wait_for(&mut self, key: &str, timeout: Duration) -> Result<()> {
        let until = Instant::now() + timeout;
        while !self.has(key) {
            if let Some(st) = self.child.try_wait()? {
                return Err(failed(format!(
                    "{} exited ({st}) before '{key}'",
                    self.name
                )));
            }
            if Instant::now() > until {
                return Err(failed(format!(
                    "{} did not report '{key}' in {timeout:?}",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Waits for exit; returns the `final` object and the process's CPU time.
    pub(crate) fn finish(mut self) -> Result<(Value, Duration)> {
        let (ok, cpu) = proc::wait_child(self.child.id(), Duration::from_secs(60))
            .map_err(io(format!("waiting for {}", self.name)))?;
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let fin = self
            .lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find_map(|v| v.get("final").cloned());
        match (ok, fin) {
            (true, Some(f)) => Ok((f, cpu)),
            (_, f) => Err(failed(format!(
                "{} failed (exit ok: {ok}, report: {f:?})",
                self.name
            ))),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

pub(crate) fn wait_socket(p: &Path, backend: &mut Proc) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(10);
    while !p.exists() {
        if let Some(st) = backend.child.try_wait()? {
            return Err(failed(format!("backend exited early: {st}")));
        }
        if Instant::now() > until {
            return Err(failed("backend socket did not appear"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}
