//! `pvnet frontend`: pvnet's virtio-net driver as a traffic source or sink.
//!
//! Output on stdout is JSON lines: `{"ready":..}` once the queues run, `{"progress":..}` about
//! four times a second, and `{"final":..}` at the end (the bench reads them).

use crate::backend_cmd::anyhow_lite::Result;
use crate::limits::pin_current_thread;
use crate::proc;
use clap::{Args, ValueEnum};
use pvnet_dataplane::frame::{self, SeqCheck};
use pvnet_vhost::frontend::{ClientConfig, NetClient};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use virtq::event::Armed;

/// What the frontend does.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum FrontRole {
    /// Send numbered frames as fast as the ring allows for --secs, then an end marker.
    Tx,
    /// Receive and check numbered frames until the end marker.
    Rx,
    /// Connect, post receive buffers, and sleep for --secs (idle CPU check).
    Idle,
}

/// `pvnet frontend` arguments.
#[derive(Args, Debug, Clone)]
pub struct FrontendArgs {
    /// vhost-user socket of the backend.
    #[arg(long)]
    pub socket: PathBuf,
    /// Role.
    #[arg(long, value_enum, default_value_t = FrontRole::Tx)]
    pub role: FrontRole,
    /// Ethernet frame length in bytes (virtio-net header not included).
    #[arg(long, default_value_t = 64)]
    pub frame_len: usize,
    /// Seconds to send (tx) or stay idle (idle).
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
    /// Descriptors per queue (power of two).
    #[arg(long, default_value_t = 256)]
    pub queue_size: u16,
    /// Frames per burst: one publish, one fence and at most one kick per burst. The fence
    /// after publishing waits for the burst's packet stores to drain, so fewer, larger bursts
    /// pay it less often (docs/bench.md has the measured effect).
    #[arg(long, default_value_t = 64)]
    pub burst: usize,
    /// Pin to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Microseconds to keep polling before arming and sleeping.
    #[arg(long, default_value_t = 100)]
    pub window_us: u64,
    /// rx: give up if no frame arrives for this many seconds.
    #[arg(long, default_value_t = 30.0)]
    pub idle_timeout: f64,
    /// Disable VIRTIO_F_EVENT_IDX (use flag-based suppression).
    #[arg(long)]
    pub no_event_idx: bool,
}

fn emit(v: &serde_json::Value) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

/// Runs the frontend.
pub fn run(a: &FrontendArgs) -> Result<()> {
    proc::install_stop_handler();
    if let Some(cpu) = a.cpu {
        pin_current_thread(cpu);
    }
    if !(a.secs.is_finite() && a.secs >= 0.0) {
        return Err("--secs must be a non-negative number".into());
    }
    let cfg = ClientConfig {
        queue_size: a.queue_size,
        buf_size: 2048,
        event_idx: !a.no_event_idx,
    };
    let frame_len = a.frame_len.clamp(frame::MIN_FRAME, 2048 - 12);
    if frame_len != a.frame_len {
        return Err(format!(
            "--frame-len must be within {}..={}",
            frame::MIN_FRAME,
            2048 - 12
        )
        .into());
    }
    let mut c = NetClient::connect(&a.socket, cfg)?;
    emit(&serde_json::json!({ "ready": { "features": format!("{:#x}", c.features()) } }));
    let window = Duration::from_micros(a.window_us);
    let r = match a.role {
        FrontRole::Tx => tx(&mut c, a, frame_len, window)?,
        FrontRole::Rx => rx(&mut c, a, window)?,
        FrontRole::Idle => {
            let until = Instant::now() + Duration::from_secs_f64(a.secs);
            while Instant::now() < until && !proc::stopping() {
                if c.arm_rx()? == Armed::Empty {
                    c.wait(until.saturating_duration_since(Instant::now()))?;
                }
                c.recv_burst(usize::MAX, |_| {})?;
            }
            serde_json::json!({})
        }
    };
    c.stop()?;
    let s = c.stats;
    let mut out = serde_json::json!({
        "tx_packets": s.tx_packets, "rx_packets": s.rx_packets, "rx_errors": s.rx_errors,
        "kicks": s.kicks, "calls": s.calls, "sleeps": s.sleeps,
    });
    if let (Some(o), Some(r)) = (out.as_object_mut(), r.as_object()) {
        o.extend(r.clone());
    }
    emit(&serde_json::json!({ "final": out }));
    Ok(())
}

/// Sends numbered frames for `secs`, then the end marker, then waits until the backend has
/// consumed everything. Reports the data frames sent and the interval they took.
fn tx(
    c: &mut NetClient,
    a: &FrontendArgs,
    frame_len: usize,
    window: Duration,
) -> Result<serde_json::Value> {
    let mut scratch = vec![0u8; 2048];
    frame::write_template(
        &mut scratch[12..],
        frame_len,
        [2, 0, 0, 0, 0, 3],
        [2, 0, 0, 0, 0, 4],
    );
    let tpl: Vec<u8> = scratch[12..12 + frame_len].to_vec();
    let dur = Duration::from_secs_f64(a.secs);
    let start = Instant::now();
    let mut seq = 0u64;
    let mut next_report = start + Duration::from_millis(250);
    let mut idle_since: Option<Instant> = None;
    let burst = a.burst.max(1);
    loop {
        let now = Instant::now();
        if now.duration_since(start) >= dur || proc::stopping() {
            break;
        }
        if now >= next_report {
            emit(&serde_json::json!({ "progress": { "packets": seq } }));
            next_report = now + Duration::from_millis(250);
        }
        let mut k = 0u64;
        let n = c.send_burst(burst, &mut scratch, |_, buf| {
            buf[..frame_len].copy_from_slice(&tpl);
            frame::set_seq(buf, seq + k);
            k += 1;
            frame_len
        })?;
        seq += n as u64;
        if n > 0 {
            idle_since = None;
            continue;
        }
        // Ring full: poll for completions for the window, then arm the TX interrupt and sleep.
        let t = *idle_since.get_or_insert(now);
        if now.duration_since(t) < window {
            std::hint::spin_loop();
            continue;
        }
        if c.arm_tx()? == Armed::Empty {
            c.wait(Duration::from_millis(100))?;
        }
        c.disarm_tx();
        idle_since = None;
    }
    // End marker: retried until the ring takes it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = c.send_burst(1, &mut scratch, |_, buf| {
            buf[..frame_len].copy_from_slice(&tpl);
            frame::set_end(buf, seq);
            frame_len
        })?;
        if n == 1 {
            break;
        }
        if Instant::now() > deadline {
            return Err("backend stopped taking frames (end marker not queued)".into());
        }
        if c.arm_tx()? == Armed::Empty {
            c.wait(Duration::from_millis(50))?;
        }
        c.disarm_tx();
    }
    // Wait for the backend to consume everything (completions), so the interval covers it.
    while c.tx_in_flight() > 0 {
        c.reclaim_tx()?;
        if c.tx_in_flight() == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err("backend did not complete all TX buffers".into());
        }
        if c.arm_tx()? == Armed::Empty {
            c.wait(Duration::from_millis(50))?;
        }
        c.disarm_tx();
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(serde_json::json!({ "data_sent": seq, "secs": secs }))
}

/// Receives until the end marker; checks order and count. The interval runs from the first
/// frame to the end marker.
fn rx(c: &mut NetClient, a: &FrontendArgs, window: Duration) -> Result<serde_json::Value> {
    let mut check = SeqCheck::default();
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut next_report = Instant::now() + Duration::from_millis(250);
    let mut idle_since: Option<Instant> = None;
    let mut body = vec![0u8; 2048];
    let idle_timeout = Duration::from_secs_f64(a.idle_timeout);
    let mut last_frame = Instant::now();
    c.disarm_rx();
    while check.end.is_none() && !proc::stopping() {
        let mut done = false;
        let n = c.recv_burst(usize::MAX, |f| {
            // Read every byte, as any real consumer would, then check the sequence.
            let n = f.read(0, &mut body);
            if check.feed(frame::parse(&body[..n])) {
                done = true;
            }
        })?;
        let now = Instant::now();
        if n > 0 {
            first.get_or_insert(now);
            last = now;
            last_frame = now;
            idle_since = None;
            if now >= next_report {
                emit(&serde_json::json!({ "progress": { "packets": check.data } }));
                next_report = now + Duration::from_millis(250);
            }
            if done {
                break;
            }
            continue;
        }
        if now.duration_since(last_frame) > idle_timeout {
            return Err(format!(
                "no frame for {:.0} s (got {} so far)",
                idle_timeout.as_secs_f64(),
                check.data
            )
            .into());
        }
        let t = *idle_since.get_or_insert(now);
        if now.duration_since(t) < window {
            std::hint::spin_loop();
            continue;
        }
        if c.arm_rx()? == Armed::Empty {
            c.wait(Duration::from_millis(100))?;
        }
        c.disarm_rx();
        idle_since = None;
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    Ok(serde_json::json!({
        "data_received": check.data, "seq_errors": check.seq_errors,
        "end_count": check.end, "complete": check.complete(), "secs": secs,
    }))
}
